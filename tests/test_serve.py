"""`python -m sim.serve` and `sim.decode --prompt` (issue 14): the JSON, replays alone, refusals, figures,
and `sim.bench --serve`'s targets."""
from __future__ import annotations

import io
import json

import pytest

from host.serving.results import summary
from host.serving.trace import make_trace
from sim import decode, ga2, serve


def _run(argv, capsys):
    status = ga2.main(argv)
    return status, capsys.readouterr().out


def test_json_fields_and_every_replay_cmd_reproduces_its_request(tmp_path, capsys):
    path = tmp_path / "s.json"
    status, out = _run(["serve", "--requests", "5", "--seed", "1", "--max-batch", "3", "--window", "4",
                        "--sinks", "1", "--pages", "8", "--prefix-share", "0.6", "--json", str(path)], capsys)
    assert status == 0, out
    assert "replays alone: 5 of 5 requests identical" in out
    doc = json.loads(path.read_text())
    for key in ("requests", "total_cycles", "tokens_generated", "tokens_per_mcycle", "peak_pages", "preemptions",
                "prefix_hit_rows", "prompt_rows_computed", "max_batch", "mode", "chip"):
        assert key in doc, key
    assert (doc["max_batch"], doc["mode"], doc["chip"]) == (3, "book", "book")
    assert doc["pages_owned_at_end"] == 0
    assert doc["tokens_generated"] == sum(len(r["tokens"]) for r in doc["requests"])
    for r in doc["requests"]:
        for key in ("id", "prompt", "tokens", "logits_int", "ttft_cycles", "finish_cycles", "preempted",
                    "replay_cmd"):
            assert key in r, key
    for r in doc["requests"][:2]:
        cmd = r["replay_cmd"]
        assert cmd[:3] == ["python", "-m", "sim.decode"]
        rp = tmp_path / f"r{r['id']}.json"
        assert decode.main(cmd[3:] + ["--quiet", "--json", str(rp)]) == 0
        alone = json.loads(rp.read_text())
        assert alone["tokens"][len(r["prompt"]):] == r["tokens"]
        assert alone["logits_int"] == r["logits_int"]
    capsys.readouterr()


def test_a_request_that_can_never_fit_is_refused_and_the_others_served(tmp_path, capsys):
    path = tmp_path / "s.json"
    status, out = _run(["serve", "--requests", "6", "--seed", "2", "--window", "none", "--pages", "5",
                        "--prompt-len", "2:30", "--gen-len", "8:30", "--json", str(path)], capsys)
    assert status == 0
    refused = [line for line in out.splitlines() if line.startswith("error: ")]
    doc = json.loads(path.read_text())
    ids = [r["id"] for r in doc["requests"] if "refused" in r]
    assert ids and len(refused) == len(ids)
    assert "can never fit" in refused[0] and "the pool has 5" in refused[0]
    assert doc["requests_finished"] == 6 - len(ids)
    assert f"replays alone: {6 - len(ids)} of {6 - len(ids)} requests identical" in out


def test_poisson_arrivals_are_served_and_timed_from_arrival(tmp_path, capsys):
    path = tmp_path / "p.json"
    status, out = _run(["serve", "--requests", "6", "--seed", "4", "--arrival", "poisson:0.3", "--max-batch", "2",
                        "--json", str(path)], capsys)
    assert status == 0 and "replays alone: 6 of 6 requests identical" in out
    doc = json.loads(path.read_text())
    arrivals = [r["arrival"] for r in doc["requests"]]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    for r in doc["requests"]:
        assert 0 < r["ttft_cycles"] <= r["finish_cycles"]
    assert [st["step"] for st in doc["steps"]] == sorted({st["step"] for st in doc["steps"]})


def test_resident_mode_serves_with_replays_identical(tmp_path, capsys):
    path = tmp_path / "r.json"
    status, out = _run(["serve", "--requests", "5", "--seed", "1", "--mode", "resident", "--chip", "fast",
                        "--max-batch", "3", "--json", str(path)], capsys)
    assert status == 0 and "replays alone: 5 of 5 requests identical" in out
    doc = json.loads(path.read_text())
    assert doc["mode"] == "resident" and doc["load_cycles"] > 0
    assert doc["cycles_per_token"] == round(doc["total_cycles"] / doc["tokens_generated"], 1)
    assert ga2.main(["serve", "--mode", "resident"]) == 2           # the book's chip has no GATHER
    assert "gather=1" in capsys.readouterr().err


def test_out_draws_throughput_and_pages(tmp_path, capsys):
    status, out = _run(["serve", "--requests", "3", "--seed", "1", "--out", str(tmp_path / "fig"), "--no-verify"],
                       capsys)
    assert status == 0
    for name in ("serve_throughput.png", "serve_pages.png"):
        assert (tmp_path / "fig" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, text", [
    (["decode", "--sinks", "2", "--window", "4", "--sim", "reference"], "--sinks 2 needs --prompt"),
    (["decode", "--prompt", "1,2", "--steps", "70", "--sim", "reference"], "the chip attends at most 64"),
    (["decode", "--prompt", "1,16"], "tokens 0..15"),
    (["serve", "--sinks", "2", "--window", "none"], "needs a window"),
    (["serve", "--chips", "2", "--trace", "t.json"], "--trace covers one chip's engine: not with --chips"),
    (["decode", "--temperature", "0.5"], "--stop and --temperature need --prompt"),
])
def test_bad_combinations_are_one_error_line(argv, text, capsys):
    assert ga2.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and text in err[0], err


def test_a_batch_larger_than_the_chip_takes_runs_as_smaller_batches(tmp_path, capsys):
    # 20 full rows at context 8 exceed the book chip's program ROM (20 cache-only rows do not): the engine
    # forms the largest batches that fit instead of refusing the trace (issue 21)
    path = tmp_path / "b.json"
    status, out = _run(["serve", "--requests", "20", "--max-batch", "20", "--window", "8", "--no-verify",
                        "--json", str(path)], capsys)
    assert status == 0, out
    doc = json.loads(path.read_text())
    assert doc["requests_finished"] == 20 and doc["pages_owned_at_end"] == 0
    assert max(st["rows"] for st in doc["steps"]) == 20


def test_a_token_budget_halves_the_p99_time_to_first_token_without_losing_throughput():
    # the default trace: one row per running request and step, against a budget of 16 rows a step (prefill
    # first, a prompt's cache-only rows at once); replays are compared in the engine's tests
    def run(extra):
        a = serve.build_parser().parse_args(["--no-verify"] + extra)
        res = serve.serve(a)
        res.pop("model")
        return summary(res)
    one, budget = run([]), run(["--max-batched-tokens", "16"])
    assert budget["ttft_p99_cycles"] * 2 <= one["ttft_p99_cycles"]
    assert budget["tokens_per_mcycle"] >= one["tokens_per_mcycle"]
    assert budget["tokens_generated"] == one["tokens_generated"] and budget["pages_owned_at_end"] == 0


def _program_cycles(ctxs):
    """Cycles of one batched program on the book chip: a row per context (0: a cache-only row)."""
    from host import tiny_lm as T
    from host.batch import BatchRunner
    from sim.backends.reference import ReferenceMachine
    m = T.make_model("structured", 1)
    rows = [(1, None, None) if c == 0 else (1, [[0.0] * T.D] * (c - 1), [[0.0] * T.D] * (c - 1)) for c in ctxs]
    return BatchRunner(m, ReferenceMachine()).run(rows)[1][0]


def test_every_budget_gives_the_last_first_token_at_the_prefill_bound(tmp_path, capsys):
    # the default trace's 24 requests all arrive at step 0, so its p99 TTFT is the last first token: no
    # scheduler gives it sooner than the prompt rows packed perfectly into programs of --max-batch (4) rows,
    # the cache-only rows four a program and the last prompt rows four a program (by context); a budget of 4
    # and one of 16 both reach that bound, with every replay identical and the same throughput
    from host.window import sink_context
    reqs = make_trace(24, 3)
    last = sorted((sink_context(len(r.prompt), 8) for r in reqs), reverse=True)
    cache = sum(len(r.prompt) - 1 for r in reqs)
    bound = sum(_program_cycles(last[i:i + 4]) for i in range(0, len(last), 4))
    bound += cache // 4 * _program_cycles((0,) * 4) + (cache % 4 and _program_cycles((0,) * (cache % 4)))
    got = {}
    for budget in (4, 16):
        path = tmp_path / f"b{budget}.json"
        status, out = _run(["serve", "--max-batched-tokens", str(budget), "--json", str(path)], capsys)
        assert status == 0 and "replays alone: 24 of 24 requests identical" in out, out
        got[budget] = doc = json.loads(path.read_text())
        assert doc["prefix_hit_rows"] == 0 and doc["prompt_rows_computed"] == cache + len(reqs)
        assert doc["ttft_p99_cycles"] == max(r["ttft_cycles"] for r in doc["requests"]) == bound
    assert got[16]["tokens_per_mcycle"] >= got[4]["tokens_per_mcycle"]
    assert got[16]["tokens_generated"] == got[4]["tokens_generated"]


def test_stop_tokens_are_served_and_replayed_with_them(tmp_path, capsys):
    path = tmp_path / "s.json"
    status, out = _run(["serve", "--requests", "6", "--seed", "1", "--stop", "0,13", "--max-batched-tokens", "6",
                        "--json", str(path)], capsys)
    assert status == 0 and "replays alone: 6 of 6 requests identical" in out, out
    doc = json.loads(path.read_text())
    stopped = [r for r in doc["requests"] if r["finish_reason"] == "stop"]
    assert stopped and all(r["tokens"][-1] in (0, 13) and len(r["tokens"]) <= r["gen"] for r in stopped)
    r = stopped[0]
    assert r["replay_cmd"][-2:] == ["--stop", "0,13"]
    rp = tmp_path / "r.json"
    assert decode.main(r["replay_cmd"][3:] + ["--quiet", "--json", str(rp)]) == 0
    assert json.loads(rp.read_text())["tokens"][len(r["prompt"]):] == r["tokens"]
    capsys.readouterr()


def test_priorities_with_stop_tokens_and_a_budget_are_served_with_every_replay_identical(tmp_path, capsys):
    path = tmp_path / "p.json"
    status, out = _run(["serve", "--requests", "10", "--policy", "priority", "--priorities", "3", "--stop", "0",
                        "--arrival", "poisson:0.5", "--max-batch", "2", "--pages", "10", "--max-batched-tokens", "4",
                        "--json", str(path)], capsys)
    assert status == 0 and "replays alone: 10 of 10 requests identical" in out, out
    doc = json.loads(path.read_text())
    assert {r.get("priority", 0) for r in doc["requests"]} == {0, 1, 2} and doc["pages_owned_at_end"] == 0
    # the priorities come from their own generator: the trace is otherwise the one without them
    plain = make_trace(10, 3, arrivals=("poisson", 0.5))
    assert [(r.prompt, r.gen, r.arrival) for r in plain] == [(r["prompt"], r["gen"], r["arrival"]) for r in doc["requests"]]


def test_sampling_with_n_samples_priorities_and_stop_tokens_replays_every_sample(tmp_path, capsys):
    # issue 21's command on a small trace with priorities; the random model, whose logits are close enough
    # for a temperature of 0.8 to draw different tokens
    path = tmp_path / "n.json"
    status, out = _run(["serve", "--requests", "6", "--model", "random", "--policy", "priority", "--priorities", "3",
                        "--stop", "0", "--temperature", "0.8", "--top-k", "4", "--n", "2", "--json", str(path)], capsys)
    assert status == 0 and "replays alone: 12 of 12 requests identical" in out, out
    doc = json.loads(path.read_text())
    pairs = {}
    for r in doc["requests"]:
        pairs.setdefault(r["id"], []).append(r["tokens"])
    assert sorted(r.get("sample") for r in doc["requests"]) == [0] * 6 + [1] * 6
    assert any(a != b for a, b in pairs.values())             # the samples of a prompt draw apart
    r = next(r for r in doc["requests"] if r["sample"] == 1 and len(r["tokens"]) > 1)
    assert r["replay_cmd"][-8:] == ["--temperature", "0.8", "--top-k", "4", "--sample-seed", str(r["id"]),
                                    "--sample", "1"]
    rp = tmp_path / "r.json"
    assert decode.main(r["replay_cmd"][3:] + ["--quiet", "--json", str(rp)]) == 0
    alone = json.loads(rp.read_text())
    assert (alone["tokens"][len(r["prompt"]):], alone["logits_int"]) == (r["tokens"], r["logits_int"])
    capsys.readouterr()


def test_bench_serve_meets_the_book_mode_targets(capsys):
    t = serve.serve_targets()
    capsys.readouterr()
    assert t["batch4_over_batch1"] >= 2.2
    assert t["memory_ratio"] >= 4
    assert t["prefix_row_cut"] >= 0.4
    rates = t["tokens_per_mcycle"]
    assert rates[1] < rates[2] < rates[4] < rates[8]


@pytest.mark.timeout(300)
def test_tokens_per_second_come_from_the_recorded_placement_of_that_chip(tmp_path, monkeypatch):
    """The batch-4 tokens per second are the placed Fmax of a report whose chip key is the chip's, over its
    cycles per token; a report of another chip, or of the board without the link, does not count."""
    import json

    from hdl.config import PRESETS
    fast = PRESETS["fast"]
    monkeypatch.setattr(serve, "PLACED_REPORTS", tmp_path)
    report = {"link": "uart:3000000", "chip": fast.key(), "fmax": {"clk": {"achieved_mhz": 30.0}}}
    (tmp_path / "fpga-fast.json").write_text(json.dumps(report))
    (tmp_path / "fpga-a-other.json").write_text(json.dumps({**report, "chip": "x", "fmax": {"c": {"achieved_mhz": 99}}}))
    (tmp_path / "fpga-b-nolink.json").write_text(json.dumps({**report, "link": None}))
    assert serve.placed_fmax_mhz(fast) == (30.0, "fpga-fast.json")
    out = io.StringIO()
    per = serve.resident_targets(None, out)
    line = out.getvalue().splitlines()[2]
    rate = 30e6 / per[4]
    verdict = "met" if rate >= serve.TOKENS_PER_SECOND_TARGET else "NOT met"
    assert f"placed Fmax 30.00 MHz (docs/figures/fpga-fast.json): {rate:,.0f} (target >= 62,500: {verdict})" in line


def test_bench_serve_resident_targets_run_the_given_gather_chip_else_fast():
    from dataclasses import replace

    from hdl.config import PRESETS, parse_chip
    out = io.StringIO()
    fast = serve.resident_targets(None, out)
    # another gather chip: fast with the book's one-bit-a-cycle division (SM 3n + 47, not 3n + 17)
    slow_div = replace(PRESETS["fast"], sm_div=1)
    given = serve.resident_targets(slow_div, out)
    # the book's chip has no GATHER/SCATTER: resident mode falls back to fast, as before
    assert serve.resident_targets(parse_chip("book"), io.StringIO()) == fast
    assert set(fast) == set(given) == set(serve.RESIDENT_TARGETS)
    assert given[4] > fast[4] and given[8] > fast[8]
    lines = out.getvalue().splitlines()
    assert len(lines) == 6
    # each chip's two cycle lines, then its tokens per second (no placement is recorded for slow_div)
    assert lines[5].startswith("tokens per second: no recorded place and route") and slow_div.spec() in lines[5]
    for line, (chip, batch) in zip(lines[0:2] + lines[3:5],
                                   [(PRESETS["fast"], 4), (PRESETS["fast"], 8), (slow_div, 4), (slow_div, 8)]):
        figure = (fast if chip == PRESETS["fast"] else given)[batch]
        assert f"--chip {chip.spec()} --max-batch {batch}, same trace: {figure:,.1f} chip cycles" in line
        for goal in serve.RESIDENT_TARGETS[batch]:
            assert f"<= {goal:,}: {'met' if figure <= goal else 'NOT met'}" in line
