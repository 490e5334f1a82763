"""The router of K chips (``ga2 serve --chips K``), with neither Ray nor a simulator in it.

Every chip serves with its own engine (`host.engine.Engine`) and page pool. The router holds the requests
that have arrived, hands each to a chip when that chip can start it, runs the chips' engine steps in the
order of their clocks, and moves the requests of a chip that is lost to the others.

Time
    Every chip has its own clock: the chip cycles its engine has run, plus the time it sat idle before a
    request came to it. The router's time ``now`` is the earliest clock among the chips with work (and,
    while requests wait in the router, among idle chips that ran ahead). The earliest chip with work takes
    the next step (the lowest index on a tie), and a request is handed only to a chip whose clock is
    ``now`` (an idle chip behind it is brought to it): every decision sees what the chips did up to that
    moment and nothing after it. A run therefore depends only on its requests and options, not on where
    the chips run (here one after the other, or as Ray actors). A trace's arrival step t is at cycle
    t x ``step_cycles``.
Dispatch
    A request waits in the router until a chip at the router's time has a free running slot (``slots``: the
    engine's running requests at most; a request of n samples takes n). Among the waiting requests, order
    ``longest`` hands out first the one with the most rows to compute (prompt + tokens to generate - 1,
    times its samples), order ``arrival`` the earliest; both put a higher priority first when ``policy`` is
    "priority". Among the chips that can start it, route ``load`` picks the one with the fewest rows still
    to compute (the rows of its running and waiting requests that its engine has not computed, as it
    reported after its last step, plus those of the requests handed to it since), the lowest index on a
    tie; route ``prefix`` picks among the live chips the ones to which prompts sharing the most whole
    pages (of ``page`` rows, the prefix cache's unit) with this one were sent, and waits for a slot on one
    of them; without a shared page it goes by load.
Failure
    A chip whose handle raises `ChipLost` (its actor died, its process is gone) is lost: the requests the
    router had handed to it and not seen finish, running or waiting there, go back to the router's queue
    with their first arrival and are computed again from their prompt on the chips left. A token or result
    the lost chip had already given is not given again: the recomputed one must equal it (`RouterError`
    otherwise), so every request is answered exactly once. ``failovers`` in the result says which chip was
    lost, when, and which requests moved.

Why the router holds the requests (docs/cluster.md has the figures): handed out at arrival, all 32 requests
of the default trace go to the chips at cycle 0, each chip then serves its share first come first served,
and a long request that comes late in a chip's share ends that chip's run with steps of one or two rows
(a step with one full row costs about 60% of one with four). Two chips have two such tails where one chip
has one, and balancing rows does not remove them. Held until a slot frees, and the longest first, the
long requests start early and the end of the run is short requests on every chip.

A chip is any object with these methods (`EngineChip` for an engine here; ``sim.serving.multichip`` wraps
a Ray actor the same way):

- ``submit(request, at) -> dict``: the request arrives at cycle `at` (an idle chip's clock moves there);
  ``{"refused": [FinishEvent, ...], "outstanding": rows}``;
- ``step() -> dict``: one engine step: ``{"report": StepReport, "clock": cycles, "outstanding": rows,
  "running": [ids], "waiting": [ids], "hit_rows": rows, "preemptions": n, "queried_rows": rows, "owned":
  pages}``;
- ``refusal(request)``: why its engine would refuse the request, or None;
- ``abort(id)``; ``kill()`` (end the chip now: the fault ``--kill-chip`` injects); ``close()``.

`RouterEngine` gives the router the engine's online interface, so that the HTTP server's
`host.serving.service.EngineService` serves K chips as it serves one (``ga2 serve --http --chips K``).

The throughput of K chips is every token generated over the makespan, the latest clock of any chip in
chip cycles: the chips run side by side, so the run lasts as long as its slowest chip (as before the
router held requests: the busiest chip's cycles).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from host.engine import FinishEvent, StepReport, TokenEvent

__all__ = ["ROUTES", "ORDERS", "STEP_CYCLES", "ChipLost", "RouterError", "EngineChip", "Router", "RouterEngine",
           "aggregate", "shared_pages"]

ROUTES = ("load", "prefix")
ORDERS = ("longest", "arrival")
# a trace's engine step in chip cycles when several chips share one time: about one step of four rows on
# the book chip (one chip alone serving 32 requests of the default trace, seeds 1-12, takes 8,804 to 10,412
# cycles a step on average)
STEP_CYCLES = 10_000


class ChipLost(RuntimeError):
    """A chip is gone (its actor or its process died, or it was killed): its requests must move."""


class RouterError(RuntimeError):
    """The router cannot go on: every chip is lost, a chip with work runs no step, or a recomputed token
    differs from the one given before."""


def shared_pages(a, b, page: int) -> int:
    """Whole pages of `page` tokens that token lists `a` and `b` begin with in common."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n // page


def _rows(r) -> int:
    # the rows a request computes alone: every prompt token and every generated one but the last
    return len(r.prompt) + r.gen - 1


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class EngineChip:
    """A chip here: the router's methods over an engine (`host.engine.Engine` with its own backend).

    ``retain=False`` (a server that runs for ever) keeps no finished request in the engine."""

    def __init__(self, engine, retain: bool = True):
        self.engine = engine
        self.dead = False
        engine.start(retain=retain)

    def _alive(self) -> None:
        if self.dead:
            raise ChipLost("killed (EngineChip.kill)")

    def outstanding(self) -> int:
        """Rows its running and waiting requests have still to compute (samples not forked yet included)."""
        e = self.engine
        return sum(_rows(s.req) - s.pos + sum(_rows(t.req) - t.pos for t in s.pending)
                   for s in e.running + e.waiting)

    def submit(self, request, at: int) -> dict:
        self._alive()
        e = self.engine
        if not e.busy:
            e.clock = max(e.clock, at)      # it sat idle until now
        refused = e.submit(request)
        return {"refused": refused, "outstanding": self.outstanding()}

    def refusal(self, request):
        """Why the engine would refuse `request` (None: it would not)."""
        self._alive()
        return self.engine.refusal(request)

    def step(self) -> dict:
        self._alive()
        e = self.engine
        report = e.step()
        return {"report": report, "clock": e.clock, "outstanding": self.outstanding(),
                "running": sorted({s.req.id for s in e.running}), "waiting": sorted({s.req.id for s in e.waiting}),
                "hit_rows": e.hit_rows, "preemptions": e.preemptions, "queried_rows": e.queried_rows,
                "owned": e.owned()}

    def abort(self, rid) -> None:
        self._alive()
        self.engine.abort(rid)

    def kill(self) -> None:
        self.dead = True

    def close(self) -> None:
        """Nothing to release here (a Ray actor's proxy ends its actor)."""


@dataclass
class _Chip:
    """The router's view of one chip."""
    index: int
    handle: object
    slots: int
    alive: bool = True
    clock: int = 0
    steps: int = 0
    busy_cycles: int = 0
    outstanding: int = 0
    used: int = 0                                   # running slots its requests take (samples)
    assigned: dict = field(default_factory=dict)    # request id -> _Job
    prompts: list = field(default_factory=list)     # every prompt handed to it (the prefix route)
    status: dict = field(default_factory=dict)      # its last step's answer
    finished: int = 0
    tokens: int = 0
    lost: str | None = None


@dataclass
class _Job:
    """A request in the router: where it is and where it was."""
    req: object
    arrival: int                    # cycles
    chip: int | None = None
    dispatched: int = 0             # the cycle it was handed to its chip
    left: int = 0                   # its samples not finished on that chip
    moved_from: list = field(default_factory=list)


class Router:
    """K chips behind one queue (see the module's docstring).

    Parameters
    ----------
    chips : list
        The chips' handles (`EngineChip`, or a Ray actor's proxy with the same methods).
    slots : int
        Running requests a chip takes at once (its engine's ``max_running``).
    route : {"load", "prefix"}
    order : {"longest", "arrival"}
    page : int
        The prefix cache's page (rows), for ``prefix``.
    policy : {"fcfs", "priority"}
        The chips' engine policy: with "priority" a higher priority is handed out first.
    kills : iterable of (chip, step)
        Fault injection: chip c is killed (its handle's ``kill``) just before its engine step s (counted
        from 0), when its turn comes; the router then finds it lost as it would any failed chip. A chip
        that runs fewer steps is not killed (``kills_not_reached`` in the result).
    on_event : callable, optional
        Called with ``("token", id, sample, index, token, cycle)`` for every token given (once) and
        ``("finish", id, sample, result)`` for every sample answered (once).
    retain : bool
        Keep every answer for `result` (False, a server that runs for ever: a request's answers and tokens
        are forgotten once it is answered whole).
    """

    def __init__(self, chips, slots: int, route: str = "load", order: str = "longest", page: int = 4,
                 policy: str = "fcfs", kills=(), on_event=None, retain: bool = True):
        if route not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        if not chips:
            raise ValueError("a router needs at least one chip")
        self.chips = [_Chip(k, h, slots) for k, h in enumerate(chips)]
        self.slots, self.route, self.order, self.page, self.policy = slots, route, order, page, policy
        self.kills: dict = {}
        for c, s in kills:
            if not 0 <= c < len(self.chips):
                raise ValueError(f"kill: there is no chip {c} among {len(self.chips)}")
            self.kills[c] = s
        self.killed: dict = {}          # chip -> the step it was killed before
        self.on_event = on_event
        self.now = 0
        self.queue: list = []           # jobs waiting for a chip
        self.jobs: dict = {}            # id -> _Job, until every sample is answered
        self.answers: dict = {}         # (id, sample) -> result
        self.emitted: dict = {}         # (id, sample) -> the tokens given so far
        self.failovers: list = []
        self.recomputed_tokens = 0
        self.given = 0                  # answers given (a "finish" event each)
        self.retain = retain
        self.ran = False                # whether the last `advance` ran an engine step
        self.moved = False              # whether it ran one or lost a chip (something changed)

    # ---- the queue ------------------------------------------------------------------------------------
    def submit(self, r, at: int | None = None) -> None:
        """Request `r` arrived at cycle `at` (default: the router's time); it waits for a chip."""
        if r.id in self.jobs or (r.id, 0) in self.answers:
            raise RouterError(f"request id {r.id} was given twice")
        job = _Job(r, self.now if at is None else at)
        self.jobs[r.id] = job
        self.queue.append(job)

    def _key(self, job: _Job):
        r = job.req
        first = -r.priority if self.policy == "priority" else 0
        if self.order == "longest":
            return (first, -_rows(r) * r.n, job.arrival, r.id)
        return (first, job.arrival, r.id)

    def live(self) -> list:
        return [c for c in self.chips if c.alive]

    @property
    def busy(self) -> bool:
        """Whether a request waits in the router or is on a chip."""
        return bool(self.queue) or any(c.assigned for c in self.live())

    def next_time(self):
        """The router's next moment: the earliest clock of a live chip with work, or, while requests wait in
        the router, of any live chip later than now (an idle chip that ran ahead); None if there is none."""
        times = [c.clock for c in self.live() if c.assigned]
        if self.queue:
            times += [c.clock for c in self.live() if c.clock > self.now]
        return min(times, default=None)

    # ---- handing out --------------------------------------------------------------------------------
    def _dispatch(self) -> list:
        events: list = []
        if not self.queue:
            return events
        if not self.live():
            ids = sorted(j.req.id for j in self.queue)
            raise RouterError(f"every chip is lost: requests {ids[:20]} cannot be served")
        jobs, self.queue = sorted(self.queue, key=self._key), []
        for job in jobs:
            k = self._choose(job)
            if k is None:
                self.queue.append(job)
            else:
                events += self._send(job, self.chips[k])
        return events

    def _choose(self, job: _Job):
        n = min(job.req.n, self.slots)          # more samples than slots: the engine refuses it
        ready = [c for c in self.live() if c.clock <= self.now and c.slots - c.used >= n]
        if self.route == "prefix":
            shared = {c.index: max((shared_pages(job.req.prompt, p, self.page) for p in c.prompts), default=0)
                      for c in self.live()}
            best = max(shared.values())
            if best:
                ready = [c for c in ready if shared[c.index] == best]
        if not ready:
            return None
        return min(ready, key=lambda c: (c.outstanding, c.index)).index

    def _send(self, job: _Job, c: _Chip) -> list:
        try:
            out = c.handle.submit(job.req, self.now)
        except ChipLost as e:
            self.queue.append(job)
            self._lose(c, e)
            return []
        c.clock = max(c.clock, self.now)
        job.chip, job.dispatched, job.left = c.index, self.now, job.req.n
        c.assigned[job.req.id] = job
        c.used += job.req.n
        c.prompts.append(list(job.req.prompt))
        c.outstanding = out["outstanding"]
        events: list = []
        for f in out["refused"]:
            events += self._finish(c, job, f)
        return events

    # ---- a chip's step ------------------------------------------------------------------------------
    def advance(self, until: int | None = None) -> list:
        """Hand out what can start now, then run one engine step of the chip whose clock is earliest among
        those with work, unless `until` (the next arrival's cycle) comes before that step would start.
        Returns the new events (see ``on_event``)."""
        self.ran = self.moved = False
        events = self._dispatch()
        while True:
            work = [c for c in self.live() if c.assigned]
            c = min(work, key=lambda c: (c.clock, c.index)) if work else None
            if c is not None and c.clock <= self.now:
                break
            t = self.next_time()
            if t is None:
                if self.queue:
                    raise RouterError(f"requests {sorted(j.req.id for j in self.queue)[:20]} wait and no chip can "
                                      f"take them")
                return events
            if until is not None and until < t:
                return events
            self.now = t                # a later moment: hand out again first
            events += self._dispatch()
        if self.kills.get(c.index) == c.steps:
            del self.kills[c.index]
            self.killed[c.index] = c.steps
            c.handle.kill()
        self.ran = False
        self.moved = True
        try:
            out = c.handle.step()
        except ChipLost as e:
            self._lose(c, e)
            return events
        rep = out["report"]
        self.ran = rep.ran
        c.clock, c.steps = out["clock"], c.steps + rep.ran
        c.busy_cycles += rep.cycles
        c.outstanding, c.status = out["outstanding"], out
        for t in rep.tokens:
            events += self._token(c, t)
        for f in rep.finished:
            events += self._finish(c, c.assigned[f.id], f)
        if not rep.ran and c.assigned:      # (a step that only cancelled runs nothing)
            raise RouterError(f"chip {c.index} holds requests {sorted(c.assigned)[:20]} but runs no step")
        return events

    def _token(self, c: _Chip, t) -> list:
        given = self.emitted.setdefault((t.id, t.sample), [])
        if t.index < len(given):        # recomputed after a failover: given before, not again
            if given[t.index] != t.token:
                raise RouterError(f"request {t.id}: chip {c.index} recomputed token {t.index} as {t.token}, "
                                  f"not {given[t.index]} as given before: batch invariance is broken")
            self.recomputed_tokens += 1
            return []
        given.append(t.token)
        ev = ("token", t.id, t.sample, t.index, t.token, t.cycles)
        if self.on_event is not None:
            self.on_event(ev)
        return [ev]

    def _finish(self, c: _Chip, job: _Job, f) -> list:
        key = (f.id, f.sample)
        job.left -= 1
        c.used -= 1
        if job.left == 0:
            del c.assigned[job.req.id]
            c.finished += 1
        res = dict(f.result)
        if key in self.answers:          # answered before its chip was lost: the same, and not again
            prev = self.answers[key]
            if (prev.get("tokens"), prev.get("logits_int")) != (res.get("tokens"), res.get("logits_int")):
                raise RouterError(f"request {f.id}: recomputed on chip {c.index}, it differs from its answer")
            if job.left == 0:
                self._settle(job)
            return []
        wait = job.dispatched - job.arrival          # in the router's queue, and on a lost chip
        for name in ("ttft_cycles", "finish_cycles"):
            if res.get(name) is not None:
                res[name] += wait
        res["arrival"] = job.req.arrival
        res["chip"] = c.index
        if job.moved_from:
            res["moved_from"] = list(job.moved_from)
        self.answers[key] = res
        self.given += 1
        c.tokens += len(res.get("tokens", ()))
        if job.left == 0:
            self._settle(job)
        ev = ("finish", f.id, f.sample, res)
        if self.on_event is not None:
            self.on_event(ev)
        return [ev]

    def _settle(self, job: _Job) -> None:
        """Job answered whole: it leaves the router (and, not retained, so do its answers and tokens)."""
        rid = job.req.id
        self.jobs.pop(rid, None)
        if not self.retain:
            for j in range(job.req.n):
                self.answers.pop((rid, j), None)
                self.emitted.pop((rid, j), None)

    def _lose(self, c: _Chip, why: BaseException) -> None:
        c.alive = False
        c.lost = _first_line(why) if isinstance(why, ChipLost) else f"{type(why).__name__}: {_first_line(why)}"
        moved = sorted(c.assigned)
        running = set(c.status.get("running", ()))
        self.failovers.append({"chip": c.index, "after_steps": c.steps, "cycle": c.clock, "why": c.lost,
                               "killed": c.index in self.killed, "moved": moved,
                               "running": [i for i in moved if i in running],
                               "waiting": [i for i in moved if i not in running]})
        for job in c.assigned.values():
            job.moved_from.append(c.index)
            job.chip = None
            self.queue.append(job)
        c.assigned, c.used = {}, 0

    # ---- what a server needs besides ---------------------------------------------------------------
    def refusal(self, r):
        """Why every chip would refuse request `r` (they are alike: a live one is asked), or None."""
        while True:
            live = self.live()
            if not live:
                raise RouterError(f"every chip is lost: request {r.id} cannot be served")
            try:
                return live[0].handle.refusal(r)
            except ChipLost as e:
                self._lose(live[0], e)

    def abort(self, rid) -> list:
        """Cancel request `rid`. Waiting in the router, it is answered at once (reason abort, no token: the
        tokens a lost chip gave it before are not its answer); on a chip, that chip cancels it before its
        next step and its answer comes with that step. Returns the events of an answer given now."""
        job = self.jobs.get(rid)
        if job is None:
            return []
        if job.chip is not None:
            c = self.chips[job.chip]
            try:
                c.handle.abort(rid)
            except ChipLost as e:
                self._lose(c, e)            # the job is back in the queue: answered below
            if job.chip is not None:
                return []
        self.queue.remove(job)
        events = []
        for j in range(job.req.n):
            if (rid, j) in self.answers:
                continue
            r = job.req
            res = {"id": rid, "prompt": list(r.prompt), "gen": r.gen, "arrival": r.arrival, "aborted": None,
                   "tokens": [], "logits_int": [], "finish_reason": "abort", "ttft_cycles": None,
                   "finish_cycles": self.now - job.arrival, "preempted": 0, "prefix_hit_rows": 0, "rows_computed": 0,
                   "prompt_rows_computed": 0}
            if r.n > 1:
                res["sample"] = j
            self.answers[(rid, j)] = res
            self.given += 1
            ev = ("finish", rid, j, res)
            if self.on_event is not None:
                self.on_event(ev)
            events.append(ev)
        self._settle(job)
        return events

    # ---- a whole trace --------------------------------------------------------------------------------
    def run(self, requests, step_cycles: int = STEP_CYCLES, progress=None) -> dict:
        """Serve `requests` (each arriving at its ``arrival`` step, cycle step x `step_cycles`) to the end.
        ``progress(answered, total)`` is called after every engine step. Returns `result`."""
        arrivals = sorted(requests, key=lambda r: (r.arrival, r.id))
        total, i = len(arrivals), 0
        while i < len(arrivals) or self.busy:
            t = self.next_time()
            if i < len(arrivals) and (t is None or arrivals[i].arrival * step_cycles <= t):
                self.now = max(self.now, arrivals[i].arrival * step_cycles)
                while i < len(arrivals) and arrivals[i].arrival * step_cycles <= self.now:
                    self.submit(arrivals[i], arrivals[i].arrival * step_cycles)
                    i += 1
            self.advance(arrivals[i].arrival * step_cycles if i < len(arrivals) else None)
            if progress is not None:
                progress(len({k[0] for k in self.answers}), total)
        return self.result()

    def result(self) -> dict:
        """Every answer (by id, then sample) and how many were given, each chip's figures (its clock, busy cycles, steps, requests
        and tokens answered, prefix-hit rows and preemptions as of its last step, and why it was lost),
        the failovers, the tokens recomputed after them, and the kills that never came."""
        chips = []
        for c in self.chips:
            d = {"chip": c.index, "requests": c.finished, "tokens": c.tokens, "cycles": c.clock,
                 "busy_cycles": c.busy_cycles, "steps": c.steps, "prefix_hit_rows": c.status.get("hit_rows", 0),
                 "preemptions": c.status.get("preemptions", 0)}
            if c.lost is not None:
                d["lost"] = c.lost
            chips.append(d)
        return {"requests": [self.answers[k] for k in sorted(self.answers)], "chips": chips,
                "answers_given": self.given, "failovers": self.failovers, "recomputed_tokens": self.recomputed_tokens,
                "kills_not_reached": sorted(self.kills.items())}

    def close(self) -> None:
        """Close every chip's handle (a lost one too: its proxy may hold a dead actor)."""
        for c in self.chips:
            c.handle.close()


class RouterEngine:
    """The online interface of `host.engine.Engine` (``start``, ``submit``, ``step``, ``abort``, ``busy`` and
    the figures a server reads) over a `Router`, so that `host.serving.service.EngineService` serves K chips
    as it serves one: a step is one engine step of one chip (the one whose clock is earliest), the clock
    is the router's time, a refusal is answered at submit (a chip is asked, `Router.refusal`), and the
    figures add up the chips' (as of each one's last step; a lost chip's stay counted).

    Parameters
    ----------
    router : Router
    n_pages : int
        The chips' pages together (the KV-cache usage's denominator).
    """

    def __init__(self, router: Router, n_pages: int):
        self.router, self.n_pages = router, n_pages
        self.step_no = 0
        self._answered: list = []       # events of answers given outside a step (an abort in the queue)

    def start(self, retain: bool = True) -> None:
        self.router.retain = retain

    @property
    def busy(self) -> bool:
        return self.router.busy or bool(self._answered)

    @property
    def clock(self) -> int:
        return self.router.now

    def submit(self, r) -> list:
        why = self.router.refusal(r)
        if why:
            base = {"id": r.id, "prompt": list(r.prompt), "gen": r.gen, "arrival": r.arrival, "refused": why}
            return [FinishEvent(r.id, j, "refused", dict(base, **({"sample": j} if r.n > 1 else {})))
                    for j in range(r.n)]
        self.router.submit(r)
        return []

    def abort(self, rid) -> None:
        self._answered += self.router.abort(rid)

    def step(self) -> StepReport:
        now = self.router.now
        events, self._answered = self._answered, []
        events += self.router.advance()
        tokens = [TokenEvent(*ev[1:]) for ev in events if ev[0] == "token"]
        finished = [FinishEvent(ev[1], ev[2], ev[3]["finish_reason"], ev[3]) for ev in events if ev[0] == "finish"]
        # "ran": something moved on (an engine step, or a chip lost and its requests back in the queue)
        report = StepReport(self.step_no, self.router.moved, tokens, finished, self.router.now - now)
        self.step_no += self.router.ran
        return report

    @property
    def running(self) -> list:
        """The requests running on the chips (as of each one's last step; each has ``req``)."""
        return [c.assigned[i] for c in self.router.live() for i in c.status.get("running", ()) if i in c.assigned]

    @property
    def waiting(self) -> list:
        """The requests waiting in the router or in a chip's engine (each has ``req``)."""
        run = {id(j) for j in self.running}
        return list(self.router.queue) + [j for c in self.router.live() for j in c.assigned.values() if id(j) not in run]

    def owned(self) -> int:
        return sum(c.status.get("owned", 0) for c in self.router.live())

    @property
    def queried_rows(self) -> int:
        return sum(c.status.get("queried_rows", 0) for c in self.router.chips)

    @property
    def hit_rows(self) -> int:
        return sum(c.status.get("hit_rows", 0) for c in self.router.chips)

    @property
    def preemptions(self) -> int:
        return sum(c.status.get("preemptions", 0) for c in self.router.chips)


def aggregate(run: dict) -> dict:
    """The figures of a K-chip run (`Router.result`): tokens, the makespan (the latest chip clock) and
    tokens per million of its cycles, the prefix-cache hit rate (hit rows over the prompt rows of the
    answered requests), the failovers, and per chip its requests, tokens and cycles."""
    done = [r for r in run["requests"] if "refused" not in r]
    tokens = sum(len(r["tokens"]) for r in done)
    span = max((c["cycles"] for c in run["chips"]), default=0)
    prompt_rows = sum(len(r["prompt"]) for r in done)
    hits = sum(c["prefix_hit_rows"] for c in run["chips"])
    return {"chips": len(run["chips"]), "tokens_generated": tokens, "span_cycles": span,
            "tokens_per_mcycle": round(tokens * 1e6 / span, 3) if span else 0.0,
            "prefix_hit_rows": hits, "prompt_rows": prompt_rows,
            "prefix_hit_rate": round(hits / prompt_rows, 4) if prompt_rows else 0.0,
            "failovers": len(run["failovers"]), "moved_requests": sum(len(f["moved"]) for f in run["failovers"]),
            "recomputed_tokens": run["recomputed_tokens"], "per_chip": run["chips"]}
