"""Resident serving takes each token on the host (docs/serving.md): the batch programs have no AMAX and store
no tok; the host applies `hdl.arith.argmax_first`, the function AMAX computes, to the integer logits it reads
anyway. The same batch with the argmax on the chip must give the same tokens and logits, for more cycles.
Reference machine only."""
from __future__ import annotations

import pytest

from compiler import compile_graph, ext_image, readback
from hdl import isa
from hdl.arith import argmax_first
from hdl.config import parse_chip
from host import tiny_lm as T
from host.batch import _dummy_sample, build_batch_graph, universal_ranges
from host.batch_resident import ResidentBatchRunner
from sim.backends.reference import ReferenceMachine

M = T.make_model("structured", 1)
MR = T.make_model("random", 3)
FAST = parse_chip("fast")


def _ops(P):
    return [isa.operands(w)["op"] for w in P.code]


@pytest.mark.parametrize("m", [M, MR], ids=["structured", "random"])
@pytest.mark.parametrize("ctxs", [(1,), (4,), (3, 2), (5, 3, 1, 0)])
def test_the_hosts_token_is_the_chips_argmax(m, ctxs):
    rng = universal_ranges(m)
    progs = {}
    for chip_argmax in (True, False):
        g = build_batch_graph(m, ctxs, chip_argmax=chip_argmax)
        progs[chip_argmax] = compile_graph(g, [_dummy_sample(g)], ranges=rng, config=FAST)
    assert isa.Op.AMAX in _ops(progs[True]) and isa.Op.AMAX not in _ops(progs[False])
    assert "tok" not in progs[False].ext_map
    full = sum(1 for n in ctxs if n)
    for seed in range(3):
        inputs = {}
        for n in progs[True].graph.inputs():
            name, (rows, cols) = n.attrs["name"], n.shape
            inputs[name] = ([m["E"][(5 * r + seed) % T.V] for r in range(rows)] if name == "x" else
                            [[0.0] * cols] if name in ("zk", "zv") else
                            [[0.04 * (((r + 3) * (c + seed + 2) * 7) % 11 - 5) for c in range(cols)]
                             for r in range(rows)])
        outs, cycles = {}, {}
        for k, P in progs.items():
            r = ReferenceMachine(config=FAST).run(P.code, ext_image(P, inputs, P.ext_size), 8)
            outs[k], cycles[k] = readback(P, r.ext), r.counters[0]
        assert outs[False]["logits"] == outs[True]["logits"]
        chip_tokens = [row[0] for row in outs[True]["tok"][0]]
        assert [argmax_first(row) for row in outs[False]["logits"][0]] == chip_tokens
        assert len(chip_tokens) == full
        assert cycles[False] < cycles[True]


def test_the_resident_runner_runs_no_amax():
    runner = ResidentBatchRunner(M, ReferenceMachine(config=FAST), 8, FAST, page=4, n_pages=16, max_batch=4)
    rows = [(3, [0], [], 0), (5, [1], [], 0)]
    res, _, P = runner.run(rows)
    assert isa.Op.AMAX not in _ops(P)
    assert [r["tok"] for r in res] == [argmax_first(r["logits_int"]) for r in res]
