"""The sliding-window rule of the paged host (model spec 5.4 and 5.5) as small pure functions.

Step L (1-based) decodes with L-1 rows already in the cache. With a window of W tokens it attends the new
token and the rows lo..L-2 (lo = L - min(L, W)); after step L the next step needs rows >= L+1-W only.
``W = None`` means no window. ``W = 1`` is allowed here: the step attends the new token alone (context 1,
no cached row is read) and every full page is released; note that the float reference of spec 5.2
(``float_windowed``) treats W = 1 as *no* truncation, so it is not a reference for W = 1.
"""
from __future__ import annotations

__all__ = ["WindowError", "check_window", "context_size", "gather_bounds", "trim_point",
           "expected_pages", "pages_after_step", "pages_during_step", "pages_needed", "first_step_over",
           "window_bound", "contexts", "check_sinks", "sink_ranges", "sink_context"]


class WindowError(ValueError):
    """A window, page size or step number outside its domain (the message names the value)."""


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_window(W):
    """Return ``W`` if it is None or an integer >= 1, else raise WindowError."""
    if W is not None and (not _int(W) or W < 1):
        raise WindowError(f"window must be >= 1 or None, got {W!r}")
    return W


def _check_step(L) -> None:
    if not _int(L) or L < 1:
        raise WindowError(f"step must be an integer >= 1, got {L!r}")


def _check_page(page) -> None:
    if not _int(page) or page < 1:
        raise WindowError(f"page size must be >= 1, got {page!r}")


def context_size(L: int, W) -> int:
    """Tokens attended at step L (the new one included): L without a window, else min(L, W)."""
    _check_step(L)
    check_window(W)
    return L if W is None else min(L, W)


def gather_bounds(L: int, W) -> tuple[int, int]:
    """``(lo, hi)``: step L gathers the cached logical rows ``lo <= i < hi``, i.e. lo..L-2."""
    n = context_size(L, W)
    return L - n, L - 1


def trim_point(L: int, W) -> int:
    """``keep_from`` after step L: the first row any later step reads (0 without a window)."""
    _check_step(L)
    check_window(W)
    return 0 if W is None else max(0, L + 1 - W)


def expected_pages(L: int, W, page: int) -> int:
    """Pages in use at the record of step L (before its append): ceil((L-1)/P) - floor(kf/P).

    ``kf`` is the trim point of step L-1, i.e. max(0, L - W), or 0 without a window (spec 5.5).
    """
    _check_step(L)
    _check_page(page)
    check_window(W)
    if L == 1:
        return 0
    kf = 0 if W is None else max(0, L - W)
    return -(-(L - 1) // page) - kf // page


def pages_after_step(L: int, W, page: int) -> int:
    """Pages in use once step L has appended its row and trimmed (the quantity the peak is taken over)."""
    return expected_pages(L + 1, W, page)


def pages_during_step(L: int, W, page: int) -> int:
    """Pages held once step L has appended its row and before it trims: the most step L ever holds.

    The append comes first, so a step that takes a new page and releases an old one needs both at once
    (e.g. W = 2, P = 1 holds 2 pages in every step although 1 is left after each trim).
    """
    _check_step(L)
    _check_page(page)
    check_window(W)
    kf = 0 if W is None else max(0, L - W)          # the trim point of step L-1
    return -(-L // page) - kf // page


def _last_step_to_scan(n: int, W, page: int) -> int:
    # With a window, pages_during_step(L) = ceil(L/P) - floor((L-W)/P) for L >= W, which repeats with
    # period P: steps 1 .. W+P-1 already show every value an n-step decode can reach.
    return n if W is None else min(n, W + page - 1)


def pages_needed(n: int, W, page: int) -> int:
    """The pool an n-step decode needs: the largest ``pages_during_step`` over steps 1..n.

    Computed without decoding, in at most W+P-1 evaluations, so a too-small pool can be refused at once.
    """
    _check_step(n)
    _check_page(page)
    check_window(W)
    if W is None:
        return -(-n // page)                       # nothing is released: the last step holds the most
    return max(pages_during_step(L, W, page) for L in range(1, _last_step_to_scan(n, W, page) + 1))


def first_step_over(n: int, W, page: int, pool: int):
    """The first step of an n-step decode whose append finds all ``pool`` pages in use, or None."""
    _check_step(n)
    _check_page(page)
    check_window(W)
    if not _int(pool) or pool < 0:
        raise WindowError(f"pool must be an integer >= 0, got {pool!r}")
    if W is None:
        L = pool * page + 1                        # the first row that does not fit in `pool` pages
        return L if L <= n else None
    return next((L for L in range(1, _last_step_to_scan(n, W, page) + 1)
                 if pages_during_step(L, W, page) > pool), None)


def window_bound(W: int, page: int) -> int:
    """The footprint bound of a windowed request, ceil((W-1)/P) + 1 pages (spec 5.5)."""
    _check_page(page)
    if check_window(W) is None:
        raise WindowError("the window bound needs a window, got None")
    return -(-(W - 1) // page) + 1


def contexts(n: int, W) -> list[int]:
    """The distinct context sizes (= programs compiled) of an n-step decode, ascending."""
    _check_step(n)
    return sorted({context_size(L, W) for L in range(1, n + 1)})


# ---- attention sinks (the StreamingLLM idea, the chapter's exercise 3) ---------------------------------
# With S sinks a step attends the first S rows of the request as well as its window: rows 0..S-1 stay
# cached for ever and the rows between them and the window are released. S = 0 is the plain window.

def check_sinks(S, W=None):
    """Return ``S`` if it is an integer >= 0 (0 without a window: there is nothing to keep apart)."""
    if not _int(S) or S < 0:
        raise WindowError(f"sinks must be an integer >= 0, got {S!r}")
    check_window(W)
    if W is None and S:
        raise WindowError(f"sinks ({S}) need a window: without one every row is attended already")
    return S


def sink_ranges(L: int, W, S: int = 0) -> list[tuple[int, int]]:
    """The cached logical rows step L gathers, as ``[(lo, hi), ...]`` in row order, with S sinks.

    The window's part is `gather_bounds`; the sinks add rows ``0 .. min(S, lo)-1`` before it.
    """
    check_sinks(S, W)
    lo, hi = gather_bounds(L, W)
    head = min(S, lo)
    return [r for r in ((0, head), (lo, hi)) if r[1] > r[0]]


def sink_context(L: int, W, S: int = 0) -> int:
    """The context of step L with S sinks: the gathered rows and the new one (`context_size` at S = 0)."""
    return 1 + sum(hi - lo for lo, hi in sink_ranges(L, W, S))
