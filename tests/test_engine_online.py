"""The engine's online API (issue 22 part 1): `Engine.submit` while it runs, `Engine.step` one step at a time,
the tokens and finishes each step reports, `Engine.abort` between steps; `Engine.run` is the same loop.
Reference machine, small traces: seconds."""
from __future__ import annotations

import random

import pytest

from host import tiny_lm as T
from host.batch import BatchRunner
from host.engine import Engine, EngineError, FinishEvent, Request, check_invariants, decode_alone
from sim.backends.reference import ReferenceMachine

M = T.make_model("structured", 1)


def _drain(e, reports, limit=500):
    for _ in range(limit):
        if not e.busy:
            return
        reports.append(e.step())
    raise AssertionError(f"the engine was still busy after {limit} steps")


@pytest.mark.timeout(120)
def test_requests_submitted_while_it_runs_stream_their_tokens_and_equal_their_replays():
    gen = random.Random(5)
    e = Engine(M, ReferenceMachine(), max_batch=3, window=6, page=2, n_pages=24)
    e.start(retain=False)
    reqs = [Request(i, [gen.randrange(16) for _ in range(gen.randint(1, 7))], gen.randint(1, 6),
                    stop=(9,) if i % 3 == 0 else (), temperature=0.7 if i % 4 == 1 else 0.0, top_k=3, seed=i,
                    n=2 if i == 5 else 1) for i in range(10)]
    reports, arrived = [], {}
    for r in reqs:                           # one arrival every step, into a running batch
        arrived[r.id] = e.clock
        assert e.submit(r) == []
        reports.append(e.step())
    _drain(e, reports)
    assert e.done == [] and e.trace == []    # retain=False keeps nothing once reported
    streamed, ends = {}, {}
    for rep in reports:
        for t in rep.tokens:
            streamed.setdefault((t.id, t.sample), []).append((t.index, t.token, t.cycles))
        for f in rep.finished:
            assert (f.id, f.sample) not in ends
            ends[f.id, f.sample] = f
    assert sorted(ends) == sorted((r.id, j) for r in reqs for j in range(r.n))
    runner = BatchRunner(M, ReferenceMachine())
    for r in reqs:
        for j in range(r.n):
            got, f = streamed[r.id, j], ends[r.id, j]
            assert [i for i, _, _ in got] == list(range(len(got)))
            assert [t for _, t, _ in got] == f.result["tokens"]
            cycles = [c for _, _, c in got]
            assert cycles == sorted(cycles) and cycles[0] - arrived[r.id] == f.result["ttft_cycles"]
            toks, logits, _ = decode_alone(M, r.prompt, r.gen, None, 6, runner=runner, stop=r.stop,
                                           temperature=r.temperature, top_k=r.top_k, seed=r.seed, sample=j)
            assert (toks, logits) == (f.result["tokens"], f.result["logits_int"])
            assert f.reason == ("stop" if toks[-1] in r.stop else "length")
    assert sum(rep.cycles for rep in reports) == e.clock
    assert e.owned() == 0


@pytest.mark.timeout(120)
def test_run_is_the_loop_of_submit_and_step():
    reqs = [Request(i, [(3 * i + k) % 16 for k in range(2 + i % 5)], 2 + i % 4, arrival=i // 3) for i in range(9)]
    a = Engine(M, ReferenceMachine(), max_batch=2, window=4, page=2, n_pages=10).run(reqs)
    e = Engine(M, ReferenceMachine(), max_batch=2, window=4, page=2, n_pages=10)
    e.start()
    results, todo = {}, list(reqs)
    while todo or e.busy:
        while todo and todo[0].arrival <= e.step_no:
            assert e.submit(todo.pop(0)) == []
        rep = e.step()
        results.update({(f.id, f.sample): f.result for f in rep.finished})
        if not rep.ran:
            e.step_no = todo[0].arrival
    assert [d for _, d in sorted(results.items())] == a["requests"]
    assert e.clock == a["total_cycles"] and e.trace == a["steps"]


@pytest.mark.timeout(60)
def test_an_abort_between_steps_returns_its_pages_at_once():
    e = Engine(M, ReferenceMachine(), max_batch=2, window=None, page=2, n_pages=32)
    e.start(retain=False)
    assert e.submit(Request(0, [3, 1, 4, 1], 40)) == [] and e.submit(Request(1, [5], 3)) == []
    tokens = []
    for _ in range(6):
        tokens += [t.token for t in e.step().tokens if t.id == 0]
    held = e.pt.held(0)
    assert held >= 2 and e.owned() >= held
    before = e.owned()
    e.abort(0)
    rep = e.step()
    ends = {f.id: f for f in rep.finished}
    assert ends[0].reason == "abort" and ends[0].result["tokens"] == tokens
    assert 0 not in e.pt.requests() and e.owned() <= before - held + 2    # request 1's row may take a page
    check_invariants(e)
    rep = []
    _drain(e, rep)
    assert e.owned() == 0 and e.cancel == set()


@pytest.mark.timeout(60)
def test_submit_refuses_at_once_what_could_never_fit_and_a_duplicate_id():
    e = Engine(M, ReferenceMachine(), max_batch=2, window=None, page=2, n_pages=64)
    e.start(retain=False)
    (f,) = e.submit(Request(7, [1] * 60, 10))
    assert isinstance(f, FinishEvent) and f.reason == "refused" and "attends at most" in f.result["refused"]
    assert not e.busy and e.done == []
    out = e.submit(Request(8, [1, 2], 2, n=3, temperature=0.5))
    assert [g.sample for g in out] == [0, 1, 2] and "samples" in out[0].result["refused"]
    assert e.submit(Request(9, [1, 2], 2)) == []
    with pytest.raises(EngineError, match="already being served"):
        e.submit(Request(9, [4], 2))
    _drain(e, [])
    assert e.submit(Request(9, [4], 2)) == []          # an id may come back once its request has ended
