"""AMAX unit: index of the first maximum of `len` signed 32-bit words (hardware spec 4.5). B = len + 3.

Element k is compared in W(k+2); the index is written once, in W(len+2) while `fin` is high, and
`done` is high in W(len+3). Ties keep the lower index (strictly-greater comparison).
"""

from amaranth.hdl import Module, Signal, signed

from hdl.isa import Op

from .base import SpadUnit

__all__ = ["ArgmaxUnit"]


class ArgmaxUnit(SpadUnit):
    """spad[dst] = index of the first maximum of s32(spad[src .. src+len-1]).

    The ports are `SpadUnit`'s. dst, src and len are latched at E0; ``spad.raddr = src + i``; the write port
    has ``we = fin``, ``waddr = dst`` and ``wdata`` = the index zero-extended; ``done`` is high in W(len+3).
    """

    OP = Op.AMAX

    def elaborate(self, platform):
        m = Module()
        opr = self.operand_register()
        src, dst, n = opr.src, opr.dst, opr.len
        i = self.addr_signal("i")
        j = self.addr_signal("j")
        bidx = self.addr_signal("bidx")
        best = Signal(signed(32))
        v = Signal()
        fin = Signal()

        m.d.comb += [
            self.spad.raddr.eq(src + i),
            self.spad.we.eq(fin),
            self.spad.waddr.eq(dst),
            self.spad.wdata.eq(bidx),
        ]
        self.done_pulse(m)
        with m.If(self.start & ~self.busy):
            self.begin(m, opr)
            m.d.sync += [i.eq(0), j.eq(0), v.eq(0), fin.eq(0)]
        with m.Elif(self.busy):
            with m.If(fin):
                self.finish(m)
                m.d.sync += fin.eq(0)
            with m.Else():
                m.d.sync += v.eq(i < n)
                with m.If(i < n):
                    m.d.sync += i.eq(i + 1)
                with m.If(v):
                    # j == 0 loads the first element whatever `best` held before.
                    with m.If((j == 0) | (self.spad.rdata.as_signed() > best)):
                        m.d.sync += [best.eq(self.spad.rdata), bidx.eq(j)]
                    m.d.sync += j.eq(j + 1)
                    with m.If(j == n - 1):
                        m.d.sync += fin.eq(1)
        self.check_protocol(m, opr)
        return m
