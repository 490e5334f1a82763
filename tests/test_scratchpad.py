"""Scratchpad (hardware spec 5.1, 2.4): registered read, old contents on a same-edge write."""
import random

import pytest

from hdl.config import ChipConfig
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
                                         ({"width": "32"}, TypeError, "width"), ({"reads": 0}, ValueError, "reads")])
def test_bad_parameters(kw, exc, word):
    with pytest.raises(exc, match=word):
        Scratchpad(**kw)


def test_ports_follow_parameters():
    sp = built(Scratchpad())
    assert sp.raddr.shape().width == 12 and sp.rdata.shape().width == 32
    assert built(Scratchpad(256, 16)).waddr.shape().width == 8


def test_extra_read_ports_against_model():
    """With mm_load = 4 the scratchpad has three more read ports, each registered and read-before-write
    like port 0, at independent addresses (the same word on several ports included)."""
    rng = random.Random(12)
    dut = Scratchpad(depth=64, config=ChipConfig(mm_load=4))
    assert dut.reads == 4 and not hasattr(built(Scratchpad()), "raddr_x")
    model = [0] * 64

    async def bench(ctx):
        for _ in range(300):
            we, wa, wd = rng.randint(0, 1), rng.randrange(64), rng.getrandbits(32)
            ra = [rng.choice([wa, rng.randrange(64)]) for _ in range(4)]
            ctx.set(dut.we, we)
            ctx.set(dut.waddr, wa)
            ctx.set(dut.wdata, wd)
            ctx.set(dut.raddr, ra[0])
            for j in range(3):
                ctx.set(dut.raddr_x[j], ra[j + 1])
            await ctx.tick()
            expect = [model[a] for a in ra]     # sampled before this edge's write lands
            if we:
                model[wa] = wd
            assert [ctx.get(dut.rdata)] + [ctx.get(dut.rdata_x[j]) for j in range(3)] == expect

    run(dut, bench)
