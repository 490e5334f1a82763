"""UNPACK unit: int4 nibbles to sign-extended words (hardware spec 4.8). B = 10·len + 1.

Source word i takes ten cycles: its read is presented in W(10i+1) (RD), latched in W(10i+2) (LAT),
and its nibbles 0..7 are written in W(10i+3) .. W(10i+10) (WR); `done` is high in W(10·len+1).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from .isa import HW_OPERANDS, Op

__all__ = ["UnpackUnit"]


def _operand(ins, op, name):
    hi, lo = HW_OPERANDS[op][name]
    return ins[lo:hi + 1]


# The latched operands, one register (a simulator then updates one signal instead of one per field).
_Operands = data.StructLayout({"src": 12, "dst": 12, "len": 12})


class _Phase(enum.Enum, shape=2):
    RD = 0
    LAT = 1
    WR = 2


class UnpackUnit(wiring.Component):
    """spad[dst + 8i + j] = sext4(nibble j of spad[src + i]) for i < len, j < 8.

    Ports
    -----
    start : In(1)
        Issue pulse; dst, src and len (packed source words) are latched when ``start & ~busy``.
    ins : In(128)
        Instruction register.
    busy, done : Out(1)
        Busy while running; ``done`` is a registered one-cycle pulse in W(10·len+1).
    ra : Out(12)
        Scratchpad read address, ``src + i``.
    sp_rd : In(32)
        Scratchpad read data.
    we, wa, wd : Out(1), Out(12), Out(32)
        Scratchpad write port (one nibble per cycle in the WR phase).
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
        j = Signal(3)
        w = Signal(32)
        phase = Signal(_Phase)

        m.d.comb += [
            self.ra.eq(src + i),
            self.we.eq(self.busy & (phase == _Phase.WR)),
            self.wa.eq(dst + (i << 3) + j),
            self.wd.eq(w.word_select(j, 4).as_signed()),
        ]
        m.d.sync += self.done.eq(0)
        with m.If(self.start & ~self.busy):
            m.d.sync += [
                src.eq(_operand(self.ins, Op.UNPACK, "src")),
                dst.eq(_operand(self.ins, Op.UNPACK, "dst")),
                n.eq(_operand(self.ins, Op.UNPACK, "len")),
                i.eq(0), phase.eq(_Phase.RD),
                self.busy.eq(1),
            ]
        with m.Elif(self.busy):
            with m.Switch(phase):
                with m.Case(_Phase.RD):
                    m.d.sync += phase.eq(_Phase.LAT)
                with m.Case(_Phase.LAT):
                    m.d.sync += [w.eq(self.sp_rd), j.eq(0), phase.eq(_Phase.WR)]
                with m.Case(_Phase.WR):
                    m.d.sync += j.eq(j + 1)
                    with m.If(j == 7):
                        with m.If(i == n - 1):
                            m.d.sync += [self.busy.eq(0), self.done.eq(1)]
                        with m.Else():
                            m.d.sync += [i.eq(i + 1), phase.eq(_Phase.RD)]
        return m
