"""A directed program run on the whole chip in Amaranth's simulator against the reference machine (the check
that test_mm_fast, test_spad_lanes and test_vec_lanes make of their chips), and the fixed chip those
parameters' tests start from."""
from __future__ import annotations

import random
from dataclasses import replace

from hdl import isa
from hdl.config import PRESETS
from sim.backends import first_difference, get_backend
from sim.backends.reference import ReferenceMachine

__all__ = ["amaranth_chip_equals_reference", "FAST_PRE_LANES", "fast_with"]

# The fast preset as issue 23 found it, before packed C, drain and vector lanes, the broadcast array, the
# fold and the wide external port: the chip the tests of those parameters add them to, so that each test names
# the same chip whatever the preset becomes (the preset took all six in issue 23).
FAST_PRE_LANES = replace(PRESETS["fast"], mm_pack_c=0, spad_lanes=1, vec_lanes=1, mm_bcast=0, mm_fold=0,
                         ext_port=1)


def fast_with(**overrides):
    """`FAST_PRE_LANES` with `overrides` (ChipConfig's fields), validated as a chip."""
    return replace(FAST_PRE_LANES, **overrides)


def amaranth_chip_equals_reference(cfg, words, seed, counter: int, ops, lat: int = 3) -> None:
    """Run `words` on the reference machine and on the Amaranth chip `cfg` from one 2048-word image (random
    words and sign-extended int8, drawn from `seed`); assert that both end the same (memory, counters) and
    that counter `counter` of the five is the sum of `hdl.isa.busy_cycles` over the instructions whose opcode
    is in `ops` (the unit's cycle model, instruction by instruction)."""
    rng = random.Random(seed)
    image = [rng.choice((rng.getrandbits(32), rng.randint(-128, 127) & 0xFFFFFFFF)) for _ in range(2048)]
    want = ReferenceMachine(config=cfg).run(words, image, lat)
    got = get_backend("amaranth", config=cfg).run(words, image, lat)
    assert first_difference(want, got) is None
    assert want.counters[counter] == sum(isa.busy_cycles(w, lat, cfg) for w in words
                                         if isa.operands(w)["op"] in ops)
