"""GA2: the chip top, a FETCH/ISSUE/WAIT sequencer over eight units sharing one scratchpad (hardware spec 2).

Each non-HALT instruction costs 1 FETCH + 1 ISSUE + B WAIT cycles, B being its unit's busy time (the
unit's `done` pulse is seen in the last WAIT cycle); HALT costs 2. `cur` decides which unit drives the
scratchpad ports (spec 2.3); the five counters are cleared by `start` and wrap at 2^counter_bits (2^32).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

from .config import BOOK
from .dma import DMA
from .isa import HW_OPERANDS, Op
from .properties import History
from .scratchpad import Scratchpad
from .unit_amax import ArgmaxUnit
from .unit_mm import MatrixUnit
from .unit_rq import RequantUnit
from .unit_sm import SoftmaxUnit
from .unit_st import StoreUnit
from .unit_unpack import UnpackUnit
from .unit_vadd import VaddUnit

__all__ = ["GA2", "SeqState", "CUR_NONE", "CHIP_PROPERTIES"]

CUR_NONE = 15       # `cur` when no unit owns the scratchpad

# The chip's properties (hdl/properties.py), by name, with the statement sim.formal prints.
CHIP_PROPERTIES = {
    "owner_writes": "only the unit named by cur writes the scratchpad, and no unit raises we without it",
    "dma_in_range": "LD writes only inside [dst, dst+len) (mod the scratchpad depth) of the LD in the instruction register",
    "counters": "outside IDLE, total = 2*n_inst + mm + dma + vec + (0 FETCH, 1 ISSUE, 2 WAIT/HALT) mod 2^counter_bits",
    "state_legal": "the sequencer state is one of IDLE, FETCH, ISSUE, WAIT, HALT",
    "halt_stays": "once in HALT, the sequencer stays there with halted high until a reset",
}


class SeqState(enum.Enum, shape=3):
    IDLE = 0
    FETCH = 1
    ISSUE = 2
    WAIT = 3
    HALT = 4


class GA2(wiring.Component):
    """The GA-2 accelerator (ports of hardware spec 2.1 minus clk/rst; ``rst`` is the sync domain's).

    Parameters
    ----------
    config : hdl.config.ChipConfig
        The chip to build (keyword only; the book's chip by default): scratchpad depth, array size,
        operand memory depth, counter width. Every block inside is built from the same configuration.

    Ports
    -----
    start : In(1)
        Start pulse, sampled only in IDLE: pc, counters and ``halted`` are cleared and FETCH begins.
    halted : Out(1)
        Register, set when a HALT is issued.
    imem_addr : Out(16)
        The program counter.
    imem_data : In(128)
        Program ROM word at ``imem_addr``; must be combinational (sampled at the end of FETCH).
    req_valid, req_addr : Out(1), Out(16)
        External read request, straight from the LD unit (the DMA).
    resp_valid, resp_data : In(1), In(config.word_bits)
        External read response, LAT cycles after the request.
    wr_valid, wr_addr, wr_data : Out(1), Out(16), Out(config.word_bits)
        External write, straight from the ST unit.
    cyc_total, cyc_mm, cyc_dma, cyc_vec, n_inst : Out(config.counter_bits)
        Counters: all cycles from the first FETCH to the HALT's ISSUE, WAIT cycles of MM, of LD/ST,
        of every other opcode (illegal ones included), and completed non-HALT instructions.

    Attributes
    ----------
    scratchpad : Scratchpad
        The ``config.spad_depth`` x ``config.word_bits`` scratchpad (its ``.memory`` can be read and written by a simulator).
    state, pc, cur : Signal
        Sequencer registers, exposed so that a simulator can say where a program hangs.
    """

    def __init__(self, *, config=BOOK):
        self.config = cfg = config
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
            "resp_data":  In(w),
            "wr_valid":   Out(1),
            "wr_addr":    Out(xw),
            "wr_data":    Out(w),
            "cyc_total":  Out(c),
            "cyc_mm":     Out(c),
            "cyc_dma":    Out(c),
            "cyc_vec":    Out(c),
            "n_inst":     Out(c),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.scratchpad = sp = self.scratchpad
        cfg = self.config
        m.submodules.ld = ld = DMA(config=cfg)
        units = {op: cls(config=cfg) for op, cls in (
            (Op.ST, StoreUnit), (Op.MM, MatrixUnit), (Op.RQ, RequantUnit), (Op.SM, SoftmaxUnit),
            (Op.VADD, VaddUnit), (Op.AMAX, ArgmaxUnit), (Op.UNPACK, UnpackUnit))}
        for op, unit in units.items():
            m.submodules[op.name.lower()] = unit

        st, pc, cur = self.state, self.pc, self.cur
        ins = Signal(128)
        opcode = ins[124:128]
        go = Signal()
        m.d.comb += [go.eq(st == SeqState.ISSUE), self.imem_addr.eq(pc)]

        # The wiring lives in two small submodules so that a simulator re-evaluates each only when its
        # own inputs change: `decode` when a new instruction is fetched or issued, `port` when the
        # owning unit moves its scratchpad address/write signals or the read data changes.
        m.submodules.decode = dec = Module()
        m.submodules.port = port = Module()

        # ---- units: the instruction register goes to everyone, `start` only to the named unit ----
        for op, unit in units.items():
            dec.d.comb += [unit.ins.eq(ins), unit.start.eq(go & (opcode == op))]

        def ld_field(name):
            hi, lo = HW_OPERANDS[Op.LD][name]
            return ins[lo:hi + 1]

        dec.d.comb += [
            ld.start.eq(go & (opcode == Op.LD)),
            ld.dst.eq(ld_field("dst")),
            ld.src.eq(ld_field("src")),
            ld.length.eq(ld_field("len")),
        ]
        m.d.comb += [
            self.req_valid.eq(ld.req_valid),
            self.req_addr.eq(ld.req_addr),
            ld.resp_valid.eq(self.resp_valid),
            ld.resp_data.eq(self.resp_data),
        ]
        store = units[Op.ST]
        m.d.comb += [
            self.wr_valid.eq(store.wr_valid),
            self.wr_addr.eq(store.wr_addr),
            self.wr_data.eq(store.wr_data),
        ]

        # ---- scratchpad ownership by `cur` (spec 2.3) ----
        # The read data is delivered to the owning unit only (the others see 0). This is invisible:
        # a unit uses `sp_rd` only while busy, and it owns the port (cur) for its whole busy time;
        # it spares the simulator from waking the idle units on every read.
        amax = units[Op.AMAX]
        port.d.comb += [sp.raddr.eq(0), sp.we.eq(0), sp.waddr.eq(amax.wa), sp.wdata.eq(amax.wd)]
        done = Signal()
        with port.Switch(cur):
            with port.Case(Op.LD):
                port.d.comb += [sp.we.eq(ld.we), sp.waddr.eq(ld.wa), sp.wdata.eq(ld.wd), done.eq(ld.done)]
            with port.Case(Op.ST):
                port.d.comb += [sp.raddr.eq(store.ra), store.sp_rd.eq(sp.rdata), done.eq(store.done)]
            for op in (Op.MM, Op.RQ, Op.SM, Op.VADD, Op.AMAX, Op.UNPACK):
                unit = units[op]
                with port.Case(op):
                    port.d.comb += [sp.raddr.eq(unit.ra), sp.we.eq(unit.we), unit.sp_rd.eq(sp.rdata),
                                    done.eq(unit.done)]
                    if op != Op.AMAX:
                        port.d.comb += [sp.waddr.eq(unit.wa), sp.wdata.eq(unit.wd)]
                    if op == Op.MM and cfg.mm_load > 1:
                        # the scratchpad's other read ports serve only MM's operand staging
                        port.d.comb += [sp.raddr_x.eq(unit.ra_x), unit.sp_rd_x.eq(sp.rdata_x)]

        # ---- sequencer (spec 2.2) ----
        with m.Switch(st):
            with m.Case(SeqState.IDLE):
                with m.If(self.start):
                    m.d.sync += [
                        pc.eq(0), st.eq(SeqState.FETCH), self.halted.eq(0),
                        self.cyc_total.eq(0), self.cyc_mm.eq(0), self.cyc_dma.eq(0),
                        self.cyc_vec.eq(0), self.n_inst.eq(0),
                    ]
            with m.Case(SeqState.FETCH):
                m.d.sync += [ins.eq(self.imem_data), self.cyc_total.eq(self.cyc_total + 1),
                             st.eq(SeqState.ISSUE)]
            with m.Case(SeqState.ISSUE):
                m.d.sync += self.cyc_total.eq(self.cyc_total + 1)
                with m.If(opcode == Op.HALT):
                    m.d.sync += [st.eq(SeqState.HALT), self.halted.eq(1), cur.eq(CUR_NONE)]
                with m.Else():
                    m.d.sync += [st.eq(SeqState.WAIT), cur.eq(opcode)]
            with m.Case(SeqState.WAIT):
                m.d.sync += self.cyc_total.eq(self.cyc_total + 1)
                with m.If(cur == Op.MM):
                    m.d.sync += self.cyc_mm.eq(self.cyc_mm + 1)
                with m.Elif((cur == Op.LD) | (cur == Op.ST)):
                    m.d.sync += self.cyc_dma.eq(self.cyc_dma + 1)
                with m.Else():
                    m.d.sync += self.cyc_vec.eq(self.cyc_vec + 1)
                with m.If(done):
                    m.d.sync += [pc.eq(pc + 1), self.n_inst.eq(self.n_inst + 1),
                                 cur.eq(CUR_NONE), st.eq(SeqState.FETCH)]
            # HALT: nothing until rst.

        self._check_properties(m, ins, sp, ld, units)
        return m

    def _check_properties(self, m, ins, sp, ld, units):
        """The chip's properties (``CHIP_PROPERTIES``) as Asserts; ``python -m sim.formal`` proves them."""
        h = History(m, "chip")
        st, cur = self.state, self.cur
        t = CHIP_PROPERTIES

        # Only the owner writes: a unit raises `we` only while it owns the port, and the scratchpad's
        # write port carries exactly the owner's write (nothing when no writing unit owns it).
        writers = {Op.LD: ld, **{op: u for op, u in units.items() if op != Op.ST}}
        owned = 0
        for op, u in writers.items():
            mine = cur == op
            owned = owned | mine
            h.check("owner_writes", ~u.we | mine, t["owner_writes"])
            h.check("owner_writes", ~mine | ((sp.we == u.we) & (~u.we | ((sp.waddr == u.wa) &
                                                                         (sp.wdata == u.wd)))),
                    t["owner_writes"])
        h.check("owner_writes", owned | ~sp.we, t["owner_writes"])

        # The LD engine writes inside [dst, dst+len) of the instruction it executes (modulo the
        # scratchpad's depth, as its addresses wrap); dst and len are read from the instruction
        # register, not the engine.
        hi, lo = HW_OPERANDS[Op.LD]["dst"]
        dst = ins[lo:hi + 1]
        hi, lo = HW_OPERANDS[Op.LD]["len"]
        length = ins[lo:hi + 1]
        h.check("dma_in_range", ~(sp.we & (cur == Op.LD)) | ((sp.waddr - dst)[:self.config.spad_addr_bits] < length),
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
        relation = (self.cyc_total == ((self.n_inst << 1) + self.cyc_mm + self.cyc_dma + self.cyc_vec + k)[:self.config.counter_bits])
        h.check("counters", (st == SeqState.IDLE) | relation, t["counters"])
        h.check("state_legal", st.as_value() <= SeqState.HALT.value, t["state_legal"])

        # HALT is left only by a reset.
        was_halt = h.past(st == SeqState.HALT, "halt")
        h.check("halt_stays", ~(h.valid & was_halt) | ((st == SeqState.HALT) & self.halted),
                t["halt_stays"])
