# amaranth: UnusedElaboratable=no
"""Systolic array (hardware spec 5.3, R9): frame-by-frame values, random matrices, clr and 32-bit wrap.

Expected values come from the spec's closed form acc(i,j) after edge t = sum_{k <= t-i-j} A[i][k] B[k][j],
computed here in plain Python, and from the R9 figures printed in the spec.
"""
import random

import pytest

from hdl.arith import s32, sext
from hdl.config import ChipConfig
from hdl.systolic import SystolicArray
from tests.simutil import built, run


def pack(values, bits):
    word = 0
    for k, v in enumerate(values):
        word |= (v & ((1 << bits) - 1)) << (bits * k)
    return word


def unpack(word, bits, count):
    return [sext(word >> (bits * k), bits) for k in range(count)]


def skewed(A, B, n, t):
    """The edge inputs of cycle t: a[i] = A[i][t-i], b[j] = B[t-j][j], 0 outside the matrices."""
    M, K, N = len(A), len(B), len(B[0])
    a = [A[i][t - i] if i < M and 0 <= t - i < K else 0 for i in range(n)]
    b = [B[t - j][j] if j < N and 0 <= t - j < K else 0 for j in range(n)]
    return a, b


def closed_form(A, B, n, t):
    M, K, N = len(A), len(B), len(B[0])
    out = []
    for i in range(n):
        for j in range(n):
            if i < M and j < N:
                out.append(s32(sum(A[i][k] * B[k][j] for k in range(0, min(K, t - i - j + 1)))))
            else:
                out.append(0)
    return out


def run_product(n, cases, extra=2):
    """Multiply each (A, B) after a clr, returning the n*n accumulators after every edge.

    Before each clr the array is fed three cycles of non-zero junk, so that a clr that left a
    pass-through register or an accumulator standing would show in the frames.
    """
    dut = SystolicArray(n)
    rng = random.Random(n)
    frames = []
    a_val, b_val, c_val = dut.a_edge.as_value(), dut.b_edge.as_value(), dut.c.as_value()

    async def bench(ctx):
        for A, B in cases:
            for _ in range(3):
                ctx.set(a_val, pack([rng.randint(1, 127) for _ in range(n)], 8))
                ctx.set(b_val, pack([rng.randint(1, 127) for _ in range(n)], 8))
                await ctx.tick()
            ctx.set(dut.clr, 1)
            ctx.set(a_val, pack([55] * n, 8))       # clr wins over the edge inputs
            ctx.set(b_val, pack([-66] * n, 8))
            await ctx.tick()
            assert ctx.get(c_val) == 0
            ctx.set(dut.clr, 0)
            seen = []
            for t in range(len(B) + 2 * n - 2 + extra):
                a, b = skewed(A, B, n, t)
                ctx.set(a_val, pack(a, 8))
                ctx.set(b_val, pack(b, 8))
                await ctx.tick()
                seen.append(unpack(ctx.get(c_val), 32, n * n))
            frames.append(seen)

    run(dut, bench)
    return frames


R9_A = [[1, 2, 3, 4], [0, -1, 2, 1], [5, 1, -2, 0]]
R9_B = [[1, 0, 2], [2, 1, 0], [0, -3, 1], [-1, 2, 1]]
R9_C = [[1, 1, 9], [-3, -5, 3], [7, 7, 8]]


def test_r9_frames():
    n = 3
    (frames,) = run_product(n, [(R9_A, R9_B)], extra=3)
    pe = lambda t, i, j: frames[t][i * n + j]
    assert [pe(t, 0, 0) for t in range(4)] == [1, 5, 5, 1]
    assert pe(2, 2, 0) == 5 and pe(2, 0, 2) == 2
    # edges 0 .. K+2N-3 = 7 complete the product; the three extra zero edges hold it
    for t in range(7, len(frames)):
        assert [[pe(t, i, j) for j in range(n)] for i in range(n)] == R9_C
    for t, frame in enumerate(frames):
        assert frame == closed_form(R9_A, R9_B, n, t), f"edge {t}"


def random_matrix(rng, rows, cols):
    return [[rng.randint(-128, 127) for _ in range(cols)] for _ in range(rows)]


@pytest.mark.parametrize("K", [1, 2, 3, 7, 63, 64])
def test_random_shapes(K):
    rng = random.Random(1000 + K)
    cases = [(random_matrix(rng, M, K), random_matrix(rng, K, N)) for M in range(1, 5) for N in range(1, 5)]
    frames = run_product(4, cases, extra=1)
    for (A, B), seen in zip(cases, frames):
        for t, frame in enumerate(seen):
            assert frame == closed_form(A, B, 4, t), f"M={len(A)} K={K} N={len(B[0])} edge {t}"


@pytest.mark.parametrize("n", [1, 2, 5])
def test_other_sizes(n):
    rng = random.Random(n)
    A, B = random_matrix(rng, n, 9), random_matrix(rng, 9, n)
    (frames,) = run_product(n, [(A, B)])
    for t, frame in enumerate(frames):
        assert frame == closed_form(A, B, n, t)


def test_accumulator_wraps_at_32_bits():
    # (-128)*(-128) = 2^14 per edge: 2^17 edges reach 2^31, which must wrap to -2^31.
    dut = SystolicArray(1)

    async def bench(ctx):
        ctx.set(dut.a_edge[0], -128)
        ctx.set(dut.b_edge[0], -128)
        await ctx.tick().repeat((1 << 17) - 1)
        assert ctx.get(dut.c[0]) == (1 << 31) - (1 << 14)
        await ctx.tick()
        assert ctx.get(dut.c[0]) == -(1 << 31)
        ctx.set(dut.a_edge[0], 127)
        await ctx.tick()
        assert ctx.get(dut.c[0]) == (1 << 31) - 128 * 127     # wraps back to positive

    run(dut, bench)


@pytest.mark.parametrize("n,exc", [(0, ValueError), (-1, ValueError), (2.0, TypeError), ("4", TypeError)])
def test_bad_n(n, exc):
    with pytest.raises(exc, match="n must"):
        SystolicArray(n)


def test_ports():
    sa = built(SystolicArray(4))
    assert sa.c.shape().length == 16 and sa.a_edge.shape().length == 4


def test_size_from_config():
    """Without `n` the array is the configuration's: 4 x 4 on the book's chip, 8 x 8 with array=8."""
    assert built(SystolicArray()).n == 4
    sa = built(SystolicArray(config=ChipConfig(array=8)))
    assert sa.n == 8 and sa.c.shape().length == 64 and sa.b_edge.shape().length == 8
