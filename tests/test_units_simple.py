"""The simple chip units (ST, RQ, VADD, AMAX, UNPACK) alone, against hdl.arith and hdl.isa.busy_cycles.

The testbench plays the scratchpad (hardware spec 2.4): the address a unit presents in cycle c is
answered in c+1 with the contents before that edge's write. Each case checks the unit's busy time
(the WAIT cycle its `done` is high in), every scratchpad/external word, and that `done` is one pulse.

The random sweeps also disturb the unit the way the chip never would (spec 4: a unit takes its operands
at E0 and ignores `start` while busy): the instruction input is replaced by random bits right after E0,
`start` is pulsed again in random WAIT cycles, and the issued word carries junk in every bit the
hardware ignores. A unit that reads `ins` after E0 or restarts while busy gives a wrong result or time.
"""
import random
from dataclasses import replace

import pytest
from amaranth.sim import Simulator

from hdl import isa
from hdl.arith import argmax_first, requant, u32, unpack_word, vadd_sat
from hdl.config import BOOK
from hdl.units.amax import ArgmaxUnit
from hdl.units.rq import RequantUnit
from hdl.units.st import StoreUnit
from hdl.units.unpack import UnpackUnit
from hdl.units.vadd import VaddUnit
from sim.verify.progen import ignored_bits

SPAD = 4096
RQ_PIPE = replace(BOOK, rq_pipe=1)      # the piped requantizer (docs/rq-pipe.md): RQ's B = len + 3


def run_unit(unit, jobs, disturb=None):
    """Run instructions one after the other on one unit; return [(busy, spad, ext_writes)] per job.

    `jobs` is a list of (instruction or 128-bit word, spad dict). The unit's `done` cycle gives the busy
    time; a job that takes more than 20000 cycles fails the test. With `disturb` (a `random.Random`),
    `ins` holds random bits from the cycle after E0 on, and `start` is pulsed in about one busy WAIT
    cycle in five (never in the done cycle: there the unit is idle again and would rightly restart).
    """
    has_ext = isinstance(unit, StoreUnit)
    results = []

    async def bench(ctx):
        for ins, init in jobs:
            spad = dict(init)
            ext = {}
            ctx.set(unit.ins, ins if isinstance(ins, int) else isa.encode(ins))
            ctx.set(unit.start, 1)
            await ctx.tick()                          # E0: the unit latches its operands
            ctx.set(unit.start, 0)
            if disturb is not None:
                ctx.set(unit.ins, disturb.getrandbits(128))
            busy = 0
            dones = 0
            for w in range(1, 20000):                 # cycle W(w)
                assert ctx.get(unit.busy) or ctx.get(unit.done), f"unit idle in W{w} without done"
                if ctx.get(unit.done):
                    busy = w
                    dones += 1
                    break
                stray = disturb is not None and disturb.random() < 0.2
                ctx.set(unit.start, stray)            # busy here: the unit must ignore it
                ra = ctx.get(unit.spad.raddr)
                rd = spad.get(ra, 0)
                if has_ext:
                    if ctx.get(unit.wr_valid):
                        ext[ctx.get(unit.wr_addr)] = ctx.get(unit.wr_data)
                elif ctx.get(unit.spad.we):
                    spad[ctx.get(unit.spad.waddr)] = ctx.get(unit.spad.wdata)
                await ctx.tick()
                ctx.set(unit.start, 0)
                ctx.set(unit.spad.rdata, rd)
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


@pytest.mark.parametrize("cfg", [BOOK, RQ_PIPE], ids=["book", "rq_pipe"])
def test_rq_matches_golden_requant(cfg):
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
    for (ins, want), (busy, spad, _) in zip(expect, run_unit(RequantUnit(config=cfg), jobs)):
        # the contract stated outright: len + 2 on the book's chip, len + 3 with the pipeline register
        assert busy == isa.busy_cycles(ins, cfg=cfg) == isa.operands(ins)["len"] + (3 if cfg.rq_pipe else 2)
        assert spad == want, f"{ins}"


def _rq_lagged(spad, dst, src, n, mant, s, relu, lag=2):
    """RQ element by element as the book's unit does it: element k's read sees the writes of the
    elements <= k - lag (hardware spec 4.3 and sim.backends.reference: lag 2)."""
    spad, out = dict(spad), []
    for k in range(n):
        if k >= lag:
            spad[(dst + k - lag) % SPAD] = out[k - lag]
        out.append(u32(requant(spad.get((src + k) % SPAD, 0), mant, s, relu)))
    for k in range(max(0, n - lag), n):
        spad[(dst + k) % SPAD] = out[k]
    return spad


@pytest.mark.parametrize("cfg", [BOOK, RQ_PIPE], ids=["book", "rq_pipe"])
def test_rq_overlapping_operands_give_the_book_result(cfg):
    """dst = src + d for d in -4..5 (wrapping at the scratchpad's end too): the piped unit, whose read of
    element k meets the write of element k-2 instead of k-1, forwards that value (d = 2), so every
    placement leaves what the book's unit leaves."""
    rng = random.Random(7)
    jobs, expect = [], []
    for d in range(-4, 6):
        for src in (100, SPAD - 3):
            n = rng.randint(5, 9)
            # words that stay int32 when requantized once and change again when requantized twice
            accs = [rng.randint(-(1 << 20), 1 << 20) for _ in range(n)]
            mant, s, relu = 12_000_000 + rng.randint(0, 4_000_000), rng.choice((0, 1, 3)), rng.randint(0, 1)
            sp0 = load(src, [u32(a) for a in accs])
            dst = (src + d) % SPAD
            jobs.append((isa.rq(dst, src, n, mant, s, relu), sp0))
            expect.append(_rq_lagged(sp0, dst, src, n, mant, s, relu))
    results = run_unit(RequantUnit(config=cfg), jobs)
    for (ins, _), want, (busy, spad, _) in zip(jobs, expect, results):
        assert busy == isa.busy_cycles(ins, cfg=cfg)
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


# ---- random sweeps, disturbed after E0 ----------------------------------------------------------------

_EXTREMES = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFFFF80, 0xFFFFFF81, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


def _words(rng, n):
    """n words: about a third the extremes of int8 and int32, the rest random 32-bit."""
    return [rng.choice(_EXTREMES) if rng.random() < 0.3 else rng.getrandbits(32) for _ in range(n)]


def _length(rng, top):
    r = rng.random()
    return 1 if r < 0.15 else top if r < 0.2 else rng.randint(1, top)


def _apart(a, n, b, m):
    """The n words at a and the m words at b do not meet, addresses wrapping at 12 bits."""
    return (b - a) % SPAD >= n and (a - b) % SPAD >= m


def _place(rng, n, avoid):
    """A start for n words that meets none of the (start, length) regions in `avoid`, or None."""
    for _ in range(100):
        d = rng.randrange(SPAD)
        if all(_apart(d, n, a, m) for a, m in avoid):
            return d
    return None


def _junked(rng, ins):
    """The instruction word with random bits in every bit the hardware ignores."""
    return isa.encode(ins) | (rng.getrandbits(128) & ignored_bits(ins.op))


def _sweep(unit, make, count, seed, long_job=None, cfg=BOOK):
    """`count` jobs from ``make(rng) -> (instruction, spad, expected spad, expected ext)`` (and `long_job`,
    made the same way, last) on one unit, disturbed; every busy time, word and external write checked."""
    rng = random.Random(seed)
    cases = [make(rng) for _ in range(count)] + ([long_job(rng)] if long_job else [])
    jobs = [(_junked(rng, ins), sp0) for ins, sp0, _, _ in cases]
    results = run_unit(unit, jobs, disturb=random.Random(seed + 1))
    for (ins, _, want_spad, want_ext), (busy, spad, ext) in zip(cases, results):
        assert busy == isa.busy_cycles(ins, cfg=cfg), f"{ins}: busy {busy}"
        assert spad == want_spad, f"{ins}"
        assert ext == want_ext, f"{ins}"


def _st_job(rng, n=None):
    n = n or _length(rng, 40)
    src, dst = rng.randrange(SPAD), rng.getrandbits(16)
    words = _words(rng, n)
    sp0 = load(src, words)
    return isa.st(src, dst, n), sp0, sp0, {(dst + i) & 0xFFFF: w for i, w in enumerate(words)}


def _rq_job(rng, n=None):
    n = n or _length(rng, 40)
    src = rng.randrange(SPAD)
    dst = (src if rng.random() < 0.3 else _place(rng, n, [(src, n)])) or src     # 4095 words: in place
    accs = _words(rng, n)
    mant = rng.choice([rng.getrandbits(24), rng.randint(1 << 23, (1 << 24) - 1), 0, (1 << 24) - 1])
    shift = rng.choice([rng.randint(0, 63), rng.randint(20, 40), 0, 63])
    relu = rng.randint(0, 1)
    sp0 = load(src, accs)
    want = dict(sp0)
    want.update({(dst + i) % SPAD: u32(requant(a, mant, shift, relu)) for i, a in enumerate(accs)})
    return isa.rq(dst, src, n, mant, shift, relu), sp0, want, {}


def _vadd_job(rng, n=None):
    n = n or _length(rng, 30)
    s1 = rng.randrange(SPAD)
    s2 = rng.choice([s1, _place(rng, n, [(s1, n)]) or s1])
    r = rng.random()
    dst = s1 if r < 0.2 else s2 if r < 0.4 else _place(rng, n, [(s1, n), (s2, n)]) or s1
    sp0 = load(s1, _words(rng, n))
    sp0.update(load(s2, _words(rng, n)) if s2 != s1 else {})
    av = [sp0[(s1 + i) % SPAD] for i in range(n)]
    bv = [sp0[(s2 + i) % SPAD] for i in range(n)]
    want = dict(sp0)
    want.update({(dst + i) % SPAD: u32(vadd_sat(x, y)) for i, (x, y) in enumerate(zip(av, bv))})
    return isa.vadd(dst, s1, s2, n), sp0, want, {}


def _amax_job(rng, n=None):
    n = n or _length(rng, 40)
    src = rng.randrange(SPAD)
    dst = rng.randrange(SPAD)                 # even inside the source: the index is written after every read
    vec = _words(rng, n) if rng.random() < 0.6 else [rng.choice(_EXTREMES[:4]) for _ in range(n)]   # ties
    sp0 = load(src, vec)
    want = dict(sp0)
    want[dst] = argmax_first(vec)
    return isa.amax(dst, src, n), sp0, want, {}


def _unpack_job(rng, n=None):
    n = n or _length(rng, 6)
    src = rng.randrange(SPAD)
    dst = _place(rng, 8 * n, [(src, n)])
    if dst is None:                           # 511 words: the output must meet the source somewhere
        dst = rng.randrange(SPAD)
    sp0 = load(src, _words(rng, n))
    want = dict(sp0)
    for i in range(n):                        # spec 4.8: word i is read after every nibble of word i-1 is written
        for j, v in enumerate(unpack_word(want.get((src + i) % SPAD, 0))):
            want[(dst + 8 * i + j) % SPAD] = u32(v)
    return isa.unpack(dst, src, n), sp0, want, {}


def test_st_random_sweep_disturbed():
    _sweep(StoreUnit(), _st_job, 40, 101, long_job=lambda rng: _st_job(rng, 4095))


@pytest.mark.parametrize("cfg", [BOOK, RQ_PIPE], ids=["book", "rq_pipe"])
def test_rq_random_sweep_disturbed(cfg):
    _sweep(RequantUnit(config=cfg), _rq_job, 40, 102, long_job=lambda rng: _rq_job(rng, 4095), cfg=cfg)


def test_vadd_random_sweep_disturbed():
    _sweep(VaddUnit(), _vadd_job, 30, 103, long_job=lambda rng: _vadd_job(rng, 4096))


def test_amax_random_sweep_disturbed():
    _sweep(ArgmaxUnit(), _amax_job, 40, 104, long_job=lambda rng: _amax_job(rng, 4095))


def test_unpack_random_sweep_disturbed():
    _sweep(UnpackUnit(), _unpack_job, 30, 105, long_job=lambda rng: _unpack_job(rng, 511))
