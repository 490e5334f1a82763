# amaranth: UnusedElaboratable=no
"""vec_lanes (docs/vec-lanes.md): RQ and VADD reading and writing `vec_lanes` consecutive words a cycle
through the banked scratchpad. The configuration, the cycle formulas against the group schedule counted
here, the reference machine's group rule, the banks' read lanes in pysim (every alignment, across the top,
read-before-write), and each unit in pysim against the reference machine on a table of placements (aligned,
unaligned, overlapping at every small distance, wrapping), with busy == hdl.isa.busy_cycles."""
import random
from dataclasses import replace

import pytest
from amaranth.sim import Simulator

from hdl import isa
from hdl.isa import Op
from hdl.config import BOOK, PRESETS, ChipConfig, ChipSpecError, parse_chip
from hdl.scratchpad import Scratchpad, SpadPort
from hdl.units.rq import RequantUnit
from hdl.units.vadd import VaddUnit
from sim.backends.reference import ReferenceMachine
from tests.unitbench import SPAD_DEPTH, simulate
from chipbench import FAST_PRE_LANES, fast_with

VEC4 = fast_with(mm_pack_c=1, spad_lanes=4, vec_lanes=4)
VEC2 = fast_with(spad_lanes=2, vec_lanes=2)
# two lanes on four banks, and the combinational requantizer (the book's RQ timing, two lanes)
VEC2_ON4 = fast_with(spad_lanes=4, vec_lanes=2)
VEC4_NOPIPE = fast_with(rq_pipe=0, spad_lanes=4, vec_lanes=4)
CHIPS = [VEC4, VEC2, VEC2_ON4, VEC4_NOPIPE]
IDS = ["vec4", "vec2", "vec2_on4", "vec4_nopipe"]


# ---- configuration -------------------------------------------------------------------------------

def test_book_keeps_one_lane():
    assert BOOK.vec_lanes == 1 and FAST_PRE_LANES.vec_lanes == 1
    assert VEC4.vec_lanes == 4 and VEC4.generated


@pytest.mark.parametrize("value", [0, 3, 8, -1])
def test_bad_value_names_it(value):
    with pytest.raises(ChipSpecError) as e:
        parse_chip(f"fast,spad_lanes=4,vec_lanes={value}")
    assert str(e.value) == f"--chip 'fast,spad_lanes=4,vec_lanes={value}': ChipConfig vec_lanes must be 1, 2 or 4, not {value}"


def test_needs_the_banks_and_two_ports():
    with pytest.raises(ChipSpecError) as e:
        parse_chip("fast,spad_lanes=2,vec_lanes=4")
    assert str(e.value).endswith("ChipConfig vec_lanes = 4 needs spad_lanes >= 4 (the banks carry the lanes), "
                                 "not spad_lanes=2")
    with pytest.raises(ValueError, match="vec_lanes = 2 needs vadd_ports=2.*not vadd_ports=1"):
        ChipConfig(mm_overlap=1, spad_lanes=2, vec_lanes=2)
    assert "\n" not in str(e.value)


def test_port_signature():
    port = SpadPort.of(VEC4, reads=2, lanes=4, read_lanes=4)
    assert port.lane_reads == 2 and port.members["rdata_l"].shape.length == 2
    assert "rdata_l" not in SpadPort.of(VEC4).members and SpadPort.of(VEC4) == SpadPort(12, 32)
    assert RequantUnit(config=VEC4).spad.signature == SpadPort.of(VEC4, lanes=4, read_lanes=4)
    with pytest.raises(ValueError, match="read_lanes 4 is above its 2 banks"):
        Scratchpad(depth=64, lanes=2, read_lanes=4)


# ---- the cycle formulas --------------------------------------------------------------------------

def _busy_by_schedule(n, l, lag):
    """B counted from the group schedule (docs/vec-lanes.md): group g's address goes out in W(g+1), it is
    written at the end of W(g + lag); done is high in the cycle after the last group's write."""
    last_write = max(g + lag for g in range(-(-n // l)))
    return last_write + 1


@pytest.mark.parametrize("cfg", CHIPS + [PRESETS["fast"]], ids=IDS + ["fast"])
def test_formulas_are_the_schedule(cfg):
    l = cfg.vec_lanes
    for n in list(range(1, 40)) + [4095]:          # RQ's len field is 12 bits
        assert isa.rq_busy_cycles(n, cfg) == _busy_by_schedule(n, l, 2 + cfg.rq_pipe)
        assert isa.vadd_busy_cycles(n, cfg) == _busy_by_schedule(n, l, 2)
        assert isa.busy_cycles(isa.rq(0, 0, n, 1 << 23, 20), 8, cfg) == isa.rq_busy_cycles(n, cfg)
        assert isa.busy_cycles(isa.vadd(0, 0, 0, n), 8, cfg) == isa.vadd_busy_cycles(n, cfg)
    assert isa.vector_lanes(cfg) == l


def test_formula_examples():
    """The served vectors of 32 and 48 words (docs/vec-lanes.md)."""
    fast, vec4 = FAST_PRE_LANES, fast_with(spad_lanes=4, vec_lanes=4)
    assert [isa.rq_busy_cycles(n, c) for n in (32, 48) for c in (fast, vec4)] == [35, 11, 51, 15]
    assert [isa.vadd_busy_cycles(n, c) for n in (32, 48) for c in (fast, vec4)] == [34, 10, 50, 14]


# ---- the reference machine -----------------------------------------------------------------------

def _apart_program(rng, cfg):
    """RQs and VADDs whose destinations lie outside their sources (no group rule can matter)."""
    prog = []
    for _ in range(10):
        n = rng.choice([1, 2, 3, 5, rng.randint(6, 90)])
        dst = rng.randrange(2000, 3900)
        if rng.random() < 0.5:
            prog.append(isa.rq(dst, rng.randrange(0, 1900), n, rng.randrange(1, 1 << 24), rng.randrange(8, 40),
                               rng.randrange(2)))
        else:
            prog.append(isa.vadd(dst, rng.randrange(0, 1900), rng.randrange(0, 1900), n))
    return prog + [isa.halt()]


@pytest.mark.parametrize("cfg", CHIPS, ids=IDS)
def test_reference_apart_operands_give_the_one_lane_words(cfg):
    """With disjoint operands the lanes change only the cycles: the words are the one-lane chip's, and the
    vector counter drops by the formulas' difference."""
    one = replace(cfg, vec_lanes=1)
    rng = random.Random(cfg.key())
    spad = [rng.getrandbits(32) for _ in range(cfg.spad_depth)]
    prog = _apart_program(rng, cfg)
    runs = [ReferenceMachine(config=c).run(prog, [0] * 16, scratchpad=spad) for c in (one, cfg)]
    assert runs[0].scratchpad == runs[1].scratchpad
    assert runs[0].counters[3] - runs[1].counters[3] == \
        sum(isa.busy_cycles(w, 8, one) - isa.busy_cycles(w, 8, cfg) for w in prog) > 0


def test_reference_group_rule():
    """dst = src + d on four lanes: element k's read sees element f's write (f = k - d, the word it
    reads) only when f's group is at least `lag` groups before k's. An RQ with m = 2^23, s = 23 is the
    identity on int8 words, so the result shows which words each read saw; the expectation is counted
    element by element here, not group by group as the reference machine does."""
    words = list(range(1, 41)) + [0] * (4096 - 40)
    n, l = 24, 4
    for cfg, lag in ((VEC4_NOPIPE, 2), (VEC4, 3)):
        for d in (1, 5, 6, 9, 13):
            got = ReferenceMachine(config=cfg).run([isa.rq(d, 0, n, 1 << 23, 23), isa.halt()], [0] * 16,
                                                   scratchpad=words).scratchpad
            out = []
            for k in range(n):
                f = k - d
                out.append(out[f] if f >= 0 and f // l <= k // l - lag else words[k])
            want = list(words)
            want[d:d + n] = out
            assert got[:64] == want[:64], (cfg.spec(), d)


# ---- the banks' read lanes in pysim --------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("banks, lanes", [(2, 2), (4, 4), (4, 2)])
def test_read_lanes_every_alignment(banks, lanes):
    """Two read ports with lanes reading l words at random addresses (every alignment, across the top)
    while lanes write: each lane gives the word at address + i before that edge's writes."""
    depth = 64
    dut = Scratchpad(depth=depth, width=32, reads=3, lanes=banks, read_lanes=lanes, lane_reads=2)
    p = dut.port
    rng = random.Random(banks * 10 + lanes)

    async def bench(ctx):
        mirror = [rng.getrandbits(32) for _ in range(depth)]
        for a, w in enumerate(mirror):
            ctx.set(dut.row(a), w)
        expect = None
        for _ in range(300):
            ras = [rng.randrange(depth) for _ in range(3)]
            ctx.set(p.raddr, ras[0])
            ctx.set(p.raddr_x[0], ras[1])
            ctx.set(p.raddr_x[1], ras[2])
            wa = rng.choice([ras[0], ras[1], rng.randrange(depth)])
            wes = [rng.randrange(2) for _ in range(banks)]
            wds = [rng.getrandbits(32) for _ in range(banks)]
            ctx.set(p.we, wes[0])
            ctx.set(p.waddr, wa)
            ctx.set(p.wdata, wds[0])
            for i in range(1, banks):
                ctx.set(p.we_x[i - 1], wes[i])
                ctx.set(p.wdata_x[i - 1], wds[i])
            now = [[mirror[(ras[r] + i) % depth] for i in range(lanes)] for r in range(2)] + [[mirror[ras[2]]]]
            await ctx.tick()
            got = [[ctx.get(p.rdata)] + [ctx.get(p.rdata_l[0][i]) for i in range(lanes - 1)],
                   [ctx.get(p.rdata_x[0])] + [ctx.get(p.rdata_l[1][i]) for i in range(lanes - 1)],
                   [ctx.get(p.rdata_x[1])]]
            assert got == now
            for i in range(banks):
                if wes[i]:
                    mirror[(wa + i) % depth] = wds[i]
        assert expect is None

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


# ---- the units against the reference machine -----------------------------------------------------

def _cases(rng, cfg):
    """RQ and VADD words of every placement: aligned and unaligned, lengths around the lanes, the
    destination at every small distance after (and before) a source, in place, wrapping at the top."""
    l, top = cfg.vec_lanes, cfg.spad_depth
    rqs, vadds = [], []
    for n in (1, 2, 3, 4, 5, 7, 9, 16, 33):
        src = rng.randrange(100, 3000) + rng.randrange(4)
        for gap in (0, 1, 2, 3, 4, 5, 7, 9, 12, -1, -3, 500):
            rqs.append(isa.rq((src + gap) % top, src, n, rng.randrange(1, 1 << 24), rng.randrange(0, 40),
                              rng.randrange(2)))
            s2 = rng.randrange(100, 3000)
            vadds.append(isa.vadd((src + gap) % top, src, s2, n))
            vadds.append(isa.vadd((s2 + gap) % top, src, s2, n))
    for n in (5, 11):
        rqs.append(isa.rq(top - 2, top - 3, n, 1 << 23, 16, 1))
        vadds.append(isa.vadd(top - 3, top - 1, top - 6, n))
    rng.shuffle(rqs)
    rng.shuffle(vadds)
    return rqs[:36 + 4 * l], vadds[:36 + 4 * l]


def _run_unit(unit_cls, cfg, cases, seed):
    """Each word of `cases` on the unit in pysim (simulation-only checks on), the whole scratchpad checked
    against the reference machine after each; returns the busy cycles."""
    assert SPAD_DEPTH == cfg.spad_depth
    rng = random.Random(seed)
    background = [rng.getrandbits(32) for _ in range(SPAD_DEPTH)]
    # small words too, so the requantizer's and the adder's interesting range is hit
    for a in rng.sample(range(SPAD_DEPTH), 2000):
        background[a] = rng.randrange(-300, 300) & 0xFFFFFFFF

    async def bench_fn(ctx, bench):
        bench.fill(ctx, background)
        mirror = list(background)
        out = []
        for ins in cases:
            mirror = ReferenceMachine(config=cfg, check=False).run([ins, isa.halt()], [0] * 16,
                                                                    scratchpad=mirror).scratchpad
            b, _ = await bench.issue(ctx, isa.encode(ins), stray=(1, 2))
            bench.check_against(ctx, mirror, isa.encode(ins))
            out.append(b)
            await bench.idle(ctx, 1)
        return out
    return simulate(unit_cls(config=cfg), bench_fn)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("cfg", CHIPS, ids=IDS)
@pytest.mark.parametrize("unit", ["rq", "vadd"])
def test_unit_equals_reference_and_cycle_model(cfg, unit):
    rng = random.Random(cfg.key() + unit)
    rqs, vadds = _cases(rng, cfg)
    cases, cls = (rqs, RequantUnit) if unit == "rq" else (vadds, VaddUnit)
    got = _run_unit(cls, cfg, cases, seed=5)
    assert got == [isa.busy_cycles(ins, 8, cfg) for ins in cases]


# ---- the chip ------------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_program_on_the_amaranth_chip_equals_the_reference():
    """RQs and VADDs of four lanes (unaligned, overlapping their sources, near each other) between MMs
    (whose drain shares the write lanes) and the one-lane units, through PortOwner, on
    fast,mm_pack_c=1,spad_lanes=4,vec_lanes=4: the Amaranth chip gives the reference machine's words and
    counters."""
    from chipbench import amaranth_chip_equals_reference
    cfg = VEC4
    prog = [isa.ld(0, 0, 300), isa.rqc(11_534_336, 34, 0),
            isa.rq(401, 1, 37, 11_534_336, 30, 0),
            isa.vadd(502, 401, 203, 29),
            isa.mm(600, 0, 100, 4, 16, 8, ldb=2, pb=1, rq=1),
            isa.vadd(607, 600, 603, 13),                     # dst = src1 + 7 = src2 + 4
            isa.rq(403, 401, 22, 1 << 23, 21, 1),           # dst = src + 2
            isa.amax(700, 502, 29),
            isa.vadd(801, 801, 502, 9),                     # in place
            isa.st(0, 400, 500), isa.halt()]
    words = [isa.encode(i) for i in prog]
    amaranth_chip_equals_reference(cfg, words, 6, 3, (Op.RQ, Op.VADD, Op.AMAX))
