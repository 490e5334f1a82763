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
