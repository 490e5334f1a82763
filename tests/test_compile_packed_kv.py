"""The compiler's packed activations (docs/mm-pack-c.md): on a chip with ``mm_pack_c=1`` the K and V rows are
kept four int8 a word. The matmuls that make them write them with ``pc=1``, the attention matmuls read them
with ``pb=1`` (the keys transposed), the loads and stores move the packed words, and in resident mode a pool
row is ceil(D/4) words, so GATHER and SCATTER move a quarter of the words. Nothing a program computes may
change: readbacks, tokens and integer logits equal those of the same chip without packing, word for word,
and the compiler's cycle prediction stays exact. Reference machine only.
"""
from __future__ import annotations

import pytest

from compiler import Graph, compile_graph, ext_image, readback
from compiler.buffers import pack_rows, packed_activations, unpack_rows
from compiler.interp import interpret_readback
from hdl import isa
from host import tiny_lm as T
from host.batch import batch_program, universal_ranges
from host.calibrate import calibrate
from sim.backends.reference import ReferenceMachine
from tests.servingutil import batch_inputs, serve_on_chips
from chipbench import FAST_PRE_LANES, fast_with

M = T.make_model("structured", 1)
MR = T.make_model("random", 2)
PLAIN = FAST_PRE_LANES                  # pool rows one int8 a word
KV = fast_with(mm_pack_c=1)


def _names(g, ids):
    return {g.nodes[i].attrs["name"] for i in ids if g.nodes[i].op in ("input", "output")}


@pytest.mark.parametrize("rows", [[[1, -1, 127, -128, 5]], [[-3, 0, 2], [4, -5, 6]], [[0]]])
def test_unpack_rows_inverts_pack_rows(rows):
    assert unpack_rows(pack_rows(rows), len(rows), len(rows[0])) == rows


@pytest.mark.parametrize("L", [1, 2, 5])
def test_the_k_and_v_groups_are_packed_and_nothing_else(L):
    g = T.build_graph(M, L)
    assert packed_activations(g, PLAIN) == frozenset()
    acts = packed_activations(g, KV)
    want = {"k_new", "v_new"} | ({"kc", "vc"} if L > 1 else set())
    assert _names(g, acts) == want
    ops = sorted(g.nodes[i].op for i in acts)
    assert ops.count("matmul") == 2 and ops.count("concat") == (2 if L > 1 else 0)


def test_a_group_with_any_other_reader_stays_unpacked():
    # k feeds an add as well: its whole group (the cache input too) keeps one value a word; v's group is
    # packed, and so is the attention's result a, which only the host reads
    g = Graph()
    x = g.input("x", (1, 4))
    k = g.matmul(x, g.weight("Wk", [[0.1 * (i - j) for j in range(8)] for i in range(4)]))
    v = g.matmul(x, g.weight("Wv", [[0.1 * (i + j) for j in range(8)] for i in range(4)]))
    keys = g.concat_rows(g.input("kc", (2, 8)), k)
    vals = g.concat_rows(g.input("vc", (2, 8)), v)
    p = g.softmax(g.matmul(g.input("q", (1, 8)), keys, transpose_b=True))
    g.output(g.matmul(p, vals), "a")
    g.output(g.add(k, k), "kk")
    g.output(k, "k_new")
    g.output(v, "v_new")
    assert _names(g, packed_activations(g, KV)) == {"vc", "v_new", "a"}


def _run(P, inputs):
    image = ext_image(P, inputs, P.ext_size)
    r = ReferenceMachine(config=P.config).run(P.code, image, 8)
    assert r.error is None
    assert list(r.counters) == P.counters(8)            # the compiler's prediction stays exact
    return r, readback(P, r.ext)


@pytest.mark.parametrize("model", ["structured", "random"])
@pytest.mark.parametrize("L", [1, 2, 4, 9])
def test_the_books_decode_graph_reads_back_the_same_for_fewer_words(model, L):
    m = M if model == "structured" else MR
    calib, ranges = calibrate(m, 9, None, starts=range(3))
    g = T.build_graph(m, L)
    plain = compile_graph(g, calib[L], ranges=ranges, config=PLAIN)
    packed = compile_graph(g, calib[L], ranges=ranges, config=KV)
    mms = [(isa.operands(w), int(note.split()[1])) for w, note in zip(packed.code, packed.notes)
           if isa.operands(w)["op"] == isa.Op.MM]
    tagged = {n.id: n.attrs.get("tag") for n in g.nodes}
    assert {tagged[nid] for o, nid in mms if o["pc"]} == {"k", "v"}     # the tiles of k and v
    assert len({nid for o, nid in mms if o["pc"]}) == 2
    assert len({nid for o, nid in mms if o["pb"] and o["tb"]}) == 1     # the scores read the keys transposed
    assert packed.ext_map["k_new"].words == 4 and packed.ext_map["k_new"].packed
    for smp in calib[L][:2]:
        ra, oa = _run(plain, smp)
        rb, ob = _run(packed, smp)
        assert ob == oa == interpret_readback(packed, smp)
        if L > 1:
            assert rb.counters[2] < ra.counters[2]              # the cache's loads move a quarter
        # the stored rows are the plain program's integers, four a word
        e, f = plain.ext_map["k_new"], packed.ext_map["k_new"]
        assert unpack_rows(rb.ext[f.address:f.address + f.words], 1, T.D) == \
            [[v - 256 if v & 0x80 else v for v in (w & 0xFF for w in ra.ext[e.address:e.address + e.words])]]


@pytest.mark.parametrize("ctxs", [(1,), (5,), (3, 1), (4, 2, 1, 0), (2, 0, 0)])
def test_batched_programs_read_back_the_same(ctxs):
    rng = universal_ranges(M)
    plain, packed = batch_program(M, ctxs, rng, PLAIN), batch_program(M, ctxs, rng, KV)
    for seed in (0, 1):
        inputs = batch_inputs(M, plain.graph, seed)
        assert _run(packed, inputs)[1] == _run(plain, inputs)[1]


def test_resident_serving_gives_the_same_requests_with_a_quarter_of_the_pool_words():
    plain, packed = serve_on_chips(M, PLAIN, KV)
    assert packed < plain


def test_the_resident_layout_keeps_rows_of_a_quarter_of_the_words():
    from compiler.resident import plan_layout
    g = T.build_graph(M, 1)
    plain, packed = plan_layout(g, PLAIN, 4, 16), plan_layout(g, KV, 4, 16)
    assert (plain.row_words, packed.row_words) == (T.D, T.D // 4)
    assert plain.pool_words == 4 * packed.pool_words
