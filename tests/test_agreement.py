"""The compiled programs on the reference machine read back exactly what the integer interpreter
computes, and the chip agrees with the float model as the book reports (model spec 6.1)."""
import random

import pytest

import compiler as C
from host.agreement import agreement_study, decode_forced
from host.calibrate import calibrate
from host.tiny_lm import build_graph, make_model

from sim.backends import reference     # a plain import: a broken or missing reference machine must fail, not skip


@pytest.fixture(scope="module")
def machine():
    return reference.ReferenceMachine()


def _check_equal(P, inputs, machine):
    outs, result = C.run(P, inputs, machine)
    want = C.interpret(P, inputs)
    assert {k: v[0] for k, v in outs.items()} == want
    assert result.counters == P.counters()
    return outs


@pytest.mark.parametrize("kind, seed, contexts", [
    ("structured", None, (1, 2, 5, 9, 17)),
    ("random", 1, (1, 3, 6, 12)),
    ("random", 2, (2, 7)),
    ("random", 3, (4, 10)),
])
def test_interpreter_equals_reference_machine(machine, kind, seed, contexts):
    m = make_model(kind, seed)
    calib, ranges = calibrate(m, max(contexts), None, starts=range(0, 16, 5))
    for n in contexts:
        P = C.compile_graph(build_graph(m, n), calib[n], ranges=ranges)
        for sample in calib[n]:
            outs = _check_equal(P, sample, machine)
            assert outs["tok"][1][0][0] == float(outs["tok"][0][0][0])
            assert outs["logits"][1][0] == [v * P.scales[P.ext_map["logits"].node] for v in outs["logits"][0][0]]


def test_generic_graph_on_reference_machine(machine):
    """Tiles in both directions, a transposed B wider than 4, multi-row softmax/argmax, a slice, an
    int4 weight and no buffer reuse: the emitted code still equals the interpreter."""
    rnd = random.Random(7)
    mat = lambda r, c: [[rnd.gauss(0, 1) for _ in range(c)] for _ in range(r)]
    g = C.Graph()
    a = g.input("a", (6, 20))
    w = g.weight("W", mat(20, 7))
    b = g.matmul(a, w)
    s = g.matmul(b, g.weight("Kt", mat(9, 7)), transpose_b=True, scale=0.5)
    p = g.softmax(s)
    w4 = g.weight("W4", mat(9, 5), bits=4)
    h = g.relu(g.matmul(p, w4))
    top = g.slice_rows(h, 2, 3)
    g.output(top, "top")
    g.output(g.argmax(s), "arg")
    g.output(b, "b")
    samples = [{"a": mat(6, 20)} for _ in range(3)]
    for reuse in (True, False):
        P = C.compile_graph(g, samples, reuse=reuse)
        assert any(note.startswith("node 2 tile i0=4 j0=4") for note in P.notes)
        assert any(note.startswith("unpack W4") for note in P.notes)
        for smp in samples + [{"a": mat(6, 20)}]:
            _check_equal(P, smp, machine)


def test_step_three_chip_logit():
    # spec 1.5: the compiled chip gives 7.8181 for token 13 at step 3 from start 0 (book: +7.82)
    m = make_model("structured")
    calib, ranges = calibrate(m, 12)
    progs = {L: C.compile_graph(build_graph(m, L), calib[L], ranges=ranges) for L in (1, 2, 3)}
    steps = list(decode_forced(m, progs, 0, 3))
    L, ctok, clog, ftok, flog = steps[2]
    assert ctok == ftok == 13 and round(clog[13], 4) == 7.8181


def test_agreement_study():
    r = agreement_study(seeds=(1, 2, 3), starts=range(16), steps=12)
    assert (r["agree"], r["total"]) == (559, 576)
    assert round(100 * r["mean_err"], 1) == 2.3
    assert round(100 * r["worst_err"], 1) == 6.1


def test_agreement_on_reference_machine(machine):
    # one model, a few starts: the machine gives the interpreter's numbers, decision by decision
    m = make_model("random", 1)
    calib, ranges = calibrate(m, 6)
    progs = {L: C.compile_graph(build_graph(m, L), calib[L], ranges=ranges) for L in range(1, 7)}
    for s in (0, 9):
        a = list(decode_forced(m, progs, s, 6))
        b = list(decode_forced(m, progs, s, 6, backend=machine))
        assert a == b
