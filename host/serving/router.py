"""The router of K chips (``sim.serve --chips K``), without Ray or a simulator: which chip serves each
request (`route`), and the figures of a K-chip run (`aggregate`).

- ``load``: the chip with the least work assigned (the engine steps its requests need at least, with
  this one; the router does not watch the chips' progress), the lowest index on a tie;
- ``prefix``: the chip whose earlier requests share the longest prefix with this prompt (what its prefix
  cache can hold), counted in whole pages (the cache's unit), the least loaded among equals.

The chips run in parallel in simulated time: the trace takes as many cycles as the busiest chip, and the
aggregate throughput is every chip's tokens per million of those cycles.
"""
from __future__ import annotations

__all__ = ["ROUTES", "route", "aggregate"]

ROUTES = ("load", "prefix")


def _common(a, b) -> int:
    # the length of the longest common prefix of two token lists
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def route(reqs, chips: int, policy: str, page: int, max_batch: int) -> list:
    """The chip of every request of `reqs` (taken in the trace's order of arrival, ties by id), by `policy`.

    A chip's load is the engine steps its requests need at least: their rows (prompt + generated - 1) over
    `max_batch` rows a step, or its longest request's rows if more (one row per request and step).
    ``load`` picks the chip whose load after taking the request is least; ``prefix`` the chip whose earlier
    requests share the most whole pages (of `page` rows) with the prompt, the least loaded among equals.
    Ties go to the lowest index. The router does not watch the chips' progress.
    """
    if policy not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {policy!r}")
    rows, longest = [0] * chips, [0] * chips
    seen: list[list] = [[] for _ in range(chips)]
    chip_of = {}
    for r in sorted(reqs, key=lambda r: (r.arrival, r.id)):
        n = len(r.prompt) + r.gen - 1

        def load_after(k):
            return max(-(-(rows[k] + n) // max_batch), longest[k], n)

        if policy == "prefix":
            shared = [max((_common(r.prompt, p) // page for p in seen[k]), default=0) for k in range(chips)]
        else:
            shared = [0] * chips
        k = min(range(chips), key=lambda k: (-shared[k], load_after(k), rows[k], k))
        chip_of[r.id] = k
        rows[k] += n
        longest[k] = max(longest[k], n)
        seen[k].append(r.prompt)
    return [chip_of[r.id] for r in reqs]


def aggregate(run: dict) -> dict:
    """The figures of a K-chip run (``{"chips": [engine result per chip], ...}``): tokens, the busiest chip's
    cycles, tokens per million of them, the prefix-cache hit rate (hit rows over prompt rows), and per chip
    its requests, tokens and cycles."""
    per = []
    for c, res in enumerate(run["chips"]):
        done = [r for r in res["requests"] if "refused" not in r]
        per.append({"chip": c, "requests": len(done), "tokens": sum(len(r["tokens"]) for r in done),
                    "cycles": res["total_cycles"], "prefix_hit_rows": res["prefix_hit_rows"],
                    "prompt_rows": sum(len(r["prompt"]) for r in done), "preemptions": res["preemptions"]})
    tokens = sum(p["tokens"] for p in per)
    span = max((p["cycles"] for p in per), default=0)
    prompt_rows = sum(p["prompt_rows"] for p in per)
    hits = sum(p["prefix_hit_rows"] for p in per)
    return {"chips": len(per), "tokens_generated": tokens, "span_cycles": span,
            "tokens_per_mcycle": round(tokens * 1e6 / span, 3) if span else 0.0,
            "prefix_hit_rows": hits, "prompt_rows": prompt_rows,
            "prefix_hit_rate": round(hits / prompt_rows, 4) if prompt_rows else 0.0, "per_chip": per}
