"""The requantizer: int32 accumulator -> int8, purely combinational (hardware spec 5.4).

q = clamp(round_half_away(acc * m / 2^s), -127, 127), with relu raising the lower bound to 0. No clock:
`q` follows the inputs in the same cycle (RQ feeds it straight from the scratchpad read register).
"""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Requantizer"]


class Requantizer(wiring.Component):
    """Combinational int32 -> int8 requantizer.

    Ports
    -----
    acc : In(signed(32))
        The accumulator to scale.
    m : In(24)
        Unsigned mantissa of the multiplier (the compiler keeps it in [2^23, 2^24)).
    s : In(6)
        Right shift; the multiplier is m / 2^s. Any shift 0..63 is exact (large shifts give 0).
    relu : In(1)
        When 1, negative results become 0.
    q : Out(signed(8))
        The result, always in [-127, 127] (-128 is never produced).
    """

    acc:  In(signed(32))
    m:    In(24)
    s:    In(6)
    relu: In(1)
    q:    Out(signed(8))

    def elaborate(self, platform):
        m = Module()
        # Work on the signed product so that no negation sits before or after the multiplier (the
        # chip's longest path runs from the scratchpad through here): |p| < 2^55 fits in 57 signed bits.
        p = Signal(signed(57))
        m.d.comb += p.eq(self.acc * self.m)
        one_s = Signal(64)
        m.d.comb += one_s.eq(1 << self.s)
        # Round half away from zero as a floor division by 2^s: a non-negative p gets + half, a negative
        # one + half - 1, which is -floor((|p| + half) / 2^s). For s = 0 there is no half and nothing to
        # round. Halves of 2^56 and more (s >= 57) are larger than any |p|, so keeping them is harmless.
        half = Signal(63)
        m.d.comb += half.eq(one_s[1:])
        biased = Signal(signed(66))
        m.d.comb += biased.eq(p + half - (self.acc[31] & (self.s != 0)))
        shifted = Signal(signed(66))
        m.d.comb += shifted.eq(biased >> self.s)
        # The clamp is decided on `biased` against the scaled bounds, beside the shift rather than after it:
        # shifted >= 128 exactly when biased >= 128 * 2^s, shifted <= -128 when biased < -127 * 2^s.
        upper = Signal(71)
        m.d.comb += upper.eq(one_s << 7)
        lower = Signal(signed(72))
        m.d.comb += lower.eq(one_s - upper)             # a subtraction, not a multiply (no DSP)
        q = Signal(signed(8))
        m.d.comb += q.eq(Mux(biased >= upper, 127, Mux(biased < lower, -127, shifted[:8])))
        m.d.comb += self.q.eq(Mux(self.relu & q[7], 0, q))
        return m
