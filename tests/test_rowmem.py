# amaranth: UnusedElaboratable=no
"""Operand memory (hardware spec 5.2): combinational read, write at the edge, old value during the write."""
import random

import pytest

from hdl.rowmem import RowMem
from tests.simutil import built, run


def test_combinational_read_and_write_at_edge():
    dut = RowMem()

    async def bench(ctx):
        ctx.set(dut.memory.data[5], -7)
        ctx.set(dut.raddr, 5)
        assert ctx.get(dut.rdata) == -7           # same cycle, no edge needed
        ctx.set(dut.we, 1)
        ctx.set(dut.waddr, 5)
        ctx.set(dut.wdata, 100)
        assert ctx.get(dut.rdata) == -7           # collision: the old value until the edge
        await ctx.tick()
        ctx.set(dut.we, 0)
        assert ctx.get(dut.rdata) == 100
        ctx.set(dut.raddr, 6)
        assert ctx.get(dut.rdata) == 0
        ctx.set(dut.raddr, 5)
        await ctx.tick()
        assert ctx.get(dut.rdata) == 100          # we=0: nothing written
        assert ctx.get(dut.memory.data[5]) == 100

    run(dut, bench)


def test_random_against_model():
    rng = random.Random(7)
    dut = RowMem()
    model = [0] * 64

    async def bench(ctx):
        for _ in range(400):
            we, wa, wd, ra = rng.randint(0, 1), rng.randrange(64), rng.randint(-128, 127), rng.randrange(64)
            if rng.random() < 0.3:
                ra = wa
            ctx.set(dut.we, we)
            ctx.set(dut.waddr, wa)
            ctx.set(dut.wdata, wd)
            ctx.set(dut.raddr, ra)
            assert ctx.get(dut.rdata) == model[ra]
            await ctx.tick()
            if we:
                model[wa] = wd

    run(dut, bench)


@pytest.mark.parametrize("depth,exc", [(0, ValueError), (1, ValueError), (48, ValueError), (-64, ValueError),
                                       (64.0, TypeError), ("64", TypeError), (True, TypeError)])
def test_bad_depth(depth, exc):
    with pytest.raises(exc, match="depth"):
        RowMem(depth)


def test_depth_sets_address_width():
    assert built(RowMem(16)).raddr.shape().width == 4
    assert built(RowMem()).waddr.shape().width == 6
