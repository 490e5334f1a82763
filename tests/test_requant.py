# amaranth: UnusedElaboratable=no
"""Requantizer (hardware spec 5.4): every edge, R10, and 20,000 random cases against hdl.arith.

Two independent golden paths: `hdl.arith.requant` (the RTL's own steps) and the spec's integer rule
clamp(round_half_away(acc * m / 2^s), -127, 127) built from `hdl.arith.rha_div`. Both the book's
combinational block and the piped one of ``rq_pipe`` chips (docs/rq-pipe.md: q one cycle after its inputs).
"""
import random

import pytest
from amaranth.hdl import ClockDomain

from hdl.arith import clamp, requant, rha_div
from hdl.requant import Requantizer
from tests.simutil import run


def integer_rule(acc, m, s, relu):
    q = clamp(rha_div(acc * m, 1 << s), -127, 127)
    return max(q, 0) if relu else q


def simulate(cases, pipe=0):
    """Drive every (acc, m, s, relu) case through the block; return the q values. The combinational block
    runs without a clock; the piped one (`pipe` = 1) takes case k in cycle k, and its q is read in cycle
    k+1 with case k+1 already on the inputs (so a q that followed its inputs would be the wrong case's)."""
    if pipe:
        return _simulate_piped(cases)
    dut = Requantizer()
    out = []

    async def bench(ctx):
        for acc, m, s, relu in cases:
            ctx.set(dut.acc, acc)
            ctx.set(dut.m, m)
            ctx.set(dut.s, s)
            ctx.set(dut.relu, relu)
            out.append(ctx.get(dut.q))

    run(dut, bench, clocked=False)
    return out


def _simulate_piped(cases, dut=None):
    dut = Requantizer(pipe=1) if dut is None else dut
    out = []

    async def bench(ctx):
        for k, case in enumerate(cases + [(0, 0, 0, 0)]):
            for port, value in zip((dut.acc, dut.m, dut.s, dut.relu), case):
                ctx.set(port, value)
            if k:
                out.append(ctx.get(dut.q))        # the previous case's result, with this case on the inputs
            await ctx.tick()

    run(dut, bench, domain=ClockDomain("sync"))     # a clock domain even for the combinational block
    return out


def check(cases, pipe=0):
    got = simulate(cases, pipe)
    bad = [(c, g, requant(*c)) for c, g in zip(cases, got) if g != requant(*c)]
    assert not bad, f"{len(bad)} mismatches, first (case, got, want): {bad[:3]}"
    rule = [(c, requant(*c), integer_rule(*c)) for c in cases if requant(*c) != integer_rule(*c)]
    assert not rule, f"golden paths disagree: {rule[:3]}"


def test_r10_book_values():
    acc = [11200, -18444, 13569, 1754]
    assert simulate([(a, 14757225, 31, 0) for a in acc]) == [77, -127, 93, 12]


def test_r10_ties_round_away_from_zero():
    cases = [(a, 1 << 23, 24, 0) for a in (1, -1, 3, -3, 5, -5)]
    assert simulate(cases) == [1, -1, 2, -2, 3, -3]


def edge_cases():
    cases = []
    extremes = [-(1 << 31), (1 << 31) - 1, -((1 << 31) - 1), 0, 1, -1, 127, -127, 128, -128]
    for acc in extremes:
        for m in (0, 1, 1 << 23, (1 << 24) - 1):
            for s in (0, 1, 23, 24, 31, 55, 56, 57, 62, 63):
                for relu in (0, 1):
                    cases.append((acc, m, s, relu))
    # Exact ties acc*m = (2n+1) * 2^(s-1) at every shift 1..40, both signs, several n.
    for s in range(1, 41):
        lg = min(s - 1, 23)
        m = 1 << lg
        for n in (0, 1, 2, 62, 63, 64, 126, 127, 200):
            acc = (2 * n + 1) << (s - 1 - lg)
            if acc < (1 << 31):
                for sign in (1, -1):
                    for relu in (0, 1):
                        cases.append((sign * acc, m, s, relu))
        # just below and just above a tie (acc*m = tie -+ m), and the largest mantissa at this shift
        tie = 5 << (s - 1 - lg)
        for acc in (tie - 1, tie + 1, -(tie - 1), -(tie + 1)):
            cases.append((acc, m, s, 0))
        cases.append((-12345, (1 << 24) - 1, s, 0))
    return cases


@pytest.mark.parametrize("pipe", [0, 1])
def test_edges(pipe):
    cases = edge_cases()
    assert len(cases) > 1000
    check(cases, pipe)


def test_piped_block_is_one_cycle_late_and_the_config_selects_it():
    """The piped block's q is the result of the previous cycle's inputs, not of this cycle's: the check
    of `_simulate_piped` fails on the combinational block; `config.rq_pipe` is the default of `pipe`."""
    from dataclasses import replace

    from hdl.config import BOOK, PRESETS
    cases = [(11200, 14757225, 31, 0), (-18444, 14757225, 31, 0), (13569, 14757225, 31, 0), (5, 1, 0, 0)]
    assert _simulate_piped(cases) == [77, -127, 93, 5]
    assert _simulate_piped(cases, Requantizer(pipe=0)) == [-127, 93, 5, 0]      # each one case early
    assert Requantizer().pipe == 0 and Requantizer(config=replace(BOOK, rq_pipe=1)).pipe == 1
    assert Requantizer(config=PRESETS["fast"]).pipe == 1 and Requantizer(config=PRESETS["fast"], pipe=0).pipe == 0
    with pytest.raises(ValueError, match="pipe must be 0 or 1"):
        Requantizer(pipe=2)


def test_edge_values_directly():
    # Values the spec states outright, independent of any golden function.
    cases = [((1 << 31) - 1, 1 << 23, 0, 0), (-(1 << 31), 1 << 23, 0, 0), (0, (1 << 24) - 1, 5, 0),
             (-1000, 1 << 23, 23, 1), (1000, 1 << 23, 23, 1), (100, 1 << 23, 63, 0),
             (-(1 << 31), (1 << 24) - 1, 56, 0), (-(1 << 31), (1 << 24) - 1, 54, 0)]
    # 2^31 * (2^24-1) / 2^56 = 0.49999997 -> 0, and / 2^54 = 1.9999999 -> 2 (negated).
    assert simulate(cases) == [127, -127, 0, 0, 127, 0, 0, -2]


@pytest.mark.parametrize("pipe", [0, 1])
def test_random_20000(pipe):
    rng = random.Random(20260530)
    cases = []
    for _ in range(20000):
        kind = rng.random()
        if kind < 0.4:
            acc = rng.randint(-(1 << 31), (1 << 31) - 1)
        else:
            acc = rng.randint(-(1 << 20), 1 << 20)
        m = rng.choice([rng.randint(1 << 23, (1 << 24) - 1), rng.randint(0, (1 << 24) - 1)])
        s = rng.choice([rng.randint(0, 63), rng.randint(20, 40)])
        cases.append((acc, m, s, rng.randint(0, 1)))
    check(cases, pipe)


def test_never_minus_128():
    got = simulate([(-(1 << 31), (1 << 24) - 1, s, 0) for s in range(0, 64)])
    assert min(got) >= -127
