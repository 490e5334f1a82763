"""Small helpers shared by the block tests: run one async testbench against one component.

`run(dut, bench)` builds a Simulator, adds a clock to the `sync` domain unless `clocked=False` (purely
combinational blocks), adds `bench(ctx)` as the only testbench and runs it to completion.
No VCD is written unless the environment variable GA2_VCD names a file.
"""
from __future__ import annotations

import os

from amaranth.hdl import Fragment, Module
from amaranth.sim import Simulator

from hdl.properties import checks

__all__ = ["run", "built"]


def built(component):
    """Elaborate `component` once and return it (port-shape tests, which never simulate, stay warning-free)."""
    Fragment.get(component, None)
    return component


def run(dut, bench, *, clocked: bool = True, domain=None):
    """Simulate `dut` with the async testbench `bench(ctx)`; return what the testbench returned.

    Pass an `amaranth.hdl.ClockDomain("sync")` as `domain` to drive its `rst` from the testbench.
    """
    if domain is not None:
        top = Module()
        top.domains.sync = domain
        top.submodules.dut = dut
        dut = top
    with checks():                      # the simulation-only checks too (hdl.properties.checks)
        sim = Simulator(dut)
    if clocked:
        sim.add_clock(1e-6)
    result = {}

    async def wrapper(ctx):
        result["value"] = await bench(ctx)

    sim.add_testbench(wrapper)
    vcd = os.environ.get("GA2_VCD")
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()
    return result.get("value")


def check_traces_against_reference(cases, got, cfg, budget, least_entries):
    """Each result of `got` (an RTL run of fuzz case `cases[i]` with ``trace=True``) equals the reference
    machine's run of the same case, trace included; on a chip other than the book's the cases must have
    reached overlapped issues, a HALT issued in a done cycle, an error stop and resident programs."""
    from sim.backends import first_difference
    from sim.backends.reference import ReferenceMachine
    ref = ReferenceMachine(check=False, trace=True, config=cfg, max_cycles=budget)
    for c, r in zip(cases, got, strict=True):
        want = ref.run(c.program, c.image, c.lat, c.scratchpad)
        assert first_difference(want, r) is None
        assert r.trace == want.trace, f"program {c.index}"
    assert sum(len(r.trace) for r in got) > least_entries
    if cfg.generated:
        assert any(e.seq == 0 for r in got for e in r.trace[:-1])      # issued in a done cycle
        assert any(r.trace[-1].seq == 0 for r in got)                   # a HALT issued in a done cycle
        assert any(r.error is not None for r in got)                    # an error stop
        assert any(c.scratchpad is not None for c in cases)             # resident programs
