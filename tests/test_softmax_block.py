# amaranth: UnusedElaboratable=no
"""Standalone softmax block (hardware spec 5.8, R7): probabilities against hdl.arith.softmax_q16 and the
3N+43 edges from the start-sampling edge (exclusive) to the edge that sets `done` (inclusive)."""
import random

import pytest

from hdl.arith import softmax_q16
from hdl.softmax import Softmax
from tests.simutil import built, run


def softmax_runs(n, score_sets, stray_start=False):
    """Run the block once per score vector; return [(p list, edges until done)]."""
    dut = Softmax(n)
    out = []

    async def bench(ctx):
        for xs in score_sets:
            ctx.set(dut.x, xs)
            ctx.set(dut.start, 1)
            await ctx.tick()                      # the start-sampling edge
            ctx.set(dut.start, int(stray_start))
            ctx.set(dut.x, [0] * n)               # latched at start: later changes must not matter
            edges = 0
            while True:
                assert ctx.get(dut.busy) == 1
                await ctx.tick()
                edges += 1
                if ctx.get(dut.done):
                    break
                assert edges < 3 * n + 60, "done never came"
            ctx.set(dut.start, 0)
            assert ctx.get(dut.busy) == 0
            p = list(ctx.get(dut.p))
            await ctx.tick()
            assert ctx.get(dut.done) == 0
            out.append((p, edges))

    run(dut, bench)
    return out


def test_r7():
    [(p, edges)] = softmax_runs(4, [[32, 16, 0, -16]])
    assert p == [42200, 15524, 5711, 2101]
    assert sum(p) == 65536
    assert edges == 55


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64])
def test_cycles_and_values(n):
    rng = random.Random(n)
    sets = [[rng.randint(-128, 127) for _ in range(n)], [rng.randint(-20, 20) for _ in range(n)]]
    if n <= 8:
        sets.append([-128] * n)
    got = softmax_runs(n, sets, stray_start=(n == 4))
    assert [g[0] for g in got] == [softmax_q16(xs) for xs in sets]
    assert {g[1] for g in got} == {3 * n + 43}


def test_spec_figures():
    assert softmax_runs(1, [[-77]])[0] == ([65536], 46)
    assert softmax_runs(8, [[5] * 8])[0] == ([8192] * 8, 67)


@pytest.mark.parametrize("n,exc", [(0, ValueError), (2.5, TypeError)])
def test_bad_n(n, exc):
    with pytest.raises(exc, match="n must"):
        Softmax(n)


def test_ports():
    s = built(Softmax(4))
    assert s.p.shape().length == 4 and s.x.shape().length == 4
