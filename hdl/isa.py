"""The GA-2 instruction word: 128 bits, encoded, decoded and validated here and nowhere else.

Pure Python (no Amaranth): the compiler, the reference machine, the hex-file tools and the chip's
decoder all read the field positions from this module.

Generic layout (hardware spec 3.1), most significant first::

    op[127:124] a[123:108] b[107:92] c[91:76] d[75:52] e[51:46] f[45:38] g[37:30] h[29:22] fl[21:18] x[17:0]

What each opcode means by its fields is in :data:`OPERANDS`; the bits the hardware actually reads
(often fewer than the field holds) are in :func:`operands`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from hdl.config import BOOK, ChipConfig

__all__ = [
    "Op", "FIELDS", "HW_OPERANDS", "SPAD_WORDS", "ROM_WORDS", "MM_MAX_MN", "MM_MAX_K", "COUNTER_OF",
    "COUNTER_INDEX", "IsaError", "Instr",
    "encode", "decode", "operands", "validate", "validate_program", "busy_cycles", "mm_busy_cycles", "mm_b_groups",
    "vadd_busy_cycles", "rq_busy_cycles", "RQ_PIPE_CYCLES",
    "ld", "st", "mm", "rq", "sm", "vadd", "amax", "unpack", "halt",
    "to_words32", "from_words32", "describe",
    "RESIDENT_OPS", "gather", "scatter", "resident_runs", "resident_busy_cycles", "legal_ops",
    "MM_RQ_OPS", "CHIP_OPERANDS", "hw_operands", "rqc", "RQC_BUSY",
    "ideal_cycles", "macs", "ext_words", "vector_elements", "vector_lanes", "ext_port_words", "dma_groups",
    "row_group_log2", "row_groups",
    "SM_DIV_WIDTH", "sm_busy_cycles",
    "SEQ_CYCLES", "seq_cycles", "ErrorKind", "ERROR_KIND_BITS", "issue_limits", "issue_stop",
]

# The book's limits, kept as module constants for the code that only ever meets the book's chip; every
# check below takes a `cfg` and reads its limits from it (hdl.config is the one definition).
SPAD_WORDS = BOOK.spad_depth        # scratchpad words
ROM_WORDS = BOOK.rom_words          # the testbench ROM is indexed by imem_addr[7:0]
MM_MAX_MN = BOOK.mm_max_mn          # the systolic array is MM_MAX_MN x MM_MAX_MN
MM_MAX_K = BOOK.mm_max_k            # the operand memories' depth


class Op(enum.IntEnum):
    HALT = 0
    LD = 1
    ST = 2
    MM = 3
    RQ = 4
    SM = 5
    VADD = 6
    AMAX = 7
    UNPACK = 8
    GATHER = 9      # resident mode only (docs/resident.md): a chip with gather=1
    SCATTER = 10
    RQC = 11        # fused requantization only (docs/fused-rq.md): a chip with mm_rq=1


# The opcodes that exist only on a chip generated with ``gather=1`` (docs/resident.md); on the book's chip
# they are illegal like 11..15.
RESIDENT_OPS = (Op.GATHER, Op.SCATTER)


# The opcodes that exist only on a chip generated with ``mm_rq=1`` (docs/fused-rq.md): RQC loads the MM
# unit's output requantizer. On other chips opcode 11 is illegal.
MM_RQ_OPS = (Op.RQC,)


def legal_ops(cfg: ChipConfig = BOOK) -> tuple:
    """The opcodes the chip `cfg` executes (HALT included)."""
    return tuple(op for op in Op if (cfg.gather or op not in RESIDENT_OPS)
                 and (cfg.mm_rq or op not in MM_RQ_OPS))


# The cycle counter each opcode's busy cycles go to (hardware spec 2.2): the one classification that the
# reference machine, the compiler's cycle prediction and the reports share. HALT has no busy cycle.
COUNTER_OF: dict[Op, str] = {Op.LD: "dma", Op.ST: "dma", Op.MM: "mm", Op.RQ: "vec", Op.SM: "vec",
                             Op.VADD: "vec", Op.AMAX: "vec", Op.UNPACK: "vec",
                             Op.GATHER: "dma", Op.SCATTER: "dma", Op.RQC: "mm"}
# Where each class sits in the counter list [total, mm, dma, vec, instructions].
COUNTER_INDEX: dict[str, int] = {"mm": 1, "dma": 2, "vec": 3}


# name -> (lsb, width)
FIELDS: dict[str, tuple[int, int]] = {
    "op": (124, 4), "a": (108, 16), "b": (92, 16), "c": (76, 16), "d": (52, 24),
    "e": (46, 6), "f": (38, 8), "g": (30, 8), "h": (22, 8), "fl": (18, 4), "x": (0, 18),
}

# What the generic fields mean for each opcode (for messages and for `describe`).
OPERANDS: dict[Op, dict[str, str]] = {
    Op.HALT: {},
    Op.LD: {"a": "dst", "b": "src", "c": "len"},
    Op.ST: {"a": "src", "b": "dst", "c": "len"},
    Op.MM: {"a": "dst", "b": "A", "c": "B", "d": "ldb:lda", "f": "M", "g": "K", "h": "N", "fl": "tb", "x": "ldc"},
    Op.RQ: {"a": "dst", "b": "src", "c": "len", "d": "m", "e": "s", "fl": "relu"},
    Op.SM: {"a": "dst", "b": "src", "c": "len"},
    Op.VADD: {"a": "dst", "b": "src1", "c": "src2", "d": "len"},
    Op.AMAX: {"a": "dst", "b": "src", "c": "len"},
    Op.UNPACK: {"a": "dst", "b": "src", "c": "len"},
    Op.GATHER: {"a": "spad", "b": "table", "c": "table_len", "d": "base", "e": "page_log2", "f": "lo",
                "g": "hi", "fl": "row_log2", "x": "pool_pages"},
    Op.SCATTER: {"a": "spad", "b": "table", "c": "table_len", "d": "base", "e": "page_log2", "f": "lo",
                 "g": "hi", "fl": "row_log2", "x": "pool_pages"},
    Op.RQC: {"d": "m", "e": "s", "fl": "relu"},
}


class IsaError(ValueError):
    """An instruction that the chip cannot execute as intended (the message names it and the field).

    Attributes
    ----------
    stop : tuple of (ErrorKind, int) or None
        Set by `validate`: what a generated chip does with the word (`issue_stop`): the error stop it
        makes when it issues it, or None when it runs it (a refused word the hardware still runs, its
        addresses wrapping, as the reference machine models).
    """

    stop = None


class ErrorKind(enum.IntEnum):
    """Why a chip stopped with an error: the value of its ``error_kind`` register (0: it did not).

    The chips other than the book's (`hdl.config.ChipConfig.generated`) have the error state; the book's
    hangs where they stop (hardware spec 2.2). ROW and PAGE come from a GATHER or SCATTER that met a bad
    block table (docs/resident.md): that instruction ends and the next word is issued as a HALT. The other
    three are the words the chip refuses when it issues them (`issue_stop`): the word itself is issued as
    a HALT, in the cycles a HALT takes there, with ``error_info`` its opcode.
    """
    NONE = 0
    ROW = 1         # a row's table index is not below table_len
    PAGE = 2        # a table entry is not below pool_pages
    OPCODE = 3      # an opcode the chip does not have (`legal_ops`)
    LENGTH = 4      # a zero length, or an MM dimension of 0: the unit would never finish
    RANGE = 5       # a field past what the chip runs: MM's M or N past the array, K past the operand memories

    @property
    def label(self) -> str:
        """The kind's name as the backends report it (``"row"``, ``"opcode"``, ...)."""
        return self.name.lower()


# Bits of the chip's ``error_kind`` register.
ERROR_KIND_BITS = max(ErrorKind).bit_length()


@dataclass(frozen=True)
class Instr:
    """One instruction as its generic fields. Build it with the helpers (`ld`, `mm`, ...)."""
    op: int
    a: int = 0
    b: int = 0
    c: int = 0
    d: int = 0
    e: int = 0
    f: int = 0
    g: int = 0
    h: int = 0
    fl: int = 0
    x: int = 0

    def __post_init__(self):
        for name, (_, width) in FIELDS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < (1 << width):
                raise IsaError(f"field {name} = {value!r} does not fit in {width} bits")

    @property
    def word(self) -> int:
        return encode(self)

    def __str__(self) -> str:
        return describe(self)


# ---- constructors with the assembler's conventions (hardware spec 3.4) ----------------------------

def ld(dst, src, n):
    return Instr(Op.LD, a=dst, b=src, c=n)


def st(src, dst, n):
    return Instr(Op.ST, a=src, b=dst, c=n)


def mm(dst, A, B, M, K, N, lda=None, ldb=0, ldc=None, tb=0, rq=0, pb=0, pc=0):
    """MM; ``rq=1`` (a chip with mm_rq=1, docs/fused-rq.md) writes every C element requantized by the
    registers the last RQC loaded; ``pb=1`` (a chip with mm_pack=1, docs/mm-fast.md) reads B packed:
    element (k, n) is byte n % 4 of word ``B + k*ldb + n // 4`` (``ldb`` in words), or with ``tb=1`` (a
    chip with mm_pack_c=1, docs/mm-pack-c.md) byte k % 4 of word ``B + n*ldb + k // 4``; ``pc=1`` (a chip
    with mm_pack_c=1, with rq=1) writes C packed: result (m, n) is byte n % 4 of word
    ``dst + m*ldc + n // 4`` (``ldc`` in words)."""
    lda = K if lda is None else lda
    ldc = N if ldc is None else ldc
    if not 0 <= lda < 1 << _STRIDE_BITS or not 0 <= ldb < 1 << _STRIDE_BITS:
        raise IsaError(f"MM stride lda={lda} / ldb={ldb} does not fit in {_STRIDE_BITS} bits")
    if rq not in (0, 1) or tb not in (0, 1) or pb not in (0, 1) or pc not in (0, 1):
        raise IsaError(f"MM flags tb={tb!r} / rq={rq!r} / pb={pb!r} / pc={pc!r} must each be 0 or 1")
    return Instr(Op.MM, a=dst, b=A, c=B, d=(ldb << _STRIDE_BITS) | lda, f=M, g=K, h=N,
                 fl=(int(pc) << 3) | (int(pb) << 2) | (int(rq) << 1) | int(tb), x=ldc)


def rq(dst, src, n, m, s, relu=0):
    return Instr(Op.RQ, a=dst, b=src, c=n, d=m, e=s, fl=int(relu))


def rqc(m, s, relu=0):
    """RQC (a chip with mm_rq=1, docs/fused-rq.md): load the MM unit's output requantizer with (m, s,
    relu), RQ's fields and bits; the MMs with ``rq=1`` after it requantize with them."""
    return Instr(Op.RQC, d=m, e=s, fl=int(relu))


def sm(dst, src, n):
    return Instr(Op.SM, a=dst, b=src, c=n)


def vadd(dst, src1, src2, n):
    return Instr(Op.VADD, a=dst, b=src1, c=src2, d=n)


def amax(dst, src, n):
    return Instr(Op.AMAX, a=dst, b=src, c=n)


def unpack(dst, src, n):
    return Instr(Op.UNPACK, a=dst, b=src, c=n)


def halt():
    return Instr(Op.HALT)


def _resident(op, spad, table, table_len, base, page_log2, lo, hi, row_log2, pool_pages):
    return Instr(op, a=spad, b=table, c=table_len, d=base, e=page_log2, f=lo, g=hi, fl=row_log2,
                 x=pool_pages)


def gather(spad, table, table_len, base, page_log2, lo, hi, row_log2, pool_pages):
    """GATHER (docs/resident.md): rows [lo, hi) from the pool at external `base`, through the block
    table of `table_len` page numbers at scratchpad `table`, into scratchpad words from `spad` on."""
    return _resident(Op.GATHER, spad, table, table_len, base, page_log2, lo, hi, row_log2, pool_pages)


def scatter(spad, table, table_len, base, page_log2, lo, hi, row_log2, pool_pages):
    """SCATTER (docs/resident.md): rows [lo, hi) from scratchpad words from `spad` on into their page
    slots of the pool at external `base`, through the block table at scratchpad `table`."""
    return _resident(Op.SCATTER, spad, table, table_len, base, page_log2, lo, hi, row_log2, pool_pages)


# ---- encode / decode -----------------------------------------------------------------------------

def encode(ins: Instr) -> int:
    word = 0
    for name, (lsb, width) in FIELDS.items():
        word |= (getattr(ins, name) & ((1 << width) - 1)) << lsb
    return word


def decode(word: int) -> Instr:
    if not isinstance(word, int) or not 0 <= word < (1 << 128):
        raise IsaError(f"instruction word {word!r} is not a 128-bit unsigned integer")
    return Instr(**{name: (word >> lsb) & ((1 << width) - 1) for name, (lsb, width) in FIELDS.items()})


# The bits each opcode's operands are read from, as (msb, lsb): exactly what the hardware decodes
# (hardware spec 3.2). The chip's units slice the instruction register with this same table.
HW_OPERANDS: dict[Op, dict[str, tuple[int, int]]] = {
    Op.HALT: {},
    Op.LD: {"dst": (119, 108), "src": (107, 92), "len": (87, 76)},
    Op.ST: {"src": (119, 108), "dst": (107, 92), "len": (87, 76)},
    Op.MM: {"dst": (119, 108), "A": (103, 92), "B": (87, 76), "lda": (63, 52), "ldb": (75, 64),
            "M": (41, 38), "K": (36, 30), "N": (25, 22), "tb": (18, 18), "ldc": (11, 0), "rq": (19, 19),
            "pb": (20, 20), "pc": (21, 21)},
    Op.RQ: {"dst": (119, 108), "src": (103, 92), "len": (87, 76), "m": (75, 52), "s": (51, 46),
            "relu": (18, 18)},
    Op.SM: {"dst": (119, 108), "src": (103, 92), "len": (87, 76)},
    Op.VADD: {"dst": (119, 108), "src1": (103, 92), "src2": (87, 76), "len": (67, 52)},
    Op.AMAX: {"dst": (119, 108), "src": (103, 92), "len": (87, 76)},
    Op.UNPACK: {"dst": (119, 108), "src": (103, 92), "len": (87, 76)},
    # docs/resident.md "Instruction fields"
    Op.GATHER: {"spad": (119, 108), "table": (103, 92), "table_len": (87, 76), "base": (67, 52),
                "page_log2": (49, 46), "lo": (45, 38), "hi": (37, 30), "row_log2": (21, 18),
                "pool_pages": (11, 0)},
    Op.SCATTER: {"spad": (119, 108), "table": (103, 92), "table_len": (87, 76), "base": (67, 52),
                 "page_log2": (49, 46), "lo": (45, 38), "hi": (37, 30), "row_log2": (21, 18),
                 "pool_pages": (11, 0)},
    # docs/fused-rq.md: exactly RQ's m, s and relu bits
    Op.RQC: {"m": (75, 52), "s": (51, 46), "relu": (18, 18)},
}

# Operands that only a chip with a generator parameter reads, (opcode, operand) -> the parameter: on a chip
# without it the hardware ignores those bits and `validate` refuses them set. MM's rq flag (fl[1]) exists
# on a chip with mm_rq=1 (docs/fused-rq.md), its pb flag (fl[2], B packed four int8 per word) on a chip with
# mm_pack=1 (docs/mm-fast.md), its pc flag (fl[3], C packed four int8 per word) on a chip with mm_pack_c=1
# (docs/mm-pack-c.md).
CHIP_OPERANDS: dict[tuple[Op, str], str] = {(Op.MM, "rq"): "mm_rq", (Op.MM, "pb"): "mm_pack",
                                            (Op.MM, "pc"): "mm_pack_c"}


def field_bits(op, name, cfg: ChipConfig | None) -> tuple[int, int]:
    """The bits (hi, lo) of operand `name` of `op` that the chip `cfg` reads: `HW_OPERANDS`'s, except MM's
    N on an ``mm_fold`` chip, read with one bit more (h[4:0], N up to twice the array: docs/mm-fold.md)."""
    hi, lo = HW_OPERANDS[op][name]
    if cfg is not None and cfg.mm_fold and op == Op.MM and name == "N":
        hi += 1
    return hi, lo


def hw_operands(op, cfg: ChipConfig = BOOK) -> dict[str, tuple[int, int]]:
    """The operand bits of opcode `op` that the chip `cfg` reads: `HW_OPERANDS` less the operands of
    `CHIP_OPERANDS` whose parameter `cfg` does not have (the book's MM reads no rq bit), each as wide as
    the chip reads it (MM's N one bit wider with ``mm_fold``)."""
    op = Op(op)
    return {name: field_bits(op, name, cfg) for name in HW_OPERANDS[op]
            if (op, name) not in CHIP_OPERANDS or getattr(cfg, CHIP_OPERANDS[(op, name)])}


# The MM strides share field d: lda in its low half, ldb in its high half (the widths of HW_OPERANDS).
_STRIDE_BITS = HW_OPERANDS[Op.MM]["lda"][0] - HW_OPERANDS[Op.MM]["lda"][1] + 1


def _bits(word, hi, lo):
    return (word >> lo) & ((1 << (hi - lo + 1)) - 1)


def operands(word: int, cfg: ChipConfig | None = None) -> dict:
    """The operands exactly as the hardware reads them (hardware spec 3.2); ignored bits are dropped.

    Returns a dict with ``op`` plus the opcode's named operands (every one of `HW_OPERANDS`, the flags of
    `CHIP_OPERANDS` too). Unknown opcodes give only ``op``. With a chip `cfg`, each field as wide as that
    chip reads it (MM's N on an ``mm_fold`` chip, docs/mm-fold.md); without, the book's widths.
    """
    if isinstance(word, Instr):
        word = encode(word)
    op = _bits(word, 127, 124)
    r = {"op": op}
    if op in HW_OPERANDS:
        for name in HW_OPERANDS[Op(op)]:
            r[name] = _bits(word, *field_bits(Op(op), name, cfg))
    return r


def mm_fold_conflict(M: int, N: int, cfg: ChipConfig) -> bool:
    """An MM whose N needs the folded array (N > array on an ``mm_fold`` chip) but whose M uses more than
    half its rows: the chip stops on it with RANGE (docs/mm-fold.md)."""
    return bool(cfg.mm_fold) and N > cfg.array and M > cfg.array // 2


# ---- validation ----------------------------------------------------------------------------------

def _region(where, name, start, n, limit, memory):
    if start + n > limit:
        raise IsaError(f"{where}: {name} = {start} with length {n} runs past the end of "
                       f"{memory} ({limit} words)")


def issue_limits(op, cfg: ChipConfig = BOOK) -> dict[str, tuple[int, int]]:
    """The operands of opcode `op` that a generated chip checks when it issues a word, each with the range
    lo..hi it runs (the operand as the hardware reads it, ``HW_OPERANDS``): a length or an MM dimension
    below 1 stops the chip with `ErrorKind.LENGTH` (its unit would never finish), an MM's M or N past the
    array or K past the operand memories with `ErrorKind.RANGE`. `validate` refuses the same words.
    """
    op = Op(op)
    if op == Op.MM:
        # N up to twice the array with mm_fold, for M up to half of it (`mm_fold_conflict`)
        return {"M": (1, cfg.mm_max_mn), "K": (1, cfg.mm_max_k), "N": (1, cfg.mm_max_n)}
    if "len" in HW_OPERANDS[op]:
        hi, lo = HW_OPERANDS[op]["len"]
        return {"len": (1, (1 << (hi - lo + 1)) - 1)}
    return {}


def issue_stop(word, cfg: ChipConfig = BOOK) -> tuple[ErrorKind, int] | None:
    """The error stop a generated chip (``cfg.generated``) makes when it issues `word`, as (kind, info),
    or None when it runs the word.

    OPCODE for an opcode outside `legal_ops`; else LENGTH when an operand of `issue_limits` is below its
    range, else RANGE when one is above it or for an MM of `mm_fold_conflict`. `info` (the chip's
    ``error_info``) is the opcode. The book's
    chip makes no error stop: it hangs on the OPCODE and LENGTH words (hardware spec 2.2), and runs the
    RANGE ones unmodelled.
    """
    o = operands(word, cfg)
    op = o["op"]
    if op not in legal_ops(cfg):
        return ErrorKind.OPCODE, op
    limits = issue_limits(op, cfg)
    if any(o[name] < lo for name, (lo, _) in limits.items()):
        return ErrorKind.LENGTH, op
    if any(o[name] > hi for name, (_, hi) in limits.items()):
        return ErrorKind.RANGE, op
    if op == Op.MM and mm_fold_conflict(o["M"], o["N"], cfg):
        return ErrorKind.RANGE, op
    return None


def validate(ins, ext_words: int | None = None, index: int | None = None, cfg: ChipConfig = BOOK) -> dict:
    """Check one instruction (an `Instr` or a 128-bit word) for the chip `cfg`.

    Parameters
    ----------
    ins : Instr or int
    ext_words : int, optional
        Words of external memory (default: ``cfg.ext_words``).
    index : int, optional
        The instruction's place in its program, for the message.
    cfg : hdl.config.ChipConfig
        The chip: its scratchpad depth and the MM unit's limits.

    Raises `IsaError` naming the instruction (its index when given) and the offending field, its
    ``stop`` what a generated chip does with the word (`issue_stop`: every word it stops on is refused
    here); returns the hardware operands (see `operands`) when the instruction is legal.
    """
    try:
        return _validate(ins, ext_words, index, cfg)
    except IsaError as e:
        word = encode(ins) if isinstance(ins, Instr) else ins
        if isinstance(word, int) and 0 <= word < (1 << 128):
            e.stop = issue_stop(word, cfg)
        raise


def _validate(ins, ext_words, index, cfg):
    """`validate` without the ``stop`` of its error."""
    ext_words = cfg.ext_words if ext_words is None else ext_words
    spad_words = cfg.spad_depth

    def spad_region(where, name, start, n):
        _region(where, name, start, n, spad_words, "the scratchpad")

    def ext_region(where, name, start, n):
        _region(where, name, start, n, ext_words, "external memory")

    def spad_address(where, label, value, op, operand):
        # a base address must name a scratchpad word AND fit the bits the hardware reads of its field
        # (HW_OPERANDS): on a scratchpad deeper than those bits reach, the field is the tighter limit
        hi, lo = HW_OPERANDS[op][operand]
        if value >= spad_words:
            raise IsaError(f"{where}: {label} = {value} is past the scratchpad ({spad_words} words)")
        if value >= 1 << (hi - lo + 1):
            raise IsaError(f"{where}: {label} = {value} does not fit the {hi - lo + 1} bits the hardware "
                           f"reads of it")

    word = encode(ins) if isinstance(ins, Instr) else ins
    if not isinstance(word, int) or not 0 <= word < (1 << 128):
        raise IsaError(f"instruction {index}: word {word!r} is not a 128-bit unsigned integer")
    g = decode(word)
    o = operands(word, cfg)
    op = o["op"]
    try:
        name = Op(op).name
    except ValueError:
        raise IsaError(f"instruction {'' if index is None else index} ({word:032x}): "
                       f"unknown opcode {op} (legal: 0..{max(legal_ops(cfg))})") from None
    where = f"instruction {index} ({name})" if index is not None else f"{name} instruction"
    if op == Op.HALT:
        return o
    if op in RESIDENT_OPS:
        if not cfg.gather:
            raise IsaError(f"{where}: opcode {op} exists only on a chip with gather=1 (resident mode); "
                           f"on this chip it is illegal (legal: 0..{max(legal_ops(cfg))})")
        _validate_resident(where, g, o, cfg, ext_words, spad_address, spad_region, ext_region)
        return o
    if op in MM_RQ_OPS:
        if not cfg.mm_rq:
            raise IsaError(f"{where}: opcode {op} exists only on a chip with mm_rq=1 (fused requantization); "
                           f"on this chip it is illegal (legal: 0..{max(legal_ops(cfg))})")
        # m and s fill their fields (24 and 6 bits): any value is in range, as for RQ
        return o
    if op == Op.MM:
        if o["rq"] and not cfg.mm_rq:
            raise IsaError(f"{where}: rq = 1 (fl bit 1) needs a chip with mm_rq=1 (fused requantization)")
        if o["pb"] and not cfg.mm_pack:
            raise IsaError(f"{where}: pb = 1 (fl bit 2) needs a chip with mm_pack=1 (B packed four int8 a word)")
        if o["pb"] and o["tb"] and not cfg.mm_pack_c:
            raise IsaError(f"{where}: tb = 1 with pb = 1: a packed B (fl bit 2) must not be transposed")
        if o["pc"] and not cfg.mm_pack_c:
            raise IsaError(f"{where}: pc = 1 (fl bit 3) needs a chip with mm_pack_c=1 (C packed four int8 a word)")
        if o["pc"] and not o["rq"]:
            raise IsaError(f"{where}: pc = 1 (fl bit 3) needs rq = 1 (fl bit 1): a packed C holds int8 results")
        limits = issue_limits(Op.MM, cfg)
        for k, fname in (("M", "f"), ("K", "g"), ("N", "h")):
            hi, lo = field_bits(Op.MM, k, cfg)
            if getattr(g, fname) >= 1 << (hi - lo + 1):     # e.g. N = 16 on a 16 x 16 array: N reads 4 bits
                raise IsaError(f"{where}: {k} = {getattr(g, fname)} does not fit the {hi - lo + 1} bits the "
                               f"hardware reads of it")
            least, most = limits[k]
            if not least <= o[k] <= most:
                raise IsaError(f"{where}: {k} = {o[k]} is outside {least}..{most}")
        if mm_fold_conflict(o["M"], o["N"], cfg):
            raise IsaError(f"{where}: N = {o['N']} is past the array ({cfg.array}) with M = {o['M']}: a folded MM "
                           f"(mm_fold) computes its columns past {cfg.array} in rows {cfg.array // 2}.., so M must "
                           f"be at most {cfg.array // 2}")
        # fields wider than what the hardware reads would be silently truncated: refuse them
        for fname in ("a", "b", "c", "x"):
            operand = OPERANDS[Op.MM][fname]
            spad_address(where, operand, getattr(g, fname), Op.MM, operand)
        M, K, N = o["M"], o["K"], o["N"]
        per_word = cfg.elems_per_word
        c_words = -(-N // per_word) if o["pc"] else N                     # a packed C: ceil(N/4) words a row
        spad_region(where, "dst", o["dst"], (M - 1) * o["ldc"] + c_words)
        spad_region(where, "A", o["A"], (M - 1) * o["lda"] + K)
        if o["pb"] and o["tb"]:
            span_b = (N - 1) * o["ldb"] + -(-K // per_word)               # mm_pack_c: ceil(K/4) words an n
        elif o["pb"]:
            span_b = (K - 1) * o["ldb"] + -(-N // per_word)               # ceil(N/4) words a k
        else:
            span_b = (N - 1) * o["ldb"] + K if o["tb"] else (K - 1) * o["ldb"] + N
        spad_region(where, "B", o["B"], span_b)
        return o
    n = o["len"]
    len_field = "d" if op == Op.VADD else "c"
    raw_len = getattr(g, len_field)
    hi, lo = HW_OPERANDS[Op(op)]["len"]
    limit = min(spad_words if op == Op.VADD else cfg.max_len, (1 << (hi - lo + 1)) - 1)
    if raw_len == 0:
        raise IsaError(f"{where}: len = 0 (a zero length never finishes)")
    if raw_len > limit:
        raise IsaError(f"{where}: len = {raw_len} is outside 1..{limit}")
    if op == Op.LD:
        spad_address(where, "dst", g.a, Op.LD, "dst")
        spad_region(where, "dst", o["dst"], n)
        ext_region(where, "src", o["src"], n)
    elif op == Op.ST:
        spad_address(where, "src", g.a, Op.ST, "src")
        spad_region(where, "src", o["src"], n)
        ext_region(where, "dst", o["dst"], n)
    else:
        names = [OPERANDS[Op(op)][f] for f in ("a", "b", "c") if OPERANDS[Op(op)][f] != "len"]
        for fname, oname in zip(("a", "b", "c"), names):
            spad_address(where, oname, getattr(g, fname), Op(op), oname)
        out_n = 8 * n if op == Op.UNPACK else (1 if op == Op.AMAX else n)
        spad_region(where, "dst", o["dst"], out_n)
        if op == Op.VADD:
            spad_region(where, "src1", o["src1"], n)
            spad_region(where, "src2", o["src2"], n)
        else:
            spad_region(where, "src", o["src"], n)
    return o


def _validate_resident(where, g, o, cfg, ext_words, spad_address, spad_region, ext_region):
    """The static checks of GATHER/SCATTER (docs/resident.md); a bad table is a run-time error stop."""
    op = Op(o["op"])
    spad_address(where, "spad", g.a, op, "spad")
    spad_address(where, "table", g.b, op, "table")
    fields = HW_OPERANDS[op]
    for fname, operand in OPERANDS[op].items():
        hi, lo = fields[operand]
        raw = getattr(g, fname)
        if raw >= 1 << (hi - lo + 1):
            raise IsaError(f"{where}: {operand} = {raw} does not fit the {hi - lo + 1} bits the hardware "
                           f"reads of it")
    if o["hi"] <= o["lo"]:
        raise IsaError(f"{where}: hi = {o['hi']} must be greater than lo = {o['lo']}")
    spad_region(where, "spad", o["spad"], (o["hi"] - o["lo"]) << o["row_log2"])
    spad_region(where, "table", o["table"], o["table_len"])
    words = (o["hi"] - o["lo"]) << o["row_log2"]
    if op == Op.GATHER and o["spad"] < o["table"] + o["table_len"] and o["table"] < o["spad"] + words:
        # the lookups of later runs would race the words being written (docs/resident.md)
        raise IsaError(f"{where}: the rows written at spad = {o['spad']} ({words} words) overlap the block "
                       f"table at {o['table']} ({o['table_len']} entries)")
    pool_words = o["pool_pages"] << (o["page_log2"] + o["row_log2"])
    ext_region(where, "base", o["base"], pool_words)


def validate_program(words, ext_words: int | None = None, cfg: ChipConfig = BOOK) -> None:
    """Validate every instruction of a program for the chip `cfg` (external memory `ext_words`, default
    ``cfg.ext_words``) and check that it ends with a HALT and fits the chip's program ROM."""
    words = [encode(w) if isinstance(w, Instr) else w for w in words]
    if not words:
        raise IsaError("the program is empty (it needs at least a HALT)")
    if len(words) > cfg.rom_words:
        raise IsaError(f"the program has {len(words)} instructions; the program ROM holds {cfg.rom_words}")
    for i, w in enumerate(words):
        validate(w, ext_words, index=i, cfg=cfg)
    if operands(words[-1])["op"] != Op.HALT:
        raise IsaError(f"the program does not end with a HALT (instruction {len(words) - 1} is "
                       f"{Op(operands(words[-1])['op']).name}): it would run off its end")


# ---- the per-instruction cycle model (hardware spec 4.9) -----------------------------------------

def mm_b_groups(N: int, cfg: ChipConfig, pb: int = 0, tb: int = 0) -> int:
    """Read cycles the MM unit spends on the N elements of one k of B: ``ceil(N/L)`` words one element
    each, or with ``pb`` (packed, docs/mm-fast.md) ``ceil(ceil(N/4)/L)`` words four elements each;
    L = ``cfg.mm_load``. A packed and transposed B (``pb`` and ``tb`` on an ``mm_pack_c`` chip,
    docs/mm-pack-c.md) is read as a transposed one, one word per n: ``ceil(N/L)``; on any other chip pb
    wins and tb is not read."""
    along_n = pb and not (tb and cfg.mm_pack_c)
    words = -(-N // cfg.elems_per_word) if along_n else N
    return -(-words // cfg.mm_load)


def mm_busy_cycles(M: int, K: int, N: int, cfg: ChipConfig, tb: int = 0, pb: int = 0, rq: int = 0,
                   pc: int = 0) -> int:
    """WAIT cycles B of one MM of M x K times K x N on the chip `cfg` (the timing contract of
    hdl/units/mm.py; docs/mm-fast.md for ``pb`` and ``mm_overlap``).

    With L = ``cfg.mm_load`` operand elements staged per cycle and ``cB = mm_b_groups(N, cfg, pb)``
    (``ceil(N/L)``, or ``ceil(ceil(N/4)/L)`` for a packed B), phases one after the other
    (``cfg.mm_overlap`` = 0)::

        B = M*ceil(K/L) + K*cB + (K+M+N-2) + M*N + 7

    (the book's chip, L = 1, pb = 0: M*K + K*N + (K+M+N-2) + M*N + 7). A is staged L elements of one row a
    cycle, B L words of one k a cycle; a row's or a k's last group may be partial. The array's size
    does not enter. No alignment is needed: bases, strides and tb are free as for L = 1 (the unit reads
    the L words of a group through L scratchpad read ports, each element being its own word, or four
    with pb).

    Overlapped phases (``cfg.mm_overlap`` = 1, derivation in docs/mm-fast.md): A and B are staged k by k
    at the same time, C = max(ceil(M/L), cB) cycles a k, the array starts as soon as every operand it
    needs is staged and C is written from the cycle the first result is final::

        B = (K-1)*C + max(3, C-1) + M*N + 1 + RQ_PIPE_CYCLES*rq*cfg.rq_pipe

    The last term (docs/rq-pipe.md): with the requantizer's pipeline register (``cfg.rq_pipe``) a
    fused MM (``rq`` = 1, an ``mm_rq`` chip) writes each C element one cycle after the drain selects it,
    so its last write takes one cycle more. With phases one after the other that cycle is the FIN
    cycle, which the unit has anyway: the first formula does not change.

    `tb` does not enter either formula (it changes the addresses only), except through ``cB`` for a
    packed and transposed B on an ``mm_pack_c`` chip (`mm_b_groups`: ``ceil(N/L)``, tb's reads).

    A packed C (``pc`` = 1, an ``mm_pack_c`` chip, so overlapped; docs/mm-pack-c.md, which derives it)
    adds nothing: the drain still selects one result a cycle in the same order, and the word of result
    (m, n) is written in the cycle the unpacked result would be written when n % 4 = 3 or n = N-1, else
    not at all; result (M-1, N-1) ends a word, so the last write, and with it done, does not move: `pc`
    changes neither formula.

    Drain lanes (``cfg.spad_lanes`` = l > 1, an overlapped chip; docs/spad-lanes.md derives it): the drain
    writes G = ceil(N/l) groups a row, group g being results g*l .. min(g*l+l, N)-1 of the row, one group a
    cycle through the scratchpad's l banked write ports. The group's last result must be final before its
    write cycle, which moves the first write N - G cycles later (0 when l = 1)::

        B = (K-1)*C + max(3 + N - G, C - 1) + M*G + 1 + RQ_PIPE_CYCLES*rq*cfg.rq_pipe

    With ``pc`` the groups are the same (l results a cycle, their bytes packed into the word they
    belong to, the word written in the cycle of its last group), so `pc` changes nothing here either.

    A broadcast array (``cfg.mm_bcast``, docs/mm-bcast.md, which derives it): every PE of row m takes
    A[m][k] in the same cycle and every column B[k] unskewed, so the whole row is final when its first
    column is. The columns of B's last group of a k are staged cB - 1 cycles after its first, so the
    array starts that much later, and the first write waits for it instead of the N - G cycles of the
    row's last group::

        B = (K-1)*C + max(2 + cB, C - 1) + M*G + 1 + RQ_PIPE_CYCLES*rq*cfg.rq_pipe

    A folding chip (``cfg.mm_fold``, docs/mm-fold.md) takes N up to twice the array for M up to half of it,
    the columns past the array in the lower rows, final when the upper rows are: the same formula, with cB
    and G counting the wide row's columns.
    """
    L = cfg.mm_load
    groups_b = mm_b_groups(N, cfg, pb, tb)
    if cfg.mm_overlap:
        c = max(-(-M // L), groups_b)
        g = -(-N // cfg.spad_lanes)         # drain groups a row: N when spad_lanes = 1
        # the wait for row 0's last group to be final: its skew, or on a broadcast array B's last group
        skew = groups_b - 1 if cfg.mm_bcast else N - g
        return (K - 1) * c + max(3 + skew, c - 1) + M * g + 1 + RQ_PIPE_CYCLES * rq * cfg.rq_pipe
    groups_k = -(-K // L)
    return M * groups_k + K * groups_b + (K + M + N - 2) + M * N + 7


def vadd_busy_cycles(n: int, cfg: ChipConfig) -> int:
    """WAIT cycles B of one VADD of `n` elements on the chip `cfg` (the timing contract of
    hdl/units/vadd.py, docs/vadd-ports.md): ``2*n + 2`` with one read port (``cfg.vadd_ports`` = 1, the
    book's: src1[i] and src2[i] in two cycles), ``n + 2`` with two (both in one cycle). With
    ``cfg.vec_lanes`` = l (docs/vec-lanes.md, which derives it) the unit takes G = ceil(n/l) groups of l
    consecutive elements, one group a cycle: ``G + 2`` (n + 2 when l = 1)."""
    if cfg.vadd_ports == 2:
        return -(-n // cfg.vec_lanes) + 2
    return 2 * n + 2


# Cycles the requantizer's pipeline register adds to its latency on a chip with ``rq_pipe`` = 1
# (docs/rq-pipe.md): the product acc * m is registered, so q follows its input one cycle later.
RQ_PIPE_CYCLES = 1


def rq_busy_cycles(n: int, cfg: ChipConfig) -> int:
    """WAIT cycles B of one RQ of `n` words on the chip `cfg` (the timing contract of hdl/units/rq.py,
    docs/rq-pipe.md): ``n + 2`` with the combinational requantizer (the book's), ``n + 3`` with its
    pipeline register (``cfg.rq_pipe`` = 1: each word is written one cycle later). With
    ``cfg.vec_lanes`` = l (docs/vec-lanes.md) the unit reads, requantizes and writes G = ceil(n/l) groups of
    l consecutive words, one group a cycle: ``G + 2 + rq_pipe`` (the old formula when l = 1)."""
    return -(-n // cfg.vec_lanes) + 2 + RQ_PIPE_CYCLES * cfg.rq_pipe


def busy_cycles(ins, lat: int = 8, cfg: ChipConfig = BOOK) -> int:
    """WAIT cycles B of one legal instruction on the chip `cfg`; the instruction costs ``seq_cycles`` + B
    cycles in all (2 + B on the book's chip; HALT: 2). Only the MM, VADD and RQ units' times depend on
    the configuration."""
    o = operands(ins, cfg)
    op = o["op"]
    if op == Op.HALT:
        return 0
    if op == Op.MM:
        # rq = 1 (docs/fused-rq.md) costs a cycle only with rq_pipe and mm_overlap (docs/rq-pipe.md); pb
        # and rq are read on a chip with mm_pack = 1 and mm_rq = 1 only
        return mm_busy_cycles(o["M"], o["K"], o["N"], cfg, tb=o["tb"], pb=o["pb"] if cfg.mm_pack else 0,
                              rq=o["rq"] if cfg.mm_rq else 0, pc=o["pc"] if cfg.mm_pack_c else 0)
    if op == Op.RQC:
        return RQC_BUSY
    if op in RESIDENT_OPS:
        runs = resident_runs(o["lo"], o["hi"], o["page_log2"])
        return resident_busy_cycles(op, len(runs), row_groups(o["hi"] - o["lo"], o["row_log2"], cfg), lat)
    n = o["len"]
    if op == Op.VADD:
        return vadd_busy_cycles(n, cfg)
    if op == Op.RQ:
        return rq_busy_cycles(n, cfg)
    if op == Op.SM:
        return sm_busy_cycles(n, cfg)
    # LD and ST move ext_port words a cycle (docs/ext-port.md): n on the book's chip
    groups = dma_groups(n, cfg)
    return {Op.LD: groups + lat + 1, Op.ST: groups + 2,
            Op.AMAX: n + 3, Op.UNPACK: 10 * n + 1}[Op(op)]


# Bits of the SM unit's divider (hardware spec 5.6): floor(2^38 / sum) is a 40-bit division.
SM_DIV_WIDTH = 40


def sm_busy_cycles(n: int, cfg: ChipConfig) -> int:
    """WAIT cycles B of one SM of `n` scores on the chip `cfg` (the timing contract of hdl/units/sm.py,
    docs/sm-div.md): three passes of n + 1 cycles, the divider's start cycle, ``SM_DIV_WIDTH / sm_div``
    division cycles and two more (the divider's done and the unit's)::

        B = 3*n + 7 + 40 / sm_div

    which is the book's 3*n + 47 with ``sm_div`` = 1, 3*n + 27 with 2, 3*n + 17 with 4."""
    return 3 * n + 7 + SM_DIV_WIDTH // cfg.sm_div


# WAIT cycles of an RQC (docs/fused-rq.md): the MM unit's requantizer registers take (m, s, relu) at E0
# and the chip ends the WAIT at once (done in W1); no unit is started.
RQC_BUSY = 1


# The sequencer's own cycles for one instruction fetched and issued the book's way: FETCH and ISSUE
# (hardware spec 2.2).
SEQ_CYCLES = 2


def seq_cycles(index: int, cfg: ChipConfig = BOOK, after_error: bool = False) -> int:
    """Cycles the sequencer spends on instruction `index` of a run (0 = the first; HALT included) outside
    every unit's WAIT cycles, so that a run's ``cyc_total`` is the sum of ``seq_cycles + busy_cycles`` over
    the instructions it issues, its HALT included.

    On the book's chip every instruction costs its FETCH and ISSUE cycles: ``SEQ_CYCLES`` = 2. On a chip
    with ``prefetch`` = 1 (docs/prefetch.md) an instruction that follows another was fetched while that one
    worked and is issued in its done cycle, which is one of its WAIT cycles: 0. The first instruction of a
    run, and the HALT that an error stop issues (`after_error`: the instruction after a GATHER or SCATTER
    that found a bad table, docs/resident.md), go through FETCH and ISSUE on every chip: 2.
    """
    if cfg.prefetch and index > 0 and not after_error:
        return 0
    return SEQ_CYCLES


# ---- the ideal under the chip's own limits (issue 23: the yardstick of `ga2 profile`) ---------------------
#
# Beside each busy time above, the least time the same work could take if the unit did nothing but that work
# at the rate the chip's own resources allow: the PEs an MM's shape can use, the lanes of a vector unit, the
# width of the external-memory port. busy_cycles - ideal_cycles is what a unit loses to staging, draining,
# latency, extra passes and setup; the sequencer's 2 cycles of fetch and issue an instruction have an ideal of
# 0 (a chip can overlap them with the previous instruction's work: a prefetch chip does, `seq_cycles`).

def vector_lanes(cfg: ChipConfig = BOOK) -> int:
    """Elements a vector unit (RQ, SM, VADD, AMAX, UNPACK) can take in one cycle on the chip `cfg`:
    ``cfg.vec_lanes`` (docs/vec-lanes.md: RQ and VADD move that many words a cycle through the banks; 1, each
    element one scratchpad word a cycle, on the book's chip and every preset). SM, AMAX and UNPACK still
    take one a cycle on a lanes chip: their ideal is then the lanes', the gap their loss to one lane."""
    return cfg.vec_lanes


def ext_port_words(cfg: ChipConfig = BOOK) -> int:
    """Words the external-memory port can move in one cycle on the chip `cfg`: ``cfg.ext_port`` (one on the
    book's chip; docs/ext-port.md)."""
    return cfg.ext_port


def dma_groups(words: int, cfg: ChipConfig = BOOK) -> int:
    """Cycles an LD or ST of `words` words moves data on the chip `cfg`: ``ceil(words / ext_port)`` groups of
    consecutive words, the last one possibly partial (docs/ext-port.md); `words` on the book's chip."""
    return -(-words // cfg.ext_port)


def row_group_log2(row_log2: int, cfg: ChipConfig = BOOK) -> int:
    """log2 of the groups one GATHER or SCATTER row of ``2**row_log2`` words takes on the chip `cfg`: a group
    is ``min(ext_port, row words)`` words and never crosses a row (docs/ext-port.md), so
    ``max(row_log2 - log2(ext_port), 0)``; `row_log2` itself on the book's chip."""
    return max(row_log2 - (cfg.ext_port.bit_length() - 1), 0)


def row_groups(rows: int, row_log2: int, cfg: ChipConfig = BOOK) -> int:
    """Cycles a GATHER or SCATTER spends moving `rows` rows of ``2**row_log2`` words on the chip `cfg`
    (`row_group_log2`): the words on a one-word port."""
    return rows << row_group_log2(row_log2, cfg)


def macs(ins, cfg: ChipConfig | None = None) -> int:
    """Multiply-accumulates one instruction does on the chip `cfg` (its N's width: docs/mm-fold.md):
    ``M*K*N`` for an MM (fused or not), 0 for the others."""
    o = operands(ins, cfg)
    return o["M"] * o["K"] * o["N"] if o["op"] == Op.MM else 0


def ext_words(ins) -> int:
    """Words one instruction moves across the external-memory port: ``len`` for LD and ST, the rows'
    words ``(hi - lo) << row_log2`` for GATHER and SCATTER (a normal end: an error stop moves fewer), 0 for
    the others."""
    o = operands(ins)
    op = o["op"]
    if op in (Op.LD, Op.ST):
        return o["len"]
    if op in RESIDENT_OPS:
        return (o["hi"] - o["lo"]) << o["row_log2"]
    return 0


def vector_elements(ins) -> int:
    """Elements one vector instruction handles, one a cycle per lane at best: ``len`` for RQ, SM, AMAX and
    VADD (a word of each source, a word of the result), ``8*len`` for UNPACK (one int4 result word per nibble
    of its ``len`` source words); 0 for the other opcodes."""
    o = operands(ins)
    op = o["op"]
    if op == Op.UNPACK:
        return 8 * o["len"]
    return o["len"] if op in (Op.RQ, Op.SM, Op.AMAX, Op.VADD) else 0


def ideal_cycles(ins, cfg: ChipConfig = BOOK) -> int:
    """The least WAIT cycles the work of one legal instruction could take under the chip `cfg`'s own limits
    (the yardstick beside `busy_cycles`):

    - MM: its MACs over the PEs its shape can use, ``ceil(M*K*N / (M*N))`` = K (M x N of the array's PEs
      hold a result each; each needs K multiply-accumulates);
    - RQ, SM, VADD, AMAX, UNPACK: ``ceil(vector_elements / vector_lanes)``;
    - LD, ST, GATHER, SCATTER: ``ceil(ext_words / ext_port_words)``;
    - RQC and HALT: 0 (no data moves: its cycle is overhead).

    For every legal instruction and every latency it is at most ``busy_cycles(ins, lat, cfg)`` (checked by
    tests/test_profile.py on random programs).
    """
    o = operands(ins, cfg)
    op = o["op"]
    if op == Op.MM:
        return -(-macs(ins, cfg) // (o["M"] * o["N"]))
    if op in (Op.RQ, Op.SM, Op.VADD, Op.AMAX, Op.UNPACK):
        return -(-vector_elements(ins) // vector_lanes(cfg))
    if op in (Op.LD, Op.ST) or op in RESIDENT_OPS:
        return -(-ext_words(ins) // ext_port_words(cfg))
    return 0


def resident_runs(lo: int, hi: int, page_log2: int) -> list[tuple[int, int, int]]:
    """The runs of a GATHER/SCATTER (docs/resident.md "Cycle model"): the rows of [lo, hi) that lie in
    one page, as ``(table index, first row, rows)`` in the order the unit moves them."""
    runs = []
    r = lo
    while r < hi:
        index = r >> page_log2
        end = min(hi, (index + 1) << page_log2)
        runs.append((index, r, end - r))
        r = end
    return runs


def resident_busy_cycles(op: int, runs: int, words: int, lat: int, *, error: bool = False,
                         built_lat: int | None = None) -> int:
    """WAIT cycles of a GATHER or SCATTER that looked up `runs` table entries and moved `words` words.

    On a chip whose external port moves more than one word a cycle (``ext_port``, docs/ext-port.md), `words`
    is the groups moved instead (`row_groups`: one a cycle, as a word is on the book's chip).

    A normal end: every run of the instruction and all its words. An error stop in run j (1-based):
    ``runs = j`` and the words of the j - 1 runs done (docs/resident.md). Two lookup cycles per run, one
    cycle per word, then LD's tail (LAT + 1) for GATHER or ST's (2) for SCATTER.

    `built_lat` is the LAT the GATHER unit was built for (``config.lat``; by default `lat`, as the
    harness builds the chip for its memory). It matters only for a GATHER that ends in its error tail
    (`error`: an error stop, or the empty range that ``validate`` refuses): the tail is ``built_lat + 1``
    cycles after the failing lookup, but never ends before the last response (requested two cycles
    before that lookup when words were moved) is written, so with a memory of latency `lat`::

        B = 2 * runs + words + max(built_lat + 1, lat - 1 if words else 0)

    which is ``2 * runs + words + lat + 1`` when ``built_lat == lat``.
    """
    if op != Op.GATHER:
        return 2 * runs + words + 2
    if error and built_lat is not None:
        return 2 * runs + words + max(built_lat + 1, lat - 1 if words else 0)
    return 2 * runs + words + lat + 1


# ---- helpers for files and messages --------------------------------------------------------------

def to_words32(word: int) -> list[int]:
    """A 128-bit instruction as four 32-bit words, most significant first (the hex-file order)."""
    return [(word >> s) & 0xFFFFFFFF for s in (96, 64, 32, 0)]


def from_words32(ws) -> int:
    w = 0
    for x in ws:
        w = (w << 32) | (x & 0xFFFFFFFF)
    return w


def describe(ins, cfg: ChipConfig | None = None) -> str:
    """One line of assembly for an instruction, from the bits the hardware (of the chip `cfg`: MM's N on an
    ``mm_fold`` chip) reads."""
    o = operands(ins, cfg)
    op = o.pop("op")
    try:
        name = Op(op).name.lower()
    except ValueError:
        return f"illegal opcode {op}"
    if op == Op.MM:
        for flag in ("rq", "pb", "pc"):
            if not o[flag]:
                del o[flag]         # a plain MM reads as on the book's chip
    return name + "".join(f" {k}={v}" for k, v in o.items())
