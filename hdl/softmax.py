"""The standalone Chapter-6 softmax block: N int8 scores -> N Q0.16 probabilities (hardware spec 5.8).

The scores are latched at the start edge; then MAXS (N cycles) finds the maximum, EXPS (N) looks up
e_i = T[m - x_i] and sums them, DIVS (1) starts the 40-bit divider on 2^38 / sum, WAITD (42) waits for
it, and MULS (N) forms p_i = (e_i * r + 2^21) >> 22. `done` is set by the (3N+43)-th edge after start.
"""
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl.arith import SOFTMAX_NUM as NUMERATOR    # r = floor(2^38 / sum): 22 fraction bits for Q0.16
from hdl._checks import check_int
from hdl.divider import Divider
from hdl.exp_lut import ExpTable

__all__ = ["Softmax"]

DIV_WIDTH = 40


class Softmax(wiring.Component):
    """Integer softmax over N scores with one exp table and one restoring divider.

    Parameters
    ----------
    n : int
        Number of scores, at least 1.

    Ports
    -----
    start : In(1)
        Begins when idle (ignored while busy); `x` is latched at the same edge.
    x : In(ArrayLayout(signed(8), n))
        The scores (Q4.4), element k at bits [8k+7:8k].
    busy : Out(1)
    done : Out(1)
        Registered one-cycle pulse; `p` holds the new probabilities from that cycle on.
    p : Out(ArrayLayout(unsigned(17), n))
        Probabilities in Q0.16 (0 to 65536), registers written during the last pass.

    Raises
    ------
    TypeError, ValueError
        If `n` is not an integer of at least 1.
    """

    def __init__(self, n):
        check_int(self, "n", n, 1)
        self._n = n
        super().__init__({
            "start": In(1),
            "x":     In(data.ArrayLayout(signed(8), n)),
            "busy":  Out(1),
            "done":  Out(1),
            "p":     Out(data.ArrayLayout(unsigned(17), n)),
        })

    @property
    def n(self):
        return self._n

    def elaborate(self, platform):
        m = Module()
        n = self._n
        m.submodules.lut = lut = ExpTable()
        m.submodules.div = div = Divider(DIV_WIDTH)

        xr = Signal(data.ArrayLayout(signed(8), n))
        er = Signal(data.ArrayLayout(unsigned(16), n))
        i = Signal(range(max(n, 2)))
        mx = Signal(signed(8))
        total = Signal(32)
        r = Signal(DIV_WIDTH)
        d_start = Signal()
        last = i == n - 1

        xi = xr[i]
        m.d.comb += [
            lut.d.eq(mx - xi),              # the 8-bit distance m - x_i (always 0..255)
            div.start.eq(d_start),
            div.num.eq(NUMERATOR),
            div.den.eq(total),
        ]
        scaled = Signal(56)
        m.d.comb += scaled.eq(er[i] * r + (1 << 21))

        m.d.sync += [self.done.eq(0), d_start.eq(0)]
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [xr.eq(self.x), mx.eq(-128), total.eq(0), i.eq(0), self.busy.eq(1)]
                    m.next = "MAXS"
            with m.State("MAXS"):
                with m.If(xi > mx):
                    m.d.sync += mx.eq(xi)
                m.d.sync += i.eq(i + 1)
                with m.If(last):
                    m.d.sync += i.eq(0)
                    m.next = "EXPS"
            with m.State("EXPS"):
                m.d.sync += [er[i].eq(lut.e), total.eq(total + lut.e), i.eq(i + 1)]
                with m.If(last):
                    m.d.sync += i.eq(0)
                    m.next = "DIVS"
            with m.State("DIVS"):
                m.d.sync += d_start.eq(1)
                m.next = "WAITD"
            with m.State("WAITD"):
                with m.If(div.done):
                    m.d.sync += r.eq(div.quot)
                    m.next = "MULS"
            with m.State("MULS"):
                m.d.sync += [self.p[i].eq(scaled[22:39]), i.eq(i + 1)]
                with m.If(last):
                    m.d.sync += [i.eq(0), self.busy.eq(0), self.done.eq(1)]
                    m.next = "IDLE"
        return m
