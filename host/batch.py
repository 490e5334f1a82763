"""Batched decode programs: one chip program runs B rows, each one token of one request (issue 14).

Batch invariance to the bit
---------------------------
A row's integers must not depend on the rows it shares a program with, so that a request served in any
batch gives exactly what it gives alone. Three things could mix rows, and each is ruled out here:

1. The scales. In `host.paged.PagedChip` every context size L has its own program, calibrated on samples
   of that L, so the activation scales (and with them every integer) depend on L. In a batch the rows
   have different contexts but share one matmul (M = B) and one requantizer scale per node, so such
   scales would make a row's integers depend on its batch mates. The batched programs therefore use a
   *universal* calibration (`universal_ranges`): every node of the graph carries a range tag, and the
   tag's range is the largest magnitude that node takes over every context 1..``CAL_STEPS`` of the float
   decodes from all 16 start tokens. The scale plan then depends on those ranges alone (the softmax's
   input and output scales are pinned anyway), never on the batch shape or on a context: `batch_program`
   checks that every node of a compiled program has the scale of its tag. A request replayed alone
   (``sim.decode --prompt``) uses the same calibration and the same builder with B = 1.
2. The arithmetic. A matmul's output element (i, j) is row i of A times column j of B, accumulated in
   full (the compiler never splits K) and requantized element by element, so with M = B rows the
   integers of row i are those of M = 1; tiling M by the array's size only reorders independent tiles.
   Residual adds (VADD), relus and requantizations are element-wise.
3. The per-row operations. Each row's attention is its own nodes: q_i (a one-row slice of Q), its keys
   and values (that row's gathered cache rows followed by its new k/v row), scores, a softmax per row
   (one SM instruction per row), p_i . V_i; the a_i rows are then concatenated (buffer placement, no
   arithmetic) for the shared output projection. The argmax is one AMAX instruction per row.

All five projections and the head run with M = B and share the weights' DMA, which is what batching
buys. A row's keys must be its cached rows followed by its new k row in one buffer, and the B-row K has
only one place in memory, so row i's k is copied next to its cached rows as ``k_i + 0`` (an add with a
zero row of the same scale: one VADD of D words, no rescale, exactly k_i's integers); the same for v.
With one row K itself follows the cached keys, as in the book's graph.

Rows are put in a canonical order (context descending, then the caller's order) so the number of
programs is that of multisets of context sizes; `BatchRunner.run` maps results back to the caller's order.
"""
from __future__ import annotations

import math

from compiler import CompileError, Graph, compile_graph, ext_image, readback
from compiler.graph import evaluate_float
from hdl.config import BOOK, ChipConfig
from host.calibrate import calibrate
from host.tiny_lm import D, V

__all__ = ["CAL_STEPS", "TAGS", "build_batch_graph", "universal_ranges", "batch_program", "BatchRunner",
           "BatchError"]

# contexts the universal calibration covers (the book's decode length)
CAL_STEPS = 32
# the range tag of every value of the graph (slices, concats and outputs take their source's)
TAGS = ("x", "q", "k", "v", "s", "p", "a", "o", "h", "u", "f", "y", "logits")


class BatchError(ValueError):
    """A batch the chip cannot run (the message names the row or the limit)."""


def build_batch_graph(m, ctxs, own_rows: bool = False, chip_argmax: bool = True, phases: bool = False) -> Graph:
    """The graph of one batched step: row i attends ``ctxs[i]`` tokens (its new one included).

    A context of 0 marks a *cache-only* row: a prompt row before the prompt's last token, whose logits
    nobody reads. The model has one layer, so such a row's attention, feed-forward and head are dead
    code: it only computes its new cache row (its k and v, which are those of a full row to the bit:
    the same row of the same matmuls, the same scales). Cache-only rows come after the full rows.

    Inputs: ``x`` (B x D, one embedding per row) and, for a row with context n > 1, ``kc{i}``/``vc{i}``
    (n-1 rows each), and ``zk``/``zv`` (one row of zeros) when B > 1 and a row has cached rows. Outputs:
    ``k_new``/``v_new`` (B x D: row i's new cache row) and, when some row is full (F of them), ``tok``
    (F x 1) and ``logits`` (F x V). Every node carries a range tag of `TAGS`.

    ``chip_argmax=False`` (resident mode): no argmax node and no ``tok`` output; the host takes each full
    row's token from the integer logits it reads anyway (`hdl.arith.argmax_first`, AMAX's function).

    ``own_rows=True`` (resident mode): in a batch of several rows, ``kc{i}``/``vc{i}`` hold all n rows a
    row attends, its own new row last: the program stores the new rows into the cache before it gathers
    (`host.batch_resident`), so no copy ``k_i + 0`` and no ``zk``/``zv`` inputs are needed.

    ``phases=True`` (resident mode, docs/resident.md): the same nodes, created phase by phase instead of
    row by row: every row's scores, then every row's softmax, then every row's p . V. The compiler lowers
    nodes in their order, so the scores share one requantizer constant, the attention matmuls another,
    and the consecutive softmaxes one RQ (`compiler.emit`); each row keeps its nodes, so its integers do
    not change.
    """
    ctxs = tuple(ctxs)
    if not ctxs or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in ctxs):
        raise CompileError(f"batch contexts {ctxs!r} must be a non-empty tuple of integers >= 0")
    B = len(ctxs)
    F = sum(1 for n in ctxs if n > 0)
    if any(n == 0 for n in ctxs[:F]):
        raise CompileError(f"batch contexts {ctxs!r}: the cache-only rows (context 0) must come last")
    g = Graph()
    X = g.tag(g.input("x", (B, D)), "x")
    if F:
        XF = X if F == B else g.tag(g.slice_rows(X, 0, F), "x")
        Q = g.tag(g.matmul(XF, g.weight("Wq", m["Wq"])), "q")
    K = g.tag(g.matmul(X, g.weight("Wk", m["Wk"])), "k")
    Vn = g.tag(g.matmul(X, g.weight("Wv", m["Wv"])), "v")
    if F:
        _attend_and_head(g, m, ctxs[:F], B, XF, Q, K, Vn, own_rows, chip_argmax, phases)
    g.tag(g.output(K, "k_new"), "k")
    g.tag(g.output(Vn, "v_new"), "v")
    return g


def _attend_and_head(g, m, ctxs, B, X, Q, K, Vn, own_rows, chip_argmax=True, phases=False) -> None:
    """The full rows' attention (row i over its cached rows and its new one), feed-forward and head."""
    zk = zv = None
    rows_a, later = [], []
    for i, n in enumerate(ctxs):
        k = g.tag(g.slice_rows(K, i, 1), "k")
        v = g.tag(g.slice_rows(Vn, i, 1), "v")
        if n > 1 and B == 1:
            # one row: K itself can sit right after the cached keys (the book's layout, no copy)
            keys = g.tag(g.concat_rows(g.tag(g.input(f"kc{i}", (n - 1, D)), "k"), K), "k")
            vals = g.tag(g.concat_rows(g.tag(g.input(f"vc{i}", (n - 1, D)), "v"), Vn), "v")
        elif n > 1 and own_rows:
            # the row's new k/v reach the cache before its rows are gathered: all n rows come from there
            keys, vals = g.tag(g.input(f"kc{i}", (n, D)), "k"), g.tag(g.input(f"vc{i}", (n, D)), "v")
        elif n > 1:
            if zk is None:
                zk, zv = g.tag(g.input("zk", (1, D)), "k"), g.tag(g.input("zv", (1, D)), "v")
            # k + 0 is k's integers copied (same scale, no rescale, VADD): the copy sits right after the
            # row's cached keys, in the one buffer its attention reads
            keys = g.tag(g.concat_rows(g.tag(g.input(f"kc{i}", (n - 1, D)), "k"), g.tag(g.add(k, zk), "k")), "k")
            vals = g.tag(g.concat_rows(g.tag(g.input(f"vc{i}", (n - 1, D)), "v"), g.tag(g.add(v, zv), "v")), "v")
        else:
            keys, vals = k, v
        qi = g.tag(g.slice_rows(Q, i, 1), "q")
        if phases:
            later.append((qi, keys, vals))     # the row's attention comes after the loop, phase by phase
            continue
        s = g.tag(g.matmul(qi, keys, transpose_b=True, scale=1 / math.sqrt(16)), "s")
        p = g.tag(g.softmax(s), "p")
        rows_a.append(g.tag(g.matmul(p, vals), "a"))
    if phases:
        S = [g.tag(g.matmul(qi, keys, transpose_b=True, scale=1 / math.sqrt(16)), "s") for qi, keys, _ in later]
        probs = [g.tag(g.softmax(s), "p") for s in S]
        rows_a = [g.tag(g.matmul(p, vals), "a") for p, (_, _, vals) in zip(probs, later)]
    A = rows_a[0]
    for a in rows_a[1:]:
        A = g.tag(g.concat_rows(A, a), "a")
    O = g.tag(g.matmul(A, g.weight("Wo", m["Wo"])), "o")
    H = g.tag(g.add(X, O), "h")
    U = g.tag(g.matmul(H, g.weight("W1", m["W1"])), "u")
    R = g.tag(g.relu(U), "u")
    Fo = g.tag(g.matmul(R, g.weight("W2", m["W2"])), "f")
    Y = g.tag(g.add(H, Fo), "y")
    logits = g.tag(g.matmul(Y, g.weight("Wout", m["Wout"])), "logits")
    if chip_argmax:
        g.output(g.argmax(logits), "tok")
    g.tag(g.output(logits, "logits"), "logits")


def _absmax(mat) -> float:
    return max((abs(t) for row in mat for t in row), default=0.0)


_UNIVERSAL: dict = {}
_PROGRAMS: dict = {}     # (model key, chip, contexts) -> program: a pure function of them, shared by runners


def _model_key(m):
    return tuple((name, tuple(tuple(r) for r in m[name])) for name in ("E", "Wq", "Wk", "Wv", "Wo", "W1", "W2",
                                                                        "Wout"))


def universal_ranges(m, steps: int = CAL_STEPS) -> dict:
    """Per tag, the largest magnitude its nodes take over contexts 1..`steps` (unwindowed float decodes
    from every start token), evaluated on `build_batch_graph` with one row. Cached per model."""
    key = (_model_key(m), steps)
    if key not in _UNIVERSAL:
        calib, base = calibrate(m, steps, None)
        rng = {t: 0.0 for t in TAGS}
        for n, samples in sorted(calib.items()):
            g = build_batch_graph(m, (n,))
            for smp in samples:
                inputs = {"x": smp["x"]}
                if n > 1:
                    inputs["kc0"], inputs["vc0"] = smp["kc"], smp["vc"]
                vals = evaluate_float(g, inputs)
                for node in g.nodes:
                    t = node.attrs.get("tag")
                    if t is not None:
                        rng[t] = max(rng[t], _absmax(vals[node.id]))
        # x, k and v keep the ranges every book program shares (they bound the cache rows fed back)
        for t in ("x", "k", "v"):
            rng[t] = max(rng[t], base[t])
        _UNIVERSAL[key] = rng
    return dict(_UNIVERSAL[key])


def _dummy_sample(g: Graph) -> dict:
    # the scales come from the tag ranges alone; plan_scales still evaluates one input set
    return {n.attrs["name"]: [[0.0] * n.cols for _ in range(n.rows)] for n in g.inputs()}


def batch_program(m, ctxs, ranges, config: ChipConfig = BOOK):
    """Compile `build_batch_graph` for `ctxs` with the universal `ranges`; check every node's scale.

    Raises CompileError if a node's scale is not the one its tag alone decides (a batch-dependent scale
    would break batch invariance) or if the program does not fit the chip.
    """
    g = build_batch_graph(m, ctxs)
    P = compile_graph(g, [_dummy_sample(g)], ranges=ranges, config=config)
    seen = {}
    for node in g.nodes:
        if node.op in ("argmax", "weight") or (node.op == "output" and g[node.ins[0]].op == "argmax"):
            continue                    # a weight's scale is its own array's; a token has none
        t = node.attrs.get("tag")
        if t is None:
            raise CompileError(f"{node.label()} has no range tag: its scale would depend on the batch")
        if seen.setdefault(t, P.scales[node.id]) != P.scales[node.id]:
            raise CompileError(f"{node.label()}: scale {P.scales[node.id]!r} differs from tag {t!r}'s "
                               f"{seen[t]!r}")
    P.tag_scales = seen
    return P


class BatchRunner:
    """Compiles (once per batch shape) and runs batched steps on a backend.

    Parameters
    ----------
    m : dict
        The tiny LM.
    backend : object
        ``run(code, image, lat)`` (e.g. ``sim.backends.reference.ReferenceMachine``).
    lat : int
    config : hdl.config.ChipConfig

    Attributes
    ----------
    progs : dict
        Canonical context tuple -> compiled program.
    ranges : dict
        The universal calibration (`universal_ranges`).
    """

    def __init__(self, m, backend, lat: int = 8, config: ChipConfig = BOOK):
        self.m, self.backend, self.lat, self.config = m, backend, lat, config
        self.ranges = universal_ranges(m)
        self._key = (_model_key(m), config.key())
        self.progs: dict = {}
        self.unfit: dict = {}           # context tuple -> why its program does not fit the chip

    def program(self, ctxs):
        """The program of the canonical (descending) context tuple `ctxs`; CompileError if the chip cannot
        run it (remembered: the engine asks again for every step it forms)."""
        ctxs = tuple(ctxs)
        if ctxs not in self.progs:
            self.progs[ctxs] = self.check(ctxs)
        return self.progs[ctxs]

    def check(self, ctxs):
        """The program of `ctxs` like `program`, not counted among this runner's programs (`progs`)."""
        ctxs = tuple(ctxs)
        if ctxs in self.unfit:
            raise CompileError(self.unfit[ctxs])
        key = self._key + (ctxs,)
        if key not in _PROGRAMS:
            try:
                _PROGRAMS[key] = batch_program(self.m, ctxs, self.ranges, self.config)
            except CompileError as exc:
                self.unfit[ctxs] = str(exc)
                raise
        return _PROGRAMS[key]

    def run(self, rows):
        """Run one batch. `rows` is a list of ``(token, kc, vc)`` (kc/vc: the gathered cache rows, lists of
        D floats, equally long; both None for a cache-only row, see `build_batch_graph`). Returns
        ``(results, counters, program)``, results in the order of `rows`: dicts with ``tok``,
        ``logits_int`` (None for a cache-only row), ``k``, ``v`` (the new cache row as the chip's floats)."""
        if not rows:
            raise BatchError("a batch needs at least one row")
        for i, (tok, kc, vc) in enumerate(rows):
            if not (isinstance(tok, int) and 0 <= tok < V) or (kc is None) != (vc is None) \
                    or (kc is not None and len(kc) != len(vc)):
                raise BatchError(f"row {i}: bad token {tok!r} or cache rows ({kc!r:.40} keys, {vc!r:.40} values)")
        ctx_of = [0 if kc is None else len(kc) + 1 for _, kc, _ in rows]
        order = sorted(range(len(rows)), key=lambda i: -ctx_of[i])
        ctxs = tuple(ctx_of[i] for i in order)
        if max(ctxs) > self.config.mm_max_k:
            raise BatchError(f"a row attends {max(ctxs)} tokens, more than the chip's limit of "
                             f"{self.config.mm_max_k}")
        P = self.program(ctxs)
        E = self.m["E"]
        inputs = {"x": [E[rows[i][0]] for i in order]}
        if len(rows) > 1 and any(rows[i][1] for i in order):
            inputs["zk"] = inputs["zv"] = [[0.0] * D]
        for j, i in enumerate(order):
            _, kc, vc = rows[i]
            if kc:
                inputs[f"kc{j}"] = [list(r) for r in kc]
                inputs[f"vc{j}"] = [list(r) for r in vc]
        image = ext_image(P, inputs, P.ext_size)
        result = self.backend.run(P.code, image, self.lat)
        out = readback(P, result.ext)
        res = [None] * len(rows)
        for j, i in enumerate(order):
            full = ctxs[j] > 0
            res[i] = {"tok": int(out["tok"][0][j][0]) if full else None,
                      "logits_int": [int(t) for t in out["logits"][0][j]] if full else None,
                      "k": tuple(out["k_new"][1][j]), "v": tuple(out["v_new"][1][j])}
        return res, [int(c) for c in result.counters], P
