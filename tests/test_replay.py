"""Random program suites (sim.verify.progen) and the replay command (sim.replay): PASS, FAIL and error lines."""
import random
import subprocess
import sys
from pathlib import Path

import pytest

from hdl.isa import Op, halt, ld, operands, sm, validate
from sim.backends import MAX_CYCLES
from sim.formats.hexfile import make_record, read_records, write_records
from sim.verify.progen import LAYOUT, random_program, random_suite
from sim.replay import main as replay_main

ROOT = Path(__file__).resolve().parents[1]


def cli(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def suite():
    return random_suite(11, 8)


# ---- the generator ------------------------------------------------------------------------------------

def test_same_seed_same_programs():
    a = random_suite(3, 2, ext=1536)
    b = random_suite(3, 2, ext=1536)
    assert [(r.program, r.image) for r in a] == [(r.program, r.image) for r in b]
    assert a[0].program != random_suite(4, 1, ext=1536)[0].program


def arena_loads(ops):
    """How many leading LDs it takes to fill scratchpad 0..1023 from ext 0..1023 (fails if they do not)."""
    filled = set()
    for k, o in enumerate(ops):
        if len(filled) == 1024:
            return k
        assert o["op"] == Op.LD and o["src"] == o["dst"], f"instruction {k} is not an arena load"
        filled |= set(range(o["dst"], o["dst"] + o["len"]))
        assert max(filled) < 1024
    raise AssertionError("the arenas are never filled")


def _overlap(a, n, b, m):
    return not (a + n <= b or b + m <= a)


@pytest.mark.parametrize("ext", [2048, 8192])
def test_programs_are_legal_and_well_formed(ext):
    rng = random.Random(ext)
    base, length = LAYOUT["result"]
    for _ in range(15):
        prog, image = random_program(rng, ext)
        assert len(image) == ext
        ops = [operands(w) for w in prog]
        for pc, w in enumerate(prog):
            validate(w, ext_words=ext, index=pc)
        assert ops[-1]["op"] == Op.HALT
        assert ops[-2]["op"] == Op.ST and (ops[-2]["src"], ops[-2]["len"]) == (base, length)
        loads = arena_loads(ops)                              # the four arenas are loaded first
        assert 4 <= loads <= 8
        assert 10 <= len(prog) - loads - 2 <= 25              # then 10..25 random instructions
        for o in ops:
            op = o["op"]
            if op in (Op.RQ, Op.SM):
                assert o["dst"] == o["src"] or not _overlap(o["dst"], o["len"], o["src"], o["len"])
            if op == Op.VADD:
                for s in ("src1", "src2"):
                    assert o["dst"] == o[s] or not _overlap(o["dst"], o["len"], o[s], o["len"])
            if op == Op.UNPACK:
                assert not _overlap(o["dst"], 8 * o["len"], o["src"], o["len"])
        assert make_record(prog, image).expected_counters[0] < MAX_CYCLES


def test_suite_covers_the_spec_list():
    seen = set()
    rng = random.Random(2024)
    for _ in range(30):
        prog, _ = random_program(rng)
        ops = [operands(w) for w in prog]
        for o in ops[arena_loads(ops):-2]:
            op = o["op"]
            seen.add(Op(op).name)
            if op == Op.MM:
                seen |= {("K", o["K"]), ("M", o["M"]), ("N", o["N"]), ("tb", o["tb"])}
                if o["lda"] != o["K"]:
                    seen.add("lda stride")
                if o["ldc"] != o["N"]:
                    seen.add("ldc stride")
            if op in (Op.RQ, Op.SM) and o["dst"] == o["src"]:
                seen.add(f"in-place {Op(op).name}")
            if op == Op.VADD and o["dst"] in (o["src1"], o["src2"]):
                seen.add("in-place VADD")
    need = {"LD", "ST", "MM", "RQ", "SM", "VADD", "AMAX", "UNPACK", ("K", 1), ("K", 64), ("tb", 0), ("tb", 1),
            "lda stride", "ldc stride", "in-place RQ", "in-place SM", "in-place VADD"}
    need |= {(k, v) for k in "MN" for v in range(1, 5)}
    assert need <= seen, need - seen


# ---- replay in process ----------------------------------------------------------------------------

def test_replay_pass(tmp_path, suite, capsys):
    path = tmp_path / "s.hex"
    write_records(path, suite)
    assert replay_main([str(path)]) == 0
    total = sum(r.expected_counters[0] for r in suite)
    assert capsys.readouterr().out == f"PASS: 8 programs match (memory and all five counters), {total} cycles in total\n"


def test_replay_fail_on_counter(tmp_path, suite, capsys):
    recs = read_back(tmp_path, suite)
    recs[5].expected_counters[3] += 1
    path = tmp_path / "bad.hex"
    write_records(path, recs)
    assert replay_main([str(path)]) == 1
    want = recs[5].expected_counters[3]
    assert capsys.readouterr().out == (f"FAIL: program 5: counter cyc_vec: expected {want}, got {want - 1}"
                                       " (the reference machine itself differs from the file's expected values)\n")


def test_replay_names_the_first_differing_instruction(suite):
    """A simulator that goes wrong from instruction 3 on: the failure names pc 3 and what it is."""
    from hdl.isa import describe
    from sim.backends.reference import ReferenceMachine
    from sim.replay import replay

    class WrongFromPc3(ReferenceMachine):
        name = "faulty"

        def run(self, program, image, lat=8):
            res = super().run(program, image, lat)
            if len(program) > 4:            # the prefix holds instruction 3 (and a HALT after it)
                res.counters[4] += 1
            return res

    failure, _ = replay(suite[:1], WrongFromPc3(), lat=8)
    assert failure.startswith("program 0: counter n_inst")
    assert failure.endswith(f"(first differing instruction: pc 3, {describe(suite[0].program[3])})")


def test_replay_compares_the_scratchpad_with_the_reference(suite):
    """The file holds no scratchpad: a simulator whose memory and counters match the file but whose
    scratchpad is wrong from instruction 2 on fails, naming the word and the instruction."""
    from hdl.isa import describe
    from sim.backends.reference import ReferenceMachine
    from sim.replay import replay

    class Twin(ReferenceMachine):
        name = "twin"
        flip = False

        def run(self, program, image, lat=8):
            res = super().run(program, image, lat)
            if self.flip and len(program) > 3:     # the prefix holds instruction 2 (and a HALT after it)
                res.scratchpad[4095] ^= 1
            return res

    sim = Twin()
    assert replay(suite[:3], sim, lat=8) == (None, sum(r.expected_counters[0] for r in suite[:3]))
    sim.flip = True
    failure, _ = replay(suite[:3], sim, lat=8)
    assert failure.startswith("program 0: scratchpad word 4095: expected 0x")
    assert failure.endswith("(compared with the reference machine: the file has no scratchpad) "
                            f"(first differing instruction: pc 2, {describe(suite[0].program[2])})")


def read_back(tmp_path, suite):
    path = tmp_path / "orig.hex"
    write_records(path, suite)
    return read_records(path)


def error_line(capsys):
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.err
    return lines[0]


def test_replay_errors(tmp_path, suite, capsys):
    assert replay_main([str(tmp_path / "missing.hex")]) == 2
    assert "no such file" in error_line(capsys)

    good = tmp_path / "g.hex"
    write_records(good, suite[:2])
    short = tmp_path / "short.hex"
    short.write_text("".join(good.read_text().splitlines(keepends=True)[:-3]))
    assert replay_main([str(short)]) == 2
    assert "truncated in program 1" in error_line(capsys)

    from sim.cli import guarded
    assert guarded(replay_main, [str(good), "--sim", "nosuch"]) == 2     # refused by the parser
    assert "--sim must be one of reference, amaranth, verilator, board, got 'nosuch'" in error_line(capsys)

    for args in (["--lat", "0"], ["--lat", "1025"], ["--ext", "0"]):
        assert guarded(replay_main, [str(good), *args]) == 2
        assert args[0] in error_line(capsys)
    with pytest.raises(SystemExit) as e:           # argparse's own errors exit 2 with one line too
        replay_main([str(good), "--ext", "x"])
    assert e.value.code == 2 and "--ext" in error_line(capsys)

    illegal = tmp_path / "illegal.hex"
    rec = make_record([ld(0, 0, 4), halt()], [0] * 2048)
    rec.program = [ld(0, 0, 4).word, sm(0, 0, 0).word, halt().word]
    write_records(illegal, [suite[0], rec])
    assert replay_main([str(illegal)]) == 2
    assert "program 1: instruction 1 (SM): len = 0" in error_line(capsys)


# ---- the commands, as a user runs them (few: each start costs a second) --------------------------------

def test_progen_then_replay_command(tmp_path):
    path = tmp_path / "r.hex"
    p = cli("sim.verify.progen", "--seed", "5", "--count", "3", "--out", str(path))
    assert p.returncode == 0, p.stderr
    p = cli("sim.replay", str(path), "--sim", "reference")
    assert p.returncode == 0 and p.stdout.startswith("PASS: 3 programs match"), p.stdout + p.stderr


def test_replay_command_fail_and_error(tmp_path, suite):
    recs = read_back(tmp_path, suite)
    recs[2].expected_ext[-1] ^= 1                   # the last word is in the stored result area
    path = tmp_path / "flip.hex"
    write_records(path, recs)
    p = cli("sim.replay", str(path))
    assert p.returncode == 1
    assert p.stdout.startswith("FAIL: program 2: external word 2047: expected"), p.stdout
    p = cli("sim.replay", str(path), "--sim", "bogus")
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1


def test_directed_suite_file(tmp_path, capsys):
    from sim.verify.progen import main as progen_main
    path = tmp_path / "d.hex"
    assert progen_main(["--directed", "--out", str(path)]) == 0
    capsys.readouterr()
    recs = read_records(path)
    assert len(recs) == 44
    assert recs[0].expected_counters == [85, 28, 30, 13, 6]            # R1, from the spec
    assert recs[-1].expected_counters == [97, 32, 40, 11, 6]           # R11
    assert replay_main([str(path)]) == 0
    assert capsys.readouterr().out.startswith("PASS: 44 programs match")
    from sim.cli import guarded
    assert guarded(progen_main, ["--directed", "--ext", "4096", "--out", str(path)]) == 2
    assert "EXT 2048" in error_line(capsys)


def test_replay_fail_on_a_legal_program_that_does_not_halt(tmp_path, suite, capsys):
    from sim.formats.hexfile import ProgramRecord
    long = [ld(0, 0, 2048).word] * 50 + [halt().word]      # legal, but over 100,000 cycles
    recs = [suite[0], ProgramRecord(long, [0] * 2048, [0] * 2048, [0, 0, 0, 0, 0]), suite[1]]
    path = tmp_path / "long.hex"
    write_records(path, recs)
    assert replay_main([str(path)]) == 1
    assert capsys.readouterr().out.startswith("FAIL: program 1: did not halt within 100000 cycles")
