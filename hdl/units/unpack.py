"""UNPACK unit: int4 nibbles to sign-extended words (hardware spec 4.8). B = 10·len + 1.

States IDLE, RD, LAT, WR. Source word i takes ten cycles: its read is presented in W(10i+1) (RD),
latched in W(10i+2) (LAT), and its nibbles 0..7 are written in W(10i+3) .. W(10i+10) (WR); `done` is
high in W(10·len+1).
"""

from amaranth.hdl import Module, Signal

from hdl.isa import Op

from .base import SpadUnit

__all__ = ["UnpackUnit"]


class UnpackUnit(SpadUnit):
    """spad[dst + 8i + j] = sext4(nibble j of spad[src + i]) for i < len, j < 8.

    The ports are `SpadUnit`'s. dst, src and len (packed source words) are latched at E0;
    ``spad.raddr = src + i``; one nibble is written per cycle in the WR phase; ``done`` is high in W(10·len+1).
    """

    OP = Op.UNPACK

    def out_words(self, opr):
        """Eight words a source word."""
        return opr.len << 3

    def elaborate(self, platform):
        m = Module()
        opr = self.operand_register()
        src, dst, n = opr.src, opr.dst, opr.len
        i = self.addr_signal("i")
        j = Signal(3)
        w = Signal(32)

        m.d.comb += [
            self.spad.raddr.eq(src + i),
            self.spad.waddr.eq(dst + (i << 3) + j),
            self.spad.wdata.eq(w.word_select(j, 4).as_signed()),
        ]
        with self.control(m) as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    self.begin(m, opr)
                    m.d.sync += i.eq(0)
                    m.next = "RD"
            with m.State("RD"):
                m.next = "LAT"
            with m.State("LAT"):
                m.d.sync += [w.eq(self.spad.rdata), j.eq(0)]
                m.next = "WR"
            with m.State("WR"):
                m.d.sync += j.eq(j + 1)
                with m.If(j == 7):
                    with m.If(i == n - 1):
                        self.finish(m)
                    with m.Else():
                        m.d.sync += i.eq(i + 1)
                        m.next = "RD"
        m.d.comb += self.spad.we.eq(fsm.ongoing("WR"))
        self.check_protocol(m, opr)
        return m
