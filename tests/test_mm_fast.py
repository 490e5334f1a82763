"""The faster MM unit (docs/mm-fast.md): B packed four int8 per word (``mm_pack``, MM's pb flag) and
overlapped phases (``mm_overlap``). The configuration, the ISA, the cycle model and the reference machine
here, table-driven; the unit itself further down.
"""
import random
from dataclasses import replace

import pytest

from hdl import isa
from hdl.config import BOOK, ChipConfig, ChipSpecError, parse_chip
from hdl.isa import IsaError, Op
from sim.backends.reference import ReferenceMachine

FAST = parse_chip("array=8,mm_load=4,gather=1,ext_words=16384,mm_rq=1,vadd_ports=2")
PACK = replace(FAST, mm_pack=1)
BOOK_PACK = replace(BOOK, mm_pack=1)
OVER = replace(PACK, mm_overlap=1)


# ---- configuration -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mm_pack", "mm_overlap"])
@pytest.mark.parametrize("value", [2, -1, 4])
def test_bad_flag_names_the_value(name, value):
    with pytest.raises(ValueError) as e:
        ChipConfig(**{name: value})
    assert str(e.value) == f"ChipConfig {name} must be 0 or 1, not {value}"
    with pytest.raises(ChipSpecError) as e:
        parse_chip(f"array=8,mm_load=4,gather=1,ext_words=16384,{name}={value}")
    assert str(e.value) == f"--chip 'array=8,mm_load=4,gather=1,ext_words=16384,{name}={value}': ChipConfig {name} must be 0 or 1, not {value}"


@pytest.mark.parametrize("spec, reads", [
    ("book", 1), ("mm_pack=1", 1), ("mm_overlap=1", 2), ("mm_overlap=1,vadd_ports=2", 2),
    ("mm_load=2,mm_overlap=1", 4), ("array=8,mm_load=4,gather=1,ext_words=16384,mm_pack=1", 4), ("array=8,mm_load=4,gather=1,ext_words=16384,mm_overlap=1", 8),
    ("fast", 8), ("array=8,mm_load=4,gather=1,ext_words=16384,mm_overlap=0", 4),
])
def test_spec_round_trip_and_read_ports(spec, reads):
    cfg = parse_chip(spec)
    assert parse_chip(cfg.spec()) == cfg
    assert cfg.spad_reads == reads
    assert BOOK.mm_pack == 0 and BOOK.mm_overlap == 0


# ---- the instruction ------------------------------------------------------------------------------

def test_pb_is_fl_bit_2_and_read_only_on_pack_chips():
    ins = isa.mm(0, 100, 200, 4, 8, 4, ldb=1, pb=1)
    assert (isa.encode(ins) >> 20) & 1 == 1 and (isa.encode(ins) >> 18) & 0b1011 == 0
    assert isa.operands(ins)["pb"] == 1
    assert "pb" in isa.hw_operands(Op.MM, PACK)
    assert "pb" not in isa.hw_operands(Op.MM, BOOK) and "pb" not in isa.hw_operands(Op.MM, FAST)
    assert isa.describe(ins).endswith(" pb=1")
    assert "pb" not in isa.describe(isa.mm(0, 100, 200, 4, 8, 4))


@pytest.mark.parametrize("cfg, ins, message", [
    (FAST, isa.mm(0, 100, 200, 4, 8, 4, pb=1),
     "MM instruction: pb = 1 (fl bit 2) needs a chip with mm_pack=1 (B packed four int8 a word)"),
    (BOOK, isa.mm(0, 100, 200, 4, 8, 4, pb=1),
     "MM instruction: pb = 1 (fl bit 2) needs a chip with mm_pack=1 (B packed four int8 a word)"),
    (PACK, isa.mm(0, 100, 200, 4, 8, 4, ldb=8, tb=1, pb=1),
     "MM instruction: tb = 1 with pb = 1: a packed B (fl bit 2) must not be transposed"),
    # packed B spans (K-1)*ldb + ceil(N/4) words: 4095 + 2 runs one past the scratchpad
    (PACK, isa.mm(0, 100, 4095 - 2 * 7, 4, 8, 5, ldb=2, pb=1),
     "MM instruction: B = 4081 with length 16 runs past the end of the scratchpad (4096 words)"),
])
def test_validate_refuses(cfg, ins, message):
    with pytest.raises(IsaError) as e:
        isa.validate(ins, cfg=cfg)
    assert str(e.value) == message


@pytest.mark.parametrize("ins", [
    isa.mm(0, 100, 4096 - 2 * 7 - 2, 4, 8, 5, ldb=2, pb=1),     # the last word of B is 4095
    isa.mm(0, 100, 4095, 8, 1, 4, ldb=0, pb=1),                  # K = 1, N <= 4: one word
    isa.mm(0, 100, 4094, 8, 3, 4, ldb=0, pb=1),                  # ldb = 0: every k reads the same word
])
def test_validate_accepts_packed_b_to_the_end(ins):
    isa.validate(ins, cfg=PACK)


# ---- the cycle model -----------------------------------------------------------------------------

# (chip, M, K, N, pb, B): every figure worked by hand from docs/mm-fast.md
#   serial:  M*ceil(K/L) + K*cB + (K+M+N-2) + M*N + 7,  cB = ceil(N/L) or ceil(ceil(N/4)/L)
#   overlap: (K-1)*C + max(3, C-1) + M*N + 1,           C = max(ceil(M/L), cB)
CYCLES = [
    (BOOK, 4, 4, 4, 0, 16 + 16 + 10 + 16 + 7),
    (BOOK_PACK, 4, 4, 4, 1, 16 + 4 + 10 + 16 + 7),           # one word a k instead of four
    (BOOK_PACK, 4, 4, 4, 0, 16 + 16 + 10 + 16 + 7),          # pb = 0 on a pack chip: the book's
    (BOOK_PACK, 1, 64, 3, 1, 64 + 64 + 66 + 3 + 7),
    (FAST, 8, 64, 8, 0, 128 + 128 + 78 + 64 + 7),
    (PACK, 8, 64, 8, 1, 128 + 64 + 78 + 64 + 7),             # 2 words a k through 4 ports: 1 cycle
    (PACK, 1, 5, 8, 1, 2 + 5 + 12 + 8 + 7),
    (replace(PACK, array=16), 3, 7, 15, 1, 6 + 7 + 23 + 45 + 7),     # 4 words a k: 1 cycle
    (replace(BOOK_PACK, array=16), 3, 7, 13, 1, 21 + 28 + 21 + 39 + 7),   # 4 words, one port: 4
    (replace(PACK, mm_load=2), 8, 9, 8, 1, 40 + 9 + 23 + 64 + 7),
    # overlapped
    (replace(BOOK, mm_overlap=1), 4, 4, 4, 0, 3 * 4 + 3 + 16 + 1),
    (replace(BOOK, mm_overlap=1), 1, 1, 1, 0, 0 + 3 + 1 + 1),
    (replace(BOOK_PACK, mm_overlap=1), 4, 10, 4, 1, 9 * 4 + 3 + 16 + 1),   # A's 4 rows bound: C = 4
    (replace(BOOK_PACK, mm_overlap=1), 1, 10, 4, 1, 9 * 1 + 3 + 4 + 1),
    (replace(FAST, mm_overlap=1), 8, 64, 8, 0, 63 * 2 + 3 + 64 + 1),
    (OVER, 8, 64, 8, 1, 63 * 2 + 3 + 64 + 1),                # A's 8 rows through 4 ports: C = 2
    (OVER, 4, 64, 8, 1, 63 * 1 + 3 + 32 + 1),
    (OVER, 4, 64, 8, 0, 63 * 2 + 3 + 32 + 1),
    (replace(OVER, mm_load=1, array=16), 1, 6, 15, 0, 5 * 15 + 14 + 15 + 1),  # C - 1 = 14 > 3
    (replace(OVER, mm_load=1, array=16), 1, 6, 15, 1, 5 * 4 + 3 + 15 + 1),
]


@pytest.mark.parametrize("cfg, M, K, N, pb, busy", CYCLES)
def test_mm_busy_cycles(cfg, M, K, N, pb, busy):
    assert isa.mm_busy_cycles(M, K, N, cfg, pb=pb) == busy
    for tb in (0, 1):       # tb changes no figure
        assert isa.mm_busy_cycles(M, K, N, cfg, tb=tb, pb=pb) == busy
    ins = isa.mm(0, 0, 0, M, K, N, pb=pb)
    assert isa.busy_cycles(ins, 8, cfg) == busy
    assert isa.busy_cycles(isa.encode(ins), 3, cfg) == busy


def test_pb_bit_is_not_read_on_other_chips_cycles():
    # bit 20 set on a chip without mm_pack: junk, the book's cycles
    ins = isa.encode(isa.mm(0, 0, 0, 4, 4, 4)) | (1 << 20)
    assert isa.busy_cycles(ins, 8, BOOK) == isa.mm_busy_cycles(4, 4, 4, BOOK) == 65


def test_overlap_saves_the_goal_when_b_groups_bound():
    """docs/mm-fast.md: against the serial formula the overlapped one saves at least M*ceil(K/L) + K - 2
    whenever ceil(M/L) <= cB (A's groups a k no more than B's), for every shape of those chips."""
    for base in (BOOK, FAST, PACK, replace(PACK, mm_load=2), replace(BOOK_PACK, array=16)):
        over = replace(base, mm_overlap=1)
        L = base.mm_load
        for pb in ((0, 1) if base.mm_pack else (0,)):
            for M in range(1, base.array + 1):
                for N in range(1, min(base.array, 15) + 1):
                    if -(-M // L) > isa.mm_b_groups(N, base, pb):
                        continue
                    for K in range(1, base.row_depth + 1):
                        saved = isa.mm_busy_cycles(M, K, N, base, pb=pb) - isa.mm_busy_cycles(M, K, N, over, pb=pb)
                        assert saved >= M * -(-K // L) + K - 2, (base.spec(), M, K, N, pb, saved)


# ---- the reference machine: pb = 1 equals pb = 0 on the unpacked copy of B ----------------------

def _pack(values):
    """int8 values into words, four a word, value j in byte j % 4."""
    words = []
    for w in range(0, len(values), 4):
        word = 0
        for b, v in enumerate(values[w:w + 4]):
            word |= (v & 0xFF) << (8 * b)
        words.append(word)
    return words


def _shapes(cfg, rng, n):
    for _ in range(n):
        M, N = rng.randint(1, cfg.array), rng.randint(1, cfg.array)
        K = rng.choice([1, 2, rng.randint(1, cfg.row_depth)])
        yield M, K, N


@pytest.mark.parametrize("cfg, seed", [(PACK, 1), (PACK, 2), (BOOK_PACK, 3), (replace(PACK, mm_load=1), 4),
                                       (OVER, 5)])
def test_reference_packed_equals_unpacked(cfg, seed):
    """Random A and B (B's words full of junk above the byte each element uses in the unpacked copy), one
    MM a program: pb = 1 on the packed B writes the same words as pb = 0 on the unpacked copy, also with
    rq = 1, and its counters differ by exactly K*(ceil(N/L) - cB) in total and mm."""
    rng = random.Random(seed)
    ref = ReferenceMachine(config=cfg)
    for M, K, N in _shapes(cfg, rng, 12):
        words_k = -(-N // 4)
        ldb_packed = words_k + rng.choice([0, 0, 3])
        ldb_plain = N + rng.choice([0, 5])
        a = [rng.getrandbits(32) for _ in range(64 * 16)]            # A's element is the low byte anyway
        b = [[rng.randint(-128, 127) for _ in range(N)] for _ in range(K)]
        packed = [0] * ((K - 1) * ldb_packed + words_k)
        plain = [0] * ((K - 1) * ldb_plain + N)
        for k in range(K):
            packed[k * ldb_packed:k * ldb_packed + words_k] = _pack(b[k])
            # the unpacked element in the low byte, junk above it (the unit reads bits 7:0 only)
            plain[k * ldb_plain:k * ldb_plain + N] = [(v & 0xFF) | (rng.getrandbits(24) << 8) for v in b[k]]
        A, BP, BU, C = 0, 1100, 2300, 3500
        lda = K + rng.choice([0, 2])
        rq = rng.randint(0, 1) if cfg.mm_rq else 0
        head = [isa.rqc(rng.randint(1, 1 << 22), rng.randint(8, 30), rng.randint(0, 1))] if rq else []
        image = [0] * 4096
        image[A:A + len(a)] = a
        image[BP:BP + len(packed)] = packed
        image[BU:BU + len(plain)] = plain
        runs = []
        for pb, B, ldb in ((1, BP, ldb_packed), (0, BU, ldb_plain)):
            prog = [isa.ld(0, 0, 4095)] + head + [
                isa.mm(C, A, B, M, K, N, lda=lda, ldb=ldb, ldc=N + 1, rq=rq, pb=pb),
                isa.st(C, C, M * (N + 1)), isa.halt()]
            runs.append(ref.run(prog, image, 8))
        got, want = runs
        span = M * (N + 1)
        assert got.ext[C:C + span] == want.ext[C:C + span], (M, K, N)
        assert got.scratchpad[C:C + span] == want.scratchpad[C:C + span]
        saved = isa.mm_busy_cycles(M, K, N, cfg) - isa.mm_busy_cycles(M, K, N, cfg, pb=1)
        if not cfg.mm_overlap:
            assert saved == K * (-(-N // cfg.mm_load) - isa.mm_b_groups(N, cfg, 1))
        assert got.counters == [want.counters[0] - saved, want.counters[1] - saved, *want.counters[2:]]


def test_reference_ignores_bit_20_without_mm_pack():
    """On a chip without mm_pack bit 20 is junk: the MM reads B unpacked (unchecked, as progen's junk)."""
    rng = random.Random(7)
    image = [rng.getrandbits(32) for _ in range(4096)]
    word = isa.encode(isa.mm(3000, 0, 500, 4, 9, 4, ldb=4))
    runs = [ReferenceMachine(config=FAST, check=False).run([isa.ld(0, 0, 4095), w, isa.halt()], image, 8)
            for w in (word, word | (1 << 20))]
    assert runs[0].scratchpad == runs[1].scratchpad and runs[0].counters == runs[1].counters


# ---- the random programs (sim.verify.progen) -----------------------------------------------------

@pytest.mark.parametrize("cfg", [PACK, OVER, BOOK_PACK])
def test_progen_mixes_packed_mms_on_pack_chips(cfg):
    """On a chip with mm_pack about half the MMs of the fuzz mix read B packed, M and N cover 1..array,
    and every word is legal on that chip once its ignored bits are cleared (but the word a program meant to
    stop the chip carries, docs/error-stop.md); a checked classic program runs on the checked reference."""
    from sim.verify.progen import fuzz_case, ignored_bits, random_program
    mms = []
    for i in range(60):
        c = fuzz_case(11, i, config=cfg)
        for pc, word in enumerate(c.program):
            if isa.issue_stop(word, cfg) is not None:
                continue
            plain = word & ~ignored_bits(word >> 124, cfg)
            isa.validate(plain, ext_words=c.ext, index=pc, cfg=cfg)
            if word >> 124 == Op.MM:
                mms.append(isa.operands(plain))
    packed = [o for o in mms if o["pb"]]
    assert 0.3 < len(packed) / len(mms) < 0.7
    assert all(o["tb"] == 0 for o in packed)
    assert {o["N"] for o in mms} == {o["M"] for o in mms} == set(range(1, cfg.array + 1))
    assert {o["N"] for o in packed} >= {1, 4, cfg.array}      # one word a k, and two on an 8 x 8 array
    rng = random.Random(5)
    for _ in range(3):
        program, image = random_program(rng, 2048, config=cfg)
        ReferenceMachine(config=cfg).run(program, image, 8)


def test_progen_programs_of_other_chips_read_no_pb():
    from sim.verify.progen import fuzz_case, ignored_bits
    for cfg in (BOOK, FAST):
        for i in range(30):
            for word in fuzz_case(11, i, config=cfg).program:
                if word >> 124 == Op.MM and isa.issue_stop(word, cfg) is None:     # not a stop_word
                    assert isa.operands(word & ~ignored_bits(Op.MM, cfg))["pb"] == 0
                    assert isa.operands(word)["M"] <= 4 and isa.operands(word)["N"] <= 4


# ---- the unit (hdl/units/mm.py) on its own -------------------------------------------------------

def _golden_writes(mem, word, cfg):
    """The writes of one MM (address, unsigned word) in order, B packed when pb on an mm_pack chip."""
    from hdl.arith import s8, s32, u32
    o = isa.operands(word)
    M, K, N, depth = o["M"], o["K"], o["N"], len(mem)
    pb = o["pb"] and cfg.mm_pack
    a = [[s8(mem[(o["A"] + r * o["lda"] + k) % depth]) for k in range(K)] for r in range(M)]

    def b(k, n):
        if pb:
            return s8(mem[(o["B"] + k * o["ldb"] + n // 4) % depth] >> (8 * (n % 4)))
        if o["tb"]:
            return s8(mem[(o["B"] + n * o["ldb"] + k) % depth])
        return s8(mem[(o["B"] + k * o["ldb"] + n) % depth])
    return [((o["dst"] + r * o["ldc"] + n) % depth, u32(s32(sum(a[r][k] * b(k, n) for k in range(K)))))
            for r in range(M) for n in range(N)]


def _random_mm(rng, cfg, M, K, N, tb, pb):
    """An MM with random bases and strides (usually the dense ones), sometimes C over A or over B."""
    def stride(dense):
        return dense if rng.random() < 0.5 else rng.randrange(4096)
    a, b, dst = rng.randrange(4096), rng.randrange(4096), rng.randrange(4096)
    pick = rng.random()
    if pick < 0.15:
        dst = a
    elif pick < 0.3:
        dst = b
    return isa.encode(isa.mm(dst, a, b, M, K, N, lda=stride(K), ldb=stride(-(-N // 4) if pb else K if tb else N),
                             ldc=stride(N), tb=0 if pb else tb, pb=pb))


def _run_unit(cfg, words, seed, trace=False, **issue_options):
    """The MM words back to back on the unit of chip `cfg`, the whole scratchpad checked after each
    against `_golden_writes`; returns [(B, trace)]."""
    from hdl.units.mm import MatrixUnit
    from tests.unitbench import simulate
    rng = random.Random(seed)
    background = [rng.getrandbits(32) for _ in range(4096)]

    async def bench_fn(ctx, bench):
        bench.fill(ctx, background)
        mirror = list(background)
        await bench.idle(ctx, 2)
        out = []
        for word in words:
            writes = _golden_writes(mirror, word, cfg)
            b, cycles = await bench.issue(ctx, word, trace=trace, **issue_options)
            for addr, value in writes:
                mirror[addr] = value
            bench.check_against(ctx, mirror, word)
            await bench.idle(ctx, 1)
            out.append((b, cycles))
        return out
    return simulate(MatrixUnit(config=cfg), bench_fn)


UNIT_CHIPS = [
    "mm_pack=1",                                          # serial, one port
    "array=8,mm_load=4,mm_pack=1",                        # serial, four ports
    "mm_overlap=1",                                       # overlapped, 1 + 1 ports
    "array=8,mm_load=4,mm_pack=1,mm_overlap=1",           # the fast chip's unit: 4 + 4 ports
    "mm_load=2,mm_pack=1,mm_overlap=1",
    "array=2,mm_load=4,row_depth=4,mm_pack=1,mm_overlap=1",   # groups wider than the array and K
    "array=1,row_depth=1,mm_overlap=1",
]


@pytest.mark.parametrize("spec", UNIT_CHIPS)
def test_unit_equals_golden_and_cycle_model(spec):
    """Corner and random shapes (both tb; pb half the time on a pack chip; random bases, strides,
    C over A or B): the whole scratchpad is the golden matmul's and B is hdl.isa.mm_busy_cycles."""
    cfg = parse_chip(spec)
    rng = random.Random(spec)
    n, d = min(cfg.array, 15), cfg.row_depth
    corners = [(1, 1, 1), (n, d, n), (n, min(d, 5), 1), (1, min(d, 7), n), (n, 1, n)]
    shapes = corners + [(rng.randint(1, n), rng.choice([1, 2, 3, 4, 5, rng.randint(1, min(d, 24))]) if d > 1
                         else 1, rng.randint(1, n)) for _ in range(8)]
    cases = []
    for M, K, N in shapes:
        K = min(K, d)
        pb = cfg.mm_pack and rng.random() < 0.6
        tb = 0 if pb else rng.randrange(2)
        cases.append((M, K, N, tb, int(pb)))
    words = [_random_mm(rng, cfg, *c) for c in cases]
    got = [b for b, _ in _run_unit(cfg, words, seed=len(spec))]
    assert got == [isa.mm_busy_cycles(M, K, N, cfg, tb=tb, pb=pb) for M, K, N, tb, pb in cases]


def test_overlapped_schedule_port_timing():
    """docs/mm-fast.md's schedule on the fast chip's unit: port 0 reads A + k + g*L*lda in cycle x = k*C + g
    (W(x+1)); C's words go out m-major from x = X0 on, one a cycle, each the golden value; done alone in
    W_B, busy before it."""
    cfg = parse_chip("array=8,mm_load=4,mm_pack=1,mm_overlap=1")
    L = 4
    cases = [(8, 9, 8, 0, 0, 13), (3, 5, 7, 0, 1, 2), (8, 3, 2, 1, 0, 9)]      # M, K, N, tb, pb, lda
    words = [isa.encode(isa.mm(4090, 4093, 7, M, K, N, lda=lda, ldb=11, ldc=N + 2, tb=tb, pb=pb))
             for M, K, N, tb, pb, lda in cases]
    rng = random.Random(9)
    background = [rng.getrandbits(32) for _ in range(4096)]
    mirror = list(background)
    for (M, K, N, tb, pb, lda), word, (b, cycles) in zip(cases, words, _run_unit(cfg, words, 9, trace=True)):
        C = max(-(-M // L), isa.mm_b_groups(N, cfg, pb))
        x0 = (K - 1) * C + max(3, C - 1)
        assert b == x0 + M * N + 1 == len(cycles)
        ra = [cy.ra for cy in cycles]
        assert ra[:K * C] == [(4093 + k + g * L * lda) % 4096 for k in range(K) for g in range(C)]
        writes = _golden_writes(mirror, word, cfg)
        for addr, value in writes:
            mirror[addr] = value
        assert [(cy.n, cy.wa, cy.wd) for cy in cycles if cy.we] == \
            [(x0 + 1 + q, a, v) for q, (a, v) in enumerate(writes)]
        assert [cy.done for cy in cycles] == [0] * (b - 1) + [1]
        assert [cy.busy for cy in cycles] == [1] * (b - 1) + [0]


def test_overlapped_unit_ignores_start_while_busy_and_hangs_on_a_zero_dimension():
    from hdl.units.mm import MatrixUnit
    from tests.unitbench import nonzero_words, simulate
    cfg = parse_chip("array=8,mm_load=4,mm_pack=1,mm_overlap=1")
    rng = random.Random(4)
    cases = [(8, 7, 8, 0, 1), (4, 3, 1, 1, 0), (1, 9, 5, 0, 0)]
    words = [_random_mm(rng, cfg, *c) for c in cases]
    got = [b for b, _ in _run_unit(cfg, words, seed=4, stray=range(1, 1000))]
    assert got == [isa.mm_busy_cycles(M, K, N, cfg, pb=pb) for M, K, N, _, pb in cases]
    for seed, word in enumerate([isa.mm(100, 0, 50, 0, 3, 2), isa.mm(100, 0, 50, 2, 0, 2),
                                 isa.mm(100, 0, 50, 2, 3, 0, pb=1)]):
        background = nonzero_words(seed)

        async def bench_fn(ctx, bench):
            bench.fill(ctx, background)
            b, _ = await bench.issue(ctx, isa.encode(word), hang=True, limit=300)
            bench.check_against(ctx, background, isa.encode(word))
            return b
        assert simulate(MatrixUnit(config=cfg), bench_fn) is None


# ---- the chip: Amaranth and Verilator against the reference --------------------------------------

def _chip_program(cfg):
    """MMs of several shapes with and without pb (packed B at word strides, a B whose last word is
    partial), rq, tb, C over its own operands, back to back; the results stored."""
    n, rq = cfg.array, cfg.mm_rq
    return [isa.ld(0, 0, 1024), isa.ld(1024, 1024, 1000)] + [isa.rqc(11_534_336, 34, 0)] * rq + [
            isa.mm(3000, 0, 1024, n, 64, n, pb=1, ldb=n // 4),
            isa.mm(3100, 5, 1030, 3, 7, 2, tb=1, lda=11, ldb=9),
            isa.mm(3200, 0, 1024, n, 9, n - 1, rq=rq, ldc=11, pb=1, ldb=5),
            isa.mm(3300, 7, 1100, 1, 5, 3, ldb=3),
            isa.mm(3400, 0, 1024, n, 33, n, rq=rq, ldb=n),
            isa.mm(3500, 0, 1200, 2, 1, max(n - 3, 3), pb=1, ldb=0),
            isa.mm(1030, 1024, 1030, n, 20, n, pb=1, ldb=3),          # over its own B operand
            isa.mm(1040, 1040, 1060, n, 3, 1, lda=2, ldb=1),           # over its own A operand
            isa.st(3000, 1500, 548), isa.st(1024, 1000, 400), isa.halt()]


@pytest.mark.parametrize("spec", ["array=8,mm_load=4,gather=1,ext_words=16384,mm_rq=1,vadd_ports=2,mm_pack=1",
                                  "array=8,mm_load=4,gather=1,ext_words=16384,mm_rq=1,vadd_ports=2,mm_pack=1,mm_overlap=1", "mm_overlap=1,mm_pack=1"])
def test_directed_program_on_the_amaranth_chip_equals_the_reference(spec):
    from chipbench import amaranth_chip_equals_reference
    cfg = parse_chip(spec)
    prog = [isa.encode(i) for i in _chip_program(cfg)]
    amaranth_chip_equals_reference(cfg, prog, spec, 1, (Op.MM, Op.RQC))


def test_fuzz_mix_on_verilator_equals_the_reference():
    """The fuzz mix of the fast chip with both features (packed and plain MMs of every shape, fused ones,
    junk in every ignored bit, resident programs) on its Verilator model at EXT 16384, LAT 8: the model
    the fast preset's serving test builds once `fast` has these parameters."""
    from hdl.config import PRESETS
    from sim.backends import BackendUnavailable, first_difference, get_backend
    from sim.verify.progen import fuzz_case
    cfg = replace(PRESETS["fast"], mm_rq=1, vadd_ports=2, mm_pack=1, mm_overlap=1)
    try:
        chip = get_backend("verilator", config=cfg)
    except BackendUnavailable as exc:
        pytest.skip(f"verilator backend unavailable: {exc}")
    ref = ReferenceMachine(config=cfg, check=False)
    cases = [fuzz_case(2027, i, ((cfg.ext_words, 8),), 40_000, cfg) for i in range(40)]
    packed = sum(isa.operands(w)["pb"] for c in cases for w in c.program if w >> 124 == Op.MM)
    assert packed >= 10
    for c in cases:
        want = ref.run(c.program, c.image, c.lat, scratchpad=c.scratchpad)
        got = chip.run(c.program, c.image, c.lat, scratchpad=c.scratchpad)
        assert first_difference(want, got) is None, c.index
