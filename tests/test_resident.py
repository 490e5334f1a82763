"""Resident mode (issue 13) end to end on the reference machine: the same tokens and integer logits as
the book's mode, paged == plain, the pool's rows equal the book's requantized kc/vc, host words, the
chip-side copy-on-write, the error stop on a bad block table, and the commands' refusals.
"""
from __future__ import annotations

import json

import pytest

from compiler import CompileError
from compiler.resident import compile_step, plan_layout
from hdl import isa
from hdl.config import BOOK, PRESETS, ChipConfig
from host import tiny_lm as T
from host.paged import PagedChip
from host.resident import ResidentChip, ResidentError
from sim.backends import ErrorStop
from sim.cli import guarded
from sim.backends.reference import ReferenceMachine
from chipbench import FAST_PRE_LANES

FAST = PRESETS["fast"]


def _book(m, steps, W, page=4, paged=True, force=None, cfg=FAST):
    chip = PagedChip(m, steps, W, page=page, paged=paged, backend=ReferenceMachine(config=cfg), config=cfg)
    return chip, chip.generate(force[0] if force else 0, steps, force=force)


def _resident(m, steps, W, page=4, n_pages=64, force=None, cfg=FAST):
    chip = ResidentChip(m, steps, W, page=page, n_pages=n_pages, backend=ReferenceMachine(config=cfg),
                        config=cfg)
    return chip, chip.generate(force[0] if force else 0, steps, force=force)


MODELS = {"structured": T.make_model("structured", 1), "random": T.make_model("random", 2)}


@pytest.fixture(scope="module")
def runs():
    out = {}
    for name, m in MODELS.items():
        for W in (None, 8, 4):
            steps = 20 if W is None else 12          # past every window's trimming, a few pages
            out[name, W] = (_book(m, steps, W), _resident(m, steps, W))
    return out


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("W", [None, 8, 4])
def test_resident_equals_book(runs, model, W):
    (_, (tb, rb)), (chip, (tr, rr)) = runs[model, W]
    assert tr == tb
    assert [r["logits_int"] for r in rr] == [r["logits_int"] for r in rb]
    assert [r["pages"] for r in rr] == [r["pages"] for r in rb]
    # what the host wrote: the whole image in book mode, the row x and the block table in resident mode
    assert all(len(r["image"]) == FAST.ext_words for r in rb)
    assert [r["host_words"] for r in rr] == [T.D + len(r["table"]) for r in rr]
    assert max(r["host_words"] for r in rr) <= T.D + (5 if W is None else 3)
    # the fast chip packs its weights four int8 a word (mm_pack, docs/mm-fast.md)
    assert chip.load_record["host_words"] == sum(n.rows * -(-n.cols // 4) for n in
                                                 T.build_graph(MODELS[model], 1).nodes if n.op == "weight") == 576


def test_structured_model_follows_its_rule(runs):
    tr = runs["structured", 4][1][1][0]
    assert tr == [[0, 3, 2, 13, 4, 7, 6, 1, 8, 11, 10, 5, 12, 15, 14, 9][i % 16] for i in range(13)]


@pytest.mark.parametrize("page", [1, 2, 8])
def test_paged_equals_plain_in_both_modes(runs, page):
    m = MODELS["random"]
    _, (tp, rp) = _book(m, 12, 4, paged=False)
    _, (tb, rb) = _book(m, 12, 4, page=page)
    _, (tr, rr) = _resident(m, 12, 4, page=page, n_pages=16)
    assert tp == tb == tr
    assert [r["logits_int"] for r in rp] == [r["logits_int"] for r in rb] == [r["logits_int"] for r in rr]


def test_pool_rows_are_the_book_kc_and_vc_integers():
    # the pool keeps the chip's int8 rows; the book host dequantizes them and requantizes them into kc/vc:
    # the words must be the same (a chip whose pool rows hold one int8 a word; packed rows:
    # tests/test_compile_packed_kv.py)
    m = MODELS["random"]
    steps = 9
    book, (tb, rb) = _book(m, steps, None, cfg=FAST_PRE_LANES)
    chip, (tr, rr) = _resident(m, steps, None, cfg=FAST_PRE_LANES)
    image = rb[-1]["image"]
    P = book.progs[steps]
    lay = chip.layout
    table = chip.pagetable.table(0)
    for cached, base in (("kc", lay.k_base), ("vc", lay.v_base)):
        want = image[P.ext_map[cached].address:][:(steps - 1) * T.D]
        got = []
        for row in range(steps - 1):
            page, slot = table[row // lay.page_rows], row % lay.page_rows
            # one pool: a pool row is the position's K row, then its V row (v_base = k_base + row_words)
            a = base + ((page * lay.page_rows + slot) * lay.pool_row_words)
            got += chip._ext[a:a + T.D]
        assert got == want


def test_copy_on_write_is_a_chip_side_page_copy():
    m = MODELS["random"]
    seq = [0, 5, 9, 2, 14, 7]
    ta, tb_ = seq + [3], seq + [11]
    chip = ResidentChip(m, 8, None, page=4, backend=ReferenceMachine(config=FAST), config=FAST)
    chip.load()
    chip.new("a")
    for t in seq:
        chip.step("a", t)
    chip.fork("a", "b")                     # rows 4, 5 sit in a shared, partly filled page
    shared = chip.pagetable.table("a")[-1]
    rec_b = chip.step("b", tb_[-1])
    assert rec_b["copies"] == 1 and rec_b["table"][-1] != shared
    assert rec_b["host_words"] == T.D + 2 + 2         # x, the table, and the copy's two page numbers
    rec_a = chip.step("a", ta[-1])
    assert rec_a["copies"] == 0 and rec_a["table"][-1] == shared
    # each request equals a book decode of its own token sequence
    for rec, toks in ((rec_a, ta), (rec_b, tb_)):
        _, (_, book) = _book(m, 7, None, force=toks + [0])
        assert rec["logits_int"] == book[-1]["logits_int"]


def _bad_table_run(table_of, make_program=None):
    """Run step 6 of a resident decode with a block table rewritten by `table_of(table)` (and the step
    program optionally rewritten); returns the error, the program and the external memory before."""
    m = MODELS["structured"]
    chip = ResidentChip(m, 8, None, page=4, n_pages=8, backend=ReferenceMachine(config=FAST), config=FAST)
    chip.generate(0, 5)
    pt = chip.pagetable
    pt.append(0, None)
    table = pt.table(0)
    P = chip.program(6, 0, len(table))
    code = make_program(P.code) if make_program else P.code
    from compiler.resident import mailbox_words
    ext = list(chip._ext)
    for a, w in mailbox_words(chip.layout, P, m["E"][3], table_of(list(table))).items():
        ext[a] = w
    r = ReferenceMachine(config=FAST).run(code, ext, 8, scratchpad=chip._spad)
    return r, code, ext, chip


def test_a_page_outside_the_pool_stops_the_chip():
    r, code, ext, chip = _bad_table_run(lambda t: [t[0], 8])      # the pool has pages 0..7
    gathers = [i for i, w in enumerate(code) if isa.operands(w)["op"] == isa.Op.GATHER]
    assert r.error == ErrorStop("page", gathers[0], 8)
    assert r.ext == ext                     # nothing stored: the stop comes before any ST or SCATTER
    assert r.counters[4] == gathers[0] + 1
    r, *_ = _bad_table_run(lambda t: [0xFFFF_FFFF, t[1]])
    assert r.error.kind == "page" and r.error.info == 0xFFFF_FFFF


def test_a_row_beyond_the_table_stops_the_chip():
    def shorten(code):
        # the same program with a one-entry table: the cached rows 4, 5 lie in entry 1
        out = []
        for w in code:
            o = isa.operands(w)
            if o["op"] in (isa.Op.GATHER, isa.Op.SCATTER):
                w = isa.encode(isa.Instr(o["op"], a=o["spad"], b=o["table"], c=1, d=o["base"],
                                         e=o["page_log2"], f=o["lo"], g=o["hi"], fl=o["row_log2"],
                                         x=o["pool_pages"]))
            out.append(w)
        return out
    r, code, ext, _ = _bad_table_run(lambda t: t, shorten)
    first = next(i for i, w in enumerate(code) if isa.operands(w)["op"] == isa.Op.GATHER)
    assert r.error == ErrorStop("row", first, 1)
    assert r.ext == ext


def test_the_host_reports_the_error_stop():
    m = MODELS["structured"]
    chip = ResidentChip(m, 8, None, page=4, n_pages=8, backend=ReferenceMachine(config=FAST), config=FAST)
    chip.generate(0, 5)
    chip.pagetable._table[0][0] = 8         # a corrupted block table (the host's own rows are None)
    with pytest.raises(ResidentError, match="page outside the pool, entry 8"):
        chip.step(0, 3)


def test_step_programs_must_use_the_loaded_weights():
    m = MODELS["structured"]
    chip = ResidentChip(m, 4, None, backend=ReferenceMachine(config=FAST), config=FAST)
    chip.load()
    other = dict(m, Wo=[[v * 1.5 for v in row] for row in m["Wo"]])
    with pytest.raises(CompileError, match="weight 'Wo' has scale"):
        compile_step(chip.layout, T.build_graph(other, 2), chip.calib[2], chip.ranges, 0, 1,
                     weights=chip.weights)


def test_a_cached_row_that_would_be_requantized_is_refused():
    import dataclasses
    from compiler.resident import check_row_round_trip
    m = MODELS["structured"]
    chip = ResidentChip(m, 4, None, backend=ReferenceMachine(config=FAST), config=FAST)
    P = chip.program(3, 0, 1)
    check_row_round_trip(P)
    kc = next(n.id for n in P.graph.nodes if n.op == "input" and n.attrs["name"] == "kc")
    scales = list(P.scales)
    scales[kc] *= 1.01
    with pytest.raises(CompileError, match="kc has scale .* the cached rows would be requantized"):
        check_row_round_trip(dataclasses.replace(P, scales=scales))


def test_layout_refusals():
    g = T.build_graph(MODELS["structured"], 1)
    with pytest.raises(CompileError, match="needs a chip with gather=1"):
        plan_layout(g, BOOK, 4, 64)
    with pytest.raises(CompileError, match=r"needs 10657 external words .* ext_words=8192"):
        plan_layout(g, ChipConfig(gather=1), 4, 64)
    with pytest.raises(CompileError, match="power-of-two number of rows"):
        plan_layout(g, FAST, 3, 64)
    lay = plan_layout(g, ChipConfig(gather=1), 4, 32)       # half the pool fits 8192 words
    assert lay.ext_needed == 2 * 32 * 4 * 16 + 2304 + 16 + 128 + 17


def test_fast_preset_steps_at_most_2400_cycles(runs):
    (_, (_, rb)), (_, (_, rr)) = runs["structured", 4]
    at4 = [r["counters"][0] for r in rr if r["ctx"] == 4]
    assert max(at4) <= 2400 and max(at4) < min(r["counters"][0] for r in rb if r["ctx"] == 4)


@pytest.mark.parametrize("args,words", [
    (["--mode", "resident"], "--mode resident needs a chip with GATHER/SCATTER"),
    (["--mode", "resident", "--chip", "array=8,gather=1"], "needs 10657 external words"),
    (["--mode", "cached"], "--mode"),
])
def test_decode_refuses_a_resident_mode_without_its_chip(capsys, tmp_path, args, words):
    from sim import decode
    path = tmp_path / "out.json"
    assert guarded(decode.main, [*args, "--sim", "reference", "--json", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and words in err[0]
    assert not path.exists()


def test_decode_json_reports_host_words(tmp_path, capsys):
    from sim import decode
    path = tmp_path / "r.json"
    assert decode.main(["--window", "4", "--steps", "6", "--mode", "resident", "--chip", "fast",
                        "--sim", "reference", "--json", str(path), "--quiet"]) == 0
    run = json.loads(path.read_text())
    assert run["mode"] == "resident" and run["load"]["host_words"] == 576
    assert [r["host_words"] for r in run["records"]] == [17, 17, 17, 17, 18, 18]
    assert run["tokens"] == [0, 3, 2, 13, 4, 7, 6]
    assert "words the host wrote to the chip per step: 17..18" in capsys.readouterr().out
    assert decode.main(["--steps", "2", "--sim", "reference", "--json", str(path), "--quiet"]) == 0
    run = json.loads(path.read_text())
    assert run["mode"] == "book" and [r["host_words"] for r in run["records"]] == [8192, 8192]


def test_bench_prints_both_modes_side_by_side():
    import io
    from sim.bench import compare_modes, mac_count
    # q, k, v, Wo: 4 x 16*16; W1, W2: 2 x 16*32; Wout 16*16; q.K^T and p.V: 2 x 16*context
    assert mac_count(T.build_graph(MODELS["structured"], 4)) == 4 * 256 + 2 * 512 + 256 + 2 * 16 * 4 == 2432
    out = io.StringIO()
    rows = compare_modes(4, 4, 8, FAST, out=out)
    assert set(rows) == {"book book", "book fast", "resident fast"}
    assert all(r["identical"] for r in rows.values())
    book, res = rows["book book"], rows["resident fast"]
    assert book["step_cycles"] == 7259 and book["mac_bound"] == 2432 / 16
    assert res["step_cycles"] == res["mm"] + res["dma"] + res["vec"] + res["overhead"] <= 2400
    # the sequencer's own cycles (hdl.isa.seq_cycles): on fast, a prefetch chip, the first instruction's 2
    assert res["overhead"] == sum(isa.seq_cycles(k, FAST) for k in range(res["instructions"] + 1)) == 2
    assert res["host_words"] == 17
    # the load program is one LD of the 576 weight words and a HALT (its first instruction's fetch and issue)
    load = isa.seq_cycles(0, FAST) + isa.busy_cycles(isa.ld(0, 0, 576).word, 8, FAST) + isa.seq_cycles(1, FAST)
    assert f"plus the load program once: {load} cycles, 576 words" in out.getvalue()


@pytest.mark.parametrize("cfg", [FAST, FAST_PRE_LANES], ids=["packed", "one-int8-a-word"])
def test_one_pool_row_holds_a_positions_k_and_v_rows(cfg):
    # a step moves its cached K and V rows with one GATHER and its new k and v with one SCATTER, all of
    # the pool at k_base with rows twice a K row; the page copy is one GATHER and one SCATTER as well
    from compiler.resident import compile_page_copy
    m = MODELS["random"]
    chip, (toks, recs) = _resident(m, 9, 4, cfg=cfg)
    lay = chip.layout
    assert lay.pool_row_words == 2 * lay.row_words and lay.v_base == lay.k_base + lay.row_words
    assert lay.ext_needed == lay.k_base + lay.pool_pages * lay.page_rows * 2 * lay.row_words
    for rec in recs:
        moves = [isa.operands(w) for w in rec["code"] if isa.operands(w)["op"] in (isa.Op.GATHER, isa.Op.SCATTER)]
        ops = [o["op"] for o in moves]
        assert ops.count(isa.Op.SCATTER) == 1 and ops.count(isa.Op.GATHER) == (rec["ctx"] > 1)
        assert {(o["base"], o["row_log2"]) for o in moves} == {(lay.k_base, lay.row_log2 + 1)}
    copy = [isa.operands(w) for w in compile_page_copy(lay, 3)]
    assert [o["op"] for o in copy] == [isa.Op.LD, isa.Op.GATHER, isa.Op.SCATTER, isa.Op.HALT]
    assert all((o["base"], o["row_log2"], o["hi"]) == (lay.k_base, lay.row_log2 + 1, 3) for o in copy[1:3])


def test_the_interleaved_pool_refuses_a_graph_that_reads_the_cache_otherwise():
    # the cached rows live in the K/V region, not where the allocator put kc: any other reader is refused
    from compiler.resident import plan_kv
    m = MODELS["random"]
    g = T.build_graph(m, 3)
    kc = next(n.id for n in g.nodes if n.op == "input" and n.attrs["name"] == "kc")
    g.output(g.add(kc, kc), "kc_twice")
    with pytest.raises(CompileError, match="is read by"):
        plan_kv(g, 4)
    assert plan_kv(T.build_graph(m, 3), 4).reserve == 3 * 2 * 4    # kc's two rows and the new one
