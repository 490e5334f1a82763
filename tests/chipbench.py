"""A directed program run on the whole chip in Amaranth's simulator against the reference machine (the check
that test_mm_fast, test_spad_lanes and test_vec_lanes make of their chips)."""
from __future__ import annotations

import random

from hdl import isa
from sim.backends import first_difference, get_backend
from sim.backends.reference import ReferenceMachine

__all__ = ["amaranth_chip_equals_reference"]


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
