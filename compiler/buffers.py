"""Where every tensor lives: scratchpad buffers, their lifetimes, the external layout, the allocator.

Buffers are planned once (model spec 4.5-4.7) and get a scratchpad address lazily, the first time
emission asks for one, from a first-fit allocator with coalescing (4.8); the allocation order, not
the buffer ids, decides the addresses.

On a chip with ``mm_pack = 1`` (docs/mm-fast.md) an int8 weight that is only ever the B operand of
untransposed matmuls is stored packed, four int8 a word (`packed_weights`): element (i, j) is byte j % 4
(byte 0 = bits 7:0) of word ``i * ceil(cols / 4) + j // 4``, in the external image and in its scratchpad
buffer alike, and its MM tiles read it with ``pb = 1``.

On a chip with ``mm_pack_c = 1`` (docs/mm-pack-c.md) the same layout extends to activations
(`packed_activations`): a tensor that is only ever written by fused matmuls (``pc = 1``), loaded as an
input, stored as an output, or read as the B operand of a matmul (``pb = 1``, transposed or not) is kept
four int8 a word, so the K and V rows of a resident pool move a quarter of the words.
"""
from __future__ import annotations

from dataclasses import dataclass

from hdl.config import BOOK

from .graph import CompileError, Graph

__all__ = ["Buffer", "ExtEntry", "Allocator", "plan_buffers", "plan_lifetimes", "plan_external",
           "packed_words", "packed_weights", "packed_activations", "pack_rows", "unpack_rows", "row_words",
           "PACK"]

PACK = 4        # int8 values a word of a packed weight (mm_pack chips)


def packed_weights(graph: Graph, config=BOOK) -> frozenset:
    """Ids of the weights stored four int8 a word: on a chip with ``mm_pack = 1``, every int8 weight whose
    consumers are all matmuls reading it as their B operand untransposed (MM's ``pb`` needs ``tb = 0``);
    none on any other chip. A weight read any other way (as A, transposed, sliced, added, stored) keeps
    one value a word."""
    if not getattr(config, "mm_pack", 0):
        return frozenset()
    out = set()
    for n in graph.nodes:
        if n.op != "weight" or n.attrs.get("bits", 8) != 8:
            continue
        users = [graph.nodes[c] for c in graph.consumers(n.id)]
        if users and all(c.op == "matmul" and c.ins[1] == n.id and c.ins[0] != n.id
                         and not c.attrs["transpose_b"] for c in users):
            out.add(n.id)
    return frozenset(out)


def packed_activations(graph: Graph, config=BOOK) -> frozenset:
    """Ids of the activations kept four int8 a word (and of the outputs that store them): on a chip with
    ``mm_pack_c = 1``, every group of nodes that share one buffer (a concat with its inputs, a slice with
    its source) made only of inputs, matmuls (fused, written with ``pc = 1``), concats and slices, whose
    every reader outside the group is a matmul taking it as B only (read with ``pb = 1``, transposed or
    not) or an output; none on any other chip. Anything else (an A operand, a softmax, an add, a relu, a
    row that feeds two concats) keeps one value a word for the whole group."""
    if not getattr(config, "mm_pack_c", 0):
        return frozenset()
    nodes = graph.nodes
    parent = list(range(len(nodes)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for n in nodes:
        if n.op in ("concat", "slice"):
            for i in n.ins:
                parent[root(i)] = root(n.id)
    groups = {}
    for n in nodes:
        groups.setdefault(root(n.id), []).append(n.id)
    out = set()
    for members in groups.values():
        inside = set(members)
        ok = any(nodes[i].op in ("input", "matmul") for i in members)
        for i in members:
            if not ok:
                break
            if nodes[i].op not in ("input", "matmul", "concat", "slice"):
                ok = False
                break
            for c in graph.consumers(i):
                user = nodes[c]
                if c in inside or user.op == "output":
                    continue
                if not (user.op == "matmul" and user.ins[1] == i and user.ins[0] != i):
                    ok = False
                    break
        if ok:
            out |= inside
            out |= {c for i in members for c in graph.consumers(i) if nodes[c].op == "output"}
    return frozenset(out)


def row_words(node, packed: bool = False) -> int:
    """Words a row of `node` takes in its buffer: ceil(cols / 4) packed, cols otherwise."""
    return -(-node.cols // PACK) if packed else node.cols


def unpack_rows(words, rows: int, cols: int) -> list:
    """The int8 matrix (`rows` x `cols`) of words packed by `pack_rows`, sign-extended byte by byte."""
    per = -(-cols // PACK)
    out = []
    for r in range(rows):
        row = []
        for j in range(cols):
            b = (words[r * per + j // PACK] >> (8 * (j % PACK))) & 0xFF
            row.append(b - 256 if b & 0x80 else b)
        out.append(row)
    return out


def pack_rows(rows) -> list:
    """The words of an int8 matrix packed four a word: row by row, ceil(cols / 4) words a row, value j of
    a row in byte j % 4 of the row's word j // 4 (two's complement bytes, unused bytes 0)."""
    words = []
    for row in rows:
        for w0 in range(0, len(row), PACK):
            w = 0
            for b, v in enumerate(row[w0:w0 + PACK]):
                w |= (v & 0xFF) << (8 * b)
            words.append(w)
    return words


def packed_words(node, packed: bool = False) -> int:
    """Words of an input/weight/output: one value a word, int4 weights eight a word, a packed int8
    weight (`packed_weights`) ceil(cols / 4) a row."""
    if node.op == "weight" and node.attrs.get("bits", 8) == 4:
        return -(-node.size // 8)
    if packed:
        return node.rows * -(-node.cols // PACK)
    return node.size


@dataclass
class Buffer:
    """A scratchpad region shared by the nodes located in it.

    Attributes
    ----------
    id : int
        Creation order.
    words : int
        Size in words.
    addr : int or None
        Scratchpad address while allocated.
    last_use : int
        Id of the last node that reads or writes the buffer (-1: never, or already released).
    """
    id: int
    words: int
    addr: int | None = None
    last_use: int = -1


@dataclass
class ExtEntry:
    """One region of external memory: an input, a weight or an output (``packed``: a weight stored four
    int8 a word, `packed_weights`)."""
    name: str
    address: int
    shape: tuple
    node: int
    kind: str
    words: int
    packed: bool = False


class Allocator:
    """First-fit allocator with coalescing over the scratchpad (model spec 4.8).

    Parameters
    ----------
    size : int
        Words to allocate from: the chip's scratchpad depth (default: the book's chip's).
    """

    def __init__(self, size: int = BOOK.spad_depth):
        self.size = size
        self.free = [(0, size)]
        self.hwm = 0

    def alloc(self, n: int, what: str = "") -> int:
        for i, (start, size) in enumerate(self.free):
            if size >= n:
                if size == n:
                    del self.free[i]
                else:
                    self.free[i] = (start + n, size - n)
                self.hwm = max(self.hwm, start + n)
                return start
        largest = max((s for _, s in self.free), default=0)
        raise CompileError(f"scratchpad full: {what or 'a buffer'} needs {n} words, the largest free "
                           f"extent holds {largest} (of {self.size})")

    def release(self, start: int, n: int) -> None:
        extents = sorted(self.free + [(start, n)])
        merged = []
        for s, size in extents:
            if merged and merged[-1][0] + merged[-1][1] >= s:
                ps, psize = merged[-1]
                merged[-1] = (ps, max(ps + psize, s + size) - ps)
            else:
                merged.append((s, size))
        self.free = merged


def plan_buffers(graph: Graph, packed=frozenset()):
    """Return ``(loc, buffers)``: loc[node id] = (buffer id, row offset) or None; buffers by id. The
    weights whose ids are in `packed` get buffers of their packed size."""
    nodes = graph.nodes
    loc = [None] * len(nodes)
    buffers: list[Buffer] = []

    def new_buffer(words):
        buffers.append(Buffer(len(buffers), words))
        return len(buffers) - 1

    for n in reversed(nodes):
        if n.op in ("output", "argmax", "slice"):
            continue
        if loc[n.id] is None:
            if n.op == "weight" and n.attrs.get("bits", 8) == 4:
                words = -(-n.size // 8) * 8
            else:
                words = packed_words(n, n.id in packed)
            loc[n.id] = (new_buffer(words), 0)
        if n.op == "relu":
            src = nodes[n.ins[0]]
            if loc[src.id] is not None:
                raise CompileError(f"{n.label()}: its input {src.label()} is already placed elsewhere")
            loc[src.id] = loc[n.id]
        elif n.op == "concat":
            buf, off = loc[n.id]
            a, b = nodes[n.ins[0]], nodes[n.ins[1]]
            for src, o in ((a, off), (b, off + a.rows)):
                if loc[src.id] is not None:
                    raise CompileError(f"{n.label()}: its input {src.label()} already lives in another "
                                       f"buffer (it feeds two concats or a concat and a relu)")
                loc[src.id] = (buf, o)
    for n in nodes:
        if n.op == "slice":
            src = nodes[n.ins[0]]
            if any(graph.nodes[c].op in ("concat", "relu") for c in graph.consumers(n.id)):
                raise CompileError(f"{n.label()}: a slice cannot feed a concat or a relu")
            if loc[src.id] is None:
                raise CompileError(f"{n.label()}: its source {src.label()} has no buffer")
            buf, off = loc[src.id]
            loc[n.id] = (buf, off + n.attrs["start"])
    for n in nodes:
        if n.op == "argmax":
            loc[n.id] = (new_buffer(n.rows), 0)
    return loc, buffers


def plan_lifetimes(graph: Graph, loc, buffers) -> None:
    """Set each buffer's last use (model spec 4.6); loads of inputs and weights are not uses."""
    for n in graph.nodes:
        if n.op in ("input", "weight"):
            continue
        if loc[n.id] is not None:
            b = buffers[loc[n.id][0]]
            b.last_use = max(b.last_use, n.id)
        for i in n.ins:
            if loc[i] is not None:
                b = buffers[loc[i][0]]
                b.last_use = max(b.last_use, n.id)


def plan_external(graph: Graph, ext_size: int, packed=frozenset()) -> dict:
    """The external map: inputs and weights in node order from address 0, then the outputs; the weights
    whose ids are in `packed` take their packed words."""
    ext = {}
    addr = 0
    order = [n for n in graph.nodes if n.op in ("input", "weight")] + \
            [n for n in graph.nodes if n.op == "output"]
    for n in order:
        name = n.attrs["name"]
        if name in ext:
            raise CompileError(f"{n.label()}: the external name {name!r} is used twice")
        kind = n.op
        words = packed_words(n, n.id in packed)
        ext[name] = ExtEntry(name, addr, n.shape, n.id, kind, words, packed=n.id in packed)
        addr += words
    if addr > ext_size:
        raise CompileError(f"external memory too small: the program needs {addr} words, the chip has {ext_size}")
    return ext
