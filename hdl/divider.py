"""Restoring unsigned divider, one quotient bit per cycle (hardware spec 5.6).

start & ~busy at edge E0 latches num/den; the W busy edges that follow each produce a quotient bit, and
the W-th sets `done` (visible in the cycle after it, W+1 cycles after the start cycle) and loads
quot/rem. A start while busy is ignored. Division by zero gives quot = 2^W - 1 and rem = num.
"""
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl._checks import check_int

__all__ = ["Divider"]


class Divider(wiring.Component):
    """W-bit restoring divider with a W-cycle busy window.

    Parameters
    ----------
    width : int
        Operand width W (40 on the chip), at least 2.

    Ports
    -----
    start : In(1)
        Starts a division when the divider is idle; ignored while busy.
    num, den : In(width)
        Numerator and denominator, sampled with `start`.
    busy : Out(1)
        High from the edge after the start cycle through the W-th busy cycle.
    done : Out(1)
        One-cycle registered pulse, high in the cycle after the last busy edge.
    quot, rem : Out(width)
        Registers, loaded only at completion (they hold the last result otherwise).

    Raises
    ------
    TypeError, ValueError
        If `width` is not an integer of at least 2.
    """

    def __init__(self, width=40):
        check_int(self, "width", width, 2)
        self._width = width
        super().__init__({
            "start": In(1),
            "num":   In(width),
            "den":   In(width),
            "busy":  Out(1),
            "done":  Out(1),
            "quot":  Out(width),
            "rem":   Out(width),
        })

    @property
    def width(self):
        return self._width

    def elaborate(self, platform):
        m = Module()
        w = self._width
        n_r = Signal(w)
        d_r = Signal(w)
        r = Signal(w + 1)
        q = Signal(w)
        cnt = Signal(max(8, w.bit_length()))      # 8 bits as in the RTL, wider only if W needs it

        sh = Signal(w + 1)
        fits = Signal()
        r_next = Signal(w + 1)
        q_next = Signal(w)
        m.d.comb += [
            sh.eq(Cat(n_r[w - 1], r[:w])),
            fits.eq(sh >= d_r),
            r_next.eq(Mux(fits, sh - d_r, sh)),
            q_next.eq(Cat(fits, q[:w - 1])),
        ]

        m.d.sync += self.done.eq(0)
        with m.If(self.busy):
            m.d.sync += [r.eq(r_next), q.eq(q_next), n_r.eq(n_r << 1), cnt.eq(cnt - 1)]
            with m.If(cnt == 1):
                m.d.sync += [self.busy.eq(0), self.done.eq(1),
                             self.quot.eq(q_next), self.rem.eq(r_next[:w])]
        with m.Elif(self.start):
            m.d.sync += [n_r.eq(self.num), d_r.eq(self.den), r.eq(0), q.eq(0),
                         cnt.eq(w), self.busy.eq(1)]
        return m
