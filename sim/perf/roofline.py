"""The roofline of a profile (``ga2 profile --png``): achieved MACs per cycle against arithmetic intensity.

Arithmetic intensity is MACs per external-memory word (the words LD, ST, GATHER and SCATTER move). Two roofs:
the compute roof, every PE busy (array x array MACs a cycle; dashed below it, the roof of the rows the batch
fills), and the memory roof, the port's words a cycle times the intensity.

Points:
- one per program run that does MACs (a decode step is one generated token; a served program's tokens all sit
  at its point, since both axes are ratios of its own MACs), and one for all the profiled runs together;
- one per instruction class, at the profiled runs' intensity, at the MACs of all the runs over that class's
  cycles: the rate the runs would reach if that class were the only time spent. Since the classes' cycles add
  up to the total, 1 / (the runs' rate) is the sum over the classes of 1 / (the class's rate).
"""
from __future__ import annotations

import sys

from sim.cli import write_png
from sim.perf.breakdown import CLASSES
from sim.plot import pyplot

__all__ = ["pyplot", "roofline_points", "draw_roofline"]


def roofline_points(doc: dict) -> dict:
    """The figure's points from a profile document (`sim.perf.report.profile_document`): ``runs`` and
    ``classes`` as ``(label, intensity, MACs per cycle)``, ``all`` for the runs together, ``roofs``."""
    lim = doc["limits"]
    runs = [(r["label"], r["macs"] / r["ext_words"], r["macs"] / r["cycles"]) for r in doc["runs"]
            if r["macs"] and r["ext_words"]]
    macs = sum(r["macs"] for r in doc["runs"])
    ext = sum(r["ext_words"] for r in doc["runs"])
    cycles = doc["counters"][0]
    x = macs / ext if ext else None
    classes = [(c["class"], x, macs / c["busy"]) for c in doc["classes"] if c["busy"] and macs and x]
    rows = max((r["rows_used"] for r in doc["runs"] if r["macs"]), default=1)
    return {"runs": runs, "classes": classes, "all": ("all runs", x, macs / cycles) if x and macs else None,
            "roofs": {"compute": lim["pes"], "batch": rows * lim["array"], "batch_rows": rows,
                      "port": lim["ext_port_words"]}}


def draw_roofline(path, doc: dict, out=None) -> None:
    """Draw the roofline of profile `doc` to the PNG `path` (written atomically)."""
    plt = pyplot("--png (the roofline)")
    pts = roofline_points(doc)
    roofs = pts["roofs"]
    xs = [p[1] for p in pts["runs"] + pts["classes"]] or [1.0]
    ys = [p[2] for p in pts["runs"] + pts["classes"]] or [1.0]
    ridge = roofs["compute"] / roofs["port"]
    lo_x, hi_x = min(xs) / 4, max(max(xs) * 4, ridge * 4)
    lo_y, hi_y = min(ys) / 4, max(max(ys), roofs["compute"]) * 4
    fig, ax = plt.subplots(figsize=(12, 6))
    ax.set_xscale("log")
    ax.set_yscale("log")
    gx = [lo_x, ridge, hi_x]
    ax.plot(gx, [min(roofs["port"] * x, roofs["compute"]) for x in gx], color="black", lw=2,
            label=f"roofs: {roofs['compute']} MACs/cycle (every PE), {roofs['port']} EXT word/cycle x intensity")
    if roofs["batch"] < roofs["compute"]:
        bx = [lo_x, roofs["batch"] / roofs["port"], hi_x]
        ax.plot(bx, [min(roofs["port"] * x, roofs["batch"]) for x in bx], color="gray", ls="--",
                label=f"roof of the batch's {roofs['batch_rows']} row(s): {roofs['batch']} MACs/cycle")
    if pts["runs"]:
        ax.scatter([p[1] for p in pts["runs"]], [p[2] for p in pts["runs"]], s=14, color="tab:blue", alpha=0.6,
                   label=f"{len(pts['runs'])} program runs (their tokens)", zorder=3)
    if pts["all"]:
        ax.scatter([pts["all"][1]], [pts["all"][2]], s=90, marker="*", color="tab:red", zorder=4,
                   label=f"all runs: {pts['all'][2]:.2f} MACs/cycle at {pts['all'][1]:.1f} MACs/word")
    markers, colors = "os^vD<>phX8P*", plt.get_cmap("tab10").colors
    for name, x, y in pts["classes"]:
        i = CLASSES.index(name)             # a class keeps its marker and colour from one figure to the next
        ax.scatter([x], [y], s=40, marker=markers[i % len(markers)], color=colors[i % 10],
                   zorder=3, edgecolors="black", linewidths=0.5, label=f"class {name}: {y:,.2f} (all MACs / its cycles)")
    ax.set_xlim(lo_x, hi_x)
    ax.set_ylim(lo_y, hi_y)
    ax.set_xlabel("arithmetic intensity (MACs per external-memory word)")
    ax.set_ylabel("achieved MACs per cycle")
    ax.set_title(f"GA-2 roofline, chip {doc['chip']}: {doc['what']}", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    write_png(path, fig, out=out or sys.stdout)
