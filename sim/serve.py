"""Serve a synthetic trace of many requests on the GA-2 chip: continuous batching over one page pool.

    python -m sim.serve --requests 24 --seed 3 --max-batch 4 --window 8 --sim reference --json a.json

The trace (`host.serving.trace.make_trace`): request lengths drawn from Example B's long-tailed shape
(lognormal, 16..2048 rows) scaled into ``--prompt-len`` and ``--gen-len``; a fraction ``--prefix-share`` of
the prompts begin with one of a few shared prefixes; arrivals all at step 0 or Poisson. `host.engine.Engine`
serves it and every request is then replayed alone on the reference machine (`host.engine.decode_alone`,
what ``sim.decode --prompt`` runs): its tokens and integer logits must be identical (exit status 1 if not).
Times are chip cycles: TTFT from the request's arrival to its first token, TPOT per later token
(`host.serving.results.summary`). This module wires the host's serving code to a backend and prints;
``--chips K`` is `sim.serving.multichip`; ``--http HOST:PORT`` serves clients instead of a trace, an
OpenAI-compatible API (`sim.serving.http_serve`, docs/http-server.md).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from host.serving.results import add_replays, replay_cmd, replay_mismatches, summary
from host.serving.trace import N_PREFIXES, PREFIX_LEN, make_trace
from sim.backends import MAX_LAT
from sim.cli import (Parser, Progress, UsageError, backend_options, board_options, chip_option, guarded, int_range,
                     link_report, make_dir, output_dir, output_file, sim_option, window, write_json)
from sim.options import arrival, fraction, span, temperature, token_list
from sim.plot import chart, pyplot

__all__ = ["serve", "build_parser", "check_args", "main", "serve_targets"]

DEFAULT_SIM = "reference"


def serve(a, backend=None, max_batch=None, progress=None, engine_cls=None) -> dict:
    """Serve the trace of parsed arguments `a` (``max_batch`` overrides ``a.max_batch``); the engine's result
    (``res["engine"]``: the engine, with ``engine_cls`` given, e.g. `sim.timeline.recording_engine`)."""
    from host.serving.build import make_engine, model_of
    from sim.backends import get_backend
    m = model_of(a)
    backend = backend or get_backend(a.sim, config=a.chip, **backend_options(a))
    reqs = make_trace(a.requests, a.seed, a.prompt_len, a.gen_len, a.prefix_share, a.arrival,
                      getattr(a, "priorities", 1))
    for r in reqs:
        r.stop = tuple(getattr(a, "stop", None) or ())
        # sampling: each request's seed is its id (sample j of it draws apart, host.sampling)
        r.temperature, r.top_k, r.n, r.seed = getattr(a, "temperature", 0.0), getattr(a, "top_k", 0), \
            getattr(a, "n", 1), r.id
    e = make_engine(a, m, backend, contig_rows=a.prompt_len[1] + a.gen_len[1] - 1, max_batch=max_batch,
                    engine_cls=engine_cls)
    res = e.run(reqs, progress=progress)
    res["owned_at_end"], res["cached_at_end"] = e.owned(), len(e.page_hash)
    res["model"] = m
    if engine_cls is not None:
        res["engine"] = e
    return res


def build_parser() -> Parser:
    p = Parser(
        "python -m sim.serve",
        "Serve a synthetic trace of requests on the GA-2 chip: continuous batching (decode rows first, then "
        "prompt rows), admission with a free-page watermark, preemption by recompute, prefix caching and "
        "attention sinks over one page pool (host.engine). Prints requests finished, tokens generated, chip "
        "cycles, tokens per million cycles, time to first token and per output token (cycles; mean and p99), "
        "pages in use, preemptions and prefix-cache hit rows, and checks that every request equals its replay "
        "alone (sim.decode --prompt; exit status 1 if one differs). With --http HOST:PORT it serves clients "
        "instead, an OpenAI-compatible HTTP API with streaming and metrics (docs/http-server.md).",
        "python -m sim.serve --requests 24 --seed 3 --max-batch 4 --window 8 --sim reference --json a.json\n"
        "python -m sim.serve --prefix-share 0.5 --no-prefix-cache\n"
        "python -m sim.serve --pages 12 --max-batch 8 --alloc contiguous --out out/serve\n"
        "python -m sim.serve --http 127.0.0.1:8123 --sim reference")
    p.add_argument("--requests", type=int_range(1, 10000), default=24, metavar="N", help="requests in the trace")
    p.add_argument("--seed", type=int, default=3, metavar="S", help="trace seed")
    p.add_argument("--arrival", type=arrival, default=("all", 0.0), metavar="all|poisson:RATE",
                   help="every request at step 0, or Poisson arrivals of RATE requests per engine step")
    p.add_argument("--prompt-len", type=span, default=(2, 16), metavar="A:B", help="prompt tokens, A..B")
    p.add_argument("--gen-len", type=span, default=(2, 16), metavar="A:B", help="tokens to generate, A..B")
    p.add_argument("--prefix-share", type=fraction, default=0.0, metavar="F",
                   help=f"fraction of prompts that begin with one of {N_PREFIXES} shared prefixes of "
                        f"{PREFIX_LEN} tokens")
    p.add_argument("--max-batch", type=int_range(1, 64), default=4, metavar="B",
                   help="rows per chip program (and running requests) at most")
    p.add_argument("--max-batched-tokens", type=int_range(1, 256), default=None, metavar="N",
                   help="rows per engine step at most, a token budget: prefill first (a prompt's cache-only "
                        "rows up to N at once, last prompt rows and then decode rows in whole programs), as many "
                        "requests running as the pool admits, each step in programs of at most --max-batch rows "
                        "(default: one row per running request and step)")
    p.add_argument("--stop", type=token_list, default=None, metavar="T1,T2,...",
                   help="stop tokens of every request: its generation ends at the first one (its last token) "
                        "or at its length")
    p.add_argument("--temperature", type=temperature, default=0.0, metavar="T",
                   help="draw each token on the host from the row's integer logits at temperature T (0: the chip's "
                        "argmax); the seed of a request is its id")
    p.add_argument("--top-k", type=int_range(0, 16), default=0, metavar="K",
                   help="with --temperature: draw among the K largest logits only (0: all)")
    p.add_argument("--n", type=int_range(1, 16), default=1, metavar="N",
                   help="samples of every prompt, sharing its pages (forked after its last prompt row, copy on write)")
    p.add_argument("--policy", choices=("fcfs", "priority"), default="fcfs",
                   help="fcfs: admitted by arrival, the most recently admitted preempted first; priority: a higher "
                        "priority is admitted first and preempts a lower one (for a slot or for pages)")
    p.add_argument("--priorities", type=int_range(1, 100), default=1, metavar="K",
                   help="give each request of the trace a priority 0..K-1 (higher is more urgent; default all 0)")
    p.add_argument("--window", type=window, default=8, metavar="{none|N}",
                   help="each row attends its new token and at most N-1 previous ones")
    p.add_argument("--sinks", type=int_range(0, None), default=0, metavar="S",
                   help="also keep and attend the first S rows of every request (needs a window)")
    p.add_argument("--page", type=int_range(1, None), default=4, metavar="P", help="cache rows per page")
    p.add_argument("--pages", type=int_range(1, None), default=64, metavar="N", help="pages in the pool")
    p.add_argument("--alloc", choices=("paged", "contiguous"), default="paged",
                   help="paged: pages as rows come; contiguous: the baseline reserving, per request, the pages of "
                        "the longest request --prompt-len and --gen-len allow (no prefix cache)")
    p.add_argument("--no-prefix-cache", action="store_true", help="compute every prompt row")
    p.add_argument("--prefill", choices=("cache", "full"), default="cache",
                   help="cache: a prompt row before the prompt's last computes only its k/v cache row (the "
                        "model has one layer, the rest is dead); full: every prompt row runs the whole model "
                        "and its logits are discarded (the baseline)")
    p.add_argument("--mode", choices=("book", "resident"), default="book",
                   help="book: the host gathers each row's cache rows into the image; resident: the weights "
                        "and the cache stay on the chip, each row GATHERs through its block table (needs "
                        "gather=1, e.g. --chip fast; the load program's cycles are reported apart)")
    chip_option(p, help="the chip the programs are compiled for and the simulator runs")
    p.add_argument("--model", choices=("structured", "random"), default="structured", help="the tiny LM")
    p.add_argument("--model-seed", dest="seed_model", type=int, default=None, metavar="S",
                   help="model seed (default 1 for structured, 2 for random)")
    sim_option(p, DEFAULT_SIM, help="which simulator runs the chip (the replays alone run on the reference)")
    board_options(p)
    p.add_argument("--lat", type=int_range(1, MAX_LAT), default=None, metavar="N",
                   help="external memory read latency (default: the chip's)")
    p.add_argument("--json", type=output_file, default=None, metavar="PATH", help="write the run as JSON")
    p.add_argument("--out", type=output_dir, default=None, metavar="DIR",
                   help="draw DIR/serve_throughput.png (the trace at batch 1, 2, 4, 8 on the reference) and "
                        "DIR/serve_pages.png (pages in use per engine step)")
    p.add_argument("--no-verify", action="store_true", help="skip the replays alone")
    p.add_argument("--trace", type=output_file, default=None, metavar="FILE.json",
                   help="also write a timeline to FILE.json (Chrome trace-event JSON: open it in ui.perfetto.dev or "
                        "chrome://tracing): the chip's tracks from the reference machine's per-instruction trace of "
                        "every program the engine runs (with --sim verilator or amaranth, the RTL's own, checked equal "
                        "to it), "
                        "and an engine process with a track of steps and one per "
                        "request (waiting, prefill, decode, preempted), all in chip cycles")
    from sim.serving.multichip import chip_options
    chip_options(p)
    from sim.cluster import cluster_option
    cluster_option(p, "one Ray actor per chip")
    from sim.serving.http_serve import add_http_options
    add_http_options(p)
    return p


def check_args(a) -> None:
    backend_options(a)
    if a.trace and (a.chips > 1 or a.cluster is not None):
        raise UsageError("--trace covers one chip's engine: not with --chips or --cluster")
    if a.sim == "board" and (a.chips > 1 or a.cluster is not None):
        raise UsageError("--sim board serves on the one board of --port: not with --chips or --cluster")
    if a.mode == "resident":
        if not a.chip.gather:
            raise UsageError(f"--mode resident needs a chip with GATHER/SCATTER (gather=1), and --chip "
                             f"{a.chip.spec()} has none: use --chip fast or add gather=1")
        if a.alloc != "paged":
            raise UsageError("--mode resident keeps the cache in the chip's page pools: --alloc contiguous is "
                             "a book-mode baseline")
    if a.sinks and a.window is None:
        raise UsageError(f"--sinks {a.sinks} needs a window (--window N)")
    if a.page * a.pages > (1 << 20):
        raise UsageError(f"--page {a.page} --pages {a.pages}: more than 2^20 rows")
    if a.out:
        pyplot("the serving figures")           # a missing matplotlib is said before any work


def main(argv=None, out=None) -> int:
    out = out or sys.stdout
    a = build_parser().parse_args(argv)
    from sim.serving.http_serve import check_http_args, given_options, main_http
    check_http_args(a, given_options(build_parser(), sys.argv[1:] if argv is None else argv))
    check_args(a)
    from sim.cluster import check_cluster_args
    check_cluster_args(a)
    if a.http is not None:
        return main_http(a, out)
    from sim.serving.multichip import main_chips, uses_router
    if uses_router(a):
        return main_chips(a, out)
    from host.batch import BatchRunner
    from sim.backends.reference import ReferenceMachine
    t0 = time.perf_counter()
    from sim.backends import get_backend
    backend = get_backend(a.sim, config=a.chip, **backend_options(a))
    tracer = engine_cls = None
    if a.trace:
        from sim.timeline import TracingBackend, recording_engine
        tracer = TracingBackend(backend, a.chip)
        engine_cls = recording_engine(tracer)
    with Progress(f"serving on {a.sim}", unit="request") as bar:
        res = serve(a, backend=tracer or backend, progress=bar, engine_cls=engine_cls)
    wall = time.perf_counter() - t0
    m = res.pop("model")
    trace_doc = _trace_document(a, tracer, res.pop("engine")) if tracer is not None else None
    s = summary(res)
    add_replays(a, res["requests"], out)
    w = "none" if a.window is None else a.window
    print(f"GA-2 serve: {a.requests} requests (seed {a.seed}), max batch {a.max_batch}, window {w}, sinks "
          f"{a.sinks}, pool {a.pages} pages of {a.page} rows ({a.alloc}), prefix cache "
          f"{'off' if a.no_prefix_cache or a.alloc == 'contiguous' else 'on'}, prefill {a.prefill}, chip "
          f"{a.chip.spec()}, mode {a.mode}, simulator {a.sim}", file=out)
    print(f"requests finished {s['requests_finished']} (refused {s['refused']}), tokens generated "
          f"{s['tokens_generated']}, total chip cycles {s['total_cycles']:,}, tokens per million cycles "
          f"{s['tokens_per_mcycle']}", file=out)
    print(f"time to first token: mean {s['ttft_mean_cycles']:,} p99 {s['ttft_p99_cycles']:,} cycles; per output "
          f"token: mean {s['tpot_mean_cycles']:,} p99 {s['tpot_p99_cycles']:,} cycles", file=out)
    if a.mode == "resident":
        per = s["total_cycles"] / s["tokens_generated"] if s["tokens_generated"] else 0.0
        print(f"resident mode: {per:,.1f} chip cycles per generated token (the load program's "
              f"{res['load_cycles']:,} cycles once, not included)", file=out)
    print(f"pages in use: peak {s['peak_pages']}, mean {s['mean_pages']}; requests running at once: peak "
          f"{s['peak_running']}; preemptions {s['preemptions']}; prefix-cache hit rows {s['prefix_hit_rows']}; "
          f"prompt rows computed {s['prompt_rows_computed']}; {s['engine_steps']} engine steps, "
          f"{s['programs_compiled']} programs compiled", file=out)
    print(f"at the end: {s['pages_owned_at_end']} pages owned by requests, {s['pages_cached_at_end']} cached (the "
          f"invariants held after every engine step)", file=out)
    status = 0
    if not a.no_verify:
        runner = BatchRunner(m, ReferenceMachine(config=a.chip), cfg_lat(a), a.chip)
        done = [r for r in res["requests"] if "refused" not in r]
        bad = replay_mismatches(m, done, a.window, a.sinks, runner)
        if bad:
            status = 1
            print(f"replays alone: {len(bad)} of {len(done)} requests DIFFER (ids {bad[:10]}); e.g. "
                  f"{' '.join(replay_cmd(a, next(r for r in done if r['id'] == bad[0])))}", file=out)
        else:
            print(f"replays alone: {len(done)} of {len(done)} requests identical (tokens and integer logits, "
                  f"sim.decode --prompt on the reference)", file=out)
    doc = {"requests": [{k: v for k, v in r.items()} for r in res["requests"]],
           **{k: v for k, v in s.items()}, "max_batch": a.max_batch, "mode": a.mode, "chip": a.chip.spec(),
           "window": a.window, "sinks": a.sinks, "page": a.page, "pages": a.pages, "alloc": a.alloc,
           "prefix_cache": not a.no_prefix_cache and a.alloc == "paged", "prefill": a.prefill,
           "steps": res["steps"], "run": {"sim": a.sim, "wall_seconds": round(wall, 2)}}
    if a.out:
        make_dir(a.out, out)
        sizes, rates = [1, 2, 4, 8], []
        for b in sizes:
            rb = serve(a, backend=ReferenceMachine(config=a.chip), max_batch=b)
            rb.pop("model")
            rates.append(summary(rb)["tokens_per_mcycle"])
        doc["throughput_by_batch"] = dict(zip(map(str, sizes), rates))
        chart(os.path.join(a.out, "serve_throughput.png"), f"{a.requests} requests, window {w}, chip "
              f"{a.chip.spec()}", sizes, rates, "max batch (rows per program)", "tokens per million cycles", "bar")
        chart(os.path.join(a.out, "serve_pages.png"), f"pool of {a.pages} pages, max batch {a.max_batch}",
              [st["step"] for st in res["steps"]], [st["pages"] for st in res["steps"]], "engine step",
              "pages owned by requests")
    if hasattr(backend, "link_summary"):
        link_report(backend, out)
        st = backend.stats
        doc["run"]["link"] = {"retries": st.retries, "reasons": dict(st.reasons), "polls": st.polls,
                              "bytes_out": st.bytes_out, "bytes_in": st.bytes_in, "runs": st.runs}
    if a.json:
        write_json(a.json, doc, out=out)
    if trace_doc is not None:
        write_json(a.trace, trace_doc, out=out)
    return status


def _trace_document(a, tracer, e) -> dict:
    """`--trace`: the chip's runs (the load program, then each step's page copies and programs) and the
    engine's process, both checked (tracks against counters, request slices in order) before written."""
    from sim.timeline import serve_trace_document
    return serve_trace_document(a.chip, tracer.runs, e, a.mode, f"ga2 serve, {a.requests} requests, "
                                f"{len(e.tl_steps)} engine steps, {len(tracer.runs)} chip runs, mode {a.mode}",
                                tracer.source)


def cfg_lat(a) -> int:
    return a.chip.lat if a.lat is None else a.lat


# ---- sim.bench --serve: the targets as ratios -----------------------------------------------

TARGET_TRACE = ["--requests", "24", "--seed", "3", "--window", "8"]


# The resident serving targets, cycles per generated token on the default trace (prompt rows included) by
# max batch: issue 14's (batch 4 <= 1,200) and issue 23's (batch 4 <= 400, batch 8 <= 300).
RESIDENT_TARGETS = {4: (1200, 400), 8: (300,)}
# Issue 23's throughput target: generated tokens per second at batch 4 on the ULX3S-85F at the chip's placed
# Fmax, and where the placement of each preset is recorded (`python -m sim.fpga ... --link uart`'s
# fpga_report.json, copied there with the chip's key).
TOKENS_PER_SECOND_TARGET = 62_500
PLACED_REPORTS = Path(__file__).resolve().parent.parent / "docs" / "figures"


def placed_fmax_mhz(config) -> tuple[float, str] | None:
    """The Fmax (MHz) and the report's name of the recorded place and route of the served board with exactly the
    chip `config` (``docs/figures/fpga-<preset>.json`` whose ``chip`` is ``config.key()``), or None."""
    for path in sorted(PLACED_REPORTS.glob("fpga-*.json")):
        rep = json.loads(path.read_text())
        if rep.get("chip") == config.key() and rep.get("link"):
            return min(f["achieved_mhz"] for f in rep["fmax"].values()), path.name
    return None


def resident_targets(config=None, out=None) -> dict:
    """Serve the default trace in resident mode at max batch 4 and 8 on the chip `config` (``fast`` when it is
    None or has no GATHER/SCATTER) on the reference machine; print each figure against `RESIDENT_TARGETS` and
    return ``{max_batch: cycles per generated token}``."""
    from hdl.config import PRESETS
    out = out or sys.stdout
    chip = config if config is not None and config.gather else PRESETS["fast"]
    per = {}
    for batch, goals in RESIDENT_TARGETS.items():
        a = build_parser().parse_args(TARGET_TRACE + ["--mode", "resident", "--chip", chip.spec(),
                                                      "--max-batch", str(batch)])
        res = serve(a)
        res.pop("model")
        r = summary(res)
        per[batch] = r["cycles_per_token"]
        verdicts = ", ".join(f"<= {g:,}: {'met' if per[batch] <= g else 'NOT met'}" for g in goals)
        print(f"resident mode, --chip {chip.spec()} --max-batch {batch}, same trace: {per[batch]:,.1f} chip "
              f"cycles per generated token ({r['total_cycles']:,} cycles, {r['tokens_generated']} tokens, prompt "
              f"rows included; the load program's {r['load_cycles']:,} once apart) (targets {verdicts})", file=out)
    placed = placed_fmax_mhz(chip)
    if placed is None:
        print(f"tokens per second: no recorded place and route of the served board with this chip (python -m "
              f"sim.fpga --board ulx3s-85f --chip {chip.spec()} --link uart, its report in "
              f"docs/figures/fpga-<name>.json)", file=out)
    else:
        mhz, name = placed
        rate = mhz * 1e6 / per[4]
        verdict = "met" if rate >= TOKENS_PER_SECOND_TARGET else "NOT met"
        print(f"tokens per second at batch 4 on the ULX3S-85F at the placed Fmax {mhz:.2f} MHz (docs/figures/{name}): "
              f"{rate:,.0f} (target >= {TOKENS_PER_SECOND_TARGET:,}: {verdict}); at 25 MHz: {25e6 / per[4]:,.0f}",
              file=out)
    return per


def serve_targets(config=None, out=None) -> dict:
    """Measure the serving targets on the reference machine (cycle counts are exact, so the figures are
    deterministic) and print them as ratios; returns them."""
    out = out or sys.stdout
    extra = [] if config is None else ["--chip", config.spec()]

    def run(args):
        a = build_parser().parse_args(TARGET_TRACE + extra + args)
        res = serve(a)
        res.pop("model")
        return summary(res)
    rates, ratios = {}, {}
    for prefill in ("full", "cache"):
        r = {b: run(["--max-batch", str(b), "--prefill", prefill])["tokens_per_mcycle"] for b in (1, 2, 4, 8)}
        rates[prefill], ratios[prefill] = r, r[4] / r[1]
        print(f"throughput, book mode, --prefill {prefill}, trace {' '.join(TARGET_TRACE + extra)}: tokens per "
              f"million cycles " + ", ".join(f"batch {b}: {t}" for b, t in r.items()), file=out)
        print(f"  batch 4 / batch 1 = {ratios[prefill]:.3f}; batch 2: {r[2] / r[1]:.3f}, batch 8: "
              f"{r[8] / r[1]:.3f}", file=out)
    # the target is defined on the rows (every prompt row a whole-model row); with cache-only prompt
    # rows batch 1 is itself much faster, so batching has less shared work left to share
    ratio = ratios["full"]
    print(f"  target: batch 4 / batch 1 >= 2.2 with every prompt row a full row: {ratio:.3f}, "
          f"{'met' if ratio >= 2.2 else 'NOT met'} (with --prefill cache, the default: {ratios['cache']:.3f}, "
          f"at {rates['cache'][4] / rates['full'][4]:.2f}x the throughput of --prefill full at batch 4)", file=out)
    mem = ["--pages", "16", "--max-batch", "8"]
    paged, contig = run(mem), run(mem + ["--alloc", "contiguous"])
    d = build_parser().parse_args(TARGET_TRACE)
    reserve = d.prompt_len[1] + d.gen_len[1] - 1
    mratio = paged["peak_running"] / contig["peak_running"]
    print(f"memory, pool of 16 pages of 4 rows, max batch 8: requests running at once with paging "
          f"{paged['peak_running']}, contiguous {contig['peak_running']} (reserving "
          f"{reserve} rows each): {mratio:.2f}x (target >= 4: {'met' if mratio >= 4 else 'NOT met'})",
          file=out)
    pre = ["--prefix-share", "0.5", "--prompt-len", "8:24"]
    on, off = run(pre), run(pre + ["--no-prefix-cache"])
    cut = 1 - on["prompt_rows_computed"] / off["prompt_rows_computed"]
    print(f"prefix cache, --prefix-share 0.5 --prompt-len 8:24: prompt rows computed {on['prompt_rows_computed']} "
          f"with, {off['prompt_rows_computed']} without ({on['prefix_hit_rows']} hit rows): {100 * cut:.1f}% fewer "
          f"(target >= 40%: {'met' if cut >= 0.4 else 'NOT met'})", file=out)
    resident = resident_targets(config, out)
    return {"tokens_per_mcycle": rates["full"], "tokens_per_mcycle_cache": rates["cache"],
            "batch4_over_batch1": ratio, "batch4_over_batch1_cache": ratios["cache"], "paged_running": paged["peak_running"],
            "contiguous_running": contig["peak_running"], "memory_ratio": mratio,
            "prompt_rows_with_cache": on["prompt_rows_computed"], "prompt_rows_without": off["prompt_rows_computed"],
            "prefix_row_cut": cut, "resident_cycles_per_token": resident[4], "resident_cycles_per_token_b8": resident[8]}


if __name__ == "__main__":
    sys.exit(guarded(main))
