"""Differential fuzzing: random programs from `sim.progen` on the reference machine and on a backend.

    python -m sim.fuzz --sim verilator --count 200 --seed S [--ext 2048] [--lat 8]

Prints one line per program whose memory or counters differ (with the first differing instruction,
found by re-running the program's prefixes, and the first differing counter or word) and a summary
line. Exit status 0 when every program matches, 1 on any mismatch, 2 for bad input.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

from hdl.isa import describe, halt

from sim.backend import Backend, RunResult, SimError, first_difference, get_backend
from sim.cli import UsageError, guarded

__all__ = ["fuzz", "locate", "run_batch", "CheckedBackend", "main"]

_HALT = halt().word


def run_batch(backend, pairs, lat: int) -> list:
    """Run ``(program, image)`` pairs; each entry is a `RunResult` or the `SimError` that run raised.

    Uses the Verilator backend's single-invocation batch when there is one.
    """
    if getattr(backend, "name", None) == "verilator":
        return backend.run_many(pairs, lat=lat, return_errors=True)
    out = []
    for program, image in pairs:
        try:
            out.append(backend.run(program, image, lat))
        except SimError as e:
            out.append(e)
    return out


def _compare(expected, got) -> str | None:
    """None when the two outcomes agree (equal results, or the same kind of error), else the difference."""
    if isinstance(expected, Exception) or isinstance(got, Exception):
        if type(expected) is type(got):
            return None
        def outcome(r):
            return f"{type(r).__name__} ({r})" if isinstance(r, Exception) else "a normal halt"
        return f"expected {outcome(expected)}, got {outcome(got)}"
    return first_difference(expected, got)


def locate(program, image, lat, backend, reference) -> int | None:
    """The pc of the first instruction after which the backend and the reference disagree.

    Runs every prefix ``program[:k] + [HALT]``; the first k that differs names instruction k-1.
    """
    prefixes = [(list(program[:k]) + [_HALT], image) for k in range(1, len(program))]
    ref = run_batch(reference, prefixes, lat)
    got = run_batch(backend, prefixes, lat)
    for k, (a, b) in enumerate(zip(ref, got), start=1):
        if _compare(a, b) is not None:
            return k - 1
    return None


class CheckedBackend(Backend):
    """A backend that runs every program on the reference machine too and stops at the first difference.

    The error names the run (counted from 1: in a decode, run n is step n), the first instruction after
    which the two disagree (pc and assembly) and the first differing counter or word.
    """

    def __init__(self, backend, reference=None):
        from sim.reference import ReferenceMachine
        self.backend = backend
        self.reference = reference or ReferenceMachine()
        self.name = f"{backend.name} (checked against the reference)"
        self.runs = 0

    def run(self, program, image, lat: int = 8) -> RunResult:
        self.runs += 1
        n = self.runs
        try:
            got = self.backend.run(program, image, lat)
        except SimError as e:
            got = e
        try:
            want = self.reference.run(program, image, lat)
        except SimError as e:
            want = e
        diff = _compare(want, got)
        if diff is not None:
            pc = locate(list(program), list(image), lat, self.backend, self.reference)
            where = "" if pc is None else f", first at pc {pc} ({describe(program[pc])})"
            raise SimError(f"run {n} on {self.backend.name} differs from the reference: {diff}{where}")
        if isinstance(got, SimError):
            raise got
        return got


def fuzz(backend, reference, count: int, seed: int, ext: int = 2048, lat: int = 8, out=sys.stdout) -> dict:
    """Compare `count` random programs of `seed`; print one line per failure. Returns a summary dict."""
    from sim.progen import random_program
    rng = random.Random(seed)
    pairs = [random_program(rng, ext) for _ in range(count)]
    t0 = time.perf_counter()
    expected = run_batch(reference, pairs, lat)
    t1 = time.perf_counter()
    got = run_batch(backend, pairs, lat)
    t2 = time.perf_counter()
    failures = 0
    cycles = 0
    for i, ((program, image), a, b) in enumerate(zip(pairs, expected, got)):
        diff = _compare(a, b)
        if isinstance(b, RunResult):
            cycles += b.cycles
        if diff is None:
            continue
        failures += 1
        pc = locate(program, image, lat, backend, reference)
        where = f"pc {pc} ({describe(program[pc])})" if pc is not None else "pc unknown (only the full program differs)"
        print(f"FAIL program {i} (seed {seed}): first differing instruction {where}; {diff}", file=out)
    return {"count": count, "failures": failures, "cycles": cycles,
            "reference_s": t1 - t0, "backend_s": t2 - t1}


class _Parser(argparse.ArgumentParser):
    def error(self, message):           # one line, no usage dump
        self.exit(2, f"error: {message}\n")


def main(argv=None) -> int:
    p = _Parser(prog="python -m sim.fuzz",
                description="Run random programs (sim.progen) on the reference machine and on a simulator and "
                            "compare every external word and the five counters.")
    p.add_argument("--sim", default="verilator", help="the simulator to check: amaranth or verilator "
                                                      "(default verilator)")
    p.add_argument("--count", type=int, default=200, help="programs to generate (default 200)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--ext", type=int, default=2048, help="external memory words (default 2048)")
    p.add_argument("--lat", type=int, default=8, help="external read latency (default 8)")
    a = p.parse_args(argv)
    if a.count < 1:
        raise UsageError(f"--count must be at least 1, got {a.count}")
    if a.lat < 1:
        raise UsageError(f"--lat must be at least 1, got {a.lat}")
    if not 1536 <= a.ext <= 65536:
        raise UsageError(f"--ext must be within 1536..65536 (random programs need 1536 words), got {a.ext}")
    backend = get_backend(a.sim)
    reference = get_backend("reference")
    s = fuzz(backend, reference, a.count, a.seed, a.ext, a.lat)
    status = "PASS" if s["failures"] == 0 else "FAIL"
    print(f"{status}: {s['count'] - s['failures']}/{s['count']} programs identical on {a.sim} and reference "
          f"(seed {a.seed}, EXT {a.ext}, LAT {a.lat}; {s['cycles']:,} cycles; "
          f"{a.sim} {s['backend_s']:.1f} s, reference {s['reference_s']:.1f} s)")
    return 0 if s["failures"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(guarded(main))
