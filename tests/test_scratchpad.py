"""Scratchpad (hardware spec 5.1, 2.4): registered read, old contents on a same-edge write."""
import random

import pytest

from hdl.scratchpad import Scratchpad
from tests.simutil import built, run


def test_registered_read_before_write():
    dut = Scratchpad()

    async def bench(ctx):
        ctx.set(dut.memory.data[9], 0x11111111)
        ctx.set(dut.memory.data[4095], 0xCAFEF00D)
        ctx.set(dut.raddr, 9)
        assert ctx.get(dut.rdata) == 0               # not yet sampled: a registered read
        await ctx.tick()
        assert ctx.get(dut.rdata) == 0x11111111
        # read and write the same word at the same edge: the read returns the old word
        ctx.set(dut.we, 1)
        ctx.set(dut.waddr, 9)
        ctx.set(dut.wdata, 0x22222222)
        await ctx.tick()
        ctx.set(dut.we, 0)
        assert ctx.get(dut.rdata) == 0x11111111
        assert ctx.get(dut.memory.data[9]) == 0x22222222
        await ctx.tick()
        assert ctx.get(dut.rdata) == 0x22222222
        ctx.set(dut.raddr, 4095)
        assert ctx.get(dut.rdata) == 0x22222222      # the register holds until the edge
        await ctx.tick()
        assert ctx.get(dut.rdata) == 0xCAFEF00D

    run(dut, bench)


def test_random_against_model():
    rng = random.Random(11)
    dut = Scratchpad(depth=64, width=32)
    model = [0] * 64

    async def bench(ctx):
        expect = 0
        for _ in range(400):
            we, wa, wd, ra = rng.randint(0, 1), rng.randrange(64), rng.getrandbits(32), rng.randrange(64)
            if rng.random() < 0.3:
                ra = wa
            ctx.set(dut.we, we)
            ctx.set(dut.waddr, wa)
            ctx.set(dut.wdata, wd)
            ctx.set(dut.raddr, ra)
            assert ctx.get(dut.rdata) == expect
            await ctx.tick()
            expect = model[ra]          # sampled before this edge's write lands
            if we:
                model[wa] = wd
            assert ctx.get(dut.rdata) == expect

    run(dut, bench)


@pytest.mark.parametrize("kw,exc,word", [({"depth": 0}, ValueError, "depth"), ({"depth": 1000}, ValueError, "depth"),
                                         ({"depth": 4096.0}, TypeError, "depth"), ({"width": 0}, ValueError, "width"),
                                         ({"width": "32"}, TypeError, "width")])
def test_bad_parameters(kw, exc, word):
    with pytest.raises(exc, match=word):
        Scratchpad(**kw)


def test_ports_follow_parameters():
    sp = built(Scratchpad())
    assert sp.raddr.shape().width == 12 and sp.rdata.shape().width == 32
    assert built(Scratchpad(256, 16)).waddr.shape().width == 8
