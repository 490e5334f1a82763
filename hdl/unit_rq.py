"""RQ unit: requantizes `len` int32 words to int8 (hardware spec 4.3). B = len + 2.

The ST skeleton with the scratchpad as destination: element k is read in W(k+1), goes through the
combinational requantizer and is written at the end of W(k+2); `done` is high in W(len+2).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .isa import HW_OPERANDS, Op
from .requant import Requantizer

__all__ = ["RequantUnit"]


def _operand(ins, op, name):
    hi, lo = HW_OPERANDS[op][name]
    return ins[lo:hi + 1]


# The latched operands, one register (a simulator then updates one signal instead of one per field).
_Operands = data.StructLayout({"src": 12, "dst": 12, "len": 12, "m": 24, "s": 6, "relu": 1})


class RequantUnit(wiring.Component):
    """Vector requantizer: spad[dst+i] = sext(requant(s32(spad[src+i]), m, s, relu)).

    Ports
    -----
    start : In(1)
        Issue pulse; operands (dst, src, len, m, s, relu) are latched when ``start & ~busy``.
    ins : In(128)
        Instruction register.
    busy, done : Out(1)
        Busy while running; ``done`` is a registered one-cycle pulse in W(len+2).
    ra : Out(12)
        Scratchpad read address, ``src + i``.
    sp_rd : In(32)
        Scratchpad read data.
    we, wa, wd : Out(1), Out(12), Out(32)
        Scratchpad write port.
    """

    start: In(1)
    ins:   In(128)
    busy:  Out(1)
    done:  Out(1)
    ra:    Out(12)
    sp_rd: In(32)
    we:    Out(1)
    wa:    Out(12)
    wd:    Out(32)

    def elaborate(self, platform):
        m = Module()
        m.submodules.requant = rq = Requantizer()
        opr = Signal(_Operands)
        src, dst, n, mant, shift, relu = opr.src, opr.dst, opr.len, opr.m, opr.s, opr.relu
        i = Signal(12)
        j = Signal(12)
        v = Signal()

        m.d.comb += [
            rq.acc.eq(self.sp_rd),
            rq.m.eq(mant),
            rq.s.eq(shift),
            rq.relu.eq(relu),
            self.ra.eq(src + i),
            self.we.eq(v),
            self.wa.eq(dst + j),
            self.wd.eq(rq.q),        # q is signed(8): the assignment sign-extends it
        ]
        m.d.sync += self.done.eq(0)
        with m.If(self.start & ~self.busy):
            m.d.sync += [
                src.eq(_operand(self.ins, Op.RQ, "src")),
                dst.eq(_operand(self.ins, Op.RQ, "dst")),
                n.eq(_operand(self.ins, Op.RQ, "len")),
                mant.eq(_operand(self.ins, Op.RQ, "m")),
                shift.eq(_operand(self.ins, Op.RQ, "s")),
                relu.eq(_operand(self.ins, Op.RQ, "relu")),
                i.eq(0), j.eq(0), v.eq(0),
                self.busy.eq(1),
            ]
        with m.Elif(self.busy):
            m.d.sync += v.eq(i < n)
            with m.If(i < n):
                m.d.sync += i.eq(i + 1)
            with m.If(v):
                m.d.sync += j.eq(j + 1)
                with m.If(j == n - 1):
                    m.d.sync += [self.busy.eq(0), self.done.eq(1), v.eq(0)]
        return m
