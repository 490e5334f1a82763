"""The compiler's packed weights (docs/mm-fast.md): on a chip with ``mm_pack=1`` every int8 weight that only
feeds matmuls as their untransposed B operand is stored four int8 a word (byte j % 4 of word j // 4 of its
row, ceil(cols/4) words a row) in the external image, in the scratchpad and in the resident layout, its LD
moves the packed words and its MM tiles read it with ``pb=1``. Nothing a program computes may change: the
readbacks (and a resident serving run's tokens and integer logits) must equal those of the same chip with
``mm_pack=0``, word for word, for fewer cycles, and the compiler's cycle prediction must stay exact.
Reference machine only (the MM unit's pb path against the other simulators is tests/test_mm_fast.py's).
"""
from __future__ import annotations

import pytest

from compiler import CompileError, Graph, compile_graph, ext_image, readback
from compiler.buffers import pack_rows, packed_weights
from compiler.image import quantized_inputs
from hdl import isa
from hdl.arith import s8
from hdl.config import parse_chip
from host import tiny_lm as T
from host.batch import batch_program, universal_ranges
from host.calibrate import calibrate
from sim.backends.reference import ReferenceMachine
from tests.servingutil import batch_inputs, serve_on_chips

M = T.make_model("structured", 1)
MR = T.make_model("random", 2)
# the chip of issue 14's measurements, with and without packing (explicit, whatever `fast` becomes)
PLAIN = parse_chip("array=8,mm_load=4,gather=1,ext_words=16384,mm_rq=1,vadd_ports=2,mm_pack=0")
PACKED = parse_chip("array=8,mm_load=4,gather=1,ext_words=16384,mm_rq=1,vadd_ports=2,mm_pack=1")


def _unpack(words, rows, cols):
    """The int8 matrix that packed `words` hold (the MM unit's reading of pb=1, written independently)."""
    per_row = (cols + 3) // 4
    assert len(words) == rows * per_row
    return [[s8((words[i * per_row + j // 4] >> (8 * (j % 4))) & 0xFF) for j in range(cols)]
            for i in range(rows)]


@pytest.mark.parametrize("rows, words", [
    ([[1, -1, 127, -128]], [0x807FFF01]),
    ([[1, 2, 3, 4, 5]], [0x04030201, 0x05]),
    ([[-2], [3]], [0xFE, 0x03]),
    ([[0, 0, 0, -1, 7, -7]], [0xFF000000, 0xF907]),
])
def test_pack_rows_puts_value_j_in_byte_j_mod_4_of_word_j_div_4(rows, words):
    assert pack_rows(rows) == words
    assert _unpack(words, len(rows), len(rows[0])) == rows


def _check_packed_shape(plain, packed):
    """The packed program is the plain one with the packed weights' LDs shorter and their tiles pb=1."""
    nodes = packed.graph.nodes
    which = packed_weights(packed.graph, packed.config)
    assert packed_weights(plain.graph, plain.config) == frozenset()
    assert which, "nothing was packed"
    assert [isa.operands(w)["op"] for w in packed.code] == [isa.operands(w)["op"] for w in plain.code]
    assert not any(isa.operands(w)["op"] == isa.Op.MM and isa.operands(w)["pb"] for w in plain.code)
    for i, (wp, wq) in enumerate(zip(plain.code, packed.code)):
        op, oq = isa.operands(wp), isa.operands(wq)
        if oq["op"] == isa.Op.MM:
            nid = int(packed.notes[i].split()[1])
            b = nodes[nodes[nid].ins[1]]
            assert oq["pb"] == int(b.id in which), packed.notes[i]
            if oq["pb"]:
                assert oq["tb"] == 0 and oq["ldb"] == (b.cols + 3) // 4 and op["ldb"] == b.cols
            assert (oq["M"], oq["K"], oq["N"], oq["rq"]) == (op["M"], op["K"], op["N"], op["rq"])
        elif oq["op"] == isa.Op.LD:
            e = next(e for e in packed.ext_map.values() if e.address == oq["src"])
            n = nodes[e.node]
            want = n.rows * ((n.cols + 3) // 4) if n.id in which else op["len"]
            assert e.packed == (n.id in which) and oq["len"] == e.words == want, packed.notes[i]
    assert packed.hwm <= plain.hwm


def _run_both(plain, packed, inputs):
    """Both programs on the reference machine of their chips: equal readbacks and output words, the
    packed weights' image words holding the plain image's integers, fewer cycles."""
    outs = []
    for P in (plain, packed):
        image = ext_image(P, inputs, P.ext_size)
        r = ReferenceMachine(config=P.config).run(P.code, image, 8)
        assert r.error is None
        assert list(r.counters) == P.counters(8)        # the compiler's prediction stays exact
        outs.append((P, image, r, readback(P, r.ext)))
    (_, img_a, ra, oa), (_, img_b, rb, ob) = outs
    assert ob == oa
    for name, e in plain.ext_map.items():
        f = packed.ext_map[name]
        if e.kind == "output":
            assert rb.ext[f.address:f.address + f.words] == ra.ext[e.address:e.address + e.words], name
        elif f.packed:
            got = _unpack(img_b[f.address:f.address + f.words], *f.shape)
            assert got == [[s8(w) for w in img_a[e.address + r * f.shape[1]:e.address + (r + 1) * f.shape[1]]]
                           for r in range(f.shape[0])], name
            assert got == quantized_inputs(packed, inputs)[name]
        else:
            assert img_b[f.address:f.address + f.words] == img_a[e.address:e.address + e.words], name
    assert rb.counters[0] < ra.counters[0]
    assert rb.counters[1] < ra.counters[1] and rb.counters[2] < ra.counters[2]     # mm and dma both cheaper
    return ra.counters, rb.counters


@pytest.mark.parametrize("model", ["structured", "random"])
@pytest.mark.parametrize("L", [1, 2, 4, 8, 13])
def test_the_books_decode_graph_gives_the_same_words_for_fewer_cycles(model, L):
    m = M if model == "structured" else MR
    calib, ranges = calibrate(m, 13, None, starts=range(4))
    g = T.build_graph(m, L)
    plain = compile_graph(g, calib[L], ranges=ranges, config=PLAIN)
    packed = compile_graph(g, calib[L], ranges=ranges, config=PACKED)
    _check_packed_shape(plain, packed)
    names = {packed.graph.nodes[i].attrs["name"] for i in packed_weights(g, PACKED)}
    assert names == {"Wq", "Wk", "Wv", "Wo", "W1", "W2", "Wout"}
    for smp in calib[L][:3]:
        _run_both(plain, packed, smp)


BATCHES = [(1,), (5,), (3, 1), (4, 2, 1, 0), (7, 3, 0, 0), (2, 0, 0), (0,), (8, 8, 6, 5, 3, 1, 1)]



@pytest.mark.parametrize("ctxs", BATCHES)
def test_batched_programs_give_the_same_words_for_fewer_cycles(ctxs):
    rng = universal_ranges(M)
    plain = batch_program(M, ctxs, rng, PLAIN)
    packed = batch_program(M, ctxs, rng, PACKED)
    _check_packed_shape(plain, packed)
    for seed in (0, 1):
        _run_both(plain, packed, batch_inputs(M, plain.graph, seed))


def test_resident_serving_gives_the_same_requests_for_fewer_cycles():
    plain, packed = serve_on_chips(M, PLAIN, PACKED)
    assert packed < plain


def test_the_resident_layout_and_load_program_keep_the_weights_packed():
    from compiler.resident import compile_load, plan_layout
    from host.resident import ResidentChip
    g = T.build_graph(M, 1)
    plain, packed = plan_layout(g, PLAIN, 4, 16), plan_layout(g, PACKED, 4, 16)
    assert plain.packed == frozenset() and packed.packed == {"Wq", "Wk", "Wv", "Wo", "W1", "W2", "Wout"}
    for name, (_, words) in packed.weights.items():
        n = next(n for n in g.nodes if n.op == "weight" and n.attrs["name"] == name)
        assert words == n.rows * ((n.cols + 3) // 4) and plain.weights[name][1] == n.size
    assert packed.weight_words() < plain.weight_words()
    assert packed.weights_base - plain.weights_base == plain.weight_words() - packed.weight_words()
    # the load program writes the packed words and one LD moves them; the scratchpad then holds them
    chip = ResidentChip(M, 4, None, page=4, n_pages=16, backend=ReferenceMachine(config=PACKED), config=PACKED)
    rec = chip.load()
    lay = chip.layout
    assert rec["host_words"] == lay.weight_words() == packed.weight_words()
    assert [isa.operands(w)["len"] for w in rec["code"][:-1]] == [lay.weight_words()]
    spad = chip._spad
    for name, (addr, words) in lay.weights.items():
        rows = chip.weights[name][1]
        assert chip.weights[name][2] is True
        assert _unpack(spad[addr:addr + words], len(rows), len(rows[0])) == rows, name
    load = compile_load(lay, chip.program(1, 0, 1))
    n = lay.weight_words()
    assert load.writes == {lay.staging + i: w for i, w in enumerate(spad[lay.weights_base:lay.weights_base + n])}
    # a program that would read a resident weight unpacked is refused
    from compiler.resident import check_same_weights
    other = compile_graph(T.build_graph(M, 2), chip.calib[2], ranges=chip.ranges, config=PLAIN)
    with pytest.raises(CompileError, match="is read one int8 a word, the resident copy is not stored so"):
        check_same_weights(chip.weights, other, "a plain program")


def test_a_weight_read_any_other_way_stays_unpacked():
    # W feeds one matmul as B and another as A (so it stays one value a word); U is transposed (stays);
    # P only as B (packed); all give the plain chip's words
    g = Graph()
    x = g.input("x", (3, 8))
    w = g.weight("W", [[((i * 5 + j) % 7 - 3) / 5 for j in range(8)] for i in range(8)])
    u = g.weight("U", [[((i + 2 * j) % 5 - 2) / 3 for j in range(8)] for i in range(6)])
    p = g.weight("P", [[((3 * i + j) % 9 - 4) / 6 for j in range(6)] for i in range(8)])
    g.output(g.matmul(x, w), "a")
    g.output(g.matmul(w, p), "b")
    g.output(g.matmul(x, u, transpose_b=True), "c")
    smp = {"x": [[(j - 3) / 4 for j in range(8)], [(5 - j) / 3 for j in range(8)], [0.1 * j for j in range(8)]]}
    plain = compile_graph(g, [smp], config=PLAIN)
    packed = compile_graph(g, [smp], config=PACKED)
    assert packed_weights(g, PACKED) == {p}
    _check_packed_shape(plain, packed)
    _run_both(plain, packed, smp)


def test_a_tile_that_is_not_word_aligned_is_refused():
    g = Graph()
    x = g.input("x", (1, 4))
    g.output(g.matmul(x, g.weight("W", [[(i - j) / 4 for j in range(8)] for i in range(4)])), "y")
    smp = {"x": [[0.5, -0.25, 0.125, 1.0]]}
    cfg = parse_chip("array=2,mm_pack=1")
    with pytest.raises(CompileError, match="column 2 of the packed .* is not word-aligned"):
        compile_graph(g, [smp], config=cfg)
    compile_graph(g, [smp], config=parse_chip("array=4,mm_pack=1"))        # aligned at 4


@pytest.mark.parametrize("spec", ["book,mm_pack=1", "book,mm_rq=1,mm_pack=1"])
def test_random_graphs_give_the_interpreters_words_with_packed_weights(spec):
    # tests/test_random_graphs.py's graphs (int4 weights, slices, concats, relus, softmaxes, adds, argmaxes;
    # weights of any width, so rows padded to whole words) on the book's chip with packing, with and without
    # fused requantization: 4x4 tiles, so packed tiles at word offsets 1, 2, ...; the interpreter never
    # looks at the code and the image it starts from is the packed one
    from test_random_graphs import expected_memory, random_graph
    cfg = parse_chip(spec)
    plain_cfg = parse_chip(spec.replace("mm_pack=1", "mm_pack=0"))
    packed_cycles = plain_cycles = graphs = tiles = padded = wide = 0
    for seed in range(200):
        g, sample = random_graph(seed)
        P = compile_graph(g, [sample], config=cfg)
        which = packed_weights(g, cfg)
        r = ReferenceMachine(config=cfg).run(P.code, ext_image(P, sample, P.ext_size), 8)
        assert list(r.ext) == expected_memory(P, sample), f"seed {seed}\n{P.listing()}"
        assert list(r.counters) == P.counters(8), seed
        if which:
            graphs += 1
            tiles += sum(1 for w in P.code if isa.operands(w)["op"] == isa.Op.MM and isa.operands(w)["pb"])
            padded += sum(1 for i in which if g[i].cols % 4)            # rows padded to whole words
            wide += sum(1 for i in which if g[i].cols > 4)              # tiles at word offsets 1, 2, ...
            packed_cycles += r.counters[0]
            plain_cycles += compile_graph(g, [sample], config=plain_cfg).counters(8)[0]
    assert graphs >= 30 and tiles >= graphs and padded >= 5 and wide >= 5 and packed_cycles < plain_cycles
