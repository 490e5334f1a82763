"""What a served trace gives back, host-side: its figures (`summary`), each request's replay command
(`replay_cmd`, `add_replays`) and the comparison of every request with its replay alone (`replay_mismatches`).

`replay_cmd` and `add_replays` read the serving options from `a`, any object with the attributes of
``sim.serve``'s parsed arguments they use (``window``, ``model``, ``chip``, ``sinks``, ``seed_model``).
"""
from __future__ import annotations

import math

from host.engine import decode_alone

__all__ = ["add_replays", "replay_cmd", "replay_steps", "replay_mismatches", "summary"]


def add_replays(a, requests, out) -> None:
    """Give every served request its ``replay_cmd``; print one ``error:`` line for each refused one."""
    for r in requests:
        if "refused" in r:
            print(f"error: {r['refused']} (refused; the other requests are served)", file=out)
        else:
            r["replay_cmd"] = replay_cmd(a, r)


def replay_steps(r) -> int:
    """The tokens a replay of request `r` generates: its length, or, cancelled, its tokens so far."""
    return len(r["tokens"]) if "aborted" in r else r["gen"]


def replay_cmd(a, r) -> list:
    """The ``python -m sim.decode`` argument list that replays request `r` alone (same calibration)."""
    cmd = ["python", "-m", "sim.decode", "--prompt", ",".join(map(str, r["prompt"])), "--steps",
           str(replay_steps(r)), "--window", "none" if a.window is None else str(a.window), "--model", a.model,
           "--chip", a.chip.spec(), "--sim", "reference"]
    if a.sinks:
        cmd += ["--sinks", str(a.sinks)]
    if a.seed_model is not None:
        cmd += ["--seed", str(a.seed_model)]
    if r.get("stop"):
        cmd += ["--stop", ",".join(map(str, r["stop"]))]
    if r.get("temperature"):
        cmd += ["--temperature", str(r["temperature"]), "--top-k", str(r["top_k"]), "--sample-seed", str(r["seed"]),
                "--sample", str(r.get("sample", 0))]
    return cmd


def replay_mismatches(m, requests, window, sinks, runner) -> list:
    """The ids of the served `requests` (none refused) whose tokens or integer logits differ from their
    replay alone (`host.engine.decode_alone` with model `m`, the `window` and `sinks` served with, on
    `runner`, a `host.batch.BatchRunner` of the machine that replays); a request with no token to
    generate is not replayed."""
    bad = []
    for r in requests:
        steps = replay_steps(r)
        if not steps:
            continue
        toks, logits, _ = decode_alone(m, r["prompt"], steps, None, window, sinks, runner=runner,
                                       stop=r.get("stop", ()), temperature=r.get("temperature", 0.0),
                                       top_k=r.get("top_k", 0), seed=r.get("seed", 0), sample=r.get("sample", 0))
        if toks != r["tokens"] or logits != r["logits_int"]:
            bad.append(r["id"])
    return bad


def _p99(v):
    # the nearest-rank 99th percentile (0 for no values)
    v = sorted(v)
    return v[max(0, math.ceil(0.99 * len(v)) - 1)] if v else 0


def _mean(v):
    return sum(v) / len(v) if v else 0.0


def summary(res: dict) -> dict:
    """The figures of a served trace (`host.engine.Engine.run`'s result with ``owned_at_end`` and
    ``cached_at_end`` added): integers where they are counts of cycles, rows or pages."""
    done = [r for r in res["requests"] if "refused" not in r]
    tokens = sum(len(r["tokens"]) for r in done)
    ttft = [r["ttft_cycles"] for r in done if r["ttft_cycles"] is not None]     # None: cancelled before a token
    tpot = [(r["finish_cycles"] - r["ttft_cycles"]) / (len(r["tokens"]) - 1) for r in done if len(r["tokens"]) > 1]
    pages = [s["pages"] for s in res["steps"]]
    total = res["total_cycles"]
    return {"requests_finished": len(done), "refused": len(res["requests"]) - len(done),
            "tokens_generated": tokens, "total_cycles": total,
            "tokens_per_mcycle": round(tokens * 1e6 / total, 3) if total else 0.0,
            "ttft_mean_cycles": round(_mean(ttft), 1), "ttft_p99_cycles": _p99(ttft),
            "tpot_mean_cycles": round(_mean(tpot), 1), "tpot_p99_cycles": round(_p99(tpot), 1),
            "peak_pages": max(pages, default=0), "mean_pages": round(_mean(pages), 2),
            "peak_running": max((s["running"] for s in res["steps"]), default=0),
            "preemptions": res["preemptions"], "prefix_hit_rows": res["prefix_hit_rows"],
            "prompt_rows_computed": sum(r["prompt_rows_computed"] for r in done),
            "engine_steps": len(res["steps"]), "programs_compiled": res["programs_compiled"],
            "cycles_per_token": round(total / tokens, 1) if tokens else 0.0, "load_cycles": res["load_cycles"],
            "pages_owned_at_end": res["owned_at_end"], "pages_cached_at_end": res["cached_at_end"]}
