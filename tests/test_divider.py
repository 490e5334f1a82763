# amaranth: UnusedElaboratable=no
"""Divider (hardware spec 5.6, R8): results, /0, the ignored stray start and the exact cycle of `done`."""
import random

import pytest
from amaranth.hdl import ClockDomain

from hdl.arith import divu
from hdl.divider import Divider
from tests.simutil import built, run


def divide_all(cases, width=40, stray=False, bits=1):
    """Run each (num, den) from idle; check the cycle-by-cycle contract; return [(quot, rem, cycles)]."""
    dut = Divider(width, bits)
    out = []

    async def bench(ctx):
        prev = (0, 0)
        for num, den in cases:
            ctx.set(dut.num, num)
            ctx.set(dut.den, den)
            ctx.set(dut.start, 1)
            await ctx.tick()                      # E0: start sampled
            ctx.set(dut.start, 0)
            cycles = 0
            while not ctx.get(dut.done):
                assert ctx.get(dut.busy) == 1
                assert (ctx.get(dut.quot), ctx.get(dut.rem)) == prev   # only loaded at completion
                if stray and cycles == 5:
                    ctx.set(dut.num, 1000)
                    ctx.set(dut.den, 3)
                    ctx.set(dut.start, 1)
                if stray and cycles == 6:
                    ctx.set(dut.start, 0)
                await ctx.tick()
                cycles += 1
                assert cycles <= width + 2, "done never came"
            assert ctx.get(dut.busy) == 0
            prev = (ctx.get(dut.quot), ctx.get(dut.rem))
            out.append(prev + (cycles,))
            await ctx.tick()
            assert ctx.get(dut.done) == 0         # a one-cycle pulse
            assert (ctx.get(dut.quot), ctx.get(dut.rem)) == prev

    run(dut, bench)
    return out


def test_r8():
    got = divide_all([(1 << 38, 101776), (123456789, 0)])
    # 40 edges after E0: done is high in the 41st cycle after the start cycle.
    assert got == [(2700812, 64832, 40), ((1 << 40) - 1, 123456789, 40)]


def test_r8_stray_start_ignored():
    assert divide_all([(22, 5)], stray=True) == [(4, 2, 40)]


@pytest.mark.parametrize("width", [40, 2, 3, 8])
def test_random_against_golden(width):
    rng = random.Random(width)
    top = (1 << width) - 1
    special = [0, 1, 2, top, top - 1, 1 << (width - 1)]
    cases = [(n, d) for n in special for d in special]
    for _ in range(60 if width == 40 else 20):
        cases.append((rng.randint(0, top), rng.choice([rng.randint(0, top), rng.randint(0, 1000) & top])))
    got = divide_all(cases, width)
    assert got == [divu(n, d, width) + (width,) for n, d in cases]


def test_back_to_back_start_in_done_cycle():
    # A start held high is taken again in the done cycle (busy is already 0 there): period W + 1.
    dut = Divider(8)
    dones = []

    async def bench(ctx):
        ctx.set(dut.num, 200)
        ctx.set(dut.den, 7)
        ctx.set(dut.start, 1)
        for cycle in range(1, 30):
            await ctx.tick()
            if ctx.get(dut.done):
                dones.append((cycle, ctx.get(dut.quot), ctx.get(dut.rem)))

    run(dut, bench)
    assert dones == [(9, 28, 4), (18, 28, 4), (27, 28, 4)]


def test_reset_clears_busy():
    dut = Divider(8)
    cd = ClockDomain("sync")

    async def bench(ctx):
        ctx.set(dut.num, 9)
        ctx.set(dut.den, 2)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        await ctx.tick().repeat(3)
        ctx.set(cd.rst, 1)
        await ctx.tick()
        ctx.set(cd.rst, 0)
        assert ctx.get(dut.busy) == 0
        for _ in range(12):
            await ctx.tick()
            assert ctx.get(dut.done) == 0

    run(dut, bench, domain=cd)


@pytest.mark.parametrize("width,bits", [(40, 2), (40, 4), (8, 2), (8, 4), (2, 2), (4, 4)])
def test_several_bits_a_cycle_against_golden(width, bits):
    """docs/sm-div.md: `bits` quotient bits a cycle give the same quotient and remainder in width/bits cycles;
    the 40-bit cases include the SM unit's numerator 2^38 over sums of e values."""
    rng = random.Random(width * 10 + bits)
    top = (1 << width) - 1
    special = [0, 1, 2, top, top - 1, 1 << (width - 1)]
    cases = [(n, d) for n in special for d in special]
    for _ in range(40 if width == 40 else 20):
        cases.append((rng.randint(0, top), rng.choice([rng.randint(0, top), rng.randint(0, 1000) & top])))
    if width == 40:
        cases += [(1 << 38, rng.randint(65535, 4095 * 65535)) for _ in range(20)]
    got = divide_all(cases, width, bits=bits)
    assert got == [divu(n, d, width) + (width // bits,) for n, d in cases]


@pytest.mark.parametrize("bits", [3, 0, True, 8])
def test_bad_bits(bits):
    with pytest.raises(ValueError, match="bits must be 1, 2 or 4"):
        Divider(40 if bits != 3 else 40, bits)
    with pytest.raises(ValueError, match="divide the width 6"):
        Divider(6, 4)


@pytest.mark.parametrize("width,exc", [(1, ValueError), (0, ValueError), (40.0, TypeError), ("40", TypeError)])
def test_bad_width(width, exc):
    with pytest.raises(exc, match="width must"):
        Divider(width)


def test_ports():
    d = built(Divider())
    assert d.num.shape().width == 40 and d.quot.shape().width == 40
