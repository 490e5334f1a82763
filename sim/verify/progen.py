"""Seeded random GA-2 programs for fuzzing the backends against the reference (hardware spec 6.5).

Two kinds of program come out of `random_program`:

* classic (``knobs=None``): four operand arenas loaded with LDs, 10-25 random MM/RQ/SM/VADD/AMAX/LD/ST/
  UNPACK instructions whose operands never partially overlap, the result area stored, HALT. Short (a few
  thousand cycles): the Amaranth-simulator tests use these.
* wide (a `Knobs` with ``wide=True``): the whole scratchpad is loaded and in play, and the knobs push the
  program into the corners: partially overlapping operands, junk in every bit the hardware ignores,
  maximum lengths, the same unit back to back, one instruction reading what the previous one wrote. The
  program is built to stay within its cycle budget (at most `sim.backends.MAX_CYCLES`) at its LAT.

`fuzz_case` draws the mix `sim.verify.fuzz` runs by default: an (EXT, LAT) from `MIX_CONFIGS` and the knobs
from `draw_knobs`, each program from its own seed so that one program can be regenerated alone.
Same seed, same programs.

Command: ``python -m sim.progen --seed S --count N [--ext 2048] [--lat 8] --out FILE.hex``
(``--directed`` writes the spec's directed programs instead). It writes classic programs: a record file
holds programs that pass ``hdl.isa.validate``, and junk in the bits it refuses would not.
"""
from __future__ import annotations

import random
from array import array
from dataclasses import dataclass

from hdl.config import BOOK
from hdl.isa import (SPAD_WORDS, Instr, Op, amax, busy_cycles, field_bits, halt, hw_operands, issue_limits, issue_stop,
                     ld, legal_ops, mm, rq, rqc, sm, st, unpack, validate, vadd)

from sim.backends import MAX_CYCLES, MAX_LAT
from sim.formats.hexfile import ProgramRecord, make_record

__all__ = ["random_program", "random_suite", "directed_suite", "LAYOUT", "Knobs", "draw_knobs", "ignored_bits",
           "max_len", "FuzzCase", "fuzz_case", "stop_word", "STOP_SHARE", "MIX_CONFIGS", "CI_CONFIGS",
           "resident_program", "RESIDENT_SHARE", "RESIDENT_CI_CONFIGS"]

# Scratchpad: four 256-word arenas at 0..1023 loaded from ext[0..1023]; results at the top of the
# scratchpad (so the 12-bit address limit is exercised); the result area is stored to the top of EXT.
ARENA = 256
RESULT_BASE, RESULT_LEN = 3840, 256
LAYOUT = {"arenas": [(k * ARENA, ARENA) for k in range(4)], "result": (RESULT_BASE, RESULT_LEN)}
_W = 0xFFFFFFFF


def _disjoint(a: int, n: int, b: int, m: int) -> bool:
    return a + n <= b or b + m <= a


def _ext_layout(ext: int) -> tuple[int, int, int]:
    """(source words, start of the scratch ST zone, start of the final result copy) for EXT words."""
    if ext < 4 * ARENA + 2 * RESULT_LEN:
        raise ValueError(f"ext = {ext} words is too small for random programs (need >= {4 * ARENA + 2 * RESULT_LEN})")
    return 4 * ARENA, 4 * ARENA, ext - RESULT_LEN


def _random_image(rng: random.Random, ext: int) -> list[int]:
    img = [0] * ext
    for i in range(ARENA):
        img[i] = rng.randint(-128, 127) & _W                                  # int8, sign-extended
        img[ARENA + i] = (rng.randint(-128, 127) & 0xFF) | (rng.getrandbits(24) << 8)  # junk above bit 7
        img[2 * ARENA + i] = rng.randint(-(1 << 20), 1 << 20) & _W if rng.random() < 0.8 else rng.getrandbits(32)
        img[3 * ARENA + i] = rng.getrandbits(32)                              # packed nibbles, raw words
    for i in range(4 * ARENA, ext):
        if rng.random() < 0.1:
            img[i] = rng.getrandbits(32)
    return img


def _random_rqc(rng: random.Random) -> Instr:
    """An RQC (a chip with mm_rq=1, docs/fused-rq.md) with RQ's mix of multipliers and shifts."""
    m = rng.choice([rng.randint(1 << 23, (1 << 24) - 1), rng.getrandbits(24), 0, (1 << 24) - 1])
    s = rng.choice([rng.randint(10, 40), rng.randint(0, 63), 0, 63])
    return rqc(m, s, relu=rng.randint(0, 1))


def _packed_b(rng: random.Random, fast, N: int) -> tuple[int, int]:
    """(pb, words of one k of B): on a chip with mm_pack = 1 an MM reads B packed (pb, fl[2],
    docs/mm-fast.md) one time in two, ceil(N/4) words a k; elsewhere (0, N) and no random number is drawn."""
    if fast is not None and fast.mm_pack and rng.random() < 0.5:
        return 1, -(-N // 4)
    return 0, N


def _mm_shape(rng: random.Random, fast) -> tuple[int, int, int, int, int, int]:
    """(M, N, K, tb, pb, words of one k of B) of a random MM on the chip `fast` (None: the book's array of 4),
    drawn in the one order both generators use (so a seed gives the same programs as before). On an
    mm_pack_c chip half the packed Bs are transposed (tb = pb = 1): the last item is then the words of one
    n, ceil(K/4). On an mm_fold chip half the MMs of at most half the array's rows are wide (N past the
    array, docs/mm-fold.md): drawn after the others, so that no other chip's programs change."""
    top = 4 if fast is None else fast.array
    M, N = rng.randint(1, top), rng.randint(1, top)
    if fast is not None and fast.mm_fold and M <= top // 2 and rng.random() < 0.5:
        N = rng.randint(top + 1, fast.mm_max_n)
    K = rng.choice([1, 64, rng.randint(2, 63)])
    tb = rng.randint(0, 1)
    pb, pw = _packed_b(rng, fast, N)
    if pb and fast.mm_pack_c and rng.random() < 0.5:
        # docs/mm-pack-c.md: N rows of K packed four a word, read transposed (ceil(K/4) words an n)
        return M, N, K, 1, 1, -(-K // 4)
    return M, N, K, 0 if pb else tb, pb, pw


def _span_b(N: int, K: int, tb: int, pb: int, pw: int, ldb: int) -> int:
    """Words of B's region (``hdl.isa.validate``'s): (K-1)*ldb + (ceil(N/4) packed, else N); transposed
    (N-1)*ldb + (ceil(K/4) packed on an mm_pack_c chip, else K); `pw` the packed words of a k or an n."""
    if tb:
        return (N - 1) * ldb + (pw if pb else K)
    return (K - 1) * ldb + (pw if pb else N)


def _maybe_fused(rng: random.Random, ins: Instr, mm_rq: bool, fast=None) -> Instr:
    """On a chip with mm_rq=1 an MM gets its rq flag (fl[1]) one time in two; elsewhere `ins` as it is
    (and no random number is drawn, so the book's programs do not change). On an mm_pack_c chip (`fast`)
    half the fused MMs write C packed (pc, fl[3], docs/mm-pack-c.md), half of those with the dense
    ldc = ceil(N/4): C's region only shrinks, so the placement drawn for the unpacked C still holds."""
    if mm_rq and rng.random() < 0.5:
        fields = {f: getattr(ins, f) for f in ("op", "a", "b", "c", "d", "e", "f", "g", "h", "x")}
        fl = ins.fl | 2
        if fast is not None and fast.mm_pack_c and rng.random() < 0.5:
            fl |= 8
            if rng.random() < 0.5:
                fields["x"] = -(-ins.h // 4)
        return Instr(**{**fields, "fl": fl})
    return ins


class _Gen:
    """State of one program being generated."""

    def __init__(self, rng: random.Random, ext: int, mm_rq: bool = False, fast=None):
        self.rng = rng
        self.ext = ext
        self.mm_rq = mm_rq
        self.fast = fast        # the chip, if it has mm_pack or mm_overlap (docs/mm-fast.md), else None
        self.src_words, self.st_zone, self.final_dst = _ext_layout(ext)

    # -- regions --
    def length(self, hi: int = 64) -> int:
        r = self.rng.random()
        if r < 0.15:
            return 1
        if r < 0.25:
            return hi
        return self.rng.randint(1, hi)

    def anywhere(self, n: int) -> int:
        """A source region of n words in the arenas or the result area."""
        if self.rng.random() < 0.6:
            return self.rng.randint(0, 4 * ARENA - n)
        return self.rng.randint(RESULT_BASE, RESULT_BASE + RESULT_LEN - n)

    def result_dst(self, n: int, avoid=()) -> int | None:
        """A destination of n words in the result area, disjoint from every (start, len) in avoid."""
        for _ in range(20):
            d = self.rng.randint(RESULT_BASE, RESULT_BASE + RESULT_LEN - n)
            if all(_disjoint(d, n, a, m) for a, m in avoid):
                return d
        return None

    def in_result(self, a: int, n: int) -> bool:
        return RESULT_BASE <= a and a + n <= RESULT_BASE + RESULT_LEN

    # -- instructions --
    def mm(self) -> Instr:
        rng = self.rng
        M, N, K, tb, pb, pw = _mm_shape(rng, self.fast)
        lda = rng.choice([K, K, rng.randint(0, K + 8)])
        ldb = rng.choice([pw if pb else K if tb else N, rng.randint(0, 70)])
        ldc = rng.choice([N, N, rng.randint(N, max(N, 12)), rng.randint(0, N)])
        span_a = (M - 1) * lda + K
        span_b = _span_b(N, K, tb, pb, pw, ldb)
        span_c = (M - 1) * ldc + N
        if span_a > 4 * ARENA or span_b > 4 * ARENA or span_c > RESULT_LEN:
            lda, ldb, ldc = K, (pw if pb else K if tb else N), N
            span_a, span_b, span_c = (M - 1) * K + K, _span_b(N, K, tb, pb, pw, ldb), (M - 1) * N + N
        A = self.anywhere(span_a) if span_a <= RESULT_LEN else rng.randint(0, 4 * ARENA - span_a)
        B = self.anywhere(span_b) if span_b <= RESULT_LEN else rng.randint(0, 4 * ARENA - span_b)
        dst = rng.randint(RESULT_BASE, RESULT_BASE + RESULT_LEN - span_c)   # MM may overlap freely
        return _maybe_fused(rng, mm(dst, A, B, M=M, K=K, N=N, lda=lda, ldb=ldb, ldc=ldc, tb=tb, pb=pb), self.mm_rq,
                            self.fast)

    def rqc(self) -> Instr:
        return _random_rqc(self.rng)

    def unary_dst(self, src: int, n: int) -> int:
        """dst identical to src (in place, when src is a result) or disjoint from it."""
        if self.in_result(src, n) and self.rng.random() < 0.4:
            return src
        d = self.result_dst(n, avoid=[(src, n)])
        return src if d is None and self.in_result(src, n) else d

    def rq(self) -> Instr | None:
        rng = self.rng
        n = self.length()
        src = self.anywhere(n)
        dst = self.unary_dst(src, n)
        if dst is None:
            return None
        m = rng.choice([rng.randint(1 << 23, (1 << 24) - 1), rng.getrandbits(24)])
        s = rng.choice([rng.randint(20, 40), rng.randint(0, 63)])
        return rq(dst, src, n, m=m, s=s, relu=rng.randint(0, 1))

    def sm(self) -> Instr | None:
        n = self.length()
        src = self.anywhere(n)
        dst = self.unary_dst(src, n)
        return None if dst is None else sm(dst, src, n)

    def vadd(self) -> Instr | None:
        n = self.length()
        s1, s2 = self.anywhere(n), self.anywhere(n)
        r = self.rng.random()
        if r < 0.25 and self.in_result(s1, n) and (s2 == s1 or _disjoint(s1, n, s2, n)):
            dst = s1
        elif r < 0.5 and self.in_result(s2, n) and (s1 == s2 or _disjoint(s1, n, s2, n)):
            dst = s2
        else:
            dst = self.result_dst(n, avoid=[(s1, n), (s2, n)])
        return None if dst is None else vadd(dst, s1, s2, n)

    def amax(self) -> Instr:
        n = self.length()
        src = self.anywhere(n)
        return amax(self.rng.randint(RESULT_BASE, RESULT_BASE + RESULT_LEN - 1), src, n)

    def unpack(self) -> Instr | None:
        n = self.length(8)
        src = self.anywhere(n)
        dst = self.result_dst(8 * n, avoid=[(src, n)])
        return None if dst is None else unpack(dst, src, n)

    def ld(self) -> Instr:
        n = self.length()
        dst = self.rng.choice([self.rng.randint(0, 4 * ARENA - n), self.result_dst(n) or 0])
        return ld(dst, self.rng.randint(0, self.ext - n), n)     # may read back earlier stores

    def st(self) -> Instr:
        n = self.length()
        return st(self.anywhere(n), self.rng.randint(self.st_zone, self.final_dst - n), n)


_KINDS = ("mm", "mm", "rq", "sm", "vadd", "amax", "unpack", "ld", "st")


def _classic_program(rng: random.Random, ext: int, cfg=BOOK) -> tuple[list[int], list[int]]:
    g = _Gen(rng, ext, bool(cfg.mm_rq), cfg if cfg.mm_pack or cfg.mm_overlap else None)
    kinds = _KINDS + (("rqc",) if cfg.mm_rq else ())
    image = _random_image(rng, ext)
    prog: list[Instr] = []
    for base, n in LAYOUT["arenas"]:
        if rng.random() < 0.3:          # sometimes in two pieces
            cut = rng.randint(1, n - 1)
            prog += [ld(base, base, cut), ld(base + cut, base + cut, n - cut)]
        else:
            prog.append(ld(base, base, n))
    target = rng.randint(10, 25)
    body = 0
    while body < target:
        ins = getattr(g, rng.choice(kinds))()
        if ins is None:
            continue
        prog.append(ins)
        body += 1
    prog.append(st(RESULT_BASE, g.final_dst, RESULT_LEN))
    prog.append(halt())
    words = [i.word for i in prog]
    for pc, w in enumerate(words):
        validate(w, ext_words=ext, index=pc, cfg=cfg)
    return words, image


# ---- wide programs: the knobs -------------------------------------------------------------------

@dataclass(frozen=True)
class Knobs:
    """How far a program leans into the corners. Every probability applies to each instruction.

    Attributes
    ----------
    wide : bool
        The whole scratchpad is loaded first and operands go anywhere in it; the program ends by storing
        as much of the scratchpad as EXT holds (all of it from EXT 8192 up). False: a classic program,
        and every other knob must be left at its default.
    overlap : float
        RQ, VADD, SM, UNPACK or AMAX writes a region that partially overlaps one of its sources.
    junk : float
        The word carries random bits in every bit the hardware ignores (`ignored_bits`); one time in
        four all of them are set.
    maxlen : float
        The length is the largest legal one (`max_len`; LD and ST as far as EXT allows).
    longlen : float
        The length is drawn from 1 .. the largest (otherwise mostly 1 .. 64).
    repeat : float
        The next instruction goes to the same unit (the unit is started again two cycles after its done;
        on a prefetch chip, docs/prefetch.md, at the edge that closes its done cycle).
    chain : float
        The next instruction reads what the previous one wrote (an LD reads back the previous ST).
    budget : int
        The program's cycles at its LAT (``hdl.isa.busy_cycles``) stay within this.
    """
    wide: bool = False
    overlap: float = 0.0
    junk: float = 0.0
    maxlen: float = 0.0
    longlen: float = 0.0
    repeat: float = 0.0
    chain: float = 0.0
    budget: int = MAX_CYCLES

    def __post_init__(self):
        for name in ("overlap", "junk", "maxlen", "longlen", "repeat", "chain"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"knob {name} = {v!r} is not a probability")
            if v and not self.wide:
                raise ValueError(f"knob {name} needs a wide program (wide=True)")
        if self.maxlen + self.longlen > 1.0:
            raise ValueError(f"knobs maxlen + longlen = {self.maxlen + self.longlen} exceed 1")
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or not 1 <= self.budget <= MAX_CYCLES:
            raise ValueError(f"budget = {self.budget!r} must be a whole number of cycles in 1..{MAX_CYCLES}")


def ignored_bits(op, cfg=BOOK) -> int:
    """The bits of a 128-bit word of opcode `op` that the chip `cfg` never reads: all but the opcode and
    the operand fields of ``hdl.isa.hw_operands`` (``HW_OPERANDS`` less MM's rq bit unless ``mm_rq``)."""
    used = 0xF << 124
    for hi, lo in hw_operands(op, cfg).values():
        used |= ((1 << (hi - lo + 1)) - 1) << lo
    return ((1 << 128) - 1) & ~used


def max_len(op, ext: int = 1 << 16) -> int:
    """The largest length an instruction of `op` can have (``hdl.isa.validate``'s limits), LD and ST also
    limited by an external memory of `ext` words; UNPACK's 512 needs dst = 0 (8 x 512 words)."""
    op = Op(op)
    if op == Op.VADD:
        return SPAD_WORDS
    if op == Op.UNPACK:
        return SPAD_WORDS // 8
    if op in (Op.LD, Op.ST):
        return min(SPAD_WORDS - 1, ext)
    return SPAD_WORDS - 1


_SPAD = SPAD_WORDS
_EXTREMES = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFFFF80, 0xFFFFFF81, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)
_WIDE_KINDS = ("mm", "rq", "sm", "vadd", "amax", "unpack", "ld", "st")
# On a prefetch chip (docs/prefetch.md): the chance that an instruction of a new kind starts a burst of 2..6
# short instructions (`_Wide.short`).
_BURST = 0.25


def _words32(rng: random.Random, n: int) -> list[int]:
    a = array("I", rng.randbytes(4 * n))
    assert a.itemsize == 4
    return a.tolist()


def _wide_image(rng: random.Random, ext: int) -> list[int]:
    """EXT words in runs of one kind each: zeros, raw 32-bit words (packed nibbles, int8 with junk above),
    sign-extended int8, small values (ties for AMAX and SM), int32 of moderate size, one repeated
    value, the extremes of each width."""
    img: list[int] = []
    while len(img) < ext:
        n = min(ext - len(img), rng.choice((1, 16, 64, 256, 1024, rng.randint(1, 512))))
        kind = rng.randrange(7)
        if kind == 0:
            img += [0] * n
        elif kind == 1:
            img += _words32(rng, n)
        elif kind == 2:
            img += [b | 0xFFFFFF00 if b & 0x80 else b for b in rng.randbytes(n)]
        elif kind == 3:
            img += [(b % 17 - 8) & _W for b in rng.randbytes(n)]
        elif kind == 4:
            img += [((w & 0x1FFFFF) - 0x100000) & _W for w in _words32(rng, n)]
        elif kind == 5:
            img += [rng.choice(_EXTREMES + (rng.getrandbits(32),))] * n
        else:
            img += [_EXTREMES[b % len(_EXTREMES)] for b in rng.randbytes(n)]
    return img


class _Wide:
    """State of one wide program being generated: the knobs, the last instruction's output."""

    def __init__(self, rng: random.Random, ext: int, lat: int, knobs: Knobs, mm_rq: bool = False, fast=None):
        self.rng, self.ext, self.lat, self.k = rng, ext, lat, knobs
        self.mm_rq = mm_rq
        self.fast = fast        # the chip, if it has mm_pack or mm_overlap (docs/mm-fast.md), else None
        # External memory: body STs write below `zone`, the final stores from `zone` up.
        self.zone = ext - _SPAD if ext >= 2 * _SPAD else ext // 4
        self.prev: tuple[str, int, int] | None = None      # ("spad" | "ext", start, length) last written
        # Instructions left in a burst (a prefetch chip only, docs/prefetch.md): lengths 1..3, each reading
        # what the one before wrote, so that short instructions of every unit are issued back to back in
        # each other's done cycles.
        self.short = 0

    # -- lengths and regions --
    def length(self, top: int) -> int:
        rng, k = self.rng, self.k
        if self.short:
            return rng.randint(1, min(3, top))
        r = rng.random()
        if r < k.maxlen:
            return top
        if r < k.maxlen + k.longlen:
            return rng.randint(1, top)
        r = rng.random()
        if r < 0.15:
            return 1
        if r < 0.25:
            return min(64, top)
        return rng.randint(1, min(64, top))

    def region(self, n: int) -> int:
        return self.rng.randint(0, _SPAD - n)

    def source(self, n: int) -> int:
        """Where n words are read from: what the previous instruction wrote (knob `chain`), or anywhere."""
        if self.prev and self.prev[0] == "spad" and (self.short or self.rng.random() < self.k.chain):
            return min(self.prev[1], _SPAD - n)
        return self.region(n)

    def overlapping(self, src: int, n: int, out_n: int) -> int | None:
        """A dst whose `out_n` words partially overlap the n words at src (never dst == src when
        out_n == n: that is in place), or None when there is no such dst."""
        lo, hi = max(0, src - out_n + 1), min(_SPAD - out_n, src + n - 1)
        near = [src + d for d in (1, 2, 3, -1, -2, -3)] + [lo, hi]
        if self.fast is not None and self.fast.vec_lanes > 1:
            # the distances where RQ's and VADD's groups of l words see a group of theirs or not (lag 2
            # or 3 groups, docs/vec-lanes.md): up to 3l + 1 words after the source (one-lane chips draw as before)
            near += [src + d for d in range(4, 3 * self.fast.vec_lanes + 2)]
        if lo <= hi:
            near.append(self.rng.randint(lo, hi))
        ok = [d for d in near if lo <= d <= hi and not (d == src and out_n == n)]
        return self.rng.choice(ok) if ok else None

    def dst(self, src: int, n: int, out_n: int) -> int:
        rng = self.rng
        if rng.random() < self.k.overlap:
            d = self.overlapping(src, n, out_n)
            if d is not None:
                return d
        if out_n == n and rng.random() < 0.25:
            return src
        return rng.randint(0, _SPAD - out_n)

    # -- instructions: each returns (instruction, what it writes) --
    def mm(self):
        rng = self.rng
        M, N, K, tb, pb, pw = _mm_shape(rng, self.fast)
        lda = rng.choice([K, K, rng.randint(0, K + 8), rng.randint(0, 1000)])
        ldb = rng.choice([pw if pb else K if tb else N, rng.randint(0, 70), rng.randint(0, 1000)])
        ldc = rng.choice([N, N, rng.randint(0, 12), rng.randint(0, 1000)])
        span_a = (M - 1) * lda + K
        span_b = _span_b(N, K, tb, pb, pw, ldb)
        if span_b > _SPAD:
            ldb = pw if pb else K if tb else N
            span_b = _span_b(N, K, tb, pb, pw, ldb)
        if (M - 1) * lda + K > _SPAD or (M - 1) * ldc + N > _SPAD:    # only with M > 4 (mm-fast chips)
            lda, ldc = K, N
            span_a = M * K
        span_c = (M - 1) * ldc + N
        A, B = self.source(span_a), self.source(span_b)
        dst = rng.randint(0, _SPAD - span_c)          # the operands are staged first: any overlap is fine
        ins = mm(dst, A, B, M=M, K=K, N=N, lda=lda, ldb=ldb, ldc=ldc, tb=tb, pb=pb)
        return _maybe_fused(rng, ins, self.mm_rq, self.fast), ("spad", dst, span_c)

    def rqc(self):
        return _random_rqc(self.rng), self.prev         # writes nothing: the chain goes on

    def rq(self):
        rng = self.rng
        n = self.length(max_len(Op.RQ))
        src = self.source(n)
        dst = self.dst(src, n, n)
        m = rng.choice([rng.randint(1 << 23, (1 << 24) - 1), rng.getrandbits(24), 0, (1 << 24) - 1])
        s = rng.choice([rng.randint(20, 40), rng.randint(0, 63), 0, 63])
        return rq(dst, src, n, m=m, s=s, relu=rng.randint(0, 1)), ("spad", dst, n)

    def sm(self):
        n = self.length(max_len(Op.SM))
        src = self.source(n)
        dst = self.dst(src, n, n)
        return sm(dst, src, n), ("spad", dst, n)

    def vadd(self):
        rng = self.rng
        n = self.length(max_len(Op.VADD))
        s1 = self.source(n)
        s2 = rng.choice([self.region(n), s1, min(max(0, s1 + rng.randint(-3, 3)), _SPAD - n)])
        if rng.random() < 0.5:
            s1, s2 = s2, s1
        dst = self.dst(rng.choice([s1, s2]), n, n)
        return vadd(dst, s1, s2, n), ("spad", dst, n)

    def amax(self):
        n = self.length(max_len(Op.AMAX))
        src = self.source(n)
        dst = self.dst(src, n, 1)
        return amax(dst, src, n), ("spad", dst, 1)

    def unpack(self):
        rng = self.rng
        top = max_len(Op.UNPACK) - (rng.random() < 0.5)         # 511 or 512 (512 only at dst 0)
        n = self.length(top)
        src = self.source(n)
        dst = self.dst(src, n, 8 * n)
        return unpack(dst, src, n), ("spad", dst, 8 * n)

    def ld(self):
        rng = self.rng
        n = self.length(max_len(Op.LD, self.ext))
        if self.prev and self.prev[0] == "ext" and rng.random() < self.k.chain:
            src = min(self.prev[1], self.ext - n)                # read back what the last ST wrote
        else:
            src = rng.randint(0, self.ext - n)
        dst = self.region(n)
        return ld(dst, src, n), ("spad", dst, n)

    def st(self):
        n = self.length(max_len(Op.ST, self.zone))
        src = self.source(n)
        dst = self.rng.randint(0, self.zone - n)
        return st(src, dst, n), ("ext", dst, n)


def _fill(rng: random.Random, ext: int, words: int) -> list[Instr]:
    """LDs that load scratchpad words 0 .. words-1 from random places in external memory."""
    out, pos = [], 0
    while pos < words:
        n = min(words - pos, ext, SPAD_WORDS - 1)
        out.append(ld(pos, rng.randint(0, ext - n), n))
        pos += n
    return out


def _final_stores(rng: random.Random, ext: int, zone: int) -> list[Instr]:
    """Copy the scratchpad (all of it when EXT >= 8192, else a random window) to ext[zone:]."""
    if ext - zone >= _SPAD:
        return [st(0, zone, _SPAD - 1), st(_SPAD - 1, zone + _SPAD - 1, 1)]
    n = ext - zone
    return [st(rng.randint(0, _SPAD - n), zone, n)]


def _with_junk(rng: random.Random, word: int, p: float, cfg=BOOK) -> int:
    if rng.random() >= p:
        return word
    mask = ignored_bits(word >> 124, cfg)
    return word | (mask if rng.random() < 0.25 else rng.getrandbits(128) & mask)


def _wide_program(rng: random.Random, ext: int, lat: int, k: Knobs, cfg=BOOK) -> tuple[list[int], list[int]]:
    if ext < 1024:
        raise ValueError(f"ext = {ext} words is too small for wide programs (need >= 1024)")
    g = _Wide(rng, ext, lat, k, bool(cfg.mm_rq), cfg if cfg.mm_pack or cfg.mm_overlap else None)
    kinds = _WIDE_KINDS + (("rqc",) if cfg.mm_rq else ())
    image = _wide_image(rng, ext)
    # the larger of the book's and the chip's cost: every parameter but rq_pipe only shortens instructions
    # (so those chips' programs are the book-counted ones they always were), and an RQ (and an overlapped
    # fused MM) of a chip with rq_pipe takes one cycle more (docs/rq-pipe.md), which the budget must count
    cost = lambda ins: 2 + max(busy_cycles(ins, lat), busy_cycles(ins, lat, cfg))      # noqa: E731
    tail = _final_stores(rng, ext, g.zone)
    reserve = sum(map(cost, tail)) + 2                                  # the stores and the HALT
    # Load the whole scratchpad when the budget allows it, else a part that leaves half the budget.
    words = _SPAD
    while words > 64 and sum(map(cost, _fill(random.Random(0), ext, words))) > (k.budget - reserve) // 2:
        words //= 2
    prog = _fill(rng, ext, words)
    used = sum(map(cost, prog)) + reserve
    if used > k.budget:
        raise ValueError(f"budget = {k.budget} cycles is too small for a wide program at EXT {ext}, "
                         f"LAT {lat} (needs {used})")
    target, tries = rng.randint(8, 40), 0
    kind = rng.choice(kinds)
    while len(prog) < target + 2 and tries < 4 * target:
        tries += 1
        if rng.random() >= k.repeat:
            kind = rng.choice(kinds)
            if cfg.prefetch and not g.short and rng.random() < _BURST:
                g.short = rng.randint(2, 6)
        ins, out = getattr(g, kind)()
        g.short = max(0, g.short - 1)
        c = cost(ins)
        if used + c > k.budget:
            continue
        used += c
        prog.append(ins)
        g.prev = out
    prog += tail + [halt()]
    words_out = []
    for pc, ins in enumerate(prog):
        validate(ins.word, ext_words=ext, index=pc, cfg=cfg)     # the program as meant; the junk on top
        words_out.append(_with_junk(rng, ins.word, k.junk, cfg))
    return words_out, image


def random_program(rng, ext: int = 2048, knobs: Knobs | None = None, lat: int = 8,
                   config=None) -> tuple[list[int], list[int]]:
    """One random program (128-bit words, HALT last) and its initial external image of `ext` words.

    Parameters
    ----------
    rng : random.Random or int
        The generator (or a seed for one).
    ext : int
        External memory words of the chip the program is for.
    knobs : Knobs, optional
        None or a Knobs with ``wide=False``: a classic program (every word passes ``hdl.isa.validate``).
        Wide: see `Knobs`; every word passes ``validate`` once its ignored bits (`ignored_bits`) are
        cleared, so a reference machine must run it unchecked (``ReferenceMachine(check=False)``).
    lat : int
        The external read latency the program's cycle budget is counted at (wide programs only).
    config : hdl.config.ChipConfig, optional
        The chip (default the book's). Only ``mm_rq``, ``mm_pack`` and ``mm_overlap`` change the programs:
        with mm_rq they also carry RQCs and MMs with the rq flag (docs/fused-rq.md), and the junk spares
        MM's rq bit; with mm_pack or mm_overlap MM's M and N range over 1..array (else 1..4), and with
        mm_pack half the MMs read B packed (pb = 1, docs/mm-fast.md) and the junk spares the pb bit; with
        mm_pack_c half of those are transposed (tb = pb = 1) and half the fused MMs write C packed (pc = 1,
        docs/mm-pack-c.md), the junk sparing the pc bit.
        ``rq_pipe`` changes only the cycle budget's count (an RQ one cycle more, docs/rq-pipe.md); the
        knob `overlap` already places RQ's dst at src + 2, the placement the piped unit forwards. With
        ``prefetch`` (docs/prefetch.md) a wide program has bursts of 2..6 short instructions chained on
        each other's results (every pair of units issued in each other's done cycles); its budget is still
        counted at 2 + B an instruction (an upper bound there).
    """
    if not isinstance(rng, random.Random):
        rng = random.Random(rng)
    cfg = BOOK if config is None else config
    if knobs is None or not knobs.wide:
        return _classic_program(rng, ext, cfg)
    return _wide_program(rng, ext, lat, knobs, cfg)


# ---- the mix that sim.verify.fuzz runs ------------------------------------------------------------------

# (EXT, LAT) pairs of the default mix. Each pair is one Verilator model (a build of a minute, cached).
MIX_CONFIGS = ((2048, 1), (2048, 2), (2048, 3), (2048, 4), (2048, 8),
               (8192, 1), (8192, 8), (8192, 20), (65536, 1), (65536, 7))
# The subset the test suite's fresh-seed campaign runs: the suite's Verilator tests build the other models
# already, so this adds two builds (the LAT 1 corner at EXT 2048 and at 65536).
CI_CONFIGS = ((2048, 1), (2048, 8), (8192, 8), (8192, 20), (65536, 1))
CLASSIC_SHARE = 0.1


def draw_knobs(rng: random.Random, budget: int = MAX_CYCLES) -> Knobs:
    """The knobs of one program of the mix: a classic program one time in ten; otherwise a wide one with
    each knob independently off, low or high (overlap 0/0.2/0.6, junk 0/0.3/1, maxlen 0/0.05/0.2,
    longlen 0/0.2/0.5, repeat 0/0.3/0.7, chain 0/0.3/0.7)."""
    if rng.random() < CLASSIC_SHARE:
        return Knobs(budget=budget)
    c = rng.choice
    return Knobs(wide=True, overlap=c((0.0, 0.2, 0.6)), junk=c((0.0, 0.3, 1.0)), maxlen=c((0.0, 0.05, 0.2)),
                 longlen=c((0.0, 0.2, 0.5)), repeat=c((0.0, 0.3, 0.7)), chain=c((0.0, 0.3, 0.7)), budget=budget)


@dataclass
class FuzzCase:
    """Program `index` of a fuzz run of `seed`: its chip (EXT, LAT), knobs, program and image."""
    seed: int
    index: int
    ext: int
    lat: int
    knobs: Knobs
    program: list[int]
    image: list[int]
    scratchpad: list[int] | None = None     # the initial scratchpad (resident programs only)


def fuzz_case(seed: int, index: int, configs=MIX_CONFIGS, budget: int = MAX_CYCLES, config=None) -> FuzzCase:
    """Program `index` of the mix of `seed`, generated on its own.

    The (EXT, LAT) pair is drawn from `configs` with a generator of its own, so the program depends only
    on (seed, index, EXT, LAT, budget): pinning the pair it drew (``--ext E --lat L``) regenerates it.
    On a chip `config` with ``gather=1`` a share `RESIDENT_SHARE` of the programs is `resident_program`'s
    (their `FuzzCase` carries the initial scratchpad, and knobs None); the others are the book's mix, as
    on any chip.
    """
    configs = tuple(configs)
    if not configs:
        raise ValueError("no (EXT, LAT) configurations to draw from")
    ext, lat = random.Random(f"ga2-fuzz-config {seed} {index}").choice(configs)
    if config is not None and config.gather and \
            random.Random(f"ga2-fuzz-resident {seed} {index}").random() < RESIDENT_SHARE:
        rng = random.Random(f"ga2-fuzz-resident {seed} {index} {ext} {lat}")
        program, image, spad = resident_program(rng, ext, lat, budget, config)
        return FuzzCase(seed, index, ext, lat, None, _with_stop(seed, index, program, config), image, spad)
    rng = random.Random(f"ga2-fuzz {seed} {index} {ext} {lat}")
    knobs = draw_knobs(rng, budget)
    program, image = random_program(rng, ext, knobs, lat, config)
    return FuzzCase(seed, index, ext, lat, knobs, _with_stop(seed, index, program, config), image)


# Share of the mix whose program has one word the chip stops on (`stop_word`), on a chip other than the
# book's (which hangs there instead).
STOP_SHARE = 0.1


def stop_word(rng: random.Random, cfg) -> int:
    """A word the chip `cfg` stops on when it issues it (``hdl.isa.issue_stop``; a chip other than the book's):
    an opcode it does not have, a zero length or MM dimension, or an MM dimension past the array or the
    operand memories, every other bit random."""
    illegal = [op for op in range(16) if op not in legal_ops(cfg)]
    checked = [op for op in legal_ops(cfg) if issue_limits(op, cfg)]
    while True:
        kind = rng.randrange(3)
        word = rng.getrandbits(124)
        if kind == 0 and illegal:
            word |= rng.choice(illegal) << 124
        elif kind > 0:
            op = rng.choice(checked)
            name, (least, most) = rng.choice(sorted(issue_limits(op, cfg).items()))
            hi, lo = field_bits(op, name, cfg)
            top = (1 << (hi - lo + 1)) - 1
            if kind == 2 and most >= top:
                continue                    # no value of this field is past its range
            value = 0 if kind == 1 else rng.randint(most + 1, top)
            word = (op << 124) | (word & ~(top << lo)) | (value << lo)
        if issue_stop(word, cfg) is not None:
            return word


def _with_stop(seed: int, index: int, program: list[int], config) -> list[int]:
    """`program` with, one time in 1 / `STOP_SHARE` on a chip other than the book's, one word before its
    HALT replaced by a `stop_word` (drawn from a generator of its own: the rest of the program is as
    without it)."""
    if config is None or not config.generated:
        return program
    rng = random.Random(f"ga2-fuzz-stop {seed} {index}")
    if rng.random() >= STOP_SHARE:
        return program
    end = next(pc for pc, w in enumerate(program) if w >> 124 == Op.HALT)
    program = list(program)
    program[rng.randrange(end + 1)] = stop_word(rng, config)
    return program


# ---- resident-mode programs (GATHER/SCATTER, docs/resident.md) ------------------------------------

# Share of the mix that is resident-mode programs on a chip with gather=1 (the rest: the book's mix).
RESIDENT_SHARE = 0.5
# The (EXT, LAT) pair of the resident programs' CI campaign: one Verilator model of a gather=1 chip (a
# build is a minute or more on a loaded machine); `python -m sim.fuzz --chip fast` runs the whole mix.
RESIDENT_CI_CONFIGS = ((2048, 3),)


def resident_program(rng, ext: int = 8192, lat: int = 8, budget: int = MAX_CYCLES, cfg=None):
    """A random program for a chip with ``gather=1``: GATHER and SCATTER over random pools, page and row
    sizes, ranges and block tables, among LDs (some rewriting a table, as the host's mailbox does) and STs.

    The scratchpad starts as random words with the block tables in them (the run's initial scratchpad,
    as a resident session hands it over). One program in three has bad tables: an entry at or past the
    pool's end (sometimes a 32-bit value) or a range whose rows run past the table, so the chip must stop
    with the error state and leave the rest of the program unexecuted. Every word passes
    ``hdl.isa.validate`` for `cfg` once its ignored bits (junk, one program in three) are cleared; the bad
    tables are run-time errors, not invalid instructions.

    Returns
    -------
    (program, image, scratchpad)
        128-bit words (HALT last), `ext` external words and ``cfg.spad_depth`` scratchpad words.
    """
    from dataclasses import replace

    from hdl.config import BOOK
    from hdl.isa import gather, scatter
    cfg = replace(BOOK, gather=1) if cfg is None else cfg
    if not isinstance(rng, random.Random):
        rng = random.Random(rng)
    depth = min(cfg.spad_depth, SPAD_WORDS)
    image = _wide_image(rng, ext)
    spad = _words32(rng, cfg.spad_depth)
    tables = depth - 512                # block tables live in the top 512 words
    bad = rng.choice((0.0, 0.0, 0.15))
    junk = rng.choice((0.0, 0.0, 0.5))
    # Two pools (K and V) of one shape, as the resident decode has them: same pages, two bases.
    pl, rl = rng.randint(0, 3), rng.randint(0, 3)
    if rng.random() < 0.2:
        pl, rl = rng.choice(((0, 0), (4, 0), (0, 5), (2, 4)))
    page_words = 1 << (pl + rl)
    pages = max(1, min(rng.randint(1, 40), (ext // 2) // page_words))
    pool = pages * page_words
    bases = [rng.randint(0, ext - pool) for _ in range(2)]
    cost = lambda ins: 2 + busy_cycles(ins, lat, cfg)                     # noqa: E731
    prog: list[Instr] = []
    used = 2
    target = rng.randint(2, 14)
    for _ in range(4 * target):
        if len(prog) >= target:
            break
        r = rng.random()
        if r < 0.12:                    # the host's mailbox: LD a new table from external memory
            n = rng.randint(1, 32)
            ins = ld(rng.randint(tables, depth - n), rng.randint(0, ext - n), n)
        elif r < 0.2:
            n = rng.randint(1, 64)
            ins = st(rng.randint(0, depth - n), rng.randint(0, ext - n), n)
        else:
            op = Op.GATHER if rng.random() < 0.55 else Op.SCATTER
            lo = rng.randint(0, 40)
            hi = lo + rng.randint(1, max(1, min(24, 256 >> rl)))
            hi = min(hi, 255)
            if hi <= lo:
                continue
            need = ((hi - 1) >> pl) + 1             # table entries the range needs
            table_len = need
            if rng.random() < bad:
                table_len = rng.randint(0, need - 1)            # a row beyond the table
            table_len = max(table_len, rng.choice((table_len, table_len + rng.randint(0, 3))))
            if table_len > 512:
                continue
            table = rng.randint(tables, depth - max(table_len, 1))
            for i in range(table_len):
                if rng.random() < bad:
                    spad[table + i] = rng.choice((pages, pages + rng.randint(0, 5000), rng.getrandbits(32),
                                                  0xFFFFFFFF, 1 << 31))
                else:
                    spad[table + i] = rng.randrange(pages)
            words = (hi - lo) << rl
            if words > tables:
                continue
            if op == Op.GATHER:
                dst = rng.randint(0, tables - words)            # never over the tables
            else:
                dst = rng.randint(0, depth - words)
            make = gather if op == Op.GATHER else scatter
            ins = make(dst, table, table_len, rng.choice(bases), pl, lo, hi, rl, pages)
        c = cost(ins)
        if used + c > budget:
            continue
        used += c
        prog.append(ins)
    prog.append(halt())
    words_out = []
    for pc, ins in enumerate(prog):
        validate(ins.word, ext_words=ext, index=pc, cfg=cfg)
        words_out.append(_with_junk(rng, ins.word, junk))
    return words_out, image, spad


def random_suite(seed: int, count: int, ext: int = 2048, lat: int = 8, progress=None) -> list[ProgramRecord]:
    """`count` random programs from `seed`, each with the reference machine's expected image and counters;
    ``progress(done, count)`` is called after each one when given."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        program, image = random_program(rng, ext)
        out.append(make_record(program, image, lat=lat))
        if progress is not None:
            progress(i + 1, count)
    return out


def directed_suite(lat: int = 8) -> list[ProgramRecord]:
    """The spec's directed programs (R1-R5, R7 on the chip, R11) as records (EXT = 2048)."""
    from sim.verify.programs import directed_suite as _directed
    return _directed(lat=lat)


MAX_COUNT = 100_000         # about 20 minutes of generation and a file of ~1 GB at EXT 2048


def build_parser():
    from sim.cli import Parser, int_range, output_file
    p = Parser("python -m sim.progen",
               "Write a suite of random GA-2 programs (or, with --directed, the spec's directed programs) in the "
               "book's record format, each with the external memory and the five counters the reference "
               "machine expects; sim.replay runs such a file on any simulator.",
               "python -m sim.progen --seed 7 --count 200 --out suite.hex\n"
               "python -m sim.progen --directed --out directed.hex")
    p.add_argument("--seed", type=int, default=1, metavar="S", help="random seed")
    p.add_argument("--count", type=int_range(0, MAX_COUNT), default=100, metavar="N",
                   help=f"random programs, 0..{MAX_COUNT}")
    p.add_argument("--ext", type=int_range(1, 65536), default=2048, metavar="WORDS",
                   help=f"external memory words per image, {1024 + 2 * RESULT_LEN}..65536 (--directed: 2048)")
    p.add_argument("--lat", type=int_range(1, MAX_LAT), default=8, metavar="N",
                   help=f"external read latency the expected counters are computed for, 1..{MAX_LAT}")
    p.add_argument("--directed", action="store_true", help="write the spec's directed programs (EXT 2048)")
    p.add_argument("--out", type=output_file, required=True, metavar="FILE.hex", help="the record file to write")
    return p


def main(argv=None) -> int:
    from sim.cli import Progress, UsageError, write_text
    from sim.formats.hexfile import format_records
    a = build_parser().parse_args(argv)
    if a.directed:
        if a.ext != 2048:
            raise UsageError(f"--directed programs use EXT 2048, not --ext {a.ext}")
        records = directed_suite(a.lat)
    else:
        if not 1024 + 2 * RESULT_LEN <= a.ext <= 65536:
            raise UsageError(f"--ext must be within {1024 + 2 * RESULT_LEN}..65536, got {a.ext}")
        with Progress("generating", unit="program") as bar:
            records = random_suite(a.seed, a.count, a.ext, a.lat, progress=bar)
    write_text(a.out, format_records(records, a.ext), say=False)
    total = sum(r.expected_counters[0] for r in records)
    print(f"wrote {len(records)} programs ({total} cycles in total) to {a.out}")
    return 0


if __name__ == "__main__":
    from sim.cli import guarded
    raise SystemExit(guarded(main))
