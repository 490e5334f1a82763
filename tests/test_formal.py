"""sim.verify.formal: the real design's properties hold, and each property fails on a design broken for it.

Every broken variant below breaks one rule of the unit contract or of the chip, and SymbiYosys must find a
counterexample for exactly the property that states that rule (only that property is kept in the run).
The depths are small: a counterexample of these variants is at most ~10 cycles long.
"""
from dataclasses import replace

import pytest
from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import Out
from amaranth.sim import Simulator

import hdl.chip
from hdl.chip import GA2, SeqState
from hdl.config import BOOK
from hdl.isa import HW_OPERANDS, Op
from hdl.properties import UNIT_PROPERTIES
from hdl.units.amax import ArgmaxUnit
from hdl.units.base import operand_bits
from hdl.units.gather import TableWalk
from hdl.units.ld import DMA
from hdl.units.mm import MatrixUnit
from hdl.units.st import StoreUnit
from hdl.units.vadd import VaddUnit
from sim.verify import formal

# The formal tools are test dependencies (the test extra pulls them in): a missing one fails this module
# loudly instead of skipping every proof.
TOOLS = formal.find_tools()

TARGETS = {t.name: t for t in formal.targets()}


def verdict(target, prop, depth, build=None, mode="prove"):
    return formal.prove(TARGETS[target], [prop], depth, TOOLS, build=build, mode=mode)[0]


# ---- broken units (the store unit, the smallest) ----

class DoneWhileIdle(StoreUnit):
    """Pulses done right after its start edge: done without a busy cycle before it."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.start & ~self.busy):
            m.d.sync += self.done.eq(1)
        return m


class Abort(StoreUnit):
    """Shows busy low when ins[0] is high, without done."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.ins[0]):
            m.d.comb += self.busy.eq(0)
        return m


class DoneTwice(StoreUnit):
    """Holds done high once it rose."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.done):
            m.d.sync += self.done.eq(1)
        return m


class SelfStart(StoreUnit):
    """Shows busy on ins[0] without a start."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(~self.start & self.ins[0]):
            m.d.comb += self.busy.eq(1)
        return m


class RestartingVadd(VaddUnit):
    """VADD that re-latches its operands on a start while busy."""
    def operand_register(self):
        self.opr = super().operand_register()
        return self.opr

    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.start & self.busy):
            m.d.sync += self.opr.eq(operand_bits(self.ins, Op.VADD))
        return m


@pytest.mark.parametrize("prop, broken", [
    ("done_ends_busy", DoneWhileIdle),
    ("busy_drops_with_done", Abort),
    ("done_one_cycle", DoneTwice),
    ("busy_after_start", SelfStart),
])
def test_unit_property_fails_on_broken_store_unit(prop, broken):
    assert verdict("st", prop, 6, build=broken) == "FAIL"


def test_start_while_busy_fails_on_restarting_vadd():
    assert verdict("vadd", "start_while_busy_ignored", 6, build=RestartingVadd) == "FAIL"


def test_store_unit_contract_proved():
    got = formal.prove(TARGETS["st"], sorted(TARGETS["st"].induct), 8, TOOLS)
    assert got[0] == "proved"


# ---- broken chips ----

class LateAmax(ArgmaxUnit):
    """Writes once more in the cycle after done, when it no longer owns the scratchpad."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        late = Signal()
        m.d.sync += late.eq(self.done)
        with m.If(late):
            m.d.comb += self.spad.we.eq(1)
        return m


class LongDMA(DMA):
    """Transfers one word more than asked (writes dst+len)."""
    # the engine's registers, for ChipEnv's in_flight (the inner engine's, elaborated before it reads them)
    _count = property(lambda self: self._inner._count)
    _dst_r = property(lambda self: self._inner._dst_r)
    _len_r = property(lambda self: self._inner._len_r)
    _groups = property(lambda self: self._inner._groups)

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = self._inner = DMA(self.aw, self.xw)
        for name, member in self.signature.members.items():
            mine, theirs = getattr(self, name), getattr(inner, name)
            if member.is_signature:
                wiring.connect(m, wiring.flipped(mine), theirs)      # the scratchpad port, forwarded
            elif member.flow == wiring.In:
                m.d.comb += theirs.eq(mine + 1 if name == "length" else mine)
            else:
                m.d.comb += mine.eq(theirs)
        return m


class VecCountsMM(GA2):
    """Counts MM's WAIT cycles in cyc_vec as well."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If((self.state == SeqState.WAIT) & (self.cur == Op.MM)):
            m.d.sync += self.cyc_vec.eq(self.cyc_vec + 1)
        return m


class HaltRestarts(GA2):
    """Leaves HALT on start."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If((self.state == SeqState.HALT) & self.start):
            m.d.sync += self.state.eq(SeqState.FETCH)
        return m


class HaltToNowhere(GA2):
    """Goes from HALT to the unused state 5 on start."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If((self.state == SeqState.HALT) & self.start):
            m.d.sync += self.state.as_value().eq(5)
        return m


def chip_env(chip):
    return lambda: formal.ChipEnv(chip=chip)


def test_owner_writes_fails_when_a_unit_writes_after_done(monkeypatch):
    monkeypatch.setattr(hdl.chip, "ArgmaxUnit", LateAmax)
    assert verdict("chip", "owner_writes", 10, mode="bmc") == "FAIL"


def test_dma_in_range_fails_when_ld_writes_one_word_more(monkeypatch):
    monkeypatch.setattr(hdl.chip, "DMA", LongDMA)
    assert verdict("chip", "dma_in_range", 10, mode="bmc") == "FAIL"


@pytest.mark.parametrize("prop, broken, mode", [
    ("counters", VecCountsMM, "bmc"),
    ("halt_stays", HaltRestarts, "prove"),
    ("state_legal", HaltToNowhere, "prove"),
])
def test_chip_property_fails_on_broken_chip(prop, broken, mode):
    assert verdict("chip", prop, 6, build=chip_env(broken), mode=mode) == "FAIL"


def test_chip_properties_hold():
    # the state facts by induction (seconds); the whole induction of the chip's properties takes minutes
    # (python -m sim.formal --only chip): here the others bounded from reset
    chip = TARGETS["chip"]
    assert formal.prove(chip, ["state_legal", "halt_stays"], formal.CHIP_INDUCT_DEPTH, TOOLS)[0] == "proved"
    rest = [p for p in chip.properties if p not in ("state_legal", "halt_stays")]
    assert formal.prove(chip, rest, 8, TOOLS, mode="bmc")[0] == "bounded"


# ---- the Asserts are live in Amaranth's simulator ----

def test_pysim_evaluates_the_asserts():
    dut = DoneWhileIdle()
    sim = Simulator(dut)
    sim.add_clock(1e-6)

    async def bench(ctx):
        ctx.set(dut.ins, 1 << HW_OPERANDS[Op.ST]["len"][1])       # len = 1
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        for _ in range(8):
            await ctx.tick()

    sim.add_testbench(bench)
    with pytest.raises(AssertionError, match=r"st\.done_ends_busy: "):
        sim.run()


def test_only_rejects_an_unknown_name(capsys):
    from sim.cli import guarded
    assert guarded(formal.main, ["--only", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --only must name") and err.count("\n") == 1


# ---- honest reporting (issue 24 part 2): covers, inconclusive inductions, broken designs of every kind ----

class NeverDone(StoreUnit):
    """Its done never rises: done_ends_busy ("done only after busy") holds, vacuously."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        m.d.sync += self.done.eq(0)         # the last assignment wins: done stays 0
        return m


def test_covers_are_reached_on_the_store_unit_and_not_on_one_that_never_finishes():
    st = TARGETS["st"]
    found, _, detail = formal.cover(st, ["done_ends_busy", "busy_after_start"], 8, TOOLS)
    assert detail == "" and found == {"done_ends_busy": (["done"], []), "busy_after_start": (["busy rises"], [])}
    found, _, _ = formal.cover(st, ["done_ends_busy"], 8, TOOLS, build=NeverDone)
    assert found == {"done_ends_busy": ([], ["done"])}


def test_covers_exist_only_inside_the_covers_block():
    """Outside `hdl.properties.covers` the design is its Asserts alone (the Verilog does not change)."""
    from amaranth.back import rtlil
    from hdl.properties import covers
    plain = rtlil.convert(StoreUnit(), name="top")
    with covers():
        covered = rtlil.convert(StoreUnit(), name="top")
    assert 'FLAVOR "cover"' not in plain and covered.count('FLAVOR "cover"') == len(UNIT_PROPERTIES)


class Wraps(wiring.Component):
    """A 4-bit counter that counts 0..5 and starts over, every cycle. Its property "never 12" holds (12 is
    never reached) but is not k-inductive below k = 7: the unreachable run 6, 7, ..., 11 ends in 12 (and 6
    has no predecessor). Its triggers: the counter at each value of `at`."""
    def __init__(self, at=(2,)):
        self.at = at
        super().__init__({"count": Out(4)})

    def elaborate(self, platform):
        from hdl.properties import History
        m = Module()
        c = self.count
        m.d.sync += c.eq(Mux(c == 5, 0, c + 1))
        h = History(m, "toy")
        h.check("never_12", c != 12, "the counter never reads 12",
                covers={f"the counter at {k}": c == k for k in self.at})
        return m


TOY = formal.Target("toy", Wraps, {"never_12": "the counter never reads 12"}, frozenset({"never_12"}))


def test_an_inconclusive_induction_is_unproved_and_fails_the_command(monkeypatch, capsys):
    assert formal.prove(TOY, ["never_12"], 8, TOOLS)[0] == "proved"          # it holds: k = 8 shows it
    monkeypatch.setattr(formal, "targets", lambda *args, **kwargs: [TOY])
    assert formal.main(["--depth", "4"]) == 1
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("toy.never_12 "))
    assert row.split()[1:5] == ["prove", "4", "UNPROVED", "reached"]


def test_an_unreached_cover_fails_the_command(monkeypatch, capsys):
    """The toy counter reads 2 in its third cycle, its cover is seen an edge later: a 2-cycle bounded check
    never saw it."""
    bmc = formal.Target("toy", Wraps, TOY.properties)
    monkeypatch.setattr(formal, "targets", lambda *args, **kwargs: [bmc])
    assert formal.main(["--depth", "2"]) == 1
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("toy.never_12 "))
    assert row.split()[1:4] == ["bmc", "2", "bounded"] and "NOT REACHED" in row and \
        row.endswith("not reached: the counter at 2")
    assert formal.cover(bmc, ["never_12"], 4, TOOLS)[0] == {"never_12": (["the counter at 2"], [])}


def test_every_cover_reached_is_counted():
    """Seven triggers, seven traces: more than the five SymbiYosys's log lists (its summary file has all)."""
    every = [f"the counter at {k}" for k in range(6)] + ["the counter at 9"]
    found, _, detail = formal.cover(formal.Target("toy", lambda: Wraps(at=(0, 1, 2, 3, 4, 5, 9)), TOY.properties),
                                    ["never_12"], 10, TOOLS)
    assert detail == "" and found == {"never_12": (every[:6], every[6:])}


def long_rows(m, unit, opr):
    """A table walk that ends a row one word late (word = 2**row_log2 before the next row): breaks `walk`."""
    walk = TableWalk(m, unit, opr)
    walk.row_end = walk.word == (Const(1, 1) << opr.row_log2)
    return walk


class RqcAtStart(MatrixUnit):
    """Clears its requantizer registers at every MM start, without an RQC: breaks `rq_hold`."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.start & ~self.busy):
            m.d.sync += self.rq_regs.eq(0)
        return m


class WideRq(MatrixUnit):
    """Writes 128 wherever it writes: out of the int8 range a requantized word must be in (`rq_range`)."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.spad.we):
            m.d.comb += self.spad.wdata.eq(128)
        return m


class SelfStartMM(MatrixUnit):
    """Shows busy on ins[0] without a start."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(~self.start & self.ins[0]):
            m.d.comb += self.busy.eq(1)
        return m


def test_walk_fails_on_a_gather_whose_rows_run_one_word_long(monkeypatch):
    import hdl.units.gather as g
    monkeypatch.setattr(g, "TableWalk", long_rows)
    cfg = replace(BOOK, gather=1, lat=formal.CHIP_LAT)
    assert verdict("gather", "walk", 8, build=lambda: g.GatherUnit(config=cfg), mode="bmc") == "FAIL"


@pytest.mark.parametrize("target, prop, broken", [
    ("mm_rq", "rq_hold", RqcAtStart),
    ("mm_rq", "rq_range", WideRq),
    ("mm_fast", "busy_after_start", SelfStartMM),
])
def test_mm_property_fails_on_broken_mm_unit(target, prop, broken):
    # a 2 x 2 array: the same unit and properties, a smaller datapath for the solver
    cfg = {"mm_rq": replace(BOOK, mm_rq=1, array=2), "mm_fast": replace(BOOK, mm_pack=1, mm_overlap=1, array=2)}[target]
    assert verdict(target, prop, 4 if prop != "rq_range" else 14, build=lambda: broken(config=cfg),
                   mode="bmc") == "FAIL"
