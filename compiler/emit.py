"""Lowering a planned graph to GA-2 instructions (model spec 4.9) and the `Program` record (4.10).

One forward pass, node by node: inputs and weights are loaded lazily by their first consumer, every
matmul becomes MM tiles of at most the array's size (``cfg.mm_max_mn`` square, 4x4 on the book's chip)
into a temporary accumulator and one RQ, buffers are released after their last use. The program ends
with HALT; its cycle count follows `hdl.isa.busy_cycles` for the chip it was compiled for.

On a chip with ``mm_rq = 1`` (docs/fused-rq.md) a matmul's requantization is fused into its MM tiles
instead: one RQC latches the node's (m, s, relu) into the MM unit (left out when the previous RQC of the
program latched the same), and the tiles, with rq=1, write the int8 results straight into the node's
buffer at the words the RQ would have written; no accumulator, no RQ. The arithmetic is the RQ's, so the
integers are those of the unfused program.

On a chip with ``mm_pack = 1`` (docs/mm-fast.md) the int8 weights that only feed matmuls as their
untransposed B operand are stored four a word (`compiler.buffers.packed_weights`): their LD moves
ceil(cols/4) words a row, and their tiles read them with ``pb = 1``, the B address and ``ldb`` in words
(a tile's first column is a multiple of the array size, hence of 4, or the compiler refuses). On a chip with
``mm_fold = 1`` (docs/mm-fold.md) a tile of at most half the array's rows is up to twice the array wide.

On a chip with ``mm_pack_c = 1`` (docs/mm-pack-c.md) the activations of `compiler.buffers.
packed_activations` are kept four int8 a word as well: the matmuls that write them do so with ``pc = 1``
(C's address and ``ldc`` in words), the matmuls that read them as B with ``pb = 1`` (transposed: B row n's
element k is byte k % 4 of word ``B + n*ldb + k // 4``), their loads and stores move the packed words.

A run of consecutive softmax nodes (a batch's rows lowered phase by phase, ``host.batch``) is lowered
together: their outputs side by side in one extent, one SM a row, and one RQ for the whole run, which writes
the integers of one RQ a node (the RQ is element-wise with the softmax's fixed constants) and pays the
requantizer's fixed cost once.

The tiles of one matmul write disjoint parts of the accumulator and each computes its dot products in
full (K is never split), so the tile size changes the order of independent tiles and never the integers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hdl import isa
from hdl.arith import mantissa_shift
from hdl.config import BOOK, ChipConfig

from .buffers import (PACK, Allocator, packed_activations, packed_weights, plan_buffers, plan_external,
                      plan_lifetimes, row_words)
from .graph import CompileError, Graph
from .scales import fuse_relus, plan_scales

__all__ = ["Program", "compile_graph", "SOFTMAX_RQ_MULTIPLIER", "COPY_RQ"]

SOFTMAX_RQ_MULTIPLIER = 127 / 65536     # Q0.16 probability -> int8 at scale 1/127
COPY_RQ = (1 << 23, 23, 0)              # RQ with multiplier exactly 1: a copy of int8 words


@dataclass
class Program:
    """A compiled graph: the code, where everything lives, and the quantization plan.

    Attributes
    ----------
    code : list of int
        128-bit instruction words, HALT last.
    instrs : list of hdl.isa.Instr
        The same instructions as field records.
    notes : list of str
        Per instruction, its role (e.g. ``"node 2 tile j0=4"``).
    ext_map : dict
        name -> `ExtEntry` (address, shape, node, kind, words), inputs and weights first.
    ext_words : int
        External words used by the program's regions.
    ext_size : int
        External memory size the program was checked against.
    scales : list
        Real scale per node id (None for argmax nodes).
    ranges : list
        Range per node id used for the scales (after overrides).
    rq_params : dict
        Requantizer ``(mantissa, shift)`` per matmul/softmax node id and per ``(add id, operand)``.
    relu_fused : set
        Ids of the matmuls whose RQ applies the relu.
    loc, buffers
        Buffer plan: ``loc[id] = (buffer id, row offset)`` or None; buffers with their sizes.
    hwm : int
        Scratchpad high-water mark in words.
    warnings : list of str
    config : hdl.config.ChipConfig
        The chip the program was compiled for (its limits and cycle model).
    """
    graph: Graph
    code: list
    instrs: list
    notes: list
    ext_map: dict
    ext_words: int
    ext_size: int
    scales: list
    ranges: list
    rq_params: dict
    relu_fused: set
    loc: list
    buffers: list
    hwm: int
    warnings: list = field(default_factory=list)
    config: ChipConfig = BOOK

    def cycles(self, lat: int = 8) -> list:
        """Per instruction, the sequencer's fetch/issue cycles (`hdl.isa.seq_cycles`: 2 on the book's chip,
        0 after the first instruction on a prefetch chip) plus the busy cycles of the cycle model."""
        return [isa.seq_cycles(i, self.config) + isa.busy_cycles(w, lat, self.config)
                for i, w in enumerate(self.code)]

    def counters(self, lat: int = 8) -> list:
        """The five counters ``[total, mm, dma, vec, instructions]`` the cycle model predicts."""
        counters = [sum(self.cycles(lat)), 0, 0, 0, len(self.code) - 1]
        for w in self.code:
            cls = isa.COUNTER_OF.get(isa.operands(w)["op"])
            if cls is not None:         # HALT counts in no class
                counters[isa.COUNTER_INDEX[cls]] += isa.busy_cycles(w, lat, self.config)
        return counters

    def listing(self) -> str:
        """The program as text: index, assembly, role, cycles."""
        cyc = self.cycles()
        return "\n".join(f"{i:3d}  {isa.describe(w, self.config):70s} {self.notes[i]:40s} {cyc[i]:5d}"
                         for i, w in enumerate(self.code))


def _mshift(M, what):
    try:
        return mantissa_shift(M)
    except ValueError as e:
        raise CompileError(f"{what}: {e}") from None


def _width(rows: int, config: ChipConfig) -> int:
    """The widest tile of `rows` rows: twice the array on a folding chip when they fit half of it
    (docs/mm-fold.md; never slower than two tiles: the same drain, one start and finish), else the array."""
    return config.mm_max_n if rows <= config.mm_max_mn // 2 else config.mm_max_mn


def _row_tile(m: int, k: int, nn: int, config: ChipConfig, flags: dict) -> int:
    """Rows a tile of an m x k by k x nn matmul takes: the array's, or on a folding chip half of it when that is
    cheaper by the cycle model (every tile then folds: e.g. with a packed B two M = 4, N = 16 tiles stage A one
    cycle a k where two M = 8, N = 8 tiles take two; with an unpacked B the wide tiles' B staging may cost
    more). The rows never change the integers, only the order of independent dot products."""
    tile = config.mm_max_mn
    if not config.mm_fold or nn <= tile:
        return tile

    def cost(rows):
        total = 0
        for i0 in range(0, m, rows):
            mt = min(rows, m - i0)
            width = _width(mt, config)
            total += sum(isa.mm_busy_cycles(mt, k, min(width, nn - j0), config, **flags)
                         for j0 in range(0, nn, width))
        return total
    return min((tile, tile // 2), key=cost)


def compile_graph(graph: Graph, calib_samples, ranges=None, ext_words: int | None = None, reuse: bool = True,
                  config: ChipConfig = BOOK, placed: dict | None = None,
                  spad_limit: int | None = None) -> Program:
    """Compile `graph` for the GA-2 chip.

    Parameters
    ----------
    graph : Graph
    calib_samples : list of dict
        Input sets (name -> 2-D list) whose float evaluation gives every node's range.
    ranges : dict, optional
        Tag -> range overriding the calibrated range of every node with that tag.
    ext_words : int, optional
        Size of the chip's external memory (default: ``config.ext_words``, 8192 on the book's chip).
    reuse : bool
        Release buffers after their last use (the default); temporaries are released either way.
    config : hdl.config.ChipConfig
        The chip compiled for: the array size tiles the matmuls, the operand memories' depth bounds K,
        the scratchpad depth bounds the allocator.
    placed : dict, optional
        Weight name -> scratchpad address where its int8 values already are (resident mode,
        ``compiler.resident``): never loaded, never released. Default: none, every weight is loaded.
    spad_limit : int, optional
        Words ``[0, spad_limit)`` the allocator may use (default: the whole scratchpad); the words above
        are the caller's (resident weights, a block table).

    Raises
    ------
    CompileError
        Naming the node and the shapes or sizes that do not fit.
    """
    if not isinstance(graph, Graph) or not graph.nodes:
        raise CompileError("compile_graph needs a non-empty Graph")
    if not isinstance(config, ChipConfig):
        raise CompileError(f"config must be an hdl.config.ChipConfig, got {type(config).__name__}")
    ext_words = config.ext_words if ext_words is None else ext_words
    tile, max_k = config.mm_max_mn, config.mm_max_k
    nodes = graph.nodes
    relu_fused = fuse_relus(graph)
    scale, rng, warnings = plan_scales(graph, calib_samples, ranges)
    packed = packed_weights(graph, config)      # mm_pack chips: weights stored four int8 a word
    packed |= packed_activations(graph, config)     # mm_pack_c chips: K/V-like activations as well
    loc, buffers = plan_buffers(graph, packed)
    plan_lifetimes(graph, loc, buffers)
    ext = plan_external(graph, ext_words, packed)

    # buffers that hold more than one tensor (a concat's, a relu's): UNPACK writes whole words of eight
    # values, so a 4-bit weight placed in one of them is unpacked aside and copied to its place
    holders = {}
    for n in nodes:
        if loc[n.id] is not None and n.op not in ("slice", "output", "argmax"):
            holders[loc[n.id][0]] = holders.get(loc[n.id][0], 0) + 1
    # runs of consecutive softmax nodes, each alone in its buffer (a batch's rows phase by phase,
    # host.batch): lowered together, their probabilities side by side and ONE RQ for all (it is element-wise
    # and the softmax's (m, s) is fixed, so the integers are those of one RQ a node; saves its fixed cost)
    sm_runs, run, words = {}, [], 0
    for n in nodes + [None]:
        alone = (n is not None and n.op == "softmax" and holders[loc[n.id][0]] == 1
                 and buffers[loc[n.id][0]].words == n.size)
        # it joins the run unless that passes one RQ's length field (no softmax reads one of the run: a
        # softmax's input and result have different pinned scales, compiler.scales refuses it)
        if alone and words + n.size <= config.max_len:
            run.append(n.id)
            words += n.size
            continue
        if len(run) > 1:
            sm_runs.update((i, run) for i in run)
        run, words = ([n.id], n.size) if alone else ([], 0)
    spad = Allocator(config.spad_depth if spad_limit is None else spad_limit)
    instrs, notes = [], []
    rq_params = {}
    loaded = set()
    # mm_rq chips: every matmul's RQ is fused into its MM tiles (RQC + MM rq=1); latched[0] is the
    # (m, s, relu) the MM unit's requantizer holds at this point of the program (None: not known, as at
    # the start, where a backend's reset state is not relied on)
    fused_rq = bool(config.mm_rq)
    latched = [None]
    for name, address in (placed or {}).items():
        # resident weights: their buffer is fixed where the load program put them and outlives the program
        n = nodes[ext[name].node] if name in ext else None
        if n is None or n.op != "weight" or n.attrs.get("bits", 8) != 8 or holders[loc[n.id][0]] != 1:
            raise CompileError(f"placed {name!r}: only an int8 weight in its own buffer can be resident")
        b = buffers[loc[n.id][0]]
        b.addr, b.last_use = address, -1
        loaded.add(n.id)

    def emit(ins, note):
        instrs.append(ins)
        notes.append(note)

    def addr_of(nid):
        if loc[nid] is None:
            raise CompileError(f"{nodes[nid].label()} has no scratchpad buffer")
        b = buffers[loc[nid][0]]
        if b.addr is None:
            b.addr = spad.alloc(b.words, nodes[nid].label())
        return b.addr + loc[nid][1] * row_words(nodes[nid], nid in packed)

    def temp(n, why):
        return spad.alloc(n, f"the temporary of {why}")

    def requantizer(n, A, B):
        M = n.attrs["scale"] * scale[A.id] * scale[B.id] / scale[n.id]
        rq_params[n.id] = _mshift(M, f"{n.label()} requantizer")
        return rq_params[n.id]

    def ensure(nid):
        n = nodes[nid]
        if n.op in ("input", "weight") and nid not in loaded:
            dst = addr_of(nid)
            e = ext[n.attrs["name"]]
            if n.op == "weight" and n.attrs.get("bits", 8) == 4:
                t = temp(e.words, n.label())
                emit(isa.ld(t, e.address, e.words), f"load {e.name} (packed)")
                if holders[loc[nid][0]] == 1:       # its own buffer, padded to whole words
                    emit(isa.unpack(dst, t, e.words), f"unpack {e.name}")
                else:
                    u = temp(8 * e.words, n.label())
                    emit(isa.unpack(u, t, e.words), f"unpack {e.name} aside")
                    emit(isa.rq(dst, u, n.size, *COPY_RQ), f"copy {e.name} into its shared buffer")
                    spad.release(u, 8 * e.words)
                spad.release(t, e.words)
            else:
                emit(isa.ld(dst, e.address, e.words if e.packed else n.size),
                     f"load {e.name}" + (" (four a word)" if e.packed else ""))
            loaded.add(nid)
        return addr_of(nid)

    for n in nodes:
        op = n.op
        if op in ("input", "weight"):
            continue
        if op in ("concat", "relu", "slice"):
            for i in n.ins:
                ensure(i)
            addr_of(n.id)
            continue
        srcs = [ensure(i) for i in n.ins]
        if op == "matmul":
            A, B = nodes[n.ins[0]], nodes[n.ins[1]]
            m, k = A.shape
            nn = n.cols
            tb = n.attrs["transpose_b"]
            if k > max_k:
                raise CompileError(f"{n.label()}: inner dimension {k} of {A.label()} exceeds the matrix "
                                   f"unit's {max_k}")
            out = addr_of(n.id)
            relu = int(n.id in relu_fused)
            if fused_rq:
                # the MM unit requantizes on its way out: its tiles write the int8 result where the RQ
                # would have (row i, column j at out + i*nn + j), after one RQC unless it already holds
                # these parameters
                mant, sh = requantizer(n, A, B)
                if latched[0] != (mant, sh, relu):
                    emit(isa.rqc(mant, sh, relu), f"node {n.id} requantizer")
                    latched[0] = (mant, sh, relu)
                dst = out
            else:
                dst = temp(m * nn, n.label())
            pb = B.id in packed             # B four int8 a word: its address and ldb count words
            pc = fused_rq and n.id in packed    # C four int8 a word (mm_pack_c): its address and ldc too
            # B's words a row: row k (tb = 0) holds N values, row n (tb = 1) holds K
            b_row = row_words(B, pb)
            ldc = row_words(n, pc)
            flags = dict(tb=int(tb), rq=int(fused_rq), pb=int(pb))
            if pc:
                flags["pc"] = 1
            rows = _row_tile(m, k, nn, config, flags)
            for i0 in range(0, m, rows):
                width = _width(min(rows, m - i0), config)
                for j0 in range(0, nn, width):
                    if (pb and not tb or pc) and j0 % PACK:
                        what = B.label() if pb and not tb else f"result {n.label()}"
                        raise CompileError(f"{n.label()}: a tile starting at column {j0} of the packed "
                                           f"{what} is not word-aligned (array {tile} is not a "
                                           f"multiple of {PACK})")
                    b_addr = srcs[1] + (j0 * b_row if tb else j0 // PACK if pb else j0)
                    c_addr = dst + i0 * ldc + (j0 // PACK if pc else j0)
                    emit(isa.mm(c_addr, srcs[0] + i0 * k, b_addr,
                                min(rows, m - i0), k, min(width, nn - j0), lda=k, ldb=b_row, ldc=ldc,
                                **flags),
                         f"node {n.id} tile " + (f"i0={i0} " if m > rows else "") + f"j0={j0}")
            if not fused_rq:
                mant, sh = requantizer(n, A, B)
                emit(isa.rq(out, dst, m * nn, mant, sh, relu), f"node {n.id} requant")
                spad.release(dst, m * nn)
        elif op == "softmax" and n.id in sm_runs and sm_runs[n.id][0] != n.id:
            pass                        # lowered with the first softmax of its run
        elif op == "softmax":
            run = sm_runs.get(n.id, [n.id])
            total = sum(nodes[i].size for i in run)
            if len(run) > 1:
                # the run's outputs side by side in one extent, so that one RQ covers them all
                base = spad.alloc(total, f"the probabilities of nodes {run[0]}..{run[-1]}")
                for i in run:
                    buffers[loc[i][0]].addr = base
                    base += nodes[i].size
            out = addr_of(run[0])
            t = temp(total, n.label())
            off = 0
            for i in run:
                m, nn = nodes[i].shape
                src = ensure(nodes[i].ins[0])
                for r in range(m):
                    emit(isa.sm(t + off + r * nn, src + r * nn, nn), f"node {i} softmax row {r}")
                off += m * nn
            mant, sh = _mshift(SOFTMAX_RQ_MULTIPLIER, f"{n.label()} requantizer")
            for i in run:
                rq_params[i] = (mant, sh)
            emit(isa.rq(out, t, total, mant, sh, 0), f"node {n.id} Q0.16->int8" if len(run) == 1 else
                 f"nodes {run[0]}..{run[-1]} Q0.16->int8 (one RQ for the run of softmaxes)")
            spad.release(t, total)
        elif op == "add":
            size = n.size
            operands, temps = [], []
            for j, (i, a) in enumerate(zip(n.ins, srcs)):
                ratio = scale[i] / scale[n.id]
                if abs(ratio - 1) < 1e-9:
                    operands.append(a)
                    continue
                t = temp(size, n.label())
                mant, sh = _mshift(ratio, f"{n.label()} rescale of operand {j}")
                rq_params[(n.id, j)] = (mant, sh)
                emit(isa.rq(t, a, size, mant, sh, 0), f"node {n.id} rescale operand {j} (node {i})")
                operands.append(t)
                temps.append(t)
            emit(isa.vadd(addr_of(n.id), operands[0], operands[1], size), f"node {n.id} add")
            for t in temps:
                spad.release(t, size)
        elif op == "argmax":
            m, nn = nodes[n.ins[0]].shape
            out = addr_of(n.id)
            for r in range(m):
                emit(isa.amax(out + r, srcs[0] + r * nn, nn), f"node {n.id} argmax row {r}")
        elif op == "output":
            e = ext[n.attrs["name"]]
            emit(isa.st(srcs[0], e.address, e.words),
                 f"store {e.name}" + (" (four a word)" if e.packed else ""))
        else:  # pragma: no cover
            raise CompileError(f"{n.label()}: cannot lower this operation")
        if reuse:
            for b in buffers:
                if b.last_use == n.id and b.addr is not None:
                    spad.release(b.addr, b.words)
                    b.addr = None
                    b.last_use = -1
    emit(isa.halt(), "halt")

    code = [isa.encode(i) for i in instrs]
    try:
        isa.validate_program(code, ext_words, cfg=config)
    except isa.IsaError as e:
        raise CompileError(f"the emitted program is not legal for the chip: {e}") from None
    return Program(graph=graph, code=code, instrs=instrs, notes=notes, ext_map=ext,
                   ext_words=sum(e.words for e in ext.values()), ext_size=ext_words, scales=scale,
                   ranges=rng, rq_params=rq_params, relu_fused=relu_fused, loc=loc, buffers=buffers,
                   hwm=spad.hwm, warnings=warnings, config=config)
