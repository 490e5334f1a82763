"""spad_lanes (docs/spad-lanes.md): the banked scratchpad's write lanes and the MM drain that writes up to
`spad_lanes` results a cycle. The configuration, the cycle formula against the schedule's constraints
counted here, the banks in pysim (every alignment, read-before-write), the overlapped MM unit against the
reference machine on a table of shapes (words and busy cycles), its write cycles, and a program on the
Amaranth chip."""
import random
from dataclasses import replace

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from hdl import isa
from hdl.config import BOOK, ChipConfig, ChipSpecError, parse_chip
from hdl.isa import RQ_PIPE_CYCLES, Op
from hdl.scratchpad import Scratchpad, SpadPort
from sim.backends.reference import ReferenceMachine
from chipbench import FAST_PRE_LANES, fast_with

LANES4 = fast_with(spad_lanes=4)
LANES2 = fast_with(spad_lanes=2)
PACK_C4 = fast_with(mm_pack_c=1, spad_lanes=4)
PACK_C2 = fast_with(mm_pack_c=1, spad_lanes=2)
# the book's 4x4 array, overlapped, no requantizer; and a 2x2 array with more lanes than columns
SMALL4 = replace(BOOK, mm_overlap=1, spad_lanes=4)
TINY = replace(BOOK, array=2, mm_load=2, mm_overlap=1, mm_pack=1, spad_lanes=4)


# ---- configuration -------------------------------------------------------------------------------

def test_book_keeps_one_lane():
    assert BOOK.spad_lanes == 1 and FAST_PRE_LANES.spad_lanes == 1
    assert LANES4.spad_lanes == 4 and LANES4.generated


@pytest.mark.parametrize("value", [0, 3, 8, -1])
def test_bad_value_names_it(value):
    with pytest.raises(ValueError, match=f"spad_lanes must be 1, 2 or 4, not {value}"):
        ChipConfig(mm_overlap=1, spad_lanes=value)
    with pytest.raises(ChipSpecError, match=f"spad_lanes must be 1, 2 or 4, not {value}"):
        parse_chip(f"fast,vec_lanes=1,spad_lanes={value}")


def test_needs_mm_overlap():
    with pytest.raises(ChipSpecError, match="spad_lanes = 2 needs mm_overlap=1.*not mm_overlap=0"):
        parse_chip("array=8,mm_load=4,spad_lanes=2")
    assert parse_chip("mm_overlap=1,spad_lanes=2").spad_lanes == 2


def test_port_signature():
    assert SpadPort.of(LANES4) == SpadPort(12, 32) and "we_x" not in SpadPort.of(LANES4).members
    port = SpadPort.of(LANES4, reads=8, lanes=4)
    assert port.members["we_x"].shape == 3 and port.lanes == 4 and port != SpadPort.of(LANES4, reads=8)
    with pytest.raises(ValueError, match="lanes must be 1, 2 or 4, not 3"):
        SpadPort(12, 32, lanes=3)


# ---- the cycle formula ---------------------------------------------------------------------------

def _busy_by_schedule(M, K, N, cfg, pb=0, rq=0):
    """B of the overlapped MM counted from its constraints (docs/spad-lanes.md), not from the formula:
    group (m, g) of G = ceil(N/l) a row goes out in cycle X0 + m*G + g; PE(m, n) is final from S + K + m
    + n on (S + K + m on a broadcast array, docs/mm-bcast.md), every operand is read by K*C - 1 (the
    first write may be in that cycle: read-before-write); X0 is the least cycle meeting both for every
    group, done one cycle after the last write."""
    lanes, L = cfg.spad_lanes, cfg.mm_load
    c_b = isa.mm_b_groups(N, cfg, pb)
    c = max(-(-M // L), c_b)
    # the array's first cycle; a broadcast array waits for B's last group of the first k (docs/mm-bcast.md)
    s = (K - 1) * (c - 1) + 2 + (c_b - 1 if cfg.mm_bcast else 0)
    groups = -(-N // lanes)
    x0 = K * c - 1
    for m in range(M):
        for g in range(groups):
            last_n = 0 if cfg.mm_bcast else min(g * lanes + lanes, N) - 1
            x0 = max(x0, s + K + m + last_n - (m * groups + g))
    return x0 + M * groups + 1 + RQ_PIPE_CYCLES * rq * cfg.rq_pipe


@pytest.mark.parametrize("cfg", [LANES4, LANES2, FAST_PRE_LANES, SMALL4, TINY,
                                 fast_with(rq_pipe=0, spad_lanes=4)],
                         ids=["lanes4", "lanes2", "fast", "small4", "tiny", "lanes4_nopipe"])
def test_formula_is_the_schedule(cfg):
    check_formula_is_the_schedule(cfg)


def check_formula_is_the_schedule(cfg):
    """hdl.isa.mm_busy_cycles == `_busy_by_schedule` for every M, N, several K, pb and rq on `cfg`."""
    for M in range(1, cfg.array + 1):
        for N in range(1, cfg.array + 1):
            for K in (1, 2, 3, 7, 16, cfg.row_depth):
                for pb in range(1 + cfg.mm_pack):
                    for rq in range(1 + cfg.mm_rq):
                        assert isa.mm_busy_cycles(M, K, N, cfg, pb=pb, rq=rq) == \
                            _busy_by_schedule(M, K, N, cfg, pb, rq), (M, K, N, pb, rq)


def test_formula_examples():
    """The serving shapes of docs/spad-lanes.md: M = 4, K = 16, N = 8 with a packed B and rq."""
    fast = FAST_PRE_LANES
    got = [isa.mm_busy_cycles(4, 16, 8, c, pb=1, rq=1) for c in (fast, LANES2, LANES4)]
    assert got == [52, 40, 34]
    # M = 1: the array's skew, not the drain, bounds it
    assert {isa.mm_busy_cycles(1, 16, 8, c, pb=1, rq=1) for c in (fast, LANES2, LANES4)} == {28}
    # pc does not change it
    assert isa.mm_busy_cycles(4, 16, 8, PACK_C4, pb=1, rq=1, pc=1) == isa.mm_busy_cycles(4, 16, 8, PACK_C4, pb=1, rq=1)


def test_reference_takes_the_formula():
    """Same words on a lanes chip as on one lane, the MM counter smaller by the formula's difference."""
    fast = FAST_PRE_LANES
    rng = random.Random(4)
    spad = [rng.getrandbits(32) for _ in range(fast.spad_depth)]
    prog = [isa.rqc(1 << 23, 20, 0), isa.mm(3000, 0, 1000, 4, 16, 8, ldb=2, pb=1, rq=1),
            isa.mm(3100, 0, 1000, 8, 9, 7, rq=1), isa.halt()]
    runs = {c: ReferenceMachine(config=c).run(prog, [0] * 16, scratchpad=spad) for c in (fast, LANES4)}
    assert runs[fast].scratchpad == runs[LANES4].scratchpad
    assert runs[fast].counters[1] - runs[LANES4].counters[1] == \
        sum(isa.busy_cycles(w, 8, fast) - isa.busy_cycles(w, 8, LANES4) for w in prog) > 0


# ---- the banked scratchpad in pysim --------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("lanes", [2, 4])
def test_banks_every_alignment_read_before_write(lanes):
    """Random lane writes at every alignment (wrapping at the top too) with two read ports reading
    every cycle, often the words being written: each read gives the word before that edge's writes."""
    depth = 64
    dut = Scratchpad(depth=depth, width=32, reads=2, lanes=lanes)
    rng = random.Random(lanes)
    mirror = [rng.getrandbits(32) for _ in range(depth)]
    seen = {"aligned": set(), "checked": 0}

    async def bench(ctx):
        p = dut.port
        for a, w in enumerate(mirror):
            ctx.set(dut.row(a), w)
        pending = None
        for cycle in range(400):
            base = rng.choice([depth - 1, depth - 2, depth - 3, rng.randrange(depth)])
            enables = [rng.random() < 0.7 for _ in range(lanes)]
            words = [rng.getrandbits(32) for _ in range(lanes)]
            reads = [rng.choice([(base + rng.randrange(lanes)) % depth, rng.randrange(depth)]) for _ in range(2)]
            ctx.set(p.we, enables[0])
            ctx.set(p.waddr, base)
            ctx.set(p.wdata, words[0])
            for i in range(1, lanes):
                ctx.set(p.we_x[i - 1], enables[i])
                ctx.set(p.wdata_x[i - 1], words[i])
            ctx.set(p.raddr, reads[0])
            ctx.set(p.raddr_x[0], reads[1])
            if pending is not None:
                assert [ctx.get(p.rdata), ctx.get(p.rdata_x[0])] == pending, cycle
                seen["checked"] += 1
            pending = [mirror[a] for a in reads]         # before this edge's writes
            await ctx.tick()
            for i in range(lanes):
                if enables[i]:
                    mirror[(base + i) % depth] = words[i]
            seen["aligned"].add(base % lanes)
        assert [ctx.get(dut.row(a)) for a in range(depth)] == mirror

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen["aligned"] == set(range(lanes)) and seen["checked"] == 399


def test_backdoor_reads_and_writes_every_bank():
    """The harness's backdoor on a banked scratchpad: a combinational read of any word, a write to one."""
    from amaranth.hdl import Signal
    dut = Scratchpad(depth=32, width=32, reads=1, lanes=4)
    addr, rdata, we, wdata = Signal(5), Signal(32), Signal(), Signal(32)
    top = Module()
    top.submodules.dut = dut
    dut.backdoor(top, addr, rdata, we, wdata)

    async def bench(ctx):
        for a in range(32):
            ctx.set(dut.row(a), 1000 + a)
        for a in range(32):
            ctx.set(addr, a)
            assert ctx.get(rdata) == 1000 + a
        ctx.set(addr, 13)
        ctx.set(wdata, 77)
        ctx.set(we, 1)
        await ctx.tick()
        ctx.set(we, 0)
        assert [ctx.get(dut.row(a)) for a in range(32)] == [77 if a == 13 else 1000 + a for a in range(32)]

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


# ---- the MM unit with drain lanes ----------------------------------------------------------------

def _cases(rng, cfg, count):
    """Corner shapes then random ones: bases anywhere (C wrapping past the top), strides dense or not,
    C over A or B; packed B and packed C where the chip has them, rq where it has the requantizer."""
    n, d = cfg.array, cfg.row_depth
    shapes = [(n, 9, n), (1, 1, 1), (n, 4, n - 1 or 1), (3 % n or 1, min(d, 64), min(5, n)), (n, 1, n),
              (1, 16, n)]
    shapes += [(rng.randint(1, n), rng.choice([1, 2, 3, 5, rng.randint(1, 20)]), rng.randint(1, n))
               for _ in range(count - len(shapes))]
    cases = []
    for i, (M, K, N) in enumerate(shapes[:count]):
        pc = i % 2 if cfg.mm_pack_c else 0
        pb = (i // 2) % 2 if cfg.mm_pack else 0
        rq = 1 if cfg.mm_rq and (pc or rng.random() < 0.7) else 0

        def stride(dense):
            return dense if rng.random() < 0.6 else rng.randrange(40)
        lda, ldb, ldc = stride(K), stride(-(-N // 4) if pb else N), stride(-(-N // 4) if pc else N)
        A, B, dst = (rng.randrange(cfg.spad_depth - 3000) for _ in range(3))
        pick = rng.random()
        if pick < 0.2:
            dst = A
        elif pick < 0.4:
            dst = B
        elif pick < 0.6:
            # C's last word the scratchpad's last: the lanes' banks at the top rows
            dst = cfg.spad_depth - ((M - 1) * ldc + (-(-N // 4) if pc else N))
        ins = isa.mm(dst, A, B, M, K, N, lda=lda, ldb=ldb, ldc=ldc, pb=pb, rq=rq, pc=pc)
        rqr = (rng.randint(1 << 22, (1 << 24) - 1), rng.randint(12, 24), rng.randint(0, 1))
        cases.append((rqr, ins))
    return cases


def _run_unit(cfg, cases, seed, record=False):
    """Each (rqc, MM) on the unit of chip `cfg` from a random scratchpad: after each MM the whole
    scratchpad must be the reference machine's. Returns [(B, writes)], writes [(W, waddr, lane enables)]
    when `record`."""
    from hdl.units.mm import MatrixUnit
    from tests.unitbench import SPAD_DEPTH, simulate
    assert SPAD_DEPTH == cfg.spad_depth
    rng = random.Random(seed)
    background = [rng.getrandbits(32) for _ in range(SPAD_DEPTH)]

    async def bench_fn(ctx, bench):
        unit = bench.unit
        p = unit.spad
        bench.fill(ctx, background)
        mirror = list(background)
        out = []
        for rqr, ins in cases:
            prog = [ins, isa.halt()]
            if cfg.mm_rq:
                ctx.set(unit.ins, isa.rqc(*rqr).word)
                ctx.set(unit.rqc, 1)
                await ctx.tick()
                ctx.set(unit.rqc, 0)
                prog = [isa.rqc(*rqr)] + prog
            mirror = ReferenceMachine(config=cfg, check=False).run(prog, [0] * 16, scratchpad=mirror).scratchpad
            ctx.set(unit.ins, ins.word)
            ctx.set(unit.start, 1)
            await ctx.tick()
            ctx.set(unit.start, 0)
            ctx.set(unit.ins, rng.getrandbits(128))      # junk after E0: the unit latched its operands
            writes = []
            for n in range(1, 2000):
                lanes = [ctx.get(p.we)] + [ctx.get(p.we_x[i]) for i in range(cfg.spad_lanes - 1)]
                if any(lanes):
                    writes.append((n, ctx.get(p.waddr), lanes))
                done = ctx.get(unit.done)
                await ctx.tick()
                if done:
                    break
            else:
                raise AssertionError(f"no done for {isa.describe(ins)}")
            bench.check_against(ctx, mirror, ins.word)
            out.append((n, writes if record else None))
            await bench.idle(ctx, 1)
        return out
    return simulate(MatrixUnit(config=cfg), bench_fn)


UNIT_CHIPS = [LANES4, LANES2, PACK_C4, PACK_C2, SMALL4, TINY]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cfg", UNIT_CHIPS, ids=["lanes4", "lanes2", "pack_c4", "pack_c2", "small4", "tiny"])
def test_unit_equals_reference_and_cycle_model(cfg):
    """The overlapped unit with drain lanes in pysim (the simulation-only checks on: exact_completion,
    write_region with every lane, rq_range, pc_range): the scratchpad is the reference machine's after
    each MM, and B is hdl.isa.busy_cycles."""
    rng = random.Random(cfg.key())
    cases = _cases(rng, cfg, 14)
    for _, ins in cases:
        isa.validate(ins, cfg=cfg)
    got = [b for b, _ in _run_unit(cfg, cases, seed=7)]
    assert got == [isa.busy_cycles(ins, 8, cfg) for _, ins in cases]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cfg", [LANES4, PACK_C2, PACK_C4], ids=["lanes4", "pack_c2", "pack_c4"])
def test_unit_write_cycles(cfg):
    """docs/spad-lanes.md's drain, stated outright: group (m, g) goes out in W(X0 + 1 + m*G + g + rq_pipe*rq)
    at dst + m*ldc + g*l with lanes n < N on; with pc one word, lane 0 only, in the cycle of the word's
    last group, at dst + m*ldc + n // 4. Nothing else is written; done the cycle after the last write."""
    check_write_cycles(cfg)


def check_write_cycles(cfg):
    """`test_unit_write_cycles` on the chip `cfg`: X0 = (K-1)*C + max(3 + N - G, C - 1), or with a broadcast
    array max(3, C - 1) (docs/mm-bcast.md)."""
    lanes, L = cfg.spad_lanes, cfg.mm_load
    cases = [((1 << 23, 16, 0), isa.mm(4000, 100, 2000, 4, 16, 8, ldb=2, ldc=9, pb=1, rq=1)),
             ((1 << 23, 16, 1), isa.mm(4093, 4090, 7, 3, 6, 7, lda=11, ldc=7, rq=1)),
             ((3 << 22, 18, 0), isa.mm(10, 10, 3000, 5, 5, 5, ldb=5, ldc=6, rq=0))]
    if cfg.mm_pack_c:
        cases = [(rqr, isa.mm(**{**_fields(ins), "pc": 1, "rq": 1, "ldc": 3})) for rqr, ins in cases]
    for (rqr, ins), (b, writes) in zip(cases, _run_unit(cfg, cases, seed=3, record=True)):
        o = isa.operands(ins)
        M, K, N, pc = o["M"], o["K"], o["N"], o["pc"]
        C = max(-(-M // L), isa.mm_b_groups(N, cfg, o["pb"], o["tb"]))
        G = -(-N // lanes)
        c_b = isa.mm_b_groups(N, cfg, o["pb"], o["tb"])
        x0 = (K - 1) * C + max(3 + (c_b - 1 if cfg.mm_bcast else N - G), C - 1)
        late = cfg.rq_pipe * o["rq"]
        want = []
        for m in range(M):
            for g in range(G):
                n = g * lanes
                w = x0 + 1 + m * G + g + late
                if not pc:
                    want.append((w, (o["dst"] + m * o["ldc"] + n) % cfg.spad_depth,
                                 [int(n + i < N) for i in range(lanes)]))
                elif (n + lanes) % 4 == 0 or n + lanes >= N:
                    want.append((w, (o["dst"] + m * o["ldc"] + n // 4) % cfg.spad_depth, [1] + [0] * (lanes - 1)))
        assert writes == want, isa.describe(ins)
        assert b == want[-1][0] + 1 == isa.busy_cycles(ins, 8, cfg)


def _fields(ins):
    o = isa.operands(ins)
    return {k: o[k] for k in ("dst", "A", "B", "M", "K", "N", "lda", "ldb", "ldc", "tb", "pb", "rq")}


# ---- the chip ------------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_program_on_the_amaranth_chip_equals_the_reference():
    """MMs of several shapes (lane writes at every alignment, C over its operands) between the other
    writing units (RQ, VADD, AMAX, LD: lane 0 only, through PortOwner) on fast,spad_lanes=4."""
    from chipbench import amaranth_chip_equals_reference
    cfg = LANES4
    prog = [isa.ld(0, 0, 1024), isa.ld(1024, 1024, 600), isa.rqc(11_534_336, 34, 0),
            isa.mm(3001, 0, 1024, 8, 16, 8, ldb=2, pb=1, rq=1),
            isa.mm(3102, 5, 1030, 3, 7, 7, lda=11, ldb=9, ldc=5),
            isa.vadd(3103, 3001, 3010, 20),
            isa.mm(3203, 0, 1024, 4, 9, 6, rq=1, ldc=11, ldb=6),
            isa.rq(3300, 3203, 30, 11_534_336, 34, 0),
            isa.mm(1030, 1024, 1030, 8, 20, 8, pb=1, ldb=3, rq=1),      # over its own B operand
            isa.amax(3400, 1030, 40),
            isa.mm(1040, 1040, 1060, 5, 3, 3, lda=2, ldb=1),             # over its own A operand
            isa.st(3000, 1500, 500), isa.st(1024, 1000, 400), isa.halt()]
    words = [isa.encode(i) for i in prog]
    amaranth_chip_equals_reference(cfg, words, 5, 1, (Op.MM, Op.RQC))
