"""The figures' plotting, shared by the commands that draw (``sim.serve``, ``sim.sweep``,
``sim.paging_study``): matplotlib without a display, and one bar or step chart written atomically."""
from __future__ import annotations

from sim.cli import UsageError, write_png

__all__ = ["pyplot", "chart"]


def pyplot(what: str = "drawing the figures", hint: str = ""):
    """`matplotlib.pyplot` on the Agg backend (no display needed); a missing matplotlib is a `UsageError`
    saying `what` needs it, then `hint` (e.g. an option that does without figures)."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(f"{what} needs matplotlib (pip install matplotlib, or pip install -e '.[test]')"
                         f"{hint}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def chart(path, title, xs, ys, xlabel, ylabel, kind="line") -> None:
    """Draw `ys` against `xs` to the PNG `path`: bars (``kind="bar"``, one per x, labelled by it) or a
    step line (a value holds until the next x)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if kind == "bar":
        ax.bar([str(x) for x in xs], ys)
    else:
        ax.step(xs, ys, where="post")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    write_png(path, fig)              # atomic: no half-drawn figure is left behind
