"""GATHER and SCATTER (docs/resident.md) in the ISA and on the reference machine: encoding, the field
limits, the cycle model for runs over 1..3 pages, the error stop and what it leaves behind.

Expected values are worked out by hand from docs/resident.md (addresses, B = 2 * runs + words + LAT + 1
for GATHER, + 2 for SCATTER), never read back from the code under test.
"""
from __future__ import annotations

import random

import pytest

from hdl.config import BOOK, ChipConfig
from hdl.isa import (HW_OPERANDS, IsaError, Op, busy_cycles, decode, describe, encode, gather, halt, ld,
                     operands, scatter, validate)
from sim.backends import BadInput, ErrorStop, RunResult, first_difference
from sim.backends.reference import ReferenceMachine

RES = ChipConfig(gather=1)
EXT = 8192
BASE = 4096             # the pool's page 0
TABLE = 3000            # block table in the scratchpad
DST = 100               # where GATHER writes / SCATTER reads


def _ext():
    # every external word is distinct and tells its address
    return [0x5000_0000 | a for a in range(EXT)]


def _spad(table):
    spad = [0] * RES.spad_depth
    spad[TABLE:TABLE + len(table)] = table
    return spad


# ---- encoding ------------------------------------------------------------------------------------

def test_encode_decode_round_trip_and_operands():
    rng = random.Random(13)
    for op, make in ((Op.GATHER, gather), (Op.SCATTER, scatter)):
        for _ in range(50):
            v = dict(spad=rng.randrange(4096), table=rng.randrange(4096), table_len=rng.randrange(4096),
                     base=rng.randrange(1 << 16), page_log2=rng.randrange(16), lo=rng.randrange(256),
                     hi=rng.randrange(256), row_log2=rng.randrange(16), pool_pages=rng.randrange(4096))
            ins = make(**v)
            assert decode(encode(ins)) == ins
            assert operands(encode(ins)) == {"op": op, **v}
            assert describe(ins).startswith(op.name.lower() + " spad=")
    # the bits of docs/resident.md's table, field by field
    word = encode(gather(spad=1, table=2, table_len=3, base=4, page_log2=5, lo=6, hi=7, row_log2=8,
                         pool_pages=9))
    assert word >> 124 == 9
    for name, lsb, value in (("spad", 108, 1), ("table", 92, 2), ("table_len", 76, 3), ("base", 52, 4),
                             ("page_log2", 46, 5), ("lo", 38, 6), ("hi", 30, 7), ("row_log2", 18, 8),
                             ("pool_pages", 0, 9)):
        assert HW_OPERANDS[Op.GATHER][name][1] == lsb
        assert (word >> lsb) & 0xF == value
    assert HW_OPERANDS[Op.SCATTER] == HW_OPERANDS[Op.GATHER]
    assert encode(scatter(0, 0, 1, 0, 0, 0, 1, 0, 1)) >> 124 == 10


# ---- validation: every field's limit, named ------------------------------------------------------

GOOD = dict(spad=DST, table=TABLE, table_len=4, base=BASE, page_log2=2, lo=0, hi=4, row_log2=4,
            pool_pages=64)

LIMITS = [
    # (override, message)
    (dict(spad=4096), "spad = 4096 is past the scratchpad"),
    (dict(table=4096), "table = 4096 is past the scratchpad"),
    (dict(table_len=4096), "table_len = 4096 does not fit the 12 bits"),
    (dict(base=1 << 16), "base = 65536 does not fit the 16 bits"),
    (dict(page_log2=16), "page_log2 = 16 does not fit the 4 bits"),
    (dict(pool_pages=4096), "pool_pages = 4096 does not fit the 12 bits"),
    (dict(lo=4, hi=4), "hi = 4 must be greater than lo = 4"),
    (dict(lo=5, hi=4), "hi = 4 must be greater than lo = 5"),
    (dict(spad=4000, hi=8), r"spad = 4000 with length 128 runs past the end of the scratchpad"),
    (dict(table=4094, table_len=3), r"table = 4094 with length 3 runs past the end of the scratchpad"),
    (dict(pool_pages=65), r"base = 4096 with length 4160 runs past the end of external memory \(8192"),
    (dict(base=8160, pool_pages=1), r"base = 8160 with length 64 runs past the end of external memory"),
]


@pytest.mark.parametrize("make", [gather, scatter], ids=["gather", "scatter"])
@pytest.mark.parametrize("override,message", LIMITS, ids=[m.split(" ")[0] + str(i) for i, (_, m) in
                                                          enumerate(LIMITS)])
def test_every_field_limit_is_named(make, override, message):
    validate(make(**GOOD), EXT, cfg=RES)                   # the base case is legal
    with pytest.raises(IsaError, match=message):
        validate(make(**{**GOOD, **override}), EXT, index=5, cfg=RES)


def test_resident_opcodes_are_illegal_on_a_chip_without_gather():
    for make, name in ((gather, "GATHER"), (scatter, "SCATTER")):
        with pytest.raises(IsaError, match=rf"instruction 2 \({name}\): opcode {9 if name == 'GATHER' else 10} "
                                           r"exists only on a chip with gather=1.*legal: 0..8"):
            validate(make(**GOOD), index=2, cfg=BOOK)
    with pytest.raises(IsaError, match=r"opcode 11 exists only on a chip with mm_rq=1.*\(legal: 0..10\)"):
        validate(11 << 124, index=0, cfg=RES)
    # the book's reference machine hangs on them as on any illegal opcode (hardware spec 2.2)
    from sim.backends import DidNotHalt
    with pytest.raises(DidNotHalt, match="illegal opcode 9"):
        ReferenceMachine().run([gather(**GOOD), halt()], _ext())


def test_gather_may_not_overwrite_its_own_table():
    with pytest.raises(IsaError, match="overlap the block table"):
        validate(gather(**{**GOOD, "spad": TABLE - 63}), EXT, cfg=RES)
    validate(gather(**{**GOOD, "spad": TABLE - 64}), EXT, cfg=RES)      # ends right before it
    validate(scatter(**{**GOOD, "spad": TABLE - 63}), EXT, cfg=RES)     # SCATTER only reads both


# ---- the cycle model: runs spanning 1..3 pages and partial pages ---------------------------------

# (page_log2, lo, hi, row_log2, runs) -- runs counted by hand: the pages that [lo, hi) touches
RUNS = [
    (2, 0, 4, 4, 1),        # one whole page
    (2, 1, 3, 4, 1),        # inside one page
    (2, 3, 5, 4, 2),        # the last row of page 0, the first of page 1
    (2, 0, 8, 4, 2),        # two whole pages
    (2, 2, 11, 4, 3),       # partial, whole, partial
    (0, 5, 8, 2, 3),        # one row per page
    (3, 1, 17, 0, 3),       # one-word rows: 7 + 8 + 1 rows
]


@pytest.mark.parametrize("page_log2,lo,hi,row_log2,runs", RUNS)
@pytest.mark.parametrize("lat", [1, 8, 20])
def test_busy_cycles(page_log2, lo, hi, row_log2, runs, lat):
    words = (hi - lo) << row_log2
    v = dict(GOOD, page_log2=page_log2, lo=lo, hi=hi, row_log2=row_log2, pool_pages=8, table_len=8)
    assert busy_cycles(gather(**v), lat, RES) == 2 * runs + words + lat + 1
    assert busy_cycles(scatter(**v), lat, RES) == 2 * runs + words + 2
    # the reference machine's counters: 2 + B for the instruction, 2 for the HALT, all of B to dma
    table = [7, 2, 5, 0, 1, 3, 4, 6]
    ref = ReferenceMachine(config=RES)
    for make, tail in ((gather, lat + 1), (scatter, 2)):
        b = 2 * runs + words + tail
        r = ref.run([make(**v), halt()], _ext(), lat, scratchpad=_spad(table))
        assert r.counters == [2 + b + 2, 0, b, 0, 1] and r.error is None


# ---- data movement -------------------------------------------------------------------------------

def _pool_addr(page, row, word, page_log2, row_log2):
    return BASE + (page << (page_log2 + row_log2)) + ((row & ((1 << page_log2) - 1)) << row_log2) + word


def test_gather_moves_the_rows_the_table_names():
    table = [9, 3, 60, 1]
    v = dict(GOOD, lo=2, hi=11, table_len=4)
    r = ReferenceMachine(config=RES).run([gather(**v), halt()], _ext(), 8, scratchpad=_spad(table))
    want = _spad(table)
    for row in range(2, 11):
        for w in range(16):
            want[DST + (row - 2) * 16 + w] = 0x5000_0000 | _pool_addr(table[row >> 2], row, w, 2, 4)
    assert r.scratchpad == want
    assert r.ext == _ext()
    assert want[DST] == 0x5000_0000 | (BASE + 9 * 64 + 2 * 16)       # row 2 = page 9's third row


def test_scatter_writes_only_the_page_slots():
    table = [9, 3, 60]
    spad = _spad(table)
    spad[DST:DST + 5 * 16] = [0xA000 + k for k in range(5 * 16)]
    v = dict(GOOD, lo=3, hi=8, table_len=3)                       # rows 3 (page 9), 4..7 (page 3)
    r = ReferenceMachine(config=RES).run([scatter(**v), halt()], _ext(), 8, scratchpad=spad)
    want = _ext()
    for row in range(3, 8):
        for w in range(16):
            want[_pool_addr(table[row >> 2], row, w, 2, 4)] = 0xA000 + (row - 3) * 16 + w
    assert r.ext == want and r.scratchpad == spad
    assert sum(a != b for a, b in zip(r.ext, _ext())) == 80


# ---- the error stop ------------------------------------------------------------------------------

# (table, lo, hi, kind, info, runs_done) with page_log2 = 2, row_log2 = 4, pool_pages = 64, table_len
# = len(table)
ERRORS = [
    ([64], 0, 4, "page", 64, 0),                  # the first page is outside the pool
    ([5, 0xFFFFFFFF], 1, 8, "page", 0xFFFFFFFF, 1),   # the whole 32-bit entry is compared
    ([5, 6], 2, 12, "row", 2, 2),                  # row 8 needs entry 2 of a 2-entry table
    ([], 0, 1, "row", 0, 0),                       # an empty table
    ([5, 6, 1 << 12], 0, 12, "page", 4096, 2),    # entry 4096 (its low 12 bits would be page 0)
]


@pytest.mark.parametrize("table,lo,hi,kind,info,done", ERRORS)
@pytest.mark.parametrize("make", [gather, scatter], ids=["gather", "scatter"])
def test_error_stop(make, table, lo, hi, kind, info, done):
    lat = 8
    v = dict(GOOD, lo=lo, hi=hi, table_len=len(table))
    spad = _spad(table)
    spad[DST:DST + 256] = [0xB000 + k for k in range(256)]
    # the instruction after the failing one is never executed: the sequencer acts as if it were HALT
    prog = [ld(0, 0, 4), make(**v), ld(4, 0, 4), halt()]
    r = ReferenceMachine(config=RES, trace=True).run(prog, _ext(), lat, scratchpad=spad)
    assert r.error == ErrorStop(kind, 1, info)
    # words moved before the error: the runs done, all of them
    runs_done = [(max(lo, i * 4), min(hi, (i + 1) * 4)) for i in range(done)]
    words_done = sum(b - a for a, b in runs_done) * 16
    b = 2 * (done + 1) + words_done + (lat + 1 if make is gather else 2)
    ld_b = 4 + lat + 1
    assert r.counters == [(2 + ld_b) + (2 + b) + 2, 0, ld_b + b, 0, 2]
    assert [t.pc for t in r.trace] == [0, 1, 2] and r.trace[2].done == r.trace[2].issue
    want_spad, want_ext = list(spad), _ext()
    want_spad[0:4] = want_ext[0:4]
    for a, e in runs_done:
        for row in range(a, e):
            for w in range(16):
                x = _pool_addr(table[row >> 2], row, w, 2, 4)
                if make is gather:
                    want_spad[DST + (row - lo) * 16 + w] = want_ext[x]
                else:
                    want_ext[x] = spad[DST + (row - lo) * 16 + w]
    assert r.scratchpad == want_spad and r.ext == want_ext


def test_error_state_is_compared_after_the_counters():
    a = RunResult(ext=[0], counters=[1, 0, 0, 0, 0], scratchpad=[0])
    b = RunResult(ext=[0], counters=[1, 0, 0, 0, 0], scratchpad=[0], error=ErrorStop("page", 3, 70))
    assert first_difference(a, a) is None
    assert first_difference(a, b) == "error state: expected none, got error stop at pc 3: page outside " \
                                     "the pool, entry 70"
    assert first_difference(b, RunResult(ext=[0], counters=[1, 0, 0, 0, 0], scratchpad=[0],
                                         error=ErrorStop("row", 3, 70))).startswith("error state")
    c = RunResult(ext=[1], counters=[2, 0, 0, 0, 0], scratchpad=[0], error=ErrorStop("page", 3, 70))
    assert first_difference(a, c).startswith("counter cyc_total")


# ---- the initial scratchpad ----------------------------------------------------------------------

def test_initial_scratchpad_is_used_and_checked():
    ref = ReferenceMachine()
    spad = [k * 7 & 0xFFFFFFFF for k in range(4096)]
    r = ref.run([halt()], [0], scratchpad=spad)
    assert r.scratchpad == spad and r.scratchpad is not spad
    assert ref.run([halt()], [0], scratchpad=None).scratchpad == [0] * 4096
    for bad, msg in (([0] * 4095, "has 4095 words; the chip's scratchpad has 4096"),
                     ([0] * 4095 + [1 << 32], "word 4095 = 4294967296 is not an unsigned 32-bit"),
                     ([-1] + [0] * 4095, "word 0 = -1"), (5, "is not a list of words")):
        with pytest.raises(BadInput, match=msg):
            ref.run([halt()], [0], scratchpad=bad)
    # a batch job may carry one: (program, image, lat, scratchpad)
    out = ref.run_many([([halt()], [0], 8, spad), ([halt()], [0])])
    assert out[0].scratchpad == spad and out[1].scratchpad == [0] * 4096
