"""`python -m sim.sweep`: the decode on a grid of chip configurations, on the reference machine (no builds).

The figures are the spec's (the book's chip: 7,259 cycles for a step at context 4, 231,792 for the window-4
decode) and the reference machine's prediction for array=8,mm_load=4 (142,588, which Verilator's run of
that chip also gives: README, "The chip generator").
"""
import json

from sim import ga2, sweep

CONFIGS = "book;array=8,mm_load=4"


def _run(tmp_path, capsys, *extra):
    out = tmp_path / "sw"
    status = ga2.main(["sweep", "--out", str(out), "--sim", "reference", "--configs", CONFIGS, *extra])
    return status, out, capsys.readouterr()


def test_sweep_figures_and_identical_tokens(tmp_path, capsys):
    status, out, cap = _run(tmp_path, capsys)
    assert status == 0, cap.err
    doc = json.loads((out / "sweep.json").read_text())
    rows = {r["chip"]: r for r in doc["rows"]}
    assert list(rows) == ["book", "array=8,mm_load=4"]
    book, fast = rows["book"], rows["array=8,mm_load=4"]
    assert (book["cycles_ctx1"], book["cycles_ctx4"], book["total_w4"]) == (7000, 7259, 231792)
    assert book["ctx4_step"] == 4 and book["ctx4_all_equal"] is True
    assert fast["total_w4"] == 142588
    assert fast["cycles_ctx4"] == 4465
    # the structured model's rule f(t) = 5t+3 mod 16, on both chips
    expect = [0]
    for _ in range(sweep.STEPS):
        expect.append((5 * expect[-1] + 3) % 16)
    assert book["tokens"] == fast["tokens"] == doc["book_tokens"] == expect
    md = (out / "sweep.md").read_text()
    assert "| `book` | 7,000 | 7,259 | 231,792 | the book's |" in md
    assert "| `array=8,mm_load=4` | 4,308 | 4,465 | 142,588 | identical |" in md
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.iterdir()) == ["sweep.json", "sweep.md", "sweep.png"]


def test_a_changed_logit_is_exit_1_naming_the_chip_and_step(tmp_path, capsys, monkeypatch):
    real = sweep.decode

    def planted(cfg, sim):
        run = real(cfg, sim)
        if cfg.spec() == "array=8,mm_load=4":
            run["records"][6]["logits_int"][3] += 1          # step 7, one logit one step off
        return run

    monkeypatch.setattr(sweep, "decode", planted)
    status, out, cap = _run(tmp_path, capsys)
    assert status == 1
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: chip array=8,mm_load=4 differs from the book's chip at step 7: integer "
                               "logit 3 is ")
    assert not (out / "sweep.json").exists()


def test_a_changed_token_names_its_step(monkeypatch):
    run = {"tokens": [0, 3], "records": [{"L": 1, "tok": 3, "logits_int": [1, 2]}]}
    book = json.loads(json.dumps(run))
    assert sweep.first_difference(run, book) is None
    run["records"][0]["tok"] = 4
    assert sweep.first_difference(run, book) == "step 1: token 4, the book's 3"


def test_fits_the_ulx3s_85f():
    assert sweep.fits({"lut": 83640, "dsp": 156, "ebr": 208})
    assert not sweep.fits({"lut": 83641, "dsp": 1, "ebr": 1})
    assert not sweep.fits({"lut": 1, "dsp": 157, "ebr": 1})
    assert not sweep.fits({"lut": 1, "dsp": 1, "ebr": 209})


def test_bad_configs_are_one_line(tmp_path, capsys):
    for bad, words in (("book;array=3", "array must be a power of two"), ("book;book", "again"), (";", "no configuration")):
        assert ga2.main(["sweep", "--out", str(tmp_path / "x"), "--configs", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: --configs") and words in err[0], err
    assert not (tmp_path / "x").exists()


def test_synth_without_the_extra_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("yowasp") else real(name, *a))
    monkeypatch.setattr(sweep, "sweep", lambda *a, **k: (_ for _ in ()).throw(AssertionError("work began")))
    assert ga2.main(["sweep", "--out", str(tmp_path / "x"), "--synth"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the synthesis extra is not installed")
    assert not (tmp_path / "x").exists()


def test_synth_columns_and_a_chip_that_does_not_fit(tmp_path):
    def row(chip, lut, dsp, ebr, fmax):
        s = {"lut": lut, "dsp": dsp, "ebr": ebr, "fmax_mhz": fmax}
        s["fits_ulx3s_85f"] = sweep.fits(s)
        return {"chip": chip, "cycles_ctx1": 7000, "cycles_ctx4": 7259, "total_w4": 231792, "synth": s}
    doc = {"sim": "reference", "steps": 32, "window": 4, "synth": True,
           "board": {"name": "ulx3s-85f", **sweep.ULX3S_85F},
           "rows": [row("book", 4949, 22, 10, 31.54), row("array=16", 90000, 300, 10, None)]}
    md = sweep.format_markdown(doc)
    assert "| `book` | 7,000 | 7,259 | 231,792 | the book's | 4,949 | 22 | 10 | 31.5 | fits |" in md
    assert "| `array=16` | 7,000 | 7,259 | 231,792 | identical | 90,000 | 300 | 10 | - | does not fit |" in md
    sweep.draw(doc, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.png"]
