"""The compiler against the book: the instruction lists of model spec 6.3/6.4, the per-step cycle
totals and counters of 6.2, the external layout of 4.7, and the compile errors of 4.1-4.9.

The two tables below are transcribed from the specification (the independent source): one row per
instruction, ``op | len | M,K,N | operands | role | cycles``.
"""
import math

import pytest

import compiler as C
from compiler.buffers import Allocator
from hdl import isa
from hdl.isa import Op
from host.calibrate import calibrate
from host.tiny_lm import build_graph, make_model

TABLE_N1 = """
LD | 16 | - | spad dst=0, ext src=0 | load x | 27
LD | 256 | - | spad dst=16, ext src=16 | load Wq | 267
MM | - | 1,16,4 | dst=288 A=0 B=16 tb=0 lda=16 ldb=16 ldc=16 | node 2 tile j0=0 | 112
MM | - | 1,16,4 | dst=292 A=0 B=20 tb=0 lda=16 ldb=16 ldc=16 | node 2 tile j0=4 | 112
MM | - | 1,16,4 | dst=296 A=0 B=24 tb=0 lda=16 ldb=16 ldc=16 | node 2 tile j0=8 | 112
MM | - | 1,16,4 | dst=300 A=0 B=28 tb=0 lda=16 ldb=16 ldc=16 | node 2 tile j0=12 | 112
RQ | 16 | - | dst=272 src=288 m=13778635 s=33 relu=0 | node 2 requant | 20
LD | 256 | - | spad dst=16, ext src=272 | load Wk | 267
MM | - | 1,16,4 | dst=304 A=0 B=16 tb=0 lda=16 ldb=16 ldc=16 | node 4 tile j0=0 | 112
MM | - | 1,16,4 | dst=308 A=0 B=20 tb=0 lda=16 ldb=16 ldc=16 | node 4 tile j0=4 | 112
MM | - | 1,16,4 | dst=312 A=0 B=24 tb=0 lda=16 ldb=16 ldc=16 | node 4 tile j0=8 | 112
MM | - | 1,16,4 | dst=316 A=0 B=28 tb=0 lda=16 ldb=16 ldc=16 | node 4 tile j0=12 | 112
RQ | 16 | - | dst=288 src=304 m=15008041 s=33 relu=0 | node 4 requant | 20
LD | 256 | - | spad dst=16, ext src=528 | load Wv | 267
MM | - | 1,16,4 | dst=320 A=0 B=16 tb=0 lda=16 ldb=16 ldc=16 | node 6 tile j0=0 | 112
MM | - | 1,16,4 | dst=324 A=0 B=20 tb=0 lda=16 ldb=16 ldc=16 | node 6 tile j0=4 | 112
MM | - | 1,16,4 | dst=328 A=0 B=24 tb=0 lda=16 ldb=16 ldc=16 | node 6 tile j0=8 | 112
MM | - | 1,16,4 | dst=332 A=0 B=28 tb=0 lda=16 ldb=16 ldc=16 | node 6 tile j0=12 | 112
RQ | 16 | - | dst=304 src=320 m=13260784 s=33 relu=0 | node 6 requant | 20
MM | - | 1,16,1 | dst=17 A=272 B=288 tb=1 lda=16 ldb=16 ldc=1 | node 7 tile j0=0 | 58
RQ | 1 | - | dst=16 src=17 m=9869761 s=38 relu=0 | node 7 requant | 5
SM | 1 | - | dst=18 src=16 | node 8 softmax row 0 | 52
RQ | 1 | - | dst=17 src=18 m=16646144 s=33 relu=0 | node 8 Q0.16->int8 | 5
MM | - | 1,1,4 | dst=34 A=17 B=304 tb=0 lda=1 ldb=16 ldc=16 | node 9 tile j0=0 | 22
MM | - | 1,1,4 | dst=38 A=17 B=308 tb=0 lda=1 ldb=16 ldc=16 | node 9 tile j0=4 | 22
MM | - | 1,1,4 | dst=42 A=17 B=312 tb=0 lda=1 ldb=16 ldc=16 | node 9 tile j0=8 | 22
MM | - | 1,1,4 | dst=46 A=17 B=316 tb=0 lda=1 ldb=16 ldc=16 | node 9 tile j0=12 | 22
RQ | 16 | - | dst=18 src=34 m=8454660 s=30 relu=0 | node 9 requant | 20
LD | 256 | - | spad dst=320, ext src=784 | load Wo | 267
MM | - | 1,16,4 | dst=50 A=18 B=320 tb=0 lda=16 ldb=16 ldc=16 | node 11 tile j0=0 | 112
MM | - | 1,16,4 | dst=54 A=18 B=324 tb=0 lda=16 ldb=16 ldc=16 | node 11 tile j0=4 | 112
MM | - | 1,16,4 | dst=58 A=18 B=328 tb=0 lda=16 ldb=16 ldc=16 | node 11 tile j0=8 | 112
MM | - | 1,16,4 | dst=62 A=18 B=332 tb=0 lda=16 ldb=16 ldc=16 | node 11 tile j0=12 | 112
RQ | 16 | - | dst=34 src=50 m=14692252 s=31 relu=0 | node 11 requant | 20
RQ | 16 | - | dst=16 src=0 m=10808373 s=24 relu=0 | node 12 rescale operand 0 (node 0) | 20
RQ | 16 | - | dst=50 src=34 m=13229349 s=25 relu=0 | node 12 rescale operand 1 (node 11) | 20
VADD | 16 | - | dst=66 src1=16 src2=50 | node 12 add | 36
LD | 512 | - | spad dst=320, ext src=1040 | load W1 | 523
MM | - | 1,16,4 | dst=32 A=66 B=320 tb=0 lda=16 ldb=32 ldc=32 | node 14 tile j0=0 | 112
MM | - | 1,16,4 | dst=36 A=66 B=324 tb=0 lda=16 ldb=32 ldc=32 | node 14 tile j0=4 | 112
MM | - | 1,16,4 | dst=40 A=66 B=328 tb=0 lda=16 ldb=32 ldc=32 | node 14 tile j0=8 | 112
MM | - | 1,16,4 | dst=44 A=66 B=332 tb=0 lda=16 ldb=32 ldc=32 | node 14 tile j0=12 | 112
MM | - | 1,16,4 | dst=48 A=66 B=336 tb=0 lda=16 ldb=32 ldc=32 | node 14 tile j0=16 | 112
MM | - | 1,16,4 | dst=52 A=66 B=340 tb=0 lda=16 ldb=32 ldc=32 | node 14 tile j0=20 | 112
MM | - | 1,16,4 | dst=56 A=66 B=344 tb=0 lda=16 ldb=32 ldc=32 | node 14 tile j0=24 | 112
MM | - | 1,16,4 | dst=60 A=66 B=348 tb=0 lda=16 ldb=32 ldc=32 | node 14 tile j0=28 | 112
RQ | 32 | - | dst=0 src=32 m=12075419 s=32 relu=1 | node 14 requant | 36
LD | 512 | - | spad dst=320, ext src=1552 | load W2 | 523
MM | - | 1,32,4 | dst=48 A=0 B=320 tb=0 lda=32 ldb=16 ldc=16 | node 17 tile j0=0 | 208
MM | - | 1,32,4 | dst=52 A=0 B=324 tb=0 lda=32 ldb=16 ldc=16 | node 17 tile j0=4 | 208
MM | - | 1,32,4 | dst=56 A=0 B=328 tb=0 lda=32 ldb=16 ldc=16 | node 17 tile j0=8 | 208
MM | - | 1,32,4 | dst=60 A=0 B=332 tb=0 lda=32 ldb=16 ldc=16 | node 17 tile j0=12 | 208
RQ | 16 | - | dst=32 src=48 m=14802695 s=31 relu=0 | node 17 requant | 20
RQ | 16 | - | dst=0 src=66 m=16002490 s=24 relu=0 | node 18 rescale operand 0 (node 12) | 20
RQ | 16 | - | dst=16 src=32 m=9145906 s=25 relu=0 | node 18 rescale operand 1 (node 17) | 20
VADD | 16 | - | dst=48 src1=0 src2=16 | node 18 add | 36
LD | 256 | - | spad dst=320, ext src=2064 | load Wout | 267
MM | - | 1,16,4 | dst=16 A=48 B=320 tb=0 lda=16 ldb=16 ldc=16 | node 20 tile j0=0 | 112
MM | - | 1,16,4 | dst=20 A=48 B=324 tb=0 lda=16 ldb=16 ldc=16 | node 20 tile j0=4 | 112
MM | - | 1,16,4 | dst=24 A=48 B=328 tb=0 lda=16 ldb=16 ldc=16 | node 20 tile j0=8 | 112
MM | - | 1,16,4 | dst=28 A=48 B=332 tb=0 lda=16 ldb=16 ldc=16 | node 20 tile j0=12 | 112
RQ | 16 | - | dst=0 src=16 m=12127921 s=34 relu=0 | node 20 requant | 20
AMAX | 16 | - | dst=16 src=0 | node 21 argmax row 0 | 21
ST | 1 | - | spad src=16, ext dst=2320 | store tok | 5
ST | 16 | - | spad src=0, ext dst=2321 | store logits | 20
ST | 16 | - | spad src=288, ext dst=2337 | store k_new | 20
ST | 16 | - | spad src=304, ext dst=2353 | store v_new | 20
HALT | - | - |  |  | 2
"""

TABLE_N2 = """
LD | 16 | - | spad dst=0, ext src=0 | load x | 27
LD | 256 | - | spad dst=16, ext src=16 | load Wq | 267
MM | - | 1,16,4 | dst=288 A=0 B=16 tb=0 lda=16 ldb=16 ldc=16 | node 2 tile j0=0 | 112
MM | - | 1,16,4 | dst=292 A=0 B=20 tb=0 lda=16 ldb=16 ldc=16 | node 2 tile j0=4 | 112
MM | - | 1,16,4 | dst=296 A=0 B=24 tb=0 lda=16 ldb=16 ldc=16 | node 2 tile j0=8 | 112
MM | - | 1,16,4 | dst=300 A=0 B=28 tb=0 lda=16 ldb=16 ldc=16 | node 2 tile j0=12 | 112
RQ | 16 | - | dst=272 src=288 m=13778635 s=33 relu=0 | node 2 requant | 20
LD | 256 | - | spad dst=16, ext src=272 | load Wk | 267
MM | - | 1,16,4 | dst=320 A=0 B=16 tb=0 lda=16 ldb=16 ldc=16 | node 4 tile j0=0 | 112
MM | - | 1,16,4 | dst=324 A=0 B=20 tb=0 lda=16 ldb=16 ldc=16 | node 4 tile j0=4 | 112
MM | - | 1,16,4 | dst=328 A=0 B=24 tb=0 lda=16 ldb=16 ldc=16 | node 4 tile j0=8 | 112
MM | - | 1,16,4 | dst=332 A=0 B=28 tb=0 lda=16 ldb=16 ldc=16 | node 4 tile j0=12 | 112
RQ | 16 | - | dst=304 src=320 m=15008041 s=33 relu=0 | node 4 requant | 20
LD | 256 | - | spad dst=16, ext src=528 | load Wv | 267
MM | - | 1,16,4 | dst=352 A=0 B=16 tb=0 lda=16 ldb=16 ldc=16 | node 6 tile j0=0 | 112
MM | - | 1,16,4 | dst=356 A=0 B=20 tb=0 lda=16 ldb=16 ldc=16 | node 6 tile j0=4 | 112
MM | - | 1,16,4 | dst=360 A=0 B=24 tb=0 lda=16 ldb=16 ldc=16 | node 6 tile j0=8 | 112
MM | - | 1,16,4 | dst=364 A=0 B=28 tb=0 lda=16 ldb=16 ldc=16 | node 6 tile j0=12 | 112
RQ | 16 | - | dst=336 src=352 m=13260784 s=33 relu=0 | node 6 requant | 20
LD | 16 | - | spad dst=288, ext src=784 | load kc | 27
LD | 16 | - | spad dst=320, ext src=800 | load vc | 27
MM | - | 1,16,2 | dst=18 A=272 B=288 tb=1 lda=16 ldb=16 ldc=2 | node 11 tile j0=0 | 76
RQ | 2 | - | dst=16 src=18 m=9869761 s=38 relu=0 | node 11 requant | 6
SM | 2 | - | dst=20 src=16 | node 12 softmax row 0 | 55
RQ | 2 | - | dst=18 src=20 m=16646144 s=33 relu=0 | node 12 Q0.16->int8 | 6
MM | - | 1,2,4 | dst=36 A=18 B=320 tb=0 lda=2 ldb=16 ldc=16 | node 13 tile j0=0 | 28
MM | - | 1,2,4 | dst=40 A=18 B=324 tb=0 lda=2 ldb=16 ldc=16 | node 13 tile j0=4 | 28
MM | - | 1,2,4 | dst=44 A=18 B=328 tb=0 lda=2 ldb=16 ldc=16 | node 13 tile j0=8 | 28
MM | - | 1,2,4 | dst=48 A=18 B=332 tb=0 lda=2 ldb=16 ldc=16 | node 13 tile j0=12 | 28
RQ | 16 | - | dst=20 src=36 m=12999639 s=30 relu=0 | node 13 requant | 20
LD | 256 | - | spad dst=352, ext src=816 | load Wo | 267
MM | - | 1,16,4 | dst=52 A=20 B=352 tb=0 lda=16 ldb=16 ldc=16 | node 15 tile j0=0 | 112
MM | - | 1,16,4 | dst=56 A=20 B=356 tb=0 lda=16 ldb=16 ldc=16 | node 15 tile j0=4 | 112
MM | - | 1,16,4 | dst=60 A=20 B=360 tb=0 lda=16 ldb=16 ldc=16 | node 15 tile j0=8 | 112
MM | - | 1,16,4 | dst=64 A=20 B=364 tb=0 lda=16 ldb=16 ldc=16 | node 15 tile j0=12 | 112
RQ | 16 | - | dst=36 src=52 m=11786936 s=31 relu=0 | node 15 requant | 20
RQ | 16 | - | dst=16 src=0 m=11885904 s=24 relu=0 | node 16 rescale operand 0 (node 0) | 20
RQ | 16 | - | dst=52 src=36 m=11794042 s=25 relu=0 | node 16 rescale operand 1 (node 15) | 20
VADD | 16 | - | dst=68 src1=16 src2=52 | node 16 add | 36
LD | 512 | - | spad dst=352, ext src=1072 | load W1 | 523
MM | - | 1,16,4 | dst=32 A=68 B=352 tb=0 lda=16 ldb=32 ldc=32 | node 18 tile j0=0 | 112
MM | - | 1,16,4 | dst=36 A=68 B=356 tb=0 lda=16 ldb=32 ldc=32 | node 18 tile j0=4 | 112
MM | - | 1,16,4 | dst=40 A=68 B=360 tb=0 lda=16 ldb=32 ldc=32 | node 18 tile j0=8 | 112
MM | - | 1,16,4 | dst=44 A=68 B=364 tb=0 lda=16 ldb=32 ldc=32 | node 18 tile j0=12 | 112
MM | - | 1,16,4 | dst=48 A=68 B=368 tb=0 lda=16 ldb=32 ldc=32 | node 18 tile j0=16 | 112
MM | - | 1,16,4 | dst=52 A=68 B=372 tb=0 lda=16 ldb=32 ldc=32 | node 18 tile j0=20 | 112
MM | - | 1,16,4 | dst=56 A=68 B=376 tb=0 lda=16 ldb=32 ldc=32 | node 18 tile j0=24 | 112
MM | - | 1,16,4 | dst=60 A=68 B=380 tb=0 lda=16 ldb=32 ldc=32 | node 18 tile j0=28 | 112
RQ | 32 | - | dst=0 src=32 m=11538451 s=32 relu=1 | node 18 requant | 36
LD | 512 | - | spad dst=352, ext src=1584 | load W2 | 523
MM | - | 1,32,4 | dst=48 A=0 B=352 tb=0 lda=32 ldb=16 ldc=16 | node 21 tile j0=0 | 208
MM | - | 1,32,4 | dst=52 A=0 B=356 tb=0 lda=32 ldb=16 ldc=16 | node 21 tile j0=4 | 208
MM | - | 1,32,4 | dst=56 A=0 B=360 tb=0 lda=32 ldb=16 ldc=16 | node 21 tile j0=8 | 208
MM | - | 1,32,4 | dst=60 A=0 B=364 tb=0 lda=32 ldb=16 ldc=16 | node 21 tile j0=12 | 208
RQ | 16 | - | dst=32 src=48 m=13991109 s=31 relu=0 | node 21 requant | 20
RQ | 16 | - | dst=0 src=68 m=15429662 s=24 relu=0 | node 22 rescale operand 0 (node 16) | 20
RQ | 16 | - | dst=16 src=32 m=9764252 s=25 relu=0 | node 22 rescale operand 1 (node 21) | 20
VADD | 16 | - | dst=48 src1=0 src2=16 | node 22 add | 36
LD | 256 | - | spad dst=352, ext src=2096 | load Wout | 267
MM | - | 1,16,4 | dst=16 A=48 B=352 tb=0 lda=16 ldb=16 ldc=16 | node 24 tile j0=0 | 112
MM | - | 1,16,4 | dst=20 A=48 B=356 tb=0 lda=16 ldb=16 ldc=16 | node 24 tile j0=4 | 112
MM | - | 1,16,4 | dst=24 A=48 B=360 tb=0 lda=16 ldb=16 ldc=16 | node 24 tile j0=8 | 112
MM | - | 1,16,4 | dst=28 A=48 B=364 tb=0 lda=16 ldb=16 ldc=16 | node 24 tile j0=12 | 112
RQ | 16 | - | dst=0 src=16 m=11385076 s=34 relu=0 | node 24 requant | 20
AMAX | 16 | - | dst=16 src=0 | node 25 argmax row 0 | 21
ST | 1 | - | spad src=16, ext dst=2352 | store tok | 5
ST | 16 | - | spad src=0, ext dst=2353 | store logits | 20
ST | 16 | - | spad src=304, ext dst=2369 | store k_new | 20
ST | 16 | - | spad src=336, ext dst=2385 | store v_new | 20
HALT | - | - |  |  | 2
"""

# model spec 6.2: cycles per decode step for context n = 1..32
STEP_TOTALS = [7000, 7101, 7180, 7259, 7378, 7457, 7536, 7615, 7734, 7813, 7892, 7971, 8090, 8169, 8248,
               8327, 8446, 8525, 8604, 8683, 8802, 8881, 8960, 9039, 9158, 9237, 9316, 9395, 9514, 9593,
               9672, 9751]
# [total, MM, DMA, vector, instructions excl. HALT]
COUNTERS = {1: [7000, 4040, 2449, 375, 67], 2: [7101, 4082, 2499, 380, 69], 8: [7615, 4372, 2691, 410, 70],
            24: [9039, 5196, 3203, 490, 74], 32: [9751, 5608, 3459, 530, 76]}


def parse_table(text):
    """Rows of a spec table as (op, expected hardware operands, role, cycles)."""
    rows = []
    for line in text.strip().splitlines():
        op, ln, mkn, params, role, cyc = [c.strip() for c in line.split("|")]
        exp = {"op": int(Op[op])}
        if ln != "-":
            exp["len"] = int(ln)
        if mkn != "-":
            exp["M"], exp["K"], exp["N"] = (int(v) for v in mkn.split(","))
        for tok in params.replace("spad ", "").replace("ext ", "").replace(",", " ").split():
            key, val = tok.split("=")
            exp[key] = int(val)
        rows.append((op, exp, role, int(cyc)))
    return rows


@pytest.fixture(scope="module")
def structured():
    m = make_model("structured")
    calib, ranges = calibrate(m, 32, None)
    progs = {n: C.compile_graph(build_graph(m, n), calib[n], ranges=ranges) for n in range(1, 33)}
    return m, calib, ranges, progs


@pytest.mark.parametrize("n, table, hwm", [(1, TABLE_N1, 832), (2, TABLE_N2, 864)], ids=["n1", "n2"])
def test_program_equals_spec_table(structured, n, table, hwm):
    P = structured[3][n]
    rows = parse_table(table)
    assert len(P.code) == len(rows)
    cycles = P.cycles()
    for i, (word, (op, exp, role, cyc)) in enumerate(zip(P.code, rows)):
        got = isa.operands(word)
        for key, val in exp.items():
            assert got[key] == val, f"instruction {i} ({op}): {key} = {got[key]}, table says {val}"
        assert 2 + isa.busy_cycles(word) == cyc == cycles[i], f"instruction {i} cycles"
        if role:
            assert P.notes[i] == role, f"instruction {i} role"
    assert P.hwm == hwm
    assert sum(cycles) == STEP_TOTALS[n - 1]


def test_step_totals_n_1_to_32(structured):
    progs = structured[3]
    assert [sum(2 + isa.busy_cycles(w) for w in progs[n].code) for n in range(1, 33)] == STEP_TOTALS
    # the closed form of 6.2 agrees with the list (a check of the transcription)
    assert all(STEP_TOTALS[n - 1] == 6903 + 79 * n + 40 * math.ceil(n / 4) for n in range(2, 33))


def classify(code):
    """Counters from busy cycles by opcode: MM -> mm, LD/ST -> dma, the rest -> vector."""
    tot = mm = dma = vec = 0
    for w in code:
        op, b = isa.operands(w)["op"], isa.busy_cycles(w)
        tot += 2 + b
        if op == Op.MM:
            mm += b
        elif op in (Op.LD, Op.ST):
            dma += b
        else:
            vec += b
    return [tot, mm, dma, vec, len(code) - 1]


@pytest.mark.parametrize("n", sorted(COUNTERS))
def test_counters(structured, n):
    P = structured[3][n]
    assert classify(P.code) == COUNTERS[n]
    assert P.counters() == COUNTERS[n]


def test_add_rescales_counted_from_scales(structured):
    # every decode program has both operands of both adds at a scale other than the sum's (spec 4.9)
    for n, P in structured[3].items():
        rescales = [k for k in P.rq_params if isinstance(k, tuple)]
        emitted = [note for note in P.notes if "rescale" in note]
        assert len(rescales) == len(emitted) == 4, n
        for add_id, j in rescales:
            src = P.graph.nodes[add_id].ins[j]
            assert abs(P.scales[src] / P.scales[add_id] - 1) >= 1e-9


def test_no_rescale_when_scales_match():
    g = C.Graph()
    a = g.tag(g.input("a", (1, 4)), "t")
    b = g.tag(g.input("b", (1, 4)), "t")
    s = g.tag(g.add(a, b), "t")
    g.output(s, "s")
    P = C.compile_graph(g, [{"a": [[0.1, 0.2, 0.3, 0.4]], "b": [[0.4, 0.3, 0.2, 0.1]]}], ranges={"t": 1.0})
    ops = [isa.operands(w)["op"] for w in P.code]
    assert ops == [Op.LD, Op.LD, Op.VADD, Op.ST, Op.HALT]
    assert not [k for k in P.rq_params if isinstance(k, tuple)]
    # the sum of two operands at 0.5 has range 1.0, so both operands are rescaled to it
    g2 = C.Graph()
    a = g2.tag(g2.input("a", (1, 4)), "t")
    b = g2.tag(g2.input("b", (1, 4)), "t")
    g2.output(g2.add(a, b), "s")
    P2 = C.compile_graph(g2, [{"a": [[0.5] * 4], "b": [[0.5] * 4]}], ranges={"t": 0.5})
    assert sorted(k for k in P2.rq_params if isinstance(k, tuple)) == [(2, 0), (2, 1)]


def test_external_layout(structured):
    P1, P2, P24 = (structured[3][n] for n in (1, 2, 24))
    want1 = {"x": 0, "Wq": 16, "Wk": 272, "Wv": 528, "Wo": 784, "W1": 1040, "W2": 1552, "Wout": 2064,
             "tok": 2320, "logits": 2321, "k_new": 2337, "v_new": 2353}
    assert {k: e.address for k, e in P1.ext_map.items()} == want1
    assert list(P1.ext_map) == list(want1)
    assert P1.ext_words == 2369 and P2.ext_words == 2401 and P24.ext_words == 3105
    assert P24.ext_map["kc"].address == 784 and P24.ext_map["vc"].address == 784 + 16 * 23
    assert [e.kind for e in P2.ext_map.values()] == ["input", "weight", "weight", "weight", "input", "input"] + \
        ["weight"] * 4 + ["output"] * 4


def test_scale_groups(structured):
    _, _, ranges, progs = structured
    P = progs[2]
    sc = P.scales
    # node ids of the L > 1 column of spec 1.6
    assert sc[0] == ranges["x"] / 127
    assert sc[4] == sc[7] == sc[8] == sc[28] == ranges["k"] / 127
    assert sc[6] == sc[9] == sc[10] == sc[29] == ranges["v"] / 127
    assert sc[11] == 1 / 16 and sc[12] == 1 / 127
    assert sc[18] == sc[19] and sc[24] == sc[27]
    assert sc[25] is None
    assert P.relu_fused == {18}


# ---- the allocator (spec 4.8) ----

def test_allocator_first_fit_and_coalescing():
    a = Allocator(100)
    assert [a.alloc(10), a.alloc(20), a.alloc(30)] == [0, 10, 30]
    a.release(10, 20)
    assert a.alloc(5) == 10            # first extent that fits
    a.release(0, 10)
    a.release(15, 15)
    assert a.free == [(0, 10), (15, 15), (60, 40)]   # 10..14 is still taken
    a.release(10, 5)
    assert a.free == [(0, 30), (60, 40)]             # neighbours merged
    a.release(30, 30)
    assert a.free == [(0, 100)]
    assert a.hwm == 60
    with pytest.raises(C.CompileError, match="needs 101 words"):
        a.alloc(101)


def test_reuse_off_keeps_every_buffer(structured):
    m, calib, ranges, progs = structured
    P = C.compile_graph(build_graph(m, 3), calib[3], ranges=ranges, reuse=False)
    total = sum(b.words for b in P.buffers)
    assert P.hwm >= total > progs[3].hwm
    assert sum(P.cycles()) == STEP_TOTALS[2]


# ---- compile errors name the node and the shapes ----

def test_shape_errors():
    g = C.Graph()
    x = g.input("x", (1, 16))
    w = g.weight("W", [[0.0] * 8 for _ in range(12)])
    with pytest.raises(C.CompileError, match=r"node 2 \(matmul\).*1x16.*12x8"):
        g.matmul(x, w)
    w2 = g.weight("W2", [[0.0] * 16 for _ in range(16)])
    y = g.matmul(x, w2)
    z = g.input("z", (2, 16))
    with pytest.raises(C.CompileError, match=r"node 5 \(add\): shapes differ.*1x16.*2x16"):
        g.add(y, z)
    with pytest.raises(C.CompileError, match=r"concat.*column counts differ.*1x16.*12x8"):
        g.concat_rows(x, w)
    with pytest.raises(C.CompileError, match="bits = 5"):
        g.weight("W3", [[1.0]], bits=5)
    with pytest.raises(C.CompileError, match="shape"):
        g.input("q", (0, 3))
    with pytest.raises(C.CompileError, match="outside"):
        g.slice_rows(z, 1, 2)
    with pytest.raises(C.CompileError, match="not a node"):
        g.relu(99)


def _two_layer(k_inner=16):
    g = C.Graph()
    x = g.input("x", (1, k_inner))
    u = g.matmul(x, g.weight("W", [[0.1] * 4 for _ in range(k_inner)]))
    return g, x, u


def test_compile_errors():
    g, x, u = _two_layer()
    g.relu(u)
    g.output(u, "u")                    # a second consumer of the relu's matmul
    with pytest.raises(C.CompileError, match=r"relu.*node 2 \(matmul.*2 consumer"):
        C.compile_graph(g, [{"x": [[0.5] * 16]}])
    g, x, u = _two_layer()
    r = g.relu(x)
    g.output(r, "r")
    with pytest.raises(C.CompileError, match=r"relu must follow a matmul.*node 0 \(input"):
        C.compile_graph(g, [{"x": [[0.5] * 16]}])
    g, x, u = _two_layer(65)
    g.output(u, "u")
    with pytest.raises(C.CompileError, match=r"inner dimension 65.*1x65"):
        C.compile_graph(g, [{"x": [[0.5] * 65]}])
    g, x, u = _two_layer()
    g.output(u, "u")
    with pytest.raises(C.CompileError, match="needs 84 words, the chip has 80"):
        C.compile_graph(g, [{"x": [[0.5] * 16]}], ext_words=80)
    with pytest.raises(C.CompileError, match="no calibration samples"):
        C.compile_graph(g, [])
    with pytest.raises(C.CompileError, match="calibration sample 0 is int 1, not a dict"):
        C.compile_graph(g, {1: [{"x": [[0.5] * 16]}]})
    with pytest.raises(C.CompileError, match=r"input 'x': expected shape 1x16, got 1x3"):
        C.compile_graph(g, [{"x": [[0.5] * 3]}])
    g2 = C.Graph()
    big = g2.input("big", (64, 64))
    g2.output(g2.add(big, big), "s")
    with pytest.raises(C.CompileError, match="scratchpad full"):
        C.compile_graph(g2, [{"big": [[1.0] * 64] * 64}])


def test_image_errors(structured):
    m, calib, ranges, progs = structured
    P = progs[2]
    with pytest.raises(C.CompileError, match=r"input 'kc' is missing"):
        C.ext_image(P, {"x": [m["E"][0]], "vc": [[0.0] * 16]})
    with pytest.raises(C.CompileError, match=r"input 'vc': expected shape 1x16, got 2x16"):
        C.ext_image(P, {"x": [m["E"][0]], "kc": [[0.0] * 16], "vc": [[0.0] * 16] * 2})


def test_image_quantizes_at_node_scales(structured):
    m, calib, ranges, progs = structured
    P = progs[2]
    s = calib[2][5]
    img = C.ext_image(P, s)
    assert len(img) == 8192
    e = P.ext_map["kc"]
    from hdl.arith import quantize
    want = [quantize(v, ranges["k"] / 127) & 0xFFFFFFFF for v in s["kc"][0]]
    assert img[e.address:e.address + 16] == want
    assert img[P.ext_map["tok"].address:] == [0] * (8192 - P.ext_map["tok"].address)


@pytest.mark.parametrize("kind, seed", [("structured", None), ("random", 2)])
def test_stage_check_within_one_level(kind, seed):
    # every tensor against the real result of its operation on its dequantized inputs (spec 4.13)
    m = make_model(kind, seed)
    calib, ranges = calibrate(m, 8, starts=range(0, 16, 3))
    for n in (1, 3, 8):
        P = C.compile_graph(build_graph(m, n), calib[n], ranges=ranges)
        for sample in calib[n]:
            assert C.stage_check(P, sample) == []


@pytest.mark.parametrize("W, total", [(None, 268346), (8, 241286), (4, 231792)])
def test_decode_totals_with_window(structured, W, total):
    # spec 6.1: 32 decode steps; with a window, step L runs the program of context min(L, W),
    # compiled from the windowed calibration (5.3)
    m = structured[0]
    if W is None:
        progs = structured[3]
    else:
        calib, ranges = calibrate(m, 32, W)
        progs = {n: C.compile_graph(build_graph(m, n), calib[n], ranges=ranges) for n in sorted(calib)}
    assert len(progs) == (W or 32)
    assert sum(sum(progs[min(L, W or L)].cycles()) for L in range(1, 33)) == total


# ---- one scale per scale group (issue 10) ----

def test_4bit_weight_group_shares_one_scale():
    # a slice, a concat and an output read the 4-bit weight's words: all of them use its range / 7
    g = C.Graph()
    w = g.weight("W", [[0.5, -0.7], [0.2, 0.1]], bits=4)
    s = g.slice_rows(w, 1, 1)
    z = g.input("z", (1, 2))
    c = g.concat_rows(w, z)
    o = g.output(s, "s")
    g.output(c, "c")
    P = C.compile_graph(g, [{"z": [[1.4, 0.0]]}])
    # the group's range is z's 1.4, so the weight's nibbles use 0.2 a level
    assert P.scales[w] == P.scales[s] == P.scales[z] == P.scales[c] == P.scales[o] == 1.4 / 7
    # the weight shares the concat's buffer: unpacked aside, then copied by an RQ of multiplier 1
    assert [n for n in P.notes if n.startswith(("unpack", "copy"))] == ["unpack W aside",
                                                                        "copy W into its shared buffer"]


def test_pinned_groups_refuse_a_second_scale():
    g = C.Graph()
    x = g.input("x", (1, 4))
    s1 = g.softmax(x)
    g.output(g.softmax(s1), "p")        # s1 would be both a result at 1/127 and scores at 1/16
    with pytest.raises(C.CompileError, match=r"node 2 \(softmax.*its input node 1 \(softmax.*1/127.*Q4\.4"):
        C.compile_graph(g, [{"x": [[0.1, 0.2, 0.3, 0.4]]}])
    g = C.Graph()
    x = g.input("x", (1, 4))
    w = g.weight("W", [[0.1, 0.2, 0.3, 0.4]], bits=4)
    g.output(g.softmax(g.concat_rows(x, w)), "p")
    with pytest.raises(C.CompileError, match=r"node 1 \(weight 'W'.*4-bit weight.*node 3 \(softmax.*Q4\.4"):
        C.compile_graph(g, [{"x": [[0.1, 0.2, 0.3, 0.4]]}])


def test_tiles_follow_the_configured_array(structured):
    # the same graph for an 8x8 array: tiles up to 8 wide, the same RQ/SM/VADD/LD/ST instructions, and a
    # cycle prediction from that chip's model
    from hdl.config import BOOK, parse_chip
    m, calib, ranges, progs = structured
    cfg = parse_chip("array=8")
    for n in (1, 5, 24):
        book, wide = progs[n], C.compile_graph(build_graph(m, n), calib[n], ranges=ranges, config=cfg)
        assert wide.config == cfg and book.config == BOOK
        mn = [(isa.operands(w)["M"], isa.operands(w)["N"]) for w in wide.code if isa.operands(w)["op"] == Op.MM]
        assert max(max(t) for t in mn) == 8 and all(max(t) <= 8 for t in mn)
        others = lambda P: [w for w in P.code if isa.operands(w)["op"] != Op.MM]       # noqa: E731
        assert others(wide) == others(book)
        assert wide.counters() == [sum(2 + isa.busy_cycles(w, 8, cfg) for w in wide.code),
                                   sum(isa.busy_cycles(w, 8, cfg) for w in wide.code if isa.operands(w)["op"] == Op.MM),
                                   book.counters()[2], book.counters()[3], len(wide.code) - 1]
    with pytest.raises(C.CompileError, match="exceeds the matrix unit's 16"):
        C.compile_graph(build_graph(m, 17), calib[17], ranges=ranges, config=parse_chip("row_depth=16"))
    with pytest.raises(C.CompileError, match=r"scratchpad full: .* \(of 256\)"):
        C.compile_graph(build_graph(m, 1), calib[1], ranges=ranges, config=parse_chip("spad_depth=256"))
