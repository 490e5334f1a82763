"""AMAX unit: index of the first maximum of `len` signed 32-bit words (hardware spec 4.5). B = len + 3.

Element k is compared in W(k+2); the index is written once, in W(len+2) while `fin` is high, and
`done` is high in W(len+3). Ties keep the lower index (strictly-greater comparison).
"""

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .isa import HW_OPERANDS, Op

__all__ = ["ArgmaxUnit"]


def _operand(ins, op, name):
    hi, lo = HW_OPERANDS[op][name]
    return ins[lo:hi + 1]


# The latched operands, one register (a simulator then updates one signal instead of one per field).
_Operands = data.StructLayout({"src": 12, "dst": 12, "len": 12})


class ArgmaxUnit(wiring.Component):
    """spad[dst] = index of the first maximum of s32(spad[src .. src+len-1]).

    Ports
    -----
    start : In(1)
        Issue pulse; dst, src and len are latched when ``start & ~busy``.
    ins : In(128)
        Instruction register.
    busy, done : Out(1)
        Busy while running; ``done`` is a registered one-cycle pulse in W(len+3).
    ra : Out(12)
        Scratchpad read address, ``src + i``.
    sp_rd : In(32)
        Scratchpad read data.
    we, wa, wd : Out(1), Out(12), Out(32)
        Scratchpad write port: ``we = fin``, ``wa = dst``, ``wd`` = the index zero-extended.
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
        src, dst, n = opr.src, opr.dst, opr.len
        i = Signal(12)
        j = Signal(12)
        bidx = Signal(12)
        best = Signal(signed(32))
        v = Signal()
        fin = Signal()

        m.d.comb += [
            self.ra.eq(src + i),
            self.we.eq(fin),
            self.wa.eq(dst),
            self.wd.eq(bidx),
        ]
        m.d.sync += self.done.eq(0)
        with m.If(self.start & ~self.busy):
            m.d.sync += [
                src.eq(_operand(self.ins, Op.AMAX, "src")),
                dst.eq(_operand(self.ins, Op.AMAX, "dst")),
                n.eq(_operand(self.ins, Op.AMAX, "len")),
                i.eq(0), j.eq(0), v.eq(0), fin.eq(0),
                self.busy.eq(1),
            ]
        with m.Elif(self.busy):
            with m.If(fin):
                m.d.sync += [fin.eq(0), self.busy.eq(0), self.done.eq(1)]
            with m.Else():
                m.d.sync += v.eq(i < n)
                with m.If(i < n):
                    m.d.sync += i.eq(i + 1)
                with m.If(v):
                    # j == 0 loads the first element whatever `best` held before.
                    with m.If((j == 0) | (self.sp_rd.as_signed() > best)):
                        m.d.sync += [best.eq(self.sp_rd), bidx.eq(j)]
                    m.d.sync += j.eq(j + 1)
                    with m.If(j == n - 1):
                        m.d.sync += fin.eq(1)
        return m
