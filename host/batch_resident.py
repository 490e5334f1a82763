"""Batched programs in resident mode (issue 14 on top of issue 13, docs/resident.md).

The weights stay in the scratchpad (one load program per session) and the KV cache stays in the chip's page
pool, a position's K row and V row side by side in one pool row (`compiler.resident.plan_kv`): each row of
a batch GATHERs its cached K and V rows through its own block table (one GATHER a gathered range) and
SCATTERs its new k and v row into its page slot (one SCATTER). The host writes only the mailbox: the B input
rows x, ending where the block tables of the B rows (one after the other) start, so that the program's first
instruction, its only LD, brings both (`compiler.resident.mailbox_load`: x kept right below the block-table
area, `compiler.resident.relocate_load`). In a batch of several rows every row's new k/v row is SCATTERed
before the first GATHER, and each row gathers its own new row with its cached ones (``own_rows`` of
`host.batch.build_batch_graph`): no copy of it is made in the scratchpad.
The graph, the universal calibration and so every integer are those of `host.batch`: a request served in
resident mode gives what it gives in book mode and alone (`host.engine.decode_alone`).
"""
from __future__ import annotations

import dataclasses

from compiler import CompileError, readback
from compiler.resident import (compile_load, compile_page_copy, compile_resident, finish_program, mailbox_load,
                               plan_layout, relocate_load)
from hdl import isa
from hdl.arith import argmax_first, u32
from hdl.config import ChipConfig
from host.batch import _dummy_sample, _model_key, build_batch_graph, universal_ranges
from host.tiny_lm import D, V

__all__ = ["ResidentBatchRunner"]


def _quantize_row(row, scale):
    from compiler.image import quantize_matrix
    return quantize_matrix([list(row)], scale)[0]


def _with_own_row(ranges, new_row):
    """The relative row ranges `ranges` followed by the row `new_row` (merged into the last range when it
    ends there)."""
    ranges = [tuple(r) for r in ranges]
    if ranges and ranges[-1][1] == new_row:
        return ranges[:-1] + [(ranges[-1][0], new_row + 1)]
    return ranges + [(new_row, new_row + 1)]


class ResidentBatchRunner:
    """Runs batched steps of the resident session of one chip.

    Parameters
    ----------
    m : dict
    backend : object
        ``run(code, image, lat, scratchpad=words)``.
    lat : int
    config : hdl.config.ChipConfig
        ``gather`` must be 1.
    page, n_pages : int
        The pools' geometry (``page`` a power of two).
    max_batch : int
        Rows per program at most (sizes the mailbox).

    Attributes
    ----------
    load_counters : list
        The load program's five counters.
    """

    def __init__(self, m, backend, lat, config: ChipConfig, page: int, n_pages: int, max_batch: int,
                 table_cap: int = 128):
        self.m, self.backend, self.lat, self.config = m, backend, lat, config
        self.ranges = universal_ranges(m)
        one = build_batch_graph(m, (1,), chip_argmax=False)
        base = plan_layout(one, config, page, n_pages, table_cap)
        B = max_batch
        # the mailbox for B rows: x (B x D; a batch of b rows writes its b x D words right before the
        # tables, `ResidentLayout.x_ext`), the tables, tok (B), logits (B x V)
        table_ext = B * D
        tok = table_ext + table_cap
        logits = tok + B
        staging = logits + B * V
        k_base = staging + base.weight_words()
        v_base = k_base + base.row_words       # V's half of a pool row (compiler.resident.ResidentLayout)
        need = k_base + base.pool_words
        if need > config.ext_words:
            raise CompileError(f"resident serving needs {need} external words (a pool of {n_pages} pages of "
                               f"{page} rows, a mailbox for {B} rows); the chip has ext_words={config.ext_words}")
        self.layout = dataclasses.replace(base, x_addr=0, table_ext=table_ext, tok_addr=tok, logits_addr=logits,
                                          staging=staging, k_base=k_base, v_base=v_base, ext_needed=need)
        self.max_batch = B
        self.progs: dict = {}
        self.unfit: dict = {}           # program key -> why the chip cannot run it
        self._key = (_model_key(m), config.key())
        first = self._compile((1,), [(0, 1, [], 0)])
        load = compile_load(self.layout, first)
        self.weights = load.weights
        image = [0] * config.ext_words
        for a, w in load.writes.items():
            image[a] = w
        result = backend.run(load.code, image, lat)
        self._check(result, "the load program")
        self._ext, self._spad = list(result.ext), list(result.scratchpad)
        self.load_counters = [int(c) for c in result.counters]

    def _check(self, result, what):
        if getattr(result, "error", None) is not None:
            raise CompileError(f"{what}: the chip stopped with its error state ({result.error})")

    def _compile(self, ctxs, specs, phases=None):
        """`specs[j]` = (table offset, table length, [(lo, hi) relative rows gathered], new row) of row j.

        `phases` (default: when there are several rows) lowers the rows' attention phase by phase
        (`host.batch.build_batch_graph`, docs/resident.md), each row's K/V block in a place of its own; when
        those places leave the allocator too little of the scratchpad, the rows attend one after the other
        in one shared place (the same integers either way)."""
        lay, cfg = self.layout, self.config
        own = len(ctxs) > 1             # several rows: each row's new k/v is stored before it is gathered
        if phases is None:
            if own:
                try:
                    return self._compile(ctxs, specs, True)
                except CompileError as exc:
                    if not str(exc).startswith("scratchpad full"):
                        raise
            phases = False
        g = build_batch_graph(self.m, ctxs, own_rows=own, chip_argmax=False, phases=phases)
        # x lives right below the block-table area (one LD brings both, `compiler.resident.mailbox_load`),
        # the K/V rows' region below it: both kept from the allocator
        x_words = next(n for n in g.nodes if n.op == "input" and n.attrs["name"] == "x").size
        x_spad = lay.table_addr - x_words
        P, moved = compile_resident(lay, g, [_dummy_sample(g)], self.ranges, x_spad,
                                    getattr(self, "weights", None), f"the batch program {ctxs}")
        pool_row = lay.pool_row_words
        e = P.ext_map
        x_ext = lay.x_ext(x_words)
        loads_x = [i for i, ins in enumerate(moved.instrs)
                   if isa.operands(ins)["op"] == isa.Op.LD and isa.operands(ins)["src"] == e["x"].address]
        if len(loads_x) != 1:
            raise CompileError(f"batch program {ctxs}: {len(loads_x)} loads of x, not one")
        # x's reads move with it to x_spad; the one LD is the program's first instruction (x's words and the
        # tables' are the caller's, written by nothing else)
        body = relocate_load(moved.instrs, loads_x[0], x_spad, cfg)
        total_table = sum(s[1] for s in specs)
        if total_table > lay.table_cap:
            raise CompileError(f"the batch's block tables hold {total_table} pages, the mailbox {lay.table_cap}")
        instrs, notes = [], []

        def put(ins, note):
            instrs.append(ins)
            notes.append(note)

        def common(j):
            off, n, _, _ = specs[j]
            return dict(table=lay.table_addr + off, table_len=n, page_log2=lay.page_log2,
                        row_log2=lay.pool_row_log2, pool_pages=lay.pool_pages, base=lay.k_base)
        put(mailbox_load(lay, x_words, total_table), "load x and the block tables (mailbox, one LD)")
        by_addr = {ent.address: name for name, ent in e.items()}
        scattered = False

        def scatter_new():
            for j, spec in enumerate(specs):
                r = spec[3]
                put(isa.scatter(moved.new + j * pool_row, lo=r, hi=r + 1, **common(j)),
                    f"scatter row {j}'s new k and v into row {r}")

        for at, (ins, note) in enumerate(zip(body, moved.notes)):
            o = isa.operands(ins)
            if o["op"] == isa.Op.LD and own and not scattered and (by_addr.get(o["src"]) or "")[:2] in ("kc", "vc"):
                # the rows' new k/v go to the cache first, so that each row's gather brings its own row too;
                # the new K and V rows must be final by now
                if moved.last_kv_write >= at:
                    raise CompileError(f"batch program {ctxs}: the new k/v rows are written at instruction "
                                       f"{moved.last_kv_write}, after the first gather ({at})")
                scatter_new()
                scattered = True
            if o["op"] == isa.Op.LD:
                name = by_addr.get(o["src"])
                if name == "x":
                    pass                        # it came with the tables, first of all
                elif name and name[:2] == "kc":
                    j = int(name[2:])
                    dst = moved.blocks[name]
                    for lo, hi in _with_own_row(specs[j][2], specs[j][3]) if own else specs[j][2]:
                        put(isa.gather(dst, lo=lo, hi=hi, **common(j)), f"gather {name} and vc{j} rows {lo}..{hi - 1}")
                        dst += (hi - lo) * pool_row
                elif name and name[:2] == "vc":
                    pass                        # its rows came with kc's
                else:
                    raise CompileError(f"batch program: unexpected load {isa.describe(ins, cfg)} ({note})")
            elif o["op"] == isa.Op.ST:
                name = by_addr.get(o["dst"])
                if name == "tok":
                    put(isa.st(o["src"], lay.tok_addr, o["len"]), "store tok (mailbox)")
                elif name == "logits":
                    put(isa.st(o["src"], lay.logits_addr, o["len"]), "store logits (mailbox)")
                elif name == "k_new":
                    if not scattered:
                        scatter_new()
                        scattered = True
                elif name == "v_new":
                    pass                        # v's rows went with k's
                else:
                    raise CompileError(f"batch program: unexpected store {isa.describe(ins, cfg)} ({note})")
            else:
                put(ins, note)
        return finish_program(P, instrs, notes, dataclasses.replace(lay, x_addr=x_ext), cfg,
                              "resident batch program")

    def _run(self, code, writes, what):
        for a, w in writes.items():
            self._ext[a] = w
        result = self.backend.run(code, self._ext, self.lat, scratchpad=self._spad)
        self._ext, self._spad = list(result.ext), list(result.scratchpad)
        self._check(result, what)
        return result

    def copy_page(self, old: int, new: int, rows: int) -> list:
        """Copy-on-write on the chip: rows [0, rows) of page `old` into page `new` (their K and V words)."""
        lay = self.layout
        r = self._run(compile_page_copy(lay, rows), {lay.table_ext: old, lay.table_ext + 1: new}, "a page copy")
        return [int(c) for c in r.counters]

    def program_for(self, rows):
        """The program of a batch of `rows` (as `run` takes them; only the tables' lengths matter) and the
        rows' canonical order: ``(program, order)``. CompileError if the chip cannot run it (remembered)."""
        ctx_of = [0 if r[2] is None else 1 + sum(hi - lo for lo, hi in r[2]) for r in rows]
        order = sorted(range(len(rows)), key=lambda i: -ctx_of[i])
        ctxs = tuple(ctx_of[i] for i in order)
        if max(ctxs) > self.config.mm_max_k:
            raise CompileError(f"a row attends {max(ctxs)} tokens, more than the chip's {self.config.mm_max_k}")
        specs, off = [], 0
        for i in order:
            _, table, gathered, new_row = rows[i]
            specs.append((off, len(table), list(gathered or ()), new_row))
            off += len(table)
        key = (ctxs, tuple((s[1], tuple(s[2]), s[3]) for s in specs))
        if key in self.unfit:
            raise CompileError(self.unfit[key])
        if key not in self.progs:
            try:
                self.progs[key] = self._compile(ctxs, specs)
            except CompileError as exc:
                self.unfit[key] = str(exc)
                raise
        return self.progs[key], order

    def run(self, rows):
        """`rows`: list of ``(token, table, gathered, new_row)``: the row's block table (pages, None for a
        hole), the relative row ranges it attends (None for a cache-only row, see
        `host.batch.build_batch_graph`) and the relative row its new k/v goes to. Returns
        ``(results, counters, program)`` like `host.batch.BatchRunner.run` (``k``/``v`` are None: the rows
        stay in the pools)."""
        P, order = self.program_for(rows)
        ctxs = tuple(0 if rows[i][2] is None else 1 + sum(hi - lo for lo, hi in rows[i][2]) for i in order)
        lay = self.layout
        xs = P.graph.nodes[P.ext_map["x"].node]
        q = _quantize_row([v for i in order for v in self.m["E"][rows[i][0]]], P.scales[xs.id])
        x_ext = P.ext_map["x"].address        # x ends where the tables start
        writes = {x_ext + k: u32(v) for k, v in enumerate(q)}
        t = lay.table_ext
        for i in order:
            for p in rows[i][1]:
                writes[t] = 0xFFFFFFFF if p is None else p
                t += 1
        result = self._run(P.code, writes, f"the batch {ctxs}")
        out = readback(P, result.ext)
        res = [None] * len(rows)
        for j, i in enumerate(order):
            full = ctxs[j] > 0
            logits = [int(v) for v in out["logits"][0][j]] if full else None
            # the host picks the token from the logits it reads anyway: AMAX's function, no AMAX on the chip
            res[i] = {"tok": argmax_first(logits) if full else None, "logits_int": logits, "k": None, "v": None}
        return res, [int(c) for c in result.counters], P
