"""Calibration inputs for the compiler: the float model's own decodes (model spec 1.7, 5.3).

For every start token the float model decodes `steps` tokens; each step's inputs are recorded under
its context size, and the largest |x|, |k|, |v| seen anywhere become the ranges every program shares.
"""
from __future__ import annotations

from .tiny_lm import V, argmax, float_step

__all__ = ["calibrate"]


def calibrate(m, steps: int, W=None, starts=range(V)):
    """Return ``(calib, ranges)``: calib[n] = list of input dicts for context n; ranges x, k, v.

    Without a window (W None) the context of step L is L. With a window it is min(L, W), the previous
    rows being the last n-1 of the float caches, so key W collects every step from W on.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"calibration steps = {steps!r} must be a positive integer")
    if W is not None and (not isinstance(W, int) or W < 1):
        raise ValueError(f"window W = {W!r} must be a positive integer or None")
    calib = {}
    rk = rv = rx = 0.0
    for s in starts:
        toks, kc, vc = [s], [], []
        for L in range(1, steps + 1):
            n = L if W is None else min(L, W)
            prev_k = kc[len(kc) - (n - 1):] if n > 1 else []
            prev_v = vc[len(vc) - (n - 1):] if n > 1 else []
            x = m["E"][toks[-1]]
            logits, k, v, _ = float_step(m, toks[-1], prev_k, prev_v)
            sample = {"x": [x]}
            if n > 1:
                sample["kc"] = [list(r) for r in prev_k]
                sample["vc"] = [list(r) for r in prev_v]
            calib.setdefault(n, []).append(sample)
            rk = max(rk, max(abs(t) for t in k))
            rv = max(rv, max(abs(t) for t in v))
            rx = max(rx, max(abs(t) for t in x))
            kc.append(k)
            vc.append(v)
            toks.append(argmax(logits))
    return calib, {"x": rx, "k": rk, "v": rv}
