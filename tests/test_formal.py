"""sim.verify.formal: the real design's properties hold, and each property fails on a design broken for it.

Every broken variant below breaks one rule of the unit contract or of the chip, and SymbiYosys must find a
counterexample for exactly the property that states that rule (only that property is kept in the run).
The depths are small: a counterexample of these variants is at most ~10 cycles long.
"""
import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.sim import Simulator

import hdl.chip
from hdl.chip import GA2, SeqState
from hdl.isa import HW_OPERANDS, Op
from hdl.units.amax import ArgmaxUnit
from hdl.units.base import operand_bits
from hdl.units.ld import DMA
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
    got = formal.prove(TARGETS["st"], list(TARGETS["st"].properties), 8, TOOLS)
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
    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = DMA(self.aw, self.xw)
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
    chip = TARGETS["chip"]
    assert formal.prove(chip, sorted(chip.induct), 4, TOOLS)[0] == "proved"
    rest = [p for p in chip.properties if p not in chip.induct]
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
