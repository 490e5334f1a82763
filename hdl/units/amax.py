"""AMAX unit: index of the first maximum of `len` signed 32-bit words (hardware spec 4.5). B = len + 3.

States IDLE, SCAN, WRITE: element k is compared in W(k+2); the index is written once, in W(len+2)
(WRITE), and `done` is high in W(len+3). Ties keep the lower index (strictly-greater comparison).
"""

from amaranth.hdl import Module, Signal, signed

from hdl.isa import Op

from .base import SpadUnit

__all__ = ["ArgmaxUnit"]


class ArgmaxUnit(SpadUnit):
    """spad[dst] = index of the first maximum of s32(spad[src .. src+len-1]).

    The ports are `SpadUnit`'s. dst, src and len are latched at E0; ``spad.raddr = src + i``; the write port
    writes in WRITE: ``waddr = dst`` and ``wdata`` = the index zero-extended; ``done`` is high in W(len+3).
    """

    OP = Op.AMAX

    def out_words(self, opr):
        """The index goes to dst alone."""
        return 1

    def elaborate(self, platform):
        m = Module()
        opr = self.operand_register()
        src, dst, n = opr.src, opr.dst, opr.len
        i = self.addr_signal("i")
        j = self.addr_signal("j")
        bidx = self.addr_signal("bidx")
        best = Signal(signed(32))
        v = Signal()

        m.d.comb += [
            self.spad.raddr.eq(src + i),
            self.spad.waddr.eq(dst),
            self.spad.wdata.eq(bidx),
        ]
        with self.control(m) as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    self.begin(m, opr)
                    m.d.sync += [i.eq(0), j.eq(0), v.eq(0)]
                    m.next = "SCAN"
            with m.State("SCAN"):
                m.d.sync += v.eq(i < n)
                with m.If(i < n):
                    m.d.sync += i.eq(i + 1)
                with m.If(v):
                    # j == 0 loads the first element whatever `best` held before.
                    with m.If((j == 0) | (self.spad.rdata.as_signed() > best)):
                        m.d.sync += [best.eq(self.spad.rdata), bidx.eq(j)]
                    m.d.sync += j.eq(j + 1)
                    with m.If(j == n - 1):
                        m.next = "WRITE"
            with m.State("WRITE"):
                self.finish(m)
        m.d.comb += self.spad.we.eq(fsm.ongoing("WRITE"))
        self.check_protocol(m, opr)
        return m
