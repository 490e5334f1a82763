"""The paged host (model spec 5.4) on the reference machine: paged == plain host in integers, exact page
counts, the rule under every window, the chapter's 32-step decodes, 5c, argument errors, a pool that is too
small refused before the first step with nothing changed, and a plain host that never touches a page table."""
import copy
import math
import subprocess
import sys
import time

import pytest

import host.paged
from host import tiny_lm as T
from host.paged import HostError, PagedChip
from host.pagetable import OutOfPages
from sim.backends.reference import ReferenceMachine
from test_window import held_pages_brute

MACHINE = ReferenceMachine()


def rule(start, n):
    toks = [start]
    for _ in range(n):
        toks.append((5 * toks[-1] + 3) % 16)          # f(t) = 5t + 3 mod 16, spec 1.1
    return toks


@pytest.fixture(scope="module")
def structured():
    return T.make_model("structured")


# ---- item 3: five (window, page) pairs, 24 steps -------------------------------------------------
PAIRS = [(None, 4), (8, 4), (6, 2), (4, 4), (3, 1)]


def table_state(pt):
    """Everything a page table holds (pool contents, free list, counts, block tables, lengths, dropped)."""
    return copy.deepcopy(vars(pt))


@pytest.fixture(scope="module")
def pair_runs(structured):
    runs = {}
    for W, page in PAIRS:
        chip = PagedChip(structured, 24, W, page, 64, backend=MACHINE)
        t1, r1 = chip.generate(0, 24)
        peak, pt, state = chip.peak, chip.pagetable, table_state(chip.pagetable)
        chip.paged = False
        t2, r2 = chip.generate(0, 24)
        # the plain run left the paged run's table and peak alone
        assert chip.pagetable is pt and table_state(pt) == state and chip.peak == peak
        runs[W, page] = (chip, t1, r1, peak, t2, r2)
    return runs


@pytest.mark.parametrize("W,page", PAIRS)
def test_paged_equals_plain_host(pair_runs, W, page):
    chip, t1, r1, _, t2, r2 = pair_runs[W, page]
    assert t1 == t2
    assert [r["logits_int"] for r in r1] == [r["logits_int"] for r in r2]
    assert [r["image"] for r in r1] == [r["image"] for r in r2]      # the chip saw the same inputs
    assert t1 == rule(0, 24), "the structured model must follow f(t) = 5t+3 mod 16"


@pytest.mark.parametrize("W,page", PAIRS)
def test_exact_page_counts_and_bounds(pair_runs, W, page):
    chip, _, r1, peak, _, r2 = pair_runs[W, page]
    for r in r1:
        L = r["L"]
        kf = 0 if W is None else max(0, L - W)
        assert r["pages"] == held_pages_brute(kf, L - 1, page), f"step {L}"
        assert r["ctx"] == (L if W is None else min(L, W))
    if W is None:
        assert r1[-1]["pages"] == math.ceil(24 / page)
    else:
        B = math.ceil((W - 1) / page) + 1
        # after its trim a step holds the W-1 rows the next step reads: at most B pages (spec 5.5 allows B+1)
        assert peak <= B and r1[-1]["pages"] <= B
        assert sorted(chip.progs) == list(range(1, W + 1))
    assert peak == max(held_pages_brute(0 if W is None else max(0, L + 1 - W), L, page) for L in range(1, 25))
    # the plain host keeps its rows in a list and counts no pages
    assert [r["pages"] for r in r2] == [None] * 24


# ---- the chapter's 32-step decodes (spec 5.5 table; cycles of spec 6.2) -----------------------------
def spec_cycles(n):
    return 7000 if n == 1 else 6903 + 79 * n + 40 * math.ceil(n / 4)


@pytest.mark.parametrize("W,programs,pages,peak,total", [
    (None, 32, [1, 2, 4, 8], 8, 268346),
    (8, 8, [1, 2, 2, 2], 3, 241286),
    (4, 4, [1, 1, 1, 1], 2, 231792),
])
def test_32_step_decodes(structured, W, programs, pages, peak, total):
    seen = []
    chip = PagedChip(structured, 32, W, 4, 64, backend=MACHINE)
    toks, rec = chip.generate(0, 32, progress=lambda L, n: seen.append((L, n)))
    assert toks == rule(0, 32)
    assert len(chip.progs) == programs
    assert [rec[L - 1]["pages"] for L in (2, 9, 17, 32)] == pages
    assert chip.peak == peak
    assert [r["counters"][0] for r in rec] == [spec_cycles(r["ctx"]) for r in rec]
    assert sum(r["counters"][0] for r in rec) == total
    assert seen == [(L, 32) for L in range(1, 33)]
    r = rec[0]
    assert {"L", "ctx", "tok", "pages", "counters", "logits_int", "logits", "code", "image"} <= set(r)
    assert len(r["counters"]) == 5 and len(r["logits_int"]) == 16 and len(r["logits"]) == 16
    assert r["pages"] == 0 and r["tok"] == toks[1]


# ---- the rule under every window (W = 1 included: each step attends its own token) ----------------
@pytest.mark.parametrize("W", [1, 2, 5, 7, 12, 16])
def test_rule_under_other_windows(structured, W):
    chip = PagedChip(structured, 20, W, 3, 64, backend=MACHINE)
    toks, rec = chip.generate(0, 20)
    assert toks == rule(0, 20)
    assert len(chip.progs) == W
    assert all(r["pages"] == held_pages_brute(max(0, r["L"] - W), r["L"] - 1, 3) for r in rec)


# ---- 5c: the chip follows the windowed float reference on a random model -----------------------------
@pytest.mark.parametrize("W", [None, 4])
def test_5c_chip_follows_windowed_float(W):
    mr = T.make_model("random", 2)
    ft = T.float_generate(mr, 3, 16, W)
    chip = PagedChip(mr, 16, W, 4, 64, backend=MACHINE)
    toks, rec = chip.generate(3, 16, force=ft)
    assert toks == ft
    kc, vc = [], []
    for L in range(1, 17):
        lg, k, v, _ = T.float_windowed(mr, ft[L - 1], kc, vc, W)
        kc.append(k)
        vc.append(v)
        err = math.sqrt(sum((a - b) ** 2 for a, b in zip(rec[L - 1]["logits"], lg)) / sum(b * b for b in lg))
        assert err <= 0.15, f"W={W} step {L}: relative RMS logit error {err:.3f}"


# ---- resources and arguments ------------------------------------------------------------------------
class CountingMachine:
    """The reference machine, counting the programs it was asked to run."""

    def __init__(self):
        self.runs = 0

    def run(self, code, image, lat):
        self.runs += 1
        return MACHINE.run(code, image, lat)


def host_state(chip):
    return (table_state(chip.pagetable), chip.peak, sorted(chip.progs))


def test_out_of_pages_is_refused_before_the_first_step(structured):
    backend = CountingMachine()
    chip = PagedChip(structured, 12, None, 4, 2, backend=backend)
    chip.generate(0, 8)                 # 8 rows fit in 2 pages
    before, runs = host_state(chip), backend.runs
    with pytest.raises(OutOfPages) as e:
        chip.generate(0, 12)            # the 9th append needs a third page
    assert str(e.value) == ("out of pages: step 9 needs 3 pages of 4 rows and the pool has 2 "
                            "(12 steps with window none need 3)")
    assert backend.runs == runs and host_state(chip) == before


@pytest.mark.parametrize("W,page,pool,n,message", [
    # worked by hand: rows max(0, L-W)..L-1 are held once step L has appended; they span the pages counted
    (4, 4, 1, 20, "step 5 needs 2 pages of 4 rows and the pool has 1 (20 steps with window 4 need 2)"),
    (6, 2, 3, 20, "step 7 needs 4 pages of 2 rows and the pool has 3 (20 steps with window 6 need 4)"),
    (2, 1, 1, 5, "step 2 needs 2 pages of 1 rows and the pool has 1 (5 steps with window 2 need 2)"),
])
def test_windowed_pool_too_small(structured, W, page, pool, n, message):
    backend = CountingMachine()
    chip = PagedChip(structured, 6, W, page, pool, backend=backend)
    with pytest.raises(OutOfPages) as e:
        chip.generate(0, n)
    assert str(e.value) == "out of pages: " + message
    assert backend.runs == 0 and chip.pagetable is None and chip.peak == 0 and chip.progs == {}


def test_out_of_pages_during_a_run_leaves_the_host_as_it_was(structured, monkeypatch):
    # should the pool check ever be wrong, the page table itself runs out: the message still names the step
    backend = CountingMachine()
    chip = PagedChip(structured, 12, None, 4, 2, backend=backend)
    chip.generate(3, 8)
    before = host_state(chip)
    monkeypatch.setattr(host.paged, "check_decode", lambda *args, **kwargs: None)
    with pytest.raises(OutOfPages) as e:
        chip.generate(0, 12)
    assert str(e.value) == ("out of pages at step 9, which needs 3 pages of 4 rows and the pool has 2: "
                            "no free page for row 8 of request 0: all 2 pages of 4 rows are in use")
    assert backend.runs == 8 + 9
    assert host_state(chip)[:2] == before[:2]       # the table and peak of the last completed decode


def test_plain_host_touches_no_page_table(structured, monkeypatch):
    class NoTable:
        def __init__(self, *args, **kwargs):
            raise AssertionError("the plain host created a page table")
    chip = PagedChip(structured, 12, None, 4, 1, paged=False, backend=MACHINE)   # 1 page: 4 rows only
    monkeypatch.setattr(host.paged, "PageTable", NoTable)
    toks, rec = chip.generate(0, 12)
    assert toks == rule(0, 12) and [r["pages"] for r in rec] == [None] * 12
    assert chip.pagetable is None and chip.peak == 0


def test_generate_is_repeatable(structured):
    chip = PagedChip(structured, 6, 3, 2, 8, backend=MACHINE)
    a = chip.generate(5, 6)
    b = chip.generate(5, 6)
    assert a[0] == b[0] == rule(5, 6)
    assert [r["logits_int"] for r in a[1]] == [r["logits_int"] for r in b[1]]


@pytest.mark.parametrize("kwargs,message", [
    ({"W": 0}, "window must be >= 1 or None, got 0"),
    ({"W": -2}, "window must be >= 1 or None, got -2"),
    ({"page": 0}, "page size must be >= 1, got 0"),
    ({"steps": 0}, "steps must be >= 1, got 0"),
    ({"n_pages": 0}, "pool size (n_pages) must be >= 1, got 0"),
    ({"starts": [16]}, "calibration start must be a token 0..15, got 16"),
    ({"backend": object()}, "backend must have a run(code, image, lat) method, got object"),
    ({"paged": "no"}, "paged must be True or False, got 'no'"),
    ({"starts": 5}, "starts must be an iterable of tokens, got int"),
    ({"steps": 65}, "a context of 65 tokens exceeds the chip's limit of 64 (the attention's p.V has K = context "
                    "and a matmul's K is at most 64): decode fewer steps or use a window of at most 64"),
    ({"steps": 70, "W": 65}, "a context of 65 tokens exceeds the chip's limit of 64 (the attention's p.V has "
                             "K = context and a matmul's K is at most 64): decode fewer steps or use a window of "
                             "at most 64"),
    ({"n_pages": 2**18 + 1}, "a pool of 262145 pages of 4 rows holds 1048580 rows, more than the 1048576 allowed"),
    ({"page": 2**20, "n_pages": 2}, "a pool of 2 pages of 1048576 rows holds 2097152 rows, more than the 1048576 "
                                    "allowed"),
    ({"m": None}, "model must be a dict of weights (host.tiny_lm.make_model), got NoneType"),
    ({"m": {}}, "model has no E, Wq, Wk, Wv, Wo, W1, W2, Wout (host.tiny_lm.make_model gives every weight)"),
    ({"m": "drop Wout"}, "model has no Wout (host.tiny_lm.make_model gives every weight)"),
    ({"m": "short E"}, "model weight E must be 16 rows of 16 numbers"),
    ({"m": "nan in W2"}, "model weight W2 holds a value that is not a finite number"),
])
def test_bad_construction(structured, kwargs, message):
    args = {"m": structured, "steps": 4, "W": None, "page": 4, "n_pages": 64, **kwargs}
    m = copy.deepcopy(structured)
    if args["m"] == "drop Wout":
        del m["Wout"]
    elif args["m"] == "short E":
        m["E"] = m["E"][:15]
    elif args["m"] == "nan in W2":
        m["W2"][31][15] = float("nan")
    if isinstance(args["m"], str):
        args["m"] = m
    with pytest.raises(HostError) as e:
        PagedChip(**args)
    assert str(e.value) == message


@pytest.mark.parametrize("call,message", [
    (lambda c: c.generate(16, 2), "start must be a token 0..15, got 16"),
    (lambda c: c.generate(-1, 2), "start must be a token 0..15, got -1"),
    (lambda c: c.generate(0, 0), "n (steps to decode) must be >= 1, got 0"),
    (lambda c: c.generate(0, 5), "cannot decode 5 steps: calibrated for 4 steps, i.e. contexts up to 4, "
                                 "and this decode needs 5"),
    (lambda c: c.generate(0, 3, force=[0, 3]), "force must be a sequence of at least 4 tokens, got 2"),
    (lambda c: c.generate(0, 2, force=[0, 3, 99]), "force[2] must be a token 0..15, got 99"),
    (lambda c: c.generate(0, 2, progress=3), "progress must be a callable(L, n) or None, got int"),
    (lambda c: c.generate(0, 2, progress=print.__self__.len), "progress must accept two arguments (L, n), "
                                                              "got <built-in function len>"),
])
def test_bad_generate(structured, call, message):
    chip = PagedChip(structured, 4, None, backend=MACHINE)
    with pytest.raises(HostError) as e:
        call(chip)
    assert str(e.value) == message


def test_no_backend(structured):
    chip = PagedChip(structured, 2)
    with pytest.raises(HostError, match="no backend"):
        chip.generate(0, 2)


def test_window_lets_a_decode_run_past_its_calibration(structured):
    chip = PagedChip(structured, 4, 4, 4, 4, backend=MACHINE)      # contexts 1..4 only, 4 pages
    toks, rec = chip.generate(0, 20)
    assert toks == rule(0, 20) and len(chip.progs) == 4 and chip.peak <= 2


def test_host_imports_no_simulator_and_no_amaranth():
    # layer rule: host/ imports the compiler (and hdl.isa's limits, as the compiler does), never a simulator
    # or Amaranth; the backend object is passed in
    import subprocess
    import sys
    code = ("import sys, host.paged, host.pagetable, host.window; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sim', 'amaranth')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__file__.rsplit("/tests/", 1)[0]).stdout.strip()
    assert out == "[]"


# ---- the command refuses a pool that is too small before any simulation ------------------------------
@pytest.mark.parametrize("args,message", [
    (["--pages", "7"], "step 29 needs 8 pages of 4 rows and the pool has 7 (32 steps with window none need 8)"),
    (["--steps", "20", "--window", "6", "--page", "2", "--pages", "3"],
     "step 7 needs 4 pages of 2 rows and the pool has 3 (20 steps with window 6 need 4)"),
    (["--window", "4", "--pages", "1"], "step 5 needs 2 pages of 4 rows and the pool has 1 (32 steps with window 4 need 2)"),
    (["--steps", "12", "--page", "1", "--pages", "11"],
     "step 12 needs 12 pages of 1 rows and the pool has 11 (12 steps with window none need 12)"),
])
def test_decode_command_refuses_a_small_pool_at_once(tmp_path, args, message):
    path = tmp_path / "never.json"
    t0 = time.perf_counter()
    # the default simulator (Amaranth): a refusal after building it would take far longer than two seconds
    p = subprocess.run([sys.executable, "-m", "sim.decode", *args, "--json", str(path)], capture_output=True,
                       text=True, timeout=60, cwd=__file__.rsplit("/tests/", 1)[0])
    elapsed = time.perf_counter() - t0
    assert (p.returncode, p.stdout, p.stderr) == (2, "", f"error: out of pages: {message}\n")
    assert elapsed < 2.0, f"{elapsed:.2f} s"
    assert list(tmp_path.iterdir()) == []


def test_decode_command_refuses_before_building_a_simulator_or_calibrating(tmp_path, monkeypatch, capsys):
    import sim.backends
    from sim import decode
    from sim.cli import guarded

    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the pool was checked")
    monkeypatch.setattr(sim.backends, "get_backend", forbidden)
    monkeypatch.setattr(host.paged, "calibrate", forbidden)
    assert guarded(decode.main, ["--pages", "7", "--json", str(tmp_path / "never.json")]) == 2
    assert capsys.readouterr().err == ("error: out of pages: step 29 needs 8 pages of 4 rows and the pool has 7 "
                                       "(32 steps with window none need 8)\n")
    assert list(tmp_path.iterdir()) == []


def test_the_context_limit_and_the_programs_follow_the_configuration():
    # the limit is the chip's matrix K: 64 on the book's chip, 16 on a chip with 16-deep operand memories
    from hdl.config import BOOK, parse_chip
    from host.paged import MAX_CONTEXT, check_decode, max_context
    from sim.backends.reference import ReferenceMachine
    small = parse_chip("row_depth=16")
    assert MAX_CONTEXT == max_context(BOOK) == 64 and max_context(small) == 16
    check_decode(17, None, 4, 64)
    with pytest.raises(HostError, match="exceeds the chip's limit of 16"):
        check_decode(17, None, 4, 64, config=small)
    check_decode(17, 16, 4, 64, config=small)               # a window of 16 keeps every context within K
    with pytest.raises(HostError, match="exceeds the chip's limit of 16"):
        PagedChip(T.make_model("structured", 1), 17, None, config=small)
    wide = parse_chip("array=8")
    chip = PagedChip(T.make_model("structured", 1), 3, None, backend=ReferenceMachine(config=wide), config=wide)
    toks, _ = chip.generate(0, 3)
    assert toks == [0, 3, 2, 13] and {P.config for P in chip.progs.values()} == {wide}
