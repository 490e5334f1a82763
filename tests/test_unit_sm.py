"""SoftmaxUnit (hardware spec 4.6) against hdl.arith.softmax_q16, the R7 figures, busy times and write timing.

The scratchpad starts as random 32-bit words, so every score carries junk above bit 7; the whole scratchpad
is compared with a Python mirror after each instruction.
"""
import random

from hdl.arith import softmax_q16
from hdl.isa import operands, sm
from hdl.units.sm import SoftmaxUnit
from tests.unitbench import SPAD_DEPTH, nonzero_words, simulate


def busy_time(length):
    # Hardware spec 4.6: P1, P2 and P3 take len+1 each, DIVS 1, WAITD 42, the done cycle 1.
    return 3 * (length + 1) + 1 + 42 + 1


def run_cases(cases, *, seed, trace=False, **issue_options):
    """cases: (word, {address: word} to poke first). Returns [(word, B, cycles, expected p)]."""
    rng = random.Random(seed)
    background = [rng.getrandbits(32) for _ in range(SPAD_DEPTH)]

    async def bench_fn(ctx, bench):
        bench.fill(ctx, background)
        mirror = list(background)
        await bench.idle(ctx, 2)
        results = []
        for word, poke in cases:
            bench.fill(ctx, poke)
            for a, w in poke.items():
                mirror[a] = w & 0xFFFFFFFF
            o = operands(word)
            scores = [mirror[(o["src"] + k) % SPAD_DEPTH] for k in range(o["len"])]
            p = softmax_q16(scores)
            b, cycles = await bench.issue(ctx, word, trace=trace, **issue_options)
            for k, pk in enumerate(p):
                mirror[(o["dst"] + k) % SPAD_DEPTH] = pk
            bench.check_against(ctx, mirror, word)
            await bench.idle(ctx, 1)
            results.append((word, b, cycles, p))
        return results

    return simulate(SoftmaxUnit(), bench_fn)


def scores_at(base, values, junk=0):
    """Words holding the int8 `values` at base..; `junk` sets the bits above 7 (the unit ignores them)."""
    return {(base + k) % SPAD_DEPTH: ((junk << 8) | (v & 0xFF)) for k, v in enumerate(values)}


def test_r7_on_chip():
    """R7: [32, 16, 0, -16] -> [42200, 15524, 5711, 2101] with busy 59; also in place."""
    cases = [
        (sm(2048, 0, 4).word, scores_at(0, [32, 16, 0, -16])),
        (sm(10, 10, 4).word, scores_at(10, [32, 16, 0, -16], junk=0xFFFFFF)),
    ]
    for word, b, _, _ in run_cases(cases, seed=7):
        assert b == 59
    # The figures themselves, read from the scratchpad the unit wrote; no other word changes.
    mirror = nonzero_words(7)
    mirror[0:4] = [32, 16, 0, 0xF0]

    async def bench_fn(ctx, bench):
        bench.fill(ctx, mirror)
        b, _ = await bench.issue(ctx, sm(2048, 0, 4).word)
        got = bench.dump(ctx)[2048:2052]
        mirror[2048:2052] = [42200, 15524, 5711, 2101]
        bench.check_against(ctx, mirror, sm(2048, 0, 4).word)
        return b, got
    assert simulate(SoftmaxUnit(), bench_fn) == (59, [42200, 15524, 5711, 2101])


def test_equal_scores_and_single_element():
    """R7 on chip: eight equal scores give 8192 each (busy 71); len 1 gives 65536 (busy 50); nothing else of a
    scratchpad of random non-zero words changes."""
    mirror = nonzero_words(8)
    for a, w in {**scores_at(100, [-5] * 8, junk=0x123456), **scores_at(200, [77])}.items():
        mirror[a] = w

    async def bench_fn(ctx, bench):
        bench.fill(ctx, mirror)
        b8, _ = await bench.issue(ctx, sm(300, 100, 8).word)
        b1, _ = await bench.issue(ctx, sm(400, 200, 1).word)
        mem = bench.dump(ctx)
        mirror[300:308] = [8192] * 8
        mirror[400] = 65536
        bench.check_against(ctx, mirror, sm(400, 200, 1).word)
        return b8, mem[300:308], b1, mem[400]
    assert simulate(SoftmaxUnit(), bench_fn) == (71, [8192] * 8, 50, 65536)


def test_random_lengths_and_in_place():
    """Random lengths 1..64 (and two long ones), half in place, some wrapping past address 4095."""
    rng = random.Random(5)
    cases = []
    for n in range(24):
        length = rng.randint(1, 64) if n < 22 else rng.randint(200, 300)
        src = rng.randrange(SPAD_DEPTH)
        dst = src if n % 2 else rng.randrange(SPAD_DEPTH)
        if n == 3:
            src = dst = SPAD_DEPTH - 5
        if n % 5 == 0:
            # Narrow spreads, so many probabilities are non-trivial.
            poke = scores_at(src, [rng.randint(-20, 20) for _ in range(length)], junk=rng.getrandbits(24))
        else:
            poke = {}                   # the random background words are the scores
        span = {(src + k) % SPAD_DEPTH for k in range(length)}
        if dst != src and span & {(dst + k) % SPAD_DEPTH for k in range(length)}:
            dst = src                   # partial overlap is undefined: use in place instead
        cases.append((sm(dst, src, length).word, poke))
    cases.append((sm(0, 0, 6).word, scores_at(0, [-128] * 6)))              # max stays at -128
    cases.append((sm(20, 30, 3).word, scores_at(30, [127, -128, 127])))     # distance 255 -> T = 0
    for word, b, _, _ in run_cases(cases, seed=11):
        assert b == busy_time(operands(word)["len"])


def test_all_negative_scores_far_from_zero():
    """Scores that are all negative and far below 0: the maximum must be the largest score itself (a
    running maximum that started at 0 would look up e = T[-x], coarse values, and round differently)."""
    cases = [
        (sm(600, 0, 4).word, scores_at(0, [-100, -101, -110, -128])),
        (sm(700, 20, 3).word, scores_at(20, [-60, -61, -75], junk=0xABCDEF)),
        (sm(800, 40, 2).word, scores_at(40, [-127, -126])),
    ]
    results = run_cases(cases, seed=13)
    # a sanity check of the golden values as well: the largest score gets the largest probability
    for (word, b, _, p), top in zip(results, [0, 0, 1]):
        assert b == busy_time(operands(word)["len"])
        assert p.index(max(p)) == top


def test_write_timing():
    """e_k is written at dst+k in W(L+3+k) and p_k in W(2L+47+k); reads follow spec 4.6; done alone in W_B."""
    for dst, src, length in [(500, 500, 5), (4094, 7, 3)]:
        rng = random.Random(length)
        values = [rng.randint(-40, 40) for _ in range(length)]
        poke = scores_at(src, values)
        ((word, b, cycles, p),) = run_cases([(sm(dst, src, length).word, poke)], seed=length, trace=True)
        _, detail = softmax_q16(values, detail=True)
        L = length
        wants = [(L + 3 + k, (dst + k) % SPAD_DEPTH, detail["e"][k]) for k in range(L)]
        wants += [(2 * L + 47 + k, (dst + k) % SPAD_DEPTH, p[k]) for k in range(L)]
        assert [(c.n, c.wa, c.wd) for c in cycles if c.we] == wants
        reads = [c.ra for c in cycles]
        srcs = [(src + k) % SPAD_DEPTH for k in range(L)]
        assert reads[0:L] == srcs                          # P1 from W1
        assert reads[L + 1:2 * L + 1] == srcs              # P2 from W(L+2)
        assert reads[2 * L + 45:3 * L + 45] == [(dst + k) % SPAD_DEPTH for k in range(L)]   # P3
        assert b == len(cycles) == busy_time(L)
        assert [c.done for c in cycles] == [0] * (b - 1) + [1]
        assert [c.busy for c in cycles] == [1] * (b - 1) + [0]


def test_start_while_busy_is_ignored():
    """Start pulses (with junk on ins) during an SM, also while the divider runs, change nothing."""
    cases = [(sm(900, 40, 9).word, {}), (sm(40, 40, 5).word, {})]
    results = run_cases(cases, seed=9, stray=range(1, 1000))     # start high in every WAIT cycle
    assert [b for _, b, _, _ in results] == [busy_time(9), busy_time(5)]


def test_zero_length_hangs():
    """len = 0 is illegal; like the book's RTL the unit then never raises done and writes nothing: every word
    of a scratchpad of random non-zero words is unchanged."""
    background = nonzero_words(0)

    async def bench_fn(ctx, bench):
        bench.fill(ctx, background)
        b, _ = await bench.issue(ctx, sm(100, 0, 0).word, hang=True, limit=300)
        bench.check_against(ctx, background, sm(100, 0, 0).word)
        return b
    assert simulate(SoftmaxUnit(), bench_fn) is None
