"""The directed programs of hardware spec section 7 as data: program, initial image, expected figures.

Every expected number here is transcribed from the spec (R1-R5, R7 on the chip, R11), never computed
by a simulator, so a backend is checked against the book rather than against itself. Images are EXT
words long (2048, the book's suites); data the spec leaves open (R4, R5) is a fixed formula.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hdl.isa import amax, halt, ld, mm, rq, sm, st, unpack, vadd

__all__ = ["Directed", "EXT", "r1", "r2", "r3", "r4", "r5", "r7_chip", "r11", "all_directed",
           "directed_suite", "R1_CODE", "R2_EXTRA_CODE", "R11_UNPACK_CODE"]

EXT = 2048
_W = 0xFFFFFFFF


@dataclass(frozen=True)
class Directed:
    """One directed program and what the spec says it must produce.

    Attributes
    ----------
    name : str
        Figure and row, e.g. ``"R5.12"``.
    program : tuple of Instr
        Ends with HALT.
    image : tuple of int
        Initial external memory, EXT unsigned words.
    counters : tuple of int or None
        ``[cyc_total, cyc_mm, cyc_dma, cyc_vec, n_inst]`` when the spec gives them.
    expect_ext : dict
        External address -> expected unsigned word after the run.
    others_unchanged : bool
        The spec says every other external word keeps its initial value.
    busy : dict
        pc -> expected busy cycles B of that instruction (from the spec).
    trace : tuple
        ``(pc, F, I, D)`` rows of the spec's trace table.
    """
    name: str
    program: tuple
    image: tuple
    counters: tuple | None = None
    expect_ext: dict = field(default_factory=dict)
    others_unchanged: bool = False
    busy: dict = field(default_factory=dict)
    trace: tuple = ()

    @property
    def words(self) -> list[int]:
        return [i.word for i in self.program]


def _image(ext: int = EXT, at: dict | None = None, fill=None) -> tuple:
    """EXT words: `fill(i)` (or 0) everywhere, then the runs in `at` ({start: [values]})."""
    img = [(fill(i) if fill else 0) & _W for i in range(ext)]
    for start, values in (at or {}).items():
        for k, v in enumerate(values):
            img[start + k] = v & _W
    return tuple(img)


def _words(start: int, values) -> dict:
    return {start + k: v & _W for k, v in enumerate(values)}


# ---- R1 / R2: Chapter 7 running example A ----------------------------------------------------------

_R1_BODY = [
    ld(0, 0, 12),
    mm(100, 0, 6, M=2, K=3, N=2, lda=3, ldb=2, ldc=2),
    rq(110, 100, 4, m=8388608, s=23, relu=1),
    amax(120, 110, 4),
]
_R1_STORES = [st(110, 24, 4), st(120, 28, 1)]
_R1_DATA = {0: [1, 2, 3, 4, 5, 6, 1, 0, 0, 1, 1, 1]}

R1_CODE = (  # the spec's machine code for R1, one 128-bit word per instruction
    "100000000000c0000000000000000000",
    "300640000000600200300080c0800002",
    "4006e006400048000005c00000040000",
    "70078006e00040000000000000000000",
    "2006e001800040000000000000000000",
    "20078001c00010000000000000000000",
    "00000000000000000000000000000000",
)
R2_EXTRA_CODE = "20064001400040000000000000000000"


def r1() -> Directed:
    return Directed(
        "R1", tuple(_R1_BODY + _R1_STORES + [halt()]), _image(at=_R1_DATA),
        counters=(85, 28, 30, 13, 6),
        expect_ext=_words(24, [4, 5, 10, 11, 3]), others_unchanged=True,
        trace=((0, 0, 1, 22), (1, 23, 24, 52), (2, 53, 54, 60), (3, 61, 62, 69), (4, 70, 71, 77),
               (5, 78, 79, 82)),
        busy={0: 21, 1: 28, 2: 6, 3: 7, 4: 6, 5: 3})


def r2() -> Directed:
    expect = _words(20, [4, 5, 10, 11])
    expect.update(_words(24, [4, 5, 10, 11, 3]))
    return Directed("R2", tuple(_R1_BODY + [st(100, 20, 4)] + _R1_STORES + [halt()]),
                    _image(at=_R1_DATA), counters=(93, 28, 36, 13, 7),
                    expect_ext=expect, others_unchanged=True)


# ---- R3: Chapter 7 running example B (a hand-written MLP) ------------------------------------------

R3_X = [[127, 99, 14, -28], [-71, 14, 113, 85], [42, -28, 56, 0], [85, 113, 71, 56]]
R3_W1 = [[127, -127, 127, 0], [127, -127, -127, 0], [-127, 127, 0, 127], [-127, 127, 0, -127]]
R3_W2 = [[127, 0], [0, 127], [64, -64], [-64, 64]]
# intermediate scratchpad contents the spec lists (derived figures)
R3_HIDDEN = [120, 0, 14, 21, 0, 127, 0, 14, 0, 21, 35, 28, 35, 0, 0, 7]
R3_ACC2 = [14792, 448, -896, 17025, 448, 2219, 3997, 448]
R3_SCORES = [110, 3, -7, 127, 3, 17, 30, 3]


def r3() -> Directed:
    flat = lambda rows: [v for row in rows for v in row]   # noqa: E731 - row-major, as stored
    prog = (
        ld(0, 0, 40),
        mm(100, 0, 16, M=4, K=4, N=4, lda=4, ldb=4, ldc=4),
        rq(120, 100, 16, m=8454660, s=31, relu=1),
        mm(140, 120, 32, M=4, K=4, N=2, lda=4, ldb=2, ldc=2),
        rq(150, 140, 8, m=16019356, s=31, relu=0),
        amax(160, 150, 2), amax(161, 152, 2), amax(162, 154, 2), amax(163, 156, 2),
        st(160, 64, 4),
        halt(),
    )
    image = _image(at={0: flat(R3_X), 16: flat(R3_W1), 32: flat(R3_W2)})
    return Directed("R3", prog, image, counters=(237, 112, 55, 48, 10),
                    expect_ext=_words(64, [0, 1, 1, 0]), others_unchanged=True)


# ---- R4: single instructions, each followed by HALT (cyc_total = B + 4) ----------------------------

def _r45_fill(i: int) -> int:
    """Data for the programs whose figures do not depend on it: int8 below 512, wider words above."""
    if i < 512:
        return ((i * 73 + 41) % 255) - 127
    return ((i * 2654435761) & 0xFFFFF) - (1 << 19)


# (label, instruction, B, counter class: 1 mm, 2 dma, 3 vec) -- B from the spec's R4 table
_R4_ROWS = [
    ("LD len 1", ld(0, 0, 1), 10, 2), ("LD len 10", ld(0, 0, 10), 19, 2),
    ("LD len 50", ld(0, 0, 50), 59, 2),
    ("ST len 1", st(0, 1024, 1), 3, 2), ("ST len 10", st(0, 1024, 10), 12, 2),
    ("RQ len 1", rq(2048, 0, 1, 1 << 23, 23), 3, 3), ("RQ len 10", rq(2048, 0, 10, 1 << 23, 23), 12, 3),
    ("SM len 1", sm(2048, 0, 1), 50, 3), ("SM len 10", sm(2048, 0, 10), 77, 3),
    ("SM len 30", sm(2048, 0, 30), 137, 3),
    ("VADD len 1", vadd(2048, 0, 64, 1), 4, 3), ("VADD len 10", vadd(2048, 0, 64, 10), 22, 3),
    ("AMAX len 1", amax(2048, 0, 1), 4, 3), ("AMAX len 10", amax(2048, 0, 10), 13, 3),
    ("MM M1K1N1", mm(2048, 0, 512, 1, 1, 1), 11, 1),
    ("MM M1K4N4", mm(2048, 0, 512, 1, 4, 4), 38, 1),
    ("MM M4K8N4", mm(2048, 0, 512, 4, 8, 4), 101, 1),
    ("MM M2K5N3 tb=1", mm(2048, 0, 512, 2, 5, 3, lda=5, ldb=5, ldc=3, tb=1), 46, 1),
    ("UNPACK len 1", unpack(2048, 0, 1), 11, 3), ("UNPACK len 16", unpack(2048, 0, 16), 161, 3),
]


def r4() -> list[Directed]:
    image = _image(fill=_r45_fill)
    out = []
    for label, ins, b, cls in _R4_ROWS:
        counters = [b + 4, 0, 0, 0, 1]
        counters[cls] = b
        out.append(Directed(f"R4 {label}", (ins, halt()), image, counters=tuple(counters), busy={0: b}))
    return out


# ---- R5: the 18 directed programs ------------------------------------------------------------------

def _r5_programs() -> list[tuple]:
    D, S = 2048, 1024      # result area in the scratchpad, ST destination in external memory
    return [
        (ld(0, 0, 16), st(0, S, 16)),
        (ld(0, 0, 1), st(0, S, 1)),
        (ld(0, 0, 64), mm(D, 0, 16, 1, 1, 1), st(D, S, 1)),
        (ld(0, 0, 256), mm(D, 0, 128, M=4, K=64, N=4, lda=64, ldb=4, ldc=4), st(D, S, 16)),
        (ld(0, 0, 256), mm(D, 0, 128, M=3, K=7, N=2, lda=7, ldb=7, ldc=2, tb=1), st(D, S, 6)),
        (ld(0, 512, 32), rq(D, 0, 32, m=(1 << 23) + 12345, s=30, relu=0), st(D, S, 32)),
        (ld(0, 512, 32), rq(D, 0, 32, m=(1 << 24) - 1, s=24, relu=1), st(D, S, 32)),
        (ld(0, 0, 16), sm(D, 0, 16), st(D, S, 16)),
        (ld(0, 0, 1), sm(D, 0, 1), st(D, S, 1)),
        (ld(0, 0, 64), ld(64, 0, 64), vadd(D, 0, 64, 64), st(D, S, 64)),
        (ld(0, 512, 40), amax(D, 0, 40), st(D, S, 1)),
        (ld(0, 0, 1500), st(0, 548, 1500)),
        (ld(0, 0, 1000), ld(1000, 0, 1000), vadd(D, 0, 1000, 1000), st(D, S, 1000)),
        (ld(0, 512, 500), rq(D, 0, 500, m=(1 << 23) + 777, s=29, relu=0), st(D, S, 500)),
        (ld(0, 0, 600), sm(D, 0, 600), st(D, S, 600)),
        (ld(0, 0, 400), ld(400, 0, 400), amax(D, 0, 800), st(D, S, 1)),
        (ld(0, 0, 8), amax(D, 0, 8), st(D, S, 1)),
        (),
    ]


R5_COUNTERS = [
    (49, 0, 43, 0, 2), (19, 0, 13, 0, 2), (95, 11, 76, 0, 3), (896, 605, 283, 0, 3),
    (339, 58, 273, 0, 3), (117, 0, 75, 34, 3), (117, 0, 75, 34, 3), (146, 0, 43, 95, 3),
    (71, 0, 13, 50, 3), (352, 0, 212, 130, 4), (103, 0, 52, 43, 3), (3017, 0, 3011, 0, 2),
    (5032, 0, 3020, 2002, 4), (1521, 0, 1011, 502, 3), (3066, 0, 1211, 1847, 3),
    (1634, 0, 821, 803, 4), (39, 0, 20, 11, 3), (2, 0, 0, 0, 0),
]


def r5() -> list[Directed]:
    image = _image(fill=_r45_fill)
    return [Directed(f"R5.{i}", tuple(body) + (halt(),), image, counters=c)
            for i, (body, c) in enumerate(zip(_r5_programs(), R5_COUNTERS))]


# ---- R7 on the chip: LD / SM / ST ------------------------------------------------------------------

def r7_chip() -> list[Directed]:
    scores = [32, 16, 0, -16]
    four = Directed("R7 chip [32,16,0,-16]", (ld(0, 0, 4), sm(100, 0, 4), st(100, 16, 4), halt()),
                    _image(at={0: scores}), expect_ext=_words(16, [42200, 15524, 5711, 2101]),
                    others_unchanged=True, busy={1: 59})
    eight = Directed("R7 chip eight equal", (ld(0, 0, 8), sm(100, 0, 8), st(100, 16, 8), halt()),
                     _image(at={0: [5] * 8}), expect_ext=_words(16, [8192] * 8),
                     others_unchanged=True, busy={1: 71})
    return [four, eight]


# ---- R11: UNPACK, Chapter 13 example A --------------------------------------------------------------

R11_UNPACK_CODE = "80008000000010000000000000000000"


def r11() -> Directed:
    prog = (
        ld(0, 0, 1),
        unpack(8, 0, 1),
        ld(100, 16, 8),
        mm(200, 100, 8, M=1, K=8, N=1, lda=8, ldb=1, ldc=1),
        st(8, 32, 8),
        st(200, 48, 1),
        halt(),
    )
    image = _image(at={0: [0x3F2970E5], 16: [3, -2, 5, 1, -4, 2, 6, -1]})
    expect = _words(32, [5, -2, 0, 7, -7, 2, -1, 3])
    expect[48] = 49
    return Directed("R11", prog, image, counters=(97, 32, 40, 11, 6), expect_ext=expect,
                    others_unchanged=True)


def all_directed() -> list[Directed]:
    """R1, R2, R3, R4 (20 rows), R5 (18 rows), R7 on the chip (2), R11: 44 programs."""
    return [r1(), r2(), r3(), *r4(), *r5(), *r7_chip(), r11()]


def directed_suite(lat: int = 8):
    """The directed programs as program records (expected image and counters from the reference)."""
    from sim.formats.hexfile import make_record     # here, not at the top: hexfile imports the reference
    return [make_record(list(d.program), list(d.image), lat=lat) for d in all_directed()]
