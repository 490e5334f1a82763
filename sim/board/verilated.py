"""The board top in Verilator for `ga2 board-sim`: built once per (chip, clock, baud), cached, run as a
child process between the pseudo-terminal and the simulated line.

`hdl.board_top.board_verilog` gives the FPGA top the bitstream is built from (UART, protocol engine, chip,
memories) as Verilog; ``sim/board/board_main.cpp`` drives its ``rx`` pin bit by bit from the bytes on its
stdin and decodes its ``tx`` pin into bytes on its stdout (its header comment has the timing, and how it
blocks when the board is idle). The executable is cached beside the chip models of
`sim.backends.verilator_backend` (``$GA2_BUILD_DIR/verilator/board-<hash>/`` or ``build/verilator/...``),
the hash covering the Verilog, the driver, the flags, the clock and baud and the Verilator version; a
shortcut from the hdl/ sources skips emitting the Verilog when nothing changed. Verilator's run-time
library objects are shared with the chip models (the same OBJCACHE).
"""
from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
from pathlib import Path

from hdl.config import BOOK, ChipConfig
from sim.backends import BackendUnavailable, SimError

__all__ = ["VerilatedBoard", "board_executable", "DRIVER"]

DRIVER = Path(__file__).with_name("board_main.cpp")
TOP = "board"
PREFIX = "Vboard"
EXE = "ga2board"
ERR_KEEP = 16384                # bytes of the child's stderr kept (its last lines)

_EMIT = """
import sys
from hdl.board_top import board_verilog
from hdl.config import ChipConfig
config = ChipConfig(**{k: int(v) for k, v in (kv.split("=") for kv in sys.argv[1].split(","))})
sys.stdout.write(board_verilog(config, int(sys.argv[2]), int(sys.argv[3]), name=sys.argv[4]))
"""


def _emit(config: ChipConfig, clk_hz: int, baud: int) -> str:
    """The board top's Verilog, emitted by a fresh interpreter from hdl/ as it is on disk now."""
    from sim.backends.verilator_backend import _hdl_dir
    env = dict(os.environ)
    root = str(_hdl_dir().parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run([sys.executable, "-c", _EMIT, config.key(), str(clk_hz), str(baud), TOP], cwd=root,
                       env=env, capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        raise BackendUnavailable(f"cannot emit the board's Verilog: {last}")
    return p.stdout


def board_executable(config: ChipConfig = BOOK, clk_hz: int = 25_000_000, baud: int = 3_000_000,
                     build_dir=None, verbose: bool = True) -> Path:
    """The Verilator executable of the board top (built now if the cache does not hold it)."""
    from sim.backends import verilator_backend as vb
    from hdl.link_engine import gap_cycles
    tool, version = vb._find_tool()
    root = Path(build_dir) if build_dir is not None else vb.default_build_root()
    root.mkdir(parents=True, exist_ok=True)
    driver = DRIVER.read_text()
    defines = [f"-DGA2_CLK_HZ={clk_hz}", f"-DGA2_BAUD={baud}", f"-DGA2_GAP={gap_cycles(clk_hz, baud)}"]
    flags = " ".join(vb.VERILATOR_FLAGS + defines)
    source_key = vb._hdl_source_key()
    shortcut = root / "by-source" / ("board-" + vb._digest(source_key, config.key(), vb._amaranth_version(),
                                                            driver, version, flags))
    with open(root / f"src-{shortcut.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            exe = root / shortcut.read_text().strip() / EXE
            if exe.exists():
                return exe
        except OSError:
            pass
        text = _emit(config, clk_hz, baud)
        digest = "board-" + vb._digest(text, config.key(), driver, version, flags)
        final = root / digest
        exe = final / EXE
        if not exe.exists():
            with open(root / f"{digest}.lock", "w") as lock2:
                fcntl.flock(lock2, fcntl.LOCK_EX)
                if not exe.exists():
                    vb.compile_model(tool, root, final, {"board.v": text, "main.cpp": driver}, TOP, PREFIX,
                                     EXE, defines, f"the board top for --chip {config.spec()}", verbose)
        if vb._hdl_source_key() == source_key:
            shortcut.parent.mkdir(parents=True, exist_ok=True)
            tmp = shortcut.with_name(f".{shortcut.name}.{os.getpid()}")
            tmp.write_text(final.name + "\n")
            os.replace(tmp, shortcut)
    return exe


class VerilatedBoard:
    """The board top's executable as a child process, relayed to a pseudo-terminal (`serve`).

    Attributes
    ----------
    runs : int
        RUNs the board executed (after `close`: the child's own count).
    exe : pathlib.Path
    """

    def __init__(self, config: ChipConfig = BOOK, clk_hz: int = 25_000_000, baud: int = 3_000_000, build_dir=None):
        self.config, self.clk_hz, self.baud = config, clk_hz, baud
        self.exe = board_executable(config, clk_hz, baud, build_dir)
        self.proc = None
        self.runs = 0
        self.stats = ""
        self._err = b""                 # the end of the child's stderr (its last lines, the counts line)

    def _take_stderr(self, data: bytes) -> None:
        """Keep the end of the child's stderr; with GA2BOARD_DEBUG set, pass it on to ours as well."""
        if not data:
            return
        if os.environ.get("GA2BOARD_DEBUG") is not None:
            sys.stderr.write(data.decode(errors="replace"))
            sys.stderr.flush()
        self._err = (self._err + data)[-ERR_KEEP:]

    def serve(self, pty, down, up) -> None:
        """Relay between `pty` (a `sim.board.boardsim.Pty`) and the board until interrupted; bytes to the
        board pass `down`, bytes from it `up` (`sim.board.faults.FaultyLine`). The child's death ends it
        with a `SimError`."""
        self.proc = subprocess.Popen([str(self.exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0)
        child_in, child_out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        child_err = self.proc.stderr.fileno()
        os.set_blocking(child_in, False)
        pending = bytearray()           # bytes for the board the pipe did not take yet
        while True:
            wants = [child_in] if pending else []
            ready, writable, _ = select.select([pty.master, child_out, child_err], wants, [])
            if child_err in ready:      # read as it comes: a full pipe would stop the board (GA2BOARD_DEBUG)
                self._take_stderr(os.read(child_err, 65536))
            if pty.master in ready:
                data = down.apply(pty.read())
                if data:
                    pending += data
            if child_out in ready:
                data = os.read(child_out, 65536)
                if not data:
                    code = self.proc.wait()
                    self._take_stderr(self.proc.stderr.read())
                    err = self._err.decode(errors="replace").strip().splitlines()
                    raise SimError(f"the board simulation exited (status {code})"
                                   + (f": {err[-1]}" if err else ""))
                pty.write(up.apply(data))
            if pending and (child_in in writable or not wants):
                try:
                    n = os.write(child_in, pending)
                    del pending[:n]
                except BlockingIOError:
                    pass

    def close(self) -> None:
        """End the child (the end of its stdin) and take its counts."""
        p = self.proc
        if p is None:
            return
        try:
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stderr:
            self._take_stderr(p.stderr.read())
        err = self._err.decode(errors="replace")
        for line in err.splitlines():
            if line.startswith("ga2board: runs "):
                self.stats = line
                self.runs = int(line.split()[2])
        self.proc = None
