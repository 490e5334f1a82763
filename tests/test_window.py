"""The window rule (model spec 5.4/5.5) and the windowed float reference (5.2; 5.6 item 4, checks 5a/5b)."""
import pytest

from host import tiny_lm as T
from host.pagetable import PageTable
from host.window import (WindowError, check_window, context_size, contexts, expected_pages, first_step_over,
                         gather_bounds, pages_after_step, pages_during_step, pages_needed, trim_point,
                         window_bound)


def held_pages_brute(rows_lo: int, rows_hi: int, page: int) -> int:
    """Pages a table holds for rows rows_lo..rows_hi-1 when only pages wholly below rows_lo were released:
    every logical page j that still ends after rows_lo and starts before rows_hi (counted one by one)."""
    return sum(1 for j in range(0, rows_hi + 1) if (j + 1) * page > rows_lo and j * page < rows_hi)


# ---- the rule against example A of the chapter (window 6): rows each step reads ----------------------
# transcribed from the seed's recorded output: step -> rows gathered
EXAMPLE_A_GATHERED = {1: [], 2: [0], 3: [0, 1], 4: [0, 1, 2], 5: [0, 1, 2, 3], 6: [0, 1, 2, 3, 4],
                      7: [1, 2, 3, 4, 5], 8: [2, 3, 4, 5, 6], 9: [3, 4, 5, 6, 7], 10: [4, 5, 6, 7, 8],
                      11: [5, 6, 7, 8, 9], 12: [6, 7, 8, 9, 10], 13: [7, 8, 9, 10, 11], 14: [8, 9, 10, 11, 12]}


@pytest.mark.parametrize("L", range(1, 15))
def test_gather_bounds_example_a(L):
    lo, hi = gather_bounds(L, 6)
    assert list(range(lo, hi)) == EXAMPLE_A_GATHERED[L]
    assert context_size(L, 6) == len(EXAMPLE_A_GATHERED[L]) + 1


def test_gather_without_window_reads_everything():
    for L in range(1, 40):
        assert gather_bounds(L, None) == (0, L - 1) and context_size(L, None) == L and trim_point(L, None) == 0


def test_trim_point_is_the_first_row_the_next_step_reads():
    for W in range(1, 12):
        for L in range(1, 40):
            lo_next, _ = gather_bounds(L + 1, W)
            assert trim_point(L, W) == lo_next


# ---- exact page counts (5.5) ---------------------------------------------------------------------
@pytest.mark.parametrize("W", [None, 1, 2, 3, 4, 5, 6, 7, 8, 11, 16])
@pytest.mark.parametrize("page", [1, 2, 3, 4, 5, 8])
def test_expected_pages_equals_a_row_by_row_count(W, page):
    for L in range(1, 50):
        kf = 0 if W is None else max(0, L - W)       # trim point of step L-1, from spec 5.4 step 5
        assert expected_pages(L, W, page) == held_pages_brute(kf, L - 1, page), (L, W, page)
        if W is not None:
            B = window_bound(W, page)
            assert expected_pages(L, W, page) <= B and pages_after_step(L, W, page) <= B


# the table of spec 5.5 (page 4, 32 steps): pages at the records of steps 2, 9, 17, 32 and the peak
SPEC_5_5 = {None: ([1, 2, 4, 8], 8, 32), 8: ([1, 2, 2, 2], 3, 8), 4: ([1, 1, 1, 1], 2, 4)}


@pytest.mark.parametrize("W", [None, 8, 4])
def test_spec_table_5_5(W):
    pages, peak, programs = SPEC_5_5[W]
    assert [expected_pages(L, W, 4) for L in (2, 9, 17, 32)] == pages
    assert max(pages_after_step(L, W, 4) for L in range(1, 33)) == peak
    assert contexts(32, W) == list(range(1, programs + 1))


def held_while_decoding(n: int, W, page: int) -> list[int]:
    """Pages in use right after each step's append (before its trim), measured on a real PageTable driven
    as spec 5.4 drives it; the trim point is written out here, not taken from host.window."""
    pt = PageTable(n + 1, page)
    pt.new(0)
    held = []
    for L in range(1, n + 1):
        pt.append(0, L - 1)
        held.append(pt.used())
        if W is not None:
            pt.trim(0, max(0, L + 1 - W))
    return held


@pytest.mark.parametrize("W", [None, 1, 2, 3, 4, 5, 6, 8, 11, 16])
@pytest.mark.parametrize("page", [1, 2, 3, 4, 7])
def test_pages_needed_and_first_step_over_equal_a_real_table(W, page):
    held = held_while_decoding(40, W, page)
    for L in range(1, 41):
        assert pages_during_step(L, W, page) == held[L - 1], (L, W, page)
    for n in range(1, 41):
        need = max(held[:n])
        assert pages_needed(n, W, page) == need, (n, W, page)
        if W is not None:
            assert need <= window_bound(W, page)     # W rows at once never span more than B pages
        for pool in range(0, need + 2):
            over = next((L for L in range(1, n + 1) if held[L - 1] > pool), None)
            assert first_step_over(n, W, page, pool) == over, (n, W, page, pool)


def test_pages_needed_is_quick_for_a_long_windowed_decode():
    # the scan is bounded by the window's period: a billion steps cost W + P - 1 evaluations
    assert pages_needed(10**9, 6, 4) == pages_needed(40, 6, 4) == 3
    assert first_step_over(10**9, 6, 4, 2) == first_step_over(40, 6, 4, 2) == 9
    assert pages_needed(10**9, None, 4) == 250_000_000 and first_step_over(10**9, None, 4, 7) == 29


def test_window_bound_values():
    # B = ceil((W-1)/P) + 1, worked by hand
    assert window_bound(8, 4) == 3 and window_bound(4, 4) == 2 and window_bound(6, 2) == 4
    assert window_bound(3, 1) == 3 and window_bound(1, 4) == 1 and window_bound(5, 4) == 2


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_bad_window(bad):
    with pytest.raises(WindowError, match=f"^window must be >= 1 or None, got {bad!r}$".replace(".", r"\.")):
        check_window(bad)


def test_bad_step_and_page():
    with pytest.raises(WindowError, match="step must be an integer >= 1, got 0"):
        context_size(0, 4)
    with pytest.raises(WindowError, match="page size must be >= 1, got 0"):
        expected_pages(3, 4, 0)
    with pytest.raises(WindowError, match="needs a window"):
        window_bound(None, 4)


# ---- the windowed float reference: 5a and 5b of spec 5.6 item 4 -------------------------------------
@pytest.fixture(scope="module")
def random2():
    mr = T.make_model("random", 2)
    return mr, T.float_generate(mr, 3, 16, None)


def test_5a_large_window_changes_nothing_small_window_does(random2):
    mr, full = random2
    caches = {20: ([], []), 3: ([], []), None: ([], [])}
    diff3 = 0.0
    for L in range(1, 14):
        out = {}
        for W, (kc, vc) in caches.items():
            lg, k, v, _ = T.float_windowed(mr, full[L - 1], kc, vc, W) if W else T.float_step(mr, full[L - 1], kc, vc)
            kc.append(k)
            vc.append(v)
            out[W] = lg
        assert max(abs(a - b) for a, b in zip(out[20], out[None])) <= 1e-12, L
        diff3 = max(diff3, max(abs(a - b) for a, b in zip(out[3], out[None])))
    assert diff3 >= 1e-3, "a window of 3 changed nothing: the window is not applied"


@pytest.mark.parametrize("W", [2, 3, 5])
def test_5b_windowed_step_equals_recomputation(random2, W):
    mr, full = random2
    toks = full[:12]
    kc, vc = [], []
    for L in range(1, 12):
        got, k, v, _ = T.float_windowed(mr, toks[L - 1], kc, vc, W)
        # keys and values of exactly the last W-1 previous tokens, recomputed from their ids (not the cache)
        prev = toks[max(0, L - W):L - 1]
        kk = [T.vm(mr["E"][t], mr["Wk"]) for t in prev]
        vv = [T.vm(mr["E"][t], mr["Wv"]) for t in prev]
        ref = T.float_step(mr, toks[L - 1], kk, vv)[0]
        assert max(abs(a - b) for a, b in zip(ref, got)) <= 1e-9, (W, L)
        kc.append(k)
        vc.append(v)
