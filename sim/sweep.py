"""A sweep over chip configurations: `python -m sim.sweep --out DIR [--synth] [--sim ...] [--configs ...]`.

Every configuration runs the same window-4 decode (32 steps, structured tiny LM, start token 0) as
``python -m sim.decode --window 4 --chip SPEC``, through `sim.decode.run_decode` itself. The configuration
may change the cycles but never an integer: each configuration's tokens and integer logits must equal the
book's chip's (decoded on the reference machine), step by step, or the sweep stops with exit status 1 and
one line naming the configuration and the first differing step. With ``--synth`` the chip (`ga2` of
`sim.flow.verilog.BLOCKS`) of each configuration is synthesized for the ECP5 and placed out of context
(`sim.flow.synth.synthesize_block`) for its LUTs, DSPs, EBRs and Fmax, and checked against the ULX3S-85F.

Writes DIR/sweep.json, DIR/sweep.md (the table) and DIR/sweep.png (cycles per token against LUTs with
``--synth``, else one bar per configuration).
"""
from __future__ import annotations

import os
import sys
from dataclasses import asdict

from sim.cli import (Parser, Progress, guarded, make_dir, output_dir, sim_option, write_json, write_png,
                     write_text)
from sim.plot import pyplot

__all__ = ["DEFAULT_CONFIGS", "ULX3S_85F", "STEPS", "WINDOW", "configs", "decode", "first_difference",
           "fits", "config_row", "sweep", "format_markdown", "build_parser", "main"]

# The default grid: array 4 and 8, mm_load 1 and 4.
DEFAULT_CONFIGS = "book;array=8;mm_load=4;array=8,mm_load=4"
STEPS = 32          # the book's decode length
WINDOW = 4          # the book's window: steps 4..32 attend a context of 4
# The ULX3S-85F's LFE5U-85F as nextpnr-ecp5 counts it (docs/synthesis.md, the bitstream's utilization):
# LUT4s (TRELLIS_COMB), 18x18 multipliers (MULT18X18D) and block RAMs (DP16KD).
ULX3S_85F = {"lut": 83640, "dsp": 156, "ebr": 208}


class SweepMismatch(Exception):
    """A configuration whose tokens or integer logits differ from the book's (exit status 1, not 2: the
    input was fine, the chip is not)."""


def configs(text: str):
    """An argparse type: configurations separated by ``;``, each a ``--chip`` spec (`hdl.config.parse_chip`);
    a bad spec or the same chip twice is refused while parsing."""
    import argparse

    from hdl.config import ChipSpecError, parse_chip
    specs = [s.strip() for s in text.split(";") if s.strip()]
    if not specs:
        raise argparse.ArgumentTypeError(f"no configuration in {text!r}")
    out = []
    for s in specs:
        try:
            cfg = parse_chip(s)
        except ChipSpecError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if cfg in out:
            raise argparse.ArgumentTypeError(f"{s!r} is the chip {cfg.spec()!r} again")
        out.append(cfg)
    return out


configs.__name__ = "configurations"


def decode(cfg, sim: str) -> dict:
    """The window-4 decode of `sim.decode` on the chip `cfg` and simulator `sim`; its JSON-ready result
    (``tokens``, ``records`` with ``L``, ``ctx``, ``counters``, ``logits_int``). Its printout is dropped."""
    import io

    from sim import decode as D
    a = D.build_parser().parse_args(["--window", str(WINDOW), "--steps", str(STEPS), "--sim", sim, "--quiet"])
    a.chip = cfg
    D.check_args(a)
    return D.run_decode(a, out=io.StringIO())


def first_difference(run: dict, book: dict) -> str | None:
    """Where `run`'s integers first differ from the `book`'s: ``"step L: ..."``, or None if identical."""
    if run["tokens"][0] != book["tokens"][0] or len(run["records"]) != len(book["records"]):
        return f"start token {run['tokens'][0]} / {len(run['records'])} steps, the book's " \
               f"{book['tokens'][0]} / {len(book['records'])}"
    for r, b in zip(run["records"], book["records"]):
        if r["tok"] != b["tok"]:
            return f"step {r['L']}: token {r['tok']}, the book's {b['tok']}"
        if r["logits_int"] != b["logits_int"]:
            i = next(i for i, (x, y) in enumerate(zip(r["logits_int"], b["logits_int"])) if x != y) \
                if len(r["logits_int"]) == len(b["logits_int"]) else None
            what = f"logit {i} is {r['logits_int'][i]}, the book's {b['logits_int'][i]}" if i is not None else \
                f"{len(r['logits_int'])} logits, the book's {len(b['logits_int'])}"
            return f"step {r['L']}: integer {what}"
    return None


def fits(row: dict) -> bool:
    """Whether a synthesized chip's LUTs, DSPs and EBRs all fit the ULX3S-85F."""
    return all(row[k] <= ULX3S_85F[k] for k in ULX3S_85F)


def _synth(cfg) -> dict:
    from sim.flow.synth import synthesize_block
    row = synthesize_block("ga2", "ecp5", pnr=True, config=cfg)
    out = {"lut": row.lut, "dsp": row.dsp or 0, "ebr": row.bram, "fmax_mhz": row.fmax_mhz,
           "note": row.note, "cells": asdict(row)["cells"]}
    out["fits_ulx3s_85f"] = fits(out)
    return out


def config_row(cfg, sim: str, synth: bool, book: dict) -> dict:
    """The sweep's row of one configuration: its decode on `sim` checked against `book` (the book's chip's
    decode), and with `synth` its synthesis. Raises `SweepMismatch` when its integers differ. One task
    of ``--cluster``."""
    run = decode(cfg, sim)
    diff = first_difference(run, book)
    if diff is not None:
        raise SweepMismatch(f"chip {cfg.spec()} differs from the book's chip at {diff}")
    recs = run["records"]
    ctx4 = next(r for r in recs if r["ctx"] == WINDOW)
    row = {"chip": cfg.spec(), "config": cfg.overrides(),
           "cycles_ctx1": recs[0]["counters"][0], "cycles_ctx4": ctx4["counters"][0],
           "ctx4_step": ctx4["L"],
           "ctx4_all_equal": all(r["counters"][0] == ctx4["counters"][0] for r in recs if r["ctx"] == WINDOW),
           "total_w4": run["cycles_total"], "tokens": run["tokens"], "identical_to_book": True}
    if synth:
        row["synth"] = _synth(cfg)
    return row


def sweep(cfgs, sim: str, synth: bool = False, out=None, cluster: str | None = None,
          workers: int | None = None) -> dict:
    """Run the decode (and with `synth` the synthesis) of every configuration; the sweep's JSON document.

    With `cluster` (a `sim.cluster` address) each configuration is one Ray task on it (`config_row`), the
    rows coming back in the order of `cfgs`. Raises `SweepMismatch` at the first configuration (in that
    order) whose integers differ from the book's.
    """
    import contextlib

    from hdl.config import BOOK
    out = out or sys.stdout
    book = decode(BOOK, "reference")            # the integers every chip must give back
    rows = []
    with Progress(f"sweep on {sim}", unit="configuration") as bar, contextlib.ExitStack() as stack:
        if cluster is not None:
            from sim.cluster import Cluster
            c = stack.enter_context(Cluster(cluster, workers))
            results = c.map(config_row, [(cfg, sim, synth, book) for cfg in cfgs], label=f"sweep on {sim}",
                            unit="configuration", progress=False)
        else:
            results = (config_row(cfg, sim, synth, book) for cfg in cfgs)
        for i, row in enumerate(results):
            rows.append(row)
            print(f"{row['chip']}: {row['cycles_ctx1']} cycles at context 1, {row['cycles_ctx4']} at context "
                  f"{WINDOW}, {row['total_w4']} in {STEPS} steps; tokens and integer logits identical to the book's",
                  file=out, flush=True)
            bar(i + 1, len(cfgs))
    return {"sim": sim, "steps": STEPS, "window": WINDOW, "synth": synth,
            "board": {"name": "ulx3s-85f", **ULX3S_85F} if synth else None,
            "book_tokens": book["tokens"], "rows": rows}


def format_markdown(doc: dict) -> str:
    """The sweep as a markdown table."""
    synth = doc["synth"]
    head = ["chip", "cycles, step 1 (context 1)", f"cycles, a step at context {doc['window']}",
            f"window-{doc['window']} decode, {doc['steps']} steps", "tokens and integer logits"]
    if synth:
        head += ["ECP5 LUT4", "DSP", "EBR", "Fmax (MHz)", "ULX3S-85F"]
    lines = [f"# Chip sweep on {doc['sim']}", "",
             f"The structured tiny LM decoded {doc['steps']} steps from token 0 with a window of {doc['window']} "
             f"tokens (`python -m sim.decode --window {doc['window']} --chip SPEC --sim {doc['sim']}`).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["rows"]:
        cells = [f"`{r['chip']}`", f"{r['cycles_ctx1']:,}", f"{r['cycles_ctx4']:,}", f"{r['total_w4']:,}",
                 "the book's" if r["chip"] == "book" else "identical"]
        if synth:
            s = r["synth"]
            fmax = "-" if s["fmax_mhz"] is None else f"{s['fmax_mhz']:.1f}"
            cells += [f"{s['lut']:,}", str(s["dsp"]), str(s["ebr"]), fmax,
                      "fits" if s["fits_ulx3s_85f"] else "does not fit"]
        lines.append("| " + " | ".join(cells) + " |")
    if synth:
        b = doc["board"]
        lines += ["", f"ULX3S-85F: {b['lut']:,} LUT4, {b['dsp']} DSP (MULT18), {b['ebr']} EBR; the chip alone "
                      "(`ga2`), placed out of context by nextpnr-ecp5."]
    return "\n".join(lines) + "\n"


def draw(doc: dict, path) -> None:
    """Cycles per token at context 4 against LUTs (with synthesis) or per configuration (bars)."""
    plt = pyplot("the sweep's figure")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = [r["chip"] for r in doc["rows"]]
    cycles = [r["cycles_ctx4"] for r in doc["rows"]]
    if doc["synth"]:
        luts = [r["synth"]["lut"] for r in doc["rows"]]
        ax.scatter(luts, cycles)
        for x, y, n in zip(luts, cycles, names):
            ax.annotate(n, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.axvline(doc["board"]["lut"], color="grey", linestyle="--", label="ULX3S-85F LUT4s")
        ax.set_xlabel("ECP5 LUT4s of the chip")
        ax.legend()
    else:
        ax.bar(range(len(names)), cycles)
        ax.set_xticks(range(len(names)), names, rotation=15, fontsize=8)
        ax.set_xlabel("chip configuration")
    ax.set_ylabel(f"cycles per token (window {doc['window']}, context {doc['window']})")
    ax.set_title(f"GA-2 chip sweep on {doc['sim']}")
    fig.tight_layout()
    write_png(path, fig)              # atomic: no half-drawn figure is left behind


def build_parser() -> Parser:
    p = Parser("python -m sim.sweep",
               f"Run the window-{WINDOW} decode ({STEPS} steps) on a grid of chip configurations, check that "
               "every configuration's tokens and integer logits equal the book's chip's (exit status 1 and the "
               "first differing step if not), and write DIR/sweep.json, DIR/sweep.md and DIR/sweep.png: cycles "
               f"of step 1 (context 1) and of a step at context {WINDOW}, the {STEPS}-step total and, with "
               "--synth, the chip's ECP5 LUTs, DSPs, EBRs and Fmax and whether it fits the ULX3S-85F. Each "
               "configuration is a Verilator build on first use (~1 min); --synth adds minutes per chip.",
               "python -m sim.sweep --out out/sweep\n"
               "python -m sim.sweep --out out/sweep --sim reference --configs 'book;array=8,mm_load=4'\n"
               "python -m sim.sweep --out out/sweep --synth")
    p.add_argument("--out", type=output_dir, required=True, metavar="DIR",
                   help="directory for sweep.json, sweep.md and sweep.png (created if missing)")
    sim_option(p, "verilator", help="which simulator runs every configuration's decode")
    p.add_argument("--configs", type=configs, default=configs(DEFAULT_CONFIGS), metavar="SPEC;SPEC;...",
                   help=f"the configurations, each a --chip spec, separated by ';' (default: {DEFAULT_CONFIGS})")
    p.add_argument("--synth", action="store_true",
                   help="also synthesize each chip for the ECP5 and place it (needs pip install -e '.[synth]')")
    from sim.cluster import cluster_option
    cluster_option(p, "one configuration a task, its decode and synthesis")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    from sim.cluster import check_cluster_args
    check_cluster_args(a)
    pyplot("the sweep's figure")         # a missing matplotlib or synthesis extra is said before any work
    if a.synth:
        from sim.flow.synth import require_tools
        require_tools(pnr=True)
    make_dir(a.out)
    try:
        doc = sweep(a.configs, a.sim, synth=a.synth, cluster=a.cluster, workers=a.workers)
    except SweepMismatch as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_json(os.path.join(a.out, "sweep.json"), doc)
    write_text(os.path.join(a.out, "sweep.md"), format_markdown(doc))
    draw(doc, os.path.join(a.out, "sweep.png"))
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
