"""Simulator benchmark: the same workload on every available backend, timed.

    python -m sim.bench [--window 4] [--steps 32] [--sims reference,amaranth,verilator] [--random]

The workload is the paged decode (host.paged, window 4, 32 steps by default): its programs and images
are recorded once on the reference machine, then replayed on each backend, whose results must equal the
reference's. ``--random`` (or a missing host.paged) uses random programs from sim.progen of about the
same total cycles instead. Prints per backend: wall time, cycles simulated per second, and the ratio of
its wall time to the reference machine's. Verilator's build is done (or found in the cache) beforehand
and reported apart; its in-model rate counts only the edges from start to halt.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

from sim.backend import BackendUnavailable, first_difference, get_backend
from sim.cli import UsageError, guarded

__all__ = ["decode_jobs", "random_jobs", "bench", "main"]

SIMULATORS = ("reference", "amaranth", "verilator")


class _Recorder:
    """A backend that runs the reference machine and remembers every (program, image, lat) it was given."""
    name = "recorder"

    def __init__(self, inner):
        self.inner = inner
        self.jobs = []

    def run(self, program, image, lat=8):
        self.jobs.append((list(program), list(image), lat))
        return self.inner.run(program, image, lat)


def decode_jobs(window, steps: int, lat: int = 8, start: int = 0):
    """The (program, image, lat) jobs of a paged decode of the structured tiny LM, recorded on the reference."""
    from host import tiny_lm as T
    from host.paged import PagedChip
    rec = _Recorder(get_backend("reference"))
    chip = PagedChip(T.make_model("structured", 1), steps, window, backend=rec, lat=lat)
    chip.generate(start, steps)
    return rec.jobs


def random_jobs(total_cycles: int, seed: int = 1, ext: int = 8192, lat: int = 8):
    """Random programs (sim.progen) until their reference cycle count reaches `total_cycles`."""
    from sim.progen import random_program
    ref = get_backend("reference")
    rng = random.Random(seed)
    jobs, cycles = [], 0
    while cycles < total_cycles:
        program, image = random_program(rng, ext)
        cycles += ref.run(program, image, lat).cycles
        jobs.append((program, image, lat))
    return jobs


def _run_all(backend, jobs):
    if getattr(backend, "name", None) == "verilator":
        return backend.run_many(jobs)
    return [backend.run(p, i, lat) for p, i, lat in jobs]


def bench(jobs, sims, repeat: int = 3, out=sys.stdout) -> dict:
    """Time `jobs` on each simulator of `sims` (best of `repeat` for the fast ones); prints a table and
    returns {"jobs", "cycles", "backends": {sim: figures}}."""
    reference = get_backend("reference")
    ref_wall = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        expected = [reference.run(p, i, lat) for p, i, lat in jobs]
        ref_wall = min(ref_wall, time.perf_counter() - t0)
    cycles = sum(r.cycles for r in expected)
    rows = {}
    for name in sims:
        extra = ""
        try:
            if name == "reference":
                be, got, wall = reference, expected, ref_wall
            else:
                be = get_backend(name)
                if name == "verilator":
                    tb = time.perf_counter()
                    for key in sorted({(len(i), lat) for _, i, lat in jobs}):
                        be.model(*key)
                    extra = f"build or cache lookup {time.perf_counter() - tb:.1f} s"
                wall, in_model = float("inf"), float("inf")
                # the Python simulator is far too slow to repeat; the others take the best of `repeat`
                for _ in range(repeat if name == "verilator" else 1):
                    t = time.perf_counter()
                    got = _run_all(be, jobs)
                    wall = min(wall, time.perf_counter() - t)
                    in_model = min(in_model, getattr(be, "last_run_seconds", float("inf")))
        except BackendUnavailable as e:
            print(f"{name:>10}: not available ({e})", file=out)
            continue
        diff = next((f"job {k}: {d}" for k, (a, b) in enumerate(zip(expected, got))
                     if (d := first_difference(a, b)) is not None), None)
        row = {"wall_s": wall, "cycles_per_s": cycles / wall if wall > 0 else float("inf"),
               "ratio_to_reference": wall / ref_wall if ref_wall > 0 else float("inf"),
               "identical": diff is None}
        if name == "verilator":
            row["in_model_s"] = in_model
            row["in_model_cycles_per_s"] = cycles / in_model if in_model > 0 else float("inf")
            extra += (f"; in-model {row['in_model_cycles_per_s']:,.0f} cycles/s ({in_model:.3f} s from start "
                      f"pulses to halts; the rest of the wall time is process start, loading and read-back)")
        rows[name] = row
        print(f"{name:>10}: {wall:9.3f} s wall  {row['cycles_per_s']:>14,.0f} cycles/s  "
              f"x{row['ratio_to_reference']:<9.2f} the reference's time  "
              f"{'identical to the reference' if diff is None else 'DIFFERS: ' + diff}", file=out)
        if extra:
            print(f"{'':>12}{extra}", file=out)
    return {"jobs": len(jobs), "cycles": cycles, "backends": rows}


class _Parser(argparse.ArgumentParser):
    def error(self, message):           # one line, no usage dump
        self.exit(2, f"error: {message}\n")


def main(argv=None) -> int:
    p = _Parser(prog="python -m sim.bench",
                description="Run one workload on every available simulator and report cycles per second.")
    p.add_argument("--window", default="4", help="decode window: a whole number or 'none' (default 4)")
    p.add_argument("--steps", type=int, default=32, help="decode steps (default 32)")
    p.add_argument("--lat", type=int, default=8, help="external read latency (default 8)")
    p.add_argument("--sims", default=",".join(SIMULATORS),
                   help=f"comma-separated simulators (default {','.join(SIMULATORS)})")
    p.add_argument("--repeat", type=int, default=3,
                   help="timed runs per fast simulator, the best is reported (default 3; amaranth runs once)")
    p.add_argument("--random", action="store_true",
                   help="random programs of about the decode's total cycles instead of the decode")
    a = p.parse_args(argv)
    sims = [s.strip() for s in a.sims.split(",") if s.strip()]
    bad = [s for s in sims if s not in SIMULATORS]
    if bad or not sims:
        raise UsageError(f"--sims must list some of {', '.join(SIMULATORS)}, got {a.sims!r}")
    if a.window.lower() == "none":
        window = None
    elif a.window.isdigit() and int(a.window) >= 1:
        window = int(a.window)
    else:
        raise UsageError(f"--window must be 'none' or a whole number >= 1, got {a.window!r}")
    if not 1 <= a.steps <= 64:
        raise UsageError(f"--steps must be within 1..64, got {a.steps}")
    if a.lat < 1:
        raise UsageError(f"--lat must be at least 1, got {a.lat}")
    if a.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {a.repeat}")

    what = None
    if not a.random:
        try:
            jobs = decode_jobs(window, a.steps, a.lat)
            what = f"paged decode, window {a.window}, {a.steps} steps"
        except ImportError as e:
            print(f"(the decode is not available: {e}; using random programs)", file=sys.stderr)
    if what is None:
        jobs = random_jobs(231_792, ext=8192, lat=a.lat)
        what = f"random programs (sim.progen, seed 1, EXT 8192)"
    exts = sorted({len(i) for _, i, _ in jobs})
    print(f"workload: {what}: {len(jobs)} programs, EXT {'/'.join(map(str, exts))}, LAT {a.lat}")
    r = bench(jobs, sims, a.repeat)
    print(f"{r['cycles']:,} chip cycles per backend")
    return 0 if all(row["identical"] for row in r["backends"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(guarded(main))
