"""ST unit: copies `len` scratchpad words to external memory (hardware spec 4.2). B = len + 2.

Element k is read in W(k+1) and written to external memory at the end of W(k+2), straight from the
scratchpad's read register; `done` is high in W(len+2).
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .isa import HW_OPERANDS, Op

__all__ = ["StoreUnit"]


def _operand(ins, op, name):
    hi, lo = HW_OPERANDS[op][name]
    return ins[lo:hi + 1]


# The latched operands, one register (a simulator then updates one signal instead of one per field).
_Operands = data.StructLayout({"src": 12, "dst": 16, "len": 12})


class StoreUnit(wiring.Component):
    """Scratchpad -> external memory copy engine.

    Ports
    -----
    start : In(1)
        Issue pulse; operands are latched when ``start & ~busy``.
    ins : In(128)
        Instruction register; src = a[11:0], dst = b (16 bits), len = c[11:0].
    busy, done : Out(1)
        Busy while copying; ``done`` is a registered one-cycle pulse in W(len+2).
    ra : Out(12)
        Scratchpad read address, ``src + i``.
    sp_rd : In(32)
        Scratchpad read data (registered by the scratchpad, one cycle after ``ra``).
    wr_valid, wr_addr, wr_data : Out(1), Out(16), Out(32)
        External write port; ``wr_data`` is ``sp_rd`` passed through.
    """

    start:    In(1)
    ins:      In(128)
    busy:     Out(1)
    done:     Out(1)
    ra:       Out(12)
    sp_rd:    In(32)
    wr_valid: Out(1)
    wr_addr:  Out(16)
    wr_data:  Out(32)

    def elaborate(self, platform):
        m = Module()
        opr = Signal(_Operands)
        src, dst, n = opr.src, opr.dst, opr.len
        i = Signal(12)
        j = Signal(12)
        v = Signal()

        m.d.comb += [
            self.ra.eq(src + i),
            self.wr_valid.eq(v),
            self.wr_addr.eq(dst + j),
            self.wr_data.eq(self.sp_rd),
        ]
        m.d.sync += self.done.eq(0)
        with m.If(self.start & ~self.busy):
            m.d.sync += [
                src.eq(_operand(self.ins, Op.ST, "src")),
                dst.eq(_operand(self.ins, Op.ST, "dst")),
                n.eq(_operand(self.ins, Op.ST, "len")),
                i.eq(0), j.eq(0), v.eq(0),
                self.busy.eq(1),
            ]
        with m.Elif(self.busy):
            m.d.sync += v.eq(i < n)
            with m.If(i < n):
                m.d.sync += i.eq(i + 1)
            with m.If(v):
                m.d.sync += j.eq(j + 1)
                # n - 1 is signed in Amaranth: a zero length never matches, as in the RTL.
                with m.If(j == n - 1):
                    m.d.sync += [self.busy.eq(0), self.done.eq(1), v.eq(0)]
        return m
