"""The external-memory image of a run, the readback of its outputs, and `run` on a backend.

The image holds every input and weight quantized at its node's scale, one two's-complement value a
word (int4 weights: eight nibbles a word, low nibble first; on an mm_pack chip the int8 weights that only
feed matmuls as B, four bytes a word, `compiler.buffers.pack_rows`; on an mm_pack_c chip the packed
activations' inputs and outputs too); output regions start at zero (model spec 4.11, 4.12). Readback turns
the output regions back into integers and floats.
"""
from __future__ import annotations

from hdl.arith import clamp, quantize, rha, s8, s32, u32

from .buffers import pack_rows, unpack_rows
from .graph import CompileError

__all__ = ["ext_image", "readback", "run", "quantize_matrix", "quantized_inputs"]


def quantize_matrix(values, scale: float, bits: int = 8) -> list:
    """A 2-D list of reals as int8 (or int4: clamp at +-7) at `scale`."""
    if bits == 4:
        return [[clamp(rha(v / scale), -7, 7) for v in row] for row in values]
    return [[quantize(v, scale) for v in row] for row in values]


def _input_matrix(P, e, inputs):
    node = P.graph.nodes[e.node]
    if e.kind == "weight":
        return node.attrs["array"]
    if e.name not in inputs:
        raise CompileError(f"input {e.name!r} is missing (the program needs {', '.join(k for k, v in P.ext_map.items() if v.kind == 'input')})")
    try:
        rows = [list(r) for r in inputs[e.name]]
    except TypeError:
        raise CompileError(f"input {e.name!r}: value is not a list of rows") from None
    if len(rows) != node.rows or any(len(r) != node.cols for r in rows):
        got = f"{len(rows)}x{len(rows[0]) if rows else 0}"
        raise CompileError(f"input {e.name!r}: expected shape {node.rows}x{node.cols}, got {got}")
    return rows


def quantized_inputs(P, inputs) -> dict:
    """name -> int matrix of every input and weight, quantized at the planned scales."""
    out = {}
    for e in P.ext_map.values():
        if e.kind in ("input", "weight"):
            node = P.graph.nodes[e.node]
            out[e.name] = quantize_matrix(_input_matrix(P, e, inputs), P.scales[e.node],
                                          node.attrs.get("bits", 8) if e.kind == "weight" else 8)
    return out


def ext_image(P, inputs, ext_size: int | None = None) -> list:
    """The external memory (a list of `ext_size` unsigned 32-bit words, by default the size `P` was
    compiled for) for one run of `P` on `inputs`."""
    ext_size = P.ext_size if ext_size is None else ext_size
    if ext_size < P.ext_words:
        raise CompileError(f"ext_size {ext_size} is smaller than the program's {P.ext_words} external words")
    image = [0] * ext_size
    q = quantized_inputs(P, inputs)
    for name, mat in q.items():
        e = P.ext_map[name]
        flat = [v for row in mat for v in row]
        if P.graph.nodes[e.node].attrs.get("bits", 8) == 4:   # eight nibbles a word, low first, zero padded
            for i in range(e.words):
                w = 0
                for j, v in enumerate(flat[8 * i:8 * i + 8]):
                    w |= (v & 0xF) << (4 * j)
                image[e.address + i] = w
        elif e.packed:                                        # four int8 a word, ceil(cols/4) words a row
            words = pack_rows(mat)
            if len(words) != e.words:
                raise CompileError(f"{e.kind} {name!r}: {len(words)} packed words, the map has {e.words}")
            image[e.address:e.address + e.words] = words
        else:
            for i, v in enumerate(flat):
                image[e.address + i] = u32(v)
    return image


def readback(P, ext) -> dict:
    """name -> (ints 2-D, floats 2-D) of every output, read from the final external memory."""
    out = {}
    for e in P.ext_map.values():
        if e.kind != "output":
            continue
        node = P.graph.nodes[e.node]
        src = P.graph.nodes[node.ins[0]]
        rows, cols = node.shape
        n_words = e.words if e.packed else rows * cols
        words = ext[e.address:e.address + n_words]
        if len(words) != n_words:
            raise CompileError(f"output {e.name!r}: external memory ends before its {n_words} words")
        if e.packed:                    # four int8 a word (mm_pack_c), at the output's scale below
            words = [w for row in unpack_rows(words, rows, cols) for w in row]
        if src.op == "argmax":
            ints = [[s32(words[r * cols + c]) for c in range(cols)] for r in range(rows)]
            sc = 1.0
        else:
            ints = [[s8(words[r * cols + c]) for c in range(cols)] for r in range(rows)]
            sc = P.scales[node.id]
        out[e.name] = (ints, [[v * sc for v in row] for row in ints])
    return out


def run(P, inputs, backend, lat: int = 8):
    """Run `P` on `inputs` with `backend` (an object with ``run(code, image, lat)``).

    Returns ``(outputs, result)``: the readback and the backend's `RunResult`.
    """
    image = ext_image(P, inputs, P.ext_size)
    result = backend.run(P.code, image, lat)
    return readback(P, result.ext), result
