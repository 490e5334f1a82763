"""rq_pipe (docs/rq-pipe.md): the requantizer's pipeline register, on in the preset fast.

The contract: on a chip with ``rq_pipe = 1`` an RQ of n words is busy n + 3 cycles (n + 2 on the book's),
an MM with its rq flag on an mm_rq chip one cycle more when the phases overlap (none in series), every
other instruction as without it, and every word written is the same as without it (operand overlaps
included). The cycle model, the reference machine, the unit's formal contract and the Amaranth chip here;
the requantizer in tests/test_requant.py, the RQ unit in tests/test_units_simple.py, the MM unit in
tests/test_fused_rq.py.
"""
import random
from dataclasses import replace

import pytest

from hdl import isa
from hdl.config import BOOK, ChipConfig, ChipSpecError, parse_chip
from hdl.isa import Op, operands
from sim.backends import first_difference
from sim.backends.reference import ReferenceMachine
from sim.verify.progen import Knobs, random_program
from chipbench import FAST_PRE_LANES

# the fast preset before issue 23's lanes: with vector lanes an overlapping RQ reads a group older with the
# pipe (docs/vec-lanes.md), so the words of the random programs below would differ by design
FAST = FAST_PRE_LANES
PIPED = replace(BOOK, rq_pipe=1)


# ---- configuration ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [2, -1])
def test_bad_rq_pipe_names_the_value(value):
    with pytest.raises(ValueError) as e:
        ChipConfig(rq_pipe=value)
    assert str(e.value) == f"ChipConfig rq_pipe must be 0 or 1, not {value}"
    with pytest.raises(ChipSpecError, match=f"rq_pipe must be 0 or 1, not {value}"):
        parse_chip(f"fast,rq_pipe={value}")


def test_the_parameter_in_specs_and_presets():
    assert BOOK.rq_pipe == 0 and FAST.rq_pipe == 1
    assert PIPED.spec() == "rq_pipe=1" and parse_chip("rq_pipe=1") == PIPED
    assert replace(FAST_PRE_LANES, rq_pipe=0).spec() == ("array=8,mm_load=4,ext_words=16384,gather=1,mm_rq=1,"
                                                   "vadd_ports=2,mm_pack=1,mm_overlap=1,prefetch=1,sm_div=4")


# ---- the cycle model -------------------------------------------------------------------------------

def test_rq_busy_cycles():
    for n in (1, 2, 7, 4095):
        ins = isa.rq(0, 0, n, 1 << 23, 20)
        assert isa.rq_busy_cycles(n, BOOK) == isa.busy_cycles(ins, 8, BOOK) == n + 2
        assert isa.rq_busy_cycles(n, PIPED) == isa.busy_cycles(ins, 8, PIPED) == n + 3
        assert isa.busy_cycles(ins, 8, FAST) == n + 3


@pytest.mark.parametrize("spec", ["book,mm_rq=1,rq_pipe=1", "book,mm_rq=1,mm_overlap=1,rq_pipe=1", FAST.spec()],
                         ids=["mm_rq", "mm_rq_overlap", "fast"])
def test_only_rq_and_fused_overlapped_mms_change(spec):
    """Every instruction of a mix costs the same with and without rq_pipe, except RQ (+1) and an MM with
    rq = 1 on an overlapped unit (+1); an MM's rq flag is read only with mm_rq."""
    cfg = parse_chip(spec)
    plain = replace(cfg, rq_pipe=0)
    rng = random.Random(spec)
    seen = set()
    for i in range(60):
        prog, _ = random_program(rng, 2048, Knobs(wide=True, overlap=0.3, junk=0.5), 8, config=cfg)
        for w in prog:
            o = operands(w)
            op = o["op"]
            extra = 1 if op == Op.RQ or (op == Op.MM and cfg.mm_overlap and o["rq"]) else 0
            seen.add((op, extra))
            assert isa.busy_cycles(w, 8, cfg) == isa.busy_cycles(w, 8, plain) + extra, isa.describe(w)
    assert {(Op.RQ, 1), (Op.MM, 0), (Op.RQC, 0), (Op.VADD, 0)} <= seen
    assert ((Op.MM, 1) in seen) == bool(cfg.mm_overlap)
    # on a chip without mm_rq the rq bit is not read: it costs nothing
    no_rq = replace(PIPED, mm_overlap=1)
    word = isa.mm(0, 100, 200, 2, 3, 2).word | (1 << 19)
    assert isa.busy_cycles(word, 8, no_rq) == isa.mm_busy_cycles(2, 3, 2, no_rq)


# ---- the reference machine: the same words, the counted cycles more -------------------------------

@pytest.mark.parametrize("spec", ["rq_pipe=1", "book,mm_rq=1,mm_overlap=1,rq_pipe=1", FAST.spec()],
                         ids=["rq_pipe", "mm_rq_overlap", "fast"])
def test_reference_same_words_and_the_extra_cycles(spec):
    cfg = parse_chip(spec)
    plain = replace(cfg, rq_pipe=0)
    for seed in range(6):
        prog, image = random_program(random.Random(f"{spec} {seed}"), 2048,
                                     Knobs(wide=True, overlap=0.6, junk=0.3, chain=0.5), 8, config=cfg)
        a = ReferenceMachine(config=cfg, check=False).run(prog, image, 8)
        b = ReferenceMachine(config=plain, check=False).run(prog, image, 8)
        assert a.ext == b.ext and a.scratchpad == b.scratchpad
        ops = [operands(w) for w in prog]
        rqs = sum(o["op"] == Op.RQ for o in ops)
        fused = sum(o["op"] == Op.MM and o["rq"] and cfg.mm_rq and cfg.mm_overlap for o in ops)
        # [total, mm, dma, vec, instructions]
        assert [x - y for x, y in zip(a.counters, b.counters)] == [rqs + fused, fused, 0, rqs, 0]


# ---- the unit contracts, formally (sim.verify.formal's targets rq_pipe and mm_rq_pipe) ----------

# The piped RQ unit's contract is proved here by k-induction at the units' depth (seconds). The MM unit that
# fuses it (mm_rq_pipe) takes minutes to prove, so the suite checks it bounded from reset (10 cycles, 12 s);
# `python -m sim.formal --only mm_rq_pipe` proves it at depth 20.
MM_RQ_PIPE_BMC_DEPTH = 10


def test_piped_rq_proved_fused_mm_bounded_and_a_unit_that_drops_its_last_word_fails():
    from hdl.units.rq import RequantUnit
    from sim.verify import formal
    targets = {t.name: t for t in formal.targets()}
    tools = formal.find_tools()
    target = targets["rq_pipe"]
    assert formal.prove(target, sorted(target.induct), formal.UNIT_DEPTH, tools)[0] == "proved"
    target = targets["mm_rq_pipe"]
    assert formal.prove(target, sorted(target.induct), MM_RQ_PIPE_BMC_DEPTH, tools, mode="bmc")[0] == "bounded"

    class NoDrain(RequantUnit):
        """Without DRAIN: finishes in the last word's read cycle (the book's control), so that word is
        written in the done cycle, idle."""
        def _piped(self, m, opr, n):
            return self.one_pass(m, opr, n)

    target = targets["rq_pipe"]
    broken = formal.prove(target, ["write_in_busy"], 8, tools, build=lambda: NoDrain(config=PIPED))
    assert broken[0] == "FAIL"


# ---- the chip in Amaranth's simulator ---------------------------------------------------------------

def test_overlapping_rqs_on_the_amaranth_chip_equal_the_reference():
    """RQs with dst = src + d for d in -3..3 (d = 2: the forwarded word), back to back, on the book's chip
    with rq_pipe: the reference's words and counters."""
    from sim.backends import get_backend
    prog = [isa.ld(0, 0, 64)]
    for d in (-3, -2, -1, 0, 1, 2, 3):
        prog.append(isa.rq(100 + d, 100, 9, 12_000_000 + 1000 * d, 3, d & 1))
        prog.append(isa.ld(100, 0, 64))
    prog += [isa.rq(4094, 4092, 2, 9_000_000, 2), isa.st(90, 1000, 30), isa.st(4090, 1100, 6), isa.halt()]
    rng = random.Random(3)
    image = [rng.randint(-(1 << 16), 1 << 16) & 0xFFFFFFFF for _ in range(2048)]
    words = [w.word for w in prog]
    want = ReferenceMachine(config=PIPED).run(words, image, 3)
    got = get_backend("amaranth", config=PIPED).run(words, image, 3)
    assert first_difference(want, got) is None
    plain = ReferenceMachine(config=BOOK).run(words, image, 3)
    assert want.ext == plain.ext and want.counters[3] == plain.counters[3] + 8
