"""The design's properties evaluated in Verilator (issue 24 part 3): ``VerilatorBackend(asserts=True)``,
``ga2 fuzz --assert`` and ``ga2 decode --assert``.

* every `Assert` of the chip (`hdl.properties.History.check`), those of `hdl.properties.checks` included (a
  unit's exact completion and write region, a generated chip's WAIT bound: the model with assertions is
  elaborated inside it), is an immediate ``assert`` in the Verilog the model is built from, its message
  written right before it;
* a design broken so that only an assertion can tell (a unit that raises its write enable a cycle after done,
  when the port is no longer routed to it: the scratchpad is unchanged) fails with a one-line
  `AssertionFailed` naming the property and the edge, computed from the reference's cycle count; in the same
  model an ST one cycle late fails its exact completion (a check of `hdl.properties.checks`);
* a fresh-seed fuzz slice with assertions on for the book's chip and for ``fast`` (one (EXT, LAT) pair each:
  one model each, built once and cached apart from the model without assertions).
"""
import contextlib
import os
import re
from collections import Counter

import pytest
from amaranth.hdl import Signal

from hdl.chip import CHIP_PROPERTIES, RESIDENT_CHIP_PROPERTIES
from hdl.config import PRESETS
from hdl.isa import amax, halt, ld, st
from hdl.properties import checks
from hdl.units import unit_classes
from hdl.units.amax import ArgmaxUnit
from hdl.units.base import COMPLETION_PROPERTIES, WRITE_BUSY_PROPERTIES
from hdl.units.st import StoreUnit
from sim.backends import AssertionFailed
from sim.backends.reference import ReferenceMachine
from sim.verify.progen import RESIDENT_CI_CONFIGS

try:
    from sim.backends.verilator_backend import VerilatorBackend, _find_tool
    _find_tool()
    HAVE_VERILATOR = True
except Exception:       # noqa: BLE001 - any reason the tool cannot run means: skip those tests
    HAVE_VERILATOR = False

needs_verilator = pytest.mark.skipif(not HAVE_VERILATOR, reason="Verilator is not installed")

SLICE_COUNT = 16            # programs of each fuzz slice (a fresh seed each run)
SLICE_BUDGET = 30_000       # cycles per program there
# one (EXT, LAT) pair a chip: one model each (the book's is the CI campaign's first pair; fast's the resident one)
SLICE_CONFIGS = {"book": ((2048, 8),), "fast": RESIDENT_CI_CONFIGS}

# "if (!cond) $write("<message>"); assert (cond);" as Amaranth's Verilog has every Assert
_ASSERTED = re.compile(r'if \(!(\S+) \)\s*\$write\("([^"]*)"\);\s*assert \((\S+) \);')


def asserted_messages(verilog: str) -> Counter:
    """The messages of the immediate assertions in `verilog`, each counted once per assertion; a message
    whose guard is not the asserted condition is not counted."""
    return Counter(msg for guard, msg, cond in _ASSERTED.findall(verilog) if guard == cond)


def design_messages(design, checked=True) -> Counter:
    """The message of every `Assert` the design's blocks add through `hdl.properties.History.check`,
    counted, found by elaborating `design` (no Verilog); with `checked` (as the model with assertions is
    elaborated) inside `hdl.properties.checks`."""
    import hdl.properties
    from amaranth.hdl import Fragment
    made = Counter()
    check = hdl.properties.History.check

    def counted(self, name, holds, text, *args, **kwargs):
        made[f"{self.scope}.{name}: {text}"] += 1
        return check(self, name, holds, text, *args, **kwargs)

    hdl.properties.History.check = counted
    try:
        with checks() if checked else contextlib.nullcontext():
            Fragment.get(design, None)
    finally:
        hdl.properties.History.check = check
    return made


def expected_names(cfg) -> set:
    """``<scope>.<property>`` of every property the chip `cfg` carries: the chip's (a generated chip's
    too), every unit's under its scope (`hdl.units.base.Scoped`: the exact completion and write region among
    them)."""
    chip = {**CHIP_PROPERTIES, **(RESIDENT_CHIP_PROPERTIES if cfg.generated else {})}
    scope = "prefetch" if cfg.prefetch else "chip"
    return ({f"{scope}.{p}" for p in chip} |
            {f"{cls.scope_of(cfg)}.{p}" for cls in unit_classes(cfg).values() for p in cls.properties_of(cfg)})


@pytest.mark.parametrize("chip", ["book", "fast"])
def test_every_assert_of_the_chip_is_an_immediate_assertion_in_its_verilog(chip):
    """The harness emitted as the Verilator backend emits the model with assertions (inside
    `hdl.properties.checks`): one ``assert`` per `History.check` call, and among them every property of the
    chip and its units, the simulation-only ones included; the model without assertions has none of those."""
    from hdl.harness import ChipHarness
    from sim.backends.verilator_backend import _emit_chip_verilog
    cfg = PRESETS[chip]
    made = design_messages(ChipHarness(ext_words=64, lat=3, config=cfg))
    text = _emit_chip_verilog(64, 3, cfg, checked=True)
    assert made and asserted_messages(text) == made
    names = {m.split(": ", 1)[0] for m in made}
    assert expected_names(cfg) <= names, expected_names(cfg) - names
    only_checked = {n.split(".", 1)[1] for n in names} & {"exact_completion", "write_region", "wait_bounded"}
    assert only_checked == ({"exact_completion", "write_region"} | ({"wait_bounded"} if cfg.generated else set()))
    plain = _emit_chip_verilog(64, 3, cfg)
    assert asserted_messages(plain) == design_messages(ChipHarness(ext_words=64, lat=3, config=cfg), checked=False)
    assert not any(m.split(": ", 1)[0].split(".", 1)[1] in only_checked for m in asserted_messages(plain))


class LateAmax(ArgmaxUnit):
    """Raises its write enable once more in the cycle after done, when it no longer owns the port: the
    ownership decoder drops the write (nothing changes), only the chip's owner_writes Assert sees it."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        late = Signal()
        m.d.sync += late.eq(self.done)
        with m.If(late):
            m.d.comb += self.spad.we.eq(1)
        return m


class LateStore(StoreUnit):
    """ST whose last word goes through a drain cycle: done one cycle late, everything it writes unchanged.
    Only the cycle counts and the exact completion (a check of `hdl.properties.checks`) can tell."""
    def one_pass(self, m, opr, n, drain=False):
        return super().one_pass(m, opr, n, drain=True)


@needs_verilator
@pytest.mark.timeout(900)
def test_a_failed_assertion_names_the_property_and_the_edge(monkeypatch):
    """One model of a chip with two broken units (one build): the late AMAX write fails amax.write_in_busy (the
    unit's own invariant, reported first) and chip.owner_writes in the same edge, an
    ST one cycle late (a program without AMAX) fails st.exact_completion, a check the model carries because
    it is elaborated inside `hdl.properties.checks`; each at the edge the reference's cycle count gives."""
    import hdl.chip
    from hdl.harness import ChipHarness
    monkeypatch.setattr(hdl.chip, "ArgmaxUnit", LateAmax)
    monkeypatch.setattr(hdl.chip, "StoreUnit", LateStore)
    # the shared build directory: a model made from a design is keyed by its Verilog text, so the broken
    # chip's model cannot stand in for the real one, and it reuses the run-time library's compiled objects
    be = VerilatorBackend(design=lambda ext, lat: ChipHarness(ext_words=ext, lat=lat), asserts=True)
    lat = 3
    image = [3, 9, 2, 7, 1, 0, 5, 4] + [0] * 56
    program = [ld(0, 0, 8).word, amax(100, 0, 8).word, st(100, 50, 1).word, halt().word]
    store = [ld(0, 0, 8).word, st(0, 40, 8).word, halt().word]
    got = be.run_many([(program, image, lat), ([halt().word], image, lat), (program[1:], image, lat),
                       (store, image, lat)], return_errors=True)
    ref = ReferenceMachine()
    # AMAX's done is in the last WAIT cycle of the prefix before the ST; its late write one cycle later.
    # Cycle c of the run ends at edge c after the start pulse (cycle 1 is the first FETCH).
    for job, (prefix, result) in enumerate(((program[:2], got[0]), (program[1:2], got[2])), ):
        edge = ref.run(prefix + [halt().word], image, lat).cycles - 2 + 1       # HALT's two cycles off
        assert isinstance(result, AssertionFailed), result
        msg = str(result)
        assert msg == (f"assertion amax.write_in_busy failed at edge {edge} after the start pulse: "
                       f"{WRITE_BUSY_PROPERTIES['write_in_busy']} (and 1 other property in the same edge) "
                       f"(job {2 * job})"), msg
    # the job between them runs on a fresh model, unharmed
    assert got[1].counters == ref.run([halt().word], image, lat).counters
    # ST's done comes one cycle after the cycle model's (the run's cycles without HALT's two)
    edge = ref.run(store, image, lat).cycles - 2 + 1
    assert str(got[3]) == (f"assertion st.exact_completion failed at edge {edge} after the start pulse: "
                           f"{COMPLETION_PROPERTIES['exact_completion']} (job 3)"), str(got[3])
    with pytest.raises(AssertionFailed) as e:
        be.run(program, image, lat)
    assert "\n" not in str(e.value) and str(e.value).startswith("assertion amax.write_in_busy failed at edge ")
    # the model was built with Verilator's --assert, and the driver told to report
    log = (be.model(64, lat).parent / "build.log").read_text().splitlines()[0]
    assert " --assert " in log and "--noassert" not in log and "-DGA2_ASSERT=1" in log


@needs_verilator
@pytest.mark.timeout(900)
@pytest.mark.parametrize("chip", ["book", "fast"])
def test_fuzz_slice_with_assertions(chip):
    """A fresh seed every run (GA2_SEED=S repeats one): SLICE_COUNT programs of the mix with every Assert
    evaluated, equal to the reference; the model's Verilog asserts every property of the chip."""
    import io

    from sim.verify.fuzz import fuzz
    cfg = PRESETS[chip]
    env = os.environ.get("GA2_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(4), "little")
    print(f"fuzz seed: {seed} (rerun with GA2_SEED={seed})")
    be = VerilatorBackend(config=cfg, asserts=True)
    out = io.StringIO()
    s = fuzz(be, ReferenceMachine(check=False, config=cfg), SLICE_COUNT, seed, configs=SLICE_CONFIGS[chip],
             out=out, budget=SLICE_BUDGET)
    assert s["failures"] == 0, (f"seed {seed} (GA2_SEED={seed} repeats this run): {s['failures']} of "
                                f"{SLICE_COUNT} programs differ:\n{out.getvalue()}")
    (ext, lat), = SLICE_CONFIGS[chip]
    model = be.model(ext, lat).parent
    from hdl.harness import ChipHarness
    assert asserted_messages((model / "harness.v").read_text()) == design_messages(
        ChipHarness(ext_words=ext, lat=lat, config=cfg))
    assert " --assert " in (model / "build.log").read_text().splitlines()[0]


def test_assert_needs_the_verilator_simulator(capsys):
    from sim.cli import guarded
    from sim.verify.fuzz import main as fuzz_main
    from sim.decode import main as decode_main
    for main, sim in ((fuzz_main, "amaranth"), (decode_main, "reference")):
        assert guarded(main, ["--assert", "--sim", sim]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --assert builds the Verilator model with the design's assertions: it needs "
                              f"--sim verilator, not --sim {sim}") and err.count("\n") == 1


def test_the_reproduce_command_keeps_the_assertions():
    from sim.verify.fuzz import build_parser, reproduce_command
    cmd = reproduce_command("verilator", 7, 12, 2048, 3, chip=PRESETS["fast"], asserts=True)
    assert cmd.endswith(" --chip fast --assert")
    a = build_parser().parse_args(cmd.split()[3:])
    assert a.asserts and a.sim == "verilator" and (a.first, a.count, a.ext, a.lat) == (12, 1, 2048, 3)
    assert "--assert" not in reproduce_command("verilator", 7, 12, 2048, 3)
