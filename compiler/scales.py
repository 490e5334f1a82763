"""Scale planning and relu fusion (model spec 4.3, 4.4): one real scale per node, from calibration.

Nodes that must share a representation (concat and its inputs, relu and its input, slice and its
source, output and its source) read and write the same words, so they form one group, and the group's
scale is decided once, for all its members:

- a softmax pins its input group to Q4.4 (1/16) and its own group to 1/127;
- otherwise a group that holds a 4-bit weight takes the 4-bit rule, range / 7, because that weight's
  nibbles only reach +-7 and every partner (a slice, a concat, an output) reads the unpacked words;
- otherwise range / 127.

A graph that would fix one group twice (a 4-bit weight or a softmax output inside a pinned group) is
refused with a `CompileError` naming the node. For a 4-bit weight alone in its group (the book's
graphs) the 4-bit rule gives the book's range / 7. Warnings are collected, they never change the plan.
"""
from __future__ import annotations

from .graph import CompileError, Graph, evaluate_float

__all__ = ["plan_scales", "fuse_relus", "SOFTMAX_IN_SCALE", "SOFTMAX_OUT_SCALE"]

SOFTMAX_IN_SCALE = 1.0 / 16     # SM reads Q4.4 scores
SOFTMAX_OUT_SCALE = 1.0 / 127   # its Q0.16 result is requantized to int8 at 1/127
_PIN_NAMES = {SOFTMAX_IN_SCALE: "Q4.4 (1/16, a softmax's input)", SOFTMAX_OUT_SCALE: "1/127 (a softmax's result)"}


class _UnionFind:
    def __init__(self, n):
        self.parent = list(range(n))

    def find(self, i):
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _absmax(mat) -> float:
    m = 0.0
    for row in mat:
        for v in row:
            a = abs(v)
            if a > m:
                m = a
    return m


def plan_scales(graph: Graph, calib_samples, ranges=None):
    """Return ``(scale, rng, warnings)``: per node id its real scale (None for argmax) and range.

    `calib_samples` is a non-empty list of input dicts; `ranges` maps tag names to ranges that replace
    the calibrated range of every node carrying that tag.
    """
    nodes = graph.nodes
    samples = list(calib_samples or [])
    if not samples:
        raise CompileError("no calibration samples: the compiler needs at least one input set")
    for i, smp in enumerate(samples):
        if not isinstance(smp, dict):
            raise CompileError(f"calibration sample {i} is {type(smp).__name__} {smp!r:.40}, not a dict of "
                               f"input name -> rows (pass calib[n], not the whole calibration)")
    uf = _UnionFind(len(nodes))
    for n in nodes:
        if n.op in ("concat", "relu", "slice", "output"):
            for i in n.ins:
                uf.union(n.id, i)

    rng = [0.0] * len(nodes)
    for sample in samples:
        vals = evaluate_float(graph, sample)
        for n in nodes:
            if n.op == "argmax":
                continue
            r = _absmax(vals[n.id])
            if r > rng[n.id]:
                rng[n.id] = r
    for n in nodes:
        if n.op == "argmax":
            rng[n.id] = 0.0
    if ranges:
        for n in nodes:
            t = n.attrs.get("tag")
            if t is not None and t in ranges:
                rng[n.id] = float(ranges[t])

    gmax = {}
    for n in nodes:
        if n.op == "argmax":
            continue
        root = uf.find(n.id)
        gmax[root] = max(gmax.get(root, 0.0), rng[n.id])
        if n.op == "add":
            # the sum's scale must also hold each operand once rescaled to it
            for i in n.ins:
                gmax[root] = max(gmax[root], rng[i])

    pins, pinned_by = {}, {}
    for n in nodes:
        if n.op != "softmax":
            continue
        for root, pin, what in ((uf.find(n.ins[0]), SOFTMAX_IN_SCALE, f"its input {nodes[n.ins[0]].label()}"),
                                (uf.find(n.id), SOFTMAX_OUT_SCALE, "its own result")):
            if pins.get(root, pin) != pin:
                raise CompileError(
                    f"{n.label()}: {what} shares a scale group with {pinned_by[root]}, which fixes it at "
                    f"{_PIN_NAMES[pins[root]]}; a softmax needs {_PIN_NAMES[pin]} there")
            pins[root] = pin
            pinned_by[root] = n.label()

    four_bit = {}       # root -> the first 4-bit weight of the group
    for n in nodes:
        if n.op == "weight" and n.attrs.get("bits", 8) == 4:
            root = uf.find(n.id)
            four_bit.setdefault(root, n)
            if root in pins:
                raise CompileError(
                    f"{n.label()}: a 4-bit weight cannot share a scale group with {pinned_by[root]}, which "
                    f"fixes it at {_PIN_NAMES[pins[root]]}; its nibbles need the group's range / 7")

    # every member of a group gets the group's one scale, decided here and nowhere else
    group_scale = {}
    for n in nodes:
        if n.op == "argmax":
            continue
        root = uf.find(n.id)
        if root in group_scale:
            continue
        if root in pins:
            group_scale[root] = pins[root]
        else:
            g = gmax.get(root, 0.0)
            group_scale[root] = (g if g > 0 else 1.0) / (7 if root in four_bit else 127)
    scale = [None if n.op == "argmax" else group_scale[uf.find(n.id)] for n in nodes]

    warnings = []
    for n in nodes:
        if n.op == "softmax":
            root = uf.find(n.ins[0])
            g = max(rng[m.id] for m in nodes if m.op != "argmax" and uf.find(m.id) == root)
            if g > 127 / 16:
                warnings.append(f"softmax {n.label()}: input range {g:.4g} exceeds the Q4.4 limit {127 / 16}")
    for n in nodes:
        root = uf.find(n.id)
        if root in pins and n.op in ("concat", "relu", "input", "weight") and rng[n.id] > 127 * pins[root] * 1.001:
            warnings.append(f"{n.label()}: range {rng[n.id]:.4g} exceeds its pinned capacity {127 * pins[root]:.4g}")
    return scale, rng, warnings


def fuse_relus(graph: Graph) -> set:
    """Ids of the matmuls whose requantizer applies a relu; each relu must follow a single-use matmul."""
    fused = set()
    for n in graph.nodes:
        if n.op != "relu":
            continue
        src = graph.nodes[n.ins[0]]
        users = graph.consumers(src.id)
        if src.op != "matmul" or len(users) != 1:
            raise CompileError(f"{n.label()}: a relu must follow a matmul with no other consumer; its input "
                               f"{src.label()} has {len(users)} consumer(s)")
        fused.add(src.id)
    return fused
