"""Decode tokens with the tiny LM on the GA-2 chip through the paged KV cache: the user's main command.

    python -m sim.decode --window 4                   # 32 steps, window of 4 tokens
    python -m sim.decode --window none --sim verilator --json out/none.json
    python -m sim.decode --prompt 3,1,4 --steps 8 --window 4 --sim reference   # one request of sim.serve alone

The host calibrates the quantizer over the same number of steps from all 16 start tokens (with the same
window), compiles one program per context size min(L, W), gathers the windowed cache rows through the page
table into the chip's contiguous kc/vc inputs, runs each step on the chosen simulator, and prints the
tokens, the programs compiled, the pages in use and the per-step cycle counters.
"""
from __future__ import annotations

import sys
import time

from sim.backends import MAX_LAT
from sim.cli import (Parser, Progress, UsageError, assert_option, backend_options, board_options, chip_option, guarded,
                     int_range, link_report, output_file, sim_option, window, write_json)
from sim.options import temperature, token_list

from host.paged import MAX_CONTEXT, check_decode     # the context limit and the pool's check, once
DEFAULT_SIM = "amaranth"


MAX_STEPS = 1024            # calibration decodes every step from all 16 start tokens: keep a run in minutes

TABLE_HELP = ("columns: step = L, the tokens in the cache after the step; ctx = the context the step's program "
              "attends, min(L, W); tok = the token produced; pages = pages the request holds while the step runs "
              "(its cached rows, before the new row is appended); "
              "total = the step's chip cycles; mm, dma, vec = cycles the matrix unit, the DMA engine and the vector "
              "units were busy (one unit at a time: total = mm + dma + vec + 2 per instruction for fetch and issue + 2 for the HALT, "
              "or + 2 a step on a prefetch chip, docs/prefetch.md); instr = instructions executed")


def decode_options(p) -> None:
    """Add the options that say which tokens the decode makes: ``--window``, ``--steps``, ``--start`` (this
    command's and ``ga2 profile``'s)."""
    p.add_argument("--window", type=window, default=None, metavar="{none|N}",
                   help="attend the new token and at most N-1 previous ones (default: none, full context)")
    p.add_argument("--steps", type=int_range(1, MAX_STEPS), default=32, metavar="N",
                   help=f"decode steps, i.e. tokens generated, 1..{MAX_STEPS}; without a window at most "
                        f"the chip's matrix K ({MAX_CONTEXT} on the book's chip)")
    p.add_argument("--start", type=int_range(0, 15), default=0, metavar="T", help="start token 0..15")


def host_options(p) -> None:
    """Add the options of the host's page pool and model: ``--page``, ``--pages``, ``--model``, ``--seed``."""
    p.add_argument("--page", type=int_range(1, None), default=4, metavar="P", help="cache rows per page")
    p.add_argument("--pages", type=int_range(1, None), default=64, metavar="N", help="pages in the pool")
    p.add_argument("--model", choices=("structured", "random"), default="structured",
                   help="structured: follows f(t) = 5t+3 mod 16 by design; random: random weights")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="model seed (default 1 for structured, 2 for random)")


def mode_options(p) -> None:
    """Add ``--mode book|resident`` and ``--lat``."""
    p.add_argument("--mode", choices=("book", "resident"), default="book",
                   help="book: the host writes the whole image every step (the book's chip); resident: the "
                        "weights and the KV cache stay on the chip and the host writes only the token's row "
                        "and the block table (docs/resident.md; needs a chip with gather=1, e.g. --chip fast)")
    p.add_argument("--lat", type=int_range(1, MAX_LAT), default=None, metavar="N",
                   help=f"external memory read latency in cycles, 1..{MAX_LAT} (default: the chip's lat, 8 on "
                        f"the book's chip)")


def build_parser() -> Parser:
    p = Parser(
        "python -m sim.decode",
        "Decode tokens with the tiny language model on the GA-2 chip, its KV cache held in pages and "
        "(optionally) limited to a sliding window. Prints the tokens, the programs compiled, the pages in use "
        "and the chip's five cycle counters per step.\n\n" + TABLE_HELP + ".",
        "python -m sim.decode --window 4\n"
        "python -m sim.decode --window 4 --steps 32 --sim reference --json out/w4.json --check\n"
        "python -m sim.decode --window 4 --chip array=8 --sim reference")
    decode_options(p)
    p.add_argument("--prompt", type=token_list, default=None, metavar="T1,T2,...",
                   help="feed these tokens first, then generate --steps tokens (instead of --start): one request "
                        "of sim.serve alone, with the serving engine's calibration (host.batch); JSON "
                        "logits_int has one list per generated token")
    p.add_argument("--sinks", type=int_range(0, None), default=0, metavar="S",
                   help="with --prompt and a window: also attend the first S rows (attention sinks)")
    p.add_argument("--stop", type=token_list, default=None, metavar="T1,T2,...",
                   help="with --prompt: stop at the first of these tokens generated (it is the last one)")
    p.add_argument("--temperature", type=temperature, default=0.0, metavar="T",
                   help="with --prompt: draw each token from the integer logits at temperature T (host.sampling; "
                        "0: the chip's argmax)")
    p.add_argument("--top-k", type=int_range(0, 16), default=0, metavar="K", help="with --temperature: the K largest only")
    p.add_argument("--sample-seed", type=int, default=0, metavar="S", help="with --temperature: the request's seed")
    p.add_argument("--sample", type=int_range(0, 15), default=0, metavar="J",
                   help="with --temperature: which sample of the request (sim.serve --n) to draw")
    host_options(p)
    sim_option(p, DEFAULT_SIM, help="which simulator runs the chip: the instruction-level reference machine, "
                                    "Amaranth's simulator (~40 s for 32 steps), the emitted Verilog in Verilator, "
                                    "or a board on a serial port (--port; ga2 board-sim simulates one)")
    board_options(p)
    assert_option(p)
    chip_option(p, help="the chip the programs are compiled for and the simulator runs")
    mode_options(p)
    p.add_argument("--json", type=output_file, default=None, metavar="PATH",
                   help="also write the run as JSON to PATH")
    p.add_argument("--trace", type=output_file, default=None, metavar="FILE.json",
                   help="also write a timeline to FILE.json (Chrome trace-event JSON: open it in ui.perfetto.dev or "
                        "chrome://tracing): a track for the sequencer and one per unit, one slice per instruction "
                        "named by opcode with its fields, time in chip cycles, the steps one after another. It comes "
                        "from the reference machine (the RTL's cycles), which also runs every step whatever --sim is; "
                        "with --sim verilator or amaranth, from the RTL's own trace, stopped if it differs from the "
                        "reference's")
    p.add_argument("--vcd", type=output_file, default=None, metavar="PATH",
                   help="with --sim amaranth: write a waveform of the last step's run to PATH (slow, large)")
    p.add_argument("--check", action="store_true",
                   help="also run every step on the reference machine and stop at the first difference, "
                        "naming the step, the instruction (pc) and the counter or word; on verilator and amaranth "
                        "every instruction's fetch, issue and done cycles are compared too")
    p.add_argument("--quiet", action="store_true", help="print only the summary lines")
    return p


def check_args(a) -> None:
    """The checks that need more than one option (each option alone is checked by the parser)."""
    backend_options(a)                  # --port goes with --sim board, and --sim board needs one
    if getattr(a, "prompt", None) is not None:
        if getattr(a, "trace", None):
            raise UsageError("--trace with --prompt is not there yet (the timeline covers the plain decode)")
        return check_prompt_args(a)
    if getattr(a, "sinks", 0):
        raise UsageError(f"--sinks {a.sinks} needs --prompt (the serving engine's decode)")
    if getattr(a, "stop", None) or getattr(a, "temperature", 0):
        raise UsageError("--stop and --temperature need --prompt (the serving engine's decode)")
    check_decode_args(a)
    if a.vcd and a.sim != "amaranth":
        raise UsageError(f"--vcd needs --sim amaranth (the waveform comes from Amaranth's simulator), got --sim {a.sim}")


def check_decode_args(a) -> None:
    """The checks of the options of `decode_options`, `host_options`, `mode_options` and ``--chip`` together."""
    # the context limit, the pool's bounds and the pages this decode needs: refused before any simulation
    check_decode(a.steps, a.window, a.page, a.pages, config=a.chip)
    if getattr(a, "mode", "book") == "resident":
        if not a.chip.gather:
            raise UsageError(f"--mode resident needs a chip with GATHER/SCATTER (gather=1), and --chip "
                             f"{a.chip.spec()} has none: use --chip fast or add gather=1")
        from compiler.resident import plan_layout
        from host.tiny_lm import build_graph, make_model
        plan_layout(build_graph(make_model(), 1), a.chip, a.page, a.pages)      # the pools fit, or say why


class _Counted:
    """A backend passed through, counting the runs and the external-memory words they returned (what a
    passing --check compared)."""

    def __init__(self, inner):
        self.inner = inner
        self.runs = self.words = self.instructions = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, program, image, lat=8, scratchpad=None):
        r = self.inner.run(program, image, lat, **({} if scratchpad is None else {"scratchpad": scratchpad}))
        self.runs += 1
        self.words += len(r.ext)
        self.instructions += len(r.trace or ())
        return r


def make_decoder(a, backend):
    """The host decoder of parsed options `a` (`decode_options`, `host_options`, `mode_options`, ``--chip``)
    on `backend`, calibrated and ready to ``generate``: ``(decoder, model)``."""
    from host import tiny_lm as T
    from host.paged import PagedChip
    seed = a.seed if a.seed is not None else (1 if a.model == "structured" else 2)
    lat = a.chip.lat if a.lat is None else a.lat
    m = T.make_model(a.model, seed)
    kw = dict(page=a.page, n_pages=a.pages, backend=backend, lat=lat, config=a.chip)
    if getattr(a, "mode", "book") == "resident":
        from host.resident import ResidentChip
        return ResidentChip(m, a.steps, a.window, **kw), m
    return PagedChip(m, a.steps, a.window, **kw), m


def run_labels(n_runs: int, recs) -> list:
    """Names of a decode's runs on a timeline: one per step record of `recs`, after ``load (weights)`` when
    there is one run more (resident mode's load program); ``run i`` when the runs do not match the steps."""
    steps = [f"step L={r['L']} ctx={r['ctx']} tok={int(r['tok'])}" for r in recs]
    if n_runs == len(recs):
        return steps
    if n_runs == len(recs) + 1:
        return ["load (weights)"] + steps
    return [f"run {i}" for i in range(n_runs)]


def run_decode(a, out=None):
    """Run the decode described by parsed arguments `a`; returns the JSON-ready result dict."""
    out = out or sys.stdout             # looked up now, not at import: a caller may have redirected it
    from host import tiny_lm as T
    from sim.backends import get_backend

    seed = a.seed if a.seed is not None else (1 if a.model == "structured" else 2)
    cfg = a.chip
    lat = cfg.lat if a.lat is None else a.lat
    backend = get_backend(a.sim, config=cfg, **({"vcd": a.vcd} if a.vcd else {}), **backend_options(a))
    board = backend
    counted = None
    if a.check:
        from sim.verify.fuzz import CheckedBackend
        from sim.timeline import RTL_TRACERS
        # an RTL simulator gives its own per-instruction trace: every instruction's cycles are compared too
        traced = a.sim in RTL_TRACERS
        if traced:
            backend.trace = True
        counted = _Counted(backend)
        from sim.backends.reference import ReferenceMachine
        backend = CheckedBackend(counted, ReferenceMachine(config=cfg, trace=traced))
    tracer = None
    if getattr(a, "trace", None):
        from sim.timeline import TracingBackend
        backend = tracer = TracingBackend(backend, cfg)
    t0 = time.perf_counter()
    mode = getattr(a, "mode", "book")
    chip, m = make_decoder(a, backend)
    t_cal = time.perf_counter() - t0
    t1 = time.perf_counter()
    with Progress(f"decoding on {a.sim}") as bar:
        tokens, recs = chip.generate(a.start, a.steps, progress=bar)
    t_run = time.perf_counter() - t1
    for r in recs:
        # the words the host wrote to the chip for the step: book mode hands over the whole image
        r.setdefault("host_words", len(r.get("image") or ()))

    result = {
        "window": a.window, "page": a.page, "steps": a.steps, "start": a.start, "model": a.model,
        "seed": seed, "sim": a.sim, "chip": cfg.spec(), "lat": lat, "mode": mode,
        "tokens": [int(t) for t in tokens],
        "programs_compiled": len(chip.progs),
        "peak_pages": chip.peak,
        "records": [{"L": r["L"], "ctx": r["ctx"], "tok": int(r["tok"]), "pages": r["pages"],
                     "counters": [int(c) for c in r["counters"]], "host_words": int(r["host_words"]),
                     "logits_int": [int(v) for v in r["logits_int"]]} for r in recs],
    }
    if mode == "resident":
        result["load"] = {"counters": [int(c) for c in chip.load_record["counters"]],
                          "host_words": int(chip.load_record["host_words"])}

    w = "none" if a.window is None else str(a.window)
    print(f"GA-2 decode: {a.model} model (seed {seed}), start token {a.start}, {a.steps} steps, window {w}, "
          f"pages of {a.page} rows (pool {a.pages}), simulator {a.sim}, LAT {lat}, chip {cfg.spec()}, mode {mode}",
          file=out)
    print(f"tokens: {' '.join(str(t) for t in tokens)}", file=out)
    if a.model == "structured":
        expect = [a.start]
        for _ in range(a.steps):
            expect.append(T.f_next(expect[-1]))
        ok = list(tokens) == expect
        first_bad = next((i for i, (x, y) in enumerate(zip(tokens, expect)) if x != y), None)
        print(f"rule f(t) = 5t+3 mod 16: {'followed for all ' + str(a.steps) + ' steps' if ok else 'BROKEN at token ' + str(first_bad)}",
              file=out)
        result["rule_ok"] = ok
    else:
        ref = T.float_generate(m, a.start, a.steps, a.window)
        same = sum(1 for x, y in zip(tokens[1:], ref[1:]) if x == y)
        print(f"float reference with the same window: {same}/{a.steps} tokens identical", file=out)
    sizes = sorted({k if isinstance(k, int) else k[0] for k in chip.progs})     # resident: (ctx, row, pages)
    print(f"programs compiled: {len(chip.progs)} (context sizes {', '.join(str(n) for n in sizes)})",
          file=out)
    print(f"pages in use at each step: {' '.join(str(r['pages']) for r in recs)}; peak {chip.peak}", file=out)
    words = [r["host_words"] for r in recs]
    print(f"words the host wrote to the chip per step: {min(words)}..{max(words)}, {sum(words):,} in all"
          + (f" (plus {chip.load_record['host_words']:,} once, the weights' load: "
             f"{chip.load_record['counters'][0]:,} cycles)" if mode == "resident" else
             " (book mode: the whole external-memory image every step)"), file=out)
    if not a.quiet:
        print(f"\n{'step':>5} {'ctx':>4} {'tok':>4} {'pages':>6} {'total':>8} {'mm':>7} {'dma':>7} {'vec':>6} {'instr':>6}"
              f" {'words':>6}", file=out)
        for r in recs:
            c = r["counters"]
            print(f"{r['L']:5d} {r['ctx']:4d} {r['tok']:4d} {r['pages']:6d} {c[0]:8d} {c[1]:7d} {c[2]:7d} {c[3]:6d} {c[4]:6d}"
                  f" {r['host_words']:6d}", file=out)
    sums = [sum(r["counters"][i] for r in recs) for i in range(5)]
    print(f"{'total':>5} {'':>4} {'':>4} {'':>6} {sums[0]:8d} {sums[1]:7d} {sums[2]:7d} {sums[3]:6d} {sums[4]:6d}"
          if not a.quiet else f"total cycles {sums[0]} (mm {sums[1]}, dma {sums[2]}, vec {sums[3]}; {sums[4]} instructions)",
          file=out)
    if not a.quiet:
        print("ctx: tokens attended, min(L, W); pages: held while the step runs, before its row is appended; "
              "mm/dma/vec: busy cycles of the units (total adds 2 per instruction, fetch and issue, and 2 for HALT; "
              "2 a step on a prefetch chip, docs/prefetch.md)", file=out)
    if counted is not None:
        result["check"] = {"steps": counted.runs, "words": counted.words, "instructions": counted.instructions,
                           "identical": True}
        runs = f"{counted.runs} steps" if mode == "book" else \
            f"{counted.runs} runs (the load program and {counted.runs - 1} steps)"
        traced = (f", as are the fetch, issue and done cycles of {counted.instructions:,} instructions"
                  if counted.instructions else "")
        print(f"check: {runs} compared with the reference machine: all five counters and "
              f"{counted.words:,} external-memory words identical{traced}", file=out)
    rate = sums[0] / t_run if t_run > 0 else float("inf")
    print(f"\ncalibration and compile setup {t_cal:.1f} s; {a.steps} steps simulated in {t_run:.1f} s "
          f"({rate:,.0f} chip cycles/s on {a.sim})", file=out)
    result["cycles_total"] = sums[0]
    if tracer is not None:
        from sim.timeline import build_events, check_against_counters, trace_document
        runs = tracer.runs
        events = build_events(cfg, runs, run_labels(len(runs), recs))
        check_against_counters(events, [c for _, _, c in runs])
        result["_trace_document"] = trace_document(cfg, events, f"ga2 decode, {len(runs)} runs, mode {mode}",
                                                   tracer.source)
    if hasattr(board, "link_summary"):
        link_report(board, out)
        s = board.stats
        result["link"] = {"retries": s.retries, "reasons": dict(s.reasons), "polls": s.polls, "frames": s.frames,
                          "requests": s.requests, "bytes_out": s.bytes_out, "bytes_in": s.bytes_in, "runs": s.runs}
    return result


# ---- sim.decode --prompt: one request alone ----------------------------------------------------------

def check_prompt_args(a) -> None:
    """`sim.decode`'s checks when ``--prompt`` is given (the context limit of every row)."""
    from host.window import sink_context
    if getattr(a, "mode", "book") != "book":
        raise UsageError("--prompt runs in --mode book only for now")
    if a.sinks and a.window is None:
        raise UsageError(f"--sinks {a.sinks} needs a window (--window N)")
    rows = len(a.prompt) + a.steps - 1
    ctx = max(sink_context(L, a.window, a.sinks) for L in range(1, rows + 1))
    if ctx > a.chip.mm_max_k:
        raise UsageError(f"--prompt of {len(a.prompt)} tokens and --steps {a.steps} need a context of {ctx} "
                         f"tokens; the chip attends at most {a.chip.mm_max_k}: use a window")


def run_prompt_decode(a, out=None) -> dict:
    """`sim.decode --prompt`: the request alone, with the engine's calibration (`host.engine.decode_alone`)."""
    out = out or sys.stdout
    from host import tiny_lm as T
    from host.engine import decode_alone
    from sim.backends import get_backend
    seed = a.seed if a.seed is not None else (1 if a.model == "structured" else 2)
    cfg = a.chip
    lat = cfg.lat if a.lat is None else a.lat
    m = T.make_model(a.model, seed)
    t0 = time.perf_counter()
    backend = get_backend(a.sim, config=cfg, **backend_options(a))
    toks, logits, recs = decode_alone(m, a.prompt, a.steps, backend, a.window, a.sinks, lat, cfg,
                                      stop=getattr(a, "stop", None) or (), temperature=getattr(a, "temperature", 0.0),
                                      top_k=getattr(a, "top_k", 0), seed=getattr(a, "sample_seed", 0),
                                      sample=getattr(a, "sample", 0))
    w = "none" if a.window is None else str(a.window)
    print(f"GA-2 decode of a prompt alone: {a.model} model (seed {seed}), prompt {','.join(map(str, a.prompt))}, "
          f"{a.steps} tokens generated, window {w}, sinks {a.sinks}, simulator {a.sim}, chip {cfg.spec()} "
          f"(the serving engine's calibration: host.batch)", file=out)
    print(f"tokens: {' '.join(map(str, a.prompt))} | {' '.join(map(str, toks))}", file=out)
    total = sum(r["counters"][0] for r in recs)
    if not a.quiet:
        print(f"\n{'row':>5} {'ctx':>4} {'tok':>4} {'total':>8}", file=out)
        for r in recs:
            # a prompt row before the last computes only its cache row: no attention, no token
            ctx, tok = ("kv", "-") if r["tok"] is None else (r["ctx"], r["tok"])
            print(f"{r['L']:5d} {ctx:>4} {tok:>4} {r['counters'][0]:8d}", file=out)
    print(f"total cycles {total} over {len(recs)} rows ({time.perf_counter() - t0:.1f} s)", file=out)
    link_report(backend, out)
    return {"prompt": list(a.prompt), "steps": a.steps, "window": a.window, "sinks": a.sinks, "model": a.model,
            "seed": seed, "sim": a.sim, "chip": cfg.spec(), "lat": lat,
            "tokens": list(a.prompt) + toks, "logits_int": logits, "calibration": "universal",
            "records": [{"L": r["L"], "ctx": r["ctx"], "tok": r["tok"], "counters": r["counters"]} for r in recs],
            "cycles_total": total}


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    check_args(a)
    if getattr(a, "prompt", None) is not None:
        result = run_prompt_decode(a)
    else:
        result = run_decode(a)
    if a.vcd:
        print(f"wrote {a.vcd}")         # by Amaranth's simulator, during the last step
    doc = result.pop("_trace_document", None)
    if a.json:
        write_json(a.json, result)
    if doc is not None:
        write_json(a.trace, doc)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
