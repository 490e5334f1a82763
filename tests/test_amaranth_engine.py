"""sim.backends.amaranth_engine: the faster pysim engine gives what the stock engine gives, cycle by cycle.

A small design holds each case the engine has to get right: a register that loads inputs the testbench
sets before the clock edge, an idle register, a memory written and read back through clocked ports while
their inputs stay still, combinational logic that `_split` cuts into parts, a clocked Assert, and a second run after
``Simulator.reset()`` (the memory's read port is taken apart from its write port, whose process runs only
while its enable is high). Signed arithmetic (the inlined sign extension) and Cats of slices in order and
not (the joined fields) on both engines. The chip itself: a few random programs on the book's and the fast chip, the same
RunResult on both engines and on the reference machine.
"""
import random

import pytest
from amaranth.hdl import Assert, Cat, Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

import sim.backends.amaranth_backend as amaranth_backend
from hdl.config import BOOK, parse_chip
from sim.backends import first_difference
from sim.backends.amaranth_engine import SkipIdleEngine, engine_class
from sim.backends.reference import ReferenceMachine
from sim.verify.progen import random_program


class _Toy(wiring.Component):
    """Cases for the engine: see the module's docstring."""
    load: In(1)
    value: In(8)
    waddr: In(3)
    we: In(1)
    raddr: In(3)
    seven: In(8, init=7)           # never set: only a reset brings `copy` back to 0
    held: Out(8)
    count: Out(8)
    idle: Out(8)
    rdata: Out(8)
    mix: Out(8)
    sel: Out(2)
    copy: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=8, depth=8, init=[])
        wr = mem.write_port()
        rd = mem.read_port()
        m.d.comb += [wr.addr.eq(self.waddr), wr.data.eq(self.value), wr.en.eq(self.we),
                     rd.addr.eq(self.raddr), self.rdata.eq(rd.data)]
        m.d.sync += self.count.eq(self.count + 1)
        with m.If(self.load):
            m.d.sync += self.held.eq(self.value)
        with m.If(self.held == 200):                  # never true in the runs: a register that stays idle
            m.d.sync += self.idle.eq(self.idle + 1)
        # combinational statements that _split cuts: sel reads only held, mix reads rdata and count
        with m.Switch(self.held[:2]):
            with m.Case(0):
                m.d.comb += self.sel.eq(1)
            with m.Case(1, 2):
                m.d.comb += [self.sel.eq(2), self.mix.eq(self.rdata ^ self.count)]
            with m.Default():
                m.d.comb += self.mix.eq(self.rdata + self.count)
        m.d.sync += Assert(self.held != 99, "held took the forbidden value 99")
        # a clocked process of its own whose input never changes: after a reset it must run again
        m.submodules.copier = copier = Module()
        copier.d.sync += self.copy.eq(self.seven)
        return m


def _trace(engine, steps, forbidden=False):
    """Per cycle, every output of a `_Toy` driven by a fixed pattern, over two runs with a reset between."""
    toy = _Toy()
    sim = Simulator(toy, engine=engine)
    sim.add_clock(1e-6)
    out = []

    async def bench(ctx):
        rng = random.Random(5)
        for t in range(steps):
            # inputs held for a few edges now and then: a word written at one edge must be read at the
            # next ones with no input of the memory's ports changing
            if rng.random() < 0.4:
                ctx.set(toy.load, rng.random() < 0.3)
                value = rng.randrange(256)                # every bit, the memory's top one included
                ctx.set(toy.value, value + 1 if value in (99, 200) else value)     # never held: see _Toy
                ctx.set(toy.we, rng.random() < 0.5)
                ctx.set(toy.waddr, rng.randrange(8))
                ctx.set(toy.raddr, rng.randrange(8))
            if forbidden and t == steps // 2:
                ctx.set(toy.load, 1)
                ctx.set(toy.value, 99)
            await ctx.tick()
            out.append(tuple(ctx.get(p) for p in (toy.held, toy.count, toy.idle, toy.rdata, toy.mix, toy.sel, toy.copy)))

    sim.add_testbench(bench)
    sim.run()
    sim.reset()
    sim.run()
    return out, sim


def test_toy_design_same_as_stock_engine():
    want, _ = _trace("pysim", 200)
    got, sim = _trace(SkipIdleEngine, 200)
    assert len(got) == 400
    first = next((t for t, (a, b) in enumerate(zip(want, got)) if a != b), None)
    assert first is None, f"cycle {first}: stock {want[first]}, SkipIdleEngine {got[first]}"
    engine = sim._engine
    assert engine._guarded, "no clocked process is guarded: the engine would skip nothing"


def test_toy_assert_fires_on_both_engines():
    for engine in ("pysim", SkipIdleEngine):
        with pytest.raises(AssertionError, match="forbidden value 99"):
            _trace(engine, 40, forbidden=True)


def test_engine_class():
    assert engine_class() is SkipIdleEngine
    assert engine_class(vcd=True) == "pysim"


def _run_both(config, seeds, monkeypatch):
    ref = ReferenceMachine(config=config)
    for seed in seeds:
        program, image = random_program(random.Random(seed), config.ext_words, config=config)
        want = ref.run(program, image, 8)
        results = {}
        # the backend's own choice of engine (SkipIdleEngine with its wires inlined) against the stock one
        for name, engine in (("stock", lambda vcd=False, keep=None: "pysim"), ("skip", engine_class)):
            monkeypatch.setattr(amaranth_backend, "engine_class", engine)
            results[name] = amaranth_backend.AmaranthBackend(config=config).run(program, image, 8)
        for name, got in results.items():
            diff = first_difference(want, got)
            assert diff is None, f"seed {seed}, {name} engine: {diff}"


@pytest.mark.timeout(300)
def test_chip_book_same_on_both_engines(monkeypatch):
    _run_both(BOOK, [1], monkeypatch)


@pytest.mark.timeout(300)
def test_chip_fast_same_on_both_engines(monkeypatch):
    _run_both(parse_chip("fast"), [3], monkeypatch)


class _TwoMemories(wiring.Component):
    """Two memories, read through a port each (so that the design uses them)."""
    addr: In(3)
    a: Out(8)
    b: Out(16)

    def __init__(self):
        super().__init__()
        self.mem_a = Memory(shape=8, depth=8, init=[])
        self.mem_b = Memory(shape=16, depth=8, init=[])

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem_a, m.submodules.mem_b = self.mem_a, self.mem_b
        for mem, out in ((self.mem_a, self.a), (self.mem_b, self.b)):
            port = mem.read_port(domain="comb")
            m.d.comb += [port.addr.eq(self.addr), out.eq(port.data)]
        return m


def test_rows_written_and_read_in_one_go_as_ctx_does():
    dut = _TwoMemories()
    sim = Simulator(dut, engine=SkipIdleEngine)
    engine = sim._engine
    rows_a = [dut.mem_a.data[i] for i in range(8)]
    rows_b = [dut.mem_b.data[i] for i in range(8)]
    # in order, interleaved (as the scratchpad's banks), reversed, repeated, a single row
    layouts = [rows_a, [r for pair in zip(rows_a, rows_b) for r in pair], rows_b[::-1], [rows_a[2]] * 3 + rows_b[5:6]]
    rng = random.Random(7)
    seen = []

    async def bench(ctx):
        for _ in range(3):
            # words wider than a row are cut to it, as ctx.set cuts them
            pairs = [(row, rng.randrange(1 << 20)) for row in rows_a + rows_b if rng.random() < 0.7]
            engine.write_rows(ctx, pairs)
            for row, word in pairs:
                assert ctx.get(row) == word & ((1 << len(row)) - 1)
            for layout in layouts:
                want = [ctx.get(row) for row in layout]
                assert engine.read_rows(ctx, layout) == want
            ctx.set(dut.addr, 3)
            seen.append((ctx.get(dut.a), ctx.get(dut.b), ctx.get(rows_a[3]), ctx.get(rows_b[3])))

    sim.add_testbench(bench)
    sim.run()
    # the comb read ports saw the words written (the design was settled after write_rows)
    assert all(a == ra and b == rb for a, b, ra, rb in seen)
    assert any(a or b for a, b, _, _ in seen)


class _Slices(wiring.Component):
    """A combinational signal assigned slice by slice (`_one_assign` makes it one Cat): a signed right-hand side
    narrower than its slice (sign-extended), a wider one (cut), gaps at the signal's initial value; and a
    second signal with other inputs, so that the statements are cut into parts."""
    small: In(signed(3))
    wide: In(12)
    other: In(4)
    packed: Out(24, init=0xA5C3E1)
    echo: Out(4)

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.packed[0:5].eq(self.small), self.packed[8:16].eq(self.wide),
                     self.packed[18:22].as_signed().eq(self.wide[3:]), self.echo.eq(self.other)]
        return m


def _trace_on_both_engines(component, drive):
    """The samples `drive(ctx, dut, out)` appends to `out` from a fresh `component()` on pysim's stock engine
    and on SkipIdleEngine: [stock, skip]."""
    traces = []
    for engine in ("pysim", SkipIdleEngine):
        dut = component()
        sim = Simulator(dut, engine=engine)
        out = []

        async def bench(ctx, dut=dut, out=out):
            await drive(ctx, dut, out)

        sim.add_testbench(bench)
        sim.run()
        traces.append(out)
    return traces


def test_slices_as_one_cat_same_as_stock_engine():
    async def drive(ctx, dut, out):
        rng = random.Random(3)
        for _ in range(50):
            ctx.set(dut.small, rng.randrange(-4, 4))
            ctx.set(dut.wide, rng.randrange(1 << 12))
            ctx.set(dut.other, rng.randrange(16))
            out.append((ctx.get(dut.packed), ctx.get(dut.echo)))
    traces = _trace_on_both_engines(_Slices, drive)
    assert traces[0] == traces[1]
    assert len({p for p, _ in traces[0]}) > 10


class _Signed(wiring.Component):
    """Signed arithmetic: pysim sign-extends each signed operand, which SkipIdleEngine's compile inlines."""
    a: In(signed(8))
    b: In(signed(8))
    c: In(signed(1))                 # a one-bit signed value: 0 or -1
    d: In(signed(16))
    total: Out(signed(18))
    less: Out(1)
    neg: Out(signed(3))
    shifted: Out(signed(8))

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.total.eq(self.a * self.b + self.d), self.less.eq(self.a < self.c),
                     self.neg.eq(-self.c), self.shifted.eq(self.a >> 2)]
        return m


def test_signed_arithmetic_same_as_stock_engine():
    async def drive(ctx, dut, out):
        rng = random.Random(7)
        edges = (-128, -127, -1, 0, 1, 127)
        for t in range(120):
            a, b = (edges[t % 6], edges[t // 6 % 6]) if t < 36 else (rng.randrange(-128, 128),
                                                                       rng.randrange(-128, 128))
            ctx.set(dut.a, a)
            ctx.set(dut.b, b)
            ctx.set(dut.c, -(t % 2))
            ctx.set(dut.d, rng.randrange(-1 << 15, 1 << 15))
            out.append((a, b, ctx.get(dut.total), ctx.get(dut.less), ctx.get(dut.neg), ctx.get(dut.shifted)))
    traces = _trace_on_both_engines(_Signed, drive)
    assert traces[0] == traces[1]
    assert any(total < 0 for _, _, total, _, _, _ in traces[0]) and any(neg for *_, neg, _ in traces[0])


class _Fields(wiring.Component):
    """Cats of slices, in order and not: SkipIdleEngine's compile joins consecutive fields of one value."""
    a: In(24)
    b: In(signed(8))
    whole: Out(24)
    swapped: Out(16)
    mixed: Out(20)
    wide: Out(32)

    def elaborate(self, platform):
        m = Module()
        a = self.a
        m.d.comb += [self.whole.eq(Cat(a[0:8], a[8:16], a[16:24])), self.swapped.eq(Cat(a[8:16], a[0:8])),
                     self.mixed.eq(Cat(a[4:12], self.b[0:4], a[12:20])),
                     self.wide.eq(Cat(a[2:10], a[10:12], self.b, a[12:14]) + self.b)]
        return m


def test_fields_same_as_stock_engine():
    async def drive(ctx, dut, out):
        rng = random.Random(11)
        for _ in range(60):
            ctx.set(dut.a, rng.randrange(1 << 24))
            ctx.set(dut.b, rng.randrange(-128, 128))
            out.append(tuple(ctx.get(p) for p in (dut.whole, dut.swapped, dut.mixed, dut.wide)))
    traces = _trace_on_both_engines(_Fields, drive)
    assert traces[0] == traces[1]
    assert len({t[0] for t in traces[0]}) > 50


class _Shared(wiring.Component):
    """Values a process computes more than once (SkipIdleEngine's compile computes them once,
    `_hoist_reads`): an input read many times, signed and unsigned fields of it used by several outputs,
    a Switch whose cases repeat one test and one expression (nested too), and a shift by a computed
    amount repeated at the top level and inside a case."""
    x: In(16)
    sel: In(2)
    amount: In(3)
    y: In(signed(8))
    prods: Out(32)
    picked: Out(8)
    other: Out(8)
    shifted: Out(16)
    again: Out(16)
    twice: Out(8)

    def elaborate(self, platform):
        m = Module()
        x, y = self.x, self.y
        low, high = x[0:8].as_signed(), x[8:16].as_signed()
        m.d.comb += [self.prods.eq(Cat(low * y, high * y, (low * high)[0:8], x[0:8] + x[8:16])),
                     self.shifted.eq(x >> self.amount), self.again.eq((x >> self.amount) ^ x)]
        with m.Switch(self.sel):
            with m.Case(0):
                m.d.comb += [self.picked.eq(x[0:8] & x[8:16]), self.other.eq(x[0:8] & x[8:16])]
            with m.Case(1):
                with m.If(x[3] & x[12]):
                    m.d.comb += self.picked.eq(high)
                with m.Else():
                    m.d.comb += self.picked.eq(x[0:8] & x[8:16])
                m.d.comb += self.other.eq((x >> self.amount)[0:8])
            with m.Case(2):
                with m.If((x >> self.amount)[2]):
                    m.d.comb += self.twice.eq(x[1:9])
            with m.Default():
                with m.If(x[3] & x[12]):
                    m.d.comb += [self.picked.eq(low), self.other.eq(x[4:12])]
        with m.If((x >> self.amount)[2]):
            m.d.comb += self.twice.eq(x[2:10])
        with m.If((x >> self.amount)[1]):
            m.d.comb += self.twice.eq(x[0:8])
        with m.If((x >> self.amount)[1] & x[2]):
            m.d.comb += self.twice.eq(x[8:16])
        with m.If((x >> self.amount)[1]):
            m.d.comb += self.twice.eq(self.y)
        return m


def test_values_computed_once_same_as_stock_engine(monkeypatch):
    from sim.backends import amaranth_engine
    monkeypatch.setenv("GA2_PYSIM_CACHE", "off")         # the rewriter must run, not a cached result
    rewritten = []
    hoist = amaranth_engine._hoist_reads
    monkeypatch.setattr(amaranth_engine, "_hoist_reads", lambda source: rewritten.append(hoist(source)) or
                        rewritten[-1])

    async def drive(ctx, dut, out):
        rng = random.Random(13)
        for _ in range(200):
            ctx.set(dut.x, rng.randrange(1 << 16))
            ctx.set(dut.sel, rng.randrange(4))
            ctx.set(dut.amount, rng.randrange(8))
            ctx.set(dut.y, rng.randrange(-128, 128))
            out.append(tuple(ctx.get(p) for p in (dut.prods, dut.picked, dut.other, dut.shifted, dut.again,
                                                    dut.twice)))
    traces = _trace_on_both_engines(_Shared, drive)
    assert traces[0] == traces[1]
    assert all(len({t[k] for t in traces[0]}) > 50 for k in (1, 2, 5))
    # each kind of sharing happened: reads, fields, an expression computed at the top, one reused
    code = "\n".join(rewritten)
    assert all(name in code for name in ("curr_", "field_", "same_")), code
    assert any(line.strip().split(" = ")[-1].startswith(("test_", "expr_", "rhs_")) for line in code.splitlines()), code


class _Lanes(wiring.Component):
    """Lanes each choosing by the same Switch (a nested one too), two by another: SkipIdleEngine's
    compile makes consecutive matches on one value one (`_merge_matches`), and must not join the others."""
    x: In(16)
    sel: In(2)
    other: In(2)
    lanes: Out(20)

    def elaborate(self, platform):
        m = Module()
        x, sel = self.x, self.sel
        for k in range(5):
            lane = self.lanes[4 * k:4 * k + 4]
            with m.Switch(self.other if k in (2, 3) else sel):     # lanes 2 and 3: another value
                with m.Case(0):
                    m.d.comb += lane.eq(x[k:k + 4])
                with m.Case(1):
                    with m.Switch(x[0:2]):
                        with m.Case(3):
                            m.d.comb += lane.eq(x[8:12] + k)
                        with m.Default():
                            m.d.comb += lane.eq(x[k + 4:k + 8])
                with m.Default():
                    m.d.comb += lane.eq(x[12 - k:16 - k] ^ k)
        return m


def test_matches_on_one_value_joined_same_as_stock_engine(monkeypatch):
    from sim.backends import amaranth_engine
    monkeypatch.setenv("GA2_PYSIM_CACHE", "off")         # the rewriter must run, not a cached result
    joined = []
    merge = amaranth_engine._merge_matches
    monkeypatch.setattr(amaranth_engine, "_merge_matches",
                        lambda body: joined.append((len(body), len(merge(body)))) or merge(body))

    async def drive(ctx, dut, out):
        rng = random.Random(17)
        for _ in range(200):
            ctx.set(dut.x, rng.randrange(1 << 16))
            ctx.set(dut.sel, rng.randrange(4))
            ctx.set(dut.other, rng.randrange(4))
            out.append(ctx.get(dut.lanes))
    traces = _trace_on_both_engines(_Lanes, drive)
    assert traces[0] == traces[1]
    assert len(set(traces[0])) > 150
    assert any(after < before for before, after in joined)        # some matches were made one


def test_joined_matches_keep_what_stands_between():
    """What stands between two matches on one value moves before the first only when the first's cases
    neither read what it assigns nor assign what it reads or assigns (code as `_hoist_reads` leaves it)."""
    import ast
    from sim.backends.amaranth_engine import _merge_matches
    source = """
def run(same_1_):
    a = 0
    match same_1_:
        case 0:
            a = 1
        case _:
            a = 2
    a = 5
    match same_1_:
        case 0:
            d = a
        case _:
            d = a * 3
    b = d
    match same_1_:
        case 0:
            c = b
        case _:
            c = b + 1
    e = same_1_
    match same_1_:
        case 0:
            f = e + c
        case _:
            f = e - c
    return a, b, c, d, e, f
"""
    tree = ast.parse(source)
    function = tree.body[0]
    count = len(function.body)
    function.body[:] = _merge_matches(function.body)
    assert len(function.body) < count                 # the last two matches are one
    joined = {}
    exec(compile(tree, "<joined>", "exec"), joined)
    plain = {}
    exec(compile(ast.parse(source), "<plain>", "exec"), plain)
    for value in range(3):
        assert joined["run"](value) == plain["run"](value)


def test_ranks_share_a_loop_and_follow_the_longest_path():
    from sim.backends.amaranth_engine import _ranks
    after = {"a": {"b", "d"}, "b": {"c"}, "c": {"b", "d"}, "d": set(), "e": set(), "f": {"f", "g"}, "g": set()}
    assert _ranks(list(after), after) == {"a": 0, "b": 1, "c": 1, "d": 2, "e": 0, "f": 0, "g": 1}
    chain = {k: {k + 1} for k in range(3000)} | {3000: set()}      # deep: no recursion limit
    assert _ranks(list(chain)[::-1], chain)[3000] == 3000


class _Loop(wiring.Component):
    """A loop of processes that is not a loop of signals: `front` drives x from `a` and, in the same Assign, z
    from `back`'s y, while `back` drives y from x; `w` is computed after the loop."""
    a: In(8)
    z: Out(8)
    w: Out(8)

    def elaborate(self, platform):
        m = Module()
        x, y = Signal(8), Signal(8)
        m.submodules.front = front = Module()
        m.submodules.back = back = Module()
        front.d.comb += Cat(x, self.z).eq(Cat(self.a + 1, y ^ 0x5A))
        back.d.comb += y.eq(x * 3)
        m.d.comb += self.w.eq(self.z + x)
        return m


def test_loop_of_processes_settles_as_on_stock_engine():
    traces, engines = [], []
    for engine in ("pysim", SkipIdleEngine):
        dut = _Loop()
        sim = Simulator(dut, engine=engine)
        out = []

        async def bench(ctx, dut=dut, out=out):
            rng = random.Random(23)
            for _ in range(100):
                ctx.set(dut.a, rng.randrange(256))
                out.append((ctx.get(dut.z), ctx.get(dut.w)))
        sim.add_testbench(bench)
        sim.run()
        traces.append(out)
        engines.append(sim._engine)
    assert traces[0] == traces[1]
    assert len(set(traces[0])) > 50
    ranks = sorted(engines[1]._ranks.values())
    assert ranks == [0, 0, 1], ranks          # front and back share a rank, w's process comes after


class _Wires(wiring.Component):
    """Wires `_inline_wires` takes out: a copy, a slice, a wire of a wire, a narrower and a wider wire, a
    signed wire of an unsigned slice; read by combinational logic, by a register, by a memory port's
    address and by an Assert. `done` is a wire of the register that a testbench may await (kept then)."""
    a: In(12)
    b: In(signed(6))
    we: In(1)
    mixed: Out(16)
    reg: Out(12)
    rdata: Out(8)
    done: Out(1)

    def elaborate(self, platform):
        m = Module()
        copy, high, low2 = Signal(12), Signal(5), Signal(3)
        narrow, wide, sgn = Signal(4), Signal(20), Signal(signed(4))
        m.d.comb += [copy.eq(self.a), high.eq(copy[7:]), low2.eq(high[:3]), narrow.eq(self.a),
                     wide.eq(self.b), sgn.eq(self.a[2:6]), self.done.eq(self.reg[0])]
        m.d.comb += self.mixed.eq(low2 * 100 + narrow + wide + sgn)
        m.d.sync += self.reg.eq(copy + high)
        m.submodules.mem = mem = Memory(shape=8, depth=16, init=[])
        wr, rd = mem.write_port(), mem.read_port()
        m.d.comb += [wr.addr.eq(narrow), wr.data.eq(self.a), wr.en.eq(self.we), rd.addr.eq(high),
                     self.rdata.eq(rd.data)]
        m.d.sync += Assert(sgn != -8, "the signed wire held -8")
        return m


def test_wires_inlined_give_the_stock_engines_values():
    from sim.backends.amaranth_engine import engine_class
    traces, engines = [], []
    for engine in ("pysim", engine_class(keep=())):
        dut = _Wires()
        sim = Simulator(dut, engine=engine)
        sim.add_clock(1e-6)
        out = []

        async def bench(ctx, dut=dut, out=out):
            rng = random.Random(29)
            for _ in range(150):
                a = rng.randrange(1 << 12)
                ctx.set(dut.a, a if (a >> 2) & 15 != 8 else a ^ 4)      # never -8 in sgn: see the Assert
                ctx.set(dut.b, rng.randrange(-32, 32))
                ctx.set(dut.we, rng.randrange(2))
                await ctx.tick()
                out.append(tuple(ctx.get(p) for p in (dut.mixed, dut.reg, dut.rdata, dut.done)))
        sim.add_testbench(bench)
        sim.run()
        traces.append(out)
        engines.append(sim._engine)
    assert traces[0] == traces[1]
    assert len(set(traces[0])) > 100
    assert len(engines[1]._wires) >= 6                  # copy, high, low2, narrow, wide, sgn (and done)


def test_a_kept_wire_can_be_awaited_and_an_inlined_one_read():
    from sim.backends.amaranth_engine import engine_class
    dut = _Wires()
    sim = Simulator(dut, engine=engine_class(keep=(dut.done,)))
    sim.add_clock(1e-6)
    seen = []

    async def bench(ctx):
        ctx.set(dut.a, 0b1011_0110_1011)               # reg becomes a + (a >> 7), odd: done rises
        await ctx.posedge(dut.done)
        seen.append(ctx.get(dut.mixed))
    sim.add_testbench(bench)
    sim.run_until(1e-4)
    engine = sim._engine
    assert engine._wires and all(signal is not dut.done for signal in engine._wires.keys())
    a = 0b1011_0110_1011                               # mixed = low2 * 100 + narrow + wide + sgn, b = 0
    field = (a >> 2) & 15
    assert seen == [(((a >> 7) & 7) * 100 + (a & 15) + (field - 16 if field & 8 else field)) & 0xFFFF]


def test_awaiting_an_inlined_wire_is_refused_by_name():
    from sim.backends.amaranth_engine import engine_class
    dut = _Wires()
    sim = Simulator(dut, engine=engine_class(keep=()))
    sim.add_clock(1e-6)

    async def bench(ctx):
        await ctx.posedge(dut.done)
    sim.add_testbench(bench)
    with pytest.raises(ValueError, match="inlined the wire 'done'"):
        sim.run_until(1e-5)


def test_memory_write_ports_keep_the_fast_writer_with_wires_inlined():
    """The toy's write port takes its address, data and enable from wires: they stay signals, so the port's
    process is still `SkipIdleEngine._writer`'s (not pysim's, which builds the write mask at every edge)."""
    from sim.backends.amaranth_engine import engine_class
    dut = _Wires()
    sim = Simulator(dut, engine=engine_class(keep=()))
    engine = sim._engine
    writers = [p for p in engine._rtl if p.run.__qualname__.endswith("_writer.<locals>.write")]
    assert len(writers) == 1 and engine._wires
