"""Serving on K chips (``python -m sim.serve --chips K [--route load|prefix] [--cluster ADDRESS]``).

Each chip is a simulator with its own page pool and `host.engine.Engine` (`ChipServer`); with ``--cluster``
each is a Ray actor (`sim.cluster.Cluster.actors`), otherwise they run one after the other here: the
results are the same. The router (`host.serving.router.route`, ``load`` or ``prefix``) assigns every
request, in order of arrival, to one chip. The chips run in parallel in simulated time: the trace takes as
many cycles as the busiest chip (`host.serving.router.aggregate`). Every request must still equal its
replay alone (`host.engine.decode_alone`, on the reference machine).
"""
from __future__ import annotations

import os
import time

from host.serving.results import add_replays, replay_mismatches
from host.serving.router import ROUTES, aggregate, route
from host.serving.trace import make_trace

__all__ = ["ChipServer", "serve_chips", "main_chips"]


class ChipServer:
    """One chip: the model, a backend and an engine with its own page pool, built from the parsed
    ``sim.serve`` arguments `a`; `serve` runs a list of requests to the end (one Ray actor per chip)."""

    def __init__(self, a):
        from host import tiny_lm as T
        from host.engine import Engine
        from sim.backends import get_backend
        cfg = a.chip
        self.model = T.make_model(a.model, a.seed_model if a.seed_model is not None
                                  else (1 if a.model == "structured" else 2))
        self.engine = Engine(self.model, get_backend(a.sim, config=cfg), max_batch=a.max_batch, window=a.window,
                             sinks=a.sinks, page=a.page, n_pages=a.pages, prefix_cache=not a.no_prefix_cache,
                             alloc=a.alloc, contig_rows=a.prompt_len[1] + a.gen_len[1] - 1,
                             lat=cfg.lat if a.lat is None else a.lat, config=cfg, prefill=a.prefill)

    def serve(self, reqs) -> dict:
        return self.engine.run(reqs)


def serve_chips(a, chips: int, policy: str, cluster=None) -> dict:
    """Serve the trace of `a` on `chips` chips routed by `policy`; with `cluster` (a `sim.cluster.Cluster`,
    entered) the chips are Ray actors. Returns {"chip_of": [...], "chips": [engine result per chip]}."""
    reqs = make_trace(a.requests, a.seed, a.prompt_len, a.gen_len, a.prefix_share, a.arrival)
    chip_of = route(reqs, chips, policy, a.page, a.max_batch)
    parts = [[r for r, k in zip(reqs, chip_of) if k == c] for c in range(chips)]
    if cluster is not None:
        results = cluster.actors(ChipServer, [(a,)] * chips, "serve", [(p,) for p in parts],
                                 label=f"serve on {chips} chips")
    else:
        results = [ChipServer(a).serve(p) for p in parts]
    return {"chip_of": chip_of, "chips": results}


def main_chips(a, out) -> int:
    """`sim.serve`'s main for ``--chips K`` or ``--cluster``: serve, print, verify every request alone,
    write the JSON and, with ``--out``, the figures (throughput against K = 1, 2, 4 and the prefix-hit rate
    of the two policies)."""
    import contextlib

    from host import tiny_lm as T
    from host.batch import BatchRunner
    from sim.cli import make_dir, write_json
    from sim.backends.reference import ReferenceMachine
    if a.mode != "book":
        from sim.cli import UsageError
        raise UsageError(f"--chips {a.chips}{' --cluster' if a.cluster else ''}: --mode {a.mode} is not built "
                         "for several chips yet (use --mode book)")
    # issue 21's scheduler options are one chip's engine for now: refused rather than silently dropped
    extra = [opt for opt, on in (("--stop", a.stop), ("--temperature", a.temperature), ("--n", a.n > 1),
                                 ("--max-batched-tokens", a.max_batched_tokens), ("--policy", a.policy != "fcfs"),
                                 ("--priorities", a.priorities > 1)) if on]
    if extra:
        from sim.cli import UsageError
        raise UsageError(f"--chips {a.chips}{' --cluster' if a.cluster else ''}: {', '.join(extra)} not built for "
                         "several chips yet")
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        cluster = None
        if a.cluster is not None:
            from sim.cluster import Cluster
            cluster = stack.enter_context(Cluster(a.cluster, a.workers))
        run = serve_chips(a, a.chips, a.route, cluster)
        figures = {}
        if a.out:
            # the figures: the same trace on 1, 2 and 4 chips, and on these chips by each route
            by_k = {k: run if k == a.chips else serve_chips(a, k, a.route, cluster) for k in (1, 2, 4)}
            by_route = {p: run if p == a.route else serve_chips(a, a.chips, p, cluster) for p in ROUTES}
            figures = {"throughput_by_chips": {str(k): aggregate(r)["tokens_per_mcycle"] for k, r in by_k.items()},
                       "prefix_hit_rate_by_route": {p: aggregate(r)["prefix_hit_rate"] for p, r in by_route.items()}}
    wall = time.perf_counter() - t0
    s = aggregate(run)
    reqs = sorted((r for res in run["chips"] for r in res["requests"]), key=lambda r: r["id"])
    for r in reqs:
        r["chip"] = run["chip_of"][r["id"]]
    add_replays(a, reqs, out)
    w = "none" if a.window is None else a.window
    print(f"GA-2 serve on {a.chips} chip{'s' * (a.chips != 1)} (route {a.route}"
          f"{', Ray actors on ' + a.cluster if a.cluster else ''}): {a.requests} requests (seed {a.seed}), max "
          f"batch {a.max_batch}, window {w}, each chip a pool of {a.pages} pages of {a.page} rows, chip "
          f"{a.chip.spec()}, simulator {a.sim}", file=out)
    print(f"tokens generated {s['tokens_generated']}, busiest chip {s['span_cycles']:,} cycles, aggregate tokens "
          f"per million cycles {s['tokens_per_mcycle']}; prefix-cache hit rows {s['prefix_hit_rows']} of "
          f"{s['prompt_rows']} prompt rows", file=out)
    for p in s["per_chip"]:
        print(f"  chip {p['chip']}: {p['requests']} requests, {p['tokens']} tokens, {p['cycles']:,} cycles, "
              f"{p['prefix_hit_rows']} prefix-hit rows, {p['preemptions']} preemptions", file=out)
    status = 0
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
    doc = {"requests": reqs, **{k: v for k, v in s.items()}, "route": a.route, "max_batch": a.max_batch,
           "chip": a.chip.spec(), "window": a.window, "page": a.page, "pages": a.pages, **figures,
           "run": {"sim": a.sim, "cluster": a.cluster, "wall_seconds": round(wall, 2)}}
    if a.out:
        from sim.plot import chart
        make_dir(a.out, out)
        t = figures["throughput_by_chips"]
        chart(os.path.join(a.out, "serve_chips.png"), f"{a.requests} requests, route {a.route}",
              list(map(int, t)), list(t.values()), "chips", "aggregate tokens per million cycles", "bar")
        h = figures["prefix_hit_rate_by_route"]
        chart(os.path.join(a.out, "serve_route_prefix_hits.png"), f"{a.chips} chips, prefix share "
              f"{a.prefix_share}", list(h), list(h.values()), "route", "prefix-cache hit rows / prompt rows", "bar")
    if a.json:
        write_json(a.json, doc, out=out)
    return status
