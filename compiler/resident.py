"""Resident-mode lowering (issue 13, docs/resident.md): weights stay in the scratchpad, the KV cache in a
page pool in external memory, and the host writes only a small mailbox per step.

Three kinds of program share one `ResidentLayout`:

* the load program (`compile_load`): one LD brings every weight, quantized at its scale, from a staging
  area of the external memory into a fixed region at the top of the scratchpad;
* a step program per (context, first cached row within the table, table length) (`compile_step`): the
  book's lowering of the same graph (``compiler.emit.compile_graph``) with the weights ``placed`` where
  the load program left them (no weight loads), in which the LD of the input row x reads the mailbox,
  the loads of kc/vc become GATHERs through the block table, the stores of k_new/v_new become SCATTERs
  into the new row's page slot, and tok/logits are stored into the mailbox's output words;
* a page copy (`compile_page_copy`): copy-on-write of a partly filled page done by the chip (GATHER of
  the page's rows into scratch words, SCATTER into the new page), for the K and the V pool.

Pure Python: imports `hdl.isa`, `hdl.arith`, `hdl.config` and the compiler, never a simulator.

External memory (words)::

    0                 x: the new input row (D words)
    D                 the block table, one page number a word (table_cap words)
    D + table_cap     tok (1 word), then logits (V words)
    staging           the weights, in scratchpad order (written by the host once, for the load program)
    k_base, v_base    the K and V pools: pool_pages pages of 2**page_log2 rows of 2**row_log2 words

Scratchpad: ``[0, spad_limit)`` belongs to the step programs' allocator (and to the page copy's scratch
rows); the block table sits at ``table_addr`` (table_cap words) and the weights from ``weights_base`` to
the top. On a chip with ``mm_pack = 1`` the weights that the compiler packs (`compiler.buffers.
packed_weights`: int8, only ever an untransposed B operand) are staged and kept four int8 a word, as
every step program reads them (``pb = 1``); the layout's ``packed`` names them. On a chip with
``mm_pack_c = 1`` the K and V rows are kept four int8 a word too (`compiler.buffers.packed_activations`:
k_new and v_new are written with ``pc = 1``, kc and vc read with ``pb = 1``), so a pool row is
``row_words`` = ceil(D / 4) words and GATHER and SCATTER move a quarter of the words.
"""
from __future__ import annotations

import dataclasses
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
           "compile_page_copy", "check_same_weights", "check_row_round_trip", "mailbox_words", "finish_program"]


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
        Words of one cache row (a power of two: one int8 a word), rows of one page (a power of two),
        pages of each pool.
    weights : dict
        Weight name -> (scratchpad address, words), in scratchpad order (the staging order too).
    weights_base, table_addr, table_cap, spad_limit : int
        Scratchpad: first word of the weights, the block table's first word and its capacity, and the
        words below the table that the step programs' allocator may use.
    x_addr, table_ext, tok_addr, logits_addr, staging, k_base, v_base, ext_needed : int
        External memory: the mailbox (x, the table, tok, logits), the weights' staging area, the two
        pools, and the words the layout needs in all.
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
    def pool_words(self) -> int:
        return self.pool_pages * self.page_rows * self.row_words

    def weight_words(self) -> int:
        return sum(n for _, n in self.weights.values())


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
    pool_words = pool_pages * page_rows * row_words
    v_base = k_base + pool_words
    ext_needed = v_base + pool_words
    if ext_needed > config.ext_words:
        raise CompileError(f"the resident layout needs {ext_needed} external words (two pools of "
                           f"{pool_pages} pages of {page_rows} rows of {row_words} words, the weights' "
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
    placed = {name: addr for name, (addr, _) in layout.weights.items()}
    P = compile_graph(graph, calib_samples, ranges=ranges, ext_words=cfg.ext_words, config=cfg,
                      placed=placed, spad_limit=layout.spad_limit)
    check_row_round_trip(P)
    if weights is not None:
        check_same_weights(weights, P, f"the step program of context {n_cached + 1}")
    e = P.ext_map
    common = dict(table=layout.table_addr, table_len=table_len, page_log2=layout.page_log2,
                  row_log2=layout.row_log2, pool_pages=layout.pool_pages)
    instrs, notes = [], []

    def put(ins, note):
        instrs.append(ins)
        notes.append(note)

    put(isa.ld(layout.table_addr, layout.table_ext, table_len), "load the block table (mailbox)")
    for ins, note in zip(P.instrs, P.notes):
        o = isa.operands(ins)
        op = o["op"]
        if op == isa.Op.LD:
            src = o["src"]
            if src == e["x"].address:
                put(isa.ld(o["dst"], layout.x_addr, o["len"]), "load x (mailbox)")
            elif "kc" in e and src == e["kc"].address:
                put(isa.gather(o["dst"], base=layout.k_base, lo=lo_rel, hi=new_row, **common),
                    f"gather kc rows {lo_rel}..{new_row - 1}")
            elif "vc" in e and src == e["vc"].address:
                put(isa.gather(o["dst"], base=layout.v_base, lo=lo_rel, hi=new_row, **common),
                    f"gather vc rows {lo_rel}..{new_row - 1}")
            else:
                raise CompileError(f"step program: unexpected load {isa.describe(ins)} ({note})")
        elif op == isa.Op.ST:
            dst = o["dst"]
            if "tok" in e and dst == e["tok"].address:
                put(isa.st(o["src"], layout.tok_addr, o["len"]), "store tok (mailbox)")
            elif dst == e["logits"].address:
                put(isa.st(o["src"], layout.logits_addr, o["len"]), "store logits (mailbox)")
            elif dst == e["k_new"].address:
                put(isa.scatter(o["src"], base=layout.k_base, lo=new_row, hi=new_row + 1, **common),
                    f"scatter k row {new_row}")
            elif dst == e["v_new"].address:
                put(isa.scatter(o["src"], base=layout.v_base, lo=new_row, hi=new_row + 1, **common),
                    f"scatter v row {new_row}")
            else:
                raise CompileError(f"step program: unexpected store {isa.describe(ins)} ({note})")
        else:
            put(ins, note)
    return finish_program(P, instrs, notes, layout, cfg, "resident step program")


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


def compile_page_copy(layout: ResidentLayout, rows: int) -> list:
    """Copy-on-write on the chip: rows [0, rows) of the page named by table entry 0 into the page named
    by entry 1, in the K and the V pool (each pool: a GATHER into scratch words, a SCATTER out). The host
    writes the two page numbers to the mailbox's table words."""
    if not 1 <= rows <= layout.page_rows:
        raise CompileError(f"page copy of {rows} rows: a page has {layout.page_rows}")
    common = dict(table_len=1, page_log2=layout.page_log2, lo=0, hi=rows, row_log2=layout.row_log2,
                  pool_pages=layout.pool_pages)
    words = rows * layout.row_words
    t_old, t_new = layout.table_addr, layout.table_addr + 1
    code = [isa.ld(layout.table_addr, layout.table_ext, 2)]
    for i, base in enumerate((layout.k_base, layout.v_base)):
        scratch = i * words
        code.append(isa.gather(scratch, table=t_old, base=base, **common))
        code.append(isa.scatter(scratch, table=t_new, base=base, **common))
    code.append(isa.halt())
    code = [isa.encode(c) for c in code]
    try:
        isa.validate_program(code, layout.config.ext_words, cfg=layout.config)
    except isa.IsaError as err:
        raise CompileError(f"the page copy is not legal for the chip: {err}") from None
    return code
