"""The GATHER unit: the LD engine (`hdl.units.ld.DMA`) with a block-table indirection (docs/resident.md).

It counts requests and responses with LD's `hdl.units.ld.ReadCount`.

LD streams one contiguous external block into contiguous scratchpad words. GATHER streams rows [lo, hi)
of a request whose rows live in pool pages named by a block table in the scratchpad: each *run* (the
rows of one page) is one contiguous external block, so GATHER is LD restarted once per run at a source
address looked up in the table, with the destination side untouched (response k still goes to
``spad + k``, exactly LD's ``dst + recvd``).

Timing after the start edge E0, in WAIT cycles:

* a run begins with two lookup cycles: L1 presents ``table + (row >> page_log2)`` on the scratchpad read
  port; in L2 the entry is in ``spad.rdata`` and is checked (row beyond the table, page outside the
  pool); then the run's words are requested one a cycle, as LD requests them;
* responses arrive LAT cycles after their requests and are written as they arrive, also during the
  lookups of later runs;
* ``done`` is high LAT + 1 cycles after the last request cycle: B = 2 * runs + words + LAT + 1;
* a failing check in L2 requests nothing more; ``done`` comes ``config.lat`` + 1 cycles after that L2,
  and never before the response to every request made was written (requests and responses are
  counted, as LD counts them): B = 2 * j + words_done + LAT + 1 when the memory's LAT is
  ``config.lat``, and ``error``, ``error_kind``, ``error_info`` hold the reason until the next start.

With ``config.ext_port`` = P > 1 (docs/ext-port.md) a MOVE cycle requests a group of min(P, row words)
words (never across a row) and response k is written from ``spad + k * group`` through the write lanes: the
formulas above with the groups for the words (``hdl.isa.row_groups``).

The error tail cannot be timed by responses alone (there may be none outstanding), so its length is
``config.lat``'s; a memory slower than that makes the unit wait for its late responses
(``hdl.isa.resident_busy_cycles`` with ``built_lat``), a faster one answers within the tail. The harness
builds the chip with its memory's LAT, so the cycle model there is the formula above.
"""
import types

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import enum
from amaranth.lib.wiring import In, Out

from hdl import isa
from hdl.isa import Op
from hdl.properties import History
from hdl.scratchpad import SpadPort

from .base import SpadUnit, operand
from .ld import ReadCount, memory_on_time

__all__ = ["GatherUnit", "ErrorKind", "TableWalk", "Isolated", "error_ports", "ROW_BITS", "ROW_WORD_BITS",
           "ISOLATION_PROPERTIES"]

ROW_BITS = 8            # lo and hi are 8-bit fields: rows 0..255
ROW_WORD_BITS = 15      # a row has up to 2**15 words (row_log2 is a 4-bit field)


# ``error_kind`` as an Amaranth enum made from `hdl.isa.ErrorKind`, the one definition (its shape the bits
# of its largest value): a GATHER or SCATTER reports ROW or PAGE (docs/resident.md "Isolation"), the chip's
# sequencer the kinds of `hdl.isa.issue_stop`.
ErrorKind = types.new_class("ErrorKind", (enum.Enum,), {"shape": isa.ERROR_KIND_BITS},
                            lambda body: body.update({kind.name: kind.value for kind in isa.ErrorKind}))
ErrorKind.__module__ = __name__


# The isolation property of docs/resident.md, by name, with the statement sim.verify.formal prints.
ISOLATION_PROPERTIES = {
    "isolation": "every external request (GATHER) or write (SCATTER) lies in the pool page named by the "
                 "last entry read, in L2, from the table word of an index below table_len; and that "
                 "entry is below pool_pages",
    "walk": "in MOVE the external address register is the current row and word's address in the page "
            "looked up (the entry below pool_pages, from the table), the word inside its row: the "
            "invariant that makes isolation inductive",
}


def error_ports(cfg):
    """The error members a GATHER or SCATTER unit adds to its signature."""
    return {"error": Out(1), "error_kind": Out(ErrorKind), "error_info": Out(cfg.word_bits)}


class TableWalk:
    """The walk over rows [lo, hi) and their table lookups that GATHER and SCATTER share.

    It builds the unit's FSM (`hdl.units.base.Unit.control`, the units' one idiom: busy = not IDLE) with
    the phases of the timing contract as states, ``IDLE``, ``L1``, ``L2``, ``MOVE``, ``END``, ``STOP``,
    and the row/word registers; the unit adds what it does with each moved word (`move`) and how it
    ends (``END`` after the last word, ``STOP`` after an error or an empty range).

    Parameters
    ----------
    m : Module
    unit : GatherUnit or ScatterUnit
        Its ``ins``, ``start``, ``spad.rdata`` and error ports are used.
    opr : Value
        The unit's operand register (``operand_layout(unit.OP)``).

    Attributes
    ----------
    row, word : Signal
        The row being moved and the word inside it.
    table_addr : Value
        Scratchpad address of the current row's table entry.
    pool_addr : Value
        External address of the current row's first word in the page named by ``spad.rdata`` (valid
        in L2, where the entry is on the read port).
    """

    def __init__(self, m, unit, opr):
        cfg = unit.config
        self.m, self.unit, self.opr = m, unit, opr
        self.row = Signal(ROW_BITS, name="row")
        self.word = Signal(ROW_WORD_BITS, name="word")
        page_mask = Signal(ROW_BITS, name="page_mask")
        row_mask = Signal(ROW_WORD_BITS, name="row_mask")
        m.d.comb += [
            page_mask.eq((Const(1, 1) << opr.page_log2) - 1),
            row_mask.eq((Const(1, 1) << opr.row_log2) - 1),
        ]
        self.index = self.row >> opr.page_log2
        self.table_addr = (opr.table + self.index)[:cfg.spad_addr_bits]
        entry = unit.spad.rdata
        self.bad_row = self.index >= opr.table_len
        self.bad_page = entry >= opr.pool_pages
        # Only the low 16 bits of the page number reach a 16-bit address.
        in_pool = (entry[:cfg.ext_addr_bits] << opr.page_log2) | (self.row & page_mask)
        self.pool_addr = (opr.base + (in_pool << opr.row_log2))[:cfg.ext_addr_bits]
        P = cfg.ext_port
        if P == 1:
            self.step = 1
            self.row_end = self.word == row_mask
        else:
            # a group of min(P, row words) words a MOVE cycle, never across a row (docs/ext-port.md): the
            # word steps by the group, and the row ends with its last group
            lg = P.bit_length() - 1
            self.group_log2 = Signal(range(lg + 1), name="group_log2")
            self.group_mask = Signal(P - 1, name="group_mask")
            m.d.comb += [self.group_log2.eq(Mux(opr.row_log2 >= lg, lg, opr.row_log2)),
                         self.group_mask.eq((Const(1, 1) << self.group_log2) - 1)]
            self.step = self.group_mask + 1
            self.row_end = (self.word | self.group_mask) == row_mask
            # the groups a row takes: 2 ** (row_log2 - group_log2)
            self.row_groups_log2 = Signal(len(opr.row_log2), name="row_groups_log2")
            m.d.comb += self.row_groups_log2.eq(opr.row_log2 - self.group_log2)
        self.row_mask = row_mask
        self.last_row = (self.row + 1) == opr.hi
        self.page_end = (self.row & page_mask) == page_mask

    def control(self, start_extra, found, move, stop_entry, end, stop):
        """Build the FSM.

        Parameters
        ----------
        start_extra : list
            Statements for E0 besides latching the operands and resetting the walk.
        found : list
            Statements for the L2 edge of a good entry (the run's first address is ``pool_addr``).
        move : callable
            ``move()`` adds the statements of one MOVE cycle (one word).
        stop_entry : list
            Statements for the edge that enters ``STOP`` (error or empty range).
        end, stop : callable
            The bodies of the ``END`` state (after the last word's MOVE cycle) and of the ``STOP`` state
            (after a failed lookup or at an empty range); each calls ``unit.finish`` (back to ``IDLE``)
            when the unit is done.
        """
        m, u, opr = self.m, self.unit, self.opr
        lo = operand(u.ins, u.OP, "lo")
        hi = operand(u.ins, u.OP, "hi")
        with u.control(m) as self.fsm:
            with m.State("IDLE"):
                with m.If(u.start):
                    u.begin(m, opr)
                    m.d.sync += [self.row.eq(lo), self.word.eq(0), u.error.eq(0),
                                 u.error_kind.eq(ErrorKind.NONE), u.error_info.eq(0), *start_extra]
                    with m.If(hi > lo):
                        m.next = "L1"
                    with m.Else():
                        # an empty range (validate refuses it): no lookup, no word, just the tail
                        m.d.sync += stop_entry
                        m.next = "STOP"
            with m.State("L1"):
                m.next = "L2"
            with m.State("L2"):
                with m.If(self.bad_row | self.bad_page):
                    m.d.sync += [u.error.eq(1), *stop_entry]
                    with m.If(self.bad_row):
                        m.d.sync += [u.error_kind.eq(ErrorKind.ROW), u.error_info.eq(self.index)]
                    with m.Else():
                        m.d.sync += [u.error_kind.eq(ErrorKind.PAGE), u.error_info.eq(u.spad.rdata)]
                    m.next = "STOP"
                with m.Else():
                    m.d.sync += found
                    m.next = "MOVE"
            with m.State("MOVE"):
                move()
                with m.If(self.row_end):
                    m.d.sync += [self.word.eq(0), self.row.eq(self.row + 1)]
                    with m.If(self.last_row):
                        m.next = "END"
                    with m.Elif(self.page_end):
                        m.next = "L1"
                with m.Else():
                    m.d.sync += self.word.eq(self.word + self.step)
            with m.State("END"):
                end()
            with m.State("STOP"):
                stop()

    def check_isolation(self, valid, addr, reg):
        """The isolation property (`ISOLATION_PROPERTIES`) as an Assert: when `valid`, the external
        address `addr` lies inside the pool page of the entry looked up last, which must have come from
        the table word of an index below table_len and be below pool_pages.

        The monitor keeps its own copy of what L2 saw (the entry and whether the address read in L1 was
        the table word of an index inside the table); it does not trust the unit's address arithmetic.
        The `walk` property states that `reg`, the unit's address register in MOVE, is the address the
        doc gives the current row and word (so that isolation follows by induction).
        """
        m, u, opr = self.m, self.unit, self.opr
        cfg = u.config
        h = History(m, u.scope)
        past_raddr = h.past(u.spad.raddr, "raddr")
        page = Signal(cfg.word_bits, name="iso_page")
        listed = Signal(name="iso_listed")
        with m.If(self.fsm.ongoing("L2")):
            m.d.sync += [page.eq(u.spad.rdata),
                         listed.eq((past_raddr == (opr.table + self.index)[:cfg.spad_addr_bits]) &
                                   (self.index < opr.table_len))]
        shift = opr.page_log2 + opr.row_log2            # log2 of a page's words
        first = (opr.base + (page[:cfg.ext_addr_bits] << shift))[:cfg.ext_addr_bits]
        offset = (addr - first)[:cfg.ext_addr_bits]
        # with ext_port > 1 the access is a group: its last word too (docs/ext-port.md)
        inside = (offset if cfg.ext_port == 1 else offset + self.group_mask) < (Const(1, 1) << shift)
        good = listed & (page < opr.pool_pages)
        h.check("isolation", ~valid | (good & inside), ISOLATION_PROPERTIES["isolation"],
                covers={"an external access": valid})
        row_mask = (Const(1, 1) << opr.row_log2) - 1
        page_mask = (Const(1, 1) << opr.page_log2) - 1
        in_pool = (page[:cfg.ext_addr_bits] << opr.page_log2) | (self.row & page_mask)
        want = (opr.base + (in_pool << opr.row_log2) + self.word)[:cfg.ext_addr_bits]
        walking = good & (reg == want) & (self.word <= row_mask)
        if cfg.ext_port > 1:
            walking = walking & ((self.word & self.group_mask) == 0)        # a group's first word
        h.check("walk", ~self.fsm.ongoing("MOVE") | walking,
                ISOLATION_PROPERTIES["walk"], covers={"MOVE": self.fsm.ongoing("MOVE")})


def resident_linear(op, lat, error):
    """(per_run, per_word, tail) with ``hdl.isa.resident_busy_cycles`` of a GATHER or SCATTER (`op`) that
    looked up `runs` entries and moved `words` words equal to per_run*runs + per_word*words + tail, with a
    memory of latency `lat` on a chip built for it, at a normal end or an error stop (`error`): taken from
    the cycle model itself, the one definition; a model that is not linear raises ValueError."""
    def time(runs, words):
        return isa.resident_busy_cycles(op, runs, words, lat, error=error, built_lat=lat)
    tail = time(0, 0)
    per_run, per_word = time(1, 0) - tail, time(0, 1) - tail
    if any(time(r, w) != per_run * r + per_word * w + tail for r, w in ((1, 1), (3, 70), (255, 1000))):
        raise ValueError(f"the busy time of {Op(op).name} is not linear in its runs and words")
    return per_run, per_word, tail


class Isolated:
    """A unit that walks a block table (GATHER, SCATTER): its properties are the unit contract,
    `ISOLATION_PROPERTIES` and the exact completion (mixed in before the unit's base class). Its busy time
    depends on the table it reads (an error stop ends it early) and GATHER's on the memory: the exact
    completion (`completion`) holds at a normal end and at an error stop, GATHER's with a memory answering
    in ``config.lat`` cycles. tests/test_unit_gather.py and tests/test_unit_scatter.py check the timeline
    cycle by cycle against docs/resident.md."""

    # 255 rows of 2**15 words, two lookup cycles a run and LD's tail (LAT up to 1024) fit in 24 bits
    COMPLETION_WIDTH = 24

    @classmethod
    def properties_of(cls, cfg):
        return {**super().properties_of(cfg), **ISOLATION_PROPERTIES}

    def external_access(self):
        """The cycles that move a word: GATHER's read requests, SCATTER's external writes."""
        raise NotImplementedError

    def completion(self, m, opr):
        """``hdl.isa.resident_busy_cycles`` of the instruction in `opr`: at a normal end (``error`` low with
        done) the runs and words of rows [lo, hi) (none for an empty range); at an error stop the runs of the
        rows moved before it, plus the failing one, and those words. The words moved are the monitor's own
        count of the unit's external accesses (`external_access`). GATHER's applies when the memory answered
        on time (`hdl.units.ld.memory_on_time`)."""
        lo, hi, p = opr.lo, opr.hi, opr.page_log2
        moved = Signal(self.COMPLETION_WIDTH, name="moved")
        with m.If(self.start & ~self.busy):
            m.d.sync += moved.eq(0)
        with m.Elif(self.busy & self.external_access()):
            m.d.sync += moved.eq(moved + 1)

        def runs(end):
            """Table entries (pages) that rows [lo, end) lie in."""
            return Mux(end > lo, ((end - 1) >> p) - (lo >> p) + 1, 0)

        # the groups a row takes (docs/ext-port.md): its words on a one-word port
        per_row = opr.row_log2 if self.config.ext_port == 1 else self._walk.row_groups_log2
        words = Mux(hi > lo, (hi - lo) << per_row, 0)
        cycles = {}
        for error, n_runs, n_words in ((0, runs(hi), words), (1, runs(lo + (moved >> per_row)) + 1, moved)):
            per_run, per_word, tail = resident_linear(self.OP, self.config.lat, bool(error))
            cycles[error] = per_run * n_runs + per_word * n_words + tail
        applies = 1
        if self.OP == Op.GATHER:
            applies = memory_on_time(m, self.start, self.busy, self.req_valid, self.resp_valid, self.config.lat)
        return applies, Mux(self.error, cycles[1], cycles[0])


class GatherUnit(Isolated, SpadUnit):
    """GATHER: pool rows -> contiguous scratchpad words, through the block table (docs/resident.md).

    `SpadUnit`'s ports (``spad`` reads the table and writes the rows), LD's external read port and the
    error report.

    Parameters
    ----------
    config : hdl.config.ChipConfig
        The chip (keyword only); ``config.lat`` times the error stop's tail (which also waits for
        every outstanding response, whatever the memory's latency).

    Ports
    -----
    req_valid, req_addr : Out(1), Out(config.ext_addr_bits)
        External read request, one a cycle in a run's MOVE cycles.
    resp_valid, resp_data : In(1), In(config.word_bits)
        The response, LAT cycles after its request; written to ``spad + k`` for the k-th response.
    error : Out(1)
        Set by a failed lookup, cleared by the next start; valid with ``done``.
    error_kind : Out(ErrorKind)
        ROW (table index not below table_len) or PAGE (entry not below pool_pages).
    error_info : Out(config.word_bits)
        The table index (ROW) or the whole table entry (PAGE).
    """

    OP = Op.GATHER
    PORT_UNIT = True

    def external_access(self):
        return self.req_valid
    # its write is a response arriving (LD's ReadCount): tied to its requests at chip level, not here
    RESPONSE_WRITES = True

    def write_counts(self, opr):
        """A write is one of the instruction's when it is the response to one of its requests: some are
        outstanding, no more than a memory of latency up to 1024 can have (a response nobody asked for, which
        only a free environment sends, runs the count past that)."""
        outstanding = (self._count.issued - self._count.recvd)[:self._count.width]
        return self.busy & (outstanding != 0) & (outstanding <= 1024)

    def write_inside(self, m, opr):
        """Response k goes to spad + k, k below the words of [lo, hi): [spad, spad + words) (with
        ``ext_port`` > 1 every lane that writes, docs/ext-port.md)."""
        words = (opr.hi - opr.lo) << opr.row_log2
        aw = self.config.spad_addr_bits
        inside = (self.spad.waddr - opr.spad)[:aw] < words
        for j in range(1, self.config.ext_port):
            inside = inside & (~self.spad.we_x[j - 1] | ((self.spad.waddr + j - opr.spad)[:aw] < words))
        return inside

    def ports(self, cfg):
        members = {**super().ports(cfg),
                   "req_valid":  Out(1),
                   "req_addr":   Out(cfg.ext_addr_bits),
                   "resp_valid": In(1),
                   "resp_data":  In(cfg.word_bits * cfg.ext_port),
                   **error_ports(cfg)}
        if cfg.ext_port > 1:
            # a response group is written through ext_port write lanes (docs/ext-port.md)
            members["spad"] = Out(SpadPort.of(cfg, lanes=cfg.ext_port))
        return members

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        opr = self.operand_register()
        walk = TableWalk(m, self, opr)
        # LD's count (requests issued, responses received, response k to spad + k); the counters
        # differ by at most the memory's LAT, so a width holding 2 * 1024 compares them exactly
        # whatever the run lengths.
        count = ReadCount(max(cfg.spad_addr_bits, 12))
        src = Signal(cfg.ext_addr_bits, name="src")
        tail = Signal(range(cfg.lat + 1), name="tail")
        answered = count.answered(self.resp_valid)

        if cfg.ext_port == 1:
            writes = count.write_side(self.spad, opr.spad, self.resp_valid, self.resp_data)
        else:
            # response k is group k: min(P, row words) words from spad + k * that (docs/ext-port.md)
            lane_valid = Cat(walk.group_mask >= j for j in range(1, cfg.ext_port))
            writes = count.write_lanes(self.spad, opr.spad, self.resp_valid, self.resp_data, walk.group_log2,
                                       lane_valid)
        m.d.comb += [
            self.spad.raddr.eq(walk.table_addr),
            *writes,
            self.req_addr.eq(src),
        ]
        with m.If(self.busy & self.resp_valid):
            m.d.sync += count.receive()

        def move():
            m.d.comb += self.req_valid.eq(1)
            m.d.sync += [src.eq(src + walk.step), count.request()]

        def end():
            # LD's end: the last response is being written (one is always outstanding in END)
            with m.If(answered):
                self.finish(m)

        def stop():
            # as if the failing L2 had been a request: done config.lat + 1 cycles after it, and not
            # before every request made was answered (a memory slower than config.lat still has
            # responses on their way, which are written before done)
            with m.If(tail != 0):
                m.d.sync += tail.eq(tail - 1)
            with m.If((tail <= 1) & answered):
                self.finish(m)

        walk.control(start_extra=count.clear(), found=[src.eq(walk.pool_addr)],
                     move=move, stop_entry=[tail.eq(cfg.lat)], end=end, stop=stop)
        self._count, self._walk = count, walk
        self.check_protocol(m, opr)
        walk.check_isolation(self.req_valid, self.req_addr, src)
        return m
