"""Example B of the chapter (sim.paging_study): the four tables equal the seed's recorded output."""
import json
import math
import re
import subprocess
import sys

import pytest

from sim import paging_study as S
from sim.cli import guarded

# ---- the seed's recorded tables (transcribed) ------------------------------------------------------
SEED_PART1 = """\
contiguous (reserve 2048)              4       1022           8192    87.5%
paged, page = 1                    34       7852           7852     0.0%
paged, page = 4                    34       7852           7916     0.8%
paged, page = 16                   34       7852           8112     3.2%
paged, page = 64                   27       7308           8128    10.1%
paged, page = 256                  20       5267           7680    31.4%"""
SEED_LENGTHS = "   400 sample lengths: mean 274, median 194, max 1884"
SEED_PART2 = """\
          96    16             72             30     58%                     0
          96    40             32             18     44%                     8
         100    16             72             30     58%                     8
         100    40             32             18     44%                     8
         250    16            152             47     69%                     8
         250    40             64             22     66%                     8"""
SEED_PART3 = """\
   2    824/1152 ( 71.5%)             30.3%
   4    878/1152 ( 76.2%)             20.1%
   8    951/1152 ( 82.6%)             10.8%
  16   1077/1152 ( 93.5%)              2.8%
  24   1152/1152 (100.0%)              0.0%"""
SEED_PART4 = """\
    2048          0.50              135                 0.50                135
    8192          2.00               33                 1.00                 67
   32768          8.00                8                 1.00                 67
  131072         32.00                2                 1.00                 67"""


def numbers(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", text)


def rows_numbers(seed_table: str) -> list[list[str]]:
    return [numbers(line) for line in seed_table.splitlines()]


def printed_rows(lines: list[str], count: int) -> list[list[str]]:
    """The numbers of the last `count` table rows before the closing remark."""
    body = [ln for ln in lines if ln.strip() and re.match(r"^\s*(\d|contiguous|paged)", ln)]
    return [numbers(ln) for ln in body[-count:]]


def test_part1_memory():
    r = S.memory_study()
    lines = S.table_memory(r)
    assert numbers(SEED_LENGTHS) == numbers(next(ln for ln in lines if "sample lengths" in ln))
    assert printed_rows(lines, 6) == rows_numbers(SEED_PART1)


def test_part2_sharing():
    lines = S.table_sharing(S.sharing_study())
    assert printed_rows(lines, 6) == rows_numbers(SEED_PART2)


def test_part3_window_accuracy():
    r = S.window_study()
    assert [r[W][:2] for W in S.WINDOWS_3] == [[824, 1152], [878, 1152], [951, 1152], [1077, 1152], [1152, 1152]]
    assert [round(100 * r[W][2], 1) for W in S.WINDOWS_3] == [30.3, 20.1, 10.8, 2.8, 0.0]
    assert printed_rows(S.table_window(r), 5) == rows_numbers(SEED_PART3)


def test_part4_serving():
    lines = S.table_serving(S.serving_study())
    assert printed_rows(lines, 4) == rows_numbers(SEED_PART4)


def test_command_writes_json_and_figures(tmp_path, capsys):
    # decode files as sim.decode writes them; the cycles are spec 6.2's closed form T(n)
    def T(n):
        return 7000 if n == 1 else 6903 + 79 * n + 40 * math.ceil(n / 4)
    for w, W in (("none", None), ("8", 8), ("4", 4)):
        recs = [{"L": L, "counters": [T(L if W is None else min(L, W)), 0, 0, 0, 0]} for L in range(1, 33)]
        (tmp_path / f"decode_{w}.json").write_text(json.dumps({"records": recs}))
    assert S.main(["--out", str(tmp_path), "--parts", "1,2,4"]) == 0
    out = capsys.readouterr().out
    assert "total 268346" in out and "total 241286" in out and "total 231792" in out
    data = json.loads((tmp_path / "paging_study.json").read_text())
    assert set(data) == {"memory", "sharing", "serving", "cycles"}
    assert data["memory"]["contiguous"] == [4, 1022, 8192] and data["sharing"]["100/16"] == [72, 30, 8]
    for name in ("memory", "sharing", "serving", "cycles"):
        png = tmp_path / f"paging_{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "paging_window.png").exists()


@pytest.mark.parametrize("argv,message", [
    (["--parts", "1,5"], "error: --parts must be a comma-separated list of 1, 2, 3, 4, got '1,5'"),
    (["--parts", "x"], "error: --parts must be a comma-separated list of 1, 2, 3, 4, got 'x'"),
])
def test_bad_parts(tmp_path, capsys, argv, message):
    assert guarded(S.main, ["--out", str(tmp_path)] + argv) == 2
    assert capsys.readouterr().err == message + "\n"


def test_bad_decode_file(tmp_path, capsys):
    for w in ("none", "8", "4"):
        (tmp_path / f"decode_{w}.json").write_text('{"records": [{"L": 1}]}')
    assert guarded(S.main, ["--out", str(tmp_path), "--parts", "4", "--no-figures"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is not a decode JSON file" in err and err.count("\n") == 1


def test_missing_matplotlib_is_one_line_before_any_table(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; from sim.paging_study import main; "
            "from sim.cli import guarded; "
            f"raise SystemExit(guarded(main, ['--out', {str(tmp_path)!r}, '--parts', '4']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().startswith("error: drawing the figures needs matplotlib")
