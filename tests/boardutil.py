"""`ga2 board-sim` as a test's child process: started, its ``pty:`` line awaited (bounded), stopped by its
own pid, and its exit summary parsed."""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class BoardSim:
    """``python -m sim.board_sim ARGS`` running; `path` is its pseudo-terminal."""

    def __init__(self, *args: str, timeout: float = 60.0):
        self.args = args
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "sim.board_sim", *args], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=self.err, stdin=subprocess.DEVNULL)
        self._out = b""
        line = self._line(timeout)
        if not line.startswith("pty: "):
            self.stop()
            raise AssertionError(f"board-sim {' '.join(args)} printed {line!r} first; stderr: {self.stderr()}")
        self.path = line[len("pty: "):]

    def _line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._out:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and not select.select([fd], [], [], 0)[0]:
                return self._out.decode(errors="replace")
            if select.select([fd], [], [], min(left, 1.0))[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    return self._out.decode(errors="replace")
                self._out += chunk
        line, _, self._out = self._out.partition(b"\n")
        return line.decode(errors="replace")

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-2000:]

    def kill(self) -> None:
        """SIGKILL: the board vanishes mid-whatever (its pty closes)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> str:
        """SIGTERM, then what it printed after its first line (its summary)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            rest, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            rest, _ = self.proc.communicate(timeout=30)
        self.err.close()
        return (self._out + (rest or b"")).decode(errors="replace")

    @staticmethod
    def runs(summary: str) -> int:
        """The RUNs the board executed, from the exit summary."""
        m = re.search(r"(\d+) RUNs? executed", summary)
        assert m, summary
        return int(m.group(1))


def kill_mid_decode(sim: BoardSim, cmd: list[str], reach: float, finish: float = 10.0) -> str:
    """Run the decode `cmd` (progress lines on stderr) against `sim`, SIGKILL the board once step 2 is
    under way (within `reach` seconds), and return the command's stderr after checking that it ended
    within `finish` seconds with exit status 2 and one error line naming the board (no traceback)."""
    env = dict(os.environ, GA2_PROGRESS_SECONDS="0")       # a progress line per step on stderr
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    seen = b""
    try:
        deadline = time.monotonic() + reach
        while b"decoding on board: 2/32" not in seen and time.monotonic() < deadline:    # mid-decode
            if select.select([p.stderr], [], [], 1.0)[0]:
                chunk = os.read(p.stderr.fileno(), 4096)
                if not chunk:
                    break
                seen += chunk
        assert b"decoding on board: 2/32" in seen, seen
        sim.kill()
        t0 = time.monotonic()
        _, err = p.communicate(timeout=finish + 50)
        assert time.monotonic() - t0 < finish
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
    err = (seen + err).decode()
    lines = [ln for ln in err.splitlines() if not ln.startswith("decoding on")]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: the board on "), err
    assert "Traceback" not in err
    return err


def run_ga2(capsys, *argv):
    """``ga2 ARGV`` in this process: (exit status, stdout, stderr) as captured by pytest's `capsys`."""
    from sim import ga2
    code = ga2.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err
