"""The fuzz mix (sim.verify.progen.fuzz_case, sim.verify.fuzz): it reaches the corners, a seed reproduces a run, and a
fresh-seed campaign on Verilator in every test run.

The corner checks read the programs back through ``hdl.isa.operands`` (the bits the hardware decodes), not
through the generator's own bookkeeping, so a generator that only claims to reach a corner fails here.
"""
import io
import os
import random
import shlex
from dataclasses import replace

import pytest

from hdl.config import BOOK
from hdl.isa import HW_OPERANDS, Op, hw_operands, legal_ops, operands, validate
from sim.backends import MAX_CYCLES
from sim.verify.progen import CI_CONFIGS, MIX_CONFIGS, Knobs, fuzz_case, ignored_bits, random_program
from sim.backends.reference import ReferenceMachine

try:
    from sim.backends.verilator_backend import VerilatorBackend, _find_tool
    _find_tool()
    HAVE_VERILATOR = True
except Exception:       # noqa: BLE001 - any reason the tool cannot run means: skip those tests
    HAVE_VERILATOR = False

CORNER_SEED = 20261130
CORNER_COUNT = 150
CI_COUNT = 80           # programs of the fresh-seed campaign on Verilator (the Amaranth simulator: none)
CI_BUDGET = 50_000      # cycles per program there: every maximum length still fits, at half the time


@pytest.fixture(scope="module")
def mix():
    return [fuzz_case(CORNER_SEED, i) for i in range(CORNER_COUNT)]


def _spans(o):
    """(what the instruction writes, the regions it reads) in the scratchpad, as (start, length)."""
    op, n = o["op"], o.get("len")
    if op in (Op.RQ, Op.SM, Op.AMAX, Op.UNPACK):
        out = {Op.AMAX: 1, Op.UNPACK: 8 * n}.get(op, n)
        return (o["dst"], out), [(o["src"], n)]
    if op == Op.VADD:
        return (o["dst"], n), [(o["src1"], n), (o["src2"], n)]
    return None, []


def _partial(w, r):
    """The write region overlaps the read region without being the same region."""
    (d, m), (s, n) = w, r
    return d < s + n and s < d + m and (d, m) != (s, n)


def test_mix_reaches_every_corner(mix):
    """Across the programs of the mix: every (EXT, LAT) pair; partial overlaps for the five vector units,
    many of them within 3 words (the read-after-write timing corner; chance alone gives fewer than 40);
    junk in every ignored bit of every opcode; every maximum length; every unit three times in a row
    (chance alone: fewer than 15); instructions reading what the one before wrote."""
    pairs = {(c.ext, c.lat) for c in mix}
    assert pairs == set(MIX_CONFIGS)
    assert {lat for _, lat in pairs} >= {1, 2, 3, 4, 8} and {ext for ext, _ in pairs} == {2048, 8192, 65536}

    near, junk, longest, thrice, chained = {}, {}, {}, {}, 0
    for c in mix:
        prev, before = None, None
        for word in c.program:
            o = operands(word)
            op = Op(o["op"])
            junk[op] = junk.get(op, 0) | (word & ignored_bits(op))
            if "len" in o:
                longest.setdefault(op, set()).add(o["len"])
            w, reads = _spans(o)
            if w and any(_partial(w, r) and abs(w[0] - r[0]) <= 3 for r in reads):
                near[op] = near.get(op, 0) + 1
            if prev is not None and before is not None and prev[0] == before[0] == op:
                thrice[op] = thrice.get(op, 0) + 1
            if prev is not None and prev[1] and any(s == prev[1][0] for s, _ in reads):
                chained += 1
            prev, before = (op, w), prev
    assert set(near) == {Op.RQ, Op.VADD, Op.SM, Op.UNPACK, Op.AMAX}
    assert min(near.values()) >= 40, near
    for op in legal_ops():       # the mix is for the book's chip (no GATHER/SCATTER, no RQC)
        assert junk.get(op, 0) == ignored_bits(op), f"{op.name}: ignored bits never set: " \
            f"{ignored_bits(op) & ~junk.get(op, 0):#034x}"
    want_max = {Op.LD: {4095}, Op.ST: {4095}, Op.RQ: {4095}, Op.SM: {4095}, Op.AMAX: {4095},
                Op.VADD: {4096}, Op.UNPACK: {511, 512}}
    for op, lengths in want_max.items():
        assert lengths <= longest[op], f"{op.name} never at length {sorted(lengths - longest[op])}"
    assert set(thrice) == set(legal_ops()) - {Op.HALT}
    assert min(thrice.values()) >= 30, thrice
    assert chained >= 100


def test_ignored_bits_are_the_complement_of_what_the_hardware_reads():
    for cfg in (BOOK, replace(BOOK, mm_rq=1)):
        for op in HW_OPERANDS:
            read = sum(((1 << (hi - lo + 1)) - 1) << lo for hi, lo in hw_operands(op, cfg).values())
            assert ignored_bits(op, cfg) + read + (0xF << 124) == (1 << 128) - 1
    # MM's rq flag (fl[1]) is read only by a chip with mm_rq=1 (docs/fused-rq.md)
    assert (ignored_bits(Op.MM) >> 19) & 1 and not (ignored_bits(Op.MM, replace(BOOK, mm_rq=1)) >> 19) & 1
    assert ignored_bits(Op.HALT) == (1 << 124) - 1
    # RQ reads every bit of d (m) and e (s) but only bit 18 of fl: 19..21 are ignored
    assert (ignored_bits(Op.RQ) >> 19) & 0b111 == 0b111 and not (ignored_bits(Op.RQ) >> 18) & 1


def test_every_program_is_legal_without_its_junk_and_within_its_budget(mix):
    ref = ReferenceMachine(check=False)
    for c in mix[:25]:
        assert 2 <= len(c.program) <= 256 and operands(c.program[-1])["op"] == Op.HALT
        for pc, word in enumerate(c.program):
            validate(word & ~ignored_bits(word >> 124), ext_words=c.ext, index=pc)
        assert ref.run(c.program, c.image, c.lat).cycles <= MAX_CYCLES
    for i in range(20):
        c = fuzz_case(7, i, budget=12_000)
        assert ref.run(c.program, c.image, c.lat).cycles <= 12_000, c.index


def test_classic_programs_pass_the_checked_reference():
    rng = random.Random(3)
    for _ in range(5):
        program, image = random_program(rng, 2048)
        for pc, word in enumerate(program):
            validate(word, ext_words=2048, index=pc)
        ReferenceMachine().run(program, image, 8)


def test_knobs_refuse_nonsense():
    with pytest.raises(ValueError, match="knob overlap needs a wide program"):
        Knobs(overlap=0.5)
    with pytest.raises(ValueError, match="knob junk = 1.5 is not a probability"):
        Knobs(wide=True, junk=1.5)
    with pytest.raises(ValueError, match="budget"):
        Knobs(wide=True, budget=MAX_CYCLES + 1)


# ---- reproducing a run ------------------------------------------------------------------------------

class _MiscountsVadd:
    """The unchecked reference with a planted bug: any program with a VADD of more than 10 elements
    reports one vector cycle too many."""
    name = "planted"

    def __init__(self):
        self.inner = ReferenceMachine(check=False)

    def run(self, program, image, lat=8):
        r = self.inner.run(program, image, lat)
        if any(operands(w)["op"] == Op.VADD and operands(w)["len"] > 10 for w in program):
            r.counters[3] += 1
        return r


def test_same_seed_same_programs_and_index_alone_is_the_same_program():
    a = [fuzz_case(99, i) for i in range(12)]
    b = [fuzz_case(99, i) for i in range(12)]
    assert a == b
    assert [c.program for c in a] != [fuzz_case(100, i).program for i in range(12)]
    # program i pinned to the pair it drew is the same program, whatever list it was drawn from
    for c in a:
        assert fuzz_case(99, c.index, [(c.ext, c.lat)]) == c


def test_failure_line_names_seed_index_and_a_command_that_reproduces_it(monkeypatch, capsys):
    import sim.verify.fuzz as fz
    out = io.StringIO()
    s = fz.fuzz(_MiscountsVadd(), ReferenceMachine(check=False), count=8, seed=5, out=out, budget=10_000)
    lines = out.getvalue().splitlines()
    assert s["failures"] == len(lines) == len(s["failed"]) > 0
    monkeypatch.setattr(fz, "get_backend", lambda name, **kw: (
        ReferenceMachine(**kw) if name == "reference" else _MiscountsVadd()))
    import sim.backends
    monkeypatch.setitem(sim.backends.BACKENDS, "planted", "tests.test_fuzz:_MiscountsVadd")   # --sim's choices
    for i, line in list(zip(s["failed"], lines))[:2]:
        c = fuzz_case(5, i, budget=10_000)
        assert line.startswith(f"FAIL program {i} (seed 5, EXT {c.ext}, LAT {c.lat}): first differing instruction pc ")
        head, cmd = line.split("; reproduce: ")
        assert "counter cyc_vec: expected" in head
        assert cmd == f"python -m sim.fuzz --sim planted --seed 5 --first {i} --count 1 --ext {c.ext} --lat {c.lat} --budget 10000"
        argv = shlex.split(cmd)[3:]
        assert fz.main(argv) == 1
        printed = capsys.readouterr().out.splitlines()
        assert printed[0] == line                       # the same program, the same difference
        assert printed[1].startswith(f"FAIL: 0/1 programs identical on planted and reference (seed 5, programs {i}..{i}")


def test_fuzz_command_refuses_bad_input(capsys):
    from sim.verify.fuzz import main
    for argv, msg in ((["--budget", "5"], "--budget must be within 10000..100000"),
                      (["--first", "-1"], "--first must be at least 0"),
                      (["--lat", "0"], "--lat must be within 1..1024")):
        with pytest.raises(SystemExit) as e:
            from sim.cli import guarded
            raise SystemExit(guarded(main, argv))
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and msg in err and err.count("\n") == 1


# ---- the campaign of every test run -----------------------------------------------------------------

@pytest.mark.skipif(not HAVE_VERILATOR, reason="Verilator is not installed")
def test_fresh_seed_campaign_on_verilator():
    """A new seed every run (GA2_SEED=S repeats one): CI_COUNT programs of the mix on CI_CONFIGS."""
    from sim.verify.fuzz import fuzz
    env = os.environ.get("GA2_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(4), "little")
    print(f"fuzz seed: {seed} (rerun with GA2_SEED={seed})")
    out = io.StringIO()
    s = fuzz(VerilatorBackend(), ReferenceMachine(check=False), CI_COUNT, seed, configs=CI_CONFIGS, out=out,
             budget=CI_BUDGET)
    assert s["traces"]                  # every instruction's cycles compared, not only the counters
    assert s["failures"] == 0, (f"seed {seed} (GA2_SEED={seed} repeats this run): {s['failures']} of "
                                f"{CI_COUNT} programs differ:\n{out.getvalue()}")
    assert set(s["configs"]) == set(CI_CONFIGS)


class _LateIssue:
    """A stand-in for Verilator (fuzz compares traces there) with a trace-only bug: in a program of three
    instructions or more, the second one's issue is one cycle late and its fetch one early, so every word
    and counter still agrees."""
    name = "verilator"
    trace = False

    def run_many(self, jobs, lat=8, return_errors=False):
        from sim.backends import TraceEntry
        ref = ReferenceMachine(check=False, trace=self.trace)
        out = []
        for program, image, job_lat, spad in jobs:
            r = ref.run(program, image, job_lat, spad)
            if r.trace is not None and len(r.trace) >= 3:
                e = r.trace[1]
                r.trace[1] = TraceEntry(e.pc, e.fetch - 1, e.issue + 1, e.done, e.seq)
            out.append(r)
        return out


def test_fuzz_on_verilator_compares_every_instructions_cycles():
    from sim.verify.fuzz import fuzz
    out = io.StringIO()
    s = fuzz(_LateIssue(), ReferenceMachine(check=False), count=4, seed=11, ext=2048, lat=8, out=out)
    assert s["traces"] is True and s["failures"] == 4, out.getvalue()
    line = out.getvalue().splitlines()[0]
    assert "first differing instruction pc 1 " in line and "trace entry 1: expected TraceEntry(pc=1, " in line
