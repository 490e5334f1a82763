"""A small resident serving trace shared by the tests that compare two chips on it (packed weights, packed
K/V): six requests with shared prefixes, a window, a sink and copy-on-write, on a pool of 12 pages of 2 rows."""
from __future__ import annotations

from host.engine import Engine, Request
from sim.backends.reference import ReferenceMachine

__all__ = ["serve_on_chips", "batch_inputs"]

_PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
_REQUESTS = [Request(0, [7, 1, 4, 4, 2], 4, 0), Request(1, [7, 1, 4, 4, 2, 9], 3, 0), Request(2, [2, 2], 5, 1),
             Request(3, [9], 3, 2), Request(4, _PROMPT, 3, 3), Request(5, _PROMPT[:5] + [0], 2, 6)]
_KEYS = ("tokens", "logits_int", "preempted", "prefix_hit_rows")


def serve_on_chips(m, plain, other):
    """Serve the trace in resident mode on the reference machine of chip `plain` and of chip `other`;
    assert every request got the same tokens, integer logits, preemptions and prefix hits on both, and
    some tokens; return the two runs' total cycles (plain's, other's)."""
    kw = dict(max_batch=4, window=4, sinks=1, page=2, n_pages=12)
    res = [Engine(m, ReferenceMachine(config=cfg), config=cfg, mode="resident", **kw).run(_REQUESTS)
           for cfg in (plain, other)]
    rows = [[[r[k] for k in _KEYS] for r in run["requests"]] for run in res]
    assert rows[1] == rows[0]
    assert all(r["tokens"] for r in res[1]["requests"])
    return res[0]["total_cycles"], res[1]["total_cycles"]


def batch_inputs(m, g, seed):
    """Inputs of a batched graph `g` of model `m`: embeddings for x, varied small rows for the cache, zeros
    for zk/zv."""
    out = {}
    for n in g.inputs():
        name, (rows, cols) = n.attrs["name"], n.shape
        if name == "x":
            out[name] = [m["E"][(3 * r + seed) % len(m["E"])] for r in range(rows)]
        elif name in ("zk", "zv"):
            out[name] = [[0.0] * cols]
        else:
            out[name] = [[0.05 * (((r + 2) * (c + seed + 1) * 5) % 13 - 6) for c in range(cols)]
                         for r in range(rows)]
    return out
