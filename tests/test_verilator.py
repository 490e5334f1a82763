"""The Verilator backend: the build cache, the batch protocol, and agreement with the reference machine.

The first group runs a tiny stand-in harness defined here (same ports as hdl.harness.ChipHarness) against
a Python model of it, so the flow is checked independently of the chip. The second group runs the real
chip and compares it with sim.reference on the book's figures and on random programs.
"""

import os
import random
import shutil

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim.backend import BackendUnavailable, DidNotHalt, RunResult, SimError

try:
    from sim.verilator_backend import VerilatorBackend, _find_tool
    _find_tool()
    HAVE_VERILATOR = True
except BackendUnavailable:          # pragma: no cover - depends on the machine
    HAVE_VERILATOR = False

pytestmark = pytest.mark.skipif(not HAVE_VERILATOR, reason="Verilator is not installed")


# ---- a stand-in harness ---------------------------------------------------------------------------

class StandIn(wiring.Component):
    """A toy machine with the ChipHarness ports: every LAT cycles it executes ROM word pc.

    Word: op = bits 127:124, src = bits 15:0, dst = bits 31:16. op 0 halts; op 15 spins for ever;
    any other op does ext[dst] <- ext[src] + op. Counters: total edges, edges spent on op 3 words (mm),
    constant LAT (dma), sum of executed ops (vec), executed non-halt words (n_inst).
    """
    start: In(1)
    halted: Out(1)
    cyc_total: Out(32)
    cyc_mm: Out(32)
    cyc_dma: Out(32)
    cyc_vec: Out(32)
    n_inst: Out(32)
    rom_we: In(1)
    rom_addr: In(8)
    rom_wdata: In(128)
    ext_we: In(1)
    ext_addr: In(16)
    ext_wdata: In(32)
    ext_rdata: Out(32)

    def __init__(self, ext_words, lat):
        self.ext_words, self.lat = ext_words, lat
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.rom = rom = Memory(shape=128, depth=256, init=[])
        m.submodules.ext = ext = Memory(shape=32, depth=self.ext_words, init=[])
        rom_w, rom_r = rom.write_port(), rom.read_port(domain="comb")
        ext_w, ext_r, ext_b = ext.write_port(), ext.read_port(domain="comb"), ext.read_port(domain="comb")
        running = Signal()
        pc = Signal(8)
        wait = Signal(range(self.lat))
        ins = rom_r.data
        op = ins[124:128]
        m.d.comb += [rom_r.addr.eq(pc), ext_r.addr.eq(ins[0:16]), ext_b.addr.eq(self.ext_addr),
                     self.ext_rdata.eq(ext_b.data)]
        m.d.comb += [rom_w.en.eq(self.rom_we), rom_w.addr.eq(self.rom_addr), rom_w.data.eq(self.rom_wdata)]
        m.d.comb += [ext_w.en.eq(self.ext_we), ext_w.addr.eq(self.ext_addr), ext_w.data.eq(self.ext_wdata)]
        with m.If(self.start & ~running & ~self.halted):
            m.d.sync += [running.eq(1), pc.eq(0), wait.eq(0), self.cyc_total.eq(0), self.cyc_mm.eq(0),
                         self.cyc_dma.eq(self.lat), self.cyc_vec.eq(0), self.n_inst.eq(0)]
        with m.If(running):
            m.d.sync += self.cyc_total.eq(self.cyc_total + 1)
            with m.If(op == 3):
                m.d.sync += self.cyc_mm.eq(self.cyc_mm + 1)
            with m.If(wait == self.lat - 1):
                m.d.sync += wait.eq(0)
                with m.If(op == 0):
                    m.d.sync += [running.eq(0), self.halted.eq(1)]
                with m.Elif(op != 15):
                    m.d.sync += [pc.eq(pc + 1), self.n_inst.eq(self.n_inst + 1),
                                 self.cyc_vec.eq(self.cyc_vec + op)]
                    m.d.comb += [ext_w.en.eq(1), ext_w.addr.eq(ins[16:32]), ext_w.data.eq(ext_r.data + op)]
            with m.Else():
                m.d.sync += wait.eq(wait + 1)
        return m


def standin_model(program, image, lat):
    """What the stand-in computes, written independently in Python."""
    ext = list(image)
    counters = [0, 0, lat, 0, 0]
    for word in program:
        op, src, dst = word >> 124, word & 0xFFFF, (word >> 16) & 0xFFFF
        counters[0] += lat
        counters[1] += lat if op == 3 else 0
        if op == 0:
            break
        ext[dst] = (ext[src] + op) & 0xFFFFFFFF
        counters[3] += op
        counters[4] += 1
    return RunResult(ext=ext, counters=counters)


def toy(op, src, dst):
    return (op << 124) | (dst << 16) | src


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    return tmp_path_factory.mktemp("verilator-cache")


def test_standin_batch_matches_model(build_root):
    be = VerilatorBackend(build_dir=build_root, design=StandIn)
    rng = random.Random(7)
    jobs = []
    for n in range(12):
        lat = (3, 5)[n % 2]
        image = [rng.randrange(1 << 32) if rng.random() < 0.5 else 0 for _ in range(64)]
        program = [toy(rng.randrange(1, 15), rng.randrange(64), rng.randrange(64))
                   for _ in range(rng.randrange(0, 20))] + [toy(0, 0, 0)]
        jobs.append((program, image, lat))
    got = be.run_many(jobs)
    assert len(got) == len(jobs)
    for (program, image, lat), r in zip(jobs, got):
        want = standin_model(program, image, lat)
        assert r.counters == want.counters
        assert r.ext == want.ext
    assert be.builds == 2                   # one model per LAT
