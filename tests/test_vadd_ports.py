"""vadd_ports (docs/vadd-ports.md): VADD reading src1[i] and src2[i] in one cycle through two scratchpad
read ports. The configuration, the cycle model and the reference machine here; the unit itself below.

The contract: on a chip with ``vadd_ports = 2`` a VADD of n elements is busy n + 2 cycles (2n + 2 with
one port, the book's), and what it writes is the same as with one port for every operand placement,
partial overlaps included (the unit forwards its last sum when dst = src2 + 1, docs/vadd-ports.md).
"""
import random
from dataclasses import replace

import pytest
from amaranth.sim import Simulator

from hdl import isa
from hdl.config import BOOK, ChipConfig, ChipSpecError, parse_chip
from hdl.isa import Op
from hdl.units.vadd import VaddUnit
from sim.backends.reference import ReferenceMachine

FAST2 = parse_chip("array=8,mm_load=4,gather=1,ext_words=16384,vadd_ports=2")
BOOK2 = replace(BOOK, vadd_ports=2)


# ---- configuration -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, 3, 4, -1])
def test_bad_vadd_ports_names_the_value(value):
    with pytest.raises(ValueError) as e:
        ChipConfig(vadd_ports=value)
    assert str(e.value) == f"ChipConfig vadd_ports must be 1 or 2, not {value}"
    with pytest.raises(ChipSpecError) as e:
        parse_chip(f"array=8,mm_load=4,gather=1,ext_words=16384,vadd_ports={value}")
    assert str(e.value) == (f"--chip 'array=8,mm_load=4,gather=1,ext_words=16384,vadd_ports={value}': ChipConfig vadd_ports must be 1 or 2, "
                            f"not {value}")


def test_vadd_ports_in_the_spec_and_the_read_ports():
    assert BOOK.vadd_ports == 1 and BOOK.spad_reads == 1
    assert FAST2.spec() == "array=8,mm_load=4,ext_words=16384,gather=1,vadd_ports=2"
    assert parse_chip(FAST2.spec()) == FAST2
    assert BOOK2.spec() == "vadd_ports=2" and parse_chip("vadd_ports=2") == BOOK2
    # the scratchpad's read ports: MM's mm_load, or VADD's two when mm_load is 1
    assert [parse_chip(s).spad_reads for s in ("book", "vadd_ports=2", "mm_load=2", "mm_load=2,vadd_ports=2",
                                               "mm_load=4,vadd_ports=2", "array=8,mm_load=4,gather=1,ext_words=16384")] == [1, 2, 2, 2, 4, 4]


# ---- the cycle model -----------------------------------------------------------------------------

@pytest.mark.parametrize("cfg, n, busy", [
    (BOOK, 1, 4), (BOOK, 7, 16), (BOOK, 4096, 8194),
    (BOOK2, 1, 3), (BOOK2, 7, 9), (BOOK2, 4096, 4098),
    (FAST2, 1, 3), (FAST2, 64, 66),
    (parse_chip("array=8,mm_load=4,gather=1,ext_words=16384"), 64, 130),
])
def test_vadd_busy_cycles(cfg, n, busy):
    ins = isa.vadd(0, 0, 0, n)
    assert isa.vadd_busy_cycles(n, cfg) == busy
    assert isa.busy_cycles(ins, 8, cfg) == busy
    assert isa.busy_cycles(isa.encode(ins), 3, cfg) == busy          # LAT does not enter


def test_only_vadd_changes_with_vadd_ports():
    others = [isa.ld(0, 0, 9), isa.st(0, 0, 9), isa.rq(0, 0, 9, 1 << 23, 24), isa.sm(0, 0, 9),
              isa.amax(0, 0, 9), isa.unpack(0, 0, 9), isa.mm(0, 0, 100, 4, 9, 4), isa.halt()]
    for cfg in (BOOK, parse_chip("array=8,mm_load=4,gather=1,ext_words=16384")):
        for ins in others:
            assert isa.busy_cycles(ins, 8, replace(cfg, vadd_ports=2)) == isa.busy_cycles(ins, 8, cfg)


# ---- the reference machine -----------------------------------------------------------------------

def _vadd_program(rng, spad_depth=4096):
    """A few LDs of random words, VADDs of every placement (disjoint, in place, dst = src +- 1), STs of
    everything they wrote, HALT. Returns (program, image, [VADD lengths])."""
    ext = [rng.getrandbits(32) for _ in range(2048)]
    prog = [isa.ld(0, 0, 1024), isa.ld(1024, 1024, 1024)]
    lens = []
    for k in range(12):
        n = rng.choice([1, 2, 3, rng.randint(4, 200)])
        s1, s2 = rng.randrange(0, 1800 - n), rng.randrange(0, 1800 - n)
        dst = rng.choice([s1, s2, s1 + 1, s2 + 1, s2 - 1, s1 - 1, rng.randrange(0, 1800 - n)])
        dst = min(max(dst, 0), 1800 - n)
        prog.append(isa.vadd(dst, s1, s2, n))
        lens.append(n)
    prog += [isa.st(0, 0, 1800), isa.halt()]
    return [isa.encode(i) for i in prog], ext, lens


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reference_same_words_and_n_fewer_cycles_per_vadd(seed):
    prog, image, lens = _vadd_program(random.Random(seed))
    for one in (BOOK, parse_chip("array=8,mm_load=4,gather=1,ext_words=16384")):
        two = replace(one, vadd_ports=2)
        a = ReferenceMachine(config=one).run(prog, image, 8)
        b = ReferenceMachine(config=two).run(prog, image, 8)
        assert b.ext == a.ext and b.scratchpad == a.scratchpad
        saved = sum(lens)
        assert b.counters == [a.counters[0] - saved, a.counters[1], a.counters[2], a.counters[3] - saved,
                              a.counters[4]]


# ---- the unit, table-driven over its read ports --------------------------------------------------

SPAD = 4096
_EXTREMES = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFFFF80, 0xFFFFFF81, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


def _s8(w):
    return ((w & 0xFF) ^ 0x80) - 0x80


def one_port_model(spad, dst, s1, s2, n):
    """What the book's VADD writes (a new scratchpad dict), from its schedule (hardware spec 4.4) on the
    read-before-write scratchpad: element k is written at the end of W(2k+3), src1[k] is read at the end
    of W(2k+1) and src2[k] at the end of W(2k+2), so src1[k] sees the writes of elements <= k-2 and
    src2[k] those of elements <= k-1."""
    mem = dict(spad)
    out = []
    for k in range(n):
        if k >= 2:
            mem[(dst + k - 2) % SPAD] = out[k - 2]
        a = _s8(mem.get((s1 + k) % SPAD, 0))
        b_addr = (s2 + k) % SPAD
        b = _s8(out[k - 1] if k >= 1 and b_addr == (dst + k - 1) % SPAD else mem.get(b_addr, 0))
        out.append(max(-127, min(127, a + b)) & 0xFFFFFFFF)
    for k in range(max(0, n - 2), n):
        mem[(dst + k) % SPAD] = out[k]
    return mem


def run_vadd(unit, jobs, disturb=None):
    """Run VADDs one after the other on `unit`, the testbench playing a scratchpad with as many read
    ports as the unit has (each answers next cycle with the word before that edge's write). Returns
    [(busy, spad)] per job; `disturb` (a random.Random) puts random bits on `ins` after E0 and pulses
    `start` in about one busy WAIT cycle in five, as tests/test_units_simple.py does."""
    ports = unit.spad.signature.reads
    results = []

    async def bench(ctx):
        for word, init in jobs:
            spad = dict(init)
            ctx.set(unit.ins, word)
            ctx.set(unit.start, 1)
            await ctx.tick()                              # E0
            ctx.set(unit.start, 0)
            if disturb is not None:
                ctx.set(unit.ins, disturb.getrandbits(128))
            for w in range(1, 20000):                     # W(w)
                assert ctx.get(unit.busy) or ctx.get(unit.done), f"idle in W{w} without done"
                if ctx.get(unit.done):
                    break
                ctx.set(unit.start, disturb is not None and disturb.random() < 0.2)
                addrs = [ctx.get(unit.spad.raddr)] + [ctx.get(unit.spad.raddr_x[k]) for k in range(ports - 1)]
                words = [spad.get(a, 0) for a in addrs]
                if ctx.get(unit.spad.we):
                    spad[ctx.get(unit.spad.waddr)] = ctx.get(unit.spad.wdata)
                await ctx.tick()
                ctx.set(unit.start, 0)
                ctx.set(unit.spad.rdata, words[0])
                for k in range(ports - 1):
                    ctx.set(unit.spad.rdata_x[k], words[k + 1])
            else:
                raise AssertionError("never raised done")
            await ctx.tick()
            assert not ctx.get(unit.done) and not ctx.get(unit.busy), "done must be one pulse ending busy"
            results.append((w, spad))

    sim = Simulator(unit)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return results


def _words(rng, n):
    return [rng.choice(_EXTREMES) if rng.random() < 0.3 else rng.getrandbits(32) for _ in range(n)]


def _job(rng, n=None, placement=None):
    """(dst, src1, src2, n, spad) with the operands' placement drawn from every kind: disjoint, the same
    source twice, in place, and partial overlaps by 1..3 words either way (dst = src2 + 1 is the one a
    two-port unit must forward), addresses wrapping at the scratchpad's end."""
    n = n or rng.choice([1, 2, 3, rng.randint(4, 40)])
    s1 = rng.randrange(SPAD)
    s2 = rng.choice([s1, (s1 + rng.choice([-3, -2, -1, 1, 2, 3])) % SPAD, rng.randrange(SPAD)])
    if placement is None:
        base = rng.choice([s1, s2])
        dst = rng.choice([base, (base + rng.choice([-3, -2, -1, 1, 1, 1, 2, 3])) % SPAD, rng.randrange(SPAD)])
    else:
        dst = placement(s1, s2) % SPAD
    spad = {(s1 + k) % SPAD: w for k, w in enumerate(_words(rng, n))}
    spad.update({(s2 + k) % SPAD: w for k, w in enumerate(_words(rng, n))})
    spad.update({(dst + k) % SPAD: w for k, w in enumerate(_words(rng, n)) if (dst + k) % SPAD not in spad})
    return dst, s1, s2, n, spad


def _junk(rng, ins):
    from sim.verify.progen import ignored_bits
    return isa.encode(ins) | (rng.getrandbits(128) & ignored_bits(Op.VADD))


def _check(cfg, cases, disturb_seed=None, junk_seed=None):
    jrng = random.Random(junk_seed) if junk_seed is not None else None
    jobs = []
    for dst, s1, s2, n, spad in cases:
        ins = isa.vadd(dst, s1, s2, n)
        jobs.append((_junk(jrng, ins) if jrng else isa.encode(ins), spad))
    got = run_vadd(VaddUnit(config=cfg), jobs,
                   disturb=random.Random(disturb_seed) if disturb_seed is not None else None)
    for (dst, s1, s2, n, spad), (busy, after) in zip(cases, got):
        where = f"vadd dst={dst} src1={s1} src2={s2} len={n} on {cfg.spec()}"
        assert busy == isa.busy_cycles(isa.vadd(dst, s1, s2, n), 8, cfg), f"{where}: busy {busy}"
        assert after == one_port_model(spad, dst, s1, s2, n), where


UNIT_CHIPS = [BOOK, BOOK2, FAST2]
PLACEMENTS = {
    "disjoint": lambda s1, s2: s1 + 2000,
    "in place on src1": lambda s1, s2: s1,
    "in place on src2": lambda s1, s2: s2,
    "dst = src2 + 1": lambda s1, s2: s2 + 1,
    "dst = src1 + 1": lambda s1, s2: s1 + 1,
    "dst = src2 - 1": lambda s1, s2: s2 - 1,
    "dst = src2 + 2": lambda s1, s2: s2 + 2,
}


@pytest.mark.parametrize("cfg", UNIT_CHIPS, ids=lambda c: c.spec())
def test_unit_placements_and_saturation(cfg):
    rng = random.Random(7)
    cases = [_job(rng, n, place) for place in PLACEMENTS.values() for n in (1, 2, 5, 17)]
    # the saturation bounds: +254 -> 127, -255 -> -127, +128 -> 127, -128 -> -127, 127 + -128 = -1
    pairs = [(0x7F, 0x7F), (0xFFFFFF81, 0xFFFFFF80), (64, 64), (0xFFFFFFC0, 0xFFFFFFC0), (0x7F, 0x80), (126, 1)]
    spad = {k: a for k, (a, _) in enumerate(pairs)}
    spad.update({100 + k: b for k, (_, b) in enumerate(pairs)})
    cases.append((200, 0, 100, len(pairs), spad))
    _check(cfg, cases)


@pytest.mark.parametrize("cfg", [BOOK2, FAST2], ids=lambda c: c.spec())
def test_unit_random_sweep_disturbed(cfg):
    # (the book's unit has this sweep in tests/test_units_simple.py; the model above is checked against
    # it by test_unit_placements_and_saturation)
    rng = random.Random(11)
    cases = [_job(rng) for _ in range(40)] + [_job(rng, 4096)]
    _check(cfg, cases, disturb_seed=12, junk_seed=13)


# ---- the chip: the port wiring (PortOwner) on the Amaranth simulator ------------------------------

def _chip_program(rng):
    """LDs, VADDs of every placement (dst = src2 + 1 among them), an MM (its read ports beside VADD's),
    a VADD reading the MM's result, STs of everything, HALT."""
    image = [rng.getrandbits(32) for _ in range(2048)]
    prog = [isa.ld(0, 0, 320)]
    for k, place in enumerate(PLACEMENTS.values()):
        n = rng.choice([1, 2, rng.randint(3, 24)])
        s1, s2 = rng.randrange(0, 120), rng.randrange(0, 120)
        dst = min(max(place(s1, s2) % 320, 0), 320 - n) if k else 160 + rng.randrange(100)
        prog.append(isa.vadd(dst, s1, s2, n))
    prog += [isa.mm(200, 0, 40, 4, 8, 4), isa.vadd(201, 200, 10, 12), isa.st(0, 1000, 320), isa.halt()]
    return [isa.encode(i) for i in prog], image


@pytest.mark.parametrize("cfg", [BOOK2, parse_chip("array=8,mm_load=4,vadd_ports=2")], ids=lambda c: c.spec())
def test_chip_on_amaranth_equals_reference(cfg):
    from sim.backends import first_difference
    from sim.backends.amaranth_backend import AmaranthBackend
    program, image = _chip_program(random.Random(21))
    isa.validate_program(program, len(image), cfg=cfg)
    want = ReferenceMachine(config=cfg).run(program, image, 3)
    got = AmaranthBackend(config=cfg).run(program, image, 3)
    assert first_difference(want, got) is None, first_difference(want, got)
    # and the VADDs took n + 2: the same words as the one-port chip, sum(len) fewer cycles
    one = ReferenceMachine(config=replace(cfg, vadd_ports=1)).run(program, image, 3)
    saved = sum(isa.operands(w)["len"] for w in program if isa.operands(w)["op"] == Op.VADD)
    assert (one.ext, one.counters[0] - saved) == (got.ext, got.counters[0])


# ---- the unit contract, proved (sim.verify.formal's target vadd_ports) ------------------------------

def test_two_port_unit_contract_proved_and_a_restarting_one_fails():
    from hdl.units.base import operand_bits
    from sim.verify import formal
    # (a build without Asserts of the scope vadd_ports, e.g. the book's unit, ends in ERROR, not proved)
    target = {t.name: t for t in formal.targets()}["vadd_ports"]
    tools = formal.find_tools()
    assert formal.prove(target, sorted(target.induct), formal.UNIT_DEPTH, tools)[0] == "proved"

    class Restarting(VaddUnit):
        """Re-latches its operands on a start while busy."""
        def operand_register(self):
            self.opr = super().operand_register()
            return self.opr

        def elaborate(self, platform):
            m = super().elaborate(platform)
            with m.If(self.start & self.busy):
                m.d.sync += self.opr.eq(operand_bits(self.ins, Op.VADD))
            return m

    broken = formal.prove(target, ["start_while_busy_ignored"], 6, tools, build=lambda: Restarting(config=BOOK2))
    assert broken[0] == "FAIL"
