"""The tiny LM and its calibration against the check values printed in model spec 1.3-1.7 and 5.3
(the printed digits are the independent source), and the graph's node order of 1.6."""

import pytest

from host.calibrate import calibrate
from host.tiny_lm import (D, HID, V, build_graph, f_next, float_generate, float_step, float_windowed,
                          hadamard, make_model, vm)


@pytest.fixture(scope="module")
def structured():
    return make_model("structured")


def test_constants_and_rule():
    assert (V, D, HID) == (16, 16, 32)
    cycle = [0]
    for _ in range(16):
        cycle.append(f_next(cycle[-1]))
    assert cycle == [0, 3, 2, 13, 4, 7, 6, 1, 8, 11, 10, 5, 12, 15, 14, 9, 0]


def test_hadamard():
    assert hadamard(1) == [[1]]
    assert hadamard(2) == [[1, 1], [1, -1]]
    assert hadamard(4)[2] == [1, 1, -1, -1]
    H = hadamard(16)
    assert H[0] == [1] * 16
    for i in range(16):
        for j in range(16):
            assert sum(a * b for a, b in zip(H[i], H[j])) == (16 if i == j else 0)
    with pytest.raises(ValueError, match="12"):
        hadamard(12)


def test_structured_check_values(structured):
    m = structured
    assert m["Wq"][0][0:3] == [0.14492078472998957, 0.16306263097872423, 0.007462778505554465]
    assert m["Wk"][0][0] == 0.008336229619914419
    assert m["W1"][0][0:2] == [-0.05950636606829746, -0.1505926623167243]
    assert m["W2"][31][15] == -0.0674908231434554
    assert m["E"][5] == [h / 4 for h in hadamard(16)[5]]
    # Wout sends E[t] to logit 8 at f(t) (spec 1.3, item 3)
    for t in range(V):
        row = vm(m["E"][t], m["Wout"])
        assert row[f_next(t)] == 8.0 and all(v == 0 for j, v in enumerate(row) if j != f_next(t))
    shapes = {k: (len(v), len(v[0])) for k, v in m.items() if k != "kind"}
    assert shapes == {"E": (16, 16), "Wq": (16, 16), "Wk": (16, 16), "Wv": (16, 16), "Wo": (16, 16),
                      "W1": (16, 32), "W2": (32, 16), "Wout": (16, 16)}


def test_random_check_values():
    m = make_model("random", 1)
    assert m["E"][0][0:3] == [0.3220461882888657, 0.3623614021749427, 0.016583952234565477]
    assert m["Wout"][0][0] == 0.01852495471092093
    assert m["Wq"][0][0] == -0.12128943234368982
    assert m["W2"][31][15] == 0.23531777486499203
    assert make_model("random", 2)["Wq"][0][0] != m["Wq"][0][0]


def test_model_errors():
    with pytest.raises(ValueError, match="needs a seed"):
        make_model("random")
    with pytest.raises(ValueError, match="'tiny'"):
        make_model("tiny")


def test_step_one_logits(structured):
    logits, k, v, extras = float_step(structured, 0, [], [])
    want = [0.621675, -0.419983, -0.067835, 9.075941, 0.416615, -0.231837, 0.319863, -0.201374, 0.983872,
            0.291633, 0.585776, 0.092993, 0.762975, -0.071369, 1.328341, -0.468158]
    assert [round(x, 6) for x in logits] == want
    assert logits.index(max(logits)) == 3
    assert extras["x"] is structured["E"][0]
    assert len(k) == len(v) == 16 and len(extras["o"]) == len(extras["f"]) == 16


def test_step_three_top_logit(structured):
    toks = float_generate(structured, 0, 3)
    assert toks == [0, 3, 2, 13]
    kc, vc = [], []
    for t in toks[:2]:
        _, k, v, _ = float_step(structured, t, kc, vc)
        kc.append(k)
        vc.append(v)
    logits = float_step(structured, 2, kc, vc)[0]
    assert logits.index(max(logits)) == 13 and round(logits[13], 4) == 7.8266


def test_caller_caches_untouched(structured):
    kc = [[0.1] * 16]
    vc = [[0.2] * 16]
    float_step(structured, 4, kc, vc)
    assert kc == [[0.1] * 16] and vc == [[0.2] * 16]


@pytest.mark.parametrize("W", [None, 8, 4])
def test_structured_follows_rule(structured, W):
    toks = float_generate(structured, 0, 32, W)
    assert len(toks) == 33
    assert all(toks[i + 1] == f_next(toks[i]) for i in range(32))


def test_window_semantics():
    m = make_model("random", 2)
    full = float_generate(m, 3, 12)
    kc, vc = [], []
    for L in range(1, 12):
        a = float_step(m, full[L - 1], kc, vc)
        b = float_windowed(m, full[L - 1], kc, vc, 20)       # a window wider than the context: no change
        assert a[0] == b[0]
        c = float_windowed(m, full[L - 1], kc, vc, 3)
        d = float_step(m, full[L - 1], kc[-2:], vc[-2:])
        assert c[0] == d[0]
        kc.append(a[1])
        vc.append(a[2])
    assert float_windowed(m, 1, kc, vc, 1)[0] == float_step(m, 1, kc, vc)[0]   # W = 1: no truncation


def test_calibration_ranges(structured):
    calib, ranges = calibrate(structured, 32, None)
    assert ranges == {"x": 0.25, "k": 0.36208089716544795, "v": 0.424794920634685}
    assert sorted(calib) == list(range(1, 33))
    assert all(len(calib[n]) == 16 for n in calib)
    s = calib[5][2]                       # start 2, step 5: tokens 2, 13, 4, 7, 6
    assert s["x"] == [structured["E"][6]]
    assert len(s["kc"]) == len(s["vc"]) == 4
    assert "kc" not in calib[1][0]


def test_windowed_calibration(structured):
    calib, ranges = calibrate(structured, 12, 4)
    assert sorted(calib) == [1, 2, 3, 4]
    assert [len(calib[n]) for n in (1, 2, 3)] == [16, 16, 16]
    assert len(calib[4]) == 16 * (12 - 4 + 1)
    assert all(len(s["kc"]) == 3 for s in calib[4])
    calib_full, ranges_full = calibrate(structured, 12)
    assert calib[3] == calib_full[3]


def test_calibrate_errors(structured):
    with pytest.raises(ValueError, match="steps = 0"):
        calibrate(structured, 0)
    with pytest.raises(ValueError, match="W = -1"):
        calibrate(structured, 4, -1)


# spec 1.6: (op, inputs, shape, name, tag) per node for L > 1, with L = 3; the (*) rows are 7-10
GRAPH_L3 = [
    ("input", (), (1, 16), "x", "x"), ("weight", (), (16, 16), "Wq", None), ("matmul", (0, 1), (1, 16), None, None),
    ("weight", (), (16, 16), "Wk", None), ("matmul", (0, 3), (1, 16), None, "k"),
    ("weight", (), (16, 16), "Wv", None), ("matmul", (0, 5), (1, 16), None, "v"),
    ("input", (), (2, 16), "kc", "k"), ("concat", (7, 4), (3, 16), None, "k"),
    ("input", (), (2, 16), "vc", "v"), ("concat", (9, 6), (3, 16), None, "v"),
    ("matmul", (2, 8), (1, 3), None, None), ("softmax", (11,), (1, 3), None, None),
    ("matmul", (12, 10), (1, 16), None, None), ("weight", (), (16, 16), "Wo", None),
    ("matmul", (13, 14), (1, 16), None, None), ("add", (0, 15), (1, 16), None, None),
    ("weight", (), (16, 32), "W1", None), ("matmul", (16, 17), (1, 32), None, None),
    ("relu", (18,), (1, 32), None, None), ("weight", (), (32, 16), "W2", None),
    ("matmul", (19, 20), (1, 16), None, None), ("add", (16, 21), (1, 16), None, None),
    ("weight", (), (16, 16), "Wout", None), ("matmul", (22, 23), (1, 16), None, None),
    ("argmax", (24,), (1, 1), None, None), ("output", (25,), (1, 1), "tok", None),
    ("output", (24,), (1, 16), "logits", None), ("output", (4,), (1, 16), "k_new", None),
    ("output", (6,), (1, 16), "v_new", None),
]


def _l1_rows():
    """The L = 1 column: drop nodes 7-10, ids above 10 shift down by 4, K and Vv become k and v."""
    remap = {i: (i if i < 7 else i - 4) for i in range(30)}
    remap[8], remap[10] = 4, 6
    rows = []
    for i, (op, ins, shape, name, tag) in enumerate(GRAPH_L3):
        if 7 <= i <= 10:
            continue
        shape = (1, 1) if op in ("matmul", "softmax") and shape == (1, 3) else shape
        rows.append((op, tuple(remap[j] for j in ins), shape, name, tag))
    return rows


@pytest.mark.parametrize("L", [1, 3])
def test_graph_node_order(structured, L):
    g = build_graph(structured, L)
    want = GRAPH_L3 if L == 3 else _l1_rows()
    got = [(n.op, n.ins, n.shape, n.attrs.get("name"), n.attrs.get("tag")) for n in g.nodes]
    assert got == want
    scores = g.nodes[11 if L > 1 else 7]
    assert scores.attrs["transpose_b"] and scores.attrs["scale"] == 0.25
    assert g.nodes[1].attrs["array"] == structured["Wq"]
