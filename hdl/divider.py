"""Restoring unsigned divider, one quotient bit per cycle (hardware spec 5.6), or `bits` (docs/sm-div.md).

start & ~busy at edge E0 latches num/den; the W busy edges that follow each produce a quotient bit, and
the W-th sets `done` (visible in the cycle after it, W+1 cycles after the start cycle) and loads
quot/rem. A start while busy is ignored. Division by zero gives quot = 2^W - 1 and rem = num.

With ``bits`` = b > 1 each busy edge does b of those steps one after the other (the same restoring step
chained b times between two edges): W/b busy edges, `done` W/b + 1 cycles after the start cycle, the same
quotient and remainder for every input.
"""
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl._checks import check_int

__all__ = ["Divider"]


class Divider(wiring.Component):
    """W-bit restoring divider with a W-cycle busy window (W/bits cycles with `bits`).

    Parameters
    ----------
    width : int
        Operand width W (40 on the chip), at least 2.
    bits : int
        Quotient bits found per busy cycle, 1 (the book's), 2 or 4; must divide `width`.

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
        If `width` is not an integer of at least 2, or `bits` not 1, 2 or 4 dividing it.
    """

    def __init__(self, width=40, bits=1):
        check_int(self, "width", width, 2)
        if isinstance(bits, bool) or bits not in (1, 2, 4) or width % bits:
            raise ValueError(f"Divider bits must be 1, 2 or 4 and divide the width {width}, not {bits!r}")
        self._width = width
        self._bits = bits
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

    @property
    def bits(self):
        return self._bits

    def elaborate(self, platform):
        m = Module()
        w = self._width
        n_r = Signal(w)
        d_r = Signal(w)
        r = Signal(w + 1)
        q = Signal(w)
        cnt = Signal(max(8, w.bit_length()))      # 8 bits as in the RTL, wider only if W needs it

        # the restoring step, `bits` times in a row: numerator bit, partial remainder, quotient so far
        n_in, r_next, q_next = n_r, r, q
        for k in range(self._bits):
            r_next, q_next = self._step(m, k, n_in[w - 1], r_next, q_next, d_r)
            n_in = n_in << 1

        m.d.sync += self.done.eq(0)
        with m.If(self.busy):
            m.d.sync += [r.eq(r_next), q.eq(q_next), n_r.eq(n_r << self._bits), cnt.eq(cnt - 1)]
            with m.If(cnt == 1):
                m.d.sync += [self.busy.eq(0), self.done.eq(1),
                             self.quot.eq(q_next), self.rem.eq(r_next[:w])]
        with m.Elif(self.start):
            m.d.sync += [n_r.eq(self.num), d_r.eq(self.den), r.eq(0), q.eq(0),
                         cnt.eq(w // self._bits), self.busy.eq(1)]
        return m

    def _step(self, m, k, bit, r, q, d):
        """One restoring step (the k-th of a cycle): shift numerator bit `bit` into the remainder `r`,
        subtract `d` if it fits; returns the new (remainder, quotient) signals."""
        w = self._width
        tag = "" if k == 0 else f"_{k}"
        sh = Signal(w + 1, name=f"sh{tag}")
        fits = Signal(name=f"fits{tag}")
        r_next = Signal(w + 1, name=f"r_next{tag}")
        q_next = Signal(w, name=f"q_next{tag}")
        m.d.comb += [
            sh.eq(Cat(bit, r[:w])),
            fits.eq(sh >= d),
            r_next.eq(Mux(fits, sh - d, sh)),
            q_next.eq(Cat(fits, q[:w - 1])),
        ]
        return r_next, q_next
