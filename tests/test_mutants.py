"""The mutation-testing machinery (sim.mutants) in CI: every anchor still occurs exactly once and every
mutated file compiles (so the list cannot rot silently), one cheap mutant of each kind is caught through
the same copy-and-pytest path as the full run, and the machinery reports survivors, equivalents, broken
mutants and time-outs as such. The full run is ``python -m sim.mutants`` (minutes, not part of CI)."""
import collections
import dataclasses
import re
from pathlib import Path

import pytest

from sim import mutants as M

ROOT = M.PROJECT_ROOT


def test_every_anchor_occurs_exactly_once_and_the_mutant_compiles():
    problems = [f"{m.file}: {m.description}: {M.anchor_problem(m)}" for m in M.MUTANTS if M.anchor_problem(m)]
    assert not problems, "\n".join(problems)


def test_the_list_covers_every_kind_and_names_real_checks():
    kinds = collections.Counter(m.kind for m in M.MUTANTS)
    assert set(kinds) == set(M.KINDS)
    assert kinds["host"] >= 18 and kinds["hdl"] >= 12 and kinds["compiler"] >= 8
    broken = [m for m in M.MUTANTS if not m.equivalent]
    assert len(broken) >= 38
    assert len({m.description for m in M.MUTANTS}) == len(M.MUTANTS), "two mutants share a description"
    assert len({(m.file, m.anchor, m.replacement) for m in M.MUTANTS}) == len(M.MUTANTS)
    for m in M.MUTANTS:
        assert m.checks, m.description
        if m.kind == "hdl":
            # hardware mutants are in the Amaranth blocks, never in the golden model or the ISA
            assert m.file.startswith("hdl/") and m.file not in ("hdl/arith.py", "hdl/isa.py"), m.file
        for check in m.checks:
            path, _, node = check.partition("::")
            assert (ROOT / path).is_file(), f"{m.description}: no test file {path}"
            if node:
                name = node.split("[")[0]
                assert re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), \
                    f"{m.description}: {path} has no test {name}"


def _one(kind, file):
    found = [m for m in M.MUTANTS if m.kind == kind and m.file == file and not m.equivalent]
    assert found, (kind, file)
    return found[0]


# The cheapest mutant of each kind (a few seconds each): a leaking page table, relu at -1 in the
# requantizer block, and the softmax pin of the compiler.
@pytest.mark.parametrize("mutant", [
    _one("host", "host/pagetable.py"),
    [m for m in M.MUTANTS if m.kind == "hdl" and "relu clamps" in m.description][0],
    [m for m in M.MUTANTS if m.kind == "compiler" and "softmax input" in m.description][0],
], ids=["host", "hdl", "compiler"])
def test_one_mutant_of_each_kind_is_caught(mutant):
    verdict, detail, _ = M.run_mutant(mutant, timeout=120)
    assert verdict == "caught", detail
    named = detail.removeprefix("by ")
    assert any(named.startswith(c.split("::")[0]) for c in mutant.checks), detail


def test_work_tree_is_never_modified():
    m = _one("host", "host/pagetable.py")
    before = (ROOT / m.file).read_text()
    M.mutated_source(m)
    assert (ROOT / m.file).read_text() == before


def test_a_harmless_change_is_reported_as_surviving_or_equivalent():
    # A docstring edit changes no behaviour: the machinery must say SURVIVED (or EQUIVALENT when argued).
    harmless = M.Mutant("host", "host/window.py", "Tokens attended at step L", "Tokens seen at step L",
                        "a docstring word", ("tests/test_window.py::test_window_bound_values",))
    verdict, detail, _ = M.run_mutant(harmless, timeout=120)
    assert verdict == "SURVIVED", detail
    argued = dataclasses.replace(harmless, equivalent="only a docstring changes")
    assert M.run_mutant(argued, timeout=120)[:2] == ("EQUIVALENT", "because only a docstring changes")


@pytest.mark.parametrize("anchor, replacement, checks, words", [
    ("no such text anywhere", "x", ("tests/test_window.py",), "occurs 0 times"),
    ("    check_window(W)", "    pass", ("tests/test_window.py",), "occurs 3 times"),
    ("return L if W is None else min(L, W)", "return L if W is None else min(L, W", ("tests/test_window.py",),
     "does not compile"),
    ("Tokens attended at step L", "Tokens seen at step L", ("tests/test_window.py::test_no_such_test",),
     "pytest did not run the checks"),
])
def test_broken_mutants_are_reported_as_broken(anchor, replacement, checks, words):
    bad = M.Mutant("host", "host/window.py", anchor, replacement, "broken on purpose", checks)
    verdict, detail, _ = M.run_mutant(bad, timeout=120)
    assert verdict == "BROKEN" and words in detail, detail


def test_checks_that_run_too_long_count_as_a_timeout(tmp_path):
    copy = M.copy_project(tmp_path / "p")
    assert not (copy / ".git").exists() and not (copy / "build").exists()
    out = M.run_checks(copy, ["tests/test_window.py"], timeout=0.2)
    assert out.status == "timeout"


def test_first_failure_is_parsed_from_pytest_output():
    out = "....F\n=== short test summary info ===\nFAILED tests/test_x.py::test_y[3-a] - assert 1 == 2\n"
    assert M._first_failure(out) == "tests/test_x.py::test_y[3-a]"
    assert M._first_failure("ERROR tests/test_z.py - ImportError: boom\n") == "tests/test_z.py"
    assert M._first_failure("all good\n") is None


def test_list_option_and_bad_arguments(capsys):
    assert M.main(["--list", "--only", "compiler"]) == 0
    out = capsys.readouterr().out
    assert out.count("\ncompiler ") + out.startswith("compiler ") == sum(m.kind == "compiler" for m in M.MUTANTS)
    assert "argued equivalent" in out and "host/" not in out
    with pytest.raises(SystemExit) as e:
        M.main(["--jobs", "0"])
    assert e.value.code == 2
    assert "--jobs must be >= 1, got 0" in capsys.readouterr().err


def test_a_failing_unmutated_project_stops_the_run(monkeypatch, capsys):
    monkeypatch.setattr(M, "baseline", lambda *a, **k: M.Outcome("failed", "tests/test_a.py::test_b", 1.0, "tail"))
    monkeypatch.setattr(M, "run_mutant", lambda *a, **k: pytest.fail("no mutant may run after a failed baseline"))
    assert M.main(["--only", "host"]) == 1
    assert "the unmutated project does not pass the checks (failed, first failure tests/test_a.py::test_b)" \
        in capsys.readouterr().out


def test_no_check_starts_after_an_interrupt(tmp_path):
    M._stop_all()
    try:
        with pytest.raises(M.Interrupted):
            M.run_checks(tmp_path, ["tests/test_window.py"], timeout=30)
    finally:
        M._stopping.clear()


def test_checks_import_the_copy_not_the_work_tree(tmp_path):
    # Also under an editable install (CI): the copy's packages must shadow the installed ones.
    copy = M.copy_project(tmp_path / "p")
    (copy / "tests" / "test_where_from.py").write_text(
        "import os\n"
        "import compiler, hdl, host, sim\n\n\n"
        "def test_where_from():\n"
        "    root = os.path.realpath(os.environ['PYTHONPATH'])\n"
        "    for mod in (compiler, hdl, host, sim):\n"
        "        assert os.path.realpath(mod.__file__).startswith(root + os.sep), mod.__file__\n")
    out = M.run_checks(copy, ["tests/test_where_from.py"], timeout=120)
    assert out.status == "passed", out.tail
