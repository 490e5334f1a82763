"""The folded MM (docs/mm-fold.md): on an ``mm_fold`` chip one MM of at most half the array's rows computes up
to twice its columns, the columns past the array in the lower rows from a second B feed. The configuration's
messages, N's wider field and the RANGE stop, the formula, the array and the MM unit in pysim against the
reference machine, a program on the Amaranth chip, and the compiler's wide tiles."""
import random
from dataclasses import replace

import pytest
from amaranth.sim import Simulator

from hdl import isa
from hdl.config import BOOK, ChipConfig, ChipSpecError, parse_chip
from hdl.isa import ErrorKind, Op
from hdl.systolic import SystolicArray
from sim.backends import ErrorStop
from sim.backends.reference import ReferenceMachine
from chipbench import fast_with
from test_spad_lanes import _run_unit

BCAST = fast_with(mm_pack_c=1, spad_lanes=4, vec_lanes=2, mm_bcast=1)
FOLD = replace(BCAST, mm_fold=1)
# the formal target's chip: the book's 4x4 array, two drain lanes (N up to 8 for M up to 2)
SMALL = replace(BOOK, mm_rq=1, mm_pack=1, mm_overlap=1, rq_pipe=1, mm_pack_c=1, spad_lanes=2, mm_bcast=1, mm_fold=1)


# ---- configuration -------------------------------------------------------------------------------

def test_book_does_not_fold():
    assert BOOK.mm_fold == 0 and BOOK.mm_max_n == 4 and BCAST.mm_max_n == 8
    assert FOLD.mm_max_n == 16 and FOLD.mm_max_mn == 8 and SMALL.mm_max_n == 8


@pytest.mark.parametrize("value", [2, -1])
def test_bad_value_names_it(value):
    with pytest.raises(ValueError, match=f"mm_fold must be 0 or 1, not {value}"):
        ChipConfig(mm_overlap=1, spad_lanes=2, mm_bcast=1, mm_fold=value)


def test_needs_the_broadcast_array_and_an_even_array():
    with pytest.raises(ChipSpecError, match="mm_fold = 1 needs mm_bcast=1.*not mm_bcast=0"):
        parse_chip("fast,mm_bcast=0,mm_fold=1")
    with pytest.raises(ValueError, match="mm_fold = 1 needs an even array.*not array=1"):
        ChipConfig(array=1, mm_overlap=1, spad_lanes=2, mm_bcast=1, mm_fold=1)


# ---- the field and the stop ----------------------------------------------------------------------

def test_n_is_read_with_one_bit_more():
    """h[4:0] on a folding chip: N = 16 is 16 there, 0 on every other chip (h[3:0]), as the hardware reads it."""
    word = isa.mm(0, 0, 0, 4, 16, 16).word
    assert isa.operands(word, FOLD)["N"] == 16
    assert isa.operands(word, BCAST)["N"] == 0 and isa.operands(word)["N"] == 0
    assert isa.hw_operands(Op.MM, FOLD)["N"] == (26, 22) and isa.hw_operands(Op.MM, BCAST)["N"] == (25, 22)
    assert "N=16" in isa.describe(word, FOLD) and "N=0" in isa.describe(word)
    assert isa.macs(word, FOLD) == 4 * 16 * 16 and isa.macs(word) == 0


def test_a_wide_mm_needs_half_the_rows():
    """N past the array with M past half of it stops the chip with RANGE, and validate refuses it naming both."""
    assert isa.issue_stop(isa.mm(0, 0, 0, 4, 64, 16), FOLD) is None
    assert isa.issue_stop(isa.mm(0, 0, 0, 8, 64, 8), FOLD) is None
    assert isa.issue_stop(isa.mm(0, 0, 0, 5, 16, 9), FOLD) == (ErrorKind.RANGE, Op.MM)
    assert isa.issue_stop(isa.mm(0, 0, 0, 1, 16, 17), FOLD) == (ErrorKind.RANGE, Op.MM)
    assert isa.issue_stop(isa.mm(0, 0, 0, 1, 16, 0), FOLD) == (ErrorKind.LENGTH, Op.MM)
    with pytest.raises(isa.IsaError, match="N = 9 is past the array \\(8\\) with M = 5.*at most 4"):
        isa.validate(isa.mm(0, 0, 0, 5, 16, 9), cfg=FOLD)
    with pytest.raises(isa.IsaError, match="N = 9 is outside 1..8"):
        isa.validate(isa.mm(0, 0, 0, 1, 16, 9), cfg=BCAST)


# ---- the cycle formula ---------------------------------------------------------------------------

def test_a_wide_tile_costs_less_than_two():
    """The serving shapes (packed B, fused): one wide tile is staged and run once; the drain is the same M*G
    cycles in all, the start, pipeline and finish cycles of the second tile go."""
    got = [(2 * isa.mm_busy_cycles(M, K, 8, FOLD, pb=1, rq=1), isa.mm_busy_cycles(M, K, 16, FOLD, pb=1, rq=1))
           for M, K in ((1, 16), (4, 16), (3, 32), (1, 3))]
    assert got == [(44, 24), (56, 36), (84, 48), (18, 11)]


# ---- the array -----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("fold", [0, 1])
def test_array_folds_the_second_column_group(fold):
    """Fed a_edge[i] = a_edge[h + i] = A[i][t-i], b_edge[j] = B[t][j] and b_fold[j] = B'[t][j], rows h + i of a
    folding array hold A x B' while rows i hold A x B; with fold low the lower rows take B from above."""
    n, K = 4, 5
    h = n // 2
    cfg = replace(SMALL, array=n)
    rng = random.Random(fold)
    A = [[rng.randint(-128, 127) for _ in range(K)] for _ in range(n)]
    B = [[rng.randint(-128, 127) for _ in range(n)] for _ in range(K)]
    B2 = [[rng.randint(-128, 127) for _ in range(n)] for _ in range(K)]
    dut = SystolicArray(config=cfg)

    def a_of(i, t):
        row = i - h if fold and i >= h else i
        return A[row][t - row] if 0 <= t - row < K else 0

    async def bench(ctx):
        ctx.set(dut.fold, fold)
        for t in range(K + n + 1):
            for i in range(n):
                ctx.set(dut.a_edge[i], a_of(i, t))
                ctx.set(dut.b_edge[i], B[t][i] if t < K else 0)
                ctx.set(dut.b_fold[i], B2[t][i] if t < K else 0)
            await ctx.tick()
        for i in range(n):
            row, b = (i - h, B2) if fold and i >= h else (i, B)
            for j in range(n):
                assert ctx.get(dut.c[i * n + j]) == sum(A[row][k] * b[k][j] for k in range(K)), (i, j)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


# ---- the MM unit ---------------------------------------------------------------------------------

def _wide_cases(rng, cfg, count):
    """Wide MMs (N past the array, M up to half of it) of every B form, fused or not, packed C or not, bases
    anywhere; then ordinary ones, which must not change."""
    n, top = cfg.array, cfg.mm_max_n
    cases = []
    for i in range(count):
        wide = i < count - 3
        M = rng.randint(1, n // 2) if wide else rng.randint(1, n)
        N = rng.choice([top, rng.randint(n + 1, top)]) if wide else rng.randint(1, n)
        K = rng.choice([1, 3, 16, rng.randint(2, 20)])
        form = i % 3                    # 0: B unpacked, 1: packed along n, 2: packed along k (tb with pb)
        pb, tb = int(form > 0), int(form == 2)
        pc = i % 2
        rq = 1 if pc or rng.random() < 0.7 else 0
        ldb = (-(-K // 4) if tb else -(-N // 4)) if pb else (K if tb else N)
        ldc = -(-N // 4) if pc else N
        A, B = rng.randrange(cfg.spad_depth - 3000), rng.randrange(cfg.spad_depth - 3000)
        dst = rng.choice([A, B, rng.randrange(cfg.spad_depth - 3000), cfg.spad_depth - ((M - 1) * ldc + ldc)])
        ins = isa.mm(dst, A, B, M, K, N, lda=K, ldb=ldb, ldc=ldc, tb=tb, pb=pb, rq=rq, pc=pc)
        rqr = (rng.randint(1 << 22, (1 << 24) - 1), rng.randint(12, 24), rng.randint(0, 1))
        cases.append((rqr, ins))
    return cases


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cfg", [FOLD, SMALL], ids=["fold8", "small"])
def test_unit_equals_reference_and_cycle_model(cfg):
    """The folding unit in pysim (the simulation-only checks on): the scratchpad is the reference machine's
    after each MM, wide or not, and B is hdl.isa.busy_cycles."""
    rng = random.Random(cfg.key())
    cases = _wide_cases(rng, cfg, 10)
    for _, ins in cases:
        isa.validate(ins, cfg=cfg)
    assert sum(isa.operands(ins.word, cfg)["N"] > cfg.array for _, ins in cases) == 7
    got = [b for b, _ in _run_unit(cfg, cases, seed=12)]
    assert got == [isa.busy_cycles(ins, 8, cfg) for _, ins in cases]


# ---- the chip ------------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_program_on_the_amaranth_chip_equals_the_reference():
    """Wide and ordinary MMs between the vector units on the folding serving chip, then a wide MM with too many
    rows: the Amaranth chip's scratchpad, external memory, counters and error stop are the reference's."""
    from chipbench import amaranth_chip_equals_reference
    prog = [isa.ld(0, 0, 1024), isa.ld(1024, 1024, 600), isa.rqc(11_534_336, 34, 0),
            isa.mm(3001, 0, 1024, 4, 16, 16, ldb=4, pb=1, rq=1),
            isa.mm(3102, 5, 1030, 2, 7, 13, lda=11, ldb=19, ldc=15),
            isa.vadd(3103, 3001, 3010, 20),
            isa.mm(3203, 0, 1024, 1, 16, 16, rq=1, pc=1, ldc=4, ldb=16),
            isa.mm(3250, 0, 1100, 3, 16, 12, rq=1, pc=1, pb=1, tb=1, ldb=4, ldc=3),
            isa.rq(3300, 3203, 30, 11_534_336, 34, 0),
            isa.mm(1030, 1024, 1030, 8, 20, 8, pb=1, ldb=3, rq=1),
            isa.st(3000, 1500, 500), isa.st(1024, 1000, 400), isa.halt()]
    amaranth_chip_equals_reference(FOLD, [isa.encode(i) for i in prog], 7, 1, (Op.MM, Op.RQC))


@pytest.mark.timeout(300)
def test_a_wide_mm_with_too_many_rows_stops_the_amaranth_chip():
    """The chip's issue check stops on N past the array with M past half of it (RANGE, its pc, MM), after a
    wide MM that runs: the error state and everything else are the reference's."""
    from sim.backends import first_difference
    from sim.backends.amaranth_backend import AmaranthBackend
    words = [isa.encode(i) for i in (isa.mm(100, 0, 0, 4, 4, 16), isa.mm(200, 0, 0, 5, 4, 9), isa.halt())]
    image = [(a * 2654435761) & 0xFFFFFFFF for a in range(2048)]
    want = ReferenceMachine(config=FOLD, check=False).run(words, image, 3)
    assert want.error == ErrorStop("range", 1, Op.MM)
    assert first_difference(want, AmaranthBackend(config=FOLD, max_cycles=500).run(words, image, 3)) is None


# ---- the compiler --------------------------------------------------------------------------------

@pytest.mark.parametrize("m, n, plain, folded", [
    (3, 40, [(3, 8)] * 5, [(3, 16), (3, 16), (3, 8)]),
    (8, 16, [(8, 8)] * 2, [(4, 16)] * 2),       # rows cut in halves so that both fold: A staged a k a cycle
    (6, 8, [(6, 8)], [(6, 8)]),                 # not wider than the array: as before
])
def test_compiler_emits_wide_tiles(m, n, plain, folded):
    """An m x 16 by 16 x n matmul: on the folding chip its tiles are up to 16 wide and at most 4 rows high when
    the matmul is wider than the array, elsewhere 8 by 8; the readback is the same integers, in fewer cycles
    (or the same program when nothing folds)."""
    from compiler import Graph, compile_graph, ext_image, readback
    rng = random.Random(m * n)
    g = Graph()
    x = g.input("x", (m, 16))
    w = g.weight("w", [[rng.uniform(-1, 1) for _ in range(n)] for _ in range(16)])
    g.output(g.matmul(x, w), "y")
    inputs = {"x": [[rng.uniform(-1, 1) for _ in range(16)] for _ in range(m)]}
    got = {}
    for cfg in (BCAST, FOLD):
        prog = compile_graph(g, [inputs], config=cfg)
        mms = [isa.operands(w, cfg) for w in prog.code if isa.operands(w)["op"] == Op.MM]
        run = ReferenceMachine(config=cfg).run(prog.code, ext_image(prog, inputs), 8)
        assert run.counters == prog.counters()
        got[cfg.mm_fold] = ([(o["M"], o["N"]) for o in mms], readback(prog, run.ext)["y"][0], run.counters[0])
    assert got[0][0] == plain and got[1][0] == folded
    assert got[1][1] == got[0][1]
    assert got[1][2] < got[0][2] if folded != plain else got[1][2] == got[0][2]


def test_rows_are_halved_only_when_the_cycle_model_says_so():
    """With an unpacked B the wide tiles stage four words a k: two M = 4, N = 16 tiles would cost more than
    two M = 8, N = 8 ones, so an 8-row matmul keeps the array's rows; with a packed B it is halved."""
    from compiler import Graph, compile_graph
    unpacked = replace(FOLD, mm_pack=0, mm_pack_c=0)
    assert 2 * isa.mm_busy_cycles(4, 16, 16, unpacked, rq=1) > 2 * isa.mm_busy_cycles(8, 16, 8, unpacked, rq=1)
    assert 2 * isa.mm_busy_cycles(4, 16, 16, FOLD, pb=1, rq=1) < 2 * isa.mm_busy_cycles(8, 16, 8, FOLD, pb=1, rq=1)
    rng = random.Random(8)
    g = Graph()
    x = g.input("x", (8, 16))
    w = g.weight("w", [[rng.uniform(-1, 1) for _ in range(16)] for _ in range(16)])
    g.output(g.matmul(x, w), "y")
    inputs = {"x": [[rng.uniform(-1, 1) for _ in range(16)] for _ in range(8)]}
    shapes = {}
    for cfg in (unpacked, FOLD):
        prog = compile_graph(g, [inputs], config=cfg)
        shapes[cfg.mm_pack] = [(o["M"], o["N"]) for o in (isa.operands(w, cfg) for w in prog.code)
                               if o["op"] == Op.MM]
    assert shapes == {0: [(8, 8), (8, 8)], 1: [(4, 16), (4, 16)]}


def test_served_tokens_and_logits_are_those_without_the_fold():
    """A resident serving run: every request's tokens, integer logits, preemptions and prefix hits on the
    folding chip are the broadcast chip's, in fewer cycles."""
    from host import tiny_lm as T
    from tests.servingutil import serve_on_chips
    plain, folded = serve_on_chips(T.make_model("structured", 1), BCAST, FOLD)
    assert folded < plain
