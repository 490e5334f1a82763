"""GA2: the chip top, a FETCH/ISSUE/WAIT sequencer over eight units sharing one scratchpad (hardware spec 2).

Each non-HALT instruction costs 1 FETCH + 1 ISSUE + B WAIT cycles, B being its unit's busy time (the
unit's `done` pulse is seen in the last WAIT cycle); HALT costs 2. `cur` decides which unit drives the
scratchpad port (spec 2.3, `PortOwner`); a WAIT cycle counts in the class `hdl.isa.COUNTER_OF` gives its
opcode; the five counters are cleared by `start` and wrap at 2^counter_bits (2^32).

A chip with ``config.gather`` also has the resident mode's GATHER and SCATTER units (docs/resident.md):
GATHER shares LD's external read port and SCATTER ST's write port, each by ``cur``, and a bad block table
stops the chip with the error state (the next instruction acts as HALT). On the book's chip none of this
exists: opcodes 9 and 10 are illegal and the design is the book's.

Every chip other than the book's (``config.generated``) has the error state (``error``, ``error_kind``,
``error_pc``, ``error_info``) and stops instead of hanging: a word it cannot run (``hdl.isa.issue_stop``: an
opcode it does not have, a zero length or MM dimension, an MM dimension past the array or the operand
memories) is issued as a HALT, starting no unit, with the error state set (kind, its pc, its opcode), so
that every word either runs or stops the chip. The book's chip hangs there (hardware spec 2.2).

A chip with ``config.mm_rq`` decodes RQC (opcode 11, docs/fused-rq.md) here: at its E0 the MM unit's
``rqc`` input loads the unit's requantizer registers, and its one WAIT cycle ends at once (done in W1,
counted as mm); no unit is started and the scratchpad has no owner. Without it opcode 11 is illegal.

A chip with ``config.prefetch`` (docs/prefetch.md) reads the next word of the program into ``nxt`` while
the current instruction works and issues it in the current one's done cycle (a cycle in which every unit
is idle), so an instruction after another costs its B WAIT cycles only; FETCH and ISSUE remain for the
run's first instruction and for the HALT of an error stop. On the book's chip the sequencer is spec 2.2's.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from .config import BOOK
from .isa import COUNTER_INDEX, COUNTER_OF, HW_OPERANDS, MM_RQ_OPS, RQC_BUSY, Op, field_bits, issue_limits, legal_ops
from .properties import History, checking
from .scratchpad import Scratchpad, SpadPort
from .units.amax import ArgmaxUnit
from .units.base import operand_bits, operand_layout
from .units.ld import DMA
from .units.mm import MatrixUnit
from .units.rq import RequantUnit
from .units.sm import SoftmaxUnit
from .units.st import StoreUnit
from .units.gather import ErrorKind, GatherUnit
from .units.scatter import ScatterUnit
from .units.unpack import UnpackUnit
from .units.vadd import VaddUnit

__all__ = ["GA2", "SeqState", "PortOwner", "CUR_NONE", "CHIP_PROPERTIES", "RESIDENT_CHIP_PROPERTIES",
           "PREFETCH_CHIP_PROPERTIES", "CHIP_INVARIANTS", "RESIDENT_CHIP_INVARIANTS", "ILLEGAL_COUNTER"]

CUR_NONE = 15       # `cur` when no unit owns the scratchpad
# The counter of a WAIT cycle whose `cur` names no unit of this chip (an illegal opcode, spec 2.2); every
# other opcode's class is `hdl.isa.COUNTER_OF`'s.
ILLEGAL_COUNTER = "vec"

# The chip's properties (hdl/properties.py), by name, with the statement sim.verify.formal prints.
CHIP_PROPERTIES = {
    "owner_writes": "only the unit named by cur writes the scratchpad, and no unit raises we without it",
    "dma_in_range": "LD writes only inside [dst, dst+len) (mod the scratchpad depth) of the LD in the instruction register",
    "counters": "outside IDLE, total = 2*n_inst + mm + dma + vec + (0 FETCH, 1 ISSUE, 2 WAIT/HALT) mod 2^counter_bits",
    "state_legal": "the sequencer state is one of IDLE, FETCH, ISSUE, WAIT, HALT",
    "halt_stays": "once in HALT, the sequencer stays there with halted high until a reset",
}


# The chip's invariant behind owner_writes and halt_quiet (issue 24), a check of hdl.properties.checks (every
# simulation evaluates it; not in the emitted Verilog): a unit works only in a WAIT cycle of its own, so that
# a unit's write (`hdl.units.base.WRITE_BUSY_PROPERTIES`: only while busy) is the owner's. sim.verify.formal
# proves it by induction with them: it is what makes owner_writes inductive.
CHIP_INVARIANTS = {
    "owner_busy": "a busy unit, and a unit whose done is high, is the one cur names, in a WAIT cycle (a done "
                  "only with busy low)",
}
# A generated chip's (the error state's) invariant behind its counters' relation, as CHIP_INVARIANTS.
RESIDENT_CHIP_INVARIANTS = {
    "error_stops": "with error high the sequencer is in HALT, or on a gather chip in FETCH or ISSUE with kind "
                   "ROW or PAGE: an error stop leaves WAIT for good (the word after a failed GATHER/SCATTER, whose "
                   "report is ROW or PAGE, is issued as a HALT, a word stopped at issue is one) and only rst "
                   "clears it",
}


# The properties of a chip with the error state (every chip but the book's: docs/resident.md and
# hdl.isa.issue_stop), as CHIP_PROPERTIES.
RESIDENT_CHIP_PROPERTIES = {
    "halt_quiet": "in HALT (an error stop's included) no unit is busy: nothing moves after the chip stops",
    "wait_bounded": "the k-th WAIT cycle of an instruction has k <= its busy time (hdl.isa.busy_cycles; LD and "
                    "GATHER with a memory LAT up to MAX_LAT, SCATTER at its normal end): no word hangs the chip",
}
# The memory latency the wait_bounded property allows LD and GATHER (sim.backends.MAX_LAT): the chip does not
# know its memory's.
WAIT_MAX_LAT = 1024

# The properties of a chip with prefetch=1 (docs/prefetch.md), as CHIP_PROPERTIES: issue_quiet is its own,
# counters replaces the book's statement (only the run's first instruction and an error stop's HALT are
# fetched and issued in cycles of their own).
PREFETCH_CHIP_PROPERTIES = {
    "counters": "outside IDLE, total = 2*error + mm + dma + vec + (0 FETCH, 1 ISSUE, 2 WAIT/HALT) mod "
                "2^counter_bits (error: a GATHER's or SCATTER's error stop, kind ROW or PAGE; 0 on a chip without "
                "gather)",
    "issue_quiet": "a unit is started only in a cycle in which no unit is busy (an instruction issued in the "
                   "done cycle of the one before starts after that one has finished)",
}


def issue_check(m, word, cfg):
    """The error stop the chip `cfg` makes when it issues `word` (``hdl.isa.issue_stop``, from its
    `legal_ops` and `issue_limits`), as a combinational `ErrorKind` signal added to `m` (NONE: it runs it)."""
    opcode = word[124:128]
    illegal, short, over = Signal(name="stop_opcode"), Signal(name="stop_length"), Signal(name="stop_range")
    unchecked = []
    with m.Switch(opcode):
        for op in legal_ops(cfg):
            limits = issue_limits(op, cfg)
            if not limits:
                unchecked.append(op)
                continue
            below, above = [], []
            fields = {}
            for name, (least, most) in limits.items():
                hi, lo = field_bits(op, name, cfg)
                field = fields[name] = word[lo:hi + 1]
                below.append(field < least)
                if most < (1 << len(field)) - 1:         # else no value of the field is above it
                    above.append(field > most)
            if op == Op.MM and cfg.mm_fold:
                # N past the array folds into rows array/2..: M must fit in half (hdl.isa.mm_fold_conflict)
                above.append((fields["N"] > cfg.array) & (fields["M"] > cfg.array // 2))
            with m.Case(op):
                m.d.comb += short.eq(Cat(*below).any())
                if above:
                    m.d.comb += over.eq(Cat(*above).any())
        with m.Case(*unchecked):
            pass
        with m.Default():
            m.d.comb += illegal.eq(1)
    kind = Signal(ErrorKind, name="stop_kind")
    with m.If(illegal):
        m.d.comb += kind.eq(ErrorKind.OPCODE)
    with m.Elif(short):
        m.d.comb += kind.eq(ErrorKind.LENGTH)
    with m.Elif(over):
        m.d.comb += kind.eq(ErrorKind.RANGE)
    return kind


class SeqState(enum.Enum, shape=3):
    IDLE = 0
    FETCH = 1
    ISSUE = 2
    WAIT = 3
    HALT = 4


class PortOwner(wiring.Component):
    """The scratchpad's ownership decoder (hardware spec 2.3): ``cur`` picks the unit that drives the port.

    The read side (``raddr``, and ``raddr_x`` of a unit with more read ports) comes from the owner if it
    reads (its ``READS``), else it is 0; the write enable from the owner if it writes (``WRITES``), else
    0; the write address and data from the owning writer, and by default (no writer owns the port)
    from AMAX: harmless, since the write enable is then 0. The registered read data goes to the owner
    (spec 2.3 sends it to every unit; the others only ever use it while they own the port).

    Parameters
    ----------
    units : dict of hdl.isa.Op to unit
        Every unit of the chip by opcode (AMAX among them); each has ``spad``, ``READS`` and ``WRITES``.
    config : hdl.config.ChipConfig
        The chip (keyword only; the book's by default): the widths, and ``spad_reads`` read ports.
    host : bool
        Add the ``host`` port (keyword only; off by default, and then the decoder is the book's): the
        board's link reads and writes the scratchpad through it while the chip is stopped.

    Ports
    -----
    cur : In(4)
        The owner's opcode (15: nobody).
    spad : Out(SpadPort.of(config, reads=config.spad_reads, lanes=config.spad_lanes))
        To the scratchpad; its write lanes past 0 (``spad_lanes`` > 1) come from MM's port (docs/spad-lanes.md)
        and, while RQ or VADD owns the port on a chip with ``vec_lanes`` > 1, the first from theirs
        (docs/vec-lanes.md); off while a unit without lanes owns it. The read lanes of the first
        ``vadd_ports`` read ports go to RQ and VADD.
    ld, st, mm, ... : In(unit.spad.signature)
        One port per unit, named after its opcode, each the flip of the unit's ``spad``.
    host : In(SpadPort.of(config))
        Only with `host`: where the book's decoder drives read address 0 and no write (no unit owns the
        port, or the owner does not read or write), the host's read address and write go through; its
        write address and data replace AMAX's default only while the host writes (``host.we``), so the
        units' write paths keep their depth. ``rdata`` is read port 0's data.
    """

    def __init__(self, units, *, config=BOOK, host=False):
        self._units = dict(units)
        self._host = bool(host)
        members = {"cur": In(4), "spad": Out(SpadPort.of(config, reads=config.spad_reads,
                                                          lanes=config.spad_lanes,
                                                          **Scratchpad.read_lanes_of(config)))}
        for op, unit in self._units.items():
            members[op.name.lower()] = In(unit.spad.signature)
        if self._host:
            members["host"] = In(SpadPort.of(config))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        sp = self.spad
        ports = {op: getattr(self, op.name.lower()) for op in self._units}
        amax = ports[Op.AMAX]
        if self._host:
            hp = self.host
            m.d.comb += [sp.raddr.eq(hp.raddr), sp.we.eq(hp.we), sp.waddr.eq(Mux(hp.we, hp.waddr, amax.waddr)),
                         sp.wdata.eq(Mux(hp.we, hp.wdata, amax.wdata)), hp.rdata.eq(sp.rdata)]
        else:
            m.d.comb += [sp.raddr.eq(0), sp.we.eq(0), sp.waddr.eq(amax.waddr), sp.wdata.eq(amax.wdata)]
        if sp.signature.lanes > 1:
            # the write lanes past 0 (docs/spad-lanes.md): only MM's drain has them; their data always
            # from MM (harmless: their enables are 0 unless MM owns the port)
            m.d.comb += sp.wdata_x.eq(ports[Op.MM].wdata_x)
        with m.Switch(self.cur):
            for op, unit in self._units.items():
                port = ports[op]
                with m.Case(op):
                    if unit.READS:
                        # Read data to the owner only (the others see 0, unused: a unit reads it only
                        # while busy, and owns the port all that time): Amaranth's simulator then wakes
                        # no idle unit on a read, 28% less CPU on a 6-step decode (7.7 s against 10.6 s).
                        m.d.comb += [sp.raddr.eq(port.raddr), port.rdata.eq(sp.rdata)]
                        reads = port.signature.reads
                        if reads == sp.signature.reads > 1:
                            # the scratchpad's other read ports serve MM's operand staging (and VADD's
                            # src2 with vadd_ports = 2, docs/vadd-ports.md)
                            m.d.comb += [sp.raddr_x.eq(port.raddr_x), port.rdata_x.eq(sp.rdata_x)]
                        elif reads > 1:
                            # a unit with fewer read ports than the scratchpad: its own, the first ones
                            for k in range(reads - 1):
                                m.d.comb += [sp.raddr_x[k].eq(port.raddr_x[k]), port.rdata_x[k].eq(sp.rdata_x[k])]
                    if unit.READS and port.signature.read_lanes > 1:
                        # RQ's and VADD's read lanes (docs/vec-lanes.md), the first ports' own
                        for r in range(port.signature.lane_reads):
                            mine, all_lanes = port.rdata_l[r].as_value(), sp.rdata_l[r].as_value()
                            # a unit with fewer read lanes than the scratchpad (RQ and VADD beside ST's
                            # ext_port lanes, docs/ext-port.md) takes the first ones
                            m.d.comb += mine.eq(all_lanes if len(mine) == len(all_lanes) else all_lanes[:len(mine)])
                    if unit.WRITES:
                        m.d.comb += sp.we.eq(port.we)
                        if port.signature.lanes > 1:
                            m.d.comb += sp.we_x.eq(port.we_x)
                        if op != Op.MM and port.signature.lanes > 1:
                            # RQ's and VADD's write lanes (docs/vec-lanes.md): their data while they own
                            # the port (MM's otherwise), into the scratchpad's first lanes
                            lanes = port.signature.lanes - 1
                            m.d.comb += sp.wdata_x.as_value()[:lanes * len(port.wdata)].eq(port.wdata_x.as_value())
                        if op != Op.AMAX:
                            m.d.comb += [sp.waddr.eq(port.waddr), sp.wdata.eq(port.wdata)]
        return m


class GA2(wiring.Component):
    """The GA-2 accelerator (ports of hardware spec 2.1 minus clk/rst; ``rst`` is the sync domain's).

    Parameters
    ----------
    config : hdl.config.ChipConfig
        The chip to build (keyword only; the book's chip by default): scratchpad depth, array size,
        operand memory depth, counter width. Every block inside is built from the same configuration.
    host_port : bool
        Build the ``host`` port (keyword only; off by default, and then the chip is exactly the one
        without the argument): the FPGA board's link (`hdl.board_top`) reads and writes the scratchpad
        through the ownership decoder while the chip is stopped (IDLE or HALT: no unit owns the port).

    Ports
    -----
    start : In(1)
        Start pulse, sampled only in IDLE: pc, counters and ``halted`` are cleared and FETCH begins.
    halted : Out(1)
        Register, set when a HALT is issued.
    imem_addr : Out(16)
        The program counter; on a chip with ``config.prefetch`` the address of the word read ahead: pc in
        FETCH, pc + 1 in ISSUE, pc + 2 in WAIT (docs/prefetch.md).
    imem_data : In(128)
        Program ROM word at ``imem_addr``; must be combinational (sampled at the end of FETCH, and on a
        prefetch chip at the end of ISSUE and of an issuing WAIT cycle too).
    req_valid, req_addr : Out(1), Out(16)
        External read request, straight from the LD unit (the DMA).
    resp_valid, resp_data : In(1), In(config.word_bits * config.ext_port)
        External read response, LAT cycles after the request: the words at req_addr .. req_addr +
        ext_port - 1, word k in bits 32k .. 32k + 31 (docs/ext-port.md; one word on the book's chip).
    wr_valid, wr_addr, wr_data : Out(config.ext_port), Out(16), Out(config.word_bits * config.ext_port)
        External write, straight from the ST unit: lane k writes its word at wr_addr + k when wr_valid[k].
    cyc_total, cyc_mm, cyc_dma, cyc_vec, n_inst : Out(config.counter_bits)
        Counters: all cycles from the first FETCH to the HALT's ISSUE, WAIT cycles of MM, of LD/ST,
        of every other opcode (illegal ones included), and completed non-HALT instructions.
    error, error_kind, error_pc, error_info : Out(1), Out(ErrorKind), Out(16), Out(config.word_bits)
        Only with ``config.gather``: the error state of docs/resident.md, set when a GATHER or SCATTER
        ends on a bad table (kind ROW or PAGE, the instruction's pc, the table index or the bad entry);
        cleared by ``rst`` only. GATHER's error tail is timed by ``config.lat`` (and waits for every
        response outstanding), so the error stop's busy time is the doc's when the memory's LAT is it.
    host : In(SpadPort.of(config))
        Only with `host_port`: the scratchpad's port 0 for the board's link (``raddr``; ``rdata`` the
        next cycle, read port 0's register; ``we``/``waddr``/``wdata``). Use it only while the chip is
        stopped: a write while a unit owns the port is refused by the ``owner_writes`` Assert.

    Attributes
    ----------
    scratchpad : Scratchpad
        The ``config.spad_depth`` x ``config.word_bits`` scratchpad (its ``.memory`` can be read and written by a simulator).
    state, pc, cur : Signal
        Sequencer registers, exposed so that a simulator can say where a program hangs.
    """

    def __init__(self, *, config=BOOK, host_port=False):
        self.config = cfg = config
        self.host_port = bool(host_port)
        self.scratchpad = Scratchpad(config=cfg)
        self.state = Signal(SeqState)
        self.pc = Signal(16)
        self.cur = Signal(4, init=CUR_NONE)
        xw, w, c = cfg.ext_addr_bits, cfg.word_bits, cfg.counter_bits
        super().__init__({
            "start":      In(1),
            "halted":     Out(1),
            "imem_addr":  Out(16),
            "imem_data":  In(128),
            "req_valid":  Out(1),
            "req_addr":   Out(xw),
            "resp_valid": In(1),
            "resp_data":  In(w * cfg.ext_port),
            "wr_valid":   Out(cfg.ext_port),
            "wr_addr":    Out(xw),
            "wr_data":    Out(w * cfg.ext_port),
            "cyc_total":  Out(c),
            "cyc_mm":     Out(c),
            "cyc_dma":    Out(c),
            "cyc_vec":    Out(c),
            "n_inst":     Out(c),
            **({"error": Out(1), "error_kind": Out(ErrorKind), "error_pc": Out(16), "error_info": Out(w)}
               if cfg.generated else {}),
            **({"host": In(SpadPort.of(cfg))} if self.host_port else {}),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.scratchpad = sp = self.scratchpad
        cfg = self.config
        m.submodules.ld = ld = DMA(config=cfg)
        units = {op: cls(config=cfg) for op, cls in (
            (Op.ST, StoreUnit), (Op.MM, MatrixUnit), (Op.RQ, RequantUnit), (Op.SM, SoftmaxUnit),
            (Op.VADD, VaddUnit), (Op.AMAX, ArgmaxUnit), (Op.UNPACK, UnpackUnit),
            *(((Op.GATHER, GatherUnit), (Op.SCATTER, ScatterUnit)) if cfg.gather else ()))}
        for op, unit in units.items():
            m.submodules[op.name.lower()] = unit
        every = {Op.LD: ld, **units}

        st, pc, cur = self.state, self.pc, self.cur
        ins = Signal(128)
        # The word the units take at an issue: the instruction register on the book's chip; on a prefetch
        # chip (docs/prefetch.md) `nxt`, the word after the current one, read while it works (FETCH loads
        # it with `ins`, so in ISSUE both hold the same word).
        issue = Signal(128, name="nxt") if cfg.prefetch else ins
        opcode = issue[124:128]
        go = Signal()
        m.d.comb += [go.eq(st == SeqState.ISSUE), self.imem_addr.eq(pc)]
        is_halt = opcode == Op.HALT
        if cfg.gather:
            # the error stop: the instruction after a failed GATHER/SCATTER is issued as a HALT, whatever
            # the ROM holds, and starts no unit
            is_halt = is_halt | self.error
            m.d.comb += go.eq((st == SeqState.ISSUE) & ~self.error)

        # The instruction wiring lives in a small submodule so that a simulator re-evaluates it only when
        # a new instruction is fetched or issued (flattened: 9-10% more CPU on a 6-step pysim decode).
        m.submodules.decode = dec = Module()

        launch = go
        if cfg.generated:
            # the error stop at issue (hdl.isa.issue_stop): a word this chip cannot run is issued as a HALT
            # (is_halt) and starts nothing (launch)
            stop_kind = issue_check(dec, issue, cfg)
            stop = stop_kind.as_value() != ErrorKind.NONE.value
            is_halt = is_halt | stop
            launch = Signal(name="launch")
            m.d.comb += launch.eq(go & ~stop)

        # ---- units: the instruction register goes to everyone, `start` only to the named unit ----
        for op, unit in units.items():
            dec.d.comb += [unit.ins.eq(issue), unit.start.eq(launch & (opcode == op))]
        if cfg.mm_rq:
            # RQC: the MM unit's requantizer registers take its fields at E0 (docs/fused-rq.md)
            dec.d.comb += units[Op.MM].rqc.eq(launch & (opcode == Op.RQC))

        def ld_field(name):
            hi, lo = HW_OPERANDS[Op.LD][name]
            return issue[lo:hi + 1]

        dec.d.comb += [
            ld.start.eq(launch & (opcode == Op.LD)),
            ld.dst.eq(ld_field("dst")),
            ld.src.eq(ld_field("src")),
            ld.length.eq(ld_field("len")),
        ]
        store = units[Op.ST]
        if not cfg.gather:
            m.d.comb += [
                self.req_valid.eq(ld.req_valid),
                self.req_addr.eq(ld.req_addr),
                ld.resp_valid.eq(self.resp_valid),
                ld.resp_data.eq(self.resp_data),
            ]
            m.d.comb += [
                self.wr_valid.eq(store.wr_valid),
                self.wr_addr.eq(store.wr_addr),
                self.wr_data.eq(store.wr_data),
            ]
        else:
            # GATHER shares LD's read port and SCATTER ST's write port, by owner; a response goes only
            # to the owner (the other engine would take it for one of its own and write it)
            gather, scatter = units[Op.GATHER], units[Op.SCATTER]
            gathering, scattering = cur == Op.GATHER, cur == Op.SCATTER
            m.d.comb += [
                self.req_valid.eq(Mux(gathering, gather.req_valid, ld.req_valid)),
                self.req_addr.eq(Mux(gathering, gather.req_addr, ld.req_addr)),
                ld.resp_valid.eq(self.resp_valid & ~gathering),
                ld.resp_data.eq(self.resp_data),
                gather.resp_valid.eq(self.resp_valid & gathering),
                gather.resp_data.eq(self.resp_data),
                self.wr_valid.eq(Mux(scattering, scatter.wr_valid, store.wr_valid)),
                self.wr_addr.eq(Mux(scattering, scatter.wr_addr, store.wr_addr)),
                self.wr_data.eq(Mux(scattering, scatter.wr_data, store.wr_data)),
            ]
            # the failing unit's report, taken with its done
            failed = Signal()
            with m.Switch(cur):
                for op in (Op.GATHER, Op.SCATTER):
                    with m.Case(op):
                        m.d.comb += failed.eq(units[op].done & units[op].error)
            with m.If(failed):
                unit_error = Mux(gathering, gather.error_kind.as_value(), scatter.error_kind.as_value())
                m.d.sync += [self.error.eq(1), self.error_kind.eq(unit_error), self.error_pc.eq(pc),
                             self.error_info.eq(Mux(gathering, gather.error_info, scatter.error_info))]

        # ---- scratchpad ownership by `cur` (spec 2.3) ----
        m.submodules.port = owner = PortOwner(every, config=cfg, host=self.host_port)
        m.d.comb += owner.cur.eq(cur)
        connect(m, owner.spad, sp.port)
        if self.host_port:
            connect(m, flipped(self.host), owner.host)
        for op, unit in every.items():
            connect(m, unit.spad, getattr(owner, op.name.lower()))
        # the owner's done ends the WAIT (none while no unit owns the port)
        done = Signal()
        with m.Switch(cur):
            for op, unit in every.items():
                with m.Case(op):
                    m.d.comb += done.eq(unit.done)
            if cfg.mm_rq:
                with m.Case(Op.RQC):
                    m.d.comb += done.eq(1)          # B = 1: the registers were loaded at E0
        if cfg.prefetch:
            # The overlapped issue (docs/prefetch.md): in the done cycle of the current instruction, unless
            # it failed (an error stop issues its HALT the book's way, through FETCH and ISSUE), `nxt` is
            # issued; the word after it is read meanwhile, so imem_addr runs one ahead in ISSUE and two in WAIT.
            # It comes from a register (`ahead`, set at each edge for the state the sequencer enters), as the
            # book's comes from pc: an FPGA keeps the program memory in block RAM, its address register
            # absorbed, and the ROM's read does not wait for a done.
            overlap = (st == SeqState.WAIT) & done
            if cfg.gather:
                overlap = overlap & ~failed
            self._overlap = overlap
            ahead = Signal(16, name="ahead")
            m.d.comb += [go.eq((st == SeqState.ISSUE) & ~self.error | overlap if cfg.gather
                               else (st == SeqState.ISSUE) | overlap),
                         self.imem_addr.eq(ahead)]

        if cfg.generated:
            # the error state of a stop at issue: the word's kind, pc and opcode (not after an error stop of
            # GATHER/SCATTER, whose HALT this is, whatever the word)
            issued_at = [(st == SeqState.ISSUE, pc)]
            if cfg.prefetch:
                issued_at.append((overlap, pc + 1))          # `nxt` is the word after the current one
            for when, where in issued_at:
                with m.If(when & stop & ~self.error):
                    m.d.sync += [self.error.eq(1), self.error_kind.eq(stop_kind), self.error_pc.eq(where),
                                 self.error_info.eq(opcode)]

        # The WAIT-cycle counter of each opcode of this chip, by its class (hdl.isa.COUNTER_OF).
        counters = [self.cyc_total, self.cyc_mm, self.cyc_dma, self.cyc_vec, self.n_inst]
        counter_of = {cls: counters[k] for cls, k in COUNTER_INDEX.items()}
        answered = [*every, *(MM_RQ_OPS if cfg.mm_rq else ())]        # the opcodes this chip executes
        ops_of = {cls: ops for cls in counter_of if (ops := [op for op in answered if COUNTER_OF[op] == cls])}

        # ---- sequencer (spec 2.2) ----
        with m.Switch(st):
            with m.Case(SeqState.IDLE):
                with m.If(self.start):
                    m.d.sync += [
                        pc.eq(0), st.eq(SeqState.FETCH), self.halted.eq(0),
                        self.cyc_total.eq(0), self.cyc_mm.eq(0), self.cyc_dma.eq(0),
                        self.cyc_vec.eq(0), self.n_inst.eq(0),
                    ]
                    if cfg.prefetch:
                        m.d.sync += ahead.eq(0)
            with m.Case(SeqState.FETCH):
                # on a prefetch chip the ROM's word goes to `nxt` only (below), and `ins` takes it from
                # there at the issue
                m.d.sync += [*([] if cfg.prefetch else [ins.eq(self.imem_data)]), self.cyc_total.eq(self.cyc_total + 1),
                             st.eq(SeqState.ISSUE)]
                if cfg.prefetch:
                    m.d.sync += ahead.eq(pc + 1)
            with m.Case(SeqState.ISSUE):
                m.d.sync += self.cyc_total.eq(self.cyc_total + 1)
                if cfg.prefetch:
                    m.d.sync += [ahead.eq(pc + 2), ins.eq(issue)]
                with m.If(is_halt):
                    m.d.sync += [st.eq(SeqState.HALT), self.halted.eq(1), cur.eq(CUR_NONE)]
                with m.Else():
                    m.d.sync += [st.eq(SeqState.WAIT), cur.eq(opcode)]
            with m.Case(SeqState.WAIT):
                m.d.sync += self.cyc_total.eq(self.cyc_total + 1)
                with m.Switch(cur):
                    for cls, ops in ops_of.items():
                        with m.Case(*ops):
                            m.d.sync += counter_of[cls].eq(counter_of[cls] + 1)
                    with m.Default():
                        m.d.sync += counter_of[ILLEGAL_COUNTER].eq(counter_of[ILLEGAL_COUNTER] + 1)
                with m.If(done):
                    m.d.sync += [pc.eq(pc + 1), self.n_inst.eq(self.n_inst + 1),
                                 cur.eq(CUR_NONE), st.eq(SeqState.FETCH)]
                    if cfg.prefetch:
                        m.d.sync += ahead.eq(pc + 1)            # FETCH reads the next pc's word
                        with m.If(overlap):
                            # issue `nxt` now (its unit's E0 is this edge); `nxt` takes the word at pc + 2
                            m.d.sync += [ins.eq(issue), ahead.eq(pc + 3)]
                            with m.If(is_halt):
                                m.d.sync += [st.eq(SeqState.HALT), self.halted.eq(1)]
                            with m.Else():
                                m.d.sync += [st.eq(SeqState.WAIT), cur.eq(opcode)]
            # HALT: nothing until rst.
        if cfg.prefetch:
            # `nxt` reads the ROM in FETCH (the word at pc), ISSUE (pc + 1) and at an overlapped issue (the
            # word after the one issued), under one enable and from one source: Yosys then makes it the
            # program memory's block-RAM output register, as `ins` on the book's chip (loaded in three
            # branches of the state machine it did not, and the memory went to LUT RAM)
            with m.If((st == SeqState.FETCH) | (st == SeqState.ISSUE) | overlap):
                m.d.sync += issue.eq(self.imem_data)

        self._check_properties(m, ins, sp.port, every)
        # for the chip's formal harness (sim.verify.formal.ChipEnv: the LD engine's operands against `ins`)
        self._ins, self._every = ins, every
        return m

    def _check_wait_bounded(self, m, h, ins, every):
        """``wait_bounded`` (`RESIDENT_CHIP_PROPERTIES`): the WAIT cycles of the instruction in `ins` are at most
        its busy time, the units' own formula for those whose time is the instruction's (their
        ``busy_cycles``, asserted exactly in each unit), an upper bound for the others."""
        cfg, st, cur = self.config, self.state, self.cur
        waited = Signal(25, name="waited")          # GATHER moves up to 255 << 15 words
        with m.If(st == SeqState.WAIT):
            m.d.sync += waited.eq(waited + 1)
        with m.Else():
            m.d.sync += waited.eq(1)
        if cfg.prefetch:
            with m.If((st == SeqState.WAIT) & self._overlap):
                m.d.sync += waited.eq(1)            # the next instruction's W1 follows at once
        bound = Signal(25, name="wait_bound")
        with m.Switch(cur):
            for op, unit in every.items():
                with m.Case(op):
                    opr = data.View(operand_layout(op, cfg), operand_bits(ins, op, cfg))
                    if op == Op.LD:
                        m.d.comb += bound.eq(opr.len + WAIT_MAX_LAT + 1)
                    elif op in (Op.GATHER, Op.SCATTER):
                        runs = Mux(opr.hi > opr.lo, ((opr.hi - 1) >> opr.page_log2) - (opr.lo >> opr.page_log2) + 1, 0)
                        words = (opr.hi - opr.lo) << opr.row_log2
                        tail = WAIT_MAX_LAT + 1 if op == Op.GATHER else 2
                        m.d.comb += bound.eq(2 * runs + Mux(opr.hi > opr.lo, words, 0) + tail)
                    else:
                        m.d.comb += bound.eq(unit.busy_cycles(opr))
            if cfg.mm_rq:
                with m.Case(Op.RQC):
                    m.d.comb += bound.eq(RQC_BUSY)
        h.check("wait_bounded", (st != SeqState.WAIT) | (waited <= bound), RESIDENT_CHIP_PROPERTIES["wait_bounded"],
                covers={"a WAIT cycle": st == SeqState.WAIT})

    def _check_properties(self, m, ins, sp, every):
        """The chip's properties (``CHIP_PROPERTIES``) as Asserts; ``python -m sim.formal`` proves them."""
        # scope "prefetch" on a prefetch chip: sim.verify.formal's target of that name proves its properties
        h = History(m, "prefetch" if self.config.prefetch else "chip")
        st, cur = self.state, self.cur
        t = CHIP_PROPERTIES

        # Only the owner writes: a unit raises `we` only while it owns the port, and the scratchpad's
        # write port carries exactly the owner's write (nothing when no writing unit owns it).
        writers = {op: u.spad for op, u in every.items() if u.WRITES}
        owned = 0
        for op, u in writers.items():
            mine = cur == op
            owned = owned | mine
            h.check("owner_writes", ~u.we | mine, t["owner_writes"], covers={f"{op.name} writes": u.we})
            h.check("owner_writes", ~mine | ((sp.we == u.we) & (~u.we | ((sp.waddr == u.waddr) &
                                                                         (sp.wdata == u.wdata)))),
                    t["owner_writes"])
        if self.host_port:
            # the host's write passes where no unit owns the port, and only there
            h.check("owner_writes", owned | ~sp.we | self.host.we, t["owner_writes"])
            h.check("owner_writes", ~self.host.we | (cur == CUR_NONE), t["owner_writes"])
        else:
            h.check("owner_writes", owned | ~sp.we, t["owner_writes"])

        # The LD engine writes inside [dst, dst+len) of the instruction it executes (modulo the
        # scratchpad's depth, as its addresses wrap); dst and len are read from the instruction
        # register, not the engine.
        hi, lo = HW_OPERANDS[Op.LD]["dst"]
        dst = ins[lo:hi + 1]
        hi, lo = HW_OPERANDS[Op.LD]["len"]
        length = ins[lo:hi + 1]
        ld_write = sp.we & (cur == Op.LD)
        h.check("dma_in_range", ~ld_write | ((sp.waddr - dst)[:self.config.spad_addr_bits] < length),
                t["dma_in_range"], covers={"LD writes": ld_write,
                                           # longer than any proof's depth: not a claim about short LDs only
                                           "an LD of more than 256 words writes": ld_write & (length > 256)})
        for j in range(1, self.config.ext_port):
            # the group's other lanes (docs/ext-port.md)
            lane_write = sp.we_x[j - 1] & (cur == Op.LD)
            h.check("dma_in_range", ~lane_write | ((sp.waddr + j - dst)[:self.config.spad_addr_bits] < length),
                    t["dma_in_range"])

        # Counters: every FETCH, ISSUE and WAIT cycle adds 1 to cyc_total, every WAIT cycle 1 to exactly
        # one of mm/dma/vec, every completed instruction 1 to n_inst (its FETCH and ISSUE are 2 cycles).
        # So, modulo 2^counter_bits, total = 2*n_inst + mm + dma + vec + k with k = 0 in FETCH, 1 in ISSUE and
        # 2 in WAIT (the current instruction's FETCH and ISSUE) and in HALT (the HALT's two cycles).
        # In IDLE nothing is claimed: the spec's rst does not clear the counters.
        k = Signal(2)
        with m.Switch(st):
            with m.Case(SeqState.ISSUE):
                m.d.comb += k.eq(1)
            with m.Case(SeqState.WAIT, SeqState.HALT):
                m.d.comb += k.eq(2)
        # On a prefetch chip (docs/prefetch.md) only the run's first instruction and the HALT of a GATHER's or
        # SCATTER's error stop have FETCH and ISSUE cycles: 2*error where the book has 2*n_inst (a stop at
        # issue, hdl.isa.issue_stop, is the word itself issued as a HALT, in a HALT's cycles).
        if not self.config.prefetch:
            seq = self.n_inst << 1
        elif self.config.gather:
            seq = (self.error & (self.error_kind.as_value() <= ErrorKind.PAGE.value)) << 1
        else:
            seq = 0
        relation = (self.cyc_total == (seq + self.cyc_mm + self.cyc_dma + self.cyc_vec + k)[:self.config.counter_bits])
        answered = [*every, *(MM_RQ_OPS if self.config.mm_rq else ())]
        waits = {}
        for cls in COUNTER_INDEX:
            ops = [op for op in answered if COUNTER_OF[op] == cls]
            if ops:
                waits[f"a WAIT cycle counted in {cls}"] = (st == SeqState.WAIT) & Cat(*(cur == op for op in ops)).any()
        h.check("counters", (st == SeqState.IDLE) | relation,
                PREFETCH_CHIP_PROPERTIES["counters"] if self.config.prefetch else t["counters"], covers=waits)
        h.check("state_legal", st.as_value() <= SeqState.HALT.value, t["state_legal"],
                covers={"HALT": st == SeqState.HALT})

        if self.config.prefetch:
            # the overlapped issue starts a unit only once the one before has finished
            anyone_busy = 0
            for u in every.values():
                anyone_busy = anyone_busy | u.busy
            for op, u in every.items():
                h.check("issue_quiet", ~u.start | ~anyone_busy, PREFETCH_CHIP_PROPERTIES["issue_quiet"],
                        covers={f"{op.name} starts": u.start})

        # HALT is left only by a reset; on a chip with the error state nothing moves in it (a word that stops
        # the chip started no unit).
        if self.config.generated:
            busy = 0
            for u in every.values():
                busy = busy | u.busy
            h.check("halt_quiet", (st != SeqState.HALT) | ~busy, RESIDENT_CHIP_PROPERTIES["halt_quiet"],
                    # (not "HALT" alone: a cover of the same condition as state_legal's is merged with it by
                    # Yosys, one message survives, and the other property's cover looks unreached)
                    covers={"HALT after an instruction": (st == SeqState.HALT) & (self.n_inst != 0),
                            "an error stop": (st == SeqState.HALT) & self.error})

        if self.config.generated and checking():
            self._check_wait_bounded(m, h, ins, every)
        if checking():
            # owner_busy: a unit leaves IDLE only at a start, which is an issue (cur set to its opcode, WAIT
            # entered) and cur leaves it only with the owner's done, which comes with busy low
            for op, u in every.items():
                mine = (st == SeqState.WAIT) & (cur == op)
                h.check("owner_busy", ~u.busy | mine, CHIP_INVARIANTS["owner_busy"],
                        covers={f"{op.name} busy": u.busy})
                h.check("owner_busy", ~u.done | (mine & ~u.busy), CHIP_INVARIANTS["owner_busy"])
            if self.config.generated:
                # error_stops: with it the counters' 2*error (a prefetch gather chip's) is inductive
                text = RESIDENT_CHIP_INVARIANTS["error_stops"]
                table_kind = self.error_kind.as_value() <= ErrorKind.PAGE.value
                # FETCH and ISSUE only on a gather chip (the HALT after a failed GATHER/SCATTER): elsewhere
                # error rises only on an edge into HALT
                refetch = ((st == SeqState.FETCH) | (st == SeqState.ISSUE)) if self.config.gather else 0
                h.check("error_stops", ~self.error | (refetch & table_kind) | (st == SeqState.HALT), text,
                        covers={"an error stop": self.error})
                h.check("error_stops", ~self.error | (self.error_kind != ErrorKind.NONE), text)
                for op in (Op.GATHER, Op.SCATTER):
                    if op in every:
                        # the unit's report, taken with its done: a bad table's kind
                        u = every[op]
                        h.check("error_stops", ~u.error | (u.error_kind == ErrorKind.ROW) |
                                (u.error_kind == ErrorKind.PAGE), text)

        was_halt = h.past(st == SeqState.HALT, "halt")
        h.check("halt_stays", ~(h.valid & was_halt) | ((st == SeqState.HALT) & self.halted),
                t["halt_stays"], covers={"the cycle after HALT": was_halt})
        if checking():
            # halted is high in every HALT cycle (the edge into HALT sets it, only IDLE's start clears it): with
            # it halt_stays is inductive at sim.verify.formal's small k
            h.check("halt_stays", (st != SeqState.HALT) | self.halted, t["halt_stays"])
