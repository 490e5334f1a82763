"""The chip-against-float agreement study of Chapters 12/13 (model spec 6.1): random models,
teacher-forced on the float model's own tokens, the chip's dequantized k/v rows as its cache.

``ga2 agreement`` (``python -m sim.agreement``) prints it (book: 559/576, mean 2.3 %, worst 6.1 %); the
integer interpreter stands in for the chip, whose readback equals it exactly.
"""
from __future__ import annotations

import math

import compiler as C

from .calibrate import calibrate
from .paged import MAX_CONTEXT
from .tiny_lm import V, build_graph, float_generate, float_step, make_model

__all__ = ["agreement_study", "decode_forced", "rel_rms", "MAX_STEPS"]


def rel_rms(got, ref) -> float:
    """Relative RMS error of a logit row against the float reference row."""
    return math.sqrt(sum((a - b) ** 2 for a, b in zip(got, ref)) / sum(b * b for b in ref))


def decode_forced(m, programs, start, steps, backend=None):
    """Decode `steps` tokens on the chip from `start`, forcing each next input to the float token.

    `programs[L]` is the compiled program of context L. With `backend` None the integer interpreter
    stands in for the chip (a program's readback on any backend must equal it). Yields per step
    ``(L, chip token, chip float logits, float token, float logits)``.
    """
    ftoks = float_generate(m, start, steps)
    fk, fv, ck, cv = [], [], [], []
    for L in range(1, steps + 1):
        tok = ftoks[L - 1]
        flog, k, v, _ = float_step(m, tok, fk, fv)
        fk.append(k)
        fv.append(v)
        inputs = {"x": [m["E"][tok]]}
        if L > 1:
            inputs["kc"] = [list(r) for r in ck]
            inputs["vc"] = [list(r) for r in cv]
        P = programs[L]
        if backend is None:
            out = C.interpret_readback(P, inputs)
        else:
            out, _ = C.run(P, inputs, backend)
        ck.append(out["k_new"][1][0])
        cv.append(out["v_new"][1][0])
        yield L, out["tok"][0][0][0], out["logits"][1][0], ftoks[L], flog


def agreement_study(seeds=(1, 2, 3), starts=range(V), steps: int = 12, backend=None, progress=None) -> dict:
    """Agreement of the chip's token with the float token and the relative RMS logit error.

    Each random model is calibrated with ``calibrate(m, steps)`` (Chapter 12) and one program per
    context 1..steps is compiled with those samples and ranges. Returns a dict with ``agree``,
    ``total``, ``mean_err``, ``worst_err`` and the per-decision ``errors``. ``progress(done, total)``,
    if given, is called after each decoded (seed, start) pair.
    """
    agree = total = 0
    errors = []
    starts = list(starts)
    done, runs = 0, len(seeds) * len(starts)
    for seed in seeds:
        m = make_model("random", seed)
        calib, ranges = calibrate(m, steps)
        programs = {L: C.compile_graph(build_graph(m, L), calib[L], ranges=ranges) for L in range(1, steps + 1)}
        for s in starts:
            for L, ctok, clog, ftok, flog in decode_forced(m, programs, s, steps, backend):
                agree += ctok == ftok
                total += 1
                errors.append(rel_rms(clog, flog))
            done += 1
            if progress is not None:
                progress(done, runs)
    return {"agree": agree, "total": total, "mean_err": sum(errors) / len(errors),
            "worst_err": max(errors), "errors": errors}


# context L compiles a matmul of inner dimension L, at most the book's matrix unit's K
MAX_STEPS = MAX_CONTEXT

