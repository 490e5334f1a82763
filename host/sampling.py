"""Sampling on the host from the chip's integer logits (issue 21): temperature and top-k with a seed.

The chip gives every generated row its integer logits (`host.batch`: one scale for every program, the
universal calibration's ``logits`` tag) and the token of their argmax. A request that samples replaces that
token by `sample_token`, a function of the row's integer logits, the logits' scale, its temperature and
top-k, its seed, its sample index and the index of the generated token only. Since the integer logits
of a row do not depend on its batch (batch invariance), neither does the sampled token: a request sampled
in any batch gives what it gives alone (`host.engine.decode_alone` with the same parameters).

The random draw is ``random.Random`` seeded with the text ``"seed:sample:index"`` (Python seeds a string
through SHA-512: the same on every machine); the weights are ``exp((l_i - l_max) * scale / T)`` over the
top-k logits (ties broken by the lower token), summed in token order.
"""
from __future__ import annotations

import math
import random

__all__ = ["sample_token", "logit_scale", "check_sampling"]


def check_sampling(temperature, top_k, seed, n) -> str | None:
    """Why these sampling parameters are wrong (None if they are right)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not \
            (math.isfinite(temperature) and temperature >= 0):
        return f"temperature must be a finite number >= 0, got {temperature!r}"
    for name, v, lo in (("top_k", top_k, 0), ("seed", seed, None), ("n", n, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
            return f"{name} must be an integer{'' if lo is None else f' >= {lo}'}, got {v!r}"
    return None


def sample_token(logits, scale: float, temperature: float, top_k: int, seed: int, sample: int, index: int,
                 argmax: int) -> int:
    """The token of generated row `index` of sample `sample` of a request: `argmax` (the chip's) at
    temperature 0, else a draw among the `top_k` largest integer `logits` (0: all of them)."""
    if temperature == 0:
        return argmax
    order = sorted(range(len(logits)), key=lambda t: (-logits[t], t))
    keep = sorted(order[:top_k] if top_k else order)
    top = max(logits[t] for t in keep)
    weights = [math.exp((logits[t] - top) * scale / temperature) for t in keep]
    u = random.Random(f"{seed}:{sample}:{index}").random() * sum(weights)
    acc = 0.0
    for t, w in zip(keep, weights):
        acc += w
        if u < acc:
            return t
    return keep[-1]


def logit_scale(m, config) -> float:
    """The scale of the integer logits of every batched program of model `m` on chip `config`."""
    from host.batch import BatchRunner
    return BatchRunner(m, None, config.lat, config).check((1,)).tag_scales["logits"]
