"""The resident-mode host (issue 13, docs/resident.md): the chip keeps the weights and the KV cache.

One `ResidentChip` is one chip's session: `load` runs the load program once (the weights into the
scratchpad); afterwards every step writes only the mailbox (the input row x and the request's block
table) into the external memory the previous run left, runs the step program from the scratchpad the
previous run left (``backend.run(..., scratchpad=...)``) and keeps the final external memory and
scratchpad for the next run, exactly what the silicon would hold between programs.

The page table (`host.pagetable.PageTable`) decides allocation, window trimming, fork and copy-on-write;
the data never passes through the host: the step program GATHERs the cached rows and SCATTERs the new
one, and a copy-on-write of a partly filled page is a chip-side page copy (`compiler.resident.
compile_page_copy`). The page table's own row slots hold nothing (None).
"""
from __future__ import annotations

from compiler import CompileError, readback
from compiler.resident import (ResidentLayout, check_same_weights, compile_load, compile_page_copy,
                               compile_step, mailbox_words, plan_layout)
from hdl.config import BOOK, ChipConfig
from host.calibrate import calibrate
from host.paged import HostError, _check_model, _positive, _token, check_decode
from host.pagetable import OutOfPages, PageTable
from host.tiny_lm import V, build_graph
from host.window import context_size, gather_bounds, trim_point

__all__ = ["ResidentChip", "ResidentError"]


class ResidentError(HostError):
    """The chip stopped with its error state (a bad block table) or the session cannot go on."""


class ResidentChip:
    """A resident-mode session of the tiny LM on one chip (weights and KV cache stay on the chip).

    Parameters
    ----------
    m : dict
        The tiny LM (``host.tiny_lm.make_model``).
    steps : int
        Steps of the calibration decodes; a request may not need a larger context than they give.
    W : int or None
        Window in tokens (as `host.paged.PagedChip`).
    page, n_pages : int
        Rows per page (a power of two) and pages of each pool (K and V share page numbers).
    starts : iterable of int
        Start tokens of the calibration decodes.
    backend : object
        ``backend.run(code, image, lat, scratchpad=words)`` returning a result with ``ext``,
        ``scratchpad``, ``counters`` and ``error`` (``sim.backends``); never imported here.
    lat : int
        External read latency handed to the backend.
    config : hdl.config.ChipConfig
        The chip: ``gather`` must be 1 and its external memory must hold the pools
        (`compiler.resident.plan_layout` says how much).

    Attributes
    ----------
    layout : compiler.resident.ResidentLayout
    pagetable : PageTable
    progs : dict
        (context, first cached row in the table, table length) -> step ``compiler.Program``.
    load_record : dict or None
        The load program's run: ``counters``, ``host_words`` (the weights' words).
    peak : int
        Most pages in use after any step so far.
    """

    def __init__(self, m, steps, W=None, page=4, n_pages=64, starts=range(V), backend=None, lat=8,
                 config: ChipConfig = BOOK):
        check_decode(steps, W, page, n_pages, paged=False, config=config)
        _check_model(m)
        if not config.gather:
            raise HostError(f"--mode resident needs a chip with gather=1 (GATHER/SCATTER); --chip "
                            f"{config.spec()} has none (try --chip fast)")
        starts = list(starts)
        if not starts:
            raise HostError("starts must name at least one start token, got none")
        for s in starts:
            _token("calibration start", s)
        if backend is None or not callable(getattr(backend, "run", None)):
            raise HostError("no backend: pass backend=... (an object with run(code, image, lat, scratchpad=))")
        self.m, self.steps, self.W, self.page, self.n_pages = m, steps, W, page, n_pages
        self.backend, self.lat, self.config = backend, _positive("lat", lat), config
        self.calib, self.ranges = calibrate(m, steps, W, starts)
        try:
            self.layout: ResidentLayout = plan_layout(build_graph(m, 1), config, page, n_pages)
        except CompileError as e:
            raise HostError(str(e)) from None
        self.pagetable = PageTable(n_pages, page)
        self.progs: dict = {}
        self.weights = None
        self.load_record = None
        self.peak = 0
        self._ext = None
        self._spad = None

    # ---- programs ----------------------------------------------------------------------------------
    def program(self, n: int, lo_rel: int, table_len: int):
        """The step program for context n, cached rows from table row `lo_rel`, a `table_len`-page table."""
        key = (n, lo_rel, table_len)
        if key not in self.progs:
            self.progs[key] = compile_step(self.layout, build_graph(self.m, n), self.calib[n], self.ranges,
                                           lo_rel, table_len, weights=self.weights)
        return self.progs[key]

    # ---- the session -------------------------------------------------------------------------------
    def load(self) -> dict:
        """Run the load program once: the weights into the scratchpad. Returns its record."""
        first = compile_step(self.layout, build_graph(self.m, 1), self.calib[1], self.ranges, 0, 1)
        load = compile_load(self.layout, first)
        self.weights = load.weights
        check_same_weights(self.weights, first, "the step program of context 1")
        image = [0] * self.config.ext_words
        for a, w in load.writes.items():
            image[a] = w
        result = self.backend.run(load.code, image, self.lat)
        self._check_error(result, "the load program")
        self._ext, self._spad = list(result.ext), list(result.scratchpad)
        self.load_record = {"counters": list(result.counters), "host_words": len(load.writes),
                            "code": load.code}
        return self.load_record

    def _check_error(self, result, what):
        if getattr(result, "error", None) is not None:
            raise ResidentError(f"{what}: the chip stopped with its error state ({result.error})")

    def _run(self, code, writes, what):
        ext = self._ext
        for a, w in writes.items():
            ext[a] = w
        result = self.backend.run(code, ext, self.lat, scratchpad=self._spad)
        self._ext, self._spad = list(result.ext), list(result.scratchpad)
        self._check_error(result, what)
        return result

    def new(self, rid) -> None:
        self.pagetable.new(rid)

    def fork(self, src, dst) -> None:
        """`dst` shares every page of `src` (no copy now; the first write into a shared partly filled
        page copies it on the chip)."""
        self.pagetable.fork(src, dst)

    def release(self, rid) -> None:
        self.pagetable.release(rid)

    def step(self, rid, token: int) -> dict:
        """One decode step of request `rid` on input `token`; returns its record (as
        `host.paged.PagedChip.generate`'s, plus ``host_words``, ``lo_rel``, ``table`` and ``copies``)."""
        if self._ext is None:
            raise ResidentError("the session is not loaded: call load() first")
        _token("token", token)
        pt = self.pagetable
        L = pt.length(rid) + 1
        nc = context_size(L, self.W)
        if nc > max(self.calib):
            raise HostError(f"request {rid!r}: a context of {nc} exceeds the calibrated {max(self.calib)}")
        lo, _ = gather_bounds(L, self.W)
        pages = pt.used()
        before = pt.table(rid)
        off = (L - 1) % self.page
        # compiled before the page table changes: a program that cannot be built leaves the table alone
        P = self.program(nc, lo - pt.first_row(rid), len(before) + (off == 0))
        pt.append(rid, None)                    # the new row's slot: may take a page or copy a shared one
        after = pt.table(rid)
        host_words, copies, counters = 0, 0, [0, 0, 0, 0, 0]
        if off and before[-1] != after[-1]:
            # copy-on-write of a partly filled page: the chip copies rows [0, off) into the new page
            code = compile_page_copy(self.layout, off)
            writes = {self.layout.table_ext: before[-1], self.layout.table_ext + 1: after[-1]}
            r = self._run(code, writes, f"the page copy of request {rid!r}")
            host_words += len(writes)
            copies += 1
            counters = [a + b for a, b in zip(counters, r.counters)]
        first = pt.first_row(rid)
        writes = mailbox_words(self.layout, P, self.m["E"][token], after)
        result = self._run(P.code, writes, f"step {L} of request {rid!r}")
        host_words += len(writes)
        out = readback(P, result.ext)
        if self.W is not None:
            pt.trim(rid, trim_point(L, self.W))
        self.peak = max(self.peak, pt.used())
        return {"L": L, "ctx": nc, "lo": lo, "lo_rel": lo - first, "tok": out["tok"][0][0][0],
                "pages": pages, "table": list(after), "copies": copies,
                "counters": [a + b for a, b in zip(counters, result.counters)],
                "step_counters": list(result.counters), "host_words": host_words,
                "logits_int": list(out["logits"][0][0]), "logits": list(out["logits"][1][0]),
                "code": P.code}

    def generate(self, start, n, force=None, progress=None, rid=0):
        """Decode n tokens from `start` as request `rid` (loading the session first if needed); returns
        ``(tokens, records)`` like `host.paged.PagedChip.generate`."""
        _token("start", start)
        _positive("n (steps to decode)", n)
        need, have = context_size(n, self.W), context_size(self.steps, self.W)
        if need > have:
            raise HostError(f"cannot decode {n} steps: calibrated for {self.steps} steps, "
                            f"i.e. contexts up to {have}, and this decode needs {need}")
        check_decode(n, self.W, self.page, self.n_pages, paged=True, config=self.config)
        if force is not None and len(force) < n + 1:
            raise HostError(f"force must be a sequence of at least {n + 1} tokens")
        if self._ext is None:
            self.load()
        self.new(rid)
        toks, records = [start], []
        try:
            for L in range(1, n + 1):
                rec = self.step(rid, toks[-1])
                records.append(rec)
                toks.append(force[L] if force is not None else rec["tok"])
                if progress is not None:
                    progress(L, n)
        except OutOfPages as e:
            raise OutOfPages(f"out of pages at step {len(records) + 1}: {e}") from None
        return toks, records
