"""The serving engine at its edges (issue 21): one regression test per bug of the audit, and the tests of
each policy that no equality test could see (copy-on-write of a cached page, the prefix hash's parent,
window and sinks, the admission watermark, LRU order and refresh, the recompute self-check). Reference
machine, small traces: seconds in all."""
from __future__ import annotations

import time

import pytest

from host import tiny_lm as T
from host.batch import BatchRunner
from host.engine import Engine, EngineError, Request, _hash, check_invariants, decode_alone, kept_pages
from host.pagetable import PageTable
from sim.backends.reference import ReferenceMachine

M = T.make_model("structured", 1)
MR = T.make_model("random", 2)


def _equal_alone(m, res, W, S, config=None):
    runner = BatchRunner(m, ReferenceMachine()) if config is None else BatchRunner(m, ReferenceMachine(config=config),
                                                                                   config.lat, config)
    served = [r for r in res["requests"] if "refused" not in r]
    for r in served:
        toks, logits, _ = decode_alone(m, r["prompt"], r["gen"], None, W, S, runner=runner)
        assert (toks, logits) == (r["tokens"], r["logits_int"]), r["id"]
    return len(served)


def _hits(res):
    return {r["id"]: r["prefix_hit_rows"] for r in res["requests"]}


def _end_clean(e):
    assert e.pt.requests() == () and e.owned() == 0
    e.clear_cache()
    assert len(e.pt.free_pages()) == e.n_pages


# ---- part 1: the bugs ------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_window_one_keeps_the_partly_filled_page_the_next_row_goes_into():
    # W = 1: a row attends only itself, so no row is kept for the next step, but the page the next row is
    # written into is (it holds earlier rows too): the invariant allowed 0 pages and stopped the engine
    assert kept_pages(1, 1, 0, 2) == 1          # row 1 goes into page 0, beside row 0
    assert kept_pages(2, 1, 0, 2) == 0          # row 2 starts a new page
    assert kept_pages(5, 1, 1, 4) == 2          # the sink's page and page 1 (row 4 in it, row 5 next)
    assert kept_pages(4, 1, 1, 4) == 1
    reqs = [Request(0, [3, 1, 4], 3), Request(1, [5], 4), Request(2, [9, 2, 6, 5, 3], 2, 1)]
    for S in (0, 1):
        e = Engine(M, ReferenceMachine(), max_batch=3, window=1, sinks=S, page=2, n_pages=8)
        res = e.run(reqs)
        assert _equal_alone(M, res, 1, S) == 3
        _end_clean(e)


@pytest.mark.timeout(60)
def test_an_idle_engine_jumps_to_the_next_arrival():
    # a request arriving 10^12 steps later is served at once, with the times of a request alone
    reqs = [Request(0, [3, 1], 2, 0), Request(1, [4, 1], 2, 10 ** 12)]
    e = Engine(M, ReferenceMachine(), max_batch=2, window=4, page=2, n_pages=8)
    res = e.run(reqs)
    assert [s["step"] for s in res["steps"]] == [0, 1, 2, 10 ** 12, 10 ** 12 + 1, 10 ** 12 + 2]
    a, b = res["requests"]
    assert (a["ttft_cycles"], a["finish_cycles"]) == (b["ttft_cycles"], b["finish_cycles"])
    assert _equal_alone(M, res, 4, 0) == 2


@pytest.mark.timeout(60)
def test_the_invariants_on_a_pool_of_a_million_pages_cost_what_the_requests_touch():
    e = Engine(M, ReferenceMachine(), max_batch=2, window=4, page=1, n_pages=1 << 20)
    t0 = time.perf_counter()
    res = e.run([Request(0, [3, 1, 4], 3), Request(1, [5, 9], 4)])
    assert time.perf_counter() - t0 < 30             # quadratic in the pool: days
    assert _equal_alone(M, res, 4, 0) == 2
    assert e.owned() == 0


def _two_chains_and_a_stranger(page=2):
    P = [3, 1, 4, 1, 5, 9, 2]                   # three full pages of 2 rows and a last row
    Q = [8, 8, 0, 7, 6, 10, 12, 11]             # four full pages, nothing shared with P
    return P, Q


@pytest.mark.timeout(60)
def test_lru_evicts_the_tail_of_a_cached_chain_before_its_head():
    # A fills three cached pages; B needs one of them back; C repeats A's prompt. Evicting A's first page
    # (the oldest one filled) would leave two cached pages no lookup can reach and C with no hit at all;
    # evicting the tail leaves C the first two pages
    P, Q = _two_chains_and_a_stranger()
    reqs = [Request(0, P, 1, 0), Request(1, Q, 1, 10), Request(2, P, 1, 20)]
    e = Engine(M, ReferenceMachine(), max_batch=2, window=None, page=2, n_pages=6)
    res = e.run(reqs)
    assert _hits(res) == {0: 0, 1: 0, 2: 4}
    assert _equal_alone(M, res, None, 0) == 3
    _end_clean(e)


@pytest.mark.timeout(60)
def test_a_window_lets_go_of_a_chains_head_first_but_eviction_still_takes_its_tail():
    # with window 4, A's first pages leave its window (and are stamped) long before its last ones: least
    # recently used alone would evict A's head and strand the rest of the chain; eviction takes chain
    # leaves first, so B's pages come from A's tail and C still finds A's first two pages
    P, Q = [3, 1, 4, 1, 5, 9, 2, 6, 5], [8, 8, 0, 7, 6, 10, 12, 11, 13]
    e = Engine(M, ReferenceMachine(), max_batch=2, window=4, page=2, n_pages=7)
    res = e.run([Request(0, P, 1, 0), Request(1, Q, 1, 12), Request(2, P, 1, 24)])
    assert _hits(res) == {0: 0, 1: 0, 2: 4}
    assert _equal_alone(M, res, 4, 0) == 3
    _end_clean(e)


@pytest.mark.timeout(60)
def test_a_prefix_hit_refreshes_the_recency_of_the_pages_it_reuses():
    # A (prompt P) then B (prompt Q) are cached; C repeats P, so P's pages were used after Q's; D needs a
    # page: one of Q's goes, not one of P's, and E repeating P hits both of P's pages
    P, Q, R = [3, 1, 4, 1, 5], [8, 8, 0, 7, 6], [11, 13, 12, 2, 10]
    reqs = [Request(0, P, 1, 0), Request(1, Q, 1, 6), Request(2, P, 1, 12), Request(3, R, 1, 14),
            Request(4, P, 1, 20), Request(5, Q, 1, 26)]
    e = Engine(M, ReferenceMachine(), max_batch=2, window=None, page=2, n_pages=6)
    res = e.run(reqs)
    assert _hits(res) == {0: 0, 1: 0, 2: 4, 3: 0, 4: 4, 5: 2}
    assert _equal_alone(M, res, None, 0) == 6


@pytest.mark.timeout(60)
def test_a_second_run_keeps_the_recency_order_of_the_first():
    # the cache outlives Engine.run: pages cached by the first run are older than any of the second's,
    # although the second run counts its steps from 0 again
    P, Q, R = [3, 1, 4, 1, 5], [8, 8, 0, 7, 6], [11, 13, 12, 2, 10]
    e = Engine(M, ReferenceMachine(), max_batch=2, window=None, page=2, n_pages=6)
    first = e.run([Request(0, P, 1, 10)])
    assert _hits(first) == {0: 0}
    second = e.run([Request(1, Q, 1, 0), Request(2, R, 1, 6), Request(3, Q, 1, 12), Request(4, P, 1, 18)])
    # R's third page evicts P's tail (the oldest), not Q's head; Q is then found whole, P in part
    assert _hits(second) == {1: 0, 2: 0, 3: 4, 4: 2}
    assert _equal_alone(M, second, None, 0) == 4
    _end_clean(e)


LONG = [(7 * i + 3) % 16 for i in range(62)]


@pytest.mark.timeout(120)
def test_book_mode_serves_what_fits_instead_of_refusing_the_trace():
    # three rows at context 60 need more external memory than the book's chip has (8,483 words of 8,192 at
    # context 63): the engine refused the whole trace; it now runs the batches that fit (two rows at the
    # longest contexts) and serves every request
    reqs = [Request(i, LONG[i:i + 58] + [i], 2, 0) for i in range(3)]
    e = Engine(M, ReferenceMachine(), max_batch=3, window=None, page=4, n_pages=64)
    res = e.run(reqs)
    assert _equal_alone(M, res, None, 0) == 3
    assert [s["rows"] for s in res["steps"]] == [3] * 59 + [2, 1]
    _end_clean(e)


@pytest.mark.timeout(120)
def test_resident_batches_keep_their_block_tables_within_the_mailbox(monkeypatch):
    # a mailbox of 8 table words: four requests of up to 6 pages of 1 row can no longer all run together
    import host.batch_resident as HR
    from hdl.config import PRESETS
    fast = PRESETS["fast"]

    class Small(HR.ResidentBatchRunner):
        def __init__(self, *args, **kw):
            super().__init__(*args, **{**kw, "table_cap": 8})
    monkeypatch.setattr(HR, "ResidentBatchRunner", Small)
    reqs = [Request(i, [i, 3, 5], 3, 0) for i in range(4)] + [Request(4, [1] * 9, 2, 1)]
    e = Engine(M, ReferenceMachine(config=fast), config=fast, mode="resident", max_batch=4, window=None,
               page=1, n_pages=40)
    res = e.run(reqs)
    assert res["requests"][4]["refused"] == ("request 4 can never fit: its block table reaches 10 pages and "
                                             "the chip's mailbox holds 8")
    assert _equal_alone(M, res, None, 0, fast) == 4
    _end_clean(e)


# ---- part 2: the policies no equality test could see ------------------------------------------------------

def test_a_cached_page_held_by_one_request_is_copied_before_it_is_written():
    pt = PageTable(4, 2)
    pt.new("a")
    pt.append("a", "a0")
    pt.append("a", "a1")
    p = pt.table("a")[0]
    pt.retain(p)
    pt.release("a")
    pt.adopt("b", [p], 1)                       # b shares row 0 only; it is the page's one reference
    assert pt.refcount(p) == 1
    pt.append("b", "b1")
    assert pt.table("b")[0] != p and pt.rows("b", 0, 2) == ["a0", "b1"]
    pt.adopt("c", [p], 2)
    assert pt.rows("c", 0, 2) == ["a0", "a1"]


@pytest.mark.timeout(60)
def test_a_partial_prefix_hit_leaves_the_cached_page_intact():
    # B adopts rows 4..5 of A's cached page 1 (rows 4..7) and writes its row 6: into a copy. C, repeating
    # A's prompt later, adopts that page whole; had B written into it, C's rows 6 and 7 would be B's
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    reqs = [Request(0, prompt, 2, 0), Request(1, prompt[:6] + [0, 0], 2, 12), Request(2, prompt, 2, 24)]
    e = Engine(M, ReferenceMachine(), max_batch=1, window=None, page=4, n_pages=16)
    res = e.run(reqs)
    assert _hits(res) == {0: 0, 1: 6, 2: 8}
    assert _equal_alone(M, res, None, 0) == 3


def test_the_prefix_hash_names_the_parent_the_window_and_the_sinks():
    h = _hash("p", (1, 2), 4, 1)
    assert len({h, _hash("q", (1, 2), 4, 1), _hash("p", (1, 2), 6, 1), _hash("p", (1, 2), 4, 0),
                _hash("p", (1, 2), None, 1), _hash("p", (2, 1), 4, 1)}) == 6


@pytest.mark.timeout(60)
def test_the_same_page_tokens_after_another_prefix_do_not_hit():
    # a row's k and v depend on its token alone in this one-layer model, so a wrong hit would give the same
    # integers: only the hit counts can tell. D's first page has the tokens of A's second page.
    A, D = [1, 2, 3, 4, 5], [3, 4, 6, 7, 9]
    e = Engine(M, ReferenceMachine(), max_batch=2, window=4, sinks=1, page=2, n_pages=12)
    res = e.run([Request(0, A, 1, 0), Request(1, D, 1, 8), Request(2, A, 1, 16)])
    assert _hits(res) == {0: 0, 1: 0, 2: 4}
    # the pages cached under window 4 and sink 1 are not those of another window or sink count
    assert e._match(A)[1] == 4
    for W, S in ((6, 1), (4, 0), (4, 2)):
        e.W, e.S = W, S
        assert e._match(A) == ([], 0), (W, S)


@pytest.mark.timeout(60)
def test_admission_keeps_the_watermark_of_spare_pages():
    # A holds 3 of 6 pages when B arrives: with 3 pages kept spare B waits for A to finish; with none it
    # joins at once
    reqs = [Request(0, [3, 1, 4, 1, 5], 2, 0), Request(1, [9, 2], 2, 5)]
    running = {}
    for wm in (3, 0):
        e = Engine(M, ReferenceMachine(), max_batch=2, window=None, page=2, n_pages=6, watermark=wm,
                   prefix_cache=False)
        res = e.run(reqs)
        running[wm] = max(s["running"] for s in res["steps"])
        assert _equal_alone(M, res, None, 0) == 2
    assert running == {3: 1, 0: 2}


@pytest.mark.timeout(60)
def test_a_recomputed_row_that_differs_stops_the_engine():
    # preemption by recompute checks every recomputed token and logit against the first computation: a
    # chip giving other logits the second time is caught
    reqs = [Request(0, [1, 2, 3], 6, 0), Request(1, [4, 5, 6], 6, 0)]
    e = Engine(MR, ReferenceMachine(), max_batch=2, window=None, page=2, n_pages=6)
    res = e.run(reqs)
    assert res["preemptions"] > 0 and _equal_alone(MR, res, None, 0) == 2
    e = Engine(MR, ReferenceMachine(), max_batch=2, window=None, page=2, n_pages=6)
    real = e.runner.run

    def drifting(rows):
        results, counters, P = real(rows)
        if e.preemptions:
            for r in results:
                if r["logits_int"] is not None:
                    r["logits_int"] = [v + 1 for v in r["logits_int"]]
        return results, counters, P
    e.runner.run = drifting
    with pytest.raises(EngineError, match="batch invariance is broken"):
        e.run(reqs)


def test_check_invariants_still_catches_a_page_both_free_and_held():
    e = Engine(M, ReferenceMachine(), max_batch=2, window=4, page=2, n_pages=8)
    e.run([Request(0, [1, 2, 3], 2)])
    e.pt._free.append(e.pt._free[0])
    with pytest.raises(EngineError, match="free list holds a page twice"):
        check_invariants(e)
    e.pt._free.pop()
    p = next(iter(e.page_hash))
    e.pt._free.append(p)                    # a cached page also on the free list
    with pytest.raises(EngineError, match=f"page {p} is free and cached or owned"):
        check_invariants(e)


# ---- part 3: abort and stop tokens --------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_a_request_cancelled_at_any_step_returns_its_pages_and_keeps_a_prefix_of_its_tokens():
    base = [Request(0, [3, 1, 4, 1], 6, 0), Request(1, [5, 9], 5, 0), Request(2, [2, 6, 5], 4, 1)]
    kw = dict(max_batch=2, window=4, page=2, n_pages=8)
    full = Engine(M, ReferenceMachine(), **kw).run(base)
    runner = BatchRunner(M, ReferenceMachine())
    aborted = []
    for step in range(0, 11):
        reqs = [Request(0, [3, 1, 4, 1], 6, 0, abort=step)] + base[1:]
        e = Engine(M, ReferenceMachine(), **kw)
        res = e.run(reqs)             # the invariants after every step: request 0's pages went at once
        a = res["requests"][0]
        if a["finish_reason"] != "abort":        # done before the step it was to be cancelled at
            assert a["tokens"] == full["requests"][0]["tokens"] and "aborted" not in a
            continue
        aborted.append(step)
        assert a["aborted"] == step
        k = len(a["tokens"])
        assert a["tokens"] == full["requests"][0]["tokens"][:k]
        assert (a["ttft_cycles"] is None) == (k == 0)
        if k:
            assert decode_alone(M, a["prompt"], k, None, 4, 0, runner=runner)[:2] == (a["tokens"], a["logits_int"])
        for r, f in zip(res["requests"][1:], full["requests"][1:]):
            assert (r["tokens"], r["logits_int"], r["finish_reason"]) == (f["tokens"], f["logits_int"], "length")
        _end_clean(e)
    assert aborted == list(range(9))


@pytest.mark.timeout(60)
def test_engine_abort_cancels_a_running_and_a_waiting_request_between_steps():
    reqs = [Request(0, [3, 1, 4], 8, 0), Request(1, [5, 9], 8, 0), Request(2, [2, 6], 3, 0)]
    e = Engine(M, ReferenceMachine(), max_batch=2, window=None, page=2, n_pages=12)
    seen = []

    def progress(done, total):
        seen.append(e.owned())
        if e.step_no == 3:
            e.abort(0)                 # running
            e.abort(2)                 # still waiting: max_batch 2
    res = e.run(reqs, progress=progress)
    a, b, c = res["requests"]
    assert (a["aborted"], len(a["tokens"]), c["aborted"], c["tokens"], c["ttft_cycles"]) == (4, 2, 4, [], None)
    assert b["finish_reason"] == "length" and len(b["tokens"]) == 8
    assert seen[4] < seen[3]           # request 0's pages left with it
    assert _equal_alone(M, {"requests": [b]}, None, 0) == 1
    _end_clean(e)


@pytest.mark.timeout(60)
def test_generation_ends_at_the_first_stop_token():
    prompt = [3, 1, 4]
    toks, _, _ = decode_alone(M, prompt, 8, ReferenceMachine(), window=4)
    stop = (toks[3],)
    k = toks.index(toks[3]) + 1
    reqs = [Request(0, prompt, 8, 0, stop=stop), Request(1, [5, 9], 6, 0, stop=(15,)), Request(2, prompt, 8, 1)]
    e = Engine(M, ReferenceMachine(), max_batch=3, window=4, page=2, n_pages=12)
    res = e.run(reqs)
    a, b, c = res["requests"]
    assert (a["tokens"], a["finish_reason"], a["stop"]) == (toks[:k], "stop", list(stop))
    assert c["tokens"] == toks and c["finish_reason"] == "length"
    assert decode_alone(M, prompt, 8, ReferenceMachine(), window=4, stop=stop)[0] == toks[:k]
    alone_b = decode_alone(M, [5, 9], 6, ReferenceMachine(), window=4, stop=(15,))
    assert (b["tokens"], b["logits_int"]) == alone_b[:2]
    assert b["finish_reason"] == ("stop" if 15 in b["tokens"] else "length")
    _end_clean(e)
    with pytest.raises(EngineError, match="stop tokens"):
        e.run([Request(0, prompt, 2, stop=(16,))])


# ---- part 3: a token budget per step -------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_token_budget_prefills_a_prompt_in_two_steps():
    # ten prompt tokens: nine cache-only rows in one step (budget 16), the last prompt row in the next
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    one = Engine(M, ReferenceMachine(), max_batch=4, window=None, page=4, n_pages=16).run([Request(0, prompt, 3)])
    e = Engine(M, ReferenceMachine(), max_batch=4, window=None, page=4, n_pages=16, max_batched_tokens=16)
    res = e.run([Request(0, prompt, 3)])
    assert [s["rows"] for s in one["steps"]] == [1] * 12
    assert [(s["rows"], s["programs"]) for s in res["steps"]] == [(9, 3), (1, 1), (1, 1), (1, 1)]
    assert res["requests"][0]["tokens"] == one["requests"][0]["tokens"]
    assert res["requests"][0]["ttft_cycles"] < one["requests"][0]["ttft_cycles"]
    _end_clean(e)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["book", "resident"])
def test_a_token_budget_with_preemption_prefix_hits_and_sinks_equals_each_request_alone(mode):
    from hdl.config import PRESETS
    fast = PRESETS["fast"]
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    reqs = [Request(0, prompt, 4, 0), Request(1, prompt[:7] + [8, 8], 5, 0), Request(2, [9, 2, 6], 6, 1),
            Request(3, prompt, 3, 6), Request(4, [7] * 8, 4, 2)]
    kw = dict(max_batch=3, window=4, sinks=1, page=2, n_pages=12, max_batched_tokens=8)
    if mode == "resident":
        kw.update(config=fast, mode="resident")
    e = Engine(M, ReferenceMachine(config=fast if mode == "resident" else None) if mode == "resident"
               else ReferenceMachine(), **kw)
    res = e.run(reqs)
    assert res["preemptions"] > 0 and res["prefix_hit_rows"] > 0
    assert max(s["rows"] for s in res["steps"]) == 8 and max(s["programs"] for s in res["steps"]) == 3
    assert _equal_alone(M, res, 4, 1, fast if mode == "resident" else None) == 5
    _end_clean(e)


# ---- part 3: priorities ---------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_higher_priority_is_admitted_first():
    reqs = [Request(0, [3, 1], 2, 0, priority=0), Request(1, [5, 9], 2, 0, priority=2),
            Request(2, [2, 6], 2, 0, priority=1)]
    first = {}
    for policy in ("fcfs", "priority"):
        e = Engine(M, ReferenceMachine(), max_batch=1, window=4, page=2, n_pages=8, policy=policy)
        res = e.run(reqs)
        first[policy] = sorted(range(3), key=lambda i: res["requests"][i]["ttft_cycles"])
        assert _equal_alone(M, res, 4, 0) == 3
    assert first == {"fcfs": [0, 1, 2], "priority": [1, 2, 0]}


@pytest.mark.timeout(60)
def test_a_higher_priority_preempts_a_lower_one_for_a_slot_and_when_pages_run_out():
    # a slot: B (priority 1) arrives while A (priority 0) holds the only one: A gives way and recomputes
    reqs = [Request(0, [3, 1, 4], 6, 0), Request(1, [5, 9], 3, 2, priority=1)]
    e = Engine(M, ReferenceMachine(), max_batch=1, window=None, page=2, n_pages=8, policy="priority")
    res = e.run(reqs)
    a, b = res["requests"]
    assert (a["preempted"], b["preempted"]) == (1, 0)
    assert _equal_alone(M, res, None, 0) == 2
    same = Engine(M, ReferenceMachine(), max_batch=1, window=None, page=2, n_pages=8).run(reqs)
    assert [r["preempted"] for r in same["requests"]] == [0, 0]
    assert b["ttft_cycles"] < same["requests"][1]["ttft_cycles"] // 2        # B no longer waits for A
    # pages: four requests of 12 rows in 12 pages of 2; the earliest admitted has the lowest priority and is
    # the one preempted (first come, first served preempts the most recently admitted instead)
    reqs = [Request(i, [i, (3 * i) % 16, 5], 10, 0, priority=[0, 3, 2, 1][i]) for i in range(4)]
    pre = {}
    for policy in ("fcfs", "priority"):
        e = Engine(MR, ReferenceMachine(), max_batch=4, window=None, page=2, n_pages=12, policy=policy)
        res = e.run(reqs)
        pre[policy] = [r["preempted"] for r in res["requests"]]
        assert _equal_alone(MR, res, None, 0) == 4
        _end_clean(e)
    assert pre == {"fcfs": [0, 0, 1, 1], "priority": [1, 0, 0, 1]}
    with pytest.raises(EngineError, match="policy"):
        Engine(M, ReferenceMachine(), policy="sjf")


# ---- part 3: sampling -----------------------------------------------------------------------------------------

def test_sampling_is_a_function_of_the_logits_the_seed_the_sample_and_the_index():
    from host.sampling import sample_token
    logits = [3, -7, 12, 12, 0, 5, -1, 9, 2, 4, 1, 0, -3, 6, 7, 8]
    assert sample_token(logits, 0.07, 0.0, 4, 1, 0, 0, argmax=2) == 2            # temperature 0: the chip's
    assert sample_token(logits, 0.07, 0.8, 1, 1, 0, 0, argmax=3) == 2            # top-1: the lower of the ties
    draws = [sample_token(logits, 0.07, 0.8, 4, seed, 0, 0, argmax=2) for seed in range(200)]
    assert set(draws) == {2, 3, 7, 15}                                            # the top 4 only, each drawn
    assert draws == [sample_token(logits, 0.07, 0.8, 4, seed, 0, 0, argmax=2) for seed in range(200)]
    again = [[sample_token(logits, 0.07, 0.8, 4, 5, j, g, argmax=2) for g in range(8)] for j in range(3)]
    assert len({tuple(a) for a in again}) == 3                                    # samples draw apart
    hot = [sample_token(logits, 0.07, 100.0, 0, seed, 0, 0, argmax=2) for seed in range(400)]
    assert len(set(hot)) == 16


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["book", "resident"])
def test_n_samples_share_the_prompt_and_each_equals_its_replay_alone(mode):
    # the random model: its logits are close enough for a temperature of 0.8 to matter
    from hdl.config import BOOK, PRESETS
    cfg = PRESETS["fast"] if mode == "resident" else BOOK
    prompt = [3, 1, 4, 1, 5, 9, 2]
    reqs = [Request(0, prompt, 6, 0, temperature=0.8, top_k=4, seed=11, n=3, stop=(0,)),
            Request(1, [5, 9], 5, 0, temperature=1.5, seed=2),
            Request(2, prompt[:5], 4, 1, priority=1), Request(3, [7, 7, 7], 6, 2, temperature=0.5, top_k=2, n=2)]
    kw = dict(max_batch=4, window=None, page=2, n_pages=14, max_batched_tokens=6, config=cfg, mode=mode)
    e = Engine(MR, ReferenceMachine(config=cfg), **kw)
    res = e.run(reqs)
    rows = {(r["id"], r.get("sample", 0)): r for r in res["requests"]}
    assert sorted(rows) == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (3, 0), (3, 1)]
    runner = BatchRunner(MR, ReferenceMachine(config=cfg), cfg.lat, cfg)
    for (i, j), r in rows.items():
        q = reqs[i]
        steps = len(r["tokens"]) if "aborted" in r else q.gen
        alone = decode_alone(MR, q.prompt, steps, None, None, 0, runner=runner, stop=q.stop,
                             temperature=q.temperature, top_k=q.top_k, seed=q.seed, sample=j)
        assert alone[:2] == (r["tokens"], r["logits_int"]), (i, j)
        if j:                           # forked after sample 0's last prompt row: no prompt row of its own
            assert r["prompt_rows_computed"] == 0 or r["preempted"], (i, j)
    samples = [rows[0, j]["tokens"] for j in range(3)]
    assert len({tuple(t) for t in samples}) > 1                 # the samples differ
    assert all(rows[0, j]["logits_int"][0] == rows[0, 0]["logits_int"][0] for j in range(3))
    _end_clean(e)
