"""The argparse types of a request's options, shared by ``sim.serve`` (the trace) and ``sim.decode
--prompt`` (one request alone): each turns the text of one option into its value or says what is wrong."""
from __future__ import annotations

import argparse
import math

__all__ = ["token_list", "span", "arrival", "temperature", "fraction"]


def token_list(text: str) -> list:
    """An argparse type: comma-separated tokens 0..15, e.g. ``3,1,4``."""
    try:
        toks = [int(t) for t in text.split(",")]
    except ValueError:
        toks = []
    if not toks or any(not 0 <= t <= 15 for t in toks):
        raise argparse.ArgumentTypeError(f"must be comma-separated tokens 0..15, got {text!r}")
    return toks


def span(text: str) -> tuple:
    """An argparse type: ``A:B`` with 1 <= A <= B."""
    try:
        a, b = (int(t) for t in text.split(":"))
    except ValueError:
        a = b = 0
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"must be A:B with 1 <= A <= B, got {text!r}")
    return (a, b)


def arrival(text: str):
    """An argparse type: ``all`` or ``poisson:RATE`` (requests per engine step, > 0)."""
    if text == "all":
        return ("all", 0.0)
    if text.startswith("poisson:"):
        try:
            rate = float(text[8:])
        except ValueError:
            rate = 0.0
        if rate > 0 and math.isfinite(rate):
            return ("poisson", rate)
    raise argparse.ArgumentTypeError(f"must be 'all' or 'poisson:RATE' with RATE > 0, got {text!r}")


def temperature(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    try:
        t = float(text)
    except ValueError:
        t = -1.0
    if not (math.isfinite(t) and t >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return t


def fraction(text: str) -> float:
    """An argparse type: a number within 0..1."""
    try:
        f = float(text)
    except ValueError:
        f = -1.0
    if not 0 <= f <= 1:
        raise argparse.ArgumentTypeError(f"must be a number within 0..1, got {text!r}")
    return f
