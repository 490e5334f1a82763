"""hdl.isa and hdl.arith against the spec: encodings (R1, R2, R11), validation, busy times, the exp
table (5.5), softmax (R7), divider (R8) and requantizer (R10) figures, transcribed from the spec."""
import math

import pytest

from hdl import arith
from hdl.arith import EXP_TABLE, divu, requant, softmax_q16, unpack_word, vadd_sat, argmax_first
from hdl.isa import (Instr, IsaError, Op, amax, busy_cycles, decode, describe, encode, from_words32,
                     halt, ld, mm, operands, rq, sm, st, to_words32, unpack, validate,
                     validate_program, vadd)
from sim.verify import programs


# ---- encodings ------------------------------------------------------------------------------------

def test_r1_machine_code():
    words = [f"{i.word:032x}" for i in programs.r1().program]
    assert words == list(programs.R1_CODE)


def test_r1_decode_roundtrip():
    for text in programs.R1_CODE:
        w = int(text, 16)
        assert encode(decode(w)) == w
        assert from_words32(to_words32(w)) == w


def test_r2_inserted_store_and_r11_unpack_encodings():
    assert f"{st(100, 20, 4).word:032x}" == programs.R2_EXTRA_CODE
    assert f"{unpack(8, 0, 1).word:032x}" == programs.R11_UNPACK_CODE


def test_words32_most_significant_first():
    w = int(programs.R1_CODE[1], 16)
    assert to_words32(w) == [0x30064000, 0x00006002, 0x00300080, 0xC0800002]


def test_operands_read_only_the_hardware_bits():
    # a[15:12] of LD and fl[3:1] of RQ are not read by the chip
    w = ld(5, 7, 3).word | (0xF << 120)
    o = operands(w)
    assert (o["dst"], o["src"], o["len"]) == (5, 7, 3)
    w = rq(1, 2, 3, m=99, s=4, relu=1).word | (0b1110 << 18)
    assert operands(w)["relu"] == 1
    o = operands(mm(1, 2, 3, M=2, K=5, N=3, lda=6, ldb=7, ldc=8, tb=1))
    assert [o[k] for k in ("dst", "A", "B", "M", "K", "N", "lda", "ldb", "ldc", "tb")] == [1, 2, 3, 2, 5, 3, 6, 7, 8, 1]
    assert operands(vadd(1, 2, 3, 4096))["len"] == 4096
    assert describe(halt()) == "halt"


# ---- validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("ins, pattern", [
    (mm(0, 0, 0, M=0, K=1, N=1), "M = 0"),
    (mm(0, 0, 0, M=1, K=65, N=1), "K = 65"),
    (mm(0, 0, 0, M=1, K=1, N=5), "N = 5"),
    (mm(0, 0, 0, M=1, K=1, N=16), "N = 16 does not fit the 4 bits the hardware reads"),
    (Instr(Op.MM, f=1, g=128, h=1), "K = 128 does not fit the 7 bits"),
    (mm(4095, 0, 0, M=2, K=1, N=1), "dst = 4095"),
    (mm(0, 0, 4000, M=1, K=64, N=4, ldb=4), "B = 4000"),
    (ld(0, 0, 0), "len = 0"),
    (ld(4090, 0, 10), "dst = 4090"),
    (ld(0, 2040, 10), "src = 2040 .*external"),
    (st(0, 2047, 2), "dst = 2047"),
    (sm(0, 0, 4096), "len = 4096"),
    (unpack(4090, 0, 1), "dst = 4090"),
    (vadd(0, 0, 1, 0), "len = 0"),
    (amax(0, 4095, 2), "src = 4095"),
])
def test_validate_rejects(ins, pattern):
    with pytest.raises(IsaError, match=pattern):
        validate(ins, ext_words=2048, index=3)


def test_validate_names_the_instruction_and_unknown_opcode():
    with pytest.raises(IsaError, match="instruction 7"):
        validate(ld(0, 0, 0), index=7)
    with pytest.raises(IsaError, match="unknown opcode 12"):
        validate(12 << 124, index=0)


def test_validate_accepts_limits():
    validate(vadd(0, 0, 0, 4096))
    validate(mm(0, 0, 0, M=4, K=64, N=4, ldb=4))
    validate(ld(0, 2047, 1), ext_words=2048)
    validate(halt().word | 12345)         # any word with opcode 0 is a HALT


def test_validate_program():
    with pytest.raises(IsaError, match="empty"):
        validate_program([])
    with pytest.raises(IsaError, match="HALT"):
        validate_program([ld(0, 0, 1)])
    with pytest.raises(IsaError, match="256"):
        validate_program([ld(0, 0, 1)] * 256 + [halt()])
    validate_program([ld(0, 0, 1), halt()])


def test_instr_field_overflow():
    with pytest.raises(IsaError, match="field f"):
        Instr(Op.MM, f=256)


def test_busy_cycles_r4():
    for label, ins, b, _ in programs._R4_ROWS:
        assert busy_cycles(ins, 8) == b, label
    assert busy_cycles(ld(0, 0, 10), 20) == 10 + 20 + 1
    assert busy_cycles(halt()) == 0


# ---- the exp table (hardware spec 5.5) -------------------------------------------------------------

def test_exp_table_spot_values():
    spots = {0: 65535, 1: 61564, 2: 57834, 3: 54330, 16: 24109, 32: 8869, 48: 3263}
    for d, v in spots.items():
        assert EXP_TABLE[d] == v
    assert all(EXP_TABLE[d] == 1 for d in range(180, 189))
    assert all(EXP_TABLE[d] == 0 for d in range(189, 256))
    assert EXP_TABLE.count(0) == 67


def test_exp_table_float_crosscheck():
    assert len(EXP_TABLE) == 256
    for d in range(256):
        assert EXP_TABLE[d] == math.floor(65535 * math.exp(-d / 16) + 0.5), d


# ---- softmax (R7), divider (R8) --------------------------------------------------------------------

def test_r7_softmax_figures():
    p, det = softmax_q16([32, 16, 0, -16], detail=True)
    assert det["e"] == [65535, 24109, 8869, 3263]
    assert det["S"] == 101776
    assert det["r"] == 2700812
    assert p == [42200, 15524, 5711, 2101]
    assert sum(p) == 65536
    assert softmax_q16([-5]) == [65536]
    assert softmax_q16([7] * 8) == [8192] * 8


def test_softmax_reads_low_byte_only():
    assert softmax_q16([0xFFFFFF20, 16 | 0x1200, 0, 0xF0]) == [42200, 15524, 5711, 2101]


def test_r8_divider_figures():
    assert divu(1 << 38, 101776) == (2700812, 64832)
    assert divu(22, 5) == (4, 2)
    assert divu(123456789, 0) == ((1 << 40) - 1, 123456789)


# ---- requantizer (R10, 5.4) ------------------------------------------------------------------------

def test_r10_requant():
    acc = [11200, -18444, 13569, 1754]
    assert [requant(a, 14757225, 31) for a in acc] == [77, -127, 93, 12]
    half = 1 << 23
    ties = {1: 1, 3: 2, 5: 3}
    for a, q in ties.items():
        assert requant(a, half, 24) == q
        assert requant(-a, half, 24) == -q


def test_requant_edges():
    assert requant(-(1 << 31), (1 << 24) - 1, 0) == -127
    assert requant(0x80000000, 1 << 23, 23) == -127          # the word is read as signed
    assert requant(-50, 1 << 23, 23, relu=1) == 0
    assert requant(100, 1 << 23, 60) == 0                    # half is 0 for s >= 57
    for a in range(-300, 301, 7):
        assert requant(-a, 12345678, 27) == -requant(a, 12345678, 27)
        assert requant(a, 12345678, 27) != -128


def test_quant_helpers():
    assert arith.rha(2.5) == 3 and arith.rha(-2.5) == -3
    assert arith.rha_div(-7, 2) == -4
    assert vadd_sat(100, 100) == 127 and vadd_sat(-100, -100) == -127
    assert vadd_sat(0x1FF, 2) == 1                           # low bytes only: -1 + 2
    assert argmax_first([3, 9, 9, 1]) == 1
    assert argmax_first([0xFFFFFFFF, 0]) == 1                # -1 < 0 as signed words
    assert unpack_word(0x3F2970E5) == [5, -2, 0, 7, -7, 2, -1, 3]


# ---- the limits come from the chip's configuration (issue 12) ---------------------------------------

def test_module_limits_are_the_book_chips():
    from hdl import isa
    from hdl.config import BOOK
    assert (isa.SPAD_WORDS, isa.ROM_WORDS, isa.MM_MAX_MN, isa.MM_MAX_K) == (4096, 256, 4, 64)
    assert (isa.SPAD_WORDS, isa.ROM_WORDS, isa.MM_MAX_MN, isa.MM_MAX_K) == \
        (BOOK.spad_depth, BOOK.rom_words, BOOK.mm_max_mn, BOOK.mm_max_k)


def test_validate_reads_every_limit_from_the_configuration():
    from hdl.config import parse_chip
    big, small = parse_chip("array=8,row_depth=128"), parse_chip("spad_depth=2048,rom_words=16")
    wide = mm(0, 100, 200, M=8, K=5, N=8)
    with pytest.raises(IsaError, match=r"M = 8 is outside 1\.\.4"):
        validate(wide)
    assert validate(wide, cfg=big)["M"] == 8
    with pytest.raises(IsaError, match=r"M = 9 is outside 1\.\.8"):
        validate(mm(0, 100, 200, M=9, K=5, N=8), cfg=big)
    deep = mm(0, 0, 1000, M=1, K=100, N=1)
    with pytest.raises(IsaError, match=r"K = 100 is outside 1\.\.64"):
        validate(deep)
    assert validate(deep, cfg=big)["K"] == 100
    long_ld = ld(0, 0, 4095)
    assert validate(long_ld)["len"] == 4095
    with pytest.raises(IsaError, match=r"len = 4095 is outside 1\.\.2047"):
        validate(long_ld, cfg=small)
    with pytest.raises(IsaError, match=r"dst = 2040 with length 10 runs past the end of the scratchpad \(2048"):
        validate(ld(2040, 0, 10), cfg=small)
    with pytest.raises(IsaError, match=r"A = 3000 is past the scratchpad \(2048 words\)"):
        validate(mm(0, 3000, 0, 1, 1, 1), cfg=small)
    assert validate(ld(4000, 0, 10))["dst"] == 4000
    with pytest.raises(IsaError, match="ROM holds 16"):
        validate_program([ld(0, 0, 1)] * 16 + [halt()], cfg=small)
    validate_program([ld(0, 0, 1)] * 15 + [halt()], cfg=small)
    # the external memory defaults to the chip's
    with pytest.raises(IsaError, match=r"external memory \(1000 words\)"):
        validate(ld(0, 999, 2), cfg=parse_chip("ext_words=1000"))


def test_busy_cycles_take_the_configuration():
    from hdl.config import parse_chip
    ins = mm(0, 100, 200, M=8, K=5, N=8)
    assert busy_cycles(ins, 8, parse_chip("array=8")) == 8 * 5 + 5 * 8 + (5 + 8 + 8 - 2) + 8 * 8 + 7
    assert busy_cycles(mm(0, 100, 200, 4, 64, 4)) == 4 * 64 + 64 * 4 + 70 + 16 + 7
    # four operand elements a cycle: A's 5-long rows in 2 groups, B's 8-wide rows in 2 (hdl.isa.mm_busy_cycles)
    assert busy_cycles(ins, 8, parse_chip("array=8,mm_load=4")) == 8 * 2 + 5 * 2 + (5 + 8 + 8 - 2) + 8 * 8 + 7


def test_every_opcode_but_halt_has_one_counter_class():
    from hdl.isa import COUNTER_INDEX, COUNTER_OF
    assert set(COUNTER_OF) == set(Op) - {Op.HALT}
    assert COUNTER_OF[Op.MM] == "mm" and COUNTER_OF[Op.LD] == COUNTER_OF[Op.ST] == "dma"
    assert {COUNTER_OF[op] for op in (Op.RQ, Op.SM, Op.VADD, Op.AMAX, Op.UNPACK)} == {"vec"}
    assert COUNTER_INDEX == {"mm": 1, "dma": 2, "vec": 3}       # [total, mm, dma, vec, instructions]


def test_a_deeper_scratchpad_is_limited_by_the_bits_the_hardware_reads():
    # 8192 words: regions may run past word 4095, but a base address field is read with 12 bits and
    # LD/ST/RQ/SM/AMAX/UNPACK lengths with 12 (VADD's with 16)
    from hdl.config import parse_chip
    deep = parse_chip("spad_depth=8192")
    assert validate(ld(4000, 0, 1000), ext_words=8192, cfg=deep)["dst"] == 4000
    with pytest.raises(IsaError, match=r"dst = 5000 does not fit the 12 bits the hardware reads"):
        validate(ld(5000, 0, 10), cfg=deep)
    with pytest.raises(IsaError, match=r"A = 4096 does not fit the 12 bits"):
        validate(mm(0, 4096, 0, 1, 1, 1), cfg=deep)
    with pytest.raises(IsaError, match=r"len = 5000 is outside 1\.\.4095"):
        validate(rq(0, 100, 5000, 1 << 23, 23), cfg=deep)
    assert validate(vadd(0, 100, 200, 5000), cfg=deep)["len"] == 5000
    with pytest.raises(IsaError, match=r"len = 5000 is outside 1\.\.4096"):
        validate(vadd(0, 100, 200, 5000))
