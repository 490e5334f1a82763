"""Simulator benchmark: the same workload on every available backend, timed.

    python -m sim.bench [--window 4] [--steps 32] [--sims reference,amaranth,verilator] [--random] [--trace T.json]

The workload is the paged decode (host.paged, window 4, 32 steps by default): its programs and images
are recorded once on the reference machine, then replayed on each backend, whose results must equal the
reference's. ``--random`` (or a missing host.paged) uses random programs from sim.verify.progen of about the
same total cycles instead. Prints per backend: wall time, cycles simulated per second, and the ratio of
its wall time to the reference machine's. Verilator's build is done (or found in the cache) beforehand
and reported apart; its in-model rate counts only the edges from start to halt.

``--serve --url URL`` is the load generator instead (`host.serving.loadgen`): ``ga2 serve``'s trace sent to
a running OpenAI-compatible server (``ga2 serve --http``), Poisson arrivals, TTFT, TPOT and end-to-end
latency at p50, p90 and p99, output tokens per second, failures by HTTP status, --json and --png.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

from sim.backends import MAX_LAT, BackendUnavailable, SimError, first_difference, get_backend
from sim.backends.code_cache import default_cache_dir
from sim.cli import (Parser, Progress, UsageError, backend_options, board_options, chip_option, guarded, int_range,
                     output_file, window, write_json, write_png)
from sim.options import fraction, span
from sim.plot import pyplot

from host.paged import MAX_CONTEXT     # the book's context limit: the decode's steps without a window

__all__ = ["decode_jobs", "resident_jobs", "random_jobs", "bench", "mac_count", "mode_figures", "compare_modes",
           "board_figures", "trace_jobs", "request_rate", "server_url", "loadgen_options", "serve_load",
           "latency_figure", "build_parser", "main"]


class _Recorder:
    """A backend that runs the reference machine and remembers every (program, image, lat) it was given."""
    name = "recorder"

    def __init__(self, inner):
        self.inner = inner
        self.jobs = []

    def run(self, program, image, lat=8, scratchpad=None):
        # a resident-mode run starts from the scratchpad the previous one left: the job carries it
        if scratchpad is None:
            self.jobs.append((list(program), list(image), lat))
            return self.inner.run(program, image, lat)
        self.jobs.append((list(program), list(image), lat, list(scratchpad)))
        return self.inner.run(program, image, lat, scratchpad=scratchpad)


def decode_jobs(window, steps: int, lat: int = 8, start: int = 0, config=None):
    """The (program, image, lat) jobs of a paged decode of the structured tiny LM for the chip `config`
    (default: the book's), recorded on the reference."""
    from hdl.config import BOOK
    from host import tiny_lm as T
    from host.paged import PagedChip
    config = BOOK if config is None else config
    rec = _Recorder(get_backend("reference", config=config))
    chip = PagedChip(T.make_model("structured", 1), steps, window, backend=rec, lat=lat, config=config)
    chip.generate(start, steps)
    return rec.jobs


def resident_jobs(window, steps: int, lat: int = 8, start: int = 0, config=None):
    """The jobs of the same decode in resident mode (host.resident: the load program, then one step
    program a step, each job carrying the scratchpad it starts from), recorded on the reference."""
    from host import tiny_lm as T
    from host.resident import ResidentChip
    rec = _Recorder(get_backend("reference", config=config))
    chip = ResidentChip(T.make_model("structured", 1), steps, window, backend=rec, lat=lat, config=config)
    chip.generate(start, steps)
    return rec.jobs


def random_jobs(total_cycles: int, seed: int = 1, ext: int = 8192, lat: int = 8, config=None):
    """Random programs (sim.verify.progen, drawn for the book's limits) until their reference cycle count on the
    chip `config` reaches `total_cycles`."""
    from sim.verify.progen import random_program
    ref = get_backend("reference", config=config)
    rng = random.Random(seed)
    jobs, cycles = [], 0
    while cycles < total_cycles:
        program, image = random_program(rng, ext)
        cycles += ref.run(program, image, lat).cycles
        jobs.append((program, image, lat))
    return jobs


def _run(backend, job):
    p, i, lat = job[:3]
    return backend.run(p, i, lat) if len(job) < 4 else backend.run(p, i, lat, scratchpad=job[3])


def trace_jobs(jobs, config, what: str = "", resident: bool = False) -> dict:
    """The timeline (`sim.timeline`) of `jobs` run one after another on the reference machine for the chip
    `config`, checked against each run's counters; with `resident` the first job is named as the load
    program."""
    from sim.backends import program_words
    from sim.backends.reference import ReferenceMachine
    from sim.timeline import build_events, check_against_counters, trace_document
    ref = ReferenceMachine(trace=True, config=config)
    runs = []
    for job in jobs:
        t = _run(ref, job)
        runs.append((program_words(job[0]), t.trace, list(t.counters)))
    labels = [f"job {i}" for i in range(len(runs))]
    if resident and labels:
        labels[0] = "load (weights)"
    events = build_events(config, runs, labels)
    check_against_counters(events, [c for _, _, c in runs])
    return trace_document(config, events, what)


def _run_all(backend, jobs):
    if getattr(backend, "name", None) == "verilator":
        return backend.run_many(jobs)
    out = []
    with Progress(f"{getattr(backend, 'name', 'simulator')}", unit="program") as bar:   # amaranth: ~30 s
        for job in jobs:
            out.append(_run(backend, job))
            bar(len(out), len(jobs))
    return out


def bench(jobs, sims, repeat: int = 3, out=None, config=None, options=None) -> dict:
    """Time `jobs` on each simulator of `sims` (best of `repeat` for the fast ones), every one simulating
    the chip `config` (default: the book's); prints a table and returns {"jobs", "cycles", "backends":
    {sim: figures}}. `options` maps a simulator to its backend's arguments (the board's port); the
    backend objects are in ``"objects"``."""
    out = out or sys.stdout
    reference = get_backend("reference", config=config)
    ref_wall = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        expected = [_run(reference, job) for job in jobs]
        ref_wall = min(ref_wall, time.perf_counter() - t0)
    cycles = sum(r.cycles for r in expected)
    rows, objects = {}, {}
    for name in sims:
        extra, built = "", 0.0
        try:
            if name == "reference":
                be, got, wall = reference, expected, ref_wall
            else:
                be = get_backend(name, config=config, **(options or {}).get(name, {}))
                objects[name] = be
                if name == "verilator":
                    tb = time.perf_counter()
                    for key in sorted({(len(job[1]), job[2]) for job in jobs}):
                        be.model(*key)
                    spent = time.perf_counter() - tb
                    extra = (f"model built in {spent:.1f} s (cold build; not in the figures)" if be.builds else
                             f"model found in the cache in {spent:.1f} s (not in the figures)")
                if name == "amaranth":
                    # built first and timed apart, but counted in the wall time as before (the figure the
                    # targets name includes it): the build is then printed beside the simulation's own rate
                    tb = time.perf_counter()
                    for key in sorted({(len(job[1]), job[2]) for job in jobs}):
                        be.build(*key)
                    built = time.perf_counter() - tb
                wall, in_model = float("inf"), float("inf")
                # the Python simulator is far too slow to repeat; the others take the best of `repeat`
                for _ in range(repeat if name == "verilator" else 1):     # amaranth and a board: once
                    t = time.perf_counter()
                    got = _run_all(be, jobs)
                    wall = min(wall, time.perf_counter() - t + built)
                    in_model = min(in_model, getattr(be, "last_run_seconds", float("inf")))
                if name == "amaranth":
                    simulating = wall - built
                    cache_dir = default_cache_dir()
                    cache = (f"its code cached in {cache_dir}" if cache_dir is not None
                             else "its code cache off by $GA2_PYSIM_CACHE")
                    extra = (f"of which {built:.2f} s building the simulator ({cache}: "
                             f"docs/pysim-engine.md) and {simulating:.2f} s simulating, "
                             f"{cycles / simulating if simulating > 0 else float('inf'):,.0f} cycles/s")
        except BackendUnavailable as e:
            print(f"{name:>10}: not available ({e})", file=out)
            continue
        diff = next((f"job {k}: {d}" for k, (a, b) in enumerate(zip(expected, got))
                     if (d := first_difference(a, b)) is not None), None)
        row = {"wall_s": wall, "cycles_per_s": cycles / wall if wall > 0 else float("inf"),
               "ratio_to_reference": wall / ref_wall if ref_wall > 0 else float("inf"),
               "identical": diff is None}
        if name == "amaranth":
            row["build_s"] = built
            row["simulating_cycles_per_s"] = cycles / (wall - built) if wall > built else float("inf")
        if name == "verilator":
            row["in_model_s"] = in_model
            row["in_model_cycles_per_s"] = cycles / in_model if in_model > 0 else float("inf")
            extra += (f"; in-model {row['in_model_cycles_per_s']:,.0f} cycles/s ({in_model:.3f} s from start "
                      f"pulses to halts; the rest of the wall time is process start, loading and read-back)")
        rows[name] = row
        print(f"{name:>10}: {wall:9.3f} s wall  {row['cycles_per_s']:>14,.0f} cycles/s  "
              f"x{row['ratio_to_reference']:<9.2f} the reference's time  "
              f"{'identical to the reference' if diff is None else 'DIFFERS: ' + diff}", file=out)
        if extra:
            print(f"{'':>12}{extra}", file=out)
    return {"jobs": len(jobs), "cycles": cycles, "backends": rows, "objects": objects}


def mac_count(graph) -> int:
    """Multiply-accumulates of one forward pass of a compiler graph: M*K*N summed over its matmuls."""
    total = 0
    for n in graph.nodes:
        if n.op == "matmul":
            a = graph.nodes[n.ins[0]]
            total += a.rows * a.cols * n.cols
    return total


def mode_figures(recs, ctx: int, array: int, macs: int) -> dict:
    """Cycle figures of one decode's records: the worst step at context `ctx`, its breakdown (mm, dma,
    vec and the sequencer's own cycles, `hdl.isa.seq_cycles`: 2 an instruction for fetch and issue and 2 for
    the HALT on the book's chip, 2 a run on a prefetch chip), the total and
    the ratio of that step to the MAC bound (`macs` / array^2 cycles: every PE busy every cycle)."""
    at = [r for r in recs if r["ctx"] == ctx]
    worst = max(at, key=lambda r: r["counters"][0])
    c = worst["counters"]
    bound = macs / (array * array)
    return {"step_cycles": c[0], "mm": c[1], "dma": c[2], "vec": c[3], "instructions": c[4],
            "overhead": c[0] - c[1] - c[2] - c[3], "total": sum(r["counters"][0] for r in recs),
            "host_words": max(r.get("host_words", len(r.get("image") or ())) for r in at),
            "mac_bound": bound, "ratio_to_mac_bound": c[0] / bound}


def compare_modes(window, steps: int, lat: int, config, out=None) -> dict:
    """Decode in book mode (on the book's chip and on `config`) and in resident mode (on `config`) on the
    reference machine; print the figures side by side and return them (integers checked equal)."""
    from hdl.config import BOOK
    from host import tiny_lm as T
    from host.paged import PagedChip
    from host.resident import ResidentChip
    from host.window import context_size
    out = out or sys.stdout
    m = T.make_model("structured", 1)
    ctx = context_size(steps, window)
    macs = mac_count(T.build_graph(m, ctx))
    runs = {}
    for label, chip_cfg, cls in (("book", BOOK, PagedChip), ("book", config, PagedChip),
                                 ("resident", config, ResidentChip)):
        host = cls(m, steps, window, backend=get_backend("reference", config=chip_cfg), lat=lat, config=chip_cfg)
        toks, recs = host.generate(0, steps)
        runs[(label, chip_cfg.spec())] = (toks, recs, chip_cfg, host)
    base_toks, base_recs = runs[("book", BOOK.spec())][:2]
    rows = {}
    print(f"one step at context {ctx} ({macs:,} MACs per token, from the model's matmuls); window "
          f"{'none' if window is None else window}, {steps} steps, LAT {lat}, reference machine", file=out)
    print(f"{'mode':>9} {'chip':>24} {'step':>6} {'mm':>6} {'dma':>6} {'vec':>5} {'instr':>6} {'words':>6} "
          f"{'MAC bound':>10} {'ratio':>6} {'32-step total':>14}  integers", file=out)
    for (label, spec), (toks, recs, chip_cfg, host) in runs.items():
        f = mode_figures(recs, ctx, chip_cfg.array, macs)
        same = toks == base_toks and all(a["logits_int"] == b["logits_int"] for a, b in zip(recs, base_recs))
        f["identical"] = same
        rows[f"{label} {spec}"] = f
        print(f"{label:>9} {spec:>24} {f['step_cycles']:6d} {f['mm']:6d} {f['dma']:6d} {f['vec']:5d} "
              f"{f['overhead']:6d} {f['host_words']:6d} {f['mac_bound']:10.1f} {f['ratio_to_mac_bound']:6.1f} "
              f"{f['total']:14,d}  {'identical' if same else 'DIFFER'}", file=out)
        if label == "resident":
            lr = host.load_record
            print(f"{'':>9} {'':>24} plus the load program once: {lr['counters'][0]:,} cycles, "
                  f"{lr['host_words']:,} words", file=out)
    print("step: the worst step at that context (cycles); mm, dma, vec: busy cycles of the units; instr: the "
          "sequencer's own cycles (fetch, issue: 2 per instruction + 2 for the HALT, or 2 a run on a prefetch "
          "chip, docs/prefetch.md); words: host words written for the step; MAC bound: MACs / array^2 cycles; "
          "ratio: step / MAC bound", file=out)
    return rows


def _step_bytes(log) -> dict:
    """Mean host bytes per run of `log` entries (`BoardBackend.run_log`), each way and in all."""
    n = max(len(log), 1)
    out = sum(r["bytes_out"] for r in log) / n
    back = sum(r["bytes_in"] for r in log) / n
    return {"runs": len(log), "bytes_out": out, "bytes_in": back, "bytes": out + back,
            "frames": sum(r["frames"] for r in log) / n, "retries": sum(r["retries"] for r in log)}


def board_figures(board, config, window, steps: int, lat: int, fmax_hz=None, out=None) -> dict:
    """The board's link figures: host bytes per decode step in book mode and (on a gather chip) resident
    mode, in steady state (the runs after the first of each decode, which writes everything the board
    does not hold yet); the link's measured payload bytes per second (`BoardBackend.measure_link`); and the
    tokens per second the board would give at each mode: the lower of the link-bound figure (a step's
    bytes at the measured line rate) and the chip-bound one (its clock over a step's cycles). Prints them
    and returns them."""
    out = out or sys.stdout
    modes = [("book", decode_jobs(window, steps, lat, config=config))]
    if config.gather:
        modes.append(("resident", resident_jobs(window, steps, lat, config=config)))
    hello = board.connect()
    clk = fmax_hz or hello.clk_hz
    figures = {"clk_hz": clk, "modes": {}}
    per_mode = {}
    for mode, jobs in modes:
        start = len(board.run_log)
        for job in jobs:
            _run(board, job)
        log = board.run_log[start:]
        first = 1                                   # book: the first step; resident: the load program
        steady = log[first + (mode == "resident"):] or log[first:]
        per_mode[mode] = (_step_bytes(log[:first]), _step_bytes(steady),
                          sum(r["cycles"] for r in steady) / max(len(steady), 1))
    link = board.measure_link()
    rate = link["line_bytes_per_s"]
    nominal = hello.baud / 10                       # 8N1: ten bit times a byte, one way
    figures["link"] = link
    print(f"board link ({board.port}; the board's clock {hello.clk_hz / 1e6:g} MHz, {hello.baud:,} baud): payload "
          f"{link['payload_out_per_s']:,.0f} bytes/s to the board and {link['payload_in_per_s']:,.0f} from it "
          f"({link['words']} words each way in frames of up to {hello.max_payload} bytes); line "
          f"{rate:,.0f} bytes/s both ways together (the nominal line: {nominal:,.0f} bytes/s each way; on a "
          f"simulated board the measured rates are the simulation's)", file=out)
    for mode, (first, st, cycles) in per_mode.items():
        link_tps = rate / st["bytes"] if st["bytes"] else float("inf")
        nominal_tps = nominal / st["bytes"] if st["bytes"] else float("inf")
        chip_tps = clk / cycles if cycles else float("inf")
        board_tps = min(link_tps, chip_tps)
        both = 1 / (1 / link_tps + 1 / chip_tps)
        what = "the first step" if mode == "book" else "the load program"
        figures["modes"][mode] = {"first_bytes": first["bytes"], "step_bytes_out": st["bytes_out"],
                                  "step_bytes_in": st["bytes_in"], "step_frames": st["frames"],
                                  "step_cycles": cycles,
                                  "link_tokens_per_s": link_tps, "chip_tokens_per_s": chip_tps,
                                  "tokens_per_s": board_tps, "serial_tokens_per_s": both,
                                  "nominal_link_tokens_per_s": nominal_tps, "retries": st["retries"]}
        print(f"{mode:>9} mode: {st['bytes']:,.0f} host bytes per step ({st['bytes_out']:,.0f} to the board, "
              f"{st['bytes_in']:,.0f} back, in {st['frames']:.1f} exchanges; {what}: {first['bytes']:,.0f}), "
              f"{cycles:,.0f} cycles per step; tokens "
              f"per second: link-bound {link_tps:,.1f} (at the nominal line {nominal_tps:,.1f}), chip-bound "
              f"{chip_tps:,.1f} at {clk / 1e6:g} MHz: the board would give {board_tps:,.1f} "
              f"({'link' if link_tps < chip_tps else 'chip'}-bound; {both:,.1f} with transfer and run one after "
              f"the other)", file=out)
    print(board.link_summary(), file=out)
    return figures


# ---- --serve --url: the load generator against a running server --------------------------------------

LOADGEN_DEFAULTS = {"requests": 100, "rate": 50.0, "prompt_len": (2, 16), "gen_len": (2, 16), "prefix_share": 0.0,
                    "seed": 3}


def request_rate(text: str) -> float:
    """An argparse type: requests per second, a number > 0 or ``inf`` (every request at once)."""
    try:
        r = float(text)
    except ValueError:
        r = -1.0
    if not r > 0:               # also refuses nan
        raise argparse.ArgumentTypeError(f"must be requests per second > 0, or inf, got {text!r}")
    return r


def server_url(text: str) -> str:
    """An argparse type: a server's base URL (`host.serving.loadgen.check_url`)."""
    from host.serving.loadgen import LoadGenError, check_url
    try:
        return check_url(text)
    except LoadGenError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--url ")) from None


def loadgen_options(p) -> None:
    """The options of ``--serve --url`` (each refused without it)."""
    d = LOADGEN_DEFAULTS
    g = p.add_argument_group("the load generator (--serve --url URL)")
    g.add_argument("--url", type=server_url, default=None, metavar="URL",
                   help="with --serve: send the trace to the OpenAI-compatible server at URL (ga2 serve --http) "
                        "and time it, instead of the targets")
    g.add_argument("--requests", type=int_range(1, 10000), default=None, metavar="N",
                   help=f"requests in the trace (default {d['requests']})")
    g.add_argument("--rate", type=request_rate, default=None, metavar="R",
                   help=f"Poisson arrivals of R requests per second, drawn from --seed; inf sends all at once "
                        f"(default {d['rate']:g})")
    g.add_argument("--prompt-len", type=span, default=None, metavar="A:B",
                   help="prompt tokens, A..B, as ga2 serve's trace (default 2:16)")
    g.add_argument("--gen-len", type=span, default=None, metavar="A:B",
                   help="max_tokens of each request, A..B, as ga2 serve's trace (default 2:16)")
    g.add_argument("--prefix-share", type=fraction, default=None, metavar="F",
                   help="fraction of prompts that begin with a shared prefix, as ga2 serve's trace (default 0)")
    g.add_argument("--seed", type=int, default=None, metavar="S",
                   help=f"trace seed: ga2 serve --seed S has the same prompts (default {d['seed']})")
    g.add_argument("--json", type=output_file, default=None, metavar="PATH",
                   help="write the summary and every request (prompt, tokens, times, error) as JSON (default: none)")
    g.add_argument("--png", type=output_file, default=None, metavar="PATH",
                   help="draw the latency distribution (TTFT, TPOT, end-to-end) to PATH (default: none)")
    from sim.serving.http_serve import API_KEY_ENV
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"send Authorization: Bearer KEY (the server's --api-key; default: the environment variable "
                        f"{API_KEY_ENV}, as the server's, else none)")


def serve_load(a, out=None) -> int:
    """``--serve --url``: ``ga2 serve``'s trace sent to the server at ``a.url`` (`host.serving.loadgen`); prints
    the percentiles and the errors, writes --json and --png; exit status 1 if a request failed."""
    from host.serving import loadgen as L
    from sim.serving.http_serve import API_KEY_ENV
    out = out or sys.stdout
    d = LOADGEN_DEFAULTS
    key = a.api_key if a.api_key is not None else os.environ.get(API_KEY_ENV) or None
    n, rate, seed = (d[k] if getattr(a, k) is None else getattr(a, k) for k in ("requests", "rate", "seed"))
    plen, glen, share = (d[k] if getattr(a, k) is None else getattr(a, k)
                         for k in ("prompt_len", "gen_len", "prefix_share"))
    if a.png:
        pyplot("--png")                 # a missing matplotlib is said before any request is sent
    try:
        model = L.probe(a.url, key)
    except L.LoadGenError as e:
        raise UsageError(str(e)) from None
    prompts = L.trace_prompts(n, seed, plen, glen, share)
    times = L.arrival_times(n, rate, seed)
    how = "all at once" if math.isinf(rate) else f"Poisson at {rate:g} requests/s"
    print(f"GA-2 load generator: {n} streaming completions to {a.url} (model {model}), {how}; ga2 serve's "
          f"trace of seed {seed}: prompts {plen[0]}:{plen[1]} tokens, max_tokens {glen[0]}:{glen[1]}, prefix "
          f"share {share:g}", file=out)
    with Progress(f"requests to {a.url}", unit="request") as bar:
        records, duration = L.run_load(a.url, prompts, times, model, key, progress=bar)
    s = L.summarize(records, duration)
    for line in L.report_lines(s):
        print(line, file=out)
    if a.json:
        write_json(a.json, {"url": a.url, "model": model, "requests": n, "rate": "inf" if math.isinf(rate) else rate,
                            "seed": seed, "prompt_len": list(plen), "gen_len": list(glen), "prefix_share": share,
                            "summary": s, "records": records}, out=out)
    if a.png:
        latency_figure(a.png, records, s, f"{n} requests to {a.url}, {how}", out)
    return 0 if s["failed"] == 0 else 1


def latency_figure(path, records, s, title, out=None) -> None:
    """The latency distribution of a load run: a histogram each of TTFT, TPOT and end-to-end latency (the
    succeeded requests), with their p50, p90 and p99 marked; written atomically to `path`."""
    from host.serving.loadgen import PERCENTILES, request_tpot
    plt = pyplot("--png")
    ok = [r for r in records if r["error_kind"] is None]
    series = (("time to first token", "ttft_s", [r["ttft_s"] for r in ok if r["ttft_s"] is not None]),
              ("time per output token", "tpot_s", [t for t in map(request_tpot, ok) if t is not None]),
              ("end-to-end latency", "e2e_s", [r["e2e_s"] for r in ok]))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (label, key, values) in zip(axes, series):
        ax.hist(values, bins=30, color="tab:blue", alpha=0.8)
        for p, style in zip(PERCENTILES, (":", "--", "-")):
            v = s[key][f"p{p}"]
            if v is not None:
                ax.axvline(v, color="tab:red", linestyle=style, label=f"p{p} {v:.3f} s")
        ax.set_xlabel(f"{label} (s)")
        ax.set_ylabel("requests")
        if values:
            ax.legend(fontsize=8)
    fig.suptitle(f"{title}: {s['succeeded']} succeeded, {s['failed']} failed")
    fig.tight_layout()
    write_png(path, fig, out=out)


LOADGEN_ONLY = ("requests", "rate", "prompt_len", "gen_len", "prefix_share", "seed", "json", "png", "api_key")


def check_loadgen_args(a) -> None:
    """The load generator's options go with --serve --url and nothing of the simulator benchmark."""
    given = [k for k in LOADGEN_ONLY if getattr(a, k) is not None]
    if a.url is None:
        raise UsageError(f"--{given[0].replace('_', '-')} is an option of the load generator: give --serve --url URL")
    if not a.serve:
        raise UsageError(f"--url {a.url} needs --serve (the load generator against that server)")
    for flag, bad in (("--trace", a.trace), ("--random", a.random), ("--mode resident", a.mode == "resident"),
                      ("--port", a.port)):
        if bad:
            raise UsageError(f"{flag} is for the simulator benchmark, not the load generator (--url)")


def build_parser() -> Parser:
    from sim.backends import BACKENDS
    p = Parser("python -m sim.bench",
               "Run one workload (the paged decode, recorded once on the reference machine) on every asked "
               "simulator and report wall time, chip cycles per second and the ratio to the reference; every "
               "result must equal the reference's. A cold Verilator build is done first and timed apart.",
               "python -m sim.bench --sims reference,verilator --window 4 --steps 32\n"
               "python -m sim.bench --serve --url http://127.0.0.1:8123 --requests 200 --json load.json --png load.png")
    p.add_argument("--window", type=window, default=4, metavar="{none|N}", help="decode window")
    p.add_argument("--steps", type=int_range(1, MAX_CONTEXT), default=32, metavar="N",
                   help=f"decode steps, 1..{MAX_CONTEXT} (at most the chip's matrix K without a window)")
    chip_option(p, help="the chip the decode is compiled for and every simulator runs")
    p.add_argument("--lat", type=int_range(1, MAX_LAT), default=None, metavar="N",
                   help=f"external read latency in cycles, 1..{MAX_LAT} (default: the chip's lat, 8 on the "
                        f"book's chip)")
    local = ",".join(b for b in BACKENDS if b != "board")
    p.add_argument("--sims", "--sim", dest="sims", default=local, metavar="A,B",
                   help=f"comma-separated simulators, some of {', '.join(BACKENDS)} (board: the board on --port, "
                        f"with its link's figures: host bytes per step in book and resident mode, payload bytes "
                        f"per second, tokens per second)")
    board_options(p)
    p.add_argument("--fmax", type=float, default=None, metavar="MHZ",
                   help="with a board: the clock for its chip-bound tokens per second (default: the board's "
                        "own, from its HELLO)")
    p.add_argument("--repeat", type=int_range(1, 100), default=3, metavar="N",
                   help="timed runs per fast simulator, the best is reported (amaranth runs once)")
    p.add_argument("--random", action="store_true",
                   help="random programs of about the decode's total cycles instead of the decode")
    p.add_argument("--mode", choices=("book", "resident"), default="book",
                   help="book: the book's decode; resident: first the book and resident modes side by side "
                        "(cycles at the largest context with the breakdown, host words, the ratio to the MAC "
                        "bound, on the reference machine), then the resident decode's programs on the "
                        "simulators; without --chip the resident chip is the preset fast")
    p.add_argument("--serve", action="store_true",
                   help="instead: the serving targets of sim.serve as ratios (batch 1/2/4/8 throughput, paging "
                        "vs contiguous concurrency, prefix-cache row cut) and the resident cycles per generated "
                        "token at max batch 4 and 8 (on --chip if it has GATHER/SCATTER, else on fast), on the "
                        "reference machine; with --url, the load generator against a running server")
    p.add_argument("--trace", type=output_file, default=None, metavar="FILE.json",
                   help="also write a timeline to FILE.json (Chrome trace-event JSON for ui.perfetto.dev or "
                        "chrome://tracing) of the workload's programs, the same every simulator runs (the decode's "
                        "programs, with --mode resident the load program first, or --random's), one after another "
                        "as the reference machine runs them: a track for the sequencer and one per unit, a slice "
                        "per instruction, time in chip cycles. Not with --serve (ga2 serve --trace draws a served "
                        "trace)")
    loadgen_options(p)
    return p


def main(argv=None) -> int:
    from sim.backends import BACKENDS
    a = build_parser().parse_args(argv)
    if a.url is not None or any(getattr(a, k) is not None for k in LOADGEN_ONLY):
        check_loadgen_args(a)
        return serve_load(a)
    sims = [s.strip() for s in a.sims.split(",") if s.strip()]
    bad = [s for s in sims if s not in BACKENDS]
    if bad or not sims:
        raise UsageError(f"--sims must list some of {', '.join(BACKENDS)}, got {a.sims!r}")
    options = {"board": backend_options(a, "board")} if "board" in sims else {}
    if "board" not in sims:
        backend_options(a, sims[0])         # a --port without a board is refused
    if a.fmax is not None and not 0 < a.fmax <= 10_000:
        raise UsageError(f"--fmax must be a clock in MHz within 0..10000, got {a.fmax:g}")
    if a.serve and a.trace:
        raise UsageError("--trace draws the workload's programs, and --serve has none of its own: use ga2 serve "
                         "--trace for a served trace's timeline")
    if a.serve:
        from sim.serve import serve_targets
        serve_targets(a.chip)
        return 0
    wtext = "none" if a.window is None else str(a.window)
    argv_list = sys.argv[1:] if argv is None else list(argv)
    if a.mode == "resident":
        from hdl.config import PRESETS
        if not any(x == "--chip" or x.startswith("--chip=") for x in argv_list):
            a.chip = PRESETS["fast"]
        if not a.chip.gather:
            raise UsageError(f"--mode resident needs a chip with GATHER/SCATTER (gather=1), and --chip "
                             f"{a.chip.spec()} has none: use --chip fast or add gather=1")
        if a.random:
            raise UsageError("--random and --mode resident do not go together (resident mode is the decode)")
    if a.lat is None:
        a.lat = a.chip.lat

    what = None
    if a.mode == "resident":
        compare_modes(a.window, a.steps, a.lat, a.chip)
        print()
        jobs = resident_jobs(a.window, a.steps, a.lat, config=a.chip)
        what = f"resident decode (load program + one program a step), window {wtext}, {a.steps} steps"
    if what is None and not a.random:
        try:
            jobs = decode_jobs(a.window, a.steps, a.lat, config=a.chip)
            what = f"paged decode, window {wtext}, {a.steps} steps"
        except ImportError as e:
            print(f"(the decode is not available: {e}; using random programs)", file=sys.stderr)
    if what is None:
        jobs = random_jobs(231_792, ext=a.chip.ext_words, lat=a.lat, config=a.chip)
        what = f"random programs (sim.verify.progen, seed 1, EXT {a.chip.ext_words})"
    exts = sorted({len(job[1]) for job in jobs})
    print(f"workload: {what}: {len(jobs)} programs, EXT {'/'.join(map(str, exts))}, LAT {a.lat}, "
          f"chip {a.chip.spec()}")
    r = bench(jobs, sims, a.repeat, config=a.chip, options=options)
    print(f"{r['cycles']:,} chip cycles per backend")
    if a.trace:
        write_json(a.trace, trace_jobs(jobs, a.chip, f"ga2 bench: {what}", resident=a.mode == "resident"))
    if "board" in r["objects"] and "board" in r["backends"]:
        print()
        board_figures(r["objects"]["board"], a.chip, a.window, a.steps, a.lat,
                      fmax_hz=None if a.fmax is None else a.fmax * 1e6)
    if not r["backends"]:
        raise SimError(f"none of the asked simulators ({', '.join(sims)}) is available")
    return 0 if all(row["identical"] for row in r["backends"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(guarded(main))
