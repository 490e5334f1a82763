"""The online completion service: the serving engine on its own thread, fed by an event loop (issue 22).

What the HTTP layer (`host.serving.http`) needs from whatever serves completions is `CompletionService`:

- `CompletionService.submit` (called on the event loop) takes a `Completion` and returns its
  `CompletionStream`, or raises `QueueFull` (the waiting queue is at its bound: answer 429) or `Draining`
  (shutting down: 503). The stream's first event is `Accepted` or `Refused` (the engine's own refusal: a
  prompt the chip could never serve); then `Token` events as the chip produces them (choice, index, token,
  chip cycles since the request arrived) and one `Finished` per choice (stop, length or abort); `Failed` if
  the service broke. `CompletionStream.abort` cancels the request (a client gone): its pages return at once.
- `CompletionService.stats` gives the figures /metrics shows (`ServiceStats`).
- `CompletionService.begin_drain` stops admitting; `CompletionService.drain` waits until every accepted
  request has ended (and its replay-log line is written), then stops.

`EngineService` implements it on one `host.engine.Engine`: a thread runs the engine step after step; requests
submitted meanwhile join the running batch at the next step (continuous batching). Everything the engine
produces reaches the event loop through ``loop.call_soon_threadsafe``, one batch of events per stream and
step. A router of several chips implements the same class (its streams are `CompletionStream` too,
pushed from wherever its chips answer).

The replay log: one JSON line per finished request, on the server's disk (never sent to a client): its
parameters, each choice's tokens, its replay command (``python -m sim.decode ...``, given by the caller's
``replay``) and, with ``verify``, whether the choice is identical to that replay alone. The replay alone is
computed on a worker thread, off the engine's thread, so serving is not slowed by it.
"""
from __future__ import annotations

import abc
import asyncio
import json
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field

from host.engine import Engine, EngineError, Request

__all__ = ["Completion", "Accepted", "Refused", "Token", "Finished", "Failed", "CompletionStream", "ServiceStats",
           "QueueFull", "Draining", "CompletionService", "EngineService"]


# ---- what a client asks for, and what it gets back ------------------------------------------------------

@dataclass(frozen=True)
class Completion:
    """One request: generate at most ``max_tokens`` tokens after ``prompt`` (tokens 0..15), ``n`` choices;
    ``stop``: tokens that end a choice (the stop token is its last token); ``temperature``, ``top_k``,
    ``seed``: sampling on the host (temperature 0: the chip's argmax); ``priority``: higher is served first
    (with the engine's policy "priority"); ``tag``: the client-visible id, written in the replay log."""
    prompt: tuple
    max_tokens: int
    n: int = 1
    stop: tuple = ()
    temperature: float = 0.0
    top_k: int = 0
    seed: int | None = None
    priority: int = 0
    tag: str = ""


@dataclass(frozen=True)
class Accepted:
    """The request waits for admission or runs."""


@dataclass(frozen=True)
class Refused:
    """The request could never be served (``message``: why, one line); the stream ends."""
    message: str


@dataclass(frozen=True)
class Token:
    """Generated token ``index`` of choice ``choice``, made ``cycles`` chip cycles after the request arrived."""
    choice: int
    index: int
    token: int
    cycles: int


@dataclass(frozen=True)
class Finished:
    """Choice ``choice`` ended: ``reason`` is "stop", "length" or "abort"; ``tokens``: all it generated."""
    choice: int
    reason: str
    tokens: tuple


@dataclass(frozen=True)
class Failed:
    """The service broke while serving the request (``message``: why); the stream ends."""
    message: str


class QueueFull(Exception):
    """The waiting queue is at its bound: try again after ``retry_after`` seconds."""

    def __init__(self, waiting: int, bound: int, retry_after: int = 1):
        super().__init__(f"{waiting} requests are waiting, the bound is {bound}")
        self.waiting, self.bound, self.retry_after = waiting, bound, retry_after


class Draining(Exception):
    """The service is shutting down and admits no request."""


class CompletionStream:
    """The events of one submitted request, read on the event loop that submitted it.

    A service pushes lists of events from any thread (`push`; they reach the loop through
    ``loop.call_soon_threadsafe``); the reader awaits `next_events`. The stream ends after `Refused`,
    `Failed`, or one `Finished` per choice (`ended`)."""

    def __init__(self, n: int, abort, loop: asyncio.AbstractEventLoop | None = None):
        self.n = n
        self._abort = abort
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._finished = 0
        self.ended = False

    def push(self, events: list) -> None:
        """Hand `events` to the event loop (from any thread); nothing once that loop is closed."""
        if events and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, list(events))
            except RuntimeError:        # closed meanwhile (a forced exit): nobody reads this stream any more
                pass

    async def next_events(self) -> list:
        """The next batch of events (one engine step's, in order); waits for it."""
        events = await self._queue.get()
        for ev in events:
            if isinstance(ev, Finished):
                self._finished += 1
            if isinstance(ev, (Refused, Failed)) or self._finished == self.n:
                self.ended = True
        return events

    def abort(self) -> None:
        """Cancel the request (no effect once it ended): its pages return at once."""
        if not self.ended:
            self._abort()


@dataclass
class ServiceStats:
    """What /metrics shows. Counts since the service started; ``running`` / ``waiting`` are requests (a
    request's n choices run as n), rows are tokens of the cache (a prefix-cache query asks for a prompt's
    rows, a hit is a row not computed)."""
    running: int = 0
    waiting: int = 0
    pages_used: int = 0
    pages_total: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    chip_cycles: int = 0
    engine_steps: int = 0
    finished: dict = field(default_factory=dict)      # reason -> choices ended so ("stop", "length", "abort")
    refused: int = 0
    replays_checked: int = 0
    replays_differ: int = 0

    @property
    def kv_usage(self) -> float:
        """The fraction of the pool's pages that requests hold."""
        return self.pages_used / self.pages_total if self.pages_total else 0.0


class CompletionService(abc.ABC):
    """What the HTTP layer serves from (see the module's docstring); `EngineService` is one chip's."""

    @abc.abstractmethod
    def submit(self, c: Completion) -> CompletionStream:
        """Take request `c` (on the event loop); raises `QueueFull` or `Draining`."""

    @abc.abstractmethod
    def stats(self) -> ServiceStats:
        """The current figures (any thread)."""

    @property
    @abc.abstractmethod
    def healthy(self) -> bool:
        """False once the service broke (every request then gets `Failed`)."""

    @abc.abstractmethod
    def begin_drain(self) -> None:
        """Admit no more requests (`submit` raises `Draining`); the accepted ones go on."""

    @abc.abstractmethod
    def drain(self, timeout: float | None = None) -> bool:
        """Block until every accepted request has ended and its replay-log line is written, then stop;
        returns False if `timeout` seconds passed first."""


# ---- one chip: the engine on its own thread ---------------------------------------------------------------

@dataclass
class _Live:
    stream: CompletionStream
    c: Completion
    seed: int
    clock: int = 0                  # the engine clock at its arrival
    results: dict = field(default_factory=dict)     # choice -> the engine's result


class EngineService(CompletionService):
    """`CompletionService` on one `host.engine.Engine` (see the module's docstring).

    Parameters
    ----------
    engine : host.engine.Engine
        Not started; the service's thread owns it from `start` on.
    max_waiting : int
        The waiting queue's bound (requests submitted and not yet admitted): past it `submit` raises `QueueFull`.
    log_path : str or None
        The replay log (JSON lines; created with mode 0600, or truncated). None: no log.
    replay : callable or None
        ``replay(result) -> list of str``: the command that replays a finished choice alone (``result``
        as `host.engine.Engine.run` gives a request's).
    verify : callable or None
        ``verify(result) -> bool``: whether the choice equals its replay alone (run on the worker thread).
    """

    def __init__(self, engine: Engine, max_waiting: int = 256, log_path: str | None = None, replay=None,
                 verify=None):
        if not isinstance(max_waiting, int) or max_waiting < 1:
            raise ValueError(f"max_waiting must be an integer >= 1, got {max_waiting!r}")
        self.engine, self.max_waiting = engine, max_waiting
        self.log_path, self.replay, self.verify = log_path, replay, verify
        self._cond = threading.Condition()
        self._inbox: list = []           # ("submit", id, _Live) and ("abort", id), applied between steps
        self._live: dict = {}            # request id -> _Live, touched on the engine's thread only
        self._next_id = 0
        self._draining = self._stopping = False
        self._error: str | None = None
        self._stats = ServiceStats(pages_total=engine.n_pages)
        self._stats_lock = threading.Lock()
        self._waiting = 0                # the engine's waiting requests after the last step
        self._accepted = 0               # requests accepted and not yet logged
        self._log_queue: queue.Queue = queue.Queue()
        self._log = None
        self._engine_thread = threading.Thread(target=self._engine_loop, name="ga2-engine", daemon=True)
        self._log_thread = threading.Thread(target=self._log_loop, name="ga2-replay-log", daemon=True)
        self._started = False

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> "EngineService":
        """Open the replay log and start the engine's and the log's threads."""
        if self.log_path is not None:
            # it holds every client's prompts and tokens: created readable by the server's user alone
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            self._log = open(fd, "w", encoding="utf-8")
        self.engine.start(retain=False)
        self._started = True
        self._engine_thread.start()
        self._log_thread.start()
        return self

    @property
    def healthy(self) -> bool:
        return self._error is None

    def begin_drain(self) -> None:
        with self._cond:
            self._draining = True

    def drain(self, timeout: float | None = None) -> bool:
        self.begin_drain()
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._accepted and self._error is None:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is not None else 0.5)
            self._stopping = True
            self._cond.notify_all()
        if self._started:
            self._engine_thread.join(None if end is None else max(0.0, end - time.monotonic()))
            self._log_queue.put(None)
            self._log_thread.join(None if end is None else max(0.0, end - time.monotonic()))
        if self._log is not None:
            self._log.close()
            self._log = None
        return True

    # ---- the event loop's side ---------------------------------------------------------------------
    def submit(self, c: Completion) -> CompletionStream:
        with self._cond:
            if self._draining:
                raise Draining("the server is shutting down")
            if self._error is not None:
                stream = CompletionStream(c.n, lambda: None)
                stream.push([Failed(self._error)])
                return stream
            waiting = self._waiting + sum(1 for op in self._inbox if op[0] == "submit")
            if waiting >= self.max_waiting:
                raise QueueFull(waiting, self.max_waiting)
            rid = self._next_id
            self._next_id += 1
            stream = CompletionStream(c.n, lambda: self._post(("abort", rid)))
            seed = rid if c.seed is None else c.seed
            self._inbox.append(("submit", rid, _Live(stream, c, seed)))
            self._accepted += 1
            self._cond.notify_all()
        return stream

    def _post(self, op) -> None:
        with self._cond:
            self._inbox.append(op)
            self._cond.notify_all()

    def stats(self) -> ServiceStats:
        with self._stats_lock:
            s = ServiceStats(**{k: getattr(self._stats, k) for k in self._stats.__dataclass_fields__})
            s.finished = dict(s.finished)
        with self._cond:
            s.waiting += sum(1 for op in self._inbox if op[0] == "submit")
        return s

    # ---- the engine's thread -----------------------------------------------------------------------
    def _engine_loop(self) -> None:
        e = self.engine
        try:
            while True:
                with self._cond:
                    while not self._inbox and not e.busy and not self._stopping:
                        self._cond.wait()
                    ops, self._inbox = self._inbox, []
                    if self._stopping and not ops and not e.busy:
                        return
                    # they wait until `_publish` says otherwise: a submit meanwhile sees them
                    self._waiting += sum(1 for op in ops if op[0] == "submit")
                for op in ops:
                    if op[0] == "submit":
                        self._arrive(op[1], op[2])
                    elif op[1] in self._live:
                        e.abort(op[1])
                report = None
                if e.busy:
                    report = e.step()
                    if not report.ran and e.waiting:     # (a step that only cancelled runs nothing)
                        raise EngineError(f"request {e.waiting[0].req.id} cannot be admitted into an empty pool")
                # counted before anyone hears of it: a client that saw its tokens reads /metrics with them in
                self._publish(report)
                if report is not None:
                    self._deliver(report)
        except Exception as exc:            # a broken backend or a broken promise: every request learns it
            traceback.print_exc()
            self._fail(f"{type(exc).__name__}: {exc}".splitlines()[0])

    def _arrive(self, rid: int, live: _Live) -> None:
        c, e = live.c, self.engine
        live.clock = e.clock
        try:
            refused = e.submit(Request(rid, list(c.prompt), c.max_tokens, stop=tuple(c.stop), priority=c.priority,
                                       temperature=c.temperature, top_k=c.top_k, seed=live.seed, n=c.n))
            why = refused[0].result["refused"] if refused else None
        except EngineError as exc:
            why = str(exc)
        if why:
            live.stream.push([Refused(why)])
            with self._stats_lock:
                self._stats.refused += 1
            self._done_one()
            return
        self._live[rid] = live
        with self._stats_lock:
            self._stats.prompt_tokens += len(c.prompt)
        live.stream.push([Accepted()])

    def _deliver(self, report) -> None:
        out: dict = {}
        for t in report.tokens:
            live = self._live[t.id]
            out.setdefault(t.id, []).append(Token(t.sample, t.index, t.token, t.cycles - live.clock))
        ended = []
        for f in report.finished:
            live = self._live[f.id]
            live.results[f.sample] = f.result
            out.setdefault(f.id, []).append(Finished(f.sample, f.reason, tuple(f.result["tokens"])))
            if len(live.results) == live.c.n:
                ended.append(f.id)
        for rid, events in out.items():
            self._live[rid].stream.push(events)
        for rid in ended:
            self._log_queue.put((rid, self._live.pop(rid)))

    def _publish(self, report) -> None:
        """The figures after a step (`report`, None if none ran), all at once: a reader never sees a step half
        counted."""
        e = self.engine
        with self._stats_lock:
            st = self._stats
            if report is not None:
                st.generation_tokens += len(report.tokens)
                for f in report.finished:
                    st.finished[f.reason] = st.finished.get(f.reason, 0) + 1
            st.running = len(e.running)
            st.waiting = len(e.waiting)
            st.pages_used = e.owned()
            st.prefix_queries, st.prefix_hits = e.queried_rows, e.hit_rows
            st.preemptions, st.chip_cycles, st.engine_steps = e.preemptions, e.clock, e.step_no
        with self._cond:
            self._waiting = len(e.waiting)

    def _fail(self, message: str) -> None:
        with self._cond:
            self._error = message
            ops, self._inbox = self._inbox, []
        for op in ops:
            if op[0] == "submit":
                op[2].stream.push([Failed(message)])
                self._done_one()
        for rid, live in list(self._live.items()):
            live.stream.push([Failed(message)])
            self._done_one()
        self._live.clear()

    def _done_one(self) -> None:
        with self._cond:
            self._accepted -= 1
            self._cond.notify_all()

    # ---- the replay log's thread -------------------------------------------------------------------
    def _log_loop(self) -> None:
        while True:
            item = self._log_queue.get()
            if item is None:
                return
            rid, live = item
            try:
                line = self._log_line(rid, live)
            except Exception as exc:        # a failed replay must not stop the log (nor the drain waiting on it)
                traceback.print_exc()
                line = {"id": live.c.tag, "request": rid, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
                with self._stats_lock:      # not shown identical: counted as differing
                    self._stats.replays_checked += live.c.n
                    self._stats.replays_differ += live.c.n
            try:
                if self._log is not None:
                    self._log.write(json.dumps(line) + "\n")
                    self._log.flush()
            finally:
                self._done_one()

    def _log_line(self, rid: int, live: _Live) -> dict:
        c = live.c
        choices = []
        for j in range(c.n):
            r = live.results[j]
            ch = {"index": j, "tokens": r["tokens"], "finish_reason": r["finish_reason"],
                  "ttft_cycles": r["ttft_cycles"], "finish_cycles": r["finish_cycles"],
                  "preempted": r["preempted"], "prefix_hit_rows": r["prefix_hit_rows"]}
            if "aborted" in r:
                ch["aborted_at_step"] = r["aborted"]
            if r["tokens"]:         # a choice cancelled before its first token has nothing to replay
                if self.replay is not None:
                    ch["replay_cmd"] = " ".join(self.replay(r))
                if self.verify is not None:
                    same = bool(self.verify(r))
                    ch["identical"] = same
                    with self._stats_lock:
                        self._stats.replays_checked += 1
                        self._stats.replays_differ += not same
            choices.append(ch)
        return {"id": c.tag, "request": rid, "time": round(time.time(), 3), "prompt": list(c.prompt),
                "max_tokens": c.max_tokens, "n": c.n, "stop": list(c.stop), "temperature": c.temperature,
                "top_k": c.top_k, "seed": live.seed, "priority": c.priority, "choices": choices}
