"""``ga2 board-sim``: a GA-2 board in simulation behind a pseudo-terminal, for ``--sim board --port PTY``.

    ga2 board-sim --chip fast &                     # prints "pty: /dev/pts/N" first, serves until killed
    ga2 decode --window 4 --mode resident --chip fast --sim board --port /dev/pts/N

The board is either the FPGA top the bitstream is built from (`hdl.board_top.BoardTop`), emitted as
Verilog and run in Verilator with the UART simulated bit by bit (`sim.board.verilated`, the default), or,
with ``--model``, the behavioural board of `sim.board.model` (the link's rules in Python over the
reference machine: the quick one for protocol tests). Either way the command opens a pseudo-terminal
(``os.openpty``, raw mode; it keeps the slave side open itself, so a host may come and go), prints
``pty: PATH`` as its first line and relays bytes between the terminal and the board until it is killed
(SIGTERM or SIGINT: it then prints what it served and exits 0). pyserial opens PATH exactly as it opens
``/dev/ttyUSB0``.

``--faults flip:P,drop:P,garbage:P --seed S`` corrupts the simulated line in both directions
(`sim.board.faults`): what a host sees then is what a noisy cable would give it, and the link's CRC,
NAKs and retries must make up for it.
"""
from __future__ import annotations

import errno
import os
import select
import signal
import sys
import time
import tty

from sim.board.faults import FaultSpec, FaultyLine, faults_arg
from sim.cli import Parser, chip_option, guarded, int_range

__all__ = ["build_parser", "main", "Pty", "ModelLine", "gap_seconds", "DEFAULT_CLK_HZ", "DEFAULT_BAUD"]

DEFAULT_CLK_HZ = 25_000_000
DEFAULT_BAUD = 3_000_000
WRITE_PATIENCE = 2.0            # seconds a host may leave the terminal unread before the board's bytes are lost


def gap_seconds(baud: int) -> float:
    """The real time after which the model takes the line as silent (a frame cut short is dropped): the
    protocol's FRAME_GAP_BYTES byte times, but at least 20 ms (a pseudo-terminal's scheduling jitter; less
    than the host's shortest wait before it sends a frame again, `board_backend.MIN_WAIT`)."""
    from hdl.hostlink import FRAME_GAP_BYTES
    return max(FRAME_GAP_BYTES * 10 / baud, 0.02)


class _Stopped(Exception):
    """SIGTERM: stop serving."""


class Pty:
    """A pseudo-terminal pair: the board's side (`master`, non-blocking) and the path a host opens."""

    def __init__(self):
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)                  # no echo, no line discipline: bytes pass as they are
        self.path = os.ttyname(self.slave)
        os.set_blocking(self.master, False)
        self.lost = 0                           # board bytes nobody read within WRITE_PATIENCE

    def read(self) -> bytes:
        try:
            return os.read(self.master, 65536)
        except BlockingIOError:
            return b""
        except OSError as e:                    # EIO: no slave open (never: ours stays open)
            if e.errno == errno.EIO:
                return b""
            raise

    def write(self, data: bytes) -> None:
        """To the host; bytes a host does not read within `WRITE_PATIENCE` are lost, as on a cable."""
        view = memoryview(data)
        deadline = time.monotonic() + WRITE_PATIENCE
        while view:
            try:
                view = view[os.write(self.master, view):]
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self.lost += len(view)
                    return
                select.select([], [self.master], [], 0.05)

    def close(self) -> None:
        for fd in (self.master, self.slave):
            try:
                os.close(fd)
            except OSError:
                pass


class ModelLine:
    """The model board in-process, as a line for `sim.backends.board_backend.BoardBackend(line=...)`:
    bytes written pass `down` (host -> board faults), feed the model, and its answers pass `up`.

    A read that finds nothing waits its timeout out (the line was silent): the model then drops a frame
    cut short, as the board's frame-gap timer would.
    """

    def __init__(self, model, faults: FaultSpec = FaultSpec(), seed: int = 1):
        self.model = model
        self.down, self.up = FaultyLine(faults, 2 * seed), FaultyLine(faults, 2 * seed + 1)
        self._out = bytearray()
        self.closed = False

    def write(self, data: bytes, timeout: float) -> None:
        from sim.backends.board_backend import BoardError
        if self.closed:
            raise BoardError("the board on (test line) is gone: the line is closed")
        self._out += self.up.apply(self.model.feed(self.down.apply(bytes(data))))

    def read(self, timeout: float) -> bytes:
        from sim.backends.board_backend import BoardError
        if self.closed:
            raise BoardError("the board on (test line) is gone: the line is closed")
        if not self._out:
            time.sleep(max(timeout, 0.0))
            self.model.gap()
            return b""
        data = bytes(self._out)
        self._out.clear()
        return data

    def reset_input(self) -> None:
        self._out.clear()

    def close(self) -> None:
        pass


def serve_model(pty: Pty, model, down: FaultyLine, up: FaultyLine, gap: float) -> None:
    """Relay between the terminal and the model board until interrupted."""
    armed = False               # bytes came since the last silence: a frame may be cut short
    while True:
        ready, _, _ = select.select([pty.master], [], [], gap if armed else None)
        if not ready:
            model.gap()
            armed = False
            continue
        data = down.apply(pty.read())
        if data:
            armed = True
            out = model.feed(data)
            if out:
                pty.write(up.apply(out))


def build_parser() -> Parser:
    p = Parser(
        "python -m sim.board_sim",
        "Simulate a GA-2 board behind a pseudo-terminal: prints 'pty: PATH' as its first line, then serves "
        "the host link (hdl.hostlink) on PATH until it is killed, for --sim board --port PATH on decode, "
        "replay, fuzz, bench and serve. The board is the FPGA top (hdl.board_top) in Verilator with the UART "
        "simulated bit by bit, or with --model the behavioural board (sim.board.model, over the reference "
        "machine). --faults corrupts the simulated line in both directions (seeded).",
        "ga2 board-sim --chip fast &\n"
        "ga2 board-sim --chip book --model --faults flip:0.001,drop:0.001 --seed 3")
    chip_option(p, help="the chip on the board")
    p.add_argument("--baud", type=int_range(1200, 12_500_000), default=DEFAULT_BAUD, metavar="N",
                   help="the UART's rate in bits per second (at most a quarter of the clock)")
    p.add_argument("--clk-hz", type=int_range(1_000_000, 200_000_000), default=DEFAULT_CLK_HZ, metavar="HZ",
                   help="the board's clock (the ULX3S's 25 MHz); the UART's bit is clk-hz/baud cycles")
    p.add_argument("--faults", type=faults_arg, default=FaultSpec(), metavar="flip:P,drop:P,garbage:P",
                   help="per-byte probabilities of a flipped bit, a dropped byte and an inserted random byte "
                        "on the simulated line, each direction (default: none)")
    p.add_argument("--seed", type=int, default=1, metavar="S", help="the faults' random seed")
    p.add_argument("--model", action="store_true",
                   help="serve the behavioural board (sim.board.model over the reference machine) instead of "
                        "the Verilator model of the FPGA top")
    return p


def main(argv=None, out=None) -> int:
    out = out or sys.stdout
    a = build_parser().parse_args(argv)
    from sim.cli import UsageError
    if 4 * a.baud > a.clk_hz:
        raise UsageError(f"--baud {a.baud} is more than a quarter of --clk-hz {a.clk_hz} (a bit must last at "
                         f"least 4 clock cycles)")
    board = None
    if a.model:
        from sim.board.model import BoardModel
        board = BoardModel(a.chip, clk_hz=a.clk_hz, baud=a.baud)
    else:
        from sim.board.verilated import VerilatedBoard
        board = VerilatedBoard(a.chip, clk_hz=a.clk_hz, baud=a.baud)    # built (or found) before the pty
    down, up = FaultyLine(a.faults, 2 * a.seed), FaultyLine(a.faults, 2 * a.seed + 1)
    pty = Pty()
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    t0 = time.monotonic()
    try:
        print(f"pty: {pty.path}", file=out, flush=True)
        what = "the behavioural board (sim.board.model)" if a.model else "the FPGA top in Verilator"
        print(f"board-sim: {what}, chip {a.chip.spec()}, {a.clk_hz:,} Hz, {a.baud:,} baud, faults "
              f"{a.faults.text()} (seed {a.seed}); serving until killed", file=out, flush=True)
        try:
            if a.model:
                serve_model(pty, board, down, up, gap_seconds(a.baud))
            else:
                board.serve(pty, down, up)
        except (_Stopped, KeyboardInterrupt):
            pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not a.model:
            board.close()
        pty.close()
    runs = board.runs
    print(f"board-sim: stopped after {time.monotonic() - t0:.1f} s; {runs} RUN{'s' * (runs != 1)} executed; "
          f"bytes host->board {down.bytes:,} (faults: {down.summary()}), board->host {up.bytes:,} (faults: "
          f"{up.summary()}){f'; {pty.lost:,} bytes nobody read' if pty.lost else ''}", file=out, flush=True)
    return 0


def _raise_stopped(signum, frame):
    raise _Stopped()


if __name__ == "__main__":
    sys.exit(guarded(main))
