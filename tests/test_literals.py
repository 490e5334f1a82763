"""No literal chip dimension outside `hdl/config.py` (issue 12: every layer derives from one configuration).

A grep over the code (comments and strings are blanked first: prose may say "4096 words on the book's
chip") of hdl/, compiler/, host/ and sim/ for the numbers that used to be copied by hand: the scratchpad
depth 4096, the divider's numerator ``1 << 38``, 12-bit scratchpad address widths, and the array size,
operand-memory depth and context limit written as literals. What may stay is in `ALLOWED`, each entry with
its reason; an entry that no longer matches anything fails too, so the list cannot go stale.
"""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("hdl", "compiler", "host", "sim")
CONFIG = "hdl/config.py"            # the one place the book's numbers are written

# name -> pattern over one line of code (comments and strings blanked)
PATTERNS: dict[str, re.Pattern] = {
    "scratchpad depth 4096": re.compile(r"(?<![\w.])4096(?![\w.])"),
    "divider numerator 1 << 38": re.compile(r"\b1\s*<<\s*38\b"),
    "12-bit address width": re.compile(r"\b(?:Signal|unsigned|signed)\(\s*12\s*[,)]|\baw\s*=\s*12\b"),
    "array size ARRAY_N = 4": re.compile(r"\bARRAY_N\s*=\s*4\b"),
    "operand depth ROW_DEPTH = 64": re.compile(r"\bROW_DEPTH\s*=\s*64\b"),
    "context limit MAX_CONTEXT = 64": re.compile(r"\bMAX_CONTEXT\s*=\s*64\b"),
}

# (path, pattern name, text the line contains) -> why it may stay. Keep it short.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("hdl/arith.py", "divider numerator 1 << 38", "SOFTMAX_NUM = 1 << 38"):
        "the one definition of the SM unit's numerator (arithmetic, not a chip dimension); the golden "
        "softmax, hdl.softmax and hdl.units.sm import it",
    ("sim/paging_study.py", "scratchpad depth 4096", "WINDOW_4 = "):
        "the paging study's serving arithmetic: a 4096-token window of a 7e9-parameter model, not this chip",
}


def code_lines(text: str) -> list[str]:
    """The lines of a Python source with every comment and string literal blanked out (same line count)."""
    lines = text.splitlines()
    blank = [list(line) for line in lines]
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        (r0, c0), (r1, c1) = tok.start, tok.end
        for r in range(r0, r1 + 1):
            row = blank[r - 1]
            lo = c0 if r == r0 else 0
            hi = c1 if r == r1 else len(row)
            row[lo:hi] = " " * (hi - lo)
    return ["".join(row) for row in blank]


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
                  if p.relative_to(ROOT).as_posix() != CONFIG)


def find_literals(files) -> list[tuple[str, int, str, str]]:
    """Every (path, line number, pattern name, source line) where a pattern matches the code."""
    hits = []
    for path in files:
        text = path.read_text()
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        raw = text.splitlines()
        for i, line in enumerate(code_lines(text)):
            for name, pattern in PATTERNS.items():
                if pattern.search(line):
                    hits.append((rel, i + 1, name, raw[i].strip()))
    return hits


def _allowed(hit) -> tuple | None:
    path, _, name, line = hit
    return next((key for key in ALLOWED if key[0] == path and key[1] == name and key[2] in line), None)


def test_no_literal_chip_dimension_outside_the_configuration():
    hits = find_literals(sources())
    bad = [f"{p}:{n}: {name}: {line}" for p, n, name, line in hits if _allowed((p, n, name, line)) is None]
    assert not bad, "literal chip dimensions (derive them from hdl.config):\n" + "\n".join(bad)


def test_every_allowed_literal_is_still_there():
    used = {_allowed(h) for h in find_literals(sources())}
    stale = [key for key in ALLOWED if key not in used]
    assert not stale, f"allow-list entries that match nothing (remove them): {stale}"


@pytest.mark.parametrize("line, name", [
    ("SPAD = 4096", "scratchpad depth 4096"),
    ("NUM = 1 << 38", "divider numerator 1 << 38"),
    ("self.addr = Signal(12)", "12-bit address width"),
    ("a = Signal(unsigned(12), init=0)", "12-bit address width"),
    ("DMA(aw=12, xw=16)", "12-bit address width"),
    ("ARRAY_N = 4", "array size ARRAY_N = 4"),
    ("ROW_DEPTH = 64", "operand depth ROW_DEPTH = 64"),
    ("MAX_CONTEXT = 64", "context limit MAX_CONTEXT = 64"),
])
def test_each_pattern_finds_its_literal(tmp_path, line, name):
    # the check can fail: a file holding the literal in code is found, the same text in prose is not
    f = tmp_path / "m.py"
    f.write_text(f'"""{line} in a docstring"""\nx = 1  # {line} in a comment\n{line}\n')
    assert [(n, nm) for _, n, nm, _ in find_literals([f])] == [(3, name)]


def test_numbers_that_only_contain_a_dimension_are_not_literals(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("a = 40960\nb = 0x4096\nc = 4096.5\nd = Signal(120)\ne = 1 << 380\nMAX_CONTEXT = 640\n")
    assert find_literals([f]) == []
