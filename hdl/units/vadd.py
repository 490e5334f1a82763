"""VADD unit: saturating int8 vector add over one scratchpad read port (hardware spec 4.4). B = 2·len + 2.

The two operands are read alternately: src1[k] in W(2k+1), src2[k] in W(2k+2); the first is held in
`x`, the sum is written at the end of W(2k+3) and `done` is high in W(2·len+2). States: IDLE, RUN.
"""

from amaranth.hdl import Module, Mux, Signal, signed

from hdl.isa import Op

from .base import SpadUnit

__all__ = ["VaddUnit"]


class VaddUnit(SpadUnit):
    """spad[dst+i] = sext(clamp(s8(spad[src1+i]) + s8(spad[src2+i]), -127, 127)).

    The ports are `SpadUnit`'s. dst, src1, src2 (12 bits) and len (16 bits) are latched at E0; ``spad.raddr``
    is ``src1 + cnt/2`` on even counts and ``src2 + cnt/2`` on odd ones; only ``spad.rdata[7:0]`` is used;
    ``done`` is high in W(2·len+2).
    """

    OP = Op.VADD

    def elaborate(self, platform):
        m = Module()
        opr = self.operand_register()
        s1, s2, dst, n = opr.src1, opr.src2, opr.dst, opr.len
        j = self.addr_signal("j")
        cnt = Signal(17)
        v = Signal()
        par = Signal()
        x = Signal(signed(8))

        total = Signal(signed(9))
        m.d.comb += total.eq(x + self.spad.rdata[:8].as_signed())
        result = Signal(signed(8))
        m.d.comb += result.eq(Mux(total > 127, 127, Mux(total < -127, -127, total[:8])))

        m.d.comb += [
            self.spad.raddr.eq(Mux(cnt[0], s2, s1) + cnt[1:]),
            self.spad.we.eq(v & par),
            self.spad.waddr.eq(dst + j),
            self.spad.wdata.eq(result),
        ]
        with self.control(m):
            with m.State("IDLE"):
                with m.If(self.start):
                    self.begin(m, opr)
                    m.d.sync += [cnt.eq(0), j.eq(0), v.eq(0)]
                    m.next = "RUN"
            with m.State("RUN"):
                more = cnt < (n << 1)
                m.d.sync += [v.eq(more), par.eq(cnt[0])]
                with m.If(more):
                    m.d.sync += cnt.eq(cnt + 1)
                with m.If(v & ~par):
                    m.d.sync += x.eq(self.spad.rdata[:8])
                with m.If(v & par):
                    m.d.sync += j.eq(j + 1)
                    with m.If(j == n - 1):
                        self.finish(m)
                        m.d.sync += v.eq(0)
        self.check_protocol(m, opr)
        return m
