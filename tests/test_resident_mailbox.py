"""One LD for the mailbox of a resident batch program (docs/resident.md): x ends where the block tables
start in external memory and lies right below the block-table area in the scratchpad, so the program's
only LD brings both; the rows' integers are those of the book mode's batch."""
from __future__ import annotations

import random

import pytest

from compiler import CompileError
from compiler.resident import relocate_load
from hdl import isa
from hdl.config import PRESETS
from host import tiny_lm as T
from host.batch import BatchRunner
from host.batch_resident import ResidentBatchRunner
from sim.backends.reference import ReferenceMachine

pytestmark = pytest.mark.timeout(120)

M = T.make_model("structured", 1)
FAST = PRESETS["fast"]
LAT = 8


def _batches(ctxs, cache_only, seed):
    """The resident and book rows of one batch: a full row per context of `ctxs` (its earlier tokens filled
    in first as cache-only rows) and `cache_only` cache-only rows. Returns the resident runner, both
    batches' results and the resident program."""
    rnd = random.Random(seed)
    prompts = [[rnd.randrange(T.V) for _ in range(n)] for n in ctxs]
    extra = [rnd.randrange(T.V) for _ in range(cache_only)]
    res = ResidentBatchRunner(M, ReferenceMachine(config=FAST), LAT, FAST, 4, 64, 8)
    book = BatchRunner(M, ReferenceMachine(config=FAST), LAT, FAST)
    tables = [[2 * j, 2 * j + 1] for j in range(len(ctxs) + 1)]
    fill = [(p[r], tables[j], None, r) for j, p in enumerate(prompts) for r in range(len(p) - 1)]
    for i in range(0, len(fill), 8):
        res.run(fill[i:i + 8])
    # the book mode keeps each cached row's k and v on the host: the chip's floats of a cache-only row
    kv = {}
    where = [(j, r) for j, p in enumerate(prompts) for r in range(len(p) - 1)]
    for i in range(0, len(where), 8):
        out, _, _ = book.run([(prompts[j][r], None, None) for j, r in where[i:i + 8]])
        kv.update((jr, (o["k"], o["v"])) for jr, o in zip(where[i:i + 8], out))
    rows = [(p[-1], tables[j], [(0, len(p) - 1)] if len(p) > 1 else [], len(p) - 1)
            for j, p in enumerate(prompts)]
    rows += [(t, tables[-1], None, k) for k, t in enumerate(extra)]
    got, counters, P = res.run(rows)
    assert counters == P.counters(LAT)
    book_rows = [(p[-1], [kv[j, r][0] for r in range(len(p) - 1)], [kv[j, r][1] for r in range(len(p) - 1)])
                 for j, p in enumerate(prompts)]
    book_rows += [(t, None, None) for t in extra]
    want, _, _ = book.run(book_rows)
    return res, got, want, P


@pytest.mark.parametrize("ctxs, cache_only", [((5, 5, 4, 3, 2, 1), 2), ((6, 3), 1), ((4,), 0)],
                         ids=["eight-rows", "three-rows", "one-row"])
def test_a_batch_program_loads_its_mailbox_with_one_ld_and_computes_the_same_logits(ctxs, cache_only):
    runner, got, want, P = _batches(ctxs, cache_only, seed=len(ctxs))
    lay = runner.layout
    # the same integers as the book mode's batch: every full row's logits and token
    assert [g["logits_int"] for g in got] == [w["logits_int"] for w in want]
    assert [g["tok"] for g in got] == [w["tok"] for w in want]
    assert sum(g["logits_int"] is not None for g in got) == len(ctxs)
    ops = [isa.operands(w, FAST) for w in P.code]
    loads = [o for o in ops if o["op"] == isa.Op.LD]
    assert len(loads) == 1, "the program's only LD is the mailbox's"
    ld = loads[0]
    x_words = (len(ctxs) + cache_only) * T.D
    table_len = 2 * (len(ctxs) + cache_only)       # every row's table, two pages each (`_batches`)
    # one range in both memories: x ends where the tables start, in external memory and in the scratchpad
    assert (ld["src"], ld["len"]) == (lay.table_ext - x_words, x_words + table_len)
    assert P.ext_map["x"].address == ld["src"]
    assert ld["dst"] + x_words == lay.table_addr
    # the GATHERs and SCATTERs read their tables from the words that LD wrote
    for o in ops:
        if o["op"] in (isa.Op.GATHER, isa.Op.SCATTER):
            assert lay.table_addr <= o["table"] and o["table"] + o["table_len"] <= lay.table_addr + table_len
    # the one LD costs one fixed DMA tail less than x's and the tables' apart
    apart = (isa.busy_cycles(isa.ld(0, 0, x_words), LAT, FAST)
             + isa.busy_cycles(isa.ld(0, 0, table_len), LAT, FAST))
    assert apart - isa.busy_cycles(isa.ld(0, 0, x_words + table_len), LAT, FAST) >= LAT + 1


def test_relocate_load_moves_every_read_of_the_loaded_words_until_they_are_overwritten():
    code = [isa.ld(10, 0, 8), isa.rqc(1, 1), isa.mm(40, 10, 100, 2, 4, 4, lda=4, ldb=4, ldc=4, rq=1),
            isa.vadd(60, 14, 40, 4), isa.rq(10, 60, 8, 1, 1), isa.vadd(70, 10, 14, 4), isa.halt()]
    out = relocate_load(code, 0, 200, FAST)
    o = [isa.operands(i, FAST) for i in out]
    assert o[0]["dst"] == 200
    assert (o[2]["A"], o[2]["B"], o[2]["dst"]) == (200, 100, 40)
    assert (o[3]["src1"], o[3]["src2"]) == (204, 40)
    # the RQ writes the loaded words: from there on they are another buffer's
    assert out[4:] == code[4:]


def test_relocate_load_refuses_a_partial_read_and_a_busy_destination():
    partial = [isa.ld(10, 0, 8), isa.vadd(60, 14, 30, 8), isa.halt()]
    with pytest.raises(CompileError, match="part of the loaded"):
        relocate_load(partial, 0, 200, FAST)
    busy = [isa.ld(10, 0, 8), isa.vadd(196, 10, 10, 8), isa.halt()]
    with pytest.raises(CompileError, match="touches the words"):
        relocate_load(busy, 0, 200, FAST)


@pytest.mark.parametrize("n, table_len", [(1, 1), (3, 1), (5, 2), (9, 3)])
def test_a_step_program_loads_its_mailbox_with_one_ld(n, table_len):
    """A single-row step program (`compiler.resident.compile_step`, `ga2 decode --mode resident`) of context n
    starts with the one LD of x and its block table, x right below the table area in the scratchpad and right
    before the table outside, and has no other LD; the decode's tokens and logits are checked against book
    mode by tests/test_resident.py."""
    from host.resident import ResidentChip
    chip = ResidentChip(M, 12, None, backend=ReferenceMachine(config=FAST), config=FAST)
    P = chip.program(n, 0, table_len)
    lay = chip.layout
    loads = [isa.operands(i) for i in P.instrs if isa.operands(i)["op"] == isa.Op.LD]
    assert len(loads) == 1
    d = T.D
    assert (loads[0]["dst"], loads[0]["src"], loads[0]["len"]) == (lay.table_addr - d, lay.table_ext - d,
                                                                   d + table_len)
    assert isa.operands(P.instrs[0]) == loads[0]
