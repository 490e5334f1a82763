"""The tiny language model: its weights, one float decode step, and the graph the compiler lowers.

One layer, one head, V = D = 16, HID = 32 (model spec 1). Floats are bit-exact with the book's model
under CPython: one `random.Random(seed)` draws every weight, sums run left to right from integer 0.
"""
from __future__ import annotations

import math
import random

from compiler import CompileError, Graph

__all__ = ["V", "D", "HID", "hadamard", "f_next", "make_model", "vm", "float_step", "float_windowed",
           "float_generate", "argmax", "build_graph"]

V = 16      # vocabulary
D = 16      # model width
HID = 32    # feed-forward width


def hadamard(n: int) -> list:
    """The Sylvester Hadamard matrix of order `n` (a power of two), row 0 all ones."""
    if not isinstance(n, int) or n < 1 or n & (n - 1):
        raise ValueError(f"hadamard order {n!r} is not a power of two")
    H = [[1]]
    while len(H) < n:
        H = [row + row for row in H] + [row + [-v for v in row] for row in H]
    return H


def f_next(t: int) -> int:
    """The designed next-token rule of the structured model."""
    return (5 * t + 3) % 16


def _draw(gen, rows, cols, sd):
    return [[gen.gauss(0, sd) for _ in range(cols)] for _ in range(rows)]


def make_model(kind: str = "structured", seed=None, noise: float = 0.45) -> dict:
    """The model's weights as a dict of 2-D lists: kind, E, Wq, Wk, Wv, Wo, W1, W2, Wout.

    ``structured``: Hadamard embeddings and an output matrix that makes token t predict f(t), plus
    gaussian perturbations of deviation `noise`-scaled (seed 1 unless given). ``random``: every matrix
    drawn (a seed is required, `noise` is ignored).
    """
    if kind == "structured":
        gen = random.Random(1 if seed is None else seed)
        H = hadamard(D)
        E = [[H[t][d] / 4 for d in range(D)] for t in range(V)]
        finv = [0] * V
        for t in range(V):
            finv[f_next(t)] = t
        Wout = [[8.0 * E[finv[j]][d] for j in range(V)] for d in range(D)]
        s = noise
    elif kind == "random":
        if seed is None:
            raise ValueError("a random model needs a seed (make_model('random', seed=...))")
        gen = random.Random(seed)
        E = [[v / 4 for v in row] for row in _draw(gen, V, D, 1.0)]
        Wout = _draw(gen, D, V, 1 / math.sqrt(16))
        s = 1.0
    else:
        raise ValueError(f"model kind {kind!r} is not 'structured' or 'random'")
    m = {"kind": kind, "E": E}
    for name in ("Wq", "Wk", "Wv", "Wo"):
        m[name] = _draw(gen, D, D, s / math.sqrt(D))
    m["W1"] = _draw(gen, D, HID, s / math.sqrt(D))
    m["W2"] = _draw(gen, HID, D, s / math.sqrt(HID))
    m["Wout"] = Wout
    return m


def vm(x, W) -> list:
    """Row vector times matrix, each sum left to right from integer 0."""
    n = len(x)
    return [sum(x[i] * W[i][j] for i in range(n)) for j in range(len(W[0]))]


def argmax(row) -> int:
    """The first index of the maximum (the token choice everywhere)."""
    return row.index(max(row))


def float_step(m, tok, kc, vc):
    """One float decode step; returns ``(logits, k, v, extras)``. The caller's caches are not modified."""
    x = m["E"][tok]
    q, k, v = vm(x, m["Wq"]), vm(x, m["Wk"]), vm(x, m["Wv"])
    keys, vals = list(kc) + [k], list(vc) + [v]
    sc = [sum(q[i] * key[i] for i in range(len(q))) / math.sqrt(16) for key in keys]
    mx = max(sc)
    e = [math.exp(t - mx) for t in sc]
    z = sum(e)
    a = [sum((e[p] / z) * vals[p][i] for p in range(len(vals))) for i in range(D)]
    o = vm(a, m["Wo"])
    h = [x[i] + o[i] for i in range(D)]
    r = [max(0.0, t) for t in vm(h, m["W1"])]
    f2 = vm(r, m["W2"])
    y = [h[i] + f2[i] for i in range(D)]
    logits = vm(y, m["Wout"])
    return logits, k, v, {"x": x, "o": vm(a, m["Wo"]), "f": f2}


def float_windowed(m, tok, kc, vc, W):
    """`float_step` attending the new token and at most W-1 previous ones (W None or 1: no cut)."""
    if W is not None and W >= 2 and len(kc) > W - 1:
        kc, vc = kc[len(kc) - (W - 1):], vc[len(vc) - (W - 1):]
    return float_step(m, tok, kc, vc)


def float_generate(m, start, n, W=None) -> list:
    """Greedy float decoding from `start` for `n` steps (optionally windowed); returns n+1 tokens."""
    toks, kc, vc = [start], [], []
    for _ in range(n):
        logits, k, v, _ = float_windowed(m, toks[-1], kc, vc, W)
        kc.append(k)
        vc.append(v)
        toks.append(argmax(logits))
    return toks


def build_graph(m, L: int) -> Graph:
    """The graph of one decode step with context `L` (the new token included), node order of spec 1.6."""
    if not isinstance(L, int) or L < 1:
        raise CompileError(f"context length L = {L!r} must be a positive integer")
    g = Graph()
    x = g.tag(g.input("x", (1, D)), "x")
    q = g.matmul(x, g.weight("Wq", m["Wq"]))
    k = g.tag(g.matmul(x, g.weight("Wk", m["Wk"])), "k")
    v = g.tag(g.matmul(x, g.weight("Wv", m["Wv"])), "v")
    if L > 1:
        keys = g.tag(g.concat_rows(g.tag(g.input("kc", (L - 1, D)), "k"), k), "k")
        vals = g.tag(g.concat_rows(g.tag(g.input("vc", (L - 1, D)), "v"), v), "v")
    else:
        keys, vals = k, v
    scores = g.matmul(q, keys, transpose_b=True, scale=1 / math.sqrt(16))
    p = g.softmax(scores)
    a = g.matmul(p, vals)
    o = g.matmul(a, g.weight("Wo", m["Wo"]))
    h = g.add(x, o)
    u = g.matmul(h, g.weight("W1", m["W1"]))
    r = g.relu(u)
    f = g.matmul(r, g.weight("W2", m["W2"]))
    y = g.add(h, f)
    logits = g.matmul(y, g.weight("Wout", m["Wout"]))
    tok = g.argmax(logits)
    g.output(tok, "tok")
    g.output(logits, "logits")
    g.output(k, "k_new")
    g.output(v, "v_new")
    return g
