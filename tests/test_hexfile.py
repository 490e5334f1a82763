"""The program-record file of hardware spec 6.1: layout, round trip and one-line errors."""
import pytest

from hdl.isa import halt, ld, st
from sim.verify import programs
from sim.formats.hexfile import (HexFileError, ProgramRecord, format_records, make_record, parse_records,
                         read_records, write_records)

EXT = 16


def small_records():
    img = [0] * EXT
    img[0:3] = [5, 0xFFFFFFFE, 7]
    a = make_record([ld(0, 0, 3), st(0, 8, 3), halt()], img)
    b = ProgramRecord([halt().word], [1] * EXT, [1] * EXT, [2, 0, 0, 0, 0])
    return [a, b]


def test_layout_word_by_word():
    recs = small_records()
    lines = format_records(recs).split("\n")
    assert lines[-1] == ""                       # newline-terminated
    lines = lines[:-1]
    assert all(len(x) == 8 and x == x.lower() for x in lines)
    words = [int(x, 16) for x in lines]
    assert words[0] == 2                         # NP
    assert words[1] == 3                         # NI includes the HALT
    first = ld(0, 0, 3).word
    assert words[2:6] == [(first >> s) & 0xFFFFFFFF for s in (96, 64, 32, 0)]   # MSW first
    base = 2 + 12
    assert words[base:base + EXT] == recs[0].image
    assert words[base + EXT:base + 2 * EXT][8:11] == [5, 0xFFFFFFFE, 7]
    # counters from the spec's formulas: LD 3 (B 12), ST 3 (B 5), HALT
    assert words[base + 2 * EXT:base + 2 * EXT + 5] == [2 + 12 + 2 + 5 + 2, 0, 17, 0, 2]
    assert len(words) == 1 + (1 + 12 + 2 * EXT + 5) + (1 + 4 + 2 * EXT + 5)


def test_r1_instruction_words_in_file(tmp_path):
    d = programs.r1()
    path = tmp_path / "r1.hex"
    write_records(path, [make_record(list(d.program), list(d.image))])
    lines = path.read_text().split()
    code = "".join(lines[2:2 + 4 * 7])
    assert code == "".join(programs.R1_CODE)
    counters = [int(x, 16) for x in lines[-5:]]
    assert counters == [85, 28, 30, 13, 6]


def test_round_trip(tmp_path):
    recs = small_records()
    path = tmp_path / "s.hex"
    write_records(path, recs)
    back = read_records(path, ext=EXT)
    assert back == recs


def test_empty_suite_round_trip(tmp_path):
    path = tmp_path / "e.hex"
    write_records(path, [], ext=EXT)
    assert path.read_text() == "00000000\n"
    assert read_records(path, ext=EXT) == []


def text_of(recs):
    return format_records(recs)


@pytest.mark.parametrize("cut", [1, 2, 14, 14 + EXT, 50])
def test_truncated(cut):
    lines = text_of(small_records()).split("\n")[:-1]
    short = "\n".join(lines[:cut]) + "\n"
    with pytest.raises(HexFileError, match=r"truncated in program 0 at word offset \d+: expected") as e:
        parse_records(short, ext=EXT)
    assert "\n" not in str(e.value)


def test_truncated_names_what_was_expected():
    lines = text_of(small_records()).split("\n")[:-1]
    with pytest.raises(HexFileError, match="expected the five counters"):
        parse_records("\n".join(lines[:1 + 1 + 12 + 2 * EXT + 2]) + "\n", ext=EXT)
    with pytest.raises(HexFileError, match="truncated in program 1 at word offset"):
        parse_records("\n".join(lines[:-1]) + "\n", ext=EXT)


def test_bad_hex_line():
    lines = text_of(small_records()).split("\n")
    lines[5] = "0000zz00"
    with pytest.raises(HexFileError, match=r"line 6 \(word offset 5\): '0000zz00'"):
        parse_records("\n".join(lines), ext=EXT)
    with pytest.raises(HexFileError, match="line 1"):
        parse_records("+0000001\n", ext=EXT)
    with pytest.raises(HexFileError, match="no newline"):
        parse_records("00000000", ext=EXT)


def test_trailing_garbage():
    text = text_of(small_records()) + "00000000\n"
    with pytest.raises(HexFileError, match="1 words after the last of the 2 programs"):
        parse_records(text, ext=EXT)


@pytest.mark.parametrize("ni", [0, 257])
def test_bad_ni(ni):
    lines = text_of(small_records()).split("\n")
    lines[1] = f"{ni:08x}"
    with pytest.raises(HexFileError, match=f"program 0, word offset 1: NI = {ni} is outside 1..256"):
        parse_records("\n".join(lines), ext=EXT)


def test_wrong_ext_is_reported():
    with pytest.raises(HexFileError, match="is --ext right"):
        parse_records(text_of(small_records()), ext=EXT + 1)


def test_missing_file(tmp_path):
    with pytest.raises(HexFileError, match="no such file"):
        read_records(tmp_path / "nope.hex")


def test_write_rejects_mixed_ext():
    a, b = small_records()
    b.image = b.image + [0]
    with pytest.raises(HexFileError, match="program 1: image has 17 words, the file's EXT is 16"):
        format_records([a, b])
    a.expected_counters = [1, 2, 3]
    with pytest.raises(HexFileError, match="3 counters"):
        format_records([a])
