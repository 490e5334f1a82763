"""prefetch (docs/prefetch.md): the sequencer reads the next word ahead and issues it in the done cycle.

The contract: on a chip with ``prefetch = 1`` every instruction after the first of a run costs its busy
cycles B only (``hdl.isa.seq_cycles`` 0), the first and an error stop's HALT 2 more; the words, the error
state and the counters mm, dma, vec and n_inst are the book sequencer's. The configuration, the cycle
model, the reference machine, the compiler's prediction, the timeline, and the chip on Amaranth's
simulator (the cycle each unit starts in, R1 and random programs, an error stop) are checked here.
"""
import random
from dataclasses import replace

import pytest
from amaranth.sim import Simulator

from hdl import isa
from hdl.chip import SeqState
from hdl.config import BOOK, PRESETS, ChipConfig, ChipSpecError, parse_chip
from hdl.harness import ChipHarness
from sim.backends import first_difference
from sim.backends.amaranth_backend import AmaranthBackend
from sim.backends.reference import ReferenceMachine
from sim.verify import programs
from sim.verify.progen import Knobs, fuzz_case, random_program

PREFETCH = replace(BOOK, prefetch=1)
FAST_PF = replace(PRESETS["fast"], prefetch=1)
FAST_NO = replace(PRESETS["fast"], prefetch=0)


# ---- configuration and cycle model -----------------------------------------------------------------

@pytest.mark.parametrize("value", [2, -1])
def test_bad_prefetch_names_the_value(value):
    with pytest.raises(ValueError) as e:
        ChipConfig(prefetch=value)
    assert str(e.value) == f"ChipConfig prefetch must be 0 or 1, not {value}"
    with pytest.raises(ChipSpecError, match=f"prefetch must be 0 or 1, not {value}"):
        parse_chip(f"book,prefetch={value}")


def test_the_parameter_in_specs():
    assert BOOK.prefetch == 0
    assert PREFETCH.spec() == "prefetch=1" and parse_chip("prefetch=1") == PREFETCH


def test_seq_cycles_table():
    for i in range(5):
        assert isa.seq_cycles(i) == 2 and isa.seq_cycles(i, BOOK, after_error=True) == 2
        assert isa.seq_cycles(i, PREFETCH) == (2 if i == 0 else 0)
        assert isa.seq_cycles(i, PREFETCH, after_error=True) == 2


# ---- the reference machine -------------------------------------------------------------------------

def test_r1_on_a_prefetch_chip():
    """The book's R1 ([85, 28, 30, 13, 6] and the trace of spec 7): the same words and unit cycles, each
    instruction after the first issued in the done cycle of the one before (worked out by hand)."""
    d = programs.r1()
    book = ReferenceMachine(trace=True).run(d.words, d.image)
    got = ReferenceMachine(trace=True, config=PREFETCH).run(d.words, d.image)
    assert book.counters == [85, 28, 30, 13, 6]
    assert got.counters == [73, 28, 30, 13, 6]          # 85 - 2 per non-HALT instruction - the HALT's 2
    assert got.ext == book.ext and got.scratchpad == book.scratchpad
    rows = [(e.pc, e.fetch, e.issue, e.done, e.seq) for e in got.trace]
    assert rows == [(0, 0, 1, 22, 2), (1, 1, 22, 50, 0), (2, 22, 50, 56, 0), (3, 50, 56, 63, 0),
                    (4, 56, 63, 69, 0), (5, 63, 69, 72, 0), (6, 69, 72, 72, 0)]


@pytest.mark.parametrize("seed", range(6))
def test_reference_same_words_and_two_cycles_fewer_per_instruction(seed):
    """Book-sequencer chip against the same chip with prefetch: identical memories, scratchpad, error and
    mm/dma/vec/n_inst; cyc_total 2 lower per instruction issued after the first (HALT included, an
    error stop's HALT excluded)."""
    for index in range(8):
        case = fuzz_case(seed, index, config=FAST_PF)
        kw = {} if case.scratchpad is None else {"scratchpad": case.scratchpad}
        a = ReferenceMachine(check=False, config=FAST_NO, trace=True).run(
            case.program, list(case.image), case.lat, **({"scratchpad": list(case.scratchpad)} if kw else {}))
        b = ReferenceMachine(check=False, config=FAST_PF, trace=True).run(case.program, list(case.image),
                                                                          case.lat, **kw)
        assert a.ext == b.ext and a.scratchpad == b.scratchpad and a.error == b.error
        assert a.counters[1:] == b.counters[1:]
        issued = len(a.trace) - 1           # after the first
        # a GATHER/SCATTER that failed (the error's pc is not the last entry's, the HALT issued after it)
        # has its HALT fetched and issued the book's way (hdl.isa.seq_cycles(after_error=True))
        failed = a.error is not None and a.error.pc != a.trace[-1].pc
        saved = 2 * issued - (2 if failed else 0)
        assert a.counters[0] - b.counters[0] == saved, (seed, index)
        assert [e.busy for e in a.trace] == [e.busy for e in b.trace]
        for prev, e in zip(b.trace, b.trace[1:]):
            if e.seq == 0:
                assert (e.fetch, e.issue) == (prev.issue, prev.done)
            else:                       # an error stop's HALT
                assert failed and e is b.trace[-1] and e.fetch == prev.done + 1


def test_compiler_prediction_is_exact_on_a_prefetch_chip():
    """compiler.emit.Program.counters (tests/test_random_graphs.py's graphs) equals the machine's on a
    prefetch chip, and each graph costs 2 cycles less per instruction after the first than without."""
    from compiler import compile_graph, ext_image
    from test_random_graphs import random_graph
    for seed in range(12):
        g, sample = random_graph(seed)
        P = compile_graph(g, [sample], config=PREFETCH)
        r = ReferenceMachine(config=PREFETCH).run(P.code, ext_image(P, sample, P.ext_size), 8)
        assert list(r.counters) == P.counters(8), seed
        book = compile_graph(g, [sample])
        assert book.code == P.code and book.counters(8)[0] - P.counters(8)[0] == 2 * (len(P.code) - 1)


def test_resident_batch_on_a_prefetch_chip_is_exact():
    """A resident batch (host.batch_resident) on fast with and without prefetch: the same results, the
    counters the compiler predicts (the load program's too: compiler.resident), 2 cycles fewer per
    instruction after the first."""
    from compiler.resident import compile_load
    from host import tiny_lm as T
    from host.batch_resident import ResidentBatchRunner
    M = T.make_model("structured", 1)
    rows = [(1, [0, 1], [(0, 5)], 5), (2, [2, 3], [(0, 6)], 6), (3, [4], None, 2)]
    out = {}
    for cfg in (FAST_NO, FAST_PF):
        r = ResidentBatchRunner(M, ReferenceMachine(config=cfg), 8, cfg, 4, 16, 3)
        res, counters, P = r.run(rows)
        assert counters == P.counters(8)
        load = compile_load(r.layout, r._compile((1,), [(0, 1, [], 0)]))
        assert r.load_counters == load.counters(8, cfg)
        out[cfg.prefetch] = (res, counters, len(P.code), r.load_counters, len(load.code))
    (res0, c0, n, l0, nl), (res1, c1, _, l1, _) = out[0], out[1]
    assert res0 == res1 and c0[1:] == c1[1:] and l0[1:] == l1[1:]
    assert c0[0] - c1[0] == 2 * (n - 1) and l0[0] - l1[0] == 2 * (nl - 1)


# ---- the timeline ------------------------------------------------------------------------------------

def test_the_timeline_of_a_prefetch_run_adds_up():
    """sim.timeline on a prefetch chip: fetch and issue slices for the first instruction only (and for an
    error stop's HALT), the tracks still add up to the counters; a slice too many fails the check."""
    from sim.timeline import TimelineMismatch, build_events, check_against_counters
    runs = []
    for index in range(6):
        case = fuzz_case(4, index, config=FAST_PF)
        kw = {} if case.scratchpad is None else {"scratchpad": case.scratchpad}
        t = ReferenceMachine(check=False, config=FAST_PF, trace=True).run(case.program, case.image, case.lat, **kw)
        runs.append((case.program, t.trace, t.counters))
    ev = build_events(FAST_PF, runs)
    check_against_counters(ev, [c for _, _, c in runs])
    for i, (_, trace, _) in enumerate(runs):
        seq = [e for e in ev if e.get("cat") in ("fetch", "issue") and e["args"]["run"] == i]
        assert len(seq) == 2 * sum(1 for e in trace if e.seq)
        assert 2 <= len(seq) <= 4
    extra = dict(next(e for e in ev if e.get("cat") == "fetch"))
    with pytest.raises(TimelineMismatch):
        check_against_counters(ev + [extra], [c for _, _, c in runs])


# ---- the chip ----------------------------------------------------------------------------------------

def _sequencer(cfg, program, image, lat=8, cycles=600):
    """Run `program` on the chip `cfg` in Amaranth's simulator, one cycle at a time; returns (counters,
    {pc: [issue, done]} as the RTL shows them: the issue cycle is the one before the first WAIT cycle of
    that pc, the done cycle its last WAIT cycle; cycles are cyc_total values, as in TraceEntry), and the
    (state, pc, imem_addr) of every cycle."""
    h = ChipHarness(ext_words=len(image), lat=lat, config=cfg)
    seen = {"rows": {}, "addr": []}

    async def bench(ctx):
        for i, w in enumerate(program):
            ctx.set(h.rom.data[i], w)
        for i, w in enumerate(image):
            if w:
                ctx.set(h.ext.data[i], w)
        ctx.set(h.start, 1)
        await ctx.tick()
        ctx.set(h.start, 0)
        chip, rows = h.chip, seen["rows"]
        for _ in range(cycles):
            state, pc, cyc = ctx.get(chip.state), ctx.get(chip.pc), ctx.get(h.cyc_total)
            seen["addr"].append((state, pc, ctx.get(chip.imem_addr)))
            if state == SeqState.HALT:
                break
            if state == SeqState.WAIT:
                if pc not in rows:
                    rows[pc] = [cyc - 1, cyc]
                rows[pc][1] = cyc
            await ctx.tick()
        seen["counters"] = [ctx.get(c) for c in (h.cyc_total, h.cyc_mm, h.cyc_dma, h.cyc_vec, h.n_inst)]

    sim = Simulator(h)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return seen


def _back_to_back():
    """Every unit after itself and after the others, short jobs, an RQC (B = 1) before an MM and before
    the HALT, and an ST after the HALT that must not run: on the fast chip's units."""
    from hdl.isa import amax, halt, ld, mm, rq, rqc, sm, st, unpack, vadd
    body = [ld(0, 0, 16), ld(16, 16, 16), rqc(1 << 23, 8), mm(64, 0, 16, M=2, K=4, N=4, rq=1),
            mm(96, 0, 16, M=2, K=4, N=4), rq(128, 96, 3, 1 << 23, 4), rq(131, 96, 2, 1 << 22, 2, relu=1),
            vadd(140, 0, 16, 1), vadd(141, 140, 0, 2), amax(150, 0, 5), amax(151, 140, 2), sm(160, 0, 3),
            unpack(200, 1, 1), unpack(210, 2, 1), st(64, 300, 8), st(128, 308, 3), rqc(3, 1), ld(400, 300, 11),
            st(400, 320, 11), rqc(5, 2)]
    return [w.word for w in body + [halt(), st(0, 500, 1)]], [((i * 37) % 251) - 120 & 0xFFFFFFFF
                                                             for i in range(512)]


@pytest.mark.timeout(300)
def test_the_rtl_issues_in_the_done_cycle():
    """The chip (fast's units, prefetch on): each instruction's issue and done cycles as the reference's
    trace has them (the first one's issue at 1, every other's in the done cycle of the one before), the
    counters and every word equal to the reference's, imem_addr = pc, pc + 1, pc + 2 in FETCH, ISSUE, WAIT,
    and nothing after the HALT run (its ST would write ext[500])."""
    program, image = _back_to_back()
    want = ReferenceMachine(config=FAST_PF, trace=True).run(program, image, 3)
    seen = _sequencer(FAST_PF, program, image, lat=3)
    assert seen["counters"] == want.counters
    assert {e.pc: [e.issue, e.done] for e in want.trace if e is not want.trace[-1]} == seen["rows"]
    assert want.trace[-1].issue == want.trace[-2].done          # the HALT, read ahead
    offsets = {SeqState.FETCH: 0, SeqState.ISSUE: 1, SeqState.WAIT: 2}
    for state, pc, addr in seen["addr"]:
        if state in offsets:
            assert addr == (pc + offsets[state]) & 0xFFFF, (state, pc, addr)
    got = AmaranthBackend(config=FAST_PF).run(program, image, 3)
    assert first_difference(want, got) is None
    assert got.ext[500] == image[500] == want.ext[500]
    book = ReferenceMachine(config=FAST_NO).run(program, image, 3)
    assert book.ext == got.ext and book.counters[0] - got.counters[0] == 2 * (len(want.trace) - 1)


@pytest.mark.timeout(300)
def test_r1_and_random_programs_on_the_chip():
    backend = AmaranthBackend(config=PREFETCH)
    d = programs.r1()
    got = backend.run(d.words, d.image)
    assert got.counters == [73, 28, 30, 13, 6] and got.ext[24:29] == [4, 5, 10, 11, 3]
    rng = random.Random(17)
    for k in range(3):
        program, image = random_program(rng, 2048, Knobs(wide=True, repeat=0.7, chain=0.7, budget=12000), 2,
                                        PREFETCH)
        want = ReferenceMachine(check=False, config=PREFETCH).run(program, image, 2)
        diff = first_difference(want, backend.run(program, image, 2))
        assert diff is None, f"program {k}: {diff}"


@pytest.mark.timeout(300)
def test_an_error_stop_on_a_prefetch_chip():
    """A resident program whose GATHER finds a bad table: the error state and the counters of the reference
    (the HALT through FETCH and ISSUE, the words after the failing instruction read ahead but not run)."""
    backend = AmaranthBackend(config=FAST_PF)
    stops = 0
    for index in range(40):
        case = fuzz_case(9, index, configs=((2048, 3),), budget=10000, config=FAST_PF)
        if case.scratchpad is None:
            continue
        want = ReferenceMachine(check=False, config=FAST_PF).run(case.program, case.image, case.lat,
                                                                 scratchpad=case.scratchpad)
        if want.error is None:
            continue
        got = backend.run(case.program, case.image, case.lat, scratchpad=case.scratchpad)
        assert first_difference(want, got) is None and got.error == want.error, index
        stops += 1
        if stops == 2:
            break
    assert stops == 2
