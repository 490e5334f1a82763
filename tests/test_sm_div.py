"""sm_div (docs/sm-div.md): the SM unit's divider finds 2 or 4 quotient bits a cycle.

The contract: on a chip with ``sm_div = b`` an SM of n scores is busy 3n + 7 + 40/b cycles (3n + 47 on the
book's), every word it writes is the book's, every other instruction as without it. The configuration, the
cycle model, the reference machine, the unit (golden values, write timing, busy time, a stray start) and the
chip on Amaranth's simulator; the divider itself in tests/test_divider.py.
"""
import random
from dataclasses import replace

import pytest

from hdl import isa
from hdl.arith import softmax_q16
from hdl.config import BOOK, PRESETS, ChipConfig, ChipSpecError, parse_chip
from hdl.isa import Op, operands, sm
from hdl.units.sm import SoftmaxUnit
from sim.backends import first_difference
from sim.backends.amaranth_backend import AmaranthBackend
from sim.backends.reference import ReferenceMachine
from sim.verify.progen import Knobs, random_program
from tests.unitbench import SPAD_DEPTH, simulate


@pytest.mark.parametrize("value", [3, 0, 8])
def test_bad_sm_div_names_the_value(value):
    with pytest.raises(ValueError) as e:
        ChipConfig(sm_div=value)
    assert str(e.value) == f"ChipConfig sm_div must be 1, 2 or 4, not {value}"
    with pytest.raises(ChipSpecError, match=f"sm_div must be 1, 2 or 4, not {value}"):
        parse_chip(f"book,sm_div={value}")


def test_the_parameter_in_specs():
    assert BOOK.sm_div == 1
    assert replace(BOOK, sm_div=4).spec() == "sm_div=4" and parse_chip("sm_div=2") == replace(BOOK, sm_div=2)


def test_cycle_table():
    for n in (1, 2, 8, 4095):
        word = sm(0, 0, n).word
        assert isa.busy_cycles(word) == 3 * n + 47
        assert isa.busy_cycles(word, cfg=replace(BOOK, sm_div=2)) == 3 * n + 27
        assert isa.busy_cycles(word, cfg=replace(BOOK, sm_div=4)) == 3 * n + 17
    # every other opcode as on the book's chip
    for w in (isa.rq(0, 0, 5, 1, 2).word, isa.vadd(0, 0, 0, 5).word, isa.amax(0, 0, 5).word, isa.ld(0, 0, 5).word):
        assert isa.busy_cycles(w, cfg=replace(BOOK, sm_div=4)) == isa.busy_cycles(w)


@pytest.mark.parametrize("bits", [2, 4])
def test_reference_same_words_fewer_cycles(bits):
    """Wide random programs (overlapping operands, junk) on the reference: the same words with and without;
    total and vec 40 - 40/bits lower per SM executed."""
    cfg = replace(BOOK, sm_div=bits)
    sms = 0
    for seed in range(6):
        prog, image = random_program(random.Random(seed), 2048, Knobs(wide=True, overlap=0.6, junk=0.3, chain=0.5),
                                     8, config=cfg)
        a = ReferenceMachine(config=BOOK, check=False).run(prog, image, 8)
        b = ReferenceMachine(config=cfg, check=False).run(prog, image, 8)
        assert a.ext == b.ext and a.scratchpad == b.scratchpad
        n = sum(operands(w)["op"] == Op.SM for w in prog)
        sms += n
        saved = n * (40 - 40 // bits)
        assert [x - y for x, y in zip(a.counters, b.counters)] == [saved, 0, 0, saved, 0]
    assert sms >= 3


def _run(cfg, cases, seed):
    """Run SM `cases` ((word, {address: word} to poke)) on the unit of `cfg` over random background words;
    checks the whole scratchpad after each against a mirror; returns [(B, [(cycle, addr, data) written])]."""
    rng = random.Random(seed)
    background = [rng.getrandbits(32) for _ in range(SPAD_DEPTH)]

    async def bench_fn(ctx, bench):
        bench.fill(ctx, background)
        mirror = list(background)
        await bench.idle(ctx, 2)
        out = []
        for word, poke in cases:
            bench.fill(ctx, poke)
            for a, w in poke.items():
                mirror[a] = w & 0xFFFFFFFF
            o = operands(word)
            p = softmax_q16([mirror[(o["src"] + k) % SPAD_DEPTH] for k in range(o["len"])])
            b, cycles = await bench.issue(ctx, word, trace=True)
            for k, pk in enumerate(p):
                mirror[(o["dst"] + k) % SPAD_DEPTH] = pk
            bench.check_against(ctx, mirror, word)
            await bench.idle(ctx, 1)
            out.append((b, [(c.n, c.wa, c.wd) for c in cycles if c.we]))
        return out

    return simulate(SoftmaxUnit(config=cfg), bench_fn)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("bits", [2, 4])
def test_the_unit_writes_the_books_words_in_fewer_cycles(bits):
    """R7's [32, 16, 0, -16] (p = [42200, 15524, 5711, 2101]), equal scores, one score, random lengths in
    place and apart: the book's probabilities, busy 3n + 7 + 40/bits, the e values at the book's cycles and
    the probabilities 40 - 40/bits cycles earlier than the book's (spec 4.6: W(2n + 47 + k))."""
    cfg = replace(BOOK, sm_div=bits)
    rng = random.Random(bits)
    cases = [(sm(2048, 0, 4).word, {k: v & 0xFF for k, v in enumerate([32, 16, 0, -16])}),
             (sm(300, 100, 8).word, {100 + k: 0xFB for k in range(8)}), (sm(400, 200, 1).word, {200: 77})]
    for _ in range(6):
        n, src = rng.randint(1, 40), rng.randrange(SPAD_DEPTH)
        cases.append((sm(src if rng.random() < 0.5 else (src + 2000) % SPAD_DEPTH, src, n).word, {}))
    got = _run(cfg, cases, seed=bits)
    saved = 40 - 40 // bits
    for (word, _), (b, writes) in zip(cases, got):
        n, dst = operands(word)["len"], operands(word)["dst"]
        assert b == 3 * n + 7 + 40 // bits == isa.busy_cycles(word, cfg=cfg)
        cycles = [c for c, _, _ in writes]
        assert cycles == [n + 3 + k for k in range(n)] + [2 * n + 47 - saved + k for k in range(n)]
        assert [a for _, a, _ in writes[n:]] == [(dst + k) % SPAD_DEPTH for k in range(n)]
    assert [d for _, _, d in got[0][1][4:]] == [42200, 15524, 5711, 2101]


@pytest.mark.timeout(300)
def test_the_chip_with_sm_div_matches_the_reference():
    cfg = replace(BOOK, sm_div=4)
    backend = AmaranthBackend(config=cfg)
    rng = random.Random(23)
    seen = 0
    for k in range(3):
        prog, image = random_program(rng, 2048, Knobs(wide=True, repeat=0.3, chain=0.5, budget=12000), 3, cfg)
        seen += sum(operands(w)["op"] == Op.SM for w in prog)
        want = ReferenceMachine(check=False, config=cfg).run(prog, image, 3)
        assert first_difference(want, backend.run(prog, image, 3)) is None, k
    assert seen >= 1


def test_the_scope_and_the_formal_target():
    from sim.verify import formal
    assert SoftmaxUnit.scope_of(BOOK) == "sm" and SoftmaxUnit.scope_of(replace(BOOK, sm_div=2)) == "sm_div"
    assert "sm_div" in {t.name for t in formal.targets()}
    assert SoftmaxUnit.scope_of(PRESETS["fast"]) in {t.name for t in formal.targets()}
