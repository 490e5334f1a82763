"""The broadcast array (docs/mm-bcast.md): ``mm_bcast`` feeds each A element to its whole row of PEs at once
and B unskewed, so a row of C is final in one cycle and the drain's first write does not wait for the last
column. The configuration's messages, the cycle formula against the schedule's constraints, the array and
the MM unit in pysim against the reference machine, and a program on the Amaranth chip."""
import random
from dataclasses import replace

import pytest
from amaranth.sim import Simulator

from hdl import isa
from hdl.config import BOOK, ChipConfig, ChipSpecError, parse_chip
from hdl.isa import Op
from hdl.systolic import SystolicArray
from sim.backends.reference import ReferenceMachine
from chipbench import FAST_PRE_LANES, fast_with
from test_spad_lanes import TINY, _cases, _run_unit, check_formula_is_the_schedule, check_write_cycles

BCAST4 = fast_with(mm_pack_c=1, spad_lanes=4, mm_bcast=1)
BCAST2 = fast_with(spad_lanes=2, mm_bcast=1)
# the candidate serving chip with its vector lanes; the book's 4x4 array; a 2x2 array with more lanes than columns
SERVE = fast_with(mm_pack_c=1, spad_lanes=4, vec_lanes=4, mm_bcast=1)
SMALL = replace(BOOK, mm_overlap=1, spad_lanes=2, mm_bcast=1)
TINYB = replace(TINY, mm_bcast=1)


# ---- configuration -------------------------------------------------------------------------------

def test_book_keeps_its_array():
    assert BOOK.mm_bcast == 0 and FAST_PRE_LANES.mm_bcast == 0
    assert BCAST4.mm_bcast == 1 and BCAST4.generated


@pytest.mark.parametrize("value", [2, -1, 7])
def test_bad_value_names_it(value):
    with pytest.raises(ValueError, match=f"mm_bcast must be 0 or 1, not {value}"):
        ChipConfig(mm_overlap=1, spad_lanes=2, mm_bcast=value)
    with pytest.raises(ChipSpecError, match=f"mm_bcast must be 0 or 1, not {value}"):
        parse_chip(f"fast,vec_lanes=1,spad_lanes=2,mm_bcast={value}")


def test_needs_drain_lanes():
    with pytest.raises(ChipSpecError, match="mm_bcast = 1 needs spad_lanes > 1.*not spad_lanes=1"):
        parse_chip("fast,vec_lanes=1,spad_lanes=1,mm_bcast=1")


# ---- the cycle formula ---------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [BCAST4, BCAST2, SERVE, SMALL, TINYB, fast_with(rq_pipe=0, spad_lanes=4, mm_bcast=1)],
                         ids=["bcast4", "bcast2", "serve", "small", "tiny", "nopipe"])
def test_formula_is_the_schedule(cfg):
    """hdl.isa.mm_busy_cycles against the schedule counted group by group with a row final at once."""
    check_formula_is_the_schedule(cfg)


def test_formula_examples():
    """docs/mm-bcast.md's serving shapes (packed B, rq): K = 16, N = 8 saves N - G = 6 cycles at any M."""
    lanes = fast_with(mm_pack_c=1, spad_lanes=4)
    got = [(isa.mm_busy_cycles(M, 16, 8, lanes, pb=1, rq=1), isa.mm_busy_cycles(M, 16, 8, BCAST4, pb=1, rq=1))
           for M in (1, 4, 8)]
    assert got == [(28, 22), (34, 28), (57, 51)]


def test_reference_takes_the_formula():
    """Same words on the broadcast chip as on the skewed one, MM's counter smaller by the formulas' difference."""
    lanes = fast_with(mm_pack_c=1, spad_lanes=4)
    rng = random.Random(5)
    spad = [rng.getrandbits(32) for _ in range(lanes.spad_depth)]
    prog = [isa.rqc(1 << 23, 20, 0), isa.mm(3000, 0, 1000, 4, 16, 8, ldb=2, pb=1, rq=1),
            isa.mm(3100, 0, 1000, 8, 9, 7, rq=1), isa.mm(3200, 7, 1000, 1, 5, 1), isa.halt()]
    runs = {c: ReferenceMachine(config=c).run(prog, [0] * 16, scratchpad=spad) for c in (lanes, BCAST4)}
    assert runs[lanes].scratchpad == runs[BCAST4].scratchpad
    assert runs[lanes].counters[1] - runs[BCAST4].counters[1] == \
        sum(isa.busy_cycles(w, 8, lanes) - isa.busy_cycles(w, 8, BCAST4) for w in prog) == 6 + 4 + 0
    # the second MM's B is two groups a k (N = 7 unpacked, four ports): one cycle of its N - G = 5 goes to
    # the later start; the third has one column (N - G = 0)


# ---- the array -----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 4])
def test_array_row_is_final_at_once(n):
    """Fed a_edge[i] = A[i][t-i] and b_edge[j] = B[t][j], PE(i,j) of a broadcast array holds
    sum_{k <= t-i} A[i][k] B[k][j] after edge t: every column of a row in the same cycle."""
    cfg = replace(BOOK, array=n, mm_overlap=1, spad_lanes=2, mm_bcast=1)
    rng = random.Random(n)
    K = 6
    A = [[rng.randint(-128, 127) for _ in range(K)] for _ in range(n)]
    B = [[rng.randint(-128, 127) for _ in range(n)] for _ in range(K)]
    dut = SystolicArray(config=cfg)

    async def bench(ctx):
        for t in range(K + n + 1):
            for i in range(n):
                ctx.set(dut.a_edge[i], A[i][t - i] if 0 <= t - i < K else 0)
                ctx.set(dut.b_edge[i], B[t][i] if t < K else 0)
            await ctx.tick()
            for i in range(n):
                for j in range(n):
                    want = sum(A[i][k] * B[k][j] for k in range(min(t - i + 1, K)))
                    assert ctx.get(dut.c[i * n + j]) == want, (t, i, j)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_array_has_no_a_pass_through():
    """The broadcast array's Verilog has the B and accumulator registers only: no A pass-through."""
    from amaranth.back import rtlil
    skewed = rtlil.convert(SystolicArray(config=replace(BOOK, mm_overlap=1, spad_lanes=2)))
    bcast = rtlil.convert(SystolicArray(config=replace(BOOK, mm_overlap=1, spad_lanes=2, mm_bcast=1)))
    assert "a_out" in skewed and "a_out" not in bcast and "b_out" in bcast


# ---- the MM unit ---------------------------------------------------------------------------------

UNIT_CHIPS = [BCAST4, BCAST2, SMALL, TINYB]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cfg", UNIT_CHIPS, ids=["bcast4", "bcast2", "small", "tiny"])
def test_unit_equals_reference_and_cycle_model(cfg):
    """The broadcast unit in pysim (the simulation-only checks on): the scratchpad is the reference
    machine's after each MM, and B is hdl.isa.busy_cycles."""
    rng = random.Random(cfg.key())
    cases = _cases(rng, cfg, 14)
    for _, ins in cases:
        isa.validate(ins, cfg=cfg)
    got = [b for b, _ in _run_unit(cfg, cases, seed=11)]
    assert got == [isa.busy_cycles(ins, 8, cfg) for _, ins in cases]


@pytest.mark.timeout(120)
def test_unit_write_cycles():
    """The drain's writes, stated outright, start N - G cycles earlier than on the skewed array."""
    check_write_cycles(BCAST4)


# ---- the chip ------------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_program_on_the_amaranth_chip_equals_the_reference():
    """MMs of several shapes, fused and packed, between the vector units' lanes on the candidate serving chip
    with the broadcast array: the Amaranth chip's scratchpad, external memory and counters are the reference's."""
    from chipbench import amaranth_chip_equals_reference
    prog = [isa.ld(0, 0, 1024), isa.ld(1024, 1024, 600), isa.rqc(11_534_336, 34, 0),
            isa.mm(3001, 0, 1024, 8, 16, 8, ldb=2, pb=1, rq=1),
            isa.mm(3102, 5, 1030, 3, 7, 7, lda=11, ldb=9, ldc=5),
            isa.vadd(3103, 3001, 3010, 20),
            isa.mm(3203, 0, 1024, 1, 16, 8, rq=1, pc=1, ldc=2, ldb=8),
            isa.rq(3300, 3203, 30, 11_534_336, 34, 0),
            isa.mm(1030, 1024, 1030, 8, 20, 8, pb=1, ldb=3, rq=1),      # over its own B operand
            isa.mm(1040, 1040, 1060, 5, 3, 3, lda=2, ldb=1),             # over its own A operand
            isa.st(3000, 1500, 500), isa.st(1024, 1000, 400), isa.halt()]
    amaranth_chip_equals_reference(SERVE, [isa.encode(i) for i in prog], 6, 1, (Op.MM, Op.RQC))
