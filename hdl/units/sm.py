"""SM, the chip's softmax unit (hardware spec 4.6): Q0.16 probabilities of len int8 scores.

Timing: start is sampled at E0; P1 (len+1 cycles) finds the max, P2 (len+1) writes e = T[max - x] to dst
and sums it, DIVS (1) starts the 40-bit divider on 2^38 / sum, WAITD (42) waits for it, P3 (len+1) reads e
back from dst and writes (e*r + 2^21) >> 22 over it; done is high in W_B with B = 3*len + 47. On a chip
with ``sm_div`` = b (docs/sm-div.md) the divider finds b quotient bits a cycle: WAITD lasts 40/b + 2
cycles and B = 3*len + 7 + 40/b (``hdl.isa.sm_busy_cycles``).
"""
from amaranth.hdl import Module, Signal, signed

from hdl.arith import SOFTMAX_NUM as RECIP_NUM    # the divider's constant numerator, defined once
from hdl.divider import Divider
from hdl.exp_lut import ExpTable
from hdl.isa import SM_DIV_WIDTH, Op

from .base import SpadUnit

__all__ = ["SoftmaxUnit"]

DIV_WIDTH = SM_DIV_WIDTH


class SoftmaxUnit(SpadUnit):
    """The SM unit: three passes over the scores with one division between the second and the third.

    The ports are `SpadUnit`'s. dst, src and len are latched at E0; dst may equal src (in-place):
    element k+1 is read in the cycle element k is written. ``spad.raddr`` is src+i in P1 and P2, dst+i
    in P3;
    the write port writes e in P2 and the probability in P3, both at dst+j. The e values live in dst
    between P2 and P3.
    """

    OP = Op.SM

    def elaborate(self, platform):
        m = Module()

        m.submodules.exp = exp = ExpTable()
        m.submodules.div = div = Divider(DIV_WIDTH, bits=self.config.sm_div)

        opr = self.operand_register()
        src, dst, length = opr.src, opr.dst, opr.len
        i = self.addr_signal("i")          # next element to read
        j = self.addr_signal("j")          # element whose data is in spad.rdata when v is set
        v = Signal()
        mx = Signal(signed(8))
        total = Signal(32)
        r = Signal(DIV_WIDTH)
        d_start = Signal()

        x = self.spad.rdata[:8].as_signed()
        # m - x as 9-bit signed, taken to 8 bits: the table index (0..255 whenever m >= x).
        m.d.comb += exp.d.eq((mx - x)[:8])
        scaled = ((self.spad.rdata[:16] * r) + (1 << 21))[22:39]

        m.d.comb += [
            div.start.eq(d_start),
            div.num.eq(RECIP_NUM),
            div.den.eq(total),
            self.spad.waddr.eq(dst + j),
            self.spad.raddr.eq(src + i),        # dst + i in P3
            self.spad.wdata.eq(scaled),         # e in P2
        ]
        m.d.sync += d_start.eq(0)

        def stream(action, last):
            # Each pass streams the elements; the last one also rewinds i, j and v for the next pass.
            def rewind():
                m.d.sync += [v.eq(0), i.eq(0), j.eq(0)]
                last()
            self.stream(m, i, j, v, length, rewind, each=action)

        with self.control(m):
            with m.State("IDLE"):
                with m.If(self.start):
                    self.begin(m, opr)
                    m.d.sync += [
                        i.eq(0), j.eq(0), v.eq(0),
                        mx.eq(-128), total.eq(0),
                    ]
                    m.next = "P1"

            with m.State("P1"):
                def keep_max():
                    with m.If(x > mx):
                        m.d.sync += mx.eq(x)

                def to_p2():
                    m.next = "P2"
                stream(keep_max, to_p2)

            with m.State("P2"):
                m.d.comb += [self.spad.we.eq(v), self.spad.wdata.eq(exp.e)]

                def accumulate():
                    m.d.sync += total.eq(total + exp.e)

                def to_divs():
                    m.next = "DIVS"
                stream(accumulate, to_divs)

            with m.State("DIVS"):
                m.d.sync += d_start.eq(1)
                m.next = "WAITD"

            with m.State("WAITD"):
                with m.If(div.done):
                    m.d.sync += r.eq(div.quot)
                    m.next = "P3"

            with m.State("P3"):
                m.d.comb += [self.spad.raddr.eq(dst + i), self.spad.we.eq(v), self.spad.wdata.eq(scaled)]

                stream(None, lambda: self.finish(m))

        self.check_protocol(m, opr)
        return m

    @classmethod
    def scope_of(cls, cfg):
        """``sm``, or ``sm_div`` for the unit whose divider finds several bits a cycle (docs/sm-div.md)."""
        return "sm_div" if cfg.sm_div > 1 else "sm"
