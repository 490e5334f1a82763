"""MM's read-before-write alias case under mm_overlap (issue 24, docs/mm-fast.md "The schedule").

The overlapped unit writes C from x = X0 = (K-1)*C + max(3, C-1) while the array finishes; with C = 4 cycles
a k that is the cycle of the last staging read (the last k's last group). Here that read's address (A's last
row at k = K-1) is C's first element: the scratchpad's read port must give the word as it was before the
same edge's write (hardware spec 2.4), so the MM computes with the old A, as the reference machine says
(every operand staged before any result is written).
"""
from hdl import isa
from hdl.arith import s8, s32, u32
from hdl.config import parse_chip
from hdl.units.mm import MatrixUnit
from tests.unitbench import SPAD_DEPTH, nonzero_words, simulate

CFG = parse_chip("mm_overlap=1")        # the book's 4 x 4 array, one element a cycle: C = max(M, N)


def golden(mem, o):
    """The scratchpad after the MM `o` (operands) computed from `mem` as it was before it."""
    M, K, N = o["M"], o["K"], o["N"]
    a = [[s8(mem[o["A"] + r * o["lda"] + k]) for k in range(K)] for r in range(M)]
    b = [[s8(mem[o["B"] + k * o["ldb"] + n]) for n in range(N)] for k in range(K)]
    out = list(mem)
    for r in range(M):
        for n in range(N):
            out[o["dst"] + r * o["ldc"] + n] = u32(s32(sum(a[r][k] * b[k][n] for k in range(K))))
    return out


def test_last_operand_read_in_the_cycle_of_the_first_write_at_the_same_address():
    M, K, N = 4, 3, 4
    A, B = 100, 200
    last_a = A + (M - 1) * K + (K - 1)              # A[M-1][K-1], read in the last k's last group
    word = isa.mm(last_a, A, B, M, K, N, lda=K, ldb=N, ldc=N).word
    mem = nonzero_words(24)

    async def bench_fn(ctx, bench):
        bench.fill(ctx, mem)
        busy, cycles = await bench.issue(ctx, word, trace=True)
        return busy, cycles, bench.dump(ctx)

    busy, cycles, after = simulate(MatrixUnit(config=CFG), bench_fn)
    first = next(c for c in cycles if c.we)
    # the case is reached: the unit's last A read goes out in the cycle of its first write, at its address
    assert (first.wa, first.ra) == (last_a, last_a)
    assert [c.n for c in cycles if c.ra == last_a and c.n <= first.n] == [first.n]    # not read before
    assert busy == isa.mm_busy_cycles(M, K, N, CFG)
    assert len(after) == SPAD_DEPTH and after == golden(mem, isa.operands(word))
