"""Replay a program-record file on a backend and compare memory and all five counters (hardware spec 6.2).

``python -m sim.replay FILE.hex [--sim reference|amaranth|verilator] [--ext 2048] [--lat 8]``
prints ``PASS: N programs match ...`` (exit 0), ``FAIL: program i: <first difference>`` (exit 1), or,
for input it cannot use, one ``error: ...`` line on stderr (exit 2).

The book's record format holds no scratchpad, so a simulator other than the reference machine is also
compared with the reference machine, scratchpad included, on every program.
"""
from __future__ import annotations

import sys

from hdl.config import BOOK
from hdl.isa import IsaError, validate_program

from sim.backends import (MAX_LAT, BackendUnavailable, BadInput, RunResult, SimError, check_lat, first_difference,
                         get_backend)
from sim.formats.hexfile import HexFileError, read_records

__all__ = ["replay", "main"]


class _InputError(Exception):
    """Input replay cannot use; the message is printed after 'error: '."""


def replay(records, backend, lat: int = 8, progress=None, config=BOOK) -> tuple[str | None, int]:
    """Run every record on `backend`. Returns (None, total cycles) or ("program i: ...", cycles so far).

    Each result must equal the record's expected memory and counters and, unless `backend` is the
    reference machine itself, the reference machine's result, scratchpad included (the file has none).

    Raises `_InputError` for a latency outside 1..MAX_LAT or a record whose program is illegal on the
    chip `config` (both checked before anything runs). The reference machine models the same chip.
    """
    from sim.backends.reference import ReferenceMachine
    try:
        check_lat(lat)
    except BadInput as e:
        raise _InputError(str(e)) from None
    reference = None if _is_reference(backend) else ReferenceMachine(config=config)
    for i, rec in enumerate(records):
        try:
            validate_program(rec.program, ext_words=len(rec.image), cfg=config)
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
            diff = first_difference(expected, got, scratchpad=False)
            if diff is not None:
                return f"program {i}: {diff}{_explain(rec, backend, lat, expected, got, diff, config)}", total
            if reference is not None:
                try:
                    want = reference.run(list(rec.program), list(rec.image), lat=lat)
                except SimError as e:
                    return f"program {i}: the reference machine fails where the file's values match: {e}", total
                diff = first_difference(want, got)
                if diff is not None:
                    return (f"program {i}: {diff} (compared with the reference machine: the file has no "
                            f"scratchpad){_where_it_starts(rec, backend, lat, config)}"), total
            total += got.counters[0]
    return None, total


def _is_reference(backend) -> bool:
    return getattr(backend, "name", None) == "reference"


LAT_GUESSES = 64            # a failing replay tries the reference machine with LAT 1..64 to name a wrong --lat


def _explain(rec, backend, lat, expected, got, diff, config=BOOK) -> str:
    """Why a result differs from the file. When only counters differ and the reference machine gives the
    file's counters with another latency, the file was made for that LAT (record files do not carry it):
    say "is --lat right?". Otherwise: where the simulator starts to differ from the reference machine
    (`_where_it_starts`)."""
    if diff.startswith("counter ") and list(got.ext) == list(expected.ext):
        from sim.backends.reference import ReferenceMachine
        reference = ReferenceMachine(config=config)
        for other in range(1, LAT_GUESSES + 1):
            if other == lat:
                continue
            try:
                counters = reference.run(list(rec.program), list(rec.image), lat=other).counters
            except SimError:
                continue
            if list(counters) == list(expected.counters):
                return (f" (memory matches, and the file's counters are the reference machine's with LAT {other}, "
                        f"not {lat}: is --lat right? a record file does not say which LAT it was made for)")
    return _where_it_starts(rec, backend, lat, config)


def _where_it_starts(rec, backend, lat, config=BOOK) -> str:
    """For a simulator that disagrees with the file: the first instruction after which it also disagrees
    with the reference machine (found by running the program's prefixes on both)."""
    from hdl.isa import describe
    from sim.verify.fuzz import locate
    from sim.backends.reference import ReferenceMachine
    if _is_reference(backend):
        return " (the reference machine itself differs from the file's expected values)"
    try:
        pc = locate(list(rec.program), list(rec.image), lat, backend, ReferenceMachine(config=config))
    except SimError:
        return ""
    return "" if pc is None else f" (first differing instruction: pc {pc}, {describe(rec.program[pc], config)})"


def build_parser():
    from sim.cli import Parser, chip_option, int_range, sim_option
    p = Parser("python -m sim.replay",
               "Run every program of a record file (the book's format) on a simulator and compare the final "
               "external memory and all five counters with the file's: one PASS line (exit 0), or FAIL with "
               "the first difference (exit 1). The file holds no scratchpad: a simulator other than the "
               "reference machine is also compared with the reference machine, scratchpad included. A record "
               "file does not say which EXT and LAT it was made for: give the same --ext and --lat as "
               "sim.verify.progen was given.",
               "python -m sim.replay suite.hex --sim verilator --ext 2048 --lat 8")
    p.add_argument("file", help="the record file")
    sim_option(p, "reference", help="which simulator runs the programs")
    from sim.cli import board_options
    board_options(p)
    chip_option(p, help="the chip the file's programs were made for")
    p.add_argument("--ext", type=int_range(1, 65536), default=2048, metavar="WORDS",
                   help="external memory words per image, 1..65536")
    p.add_argument("--lat", type=int_range(1, MAX_LAT), default=8, metavar="N",
                   help=f"external read latency the file's counters were computed for, 1..{MAX_LAT}")
    return p


def main(argv=None) -> int:
    from sim.cli import Progress, backend_options, link_report
    a = build_parser().parse_args(argv)
    options = backend_options(a)
    progress = Progress("replaying", unit="program")
    try:
        backend = get_backend(a.sim, config=a.chip, **options)
        records = read_records(a.file, ext=a.ext)
        failure, total = replay(records, backend, lat=a.lat, progress=progress, config=a.chip)
    except (_InputError, HexFileError, BackendUnavailable) as e:
        progress.close()
        print(f"error: {e}", file=sys.stderr)
        return 2
    progress.close()
    link_report(backend)
    if failure is not None:
        print(f"FAIL: {failure}")
        return 1
    scratchpad = "" if _is_reference(backend) else "; the scratchpad as the reference machine's"
    print(f"PASS: {len(records)} programs match (memory and all five counters{scratchpad}), "
          f"{total} cycles in total")
    return 0


if __name__ == "__main__":
    from sim.cli import guarded
    raise SystemExit(guarded(main))
