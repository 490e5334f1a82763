"""A tiny serving engine: continuous batching of many requests on the chip over one page pool (issue 14).

Each engine step forms one batch of at most ``max_batch`` rows, one row per running request (decode rows
first, then prompt rows: chunked prefill one token per request and step), and runs it as one batched
program (`host.batch`). The KV cache of every request lives in one `host.pagetable.PageTable`:

- Admission: a waiting request is admitted (first come, first served; at most ``max_batch`` running) when
  the pool, counting cached pages nobody references as free, keeps ``watermark`` pages spare after its
  first row. A request that could not fit even alone (its pages, or a context beyond the chip's limit) is
  refused when it arrives with one error message; the others are not affected.
- Preemption by recompute: when a step's appends need more pages than the pool can give, the most recently
  admitted running request loses its pages and returns to the queue; when readmitted it recomputes its
  rows (prompt and generated tokens) as prompt rows, and every recomputed token and logit is checked
  against the one it gave before.
- Prefix caching: a full page is named by a hash chain (the parent page's hash, the page's tokens, the
  window and the sinks). A full page is cached (`PageTable.retain`) when a request fills it; an admitted
  request adopts the longest chain of cached pages its tokens begin with, and a cached page sharing only
  the first rows of its next page as a partial tail (copied on the first write into it); those rows are
  never computed. Cached pages nobody references are evicted as in vLLM's free-block queue: a page is
  stamped when its last reference goes (a request's last page first, so a hit refreshes its pages), and
  the least recently used page with no cached child goes first (a chain loses its tail before its head);
  a page is cached only under a cached parent, and evicting one forgets the pages cached after it.
- Batches the chip can take: each step runs the longest head of its rows whose program fits the chip (and,
  in resident mode, whose block tables fit the mailbox); the others wait. A request whose single row could
  never fit is refused on arrival. An idle engine goes straight to the next arrival.
- A token budget (``max_batched_tokens``, issue 21): up to that many rows a step, in programs of at most
  ``max_batch`` rows, as many requests running as the pool admits; prefill first, and the full rows (last
  prompt rows, decode rows) in whole programs, since a program with a full row costs about five times one
  of cache-only rows alone (`_candidates`).
- Attention sinks: ``sinks = S`` keeps rows 0..S-1 of every request besides the window (`host.window.
  sink_ranges`); the pages between are released (`PageTable.punch`).
- Prefill (``prefill = "cache"``, the default): a prompt row before the prompt's last token runs as a
  *cache-only* row (`host.batch.build_batch_graph`, context 0): the model has one layer, so only its k and
  v are live; they are those of a full row to the bit. ``prefill = "full"`` runs every prompt row through
  the whole model and discards the logits (the issue's row model, kept as a baseline).
- ``alloc = "contiguous"``: the baseline that reserves, per admitted request, the pages of the longest
  request the trace may hold (``contig_rows``), as Example B does on paper; no prefix cache.

Online use (issue 22, a server): `Engine.start`, then `Engine.submit` a request whenever it arrives (it is
refused at once or waits) and `Engine.step` one step at a time; each step reports the tokens it produced
(`TokenEvent`: request, sample, token, the chip clock) and the samples that ended (`FinishEvent`: stop,
length, abort). `Engine.abort` cancels one before the next step. `Engine.run` is this loop over a trace
whose requests arrive at given steps.

`check_invariants` is run after every step (every page free, cached or owned; reference counts equal the
block-table references; every cached page reachable; no request holds more pages than its kept rows and
the page its next row goes into need), at the cost of the pages in use. `decode_alone` decodes one
request with a plain list as cache and single-row programs: what every served request must equal.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

from compiler import CompileError
from hdl.config import BOOK, ChipConfig
from host.batch import BatchRunner
from host.pagetable import PageTable
from host.sampling import check_sampling, logit_scale, sample_token
from host.tiny_lm import V
from host.window import check_sinks, check_window, sink_context, sink_ranges, trim_point

__all__ = ["Request", "TokenEvent", "FinishEvent", "StepReport", "Engine", "EngineError", "decode_alone", "check_invariants", "pages_alone",
           "kept_pages", "table_alone", "PREFILLS", "POLICIES"]

# how prompt rows before the prompt's last token run: only their cache row, or the whole model
PREFILLS = ("cache", "full")
# the order of admission and preemption: arrival, or priority (higher first) then arrival
POLICIES = ("fcfs", "priority")


class EngineError(ValueError):
    """A bad engine argument, or a broken promise found by the engine's own checks."""


@dataclass
class Request:
    """One request: ``prompt`` tokens (at least one), ``gen`` tokens to generate at most (>= 1), the engine
    step it arrives at; ``stop``: tokens that end its generation (the first one generated is its last token);
    ``abort``: the engine step at which it is cancelled (None: never; `Engine.abort` cancels one at any
    step too); ``priority``: with the engine's policy "priority", a higher one is admitted first and
    preempts a lower one. ``temperature``, ``top_k``, ``seed``: each generated token is drawn on the host
    from the row's integer logits (`host.sampling`; temperature 0: the chip's argmax); ``n``: samples of
    the prompt, sample j seeded apart, all sharing the prompt's pages (forked after its last prompt row,
    copy-on-write)."""
    id: int
    prompt: list
    gen: int
    arrival: int = 0
    stop: tuple = ()
    abort: int | None = None
    priority: int = 0
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0
    n: int = 1


@dataclass(frozen=True)
class TokenEvent:
    """A token an engine step produced: generated token ``index`` (0: the first) of sample ``sample`` of
    request ``id``, and the engine clock (chip cycles) at the end of the program that computed it."""
    id: int
    sample: int
    index: int
    token: int
    cycles: int


@dataclass(frozen=True)
class FinishEvent:
    """A sample that ended: ``reason`` is "stop" (its last token is a stop token), "length", "abort" or
    "refused"; ``result`` is its result as `Engine.run` gives it (tokens, integer logits, times in cycles
    from its arrival, or the refusal's one-line reason)."""
    id: int
    sample: int
    reason: str
    result: dict


@dataclass
class StepReport:
    """What one `Engine.step` did: its number, whether a batch ran, the chip cycles it took, the tokens it
    produced (in the order their rows ran) and the samples that ended."""
    step: int
    ran: bool
    tokens: list
    finished: list
    cycles: int


@dataclass
class _State:
    req: Request
    tokens: list                       # prompt + generated so far
    logits: list = field(default_factory=list)   # per generated token
    pos: int = 0                       # rows in the cache (the next row's position)
    order: int = -1                    # admission counter (higher: admitted later)
    hashes: list = field(default_factory=list)   # hash of each full page, logical page order
    arrival_cycles: int = 0
    first_cycles: int | None = None
    finish_cycles: int | None = None
    preempted: int = 0
    hit_rows: int = 0
    computed_rows: int = 0
    prompt_rows: int = 0                # rows computed at prompt positions (recomputations included)
    refused: str | None = None
    aborted: int | None = None          # the engine step it was cancelled at
    sample: int = 0                     # which of the request's n samples
    pending: list = field(default_factory=list)  # sample 0: the other samples, forked after its prompt
    ran: int = -1                       # the last step a full row of it was chosen for (a token budget)

    @property
    def rid(self):
        """Its block table's name: the request id (sample 0) or (request id, sample)."""
        return self.req.id if self.sample == 0 else (self.req.id, self.sample)

    @property
    def done(self) -> bool:
        g = len(self.tokens) - len(self.req.prompt)
        return g >= self.req.gen or (g > 0 and self.tokens[-1] in self.req.stop)


def _kept_rows(n: int, W, S: int) -> list:
    """Rows a request with n cached rows keeps for its next step (sinks and window)."""
    if n == 0:
        return []
    tp = trim_point(n, W)
    if tp <= S:
        return [(0, n)]
    return [r for r in ((0, S), (tp, n)) if r[1] > r[0]]


def kept_pages(n: int, W, S: int, page: int) -> int:
    """Pages a request with n cached rows may hold between steps: those covering the rows it keeps (sinks and
    window) and the partly filled page its next row n goes into (with a window of 1 no row is kept, but
    that page is)."""
    pages = set()
    for lo, hi in _kept_rows(n, W, S):
        pages.update(range(lo // page, (hi - 1) // page + 1))
    if n % page:
        pages.add(n // page)
    return len(pages)


def pages_alone(rows: int, W, S: int, page: int) -> int:
    """The most pages a request of `rows` rows holds alone: after a step's append, before its release."""
    need = 0
    for L in range(1, rows + 1):
        held = set()
        for lo, hi in _kept_rows(L - 1, W, S) + [(L - 1, L)]:
            held.update(range(lo // page, (hi - 1) // page + 1))
        need = max(need, len(held))
    return need


def table_alone(rows: int, W, S: int, page: int) -> int:
    """The longest block table (pages from the first one held to the last, holes included) a request of
    `rows` rows has alone: what resident mode writes into the chip's mailbox for its row."""
    longest = 0
    for L in range(1, rows + 1):
        # step L writes row L-1; without sinks the pages before the previous step's trim point are gone
        first = 0 if S or L == 1 else trim_point(L - 1, W) // page
        longest = max(longest, (L - 1) // page + 1 - first)
    return longest


def _hash(parent: str, toks, W, S) -> str:
    return hashlib.sha256(f"{parent}|{','.join(map(str, toks))}|W={W}|S={S}".encode()).hexdigest()[:16]


def _check_request(r) -> None:
    if not isinstance(r, Request):
        raise EngineError(f"a request must be a host.engine.Request, got {type(r).__name__}")
    if not r.prompt or any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < V for t in r.prompt):
        raise EngineError(f"request {r.id}: the prompt must be a non-empty list of tokens 0..{V - 1}")
    if not isinstance(r.gen, int) or r.gen < 1:
        raise EngineError(f"request {r.id}: tokens to generate must be >= 1, got {r.gen!r}")
    if not isinstance(r.arrival, int) or r.arrival < 0:
        raise EngineError(f"request {r.id}: the arrival step must be >= 0, got {r.arrival!r}")
    if not isinstance(r.stop, (tuple, list)) or any(not isinstance(t, int) or isinstance(t, bool)
                                                    or not 0 <= t < V for t in r.stop):
        raise EngineError(f"request {r.id}: stop tokens must be tokens 0..{V - 1}, got {r.stop!r}")
    if r.abort is not None and (not isinstance(r.abort, int) or isinstance(r.abort, bool) or r.abort < 0):
        raise EngineError(f"request {r.id}: the abort step must be >= 0 or None, got {r.abort!r}")
    if not isinstance(r.priority, int) or isinstance(r.priority, bool):
        raise EngineError(f"request {r.id}: the priority must be an integer, got {r.priority!r}")
    why = check_sampling(r.temperature, r.top_k, r.seed, r.n)
    if why:
        raise EngineError(f"request {r.id}: {why}")


class Engine:
    """Continuous batching over one page pool (see the module's docstring).

    Parameters
    ----------
    m : dict
        The tiny LM.
    backend : object
        ``run(code, image, lat)``.
    max_batch : int
        Rows per chip program at most (and, without ``max_batched_tokens``, running requests and rows per
        step: one program a step).
    max_batched_tokens : int or None
        Rows per step at most, a token budget: prefill first, a request's cache-only prompt rows several in
        one step, full rows (last prompt rows, decode rows) in whole programs (`_candidates`); the requests
        the pool admits run; a step runs as many programs of at most ``max_batch`` rows as its rows need
        (None: one row per running request, ``max_batch`` running, one program a step).
    window : int or None
    sinks : int
    page, n_pages : int
        Pool geometry.
    prefix_cache : bool
    alloc : {"paged", "contiguous"}
    contig_rows : int or None
        Rows each request reserves with ``alloc="contiguous"`` (default: the longest request given to `run`).
    watermark : int
        Pages kept spare at admission.
    lat : int
    config : hdl.config.ChipConfig
    check : bool
        Run `check_invariants` after every step.
    mode : {"book", "resident"}
    prefill : {"cache", "full"}
        See the module's docstring.
    """

    def __init__(self, m, backend, max_batch=4, window=None, sinks=0, page=4, n_pages=64, prefix_cache=True,
                 alloc="paged", contig_rows=None, watermark=1, lat=8, config: ChipConfig = BOOK, check=True,
                 mode="book", prefill="cache", max_batched_tokens=None, policy="fcfs"):
        try:
            check_window(window)
            check_sinks(sinks, window)
        except ValueError as e:
            raise EngineError(str(e)) from None
        for name, v in (("max_batch", max_batch), ("page", page), ("n_pages", n_pages)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise EngineError(f"{name} must be an integer >= 1, got {v!r}")
        if alloc not in ("paged", "contiguous"):
            raise EngineError(f"alloc must be 'paged' or 'contiguous', got {alloc!r}")
        if mode not in ("book", "resident"):
            raise EngineError(f"mode must be 'book' or 'resident', got {mode!r}")
        if prefill not in PREFILLS:
            raise EngineError(f"prefill must be one of {', '.join(PREFILLS)}, got {prefill!r}")
        if mode == "resident" and alloc != "paged":
            raise EngineError("resident mode keeps the cache in the chip's page pools: alloc must be 'paged'")
        if not isinstance(watermark, int) or watermark < 0:
            raise EngineError(f"watermark must be an integer >= 0, got {watermark!r}")
        if max_batched_tokens is not None and (not isinstance(max_batched_tokens, int) or
                                               isinstance(max_batched_tokens, bool) or max_batched_tokens < 1):
            raise EngineError(f"max_batched_tokens must be an integer >= 1 or None, got {max_batched_tokens!r}")
        self.max_batched_tokens = max_batched_tokens
        if policy not in POLICIES:
            raise EngineError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        # requests running at once: with a token budget as many as the pool admits (the watermark and
        # preemption bound them), as vLLM's max_num_seqs is far above its batches
        self.max_running = max_batch if max_batched_tokens is None else n_pages
        self.m, self.max_batch, self.W, self.S = m, max_batch, window, sinks
        self.page, self.n_pages, self.alloc = page, n_pages, alloc
        self.prefix_cache = bool(prefix_cache) and alloc == "paged"
        self.contig_rows, self.watermark, self.config, self.check = contig_rows, watermark, config, check
        self.mode, self.prefill = mode, prefill
        if mode == "resident":
            from host.batch_resident import ResidentBatchRunner
            if not config.gather:
                raise EngineError(f"resident mode needs a chip with GATHER/SCATTER (gather=1); chip "
                                  f"{config.spec()} has none (try --chip fast)")
            try:
                self.runner = ResidentBatchRunner(m, backend, lat, config, page, n_pages, max_batch)
            except CompileError as exc:
                raise EngineError(f"resident mode: {exc}") from None
        else:
            self.runner = BatchRunner(m, backend, lat, config)
        self.pt = PageTable(n_pages, page)
        self.cache: dict = {}          # hash -> (page, parent hash, tokens)
        self.children: dict = {}       # parent hash -> set of hashes
        self.page_hash: dict = {}      # cached page -> hash
        self.lru: dict = {}            # cached page -> recency stamp, given when its last reference goes
        self.tick = 0                  # the stamps' counter: never reset (the cache outlives `run`)
        self.cancel: set = set()       # ids of requests to cancel before the next step (`abort`)
        self.scale = None              # the integer logits' scale (sampling)
        self._emitted: list = []       # the tokens of the step being run (`step`)
        self.start()

    # ---- pool --------------------------------------------------------------------------------------
    @property
    def root(self) -> str:
        """The parent hash of a request's first page: the window and the sinks name the whole chain."""
        return _hash("", (), self.W, self.S)

    def evictable(self) -> list:
        """Cached pages no request references, in the order they are evicted: first the least recently
        used page with no cached child (a chain loses its tail before its head, so every cached page stays
        reachable by `_match`), then the other ones least recently used first."""
        free = sorted((p for p in self.page_hash if self.pt.refcount(p) == 0), key=lambda p: (self.lru[p], p))
        leaves = [p for p in free if not self.children.get(self.page_hash[p])]
        return leaves + [p for p in free if self.children.get(self.page_hash[p])]

    def n_evictable(self) -> int:
        return sum(1 for p in self.page_hash if self.pt.refcount(p) == 0)

    def available(self) -> int:
        """Pages an append may take: the free ones and the cached ones nobody references."""
        return self.pt.free_count() + self.n_evictable()

    def owned(self) -> int:
        """Pages referenced by at least one request."""
        return self.pt.referenced()

    def _evict(self, p) -> None:
        """Forget cached page `p` and every page cached after it in its chain (they could no longer be
        matched); a forgotten page a request still holds is freed when it lets go."""
        h = self.page_hash.pop(p)
        _, parent, _ = self.cache.pop(h)
        self.children.get(parent, set()).discard(h)
        if not self.children.get(parent, True):
            del self.children[parent]
        self.lru.pop(p, None)
        self.pt.evict(p)
        for c in sorted(self.children.pop(h, ())):
            self._evict(self.cache[c][0])

    def clear_cache(self) -> None:
        """Evict every cached page."""
        while self.page_hash:
            self._evict(min(self.page_hash))

    def _make_free(self, n: int) -> None:
        while self.pt.free_count() < n:
            order = self.evictable()
            if not order:
                break
            self._evict(order[0])

    def _letting_go(self, s: _State, op, *args) -> None:
        """Run the page-table operation `op` of request `s` (release, punch, append); stamp the cached pages
        it leaves without any reference, its last page first (vLLM's free-block queue: a request's tail is
        older than its head). A page a later request adopts (a prefix hit) is stamped again when that one
        lets go: every hit refreshes its pages."""
        rid = s.rid
        before = self.pt.table(rid)
        op(rid, *args)
        after = set(self.pt.table(rid)) if rid in self.pt.requests() else set()
        for p in reversed(before):
            if p is not None and p not in after and p in self.page_hash and self.pt.refcount(p) == 0:
                self.tick += 1
                self.lru[p] = self.tick

    def _release_behind(self, s: _State) -> None:
        if s.pos == 0:
            return
        tp = trim_point(s.pos, self.W)
        if tp > self.S:
            self._letting_go(s, self.pt.punch, min(self.S, tp), tp)

    # ---- prefix cache ------------------------------------------------------------------------------
    def _match(self, toks) -> tuple:
        """The cached pages `toks` begins with (leaving its last token to compute) and the rows they hold."""
        P, limit = self.page, len(toks) - 1
        parent = self.root
        pages, n = [], 0
        while n + P <= limit:
            h = _hash(parent, toks[n:n + P], self.W, self.S)
            if h not in self.cache:
                break
            pages.append(self.cache[h][0])
            parent, n = h, n + P
        best, best_t = None, 0
        for h in sorted(self.children.get(parent, ())):
            page, _, ptoks = self.cache[h]
            t = 0
            while t < P and n + t < limit and ptoks[t] == toks[n + t]:
                t += 1
            if t > best_t:
                best, best_t = page, t
        if best is not None:
            pages.append(best)
            n += best_t
        return pages, n

    def _cache_page(self, s: _State, j: int) -> None:
        parent = s.hashes[j - 1] if j else self.root
        toks = tuple(s.tokens[j * self.page:(j + 1) * self.page])
        h = _hash(parent, toks, self.W, self.S)
        s.hashes.append(h)
        # a page is cached only under a cached parent (its chain's head may have been evicted meanwhile)
        if not self.prefix_cache or h in self.cache or (j and parent not in self.cache):
            return
        p = self.pt.table(s.rid)[j - self.pt.dropped(s.rid)]
        if p is None or p in self.page_hash:
            return
        self.pt.retain(p)
        self.cache[h] = (p, parent, toks)
        self.children.setdefault(parent, set()).add(h)
        self.page_hash[p] = h

    # ---- the loop ----------------------------------------------------------------------------------
    def _refusal(self, s: _State):
        rows = len(s.req.prompt) + s.req.gen - 1
        limit = self.config.mm_max_k
        ctx = max(sink_context(L, self.W, self.S) for L in range(1, rows + 1))
        if ctx > limit:
            return (f"request {s.req.id} needs a context of {ctx} tokens ({rows} rows, window "
                    f"{self.W}, sinks {self.S}) and the chip attends at most {limit}")
        need = pages_alone(rows, self.W, self.S, self.page)
        if self.alloc == "contiguous":
            need = max(need, -(-self.contig_rows // self.page))
        if need > self.n_pages:
            return (f"request {s.req.id} can never fit: {rows} rows need {need} pages of {self.page} rows "
                    f"alone and the pool has {self.n_pages}")
        if s.req.n > self.max_running:
            return (f"request {s.req.id} asks for {s.req.n} samples and at most {self.max_running} requests run "
                    f"at once")
        if self.mode == "resident":
            cap, n = self.runner.layout.table_cap, table_alone(rows, self.W, self.S, self.page)
            if n > cap:
                return (f"request {s.req.id} can never fit: its block table reaches {n} pages and the chip's "
                        f"mailbox holds {cap}")
        else:
            try:
                self.runner.check((ctx,))
            except CompileError as exc:
                return f"request {s.req.id} can never fit: one row at context {ctx} does not fit the chip ({exc})"
        return None

    def _admit(self, s: _State) -> bool:
        if self.alloc == "contiguous":
            R = -(-self.contig_rows // self.page)
            if (len(self.running) + 1) * R > self.n_pages:
                return False
            self.pt.new(s.rid)
            s.pos = 0
        else:
            pages, n = self._match(s.tokens) if self.prefix_cache else ([], 0)
            self.queried_rows += (len(s.tokens) - 1) if self.prefix_cache else 0
            # its first row takes a page: a new one, or the copy of an adopted partial page; into an empty
            # engine a request that fits alone (see _refusal) is admitted without the watermark and, if the
            # cached pages it would adopt leave too little, without them
            spare = self.watermark if self.running else 0
            if self.available() - sum(1 for p in pages if self.pt.refcount(p) == 0) < 1 + spare:
                if self.running:
                    return False
                pages, n = [], 0
            if pages:
                # the adopted pages leave the evictable ones; they are stamped again when this request lets go
                self.pt.adopt(s.rid, pages, n)
                s.hashes = [self.page_hash[p] for p in pages[:n // self.page]]
                s.hit_rows += n
                self.hit_rows += n
            else:
                self.pt.new(s.rid)
            s.pos = n
            self._release_behind(s)
        self.counter += 1
        s.order = self.counter
        self.running.append(s)
        return True

    def abort(self, rid) -> None:
        """Cancel request `rid` before the next engine step (at its arrival if it has not arrived): its
        pages return at once; its tokens so far are its result."""
        self.cancel.add(rid)

    def _abort(self, s: _State) -> None:
        if s in self.running:
            self.running.remove(s)
            self._letting_go(s, self.pt.release)
        else:
            self.waiting.remove(s)
        for t in [s] + s.pending:           # samples not forked yet go with their first
            t.aborted, t.finish_cycles = self.step_no, self.clock
            self.done.append(t)
        s.pending = []

    def _preempt(self, s: _State) -> None:
        self.running.remove(s)
        self._letting_go(s, self.pt.release)
        s.pos, s.hashes, s.order = 0, [], -1
        s.preempted += 1
        self.preemptions += 1
        self.waiting.append(s)
        self.waiting.sort(key=self._queue_key)

    def _queue_key(self, s: _State):
        """The waiting queue's order: first come, first served, or by priority (higher first) then so."""
        return (-s.req.priority if self.policy == "priority" else 0, s.req.arrival, s.req.id)

    def _lowest(self, states) -> _State:
        """The request to preempt among `states`: the lowest priority (policy "priority"), then the most
        recently admitted."""
        return max(states, key=lambda s: (-s.req.priority if self.policy == "priority" else 0, s.order))

    # ---- the online API: submit requests, step, read what each step produced ----------------------------
    def start(self, retain: bool = True) -> None:
        """Begin a new serving run: no request waiting or running, the clock, the step counter and the
        counters at 0 (the prefix cache and its recency order carry over). With ``retain=False`` (a server
        that runs for ever) the finished requests and the per-step trace are not kept once reported."""
        self.waiting, self.running, self.done = [], [], []
        self.counter = self.preemptions = self.hit_rows = self.queried_rows = 0
        self.clock, self.step_no, self.trace = 0, 0, []
        self.retain = retain

    @property
    def busy(self) -> bool:
        """Whether a request is waiting or running (`step` has work)."""
        return bool(self.waiting or self.running)

    def submit(self, r: Request) -> list:
        """Request `r` arrives now, at step ``step_no`` (its ``arrival`` is set to it, on a copy when it
        differs), with the engine clock as its arrival time. It waits for admission at the next `step`, or
        is refused at once when it could never fit (its context beyond the chip's limit, more pages than
        the pool, more samples than may run, a program the chip cannot take).

        Returns
        -------
        list of FinishEvent
            Empty when it waits; else one event per sample with reason "refused" (``result["refused"]``
            is the one-line reason)."""
        _check_request(r)
        if any(t.req.id == r.id for t in self.running + self.waiting):
            raise EngineError(f"request id {r.id} is already being served")
        if r.arrival != self.step_no:
            r = replace(r, arrival=self.step_no)
        if self.alloc == "contiguous" and self.contig_rows is None:
            raise EngineError("alloc='contiguous' needs contig_rows (the rows each request reserves) before submit")
        if r.temperature and self.scale is None:
            self.scale = logit_scale(self.m, self.config)
        s = _State(r, list(r.prompt))
        s.pending = [_State(r, list(r.prompt), sample=j) for j in range(1, r.n)]
        return self._arrive(s)

    def refusal(self, r: Request):
        """Why `submit` would refuse request `r` (its one-line reason), or None; nothing changes here (a router
        asks before it hands a request to a chip). A malformed request raises EngineError, as in `submit`."""
        _check_request(r)
        return self._refusal(_State(r, list(r.prompt)))

    def _arrive(self, s: _State) -> list:
        s.arrival_cycles = self.clock
        s.refused = self._refusal(s)
        if not s.refused:
            self.waiting.append(s)
            return []
        out = []
        for t in [s] + s.pending:
            t.refused = s.refused
            self.done.append(t)
            out.append(FinishEvent(t.req.id, t.sample, "refused", self._result(t)))
        s.pending = []
        if not self.retain:
            self.done.clear()
        return out

    def step(self, after=None) -> StepReport:
        """One engine step: cancel the requests `abort` named (and those whose abort step has come), admit
        waiting requests (by `policy`, within the slots and the pool), and run one batch of the running
        requests' rows (one or more chip programs) if any run; `check_invariants` after it when ``check``.
        ``after()`` is called once the batch ran and was checked, before the step counter advances.

        Returns
        -------
        StepReport
            The step's number, whether a batch ran (nothing runs when no request is admitted: the step
            counter then stays, see `run`), the tokens it produced (request, sample, index, token, chip clock
            at the end of its row's program) and the requests that ended (stop, length, abort)."""
        mark = len(self.done)
        self._emitted = []
        step, clock0 = self.step_no, self.clock
        self.waiting.sort(key=self._queue_key)
        gone = [t for t in self.running + self.waiting if t.req.id in self.cancel
                or (t.req.abort is not None and t.req.abort <= self.step_no)]
        for s in gone:
            self._abort(s)
        self.cancel -= {s.req.id for s in gone}
        while self.waiting:
            slots = len(self.running) + sum(len(t.pending) for t in self.running) + 1 + len(self.waiting[0].pending)
            if slots <= self.max_running and self._admit(self.waiting[0]):
                self.waiting.pop(0)
                continue
            # no slot or no pages: under "priority" the head preempts a running request of lower priority
            lower = [t for t in self.running if t.req.priority < self.waiting[0].req.priority]
            if self.policy != "priority" or not lower:
                break
            self._preempt(self._lowest(lower))
        ran = bool(self.running)
        if ran:
            self._step()
            if self.check:
                check_invariants(self)
            if after is not None:
                after()
            self.step_no += 1
        finished = [FinishEvent(t.req.id, t.sample, self._reason(t), self._result(t)) for t in self.done[mark:]]
        report = StepReport(step, ran, self._emitted, finished, self.clock - clock0)
        self._emitted = []
        if not self.retain:
            self.done.clear()
            self.trace.clear()
        return report

    def run(self, requests, progress=None) -> dict:
        """Serve `requests` (a list of `Request`, each arriving at its ``arrival`` step) to the end: `submit`
        and `step` until none is left, the idle steps skipped (the step counter jumps to the next arrival);
        returns the results (see `sim.serve`). ``progress(done, total)`` is called after each step that ran.
        The prefix cache and its recency order carry over to the next call."""
        reqs = list(requests)
        for r in reqs:
            _check_request(r)
        if len({r.id for r in reqs}) != len(reqs):
            raise EngineError("request ids must be distinct")
        if self.alloc == "contiguous" and self.contig_rows is None:
            self.contig_rows = max((len(r.prompt) + r.gen - 1 for r in reqs), default=1)
        self.start()
        self.cancel = set(self.cancel) & {r.id for r in reqs}
        pending = sorted(reqs, key=lambda r: (r.arrival, r.id))
        total = len(pending)
        results = {}
        tick = None if progress is None else (lambda: progress(len(self.done), total))
        while pending or self.busy:
            while pending and pending[0].arrival <= self.step_no:
                for f in self.submit(pending.pop(0)):
                    results[f.id, f.sample] = f.result
            report = self.step(tick)
            for f in report.finished:
                results[f.id, f.sample] = f.result
            if not report.ran:
                if self.waiting and not pending:
                    raise EngineError(f"request {self.waiting[0].req.id} cannot be admitted into an empty pool")
                # nothing changes until the next arrival: go there at once
                self.step_no = pending[0].arrival if pending else self.step_no + 1
        return self._results(results)

    # ---- one step ----------------------------------------------------------------------------------
    def _cache_only(self, s: _State, p: int | None = None) -> bool:
        # a prompt row before the prompt's last token (row p, default the next one): nobody reads its
        # logits, only its cache row
        return self.prefill == "cache" and (s.pos if p is None else p) < len(s.req.prompt) - 1

    def _candidates(self) -> list:
        """The rows of the next step in order, one entry per row (a request's consecutive rows repeat it).
        Without a token budget: decode rows first, then prompt rows, each by admission, one row per running
        request. With one (``max_batched_tokens``), prefill first and full rows in whole programs (a program
        costs about five times more with a full row in it than with cache-only rows alone, docs/serving.md):
        while cache-only prompt rows remain, the step holds the last prompt rows that are ready (their
        cache-only rows computed; by admission), as many as fill whole programs of ``min(max_batch,
        budget)`` rows, then cache-only rows up to the budget, a request's several at once (its last prompt
        row attends them, so it comes in a later step), and no decode row; once none remain, the full rows
        (last prompt rows, then decode rows, the one that waited longest first) up to the budget in whole
        programs, or all of them when they fill less than one. Rows left out wait a step."""
        decode = [s for s in self.running if s.pos == len(s.tokens) - 1 and s.pos >= len(s.req.prompt)]
        prompt = [s for s in self.running if s not in decode]
        if self.max_batched_tokens is None:
            return (sorted(decode, key=lambda s: s.order) + sorted(prompt, key=lambda s: s.order))[:self.max_batch]
        budget = self.max_batched_tokens
        unit = min(self.max_batch, budget)
        full = sorted((s for s in prompt if not self._cache_only(s)), key=lambda s: s.order)
        cache = sorted((s for s in prompt if self._cache_only(s)), key=lambda s: s.order)
        if not cache:
            full += sorted(decode, key=lambda s: (s.ran, s.order))
        n = min(len(full), budget)
        if cache or n >= unit:
            n -= n % unit
        rows = full[:n]
        for s in rows:
            s.ran = self.step_no
        budget -= n
        for s in cache:
            if budget <= 0:
                break
            k = min(budget, len(s.req.prompt) - 1 - s.pos)
            rows += [s] * k
            budget -= k
        return rows

    @staticmethod
    def _positions(batch) -> list:
        """Each row's position: a request's first row is its next one, the following ones come after it."""
        seen: dict = {}
        out = []
        for s in batch:
            out.append(s.pos + seen.get(id(s), 0))
            seen[id(s)] = seen.get(id(s), 0) + 1
        return out

    def _shape(self, s: _State, p: int):
        """What of row `p` of `s` decides its program: its context (0: cache-only) and, in resident mode,
        the length of its block table once rows up to p are appended, the row ranges it gathers and its
        new row (relative to the first row held)."""
        ctx = 0 if self._cache_only(s, p) else sink_context(p + 1, self.W, self.S)
        if self.mode == "book":
            return ctx
        first = self.pt.first_row(s.rid)
        n = len(self.pt.table(s.rid)) + sum(1 for q in range(s.pos, p + 1) if q % self.page == 0)
        gathered = None if ctx == 0 else [(lo - first, hi - first) for lo, hi in sink_ranges(p + 1, self.W, self.S)]
        return ctx, n, gathered, p - first

    def _fits(self, batch, positions) -> bool:
        shapes = [self._shape(s, p) for s, p in zip(batch, positions)]
        try:
            if self.mode == "book":
                self.runner.check(tuple(sorted(shapes, reverse=True)))
            else:
                # the mailbox holds the block tables of all the program's rows: a budget, not a limit to hit
                if sum(sh[1] for sh in shapes) > self.runner.layout.table_cap:
                    return False
                self.runner.program_for([(0, [0] * n, g, new) for _, n, g, new in shapes])
        except CompileError:
            return False
        return True

    def _plan(self, rows) -> list:
        """The step's programs, each the longest head of the rows left that the chip takes as one program
        (its ROM, scratchpad and external memory; in resident mode also the mailbox's block tables) and at
        most ``max_batch`` rows. Without a token budget a step is one program and the rows after it wait
        for a later step; with one, the rows go into as many programs as they need."""
        positions = self._positions(rows)
        progs, i = [], 0
        while i < len(rows) and (self.max_batched_tokens is not None or not progs):
            for k in range(min(self.max_batch, len(rows) - i), 0, -1):
                if self._fits(rows[i:i + k], positions[i:i + k]):
                    break
            else:
                raise EngineError(f"step {self.step_no}: the row of request {rows[i].req.id} alone does not fit "
                                  f"the chip")
            progs.append(rows[i:i + k])
            i += k
        return progs

    def _need(self, batch) -> int:
        """Pages the batch's appends take: a page for every row that starts one, and the copy of a shared
        partly filled last page."""
        need = 0
        for s, p in zip(batch, self._positions(batch)):
            if self.alloc == "contiguous":
                continue
            if p % self.page == 0:
                need += 1
            elif p == s.pos:
                tail = self.pt.table(s.rid)[-1]
                need += int(self.pt.refcount(tail) > 1 or self.pt.is_retained(tail))
        return need

    def _step(self) -> None:
        while True:
            rows = self._candidates()
            while True:
                progs = self._plan(rows)
                batch = [s for prog in progs for s in prog]
                need = self._need(batch)
                # short of pages: a prompt's later rows wait before any request is preempted
                extra_rows = [i for i, s in enumerate(rows) if sum(t is s for t in rows[:i]) > 0]
                if need <= self.available() or not extra_rows:
                    break
                del rows[extra_rows[-1]]
            if need <= self.available():
                break
            victim = max(self.running, key=lambda s: s.order) if self.policy == "fcfs" else self._lowest(self.running)
            if len(self.running) == 1:
                raise EngineError(f"request {victim.req.id} alone needs more pages than the pool has")
            self._preempt(victim)
        self._make_free(need)
        specs = []
        extra = 0                       # cycles of chip-side page copies (resident mode)
        for s, p in zip(batch, self._positions(batch)):
            if self.mode == "resident":
                # the new row's slot first (a page, or the copy of a shared partly filled one); the step
                # program GATHERs the attended rows and SCATTERs the new one through the block table
                before, off = self.pt.table(s.rid), p % self.page
                self._letting_go(s, self.pt.append, None)
                after = self.pt.table(s.rid)
                if off and before[-1] != after[-1]:
                    extra += self.runner.copy_page(before[-1], after[-1], off)[0]
                first = self.pt.first_row(s.rid)
                specs.append((s.tokens[p], list(after),
                              None if self._cache_only(s, p) else
                              [(lo - first, hi - first) for lo, hi in sink_ranges(p + 1, self.W, self.S)],
                              p - first))
                continue
            if self._cache_only(s, p):
                specs.append((s.tokens[p], None, None))
                continue
            kc, vc = [], []
            for lo, hi in sink_ranges(p + 1, self.W, self.S):
                for k, v in self.pt.rows(s.rid, lo, hi):
                    kc.append(k)
                    vc.append(v)
            specs.append((s.tokens[p], kc, vc))
        self.clock += extra
        cycles, results, ends, i = extra, [], [], 0
        for prog in progs:              # one after the other; each row's result is there when its program ends
            try:
                res, counters, _ = self.runner.run(specs[i:i + len(prog)])
            except CompileError as exc:
                raise EngineError(f"step {self.step_no}: {exc}") from None
            self.clock += counters[0]
            cycles += counters[0]
            results += res
            ends += [self.clock] * len(prog)
            i += len(prog)
        forked = []
        for s, res, end in zip(batch, results, ends):     # a request's rows in order: s.pos is this row's
            if self.mode == "book":
                self._letting_go(s, self.pt.append, (res["k"], res["v"]))
            s.computed_rows += 1
            s.prompt_rows += s.pos < len(s.req.prompt)
            if s.pos >= len(s.req.prompt) - 1:
                g = s.pos - (len(s.req.prompt) - 1)         # index of the generated token this row gives
                tok = self._pick(s, res["logits_int"], g, res["tok"])
                if g < len(s.logits):
                    if s.tokens[s.pos + 1] != tok or s.logits[g] != res["logits_int"]:
                        raise EngineError(f"request {s.rid}: recomputing row {s.pos} gave token {tok} "
                                          f"and logits {res['logits_int']}, not token {s.tokens[s.pos + 1]} and "
                                          f"logits {s.logits[g]}: batch invariance is broken")
                else:
                    s.tokens.append(tok)
                    s.logits.append(res["logits_int"])
                    self._emitted.append(TokenEvent(s.req.id, s.sample, g, tok, end))
                    if s.first_cycles is None:
                        s.first_cycles = end
            s.pos += 1
            if s.pos % self.page == 0:
                self._cache_page(s, s.pos // self.page - 1)
            self._release_behind(s)
            if s.pending and s.pos == len(s.req.prompt):
                forked += self._fork(s, res, end)
        n_running = len(self.running)
        for s in list({id(s): s for s in batch}.values()) + forked:
            if s.done:
                s.finish_cycles = self.clock
                self.running.remove(s)
                self._letting_go(s, self.pt.release)
                self.done.append(s)
        if self.alloc == "contiguous":
            used = len(self.running) * -(-self.contig_rows // self.page)
        else:
            used = self.owned()
        self.trace.append({"step": self.step_no, "rows": len(batch), "cycles": cycles, "pages": used,
                           "cached": len(self.page_hash), "running": n_running, "programs": len(progs)})

    def _pick(self, s: _State, logits, g: int, argmax: int) -> int:
        """Generated token g of `s` from its row's integer logits: the chip's argmax, or a draw."""
        r = s.req
        return sample_token(logits, self.scale, r.temperature, r.top_k, r.seed, s.sample, g, argmax)

    def _fork(self, s: _State, res, end) -> list:
        """Sample 0 of a request has computed its last prompt row: the other samples start from its block
        table (its pages shared, a partly filled one copied at its first write) and the same logits, each
        with its own first token."""
        out = []
        for c in s.pending:
            self.pt.fork(s.rid, c.rid)
            c.pos, c.hashes = s.pos, list(s.hashes)
            c.tokens = list(s.req.prompt) + [self._pick(c, res["logits_int"], 0, res["tok"])]
            c.logits = [res["logits_int"]]
            self._emitted.append(TokenEvent(c.req.id, c.sample, 0, c.tokens[-1], end))
            c.arrival_cycles, c.first_cycles = s.arrival_cycles, end
            self.counter += 1
            c.order = self.counter
            self.running.append(c)
            out.append(c)
        s.pending = []
        return out

    @staticmethod
    def _reason(s: _State) -> str:
        """Why a finished sample ended: refused, abort, stop (its last token is a stop token) or length."""
        if s.refused:
            return "refused"
        if s.aborted is not None:
            return "abort"
        return "stop" if len(s.tokens) > len(s.req.prompt) and s.tokens[-1] in s.req.stop else "length"

    def _result(self, s: _State) -> dict:
        """A finished (or refused) sample's result: its parameters, tokens, integer logits and times."""
        d = {"id": s.req.id, "prompt": list(s.req.prompt), "gen": s.req.gen, "arrival": s.req.arrival}
        if s.req.n > 1:
            d["sample"] = s.sample
        if s.req.temperature:
            d.update(temperature=s.req.temperature, top_k=s.req.top_k, seed=s.req.seed)
        if s.req.stop:
            d["stop"] = list(s.req.stop)
        if s.req.priority:
            d["priority"] = s.req.priority
        if s.refused:
            d["refused"] = s.refused
            return d
        if s.aborted is not None:
            d["aborted"] = s.aborted
        d.update({"tokens": s.tokens[len(s.req.prompt):], "logits_int": s.logits, "finish_reason": self._reason(s),
                  "ttft_cycles": None if s.first_cycles is None else s.first_cycles - s.arrival_cycles,
                  "finish_cycles": s.finish_cycles - s.arrival_cycles,
                  "preempted": s.preempted, "prefix_hit_rows": s.hit_rows,
                  "rows_computed": s.computed_rows, "prompt_rows_computed": s.prompt_rows})
        return d

    def _results(self, results: dict) -> dict:
        """`run`'s result: every request's result (by id, then sample) and the run's figures."""
        return {"requests": [d for _, d in sorted(results.items())], "total_cycles": self.clock, "steps": self.trace,
                "preemptions": self.preemptions, "prefix_hit_rows": self.hit_rows,
                "programs_compiled": len(self.runner.progs),
                "load_cycles": getattr(self.runner, "load_counters", [0])[0]}


def check_invariants(e: Engine) -> None:
    """Raise EngineError unless the pool is consistent: every page free, cached or owned (exactly one of
    free and not free); reference counts equal the block-table references; the cache maps each cached page
    once, every cached page's parent is cached (no page is left that no lookup reaches) and every evictable
    page has its recency stamp; every running request holds no more pages than its kept rows and the
    page its next row goes into need.

    The cost is that of the pages the requests and the cache hold, plus a few whole-pool operations done in
    C (a set of the free list, the reference counts' sum): a pool of 2^20 pages is checked every step."""
    pt = e.pt
    free = pt.free_pages()
    free_set = set(free)
    if len(free_set) != len(free):
        seen = set()
        twice = next(p for p in free if p in seen or seen.add(p))
        raise EngineError(f"the free list holds a page twice: page {twice}")
    refs: dict = {}
    for rid in pt.requests():
        for p in pt.table(rid):
            if p is not None:
                refs[p] = refs.get(p, 0) + 1
    counts = pt.refcounts()
    for p, n in refs.items():
        if counts[p] != n:
            raise EngineError(f"page {p}: reference count {counts[p]}, block tables name it {n} times")
    if sum(counts) != sum(refs.values()):
        p = next(p for p, c in enumerate(counts) if c and p not in refs)
        raise EngineError(f"page {p}: reference count {counts[p]}, block tables name it 0 times")
    retained = pt.retained()
    held = retained | set(refs)
    for p in held:
        if p in free_set:
            raise EngineError(f"page {p} is free and cached or owned")
    if len(free) + len(held) != e.n_pages:
        p = next(p for p in range(e.n_pages) if p not in free_set and p not in held)
        raise EngineError(f"page {p} is neither free nor cached or owned")
    if set(e.page_hash) != set(retained) or len(e.cache) != len(e.page_hash):
        raise EngineError("the prefix cache and the page table disagree on the cached pages")
    root = e.root
    for h, (p, parent, _) in e.cache.items():
        if e.page_hash.get(p) != h or h not in e.children.get(parent, ()):
            raise EngineError(f"cached page {p}: its hash, its parent's children and the cache disagree")
        if parent != root and parent not in e.cache:
            raise EngineError(f"cached page {p}: its parent page is not cached (no lookup can reach it)")
        if p not in refs and p not in e.lru:
            raise EngineError(f"cached page {p} is evictable but has no recency stamp")
    live = {s.rid for s in e.running}
    if set(pt.requests()) != live:
        raise EngineError(f"block tables {sorted(pt.requests(), key=str)} for running requests {sorted(live, key=str)}")
    for s in e.running:
        if s.pos != pt.length(s.rid):
            raise EngineError(f"request {s.rid}: {pt.length(s.rid)} rows cached, position {s.pos}")
        want = kept_pages(s.pos, e.W, e.S, e.page)
        if pt.held(s.rid) > want:
            raise EngineError(f"request {s.rid} holds {pt.held(s.rid)} pages; its {s.pos} rows need {want}")


def decode_alone(m, prompt, gen, backend, window=None, sinks=0, lat=8, config: ChipConfig = BOOK, runner=None,
                 stop=(), temperature=0.0, top_k=0, seed=0, sample=0):
    """Decode one request alone: feed `prompt`, generate `gen` tokens (fewer if one of `stop` comes first:
    it is the last one); a plain list is the cache and every row is a one-row program of `host.batch` (the
    engine's calibration). Returns ``(tokens, logits, records)``: the generated tokens, their integer logits
    and one record per row (``L``, ``ctx``, ``tok``, ``counters``). A `host.batch.BatchRunner` may be passed
    as `runner` (its programs are reused; `backend`, `lat` and `config` are then its own). With a temperature
    each token is drawn as the engine draws sample `sample` of a request with that `top_k` and `seed`."""
    _check_request(Request(0, list(prompt), gen, stop=tuple(stop), temperature=temperature, top_k=top_k,
                           seed=seed, n=sample + 1))
    check_sinks(sinks, window)
    runner = runner or BatchRunner(m, backend, lat, config)
    toks, logits, records, cache = list(prompt), [], [], []
    for pos in range(len(prompt) + gen - 1):
        kc, vc = [], []
        for lo, hi in sink_ranges(pos + 1, window, sinks):
            kc += [r[0] for r in cache[lo:hi]]
            vc += [r[1] for r in cache[lo:hi]]
        if pos < len(prompt) - 1:
            kc = vc = None              # a cache-only row, as in the engine
        (res,), counters, _ = runner.run([(toks[pos], kc, vc)])
        cache.append((res["k"], res["v"]))
        records.append({"L": pos + 1, "ctx": 0 if kc is None else len(kc) + 1, "tok": res["tok"],
                        "counters": counters})
        if pos >= len(prompt) - 1:
            tok = res["tok"] if not temperature else sample_token(
                res["logits_int"], runner.check((1,)).tag_scales["logits"], temperature, top_k, seed, sample,
                len(logits), res["tok"])
            toks.append(tok)
            logits.append(res["logits_int"])
            if tok in stop:
                break
    return toks[len(prompt):], logits, records
