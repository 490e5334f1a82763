"""Exact completion, the write regions and the WAIT bound (issue 24): the timing contract, and where the
units write, as properties.

* every unit asserts that its done comes exactly ``hdl.isa.busy_cycles`` after the start edge
  (``exact_completion``): LD and GATHER when the memory answered in ``config.lat`` cycles
  (`hdl.units.ld.memory_on_time`), GATHER and SCATTER at an error stop too (``hdl.isa.resident_busy_cycles``);
  every simulation of the tests and of the Amaranth backend evaluates it, and ``sim.formal`` checks it
  bounded from reset (the jobs that end within a target's depth);
* every unit that writes the scratchpad asserts that each write lies in its instruction's destination region
  (``write_region``: MM's dst + m*ldc + n in m-major order, the vector units' [dst, dst + words), GATHER's
  [spad, spad + words));
* a generated chip asserts that no instruction's WAIT outlasts its busy time (``wait_bounded``);
* both are checks of `hdl.properties.checks`: the emitted Verilog is without them.
"""
import pytest
from amaranth.back import rtlil

import hdl.chip
from hdl.chip import GA2
from hdl.config import parse_chip
from hdl.properties import checks
from hdl.units.st import StoreUnit
from sim.verify import formal

TOOLS = formal.find_tools()
TARGETS = {t.name: t for t in formal.targets()}


class LateStore(StoreUnit):
    """An ST whose own idea of its busy time is one cycle more than its done comes."""
    def busy_cycles(self, opr):
        return super().busy_cycles(opr) + 1


def test_exact_completion_holds_bounded_and_fails_on_a_late_unit():
    st = TARGETS["st"]
    assert "exact_completion" in st.properties and "exact_completion" not in st.induct
    assert formal.prove(st, ["exact_completion"], 10, TOOLS, mode="bmc")[0] == "bounded"
    assert formal.prove(st, ["exact_completion"], 10, TOOLS, build=LateStore, mode="bmc")[0] == "FAIL"


def test_the_checks_are_not_in_the_emitted_design():
    plain = rtlil.convert(StoreUnit(), name="top")
    with checks():
        checked = rtlil.convert(StoreUnit(), name="top")
    assert "exact_completion" not in plain and "st.exact_completion" in checked
    cfg = parse_chip("array=8")
    assert "wait_bounded" not in rtlil.convert(GA2(config=cfg), name="top")


def _chip_target(cfg):
    return formal.Target("chip", lambda: formal.ChipEnv(chip=lambda: GA2(config=cfg)),
                         {**hdl.chip.CHIP_PROPERTIES, **hdl.chip.RESIDENT_CHIP_PROPERTIES})


@pytest.mark.timeout(600)
def test_wait_bounded_holds_and_fails_when_a_unit_runs_past_its_time(monkeypatch):
    """From reset, 8 cycles, any program: the WAIT of every instruction ends within its busy time; with an ST
    that runs a cycle past it (its bound one less than it takes) the check finds it."""
    cfg = parse_chip("array=8")
    assert formal.prove(_chip_target(cfg), ["wait_bounded"], 8, TOOLS, mode="bmc")[0] == "bounded"

    class Slow(StoreUnit):
        def busy_cycles(self, opr):
            return super().busy_cycles(opr) - 1
    monkeypatch.setattr(hdl.chip, "StoreUnit", Slow)
    assert formal.prove(_chip_target(cfg), ["wait_bounded"], 8, TOOLS, mode="bmc")[0] == "FAIL"


def _variant(module, old, new):
    """`module`'s source with `old` replaced by `new` (exactly once), loaded as a module of its own."""
    import importlib.util
    from pathlib import Path
    text = Path(module.__file__).read_text()
    assert text.count(old) == 1, old
    spec = importlib.util.spec_from_loader(f"{module.__name__}_broken", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = module.__package__
    exec(compile(text.replace(old, new), module.__file__, "exec"), mod.__dict__)
    return mod


def test_write_region_holds_bounded_and_fails_on_a_unit_writing_past_dst():
    import hdl.units.amax as amax
    target = TARGETS["amax"]
    assert "write_region" in target.properties and "write_region" not in target.induct
    assert formal.prove(target, ["write_region"], 10, TOOLS, mode="bmc")[0] == "bounded"
    broken = _variant(amax, "self.spad.waddr.eq(dst),", "self.spad.waddr.eq(dst + 1),")
    assert formal.prove(target, ["write_region"], 10, TOOLS, build=broken.ArgmaxUnit, mode="bmc")[0] == "FAIL"


def _late(module, old, new):
    """A variant of `module` whose unit finishes one cycle late in some job (`_variant`)."""
    return _variant(module, old, new)


@pytest.mark.timeout(300)
def test_exact_completion_of_ld_gather_scatter_bounded_and_failing_one_cycle_late():
    """LD (built for LAT 2; a job ends within 12 cycles), GATHER (an empty range or an error stop: the STOP
    tail one cycle longer) and SCATTER (a normal end one cycle late, after the last word's write): bounded
    from reset, and a counterexample for each variant."""
    from dataclasses import replace

    import hdl.units.gather as gather
    import hdl.units.ld as ld
    import hdl.units.scatter as scatter
    from hdl.config import BOOK
    lat2 = replace(BOOK, lat=2)
    late_ld = _late(ld, """                    with m.If(count.is_nth(groups)):
                        m.d.sync += self.done.eq(1)
                        m.next = "IDLE"
""", """                    with m.If(count.is_nth(groups)):
                        m.next = "LAST"
            with m.State("LAST"):
                m.d.sync += self.done.eq(1)
                m.next = "IDLE"
""")
    late_stop = _late(gather, "with m.If((tail <= 1) & answered):", "with m.If((tail == 0) & answered):")
    late_end = _late(scatter, """            # ST's end: the last word is written this cycle (END) or nothing is left (STOP)
            self.finish(m)""", """            with m.If(~v):                      # END: a cycle after the last word's write
                self.finish(m)""")
    resident = next(cfg for cfg in formal.UNIT_CHIPS if cfg.gather)     # the chip of their targets
    cases = (("ld", lambda: ld.DMA(config=lat2), lambda: late_ld.DMA(config=lat2)),
             ("gather", None, lambda: late_stop.GatherUnit(config=resident)),
             ("scatter", None, lambda: late_end.ScatterUnit(config=resident)))
    for name, good, late in cases:
        target = TARGETS[name]
        assert "exact_completion" in target.properties and "exact_completion" not in target.induct
        assert formal.prove(target, ["exact_completion"], 10, TOOLS, build=good, mode="bmc")[0] == "bounded", name
        assert formal.prove(target, ["exact_completion"], 10, TOOLS, build=late, mode="bmc")[0] == "FAIL", name
