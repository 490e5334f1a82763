"""Replay a program-record file on a backend and compare memory and all five counters (hardware spec 6.2).

``python -m sim.replay FILE.hex [--sim reference|amaranth|verilator] [--ext 2048] [--lat 8]``
prints ``PASS: N programs match ...`` (exit 0), ``FAIL: program i: <first difference>`` (exit 1), or,
for input it cannot use, one ``error: ...`` line on stderr (exit 2).
"""
from __future__ import annotations

import argparse
import sys

from hdl.isa import IsaError, validate_program

from sim.backend import BackendUnavailable, RunResult, SimError, first_difference, get_backend
from sim.hexfile import HexFileError, read_records

__all__ = ["replay", "main"]


class _InputError(Exception):
    """Input replay cannot use; the message is printed after 'error: '."""


def replay(records, backend, lat: int = 8, progress=None) -> tuple[str | None, int]:
    """Run every record on `backend`. Returns (None, total cycles) or ("program i: ...", cycles so far).

    Raises `_InputError` for a record whose program is illegal (checked before anything runs).
    """
    for i, rec in enumerate(records):
        try:
            validate_program(rec.program, ext_words=len(rec.image))
        except IsaError as e:
            raise _InputError(f"program {i}: {e}") from None
    total = 0
    batch = 32 if callable(getattr(backend, "run_many", None)) else 1
    for start in range(0, len(records), batch):
        chunk = records[start:start + batch]
        if progress:
            progress(start, len(records))
        results = None
        if batch > 1:
            try:
                results = backend.run_many([(list(r.program), list(r.image)) for r in chunk], lat=lat)
            except BackendUnavailable:
                raise
            except SimError:
                results = None          # run the batch again one by one to name the program
        for k, rec in enumerate(chunk):
            i = start + k
            if results is not None:
                got = results[k]
            else:
                try:
                    got = backend.run(list(rec.program), list(rec.image), lat=lat)
                except BackendUnavailable:
                    raise
                except SimError as e:
                    return f"program {i}: {e}", total
            expected = RunResult(ext=list(rec.expected_ext), counters=list(rec.expected_counters))
            diff = first_difference(expected, got)
            if diff is not None:
                return f"program {i}: {diff}{_where_it_starts(rec, backend, lat)}", total
            total += got.counters[0]
    return None, total


def _where_it_starts(rec, backend, lat) -> str:
    """For a simulator that disagrees with the file: the first instruction after which it also disagrees
    with the reference machine (found by running the program's prefixes on both)."""
    from hdl.isa import describe
    from sim.fuzz import locate
    from sim.reference import ReferenceMachine
    if getattr(backend, "name", None) == "reference":
        return " (the reference machine itself differs from the file's expected values)"
    try:
        pc = locate(list(rec.program), list(rec.image), lat, backend, ReferenceMachine())
    except SimError:
        return ""
    return "" if pc is None else f" (first differing instruction: pc {pc}, {describe(rec.program[pc])})"


class _Parser(argparse.ArgumentParser):
    def error(self, message):           # one line, no usage dump
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _tty_progress():
    if not sys.stderr.isatty():
        return None

    def show(i, n):
        print(f"\rprogram {i + 1}/{n}", end="", file=sys.stderr, flush=True)
    return show


def main(argv=None) -> int:
    p = _Parser(prog="python -m sim.replay",
                description="Run every program of a record file on a simulator and compare memory and counters.")
    p.add_argument("file")
    p.add_argument("--sim", default="reference", help="reference, amaranth or verilator")
    p.add_argument("--ext", type=int, default=2048, help="external memory words per image (default 2048)")
    p.add_argument("--lat", type=int, default=8, help="external read latency (default 8)")
    a = p.parse_args(argv)
    progress = _tty_progress()
    try:
        if a.lat < 1:
            raise _InputError(f"--lat {a.lat} must be >= 1")
        if a.ext < 1:
            raise _InputError(f"--ext {a.ext} must be >= 1")
        backend = get_backend(a.sim)
        records = read_records(a.file, ext=a.ext)
        failure, total = replay(records, backend, lat=a.lat, progress=progress)
    except (_InputError, HexFileError, BackendUnavailable) as e:
        if progress:
            print(file=sys.stderr)
        print(f"error: {e}", file=sys.stderr)
        return 2
    if progress:
        print(file=sys.stderr)
    if failure is not None:
        print(f"FAIL: {failure}")
        return 1
    print(f"PASS: {len(records)} programs match (memory and all five counters), {total} cycles in total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
