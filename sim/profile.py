"""``ga2 profile``: where every cycle of a decode or a served trace goes, on the reference machine.

    python -m sim.profile --window 4 --mode resident --chip fast --json P.json --png R.png --trace T.json
    python -m sim.profile --serve --mode resident --chip fast

Prints one row per instruction class (`sim.perf.breakdown.CLASSES`) with its count, busy cycles, its ideal
under the chip's own limits (`hdl.isa.ideal_cycles`), the gap and the gap's share of the total; the classes add
up to the five counters exactly (checked). Then, per generated token: the cycles, the MAC bound at that batch
and array, the external-memory bound and the ratio to the larger. ``--json`` writes all of it, ``--png`` a
roofline (`sim.perf.roofline`), ``--trace`` the Chrome trace of the same run (`sim.timeline`).
"""
from __future__ import annotations

import argparse
import os
import sys

from sim import cli
from sim.cli import Parser, UsageError, chip_option, guarded, output_file, write_json
from sim.perf.breakdown import ProfileMismatch

__all__ = ["build_parser", "profile_decode", "profile_serve", "main"]

DESCRIPTION = (
    "Profile a decode (the options of ga2 decode that choose it) or, with --serve, a served trace (the options "
    "of ga2 serve; ga2 profile --serve --help lists them) on the reference machine, the RTL's cycles. Prints "
    "one row per instruction class (MM, MM+rq, RQC, RQ, SM, VADD, AMAX, UNPACK, LD, ST, GATHER, SCATTER, "
    "fetch/issue): count, busy cycles, the ideal under the chip's own limits (MM: MACs / the PEs its shape "
    "uses; vector units: elements / lanes; LD, ST, GATHER, SCATTER: words / port width; fetch/issue: 0), the "
    "gap and its share of the total. The classes add up to the five counters exactly (cyc_total = every "
    "class with fetch/issue, the sequencer's 2 cycles an instruction or 0 on a prefetch chip; cyc_mm = MM + MM+rq + RQC; cyc_dma = LD + ST + GATHER "
    "+ SCATTER; cyc_vec = the vector classes; n_inst = the counts but fetch/issue's), checked before anything "
    "is printed. Then per generated token: cycles, the MAC bound (MACs / (rows the batch fills x array)), the "
    "external-memory bound (EXT words / words a cycle) and the ratio of the cycles to the larger. A resident "
    "load program is reported apart, not in the table.")
EXAMPLE = ("python -m sim.profile --window 4 --mode resident --chip fast --json P.json --png R.png --trace T.json\n"
           "python -m sim.profile --window 4 --steps 8\n"
           "python -m sim.profile --serve --mode resident --chip fast --max-batch 8")

# the options of ga2 serve that say which trace is served and how: the profile takes these; every other option of
# ga2 serve's parser (the simulator, the board, several chips, figures, replays, what a later version adds) is
# hidden from --help and refused when given, with its reason if it is known here
_SERVE_KEPT = {"help", "requests", "seed", "arrival", "prompt_len", "gen_len", "prefix_share", "max_batch",
               "max_batched_tokens", "stop", "temperature", "top_k", "n", "policy", "priorities", "window", "sinks",
               "page", "pages", "alloc", "no_prefix_cache", "prefill", "mode", "chip", "model", "seed_model", "lat",
               "json", "trace"}
_ONE_CHIP = "the profile covers one engine on one chip"
_REFUSED_WHY = {"sim": "the profile runs on the reference machine", "port": "the profile runs on the reference machine",
                "chips": _ONE_CHIP, "cluster": _ONE_CHIP, "workers": _ONE_CHIP, "route": _ONE_CHIP,
                "order": _ONE_CHIP, "kill_chip": _ONE_CHIP, "no_verify": "the profile runs no replays",
                "out": "ga2 serve's figures; the profile draws its roofline with --png"}


JSON_HELP = "write the profile as JSON: the classes, the counters, every run's figures and the per-token figures"


def _output_options(p, trace_help: str) -> None:
    """--json (unless the parser has it: ga2 serve's), --png, and --trace when `trace_help` is given."""
    if "--json" not in p._option_string_actions:
        p.add_argument("--json", type=output_file, default=None, metavar="PATH", help=JSON_HELP)
    p.add_argument("--png", type=output_file, default=None, metavar="R.png",
                   help="draw a roofline: achieved MACs per cycle against arithmetic intensity (MACs per "
                        "external-memory word), one point per program run (its tokens) and one per instruction "
                        "class, the compute and memory roofs drawn (needs matplotlib)")
    if trace_help:
        p.add_argument("--trace", type=output_file, default=None, metavar="FILE.json", help=trace_help)


def _serve_parser() -> Parser:
    from sim.serve import build_parser as serve_parser
    p = serve_parser()
    p.prog = cli.invoked_as or "python -m sim.profile"
    p.description = DESCRIPTION
    p.epilog = "example:\n" + "\n".join("  " + ln for ln in EXAMPLE.splitlines())
    for action in p._actions:
        if action.dest not in _SERVE_KEPT:
            action.help = argparse.SUPPRESS
        elif action.dest == "json":
            action.help = JSON_HELP
    for group in p._action_groups:          # the board's group has no option left to show
        if group._group_actions and all(x.help is argparse.SUPPRESS for x in group._group_actions):
            p._action_groups.remove(group)
    p.add_argument("--serve", action="store_true", help="profile a served trace (the options above are ga2 serve's)")
    _output_options(p, "")
    return p


def build_parser(serve: bool = False) -> Parser:
    """The parser of the decode form, or with `serve` of the served-trace form (ga2 serve's options)."""
    if serve:
        return _serve_parser()
    from sim.decode import decode_options, host_options, mode_options
    p = Parser("python -m sim.profile", DESCRIPTION, EXAMPLE)
    p.add_argument("--serve", action="store_true",
                   help="profile a served trace instead of a decode, with the options of ga2 serve (ga2 profile "
                        "--serve --help)")
    decode_options(p)
    host_options(p)
    chip_option(p, help="the chip the programs are compiled for and the reference machine models")
    mode_options(p)
    _output_options(p, "also write the timeline of the same run to FILE.json (Chrome trace-event JSON for "
                       "ui.perfetto.dev or chrome://tracing, as ga2 decode --trace): the load program, then the "
                       "steps one after another, a track for the sequencer and one per unit, time in chip cycles")
    return p


def _check_outputs(a) -> None:
    paths = [os.path.abspath(x) for x in (a.json, a.png, a.trace) if x]
    if len(set(paths)) < len(paths):
        raise UsageError(f"--json, --png and --trace must name different files, got {' and '.join(paths)}")
    if a.png:
        from sim.perf.roofline import pyplot
        pyplot()                            # a missing matplotlib is refused before the run


# ---- the two workloads: runs on the traced reference machine ---------------------------------------------

def profile_decode(a) -> dict:
    """Run the decode of parsed options `a` on the traced reference machine; returns the profile document
    (`sim.perf.report.profile_document`) with the trace document under ``"_trace"`` when ``a.trace``."""
    from sim.decode import make_decoder, run_labels
    from sim.perf.report import profile_document
    from sim.timeline import TracingBackend
    tracer = TracingBackend(None, a.chip)
    chip, _ = make_decoder(a, tracer)
    tokens, recs = chip.generate(a.start, a.steps)
    runs = tracer.runs
    first = len(runs) - len(recs)
    if first not in (0, 1) or [c for _, _, c in runs[first:]] != [list(map(int, r["counters"])) for r in recs]:
        raise ProfileMismatch(f"the decode's {len(recs)} steps do not match the {len(runs)} runs traced")
    labels = run_labels(len(runs), recs)
    steps = [{"L": r["L"], "ctx": r["ctx"], "tok": int(r["tok"])} for r in recs]
    w = "none" if a.window is None else a.window
    what = (f"decode, window {w}, {a.steps} steps from token {a.start}, {a.model} model, mode {a.mode}, pages of "
            f"{a.page} rows (pool {a.pages})")
    doc = profile_document(a.chip, runs, labels, first, len(recs), what, steps=steps)
    doc["tokens"] = [int(t) for t in tokens]
    if a.trace:
        from sim.timeline import build_events, check_against_counters, trace_document
        events = build_events(a.chip, runs, labels)
        check_against_counters(events, [c for _, _, c in runs])
        doc["_trace"] = trace_document(a.chip, events, f"ga2 profile: {what}")
    return doc


def profile_serve(a) -> dict:
    """Serve the trace of parsed options `a` (ga2 serve's) on the traced reference machine; returns the
    profile document, with the trace document under ``"_trace"`` when ``a.trace``."""
    from sim.perf.report import profile_document
    from sim.serve import serve, summary
    from sim.timeline import TracingBackend, recording_engine, serve_run_labels, serve_trace_document
    tracer = TracingBackend(None, a.chip)
    res = serve(a, backend=tracer, engine_cls=recording_engine(tracer))
    e = res.pop("engine")
    res.pop("model")
    s = summary(res)
    runs = tracer.runs
    first = e.tl_steps[0]["runs"][0] if e.tl_steps else len(runs)
    if sum(int(c[0]) for _, _, c in runs[first:]) != res["total_cycles"]:
        raise ProfileMismatch(f"the traced runs do not add up to the engine's {res['total_cycles']:,} cycles")
    w = "none" if a.window is None else a.window
    what = (f"served trace, {a.requests} requests (seed {a.seed}), max batch {a.max_batch}, window {w}, "
            f"prefill {a.prefill}, mode {a.mode}")
    if not s["tokens_generated"]:
        raise UsageError("the trace generated no token: nothing to profile per token")
    doc = profile_document(a.chip, runs, serve_run_labels(len(runs), e.tl_steps, a.mode), first,
                           s["tokens_generated"], what)
    doc["serve"] = {k: s[k] for k in ("requests_finished", "refused", "tokens_generated", "total_cycles",
                                      "engine_steps", "preemptions", "prompt_rows_computed", "cycles_per_token")}
    if a.trace:
        doc["_trace"] = serve_trace_document(a.chip, runs, e, a.mode, f"ga2 profile: {what}")
    return doc


def main(argv=None, out=None) -> int:
    out = out or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    serving = "--serve" in argv
    parser = build_parser(serving)
    a = parser.parse_args(argv)
    if serving:
        for action in parser._actions:
            dest = action.dest
            if dest not in _SERVE_KEPT | {"serve", "png"} and getattr(a, dest, action.default) != action.default:
                why = _REFUSED_WHY.get(dest, "the profile serves one trace on one engine on the reference machine")
                given = action.option_strings[0] + ("" if action.nargs == 0 else f" {getattr(a, dest)}")
                raise UsageError(f"{given} is ga2 serve's option, not the profile's: {why}")
        from sim.serve import check_args
        check_args(a)
    else:
        from sim.decode import check_decode_args
        check_decode_args(a)
    _check_outputs(a)
    from sim.perf.report import print_profile
    doc = profile_serve(a) if serving else profile_decode(a)
    trace = doc.pop("_trace", None)
    doc["command"] = ["ga2", "profile", *argv]
    print_profile(doc, out)
    if a.json:
        write_json(a.json, doc, out=out)
    if a.png:
        from sim.perf.roofline import draw_roofline
        draw_roofline(a.png, doc, out=out)
    if trace is not None:
        write_json(a.trace, trace, out=out)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
