"""Decode tokens with the tiny LM on the GA-2 chip through the paged KV cache: the user's main command.

    python -m sim.decode --window 4                   # 32 steps, window of 4 tokens
    python -m sim.decode --window none --sim verilator --json out/none.json

The host calibrates the quantizer over the same number of steps from all 16 start tokens (with the same
window), compiles one program per context size min(L, W), gathers the windowed cache rows through the page
table into the chip's contiguous kc/vc inputs, runs each step on the chosen simulator, and prints the
tokens, the programs compiled, the pages in use and the per-step cycle counters.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from sim.cli import UsageError, guarded, Progress

MAX_CONTEXT = 64            # a matmul's inner dimension K is at most 64 on the chip (p . V has K = context)
SIMULATORS = ("reference", "amaranth", "verilator")
DEFAULT_SIM = "amaranth"


def _window(text: str):
    if text.lower() == "none":
        return None
    try:
        w = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"window must be 'none' or a whole number >= 1, got {text!r}")
    if w < 1:
        raise argparse.ArgumentTypeError(f"window must be 'none' or a whole number >= 1, got {w}")
    return w


def _positive(name):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number >= 1, got {text!r}")
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number >= 1, got {v}")
        return v
    return parse


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input in one line and exits with status 2."""

    def error(self, message):
        self.exit(2, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m sim.decode",
        description="Decode tokens with the tiny language model on the GA-2 chip, its KV cache held in pages "
                    "and (optionally) limited to a sliding window. Prints the tokens, the programs compiled, "
                    "the pages in use and the chip's five cycle counters per step.",
        epilog="Example: python -m sim.decode --window 4 --steps 32 --sim reference --json out/w4.json")
    p.add_argument("--window", type=_window, default=None, metavar="{none|N}",
                   help="attend the new token and at most N-1 previous ones (default: none, full context)")
    p.add_argument("--steps", type=_positive("--steps"), default=32, metavar="N",
                   help="decode steps, i.e. tokens generated (default 32)")
    p.add_argument("--start", type=int, default=0, metavar="T", help="start token 0..15 (default 0)")
    p.add_argument("--page", type=_positive("--page"), default=4, metavar="P",
                   help="cache rows per page (default 4)")
    p.add_argument("--pages", type=_positive("--pages"), default=64, metavar="N",
                   help="pages in the pool (default 64)")
    p.add_argument("--model", choices=("structured", "random"), default="structured",
                   help="structured: follows f(t) = 5t+3 mod 16 by design; random: random weights")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="model seed (default 1 for structured, 2 for random)")
    p.add_argument("--sim", default=DEFAULT_SIM, metavar="{" + "|".join(SIMULATORS) + "}",
                   help=f"which simulator runs the chip (default {DEFAULT_SIM})")
    p.add_argument("--lat", type=_positive("--lat"), default=8, metavar="N",
                   help="external memory read latency in cycles (default 8)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the run as JSON to PATH")
    p.add_argument("--vcd", default=None, metavar="PATH",
                   help="with --sim amaranth: write a waveform of the last step's run to PATH (slow, large)")
    p.add_argument("--check", action="store_true",
                   help="also run every step on the reference machine and stop at the first difference, "
                        "naming the step, the instruction (pc) and the counter or word")
    p.add_argument("--quiet", action="store_true", help="print only the summary lines")
    return p


def check_args(a) -> None:
    if a.sim not in SIMULATORS:
        raise UsageError(f"--sim must be one of {', '.join(SIMULATORS)}, got {a.sim!r}")
    if not 0 <= a.start <= 15:
        raise UsageError(f"--start must be a token 0..15, got {a.start}")
    context = a.steps if a.window is None else min(a.steps, a.window)
    if context > MAX_CONTEXT:
        raise UsageError(f"a context of {context} tokens exceeds the chip's limit of {MAX_CONTEXT} "
                         f"(a matmul's K is at most 64): use fewer --steps or a --window of at most {MAX_CONTEXT}")
    for option, path in (("--json", a.json), ("--vcd", a.vcd)):
        if path:
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise UsageError(f"{option}: directory {parent} does not exist")
    if a.vcd and a.sim != "amaranth":
        raise UsageError(f"--vcd needs --sim amaranth (the waveform comes from Amaranth's simulator), got --sim {a.sim}")


def run_decode(a, out=sys.stdout):
    """Run the decode described by parsed arguments `a`; returns the JSON-ready result dict."""
    from host import tiny_lm as T
    from host.paged import PagedChip
    from sim.backend import get_backend

    seed = a.seed if a.seed is not None else (1 if a.model == "structured" else 2)
    backend = get_backend(a.sim, **({"vcd": a.vcd} if a.vcd else {}))
    if a.check:
        from sim.fuzz import CheckedBackend
        backend = CheckedBackend(backend)
    m = T.make_model(a.model, seed)
    t0 = time.perf_counter()
    chip = PagedChip(m, a.steps, a.window, page=a.page, n_pages=a.pages, backend=backend, lat=a.lat)
    t_cal = time.perf_counter() - t0
    bar = Progress(f"decoding on {a.sim}")
    t1 = time.perf_counter()
    try:
        tokens, recs = chip.generate(a.start, a.steps, progress=bar)
    finally:
        bar.close()
    t_run = time.perf_counter() - t1

    result = {
        "window": a.window, "page": a.page, "steps": a.steps, "start": a.start, "model": a.model,
        "seed": seed, "sim": a.sim, "tokens": [int(t) for t in tokens],
        "programs_compiled": len(chip.progs),
        "peak_pages": chip.peak,
        "records": [{"L": r["L"], "ctx": r["ctx"], "tok": int(r["tok"]), "pages": r["pages"],
                     "counters": [int(c) for c in r["counters"]],
                     "logits_int": [int(v) for v in r["logits_int"]]} for r in recs],
    }

    w = "none" if a.window is None else str(a.window)
    print(f"GA-2 decode: {a.model} model (seed {seed}), start token {a.start}, {a.steps} steps, window {w}, "
          f"pages of {a.page} rows (pool {a.pages}), simulator {a.sim}, LAT {a.lat}", file=out)
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
    print(f"programs compiled: {len(chip.progs)} (context sizes {', '.join(str(n) for n in sorted(chip.progs))})",
          file=out)
    print(f"pages in use at each step: {' '.join(str(r['pages']) for r in recs)}; peak {chip.peak}", file=out)
    if not a.quiet:
        print(f"\n{'step':>5} {'ctx':>4} {'tok':>4} {'pages':>6} {'total':>8} {'mm':>7} {'dma':>7} {'vec':>6} {'instr':>6}",
              file=out)
        for r in recs:
            c = r["counters"]
            print(f"{r['L']:5d} {r['ctx']:4d} {r['tok']:4d} {r['pages']:6d} {c[0]:8d} {c[1]:7d} {c[2]:7d} {c[3]:6d} {c[4]:6d}",
                  file=out)
    sums = [sum(r["counters"][i] for r in recs) for i in range(5)]
    print(f"{'total':>5} {'':>4} {'':>4} {'':>6} {sums[0]:8d} {sums[1]:7d} {sums[2]:7d} {sums[3]:6d} {sums[4]:6d}"
          if not a.quiet else f"total cycles {sums[0]} (mm {sums[1]}, dma {sums[2]}, vec {sums[3]}; {sums[4]} instructions)",
          file=out)
    rate = sums[0] / t_run if t_run > 0 else float("inf")
    print(f"\ncalibration and compile setup {t_cal:.1f} s; {a.steps} steps simulated in {t_run:.1f} s "
          f"({rate:,.0f} chip cycles/s on {a.sim})", file=out)
    result["cycles_total"] = sums[0]
    return result


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    check_args(a)
    result = run_decode(a)
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, a.json)          # never leave a half-written file behind
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
