"""The paged host (model spec 5.4): decodes with the KV cache in a page table and an optional window.

Per step L the host gathers logical rows lo..L-2 through the block table into the contiguous kc/vc inputs of
the program for context min(L, W) (compiled once and cached), runs it on the backend it was given, appends
the new (k, v) row and releases the pages that left the window. The chip never sees a page.

Everything that can be known before a decode runs is checked before its first step (`check_decode`): the
arguments, the chip's context limit and the pages the decode will need, so a bad request fails at once and
leaves the host as it was.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence

from compiler import compile_graph, ext_image, readback
from hdl.config import BOOK, ChipConfig
from host.calibrate import calibrate
from host.pagetable import MAX_POOL_ROWS, OutOfPages, PageTable
from host.tiny_lm import D, HID, V, build_graph
from host.window import (check_window, context_size, first_step_over, gather_bounds, pages_during_step,
                         pages_needed, trim_point)

__all__ = ["PagedChip", "HostError", "MAX_CONTEXT", "max_context", "check_decode"]

# The attention's p.V multiplies by a context-long vector, i.e. a matmul whose inner dimension K is the
# context, and the matrix unit's K is at most cfg.mm_max_k: a chip's one limit on the context.
# MAX_CONTEXT is the book's chip's; `max_context(cfg)` any chip's.
def max_context(cfg: ChipConfig = BOOK) -> int:
    """The largest context the chip `cfg` can attend: its matrix unit's largest K."""
    return cfg.mm_max_k


MAX_CONTEXT = max_context(BOOK)

# The weights a model must provide, with their shapes (host.tiny_lm.make_model).
_SHAPES = {"E": (V, D), "Wq": (D, D), "Wk": (D, D), "Wv": (D, D), "Wo": (D, D), "W1": (D, HID),
           "W2": (HID, D), "Wout": (D, V)}


class HostError(ValueError):
    """A bad argument to the paged host (the message names the value)."""


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive(name: str, v) -> int:
    if not _int(v) or v < 1:
        raise HostError(f"{name} must be >= 1, got {v!r}")
    return v


def _token(name: str, t) -> int:
    if not _int(t) or not 0 <= t < V:
        raise HostError(f"{name} must be a token 0..{V - 1}, got {t!r}")
    return t


def _check_model(m) -> None:
    # a wrong model would otherwise surface as a KeyError or IndexError deep inside calibration
    if not isinstance(m, Mapping):
        raise HostError(f"model must be a dict of weights (host.tiny_lm.make_model), got {type(m).__name__}")
    missing = [k for k in _SHAPES if k not in m]
    if missing:
        raise HostError(f"model has no {', '.join(missing)} (host.tiny_lm.make_model gives every weight)")
    for k, (rows, cols) in _SHAPES.items():
        w = m[k]
        ok = (isinstance(w, Sequence) and len(w) == rows
              and all(isinstance(r, Sequence) and len(r) == cols for r in w))
        if not ok:
            raise HostError(f"model weight {k} must be {rows} rows of {cols} numbers")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                   for r in w for x in r):
            raise HostError(f"model weight {k} holds a value that is not a finite number")


def _window_text(W) -> str:
    return "none" if W is None else str(W)


def check_decode(steps, W, page, n_pages, paged: bool = True, config: ChipConfig = BOOK) -> None:
    """Refuse, before anything runs, an n-step decode that cannot complete; the message says why.

    Parameters
    ----------
    steps : int
        Steps to decode (>= 1).
    W : int or None
        Window in tokens, or None.
    page, n_pages : int
        Rows per page and pages in the pool, each >= 1 with ``page * n_pages <= MAX_POOL_ROWS`` (2^20).
    paged : bool
        False: the rows live in a plain list, so the pool is not needed (only its sizes are checked).
    config : hdl.config.ChipConfig
        The chip that will run the decode (its matrix unit's K bounds the context).

    Raises
    ------
    HostError
        A bad value, or a context ``min(steps, W)`` above ``max_context(config)`` (the matrix unit's K).
    OutOfPages
        The pool is too small: the message names the first step that would find it full, the pages that
        step needs and the pages the pool has.
    """
    try:
        check_window(W)
    except ValueError as e:
        raise HostError(str(e)) from None
    _positive("steps", steps)
    _positive("page size", page)
    _positive("pool size (n_pages)", n_pages)
    if page * n_pages > MAX_POOL_ROWS:
        raise HostError(f"a pool of {n_pages} pages of {page} rows holds {page * n_pages} rows, more than "
                        f"the {MAX_POOL_ROWS} allowed")
    if not isinstance(config, ChipConfig):
        raise HostError(f"config must be an hdl.config.ChipConfig, got {type(config).__name__}")
    ctx = context_size(steps, W)
    limit = max_context(config)
    if ctx > limit:
        raise HostError(f"a context of {ctx} tokens exceeds the chip's limit of {limit} (the attention's "
                        f"p.V has K = context and a matmul's K is at most {limit}): decode fewer steps "
                        f"or use a window of at most {limit}")
    if paged:
        L = first_step_over(steps, W, page, n_pages)
        if L is not None:
            raise OutOfPages(f"out of pages: step {L} needs {pages_during_step(L, W, page)} pages of {page} "
                             f"rows and the pool has {n_pages} ({steps} steps with window {_window_text(W)} "
                             f"need {pages_needed(steps, W, page)})")


class PagedChip:
    """The Chapter 15 host: windowed calibration, one program per context size, a paged KV cache.

    Parameters
    ----------
    m : dict
        The tiny LM (``host.tiny_lm.make_model``).
    steps : int
        Steps of the calibration decodes (>= 1); ``generate`` may not need a context larger than it gives.
    W : int or None
        Window in tokens: a step attends the new token and at most W-1 cached rows. ``None``: no window.
        ``W = 1`` is accepted (each step attends its own token only; see ``host.window``).
        The largest context, ``min(steps, W)``, may be at most ``max_context(config)`` (64 on the book's chip).
    page : int
        Cache rows per page (>= 1).
    n_pages : int
        Pages in the pool (>= 1); ``page * n_pages`` may be at most ``host.pagetable.MAX_POOL_ROWS``
        (2^20 rows). A decode that would run out is refused before its first step with
        ``host.pagetable.OutOfPages`` (see `check_decode`).
    starts : iterable of int
        Start tokens of the calibration decodes.
    paged : bool
        True: the cache lives in a `PageTable`. False: plain Python lists (the reference host), and no
        page table is created or touched (``pagetable`` and ``peak`` keep their values, records carry
        ``pages = None``); both must give identical integers.
    backend : object or None
        Runs a program: ``backend.run(code, image, lat)`` returns a result with ``.ext`` and ``.counters``
        (e.g. ``sim.backends.reference.ReferenceMachine()``). The host never imports a simulator itself.
    lat : int
        External-memory read latency handed to the backend.
    config : hdl.config.ChipConfig
        The chip the programs are compiled for (the backend must simulate the same chip). The tokens and
        integer logits do not depend on it; the cycle counts do.

    Attributes
    ----------
    progs : dict
        Context size -> compiled ``compiler.Program`` (filled as contexts are first used).
    calib, ranges
        The windowed calibration samples and ranges (spec 5.3).
    peak : int
        Most pages in use after any step of the last paged ``generate`` (0 before the first).
    pagetable : PageTable or None
        The page table of the last paged ``generate`` that completed.

    Raises
    ------
    HostError
        For any bad argument, here or in `generate` (never a bare TypeError or KeyError).
    """

    def __init__(self, m, steps, W=None, page=4, n_pages=64, starts=range(V), paged=True, backend=None,
                 lat=8, config: ChipConfig = BOOK):
        if not isinstance(paged, bool):
            raise HostError(f"paged must be True or False, got {paged!r}")
        # the pool is checked per decode, in generate
        check_decode(steps, W, page, n_pages, paged=False, config=config)
        self.config = config
        self.steps, self.page, self.n_pages = steps, page, n_pages
        self.lat = _positive("lat", lat)
        _check_model(m)
        try:
            starts = list(starts)
        except TypeError:
            raise HostError(f"starts must be an iterable of tokens, got {type(starts).__name__}") from None
        if not starts:
            raise HostError("starts must name at least one start token, got none")
        for s in starts:
            _token("calibration start", s)
        if backend is not None and not callable(getattr(backend, "run", None)):
            raise HostError(f"backend must have a run(code, image, lat) method, got {type(backend).__name__}")
        self.m, self.W, self.paged, self.backend = m, W, paged, backend
        self.calib, self.ranges = calibrate(m, steps, W, starts)
        self.progs: dict = {}
        self.peak = 0
        self.pagetable: PageTable | None = None

    def program(self, n: int):
        """The compiled program for context n (compiled on first use, then cached)."""
        if n not in self.progs:
            self.progs[n] = compile_graph(build_graph(self.m, n), self.calib[n], ranges=self.ranges,
                                          config=self.config)
        return self.progs[n]

    def generate(self, start, n, force=None, progress=None):
        """Decode n tokens from ``start``; returns ``(tokens, records)`` (n+1 tokens, n records).

        Each record holds ``L``, ``ctx``, ``lo`` (first cached row read), ``tok`` (the chip's token),
        ``pages`` (pages in use BEFORE this step's append), ``counters`` (the backend's five),
        ``logits_int``, ``logits``, ``code`` and ``image``. With ``force`` (a sequence of at least n+1
        tokens) the next input token is ``force[L]`` instead of the chip's. ``progress(L, n)`` is called
        after every step.

        Everything is checked before the first step runs (the arguments, the calibration and the pool: see
        `check_decode`); a refused call changes nothing. With ``paged`` false no page table is touched.
        """
        _token("start", start)
        _positive("n (steps to decode)", n)
        need = context_size(n, self.W)
        have = context_size(self.steps, self.W)
        if need > have:
            raise HostError(f"cannot decode {n} steps: calibrated for {self.steps} steps, "
                            f"i.e. contexts up to {have}, and this decode needs {need}")
        if force is not None:
            if not isinstance(force, Sequence) or len(force) < n + 1:
                raise HostError(f"force must be a sequence of at least {n + 1} tokens, "
                                f"got {len(force) if isinstance(force, Sequence) else type(force).__name__}")
            for i in range(1, n + 1):
                _token(f"force[{i}]", force[i])
        if progress is not None:
            if not callable(progress):
                raise HostError(f"progress must be a callable(L, n) or None, got {type(progress).__name__}")
            try:
                inspect.signature(progress).bind(1, n)
            except TypeError:
                raise HostError(f"progress must accept two arguments (L, n), got {progress!r}") from None
            except ValueError:
                pass                    # no signature to inspect (some builtins): it is called as it is
        if not isinstance(self.paged, bool):
            raise HostError(f"paged must be True or False, got {self.paged!r}")
        check_decode(n, self.W, self.page, self.n_pages, paged=self.paged, config=self.config)
        if self.backend is None:
            raise HostError("no backend: pass backend=... (an object with run(code, image, lat), "
                            "e.g. sim.backends.reference.ReferenceMachine())")
        E = self.m["E"]
        pt = PageTable(self.n_pages, self.page) if self.paged else None
        if self.paged:
            pt.new(0)
        plain: list = []
        toks, records, peak = [start], [], 0
        for L in range(1, n + 1):
            nc = context_size(L, self.W)
            lo, hi = gather_bounds(L, self.W)
            rows = pt.rows(0, lo, hi) if self.paged else plain[lo:hi]
            inputs = {"x": [E[toks[-1]]]}
            if nc > 1:
                inputs["kc"] = [list(r[0]) for r in rows]
                inputs["vc"] = [list(r[1]) for r in rows]
            P = self.program(nc)
            image = ext_image(P, inputs, P.ext_size)
            result = self.backend.run(P.code, image, self.lat)
            out = readback(P, result.ext)
            tok = out["tok"][0][0][0]
            records.append({"L": L, "ctx": nc, "lo": lo, "tok": tok, "pages": pt.used() if self.paged else None,
                            "counters": list(result.counters), "logits_int": list(out["logits"][0][0]),
                            "logits": list(out["logits"][1][0]), "code": P.code, "image": image})
            # the cache keeps the chip's dequantized rows, exactly what the next program is given back
            row = (tuple(out["k_new"][1][0]), tuple(out["v_new"][1][0]))
            if not self.paged:
                plain.append(row)
            else:
                try:
                    pt.append(0, row)
                except OutOfPages as e:
                    # check_decode makes this unreachable; should it happen, the host is left as it was
                    raise OutOfPages(f"out of pages at step {L}, which needs "
                                     f"{pages_during_step(L, self.W, self.page)} pages of {self.page} rows "
                                     f"and the pool has {self.n_pages}: {e}") from None
                if self.W is not None:
                    pt.trim(0, trim_point(L, self.W))
                peak = max(peak, pt.used())
            toks.append(force[L] if force is not None else tok)
            if progress is not None:
                progress(L, n)
        if self.paged:
            self.peak = peak
            self.pagetable = pt
        return toks, records
