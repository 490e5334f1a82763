"""A packed C and a packed, transposed B (generator parameter ``mm_pack_c``, docs/mm-pack-c.md): MM's pc
flag writes the int8 results four a word, and tb with pb reads B as N rows packed four a word. The
configuration, the ISA, the cycle model and the reference machine against a numpy model here; the unit
further down.
"""
import random
from dataclasses import replace

import numpy as np
import pytest

from hdl import isa
from hdl.arith import requant
from hdl.config import BOOK, ChipSpecError, parse_chip
from hdl.isa import IsaError, Op
from sim.backends.reference import ReferenceMachine
from chipbench import FAST_PRE_LANES, fast_with

PACK_C = fast_with(mm_pack_c=1)
FAST = FAST_PRE_LANES          # a chip without packed C (the fast preset before issue 23's lanes)
# the formal unit chip's configuration: the book's array with the three parameters mm_pack_c needs
SMALL = replace(BOOK, mm_rq=1, mm_pack=1, mm_overlap=1, mm_pack_c=1)


# ---- configuration -------------------------------------------------------------------------------

def test_the_book_does_not_have_it():
    assert BOOK.mm_pack_c == 0 and FAST.mm_pack_c == 0
    assert PACK_C == replace(FAST, mm_pack_c=1) and parse_chip(PACK_C.spec()) == PACK_C


@pytest.mark.parametrize("value", [2, -1])
def test_bad_value_names_it(value):
    with pytest.raises(ValueError) as e:
        replace(FAST, mm_pack_c=value)
    assert str(e.value) == f"ChipConfig mm_pack_c must be 0 or 1, not {value}"


@pytest.mark.parametrize("off", ["mm_pack", "mm_rq", "mm_overlap"])
def test_needs_pack_rq_and_overlap(off):
    cfg = replace(FAST, **{off: 0}, mm_pack_c=0)
    with pytest.raises(ValueError) as e:
        replace(cfg, mm_pack_c=1)
    assert str(e.value) == (f"ChipConfig mm_pack_c = 1 needs mm_pack=1, mm_rq=1 and mm_overlap=1 (not mm_pack="
                            f"{cfg.mm_pack}, mm_rq={cfg.mm_rq}, mm_overlap={cfg.mm_overlap})")
    with pytest.raises(ChipSpecError) as e:
        parse_chip(f"fast,{off}=0,mm_pack_c=1")
    assert str(e.value).startswith(f"--chip 'fast,{off}=0,mm_pack_c=1': ChipConfig mm_pack_c = 1 needs")
    assert "\n" not in str(e.value)


# ---- the instruction ------------------------------------------------------------------------------

def test_pc_is_fl_bit_3_and_read_only_on_pack_c_chips():
    ins = isa.mm(0, 100, 200, 4, 8, 4, ldc=1, rq=1, pc=1)
    assert (isa.encode(ins) >> 21) & 1 == 1 and (isa.encode(ins) >> 18) & 0b0111 == 0b010
    assert isa.HW_OPERANDS[Op.MM]["pc"] == (21, 21) and isa.CHIP_OPERANDS[(Op.MM, "pc")] == "mm_pack_c"
    assert isa.operands(ins)["pc"] == 1
    assert "pc" in isa.hw_operands(Op.MM, PACK_C)
    assert all("pc" not in isa.hw_operands(Op.MM, cfg) for cfg in (BOOK, FAST))
    assert isa.describe(ins).endswith(" rq=1 pc=1")
    assert "pc" not in isa.describe(isa.mm(0, 100, 200, 4, 8, 4, rq=1))
    with pytest.raises(IsaError):
        isa.mm(0, 0, 0, 1, 1, 1, pc=2)


@pytest.mark.parametrize("cfg, ins, message", [
    (FAST, isa.mm(0, 100, 200, 4, 8, 4, rq=1, pc=1),
     "MM instruction: pc = 1 (fl bit 3) needs a chip with mm_pack_c=1 (C packed four int8 a word)"),
    (PACK_C, isa.mm(0, 100, 200, 4, 8, 4, pc=1),
     "MM instruction: pc = 1 (fl bit 3) needs rq = 1 (fl bit 1): a packed C holds int8 results"),
    (FAST, isa.mm(0, 100, 200, 4, 8, 4, tb=1, pb=1),
     "MM instruction: tb = 1 with pb = 1: a packed B (fl bit 2) must not be transposed"),
    # the regions: C (M-1)*ldc + ceil(N/4) words, a packed transposed B (N-1)*ldb + ceil(K/4)
    (PACK_C, isa.mm(4096 - 3 * 2 - 1, 0, 200, 4, 8, 5, ldc=2, rq=1, pc=1),
     "MM instruction: dst = 4089 with length 8 runs past the end of the scratchpad (4096 words)"),
    (PACK_C, isa.mm(0, 0, 4096 - 7 * 3 - 2, 4, 9, 8, ldb=3, tb=1, pb=1),
     "MM instruction: B = 4073 with length 24 runs past the end of the scratchpad (4096 words)"),
])
def test_validate_refuses(cfg, ins, message):
    with pytest.raises(IsaError) as e:
        isa.validate(ins, cfg=cfg)
    assert str(e.value) == message


@pytest.mark.parametrize("ins", [
    isa.mm(4096 - 3 * 2 - 2, 0, 200, 4, 8, 5, ldc=2, rq=1, pc=1),       # exactly fits: 6 + 2 words
    isa.mm(0, 0, 4096 - 7 * 3 - 2, 4, 6, 8, ldb=3, tb=1, pb=1),          # exactly fits: 21 + 2 words
    isa.mm(0, 0, 100, 8, 64, 8, ldb=16, tb=1, pb=1, rq=1, pc=1),
])
def test_validate_accepts_on_pack_c(ins):
    isa.validate(ins, cfg=PACK_C)


# ---- cycles ------------------------------------------------------------------------------------

def test_cycles():
    """pc adds nothing; tb with pb stages B as tb does (ceil(N/L) groups a k) on an mm_pack_c chip, and
    as a packed B elsewhere (pb wins)."""
    for cfg in (PACK_C, SMALL):
        L = cfg.mm_load
        for M in range(1, cfg.array + 1):
            for N in range(1, cfg.array + 1):
                for K in (1, 2, 5, 64):
                    plain = isa.mm(0, 0, 0, M, K, N, rq=1)
                    packed = isa.mm(0, 0, 0, M, K, N, rq=1, pc=1)
                    assert isa.busy_cycles(packed, 8, cfg) == isa.busy_cycles(plain, 8, cfg)
                    c = max(-(-M // L), -(-N // L))
                    want = (K - 1) * c + max(3, c - 1) + M * N + 1 + cfg.rq_pipe
                    for tb, pb in ((1, 1), (1, 0)):
                        ins = isa.mm(0, 0, 0, M, K, N, rq=1, pc=1, tb=tb, pb=pb)
                        assert isa.busy_cycles(ins, 8, cfg) == want, (M, K, N, tb, pb)
                    assert isa.mm_b_groups(N, cfg, pb=1, tb=1) == -(-N // L)
    assert isa.mm_b_groups(8, FAST, pb=1, tb=1) == 1 and isa.mm_b_groups(8, PACK_C, pb=1, tb=1) == 2


# ---- the reference machine against a numpy model ---------------------------------------------------

def _packed_bytes(words, count):
    """The `count` signed bytes of 32-bit `words`, byte 0 of each first."""
    return np.asarray(words, dtype="<u4").view(np.int8)[:count].astype(np.int64)


def _model(spad, o, rqr):
    """The scratchpad after one MM (a dict of `hdl.isa.operands`), from numpy: A, B as the contract reads
    them, C = A @ B, requantized by `rqr` = (m, s, relu) when rq, packed four a word when pc."""
    spad = np.array(spad, dtype=np.int64)
    depth = len(spad)
    M, K, N = o["M"], o["K"], o["N"]
    idx = lambda base, rows, stride, n: ((base + np.arange(rows)[:, None] * stride + np.arange(n)) % depth)  # noqa: E731
    A = spad[idx(o["A"], M, o["lda"], K)].astype(np.uint32).view(np.int32) & 0xFF
    A = np.where(A > 127, A - 256, A).astype(np.int64)
    if o["pb"] and o["tb"]:
        words = spad[idx(o["B"], N, o["ldb"], -(-K // 4))].astype(np.uint32)
        B = np.stack([_packed_bytes(row, K) for row in words]).T                  # (K, N)
    else:
        assert not o["pb"] and not o["tb"]
        B = spad[idx(o["B"], K, o["ldb"], N)] & 0xFF
        B = np.where(B > 127, B - 256, B)
    C = A @ B
    if o["rq"]:
        C = np.vectorize(lambda c: requant(int(c), *rqr))(C).astype(np.int64)
    for m in range(M):
        if o["pc"]:
            row = np.zeros(4 * -(-N // 4), dtype=np.uint8)
            row[:N] = C[m] & 0xFF
            for w, word in enumerate(row.view("<u4")):
                spad[(o["dst"] + m * o["ldc"] + w) % depth] = int(word)
        else:
            for n in range(N):
                spad[(o["dst"] + m * o["ldc"] + n) % depth] = int(C[m, n]) & 0xFFFFFFFF
    return [int(v) for v in spad]


def _random_case(rng, cfg):
    M, N = rng.randint(1, cfg.array), rng.randint(1, cfg.array)
    K = rng.choice([1, 2, 3, 4, 5, rng.randint(6, cfg.mm_max_k), cfg.mm_max_k])
    tbpb = rng.random() < 0.5
    lda = rng.choice([K, rng.randint(0, K + 5)])
    ldb = rng.choice([-(-K // 4), rng.randint(0, 20)]) if tbpb else rng.choice([N, rng.randint(0, 12)])
    ldc = rng.choice([-(-N // 4), rng.randint(0, 4), N])
    A, B, dst = rng.randrange(cfg.spad_depth - 600), rng.randrange(cfg.spad_depth - 600), \
        rng.randrange(cfg.spad_depth - 100)
    if rng.random() < 0.3:
        dst = A + rng.randint(0, 8)             # C over A: every operand is read before C is written
    return isa.mm(dst, A, B, M, K, N, lda=lda, ldb=ldb, ldc=ldc, tb=int(tbpb), pb=int(tbpb), rq=1,
                  pc=int(rng.random() < 0.7))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cfg", [PACK_C, SMALL], ids=["fast", "small"])
def test_reference_matches_numpy(cfg):
    rng = random.Random(5)
    pcs = tbpbs = 0
    for _ in range(60):
        ins = _random_case(rng, cfg)
        isa.validate(ins, cfg=cfg)
        o = isa.operands(ins)
        pcs, tbpbs = pcs + o["pc"], tbpbs + o["pb"]
        spad = [rng.getrandbits(32) for _ in range(cfg.spad_depth)]
        rqr = (rng.randint(1 << 22, (1 << 24) - 1), rng.randint(14, 30), rng.randint(0, 1))
        prog = [isa.rqc(*rqr), ins, isa.halt()]
        got = ReferenceMachine(config=cfg).run(prog, [0] * 16, scratchpad=spad)
        assert got.scratchpad == _model(spad, o, rqr), isa.describe(ins)
    assert pcs >= 20 and tbpbs >= 20


@pytest.mark.timeout(60)
def test_reference_packed_is_unpacked_then_packed():
    """pc = 1 leaves the words that the same MM with pc = 0 (its results one a word) then packed would."""
    cfg = PACK_C
    rng = random.Random(9)
    for _ in range(40):
        M, N, K = rng.randint(1, 8), rng.randint(1, 8), rng.randint(1, 64)
        ldc = -(-N // 4) + rng.randint(0, 2)
        spad = [rng.getrandbits(32) for _ in range(cfg.spad_depth)]
        rqr = (rng.getrandbits(24), rng.randint(0, 63), rng.randint(0, 1))
        run = lambda pc, dst, ldc: ReferenceMachine(config=cfg).run(  # noqa: E731
            [isa.rqc(*rqr), isa.mm(dst, 0, 1000, M, K, N, ldb=N, ldc=ldc, rq=1, pc=pc), isa.halt()],
            [0] * 16, scratchpad=spad)
        unpacked = run(0, 3000, N).scratchpad
        packed = run(1, 2000, ldc)
        want = list(spad)
        for m in range(M):
            for w in range(-(-N // 4)):
                want[2000 + m * ldc + w] = sum((unpacked[3000 + m * N + n] & 0xFF) << (8 * (n - 4 * w))
                                               for n in range(4 * w, min(N, 4 * w + 4)))
        assert packed.scratchpad == want
        assert packed.counters[1] == run(0, 3000, N).counters[1]


def test_tb_pb_elsewhere_is_a_packed_b():
    """On a chip without mm_pack_c (unchecked: validate refuses it) tb with pb reads B packed along n, as
    before: pb wins."""
    rng = random.Random(3)
    spad = [rng.getrandbits(32) for _ in range(FAST.spad_depth)]
    both = isa.mm(3000, 0, 1000, 4, 9, 8, ldb=2, tb=1, pb=1)
    pb_only = isa.mm(3000, 0, 1000, 4, 9, 8, ldb=2, pb=1)
    run = lambda ins, cfg: ReferenceMachine(config=cfg, check=False).run(  # noqa: E731
        [ins, isa.halt()], [0] * 16, scratchpad=spad)
    assert run(both, FAST).scratchpad == run(pb_only, FAST).scratchpad
    assert run(both, PACK_C).scratchpad != run(pb_only, PACK_C).scratchpad


# ---- the unit (hdl/units/mm.py's overlapped unit) on its own ------------------------------------------

UNIT_CHIPS = [SMALL, replace(SMALL, rq_pipe=1), PACK_C]


def _unit_cases(rng, cfg, count):
    """Corner shapes then random ones, every pairing of pc and tb+pb; each an RQC and an MM."""
    n, d = cfg.array, cfg.row_depth
    shapes = [(n, 9, n), (1, 1, 1), (n, 4, n - 1), (3, min(d, 64), min(5, n))][:count]
    shapes += [(rng.randint(1, n), rng.choice([1, 2, 3, 5, rng.randint(1, 20)]), rng.randint(1, n))
               for _ in range(count - len(shapes))]
    cases = []
    for i, (M, K, N) in enumerate(shapes):
        pc, tbpb = i % 2, (i // 2) % 2
        rqr = (rng.randint(1 << 22, (1 << 24) - 1), rng.randint(12, 24), rng.randint(0, 1))
        cases.append((rqr, _random_case_shaped(rng, cfg, M, K, N, pc, tbpb)))
    return cases


def _random_case_shaped(rng, cfg, M, K, N, pc, tbpb):
    """An MM of this shape with random bases and strides (usually dense), sometimes C over A or B."""
    def stride(dense):
        return dense if rng.random() < 0.6 else rng.randrange(40)
    # bases at least 512 words below the top: every region (at most 7 strides of 39 and 64 words) fits, as
    # hdl.isa.validate wants (a base drawn anywhere ran past the top once the seed changed)
    A, B, dst = (rng.randrange(cfg.spad_depth - 512) for _ in range(3))
    pick = rng.random()
    if pick < 0.2:
        dst = A
    elif pick < 0.4:
        dst = B
    return isa.mm(dst, A, B, M, K, N, lda=stride(K), ldb=stride(-(-K // 4) if tbpb else N),
                  ldc=stride(-(-N // 4) if pc else N), tb=tbpb, pb=tbpb, rq=1, pc=pc)


def _run_unit(cfg, cases, seed, trace=False):
    """Each (rqc, MM) on the unit of chip `cfg` from a random scratchpad: after each MM the whole
    scratchpad is the reference machine's; returns [(B, trace)]."""
    from hdl.units.mm import MatrixUnit
    from tests.unitbench import SPAD_DEPTH, simulate
    assert SPAD_DEPTH == cfg.spad_depth
    rng = random.Random(seed)
    background = [rng.getrandbits(32) for _ in range(SPAD_DEPTH)]

    async def bench_fn(ctx, bench):
        unit = bench.unit
        bench.fill(ctx, background)
        mirror = list(background)
        out = []
        for rqr, ins in cases:
            ctx.set(unit.ins, isa.rqc(*rqr).word)
            ctx.set(unit.rqc, 1)
            await ctx.tick()
            ctx.set(unit.rqc, 0)
            mirror = ReferenceMachine(config=cfg, check=False).run([isa.rqc(*rqr), ins, isa.halt()], [0] * 16,
                                                      scratchpad=mirror).scratchpad
            out.append(await bench.issue(ctx, ins.word, trace=trace))
            bench.check_against(ctx, mirror, ins.word)
            await bench.idle(ctx, 1)
        return out
    return simulate(MatrixUnit(config=cfg), bench_fn)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cfg", UNIT_CHIPS, ids=["small", "small_pipe", "fast"])
def test_unit_equals_reference_and_cycle_model(cfg):
    """The packed C and the packed transposed B on the overlapped unit (pysim, the simulation-only checks
    on: exact_completion, write_region): the scratchpad is the reference machine's after each MM and B is
    hdl.isa.busy_cycles."""
    rng = random.Random(cfg.key())
    cases = _unit_cases(rng, cfg, 6)
    for _, ins in cases:
        isa.validate(ins, cfg=cfg)
    got = [b for b, _ in _run_unit(cfg, cases, seed=7)]
    assert got == [isa.busy_cycles(ins, 8, cfg) for _, ins in cases]


@pytest.mark.timeout(300)
def test_unit_writes_each_word_at_its_last_element():
    """docs/mm-pack-c.md's drain on the fast chip's unit: the word of elements (m, 4w .. 4w+3) goes out in
    the cycle the unpacked element (m, min(4w+3, N-1)) would, X0 + 1 + m*N + n + rq_pipe (W numbering),
    at dst + m*ldc + w; nothing else is written."""
    cfg = PACK_C
    L = cfg.mm_load
    cases = [((1 << 23, 16, 0), isa.mm(4000, 100, 2000, 5, 9, 7, ldc=3, rq=1, pc=1)),
             ((1 << 23, 16, 1), isa.mm(4090, 4093, 7, 8, 6, 8, lda=11, ldb=2, ldc=2, tb=1, pb=1, rq=1, pc=1)),
             ((3 << 22, 18, 0), isa.mm(10, 10, 3000, 3, 5, 4, ldb=5, ldc=1, rq=1, pc=1))]
    for (rqr, ins), (b, cycles) in zip(cases, _run_unit(cfg, cases, seed=3, trace=True)):
        o = isa.operands(ins)
        M, K, N = o["M"], o["K"], o["N"]
        C = max(-(-M // L), isa.mm_b_groups(N, cfg, o["pb"], o["tb"]))
        x0 = (K - 1) * C + max(3, C - 1)
        want = [(x0 + 1 + m * N + n + cfg.rq_pipe, (o["dst"] + m * o["ldc"] + n // 4) % cfg.spad_depth)
                for m in range(M) for n in range(N) if n % 4 == 3 or n == N - 1]
        assert [(cy.n, cy.wa) for cy in cycles if cy.we] == want
        assert b == want[-1][0] + 1 == isa.busy_cycles(ins, 8, cfg)      # done the cycle after the last write


# ---- progen ------------------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_progen_makes_packed_mms_on_pack_c_chips_only():
    """On an mm_pack_c chip the fuzz mix has MMs with pc (dense ldc = ceil(N/4) among them) and with tb and
    pb, every word valid once its ignored bits are cleared, and the reference runs them; the programs of
    other chips read no pc bit and pair tb with pb nowhere."""
    from sim.verify.progen import fuzz_case, ignored_bits
    mms = []
    for i in range(150):
        c = fuzz_case(11, i, config=PACK_C)
        for pc, word in enumerate(c.program):
            if isa.issue_stop(word, PACK_C) is not None:
                continue
            plain = word & ~ignored_bits(word >> 124, PACK_C)
            isa.validate(plain, ext_words=c.ext, index=pc, cfg=PACK_C)
            if word >> 124 == Op.MM:
                mms.append(isa.operands(plain))
        if i < 6:
            ReferenceMachine(config=PACK_C, check=False).run(c.program, c.image, c.lat)
    packed_c = [o for o in mms if o["pc"]]
    assert len(packed_c) >= 8 and all(o["rq"] for o in packed_c)
    assert any(o["ldc"] == -(-o["N"] // 4) for o in packed_c) and {o["N"] % 4 for o in packed_c} == {0, 1, 2, 3}
    assert sum(1 for o in mms if o["tb"] and o["pb"]) >= 8
    for cfg in (FAST, BOOK):
        for i in range(30):
            for word in fuzz_case(11, i, config=cfg).program:
                if word >> 124 == Op.MM and isa.issue_stop(word, cfg) is None:
                    o = isa.operands(word & ~ignored_bits(Op.MM, cfg))
                    assert o["pc"] == 0 and not (o["tb"] and o["pb"])


@pytest.mark.timeout(120)
def test_unit_packs_raw_results_like_the_reference_when_unchecked():
    """pc = 1 with rq = 0 (refused by validate): the unit and the unchecked reference both pack the low byte
    of each raw int32 result, in the cycles of busy_cycles."""
    for cfg in (replace(SMALL, rq_pipe=1), PACK_C):
        cases = [((1 << 23, 16, 0), isa.mm(100, 200, 300, 3, 5, min(7, cfg.array), ldc=2, pc=1)),
                 ((1 << 23, 16, 1), isa.mm(1000, 200, 300, 2, 9, 3, ldb=3, tb=1, pb=1, pc=1))]
        assert [b for b, _ in _run_unit(cfg, cases, seed=1)] == [isa.busy_cycles(i, 8, cfg) for _, i in cases]
