"""vadd_ports (docs/vadd-ports.md): VADD reading src1[i] and src2[i] in one cycle through two scratchpad
read ports. The configuration, the cycle model and the reference machine here; the unit itself below.

The contract: on a chip with ``vadd_ports = 2`` a VADD of n elements is busy n + 2 cycles (2n + 2 with
one port, the book's), and what it writes is the same as with one port for every operand placement,
partial overlaps included (the unit forwards its last sum when dst = src2 + 1, docs/vadd-ports.md).
"""
import random
from dataclasses import replace

import pytest

from hdl import isa
from hdl.config import BOOK, ChipConfig, ChipSpecError, parse_chip
from sim.backends.reference import ReferenceMachine

FAST2 = parse_chip("fast,vadd_ports=2")
BOOK2 = replace(BOOK, vadd_ports=2)


# ---- configuration -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, 3, 4, -1])
def test_bad_vadd_ports_names_the_value(value):
    with pytest.raises(ValueError) as e:
        ChipConfig(vadd_ports=value)
    assert str(e.value) == f"ChipConfig vadd_ports must be 1 or 2, not {value}"
    with pytest.raises(ChipSpecError) as e:
        parse_chip(f"fast,vadd_ports={value}")
    assert str(e.value) == (f"--chip 'fast,vadd_ports={value}': ChipConfig vadd_ports must be 1 or 2, "
                            f"not {value}")


def test_vadd_ports_in_the_spec_and_the_read_ports():
    assert BOOK.vadd_ports == 1 and BOOK.spad_reads == 1
    assert FAST2.spec() == "array=8,mm_load=4,ext_words=16384,gather=1,vadd_ports=2"
    assert parse_chip(FAST2.spec()) == FAST2
    assert BOOK2.spec() == "vadd_ports=2" and parse_chip("vadd_ports=2") == BOOK2
    # the scratchpad's read ports: MM's mm_load, or VADD's two when mm_load is 1
    assert [parse_chip(s).spad_reads for s in ("book", "vadd_ports=2", "mm_load=2", "mm_load=2,vadd_ports=2",
                                               "mm_load=4,vadd_ports=2", "fast")] == [1, 2, 2, 2, 4, 4]


# ---- the cycle model -----------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, n, busy", [
    (BOOK, 1, 4), (BOOK, 7, 16), (BOOK, 4096, 8194),
    (BOOK2, 1, 3), (BOOK2, 7, 9), (BOOK2, 4096, 4098),
    (FAST2, 1, 3), (FAST2, 64, 66),
    (parse_chip("fast"), 64, 130),
])
def test_vadd_busy_cycles(cfg, n, busy):
    ins = isa.vadd(0, 0, 0, n)
    assert isa.vadd_busy_cycles(n, cfg) == busy
    assert isa.busy_cycles(ins, 8, cfg) == busy
    assert isa.busy_cycles(isa.encode(ins), 3, cfg) == busy          # LAT does not enter


def test_only_vadd_changes_with_vadd_ports():
    others = [isa.ld(0, 0, 9), isa.st(0, 0, 9), isa.rq(0, 0, 9, 1 << 23, 24), isa.sm(0, 0, 9),
              isa.amax(0, 0, 9), isa.unpack(0, 0, 9), isa.mm(0, 0, 100, 4, 9, 4), isa.halt()]
    for cfg in (BOOK, parse_chip("fast")):
        for ins in others:
            assert isa.busy_cycles(ins, 8, replace(cfg, vadd_ports=2)) == isa.busy_cycles(ins, 8, cfg)


# ---- the reference machine -----------------------------------------------------------------------

def _vadd_program(rng, spad_depth=4096):
    """A few LDs of random words, VADDs of every placement (disjoint, in place, dst = src +- 1), STs of
    everything they wrote, HALT. Returns (program, image, [VADD lengths])."""
    ext = [rng.getrandbits(32) for _ in range(2048)]
    prog = [isa.ld(0, 0, 1024), isa.ld(1024, 1024, 1024)]
    lens = []
    for k in range(12):
        n = rng.choice([1, 2, 3, rng.randint(4, 200)])
        s1, s2 = rng.randrange(0, 1800 - n), rng.randrange(0, 1800 - n)
        dst = rng.choice([s1, s2, s1 + 1, s2 + 1, s2 - 1, s1 - 1, rng.randrange(0, 1800 - n)])
        dst = min(max(dst, 0), 1800 - n)
        prog.append(isa.vadd(dst, s1, s2, n))
        lens.append(n)
    prog += [isa.st(0, 0, 1800), isa.halt()]
    return [isa.encode(i) for i in prog], ext, lens


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reference_same_words_and_n_fewer_cycles_per_vadd(seed):
    prog, image, lens = _vadd_program(random.Random(seed))
    for one in (BOOK, parse_chip("fast")):
        two = replace(one, vadd_ports=2)
        a = ReferenceMachine(config=one).run(prog, image, 8)
        b = ReferenceMachine(config=two).run(prog, image, 8)
        assert b.ext == a.ext and b.scratchpad == a.scratchpad
        saved = sum(lens)
        assert b.counters == [a.counters[0] - saved, a.counters[1], a.counters[2], a.counters[3] - saved,
                              a.counters[4]]
