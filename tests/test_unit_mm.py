"""MatrixUnit (hardware spec 4.7) against a plain-Python model of MM, cycle counts and port timing.

The scratchpad starts as random 32-bit words (so every operand has junk above bit 7); each instruction's
expected memory is the model's, applied to a Python mirror, and the whole scratchpad is compared.
"""
import random

import pytest

from hdl.arith import s8, s32, u32
from hdl.config import BOOK, ChipConfig
from hdl.isa import mm, mm_busy_cycles, operands
from hdl.units.mm import MatrixUnit
from tests.unitbench import SPAD_DEPTH, nonzero_words, simulate


def busy_time(M, K, N):
    # Hardware spec 4.7: LA M*K+2, LB K*N+2, PRE 1, RUN K+M+N-2, OUT M*N, FIN 1, done cycle 1.
    return (M * K + 2) + (K * N + 2) + 1 + (K + M + N - 2) + M * N + 1 + 1


def mm_model(mem, word):
    """The writes of one MM, in order, as a list of (address, unsigned word); `mem` is not changed."""
    o = operands(word)
    M, K, N, tb = o["M"], o["K"], o["N"], o["tb"]
    A = [[s8(mem[(o["A"] + r * o["lda"] + k) % SPAD_DEPTH]) for k in range(K)] for r in range(M)]
    if tb:
        B = [[s8(mem[(o["B"] + n * o["ldb"] + k) % SPAD_DEPTH]) for n in range(N)] for k in range(K)]
    else:
        B = [[s8(mem[(o["B"] + k * o["ldb"] + n) % SPAD_DEPTH]) for n in range(N)] for k in range(K)]
    writes = []
    for r in range(M):
        for n in range(N):
            c = s32(sum(A[r][k] * B[k][n] for k in range(K)))
            writes.append(((o["dst"] + r * o["ldc"] + n) % SPAD_DEPTH, u32(c)))
    return writes


def random_mm(rng, M, K, N, tb):
    """An MM with random bases and strides; strides are usually the packed ones, sometimes anything."""
    def stride(packed):
        return packed if rng.random() < 0.5 else rng.randrange(SPAD_DEPTH)
    lda = stride(K)
    ldb = stride(K if tb else N)
    ldc = stride(N)
    pick = rng.random()
    a = rng.randrange(SPAD_DEPTH)
    b = rng.randrange(SPAD_DEPTH)
    dst = rng.randrange(SPAD_DEPTH)
    if pick < 0.15:
        dst = a                         # result over A
    elif pick < 0.3:
        dst = b                         # result over B
    elif pick < 0.4:
        b = a                           # A and B share one region
    return mm(dst, a, b, M, K, N, lda=lda, ldb=ldb, ldc=ldc, tb=tb).word


def run_cases(words, *, seed, trace=False, config=BOOK, **issue_options):
    """Run the MM words back to back on one scratchpad, checking the whole scratchpad after each;
    return [(word, B, trace, model writes)]."""
    rng = random.Random(seed)
    background = [rng.getrandbits(32) for _ in range(SPAD_DEPTH)]

    async def bench_fn(ctx, bench):
        bench.fill(ctx, background)
        mirror = list(background)
        await bench.idle(ctx, 2)
        results = []
        for word in words:
            writes = mm_model(mirror, word)
            b, cycles = await bench.issue(ctx, word, trace=trace, **issue_options)
            for addr, value in writes:
                mirror[addr] = value
            bench.check_against(ctx, mirror, word)
            await bench.idle(ctx, 1)
            results.append((word, b, cycles, writes))
        return results

    return simulate(MatrixUnit(config=config), bench_fn)


# R4 of the hardware spec: single-MM busy times.
R4 = [
    (dict(M=1, K=1, N=1), 11),
    (dict(M=1, K=4, N=4), 38),
    (dict(M=4, K=8, N=4), 101),
    (dict(M=2, K=5, N=3, tb=1, lda=5, ldb=5, ldc=3), 46),
]


def test_r4_busy_times_and_results():
    words = [mm(3000, 100, 200, **kw).word for kw, _ in R4]
    results = run_cases(words, seed=4)
    assert [b for _, b, _, _ in results] == [b for _, b in R4]


@pytest.mark.parametrize("K", [1, 2, 7, 64])
def test_every_shape(K):
    """Every M, N in 1..4 with both tb, random bases, strides and overlaps; B by the spec formula."""
    rng = random.Random(1000 + K)
    shapes = [(M, N, tb) for M in range(1, 5) for N in range(1, 5) for tb in (0, 1)]
    words = [random_mm(rng, M, K, N, tb) for M, N, tb in shapes]
    results = run_cases(words, seed=K)
    for (M, N, tb), (word, b, _, _) in zip(shapes, results):
        assert b == busy_time(M, K, N), (M, K, N, tb, b)


def test_port_timing():
    """Reads go out one a cycle in the spec's order (LA from W1, LB from W(MK+3)); OUT writes m-major at the
    end, with done alone in W_B and busy high before it."""
    M, K, N = 3, 5, 2
    cases = [
        mm(4090, 4093, 7, M, K, N, lda=9, ldb=2, ldc=5, tb=0).word,   # addresses wrap at 4096
        mm(50, 60, 70, M, K, N, lda=K, ldb=11, ldc=N, tb=1).word,
    ]
    for word, b, cycles, writes in run_cases(cases, seed=7, trace=True):
        o = operands(word)
        assert b == busy_time(M, K, N) == len(cycles)
        la = [(o["A"] + r * o["lda"] + k) % SPAD_DEPTH for r in range(M) for k in range(K)]
        if o["tb"]:
            lb = [(o["B"] + n * o["ldb"] + k) % SPAD_DEPTH for k in range(K) for n in range(N)]
        else:
            lb = [(o["B"] + k * o["ldb"] + n) % SPAD_DEPTH for k in range(K) for n in range(N)]
        ra = [c.ra for c in cycles]
        assert ra[0:M * K] == la
        assert ra[M * K + 2:M * K + 2 + K * N] == lb
        out_start = b - 2 - M * N           # OUT occupies the M*N cycles before FIN and the done cycle
        wrote = [(c.n, c.wa, c.wd) for c in cycles if c.we]
        assert wrote == [(out_start + 1 + q, a, v) for q, (a, v) in enumerate(writes)]
        assert [c.done for c in cycles] == [0] * (b - 1) + [1]
        assert [c.busy for c in cycles] == [1] * (b - 1) + [0]


def test_extreme_values():
    """All-(-128) operands give the largest sums, +2^20 at K=64; junk above bit 7 is ignored; on a scratchpad
    of random non-zero words, the 16 results are the only words that change."""
    word = mm(1000, 0, 64, 4, 64, 4, lda=0, ldb=0, ldc=4).word   # A rows all read the same 64 words
    mirror = nonzero_words(21)
    mirror[0:128] = [0xABCDEF80] * 128

    async def bench_fn(ctx, bench):
        bench.fill(ctx, mirror)
        b, _ = await bench.issue(ctx, word)
        got = bench.dump(ctx)
        mirror[1000:1016] = [64 * 128 * 128] * 16          # worked by hand: 64 products of (-128)^2
        bench.check_against(ctx, mirror, word)
        return b, got[1000:1016]

    b, c = simulate(MatrixUnit(), bench_fn)
    assert b == busy_time(4, 64, 4)
    assert c == [64 * 128 * 128] * 16


def test_start_while_busy_is_ignored():
    """Start pulses (with junk on ins) during an MM change neither its result nor its busy time."""
    rng = random.Random(3)
    shapes = [(2, 7, 2, 0), (4, 3, 1, 1), (1, 9, 4, 0)]
    words = [random_mm(rng, M, K, N, tb) for M, K, N, tb in shapes]
    results = run_cases(words, seed=3, stray=range(1, 1000))     # start high in every WAIT cycle
    assert [b for _, b, _, _ in results] == [busy_time(M, K, N) for M, K, N, _ in shapes]


def test_zero_dimension_hangs():
    """M, K or N = 0 is illegal; like the book's RTL the unit then never raises done and writes nothing: every
    word of a scratchpad of random non-zero words is unchanged."""
    words = [mm(100, 0, 50, 0, 3, 2).word, mm(100, 0, 50, 2, 0, 2).word, mm(100, 0, 50, 2, 3, 0).word]
    for seed, word in enumerate(words):
        background = nonzero_words(seed)

        async def bench_fn(ctx, bench):
            bench.fill(ctx, background)
            b, _ = await bench.issue(ctx, word, hang=True, limit=300)
            bench.check_against(ctx, background, word)
            return b
        assert simulate(MatrixUnit(), bench_fn) is None


def test_book_busy_cycles_is_the_spec_formula():
    """hdl.isa.mm_busy_cycles on the book's chip is spec 4.7's B for every legal shape."""
    for M in range(1, 5):
        for N in range(1, 5):
            for K in range(1, 65):
                assert mm_busy_cycles(M, K, N, BOOK) == busy_time(M, K, N)


@pytest.mark.parametrize("spec", [dict(array=8, mm_load=4), dict(array=8), dict(mm_load=2)])
def test_other_chips_match_golden_and_cycle_model(spec):
    """Random MMs (M, N up to the array, both tb, random bases, strides and overlaps, K around the
    group sizes) on the unit of another chip: the whole scratchpad is the golden matmul's and B is
    hdl.isa.mm_busy_cycles exactly."""
    cfg = ChipConfig(**spec)
    rng = random.Random(cfg.key())
    n = cfg.array
    shapes = [(n, 64, n, 1), (1, 1, 1, 0), (n, 5, n - 1, 0), (n - 1, 4, n, 1), (3, 3, 5 % n + 1, 0)]
    shapes += [(rng.randint(1, n), rng.choice([1, 2, 3, 4, 5, 7, 8, 9, rng.randint(1, 24)]),
                rng.randint(1, n), rng.randrange(2)) for _ in range(12)]
    words = [random_mm(rng, M, K, N, tb) for M, K, N, tb in shapes]
    results = run_cases(words, seed=len(spec), config=cfg)
    for (M, K, N, tb), (_, b, _, _) in zip(shapes, results):
        assert b == mm_busy_cycles(M, K, N, cfg), (M, K, N, tb, b)


@pytest.mark.parametrize("spec", [dict(array=1, row_depth=1), dict(array=2, mm_load=4, row_depth=4),
                                  dict(array=2, mm_load=2, row_depth=2)])
def test_small_chips(spec):
    """The smallest arrays and operand memories, with groups wider than the array or than K: every
    legal shape against the golden matmul and the cycle model."""
    cfg = ChipConfig(**spec)
    rng = random.Random(cfg.key())
    shapes = [(M, K, N, tb) for M in range(1, cfg.array + 1) for N in range(1, cfg.array + 1)
              for K in range(1, cfg.row_depth + 1) for tb in (0, 1)]
    words = [random_mm(rng, M, K, N, tb) for M, K, N, tb in shapes]
    results = run_cases(words, seed=5, config=cfg)
    assert [b for _, b, _, _ in results] == [mm_busy_cycles(M, K, N, cfg) for M, K, N, _ in shapes]
