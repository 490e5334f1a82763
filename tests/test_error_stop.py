"""No hang on a generated chip (issue 24 part 3): every word either runs or stops the chip with an error kind.

* ``hdl.isa.issue_stop`` is the one definition of the words a chip other than the book's stops on, and
  ``hdl.isa.validate`` (the compiler's check) refuses every one of them, its error carrying the same stop;
* the reference machine stops where the chip stops, with the counters of a HALT in that place, and the
  book's chip still hangs;
* the RTL (Amaranth's simulator, the design's Asserts evaluated) equals the reference on directed programs
  with each kind, first and later in a program, on a chip with the book's sequencer and on a prefetch chip;
* the fuzz mix of a generated chip carries such words (`sim.verify.progen.stop_word`).
"""
import random

import pytest

from hdl import isa
from hdl.config import BOOK, PRESETS, parse_chip
from hdl.isa import ErrorKind, Op
from sim.backends import DidNotHalt, ErrorStop, SimError, first_difference
from sim.backends.reference import ReferenceMachine
from sim.verify.progen import STOP_SHARE, fuzz_case, stop_word

CHIPS = [PRESETS["fast"], parse_chip("array=8,mm_load=2"), parse_chip("book,counter_bits=40")]


def test_only_the_books_chip_is_not_generated():
    assert not BOOK.generated and not parse_chip("book,ext_words=256,lat=3,rom_words=16").generated
    assert all(cfg.generated for cfg in CHIPS)


@pytest.mark.parametrize("cfg", [BOOK, *CHIPS], ids=lambda c: c.spec())
def test_validate_refuses_every_word_the_chip_stops_on(cfg):
    rng = random.Random(cfg.key())
    stopped = {kind: 0 for kind in ErrorKind}
    for _ in range(6000):
        word = (rng.randrange(16) << 124) | rng.getrandbits(124)
        if rng.random() < 0.3:
            word &= ~(0xFFF << 76)          # the length field of most opcodes
        if rng.random() < 0.3:
            word &= ~(0xF << 38)            # MM's M
        stop = isa.issue_stop(word, cfg)
        try:
            isa.validate(word, cfg=cfg)
            assert stop is None
        except isa.IsaError as e:
            assert e.stop == stop
        if stop is not None:
            stopped[stop[0]] += 1
            assert stop[1] == word >> 124
    assert all(stopped[k] > 20 for k in (ErrorKind.OPCODE, ErrorKind.LENGTH, ErrorKind.RANGE)), stopped


def test_issue_stop_kinds():
    cfg = parse_chip("array=8")
    assert isa.issue_stop(isa.halt(), cfg) is None and isa.issue_stop(isa.ld(0, 0, 1), cfg) is None
    assert isa.issue_stop(12 << 124, cfg) == (ErrorKind.OPCODE, 12)
    assert isa.issue_stop(isa.rqc(1, 1), cfg) == (ErrorKind.OPCODE, Op.RQC)     # no mm_rq on this chip
    assert isa.issue_stop(isa.sm(0, 0, 0), cfg) == (ErrorKind.LENGTH, Op.SM)
    assert isa.issue_stop(isa.mm(0, 0, 0, 8, 64, 8), cfg) is None
    assert isa.issue_stop(isa.mm(0, 0, 0, 9, 64, 8), cfg) == (ErrorKind.RANGE, Op.MM)
    assert isa.issue_stop(isa.mm(0, 0, 0, 1, 65, 1), cfg) == (ErrorKind.RANGE, Op.MM)
    assert isa.issue_stop(isa.mm(0, 0, 0, 9, 65, 0), cfg) == (ErrorKind.LENGTH, Op.MM)   # LENGTH first
    assert ErrorStop.KINDS == {1: "row", 2: "page", 3: "opcode", 4: "length", 5: "range"}


# (program, pc of the stop, kind, info): each kind first in a program and after other instructions
DIRECTED = [
    ([isa.ld(0, 0, 1), isa.sm(0, 0, 0), isa.halt()], 1, "length", Op.SM),
    ([isa.ld(0, 0, 1), 12 << 124, isa.halt()], 1, "opcode", 12),
    ([isa.mm(0, 0, 0, 9, 1, 1), isa.halt()], 0, "range", Op.MM),
    ([15 << 124, isa.halt()], 0, "opcode", 15),
    ([isa.ld(0, 0, 2), isa.mm(0, 0, 0, 2, 70, 1), isa.halt()], 1, "range", Op.MM),
    ([isa.ld(0, 0, 3), isa.st(0, 5, 3), isa.mm(0, 0, 0, 0, 1, 1), isa.halt()], 2, "length", Op.MM),
    ([isa.vadd(0, 1, 2, 0), isa.st(0, 5, 3), isa.halt()], 0, "length", Op.VADD),
]


@pytest.mark.parametrize("check", [False, True])
def test_reference_stops_where_the_chip_stops(check):
    cfg = parse_chip("array=8")
    image = list(range(2048))
    for program, pc, kind, info in DIRECTED:
        ref = ReferenceMachine(config=cfg, check=check)
        if check and kind != "opcode":
            with pytest.raises(SimError):
                ref.run(program, image, 8)
            continue
        r = ref.run(program, image, 8)
        assert r.error == ErrorStop(kind, pc, info)
        before = program[:pc] + [isa.halt()]
        halted = ReferenceMachine(config=cfg).run(before, image, 8)
        # the word is issued as a HALT in its place: the counters and memories of the program cut there
        assert (r.counters, r.ext, r.scratchpad) == (halted.counters, halted.ext, halted.scratchpad)


def test_the_books_chip_still_hangs():
    for program, _, kind, _ in DIRECTED:
        if kind == "range":
            continue                        # not modelled on the book's chip (it runs them, unchecked)
        with pytest.raises(DidNotHalt):
            ReferenceMachine(check=False, max_cycles=3000).run(program, [0] * 2048, 8)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spec", ["array=8", "book,gather=1,prefetch=1"])
def test_rtl_equals_the_reference(spec):
    """The chip's RTL on Amaranth's simulator (its Asserts evaluated every cycle, the counters relation
    among them): every directed program gives the reference's result, error state included."""
    from sim.backends.amaranth_backend import AmaranthBackend
    cfg = parse_chip(spec)
    image = [(a * 2654435761) & 0xFFFFFFFF for a in range(2048)]
    rtl = AmaranthBackend(config=cfg, max_cycles=2000)
    for program, pc, kind, info in DIRECTED:
        want = ReferenceMachine(config=cfg, check=False).run(program, image, 8)
        got = rtl.run(program, image, 8)
        assert want.error == ErrorStop(kind, pc, info)
        assert first_difference(want, got) is None, (spec, program)


def test_harness_has_the_error_outputs_on_a_generated_chip_only():
    from hdl.harness import HARNESS_SIGNATURE, harness_signature
    outs = {"error", "error_kind", "error_pc", "error_info"}
    assert not outs & set(HARNESS_SIGNATURE.members)
    assert outs <= set(harness_signature(parse_chip("array=8")).members)
    assert "spad_we" not in harness_signature(parse_chip("array=8")).members


def test_the_fuzz_mix_carries_stop_words():
    cfg = parse_chip("array=8,mm_load=4")
    rng = random.Random(5)
    for _ in range(300):
        assert isa.issue_stop(stop_word(rng, cfg), cfg) is not None
    ref = ReferenceMachine(config=cfg, check=False)
    kinds = [ref.run(c.program, c.image, c.lat).error for c in (fuzz_case(3, i, config=cfg) for i in range(100))]
    stops = [e for e in kinds if e is not None]
    assert STOP_SHARE * 100 / 3 <= len(stops) <= STOP_SHARE * 100 * 3
    # the book's mix is as it was: no stop word
    assert all(fuzz_case(3, i, config=BOOK).program == fuzz_case(3, i).program for i in range(20))
