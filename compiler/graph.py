"""The compiler's IR: a list of nodes built by `Graph` methods, and its float evaluation.

A node's id is its position in the list; every builder call checks shapes at once and raises
`CompileError` naming the node and the shapes (model spec 4.1). `evaluate_float` runs the graph on
real numbers node by node (model spec 4.2); calibration and the scale planner use it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["CompileError", "Node", "Graph", "evaluate_float", "OPS"]

OPS = ("input", "weight", "matmul", "softmax", "add", "relu", "concat", "slice", "argmax", "output")


class CompileError(ValueError):
    """A graph, a calibration set or an input that the compiler cannot turn into a program."""


@dataclass
class Node:
    """One operation of the graph.

    Attributes
    ----------
    id : int
        Position in the graph's node list.
    op : str
        One of `OPS`.
    ins : tuple of int
        Ids of the input nodes, in operand order.
    shape : tuple of int
        ``(rows, cols)`` of the value the node produces.
    attrs : dict
        Operation attributes (``name``, ``array``, ``bits``, ``transpose_b``, ``scale``, ``start``,
        ``tag``).
    """
    id: int
    op: str
    ins: tuple
    shape: tuple
    attrs: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[1]

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    def label(self) -> str:
        name = self.attrs.get("name")
        return f"node {self.id} ({self.op}{' ' + repr(name) if name else ''}, shape {self.shape[0]}x{self.shape[1]})"


def _shape(shape, what):
    try:
        r, c = shape
    except (TypeError, ValueError):
        raise CompileError(f"{what}: shape {shape!r} is not a (rows, cols) pair") from None
    if not (isinstance(r, int) and isinstance(c, int)) or r < 1 or c < 1:
        raise CompileError(f"{what}: shape {shape!r} needs two positive integers")
    return (r, c)


class Graph:
    """A dataflow graph of one forward pass, built node by node.

    Every builder method returns the new node's id (an int) and checks its operands' shapes at once.

    Attributes
    ----------
    nodes : list of Node
        The nodes in creation order (a node's id is its index).
    """

    def __init__(self):
        self.nodes: list[Node] = []

    def __len__(self):
        return len(self.nodes)

    def __getitem__(self, i) -> Node:
        return self.nodes[i]

    # ---- internals ----
    def _node(self, ref, what) -> Node:
        if isinstance(ref, Node):
            ref = ref.id
        if not isinstance(ref, int) or not 0 <= ref < len(self.nodes):
            raise CompileError(f"{what}: operand {ref!r} is not a node of this graph")
        return self.nodes[ref]

    def _add(self, op, ins, shape, **attrs) -> int:
        n = Node(len(self.nodes), op, tuple(ins), shape, attrs)
        self.nodes.append(n)
        return n.id

    def _next(self, op):
        return f"node {len(self.nodes)} ({op})"

    # ---- builder ----
    def input(self, name: str, shape) -> int:
        """A tensor supplied per run under `name`."""
        what = self._next("input")
        if not isinstance(name, str) or not name:
            raise CompileError(f"{what}: input name {name!r} must be a non-empty string")
        return self._add("input", (), _shape(shape, f"{what} {name!r}"), name=name)

    def weight(self, name: str, array, bits: int = 8) -> int:
        """A constant matrix (a list of equal-length rows of numbers), quantized to `bits` (8 or 4)."""
        what = f"{self._next('weight')} {name!r}"
        if bits not in (4, 8):
            raise CompileError(f"{what}: bits = {bits!r}, must be 4 or 8")
        try:
            rows = [list(r) for r in array]
        except TypeError:
            raise CompileError(f"{what}: the array is not a list of rows") from None
        if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
            raise CompileError(f"{what}: the array must be a non-empty list of equal-length rows")
        return self._add("weight", (), (len(rows), len(rows[0])), name=name, array=rows, bits=bits)

    def matmul(self, a, b, transpose_b: bool = False, scale: float = 1.0) -> int:
        """``scale * (a @ b)`` or ``scale * (a @ b^T)`` when `transpose_b`."""
        what = self._next("matmul")
        A, B = self._node(a, what), self._node(b, what)
        inner_b = B.cols if transpose_b else B.rows
        if A.cols != inner_b:
            raise CompileError(
                f"{what}: inner dimensions differ: {A.label()} is {A.rows}x{A.cols}, {B.label()} is "
                f"{B.rows}x{B.cols}{' (transposed)' if transpose_b else ''}")
        if not (isinstance(scale, (int, float)) and scale > 0):
            raise CompileError(f"{what}: factor {scale!r} must be a positive number")
        out = (A.rows, B.rows if transpose_b else B.cols)
        return self._add("matmul", (A.id, B.id), out, transpose_b=bool(transpose_b), scale=float(scale))

    def softmax(self, a) -> int:
        """Softmax along each row."""
        A = self._node(a, self._next("softmax"))
        return self._add("softmax", (A.id,), A.shape)

    def add(self, a, b) -> int:
        """Element-wise sum of two tensors of the same shape."""
        what = self._next("add")
        A, B = self._node(a, what), self._node(b, what)
        if A.shape != B.shape:
            raise CompileError(f"{what}: shapes differ: {A.label()} and {B.label()}")
        return self._add("add", (A.id, B.id), A.shape)

    def relu(self, a) -> int:
        A = self._node(a, self._next("relu"))
        return self._add("relu", (A.id,), A.shape)

    def concat_rows(self, a, b) -> int:
        """The rows of `a` followed by the rows of `b`."""
        what = self._next("concat")
        A, B = self._node(a, what), self._node(b, what)
        if A.cols != B.cols:
            raise CompileError(f"{what}: column counts differ: {A.label()} and {B.label()}")
        return self._add("concat", (A.id, B.id), (A.rows + B.rows, A.cols))

    def slice_rows(self, a, start: int, count: int) -> int:
        """Rows ``start .. start+count-1`` of `a` (a view, no copy)."""
        what = self._next("slice")
        A = self._node(a, what)
        if not (isinstance(start, int) and isinstance(count, int)) or start < 0 or count < 1 \
                or start + count > A.rows:
            raise CompileError(f"{what}: rows {start}..{start}+{count} are outside {A.label()}")
        return self._add("slice", (A.id,), (count, A.cols), start=start)

    def argmax(self, a) -> int:
        """Index of the first maximum of each row (shape rows x 1)."""
        A = self._node(a, self._next("argmax"))
        return self._add("argmax", (A.id,), (A.rows, 1))

    def output(self, a, name: str) -> int:
        """Store `a` to external memory under `name`."""
        what = self._next("output")
        A = self._node(a, what)
        if not isinstance(name, str) or not name:
            raise CompileError(f"{what}: output name {name!r} must be a non-empty string")
        if any(n.op == "output" and n.attrs["name"] == name for n in self.nodes):
            raise CompileError(f"{what}: output name {name!r} is used twice")
        return self._add("output", (A.id,), A.shape, name=name)

    def tag(self, node, name: str) -> int:
        """Attach a range tag (a key of `compile_graph`'s `ranges`) to a node; returns the node."""
        N = self._node(node, "tag")
        N.attrs["tag"] = name
        return N.id

    # ---- queries ----
    def consumers(self, nid: int) -> list[int]:
        return [n.id for n in self.nodes if nid in n.ins]

    def inputs(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "input"]


# ---- float evaluation (model spec 4.2) ------------------------------------------------------------

def _check_input(node: Node, value):
    try:
        rows = [list(r) for r in value]
    except TypeError:
        raise CompileError(f"input {node.attrs['name']!r}: value is not a list of rows") from None
    if len(rows) != node.rows or any(len(r) != node.cols for r in rows):
        got = f"{len(rows)}x{len(rows[0]) if rows else 0}"
        raise CompileError(f"input {node.attrs['name']!r}: expected shape {node.rows}x{node.cols}, got {got}")
    return rows


def evaluate_float(graph: Graph, inputs: dict) -> list:
    """Every node's value as a 2-D list of floats, in node order (index = node id).

    Sums run left to right from integer 0 (so results are bit-exact with the book's float model).
    """
    vals = []
    for n in graph.nodes:
        op = n.op
        if op == "input":
            name = n.attrs["name"]
            if name not in inputs:
                raise CompileError(f"input {name!r} is missing (needed by {n.label()})")
            v = _check_input(n, inputs[name])
        elif op == "weight":
            v = n.attrs["array"]
        elif op == "matmul":
            a, b = vals[n.ins[0]], vals[n.ins[1]]
            if n.attrs["transpose_b"]:
                b = [list(col) for col in zip(*b)]
            f = n.attrs["scale"]
            k = len(b)
            v = [[f * sum(row[t] * b[t][j] for t in range(k)) for j in range(len(b[0]))] for row in a]
        elif op == "softmax":
            v = []
            for row in vals[n.ins[0]]:
                mx = max(row)
                e = [math.exp(t - mx) for t in row]
                z = sum(e)
                v.append([t / z for t in e])
        elif op == "add":
            a, b = vals[n.ins[0]], vals[n.ins[1]]
            v = [[p + q for p, q in zip(ra, rb)] for ra, rb in zip(a, b)]
        elif op == "relu":
            v = [[max(0.0, t) for t in row] for row in vals[n.ins[0]]]
        elif op == "concat":
            v = [list(r) for r in vals[n.ins[0]]] + [list(r) for r in vals[n.ins[1]]]
        elif op == "slice":
            s = n.attrs["start"]
            v = [list(r) for r in vals[n.ins[0]][s:s + n.rows]]
        elif op == "argmax":
            v = [[float(row.index(max(row)))] for row in vals[n.ins[0]]]
        elif op == "output":
            v = vals[n.ins[0]]
        else:  # pragma: no cover - the builder only makes the ops above
            raise CompileError(f"{n.label()}: unknown operation")
        vals.append(v)
    return vals
