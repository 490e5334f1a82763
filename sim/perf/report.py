"""The profile of a set of runs as one document (what ``ga2 profile --json`` writes) and as text.

`profile_document` checks, with ``==``, that the classes add up to the summed counters
(`sim.perf.breakdown.check_breakdown`) and that the runs' MACs and external-memory words are the classes'.
"""
from __future__ import annotations

import sys

from hdl.config import ChipConfig
from sim.perf.breakdown import (FETCH_ISSUE, ProfileMismatch, breakdown, check_breakdown, class_table,
                                limits, per_token, run_bounds, run_figures, summed_counters)

__all__ = ["IDENTITY", "profile_document", "print_profile"]

IDENTITY = ("cyc_total = the busy cycles of every class, fetch/issue's included (the sequencer's: 2 an instruction, "
            "HALT too, 0 for one a prefetch chip read ahead); cyc_mm = MM + MM+rq + RQC; cyc_dma = LD + ST + GATHER + SCATTER; cyc_vec = RQ + SM + VADD + "
            "AMAX + UNPACK; n_inst = the counts of every class but fetch/issue")
IDEALS = ("ideal: MM, MACs / the M x N PEs its shape uses (= K); RQ, SM, VADD, AMAX, UNPACK, elements / lanes; LD, "
          "ST, GATHER, SCATTER, words / the port's words a cycle; RQC and fetch/issue, 0")


def profile_document(config: ChipConfig, runs, labels, first: int, tokens: int, what: str, steps=None) -> dict:
    """The profile of ``runs[first:]`` (the runs before `first`, a resident load program, are reported apart),
    which generated `tokens` tokens; `labels` name every run, `steps` (optional, a decode's: one dict a run
    profiled) give each run its per-token figures."""
    profiled = runs[first:]
    rows = breakdown(profiled, config)
    counters = summed_counters(profiled)
    check_breakdown(rows, counters)
    run_docs = []
    for (program, trace, c), label in zip(profiled, labels[first:]):
        fig = run_figures(program, trace, config)
        run_docs.append({"label": label, "counters": [int(x) for x in c], "cycles": int(c[0]), **fig,
                         **run_bounds(fig, config)})
    macs = sum(r["macs"] for r in run_docs)
    ext = sum(r["ext_words"] for r in run_docs)
    if macs != sum(f.macs for f in rows.values()) or ext != sum(f.ext_words for f in rows.values()):
        raise ProfileMismatch(f"the runs' MACs {macs} / EXT words {ext} are not the classes'")
    if steps is not None:
        if len(steps) != len(run_docs):
            raise ProfileMismatch(f"{len(steps)} steps for {len(run_docs)} runs profiled")
        for r, st in zip(run_docs, steps):
            r["step"] = st
            r["per_token"] = per_token([r], 1)
    total = counters[0]
    table = class_table(rows, total)
    ideal = sum(f.ideal for f in rows.values())
    return {"what": what, "chip": config.spec(), "limits": limits(config), "source": "reference machine",
            "identity": IDENTITY, "ideals": IDEALS, "counters": counters,
            "load": {"runs": first, "counters": summed_counters(runs[:first]), "labels": list(labels[:first])},
            "classes": table, "total": {"busy": total, "ideal": ideal, "gap": total - ideal,
                                        "gap_share": (total - ideal) / total if total else 0.0},
            "runs": run_docs, "per_token": per_token(run_docs, tokens)}


def _token_line(p: dict) -> str:
    return (f"{p['cycles']:10,.1f} {p['macs']:9,.1f} {p['ext_words']:9,.1f} {p['mac_bound']:10,.1f} "
            f"{p['ext_bound']:10,.1f} {p['ratio']:7.2f}x {p['bound']}")


def print_profile(doc: dict, out=None) -> None:
    """Print `doc` (a `profile_document`): the class table, then the per-token figures."""
    out = out or sys.stdout
    lim, c, load = doc["limits"], doc["counters"], doc["load"]
    print(f"GA-2 profile: {doc['what']}; chip {doc['chip']} (array {lim['array']}x{lim['array']} = {lim['pes']} "
          f"PEs, vector lanes {lim['vector_lanes']}, external port {lim['ext_port_words']} word a cycle); "
          f"{doc['source']}", file=out)
    apart = (f"; the load program apart, not in the table: {load['counters'][0]:,} cycles" if load["runs"] else "")
    print(f"profiled: {len(doc['runs'])} runs, {doc['per_token']['tokens']} tokens generated, {c[0]:,} cycles"
          f"{apart}", file=out)
    print(f"\n{'class':<12} {'count':>7} {'busy':>9} {'ideal':>9} {'gap':>9} {'gap/total':>10}", file=out)
    for r in doc["classes"]:
        if r["count"] or r["class"] == FETCH_ISSUE:
            print(f"{r['class']:<12} {r['count']:7,d} {r['busy']:9,d} {r['ideal']:9,d} {r['gap']:9,d} "
                  f"{100 * r['gap_share']:9.1f}%", file=out)
    t = doc["total"]
    print(f"{'total':<12} {c[4]:7,d} {t['busy']:9,d} {t['ideal']:9,d} {t['gap']:9,d} {100 * t['gap_share']:9.1f}%",
          file=out)
    unused = [r["class"] for r in doc["classes"] if not r["count"] and r["class"] != FETCH_ISSUE]
    print(f"(count of total: n_inst; classes not executed: {', '.join(unused) or 'none'})", file=out)
    print(f"the classes add up to the counters [cyc_total, cyc_mm, cyc_dma, cyc_vec, n_inst] = {c} (checked "
          f"with ==): {doc['identity']}", file=out)
    print(doc["ideals"], file=out)
    head = (f"{'cycles':>10} {'MACs':>9} {'EXT words':>9} {'MAC bound':>10} {'EXT bound':>10} {'ratio':>8} bound")
    p = doc["per_token"]
    print(f"\nper generated token (MAC bound: MACs / (rows the batch fills x {lim['array']}); EXT bound: EXT words / "
          f"{lim['ext_port_words']}; ratio: cycles / the larger bound):", file=out)
    if doc["runs"] and "step" in doc["runs"][0]:
        print(f"{'step':>5} {'ctx':>4} {head}", file=out)
        for r in doc["runs"]:
            print(f"{r['step']['L']:5d} {r['step']['ctx']:4d} {_token_line(r['per_token'])}", file=out)
    else:
        print(f"{'rows':>4} {'programs':>8}   per program: {head}", file=out)
        by: dict = {}
        for r in doc["runs"]:
            by.setdefault(r["rows"], []).append(r)
        for rows, rs in sorted(by.items()):
            print(f"{rows:4d} {len(rs):8d}                {_token_line(per_token(rs, len(rs)))}"
                  + ("  (page copies)" if rows == 0 else ""), file=out)
    print(f"{'all':>10} {_token_line(p)}   ({p['tokens']} tokens)", file=out)
    print(f"per generated token: {p['cycles']:,.1f} cycles, MAC bound {p['mac_bound']:,.1f}, EXT bound "
          f"{p['ext_bound']:,.1f}: {p['ratio']:.2f}x the larger ({p['bound']})", file=out)

