"""The integer interpreter (model spec 4.13): what the chip must compute, node by node.

It uses only the plan (scales, requantizer parameters, fused relus) and the golden arithmetic of
`hdl.arith`, never the emitted code, so a program run on any backend must read back exactly this.
"""
from __future__ import annotations

from hdl.arith import argmax_first, requant, s32, softmax_q16, vadd_sat

from .image import quantized_inputs

__all__ = ["interpret", "interpret_all", "interpret_readback"]


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
