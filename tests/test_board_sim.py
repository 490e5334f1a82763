"""`ga2 board-sim` with the FPGA top in Verilator (issue 20 part 4): the board the bitstream is built from,
its UART simulated bit by bit behind a pseudo-terminal, driven by `--sim board --port PTY`.

Everything equals `--sim reference` word for word and counter for counter: the book's directed suite and
a random suite, `ga2 decode --window 4` in book mode (book chip) and in resident mode (`--chip fast`), a
`ga2 serve` trace; with line faults the results are the same, the retries are counted and printed, and
no RUN executes twice (the board's own count of RUNs equals the host's); a board-sim killed mid-run
gives the error line within the timeout. A chip with drain lanes (`LANES`, docs/spad-lanes.md) runs MMs
whose upper lanes alone write some blocks on its board as on the reference: the host
reads back only the blocks of the board's dirty maps, so a word a lane wrote and the map left out would
show. Three Verilator builds (book, fast and `LANES`,
cached with the chip models). The module is two xdist groups, one a board: the book board's tests run on one
worker and the fast board's on one (maybe the other), each board started once and shared by its group's tests.
The workloads are as short as still shows each point (a few decode steps; the board simulates the line bit by
bit, about 80 cycles a byte, and a resident decode first sends ~80 KB of weights).
"""
import json
import sys

import pytest

from tests.boardutil import BoardSim, kill_mid_decode, run_ga2

pytestmark = pytest.mark.timeout(1200)
on_book_board = pytest.mark.xdist_group("board_book")
on_fast_board = pytest.mark.xdist_group("board_fast")

BUILD = 1200            # seconds a cold build may take on a loaded 2-core machine
LANES = "fast,mm_pack_c=1,spad_lanes=4"     # the serving candidate: the MM drain writes four words a cycle


def _verilator():
    from sim.backends.verilator_backend import verilator_command
    if verilator_command() is None:
        pytest.skip("Verilator is not installed")


@pytest.fixture(scope="module")
def book_sim():
    _verilator()
    sim = BoardSim("--chip", "book", timeout=BUILD)
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def fast_sim():
    _verilator()
    sim = BoardSim("--chip", "fast", timeout=BUILD)
    yield sim
    sim.stop()


def _decode(capsys, tmp_path, name, *argv):
    code, out, err = run_ga2(capsys, "decode", "--window", "4", "--quiet", "--json", str(tmp_path / name), *argv)
    assert code == 0, out + err
    return json.loads((tmp_path / name).read_text()), out


def _same_decode(a, b):
    assert a["tokens"] == b["tokens"] and a["cycles_total"] == b["cycles_total"]
    assert [r["counters"] for r in a["records"]] == [r["counters"] for r in b["records"]]
    assert [r["logits_int"] for r in a["records"]] == [r["logits_int"] for r in b["records"]]
    assert a.get("load") == b.get("load")


@on_book_board
def test_directed_and_random_suites(book_sim, tmp_path, capsys):
    port = ["--sim", "board", "--port", book_sim.path]
    for name, args in (("directed", ["--directed"]), ("random", ["--count", "3", "--seed", "20"])):
        path = tmp_path / f"{name}.hex"
        assert run_ga2(capsys, "progen", *args, "--out", str(path))[0] == 0
        code, out, err = run_ga2(capsys, "replay", str(path), *port)
        assert code == 0 and "PASS:" in out and "board link on" in out, out + err


@on_book_board
def test_decode_book_mode(book_sim, tmp_path, capsys):
    steps = ["--steps", "4"]
    got, out = _decode(capsys, tmp_path, "b.json", *steps, "--sim", "board", "--port", book_sim.path)
    want, _ = _decode(capsys, tmp_path, "r.json", *steps, "--sim", "reference")
    _same_decode(got, want)
    assert got["link"]["runs"] == 4 and f"board link on {book_sim.path}: 4 runs" in out


@on_fast_board
def test_decode_resident_mode_on_fast(fast_sim, tmp_path, capsys):
    args = ["--steps", "6", "--mode", "resident", "--chip", "fast"]
    got, out = _decode(capsys, tmp_path, "b.json", *args, "--sim", "board", "--port", fast_sim.path)
    want, _ = _decode(capsys, tmp_path, "r.json", *args, "--sim", "reference")
    _same_decode(got, want)
    assert got["link"]["runs"] == 7           # the load program and 6 steps


@on_fast_board
def test_serve_trace_on_fast(fast_sim, tmp_path, capsys):
    args = ["serve", "--requests", "4", "--seed", "5", "--prompt-len", "2:5", "--gen-len", "2:5", "--mode",
            "resident", "--chip", "fast", "--no-verify"]
    code, out, err = run_ga2(capsys, *args, "--sim", "board", "--port", fast_sim.path, "--json", str(tmp_path / "b.json"))
    assert code == 0 and "board link on" in out, out + err
    code, _, _ = run_ga2(capsys, *args, "--sim", "reference", "--json", str(tmp_path / "r.json"))
    b, r = (json.loads((tmp_path / f).read_text()) for f in ("b.json", "r.json"))
    assert b["total_cycles"] == r["total_cycles"] and b["steps"] == r["steps"]
    assert [(q["tokens"], q["logits_int"]) for q in b["requests"]] == [(q["tokens"], q["logits_int"]) for q in r["requests"]]


@on_book_board
def test_lanes_chip_on_its_board_as_on_the_reference(tmp_path, capsys):
    """MMs whose rows of C straddle 16-word blocks (and wrap past the last word), so that some blocks are
    written by lanes 1..3 only: the board backend's scratchpad (its shadow, read back through the dirty
    maps) equals the reference's word for word. (A resident decode and a serve trace pass on this board
    too, but neither leaves a block to the upper lanes alone: with only the lowest lane's block marked
    both still match, so they are not the check here.)"""
    _verilator()
    import random
    from hdl import isa
    from hdl.config import parse_chip
    from sim.backends import first_difference
    from sim.backends.board_backend import BoardBackend
    from sim.backends.reference import ReferenceMachine
    cfg = parse_chip(LANES)
    depth, K, a_at = cfg.spad_depth, 8, 3000
    rng = random.Random(23)
    spad = [0] * depth
    for a in range(a_at, a_at + 2 * cfg.array * K):                # A, then B
        spad[a] = rng.randint(-128, 127) & 0xFFFFFFFF
    image = [rng.getrandbits(32) for _ in range(2048)]
    # (dst, ldc, M, N): row m of C is dst + m*ldc .. + N-1, one drain cycle
    cases = [(14, 32, 8, 4),            # 14,15 | 16,17: blocks 1, 3, .., 15 by lanes 2 and 3 only
             (302, 16, 3, 3),           # 302,303 | 304: block 21 by lane 2 only
             (depth - 3, 5, 2, 4)]      # depth-3 .. depth-1 | 0: lane 3 wraps to word 0
    sim = BoardSim("--chip", LANES, timeout=BUILD)
    try:
        board = BoardBackend(port=sim.path, config=cfg)
        try:
            for dst, ldc, M, N in cases:
                prog = [isa.encode(isa.mm(dst, a_at, a_at + cfg.array * K, M, K, N, ldc=ldc)),
                        isa.encode(isa.halt())]
                want = ReferenceMachine(check=False, config=cfg).run(prog, image, 8, scratchpad=spad)
                got = board.run(prog, image, 8, scratchpad=spad)
                assert first_difference(want, got) is None, f"MM at {dst}: {first_difference(want, got)}"
        finally:
            board.close()
    finally:
        sim.stop()


@on_book_board         # a board-sim of its own, the book board's model
def test_faults_give_the_same_results_retries_printed_no_run_twice(tmp_path, capsys):
    _verilator()
    # two book-mode steps at these rates: ~100 faults on the line each way, ~100 retries (101 measured)
    sim = BoardSim("--chip", "book", "--faults", "flip:0.0005,drop:0.0005", "--seed", "3", timeout=BUILD)
    try:
        args = ["--steps", "2"]
        got, out = _decode(capsys, tmp_path, "b.json", *args, "--sim", "board", "--port", sim.path)
    finally:
        summary = sim.stop()
    want, _ = _decode(capsys, tmp_path, "r.json", *args, "--sim", "reference")
    _same_decode(got, want)
    link = got["link"]
    assert link["retries"] > 0 and f"{link['retries']} retries" in out
    assert BoardSim.runs(summary) == link["runs"] == 2, summary
    assert "faults: flip 0, drop 0" not in summary


@on_book_board         # the group's last test: it kills the group's board
def test_a_board_sim_killed_mid_run_gives_the_error_line(book_sim):
    kill_mid_decode(book_sim, [sys.executable, "-m", "sim.decode", "--window", "4", "--steps", "32",
                               "--sim", "board", "--port", book_sim.path, "--timeout", "5", "--quiet"], reach=300)


def test_the_relay_reads_the_childs_stderr_as_it_comes(tmp_path):
    # GA2BOARD_DEBUG makes the board executable log on stderr all along: the relay must read it while it
    # serves (a pipe nobody reads fills, and the board stops on its next line). No Verilator here: a stand-in
    # child logs 256 KiB, then echoes what the host sent, then says its counts and exits.
    import os
    import threading
    from sim.board.boardsim import Pty
    from sim.board.faults import FaultSpec, FaultyLine
    from sim.board.verilated import VerilatedBoard
    child = tmp_path / "ga2board"
    child.write_text(f"#!{sys.executable}\n"
                     "import os, sys\n"
                     "sys.stderr.write('leds 3 -> 11\\n' * 20000); sys.stderr.flush()\n"
                     "os.write(1, os.read(0, 100))\n"
                     "sys.stderr.write('ga2board: runs 3 cycles 9 bytes_in 4 bytes_out 4 framing_errors 0\\n')\n")
    child.chmod(0o755)
    board = VerilatedBoard.__new__(VerilatedBoard)
    board.exe, board.proc, board.runs, board.stats, board._err = child, None, 0, "", b""
    pty = Pty()
    failed = []

    def serve():
        try:
            board.serve(pty, FaultyLine(FaultSpec(), 2), FaultyLine(FaultSpec(), 3))
        except Exception as e:          # the child's exit ends the relay
            failed.append(e)
    try:
        os.write(pty.slave, b"ping")
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        t.join(20)
        stuck = t.is_alive()
        if stuck:
            board.proc.kill()
        assert not stuck, "the relay stopped: the child blocked on a full stderr pipe"
        assert "exited (status 0)" in str(failed[0]) and "framing_errors" in str(failed[0])
        assert os.read(pty.slave, 100) == b"ping"
        board.close()
        assert board.runs == 3
    finally:
        pty.close()
