# amaranth: UnusedElaboratable=no
"""Resident mode on the chip (issue 13, docs/resident.md): GATHER and SCATTER in the RTL, against the
reference machine, on the Amaranth simulator and on Verilator.

* the resident programs of the fuzz mix (`sim.verify.progen.resident_program`) reach their corners (read back
  through ``hdl.isa.operands`` and the reference's outcome, not the generator's bookkeeping);
* a few hundred of them on Verilator and a handful on the Amaranth simulator equal the reference word
  for word, counter for counter and error for error (a fresh seed each run, printed; ``GA2_SEED=S``
  repeats it);
* a block table pointing outside the pool stops the chip with the error state on all three simulators,
  and the instruction after it is not executed;
* the initial scratchpad (``scratchpad=``) reaches every backend;
* the book's chip has no trace of the resident mode: opcodes 9 and 10 hang it as before.
"""
import os
import random
from dataclasses import replace

import pytest

from hdl import isa
from hdl.config import BOOK
from hdl.isa import Op, operands
from sim.backends import DidNotHalt, ErrorStop, first_difference
from sim.verify.progen import RESIDENT_CI_CONFIGS, fuzz_case
from sim.backends.reference import ReferenceMachine

try:
    from sim.backends.verilator_backend import VerilatorBackend, _find_tool
    _find_tool()
    HAVE_VERILATOR = True
except Exception:       # noqa: BLE001 - any reason the tool cannot run means: skip those tests
    HAVE_VERILATOR = False

CFG = replace(BOOK, gather=1)
CORNER_SEED = 20261201
CI_COUNT = 300          # resident programs of the fresh-seed campaign on Verilator
AMARANTH_COUNT = 4
LAT = 3                 # the bad-table programs' LAT: the CI campaign's Verilator model of EXT 2048 serves them


def reference():
    return ReferenceMachine(config=CFG, check=False)


def resident_cases(seed, count, configs=RESIDENT_CI_CONFIGS):
    """The first `count` resident programs of the mix of `seed` on the gather chip (book programs skipped)."""
    out, i = [], 0
    while len(out) < count:
        c = fuzz_case(seed, i, configs, config=CFG)
        if c.scratchpad is not None:
            out.append(c)
        i += 1
    return out


def test_resident_mix_reaches_its_corners():
    """Both instructions; runs over one, two and three or more pages, partial first and last pages;
    one-row pages and one-word rows; both error kinds, in the first run and later; programs that end
    normally; the initial scratchpad differing from zero; junk in the ignored bits; a table LD between."""
    cases = resident_cases(CORNER_SEED, 120)
    ref = reference()
    seen = set()
    for c in cases:
        r = ref.run(c.program, c.image, c.lat, scratchpad=c.scratchpad)
        seen.add(("end", r.error.kind if r.error else None))
        assert any(c.scratchpad)
        ops = [operands(w) for w in c.program]
        for o, w in zip(ops, c.program):
            op = o["op"]
            if op in (Op.GATHER, Op.SCATTER):
                seen.add(Op(op))
                runs = isa.resident_runs(o["lo"], o["hi"], o["page_log2"])
                seen.add(("runs", min(len(runs), 3)))
                first_partial = o["lo"] & ((1 << o["page_log2"]) - 1) != 0
                last_partial = o["hi"] & ((1 << o["page_log2"]) - 1) != 0
                seen.add(("partial", first_partial, last_partial))
                seen.add(("page_log2", o["page_log2"] == 0))
                seen.add(("row_log2", o["row_log2"] == 0))
                if w & ignored(op):
                    seen.add("junk")
            if op == Op.LD:
                seen.add("ld")
        if r.error is not None:
            pcs = [k for k, o in enumerate(ops) if o["op"] in (Op.GATHER, Op.SCATTER)]
            seen.add(("error in first resident instruction", r.error.pc == pcs[0]))
    want = {Op.GATHER, Op.SCATTER, ("runs", 1), ("runs", 2), ("runs", 3), ("end", None), ("end", "row"),
            ("end", "page"), ("page_log2", True), ("row_log2", True), "junk", "ld",
            ("error in first resident instruction", True), ("error in first resident instruction", False)}
    want |= {("partial", a, b) for a in (False, True) for b in (False, True)}
    assert want <= seen, sorted(map(str, want - seen))


def ignored(op):
    from sim.verify.progen import ignored_bits
    return ignored_bits(op)


def compare_all(backend, cases):
    """Run `cases` on `backend` and the reference; return the failure lines."""
    ref = reference()
    jobs = [(c.program, c.image, c.lat, c.scratchpad) for c in cases]
    want = ref.run_many(jobs, return_errors=True)
    got = backend.run_many(jobs, return_errors=True)
    bad = []
    for c, a, b in zip(cases, want, got):
        diff = first_difference(a, b) if not isinstance(b, Exception) else f"raised {b}"
        if diff is not None:
            bad.append(f"program {c.index} (seed {c.seed}, EXT {c.ext}, LAT {c.lat}): {diff}")
    return bad


def bad_table_program(kind):
    """LD-free program: GATHER of rows 0..7 over pages of 4 rows; entry 1 is outside the pool (kind
    "page") or the table has one entry (kind "row"); then an ST that must not run, and HALT."""
    table_len = 1 if kind == "row" else 2
    prog = [isa.scatter(100, 50, 2, 1024, 2, 0, 4, 1, 8),        # fine: page table[0], 4 rows of 2 words
            isa.gather(200, 50, table_len, 1024, 2, 0, 8, 1, 8),  # run 2 fails
            isa.st(0, 0, 16), isa.halt()]
    spad = [0] * CFG.spad_depth
    for a in range(100, 108):
        spad[a] = 0x1000 + a
    spad[50], spad[51] = 3, 8                                   # 8 = pool_pages: outside the pool
    image = [(a * 7 + 1) & 0xFFFFFFFF for a in range(2048)]
    return [i.word for i in prog], image, spad


def check_bad_table(result, kind, image):
    assert result.error == ErrorStop(kind, 1, 1 if kind == "row" else 8)
    # the first run of the GATHER (page 3: rows 0..3, 8 words from 1024 + 3 * 8, which the SCATTER
    # before it wrote) arrived ...
    assert result.scratchpad[200:208] == [0x1000 + a for a in range(100, 108)]
    # ... nothing of the failing run, and the ST after it never ran
    assert result.scratchpad[208:216] == [0] * 8
    assert result.ext[:16] == image[:16]
    # the SCATTER before: page 3's rows 0..3
    assert result.ext[1048:1056] == [0x1000 + a for a in range(100, 108)]


@pytest.mark.parametrize("kind", ["page", "row"])
def test_bad_table_stops_the_reference(kind):
    program, image, spad = bad_table_program(kind)
    r = reference().run(program, image, LAT, scratchpad=spad)
    check_bad_table(r, kind, image)
    busy = [2 + isa.busy_cycles(program[0], LAT, CFG), 2 + 2 * 2 + 8 + LAT + 1]
    assert r.counters[0] == sum(busy) + 2 and r.counters[4] == 2


@pytest.mark.skipif(not HAVE_VERILATOR, reason="Verilator not available")
@pytest.mark.parametrize("kind", ["page", "row"])
def test_bad_table_stops_verilator(kind):
    program, image, spad = bad_table_program(kind)
    v = VerilatorBackend(config=CFG)
    r = v.run(program, image, LAT, scratchpad=spad)
    check_bad_table(r, kind, image)
    assert first_difference(reference().run(program, image, LAT, scratchpad=spad), r) is None


@pytest.mark.parametrize("kind", ["page"])
def test_bad_table_stops_amaranth(kind):
    from sim.backends.amaranth_backend import AmaranthBackend
    program, image, spad = bad_table_program(kind)
    r = AmaranthBackend(config=CFG).run(program, image, LAT, scratchpad=spad)
    check_bad_table(r, kind, image)
    assert first_difference(reference().run(program, image, LAT, scratchpad=spad), r) is None


@pytest.mark.skipif(not HAVE_VERILATOR, reason="Verilator not available")
def test_resident_programs_on_verilator():
    seed = int(os.environ.get("GA2_SEED", random.randrange(1 << 30)))
    print(f"resident fuzz seed {seed} (GA2_SEED={seed} repeats it)")
    bad = compare_all(VerilatorBackend(config=CFG), resident_cases(seed, CI_COUNT))
    assert not bad, f"seed {seed}: " + "; ".join(bad[:5])


def test_resident_programs_on_amaranth():
    from sim.backends.amaranth_backend import AmaranthBackend
    seed = int(os.environ.get("GA2_SEED", random.randrange(1 << 30)))
    print(f"resident fuzz seed {seed} (GA2_SEED={seed} repeats it)")
    cases = resident_cases(seed, AMARANTH_COUNT, configs=((2048, 3),))
    bad = compare_all(AmaranthBackend(config=CFG), cases)
    assert not bad, f"seed {seed}: " + "; ".join(bad[:5])


@pytest.mark.parametrize("op", [Op.GATHER, Op.SCATTER])
def test_book_chip_still_hangs_on_opcodes_9_and_10(op):
    """gather=0: the opcodes stay illegal; the sequencer waits forever (the reference says so too)."""
    from sim.backends.amaranth_backend import AmaranthBackend
    word = isa.encode(isa.Instr(op, a=0, b=50, c=1, d=0, e=0, f=0, g=1, fl=0, x=1))
    with pytest.raises(DidNotHalt):
        AmaranthBackend(config=BOOK, max_cycles=300).run([word, isa.halt().word], [0] * 2048, 8)
    with pytest.raises(DidNotHalt):
        ReferenceMachine(config=BOOK, check=False, max_cycles=300).run([word, isa.halt().word], [0] * 2048, 8)


def test_book_chip_has_no_resident_ports():
    """gather=0: neither the chip nor the harness grows a port (their Verilog stays the book's)."""
    from hdl.chip import GA2
    from hdl.harness import HARNESS_SIGNATURE, harness_signature
    from tests.simutil import built
    resident = {"error", "error_kind", "error_pc", "error_info", "spad_we", "spad_wdata"}
    assert not resident & set(built(GA2(config=BOOK)).signature.members)
    assert not resident & set(HARNESS_SIGNATURE.members)
    assert resident <= set(harness_signature(CFG).members)
    assert resident - {"spad_we", "spad_wdata"} <= set(built(GA2(config=CFG)).signature.members)


# ---- isolation as a formal property (sim.verify.formal targets gather and scatter) ----

def _unit_variant(module, old, new):
    """A unit module's source with `old` replaced by `new` (exactly once), loaded as a module of its own."""
    import importlib.util
    from pathlib import Path
    path = Path(module.__file__)
    text = path.read_text()
    assert text.count(old) == 1, old
    spec = importlib.util.spec_from_loader(f"{module.__name__}_broken", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = module.__package__
    exec(compile(text.replace(old, new), str(path), "exec"), mod.__dict__)
    return mod


def _formal(target, build=None, depth=8):
    from sim.verify import formal
    t = {x.name: x for x in formal.targets()}[target]
    return formal.prove(t, ["isolation"], depth, formal.find_tools(), build=build, mode="bmc")[0]


def test_isolation_holds_for_gather():
    assert _formal("gather") == "bounded"


def test_isolation_fails_on_gather_that_lets_the_pool_end_through():
    """entry == pool_pages taken for a page of the pool: its requests land outside the pool."""
    import hdl.units.gather as g
    mod = _unit_variant(g, "self.bad_page = entry >= opr.pool_pages", "self.bad_page = entry > opr.pool_pages")
    cfg = replace(BOOK, gather=1, lat=2)
    assert _formal("gather", build=lambda: mod.GatherUnit(config=cfg)) == "FAIL"


def test_isolation_fails_on_scatter_that_runs_past_its_page():
    """A run that does not end at the page's last row: SCATTER writes into the next page unlooked-up."""
    import hdl.units.gather as g
    mod = _unit_variant(g, "self.page_end = (self.row & page_mask) == page_mask",
                        "self.page_end = (self.row & page_mask) == page_mask + 1")
    import hdl.units.scatter as s
    cfg = replace(BOOK, gather=1, lat=2)

    class Broken(s.ScatterUnit):
        def elaborate(self, platform):
            # the scatter unit with the broken walk
            saved = s.TableWalk
            s.TableWalk = mod.TableWalk
            try:
                return super().elaborate(platform)
            finally:
                s.TableWalk = saved
    assert _formal("scatter", build=lambda: Broken(config=cfg)) == "FAIL"


def _gather_chip_target(chip_module=None):
    """sim.verify.formal's chip target (`ChipEnv`: any program, any data, the memory's timing) on a gather=1 chip,
    with the resident chip's property as well."""
    from hdl import chip as chipmod
    from sim.verify import formal
    mod = chip_module or chipmod
    cfg = replace(BOOK, gather=1, lat=formal.CHIP_LAT)
    return formal.Target("chip", lambda: formal.ChipEnv(chip=lambda: mod.GA2(config=cfg)),
                         {**chipmod.CHIP_PROPERTIES, **chipmod.RESIDENT_CHIP_PROPERTIES})


def test_halt_quiet_fails_on_a_chip_that_starts_the_unit_after_an_error_stop():
    """The formal chip target on a gather chip finds the unit left running after an error stop (11 cycles:
    a failing GATHER and the next issue fit). That the real chip holds it (and owner_writes) is checked by
    the design's Asserts in every Amaranth run above, error stops included (the backend clocks one edge
    past HALT for it), and by ``sim.verify.formal``-style bounded runs noted in docs/NOTES.md (11 cycles, ~30 s:
    too slow for every test run)."""
    import hdl.chip as chipmod
    from sim.verify import formal
    mod = _unit_variant(chipmod, "            m.d.comb += go.eq((st == SeqState.ISSUE) & ~self.error)",
                        "            m.d.comb += go.eq(st == SeqState.ISSUE)")
    got = formal.prove(_gather_chip_target(mod), ["halt_quiet"], 11, formal.find_tools(), mode="bmc")
    assert got[0] == "FAIL", got


def _run_harness(h, program, image, spad, then=None):
    """Run `program` on the ChipHarness `h` (built with backdoor=False) from `spad` and `image` until
    halted (at most 400 cycles); returns the harness's final state, then calls ``then(ctx, cd)``."""
    from amaranth.hdl import ClockDomain, Module
    from amaranth.sim import Simulator
    top = Module()
    top.domains.sync = cd = ClockDomain("sync")
    top.submodules.h = h
    sim = Simulator(top)
    sim.add_clock(1e-6)
    seen = {}

    async def bench(ctx):
        for i, w in enumerate(program):
            ctx.set(h.rom.data[i], w)
        for i, w in enumerate(image):
            ctx.set(h.ext.data[i], w)
        mem = h.chip.scratchpad.memory
        for i, w in enumerate(spad):
            if w:
                ctx.set(mem.data[i], w)
        ctx.set(cd.rst, 1)
        await ctx.tick()
        ctx.set(cd.rst, 0)
        ctx.set(h.start, 1)
        await ctx.tick()
        ctx.set(h.start, 0)
        for _ in range(400):
            if ctx.get(h.halted):
                break
            await ctx.tick()
        await ctx.tick()        # one more edge: the Asserts judge the first HALT cycle too
        seen["stopped"] = [ctx.get(s) for s in (h.halted, h.error, h.error_kind, h.error_pc, h.error_info)]
        seen["counters"] = [ctx.get(c) for c in (h.cyc_total, h.cyc_mm, h.cyc_dma, h.cyc_vec, h.n_inst)]
        seen["spad"] = [ctx.get(mem.data[i]) for i in range(mem.depth)]
        seen["ext"] = [ctx.get(h.ext.data[i]) for i in range(len(image))]
        if then is not None:
            await then(ctx, cd, seen)

    sim.add_testbench(bench)
    sim.run()
    return seen


def test_rst_clears_the_error_state():
    """After an error stop the chip sits in HALT with error set; a reset clears error (and halted), and
    the next run starts clean (hardware spec 2.2 with docs/resident.md)."""
    from hdl.harness import ChipHarness
    program, image, spad = bad_table_program("page")
    h = ChipHarness(ext_words=2048, lat=LAT, backdoor=False, config=CFG)

    async def reset(ctx, cd, seen):
        ctx.set(cd.rst, 1)
        await ctx.tick()
        ctx.set(cd.rst, 0)
        seen["reset"] = [ctx.get(s) for s in (h.halted, h.error, h.error_kind, h.error_pc, h.error_info)]

    seen = _run_harness(h, program, image, spad, reset)
    assert seen["stopped"] == [1, 1, 2, 1, 8]
    assert seen["reset"] == [0, 0, 0, 0, 0]


@pytest.mark.parametrize("chip_lat, lat", [(2, 9), (LAT, LAT)])
def test_error_stop_waits_for_a_slow_memory(chip_lat, lat):
    """A chip built for LAT 2 (config.lat times GATHER's error tail) behind a memory of LAT 9: when the
    GATHER's second run fails, the first run's last responses are still on their way; they are written
    before the chip stops (GATHER counts requests and responses as LD does), and the busy time is
    ``hdl.isa.resident_busy_cycles(..., error=True, built_lat=2)``. The same with the memory the chip
    was built for gives the reference machine's result, counters included."""
    from hdl.harness import ChipHarness
    from sim.backends import RunResult
    program, image, spad = bad_table_program("page")
    h = ChipHarness(ext_words=2048, lat=lat, backdoor=False, config=CFG, chip_lat=chip_lat)
    seen = _run_harness(h, program, image, spad)
    assert seen["stopped"] == [1, 1, 2, 1, 8]
    got = RunResult(ext=seen["ext"], counters=seen["counters"], scratchpad=seen["spad"],
                    error=ErrorStop("page", 1, 8))
    check_bad_table(got, "page", image)
    want = reference().run(program, image, lat, scratchpad=spad)
    gather = 2 + isa.resident_busy_cycles(Op.GATHER, 2, 8, lat, error=True, built_lat=chip_lat)
    scatter = 2 + isa.busy_cycles(program[0], lat, CFG)
    assert got.counters == [scatter + gather + 2, 0, scatter - 2 + gather - 2, 0, 2]
    if chip_lat == lat:
        assert first_difference(want, got) is None
    else:
        assert first_difference(want, got).startswith("counter cyc_total")
        assert first_difference(want, RunResult(ext=got.ext, counters=want.counters, scratchpad=got.scratchpad,
                                                error=got.error)) is None

