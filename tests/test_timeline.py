"""`ga2 decode --trace`: the timeline (sim/timeline.py, issue 23 part 2) loads as JSON with the fields Perfetto
needs, and per step its tracks add up to the chip's five counters."""
from __future__ import annotations

import copy
import json

import pytest

from hdl.config import parse_chip
from hdl.isa import seq_cycles
from sim import decode
from sim.timeline import SEQ_TID, STEPS_TID, TimelineMismatch, check_against_counters

pytestmark = pytest.mark.timeout(120)


def _run(tmp_path, *extra):
    path = tmp_path / "t.json"
    js = tmp_path / "d.json"
    assert decode.main(["--window", "4", "--sim", "reference", "--quiet", "--trace", str(path),
                        "--json", str(js), *extra]) == 0
    return json.loads(path.read_text()), json.loads(js.read_text())


def _sums_by_track(events, run):
    """cycles per track name for run `run`: the units' WAIT slices, the sequencer split HALT / not."""
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    out = {}
    for e in events:
        if e["ph"] == "X" and e["args"]["run"] == run and e["tid"] != STEPS_TID:
            key = names[e["tid"]]
            if e["tid"] == SEQ_TID:
                key = "sequencer HALT" if e["args"]["op"] == "HALT" else "sequencer"
            out[key] = out.get(key, 0) + e["dur"]
    return out


MM, DMA, VEC = ("MM", "RQC"), ("LD", "ST", "GATHER", "SCATTER"), ("RQ", "SM", "VADD", "AMAX", "UNPACK")


def _check_doc(doc, step_counters):
    """What the test asks of a timeline: fields Perfetto needs, the clock stated, tracks = counters."""
    ev = doc["traceEvents"]
    assert "chip cycle" in doc["otherData"]["clock"]
    for e in ev:
        for f in ("name", "ph", "ts", "pid", "tid"):
            assert f in e, (f, e)
        assert isinstance(e["ts"], (int, float)) and not isinstance(e["ts"], bool)
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
    cfg = parse_chip(doc["otherData"]["chip"])
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"steps", "sequencer", "MM", "LD", "ST", "RQ", "SM", "VADD", "AMAX"} <= names
    steps = sorted((e for e in ev if e["ph"] == "X" and e["tid"] == STEPS_TID), key=lambda e: e["ts"])
    assert len(steps) == len(step_counters)
    t = 0
    for i, (s, c) in enumerate(zip(steps, step_counters)):
        assert s["ts"] == t and s["dur"] == c[0], "the steps lie one after another"
        t += c[0]
        got = _sums_by_track(ev, s["args"]["run"])
        mm = sum(got.get(k, 0) for k in MM)
        dma = sum(got.get(k, 0) for k in DMA)
        vec = sum(got.get(k, 0) for k in VEC)
        assert [mm, dma, vec] == c[1:4], (i, got, c)
        # the sequencer's own cycles (hdl.isa.seq_cycles): 2 an instruction on the book's chip, the first
        # one's only on a prefetch chip (docs/prefetch.md), whose HALT is read ahead
        assert got.get("sequencer", 0) == sum(seq_cycles(k, cfg) for k in range(c[4]))
        assert got.get("sequencer HALT", 0) == seq_cycles(c[4], cfg)
        assert sum(got.values()) == c[0]
        # each slice sits inside its step
        for e in ev:
            if e["ph"] == "X" and e["args"]["run"] == s["args"]["run"]:
                assert s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"]


def test_book_chip_timeline(tmp_path):
    doc, result = _run(tmp_path, "--steps", "3")
    counters = [r["counters"] for r in result["records"]]
    _check_doc(doc, counters)
    mm = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "MM"]
    assert mm and {"M", "K", "N", "dst", "pc"} <= set(mm[0]["args"])
    assert "rq" not in mm[0]["args"]            # the book's MM reads no rq bit


def test_fast_resident_timeline(tmp_path):
    doc, result = _run(tmp_path, "--steps", "2", "--chip", "fast", "--mode", "resident")
    counters = [result["load"]["counters"]] + [r["counters"] for r in result["records"]]
    _check_doc(doc, counters)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"GATHER", "SCATTER", "RQC"} <= names
    assert any(e["name"] == "GATHER" for e in doc["traceEvents"] if e["ph"] == "X")


def test_the_check_fails_when_a_track_is_off(tmp_path):
    """On purpose: one unit slice a cycle short, then one instruction dropped; both checks say so."""
    doc, result = _run(tmp_path, "--steps", "2")
    counters = [r["counters"] for r in result["records"]]
    check_against_counters(doc["traceEvents"], counters)
    bad = copy.deepcopy(doc)
    mm = next(e for e in bad["traceEvents"] if e["ph"] == "X" and e["name"] == "MM")
    mm["dur"] -= 1
    with pytest.raises(TimelineMismatch, match="run 0"):
        check_against_counters(bad["traceEvents"], counters)
    with pytest.raises(AssertionError):
        _check_doc(bad, counters)
    dropped = copy.deepcopy(doc)
    i = next(i for i, e in enumerate(dropped["traceEvents"]) if e["ph"] == "X" and e["name"] == "issue")
    del dropped["traceEvents"][i]
    with pytest.raises(TimelineMismatch):
        check_against_counters(dropped["traceEvents"], counters)


def test_trace_refuses_a_bad_path_and_prompt(tmp_path, capsys):
    with pytest.raises(SystemExit):
        decode.build_parser().parse_args(["--trace", str(tmp_path / "no" / "t.json")])
    assert "does not exist" in capsys.readouterr().err
    a = decode.build_parser().parse_args(["--prompt", "1,2", "--trace", str(tmp_path / "t.json")])
    with pytest.raises(decode.UsageError, match="--trace"):
        decode.check_args(a)
    assert "reference machine" in decode.build_parser().format_help()


# ---- ga2 serve --trace: the chip's runs and the engine's process in one file ----------------------------

def test_serve_trace(tmp_path, capsys):
    from sim import serve
    from sim.timeline import ENGINE_PID, check_request_tracks
    path, js = tmp_path / "s.json", tmp_path / "r.json"
    assert serve.main(["--requests", "4", "--seed", "3", "--window", "8", "--sim", "reference", "--trace",
                       str(path), "--json", str(js)]) == 0
    assert "4 of 4 requests identical" in capsys.readouterr().out      # the replays still verified
    doc, res = json.loads(path.read_text()), json.loads(js.read_text())
    ev = doc["traceEvents"]
    chip = [e for e in ev if e["pid"] == 1]
    steps = sorted((e for e in chip if e["ph"] == "X" and e["tid"] == STEPS_TID), key=lambda e: e["ts"])
    counters = [[e["args"][k] for k in ("cyc_total", "cyc_mm", "cyc_dma", "cyc_vec", "n_inst")] for e in steps]
    _check_doc({"traceEvents": chip, "otherData": doc["otherData"]}, counters)
    check_against_counters(chip, counters)
    assert sum(c[0] for c in counters) == res["total_cycles"]
    eng = [e for e in ev if e["pid"] == ENGINE_PID]
    assert {"name": "process_name", "ph": "M", "ts": 0, "pid": 2, "tid": 0, "args": {"name": "engine"}} in eng
    names = {e["tid"]: e["args"]["name"] for e in eng if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(v for v in names.values() if v.startswith("request ")) == [f"request {i}" for i in range(4)]
    esteps = [e for e in eng if e["ph"] == "X" and e["tid"] == STEPS_TID]
    assert len(esteps) == res["engine_steps"] == len(steps)
    assert [e["args"]["rows"] for e in esteps] == [s["rows"] for s in res["steps"]]
    assert [(e["ts"], e["dur"]) for e in esteps] == [(s["ts"], s["dur"]) for s in steps]
    for tid, name in names.items():
        if tid == STEPS_TID:
            continue
        mine = sorted((e for e in eng if e["ph"] == "X" and e["tid"] == tid), key=lambda e: e["ts"])
        assert {e["name"] for e in mine} >= {"prefill", "decode"}
        for x, y in zip(mine, mine[1:]):
            assert x["ts"] + x["dur"] <= y["ts"], (name, x, y)
        kinds = [e["name"] for e in mine if e["name"] in ("prefill", "decode")]
        assert kinds == sorted(kinds, key=lambda k: k == "decode"), "prefill before decode"
    check_request_tracks(ev)
    # on purpose: a request's decode slice pulled back over its prefill: the check says so
    bad = copy.deepcopy(ev)
    d = next(e for e in bad if e["pid"] == ENGINE_PID and e["ph"] == "X" and e["name"] == "decode")
    d["ts"] -= 1
    with pytest.raises(TimelineMismatch, match="overlaps"):
        check_request_tracks(bad)


def test_serve_trace_refusals(tmp_path, capsys):
    from sim import serve
    with pytest.raises(SystemExit):
        serve.build_parser().parse_args(["--trace", str(tmp_path / "no" / "t.json")])
    assert "does not exist" in capsys.readouterr().err
    a = serve.build_parser().parse_args(["--chips", "2", "--trace", str(tmp_path / "t.json")])
    with pytest.raises(serve.UsageError, match="--trace"):
        serve.check_args(a)


def test_serve_trace_preempted_slices(tmp_path, capsys):
    """A pool too small for four requests of 13 rows: the two admitted last give way (preemption by recompute)
    and come back; each has one ``preempted`` slice from its preemption to its readmission, after its last
    rows and before its recomputed prompt rows, inside an engine step; the others have none."""
    from sim import serve
    from sim.timeline import ENGINE_PID, check_request_tracks
    path, js = tmp_path / "s.json", tmp_path / "r.json"
    assert serve.main(["--requests", "4", "--seed", "3", "--window", "none", "--page", "2", "--pages", "12",
                       "--prompt-len", "3:3", "--gen-len", "10:10", "--sim", "reference", "--trace", str(path),
                       "--json", str(js)]) == 0
    assert "4 of 4 requests identical" in capsys.readouterr().out
    doc, res = json.loads(path.read_text()), json.loads(js.read_text())
    ev = doc["traceEvents"]
    preempted = {r["id"]: r["preempted"] for r in res["requests"]}
    assert res["preemptions"] == sum(preempted.values()) > 0 and 0 in preempted.values()
    names = {e["tid"]: e["args"]["name"] for e in ev
             if e["pid"] == ENGINE_PID and e["ph"] == "M" and e["name"] == "thread_name"}
    steps = [e for e in ev if e["pid"] == ENGINE_PID and e["ph"] == "X" and e["tid"] == STEPS_TID]
    for tid, name in names.items():
        if tid == STEPS_TID:
            continue
        rid = int(name.split()[1])
        mine = sorted((e for e in ev if e["pid"] == ENGINE_PID and e["ph"] == "X" and e["tid"] == tid),
                      key=lambda e: e["ts"])
        gaps = [i for i, e in enumerate(mine) if e["name"] == "preempted"]
        assert len(gaps) == preempted[rid], (name, [e["name"] for e in mine])
        for i in gaps:
            p = mine[i]
            assert p["dur"] > 0 and p["args"]["request"] == str(rid)
            before, after = mine[i - 1], mine[i + 1]
            assert before["name"] in ("prefill", "decode") and before["ts"] + before["dur"] <= p["ts"]
            # readmitted: the cache was dropped, so its prompt rows are computed again
            assert after["name"] == "prefill" and after["ts"] >= p["ts"] + p["dur"]
            assert any(s["ts"] <= p["ts"] <= s["ts"] + s["dur"] for s in steps)
    check_request_tracks(ev)
    # on purpose: a preempted slice stretched over the recomputation that follows it: the check says so
    bad = copy.deepcopy(ev)
    p = next(e for e in bad if e["pid"] == ENGINE_PID and e["ph"] == "X" and e["name"] == "preempted")
    nxt = min((e for e in bad if e["pid"] == ENGINE_PID and e["ph"] == "X" and e["tid"] == p["tid"]
               and e["ts"] >= p["ts"] + p["dur"] and e is not p), key=lambda e: e["ts"])
    p["dur"] = nxt["ts"] - p["ts"] + 1
    with pytest.raises(TimelineMismatch, match="preempted"):
        check_request_tracks(bad)


# ---- ga2 bench --trace: the workload's programs, one after another ---------------------------------------

@pytest.mark.parametrize("mode", ["book", "resident"])
def test_bench_trace(tmp_path, capsys, mode):
    from sim import bench
    path = tmp_path / "b.json"
    argv = ["--sims", "reference", "--steps", "2", "--repeat", "1", "--mode", mode, "--trace", str(path)]
    assert bench.main(argv) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    doc = json.loads(path.read_text())
    from hdl.config import PRESETS
    chip = PRESETS["fast"] if mode == "resident" else None
    jobs = bench.resident_jobs(4, 2, 8, config=chip) if mode == "resident" else bench.decode_jobs(4, 2)
    from sim.backends.reference import ReferenceMachine
    ref = ReferenceMachine(config=chip) if chip is not None else ReferenceMachine()
    counters = [list(ref.run(j[0], j[1], j[2], **({"scratchpad": j[3]} if len(j) > 3 else {})).counters) for j in jobs]
    _check_doc(doc, counters)
    labels = [e["name"] for e in sorted((e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == STEPS_TID),
                                        key=lambda e: e["ts"])]
    assert labels[0] == ("load (weights)" if mode == "resident" else "job 0")
    assert "reference machine" in bench.build_parser().format_help()
    with pytest.raises(bench.UsageError, match="--serve"):
        bench.main(["--serve", "--trace", str(tmp_path / "x.json")])


# ---- the RTL's own timeline (--sim verilator) ------------------------------------------------------------

def test_fast_resident_timeline_from_the_rtl(tmp_path):
    """With --sim verilator the timeline is the Verilator model's own trace; it equals the reference's event
    for event, and says where it came from."""
    rtl, rtl_result = _run(tmp_path, "--steps", "2", "--chip", "fast", "--mode", "resident", "--sim", "verilator")
    ref, _ = _run(tmp_path, "--steps", "2", "--chip", "fast", "--mode", "resident")
    assert rtl["traceEvents"] == ref["traceEvents"]
    assert rtl["otherData"]["source"].startswith("the Verilator model: its own trace")
    assert "reference machine" in ref["otherData"]["source"] and "Verilator" not in ref["otherData"]["source"]
    counters = [rtl_result["load"]["counters"]] + [r["counters"] for r in rtl_result["records"]]
    _check_doc(rtl, counters)


def test_book_timeline_from_amaranth(tmp_path):
    """With --sim amaranth the timeline is the Amaranth simulation's own trace: equal to the reference's."""
    rtl, _ = _run(tmp_path, "--steps", "2", "--sim", "amaranth")
    ref, _ = _run(tmp_path, "--steps", "2")
    assert rtl["traceEvents"] == ref["traceEvents"]
    assert rtl["otherData"]["source"].startswith("Amaranth's simulation of the chip: its own trace")


def test_an_rtl_trace_that_differs_is_refused():
    """A simulator whose trace is not the reference machine's stops the timeline with the instruction named."""
    from sim.backends import TraceEntry
    from sim.backends.reference import ReferenceMachine
    from sim.timeline import TracingBackend

    class OffByOne:
        name = "verilator"
        trace = False

        def run(self, program, image, lat=8, scratchpad=None):
            r = ReferenceMachine(trace=True).run(program, image, lat)
            e = r.trace[1]
            r.trace[1] = TraceEntry(e.pc, e.fetch, e.issue, e.done + 1, e.seq)
            return r

    from hdl.config import BOOK
    from hdl.isa import halt, ld, st
    inner = OffByOne()
    tracer = TracingBackend(inner, BOOK)
    assert inner.trace is True                  # switched to its own trace
    with pytest.raises(TimelineMismatch, match=r"^run 0: the verilator trace differs from the reference machine's "
                                               r"at entry 1: expected TraceEntry\(pc=1, .*, got TraceEntry\(pc=1, "):
        tracer.run([ld(0, 0, 4).word, st(0, 8, 4).word, halt().word], [1, 2, 3, 4] + [0] * 2044)
