"""The reference machine against the spec's figures (R1-R5, R7 on the chip, R10, R11) and its error paths.

Expected values are the spec's, transcribed in sim/verify/programs.py or below, or derived by hand from the
unit timelines of hardware spec 4 (the partial-overlap cases), never taken from the machine itself.
"""
import time

import numpy as np
import pytest

from hdl.isa import Instr, Op, amax, halt, ld, mm, rq, sm, st, vadd
from sim.verify import programs
from sim.backends import DidNotHalt, RunResult, SimError, first_difference
from sim.backends.reference import BadInput, IllegalInstruction, ReferenceMachine

EXT = 2048
W = 0xFFFFFFFF


def run(d, **kw):
    return ReferenceMachine(trace=True, **kw).run(list(d.program), list(d.image), lat=8)


def check_directed(d):
    r = run(d)
    if d.counters is not None:
        assert tuple(r.counters) == d.counters
    for addr, v in d.expect_ext.items():
        assert r.ext[addr] == v, f"{d.name}: ext[{addr}]"
    if d.others_unchanged:
        changed = [i for i in range(EXT) if r.ext[i] != d.image[i] and i not in d.expect_ext]
        assert changed == []
    for pc, b in d.busy.items():
        assert r.trace[pc].busy == b
    return r


def image(at=None):
    img = [0] * EXT
    for start, vals in (at or {}).items():
        for k, v in enumerate(vals):
            img[start + k] = v & W
    return img


def signed(w):
    return w - (1 << 32) if w & 0x80000000 else w


# ---- the spec's figures -----------------------------------------------------------------------------

def test_r1_counters_memory_and_trace():
    d = programs.r1()
    r = check_directed(d)
    assert r.counters == [85, 28, 30, 13, 6]
    rows = [(t.pc, t.fetch, t.issue, t.done) for t in r.trace[:6]]
    assert rows == list(d.trace)
    halt_row = r.trace[6]
    assert (halt_row.pc, halt_row.fetch, halt_row.issue) == (6, 83, 84)


def test_r2():
    assert check_directed(programs.r2()).counters == [93, 28, 36, 13, 7]


def test_r3_mlp_classes_and_intermediates():
    rm = ReferenceMachine()
    d = programs.r3()
    r = rm.run(list(d.program), list(d.image))
    assert r.counters == [237, 112, 55, 48, 10]
    assert r.ext[64:68] == [0, 1, 1, 0]
    assert r.ext[:40] == list(d.image[:40])
    assert [signed(w) for w in r.scratchpad[120:136]] == programs.R3_HIDDEN
    assert [signed(w) for w in r.scratchpad[140:148]] == programs.R3_ACC2
    assert [signed(w) for w in r.scratchpad[150:158]] == programs.R3_SCORES


@pytest.mark.parametrize("d", programs.r4(), ids=lambda d: d.name)
def test_r4_single_instruction(d):
    r = check_directed(d)
    assert r.counters[0] == d.busy[0] + 4


@pytest.mark.parametrize("d", programs.r5(), ids=lambda d: d.name)
def test_r5_directed(d):
    check_directed(d)


@pytest.mark.parametrize("d", programs.r7_chip(), ids=lambda d: d.name)
def test_r7_on_chip(d):
    check_directed(d)


def test_r11_unpack():
    r = check_directed(programs.r11())
    assert r.counters == [97, 32, 40, 11, 6]
    assert r.ext[48] == 49


def test_r10_through_rq():
    acc = [11200, -18444, 13569, 1754]
    prog = [ld(0, 0, 4), rq(10, 0, 4, m=14757225, s=31), st(10, 100, 4), halt()]
    r = ReferenceMachine().run(prog, image({0: acc}))
    assert [signed(w) for w in r.ext[100:104]] == [77, -127, 93, 12]
    ties = [1, -1, 3, -3, 5, -5]
    prog = [ld(0, 0, 6), rq(0, 0, 6, m=1 << 23, s=24), st(0, 100, 6), halt()]   # in place
    r = ReferenceMachine().run(prog, image({0: ties}))
    assert [signed(w) for w in r.ext[100:106]] == [1, -1, 2, -2, 3, -3]


def test_mm_against_numpy_with_strides_and_transpose():
    rng = np.random.default_rng(5)
    vals = rng.integers(-128, 128, size=600)
    img = image({0: [int(v) | (0x5A00 if k % 3 else 0) for k, v in enumerate(vals)]})  # junk above bit 7
    M, K, N, lda, ldb, ldc = 3, 40, 4, 45, 41, 6
    prog = [ld(0, 0, 600), mm(1000, 0, 200, M=M, K=K, N=N, lda=lda, ldb=ldb, ldc=ldc, tb=1),
            st(1000, 1500, (M - 1) * ldc + N), halt()]
    r = ReferenceMachine().run(prog, img)
    A = np.array([[vals[m * lda + k] for k in range(K)] for m in range(M)])
    B = np.array([[vals[200 + n * ldb + k] for n in range(N)] for k in range(K)])
    C = A @ B
    got = [[signed(r.ext[1500 + m * ldc + n]) for n in range(N)] for m in range(M)]
    assert got == C.tolist()


def test_mm_stages_operands_before_writing():
    # dst == A: the second column still uses the original A row
    prog = [ld(0, 0, 8), mm(0, 0, 4, M=1, K=2, N=2, lda=2, ldb=2, ldc=2), st(0, 100, 2), halt()]
    r = ReferenceMachine().run(prog, image({0: [1, 2, 0, 0, 3, 4, 5, 6]}))
    assert r.ext[100:102] == [1 * 3 + 2 * 5, 1 * 4 + 2 * 6]


# ---- pipeline order with partially overlapping operands (legal per validate; derived from spec 4) ----

def test_rq_dst_one_above_src_reads_old_values():
    # element k is read at the edge that writes element k-1, so it still sees the old word
    prog = [ld(0, 0, 5), rq(1, 0, 4, m=(1 << 24) - 1, s=23), st(0, 100, 5), halt()]
    r = ReferenceMachine().run(prog, image({0: [1, 1, 1, 1, 1]}))
    assert r.ext[100:105] == [1, 2, 2, 2, 2]


def test_vadd_dst_one_above_src2_sees_previous_result():
    # src2[k] is read one edge after element k-1 was written: a running sum
    prog = [ld(0, 0, 4), ld(10, 10, 1), vadd(11, 0, 10, 4), st(10, 100, 5), halt()]
    r = ReferenceMachine().run(prog, image({0: [1, 1, 1, 1], 10: [10]}))
    assert r.ext[100:105] == [10, 11, 12, 13, 14]


def test_vadd_dst_one_above_src1_reads_old_values():
    prog = [ld(0, 0, 5), vadd(1, 0, 20, 4), st(0, 100, 5), halt()]
    r = ReferenceMachine().run(prog, image({0: [1, 2, 3, 4, 5]}))
    assert r.ext[100:105] == [1, 1, 2, 3, 4]


def test_sm_partial_overlap_is_defined():
    # dst = src + 2: pass 2 reads elements 2 and 3 after the exponentials of 0 and 1 overwrote them
    prog = [ld(0, 0, 4), sm(2, 0, 4), st(0, 100, 6), halt()]
    r = ReferenceMachine().run(prog, image({0: [0, 0, 0, 0]}))
    # m = 0; e0 = e1 = T[0] = 65535; e2 = e3 = T[(0 - s8(65535)) & 255] = T[1] = 61564
    S = 2 * 65535 + 2 * 61564
    rr = (1 << 38) // S
    p = [((e * rr + (1 << 21)) >> 22) for e in (65535, 65535, 61564, 61564)]
    assert r.ext[100:106] == [0, 0] + p


# ---- program ROM behaviour and errors ----------------------------------------------------------------

def test_missing_halt_runs_into_zero_rom_word():
    r = ReferenceMachine().run([ld(0, 0, 1)], image())
    assert r.counters == [2 + 10 + 2, 0, 10, 0, 1]


def test_halt_with_other_bits_set_is_a_halt():
    r = ReferenceMachine().run([halt().word | (1 << 100) | 77, ld(0, 0, 0)], image())
    assert r.counters == [2, 0, 0, 0, 0]


def test_ignored_bits_are_ignored():
    clean = [ld(0, 0, 4), rq(10, 0, 4, m=9000000, s=24, relu=1), st(10, 50, 4), halt()]
    dirty = list(clean)
    dirty[1] = Instr(Op.RQ, a=10, b=0, c=4, d=9000000, e=24, fl=0b1111)   # fl[3:1] unused
    img = image({0: [100, -100, 7, -7]})
    a = ReferenceMachine().run(clean, img)
    b = ReferenceMachine().run(dirty, img)
    assert first_difference(a, b) is None


def test_illegal_field_names_pc_and_field():
    with pytest.raises(IllegalInstruction, match=r"instruction 1 .*len = 0"):
        ReferenceMachine().run([ld(0, 0, 1), sm(0, 0, 0), halt()], image())
    with pytest.raises(SimError, match=r"instruction 0 .*src = 2047"):
        ReferenceMachine().run([ld(0, 2047, 2), halt()], image())


def test_illegal_opcode_does_not_halt():
    with pytest.raises(DidNotHalt, match=r"did not halt within 100000 cycles \(pc 1: illegal opcode 12\)"):
        ReferenceMachine().run([ld(0, 0, 1), 12 << 124, halt()], image())


def test_cycle_limit():
    prog = [ld(0, 0, 16), halt()]
    assert ReferenceMachine(max_cycles=2 + 25 + 2).run(prog, image()).counters[0] == 29
    with pytest.raises(DidNotHalt, match="did not halt within 28 cycles"):
        ReferenceMachine(max_cycles=28).run(prog, image())


def test_full_rom_without_halt_wraps_and_times_out():
    with pytest.raises(DidNotHalt):
        ReferenceMachine(max_cycles=20000).run([ld(0, 0, 1)] * 256, image())


def test_bad_inputs_are_one_line():
    rm = ReferenceMachine()
    for args, pat in [(([ld(0, 0, 1), "x"], image()), "program word 1"),
                      (([halt()], [1 << 32]), "external word 0"),
                      (([halt()] * 257, image()), "256"),
                      (([halt()], image(), 0), "lat")]:
        with pytest.raises(BadInput, match=pat) as e:
            rm.run(*args)
        assert "\n" not in str(e.value)


def test_unchecked_mode_mirrors_the_memory_model():
    # reads past EXT answer 0xDEADBEEF and writes past EXT are dropped (hardware spec 6.3)
    rm = ReferenceMachine(check=False)
    r = rm.run([ld(0, 2046, 4), st(0, 2046, 4), st(2, 0, 2), halt()], image({2046: [7, 8]}))
    assert r.ext[2046:2048] == [7, 8] and r.ext[0:2] == [0xDEADBEEF, 0xDEADBEEF]
    with pytest.raises(DidNotHalt, match="len = 0"):
        rm.run([ld(0, 0, 0), halt()], image())


def test_speed_of_a_long_program():
    # about the size of a decode step: ~75 instructions, several thousand cycles
    body = []
    for k in range(18):
        body += [ld(0, 0, 64), mm(100, 0, 0, M=4, K=64, N=4, ldb=4), rq(200, 100, 16, m=1 << 23, s=30),
                 sm(300, 200, 16)]
    prog = body + [st(300, 100, 16), halt()]
    rm = ReferenceMachine()
    rm.run(prog, image())
    t = time.perf_counter()
    r = rm.run(prog, image())
    dt = time.perf_counter() - t
    assert r.counters[0] > 7000 and r.counters[4] == 73
    assert dt < 0.25, f"{dt * 1000:.1f} ms"


def test_amax_first_maximum_signed():
    prog = [ld(0, 0, 6), amax(20, 0, 6), amax(21, 0, 2), st(20, 100, 2), halt()]
    r = ReferenceMachine().run(prog, image({0: [-5, -1, 9, 3, 9, 0x7FFFFFFF + 1]}))
    # 0x80000000 is the most negative word; the first 9 wins the tie; -1 > -5
    assert r.ext[100:102] == [2, 1]


def test_run_many_matches_run_and_names_the_job():
    d1, d2 = programs.r1(), programs.r11()
    rm = ReferenceMachine()
    got = rm.run_many([(list(d1.program), list(d1.image)), (list(d2.program), list(d2.image), 20)])
    assert [g.counters for g in got] == [[85, 28, 30, 13, 6], rm.run(list(d2.program), list(d2.image), 20).counters]
    hang = ([ld(0, 0, 1), 9 << 124], image())
    with pytest.raises(DidNotHalt, match=r"job 1: did not halt"):
        rm.run_many([(list(d1.program), list(d1.image)), hang])
    res = rm.run_many([hang, (list(d1.program), list(d1.image))], return_errors=True)
    assert isinstance(res[0], DidNotHalt) and res[1].counters[0] == 85


# ---- first_difference: the one comparison of two runs ------------------------------------------------

def _result():
    # LD then a requantize into the scratchpad only: the scratchpad holds what ext does not
    img = image({0: [100, -100, 7, -7]})
    return ReferenceMachine().run([ld(0, 0, 4), rq(10, 0, 4, m=9000000, s=24, relu=1), halt()], img)


def test_the_reference_returns_the_whole_scratchpad():
    r = _result()
    assert len(r.scratchpad) == 4096
    assert r.scratchpad[:4] == [100, W - 99, 7, W - 6]
    assert r.scratchpad[10:14] != [0, 0, 0, 0] and r.scratchpad[14:] == [0] * (4096 - 14)


def test_first_difference_names_a_flipped_scratchpad_word():
    a, b = _result(), _result()
    assert first_difference(a, b) is None
    b.scratchpad[11] ^= 1 << 31
    assert first_difference(a, b) == (f"scratchpad word 11: expected 0x{a.scratchpad[11]:08x}, "
                                      f"got 0x{b.scratchpad[11]:08x}")
    # only a comparison with an expectation that has no scratchpad (a record file's) may leave it out
    assert first_difference(a, b, scratchpad=False) is None


def test_first_difference_checks_lengths_before_words():
    a = _result()

    def changed(**kw):
        return RunResult(**{"ext": list(a.ext), "counters": list(a.counters),
                            "scratchpad": list(a.scratchpad), **kw})
    # each list one shorter than expected (a zip over the pair would call these equal)
    assert first_difference(a, changed(counters=a.counters[:4])) == "counters: expected 5 values, got 4"
    assert first_difference(a, changed(ext=a.ext[:-1])) == "external memory: expected 2048 values, got 2047"
    assert first_difference(a, changed(scratchpad=a.scratchpad[:-1])) == "scratchpad: expected 4096 words, got 4095"
    assert first_difference(a, changed(scratchpad=None)) == "scratchpad: missing in the got result"
    assert first_difference(changed(scratchpad=None), a) == "scratchpad: missing in the expected result"
    # counters come first, then external memory, then the scratchpad
    worse = changed(counters=[a.counters[0] + 1, *a.counters[1:]], ext=[1] + a.ext[1:])
    assert first_difference(a, worse).startswith("counter cyc_total:")
    assert first_difference(a, changed(ext=[1] + a.ext[1:], scratchpad=None)).startswith("external word 0:")


# ---- the chip's configuration (issue 12) -----------------------------------------------------------

def test_counters_wrap_at_the_configured_width():
    from hdl.config import parse_chip
    prog = [ld(0, 0, 4095)] * 17 + [halt()]           # 17 x 4106 + 2 = 69,804 cycles: past 2^16
    img = [0] * 8192
    wide = ReferenceMachine().run(prog, img).counters
    narrow = ReferenceMachine(config=parse_chip("counter_bits=16")).run(prog, img).counters
    assert wide[0] == 17 * (2 + 4095 + 8 + 1) + 2 == 69804
    assert narrow == [c & 0xFFFF for c in wide] and narrow[0] == 69804 - 65536


def test_scratchpad_depth_and_rom_come_from_the_configuration():
    from hdl.config import parse_chip
    small = ReferenceMachine(config=parse_chip("spad_depth=1024,rom_words=16"))
    img = image({0: list(range(1, 101))})
    r = small.run([ld(1000, 0, 20), halt()], img)
    assert len(r.scratchpad) == 1024 and r.scratchpad[1000:1020] == list(range(1, 21))
    with pytest.raises(IllegalInstruction, match=r"runs past the end of the scratchpad \(1024 words\)"):
        small.run([ld(1000, 0, 30), halt()], img)
    # unchecked, the address wraps at the configured depth (10 bits), as the chip's would
    r = ReferenceMachine(check=False, config=parse_chip("spad_depth=1024")).run([ld(1000, 0, 30), halt()], img)
    assert r.scratchpad[1000:1024] == list(range(1, 25)) and r.scratchpad[0:6] == list(range(25, 31))
    with pytest.raises(BadInput, match="ROM holds 16"):
        small.run([ld(0, 0, 1)] * 16 + [halt()], img)
    with pytest.raises(BadInput, match="ChipConfig"):
        ReferenceMachine(config="array=8")


def test_a_wider_array_runs_wider_tiles_with_its_own_cycle_model():
    from hdl.config import parse_chip
    from hdl.isa import busy_cycles
    cfg = parse_chip("array=8")
    rng = np.random.default_rng(12)
    A = rng.integers(-128, 128, size=(8, 5))
    B = rng.integers(-128, 128, size=(5, 8))
    img = image({0: [int(v) for v in A.flatten()], 100: [int(v) for v in B.flatten()]})
    prog = [ld(0, 0, 40), ld(100, 100, 40), mm(200, 0, 100, M=8, K=5, N=8, ldb=8), st(200, 300, 64), halt()]
    with pytest.raises(IllegalInstruction, match=r"M = 8 is outside 1\.\.4"):
        ReferenceMachine().run(prog, img)
    r = ReferenceMachine(config=cfg).run(prog, img)
    assert [signed(w) for w in r.ext[300:364]] == [int(v) for v in (A @ B).flatten()]
    assert r.counters[1] == busy_cycles(prog[2], 8, cfg) == 8 * 5 + 5 * 8 + 19 + 64 + 7
