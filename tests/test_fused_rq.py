"""Fused requantization (docs/fused-rq.md): RQC and MM's rq flag on a chip with mm_rq=1.

The reference machine first (the contract: an MM with rq=1 after an RQC leaves exactly what the MM followed
by an RQ with the same (m, s, relu) leaves, and costs the MM's cycles), then the ISA's refusals on chips
without mm_rq.
"""
import random
from dataclasses import replace

import pytest

from hdl import isa
from hdl.arith import requant, s8
from hdl.config import BOOK, ChipConfig, parse_chip
from hdl.isa import IsaError, Op, halt, ld, mm, operands, rq, rqc, st, validate
from sim.backends import DidNotHalt, ErrorStop, first_difference
from sim.backends.reference import IllegalInstruction, ReferenceMachine

FAST_RQ = parse_chip("array=8,mm_load=4,gather=1,ext_words=16384,mm_rq=1")
BOOK_RQ = replace(BOOK, mm_rq=1)
EXT = 2048
A_BASE, B_BASE, C_BASE = 0, 1024, 3000       # scratchpad: A from ext[0..], B from ext[1024..]


def _image(rng, big):
    """ext[0..2047]: int8 operands with junk above bit 7 (the MM reads the low byte); `big` pushes them to
    the ends of the range so that the accumulators reach 2^20 in magnitude, both signs."""
    def elem():
        v = rng.choice((-128, 127, -127)) if big and rng.random() < 0.7 else rng.randint(-128, 127)
        return (v & 0xFF) | (rng.getrandbits(24) << 8)
    return [elem() for _ in range(EXT)]


def _programs(M, K, N, tb, m, s, relu, ldc):
    """(fused, unfused): load A and B, then RQC + MM rq=1, or MM then one RQ per row of C; store C."""
    load = [ld(A_BASE, 0, 1024), ld(B_BASE, 1024, 1024)]
    lda, ldb = K, (K if tb else N)
    fused = load + [rqc(m, s, relu), mm(C_BASE, A_BASE, B_BASE, M, K, N, lda=lda, ldb=ldb, ldc=ldc, tb=tb, rq=1)]
    plain = load + [mm(C_BASE, A_BASE, B_BASE, M, K, N, lda=lda, ldb=ldb, ldc=ldc, tb=tb)]
    plain += [rq(C_BASE + i * ldc, C_BASE + i * ldc, N, m, s, relu) for i in range(M)]
    tail = [st(C_BASE, 1500, 500), halt()]
    return fused + tail, plain + tail


# (M, K, N, tb, m, s, relu, big operands, ldc or None for N)
CASES = [
    (1, 1, 1, 0, 1 << 23, 24, 0, False, None),
    (4, 64, 4, 0, 11_534_336, 33, 0, True, None),          # |C| up to 2^20, both signs
    (4, 64, 4, 1, 11_534_336, 33, 1, True, None),          # relu: the negatives become 0
    (8, 5, 8, 0, (1 << 24) - 1, 0, 0, False, None),         # s = 0: everything saturates at +-127
    (8, 64, 8, 1, (1 << 24) - 1, 63, 0, True, None),        # s = 63: everything rounds to 0
    (8, 37, 3, 0, 9_000_001, 57, 1, True, 11),              # s past the product's width; strided C
    (3, 17, 8, 1, 15_000_000, 30, 0, True, 9),
    (8, 64, 8, 0, 0, 20, 0, True, None),                    # m = 0
    (5, 2, 7, 0, 1, 1, 0, False, None),                     # halves: round half away from zero
    (2, 127, 2, 0, 12_345_678, 38, 0, True, None),          # K = 127 (a row_depth 128 chip below)
]


@pytest.mark.parametrize("case", CASES, ids=[f"M{c[0]}K{c[1]}N{c[2]}tb{c[3]}s{c[5]}r{c[6]}" for c in CASES])
def test_fused_mm_equals_mm_then_rq_on_the_reference(case):
    M, K, N, tb, m, s, relu, big, ldc = case
    ldc = N if ldc is None else ldc
    cfg = replace(FAST_RQ, row_depth=128) if K > 64 else FAST_RQ
    rng = random.Random(repr(case))
    image = _image(rng, big)
    fused, plain = _programs(M, K, N, tb, m, s, relu, ldc)
    ref = ReferenceMachine(config=cfg, trace=True)
    got, want = ref.run(fused, image, 8), ref.run(plain, image, 8)
    assert got.scratchpad == want.scratchpad and got.ext == want.ext, first_difference(got, want)
    # the MM's accumulators really reach the sign and size the case is about
    accs = [sum(s8(image[A_BASE + i * K + k]) * s8(image[1024 + (j * K + k if tb else k * N + j)])
                for k in range(K)) for i in range(M) for j in range(N)]
    if big:
        assert min(accs) < 0 < max(accs) and max(map(abs, accs)) > K << 10
    for i in range(M):
        for j in range(N):
            assert got.scratchpad[C_BASE + i * ldc + j] == requant(accs[i * N + j], m, s, relu) & 0xFFFFFFFF
    # cycles: the RQC costs 2 + RQC_BUSY = 3, counted as mm; the fused MM exactly the MM's formula
    rqc_entry, mm_entry = got.trace[2], got.trace[3]
    assert rqc_entry.done - rqc_entry.issue == isa.RQC_BUSY == 1
    assert mm_entry.done - mm_entry.issue == isa.mm_busy_cycles(M, K, N, cfg)
    assert got.counters[1] == isa.mm_busy_cycles(M, K, N, cfg) + isa.RQC_BUSY
    assert got.counters[0] == sum(2 + isa.busy_cycles(w, 8, cfg) for w in fused[:-1]) + 2


def test_worked_by_hand():
    """-3 * 5 = -15; m = 2^23, s = 24: -15/2 = -7.5 rounds away from zero to -8; 7 * 5 = 35 -> 17.5 -> 18;
    with relu -8 becomes 0."""
    image = [0] * EXT
    image[0], image[1], image[1024] = (-3) & 0xFFFFFFFF, 7, 5
    for relu, want in ((0, [-8, 18]), (1, [0, 18])):
        prog = [ld(0, 0, 2), ld(100, 1024, 1), rqc(1 << 23, 24, relu), mm(200, 0, 100, 2, 1, 1, rq=1), halt()]
        r = ReferenceMachine(config=BOOK_RQ).run(prog, image, 8)
        assert r.scratchpad[200:202] == [w & 0xFFFFFFFF for w in want]


def test_registers_hold_until_the_next_rqc_and_reset_at_every_run():
    image = [0] * EXT
    image[0], image[1024] = 100, 100                                    # C = 10,000
    ref = ReferenceMachine(config=BOOK_RQ)
    prog = [ld(0, 0, 1), ld(100, 1024, 1), rqc(1 << 23, 30, 0), mm(200, 0, 100, 1, 1, 1, rq=1),
            mm(201, 0, 100, 1, 1, 1), mm(202, 0, 100, 1, 1, 1, rq=1), rqc(1 << 23, 24, 0),
            mm(203, 0, 100, 1, 1, 1, rq=1), halt()]
    r = ref.run(prog, image, 8)
    assert r.scratchpad[200:204] == [requant(10_000, 1 << 23, 30), 10_000, requant(10_000, 1 << 23, 30), 127]
    assert requant(10_000, 1 << 23, 30) == 78                         # 10,000 / 128 = 78.1
    # a new run starts from reset: m = s = relu = 0, so a fused MM without an RQC writes zeros
    r2 = ref.run([ld(0, 0, 1), ld(100, 1024, 1), mm(200, 0, 100, 1, 1, 1, rq=1), halt()], image, 8,
                 scratchpad=r.scratchpad)
    assert r2.scratchpad[200] == 0


# ---- the ISA ----------------------------------------------------------------------------------------

def test_fields_constructors_and_describe():
    w = rqc((1 << 24) - 1, 63, 1).word
    assert w >> 124 == 11 == Op.RQC
    assert ((w >> 52) & 0xFFFFFF, (w >> 46) & 63, (w >> 18) & 1) == ((1 << 24) - 1, 63, 1)   # RQ's bits
    assert w & ~((0xF << 124) | (0xFFFFFF << 52) | (63 << 46) | (1 << 18)) == 0
    assert operands(w) == {"op": 11, "m": (1 << 24) - 1, "s": 63, "relu": 1}
    assert isa.HW_OPERANDS[Op.RQC] == {k: isa.HW_OPERANDS[Op.RQ][k] for k in ("m", "s", "relu")}
    assert isa.describe(w) == f"rqc m={(1 << 24) - 1} s=63 relu=1"
    fused = mm(1, 2, 3, 2, 5, 3, tb=1, rq=1)
    assert (fused.word >> 18) & 0xF == 0b11 and operands(fused)["rq"] == 1 and operands(fused)["tb"] == 1
    assert isa.describe(fused).endswith(" tb=1 ldc=3 rq=1")
    assert "rq" not in isa.describe(mm(1, 2, 3, 2, 5, 3))          # a plain MM reads as on the book's chip
    assert isa.COUNTER_OF[Op.RQC] == "mm"
    assert isa.busy_cycles(rqc(5, 6), 8, FAST_RQ) == isa.RQC_BUSY == 1
    assert isa.busy_cycles(fused, 8, BOOK_RQ) == isa.busy_cycles(mm(1, 2, 3, 2, 5, 3, tb=1), 8, BOOK_RQ)
    for bad in (dict(m=1 << 24, s=0), dict(m=0, s=64), dict(m=-1, s=0)):
        with pytest.raises(IsaError, match="does not fit"):
            rqc(**bad)
    with pytest.raises(IsaError, match="must each be 0 or 1"):
        mm(1, 2, 3, 2, 5, 3, rq=2)


def test_config_parameter():
    assert BOOK.mm_rq == 0 and FAST_RQ.mm_rq == 1 and FAST_RQ.gather == 1
    assert parse_chip(FAST_RQ.spec()) == FAST_RQ and "mm_rq=1" in FAST_RQ.spec()
    assert "mm_rq=0" in BOOK.key()
    with pytest.raises(ValueError, match="ChipConfig mm_rq must be 0 or 1, not 2"):
        ChipConfig(mm_rq=2)
    assert Op.RQC in isa.legal_ops(BOOK_RQ) and Op.RQC not in isa.legal_ops(BOOK)
    assert Op.RQC not in isa.legal_ops(parse_chip("array=8,mm_load=4,gather=1,ext_words=16384"))


@pytest.mark.parametrize("cfg", [BOOK, parse_chip("array=8,mm_load=4,gather=1,ext_words=16384")], ids=["book", "fast"])
def test_a_chip_without_mm_rq_refuses_opcode_11_and_the_rq_flag(cfg):
    with pytest.raises(IsaError, match=r"^instruction 4 \(RQC\): opcode 11 exists only on a chip with mm_rq=1"):
        validate(rqc(1 << 23, 20), index=4, cfg=cfg)
    with pytest.raises(IsaError, match=r"^instruction 2 \(MM\): rq = 1 \(fl bit 1\) needs a chip with mm_rq=1"):
        validate(mm(0, 100, 200, 2, 3, 2, rq=1), index=2, cfg=cfg)
    validate(mm(0, 100, 200, 2, 3, 2), index=2, cfg=cfg)
    # the reference refuses them when checking, and otherwise does what that chip does: on the book's no unit
    # answers opcode 11 (the sequencer waits forever), any other chip stops on it (hdl.isa.issue_stop); the
    # MM unit does not read fl[1]
    image = [0] * EXT
    for check in (True, False):
        machine = ReferenceMachine(config=cfg, check=check, max_cycles=5000)
        if cfg.generated:
            r = machine.run([ld(0, 0, 2), rqc(1, 1), halt()], image, 8)
            assert r.error == ErrorStop("opcode", 1, 11) and r.counters[4] == 1
        else:
            with pytest.raises(DidNotHalt, match="illegal opcode 11"):
                machine.run([rqc(1, 1), halt()], image, 8)
    with pytest.raises(IllegalInstruction, match=r"instruction 1 \(MM\): rq = 1"):
        ReferenceMachine(config=cfg).run([ld(0, 0, 2), mm(10, 0, 1, 1, 1, 1, rq=1), halt()], image, 8)
    image[0], image[1] = 3, 4
    prog = [ld(0, 0, 2), mm(10, 0, 1, 1, 1, 1, rq=1), halt()]
    r = ReferenceMachine(config=cfg, check=False).run(prog, image, 8)
    assert r.scratchpad[10] == 12


def test_a_chip_with_mm_rq_validates_both_and_its_programs():
    for cfg in (BOOK_RQ, FAST_RQ):
        assert validate(rqc(1 << 23, 20, 1), cfg=cfg) == {"op": 11, "m": 1 << 23, "s": 20, "relu": 1}
        assert validate(mm(0, 100, 200, 2, 3, 2, rq=1), cfg=cfg)["rq"] == 1
        isa.validate_program([rqc(5, 5), mm(0, 100, 200, 2, 3, 2, rq=1), halt()], cfg=cfg)


# ---- the MM unit alone (Amaranth's simulator) ------------------------------------------------------

# (chip, [(M, K, N, tb, m, s, relu, rq)]): an RQC before each MM with rq = 1 (m None: no new RQC, the
# registers hold); the MMs with rq = 0 must write the raw int32 whatever the registers hold.
UNIT_CASES = [
    (BOOK_RQ, [(4, 64, 4, 0, 11_534_336, 33, 0, 1), (4, 64, 4, 1, 11_534_336, 33, 1, 1),
               (3, 5, 2, 0, None, None, None, 1), (2, 9, 3, 1, None, None, None, 0),
               (1, 1, 1, 0, (1 << 24) - 1, 0, 0, 1), (4, 17, 4, 0, 1 << 23, 63, 1, 1),
               (4, 30, 3, 1, 9_000_001, 57, 0, 1), (2, 2, 2, 0, 1, 1, 0, 1)]),
    (replace(BOOK, array=8, mm_load=4, mm_rq=1),
     [(8, 64, 8, 0, 15_000_000, 31, 0, 1), (8, 13, 7, 1, 12_000_000, 26, 1, 1), (5, 3, 8, 0, None, None, None, 0),
      (7, 64, 8, 1, 0, 20, 0, 1), (8, 6, 8, 0, 10_000_000, 14, 0, 1)]),
]
# The piped requantizer (docs/rq-pipe.md): the serial unit (the write in FIN, no cycle more) and the
# overlapped one (a fused MM one cycle more), with plain MMs between fused ones.
UNIT_CASES += [(replace(UNIT_CASES[0][0], rq_pipe=1), UNIT_CASES[0][1]),
               (replace(UNIT_CASES[1][0], rq_pipe=1, mm_overlap=1), UNIT_CASES[1][1]),
               (replace(UNIT_CASES[1][0], rq_pipe=1, mm_overlap=1, mm_load=1, array=4),
                [(4, 3, 4, 0, 11_534_336, 20, 0, 1), (1, 1, 1, 0, None, None, None, 1), (2, 2, 3, 1, None, None, None, 0),
                 (1, 1, 1, 0, None, None, None, 1), (4, 64, 4, 0, 1 << 23, 40, 1, 1)])]


@pytest.mark.parametrize("cfg, cases", UNIT_CASES, ids=["book-mm_rq", "array8-load4-mm_rq", "book-mm_rq-rq_pipe",
                                                         "array8-load4-overlap-rq_pipe", "book-overlap-rq_pipe"])
def test_mm_unit_requantizes_its_output(cfg, cases):
    """RQC pulses (with junk in RQC's ignored bits) and MMs with random bases, strides and overlaps on a
    scratchpad of random words: after each MM the whole scratchpad is the golden one (`mm_model`, through
    hdl.arith.requant when rq = 1), B is hdl.isa.mm_busy_cycles (one cycle more for a fused MM of an
    overlapped unit with rq_pipe), and the registers hold what the last RQC loaded."""
    from hdl.units.mm import MatrixUnit
    from sim.verify.progen import ignored_bits
    from tests.test_unit_mm import mm_model, random_mm
    from tests.unitbench import SPAD_DEPTH, simulate
    rng = random.Random(cfg.key())
    steps = []
    for M, K, N, tb, m, s, relu, fused in cases:
        load = None if m is None else rqc(m, s, relu).word | (rng.getrandbits(128) & ignored_bits(Op.RQC, cfg))
        word = random_mm(rng, M, K, N, tb) | (fused << 19)
        steps.append((load, word))
    background = [rng.getrandbits(32) for _ in range(SPAD_DEPTH)]

    async def bench_fn(ctx, bench):
        unit = bench.unit
        bench.fill(ctx, background)
        mirror = list(background)
        regs = (0, 0, 0)
        assert (ctx.get(unit.rq_regs.m), ctx.get(unit.rq_regs.s), ctx.get(unit.rq_regs.relu)) == regs   # reset
        out = []
        for load, word in steps:
            if load is not None:
                ctx.set(unit.ins, load)
                ctx.set(unit.rqc, 1)
                await ctx.tick()
                ctx.set(unit.rqc, 0)
                o = operands(load)
                regs = (o["m"], o["s"], o["relu"])
            assert (ctx.get(unit.rq_regs.m), ctx.get(unit.rq_regs.s), ctx.get(unit.rq_regs.relu)) == regs
            writes = mm_model(mirror, word)
            b, _ = await bench.issue(ctx, word)
            for addr, value in writes:
                mirror[addr] = requant(value, *regs) & 0xFFFFFFFF if operands(word)["rq"] else value
            bench.check_against(ctx, mirror, word)
            await bench.idle(ctx, 1)
            out.append(b)
        return out

    got = simulate(MatrixUnit(config=cfg), bench_fn)
    want = [isa.mm_busy_cycles(*(lambda o: (o["M"], o["K"], o["N"]))(operands(w)), cfg, rq=operands(w)["rq"])
            for _, w in steps]
    assert got == want
    # the piped requantizer's extra cycle stated outright: only fused MMs, only with overlapped phases
    plain = [isa.mm_busy_cycles(*(lambda o: (o["M"], o["K"], o["N"]))(operands(w)), replace(cfg, rq_pipe=0))
             for _, w in steps]
    extra = cfg.rq_pipe and cfg.mm_overlap
    assert [g - p for g, p in zip(got, plain)] == [extra * operands(w)["rq"] for _, w in steps]


# ---- the chip: reference, Amaranth's simulator, Verilator ------------------------------------------

def _directed(cfg):
    """An MM with rq before any RQC (the reset registers: zeros), RQCs with junk in every ignored bit, fused
    MMs of several shapes (tb, strides, relu, saturation, s = 63), a plain MM between them (raw int32,
    registers untouched), an RQ and a fused MM writing over their own operands, back to back RQCs."""
    from sim.verify.progen import ignored_bits
    junk = ignored_bits(Op.RQC, cfg)
    n = cfg.array
    return [ld(0, 0, 1024), ld(1024, 1024, 1000),
            mm(3400, 0, 1024, 2, 3, 2, rq=1),
            rqc(11_534_336, 34, 0).word | junk,
            mm(3000, 0, 1024, n, 64, n, rq=1),
            mm(3100, 5, 1030, 3, 7, 2, tb=1, rq=1, lda=11, ldb=9),
            rqc(9_000_001, 30, 1).word | (junk & 0x5A5A5A5A5A5A5A5A5A5A5A5A5A5A5A5A),
            mm(3200, 0, 1024, n, 9, n - 1, rq=1, ldc=11),
            mm(3300, 0, 1024, 2, 3, 2),
            rqc((1 << 24) - 1, 63, 0), rqc(12_345_678, 33, 0),
            mm(3500, 0, 1024, n, 33, n, rq=1),
            rq(3600, 3300, 4, 8_388_608, 4),
            mm(1030, 1024, 1030, n, 20, n, rq=1),          # over its own B operand
            st(3000, 1500, 548), st(1024, 1000, 400), halt()]


def _chip_image(seed, ext):
    rng = random.Random(seed)
    return [rng.choice((rng.getrandbits(32), rng.randint(-128, 127) & 0xFFFFFFFF)) for _ in range(ext)]


@pytest.mark.parametrize("cfg", [BOOK_RQ, FAST_RQ, replace(BOOK_RQ, rq_pipe=1, mm_overlap=1)],
                         ids=["book-mm_rq", "fast-mm_rq", "book-mm_rq-overlap-rq_pipe"])
def test_directed_program_on_the_amaranth_chip_equals_the_reference(cfg):
    from sim.backends import get_backend
    prog = [w if isinstance(w, int) else w.word for w in _directed(cfg)]
    image = _chip_image(cfg.array, EXT)
    want = ReferenceMachine(config=cfg, check=False).run(prog, image, 3)
    got = get_backend("amaranth", config=cfg).run(prog, image, 3)
    assert first_difference(want, got) is None
    assert want.scratchpad[3400:3404] == [0] * 4                    # fused before any RQC: zeros
    assert want.counters[1] == sum(isa.busy_cycles(w, 3, cfg) for w in prog
                                   if operands(w)["op"] in (Op.MM, Op.RQC))


@pytest.mark.parametrize("cfg", [BOOK_RQ, replace(BOOK_RQ, rq_pipe=1)], ids=["book-mm_rq", "book-mm_rq-rq_pipe"])
def test_random_programs_on_the_amaranth_chip_equal_the_reference(cfg):
    """A handful of the generator's short programs with RQCs and fused MMs (one of each at least)."""
    from sim.backends import get_backend
    from sim.verify.progen import random_program
    chip = get_backend("amaranth", config=cfg)
    ref = ReferenceMachine(config=cfg, check=False)
    seen = set()
    for seed in range(3):
        prog, image = random_program(random.Random(f"fused {seed}"), EXT, None, 2, config=cfg)
        seen |= {(operands(w)["op"], operands(w).get("rq")) for w in prog}
        want, got = ref.run(prog, image, 2), chip.run(prog, image, 2)
        assert first_difference(want, got) is None, seed
    assert {(Op.RQC, None), (Op.MM, 1), (Op.MM, 0)} <= seen


def test_fuzz_mix_on_verilator_equals_the_reference():
    """The fuzz mix of a fast chip with mm_rq=1 (wide programs with RQCs, fused MMs and junk in every
    ignored bit, and resident programs) on its Verilator model at EXT 16384, LAT 8: the model the fast
    preset's serving test builds once `fast` has mm_rq=1."""
    from hdl.config import PRESETS
    from sim.backends import BackendUnavailable, get_backend
    from sim.verify.progen import fuzz_case
    cfg = replace(PRESETS["fast"], mm_rq=1)
    try:
        chip = get_backend("verilator", config=cfg)
    except BackendUnavailable as exc:
        pytest.skip(f"verilator backend unavailable: {exc}")
    ref = ReferenceMachine(config=cfg, check=False)
    cases = [fuzz_case(2026, i, ((cfg.ext_words, 8),), 40_000, cfg) for i in range(60)]
    results = chip.run_many([(c.program, c.image, c.lat, c.scratchpad) for c in cases])
    fused = 0
    for c, got in zip(cases, results):
        want = ref.run(c.program, c.image, c.lat, scratchpad=c.scratchpad)
        assert first_difference(want, got) is None, f"program {c.index}"
        fused += sum(operands(w)["op"] == Op.MM and operands(w)["rq"] for w in c.program)
    assert fused >= 20
