"""VADD unit: saturating int8 vector add over one scratchpad read port (hardware spec 4.4). B = 2·len + 2.

The two operands are read alternately: src1[k] in W(2k+1), src2[k] in W(2k+2); the first is held in
`x`, the sum is written at the end of W(2k+3) and `done` is high in W(2·len+2).
"""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .isa import HW_OPERANDS, Op

__all__ = ["VaddUnit"]


def _operand(ins, op, name):
    hi, lo = HW_OPERANDS[op][name]
    return ins[lo:hi + 1]


# The latched operands, one register (a simulator then updates one signal instead of one per field).
_Operands = data.StructLayout({"src1": 12, "src2": 12, "dst": 12, "len": 16})


class VaddUnit(wiring.Component):
    """spad[dst+i] = sext(clamp(s8(spad[src1+i]) + s8(spad[src2+i]), -127, 127)).

    Ports
    -----
    start : In(1)
        Issue pulse; dst, src1, src2 (12 bits) and len (16 bits) are latched when ``start & ~busy``.
    ins : In(128)
        Instruction register.
    busy, done : Out(1)
        Busy while running; ``done`` is a registered one-cycle pulse in W(2·len+2).
    ra : Out(12)
        Scratchpad read address: ``src1 + cnt/2`` on even counts, ``src2 + cnt/2`` on odd ones.
    sp_rd : In(32)
        Scratchpad read data (only bits [7:0] are used).
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
        opr = Signal(_Operands)
        s1, s2, dst, n = opr.src1, opr.src2, opr.dst, opr.len
        j = Signal(12)
        cnt = Signal(17)
        v = Signal()
        par = Signal()
        x = Signal(signed(8))

        total = Signal(signed(9))
        m.d.comb += total.eq(x + self.sp_rd[:8].as_signed())
        result = Signal(signed(8))
        m.d.comb += result.eq(Mux(total > 127, 127, Mux(total < -127, -127, total[:8])))

        m.d.comb += [
            self.ra.eq(Mux(cnt[0], s2, s1) + cnt[1:]),
            self.we.eq(v & par),
            self.wa.eq(dst + j),
            self.wd.eq(result),
        ]
        m.d.sync += self.done.eq(0)
        with m.If(self.start & ~self.busy):
            m.d.sync += [
                s1.eq(_operand(self.ins, Op.VADD, "src1")),
                s2.eq(_operand(self.ins, Op.VADD, "src2")),
                dst.eq(_operand(self.ins, Op.VADD, "dst")),
                n.eq(_operand(self.ins, Op.VADD, "len")),
                cnt.eq(0), j.eq(0), v.eq(0),
                self.busy.eq(1),
            ]
        with m.Elif(self.busy):
            more = cnt < (n << 1)
            m.d.sync += [v.eq(more), par.eq(cnt[0])]
            with m.If(more):
                m.d.sync += cnt.eq(cnt + 1)
            with m.If(v & ~par):
                m.d.sync += x.eq(self.sp_rd[:8])
            with m.If(v & par):
                m.d.sync += j.eq(j + 1)
                with m.If(j == n - 1):
                    m.d.sync += [self.busy.eq(0), self.done.eq(1), v.eq(0)]
        return m
