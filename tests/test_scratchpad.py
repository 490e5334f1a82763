# amaranth: UnusedElaboratable=no
"""Scratchpad (hardware spec 5.1, 2.4): registered read, old contents on a same-edge write."""
import random

import pytest
from amaranth.lib.wiring import In, Out

from hdl.config import ChipConfig
from hdl.scratchpad import Scratchpad, SpadPort
from tests.simutil import built, run


def test_registered_read_before_write():
    dut = Scratchpad()

    async def bench(ctx):
        ctx.set(dut.memory.data[9], 0x11111111)
        ctx.set(dut.memory.data[4095], 0xCAFEF00D)
        ctx.set(dut.port.raddr, 9)
        assert ctx.get(dut.port.rdata) == 0               # not yet sampled: a registered read
        await ctx.tick()
        assert ctx.get(dut.port.rdata) == 0x11111111
        # read and write the same word at the same edge: the read returns the old word
        ctx.set(dut.port.we, 1)
        ctx.set(dut.port.waddr, 9)
        ctx.set(dut.port.wdata, 0x22222222)
        await ctx.tick()
        ctx.set(dut.port.we, 0)
        assert ctx.get(dut.port.rdata) == 0x11111111
        assert ctx.get(dut.memory.data[9]) == 0x22222222
        await ctx.tick()
        assert ctx.get(dut.port.rdata) == 0x22222222
        ctx.set(dut.port.raddr, 4095)
        assert ctx.get(dut.port.rdata) == 0x22222222      # the register holds until the edge
        await ctx.tick()
        assert ctx.get(dut.port.rdata) == 0xCAFEF00D

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
            ctx.set(dut.port.we, we)
            ctx.set(dut.port.waddr, wa)
            ctx.set(dut.port.wdata, wd)
            ctx.set(dut.port.raddr, ra)
            assert ctx.get(dut.port.rdata) == expect
            await ctx.tick()
            expect = model[ra]          # sampled before this edge's write lands
            if we:
                model[wa] = wd
            assert ctx.get(dut.port.rdata) == expect

    run(dut, bench)


@pytest.mark.parametrize("kw,exc,word", [({"depth": 0}, ValueError, "depth"), ({"depth": 1000}, ValueError, "depth"),
                                         ({"depth": 4096.0}, TypeError, "depth"), ({"width": 0}, ValueError, "width"),
                                         ({"width": "32"}, TypeError, "width"), ({"reads": 0}, ValueError, "reads")])
def test_bad_parameters(kw, exc, word):
    with pytest.raises(exc, match=word):
        Scratchpad(**kw)


def test_ports_follow_parameters():
    sp = built(Scratchpad())
    assert sp.port.raddr.shape().width == 12 and sp.port.rdata.shape().width == 32
    assert built(Scratchpad(256, 16)).port.waddr.shape().width == 8


def test_extra_read_ports_against_model():
    """With mm_load = 4 the scratchpad has three more read ports, each registered and read-before-write
    like port 0, at independent addresses (the same word on several ports included)."""
    rng = random.Random(12)
    dut = Scratchpad(depth=64, config=ChipConfig(mm_load=4))
    assert dut.reads == 4 and not hasattr(built(Scratchpad()).port, "raddr_x")
    model = [0] * 64

    async def bench(ctx):
        for _ in range(300):
            we, wa, wd = rng.randint(0, 1), rng.randrange(64), rng.getrandbits(32)
            ra = [rng.choice([wa, rng.randrange(64)]) for _ in range(4)]
            ctx.set(dut.port.we, we)
            ctx.set(dut.port.waddr, wa)
            ctx.set(dut.port.wdata, wd)
            ctx.set(dut.port.raddr, ra[0])
            for j in range(3):
                ctx.set(dut.port.raddr_x[j], ra[j + 1])
            await ctx.tick()
            expect = [model[a] for a in ra]     # sampled before this edge's write lands
            if we:
                model[wa] = wd
            assert [ctx.get(dut.port.rdata)] + [ctx.get(dut.port.rdata_x[j]) for j in range(3)] == expect

    run(dut, bench)


def test_spad_port_is_the_scratchpads_port_flipped():
    """One signature for both sides: a unit's port (SpadPort.of its chip) is the scratchpad's flipped, with
    the configuration's widths and read ports; SpadPort compares by its parameters."""
    assert built(Scratchpad()).port.signature == SpadPort.of(ChipConfig()).flip()
    sig = SpadPort.of(ChipConfig(mm_load=4), reads=4)
    assert built(Scratchpad(config=ChipConfig(mm_load=4))).port.signature == sig.flip()
    assert {n: (m.flow, m.shape) for n, m in SpadPort(10, 16).members.items()} == {
        "raddr": (Out, 10), "rdata": (In, 16), "we": (Out, 1), "waddr": (Out, 10), "wdata": (Out, 16)}
    assert set(sig.members) == {"raddr", "rdata", "we", "waddr", "wdata", "raddr_x", "rdata_x"}
    assert SpadPort(10, 16) != SpadPort(10, 16, reads=2) and SpadPort(10, 16) == SpadPort(10, 16)
    assert repr(sig) == "SpadPort(12, 32, reads=4)"


@pytest.mark.parametrize("args,exc,message", [((0, 32), ValueError, "addr_bits must be at least 1, not 0"),
                                              ((12, "32"), TypeError, "data_bits must be an integer, not '32'"),
                                              ((12, 32, 0), ValueError, "reads must be at least 1, not 0")])
def test_spad_port_bad_parameters(args, exc, message):
    with pytest.raises(exc, match=f"^{message}$"):
        SpadPort(*args)
