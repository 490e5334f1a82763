"""The LD engine: external memory -> scratchpad, pipelined reads (hardware spec 4.1, 5.7).

After the start edge E0, request k is presented in cycle W(k+1); the memory answers a fixed LAT cycles
later and the word is written to dst+k at the end of W(k+1+LAT); `done` is high in W(len+LAT+1).
The engine trusts that exactly `len` responses arrive. Addresses wrap at aw (scratchpad) / xw (external).
With ``config.ext_port`` = P > 1 (docs/ext-port.md) the same with groups for words: request k asks for the P
words from src + kP, response k writes those below the length from dst + kP through the write lanes, and
`done` is high in W(ceil(len/P)+LAT+1).
"""
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl._checks import check_int
from hdl.config import BOOK
from hdl.isa import Op
from hdl.properties import History, checking, unit_protocol
from hdl.scratchpad import SpadPort

from .base import COMPLETION_PROPERTIES, Scoped, completion_counter, linear_busy
from .lanes import lanes_busy

__all__ = ["DMA", "ReadCount", "memory_on_time"]


def memory_on_time(m, start, busy, req_valid, resp_valid, lat):
    """Whether the external memory has answered a unit's reads as the chip is built for, since its start
    edge: a response exactly `lat` (``config.lat``) cycles after each request, none otherwise (hardware spec
    6.3). A monitor for the exact completion of LD and GATHER, whose time is the memory's as much as the
    instruction's: their `COMPLETION_PROPERTIES` hold for a memory of that latency (the harness's and
    ``sim.formal``'s ChipEnv on a chip built for its LAT), and say nothing of another.

    The returned register is high in a cycle when no request of the unit was in flight at the start edge
    (an earlier job's, answered early, would answer this one's) and every busy cycle before it since then
    had ``resp_valid`` equal to ``req_valid`` of `lat` cycles before (the done cycle, when the check is
    made, follows the last response)."""
    sent = Signal(lat, name="sent")             # sent[k]: req_valid k + 1 cycles ago
    m.d.sync += sent.eq(Cat(req_valid, sent[:-1]))
    on_time = Signal(name="on_time")
    with m.If(start & ~busy):
        # the bits that reach sent[-1] after this edge: requests still to be answered
        m.d.sync += on_time.eq(sent[:-1] == 0)
    with m.Elif(busy & (resp_valid != sent[-1])):
        m.d.sync += on_time.eq(0)
    return on_time


class ReadCount:
    """The count of an external read stream: LD's, shared with GATHER (`hdl.units.gather`).

    Requests are issued one a cycle at most and answered in order; response k is written to the
    scratchpad word ``base + k`` as it arrives (``spad.we`` is ``resp_valid``, ``wdata`` the response).
    The two counters wrap at `width` bits; they differ by at most the requests outstanding (the
    memory's LAT), which must stay below ``2**width``.

    Parameters
    ----------
    width : int
        Bits of each counter.

    Attributes
    ----------
    issued, recvd : Signal(width)
        Requests issued and responses received since `clear`.
    """

    def __init__(self, width):
        self.width = width
        self.issued = Signal(width, name="issued")
        self.recvd = Signal(width, name="recvd")

    def clear(self):
        """Statements for the start edge: nothing issued, nothing received."""
        return [self.issued.eq(0), self.recvd.eq(0)]

    def write_side(self, spad, base, resp_valid, resp_data):
        """Comb statements of the scratchpad write: the response arriving now to ``base + recvd``."""
        return [spad.we.eq(resp_valid), spad.waddr.eq(base + self.recvd), spad.wdata.eq(resp_data)]

    def write_lanes(self, spad, base, resp_valid, resp_data, shift, lane_valid):
        """`write_side` for responses of several words (``ext_port`` > 1, docs/ext-port.md): response k is a
        group written from ``base + (k << shift)`` through the port's write lanes, word j of the group to
        lane j; `lane_valid` (a value of one bit a lane past 0) says which lanes past 0 hold a word of it."""
        lanes = len(spad.we_x) + 1
        return [spad.we.eq(resp_valid), spad.waddr.eq(base + (self.recvd << shift)),
                spad.wdata.eq(resp_data[:len(spad.wdata)]),
                spad.we_x.eq(lane_valid & resp_valid.replicate(lanes - 1)),
                *(spad.wdata_x[j - 1].eq(resp_data.word_select(j, len(spad.wdata))) for j in range(1, lanes))]

    def request(self):
        """Sync statement of a cycle that issues a request."""
        return self.issued.eq(self.issued + 1)

    def receive(self):
        """Sync statement of a cycle whose response arrives."""
        return self.recvd.eq(self.recvd + 1)

    def is_nth(self, n):
        """The response arriving now (if any) is the `n`-th: LD's last, with n its length. ``n - 1`` is
        signed: n = 0 never matches (as in the RTL)."""
        return self.recvd == n - 1

    def answered(self, resp_valid):
        """Every request issued is answered once this cycle's response (if `resp_valid`) is written:
        none outstanding, or the one arriving is the last (modulo the counters' width)."""
        return (self.recvd == self.issued) | (resp_valid & ((self.recvd + 1)[:self.width] == self.issued))


class DMA(Scoped, wiring.Component):
    """Block-read DMA with one outstanding request per cycle and fixed-latency responses: the LD unit.

    Its operands come in as ports (``dst``, ``src``, ``length``: the chip slices them from the
    instruction), not from ``ins``; like every unit it talks to the scratchpad through ``spad``, of
    which it uses the write side only (`READS`, `WRITES`: hardware spec 2.3).

    Parameters
    ----------
    aw : int, optional
        Scratchpad address and length width, at least 1 (default ``config.spad_addr_bits``).
    xw : int, optional
        External address width, at least 1 (default ``config.ext_addr_bits``).
    config : hdl.config.ChipConfig
        The chip this engine belongs to (keyword only; the book's chip by default).

    Ports
    -----
    start : In(1)
        Begins a transfer when idle (ignored while busy).
    dst : In(aw)
        First scratchpad word, sampled with `start`.
    src : In(xw)
        First external word, sampled with `start`.
    length : In(aw)
        Number of words, sampled with `start`; 0 never finishes (as in the RTL).
    busy : Out(1)
    done : Out(1)
        Registered one-cycle pulse after the last response was written.
    req_valid : Out(1)
        A read request this cycle: busy and not all requests issued.
    req_addr : Out(xw)
        src + number of requests already issued, wrapping at xw bits.
    resp_valid : In(1)
        Response word present (LAT cycles after its request).
    resp_data : In(config.word_bits * config.ext_port)
        The response's words, word k in bits 32k .. 32k + 31 (one word on the book's chip).
    spad : Out(SpadPort(aw, config.word_bits, lanes=config.ext_port))
        The scratchpad port, write side only (``raddr`` stays 0, ``rdata`` is not used): ``we`` equals
        resp_valid, ``waddr`` is dst + number of responses already received, wrapping at aw bits, and
        ``wdata`` is resp_data passed through.

    Raises
    ------
    TypeError, ValueError
        If `aw` or `xw` is not an integer of at least 1.
    """

    OP = Op.LD
    PORT_UNIT = True
    # its busy time, len + LAT + 1, is the memory's as much as the instruction's: the exact completion is
    # asserted for a memory answering in config.lat (`memory_on_time`; a unit target's responses are free,
    # so that is the property's antecedent there); tests/test_dma.py checks the timeline cycle by cycle
    READS = False
    WRITES = True
    # its write is the response arriving (`ReadCount.write_side`): tied to its requests at chip level
    # (sim.verify.formal.IN_FLIGHT_PROPERTIES), as the formal view of it needs the memory
    RESPONSE_WRITES = True

    def __init__(self, aw=None, xw=None, *, config=BOOK):
        self.config = config
        aw = config.spad_addr_bits if aw is None else aw
        xw = config.ext_addr_bits if xw is None else xw
        check_int(self, "aw", aw, 1)
        check_int(self, "xw", xw, 1)
        self._aw, self._xw = aw, xw
        super().__init__({
            "start":      In(1),
            "dst":        In(aw),
            "src":        In(xw),
            "length":     In(aw),
            "busy":       Out(1),
            "done":       Out(1),
            "req_valid":  Out(1),
            "req_addr":   Out(xw),
            "resp_valid": In(1),
            "resp_data":  In(config.word_bits * config.ext_port),
            "spad":       Out(SpadPort(aw, config.word_bits, lanes=config.ext_port)),
        })

    @property
    def aw(self):
        return self._aw

    @property
    def xw(self):
        return self._xw

    def elaborate(self, platform):
        m = Module()
        src_r = Signal(self._xw)
        dst_r = Signal(self._aw)
        len_r = Signal(self._aw)
        count = ReadCount(self._aw)
        P = self.config.ext_port
        if P == 1:
            groups = len_r  # P == 1: a group is a word
            pending = count.issued != groups
            m.d.comb += [
                self.req_valid.eq(self.busy & pending),
                self.req_addr.eq(src_r + count.issued),
                *count.write_side(self.spad, dst_r, self.resp_valid, self.resp_data),
            ]
        else:
            # docs/ext-port.md: request k asks for the P words from src + k*P, response k writes them from
            # dst + k*P, the lanes past the length left out (the last group may be partial)
            lg = P.bit_length() - 1
            groups = Signal(self._aw, name="groups")
            pending = count.issued != groups
            first = count.recvd << lg
            lane_valid = Cat(first + j < len_r for j in range(1, P))
            m.d.comb += [
                groups.eq((len_r + (P - 1)) >> lg),
                self.req_valid.eq(self.busy & pending),
                self.req_addr.eq(src_r + (count.issued << lg)),
                *count.write_lanes(self.spad, dst_r, self.resp_valid, self.resp_data, lg, lane_valid),
            ]

        # The units' control idiom (hdl.units.base.Unit.control): an FSM, busy = not IDLE.
        m.d.sync += self.done.eq(0)
        with m.FSM(name="ld_state") as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [src_r.eq(self.src), dst_r.eq(self.dst), len_r.eq(self.length),
                                 *count.clear()]
                    m.next = "XFER"
            with m.State("XFER"):
                with m.If(pending):
                    m.d.sync += count.request()
                with m.If(self.resp_valid):
                    m.d.sync += count.receive()
                    # with len 0 this never matches, as in the RTL
                    with m.If(count.is_nth(groups)):
                        m.d.sync += self.done.eq(1)
                        m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
        unit_protocol(m, self.scope, self.start, self.busy, self.done, Cat(src_r, dst_r, len_r))
        # for the chip's formal harness (sim.verify.formal.ChipEnv ties them to the responses in flight)
        self._count, self._dst_r, self._len_r, self._groups = count, dst_r, len_r, groups
        if checking():
            self.check_completion(m, len_r)
        return m

    def check_completion(self, m, n):
        """`COMPLETION_PROPERTIES` for the transfer of `n` words latched at the start edge (a length of at
        least 1: the chip runs no other, and 0 never finishes), when the memory answered on time
        (`memory_on_time`): done exactly ``hdl.isa.busy_cycles`` (n + LAT + 1, LAT = ``config.lat``) cycles
        after the start edge."""
        waited = completion_counter(m, self.start, self.busy)
        on_time = memory_on_time(m, self.start, self.busy, self.req_valid, self.resp_valid, self.config.lat)
        if self.config.ext_port == 1:
            a, b = linear_busy(self.OP, self.config)
            cycles = a * n + b
        else:
            # ceil(n / ext_port) groups (docs/ext-port.md)
            l, b = lanes_busy(self.OP, self.config, self.config.ext_port)
            cycles = ((n + (l - 1)) >> (l.bit_length() - 1)) + b
        History(m, self.scope).check("exact_completion", ~self.done | (n == 0) | ~on_time | (waited == cycles),
                                     COMPLETION_PROPERTIES["exact_completion"],
                                     covers={"done after a memory on time": self.done & on_time})
