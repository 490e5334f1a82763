"""The GATHER unit alone (hdl/units/gather.py) against a cycle model written from docs/resident.md.

`expected` writes the doc's timeline out cycle by cycle: two lookup cycles per run (L1 presents the table
address, L2 checks the entry), one request per word right after L2, each response written LAT cycles
after its request to ``spad + k``, ``done`` LAT + 1 cycles after the last request cycle (or after the
failing L2). The testbench plays the scratchpad (registered, read-before-write: hardware spec 2.4) and
the external memory (spec 6.3); it also disturbs the unit as the chip never would (random ``ins`` after
E0, ``start`` pulsed while busy), so a unit that reads ``ins`` late or restarts is seen. Each case is
also run on the reference machine (`sim.backends.reference`), whose final scratchpad, external memory, busy time
and error must be the same.

The helpers here serve tests/test_unit_scatter.py as well.
"""
import random
from dataclasses import replace

import pytest

from hdl import isa
from hdl.config import BOOK
from hdl.isa import Op
from hdl.units.gather import ErrorKind, GatherUnit
from hdl.units.scatter import ScatterUnit
from sim.backends.reference import ReferenceMachine
from tests.simutil import run

MASK = 0xFFFFFFFF
XMASK = 0xFFFF
CFG = replace(BOOK, gather=1)
EXT_WORDS = 1 << 16       # the reference's external memory in the cross-check: every 16-bit address


def ext_word(a):
    """The testbench's external memory: a distinct nonzero word at every 16-bit address."""
    return ((a * 2654435761) ^ 0x5A5A5A5A) & MASK or 1


def base_spad(seed):
    rng = random.Random(seed)
    return [rng.randrange(1, MASK + 1) for _ in range(CFG.spad_depth)]


def expected(op, f, spad, lat, built_lat=None):
    """The doc's timeline for one GATHER/SCATTER with fields `f` (a dict of HW operand names).

    Returns (B, events, error) where events maps a WAIT index to the set of what happens in that cycle:
    ``("req", addr)`` (GATHER request), ``("spad", addr, word)`` (GATHER write), ``("ext", addr, word)``
    (SCATTER write); error is None or (ErrorKind, info). `lat` is the memory's; `built_lat` the one the
    GATHER unit was built for (default `lat`), which times its error tail: ``built_lat + 1`` cycles
    after the failing L2, and not before the last response was written.
    """
    built_lat = lat if built_lat is None else built_lat
    aw = CFG.spad_addr_bits
    events = {}
    t = 1
    k = 0
    error = None
    in_page = (1 << f["page_log2"]) - 1
    last = 0          # the cycle the tail counts from: the last request cycle or the failing L2
    last_req = None   # the last request (GATHER) or read (SCATTER) cycle
    for index, first, rows in isa.resident_runs(f["lo"], f["hi"], f["page_log2"]):
        l2 = t + 1
        if index >= f["table_len"]:
            error, last = (ErrorKind.ROW, index), l2
            break
        page = spad[(f["table"] + index) % (1 << aw)]
        if page >= f["pool_pages"]:
            error, last = (ErrorKind.PAGE, page), l2
            break
        t = l2 + 1
        for r in range(first, first + rows):
            ext0 = f["base"] + (((page << f["page_log2"]) | (r & in_page)) << f["row_log2"])
            for w in range(1 << f["row_log2"]):
                a = (ext0 + w) & XMASK
                s = (f["spad"] + k) % (1 << aw)
                if op == Op.GATHER:
                    events.setdefault(t, set()).add(("req", a))
                    events.setdefault(t + lat, set()).add(("spad", s, ext_word(a)))
                else:
                    events.setdefault(t + 1, set()).add(("ext", a, spad[s]))
                t += 1
                k += 1
        last = last_req = t - 1
    if op != Op.GATHER:
        b = last + 2
    elif error is None and last_req is not None:
        b = last_req + lat + 1          # LD's end: the last response is written
    else:
        # the error tail (or an empty range): built_lat + 1 after the failing L2, after the last response
        b = max(last + built_lat + 1, 0 if last_req is None else last_req + lat + 1)
    return b, events, error


def simulate(op, jobs, lat, seed=0, built_lat=None):
    """Run each (fields, spad) job on one unit from idle; per job (B, events, error, spad, ext writes).

    `events` has the same form as `expected`'s, recorded from the unit's ports; the run goes on for
    LAT + 3 cycles after ``done`` to see that nothing happens then. The memory answers after `lat`
    cycles; the unit is built for `built_lat` (default `lat`).
    """
    cfg = replace(CFG, lat=lat if built_lat is None else built_lat)
    dut = (GatherUnit if op == Op.GATHER else ScatterUnit)(config=cfg)
    rng = random.Random(seed)
    results = []

    async def bench(ctx):
        for fields, init in jobs:
            spad = list(init)
            ext = {}
            word = isa.encode(isa.Instr(op, a=fields["spad"], b=fields["table"], c=fields["table_len"],
                                        d=fields["base"], e=fields["page_log2"], f=fields["lo"],
                                        g=fields["hi"], fl=fields["row_log2"], x=fields["pool_pages"]))
            pipe = [None] * lat                  # pipe[-1]: the response of this cycle
            rdata = 0
            events = {}
            b = None
            ctx.set(dut.ins, word)
            ctx.set(dut.start, 1)
            await ctx.tick()                     # E0
            ctx.set(dut.start, 0)
            ctx.set(dut.ins, rng.getrandbits(128))
            w = 0
            while True:
                w += 1
                assert w < 5000, "no done"
                ctx.set(dut.spad.rdata, rdata)
                resp = pipe[-1]
                if op == Op.GATHER:
                    ctx.set(dut.resp_valid, resp is not None)
                    ctx.set(dut.resp_data, resp or 0)
                done = ctx.get(dut.done)
                if b is None:
                    assert ctx.get(dut.busy) or done, f"idle in W{w} without done"
                    if done:
                        b = w
                        ctx.set(dut.start, 0)        # idle again: a start now would rightly restart
                        err = (ctx.get(dut.error_kind), ctx.get(dut.error_info)) if ctx.get(dut.error) else None
                    else:
                        ctx.set(dut.start, rng.random() < 0.2)   # ignored while busy
                else:
                    ctx.set(dut.start, 0)
                    assert not done, f"a second done in W{w}"
                raddr = ctx.get(dut.spad.raddr)
                got = set()
                if op == Op.GATHER:
                    assert ctx.get(dut.spad.we) == (resp is not None)
                    if ctx.get(dut.req_valid):
                        got.add(("req", ctx.get(dut.req_addr)))
                    new = ext_word(ctx.get(dut.req_addr)) if ctx.get(dut.req_valid) else None
                    pipe = [new] + pipe[:-1]
                    if ctx.get(dut.spad.we):
                        got.add(("spad", ctx.get(dut.spad.waddr), ctx.get(dut.spad.wdata)))
                else:
                    assert not ctx.get(dut.spad.we)
                    if ctx.get(dut.wr_valid):
                        got.add(("ext", ctx.get(dut.wr_addr), ctx.get(dut.wr_data)))
                if got:
                    events[w] = got
                rdata = spad[raddr]               # read before this edge's write
                for e in got:
                    if e[0] == "spad":
                        spad[e[1]] = e[2]
                    elif e[0] == "ext":
                        ext[e[1]] = e[2]
                await ctx.tick()
                if b is not None and w >= b + lat + 3:
                    break
            results.append((b, events, err, spad, ext))

    run(dut, bench)
    return results


def fields(**kw):
    f = dict(spad=1000, table=3000, table_len=8, base=256, page_log2=2, lo=0, hi=4, row_log2=2,
             pool_pages=16)
    f.update(kw)
    return f


def with_table(spad, table, entries):
    spad = list(spad)
    for i, p in enumerate(entries):
        spad[table + i] = p & MASK
    return spad


# (name, fields, table entries): runs over 1..3 pages, partial first and last pages, one-word rows and
# one-row pages, both error kinds in the first and in a later run, the whole 32-bit entry compared,
# address wrap on both sides.
CASES = [
    ("one page, whole", fields(lo=4, hi=8), [9, 3]),
    ("one page, partial both ends", fields(lo=5, hi=7), [9, 3]),
    ("two pages, partial first and last", fields(lo=3, hi=6), [7, 2]),
    ("three pages, partial first and last", fields(lo=2, hi=11), [5, 0, 15]),
    ("three pages, whole", fields(lo=0, hi=12, row_log2=1), [4, 4, 1]),
    ("one-word rows, one-row pages", fields(lo=1, hi=4, page_log2=0, row_log2=0), [11, 6, 2, 13]),
    ("long rows", fields(lo=0, hi=2, page_log2=1, row_log2=5), [1]),
    ("row error in run 3", fields(lo=2, hi=11, table_len=2), [5, 0, 15]),
    ("row error in run 1", fields(lo=4, hi=6, table_len=1), [5, 0]),
    ("page error in run 2 (entry = pool_pages)", fields(lo=3, hi=9, pool_pages=10), [7, 10, 2]),
    ("page error in run 1 (all 32 bits)", fields(lo=0, hi=3, pool_pages=4095), [0xFFFF0001]),
    ("page error, high bits only", fields(lo=0, hi=3), [0x10000002]),
    ("addresses wrap", fields(spad=4090, base=0xFFF0, lo=0, hi=5, row_log2=2), [0, 1]),
]


@pytest.mark.parametrize("lat", [1, 8])
def test_gather_against_doc_and_reference(lat):
    spad0 = base_spad(lat)
    jobs = [(f, with_table(spad0, f["table"], entries)) for _, f, entries in CASES]
    results = simulate(Op.GATHER, jobs, lat, seed=lat)
    for (name, f, entries), (f_, spad), (b, events, err, spad_after, _) in zip(CASES, jobs, results):
        want_b, want_events, want_err = expected(Op.GATHER, f, spad, lat)
        assert (b, err) == (want_b, want_err), name
        assert events == want_events, name
        check_reference(Op.GATHER, f, spad, lat, b, err, spad_after, None, name)


def check_reference(op, f, spad, lat, b, err, spad_after, ext_writes, name):
    """The reference machine runs the same instruction: same busy time (unless `b` is None), error,
    scratchpad and writes."""
    word = isa.Instr(op, a=f["spad"], b=f["table"], c=f["table_len"], d=f["base"], e=f["page_log2"],
                     f=f["lo"], g=f["hi"], fl=f["row_log2"], x=f["pool_pages"])
    image = [ext_word(a) for a in range(EXT_WORDS)]
    ref = ReferenceMachine(config=CFG, check=False).run([word, isa.halt()], image, lat, scratchpad=spad)
    assert b is None or ref.counters[2] == b, name
    kind = {ErrorKind.ROW: "row", ErrorKind.PAGE: "page"}
    assert (None if ref.error is None else (ref.error.kind, ref.error.info)) == \
        (None if err is None else (kind[err[0]], err[1])), name
    assert ref.scratchpad == spad_after, name
    if ext_writes is not None:
        changed = {a: v for a, v in enumerate(ref.ext) if v != image[a]}
        assert changed == {a: v for a, v in ext_writes.items() if a < EXT_WORDS and v != image[a]}, name


def runs_and_words(f, spad):
    """The table lookups made and the words moved by one GATHER/SCATTER, and whether it failed."""
    runs = words = 0
    for index, _, rows in isa.resident_runs(f["lo"], f["hi"], f["page_log2"]):
        runs += 1
        if index >= f["table_len"] or spad[f["table"] + index] >= f["pool_pages"]:
            return runs, words, True
        words += rows << f["row_log2"]
    return runs, words, False


@pytest.mark.parametrize("built_lat, lat", [(2, 7), (1, 8), (8, 3)])
def test_gather_with_a_memory_of_another_latency(built_lat, lat):
    """A unit built for one LAT (config.lat, which times its error tail) behind a memory of another:
    every response still on its way when a later run fails is written before done (a slower memory),
    and the busy time is the doc's with ``hdl.isa.resident_busy_cycles(..., built_lat=)``."""
    spad0 = base_spad(built_lat * 100 + lat)
    jobs = [(f, with_table(spad0, f["table"], entries)) for _, f, entries in CASES]
    results = simulate(Op.GATHER, jobs, lat, seed=lat, built_lat=built_lat)
    late = 0
    for (name, f, entries), (f_, spad), (b, events, err, spad_after, _) in zip(CASES, jobs, results):
        want_b, want_events, want_err = expected(Op.GATHER, f, spad, lat, built_lat)
        assert (b, err) == (want_b, want_err), name
        assert events == want_events, name
        runs, words, failed = runs_and_words(f, spad)
        assert b == isa.resident_busy_cycles(Op.GATHER, runs, words, lat, error=failed, built_lat=built_lat), name
        # a response later than the tail built for config.lat: the case this test is about
        late += failed and words > 0 and lat - 1 > built_lat + 1
        check_reference(Op.GATHER, f, spad, lat, None, err, spad_after, None, name)
    assert late >= (2 if lat - 1 > built_lat + 1 else 0)


def test_gather_empty_range_and_restart():
    """hi <= lo (refused by validate): no lookup, no word, done after the tail; then a normal job."""
    spad0 = base_spad(5)
    empty = fields(lo=6, hi=6)
    good = fields(lo=1, hi=3)
    (b0, ev0, err0, _, _), (b1, ev1, err1, _, _) = simulate(
        Op.GATHER, [(empty, spad0), (good, with_table(spad0, good["table"], [3]))], 3)
    assert (b0, ev0, err0) == (3 + 1, {}, None)
    assert (b1, ev1, err1) == expected(Op.GATHER, good, with_table(spad0, good["table"], [3]), 3)


def test_gather_error_is_cleared_by_next_start():
    spad0 = with_table(base_spad(6), 3000, [99, 1])
    bad, good = fields(lo=0, hi=2, pool_pages=50), fields(lo=0, hi=2, table=3001)
    (_, _, err0, _, _), (_, _, err1, _, _) = simulate(Op.GATHER, [(bad, spad0), (good, spad0)], 2)
    assert err0 == (ErrorKind.PAGE, 99) and err1 is None
