"""Test fixture for one chip unit on its own: a Scratchpad connected to the unit's ``spad`` port, as the chip
does while the unit owns the scratchpad (hardware spec 2.3).

The testbench helpers follow the common protocol of spec 4: `issue` drives start for one cycle (the ISSUE
cycle), then counts WAIT cycles W1, W2, ... until done is seen; the count is the busy time B.
"""
from __future__ import annotations

import random

from amaranth.hdl import Elaboratable, Module
from amaranth.lib.wiring import connect
from amaranth.sim import Simulator

from hdl.properties import checks
from hdl.scratchpad import Scratchpad

__all__ = ["UnitBench", "Cycle", "simulate", "nonzero_words"]

SPAD_DEPTH = 4096
MASK32 = 0xFFFFFFFF


def nonzero_words(seed: int) -> list[int]:
    """A whole scratchpad of random words, none of them 0: a unit that wrote a zero (or anything) where it
    should write nothing is seen, which an all-zero scratchpad would hide."""
    rng = random.Random(seed)
    return [rng.randrange(1, MASK32 + 1) for _ in range(SPAD_DEPTH)]


class Cycle:
    """What the unit drove in one WAIT cycle (recorded only when asked for)."""
    __slots__ = ("n", "ra", "we", "wa", "wd", "busy", "done")

    def __init__(self, n, ra, we, wa, wd, busy, done):
        self.n, self.ra, self.we, self.wa, self.wd, self.busy, self.done = n, ra, we, wa, wd, busy, done


class UnitBench(Elaboratable):
    """A Scratchpad plus the unit under test; `unit.start` and `unit.ins` are left for the testbench."""

    def __init__(self, unit):
        self.unit = unit
        self.junk = random.Random(0x6A2)    # the bits that replace an instruction after E0: seeded, so a run repeats
        # the unit's chip's scratchpad, with as many read ports as the unit's port has
        sig = unit.spad.signature
        self.scratchpad = Scratchpad(depth=SPAD_DEPTH, width=32, reads=sig.reads, lanes=sig.lanes,
                                     read_lanes=sig.read_lanes, lane_reads=sig.lane_reads or None,
                                     config=unit.config)

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = u = self.unit
        m.submodules.scratchpad = sp = self.scratchpad
        connect(m, u.spad, sp.port)
        return m

    # ---- testbench helpers (call from inside an async testbench) ----------------------------------

    def fill(self, ctx, words):
        """Backdoor: write `words` (a list of SPAD_DEPTH words, or a dict address -> word)."""
        items = words.items() if isinstance(words, dict) else enumerate(words)
        for a, w in items:
            ctx.set(self.scratchpad.row(a), w & MASK32)

    def dump(self, ctx):
        """Backdoor: the whole scratchpad as a list of unsigned words."""
        return [ctx.get(self.scratchpad.row(a)) for a in range(SPAD_DEPTH)]

    def check_against(self, ctx, mirror, word):
        """Assert that the whole scratchpad equals `mirror`, naming the first differing word."""
        got = self.dump(ctx)
        bad = [a for a in range(SPAD_DEPTH) if got[a] != mirror[a]]
        assert not bad, (f"{word:#034x}: {len(bad)} words differ, first at {bad[0]}: "
                         f"got {got[bad[0]]:#x}, want {mirror[bad[0]]:#x}")

    async def issue(self, ctx, word, *, limit=5000, trace=False, junk=None, stray=(), hang=False):
        """Start the unit on instruction `word` and clock until done; return (B, trace list or None).

        After E0 the instruction input is replaced by `junk` (default: random bits), so a unit that
        does not latch its operands at E0 is caught. `stray` lists WAIT cycles in which start is
        pulsed again (a busy unit must ignore it). With `hang`, the instruction must NOT finish: after
        `limit` cycles without done and without any write, (None, trace) is returned.
        """
        u = self.unit
        ctx.set(u.ins, word)
        ctx.set(u.start, 1)
        await ctx.tick()                    # E0: the edge closing the ISSUE cycle
        ctx.set(u.start, 0)
        ctx.set(u.ins, self.junk.getrandbits(128) if junk is None else junk)
        cycles = [] if trace else None
        for n in range(1, limit + 1):       # now in W_n
            ctx.set(u.start, n in stray)
            done = ctx.get(u.done)
            if hang:
                assert not done and not ctx.get(u.spad.we), f"instruction {word:#034x} acted in W{n}"
            if trace:
                p = u.spad
                cycles.append(Cycle(n, ctx.get(p.raddr), ctx.get(p.we), ctx.get(p.waddr), ctx.get(p.wdata),
                                    ctx.get(u.busy), done))
            if done:
                ctx.set(u.start, 0)
                await ctx.tick()
                return n, cycles
            await ctx.tick()
        ctx.set(u.start, 0)
        if hang:
            return None, cycles
        raise AssertionError(f"no done within {limit} cycles for instruction {word:#034x}")

    async def idle(self, ctx, n):
        """Clock n cycles with start low, checking that the idle unit writes nothing and stays quiet."""
        u = self.unit
        for _ in range(n):
            assert (ctx.get(u.spad.we), ctx.get(u.busy), ctx.get(u.done)) == (0, 0, 0)
            await ctx.tick()


def simulate(unit, bench_fn):
    """Run `bench_fn(ctx, bench)` against `UnitBench(unit)` in a fresh simulator; return its result."""
    bench = UnitBench(unit)
    with checks():                      # the simulation-only checks too (hdl.properties.checks)
        sim = Simulator(bench)
    sim.add_clock(1e-6)
    out = {}

    async def tb(ctx):
        out["r"] = await bench_fn(ctx, bench)

    sim.add_testbench(tb)
    sim.run()
    return out.get("r")
