"""`ga2 profile` (issue 23 part 1): the instruction classes add up to the five counters, the ideal under the
chip's own limits never passes a busy figure, the per-token figures follow from the runs' integers, and the
trace of the same run adds up to the same counters. On the reference machine, in seconds."""
from __future__ import annotations

import copy
import json

import pytest

from hdl.config import BOOK, PRESETS
from hdl.isa import COUNTER_INDEX, busy_cycles, ideal_cycles
from sim import decode, ga2, profile
from sim.perf import breakdown as B
from sim.timeline import STEPS_TID, check_against_counters

pytestmark = pytest.mark.timeout(180)

FAST = PRESETS["fast"]


def _profile(tmp_path, *argv, png=False, trace=True):
    paths = {"json": tmp_path / "P.json", "png": tmp_path / "R.png", "trace": tmp_path / "T.json"}
    args = [*argv, "--json", str(paths["json"])]
    if png:
        args += ["--png", str(paths["png"])]
    if trace:
        args += ["--trace", str(paths["trace"])]
    assert ga2.main(["profile", *args]) == 0
    doc = json.loads(paths["json"].read_text())
    tr = json.loads(paths["trace"].read_text()) if trace else None
    return doc, tr, paths


def _decode_counters(tmp_path, *argv):
    """The decode's own counters (ga2 decode --json on the reference): the load program's and each step's."""
    js = tmp_path / "decode.json"
    assert decode.main([*argv, "--sim", "reference", "--quiet", "--json", str(js)]) == 0
    d = json.loads(js.read_text())
    return d.get("load", {}).get("counters"), [r["counters"] for r in d["records"]]


def _classes_give(classes):
    """The five counters the class rows of a profile JSON give (the identity of sim.perf.breakdown)."""
    got = [sum(r["busy"] for r in classes), 0, 0, 0, 0]
    for r in classes:
        if r["class"] != B.FETCH_ISSUE:
            got[COUNTER_INDEX[r["counter"]]] += r["busy"]
            got[4] += r["count"]
    return got


def _ideal_within_busy(classes):
    for r in classes:
        assert r["ideal"] <= r["busy"], f"{r['class']}: ideal {r['ideal']} > busy {r['busy']}"
        assert r["gap"] == r["busy"] - r["ideal"]


def _trace_runs(tr):
    """The chip's runs of a trace: per run its step slice's five counters, in time order."""
    steps = sorted((e for e in tr["traceEvents"] if e["pid"] == 1 and e["ph"] == "X" and e["tid"] == STEPS_TID),
                   key=lambda e: e["ts"])
    return [[e["args"][k] for k in ("cyc_total", "cyc_mm", "cyc_dma", "cyc_vec", "n_inst")] for e in steps]


def _per_token_consistent(doc):
    """Every run's bounds and per-token figures follow from its integers, and the totals from the runs."""
    lim = doc["limits"]
    for r in doc["runs"]:
        assert r["cycles"] == r["counters"][0]
        assert r["rows_used"] == min(max(r["rows"], 1), lim["array"])
        assert r["mac_bound"] == r["macs"] / (r["rows_used"] * lim["array"])
        assert r["ext_bound"] == r["ext_words"] / lim["ext_port_words"]
    p = doc["per_token"]
    n = p["tokens"]
    assert p["cycles"] == sum(r["cycles"] for r in doc["runs"]) / n
    assert sum(r["cycles"] for r in doc["runs"]) == doc["counters"][0]
    for k in ("macs", "ext_words", "mac_bound", "ext_bound"):
        assert p[k] == sum(r[k] for r in doc["runs"]) / n, k
    assert p["ratio"] == p["cycles"] / max(p["mac_bound"], p["ext_bound"])
    assert p["bound"] == ("MAC" if p["mac_bound"] >= p["ext_bound"] else "EXT")
    # the classes' MACs and external words are the runs'
    assert sum(r["macs"] for r in doc["runs"]) == sum(c["macs"] for c in doc["classes"])
    assert sum(r["ext_words"] for r in doc["runs"]) == sum(c["ext_words"] for c in doc["classes"])


def test_acceptance_resident_fast(tmp_path, capsys):
    argv = ["--window", "4", "--mode", "resident", "--chip", "fast"]
    doc, tr, paths = _profile(tmp_path, *argv, png=True)
    out = capsys.readouterr().out
    load, steps = _decode_counters(tmp_path, *argv)
    summed = [sum(c[k] for c in steps) for k in range(5)]
    # the per-class cycles add up to the decode's own counters (the load program apart)
    assert doc["counters"] == summed
    assert _classes_give(doc["classes"]) == summed
    assert doc["load"]["counters"] == load and doc["load"]["runs"] == 1
    assert [r["counters"] for r in doc["runs"]] == steps
    assert {r["class"] for r in doc["classes"] if r["count"]} >= {"MM+rq", "RQC", "GATHER", "SCATTER", "SM"}
    _ideal_within_busy(doc["classes"])
    _per_token_consistent(doc)
    assert [r["per_token"]["cycles"] for r in doc["runs"]] == [c[0] for c in steps]      # one token a step
    # the trace of the same run: the load program, then the steps; every track adds up to its counters
    runs = _trace_runs(tr)
    assert runs == [load] + steps
    check_against_counters([e for e in tr["traceEvents"] if e["pid"] == 1], runs)
    assert "chip cycle" in tr["otherData"]["clock"]
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{summed[0]:,} cycles" in out and "checked with ==" in out and "per generated token" in out


def test_the_checks_fail_when_a_figure_is_off(tmp_path, monkeypatch):
    """On purpose: a class row whose ideal passes its busy figure, a class a cycle short, and an ideal formula
    that overshoots: each check says so."""
    doc, _, _ = _profile(tmp_path, "--window", "4", "--steps", "2", "--mode", "resident", "--chip", "fast",
                         trace=False)
    _ideal_within_busy(doc["classes"])
    bad = copy.deepcopy(doc["classes"])
    row = next(r for r in bad if r["class"] == "SM")
    row["ideal"] = row["busy"] + 1
    with pytest.raises(AssertionError, match="SM: ideal"):
        _ideal_within_busy(bad)
    rows = {r["class"]: B.ClassFigures(r["count"], r["busy"], r["ideal"], r["macs"], r["ext_words"])
            for r in doc["classes"]}
    B.check_breakdown(rows, doc["counters"])
    rows["GATHER"].busy -= 1
    with pytest.raises(B.ProfileMismatch, match="the classes give counters"):
        B.check_breakdown(rows, doc["counters"])
    rows["GATHER"].busy += 1
    rows["VADD"].ideal = rows["VADD"].busy + 1
    with pytest.raises(B.ProfileMismatch, match="VADD: ideal"):
        B.check_breakdown(rows, doc["counters"])
    monkeypatch.setattr(B, "ideal_cycles", lambda word, cfg: 10 ** 6)
    assert ga2.main(["profile", "--window", "4", "--steps", "1"]) == 2         # one error line, no traceback


def test_ideal_never_exceeds_busy_on_random_programs():
    """hdl.isa.ideal_cycles <= busy_cycles for every executed instruction of random programs (progen's mix,
    resident programs on the fast chip) at their own latency and at LAT 1."""
    from sim.backends.reference import ReferenceMachine
    from sim.verify.progen import fuzz_case
    for cfg in (BOOK, FAST):
        ref = ReferenceMachine(trace=True, check=False, config=cfg)     # as the fuzzer: junk in ignored bits
        seen = set()
        for index in range(24):
            case = fuzz_case(11, index, config=cfg)
            r = ref.run(case.program, case.image, case.lat,
                        **({} if case.scratchpad is None else {"scratchpad": case.scratchpad}))
            # an error stop: the failing GATHER/SCATTER moves fewer words than its fields say and the next
            # instruction acts as a HALT whatever its word (not a normal end; decodes and serving have none)
            trace = r.trace if r.error is None else [e for e in r.trace if e.pc < r.error.pc]
            for e in trace:
                word = case.program[e.pc] if e.pc < len(case.program) else 0
                cls = B.instr_class(word, cfg)
                seen.add(cls)
                assert ideal_cycles(word, cfg) <= e.busy, (cfg.spec(), index, e.pc)
                assert ideal_cycles(word, cfg) <= busy_cycles(word, 1, cfg)
        assert {"MM", "LD", "ST", "RQ", "SM", "VADD", "AMAX", "UNPACK"} <= seen, seen
        if cfg.gather:
            assert {"GATHER", "SCATTER", "MM+rq", "RQC"} <= seen, seen


def test_book_mode_decode_profile(tmp_path, capsys):
    argv = ["--window", "4", "--steps", "6"]
    doc, tr, _ = _profile(tmp_path, *argv)
    load, steps = _decode_counters(tmp_path, *argv)
    assert load is None and doc["load"]["runs"] == 0
    assert doc["counters"] == [sum(c[k] for c in steps) for k in range(5)] == _classes_give(doc["classes"])
    used = {r["class"] for r in doc["classes"] if r["count"]}
    assert "MM" in used and not used & {"MM+rq", "RQC", "GATHER", "SCATTER"}     # the book's chip
    _ideal_within_busy(doc["classes"])
    _per_token_consistent(doc)
    assert _trace_runs(tr) == steps
    assert doc["chip"] == "book" and doc["per_token"]["tokens"] == 6


def test_prefetch_chip_profile(tmp_path):
    """On a prefetch chip (docs/prefetch.md) an instruction read ahead costs the sequencer no cycle: fetch/issue
    is hdl.isa.seq_cycles, 2 a run (its first instruction), and the classes still add up to the counters."""
    argv = ["--window", "4", "--steps", "3", "--mode", "resident", "--chip", "fast,prefetch=1"]
    doc, tr, _ = _profile(tmp_path, *argv)
    load, steps = _decode_counters(tmp_path, *argv)
    assert doc["counters"] == [sum(c[k] for c in steps) for k in range(5)] == _classes_give(doc["classes"])
    fi = next(r for r in doc["classes"] if r["class"] == B.FETCH_ISSUE)
    assert fi["busy"] == 2 * len(steps) and fi["count"] == doc["counters"][4] + len(steps)    # + the HALTs
    assert _trace_runs(tr) == [load] + steps
    _per_token_consistent(doc)


def test_serving_profile(tmp_path, capsys):
    argv = ["--serve", "--requests", "5", "--seed", "3", "--mode", "resident", "--chip", "fast"]
    doc, tr, _ = _profile(tmp_path, *argv)
    s = doc["serve"]
    assert doc["counters"][0] == s["total_cycles"]          # the engine's cycles, the load program apart
    assert _classes_give(doc["classes"]) == doc["counters"]
    _ideal_within_busy(doc["classes"])
    _per_token_consistent(doc)
    assert doc["per_token"]["tokens"] == s["tokens_generated"]
    assert max(r["rows"] for r in doc["runs"]) > 1          # batched programs: more array rows than one
    runs = _trace_runs(tr)
    assert runs[doc["load"]["runs"]:] == [r["counters"] for r in doc["runs"]]
    assert any(e["pid"] == 2 for e in tr["traceEvents"])   # the engine's process
    out = capsys.readouterr().out
    assert f"{doc['per_token']['cycles']:,.1f} cycles" in out


BAD = [
    (["--window", "0"], "--window"),
    (["--mode", "resident"], "gather=1"),
    (["--steps", "70"], "context"),
    (["--json", "same.json", "--png", "same.json"], "different files"),
    (["--serve", "--sim", "verilator"], "--sim verilator"),
    (["--serve", "--chips", "2"], "--chips 2"),
    (["--serve", "--no-verify"], "--no-verify is ga2 serve's option"),
    (["--serve", "--baud", "9600"], "--baud 9600"),
    (["--serve", "--requests", "0"], "--requests"),
    (["--serve", "--mode", "resident"], "gather=1"),
]


@pytest.mark.parametrize("argv,says", BAD)
def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    assert ga2.main(["profile", *argv]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], cap.err
    assert cap.out == "" and list(tmp_path.iterdir()) == []


def test_help_explains_both_forms(capsys):
    assert ga2.main(["profile", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())        # the help is wrapped to the terminal
    for word in ("--serve", "--window", "--png", "--trace", "ideal", "fetch/issue", "MAC bound"):
        assert word in text, word
    assert ga2.main(["profile", "--serve", "--help"]) == 0
    text = capsys.readouterr().out
    for word in ("--max-batch", "--requests", "--png", "--trace", "--json"):
        assert word in text, word
    assert "--chips" not in text and "--port" not in text       # ga2 serve's options a profile refuses
    assert "profile" in ga2.usage()
    assert profile.build_parser().prog.endswith("profile")
