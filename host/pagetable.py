"""The paged KV cache's page table (model spec 5.1): a pool of fixed-size pages shared by requests.

Host-side only: the chip never sees a page. Every operation either completes or raises and leaves the
table exactly as it was (a failed append, an unknown request id, a bad row range change nothing).
"""
from __future__ import annotations

from typing import Any, Hashable

__all__ = ["PageTable", "PageTableError", "OutOfPages", "MAX_POOL_ROWS"]

# The pool is allocated up front, one Python slot per row: 2^20 slots are 8 MB of pointers, far beyond
# what the host needs (the chip attends at most 64 rows; the paging study uses 8,192) yet small enough
# that a typo such as n_pages=10**9 is refused instead of exhausting the machine's memory.
MAX_POOL_ROWS = 1 << 20


class PageTableError(ValueError):
    """A misuse of the page table (unknown or duplicate request id, rows out of range, bad size)."""


class OutOfPages(Exception):
    """The pool has no free page for an append that needs one; the table is unchanged."""


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PageTableError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class PageTable:
    """Block tables of several requests over one pool of pages of ``page`` rows each.

    Parameters
    ----------
    n_pages : int
        Number of physical pages in the pool (>= 1).
    page : int
        Rows per page (>= 1). A row is any Python object (the host stores a (k row, v row) pair).
        The pool may hold at most ``MAX_POOL_ROWS`` (2^20) rows: ``n_pages * page <= MAX_POOL_ROWS``.

    Attributes
    ----------
    n_pages, page : int
        The sizes given (read-only).

    Notes
    -----
    The free list starts in descending order and pages are taken from its end, so page 0 goes first;
    a page whose last reference is dropped goes to the end and is the next one taken. Logical row ``i``
    of a request lives in slot ``i % page`` of block-table entry ``i // page - dropped``, where
    ``dropped`` counts the leading logical pages released by :meth:`trim`.

    Raises
    ------
    PageTableError
        On any misuse; the message names the request id, row or size at fault.
    OutOfPages
        When an append needs a page and none is free.
    """

    def __init__(self, n_pages: int, page: int = 4):
        self._page = _positive_int("page size", page)
        self._n_pages = _positive_int("pool size (pages)", n_pages)
        if n_pages * page > MAX_POOL_ROWS:
            raise PageTableError(f"a pool of {n_pages} pages of {page} rows holds {n_pages * page} rows, "
                                 f"more than the {MAX_POOL_ROWS} allowed (MAX_POOL_ROWS)")
        self._pool: list[list[Any]] = [[None] * page for _ in range(n_pages)]
        self._ref = [0] * n_pages
        self._free = list(range(n_pages - 1, -1, -1))
        self._table: dict[Hashable, list[int]] = {}
        self._length: dict[Hashable, int] = {}
        self._dropped: dict[Hashable, int] = {}
        # pages a prefix cache keeps: one whose last reference is dropped stays out of the free list
        self._retained: set[int] = set()

    # ---- read-only views -------------------------------------------------------------------------
    @property
    def page(self) -> int:
        return self._page

    @property
    def n_pages(self) -> int:
        return self._n_pages

    def requests(self) -> tuple:
        """Live request ids in creation order."""
        return tuple(self._table)

    def table(self, rid) -> tuple[int, ...]:
        """The block table of ``rid`` (physical pages of its live logical pages, in order)."""
        return tuple(self._table[self._known(rid)])

    def length(self, rid) -> int:
        """Rows appended to ``rid`` so far (released rows included)."""
        return self._length[self._known(rid)]

    def dropped(self, rid) -> int:
        """Leading logical pages of ``rid`` released by trim."""
        return self._dropped[self._known(rid)]

    def first_row(self, rid) -> int:
        """The first logical row of ``rid`` still held (``dropped * page``)."""
        return self._dropped[self._known(rid)] * self._page

    def refcount(self, p: int) -> int:
        """Number of block-table entries naming physical page ``p``."""
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < self._n_pages:
            raise PageTableError(f"page {p!r} is not in the pool (0..{self._n_pages - 1})")
        return self._ref[p]

    def free_pages(self) -> tuple[int, ...]:
        """The free list in order; the LAST entry is the next page taken."""
        return tuple(self._free)

    def used(self) -> int:
        """Pages not on the free list (held by a request, or cached)."""
        return self._n_pages - len(self._free)

    def free_count(self) -> int:
        """Pages on the free list (no copy of it is made)."""
        return len(self._free)

    def refcounts(self) -> tuple[int, ...]:
        """The reference count of every page, in page order."""
        return tuple(self._ref)

    def referenced(self) -> int:
        """Pages named by at least one block table."""
        return self._n_pages - self._ref.count(0)

    def is_retained(self, p: int) -> bool:
        """Whether page ``p`` is cached (`retain`)."""
        return p in self._retained

    # ---- operations --------------------------------------------------------------------------------
    def new(self, rid) -> None:
        """Start request ``rid`` with an empty block table."""
        self._hashable(rid)
        if rid in self._table:
            raise PageTableError(f"request {rid!r} already exists")
        self._table[rid] = []
        self._length[rid] = 0
        self._dropped[rid] = 0

    def append(self, rid, row) -> None:
        """Write ``row`` as the next logical row of ``rid``; copy a shared last page first.

        Raises OutOfPages (nothing changed) when a page is needed and the pool is empty.
        """
        t = self._table[self._known(rid)]
        i = self._length[rid]
        off = i % self._page
        if off == 0:
            t.append(self._take(rid, i))
        elif self._ref[t[-1]] > 1 or t[-1] in self._retained:
            # The page is shared (a fork, or a prefix cache's copy): writing into it would change the
            # other owners' rows.
            shared = t[-1]
            q = self._take(rid, i)           # may raise: nothing has been modified yet
            self._pool[q][:] = self._pool[shared]
            self._drop(shared)
            t[-1] = q
        self._pool[t[-1]][off] = row
        self._length[rid] = i + 1

    def rows(self, rid, lo: int, hi: int) -> list:
        """The rows of ``rid`` with logical index ``lo <= i < hi``, read through the block table."""
        self._known(rid)
        first, n = self._dropped[rid] * self._page, self._length[rid]
        for name, v in (("lo", lo), ("hi", hi)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise PageTableError(f"{name} must be an integer, got {v!r}")
        if lo < 0:
            raise PageTableError(f"request {rid!r}: lo must be >= 0, got {lo}")
        if lo < first:
            raise PageTableError(f"request {rid!r}: row {lo} already released (rows {first}..{n - 1} are held)")
        if hi > n:
            raise PageTableError(f"request {rid!r}: row {hi - 1} not written yet (length {n})")
        if lo > hi:
            raise PageTableError(f"request {rid!r}: row range lo={lo} > hi={hi}")
        t, d, P = self._table[rid], self._dropped[rid], self._page
        if any(t[j // P - d] is None for j in range(lo, hi, 1)):
            raise PageTableError(f"request {rid!r}: rows {lo}..{hi - 1} include a released page")
        return [self._pool[t[i // P - d]][i % P] for i in range(lo, hi)]

    def trim(self, rid, keep_from: int) -> None:
        """Release the leading pages of ``rid`` that lie entirely before logical row ``keep_from``.

        A page still holding row ``keep_from`` or later stays. ``keep_from`` may be at most the length.
        """
        self._known(rid)
        n = self._length[rid]
        if isinstance(keep_from, bool) or not isinstance(keep_from, int) or not 0 <= keep_from <= n:
            raise PageTableError(f"request {rid!r}: keep_from must be in 0..{n} (its length), got {keep_from!r}")
        t = self._table[rid]
        while t and (self._dropped[rid] + 1) * self._page <= keep_from:
            self._drop(t.pop(0))
            self._dropped[rid] += 1

    def fork(self, src, dst) -> None:
        """Make ``dst`` share every page of ``src`` (no copy; each page gains a reference)."""
        self._known(src)
        self._hashable(dst)
        if dst in self._table:
            raise PageTableError(f"request {dst!r} already exists (fork from {src!r})")
        self._table[dst] = list(self._table[src])
        self._length[dst] = self._length[src]
        self._dropped[dst] = self._dropped[src]
        for p in self._table[dst]:
            if p is not None:
                self._ref[p] += 1

    def release(self, rid) -> None:
        """Forget ``rid`` and drop its reference to each of its pages."""
        self._known(rid)
        for p in self._table.pop(rid):
            if p is not None:
                self._drop(p)
        del self._length[rid], self._dropped[rid]

    # ---- prefix caching and attention sinks (host.engine) ---------------------------------------------
    def retain(self, p: int) -> None:
        """Keep page ``p`` (held by a request) out of the free list when its last reference goes: cached."""
        if self.refcount(p) < 1:
            raise PageTableError(f"page {p} is not held by any request: only a live page can be cached")
        self._retained.add(p)

    def evict(self, p: int) -> None:
        """Stop keeping page ``p``; it returns to the free list now if no request references it."""
        self.refcount(p)
        if p not in self._retained:
            raise PageTableError(f"page {p} is not cached")
        self._retained.discard(p)
        if not self._ref[p]:
            self._free += [p]

    def retained(self) -> frozenset:
        """The cached pages (referenced or not)."""
        return frozenset(self._retained)

    def adopt(self, rid, pages, length: int) -> None:
        """Start request ``rid`` on the existing pages ``pages`` holding its first ``length`` rows.

        Each page gains a reference (no copy); a partial last page is copied on the request's first write
        into it (`append`). ``length`` must fall in the last page: ``(len(pages)-1)*page < length <=
        len(pages)*page``.
        """
        self._hashable(rid)
        if rid in self._table:
            raise PageTableError(f"request {rid!r} already exists")
        pages = list(pages)
        for q in pages:
            if self.refcount(q) < 1 and q not in self._retained:
                raise PageTableError(f"page {q} is free: only a held or cached page can be adopted")
        if len(set(pages)) != len(pages) or not pages or not (len(pages) - 1) * self._page < length <= len(pages) * self._page:
            raise PageTableError(f"request {rid!r}: {length} rows do not end in the last of {len(pages)} "
                                 f"distinct pages of {self._page} rows")
        for q in pages:
            self._ref[q] += 1
        self._table[rid] = pages
        self._length[rid] = length
        self._dropped[rid] = 0

    def punch(self, rid, lo: int, hi: int) -> None:
        """Release the pages of ``rid`` lying entirely inside logical rows ``lo <= i < hi`` (``hi`` at most
        the length). With ``lo`` at the first row held this is `trim`; otherwise the released pages leave
        holes in the block table (``None``), which `rows` refuses to read: attention sinks keep the first
        rows and the window's, and release those between.
        """
        self._known(rid)
        n = self._length[rid]
        if not (isinstance(lo, int) and isinstance(hi, int)) or not 0 <= lo <= hi <= n:
            raise PageTableError(f"request {rid!r}: rows {lo!r}..{hi!r} are not within 0..{n}")
        if lo <= self.first_row(rid):
            self.trim(rid, hi)
            return
        t, d, P = self._table[rid], self._dropped[rid], self._page
        for j in range(-(-lo // P), hi // P):
            q = t[j - d]
            if q is not None:
                t[j - d] = None
                self._drop(q)

    def held(self, rid) -> int:
        """Pages ``rid`` references now (holes excluded)."""
        return sum(1 for q in self._table[self._known(rid)] if q is not None)

    # ---- internals ----------------------------------------------------------------------------------
    def _take(self, rid, row: int) -> int:
        if not self._free:
            raise OutOfPages(f"no free page for row {row} of request {rid!r}: all {self._n_pages} pages "
                             f"of {self._page} rows are in use")
        p = self._free.pop()
        self._ref[p] = 1
        return p

    def _drop(self, p: int) -> None:
        self._ref[p] -= 1
        if self._ref[p] == 0 and p not in self._retained:
            self._free.append(p)

    def _known(self, rid):
        self._hashable(rid)
        if rid not in self._table:
            raise PageTableError(f"unknown request {rid!r}")
        return rid

    @staticmethod
    def _hashable(rid) -> None:
        try:
            hash(rid)
        except TypeError:
            raise PageTableError(f"request id must be hashable, got {rid!r}") from None

    def __repr__(self) -> str:
        return (f"PageTable(n_pages={self._n_pages}, page={self._page}, used={self.used()}, "
                f"requests={list(self._table)})")
