"""RQ unit: requantizes `len` int32 words to int8 (hardware spec 4.3). B = len + 2.

The ST skeleton with the scratchpad as destination: element k is read in W(k+1), goes through the
combinational requantizer and is written at the end of W(k+2); `done` is high in W(len+2).
"""

from amaranth.hdl import Module

from .isa import Op
from .requant import Requantizer
from .unit import SpadUnit

__all__ = ["RequantUnit"]


class RequantUnit(SpadUnit):
    """Vector requantizer: spad[dst+i] = sext(requant(s32(spad[src+i]), m, s, relu)).

    The ports are `SpadUnit`'s. dst, src, len, m, s and relu are latched at E0; ``ra = src + i``;
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
            rq.acc.eq(self.sp_rd),
            rq.m.eq(mant),
            rq.s.eq(shift),
            rq.relu.eq(relu),
            self.ra.eq(src + i),
            self.we.eq(v),
            self.wa.eq(dst + j),
            self.wd.eq(rq.q),        # q is signed(8): the assignment sign-extends it
        ]
        self.check_protocol(m, opr)
        return m
