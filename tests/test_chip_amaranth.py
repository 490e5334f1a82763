"""The whole chip in Amaranth's simulator: the spec's reference figures and random programs.

Every run is checked twice: against the numbers printed in hardware spec 7 (via sim.verify.programs) and
against the reference machine (sim.backends.reference): memory, scratchpad and all five counters. GA2_SLOW=1 runs
more random programs; `python -m sim.fuzz --sim amaranth` runs as many as you like.
"""
import os
import random

import pytest
from amaranth.sim import Simulator

from hdl import isa
from hdl.chip import SeqState
from hdl.extmem import SHIFT_MAX_LAT, ExtMemory
from hdl.harness import ChipHarness
from sim.verify import programs
from sim.backends.amaranth_backend import AmaranthBackend, BadInput
from sim.backends import MAX_LAT, DidNotHalt, first_difference
from sim.verify.progen import random_program
from sim.backends.reference import ReferenceMachine

SLOW = bool(os.environ.get("GA2_SLOW"))
BACKEND = AmaranthBackend()        # one per test session: its simulators are reused between tests


def check_against_reference(program, image, lat=8):
    got = BACKEND.run(program, image, lat)
    want = ReferenceMachine().run(program, image, lat)
    diff = first_difference(want, got)
    assert diff is None, diff
    return got


def check_directed(d, lat=8):
    got = check_against_reference(d.words, d.image, lat)
    if d.counters is not None:
        assert tuple(got.counters) == tuple(d.counters), f"{d.name}: counters"
    for addr, word in d.expect_ext.items():
        assert got.ext[addr] == word, f"{d.name}: ext[{addr}]"
    if d.others_unchanged:
        changed = {i for i, (a, b) in enumerate(zip(d.image, got.ext)) if a != b}
        assert changed <= set(d.expect_ext), f"{d.name}: unexpected writes at {sorted(changed - set(d.expect_ext))}"


# ---- reference figures (hardware spec 7) ---------------------------------------------------------

@pytest.mark.parametrize("fig", ["r1", "r2", "r3", "r11"])
def test_book_examples(fig):
    d = getattr(programs, fig)()
    check_directed(d)


def test_r1_counters_are_the_books():
    # [85, 28, 30, 13, 6] is printed in the book; restated here so that this test does not depend on
    # the transcription in sim.verify.programs
    got = BACKEND.run(programs.r1().words, programs.r1().image)
    assert got.counters == [85, 28, 30, 13, 6]
    assert got.ext[24:29] == [4, 5, 10, 11, 3]


def test_r4_single_instruction_busy_times():
    for d in programs.r4():
        check_directed(d)


@pytest.mark.parametrize("row", range(18))
def test_r5_directed(row):
    check_directed(programs.r5()[row])


def test_r7_softmax_on_chip():
    for d in programs.r7_chip():
        check_directed(d)


def test_r1_trace_of_the_sequencer():
    """F, I and D cycles of each instruction of R1 (spec 7, R1 trace table), seen on the RTL."""
    d = programs.r1()
    h = ChipHarness(ext_words=len(d.image), lat=8)
    rows = {}

    async def bench(ctx):
        for i, w in enumerate(d.words):
            ctx.set(h.rom.data[i], w)
        for i, w in enumerate(d.image):
            if w:
                ctx.set(h.ext.data[i], w)
        ctx.set(h.start, 1)
        await ctx.tick()
        ctx.set(h.start, 0)
        prev = None                       # (state, pc, cyc_total) of the previous cycle
        for _ in range(200):
            state, pc, cyc = ctx.get(h.chip.state), ctx.get(h.chip.pc), ctx.get(h.cyc_total)
            if state == SeqState.FETCH:
                if prev is not None and prev[0] == SeqState.WAIT:
                    rows[prev[1]].append(prev[2])      # done was seen in the last WAIT cycle
                rows[pc] = [cyc]
            elif state == SeqState.ISSUE:
                rows[pc].append(cyc)
            elif state == SeqState.HALT:
                break
            prev = (state, pc, cyc)
            await ctx.tick()

    sim = Simulator(h)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    for pc, f, i, dn in d.trace:
        assert rows[pc][:2] == [f, i], f"pc {pc}"
        assert rows[pc][2] == dn, f"pc {pc}: done cycle"
    assert rows[6][:2] == [83, 84]          # the HALT


# ---- random programs against the reference ----------------------------------------------------

@pytest.mark.parametrize("ext,lat,seed", [(2048, 8, 11), (2048, 20, 12), (8192, 8, 13), (8192, 20, 14)])
def test_random_programs_match_reference(ext, lat, seed):
    rng = random.Random(seed)
    count = 12 if SLOW else 5
    for k in range(count):
        program, image = random_program(rng, ext)
        got = BACKEND.run(program, image, lat)
        want = ReferenceMachine().run(program, image, lat)
        diff = first_difference(want, got)
        assert diff is None, f"seed {seed} program {k}: {diff}"


# ---- every latency the commands accept (1 .. MAX_LAT) ---------------------------------------------

# The ends of the range and both sides of the old limit of Amaranth's simulator (a shift register of
# 33*(LAT-1) bits failed from 434 on). Where the delay line switches from shift register to circular
# buffer (SHIFT_MAX_LAT) is checked on the memory model alone, below.
EXTREME_LATS = (1, 2, 433, 434, MAX_LAT)


def short_program(rng, ext=2048):
    """A random program cut short: its first two loads, the four instructions after its arena loads, its
    final store and HALT (at LAT 1024 each transfer costs a thousand cycles: a full program takes seconds).
    """
    program, image = random_program(rng, ext)
    loads = next(k for k, w in enumerate(program) if isa.operands(w)["op"] != isa.Op.LD)
    return program[:2] + program[loads:loads + 4] + program[-2:], image


def other_chip_program(rng, cfg, ext=2048, mms=(3, 6)):
    """A random program for chip `cfg` around its MM unit: LD random words (junk above bit 7), MMs of
    random M, N up to the array and K up to 40 with random bases, strides, tb and overlaps of results
    with operands, an RQ of one result, an ST of the result region, HALT."""
    from hdl.isa import halt, ld, mm, rq, st
    image = [rng.getrandbits(32) for _ in range(ext)]
    words = [ld(0, rng.randrange(ext - 1024), 1024).word]
    for _ in range(rng.randint(*mms)):
        M, N = rng.randint(1, cfg.array), rng.randint(1, cfg.array)
        K, tb = rng.choice([1, 3, 4, 5, 8, rng.randint(1, 40)]), rng.randrange(2)
        lda = K + rng.randrange(4)
        ldb = (K if tb else N) + rng.randrange(4)
        ldc = N + rng.randrange(3)
        dst = rng.choice([1024 + rng.randrange(256), rng.randrange(600)])   # sometimes over operands
        words.append(mm(dst, rng.randrange(600), rng.randrange(600), M, K, N,
                        lda=lda, ldb=ldb, ldc=ldc, tb=tb).word)
    words.append(rq(1500, 1024, 64, rng.randrange(1, 1 << 24), rng.randrange(8, 30), rng.randrange(2)).word)
    words += [st(1024, 0, 600).word, st(0, 700, 600).word, halt().word]
    return words, image


def test_other_chip_matches_reference():
    """The Amaranth backend builds the chip it is given: with an 8 x 8 array staging 4 operand elements a
    cycle it equals the reference machine of that configuration (memory, scratchpad, counters)."""
    from hdl.config import ChipConfig
    cfg = ChipConfig(array=8, mm_load=4)
    program, image = other_chip_program(random.Random(88), cfg, mms=(3, 3))
    isa.validate_program(program, len(image), cfg=cfg)
    got = AmaranthBackend(config=cfg).run(program, image, 8)
    diff = first_difference(ReferenceMachine(config=cfg).run(program, image, 8), got)
    assert diff is None, diff


def test_harness_ports_follow_the_configuration():
    """The harness, the chip and its scratchpad take their widths and sizes from the configuration."""
    from amaranth.hdl import Fragment, Shape
    from hdl.config import BOOK, ChipConfig
    h = ChipHarness(config=ChipConfig(spad_depth=1024, counter_bits=48, lat=3))
    Fragment.get(h, None)
    assert h.spad_addr.shape().width == 10 and h.cyc_total.shape().width == 48
    assert h.chip.scratchpad.depth == 1024 and h.ext.depth == BOOK.ext_words and h.extmem.lat == 3
    from hdl.harness import HARNESS_SIGNATURE
    book = HARNESS_SIGNATURE.members
    assert Shape.cast(book["spad_addr"].shape).width == 12 and Shape.cast(book["cyc_mm"].shape).width == 32


@pytest.mark.parametrize("lat", EXTREME_LATS)
def test_every_latency_matches_reference(lat):
    program, image = short_program(random.Random(lat))
    got = check_against_reference(program, image, lat)
    assert len(got.scratchpad) == isa.SPAD_WORDS
    assert got.counters[2] >= 3 * lat          # two loads and the store, each waiting LAT cycles


def test_delay_line_is_chosen_by_latency():
    from amaranth.hdl import Fragment
    for lat, delay in ((SHIFT_MAX_LAT, "shift"), (SHIFT_MAX_LAT + 1, "ring")):
        mem = ExtMemory(16, lat)
        Fragment.get(mem, None)             # elaborated: it builds (and nothing warns of an unused design)
        assert mem.delay == delay


@pytest.mark.parametrize("lat", [2, 3, 6])
def test_ring_answers_as_the_shift_register_does(lat):
    """Both delay lines side by side on one random stream of requests, writes and resets: resp_valid and
    resp_data equal in every cycle (the ring's entries written before a reset must not come out)."""
    from amaranth.hdl import ClockDomain, Module
    depth = 8
    top = Module()
    top.domains.sync = cd = ClockDomain("sync")
    top.submodules.shift = shift = ExtMemory(depth, lat, backdoor=False, delay="shift")
    top.submodules.ring = ring = ExtMemory(depth, lat, backdoor=False, delay="ring")
    rng = random.Random(lat)
    seen = []

    async def bench(ctx):
        for mem in (shift, ring):
            for i in range(depth):
                ctx.set(mem.memory.data[i], 1000 + i)
        for cycle in range(40 * lat):
            req, addr = rng.random() < 0.7, rng.randrange(depth + 2)      # some reads past the end
            wr, waddr, wdata = rng.random() < 0.3, rng.randrange(depth), rng.randrange(1 << 32)
            reset = rng.random() < 0.03
            for mem in (shift, ring):
                ctx.set(mem.req_valid, req)
                ctx.set(mem.req_addr, addr)
                ctx.set(mem.wr_valid, wr)
                ctx.set(mem.wr_addr, waddr)
                ctx.set(mem.wr_data, wdata)
            ctx.set(cd.rst, reset)
            a = (ctx.get(shift.resp_valid), ctx.get(shift.resp_data))
            b = (ctx.get(ring.resp_valid), ctx.get(ring.resp_data))
            seen.append((cycle, a, b))
            await ctx.tick()

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert sum(a[0] for _, a, _ in seen) > 10                 # responses did come
    assert [c for c, a, b in seen if a != b] == []


# ---- programs that never finish, and bad input -------------------------------------------------

@pytest.mark.parametrize("op", [9, 15])
def test_illegal_opcode_hangs(op):
    backend = AmaranthBackend(max_cycles=300)
    program = [isa.ld(0, 0, 1).word, op << 124, 0]
    with pytest.raises(DidNotHalt, match=rf"did not halt within 300 cycles \(pc 1: illegal opcode {op}"):
        backend.run(program, [0] * 2048)


def test_zero_length_hangs():
    backend = AmaranthBackend(max_cycles=200)
    with pytest.raises(DidNotHalt, match="still waiting on ST"):
        backend.run([isa.Instr(isa.Op.ST, a=0, b=0, c=0).word, 0], [0] * 2048)


@pytest.mark.parametrize("program,image,lat,msg", [
    ([1 << 128], [0] * 16, 8, "program word 0"),
    ([0] * 257, [0] * 16, 8, "257 instructions"),
    ([0], [0, 1 << 32], 8, "external word 1"),
    ([0], [0] * 16, 0, "lat = 0"),
    ([0], [0] * 16, 5000, "lat = 5000"),
    ([0], [], 8, "image has 0 words"),
])
def test_bad_input_is_one_line(program, image, lat, msg):
    with pytest.raises(BadInput, match=msg) as e:
        AmaranthBackend().run(program, image, lat)
    assert "\n" not in str(e.value)


# ---- the external memory model and the harness's backdoor ports --------------------------------

@pytest.mark.parametrize("lat,delay", [(1, None), (3, "shift"), (3, "ring"), (2, "ring")])
def test_extmem_latency_poison_and_dropped_writes(lat, delay):
    depth = 16
    mem = ExtMemory(depth, lat, delay=delay)
    seen = {}

    async def bench(ctx):
        for i in range(depth):
            ctx.set(mem.memory.data[i], 100 + i)
        # cycle 0: read 5 while writing 5 (the read must see the old value); cycle 1: read past the end;
        # cycle 2: write past the end (dropped) and read 15
        script = [(5, (5, 7)), (depth, None), (15, (depth + 3, 9))]
        for c in range(len(script) + lat + 2):
            addr, wr = script[c] if c < len(script) else (None, None)
            ctx.set(mem.req_valid, addr is not None)
            ctx.set(mem.req_addr, addr or 0)
            ctx.set(mem.wr_valid, wr is not None)
            if wr:
                ctx.set(mem.wr_addr, wr[0])
                ctx.set(mem.wr_data, wr[1])
            if ctx.get(mem.resp_valid):
                seen[c] = ctx.get(mem.resp_data)
            await ctx.tick()
        seen["mem"] = [ctx.get(mem.memory.data[i]) for i in range(depth)]

    sim = Simulator(mem)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen.pop("mem") == [100 + i if i != 5 else 7 for i in range(depth)]
    assert seen == {lat: 105, lat + 1: 0xDEADBEEF, lat + 2: 115}


def test_harness_backdoor_ports_run_r1():
    """The Verilator protocol on the Amaranth model: ROM and ext loaded and read through the ports."""
    d = programs.r1()
    h = ChipHarness(ext_words=len(d.image), lat=8, backdoor=True)
    out = {}

    async def bench(ctx):
        ctx.set(h.rom_we, 1)
        for i, w in enumerate(d.words):
            ctx.set(h.rom_addr, i)
            ctx.set(h.rom_wdata, w)
            await ctx.tick()
        ctx.set(h.rom_we, 0)
        ctx.set(h.ext_we, 1)
        for i in range(40):
            ctx.set(h.ext_addr, i)
            ctx.set(h.ext_wdata, d.image[i])
            await ctx.tick()
        ctx.set(h.ext_we, 0)
        ctx.set(h.start, 1)
        await ctx.tick()
        ctx.set(h.start, 0)
        await ctx.tick().until(h.halted)
        out["counters"] = [ctx.get(c) for c in (h.cyc_total, h.cyc_mm, h.cyc_dma, h.cyc_vec, h.n_inst)]
        ext = []
        for i in range(40):
            ctx.set(h.ext_addr, i)
            ext.append(ctx.get(h.ext_rdata))
        out["ext"] = ext

    sim = Simulator(h)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert out["counters"] == [85, 28, 30, 13, 6]
    want = list(d.image[:40])
    want[24:29] = [4, 5, 10, 11, 3]
    assert out["ext"] == want


def test_scratchpad_starts_zeroed_on_every_run():
    """A reused simulator must not leak one program's scratchpad into the next (spec 6.2 step 3)."""
    image = [0] * 2048
    image[0] = 0x12345678
    writer = [isa.ld(100, 0, 1).word, 0]
    reader = [isa.st(100, 10, 1).word, 0]       # stores a word it never wrote
    assert BACKEND.run(writer, image).scratchpad[100] == 0x12345678
    got = BACKEND.run(reader, [0] * 2048)
    assert got.ext[10] == 0
    assert got.scratchpad == [0] * isa.SPAD_WORDS


def test_run_many_names_the_job_that_hangs():
    backend = AmaranthBackend(max_cycles=100)
    good = ([isa.ld(0, 0, 2).word, 0], [7] * 2048)
    bad = ([9 << 124, 0], [0] * 2048, 8)
    res = backend.run_many([good, bad], return_errors=True)
    assert res[0].counters == [isa.busy_cycles(isa.ld(0, 0, 2)) + 4, 0, 11, 0, 1]
    assert isinstance(res[1], DidNotHalt)
    with pytest.raises(DidNotHalt, match=r"^job 1: did not halt within 100 cycles"):
        backend.run_many([good, bad])


def test_vcd_is_written_only_when_asked(tmp_path):
    path = tmp_path / "r5_17.vcd"
    d = programs.r5()[17]
    AmaranthBackend(vcd=str(path)).run(d.words, d.image)
    text = path.read_text()
    assert "cyc_total" in text and "$enddefinitions" in text
    BACKEND.run(d.words, d.image)
    assert list(tmp_path.iterdir()) == [path]


def test_start_is_ignored_while_running_and_after_halt():
    """Spec 2.2: start is sampled only in IDLE; HALT stays until rst."""
    d = programs.r5()[0]
    h = ChipHarness(ext_words=len(d.image), lat=8, backdoor=False)
    out = {}

    async def bench(ctx):
        for i, w in enumerate(d.words):
            ctx.set(h.rom.data[i], w)
        for cycle in range(120):
            ctx.set(h.start, cycle in (0, 10, 30, 100))       # 10 and 30 while running, 100 halted
            await ctx.tick()
        out["halted"] = ctx.get(h.halted)
        out["counters"] = [ctx.get(c) for c in (h.cyc_total, h.cyc_mm, h.cyc_dma, h.cyc_vec, h.n_inst)]

    sim = Simulator(h)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert out["halted"] == 1
    assert tuple(out["counters"]) == d.counters == (49, 0, 43, 0, 2)


# ---- the RTL's own per-instruction trace -----------------------------------------------------------------

@pytest.mark.parametrize("chip, count, budget", [("book", 6, 3000), ("fast", 12, 8000)])
def test_rtl_trace_equals_the_reference_trace(chip, count, budget):
    """`AmaranthBackend(trace=True)` wakes at each change of the sequencer's state or pc and rebuilds every
    instruction's fetch, issue and done cycles from them; they equal the reference machine's trace on fuzz
    programs (fixed seed). The fast preset's programs reach overlapped issues, HALTs issued in a done cycle,
    resident programs and error stops."""
    from hdl.config import BOOK, PRESETS
    from sim.verify.progen import fuzz_case
    cfg = BOOK if chip == "book" else PRESETS[chip]
    ext = 2048 if cfg is BOOK else cfg.ext_words
    cases = [fuzz_case(7, i, configs=((ext, 8),), budget=budget, config=None if cfg is BOOK else cfg)
             for i in range(count)]
    from tests.simutil import check_traces_against_reference
    am = AmaranthBackend(trace=True, config=cfg, max_cycles=budget)
    got = [am.run(c.program, c.image, c.lat, c.scratchpad) for c in cases]
    check_traces_against_reference(cases, got, cfg, budget, 100)


def test_a_traced_run_that_hangs_still_stops_at_its_budget():
    backend = AmaranthBackend(max_cycles=300, trace=True)
    program = [isa.ld(0, 0, 1).word, 9 << 124, 0]
    with pytest.raises(DidNotHalt, match=r"did not halt within 300 cycles \(pc 1: illegal opcode 9"):
        backend.run(program, [0] * 2048)
