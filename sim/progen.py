"""Seeded random GA-2 programs for fuzzing the backends against the reference (hardware spec 6.5).

Each program loads four operand arenas with LDs, runs 10-25 random MM/RQ/SM/VADD/AMAX/LD/ST/UNPACK
instructions whose operands are legal and never partially overlap (in-place RQ/SM/VADD allowed), then
stores the result area and halts. Same seed, same programs; every program stays far below 100,000 cycles.

Command: ``python -m sim.progen --seed S --count N [--ext 2048] [--lat 8] --out FILE.hex``
(``--directed`` writes the spec's directed programs instead).
"""
from __future__ import annotations

import argparse
import random
import sys

from hdl.isa import Instr, amax, halt, ld, mm, rq, sm, st, unpack, validate, vadd

from sim.hexfile import HexFileError, ProgramRecord, make_record, write_records

__all__ = ["random_program", "random_suite", "directed_suite", "LAYOUT"]

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


class _Gen:
    """State of one program being generated."""

    def __init__(self, rng: random.Random, ext: int):
        self.rng = rng
        self.ext = ext
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
        M, N = rng.randint(1, 4), rng.randint(1, 4)
        K = rng.choice([1, 64, rng.randint(2, 63)])
        tb = rng.randint(0, 1)
        lda = rng.choice([K, K, rng.randint(0, K + 8)])
        ldb = rng.choice([K if tb else N, rng.randint(0, 70)])
        ldc = rng.choice([N, N, rng.randint(N, 12), rng.randint(0, N)])
        span_a = (M - 1) * lda + K
        span_b = (N - 1) * ldb + K if tb else (K - 1) * ldb + N
        span_c = (M - 1) * ldc + N
        if span_a > 4 * ARENA or span_b > 4 * ARENA or span_c > RESULT_LEN:
            lda, ldb, ldc = K, (K if tb else N), N
            span_a, span_b, span_c = (M - 1) * K + K, ((N - 1) * K + K if tb else (K - 1) * N + N), (M - 1) * N + N
        A = self.anywhere(span_a) if span_a <= RESULT_LEN else rng.randint(0, 4 * ARENA - span_a)
        B = self.anywhere(span_b) if span_b <= RESULT_LEN else rng.randint(0, 4 * ARENA - span_b)
        dst = rng.randint(RESULT_BASE, RESULT_BASE + RESULT_LEN - span_c)   # MM may overlap freely
        return mm(dst, A, B, M=M, K=K, N=N, lda=lda, ldb=ldb, ldc=ldc, tb=tb)

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


def random_program(rng, ext: int = 2048) -> tuple[list[int], list[int]]:
    """One random program (128-bit words, HALT last) and its initial external image of `ext` words.

    `rng` is a `random.Random` (or an int seed). Every instruction passes ``hdl.isa.validate``.
    """
    if not isinstance(rng, random.Random):
        rng = random.Random(rng)
    g = _Gen(rng, ext)
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
        ins = getattr(g, rng.choice(_KINDS))()
        if ins is None:
            continue
        prog.append(ins)
        body += 1
    prog.append(st(RESULT_BASE, g.final_dst, RESULT_LEN))
    prog.append(halt())
    words = [i.word for i in prog]
    for pc, w in enumerate(words):
        validate(w, ext_words=ext, index=pc)
    return words, image


def random_suite(seed: int, count: int, ext: int = 2048, lat: int = 8) -> list[ProgramRecord]:
    """`count` random programs from `seed`, each with the reference machine's expected image and counters."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        program, image = random_program(rng, ext)
        out.append(make_record(program, image, lat=lat))
    return out


def directed_suite(lat: int = 8) -> list[ProgramRecord]:
    """The spec's directed programs (R1-R5, R7 on the chip, R11) as records (EXT = 2048)."""
    from sim.programs import directed_suite as _directed
    return _directed(lat=lat)


class _Parser(argparse.ArgumentParser):
    def error(self, message):           # one line, no usage dump
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv=None) -> int:
    p = _Parser(prog="python -m sim.progen", description="Write a suite of random (or directed) GA-2 programs.")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--ext", type=int, default=2048)
    p.add_argument("--lat", type=int, default=8)
    p.add_argument("--directed", action="store_true", help="write the spec's directed programs (EXT 2048)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        if a.count < 0:
            raise ValueError(f"--count {a.count} must be >= 0")
        if a.lat < 1:
            raise ValueError(f"--lat {a.lat} must be >= 1")
        if a.directed:
            if a.ext != 2048:
                raise ValueError(f"--directed programs use EXT 2048, not --ext {a.ext}")
            records = directed_suite(a.lat)
        else:
            if not 1024 + 2 * RESULT_LEN <= a.ext <= 65536:
                raise ValueError(f"--ext {a.ext} must be within {1024 + 2 * RESULT_LEN}..65536")
            records = random_suite(a.seed, a.count, a.ext, a.lat)
        write_records(a.out, records, ext=a.ext)
    except (ValueError, HexFileError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    total = sum(r.expected_counters[0] for r in records)
    print(f"wrote {len(records)} programs ({total} cycles in total) to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
