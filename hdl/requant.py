"""The requantizer: int32 accumulator -> int8, combinational by the spec (hardware spec 5.4).

q = clamp(round_half_away(acc * m / 2^s), -127, 127), with relu raising the lower bound to 0. The book's
block has no clock: `q` follows the inputs in the same cycle (RQ feeds it straight from the scratchpad
read register). On a chip with ``rq_pipe`` = 1 (docs/rq-pipe.md) it has one pipeline register: the product
acc * m, with the sign of acc, s and relu beside it, is registered, and `q` is the result for the inputs
of the cycle before (latency one cycle, one result every cycle).
"""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.config import BOOK

__all__ = ["Requantizer"]


class Requantizer(wiring.Component):
    """The int32 -> int8 requantizer: combinational, or with one pipeline register.

    Parameters
    ----------
    config : hdl.config.ChipConfig
        The chip (keyword only; the book's by default): its ``rq_pipe`` is the default of `pipe`.
    pipe : int, optional
        0: combinational, ``q`` in the cycle of its inputs. 1: the product ``acc * m`` (and the sign of
        acc, s and relu) registered at the edge closing the inputs' cycle, ``q`` in the next cycle.

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

    def __init__(self, *, config=BOOK, pipe=None):
        self.pipe = config.rq_pipe if pipe is None else pipe
        if self.pipe not in (0, 1):
            raise ValueError(f"Requantizer pipe must be 0 or 1, not {self.pipe!r}")
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        # Work on the signed product so that no negation sits before or after the multiplier (the
        # chip's longest path runs from the scratchpad through here): |p| < 2^55 fits in 57 signed bits.
        if self.pipe:
            # the pipeline register: the product and what the rounding and the clamp read of the inputs.
            # Without a reset: no unit writes q before a valid input has passed through it, and a reset
            # driven by logic (the board top's chip domain) on these registers made Yosys's ABC9 pass
            # fail an internal assertion when it mapped the served board (docs/rq-pipe.md).
            p = Signal(signed(57), reset_less=True)
            neg = Signal(name="neg_r", reset_less=True)
            shift = Signal(6, name="s_r", reset_less=True)
            relu = Signal(name="relu_r", reset_less=True)
            m.d.sync += [p.eq(self.acc * self.m), neg.eq(self.acc[31]), shift.eq(self.s), relu.eq(self.relu)]
        else:
            p = Signal(signed(57))
            neg, shift, relu = self.acc[31], self.s, self.relu
            m.d.comb += p.eq(self.acc * self.m)
        one_s = Signal(64)
        m.d.comb += one_s.eq(1 << shift)
        # Round half away from zero as a floor division by 2^s: a non-negative p gets + half, a negative
        # one + half - 1, which is -floor((|p| + half) / 2^s). For s = 0 there is no half and nothing to
        # round. Halves of 2^56 and more (s >= 57) are larger than any |p|, so keeping them is harmless.
        half = Signal(63)
        m.d.comb += half.eq(one_s[1:])
        biased = Signal(signed(66))
        m.d.comb += biased.eq(p + half - (neg & (shift != 0)))
        shifted = Signal(signed(66))
        m.d.comb += shifted.eq(biased >> shift)
        # The clamp is decided on `biased` against the scaled bounds, beside the shift rather than after it:
        # shifted >= 128 exactly when biased >= 128 * 2^s, shifted <= -128 when biased < -127 * 2^s.
        upper = Signal(71)
        m.d.comb += upper.eq(one_s << 7)
        lower = Signal(signed(72))
        m.d.comb += lower.eq(one_s - upper)             # a subtraction, not a multiply (no DSP)
        q = Signal(signed(8))
        m.d.comb += q.eq(Mux(biased >= upper, 127, Mux(biased < lower, -127, shifted[:8])))
        m.d.comb += self.q.eq(Mux(relu & q[7], 0, q))
        return m
