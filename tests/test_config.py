"""hdl.config: the book's chip is the default, derived widths, and whole-message validation errors."""
import pytest

from hdl.config import BOOK, ChipConfig, ChipSpecError, parse_chip


def test_book_is_the_default_and_its_derived_widths():
    assert BOOK == ChipConfig()
    assert (BOOK.array, BOOK.mm_load, BOOK.spad_depth, BOOK.row_depth) == (4, 1, 4096, 64)
    assert (BOOK.spad_addr_bits, BOOK.mm_max_mn, BOOK.mm_max_k, BOOK.max_len) == (12, 4, 64, 4095)
    assert BOOK.counter_mask == 0xFFFF_FFFF
    assert BOOK.spec() == "book" and BOOK.overrides() == {}


def test_spec_round_trip():
    c = parse_chip("array=8,mm_load=4")
    assert (c.array, c.mm_load) == (8, 4) and c.spec() == "array=8,mm_load=4"
    assert parse_chip(c.spec()) == c
    assert parse_chip("book") == BOOK and parse_chip("book,lat=20").lat == 20
    assert parse_chip("spad_depth=0x2000").spad_addr_bits == 13


@pytest.mark.parametrize("kwargs, message", [
    ({"array": 3}, "ChipConfig array must be a power of two in 1..16, not 3"),
    ({"array": 32}, "ChipConfig array must be a power of two in 1..16, not 32"),
    ({"mm_load": 3}, "ChipConfig mm_load must divide the 4 int8 elements of a word, not 3"),
    ({"mm_load": 0}, "ChipConfig mm_load must divide the 4 int8 elements of a word, not 0"),
    ({"spad_depth": 128},
     "ChipConfig spad_depth must be a power of two in 256..65536 (16-bit address fields), not 128"),
    ({"row_depth": 2, "array": 4}, "ChipConfig row_depth must be a power of two in 4..128 (the 8-bit K field), not 2"),
    ({"word_bits": 64}, "ChipConfig word_bits must be 32 (four int8 per word is in the ISA), not 64"),
    ({"lat": 0}, "ChipConfig lat must be in 1..1024, not 0"),
    ({"gather": 2}, "ChipConfig gather must be 0 or 1, not 2"),
    ({"mm_rq": 2}, "ChipConfig mm_rq must be 0 or 1, not 2"),
    ({"rq_pipe": 2}, "ChipConfig rq_pipe must be 0 or 1, not 2"),
    ({"ext_words": 70000}, "ChipConfig ext_words must be in 1..65536 (16-bit external addresses), not 70000"),
])
def test_bad_parameter_is_a_value_error_naming_it(kwargs, message):
    with pytest.raises(ValueError) as e:
        ChipConfig(**kwargs)
    assert str(e.value) == message


def test_non_integer_parameter_is_a_type_error():
    with pytest.raises(TypeError) as e:
        ChipConfig(array=4.0)
    assert str(e.value) == "ChipConfig array must be an integer, not 4.0"


@pytest.mark.parametrize("spec, message", [
    ("zzz", "--chip 'zzz': 'zzz' is neither a preset (book, fast) nor name=value"),
    ("foo=1", "--chip 'foo=1': unknown parameter 'foo' (parameters: array, counter_bits, ext_port, ext_words, "
              "gather, lat, mm_bcast, mm_fold, mm_load, mm_overlap, mm_pack, mm_pack_c, mm_rq, prefetch, rom_words, row_depth, rq_pipe, sm_div, spad_depth, spad_lanes, vadd_ports, "
                  "vec_lanes, word_bits)"),
    ("array=x", "--chip 'array=x': array='x' is not a whole number"),
    ("array=8,array=4", "--chip 'array=8,array=4': array given twice"),
    ("array=3", "--chip 'array=3': ChipConfig array must be a power of two in 1..16, not 3"),
    ("fast,ext_port=3", "--chip 'fast,ext_port=3': ChipConfig ext_port must be 1, 2 or 4, not 3"),
    ("book,ext_port=2", "--chip 'book,ext_port=2': ChipConfig ext_port = 2 needs spad_lanes >= 2 (a group is "
                        "written through the banks' lanes), not spad_lanes=1"),
    ("fast,ext_port=4,ext_words=16382", "--chip 'fast,ext_port=4,ext_words=16382': ChipConfig ext_port = 4 needs "
                                        "ext_words a multiple of it (the board's memory is 4 banks), not "
                                        "ext_words=16382"),
    ("", "--chip '': give a preset (book, fast) or name=value overrides"),
])
def test_bad_spec_names_itself(spec, message):
    with pytest.raises(ChipSpecError) as e:
        parse_chip(spec)
    assert str(e.value) == message
