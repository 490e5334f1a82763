"""The integer interpreter (model spec 4.13): what the chip must compute, node by node.

It uses only the plan (scales, requantizer parameters, fused relus) and the golden arithmetic of
`hdl.arith`, never the emitted code, so a program run on any backend must read back exactly this.
"""
from __future__ import annotations

import math

from hdl.arith import argmax_first, requant, s32, softmax_q16, vadd_sat

from .image import quantized_inputs

__all__ = ["interpret", "interpret_all", "interpret_readback", "stage_check"]


def interpret_all(P, inputs) -> list:
    """The integer value (2-D list) of every node, index = node id."""
    nodes = P.graph.nodes
    q = quantized_inputs(P, inputs)
    vals = []
    for n in nodes:
        op = n.op
        if op in ("input", "weight"):
            v = q[n.attrs["name"]]
        elif op == "matmul":
            a, b = vals[n.ins[0]], vals[n.ins[1]]
            if n.attrs["transpose_b"]:
                b = [list(col) for col in zip(*b)]
            m, s = P.rq_params[n.id]
            relu = int(n.id in P.relu_fused)
            k = len(b)
            # the accumulator is a 32-bit register: wrap like the hardware does
            v = [[requant(s32(sum(row[t] * b[t][j] for t in range(k))), m, s, relu)
                  for j in range(len(b[0]))] for row in a]
        elif op == "softmax":
            m, s = P.rq_params[n.id]
            v = [[requant(p, m, s) for p in softmax_q16(row)] for row in vals[n.ins[0]]]
        elif op == "add":
            ops = []
            for j, i in enumerate(n.ins):
                x = vals[i]
                if (n.id, j) in P.rq_params:
                    m, s = P.rq_params[(n.id, j)]
                    x = [[requant(t, m, s) for t in row] for row in x]
                ops.append(x)
            v = [[vadd_sat(p, r) for p, r in zip(ra, rb)] for ra, rb in zip(*ops)]
        elif op == "relu":
            v = [list(r) for r in vals[n.ins[0]]]       # already applied by the fused requantizer
        elif op == "concat":
            v = [list(r) for r in vals[n.ins[0]]] + [list(r) for r in vals[n.ins[1]]]
        elif op == "slice":
            st = n.attrs["start"]
            v = [list(r) for r in vals[n.ins[0]][st:st + n.rows]]
        elif op == "argmax":
            v = [[argmax_first(row)] for row in vals[n.ins[0]]]
        elif op == "output":
            v = vals[n.ins[0]]
        else:  # pragma: no cover
            raise ValueError(n.op)
        vals.append(v)
    return vals


def interpret(P, inputs) -> dict:
    """name -> integer 2-D list of every output of `P` on `inputs`."""
    vals = interpret_all(P, inputs)
    return {n.attrs["name"]: vals[n.id] for n in P.graph.nodes if n.op == "output"}


def interpret_readback(P, inputs) -> dict:
    """The interpreter's outputs in `readback`'s form: name -> (ints 2-D, floats 2-D)."""
    out = {}
    for name, ints in interpret(P, inputs).items():
        node = P.graph.nodes[P.ext_map[name].node]
        sc = 1.0 if P.graph.nodes[node.ins[0]].op == "argmax" else P.scales[node.id]
        out[name] = (ints, [[v * sc for v in row] for row in ints])
    return out


def stage_check(P, inputs) -> list:
    """Compare every computed tensor with the real result of its operation on its dequantized inputs.

    Tolerance 1 level (2 for adds, which round twice), after clamping the real value to +-127 levels.
    Returns a list of one-line problems (empty when every stage is within tolerance).
    """
    nodes = P.graph.nodes
    vals = interpret_all(P, inputs)
    deq = lambda nid: [[v * P.scales[nid] for v in row] for row in vals[nid]]
    problems = []
    for n in nodes:
        if n.op not in ("matmul", "softmax", "add"):
            continue
        if n.op == "matmul":
            a, b = deq(n.ins[0]), deq(n.ins[1])
            if n.attrs["transpose_b"]:
                b = [list(c) for c in zip(*b)]
            real = [[n.attrs["scale"] * sum(r[t] * b[t][j] for t in range(len(b))) for j in range(len(b[0]))]
                    for r in a]
            if n.id in P.relu_fused:
                real = [[max(0.0, v) for v in row] for row in real]
            tol = 1
        elif n.op == "softmax":
            real = []
            for row in deq(n.ins[0]):
                e = [math.exp(v - max(row)) for v in row]
                real.append([v / sum(e) for v in e])
            tol = 1
        else:
            a, b = deq(n.ins[0]), deq(n.ins[1])
            real = [[p + q for p, q in zip(ra, rb)] for ra, rb in zip(a, b)]
            tol = 2
        sc = P.scales[n.id]
        for i, (ri, gi) in enumerate(zip(real, vals[n.id])):
            for j, (r, got) in enumerate(zip(ri, gi)):
                want = max(-127.0, min(127.0, r / sc))
                if abs(got - want) > tol:
                    problems.append(f"{n.label()} [{i}][{j}]: integer {got}, real {want:.3f} levels")
    return problems
