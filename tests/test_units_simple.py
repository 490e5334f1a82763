"""The simple chip units (ST, RQ, VADD, AMAX, UNPACK) alone, against hdl.arith and hdl.isa.busy_cycles.

The testbench plays the scratchpad (hardware spec 2.4): the address a unit presents in cycle c is
answered in c+1 with the contents before that edge's write. Each case checks the unit's busy time
(the WAIT cycle its `done` is high in), every scratchpad/external word, and that `done` is one pulse.
"""
import random

from amaranth.sim import Simulator

from hdl import isa
from hdl.arith import argmax_first, requant, u32, unpack_word, vadd_sat
from hdl.unit_amax import ArgmaxUnit
from hdl.unit_rq import RequantUnit
from hdl.unit_st import StoreUnit
from hdl.unit_unpack import UnpackUnit
from hdl.unit_vadd import VaddUnit

SPAD = 4096


def run_unit(unit, jobs):
    """Run instructions one after the other on one unit; return [(busy, spad, ext_writes)] per job.

    `jobs` is a list of (instruction, spad dict). The unit's `done` cycle gives the busy time; a job
    that takes more than 20000 cycles fails the test.
    """
    has_ext = isinstance(unit, StoreUnit)
    results = []

    async def bench(ctx):
        for ins, init in jobs:
            spad = dict(init)
            ext = {}
            ctx.set(unit.ins, isa.encode(ins))
            ctx.set(unit.start, 1)
            await ctx.tick()                          # E0: the unit latches its operands
            ctx.set(unit.start, 0)
            busy = 0
            dones = 0
            for w in range(1, 20000):                 # cycle W(w)
                assert ctx.get(unit.busy) or ctx.get(unit.done), f"unit idle in W{w} without done"
                if ctx.get(unit.done):
                    busy = w
                    dones += 1
                    break
                ra = ctx.get(unit.ra)
                rd = spad.get(ra, 0)
                if has_ext:
                    if ctx.get(unit.wr_valid):
                        ext[ctx.get(unit.wr_addr)] = ctx.get(unit.wr_data)
                elif ctx.get(unit.we):
                    spad[ctx.get(unit.wa)] = ctx.get(unit.wd)
                await ctx.tick()
                ctx.set(unit.sp_rd, rd)
            else:
                raise AssertionError(f"{ins} never raised done")
            await ctx.tick()
            assert not ctx.get(unit.done), "done must be a one-cycle pulse"
            assert not ctx.get(unit.busy), "busy must drop with done"
            results.append((busy, spad, ext))

    sim = Simulator(unit)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return results


def rand_words(rng, n, lo=-(1 << 31), hi=(1 << 31) - 1):
    return [u32(rng.randint(lo, hi)) for _ in range(n)]


def load(base, words):
    return {(base + i) % SPAD: w for i, w in enumerate(words)}


# ---- ST ------------------------------------------------------------------------------------------

def test_st_copies_words_to_external_memory():
    rng = random.Random(1)
    cases = []
    for src, dst, n in ((5, 100, 1), (4090, 65530, 6), (0, 0, 13)):
        words = rand_words(rng, n)
        cases.append((isa.st(src, dst, n), load(src, words), words, dst))
    results = run_unit(StoreUnit(), [(ins, sp) for ins, sp, _, _ in cases])
    for (ins, sp0, words, dst), (busy, spad, ext) in zip(cases, results):
        assert busy == isa.busy_cycles(ins)
        assert ext == {(dst + i) & 0xFFFF: w for i, w in enumerate(words)}
        assert spad == sp0


# ---- RQ ------------------------------------------------------------------------------------------

RQ_CASES = [
    # (acc values, m, s, relu, dst, src)
    ([11200, -18444, 13569, 1754], 14757225, 31, 0, 200, 100),            # R10
    ([1, -1, 3, -3, 5, -5], 1 << 23, 24, 0, 10, 10),                      # ties, in place
    ([-(1 << 31), (1 << 31) - 1, 0, -77, 1 << 30], (1 << 24) - 1, 30, 1, 4000, 300),
    ([123456, -654321, 7], 8454660, 0, 0, 50, 60),                        # s = 0: saturates
    ([99999999, -99999999], (1 << 23) + 12345, 63, 0, 0, 1),              # s >= 57: no rounding half
]


def test_rq_matches_golden_requant():
    rng = random.Random(2)
    jobs, expect = [], []
    for accs, mant, s, relu, dst, src in RQ_CASES:
        accs = accs + [rng.randint(-(1 << 31), (1 << 31) - 1) for _ in range(3)]
        ins = isa.rq(dst, src, len(accs), mant, s, relu)
        sp0 = load(src, [u32(a) for a in accs])
        jobs.append((ins, sp0))
        want = dict(sp0)
        want.update({dst + i: u32(requant(a, mant, s, relu)) for i, a in enumerate(accs)})
        expect.append((ins, want))
    for (ins, want), (busy, spad, _) in zip(expect, run_unit(RequantUnit(), jobs)):
        assert busy == isa.busy_cycles(ins)
        assert spad == want, f"{ins}"


# ---- VADD ----------------------------------------------------------------------------------------

def test_vadd_saturates_and_reads_only_low_bytes():
    rng = random.Random(3)
    jobs, expect = [], []
    for dst, s1, s2, n in ((300, 0, 100, 1), (0, 0, 50, 9), (4000, 4090, 2000, 12), (700, 600, 600, 5)):
        a = rand_words(rng, n)          # junk above bit 7 must be ignored
        b = rand_words(rng, n)
        a[0] = 0x0000007F
        if n > 1:
            b[0], a[1], b[1] = 0x7F, 0xFFFFFF81, 0xFFFFFF80          # +254 -> 127, -255 -> -127
        sp0 = load(s1, a)
        sp0.update(load(s2, b))
        ins = isa.vadd(dst, s1, s2, n)
        jobs.append((ins, sp0))
        av = [sp0[(s1 + i) % SPAD] for i in range(n)]
        bv = [sp0[(s2 + i) % SPAD] for i in range(n)]
        want = dict(sp0)
        want.update({(dst + i) % SPAD: u32(vadd_sat(x, y)) for i, (x, y) in enumerate(zip(av, bv))})
        expect.append((ins, want))
    for (ins, want), (busy, spad, _) in zip(expect, run_unit(VaddUnit(), jobs)):
        assert busy == isa.busy_cycles(ins)
        assert spad == want, f"{ins}"


def test_vadd_saturation_boundaries():
    """Sums at and just past both limits (+-126..+-129): 127 and -127 are the bounds, so +128 must not wrap
    to -128 and -128 itself must not pass (spec 4.4, clamp to [-127, 127])."""
    pairs = [(64, 64), (127, 1), (100, 27), (120, 9), (63, 63),
             (-64, -64), (-128, 0), (-100, -27), (-120, -9), (-63, -63), (-128, -1), (127, -128)]
    a = [u32(x) for x, _ in pairs]
    b = [u32(y) for _, y in pairs]
    n = len(pairs)
    ins = isa.vadd(200, 0, 100, n)
    sp0 = load(0, a)
    sp0.update(load(100, b))
    want = dict(sp0)
    want.update({200 + i: u32(max(-127, min(127, x + y))) for i, (x, y) in enumerate(pairs)})
    [(busy, spad, _)] = run_unit(VaddUnit(), [(ins, sp0)])
    assert busy == 2 * n + 2
    assert spad == want


# ---- AMAX ----------------------------------------------------------------------------------------

def test_amax_first_maximum_and_single_write():
    rng = random.Random(4)
    vectors = [
        [5],
        [-7, -3, -3, -9],                               # ties keep the lower index
        [u32(-(1 << 31)), 0x7FFFFFFF, 0x7FFFFFFF, 0x80000000],
        rand_words(rng, 20),
        [3, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3],           # equal to the first: index 0
    ]
    jobs, expect = [], []
    for k, vec in enumerate(vectors):
        src, dst = 100 * k + 10, 4095 - k
        sp0 = load(src, [u32(x) for x in vec])
        ins = isa.amax(dst, src, len(vec))
        jobs.append((ins, sp0))
        want = dict(sp0)
        want[dst] = argmax_first([u32(x) for x in vec])
        expect.append((ins, want))
    for (ins, want), (busy, spad, _) in zip(expect, run_unit(ArgmaxUnit(), jobs)):
        assert busy == isa.busy_cycles(ins)
        assert spad == want, f"{ins}"


# ---- UNPACK --------------------------------------------------------------------------------------

def test_unpack_sign_extends_nibbles():
    rng = random.Random(5)
    jobs, expect = [], []
    for dst, src, words in ((8, 0, [0x3F2970E5]), (4090, 100, [0x89ABCDEF, 0x01234567, 0xFFFFFFFF]),
                            (200, 300, rand_words(rng, 4))):
        sp0 = load(src, words)
        ins = isa.unpack(dst, src, len(words))
        jobs.append((ins, sp0))
        want = dict(sp0)
        for i, w in enumerate(words):
            for j, v in enumerate(unpack_word(w)):
                want[(dst + 8 * i + j) % SPAD] = u32(v)
        expect.append((ins, want))
    for (ins, want), (busy, spad, _) in zip(expect, run_unit(UnpackUnit(), jobs)):
        assert busy == isa.busy_cycles(ins)
        assert spad == want, f"{ins}"


def test_r11_packed_word_unpacks_to_book_values():
    # hardware spec R11: 0x3F2970E5 holds [5,-2,0,7,-7,2,-1,3]
    [(busy, spad, _)] = run_unit(UnpackUnit(), [(isa.unpack(8, 0, 1), {0: 0x3F2970E5})])
    assert busy == 11
    assert [spad[8 + j] for j in range(8)] == [u32(v) for v in (5, -2, 0, 7, -7, 2, -1, 3)]
