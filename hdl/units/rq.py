"""RQ unit: requantizes `len` int32 words to int8 (hardware spec 4.3). B = len + 2.

The ST skeleton with the scratchpad as destination: element k is read in W(k+1), goes through the
combinational requantizer and is written at the end of W(k+2); `done` is high in W(len+2).
"""

from amaranth.hdl import Module

from hdl.isa import Op
from hdl.requant import Requantizer

from .base import SpadUnit

__all__ = ["RequantUnit"]


class RequantUnit(SpadUnit):
    """Vector requantizer: spad[dst+i] = sext(requant(s32(spad[src+i]), m, s, relu)).

    The ports are `SpadUnit`'s. dst, src, len, m, s and relu are latched at E0; ``spad.raddr = src + i``;
    ``done`` is high in W(len+2).
    """

    OP = Op.RQ

    def elaborate(self, platform):
        m = Module()
        m.submodules.requant = rq = Requantizer()
        opr = self.operand_register()
        src, dst, n, mant, shift, relu = opr.src, opr.dst, opr.len, opr.m, opr.s, opr.relu
        i, j, v = self.one_pass(m, opr, n)

        m.d.comb += [
            rq.acc.eq(self.spad.rdata),
            rq.m.eq(mant),
            rq.s.eq(shift),
            rq.relu.eq(relu),
            self.spad.raddr.eq(src + i),
            self.spad.we.eq(v),
            self.spad.waddr.eq(dst + j),
            self.spad.wdata.eq(rq.q),        # q is signed(8): the assignment sign-extends it
        ]
        self.check_protocol(m, opr)
        return m
