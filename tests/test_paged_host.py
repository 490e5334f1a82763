"""The paged host (model spec 5.4) on the reference machine: paged == plain host in integers, exact page
counts, the rule under every window, the chapter's 32-step decodes, 5c, and argument errors."""
import math

import pytest

from host import tiny_lm as T
from host.paged import HostError, PagedChip
from host.pagetable import OutOfPages
from sim.reference import ReferenceMachine
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


@pytest.fixture(scope="module")
def pair_runs(structured):
    runs = {}
    for W, page in PAIRS:
        chip = PagedChip(structured, 24, W, page, 64, backend=MACHINE)
        t1, r1 = chip.generate(0, 24)
        peak = chip.peak
        chip.paged = False
        t2, r2 = chip.generate(0, 24)
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
        assert peak <= B + 1 and r1[-1]["pages"] <= B
        assert sorted(chip.progs) == list(range(1, W + 1))
    # spec 5.4: the page table is kept in parallel either way; only the gather's source differs
    assert [r["pages"] for r in r2] == [r["pages"] for r in r1]


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
def test_out_of_pages(structured):
    chip = PagedChip(structured, 12, None, 4, 2, backend=MACHINE)
    with pytest.raises(OutOfPages):
        chip.generate(0, 12)            # 8 rows fit in 2 pages; the 9th append needs a third


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
])
def test_bad_construction(structured, kwargs, message):
    args = {"steps": 4, "W": None, "page": 4, "n_pages": 64, **kwargs}
    with pytest.raises(HostError) as e:
        PagedChip(structured, **args)
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
    # layer rule: host/ imports compiler only; the backend object is passed in
    import subprocess
    import sys
    code = ("import sys, host.paged, host.pagetable, host.window; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sim', 'amaranth')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__file__.rsplit("/tests/", 1)[0]).stdout.strip()
    assert out == "[]"
