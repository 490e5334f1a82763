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
        Right shift; the multiplier is m / 2^s. Shifts of 57 and more leave no rounding half.
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
        neg = self.acc[31]
        # |acc| as 32 unsigned bits: -2^31 negates to itself, which read unsigned is 2^31.
        mag = Signal(32)
        m.d.comb += mag.eq(Mux(neg, -self.acc, self.acc))
        prod = Signal(56)
        m.d.comb += prod.eq(mag * self.m)
        # half = 1 << (s-1) kept to 56 bits: (1 << s) >> 1 is 0 for s = 0 and the [0:56] slice drops
        # it for s >= 57, exactly as the RTL's 56-bit constant shift does.
        one_s = Signal(64)
        m.d.comb += one_s.eq(1 << self.s)
        half = Signal(56)
        m.d.comb += half.eq(one_s[1:57])
        shifted = Signal(57)
        m.d.comb += shifted.eq((prod + half) >> self.s)
        mag_q = Signal(7)
        m.d.comb += mag_q.eq(Mux(shifted > 127, 127, shifted[:7]))
        q = Signal(signed(8))
        m.d.comb += q.eq(Mux(neg, -mag_q, mag_q))
        m.d.comb += self.q.eq(Mux(self.relu & q[7], 0, q))
        return m
