"""The resident batch program's phase schedule (docs/resident.md): the full rows' attention lowered phase by
phase (every GATHER into a block of its own, one RQC and every scores matmul, every softmax and ONE RQ over
all their probabilities, one RQC and every p . V matmul) gives the integers of the row-by-row program."""
from __future__ import annotations

import random

import pytest

from hdl import isa
from hdl.config import PRESETS
from host import tiny_lm as T
from host.batch_resident import ResidentBatchRunner
from sim.backends.reference import ReferenceMachine

pytestmark = pytest.mark.timeout(120)

M = T.make_model("structured", 1)
FAST = PRESETS["fast"]
PAGE, PAGES = 4, 64


class RowByRow(ResidentBatchRunner):
    """The same runner with the rows attending one after the other (the schedule before the phases)."""

    def _compile(self, ctxs, specs, phases=None):
        return super()._compile(ctxs, specs, False)


def _serve(runner_cls, ctxs, seed=5):
    """Fill each request's cached rows with cache-only rows, then run one batch of a full row per request
    and two cache-only rows; the runner, the batch's results and its program."""
    r = runner_cls(M, ReferenceMachine(config=FAST), 8, FAST, PAGE, PAGES, 8)
    rnd = random.Random(seed)
    tables = [[2 * j, 2 * j + 1] for j in range(len(ctxs) + 1)]
    fill = [(rnd.randrange(T.V), tables[j], None, row) for j, n in enumerate(ctxs) for row in range(n - 1)]
    for i in range(0, len(fill), 8):
        r.run(fill[i:i + 8])
    rows = [(rnd.randrange(T.V), tables[j], [(0, n - 1)] if n > 1 else [], n - 1) for j, n in enumerate(ctxs)]
    rows += [(rnd.randrange(T.V), tables[-1], None, k) for k in range(8 - len(ctxs))]
    res, counters, P = r.run(rows)
    assert counters == P.counters(8)
    return r, res, P


def _ops(P):
    return [isa.operands(w) for w in P.code]


def test_the_phase_schedule_has_one_rq_and_two_rqcs_for_the_rows_attention():
    ctxs = (5, 5, 4, 3, 2, 1)
    F = len(ctxs)
    runner, phased, P = _serve(ResidentBatchRunner, ctxs)
    pool_row = runner.layout.pool_row_words
    _, rowwise, R = _serve(RowByRow, ctxs)
    # the same integers: tokens and logits of every row
    assert [x["logits_int"] for x in phased] == [x["logits_int"] for x in rowwise]
    assert [x["tok"] for x in phased] == [x["tok"] for x in rowwise]
    count = {}
    for prog, name in ((P, "phased"), (R, "row by row")):
        ops = [isa.Op(o["op"]) for o in _ops(prog)]
        count[name] = {op: ops.count(op) for op in (isa.Op.RQC, isa.Op.RQ, isa.Op.SM, isa.Op.GATHER)}
    # row by row each full row latches the scores' constants and the attention's (2 F RQCs) and requantizes
    # its softmax (F RQs); phased, one RQC a phase and one RQ for all
    assert count["phased"][isa.Op.RQC] == count["row by row"][isa.Op.RQC] - 2 * F + 2
    assert count["phased"][isa.Op.RQ] == count["row by row"][isa.Op.RQ] - F + 1
    assert count["phased"][isa.Op.SM] == count["row by row"][isa.Op.SM] == F
    # the order: every scores matmul (tb = 1) before every softmax, the one RQ after the last softmax and
    # before every attention matmul, which reads its row's slice of the RQ's words
    ops = _ops(P)
    at = {name: [i for i, o in enumerate(ops) if o["op"] == op] for name, op in
          (("sm", isa.Op.SM), ("gather", isa.Op.GATHER), ("rq", isa.Op.RQ), ("rqc", isa.Op.RQC))}
    scores = [i for i, o in enumerate(ops) if o["op"] == isa.Op.MM and o["tb"] == 1]
    rq = [i for i in at["rq"] if at["sm"][-1] < i][0]
    assert ops[rq]["len"] == sum(ctxs)
    attention = [i for i, o in enumerate(ops) if o["op"] == isa.Op.MM and i > rq and o["tb"] == 0 and o["M"] == 1
                 and o["A"] in range(ops[rq]["dst"], ops[rq]["dst"] + sum(ctxs))]
    assert len(scores) == len(attention) == F
    assert max(scores) < min(at["sm"]) and max(at["sm"]) < rq < min(attention)
    assert sorted(ops[i]["A"] - ops[rq]["dst"] for i in attention) == [sum(ctxs[:j]) for j in range(F)]
    # one RQC latches each phase's constants: none between the scores matmuls, none between the p . V ones
    assert not [i for i in at["rqc"] if min(scores) < i < max(scores) or min(attention) < i < max(attention)]
    # each row's GATHERs write a block of its own (the blocks are live at once): no two overlap
    spans = sorted((ops[i]["spad"], ops[i]["spad"] + (ops[i]["hi"] - ops[i]["lo"]) * pool_row) for i in at["gather"])
    assert len(spans) == F - ctxs.count(1)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


def test_rows_whose_blocks_do_not_fit_side_by_side_attend_one_after_the_other():
    r = ResidentBatchRunner(M, ReferenceMachine(config=FAST), 8, FAST, PAGE, 128, 8)
    # eight rows of 60 cached rows: their blocks side by side need more than the allocator's scratchpad
    rows = [(1, list(range(15 * j, 15 * j + 15)), [(0, 59)], 59) for j in range(8)]
    P, _ = r.program_for(rows)
    ops = _ops(P)
    gathers = {o["spad"] for o in ops if o["op"] == isa.Op.GATHER}
    assert len(gathers) == 1
    assert sum(1 for o in ops if o["op"] == isa.Op.RQC) >= 2 * 8



def _softmax_graph(phased):
    """Two rows' scores (3 and 5 keys) and softmaxes, consecutive (`phased`) or each after its scores."""
    from compiler import Graph
    rnd = random.Random(2)
    g = Graph()
    x = g.input("x", (1, 8))
    ws = [g.weight(f"W{j}", [[rnd.uniform(-1, 1) for _ in range(n)] for _ in range(8)]) for j, n in enumerate((3, 5))]
    if phased:
        probs = [g.softmax(s) for s in [g.matmul(x, w) for w in ws]]
    else:
        probs = [g.softmax(g.matmul(x, w)) for w in ws]
    for j, p in enumerate(probs):
        g.output(p, f"p{j}")
    return g


def test_consecutive_softmaxes_share_one_rq_with_the_same_integers():
    from compiler import compile_graph, ext_image, readback
    sample = {"x": [[0.5, -0.25, 1.0, 0.75, -1.0, 0.125, 0.3, -0.6]]}
    out, rqs = {}, {}
    for phased in (False, True):
        P = compile_graph(_softmax_graph(phased), [sample])
        result = ReferenceMachine().run(P.code, ext_image(P, sample), 8)
        out[phased] = {k: v[0] for k, v in readback(P, result.ext).items()}
        rqs[phased] = sorted(isa.operands(w)["len"] for w, note in zip(P.code, P.notes) if "Q0.16->int8" in note)
    assert out[True] == out[False]
    # row by row one RQ a softmax; phased one RQ of their 3 + 5 words
    assert rqs[False] == [3, 5]
    assert rqs[True] == [8]
