"""Faults on a simulated serial line: bytes flipped, dropped or inserted, each with a probability, seeded.

`ga2 board-sim --faults flip:P,drop:P,garbage:P --seed S` puts one `FaultyLine` on each direction of the
line (host -> board and board -> host, each with its own random stream drawn from the seed, so what one
direction suffers does not depend on how the bytes of the other were interleaved with it). Every byte
that passes is, independently:

- dropped with probability ``drop`` (it never arrives);
- else flipped with probability ``flip`` (one of its eight bits, drawn uniformly, inverted);
- and preceded by a random byte with probability ``garbage`` (noise on an idle or busy line).

The counts of each kind are kept, so that a run can say how many faults it survived.
"""
from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

__all__ = ["FaultSpec", "FaultyLine", "parse_faults", "faults_arg", "KINDS"]

KINDS = ("flip", "drop", "garbage")


@dataclass(frozen=True)
class FaultSpec:
    """Per-byte probabilities of each kind of fault (0 = none)."""
    flip: float = 0.0
    drop: float = 0.0
    garbage: float = 0.0

    def __bool__(self) -> bool:
        return any((self.flip, self.drop, self.garbage))

    def text(self) -> str:
        """The spec as `parse_faults` reads it (``none`` when there are no faults)."""
        parts = [f"{k}:{getattr(self, k):g}" for k in KINDS if getattr(self, k)]
        return ",".join(parts) or "none"


def parse_faults(text: str) -> FaultSpec:
    """``flip:P,drop:P,garbage:P`` (any subset, each P in 0..0.5) or ``none``; raises ValueError naming the part."""
    text = text.strip()
    if text in ("", "none"):
        return FaultSpec()
    seen: dict[str, float] = {}
    for part in text.split(","):
        kind, sep, value = part.strip().partition(":")
        if not sep or kind not in KINDS:
            raise ValueError(f"{part.strip()!r} is not KIND:P with KIND one of {', '.join(KINDS)}")
        if kind in seen:
            raise ValueError(f"{kind} given twice")
        try:
            p = float(value)
        except ValueError:
            p = -1.0
        if not 0.0 <= p <= 0.5:
            raise ValueError(f"{kind}:{value} must be a probability within 0..0.5")
        seen[kind] = p
    return FaultSpec(**seen)


def faults_arg(text: str) -> FaultSpec:
    """An argparse type for ``--faults``."""
    try:
        return parse_faults(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be flip:P,drop:P,garbage:P (any of them) or none: {e}") from None


faults_arg.__name__ = "fault spec"


class FaultyLine:
    """One direction of the line: `apply` returns the bytes as they arrive at the far end.

    Parameters
    ----------
    spec : FaultSpec
    seed : int
        The random stream's seed (`random.Random`); the same seed and bytes give the same faults.
    """

    def __init__(self, spec: FaultSpec, seed: int):
        self.spec = spec
        self.rng = random.Random(seed)
        self.counts = dict.fromkeys(KINDS, 0)
        self.bytes = 0

    def apply(self, data: bytes) -> bytes:
        self.bytes += len(data)
        s = self.spec
        if not s:
            return data
        rnd = self.rng.random
        out = bytearray()
        for b in data:
            if s.garbage and rnd() < s.garbage:
                out.append(self.rng.randrange(256))
                self.counts["garbage"] += 1
            if s.drop and rnd() < s.drop:
                self.counts["drop"] += 1
                continue
            if s.flip and rnd() < s.flip:
                b ^= 1 << self.rng.randrange(8)
                self.counts["flip"] += 1
            out.append(b)
        return bytes(out)

    def summary(self) -> str:
        return ", ".join(f"{k} {self.counts[k]}" for k in KINDS)
