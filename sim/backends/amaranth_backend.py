"""The Amaranth-simulator backend: runs programs on the RTL of the chip (GA2 + ROM + ExtMemory).

The chip is built from one configuration (`hdl.config.ChipConfig`, the book's by default). One
`Simulator` per (EXT, LAT) is built on first use and reused: `Simulator.reset()` returns every
register and memory to its initial (zero) state, which also zeroes the scratchpad as the book's
testbench does. The ROM, the image and (resident mode, docs/resident.md) an initial scratchpad are
written into the memories before `start`; during the run the
testbench sleeps until `halted` rises (or the cycle budget runs out), so no Python runs per cycle; then
it reads the counters, the external memory and the scratchpad straight from the signals and Memories.
The simulator runs on `sim.backends.amaranth_engine.SkipIdleEngine` (the same results as pysim's stock
engine in about half the time; the stock engine when a waveform is written).
"""
from __future__ import annotations

import gc

from amaranth.hdl import ClockDomain, Module
from amaranth.sim import Simulator

from hdl.config import BOOK
from hdl.harness import ChipHarness
from hdl.properties import checks
from sim.backends.amaranth_engine import engine_class
from sim.backends import (MAX_CYCLES, Backend, BadInput, DidNotHalt, ErrorStop, RunResult, check_lat,
                         check_max_cycles, image_words, program_words, scratchpad_words, trace_from_changes,
                         where_stuck)

__all__ = ["AmaranthBackend", "BadInput"]

_W = 0xFFFFFFFF
_PERIOD = 1e-6


class _Rig:
    """One simulator of the harness for one (EXT, LAT), with the job it is to run next."""

    def __init__(self, ext_words, lat, config, vcd=False):
        self.harness = ChipHarness(ext_words=ext_words, lat=lat, backdoor=False, config=config)
        top = Module()
        top.domains.sync = self.cd = ClockDomain("sync")
        top.submodules.harness = self.harness
        # building makes some hundred thousand objects and no garbage worth a collection: the cyclic
        # collector is paused meanwhile (about a tenth of the build)
        collecting = gc.isenabled()
        gc.disable()
        try:
            with checks():              # the simulation-only checks too (hdl.properties.checks)
                # a faster engine for pysim (sim.backends.amaranth_engine); the stock one to write a waveform
                self.sim = Simulator(top, engine=engine_class(vcd, keep=(self.harness.halted,)))
        finally:
            if collecting:
                gc.enable()
        self.sim.add_clock(_PERIOD)
        self.sim.add_testbench(self._bench)
        self.job = None
        self.fresh = True
        # the memory rows, built once: indexing a MemoryData makes a new object every time
        self.rom_rows = [self.harness.rom.data[i] for i in range(self.harness.rom.depth)]
        self.ext_rows = [self.harness.ext.data[i] for i in range(ext_words)]
        spad = self.harness.chip.scratchpad
        self.spad_rows = [spad.row(i) for i in range(spad.depth)]
        # SkipIdleEngine moves a memory's words at once (ctx.set settles the design after each word, and
        # ctx.get costs more than the read); the stock engine (a waveform) goes word by word
        self.rows_io = self.sim._engine if hasattr(self.sim._engine, "read_rows") else _RowsByContext()

    async def _bench(self, ctx):
        job = self.job
        if job is None:          # only `run` starts the simulation, with a job; nothing to do otherwise
            return
        h = self.harness
        # memories start at zero after reset: only the words other than zero are written
        io = self.rows_io
        io.write_rows(ctx, [(row, w) for rows, words in ((self.rom_rows, job.rom), (self.ext_rows, job.image),
                                                         (self.spad_rows, job.spad or ()))
                            for row, w in zip(rows, words) if w])
        ctx.set(self.cd.rst, 1)
        await ctx.tick()
        ctx.set(self.cd.rst, 0)
        ctx.set(h.start, 1)
        await ctx.tick()
        ctx.set(h.start, 0)
        # Sleep until `halted` rises, or until the cycle budget is spent: no Python runs per cycle.
        # A legal run needs at most max_cycles + 2 edges after this one (cyc_total counts from the
        # first FETCH); the extra half period puts the deadline between two edges.
        budget = job.max_cycles + 2
        chip = h.chip
        if job.changes is not None:
            # a traced run: wake at every change of the sequencer's state or pc (a few times an
            # instruction) and note (cyc_total, state, pc) there, as the Verilator driver does each cycle
            job.changes.append((ctx.get(h.cyc_total), ctx.get(chip.state).value, ctx.get(chip.pc)))
            while not ctx.get(h.halted):
                # cyc_total counts the edges since the start's, so the deadline stays where it was
                left = budget - ctx.get(h.cyc_total)
                *_, late = await ctx.changed(chip.state, chip.pc).delay((left + 0.5) * _PERIOD)
                if late:
                    break
                job.changes.append((ctx.get(h.cyc_total), ctx.get(chip.state).value, ctx.get(chip.pc)))
        elif not ctx.get(h.halted):
            await ctx.posedge(h.halted).delay((budget + 0.5) * _PERIOD)
        if ctx.get(h.halted) and h.config.generated:
            # one more edge: the design's Asserts then judge the first HALT cycle too (nothing may still
            # move after an error stop: chip.halt_quiet); HALT changes no counter or memory
            await ctx.tick()
        job.halted = ctx.get(h.halted)
        job.counters = [ctx.get(c) for c in (h.cyc_total, h.cyc_mm, h.cyc_dma, h.cyc_vec, h.n_inst)]
        job.where = (ctx.get(chip.pc), ctx.get(chip.cur), ctx.get(chip.state))
        job.ext = io.read_rows(ctx, self.ext_rows)
        job.scratchpad = io.read_rows(ctx, self.spad_rows)
        if self.harness.config.generated and ctx.get(chip.error):
            job.error = (ctx.get(chip.error_kind), ctx.get(chip.error_pc), ctx.get(chip.error_info))

    def run(self, job, vcd=None):
        if not self.fresh:
            self.sim.reset()
        self.fresh = False
        self.job = job
        try:
            if vcd:
                with self.sim.write_vcd(vcd):
                    self.sim.run()
            else:
                self.sim.run()
        finally:
            self.job = None


class _RowsByContext:
    """Memory rows written and read through the testbench's context, one at a time."""

    @staticmethod
    def write_rows(ctx, pairs):
        for row, word in pairs:
            ctx.set(row, word)

    @staticmethod
    def read_rows(ctx, rows):
        return [ctx.get(row) for row in rows]


class _Job:
    def __init__(self, rom, image, max_cycles, spad=None, traced=False):
        self.changes = [] if traced else None       # the sequencer's (cyc_total, state, pc) at each change
        self.rom = rom
        self.image = image
        self.spad = spad
        self.error = None
        self.max_cycles = max_cycles
        self.halted = False
        self.counters = None
        self.where = None
        self.ext = None
        self.scratchpad = None


class AmaranthBackend(Backend):
    """Run programs on the chip's RTL in Amaranth's Python simulator.

    Parameters
    ----------
    max_cycles : int
        Give up (`DidNotHalt`) when the chip has not halted within this many cycles.
    vcd : str or None
        Write a waveform of each run to this path (the last run wins); none when ``None``.
    config : hdl.config.ChipConfig
        The chip to simulate (keyword only; the book's chip by default).
    trace : bool
        Give every result a per-instruction trace (`RunResult.trace`, keyword only; off by default), rebuilt
        from the sequencer's state and pc at each of their changes (`sim.backends.trace_from_changes`): the
        testbench wakes a few times an instruction instead of once a run.
    """
    name = "amaranth"

    def __init__(self, max_cycles: int = MAX_CYCLES, vcd=None, *, config=BOOK, trace: bool = False):
        self.max_cycles = check_max_cycles(max_cycles)
        self.vcd = vcd
        self.config = config
        self.trace = bool(trace)
        self._rigs: dict[tuple[int, int], _Rig] = {}

    def _rig(self, ext_words, lat):
        key = (ext_words, lat)
        if key not in self._rigs:
            self._rigs[key] = _Rig(ext_words, lat, self.config, vcd=bool(self.vcd))
        return self._rigs[key]

    def build(self, ext_words: int, lat: int) -> None:
        """Build now the simulator that runs jobs of `ext_words` EXT words and latency `lat` (otherwise built
        by the first such run, then reused): `ga2 bench` times the build apart."""
        self._rig(ext_words, check_lat(lat))

    def run(self, program, image, lat: int = 8, scratchpad=None) -> RunResult:
        """Run `program` (128-bit words or Instr, HALT last) on `image` (EXT words) with latency `lat`,
        the scratchpad starting as `scratchpad` (None: all zero; else ``config.spad_depth`` words)."""
        check_lat(lat)
        rom = program_words(program)
        ext = image_words(image)
        spad = scratchpad_words(scratchpad, self.config.spad_depth)
        job = _Job(rom, ext, self.max_cycles, spad, traced=self.trace)
        self._rig(len(ext), lat).run(job, self.vcd)
        total = job.counters[0]
        if not job.halted or total > self.max_cycles:
            pc, cur, state = job.where
            raise DidNotHalt(f"did not halt within {self.max_cycles} cycles "
                             f"({where_stuck(pc, cur, state, self.config)})")
        error = None
        if job.error is not None:
            kind, pc, info = job.error
            error = ErrorStop(ErrorStop.KINDS[int(kind.value if hasattr(kind, "value") else kind)], pc, info)
        trace = trace_from_changes(job.changes) if job.changes is not None else None
        return RunResult(ext=job.ext, counters=job.counters, scratchpad=job.scratchpad, error=error, trace=trace)

