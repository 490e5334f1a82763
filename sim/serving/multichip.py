"""Serving on K chips (``python -m sim.serve --chips K [--route load|prefix] [--order longest|arrival]
[--kill-chip C@S] [--cluster ADDRESS]``).

Each chip is a simulator with its own page pool and `host.engine.Engine` (`ChipServer`); with ``--cluster``
each is a Ray actor (`sim.cluster.Cluster.spawn`, called through `RemoteChip`), otherwise it is an object
here: the results are the same, to the byte. The router (`host.serving.router.Router`) holds the requests
that arrived, hands each to a chip when one can start it and steps the chips in the order of their clocks;
a chip that is lost (``--kill-chip C@S`` kills chip C before its engine step S: ``ray.kill`` of its actor
on a cluster) has its requests moved to the others and computed again there. The trace takes as many
cycles as its slowest chip (`host.serving.router.aggregate`). Every request must still equal its replay
alone (`host.engine.decode_alone`, on the reference machine).
"""
from __future__ import annotations

import argparse
import os
import re
import time

from host.serving.results import add_replays, replay_mismatches
from host.serving.router import ORDERS, ROUTES, ChipLost, EngineChip, Router, RouterEngine, RouterError, aggregate
from host.serving.trace import make_trace
from sim.cli import int_range

__all__ = ["ChipServer", "RemoteChip", "chip_options", "uses_router", "check_chip_args", "kill_spec", "trace_requests",
           "make_chips", "serve_chips", "router_engine", "failover_lines", "main_chips"]


def kill_spec(text: str) -> tuple:
    """An argparse type for ``--kill-chip``: ``C@S[,C@S...]``, chip C (from 0) killed before its engine
    step S (from 0); the pairs in a tuple."""
    pairs = [re.fullmatch(r"([0-9]+)@([0-9]+)", part) for part in text.split(",")]
    if not all(pairs):
        raise argparse.ArgumentTypeError(f"must be CHIP@STEP[,CHIP@STEP...], e.g. 1@10, got {text!r}")
    return tuple((int(m[1]), int(m[2])) for m in pairs)


kill_spec.__name__ = "chip@step"


def chip_options(p) -> None:
    """``--chips``, ``--route``, ``--order`` and ``--kill-chip`` of ``sim.serve``."""
    p.add_argument("--chips", type=int_range(1, 64), default=1, metavar="K",
                   help="serve on K chips, each with its own pool and engine, behind one router that holds the "
                        "requests until a chip has a free slot (sim.serving.multichip, docs/cluster.md); with --out, "
                        "figures of throughput on 1, 2, 4 chips and of both routes")
    p.add_argument("--route", choices=ROUTES, default="load",
                   help="with --chips: which chip takes a request: load, the one with the fewest rows still to "
                        "compute; prefix, the one its prompt's longest shared prefix (whole pages) went to")
    p.add_argument("--order", choices=ORDERS, default=None,
                   help="with --chips: which waiting request the router hands out first: longest, the most rows "
                        "to compute (the default); arrival, the earliest (given with --chips 1, the one chip "
                        "is served through the router)")
    p.add_argument("--kill-chip", type=kill_spec, default=None, metavar="C@S[,C@S...]",
                   help="with --chips K: kill chip C (0..K-1) before its engine step S (counted from 0; ray.kill of "
                        "its actor with --cluster): its running and waiting requests move to the other chips and "
                        "are computed again there; several chips comma-separated (one chip must be left)")


def uses_router(a) -> bool:
    """Whether ``sim.serve``'s arguments `a` serve through the router (`main_chips`)."""
    return a.chips > 1 or a.cluster is not None or a.order is not None or bool(a.kill_chip)


def check_chip_args(a) -> None:
    """The K-chip options' checks (a UsageError, before any work)."""
    from sim.cli import UsageError
    for c, s in a.kill_chip or ():
        if c >= a.chips:
            raise UsageError(f"--kill-chip {c}@{s}: there is no chip {c} among --chips {a.chips} (0..{a.chips - 1})")
    killed = {c for c, _ in a.kill_chip or ()}
    if len(killed) != len(a.kill_chip or ()):
        raise UsageError("--kill-chip: a chip is killed once (given twice)")
    if a.kill_chip and len(killed) >= a.chips:
        raise UsageError(f"--kill-chip kills {len(killed)} of {a.chips} chips: at least one must be left")


class ChipServer(EngineChip):
    """One chip: the model, a backend and an engine with its own page pool, built from the parsed
    ``sim.serve`` arguments `a` (one Ray actor per chip with ``--cluster``); ``contig_rows``: the rows a
    request reserves with ``--alloc contiguous`` (default: the longest of the trace's options); ``retain``:
    see `host.serving.router.EngineChip`."""

    def __init__(self, a, contig_rows: int | None = None, retain: bool = True):
        from host.serving.build import make_engine, model_of
        from sim.backends import get_backend
        from sim.cli import backend_options
        self.model = model_of(a)
        engine = make_engine(a, self.model, get_backend(a.sim, config=a.chip, **backend_options(a)),
                             contig_rows=contig_rows or a.prompt_len[1] + a.gen_len[1] - 1)
        super().__init__(engine, retain)

    def slots(self) -> int:
        """Requests its engine runs at once."""
        return self.engine.max_running


class RemoteChip:
    """A `ChipServer` in a Ray actor (`sim.cluster.Actor`), with the router's methods: an actor that is gone
    raises `host.serving.router.ChipLost`."""

    def __init__(self, actor):
        self.actor = actor

    def _call(self, method, *args):
        from sim.cluster import ActorLost
        try:
            return self.actor.call(method, *args)
        except ActorLost as e:
            raise ChipLost(e.reason or str(e)) from e

    def slots(self) -> int:
        return self._call("slots")

    def submit(self, request, at: int) -> dict:
        return self._call("submit", request, at)

    def step(self) -> dict:
        return self._call("step")

    def refusal(self, request):
        return self._call("refusal", request)

    def abort(self, rid) -> None:
        self._call("abort", rid)

    def kill(self) -> None:
        self.actor.kill()

    def close(self) -> None:
        self.actor.kill()


def trace_requests(a) -> list:
    """The trace of `a` with its per-request options (stop tokens, sampling, samples), as ``sim.serve``
    gives them to one chip: each request's sampling seed is its id."""
    reqs = make_trace(a.requests, a.seed, a.prompt_len, a.gen_len, a.prefix_share, a.arrival, a.priorities)
    for r in reqs:
        r.stop = tuple(a.stop or ())
        r.temperature, r.top_k, r.n, r.seed = a.temperature, a.top_k, a.n, r.id
    return reqs


def make_chips(a, chips: int, cluster=None, contig_rows: int | None = None, retain: bool = True) -> list:
    """`chips` chips of the options `a`: `ChipServer` objects here, or, with `cluster` (a
    `sim.cluster.Cluster`, entered), Ray actors behind `RemoteChip`."""
    if cluster is not None:
        return [RemoteChip(x) for x in cluster.spawn(ChipServer, [(a, contig_rows, retain)] * chips, label="chip")]
    return [ChipServer(a, contig_rows, retain) for _ in range(chips)]


def serve_chips(a, chips: int, route: str, order: str, cluster=None, kills=(), progress=None) -> dict:
    """Serve the trace of `a` on `chips` chips behind the router (`route`, `order`, `kills`); with `cluster`
    (a `sim.cluster.Cluster`, entered) the chips are Ray actors. Returns `host.serving.router.Router.result`."""
    handles = make_chips(a, chips, cluster)
    router = Router(handles, handles[0].slots(), route, order, a.page, a.policy, kills)
    try:
        return router.run(trace_requests(a), progress=progress)
    finally:
        router.close()


def router_engine(a, contig_rows: int, cluster=None):
    """The chips of `a` (``--chips``, ``--route``, ``--order``, ``--kill-chip``) behind a router that runs for
    ever, as an engine (`host.serving.router.RouterEngine`) for the HTTP server (``ga2 serve --http``)."""
    check_chip_args(a)
    handles = make_chips(a, a.chips, cluster, contig_rows, retain=False)
    router = Router(handles, handles[0].slots(), a.route, a.order or "longest", a.page, a.policy,
                    a.kill_chip or (), retain=False)
    return RouterEngine(router, a.pages * a.chips)


def failover_lines(run: dict) -> list:
    """The lines that report `run`'s failovers (``failovers``) and the kills that never came
    (``kills_not_reached``)."""
    lines = []
    for f in run["failovers"]:
        how = "killed by --kill-chip" if f["killed"] else "it failed"
        lines.append(f"failover: chip {f['chip']} lost after {f['after_steps']} engine steps, at cycle {f['cycle']:,} "
                     f"({how}; {f['why']}): {len(f['running'])} running and {len(f['waiting'])} waiting requests "
                     f"moved to the chips left and computed again from their prompt (ids "
                     f"{', '.join(map(str, f['moved'])) or 'none'})")
    for c, s in run["kills_not_reached"]:
        lines.append(f"kill: chip {c} ran fewer than {s + 1} engine steps: --kill-chip {c}@{s} never came")
    return lines


def main_chips(a, out) -> int:
    """`sim.serve`'s main through the router (``--chips K``, ``--cluster``, ``--order`` or ``--kill-chip``):
    serve, print, check that every request is answered once and equals its replay alone, write the JSON
    and, with ``--out``, the figures (throughput on K = 1, 2, 4 and the prefix-hit rate of both routes)."""
    import contextlib

    from host import tiny_lm as T
    from host.batch import BatchRunner
    from sim.backends.reference import ReferenceMachine
    from sim.cli import CommandError, Progress, make_dir, write_json
    check_chip_args(a)
    order = a.order or "longest"
    kills = a.kill_chip or ()
    t0 = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            cluster = None
            if a.cluster is not None:
                from sim.cluster import Cluster
                cluster = stack.enter_context(Cluster(a.cluster, a.workers))
            with Progress(f"serving on {a.chips} chip{'s' * (a.chips != 1)}", unit="request") as bar:
                run = serve_chips(a, a.chips, a.route, order, cluster, kills, progress=bar)
            figures = {}
            if a.out:
                # the figures: the same trace on 1, 2 and 4 chips, and on these chips by each route
                by_k = {k: run if k == a.chips and not kills else serve_chips(a, k, a.route, order, cluster)
                        for k in (1, 2, 4)}
                by_route = {p: run if p == a.route and not kills else serve_chips(a, a.chips, p, order, cluster)
                            for p in ROUTES}
                figures = {"throughput_by_chips": {str(k): aggregate(r)["tokens_per_mcycle"] for k, r in by_k.items()},
                           "prefix_hit_rate_by_route": {p: aggregate(r)["prefix_hit_rate"] for p, r in by_route.items()}}
    except RouterError as e:
        raise CommandError(str(e)) from None
    wall = time.perf_counter() - t0
    s = aggregate(run)
    reqs = run["requests"]
    add_replays(a, reqs, out)
    w = "none" if a.window is None else a.window
    print(f"GA-2 serve on {a.chips} chip{'s' * (a.chips != 1)} (route {a.route}, {order} first"
          f"{', Ray actors on ' + a.cluster if a.cluster else ''}): {a.requests} requests (seed {a.seed}), max "
          f"batch {a.max_batch}, window {w}, each chip a pool of {a.pages} pages of {a.page} rows, chip "
          f"{a.chip.spec()}, simulator {a.sim}", file=out)
    print(f"tokens generated {s['tokens_generated']}, makespan {s['span_cycles']:,} cycles (the slowest chip), "
          f"aggregate tokens per million cycles {s['tokens_per_mcycle']}; prefix-cache hit rows "
          f"{s['prefix_hit_rows']} of {s['prompt_rows']} prompt rows", file=out)
    for p in s["per_chip"]:
        print(f"  chip {p['chip']}: {p['requests']} requests, {p['tokens']} tokens, {p['cycles']:,} cycles "
              f"({p['steps']} engine steps, {p['busy_cycles']:,} cycles in them), {p['prefix_hit_rows']} prefix-hit "
              f"rows, {p['preemptions']} preemptions" + (f"; LOST ({p['lost']})" if "lost" in p else ""), file=out)
    for line in failover_lines(run):
        print(line, file=out)
    # every request of the trace answered, each sample once (the router refuses a second answer)
    want = {(r.id, j) for r in trace_requests(a) for j in range(r.n)}
    got = {(r["id"], r.get("sample", 0)) for r in reqs}
    status = 0
    if got != want or run["answers_given"] != len(want):
        status = 1
        print(f"answers: {len(want & got)} of {len(want)} (request, sample) answered, {run['answers_given']} answers "
              f"given: requests LOST or ANSWERED TWICE", file=out)
    else:
        moved = len({r["id"] for r in reqs if "moved_from" in r})
        print(f"answers: {len(want)} of {len(want)} answered once each ({moved} request{'s' * (moved != 1)} after "
              f"moving off a lost chip; "
              f"{run['recomputed_tokens']} tokens computed again there, each equal to the one given before)",
              file=out)
    if not a.no_verify:
        m = T.make_model(a.model, a.seed_model if a.seed_model is not None else (1 if a.model == "structured" else 2))
        runner = BatchRunner(m, ReferenceMachine(config=a.chip), a.chip.lat if a.lat is None else a.lat, a.chip)
        done = [r for r in reqs if "refused" not in r]
        bad = replay_mismatches(m, done, a.window, a.sinks, runner)
        if bad:
            status = 1
            print(f"replays alone: {len(bad)} of {len(done)} requests DIFFER (ids {bad[:10]})", file=out)
        else:
            print(f"replays alone: {len(done)} of {len(done)} requests identical (tokens and integer logits, "
                  f"sim.decode --prompt on the reference)", file=out)
    doc = {"requests": reqs, **{k: v for k, v in s.items()}, "route": a.route, "order": order,
           "max_batch": a.max_batch, "chip": a.chip.spec(), "window": a.window, "page": a.page, "pages": a.pages,
           "failover_events": run["failovers"], "kills_not_reached": run["kills_not_reached"], **figures,
           "run": {"sim": a.sim, "cluster": a.cluster, "wall_seconds": round(wall, 2)}}
    if a.out:
        from sim.plot import chart
        make_dir(a.out, out)
        t = figures["throughput_by_chips"]
        chart(os.path.join(a.out, "serve_chips.png"), f"{a.requests} requests, route {a.route}, {order} first",
              list(map(int, t)), list(t.values()), "chips", "aggregate tokens per million cycles", "bar")
        h = figures["prefix_hit_rate_by_route"]
        chart(os.path.join(a.out, "serve_route_prefix_hits.png"), f"{a.chips} chips, prefix share "
              f"{a.prefix_share}", list(h), list(h.values()), "route", "prefix-cache hit rows / prompt rows", "bar")
    if a.json:
        write_json(a.json, doc, out=out)
    return status
