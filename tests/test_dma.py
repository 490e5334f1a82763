# amaranth: UnusedElaboratable=no
"""DMA / LD engine (hardware spec 4.1, 5.7): request, response and write timing against a memory model.

The external memory is modelled in the testbench exactly as spec 6.3 describes it: LAT stages of
(valid, data); a request in cycle c is answered with mem[addr] (0xDEADBEEF past the end) in cycle c+LAT.
"""
import random
from dataclasses import replace

import pytest

from hdl.config import BOOK, ChipConfig
from hdl.units.ld import DMA
from tests.simutil import built, run


def transfer(jobs, lat, ext, aw=12, xw=16, stray_start=False):
    """Run each (dst, src, length) from idle; return per job the cycle log {W index: (req, write, done, busy)}."""
    dut = DMA(aw, xw, config=replace(BOOK, lat=lat))     # built for its memory: exact_completion speaks
    logs = []

    async def bench(ctx):
        pipe = [(0, 0)] * lat                   # pipe[-1] is what the memory answers this cycle
        for dst, src, length in jobs:
            ctx.set(dut.dst, dst)
            ctx.set(dut.src, src)
            ctx.set(dut.length, length)
            ctx.set(dut.start, 1)
            ctx.set(dut.resp_valid, 0)
            assert ctx.get(dut.req_valid) == 0 and ctx.get(dut.busy) == 0
            await ctx.tick()                    # E0
            ctx.set(dut.dst, 0)
            ctx.set(dut.src, 0)
            ctx.set(dut.length, 1)
            log = {}
            for w in range(1, length + lat + 3):
                valid, word = pipe[-1]
                # a start pulse while busy (every busy cycle but the last) must be ignored
                ctx.set(dut.start, int(stray_start and w < length + lat))
                ctx.set(dut.resp_valid, valid)
                ctx.set(dut.resp_data, word)
                req = (ctx.get(dut.req_addr),) if ctx.get(dut.req_valid) else None
                write = (ctx.get(dut.spad.waddr), ctx.get(dut.spad.wdata)) if ctx.get(dut.spad.we) else None
                log[w] = (req, write, ctx.get(dut.done), ctx.get(dut.busy))
                new = (1, ext[req[0]] if req[0] < len(ext) else 0xDEADBEEF) if req else (0, 0)
                pipe = [new] + pipe[:-1]
                await ctx.tick()
            logs.append(log)

    run(dut, bench)
    return logs


def expected_log(dst, src, length, lat, ext, aw=12, xw=16):
    """The spec's timeline written out cycle by cycle."""
    log = {}
    for w in range(1, length + lat + 3):
        k_req, k_wr = w - 1, w - 1 - lat
        a = (src + k_req) % (1 << xw)
        req = (a,) if 0 <= k_req < length else None
        if 0 <= k_wr < length:
            a_wr = (src + k_wr) % (1 << xw)
            write = ((dst + k_wr) % (1 << aw), ext[a_wr] if a_wr < len(ext) else 0xDEADBEEF)
        else:
            write = None
        done = int(w == length + lat + 1)
        busy = int(w <= length + lat)
        log[w] = (req, write, done, busy)
    return log


EXT = [random.Random(3).getrandbits(32) for _ in range(600)]


@pytest.mark.parametrize("lat", [1, 8, 20])
# 257: a length whose ninth bit matters (the length register is as wide as a scratchpad address)
@pytest.mark.parametrize("length", [1, 2, 255, 257])
def test_timing(lat, length):
    (log,) = transfer([(100, 37, length)], lat, EXT)
    assert log == expected_log(100, 37, length, lat, EXT)
    assert log[length + lat + 1][2] == 1    # B = len + LAT + 1


def test_spec_57_directly():
    # Written from 5.7 without the model above: LAT 8, len 3, dst 5, src 2.
    (log,) = transfer([(5, 2, 3)], 8, EXT)
    assert [w for w in log if log[w][0]] == [1, 2, 3]
    assert [(w, log[w][1][0]) for w in log if log[w][1]] == [(9, 5), (10, 6), (11, 7)]
    assert [w for w in log if log[w][2]] == [12]


def test_wraps_and_back_to_back_and_stray_start():
    jobs = [(4094, 598, 5), (0, 65534, 3), (7, 9, 4)]
    logs = transfer(jobs, 4, EXT, stray_start=True)
    for (dst, src, length), log in zip(jobs, logs):
        assert log == expected_log(dst, src, length, 4, EXT)


def test_small_widths():
    (log,) = transfer([(6, 14, 4)], 2, EXT, aw=3, xw=4)
    assert log == expected_log(6, 14, 4, 2, EXT, aw=3, xw=4)


@pytest.mark.parametrize("kw,exc", [({"aw": 0}, ValueError), ({"xw": 0}, ValueError), ({"aw": 12.5}, TypeError),
                                    ({"xw": "16"}, TypeError)])
def test_bad_parameters(kw, exc):
    with pytest.raises(exc, match=next(iter(kw)) + " must"):
        DMA(**kw)


def test_ports():
    d = built(DMA())
    assert d.req_addr.shape().width == 16 and d.spad.waddr.shape().width == 12 and d.length.shape().width == 12


def test_widths_from_config():
    """Without explicit widths the engine takes the scratchpad's address width from the configuration."""
    d = built(DMA(config=ChipConfig(spad_depth=1024)))
    assert d.spad.waddr.shape().width == 10 and d.length.shape().width == 10 and d.req_addr.shape().width == 16
