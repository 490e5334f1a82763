"""`python -m sim.decode`: the book's cycle table, the JSON other tools read, and one-line errors.

Expected figures are the spec's (model spec 6.2 and 5.5, the seed's ch15_run output), transcribed here.
"""
import json
import subprocess
import sys

import pytest

from sim import decode

# model spec 6.2: cycles of one step with a context of n tokens, n = 1..32
STEP_CYCLES = [7000, 7101, 7180, 7259, 7378, 7457, 7536, 7615, 7734, 7813, 7892, 7971, 8090, 8169, 8248, 8327,
               8446, 8525, 8604, 8683, 8802, 8881, 8960, 9039, 9158, 9237, 9316, 9395, 9514, 9593, 9672, 9751]
TOTALS = {None: 268346, 8: 241286, 4: 231792}
PROGRAMS = {None: 32, 8: 8, 4: 4}
PAGES_AT_2_9_17_32 = {None: [1, 2, 4, 8], 8: [1, 2, 2, 2], 4: [1, 1, 1, 1]}
PEAK = {None: 8, 8: 3, 4: 2}
RULE = [0, 3, 2, 13, 4, 7, 6, 1, 8, 11, 10, 5, 12, 15, 14, 9]      # f(t) = 5t+3 mod 16 from 0, one cycle
JSON_KEYS = {"window", "page", "steps", "start", "model", "seed", "sim", "chip", "tokens", "programs_compiled",
             "peak_pages", "records"}
RECORD_KEYS = {"L", "ctx", "tok", "pages", "counters", "logits_int"}


def _decode(tmp_path, *args):
    path = tmp_path / "run.json"
    assert decode.main([*args, "--json", str(path), "--quiet"]) == 0
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("decode")
    return {w: _decode(tmp, "--window", "none" if w is None else str(w), "--sim", "reference")
            for w in (None, 8, 4)}


@pytest.mark.parametrize("window", [None, 8, 4])
def test_cycle_table_and_pages_match_the_book(reference_runs, window):
    run = reference_runs[window]
    assert set(run) >= JSON_KEYS
    assert all(set(r) >= RECORD_KEYS for r in run["records"])
    totals = [r["counters"][0] for r in run["records"]]
    context = [n if window is None else min(n, window) for n in range(1, 33)]
    assert totals == [STEP_CYCLES[n - 1] for n in context]
    assert sum(totals) == TOTALS[window]
    assert run["programs_compiled"] == PROGRAMS[window]
    assert [run["records"][i]["pages"] for i in (1, 8, 16, 31)] == PAGES_AT_2_9_17_32[window]
    assert run["peak_pages"] == PEAK[window]
    assert run["tokens"] == [RULE[i % 16] for i in range(33)]
    assert [r["ctx"] for r in run["records"]] == context
    assert all(len(r["logits_int"]) == 16 for r in run["records"])
    assert all(r["tok"] == r["logits_int"].index(max(r["logits_int"])) for r in run["records"])


def test_counters_at_context_1_and_24(reference_runs):
    recs = reference_runs[None]["records"]
    assert recs[0]["counters"] == [7000, 4040, 2449, 375, 67]
    assert recs[23]["counters"] == [9039, 5196, 3203, 490, 74]
    assert recs[1]["counters"] == [7101, 4082, 2499, 380, 69]
    assert recs[31]["counters"] == [9751, 5608, 3459, 530, 76]


def test_amaranth_equals_reference_for_four_steps(tmp_path):
    args = ("--window", "4", "--steps", "4")
    ref = _decode(tmp_path, *args, "--sim", "reference")
    rtl = _decode(tmp_path, *args, "--sim", "amaranth")
    assert rtl["records"] == ref["records"]
    assert rtl["tokens"] == ref["tokens"]


def test_random_model_runs_and_reports_its_seed(tmp_path):
    run = _decode(tmp_path, "--model", "random", "--steps", "3", "--sim", "reference")
    assert run["seed"] == 2 and run["model"] == "random" and len(run["tokens"]) == 4


@pytest.mark.parametrize("args, words", [
    (["--window", "0"], "window"),
    (["--window", "-3"], "window"),
    (["--window", "x"], "window"),
    (["--page", "0"], "--page"),
    (["--pages", "0"], "--pages"),
    (["--steps", "0"], "--steps"),
    (["--sim", "spice"], "spice"),
    (["--start", "16"], "16"),
    (["--steps", "65"], "64"),
    (["--steps", "40", "--pages", "2"], "page"),
    (["--vcd", "w.vcd"], "--vcd needs --sim amaranth"),
    (["--chip", "array=3"], "--chip 'array=3': ChipConfig array must be a power of two"),
    (["--chip", "arary=8"], "unknown parameter 'arary'"),
    (["--chip", "row_depth=16"], "limit of 16"),           # 32 steps, no window: a context of 32 > K 16
])
def test_bad_input_gets_one_line_and_no_json(tmp_path, args, words):
    path = tmp_path / "never.json"
    p = subprocess.run([sys.executable, "-m", "sim.decode", *args, "--sim", "reference", "--json", str(path)]
                       if "--sim" not in args else
                       [sys.executable, "-m", "sim.decode", *args, "--json", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not path.exists() and not (tmp_path / "never.json.tmp").exists()


def test_help_explains_every_option():
    p = subprocess.run([sys.executable, "-m", "sim.decode", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    for opt in ("--window", "--steps", "--start", "--page", "--pages", "--model", "--seed", "--sim", "--json"):
        assert opt in p.stdout


def test_verilator_reproduces_the_cycle_table_for_every_window(reference_runs, tmp_path):
    """Issue 4: the book's cycle table on the RTL in Verilator, records identical to the reference."""
    for window in (None, 8, 4):
        rtl = _decode(tmp_path, "--window", "none" if window is None else str(window), "--sim", "verilator")
        assert rtl["records"] == reference_runs[window]["records"]
        assert rtl["tokens"] == reference_runs[window]["tokens"]
        assert sum(r["counters"][0] for r in rtl["records"]) == TOTALS[window]


def test_vcd_waveform_on_request(tmp_path):
    vcd = tmp_path / "step.vcd"
    run = _decode(tmp_path, "--window", "2", "--steps", "1", "--sim", "amaranth", "--vcd", str(vcd))
    assert run["records"][0]["counters"] == [7000, 4040, 2449, 375, 67]
    head = vcd.read_text()
    assert "$enddefinitions" in head and "cyc_total" in head


def test_check_names_the_step_and_the_first_differing_instruction():
    """--check: a simulator that miscounts from the first VADD on is stopped at step 1, at that VADD."""
    from hdl.isa import Op, operands
    from host import tiny_lm as T
    from host.paged import PagedChip
    from sim.backends import SimError
    from sim.verify.fuzz import CheckedBackend
    from sim.backends.reference import ReferenceMachine

    class MiscountsVadd(ReferenceMachine):
        name = "faulty"

        def run(self, program, image, lat=8):
            res = super().run(program, image, lat)
            if any(operands(w)["op"] == Op.VADD for w in program):
                res.counters[3] += 1
            return res

    chip = PagedChip(T.make_model("structured"), 2, 2, backend=CheckedBackend(MiscountsVadd()))
    with pytest.raises(SimError) as e:
        chip.generate(0, 2)
    program = chip.progs[1].code
    first_vadd = next(pc for pc, w in enumerate(program) if operands(w)["op"] == Op.VADD)
    assert str(e.value).startswith("run 1 on faulty differs from the reference: counter cyc_vec")
    assert f"first at pc {first_vadd} (vadd " in str(e.value)


def test_check_option_puts_the_reference_beside_the_simulator(monkeypatch):
    """--check on a simulator that adds one to cyc_total: stopped at the first step; without --check the
    same simulator runs through (so it is the option that stops it)."""
    import io

    import sim.backends
    from sim.backends import SimError
    from sim.backends.reference import ReferenceMachine

    class OneCycleTooMany(ReferenceMachine):
        name = "faulty"

        def run(self, program, image, lat=8):
            res = super().run(program, image, lat)
            res.counters[0] += 1
            return res

    monkeypatch.setattr(sim.backends, "get_backend", lambda name, **options: OneCycleTooMany())
    args = ["--sim", "reference", "--steps", "2", "--quiet"]
    decode.run_decode(decode.build_parser().parse_args(args), out=io.StringIO())
    with pytest.raises(SimError, match="differs from the reference: counter cyc_total"):
        decode.run_decode(decode.build_parser().parse_args(args + ["--check"]), out=io.StringIO())


def test_a_wider_array_gives_the_same_integers_and_its_own_cycles(reference_runs, tmp_path):
    # matmul tiling only reorders independent tiles: tokens and integer logits are the book's exactly;
    # MM instructions and cycles are the 8x8 chip's own
    book = reference_runs[4]
    wide = _decode(tmp_path, "--window", "4", "--sim", "reference", "--chip", "array=8")
    assert book["chip"] == "book" and wide["chip"] == "array=8"
    assert wide["tokens"] == book["tokens"] == RULE * 2 + [0]
    assert [r["logits_int"] for r in wide["records"]] == [r["logits_int"] for r in book["records"]]
    for b, w in zip(book["records"], wide["records"]):
        cb, cw = b["counters"], w["counters"]
        assert cw[2:4] == cb[2:4]                       # DMA and vector units: untouched
        assert cw[1] < cb[1] and cw[4] < cb[4]          # fewer MM instructions, fewer MM cycles
        # total = 2 per instruction (FETCH, ISSUE) + the units' busy cycles + 2 for HALT
        assert cw[0] - cb[0] == (cw[1] - cb[1]) + 2 * (cw[4] - cb[4])
    assert wide["cycles_total"] < book["cycles_total"] == TOTALS[4]
