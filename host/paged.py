"""The paged host (model spec 5.4): decodes with the KV cache in a page table and an optional window.

Per step L the host gathers logical rows lo..L-2 through the block table into the contiguous kc/vc inputs of
the program for context min(L, W) (compiled once and cached), runs it on the backend it was given, appends
the new (k, v) row and releases the pages that left the window. The chip never sees a page.
"""
from __future__ import annotations

from collections.abc import Sequence

from compiler import compile_graph, ext_image, readback
from host.calibrate import calibrate
from host.pagetable import PageTable
from host.tiny_lm import V, build_graph
from host.window import check_window, context_size, gather_bounds, trim_point

__all__ = ["PagedChip", "HostError"]


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
    page : int
        Cache rows per page (>= 1).
    n_pages : int
        Pages in the pool (>= 1); running out raises ``host.pagetable.OutOfPages``.
    starts : iterable of int
        Start tokens of the calibration decodes.
    paged : bool
        True: the cache lives in a `PageTable`. False: plain Python lists (the reference host); both
        must give identical integers.
    backend : object or None
        Runs a program: ``backend.run(code, image, lat)`` returns a result with ``.ext`` and ``.counters``
        (e.g. ``sim.reference.ReferenceMachine()``). The host never imports a simulator itself.
    lat : int
        External-memory read latency handed to the backend.

    Attributes
    ----------
    progs : dict
        Context size -> compiled ``compiler.Program`` (filled as contexts are first used).
    calib, ranges
        The windowed calibration samples and ranges (spec 5.3).
    peak : int
        Most pages in use after any step of the last ``generate`` (0 before the first).
    pagetable : PageTable or None
        The page table of the last paged ``generate``.
    """

    def __init__(self, m, steps, W=None, page=4, n_pages=64, starts=range(V), paged=True, backend=None,
                 lat=8):
        try:
            check_window(W)
        except ValueError as e:
            raise HostError(str(e)) from None
        self.steps = _positive("steps", steps)
        self.page = _positive("page size", page)
        self.n_pages = _positive("pool size (n_pages)", n_pages)
        self.lat = _positive("lat", lat)
        starts = list(starts)
        if not starts:
            raise HostError("starts must name at least one start token, got none")
        for s in starts:
            _token("calibration start", s)
        if backend is not None and not callable(getattr(backend, "run", None)):
            raise HostError(f"backend must have a run(code, image, lat) method, got {type(backend).__name__}")
        self.m, self.W, self.paged, self.backend = m, W, bool(paged), backend
        self.calib, self.ranges = calibrate(m, steps, W, starts)
        self.progs: dict = {}
        self.peak = 0
        self.pagetable: PageTable | None = None

    def program(self, n: int):
        """The compiled program for context n (compiled on first use, then cached)."""
        if n not in self.progs:
            self.progs[n] = compile_graph(build_graph(self.m, n), self.calib[n], ranges=self.ranges)
        return self.progs[n]

    def generate(self, start, n, force=None, progress=None):
        """Decode n tokens from ``start``; returns ``(tokens, records)`` (n+1 tokens, n records).

        Each record holds ``L``, ``ctx``, ``lo`` (first cached row read), ``tok`` (the chip's token),
        ``pages`` (pages in use BEFORE this step's append), ``counters`` (the backend's five),
        ``logits_int``, ``logits``, ``code`` and ``image``. With ``force`` (a sequence of at least n+1
        tokens) the next input token is ``force[L]`` instead of the chip's. ``progress(L, n)`` is called
        after every step.
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
        if progress is not None and not callable(progress):
            raise HostError(f"progress must be a callable(L, n) or None, got {type(progress).__name__}")
        if self.backend is None:
            raise HostError("no backend: pass backend=... (an object with run(code, image, lat), "
                            "e.g. sim.reference.ReferenceMachine())")
        E = self.m["E"]
        pt = PageTable(self.n_pages, self.page)
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
            records.append({"L": L, "ctx": nc, "lo": lo, "tok": tok, "pages": pt.used(),
                            "counters": list(result.counters), "logits_int": list(out["logits"][0][0]),
                            "logits": list(out["logits"][1][0]), "code": P.code, "image": image})
            # the cache keeps the chip's dequantized rows, exactly what the next program is given back
            row = (tuple(out["k_new"][1][0]), tuple(out["v_new"][1][0]))
            pt.append(0, row)
            plain.append(row)
            if self.W is not None:
                pt.trim(0, trim_point(L, self.W))
            peak = max(peak, pt.used())
            toks.append(force[L] if force is not None else tok)
            if progress is not None:
                progress(L, n)
        self.peak = peak
        self.pagetable = pt
        return toks, records
