"""Resident-mode lowering (issue 13, docs/resident.md): weights stay in the scratchpad, the KV cache in a
page pool in external memory, and the host writes only a small mailbox per step.

Three kinds of program share one `ResidentLayout`:

* the load program (`compile_load`): one LD brings every weight, quantized at its scale, from a staging
  area of the external memory into a fixed region at the top of the scratchpad;
* a step program per (context, first cached row within the table, table length) (`compile_step`): the
  book's lowering of the same graph (``compiler.emit.compile_graph``) with the weights ``placed`` where
  the load program left them (no weight loads), in which the LD of the input row x reads the mailbox,
  the K and V rows move to a region of their own (`plan_kv`, `interleave_kv`: a position's K row and V
  row side by side, as in the pool), the load of kc becomes one GATHER of the cached K and V rows through
  the block table, the store of k_new one SCATTER of the new K and V row into its page slot (vc's load and
  v_new's store go), and tok/logits are stored into the mailbox's output words;
* a page copy (`compile_page_copy`): copy-on-write of a partly filled page done by the chip (GATHER of
  the page's rows into scratch words, SCATTER into the new page).

Pure Python: imports `hdl.isa`, `hdl.arith`, `hdl.config` and the compiler, never a simulator.

External memory (words)::

    0                 x: the new input row (D words), ending where the table starts (`ResidentLayout.x_ext`)
    D                 the block table, one page number a word (table_cap words)
    D + table_cap     tok (1 word), then logits (V words)
    staging           the weights, in scratchpad order (written by the host once, for the load program)
    k_base            the pool: pool_pages pages of 2**page_log2 rows of 2**(row_log2 + 1) words, each
                      row a position's K row (2**row_log2 words) then its V row (v_base = k_base +
                      2**row_log2)

Scratchpad: ``[0, spad_limit)`` belongs to the step programs' allocator (and to the page copy's scratch
rows); the block table sits at ``table_addr`` (table_cap words) and the weights from ``weights_base`` to
the top. A batch program (`host.batch_resident`) keeps its x right below the table instead of where the
allocator put it (`relocate_load`), so that x and the tables, one range in both memories, come in ONE LD
(`mailbox_load`: one fixed DMA tail less; the step programs still load them apart). On a chip with
``mm_pack = 1`` the weights that the compiler packs (`compiler.buffers.packed_weights`: int8, only ever
an untransposed B operand) are staged and kept four int8 a word, as every step program reads them
(``pb = 1``); the layout's ``packed`` names them. On a chip with ``mm_pack_c = 1`` the K and V rows are
kept four int8 a word too (`compiler.buffers.packed_activations`: k_new and v_new are written with
``pc = 1``, kc and vc read with ``pb = 1``), so a pool row is ``row_words`` = ceil(D / 4) words and
GATHER and SCATTER move a quarter of the words.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from hdl import isa
from hdl.arith import quantize, u32
from hdl.config import ChipConfig

from .buffers import pack_rows, packed_activations, packed_weights, packed_words
from .buffers import row_words as buffer_row_words
from .emit import Program, compile_graph
from .graph import CompileError, Graph
from .image import quantize_matrix

__all__ = ["ResidentLayout", "plan_layout", "LoadProgram", "compile_load", "compile_step", "finish_program",
           "compile_page_copy", "check_same_weights", "check_row_round_trip", "mailbox_words", "KVPlan",
           "plan_kv", "KVRewrite", "interleave_kv", "relocate_load", "mailbox_load"]


def _log2(n: int) -> int | None:
    return n.bit_length() - 1 if n > 0 and n & (n - 1) == 0 else None


@dataclass(frozen=True)
class ResidentLayout:
    """Where everything of a resident session lives (see the module doc for the picture).

    Attributes
    ----------
    config : hdl.config.ChipConfig
        The chip (``gather`` must be 1).
    row_words, page_rows, pool_pages : int
        Words of one K (or V) row (a power of two: ceil(D / 4) on an mm_pack_c chip, D elsewhere), rows
        of one page (a power of two), pages of the pool.
    weights : dict
        Weight name -> (scratchpad address, words), in scratchpad order (the staging order too).
    weights_base, table_addr, table_cap, spad_limit : int
        Scratchpad: first word of the weights, the block table's first word and its capacity, and the
        words below the table that the step programs' allocator may use.
    x_addr, table_ext, tok_addr, logits_addr, staging, k_base, v_base, ext_needed : int
        External memory: the mailbox (x, the table, tok, logits), the weights' staging area, the pool
        (``k_base``: its row holds a position's K row then its V row, ``pool_row_words`` words; ``v_base``
        = ``k_base + row_words``, where V's half of row 0 starts), and the words the layout needs in all.
        ``x_addr`` is the first word of x's area, which ends where the table starts (`x_ext`).
    packed : frozenset
        Names of the weights stored four int8 a word (mm_pack chips; empty on any other).
    """
    config: ChipConfig
    row_words: int
    page_rows: int
    pool_pages: int
    weights: dict
    weights_base: int
    table_addr: int
    table_cap: int
    spad_limit: int
    x_addr: int
    table_ext: int
    tok_addr: int
    logits_addr: int
    staging: int
    k_base: int
    v_base: int
    ext_needed: int
    packed: frozenset = frozenset()

    @property
    def page_log2(self) -> int:
        return _log2(self.page_rows)

    @property
    def row_log2(self) -> int:
        return _log2(self.row_words)

    @property
    def pool_row_words(self) -> int:
        """Words of one pool row: a position's K row, then its V row."""
        return 2 * self.row_words

    @property
    def pool_row_log2(self) -> int:
        return _log2(self.pool_row_words)

    @property
    def pool_words(self) -> int:
        return self.pool_pages * self.page_rows * self.pool_row_words

    def weight_words(self) -> int:
        return sum(n for _, n in self.weights.values())

    def x_ext(self, words: int) -> int:
        """External address of an input x of `words` words: x ends where the block table starts, so that
        one LD can bring both (`mailbox_load`). Raises `CompileError` when x's area is too small."""
        if not 1 <= words <= self.table_ext - self.x_addr:
            raise CompileError(f"an input x of {words} words does not fit the mailbox's "
                               f"{self.table_ext - self.x_addr} words before the block table")
        return self.table_ext - words


def plan_layout(graph: Graph, config: ChipConfig, page_rows: int, pool_pages: int,
                table_cap: int = 128) -> ResidentLayout:
    """The layout of a resident session for the step graphs shaped like `graph` (any context).

    Raises `CompileError` when the chip has no GATHER/SCATTER, the page or row is not a power of two,
    or the weights, table and pools do not fit the chip's scratchpad and external memory (the message
    names the sizes).
    """
    if not isinstance(config, ChipConfig):
        raise CompileError(f"config must be an hdl.config.ChipConfig, got {type(config).__name__}")
    if not config.gather:
        raise CompileError(f"resident mode needs a chip with gather=1 (GATHER/SCATTER); --chip "
                           f"{config.spec()} has none")
    outs = {n.attrs["name"]: n for n in graph.nodes if n.op == "output"}
    ins = {n.attrs["name"]: n for n in graph.nodes if n.op == "input"}
    for name in ("logits", "k_new", "v_new"):           # tok is optional: the host may take it from the logits
        if name not in outs:
            raise CompileError(f"a resident step graph needs an output {name!r}")
    if "x" not in ins:
        raise CompileError("a resident step graph needs an input 'x'")
    # a pool row is k_new's row as the step programs store it: four int8 a word on an mm_pack_c chip
    # (compiler.buffers.packed_activations), one a word elsewhere
    acts = packed_activations(graph, config)
    row_words = buffer_row_words(outs["k_new"], outs["k_new"].id in acts)
    if (_log2(row_words) is None or buffer_row_words(outs["v_new"], outs["v_new"].id in acts) != row_words
            or outs["v_new"].cols != outs["k_new"].cols or outs["k_new"].rows != 1):
        raise CompileError(f"a cache row must be one row of a power-of-two number of words (k_new is "
                           f"{outs['k_new'].rows}x{row_words}, v_new {outs['v_new'].rows}x"
                           f"{outs['v_new'].cols})")
    if _log2(page_rows) is None or page_rows > 1 << 15:
        raise CompileError(f"resident mode needs a page of a power-of-two number of rows (at most 2^15), "
                           f"not {page_rows}")
    if not 1 <= pool_pages < 1 << 12:
        raise CompileError(f"resident mode's pool holds 1..4095 pages (the 12-bit pool_pages field), "
                           f"not {pool_pages}")
    weights = {}
    packed = packed_weights(graph, config)      # mm_pack chips: these are kept four int8 a word
    sizes = [(n.attrs["name"], packed_words(n, n.id in packed)) for n in graph.nodes if n.op == "weight"]
    total = sum(s for _, s in sizes)
    weights_base = config.spad_depth - total
    table_addr = weights_base - table_cap
    spad_limit = table_addr
    if spad_limit < 256:
        raise CompileError(f"the weights ({total} words) and a {table_cap}-entry block table leave "
                           f"{max(spad_limit, 0)} of the scratchpad's {config.spad_depth} words for the "
                           f"step programs")
    addr = weights_base
    for name, size in sizes:
        weights[name] = (addr, size)
        addr += size
    x_words = ins["x"].size
    table_ext = x_words
    tok_addr = table_ext + table_cap
    # tok's words stay in the mailbox when the host takes the token from the logits (the same layout)
    logits_addr = tok_addr + (outs["tok"].size if "tok" in outs else outs["logits"].rows)
    staging = logits_addr + outs["logits"].size
    k_base = staging + total
    # one pool: a position's K row and V row side by side, so one GATHER/SCATTER moves both
    pool_words = pool_pages * page_rows * 2 * row_words
    v_base = k_base + row_words
    ext_needed = k_base + pool_words
    if ext_needed > config.ext_words:
        raise CompileError(f"the resident layout needs {ext_needed} external words (a pool of "
                           f"{pool_pages} pages of {page_rows} rows of 2 x {row_words} words, the weights' "
                           f"{total}, the mailbox); the chip has ext_words={config.ext_words}")
    return ResidentLayout(config=config, row_words=row_words, page_rows=page_rows, pool_pages=pool_pages,
                          weights=weights, weights_base=weights_base, table_addr=table_addr,
                          table_cap=table_cap, spad_limit=spad_limit, x_addr=0, table_ext=table_ext,
                          tok_addr=tok_addr, logits_addr=logits_addr, staging=staging, k_base=k_base,
                          v_base=v_base, ext_needed=ext_needed,
                          packed=frozenset(graph.nodes[i].attrs["name"] for i in packed))


def _weight_values(P: Program) -> dict:
    """Weight name -> (scale, quantized int8 rows, stored packed) of a compiled program."""
    out = {}
    packed = packed_weights(P.graph, P.config)
    for n in P.graph.nodes:
        if n.op == "weight":
            out[n.attrs["name"]] = (P.scales[n.id], quantize_matrix(n.attrs["array"], P.scales[n.id]),
                                    n.id in packed)
    return out


def check_same_weights(reference: dict, P: Program, what: str) -> None:
    """Refuse a program whose weights' scales, integers or packing differ from those the load program
    wrote (a program may use some of the resident weights only, as a batch of cache-only rows does)."""
    got = _weight_values(P)
    if not set(got) <= set(reference):
        raise CompileError(f"{what}: its weights {sorted(got)} are not among the resident ones {sorted(reference)}")
    for name, (scale, ints, packed) in reference.items():
        if name not in got:
            continue
        if got[name][0] != scale:
            raise CompileError(f"{what}: weight {name!r} has scale {got[name][0]!r}, the resident copy "
                               f"{scale!r}")
        if got[name][1] != ints:
            raise CompileError(f"{what}: weight {name!r} quantizes to other integers than the resident copy")
        if got[name][2] != packed:
            raise CompileError(f"{what}: weight {name!r} is read " + ("four int8 a word" if got[name][2] else
                               "one int8 a word") + ", the resident copy is not stored so")


@dataclass
class LoadProgram:
    """The load program: its code and the external words the host writes for it once.

    Attributes
    ----------
    code : list of int
    writes : dict
        External address -> word: the weights at the staging area.
    weights : dict
        Weight name -> (scale, int8 rows, stored packed) written; every step program must use exactly
        these.
    """
    code: list
    writes: dict
    weights: dict

    def counters(self, lat: int, config: ChipConfig) -> list:
        cyc = [isa.seq_cycles(i, config) + isa.busy_cycles(w, lat, config) for i, w in enumerate(self.code)]
        out = [sum(cyc), 0, 0, 0, len(self.code) - 1]
        for w in self.code[:-1]:
            out[isa.COUNTER_INDEX[isa.COUNTER_OF[isa.operands(w)["op"]]]] += isa.busy_cycles(w, lat, config)
        return out


def compile_load(layout: ResidentLayout, P: Program) -> LoadProgram:
    """The load program for the weights of `P` (any step program of the session: the weights and their
    scales are the same in all, `check_same_weights`)."""
    values = _weight_values(P)
    writes = {}
    for name, (addr, size) in layout.weights.items():
        pack = name in layout.packed
        if values[name][2] != pack:
            raise CompileError(f"weight {name!r}: the program reads it " + ("packed" if values[name][2] else
                               "unpacked") + ", the layout stores it " + ("packed" if pack else "unpacked"))
        flat = pack_rows(values[name][1]) if pack else [u32(v) for row in values[name][1] for v in row]
        if len(flat) != size:
            raise CompileError(f"weight {name!r} has {len(flat)} words, the layout {size}")
        for i, w in enumerate(flat):
            writes[layout.staging + addr - layout.weights_base + i] = w
    total = layout.weight_words()
    code = []
    for start in range(0, total, layout.config.max_len):        # one LD per 4095 words
        n = min(layout.config.max_len, total - start)
        code.append(isa.encode(isa.ld(layout.weights_base + start, layout.staging + start, n)))
    code.append(isa.encode(isa.halt()))
    try:
        isa.validate_program(code, layout.config.ext_words, cfg=layout.config)
    except isa.IsaError as e:
        raise CompileError(f"the load program is not legal for the chip: {e}") from None
    return LoadProgram(code=code, writes=writes, weights=values)


def check_row_round_trip(P: Program) -> None:
    """The pool keeps the chip's int8 k/v rows; the book's host keeps them dequantized and requantizes
    them at the kc/vc scale. Both give the same integers only if that scale is k_new's/v_new's and the
    round trip is the identity on every int8 the requantizer can write: checked here, CompileError if
    not."""
    nodes = P.graph.nodes
    by_name = {n.attrs.get("name"): n for n in nodes if n.op in ("input", "output")}
    for new, cached in (("k_new", "kc"), ("v_new", "vc")):
        s = P.scales[by_name[new].id]
        if cached in by_name and P.scales[by_name[cached].id] != s:
            raise CompileError(f"{cached} has scale {P.scales[by_name[cached].id]!r} and {new} "
                               f"{s!r}: the cached rows would be requantized")
        bad = [i for i in range(-127, 128) if quantize(i * s, s) != i]
        if bad:
            raise CompileError(f"{new}: int8 {bad[0]} does not survive dequantize-requantize at scale {s!r}")


def compile_step(layout: ResidentLayout, graph: Graph, calib_samples, ranges, lo_rel: int,
                 table_len: int, weights: dict | None = None) -> Program:
    """The step program of `graph` (context n = its kc rows + 1) for a block table of `table_len` pages
    whose cached rows of this step start at row `lo_rel` of the table (rows counted from the table's
    first page); the new row is row ``lo_rel + n - 1``.

    Returns a `compiler.Program` whose ``ext_map`` holds the mailbox's x and the outputs tok and logits
    (so `compiler.readback` reads them); k_new and v_new go to the pools only. `weights` (name -> scale,
    ints), when given, must equal this program's (`check_same_weights`).
    """
    cfg = layout.config
    names = {n.attrs["name"]: n for n in graph.nodes if n.op in ("input", "output")}
    n_cached = names["kc"].rows if "kc" in names else 0
    new_row = lo_rel + n_cached
    if not (isinstance(lo_rel, int) and isinstance(table_len, int)) or lo_rel < 0 or \
            not 1 <= table_len <= layout.table_cap or new_row >> layout.page_log2 >= table_len:
        raise CompileError(f"step program: row {new_row} (cached rows from {lo_rel}) is not inside a table "
                           f"of {table_len} pages of {layout.page_rows} rows (at most {layout.table_cap})")
    if new_row >= 256:
        raise CompileError(f"step program: row {new_row} does not fit the 8-bit lo/hi fields")
    # x lives right below the block-table area, so that one LD brings both (`mailbox_load`, as a batch
    # program's), the K/V rows' region below it: both kept from the allocator
    x_words = names["x"].size
    x_spad = layout.table_addr - x_words
    P, moved = compile_resident(layout, graph, calib_samples, ranges, x_spad, weights,
                                f"the step program of context {n_cached + 1}")
    e = P.ext_map
    loads_x = [i for i, ins in enumerate(moved.instrs)
               if isa.operands(ins)["op"] == isa.Op.LD and isa.operands(ins)["src"] == e["x"].address]
    if len(loads_x) != 1:
        raise CompileError(f"step program: {len(loads_x)} loads of x, not one")
    body = relocate_load(moved.instrs, loads_x[0], x_spad, cfg)
    common = dict(table=layout.table_addr, table_len=table_len, page_log2=layout.page_log2,
                  row_log2=layout.pool_row_log2, pool_pages=layout.pool_pages)
    instrs, notes = [], []

    def put(ins, note):
        instrs.append(ins)
        notes.append(note)

    put(mailbox_load(layout, x_words, table_len), "load x and the block table (mailbox, one LD)")
    for ins, note in zip(body, moved.notes):
        o = isa.operands(ins)
        op = o["op"]
        if op == isa.Op.LD:
            src = o["src"]
            if src == e["x"].address:
                pass                            # it came with the table, first of all
            elif "kc" in e and src == e["kc"].address:
                put(isa.gather(moved.block, base=layout.k_base, lo=lo_rel, hi=new_row, **common),
                    f"gather kc and vc rows {lo_rel}..{new_row - 1}")
            elif "vc" in e and src == e["vc"].address:
                pass                            # vc's rows came with kc's
            else:
                raise CompileError(f"step program: unexpected load {isa.describe(ins, cfg)} ({note})")
        elif op == isa.Op.ST:
            dst = o["dst"]
            if "tok" in e and dst == e["tok"].address:
                put(isa.st(o["src"], layout.tok_addr, o["len"]), "store tok (mailbox)")
            elif dst == e["logits"].address:
                put(isa.st(o["src"], layout.logits_addr, o["len"]), "store logits (mailbox)")
            elif dst == e["k_new"].address:
                put(isa.scatter(moved.new, base=layout.k_base, lo=new_row, hi=new_row + 1, **common),
                    f"scatter k and v row {new_row}")
            elif dst == e["v_new"].address:
                pass                            # v's row went with k's
            else:
                raise CompileError(f"step program: unexpected store {isa.describe(ins, cfg)} ({note})")
        else:
            put(ins, note)
    return finish_program(P, instrs, notes, layout, cfg, "resident step program")


def compile_resident(layout: ResidentLayout, graph: Graph, calib_samples, ranges, limit: int,
                     weights: dict | None = None, what: str = "") -> tuple[Program, "KVRewrite"]:
    """What a step program and a batch program (`host.batch_resident`) both do before their own rewriting:
    `graph` compiled with the loaded weights placed where the load program put them and the allocator kept
    below the K/V rows' region (`plan_kv`), which ends at scratchpad word `limit`; the row round trip
    checked, and the weights against `weights` (name -> scale, ints) when given (`what` names the program
    in that error); then the K and V rows moved into the region (`interleave_kv`).

    Returns the compiled `compiler.Program` and the `KVRewrite` of its instructions."""
    cfg = layout.config
    present = {n.attrs["name"] for n in graph.nodes if n.op == "weight"}
    placed = {name: addr for name, (addr, _) in layout.weights.items() if name in present}
    kv = plan_kv(graph, layout.row_words)
    region = limit - kv.reserve                 # the K/V rows' region, kept from the allocator
    P = compile_graph(graph, calib_samples, ranges=ranges, ext_words=cfg.ext_words, config=cfg,
                      placed=placed, spad_limit=region)
    check_row_round_trip(P)
    if weights is not None:
        check_same_weights(weights, P, what)
    return P, interleave_kv(P, kv, region)


def finish_program(P: Program, instrs: list, notes: list, layout: ResidentLayout, cfg: ChipConfig,
                   what: str) -> Program:
    """`P` rewritten for the resident mode: its instructions `instrs` (with `notes`), checked legal on the
    chip `cfg`, and its external inputs and outputs moved to the mailbox of `layout`."""
    code = [isa.encode(i) for i in instrs]
    try:
        isa.validate_program(code, cfg.ext_words, cfg=cfg)
    except isa.IsaError as err:
        raise CompileError(f"the {what} is not legal for the chip: {err}") from None
    e = P.ext_map
    ext_map = {"x": dataclasses.replace(e["x"], address=layout.x_addr)}
    if "tok" in e:                      # absent when the host takes the token from the logits
        ext_map["tok"] = dataclasses.replace(e["tok"], address=layout.tok_addr)
    if "logits" in e:                   # a batch of cache-only rows has no token and no logits
        ext_map["logits"] = dataclasses.replace(e["logits"], address=layout.logits_addr)
    return dataclasses.replace(P, code=code, instrs=instrs, notes=notes, ext_map=ext_map,
                               ext_words=layout.ext_needed, ext_size=cfg.ext_words)


# ---- one pool for K and V: a position's K row and V row side by side (docs/resident.md) -----------------

_TILE_NOTE = re.compile(r"node (\d+) tile\b")


@dataclass(frozen=True)
class KVPlan:
    """Where a step or batch program keeps its K and V rows, so that one GATHER brings a row's cached keys
    and values and one SCATTER stores its new k and v (the pool's row is K's words then V's words).

    Every K (V) row the attention reads or the projection writes is moved out of the allocator's buffers
    into a region the caller reserves above the allocator's limit: row r of a block at ``block + r * 2 *
    row_words`` (its V half ``row_words`` further), the new rows likewise at ``new``. The blocks share one
    place when the rows attend one after the other; when their attentions are interleaved (a batch lowered
    phase by phase, `host.batch.build_batch_graph`) each block has its own, side by side.

    Attributes
    ----------
    row_words : int
        Words of one K (or V) row (the layout's `row_words`); a pool row is twice as long.
    k_node, v_node : int
        The k and v projections (the matmuls stored as k_new and v_new).
    new_rows : int
        Rows of k_new (the batch's rows).
    pairs : tuple
        One ``(scores matmul, attention matmul, where)`` per attending row: `where` is ``("block", kc
        name)`` for keys and values gathered from the pool, ``("new", i)`` for row i of the new rows.
    gathered : dict
        The kc input's name -> its vc input's name.
    block_rows : int
        Rows of the blocks' region: the largest block's when they share it, their sum when not (its new
        row included when it is concatenated; 0: none).
    block_at : dict
        The kc input's name -> the row of the blocks' region where its block starts (all 0: shared).
    new_in_block : bool
        One row whose keys are its cached rows then its own new k (`host.tiny_lm.build_graph`, a batch of
        one): the new row is the block's last row and has no region of its own.
    """
    row_words: int
    k_node: int
    v_node: int
    new_rows: int
    pairs: tuple
    gathered: dict
    block_rows: int
    new_in_block: bool
    block_at: dict = dataclasses.field(default_factory=dict)

    @property
    def new_words(self) -> int:
        """Words of the new rows' region (0 when the new row is the block's last)."""
        return 0 if self.new_in_block else self.new_rows * 2 * self.row_words

    @property
    def reserve(self) -> int:
        """Scratchpad words the caller keeps out of the allocator: the new rows, then the blocks' region
        (one block when they share it: `interleave_kv` checks that the rows attend one after the other)."""
        return self.new_words + self.block_rows * 2 * self.row_words


def plan_kv(graph: Graph, row_words: int) -> KVPlan:
    """The interleaved K/V plan of a resident step or batch graph (see `KVPlan`).

    Recognizes the shapes `host.tiny_lm.build_graph` and `host.batch.build_batch_graph` (resident:
    ``own_rows`` or one row) give: each attention is ``softmax(q @ keys^T) @ vals`` where keys/vals are
    the input kc*/vc* (all rows gathered), kc*/vc* followed by the k/v projection's one row, or a row of
    the projections. Raises `CompileError` for any other use of those tensors.
    """
    nodes = graph.nodes
    outs = {n.attrs["name"]: n for n in nodes if n.op == "output"}
    if "k_new" not in outs or "v_new" not in outs:
        raise CompileError("one pool for K and V needs the outputs k_new and v_new")
    K, V = nodes[outs["k_new"].ins[0]], nodes[outs["v_new"].ins[0]]
    if K.op != "matmul" or V.op != "matmul" or K.shape != V.shape:
        raise CompileError(f"k_new and v_new must be matmuls of one shape ({K.label()}, {V.label()})")

    def where(node, proj, prefix):
        if node.id == proj.id:
            return ("new", 0), False
        if node.op == "slice" and node.ins[0] == proj.id:
            return ("new", node.attrs["start"]), False
        if node.op == "input" and node.attrs["name"].startswith(prefix):
            return ("block", node.attrs["name"], node.rows), False
        if (node.op == "concat" and nodes[node.ins[0]].op == "input" and node.ins[1] == proj.id
                and proj.rows == 1 and nodes[node.ins[0]].attrs["name"].startswith(prefix)):
            return ("block", nodes[node.ins[0]].attrs["name"], node.rows), True
        raise CompileError(f"one pool for K and V: {node.label()} is not a cached block or a new row")

    pairs, gathered, sizes, concat = [], {}, {}, 0
    readers = set()
    for s in nodes:
        if s.op != "matmul" or not s.attrs["transpose_b"]:
            continue
        smx = [nodes[c] for c in graph.consumers(s.id)]
        att = [nodes[c] for c in graph.consumers(smx[0].id)] if len(smx) == 1 and smx[0].op == "softmax" else []
        if len(att) != 1 or att[0].op != "matmul" or att[0].ins[0] != smx[0].id or att[0].attrs["transpose_b"]:
            raise CompileError(f"one pool for K and V: {s.label()} is not followed by softmax and one matmul")
        a = att[0]
        wk, ck = where(nodes[s.ins[1]], K, "kc")
        wv, cv = where(nodes[a.ins[1]], V, "vc")
        same = ck == cv and (wk == wv if wk[0] == "new" else
                             wv[0] == "block" and wk[1][2:] == wv[1][2:] and wk[2] == wv[2])
        if not same:
            raise CompileError(f"one pool for K and V: {s.label()} reads keys {wk} and {a.label()} values {wv}")
        if wk[0] == "block":
            gathered[wk[1]] = wv[1]
            sizes[wk[1]] = wk[2]
            concat += ck
            pairs.append((s.id, a.id, ("block", wk[1])))
        else:
            pairs.append((s.id, a.id, wk))
        readers |= {s.id, a.id}
    if concat and (concat != 1 or len(pairs) != 1):
        raise CompileError("one pool for K and V: a concatenated new row needs a batch of one row")
    # nothing else may read these tensors: their rows live in the reserved region, not where the
    # allocator put them
    group = {K.id, V.id} | {n.id for n in nodes if n.op == "input" and n.attrs["name"] in
                            set(gathered) | set(gathered.values())}
    group |= {n.id for n in nodes if n.op in ("slice", "concat") and set(n.ins) & group}
    for i in sorted(group):
        for c in graph.consumers(i):
            user = nodes[c]
            if c in group or user.op == "output" and user.attrs["name"] in ("k_new", "v_new"):
                continue
            if c in readers and user.ins[1] == i and user.ins[0] != i:
                continue
            raise CompileError(f"one pool for K and V: {nodes[i].label()} is read by {user.label()}")
    # the compiler lowers the nodes in their order and loads an input at its first reader: a block is live
    # from its first reader to its attention matmul; blocks live one after the other share one place, else
    # each has its own
    inputs = {n.attrs["name"]: n.id for n in nodes if n.op == "input"}
    spans = sorted((min(graph.consumers(inputs[key])), a, key) for _, a, (kind, key) in pairs if kind == "block")
    shared = all(start > end for (_, end, _), (start, _, _) in zip(spans, spans[1:]))
    block_at, rows = {}, 0
    for _, _, key in spans:
        block_at[key] = 0 if shared else rows
        rows = max(rows, sizes[key]) if shared else rows + sizes[key]
    return KVPlan(row_words=row_words, k_node=K.id, v_node=V.id, new_rows=K.rows, pairs=tuple(pairs),
                  gathered=gathered, block_rows=rows, new_in_block=bool(concat), block_at=block_at)


@dataclass
class KVRewrite:
    """`interleave_kv`'s result.

    Attributes
    ----------
    instrs : list of hdl.isa.Instr
        The program's instructions with the K/V matmul tiles moved to the reserved region (every other
        instruction as it was; the caller turns the kc loads into GATHERs, drops the vc loads and v_new's
        store, and turns k_new's store into a SCATTER). On a chip without fused requantization the K and V
        projections' RQ is replaced by one RQ a row, into the region (the list is then longer than `P`'s).
    notes : list of str
        The role of each of `instrs` (`P.notes`, with the rows' RQs named).
    block : int
        Scratchpad address of the blocks' region (where a kc load's GATHER writes when they share it).
    new : int
        Address of new row 0's K half (row i at ``new + i * 2 * row_words``).
    last_kv_write : int
        Index of the last instruction writing a new K or V row.
    blocks : dict
        The kc input's name -> the address where its GATHER writes (`KVPlan.block_at`).
    """
    instrs: list
    notes: list
    block: int
    new: int
    last_kv_write: int
    blocks: dict = dataclasses.field(default_factory=dict)


def interleave_kv(P: Program, plan: KVPlan, at: int) -> KVRewrite:
    """Rewrite the matmul tiles of `P` (compiled with ``spad_limit <= at``) for the plan's region at `at`:
    the projections write k and v side by side (``ldc = 2 * row_words``), the scores read K^T and the
    attention V from the interleaved rows (``ldb = 2 * row_words``). Every tile's operand keeps its row
    and its word within the row. Raises `CompileError` when a tile's stride is not one row or when the
    rows' gathered blocks would overlap in time."""
    rw = plan.row_words
    block = at + plan.new_words
    new = block + (plan.block_rows - 1) * 2 * rw if plan.new_in_block else at
    targets = {plan.k_node: (new, "a", "x"), plan.v_node: (new + rw, "a", "x")}
    blocks = {key: block + row * 2 * rw for key, row in plan.block_at.items()}
    for s, a, (kind, key) in plan.pairs:
        base = blocks[key] if kind == "block" else new + key * 2 * rw
        targets[s] = (base, "c", "d")
        targets[a] = (base + rw, "c", "d")
    # Without fused requantization (mm_rq = 0) the projections' tiles write a 32-bit accumulator and one RQ
    # writes the node's int8 rows: that RQ, not the tiles, moves to the region, one RQ a row (an RQ writes
    # consecutive words; the rows' stride is 2 * row_words).
    fused = P.config.mm_rq
    if not fused:
        projections = {nid: targets.pop(nid) for nid in (plan.k_node, plan.v_node)}
    tiles = {}
    for i, note in enumerate(P.notes):
        m = _TILE_NOTE.match(note)
        if m and int(m.group(1)) in targets:
            tiles.setdefault(int(m.group(1)), []).append(i)
    lda_lo, lda_hi = isa.HW_OPERANDS[isa.Op.MM]["lda"][1], isa.HW_OPERANDS[isa.Op.MM]["lda"][0]
    lda_bits = lda_hi - lda_lo + 1
    instrs = list(P.instrs)
    for nid, (base, addr, stride) in targets.items():
        if nid not in tiles:
            raise CompileError(f"one pool for K and V: no matmul tile of node {nid} in the program")
        ops = [isa.operands(P.instrs[i]) for i in tiles[nid]]
        name, ld = ("dst", "ldc") if addr == "a" else ("B", "ldb")
        old = min(o[name] for o in ops)
        for i, o in zip(tiles[nid], ops):
            if o["op"] != isa.Op.MM or o[ld] != rw:
                raise CompileError(f"one pool for K and V: {isa.describe(P.instrs[i], P.config)} ({P.notes[i]}) "
                                   f"does not step {ld} by one row of {rw} words")
            row, word = divmod(o[name] - old, rw)
            ins = instrs[i]
            if stride == "x":
                instrs[i] = dataclasses.replace(ins, a=base + row * 2 * rw + word, x=2 * rw)
            else:
                lda = ins.d & ((1 << lda_bits) - 1)
                instrs[i] = dataclasses.replace(ins, c=base + row * 2 * rw + word, d=(2 * rw << lda_bits) | lda)
    # blocks sharing one place: each block's GATHER must follow the last read of the one before
    e = P.ext_map
    load_at = {isa.operands(w)["src"]: i for i, w in enumerate(P.instrs) if isa.operands(w)["op"] == isa.Op.LD}
    spans = []
    for s, a, (kind, key) in plan.pairs:
        if kind == "block":
            spans.append((blocks[key], load_at[e[key].address], max(tiles[s] + tiles[a])))
    spans.sort()
    for (at0, _, end), (at1, start, _) in zip(spans, spans[1:]):
        if at0 == at1 and start <= end:
            raise CompileError(f"one pool for K and V: a block is gathered (instruction {start}) before the "
                               f"one before it is last read ({end})")
    if fused:
        return KVRewrite(instrs=instrs, notes=list(P.notes), block=block, new=new, blocks=blocks,
                         last_kv_write=max(tiles[plan.k_node] + tiles[plan.v_node]))
    requants = {f"node {nid} requant": (nid, base) for nid, (base, _, _) in projections.items()}
    out, notes, last = [], [], -1
    for ins, note in zip(instrs, P.notes):
        if note not in requants:
            out.append(ins)
            notes.append(note)
            continue
        nid, base = requants.pop(note)
        o = isa.operands(ins)
        if o["op"] != isa.Op.RQ or o["len"] % rw:
            raise CompileError(f"one pool for K and V: {isa.describe(ins, P.config)} ({note}) is not an RQ of "
                               f"whole rows of {rw} words")
        for row in range(o["len"] // rw):
            out.append(isa.rq(base + row * 2 * rw, o["src"] + row * rw, rw, o["m"], o["s"], o["relu"]))
            notes.append(f"{note}, row {row} into the K/V region")
        last = len(out) - 1
    if requants:
        raise CompileError(f"one pool for K and V: no {', '.join(sorted(requants))} in the program")
    return KVRewrite(instrs=out, notes=notes, block=block, new=new, last_kv_write=last, blocks=blocks)


def mailbox_words(layout: ResidentLayout, P: Program, x_row, table) -> dict:
    """External address -> word of what the host writes before a step: x quantized at its scale and
    the block table (page numbers; a hole, None, is written as an entry outside the pool)."""
    node = P.graph.nodes[P.ext_map["x"].node]
    q = quantize_matrix([list(x_row)], P.scales[node.id])[0]
    if len(table) > layout.table_cap:
        raise CompileError(f"a block table of {len(table)} pages exceeds the layout's {layout.table_cap}")
    out = {layout.x_addr + i: u32(v) for i, v in enumerate(q)}
    for i, p in enumerate(table):
        out[layout.table_ext + i] = 0xFFFFFFFF if p is None else p
    return out


def _spad_extents(ins, cfg: ChipConfig) -> tuple:
    """The scratchpad words an instruction reads and writes: ``(reads, writes)``, each a list of
    ``(generic field of its address, first word, words)``; a strided MM operand as the hull of its rows
    (the extents `hdl.isa.validate` checks)."""
    o = isa.operands(ins, cfg)
    op = o["op"]
    if op in (isa.Op.HALT, isa.Op.RQC):
        return [], []
    if op == isa.Op.LD:
        return [], [("a", o["dst"], o["len"])]
    if op == isa.Op.ST:
        return [("a", o["src"], o["len"])], []
    if op == isa.Op.MM:
        M, K, N, per_word = o["M"], o["K"], o["N"], cfg.elems_per_word
        c_words = -(-N // per_word) if o["pc"] else N
        if o["pb"] and o["tb"]:
            b_span = (N - 1) * o["ldb"] + -(-K // per_word)
        elif o["pb"]:
            b_span = (K - 1) * o["ldb"] + -(-N // per_word)
        else:
            b_span = (N - 1) * o["ldb"] + K if o["tb"] else (K - 1) * o["ldb"] + N
        return ([("b", o["A"], (M - 1) * o["lda"] + K), ("c", o["B"], b_span)],
                [("a", o["dst"], (M - 1) * o["ldc"] + c_words)])
    if op == isa.Op.VADD:
        return [("b", o["src1"], o["len"]), ("c", o["src2"], o["len"])], [("a", o["dst"], o["len"])]
    if op in (isa.Op.RQ, isa.Op.SM, isa.Op.AMAX, isa.Op.UNPACK):
        out = 8 * o["len"] if op == isa.Op.UNPACK else 1 if op == isa.Op.AMAX else o["len"]
        return [("b", o["src"], o["len"])], [("a", o["dst"], out)]
    if op in (isa.Op.GATHER, isa.Op.SCATTER):
        rows = [("a", o["spad"], (o["hi"] - o["lo"]) << o["row_log2"])]
        table = [("b", o["table"], o["table_len"])]
        return (table, rows) if op == isa.Op.GATHER else (rows + table, [])
    raise CompileError(f"no scratchpad extents known for {isa.describe(ins, cfg)}")


def relocate_load(instrs: list, load: int, to: int, cfg: ChipConfig) -> list:
    """`instrs` with the buffer that the LD ``instrs[load]`` fills moved to scratchpad word `to`: the LD
    writes there and every read of the buffer's words reads there instead.

    The compiler's allocator (`compiler.emit.compile_graph`) gives a buffer words that no other buffer
    holds while it is live, and writes a buffer's words before it reads them; so the reads of the loaded
    words are exactly those from the LD up to the first instruction writing any of them (the buffer is
    released by then). The words ``[to, to + len)`` must be the caller's (no instruction touches them).
    Raises `CompileError` when a read covers only part of the buffer's words or when an instruction
    touches the words at `to`."""
    first = isa.operands(instrs[load], cfg)
    if first["op"] != isa.Op.LD:
        raise CompileError(f"relocate_load: instruction {load} is {isa.describe(instrs[load], cfg)}, not an LD")
    lo, n = first["dst"], first["len"]
    for i, ins in enumerate(instrs):
        reads, writes = _spad_extents(ins, cfg)
        if any(s < to + n and to < s + w for _, s, w in reads + writes):
            raise CompileError(f"relocate_load: instruction {i} ({isa.describe(ins, cfg)}) touches the words "
                               f"{to}..{to + n - 1} the buffer would move to")
    out = list(instrs)
    out[load] = dataclasses.replace(instrs[load], a=to)
    for i in range(load + 1, len(instrs)):
        reads, writes = _spad_extents(instrs[i], cfg)
        moved = {}
        for field, s, w in reads:
            if s + w <= lo or s >= lo + n:
                continue
            if not lo <= s <= s + w <= lo + n:
                raise CompileError(f"relocate_load: instruction {i} ({isa.describe(instrs[i], cfg)}) reads "
                                   f"words {s}..{s + w - 1}, part of the loaded {lo}..{lo + n - 1} only")
            moved[field] = s + to - lo
        if moved:
            out[i] = dataclasses.replace(instrs[i], **moved)
        if any(s < lo + n and lo < s + w for _, s, w in writes):
            break                               # the buffer is dead: its words hold another one now
    return out


def mailbox_load(layout: ResidentLayout, x_words: int, table_len: int):
    """The one LD of a program's mailbox: x (`x_words` words, at ``layout.x_ext(x_words)``) and the block
    tables after it (`table_len` entries) are one range of external memory, brought into the scratchpad
    words ``[table_addr - x_words, table_addr + table_len)``: x right below the block-table area, where the
    caller keeps it (`relocate_load`)."""
    if layout.table_addr - x_words < 0 or not 0 <= table_len <= layout.table_cap:
        raise CompileError(f"the mailbox's x ({x_words} words) and {table_len} table entries do not fit "
                           f"below the block-table area at {layout.table_addr} (capacity {layout.table_cap})")
    n = x_words + table_len
    if n > layout.config.max_len:
        raise CompileError(f"one LD of the mailbox's {n} words is longer than the chip's {layout.config.max_len}")
    return isa.ld(layout.table_addr - x_words, layout.x_ext(x_words), n)


def compile_page_copy(layout: ResidentLayout, rows: int) -> list:
    """Copy-on-write on the chip: rows [0, rows) of the page named by table entry 0 into the page named
    by entry 1 (one GATHER of the rows' K and V words into scratch words, one SCATTER out). The host
    writes the two page numbers to the mailbox's table words."""
    if not 1 <= rows <= layout.page_rows:
        raise CompileError(f"page copy of {rows} rows: a page has {layout.page_rows}")
    common = dict(table_len=1, page_log2=layout.page_log2, lo=0, hi=rows, row_log2=layout.pool_row_log2,
                  pool_pages=layout.pool_pages, base=layout.k_base)
    t_old, t_new = layout.table_addr, layout.table_addr + 1
    code = [isa.ld(layout.table_addr, layout.table_ext, 2),
            isa.gather(0, table=t_old, **common), isa.scatter(0, table=t_new, **common), isa.halt()]
    code = [isa.encode(c) for c in code]
    try:
        isa.validate_program(code, layout.config.ext_words, cfg=layout.config)
    except isa.IsaError as err:
        raise CompileError(f"the page copy is not legal for the chip: {err}") from None
    return code
