"""The compiler's fused requantization (docs/fused-rq.md): on a chip with ``mm_rq=1`` every matmul is one RQC
(when the MM unit does not already hold its parameters) and MM tiles with rq=1 writing the int8 result in
place, with no accumulator and no RQ. The arithmetic is the RQ's, so everything a program writes to the
external memory must be the unfused program's, word for word, for fewer cycles; the cycle prediction
(`Program.counters`) must stay exact. Reference machine only (the MM unit's rq path against the other
simulators is tests/test_fused_rq.py's).
"""
from __future__ import annotations

import pytest

from compiler import compile_graph, ext_image, readback
from hdl import isa
from hdl.config import BOOK, parse_chip
from host import tiny_lm as T
from host.batch import batch_program, universal_ranges
from host.calibrate import calibrate
from host.engine import Engine, Request
from host.paged import PagedChip
from host.resident import ResidentChip
from sim.backends.reference import ReferenceMachine
from test_random_graphs import expected_memory, random_graph

M = T.make_model("structured", 1)
MR = T.make_model("random", 2)
BOOK_RQ = parse_chip("book,mm_rq=1")     # 4x4 tiles: the random graphs' M and N up to 12 take several
# explicit mm_rq on both sides: the comparison stays one of fused against unfused whatever `fast` becomes
PLAIN = parse_chip("array=8,mm_load=4,gather=1,ext_words=16384,mm_rq=0")
FUSED = parse_chip("array=8,mm_load=4,gather=1,ext_words=16384,mm_rq=1")


def _ops(P):
    return [isa.Op(isa.operands(w)["op"]) for w in P.code]


def _check_fused_shape(plain, fused):
    """The fused program is the plain one without the matmuls' RQs, with RQCs, and with rq=1 on every MM."""
    nodes = plain.graph.nodes
    mm_nodes = [n.id for n in nodes if n.op == "matmul"]
    plain_ops, fused_ops = _ops(plain), _ops(fused)
    assert isa.Op.RQC not in plain_ops
    assert all(isa.operands(w)["rq"] == 0 for w in plain.code if isa.operands(w)["op"] == isa.Op.MM)
    assert all(isa.operands(w)["rq"] == 1 for w in fused.code if isa.operands(w)["op"] == isa.Op.MM)
    assert fused_ops.count(isa.Op.MM) == plain_ops.count(isa.Op.MM)
    assert fused_ops.count(isa.Op.RQ) == plain_ops.count(isa.Op.RQ) - len(mm_nodes)
    assert 1 <= fused_ops.count(isa.Op.RQC) <= len(mm_nodes)
    assert not any(note.endswith(" requant") for note in fused.notes)
    # an RQC only where the latched parameters change, and each MM after the RQC of its node's parameters
    latched = None
    for w, note in zip(fused.code, fused.notes):
        o = isa.operands(w)
        if o["op"] == isa.Op.RQC:
            assert (o["m"], o["s"], o["relu"]) != latched, note
            latched = (o["m"], o["s"], o["relu"])
        elif o["op"] == isa.Op.MM:
            nid = int(note.split()[1])
            assert latched == (*fused.rq_params[nid], int(nid in fused.relu_fused)), note
    assert fused.rq_params == plain.rq_params and fused.relu_fused == plain.relu_fused
    assert fused.hwm <= plain.hwm


def _run_both(plain, fused, inputs):
    """Run both programs on the reference machine of their chips; the external memories must be equal."""
    outs = []
    for P in (plain, fused):
        r = ReferenceMachine(config=P.config).run(P.code, ext_image(P, inputs, P.ext_size), 8)
        assert r.error is None
        assert list(r.counters) == P.counters(8)        # the compiler's prediction stays exact
        outs.append((r, readback(P, r.ext)))
    (ra, oa), (rb, ob) = outs
    assert ob == oa
    assert list(rb.ext) == list(ra.ext)
    assert rb.counters[0] < ra.counters[0]
    assert rb.counters[3] < ra.counters[3]              # the RQs' vector cycles are gone
    return ra.counters, rb.counters


@pytest.mark.parametrize("model", ["structured", "random"])
@pytest.mark.parametrize("L", [1, 2, 4, 8, 13])
def test_the_books_decode_graph_gives_the_same_words_for_fewer_cycles(model, L):
    m = M if model == "structured" else MR
    calib, ranges = calibrate(m, 13, None, starts=range(4))
    g = T.build_graph(m, L)
    plain = compile_graph(g, calib[L], ranges=ranges, config=PLAIN)
    fused = compile_graph(g, calib[L], ranges=ranges, config=FUSED)
    _check_fused_shape(plain, fused)
    for smp in calib[L][:3]:
        _run_both(plain, fused, smp)


BATCHES = [(1,), (5,), (3, 1), (4, 2, 1, 0), (7, 3, 0, 0), (2, 0, 0), (0,), (8, 8, 6, 5, 3, 1, 1)]


def _batch_inputs(g, seed):
    """Inputs of a batched graph: embeddings for x, small varied rows elsewhere (zk/zv zero)."""
    out = {}
    for n in g.inputs():
        name, (rows, cols) = n.attrs["name"], n.shape
        if name == "x":
            out[name] = [M["E"][(5 * r + seed) % T.V] for r in range(rows)]
        elif name in ("zk", "zv"):
            out[name] = [[0.0] * cols]
        else:
            out[name] = [[0.07 * (((r + 3) * (c + seed) * 7) % 11 - 5) for c in range(cols)] for r in range(rows)]
    return out


@pytest.mark.parametrize("ctxs", BATCHES)
def test_batched_programs_give_the_same_words_for_fewer_cycles(ctxs):
    rng = universal_ranges(M)
    plain = batch_program(M, ctxs, rng, PLAIN)
    fused = batch_program(M, ctxs, rng, FUSED)
    _check_fused_shape(plain, fused)
    for seed in (0, 1):
        _run_both(plain, fused, _batch_inputs(plain.graph, seed))


def test_resident_serving_gives_the_same_requests_for_fewer_cycles():
    kw = dict(max_batch=4, window=4, sinks=1, page=2, n_pages=12)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    reqs = [Request(0, [7, 1, 4, 4, 2], 4, 0), Request(1, [7, 1, 4, 4, 2, 9], 3, 0), Request(2, [2, 2], 5, 1),
            Request(3, [9], 3, 2), Request(4, prompt, 3, 3), Request(5, prompt[:5] + [0], 2, 6)]
    res = {cfg.mm_rq: Engine(M, ReferenceMachine(config=cfg), config=cfg, mode="resident", **kw).run(reqs)
           for cfg in (PLAIN, FUSED)}
    keys = ("tokens", "logits_int", "preempted", "prefix_hit_rows")
    assert [[r[k] for k in keys] for r in res[1]["requests"]] == [[r[k] for k in keys] for r in res[0]["requests"]]
    assert all(r["tokens"] for r in res[1]["requests"])
    assert res[1]["total_cycles"] < res[0]["total_cycles"]


@pytest.mark.parametrize("host", [PagedChip, ResidentChip])
def test_the_decode_hosts_give_the_same_tokens_and_logits_for_fewer_cycles(host):
    # the book-mode host (PagedChip: the whole image every step) and the resident one (compiler.resident's
    # step programs: GATHER/SCATTER around the book's lowering), window 4, every step
    out = {}
    for cfg in (PLAIN, FUSED):
        chip = host(M, 10, 4, page=4, backend=ReferenceMachine(config=cfg), config=cfg)
        out[cfg.mm_rq] = chip.generate(0, 10)
    (tp, rp), (tf, rf) = out[0], out[1]
    assert tf == tp
    assert [r["logits_int"] for r in rf] == [r["logits_int"] for r in rp]
    assert all(f["counters"][0] < p["counters"][0] for f, p in zip(rf, rp))


def test_an_rqc_is_skipped_only_when_the_unit_holds_its_parameters():
    # three equal matmuls in a row: one RQC for all; a fourth with a relu needs its own
    from compiler import Graph
    g = Graph()
    x = g.input("x", (2, 8))
    w = g.weight("W", [[((i * 3 + j) % 5 - 2) / 4 for j in range(8)] for i in range(8)])
    a = g.matmul(x, w)
    b = g.matmul(x, w)
    c = g.matmul(x, w)
    d = g.relu(g.matmul(x, w))
    for i, t in enumerate((a, b, c, d)):
        g.output(t, f"o{i}")
    smp = {"x": [[(j - 3) / 4 for j in range(8)], [(5 - j) / 3 for j in range(8)]]}
    plain = compile_graph(g, [smp], config=PLAIN)
    fused = compile_graph(g, [smp], config=FUSED)
    _check_fused_shape(plain, fused)
    rqc = [isa.operands(w) for w in fused.code if isa.operands(w)["op"] == isa.Op.RQC]
    assert len(set(plain.rq_params.values())) == 1
    assert [o["relu"] for o in rqc] == [0, 1]
    _run_both(plain, fused, smp)


def test_random_graphs_give_the_interpreters_words_with_fused_requantization():
    # tests/test_random_graphs.py's graphs (int4 weights, slices, concats, relus, softmaxes, adds, argmaxes)
    # on the book's chip with mm_rq=1: 4x4 tiles, so matmuls of several tile rows and columns, results
    # written into concat and relu buffers; the interpreter never looks at the code
    fused_cycles = plain_cycles = matmuls = 0
    for seed in range(150):
        g, sample = random_graph(seed)
        plain = compile_graph(g, [sample], config=BOOK)
        fused = compile_graph(g, [sample], config=BOOK_RQ)
        if any(n.op == "matmul" for n in g.nodes):
            matmuls += 1
            _check_fused_shape(plain, fused)
        want = expected_memory(fused, sample)
        assert want == expected_memory(plain, sample)
        r = ReferenceMachine(config=BOOK_RQ).run(fused.code, ext_image(fused, sample, fused.ext_size), 8)
        assert list(r.ext) == want, f"seed {seed}\n{fused.listing()}"
        assert list(r.counters) == fused.counters(8), seed
        fused_cycles += r.counters[0]
        plain_cycles += plain.counters(8)[0]
    assert matmuls >= 100 and fused_cycles < plain_cycles
