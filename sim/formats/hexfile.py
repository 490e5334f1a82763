"""The book's program-record file (hardware spec 6.1): read, write, and build records.

Format: one 32-bit word per line as 8 lower-case hex digits, newline-terminated. Word 0 is NP; then
per program NI (HALT included, 1..256), NI*4 instruction words (most significant first), EXT initial
external words, EXT expected words, and the five expected counters. EXT is not in the file: reader and
writer must agree on it (2048 for the book's suites). Neither are LAT and the final scratchpad: `sim.replay`
compares a simulator's scratchpad with the reference machine's instead.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from hdl.isa import ROM_WORDS, Instr, encode, from_words32, to_words32

__all__ = ["ProgramRecord", "HexFileError", "write_records", "read_records", "make_record",
           "format_records", "parse_records"]

_W = 0xFFFFFFFF
_GOOD_FILE = re.compile(r"(?:[0-9a-fA-F]{8}\n)*")
_GOOD_LINE = re.compile(r"[0-9a-fA-F]{8}")


class HexFileError(ValueError):
    """A program-record file that cannot be read or written (one line: where and what was expected)."""


@dataclass
class ProgramRecord:
    """One program of a record file.

    Attributes
    ----------
    program : list of int
        128-bit instruction words, HALT last.
    image : list of int
        Initial external memory (EXT unsigned words).
    expected_ext : list of int
        External memory after the run (EXT unsigned words).
    expected_counters : list of int
        ``[cyc_total, cyc_mm, cyc_dma, cyc_vec, n_inst]``.
    """
    program: list
    image: list
    expected_ext: list
    expected_counters: list


def make_record(program, image, lat: int = 8) -> ProgramRecord:
    """A record whose expected image and counters come from the reference machine."""
    from sim.backends.reference import ReferenceMachine
    words = [encode(w) if isinstance(w, Instr) else w for w in program]
    result = ReferenceMachine().run(words, image, lat=lat)
    return ProgramRecord(words, [w & _W for w in image], list(result.ext), list(result.counters))


# ---- writing ---------------------------------------------------------------------------------------

def _record_words(i: int, rec: ProgramRecord, ext: int) -> list[int]:
    prog = [encode(w) if isinstance(w, Instr) else w for w in rec.program]
    if not 1 <= len(prog) <= ROM_WORDS:
        raise HexFileError(f"program {i}: {len(prog)} instructions (a record holds 1..{ROM_WORDS})")
    for name, seq in (("image", rec.image), ("expected_ext", rec.expected_ext)):
        if len(seq) != ext:
            raise HexFileError(f"program {i}: {name} has {len(seq)} words, the file's EXT is {ext}")
    if len(rec.expected_counters) != 5:
        raise HexFileError(f"program {i}: {len(rec.expected_counters)} counters (expected 5)")
    out = [len(prog)]
    for k, w in enumerate(prog):
        if not isinstance(w, int) or not 0 <= w < (1 << 128):
            raise HexFileError(f"program {i}: instruction {k} = {w!r} is not a 128-bit word")
        out += to_words32(w)
    for name, seq in (("image", rec.image), ("expected_ext", rec.expected_ext),
                      ("expected_counters", rec.expected_counters)):
        for k, w in enumerate(seq):
            if not isinstance(w, int) or not -(1 << 31) <= w <= _W:
                raise HexFileError(f"program {i}: {name}[{k}] = {w!r} is not a 32-bit word")
            out.append(w & _W)
    return out


def format_records(records, ext: int | None = None) -> str:
    """The file text for `records` (EXT taken from the first record's image unless given)."""
    records = list(records)
    if ext is None:
        ext = len(records[0].image) if records else 0
    words = [len(records)]
    for i, rec in enumerate(records):
        words += _record_words(i, rec, ext)
    return "".join(f"{w:08x}\n" for w in words)


def write_records(path, records, ext: int | None = None) -> None:
    """Write `records` to `path` in the book's format (every image must have the same length EXT)."""
    text = format_records(records, ext)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write(text)


# ---- reading ---------------------------------------------------------------------------------------

def _first_bad_line(text: str, where: str) -> str:
    lines = text.split("\n")
    for n, line in enumerate(lines):
        if n == len(lines) - 1 and line == "":
            break
        if not _GOOD_LINE.fullmatch(line):
            shown = line if len(line) <= 20 else line[:20] + "..."
            return f"{where}: line {n + 1} (word offset {n}): {shown!r} is not a 32-bit word of 8 hex digits"
    return f"{where}: the last line has no newline"


def parse_records(text: str, ext: int = 2048, where: str = "<text>") -> list[ProgramRecord]:
    """Parse file text; raises `HexFileError` naming the program, the word offset and what was expected."""
    if not isinstance(ext, int) or ext < 1:
        raise HexFileError(f"{where}: EXT = {ext!r} must be a positive number of words")
    if not _GOOD_FILE.fullmatch(text):
        raise HexFileError(_first_bad_line(text, where))
    words = [int(t, 16) for t in text.split()]
    if not words:
        raise HexFileError(f"{where}: the file is empty (expected NP at word offset 0)")
    np_ = words[0]
    pos = 1
    records = []

    def take(count: int, prog: int, what: str) -> list[int]:
        nonlocal pos
        if pos + count > len(words):
            raise HexFileError(
                f"{where}: truncated in program {prog} at word offset {len(words)}: expected {what} "
                f"({count} words from offset {pos}), the file ends (NP = {np_}, EXT = {ext}: is --ext right?)")
        chunk = words[pos:pos + count]
        pos += count
        return chunk

    for i in range(np_):
        ni = take(1, i, "NI")[0]
        if not 1 <= ni <= ROM_WORDS:
            raise HexFileError(f"{where}: program {i}, word offset {pos - 1}: NI = {ni} is outside "
                               f"1..{ROM_WORDS} (is --ext right?)")
        flat = take(4 * ni, i, f"the {ni} instruction(s)")
        program = [from_words32(flat[4 * k:4 * k + 4]) for k in range(ni)]
        image = take(ext, i, "the initial external memory")
        expected = take(ext, i, "the expected external memory")
        counters = take(5, i, "the five counters")
        records.append(ProgramRecord(program, image, expected, counters))
    if pos != len(words):
        raise HexFileError(f"{where}: word offset {pos}: {len(words) - pos} words after the last of the "
                           f"{np_} programs (expected the end of the file; is --ext right?)")
    return records


def read_records(path, ext: int = 2048) -> list[ProgramRecord]:
    """Read a record file; a missing, unreadable or malformed file raises `HexFileError` (one line)."""
    try:
        with open(path, encoding="ascii", newline="") as f:
            text = f.read()
    except FileNotFoundError:
        raise HexFileError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise HexFileError(f"{path}: byte offset {e.start}: not a text file of hex words") from None
    except OSError as e:
        raise HexFileError(f"{path}: cannot read ({e.strerror})") from None
    return parse_records(text, ext, where=str(path))
