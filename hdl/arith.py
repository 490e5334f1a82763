"""The chip's arithmetic as plain Python integers: the one definition everybody imports.

The reference machine, the compiler's integer interpreter, the exp-table ROM and every hardware
block test take their golden values from here (hardware spec 2, 4.4-4.6, 5.4-5.6; model spec 2).
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext

__all__ = [
    "s8", "s32", "u32", "sext", "rha", "rha_div", "quantize", "clamp",
    "requant", "mantissa_shift", "EXP_TABLE", "exp_table", "divu",
    "softmax_q16", "SOFTMAX_NUM", "vadd_sat", "argmax_first", "unpack_word",
]


def s8(word: int) -> int:
    """The low byte of a word as a signed int8 (units that take int8 read only bits [7:0])."""
    b = word & 0xFF
    return b - 256 if b & 0x80 else b


def s32(word: int) -> int:
    w = word & 0xFFFFFFFF
    return w - (1 << 32) if w & 0x80000000 else w


def u32(value: int) -> int:
    return value & 0xFFFFFFFF


def sext(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def clamp(v, lo, hi):
    return lo if v < lo else hi if v > hi else v


# ---- rounding and quantization (model spec 2) ----------------------------------------------------

def rha(v: float) -> int:
    """Round half away from zero for reals: floor(|v| + 0.5) with the sign of v."""
    r = math.floor(abs(v) + 0.5)
    return r if v >= 0 else -r


def rha_div(num: int, den: int) -> int:
    """Round half away from zero of num/den for integers, den > 0."""
    q, r = divmod(abs(num), den)
    if 2 * r >= den:
        q += 1
    return -q if num < 0 else q


def quantize(x: float, scale: float) -> int:
    """A real to int8 at `scale`: one float division, round half away, clamp to +-127."""
    return clamp(rha(x / scale), -127, 127)


def mantissa_shift(M: float) -> tuple[int, int]:
    """A positive real multiplier as (mantissa m, shift s) with 2^23 <= m < 2^24 and M ~ m / 2^s."""
    if not M > 0:
        raise ValueError(f"requantizer multiplier must be positive, got {M!r}")
    s = 23 - math.floor(math.log2(M))
    m = round(M * 2.0 ** s)
    if m >= 1 << 24:
        m >>= 1
        s -= 1
    if not (1 << 23) <= m < (1 << 24):
        raise ValueError(f"mantissa {m} for multiplier {M!r} is outside [2^23, 2^24)")
    if not 0 <= s < 64:
        raise ValueError(f"shift {s} for multiplier {M!r} does not fit the 6-bit field")
    return m, s


def requant(acc: int, m: int, s: int, relu: int = 0) -> int:
    """The hardware requantizer (hardware spec 5.4): int32 accumulator -> int8, exactly as the RTL.

    mag = |acc| (32 bits, -2^31 gives 2^31); prod = mag * m (56 bits); half = 1 << (s-1) in 56 bits
    (0 when s = 0 or s >= 57); shifted = (prod + half) >> s; clamp the magnitude at 127; restore the
    sign; relu sends negatives to 0.
    """
    acc = s32(acc)
    m &= (1 << 24) - 1
    s &= 63
    mag = -acc if acc < 0 else acc
    prod = mag * m
    half = ((1 << (s - 1)) & ((1 << 56) - 1)) if s else 0
    shifted = (prod + half) >> s
    q = 127 if shifted > 127 else shifted
    if acc < 0:
        q = -q
    if relu and q < 0:
        q = 0
    return q


# ---- the exp table (hardware spec 5.5), generated, never typed in ---------------------------------

def exp_table() -> list[int]:
    """T[d] = round(65535 * exp(-d/16)), d = 0..255, in 50-digit decimal arithmetic (no entry is a tie)."""
    table = []
    with localcontext() as ctx:
        ctx.prec = 50
        for d in range(256):
            v = Decimal(65535) * (Decimal(-d) / Decimal(16)).exp()
            table.append(int(v.to_integral_value(rounding="ROUND_HALF_UP")))
    return table


EXP_TABLE: tuple[int, ...] = tuple(exp_table())


# ---- divider (hardware spec 5.6) and softmax (4.6) -----------------------------------------------

def divu(num: int, den: int, width: int = 40) -> tuple[int, int]:
    """Unsigned restoring division as the divider computes it: (quotient, remainder), W-bit operands.

    Division by zero gives all ones and the numerator as remainder.
    """
    mask = (1 << width) - 1
    num &= mask
    den &= mask
    if den == 0:
        return mask, num
    return num // den, num % den


SOFTMAX_NUM = 1 << 38       # the divider's constant numerator in the SM unit


def softmax_q16(xs, detail: bool = False):
    """Integer softmax of int8 scores (Q4.4) to Q0.16 probabilities, as the SM unit computes it.

    m = max x; e_i = T[(m - x_i) mod 256]; S = sum e_i; r = floor(2^38 / S) (40-bit divider);
    p_i = ((e_i * r + 2^21) >> 22) taken to 17 bits. With `detail` also returns (m, e, S, r).
    """
    xs = [s8(x) for x in xs]
    m = -128
    for x in xs:
        if x > m:
            m = x
    e = [EXP_TABLE[(m - x) & 0xFF] for x in xs]
    total = sum(e) & 0xFFFFFFFF
    r, _ = divu(SOFTMAX_NUM, total, 40)
    p = [(((ei & 0xFFFF) * r + (1 << 21)) >> 22) & 0x1FFFF for ei in e]
    if detail:
        return p, {"m": m, "e": e, "S": total, "r": r}
    return p


# ---- vector unit pieces --------------------------------------------------------------------------

def vadd_sat(a: int, b: int) -> int:
    """VADD: the low bytes as int8, added, clamped to +-127 (hardware spec 4.4)."""
    return clamp(s8(a) + s8(b), -127, 127)


def argmax_first(values) -> int:
    """Index of the FIRST maximum of signed 32-bit words (AMAX; ties keep the lower index)."""
    best, idx = None, 0
    for j, v in enumerate(values):
        v = s32(v)
        if best is None or v > best:
            best, idx = v, j
    return idx


def unpack_word(word: int) -> list[int]:
    """UNPACK: the eight nibbles of a word, low nibble first, each sign-extended from 4 bits."""
    return [sext(word >> (4 * j), 4) for j in range(8)]
