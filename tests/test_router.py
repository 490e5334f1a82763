"""The multi-chip router (`host.serving.router`) with chips here (no Ray): its choices, its time, its
failover, and the throughput of 2 chips against 1 on held-out trace seeds. The same router with Ray actors
(and an actor killed with ``ray.kill``) is in tests/test_cluster.py."""
import json

import pytest

from host import tiny_lm as T
from host.engine import Engine, Request
from host.serving.router import ChipLost, EngineChip, Router, RouterError, aggregate
from sim.backends.reference import ReferenceMachine

M = T.make_model("structured", 1)
SHARED = [1, 2, 3, 4, 5, 6, 7, 8]


def chip(max_batch=4, **kw):
    return EngineChip(Engine(M, ReferenceMachine(), max_batch=max_batch, window=8, **kw))


def served(reqs, chips=2, slots=4, **kw):
    router = Router([chip(slots) for _ in range(chips)], slots, **kw)
    return router, router.run(reqs)


def chip_of(res):
    return {r["id"]: r["chip"] for r in res["requests"]}


def test_load_counts_rows_still_to_compute_not_requests():
    """Request 0 (20 rows) goes to chip 0; 1 and 2 (3 rows each) both to chip 1, whose rows stay fewer:
    by request count 2 would go to chip 0 (one request each, the lower index)."""
    reqs = [Request(0, [1] * 5, 16), Request(1, [2, 3], 2), Request(2, [4, 5], 2)]
    _, res = served(reqs, order="arrival")
    assert chip_of(res) == {0: 0, 1: 1, 2: 1}


def test_prefix_keeps_a_prompt_on_the_chip_its_prefix_went_to_and_waits_for_it():
    """One slot per chip. 0 shares two whole pages with 2; 1 shares nothing. By prefix, 2 waits for chip 0
    although chip 1 (a short request) frees first; by load it takes chip 1. A prefix shorter than a page is
    no reason (request 3)."""
    reqs = [Request(0, SHARED + [9], 6), Request(1, [0, 0], 1), Request(2, SHARED + [10], 3),
            Request(3, SHARED[:3] + [11], 2)]
    _, by_prefix = served(reqs, slots=1, route="prefix", order="arrival")
    _, by_load = served(reqs, slots=1, route="load", order="arrival")
    assert chip_of(by_prefix)[2] == 0 and chip_of(by_load)[2] == 1
    assert by_prefix["chips"][0]["prefix_hit_rows"] >= 8          # the two pages were not computed again
    assert by_load["chips"][1]["prefix_hit_rows"] < 8             # at most request 3's partial page
    # request 3 shares 3 tokens (< a page of 4): it goes where load says, the same under both routes
    assert chip_of(by_prefix)[3] == chip_of(by_load)[3]


def test_longest_first_hands_out_the_most_rows_first():
    """One chip with one slot: by "longest" the 3 requests run longest first, by "arrival" in id order."""
    reqs = [Request(0, [1, 2], 2), Request(1, [3] * 6, 6), Request(2, [4] * 3, 3)]
    for order, first_to_last in (("longest", [1, 2, 0]), ("arrival", [0, 1, 2])):
        _, res = served(reqs, chips=1, slots=1, order=order)
        done = sorted(res["requests"], key=lambda r: r["finish_cycles"])
        assert [r["id"] for r in done] == first_to_last, order


def test_one_chip_in_arrival_order_is_the_engine_alone():
    """Through the router, one chip serving in arrival order is the engine's own run: the same requests to
    the integer and the cycle, and the same total (the router adds no time and changes no order)."""
    from host.serving.trace import make_trace
    reqs = make_trace(24, 5)
    alone = Engine(M, ReferenceMachine(), max_batch=4, window=8).run(reqs)
    _, res = served(reqs, chips=1, order="arrival")
    strip = [{k: v for k, v in r.items() if k != "chip"} for r in res["requests"]]
    assert strip == alone["requests"]
    assert res["chips"][0]["cycles"] == alone["total_cycles"]


def test_a_chip_killed_mid_trace_moves_its_requests_and_every_answer_is_as_without_the_kill():
    from host.serving.trace import make_trace
    reqs = make_trace(24, 5)
    _, whole = served(reqs)
    events = []
    router = Router([chip(), chip()], 4, kills=[(1, 6)], on_event=events.append)
    res = router.run(reqs)
    (f,) = res["failovers"]
    assert f["chip"] == 1 and f["after_steps"] == 6 and f["killed"] and f["running"] and f["moved"]
    assert res["chips"][1]["lost"].startswith("killed") and res["chips"][1]["steps"] == 6
    # each answered once, every token given once, in order; the moved ones recomputed on chip 0
    assert sorted(r["id"] for r in res["requests"]) == list(range(24))
    finishes = [e for e in events if e[0] == "finish"]
    assert sorted(e[1] for e in finishes) == list(range(24))
    for r in res["requests"]:
        given = [e[4] for e in events if e[0] == "token" and e[1] == r["id"]]
        assert given == r["tokens"]
    moved = [r for r in res["requests"] if "moved_from" in r]
    assert sorted(r["id"] for r in moved) == f["moved"] and all(r["chip"] == 0 for r in moved)
    assert res["recomputed_tokens"] > 0      # a running request had given tokens before the kill
    same = {r["id"]: (r["tokens"], r["logits_int"]) for r in whole["requests"]}
    assert {r["id"]: (r["tokens"], r["logits_int"]) for r in res["requests"]} == same
    # a moved request's time counts from its arrival, over the lost chip's cycles too
    for r in moved:
        assert r["finish_cycles"] > f["cycle"]


def test_a_kill_that_never_comes_is_reported():
    reqs = [Request(0, [1, 2], 2)]
    _, res = served(reqs, kills=[(1, 0)])
    assert res["failovers"] == [] and res["kills_not_reached"] == [(1, 0)]


class _Tampering(EngineChip):
    """Gives request `rid`'s first token wrong: the router must refuse it when it was given before."""

    def __init__(self, rid):
        super().__init__(Engine(M, ReferenceMachine(), max_batch=4, window=8))
        self.rid = rid

    def step(self):
        out = super().step()
        rep = out["report"]
        for i, t in enumerate(rep.tokens):
            if t.id == self.rid and t.index == 0:
                rep.tokens[i] = type(t)(t.id, t.sample, t.index, (t.token + 1) % 16, t.cycles)
        return out


def test_a_recomputed_token_that_differs_is_an_error():
    """Chip 0 gives request 1's first token wrong. In arrival order request 0 goes to chip 0 and request 1
    to chip 1 (fewer rows), which gives two of its tokens before it is killed; recomputed on chip 0, its
    first token differs from the one given: RouterError. Without the kill the run passes (chip 0 never
    computes request 1): the error is the failover's comparison."""
    reqs = [Request(0, [1, 2, 3], 8), Request(1, [4, 5], 6)]
    router = Router([_Tampering(1), chip()], 4, order="arrival", kills=[(1, 3)])
    with pytest.raises(RouterError, match="request 1: chip 0 recomputed token 0"):
        router.run(reqs)
    res = Router([_Tampering(1), chip()], 4, order="arrival").run(reqs)
    assert chip_of(res) == {0: 0, 1: 1} and res["failovers"] == []


def test_every_chip_lost_is_an_error_naming_the_requests():
    class Gone(EngineChip):
        def step(self):
            raise ChipLost("gone")
    router = Router([Gone(Engine(M, ReferenceMachine(), max_batch=4, window=8))], 4)
    with pytest.raises(RouterError, match=r"every chip is lost: requests \[0\]"):
        router.run([Request(0, [1, 2], 2)])


# ---- the command ----------------------------------------------------------------------------------------

def _serve(argv, tmp_path, name):
    from sim.serve import main
    out = tmp_path / f"{name}.txt"
    with open(out, "w") as f:
        status = main(argv + ["--json", str(tmp_path / f"{name}.json")], out=f)
    return status, out.read_text(), json.loads((tmp_path / f"{name}.json").read_text())


@pytest.mark.timeout(300)
def test_two_chips_give_at_least_1_9_times_one_chip_on_held_out_seeds(tmp_path):
    """Trace seeds 7-12 (32 requests, the default options; the router was tuned on seeds 1-6): 2 chips
    behind the router give at least 1.9 times the tokens per million cycles of one chip, on each seed,
    against one chip alone (`sim.serve` without --chips) and against one chip behind the same router."""
    from host.serving.results import summary
    from sim.serve import build_parser, serve
    from sim.serving.multichip import serve_chips
    for seed in range(7, 13):
        a = build_parser().parse_args(["--requests", "32", "--seed", str(seed), "--sim", "reference"])
        res = serve(a)
        res.pop("model")
        alone = summary(res)["tokens_per_mcycle"]
        one = aggregate(serve_chips(a, 1, "load", "longest"))
        two = aggregate(serve_chips(a, 2, "load", "longest"))
        assert two["tokens_generated"] == one["tokens_generated"] == summary(res)["tokens_generated"]
        assert two["tokens_per_mcycle"] >= 1.9 * alone, (seed, two["tokens_per_mcycle"], alone)
        assert two["tokens_per_mcycle"] >= 1.9 * one["tokens_per_mcycle"], (seed, two, one)


def test_the_command_kills_a_chip_and_answers_every_request_once_as_alone(tmp_path):
    status, text, doc = _serve(["--requests", "32", "--seed", "7", "--chips", "2", "--kill-chip", "1@8"],
                               tmp_path, "kill")
    assert status == 0, text
    assert "failover: chip 1 lost after 8 engine steps" in text and "killed by --kill-chip" in text
    assert "answers: 32 of 32 answered once each" in text
    assert "replays alone: 32 of 32 requests identical" in text
    assert doc["failovers"] == 1 and doc["moved_requests"] == len(doc["failover_events"][0]["moved"]) > 0
    assert sorted(r["id"] for r in doc["requests"]) == list(range(32))


@pytest.mark.parametrize("argv, says", [
    (["--chips", "2", "--kill-chip", "2@3"], "--kill-chip 2@3: there is no chip 2 among --chips 2"),
    (["--chips", "2", "--kill-chip", "0@3,1@5"], "--kill-chip kills 2 of 2 chips: at least one must be left"),
    (["--chips", "3", "--kill-chip", "1@3,1@5"], "--kill-chip: a chip is killed once"),
    (["--kill-chip", "0@3"], "--kill-chip kills 1 of 1 chips"),
    (["--chips", "2", "--kill-chip", "1"], "--kill-chip must be CHIP@STEP"),
    (["--order", "shortest"], "--order must be one of longest, arrival, got 'shortest'"),
])
def test_bad_chip_options_are_one_line(argv, says, capsys):
    from sim.cli import guarded
    from sim.serve import main
    assert guarded(main, ["--requests", "2", "--no-verify"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and len(err.splitlines()) == 1, err


# ---- the HTTP server through the router ------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_the_http_server_serves_through_the_router_and_a_lost_chip_loses_no_stream(tmp_path):
    """``ga2 serve --http --chips 2 --kill-chip 1@6`` (in-process, 127.0.0.1 on a free port): 16 concurrent
    streaming clients each get exactly the tokens of their replay alone, although chip 1 is lost while it
    runs some of them (they move to chip 0; the tokens it recomputes are not streamed again); the replay
    log has every request identical alone; the router keeps nothing once they are answered."""
    import asyncio

    import httpx
    from host.engine import decode_alone
    from test_http_server import MODEL, log_lines, running_server, sse_chunks

    async def one(client, url, i):
        prompt = [(i * 7 + k) % 16 for k in range(2 + i % 5)]
        gen = 3 + i % 6
        r = await client.post(url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": gen,
                                                              "stream": True}, timeout=60)
        assert r.status_code == 200, r.text
        chunks = sse_chunks(r.text.splitlines())
        got = [int(c["choices"][0]["text"], 16) for c in chunks if c["choices"] and c["choices"][0]["text"]]
        return prompt, gen, got

    async def clients(url):
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*[one(client, url, i) for i in range(16)])

    with running_server(["--chips", "2", "--window", "8", "--kill-chip", "1@6"], tmp_path) as (url, service, log):
        results = asyncio.run(clients(url))
        lines = log_lines(log, 16)
        router = service.engine.router
        (f,) = router.failovers
        assert f["chip"] == 1 and f["running"], f
        assert not router.jobs and not router.answers and not router.emitted
    for prompt, gen, got in results:
        assert got == decode_alone(M, prompt, gen, ReferenceMachine(), 8)[0], (prompt, gen)
    assert len(lines) == 16 and all(ch["identical"] for ln in lines for ch in ln["choices"])
