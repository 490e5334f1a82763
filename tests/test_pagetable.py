"""The page table (model spec 5.1) against a shadow model of plain lists (5.6 item 1), exhaustion (item 2),
misuse that must raise and change nothing, and example A of the chapter (its recorded output)."""
import copy
import random
import re

import pytest

from host.pagetable import MAX_POOL_ROWS, OutOfPages, PageTable, PageTableError


# ---- the invariants, computed from the public views only ----------------------------------------
def invariant_problems(pt: PageTable, shadow: dict, dropped: dict | None = None) -> list[str]:
    """Everything that must hold after any operation; `dropped` (request -> pages the shadow says trim has
    released: every page wholly below the largest keep_from asked, i.e. max keep_from // page) is optional."""
    problems = []
    count = [0] * pt.n_pages
    for rid in pt.requests():
        for p in pt.table(rid):
            count[p] += 1
    refs = [pt.refcount(p) for p in range(pt.n_pages)]
    if count != refs:
        problems.append(f"reference counts {refs} differ from the block-table entries {count}")
    free = pt.free_pages()
    if len(set(free)) != len(free):
        problems.append(f"a page is on the free list twice: {free}")
    if any(refs[p] != 0 for p in free):
        problems.append("a referenced page is on the free list")
    if len(free) + sum(1 for r in refs if r > 0) != pt.n_pages:
        problems.append("a page is neither free nor referenced (leak)")
    if pt.used() != pt.n_pages - len(free):
        problems.append("used() disagrees with the free list")
    if list(pt.requests()) != list(shadow):
        problems.append(f"live requests {pt.requests()} differ from the shadow's {list(shadow)}")
    for rid, rows in shadow.items():
        lo = pt.dropped(rid) * pt.page
        if pt.length(rid) != len(rows):
            problems.append(f"length of request {rid}: {pt.length(rid)} != {len(rows)}")
        elif pt.rows(rid, lo, len(rows)) != rows[lo:]:
            problems.append(f"rows of request {rid} differ from the shadow")
        if dropped is not None and pt.dropped(rid) != dropped[rid]:
            problems.append(f"request {rid}: {pt.dropped(rid)} pages released, the shadow says {dropped[rid]}")
        # the table holds exactly the pages covering rows lo..length-1
        if len(pt.table(rid)) != -(-len(rows) // pt.page) - pt.dropped(rid):
            problems.append(f"request {rid}: {len(pt.table(rid))} pages for rows {lo}..{len(rows) - 1}")
    return problems


def shadow_run(seed: int, n_ops: int = 400):
    """The battery of spec 5.6 item 1, with exactly the book's sequence of random calls."""
    R = random.Random(seed)
    pt = PageTable(24, 4)
    shadow: dict = {}
    sdrop: dict = {}
    nxt = ctr = 0
    stats = {"out_of_pages": 0, "copies": 0, "trimmed": 0}
    for step in range(n_ops):
        op = R.choice(["append"] * 6 + ["new", "fork", "trim", "release"])
        ids = list(shadow)
        try:
            if op == "new" and len(ids) < 5:
                pt.new(nxt)
                shadow[nxt] = []
                sdrop[nxt] = 0
                nxt += 1
            elif op == "append" and ids:
                rid = R.choice(ids)
                ctr += 1
                row = (ctr, -ctr)
                before = pt.table(rid)
                pt.append(rid, row)
                shadow[rid].append(row)
                after = pt.table(rid)
                if len(before) == len(after) and before and before[-1] != after[-1]:
                    stats["copies"] += 1
            elif op == "fork" and ids and len(ids) < 5:
                src = R.choice(ids)
                pt.fork(src, nxt)
                shadow[nxt] = list(shadow[src])
                sdrop[nxt] = sdrop[src]
                nxt += 1
            elif op == "trim" and ids:
                rid = R.choice(ids)
                keep = R.randrange(0, len(shadow[rid]) + 1)
                d0 = pt.dropped(rid)
                pt.trim(rid, keep)
                sdrop[rid] = max(sdrop[rid], keep // 4)
                stats["trimmed"] += pt.dropped(rid) - d0
            elif op == "release" and ids:
                rid = R.choice(ids)
                pt.release(rid)
                del shadow[rid]
        except OutOfPages:
            stats["out_of_pages"] += 1
        problems = invariant_problems(pt, shadow, sdrop)
        assert not problems, f"seed {seed} op {step} ({op}): {problems[:3]}"
    for rid in list(shadow):
        pt.release(rid)
    assert pt.free_pages() and len(pt.free_pages()) == 24
    assert all(pt.refcount(p) == 0 for p in range(24)), f"seed {seed}: pages leaked"
    return stats


@pytest.mark.parametrize("seed", range(6))
def test_shadow_battery(seed):
    shadow_run(seed)


def test_shadow_battery_exercises_every_path():
    # a battery that never copied or trimmed would prove little: count what the 2,400 ops did. (The book's
    # pool of 24 pages never runs out under these sequences; exhaustion is tested below and in the
    # stateful test, whose pools are small.)
    total = {"out_of_pages": 0, "copies": 0, "trimmed": 0}
    for seed in range(6):
        for k, v in shadow_run(seed).items():
            total[k] += v
    assert total["copies"] > 0 and total["trimmed"] > 0, total


# ---- exhaustion (item 2) ---------------------------------------------------------------------------
def test_exhaustion_raises_and_keeps_length():
    pt = PageTable(3, 2)
    pt.new(0)
    with pytest.raises(OutOfPages):
        for i in range(10):
            pt.append(0, (i, i))
    assert pt.length(0) == 6
    assert pt.used() == 3 and pt.free_pages() == ()
    assert pt.rows(0, 0, 6) == [(i, i) for i in range(6)]


def test_failed_append_changes_nothing_and_names_the_row():
    pt = PageTable(3, 2)
    pt.new(0)
    pt.new(1)
    for i in range(4):
        pt.append(0, (i, i))
    pt.append(1, "b0")
    pt.trim(0, 2)                  # page 0 goes back to the free list and is taken by request 1
    pt.append(1, "b1")
    pt.append(1, "b2")             # every page is now in use: request 0 holds 1, request 1 holds 2
    views = (pt.free_pages(), [pt.refcount(p) for p in range(3)], pt.table(0), pt.table(1), pt.length(0),
             pt.length(1), pt.dropped(0), pt.rows(0, 2, 4), pt.rows(1, 0, 3))
    assert views[:5] == ((), [1, 1, 1], (1,), (2, 0), 4)
    snap = copy.deepcopy(vars(pt))
    with pytest.raises(OutOfPages, match=re.escape("no free page for row 4 of request 0: all 3 pages of 2 rows "
                                                   "are in use")):
        pt.append(0, (4, 4))
    assert vars(pt) == snap        # pool contents, free list, counts, block tables, lengths, dropped
    assert (pt.free_pages(), [pt.refcount(p) for p in range(3)], pt.table(0), pt.table(1), pt.length(0),
            pt.length(1), pt.dropped(0), pt.rows(0, 2, 4), pt.rows(1, 0, 3)) == views


def test_failed_copy_on_write_changes_nothing():
    pt = PageTable(2, 4)
    pt.new("a")
    for i in range(5):
        pt.append("a", i)          # pages 0 and 1: the pool is full
    pt.fork("a", "b")              # b shares page 1, which has room: its append must copy, but no page is free
    snap = copy.deepcopy(vars(pt))
    with pytest.raises(OutOfPages):
        pt.append("b", 99)
    assert vars(pt) == snap
    pt.release("a")                # b is now the only owner of page 1: no copy is needed, no page taken
    pt.append("b", 99)
    assert pt.table("b") == (0, 1) and pt.rows("b", 0, 6) == [0, 1, 2, 3, 4, 99]


# ---- the free list order ---------------------------------------------------------------------------
def test_free_list_descending_and_last_freed_taken_next():
    pt = PageTable(5, 1)
    assert pt.free_pages() == (4, 3, 2, 1, 0)
    pt.new(0)
    for i in range(3):
        pt.append(0, i)
    assert pt.table(0) == (0, 1, 2)
    pt.trim(0, 2)                  # releases pages 0 then 1: 1 is freed last
    assert pt.free_pages() == (4, 3, 0, 1)
    pt.append(0, 3)
    assert pt.table(0) == (2, 1)
    assert pt.rows(0, 2, 4) == [2, 3]


def test_trim_releases_only_whole_pages_before_keep_from():
    pt = PageTable(8, 4)
    pt.new(0)
    for i in range(10):
        pt.append(0, i)
    pt.trim(0, 7)                  # page of rows 4..7 still holds row 7
    assert pt.dropped(0) == 1 and pt.table(0) == (1, 2)
    pt.trim(0, 8)
    assert pt.dropped(0) == 2 and pt.table(0) == (2,)
    pt.trim(0, 3)                  # below what is already dropped: nothing happens
    assert pt.dropped(0) == 2
    pt.trim(0, 10)                 # the last page is partly written: it stays
    assert pt.table(0) == (2,) and pt.rows(0, 8, 10) == [8, 9]


# ---- misuse: a clear error and no change -----------------------------------------------------------
def _table():
    pt = PageTable(6, 4)
    pt.new("a")
    for i in range(9):
        pt.append("a", i)
    pt.trim("a", 4)                # rows 4..8 held
    pt.fork("a", "b")
    return pt


MISUSE = [
    ("new duplicate", lambda pt: pt.new("a"), "request 'a' already exists"),
    ("append unknown", lambda pt: pt.append("zz", 1), "unknown request 'zz'"),
    ("rows unknown", lambda pt: pt.rows("zz", 0, 0), "unknown request 'zz'"),
    ("rows released", lambda pt: pt.rows("a", 3, 5), "row 3 already released"),
    ("rows unwritten", lambda pt: pt.rows("a", 4, 10), "row 9 not written yet"),
    ("rows reversed", lambda pt: pt.rows("a", 6, 5), "lo=6 > hi=5"),
    ("rows not int", lambda pt: pt.rows("a", 4.0, 5), "lo must be an integer"),
    ("rows negative", lambda pt: pt.rows("a", -1, 5), "lo must be >= 0, got -1"),
    ("trim unknown", lambda pt: pt.trim("zz", 0), "unknown request 'zz'"),
    ("trim past length", lambda pt: pt.trim("a", 10), "keep_from must be in 0..9"),
    ("trim negative", lambda pt: pt.trim("a", -1), "got -1"),
    ("fork unknown src", lambda pt: pt.fork("zz", "c"), "unknown request 'zz'"),
    ("fork existing dst", lambda pt: pt.fork("a", "b"), "request 'b' already exists"),
    ("release unknown", lambda pt: pt.release("zz"), "unknown request 'zz'"),
    ("unhashable id", lambda pt: pt.new(["x"]), "must be hashable"),
    ("refcount out of pool", lambda pt: pt.refcount(6), "page 6 is not in the pool"),
    ("table unknown", lambda pt: pt.table("zz"), "unknown request 'zz'"),
]


@pytest.mark.parametrize("name,action,message", MISUSE, ids=[m[0] for m in MISUSE])
def test_misuse_raises_and_changes_nothing(name, action, message):
    pt = _table()
    snap = copy.deepcopy(vars(pt))
    with pytest.raises(PageTableError, match=re.escape(message)):
        action(pt)
    assert vars(pt) == snap


def test_release_twice_is_an_error():
    pt = _table()
    pt.release("b")
    snap = copy.deepcopy(vars(pt))
    with pytest.raises(PageTableError, match="unknown request 'b'"):
        pt.release("b")
    assert vars(pt) == snap


@pytest.mark.parametrize("n_pages,page,message", [
    (0, 4, "pool size (pages) must be an integer >= 1, got 0"),
    (8, 0, "page size must be an integer >= 1, got 0"),
    (8, -2, "page size must be an integer >= 1, got -2"),
    (8, 2.5, "page size must be an integer >= 1, got 2.5"),
    (True, 4, "pool size (pages) must be an integer >= 1, got True"),
    (2**20 + 1, 1, "a pool of 1048577 pages of 1 rows holds 1048577 rows, more than the 1048576 allowed"),
    (1025, 1024, "a pool of 1025 pages of 1024 rows holds 1049600 rows, more than the 1048576 allowed"),
    (1, 2**20 + 1, "a pool of 1 pages of 1048577 rows holds 1048577 rows, more than the 1048576 allowed"),
])
def test_bad_sizes(n_pages, page, message):
    with pytest.raises(PageTableError, match=re.escape(message)):
        PageTable(n_pages, page)


def test_largest_pool_allowed():
    assert MAX_POOL_ROWS == 2**20
    pt = PageTable(1024, 1024)     # exactly MAX_POOL_ROWS rows
    assert pt.used() == 0 and len(pt.free_pages()) == 1024


# ---- example A: the recorded output of the chapter --------------------------------------------------
SEED_EXAMPLE_A = """\
== 1. one request, pages of 4 rows, window of 6 tokens (the step attends the new token and the 5 before it)
   a row is written as 'token index'; the page pool has 8 physical pages (numbered 0..7, handed out from the top of the free list)
  step  1: reads rows [] + the new one; wrote row 0 -> table [0]  dropped pages 0  free [1, 2, 3, 4, 5, 6, 7]
  step  2: reads rows [0] + the new one; wrote row 1 -> table [0]  dropped pages 0  free [1, 2, 3, 4, 5, 6, 7]
  step  3: reads rows [0, 1] + the new one; wrote row 2 -> table [0]  dropped pages 0  free [1, 2, 3, 4, 5, 6, 7]
  step  4: reads rows [0, 1, 2] + the new one; wrote row 3 -> table [0]  dropped pages 0  free [1, 2, 3, 4, 5, 6, 7]
  step  5: reads rows [0, 1, 2, 3] + the new one; wrote row 4 -> table [0, 1]  dropped pages 0  free [2, 3, 4, 5, 6, 7]
  step  6: reads rows [0, 1, 2, 3, 4] + the new one; wrote row 5 -> table [0, 1]  dropped pages 0  free [2, 3, 4, 5, 6, 7]
  step  7: reads rows [1, 2, 3, 4, 5] + the new one; wrote row 6 -> table [0, 1]  dropped pages 0  free [2, 3, 4, 5, 6, 7]
  step  8: reads rows [2, 3, 4, 5, 6] + the new one; wrote row 7 -> table [0, 1]  dropped pages 0  free [2, 3, 4, 5, 6, 7]
  step  9: reads rows [3, 4, 5, 6, 7] + the new one; wrote row 8 -> table [1, 2]  dropped pages 1  free [0, 3, 4, 5, 6, 7]
  step 10: reads rows [4, 5, 6, 7, 8] + the new one; wrote row 9 -> table [1, 2]  dropped pages 1  free [0, 3, 4, 5, 6, 7]
  step 11: reads rows [5, 6, 7, 8, 9] + the new one; wrote row 10 -> table [1, 2]  dropped pages 1  free [0, 3, 4, 5, 6, 7]
  step 12: reads rows [6, 7, 8, 9, 10] + the new one; wrote row 11 -> table [1, 2]  dropped pages 1  free [0, 3, 4, 5, 6, 7]
  step 13: reads rows [7, 8, 9, 10, 11] + the new one; wrote row 12 -> table [2, 0]  dropped pages 2  free [1, 3, 4, 5, 6, 7]
  step 14: reads rows [8, 9, 10, 11, 12] + the new one; wrote row 13 -> table [2, 0]  dropped pages 2  free [1, 3, 4, 5, 6, 7]
   pages in use at the end: 2 (a request with no window would hold 4)

== 2. fork a second request B from A (shares every page), then B appends: the last page is shared, so B copies it first
   before the fork:  A [0, 1, 2] refcounts {0: 1, 1: 1, 2: 1}
   after the fork:   A [0, 1, 2]  B [0, 1, 2] refcounts {0: 2, 1: 2, 2: 2}  (no copy: the prefix is stored once)
   B appends row 100 (A's last page holds rows 8, 9 and has room, but is shared): A [0, 1, 2]  B [0, 1, 3] refcounts {0: 2, 1: 2, 2: 1, 3: 1}
   A's rows are untouched: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]   B's rows: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100]
   release B: A's pages keep their counts: {0: 1, 1: 1, 2: 1} free [3, 4, 5, 6, 7]
"""


def _numbers(line: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", line)]


def test_example_a_output_matches_the_chapter(capsys, tmp_path):
    from sim import pagetable_demo
    assert pagetable_demo.main(["--json", str(tmp_path / "a.json")]) == 0
    got = capsys.readouterr().out.splitlines()
    assert got.pop() == f"wrote {tmp_path / 'a.json'}"
    want = SEED_EXAMPLE_A.splitlines()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert _numbers(g) == _numbers(w), f"\n got: {g}\nwant: {w}"
    assert (tmp_path / "a.json").stat().st_size > 0


def test_example_a_bad_json_path(capsys):
    from sim import pagetable_demo
    from sim.cli import guarded
    assert guarded(pagetable_demo.main, ["--json", "/nonexistent-dir/x.json"]) == 2
    out = capsys.readouterr()
    assert out.out == ""                            # refused before the demo prints anything
    assert out.err == "error: --json: directory /nonexistent-dir does not exist\n"
