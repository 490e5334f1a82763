"""The invariants that make the chip's properties inductive (issue 24 part 1) fail on designs broken for them.

``python -m sim.formal`` proves the chip's properties by k-induction with them (`sim.verify.formal.
CHIP_INDUCT_DEPTH`; minutes a chip, not run here): each unit's ``write_in_busy`` (a write only while busy), the
chip's ``owner_busy`` (a busy unit is the one ``cur`` names, in WAIT), ChipEnv's ``in_flight`` (a response
answers a request of the LD that owns the port, LD's counts and operands), a generated chip's ``error_stops``
(an error stop never runs a unit again) and halt_stays' ``halted`` in every HALT cycle. Each test breaks the design for one of them and SymbiYosys must find a counterexample from reset
(bounded, a few cycles: the broken behaviour comes within 8).
"""
from dataclasses import replace

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring

import hdl.chip
from hdl.chip import CUR_NONE, GA2, SeqState
from hdl.config import BOOK
from hdl.isa import Op
from hdl.units.amax import ArgmaxUnit
from hdl.units.ld import DMA
from sim.verify import formal

# The formal tools are test dependencies (the test extra pulls them in), as in tests/test_formal.py.
TOOLS = formal.find_tools()
TARGETS = {t.name: t for t in formal.targets()}


def verdict(target, prop, depth, build=None, mode="bmc"):
    return formal.prove(TARGETS[target], [prop], depth, TOOLS, build=build, mode=mode)[0]


class LateAmax(ArgmaxUnit):
    """Writes once more in the cycle after done, when it is no longer busy."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.done):
            m.d.comb += self.spad.we.eq(1)
        return m


class DropsCur(GA2):
    """Gives up the scratchpad one cycle into an ST's WAIT (cur to CUR_NONE while the ST works)."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If((self.state == SeqState.WAIT) & (self.cur == Op.ST)):
            m.d.sync += self.cur.eq(CUR_NONE)
        return m


class HaltedDrops(GA2):
    """Clears halted in HALT (the state stays)."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.state == SeqState.HALT):
            m.d.sync += self.halted.eq(0)
        return m


class ErrorInWait(GA2):
    """Raises error in a WAIT cycle (the unit keeps working, the sequencer does not stop)."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.state == SeqState.WAIT):
            m.d.sync += self.error.eq(1)
        return m


class ShortLatchDMA(DMA):
    """Latches len - 1 (its last word is never written): its length disagrees with the instruction's."""
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
                wiring.connect(m, wiring.flipped(mine), theirs)
            elif member.flow == wiring.In:
                m.d.comb += theirs.eq(mine - 1 if name == "length" else mine)
            else:
                m.d.comb += mine.eq(theirs)
        return m


def chip_env(chip):
    return lambda: formal.ChipEnv(chip=chip)


@pytest.mark.timeout(300)
def test_write_in_busy_fails_on_a_unit_writing_after_done():
    assert verdict("amax", "write_in_busy", 8, build=LateAmax) == "FAIL"


@pytest.mark.timeout(300)
def test_write_in_busy_is_proved_on_the_unit():
    assert verdict("amax", "write_in_busy", 2, mode="prove") == "proved"


@pytest.mark.timeout(300)
def test_owner_busy_fails_when_the_sequencer_drops_cur_while_a_unit_works():
    assert verdict("chip", "owner_busy", 8, build=chip_env(DropsCur)) == "FAIL"


@pytest.mark.timeout(300)
def test_in_flight_fails_on_an_ld_that_latches_another_length(monkeypatch):
    monkeypatch.setattr(hdl.chip, "DMA", ShortLatchDMA)
    assert verdict("chip", "in_flight", 8) == "FAIL"


@pytest.mark.timeout(300)
def test_halt_stays_fails_when_halted_drops_in_halt():
    assert verdict("chip", "halt_stays", 6, build=chip_env(HaltedDrops)) == "FAIL"


@pytest.mark.timeout(300)
def test_error_stops_fails_when_error_rises_in_wait():
    prefetching = replace(BOOK, prefetch=1)           # the "prefetch" target's chip (a generated one)
    assert verdict("prefetch", "error_stops", 6, build=chip_env(lambda: ErrorInWait(config=prefetching))) == "FAIL"


def test_the_invariants_are_checks_only():
    """The invariants are checks of hdl.properties.checks: the emitted chip (its Verilog) has none of them."""
    from amaranth.back import rtlil
    from hdl.properties import checks
    plain = rtlil.convert(GA2(), name="top")
    with checks():
        checked = rtlil.convert(GA2(), name="top")
    for name in ("chip.owner_busy: ", "amax.write_in_busy: "):
        assert name not in plain and name in checked
