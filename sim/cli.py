"""What every command of the project shares: one-line errors instead of tracebacks, and a progress line.

A command's `main(argv)` raises one of the project's own error types for bad input or a failed run;
`guarded` turns it into ``error: <message>`` on stderr and exit status 2. Anything else is a bug and keeps
its traceback.
"""
from __future__ import annotations

import sys

__all__ = ["UsageError", "user_errors", "guarded", "Progress"]


class UsageError(ValueError):
    """Bad command-line input (the message names the option and the value)."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception types that describe a user's mistake or a failed run, not a bug."""
    from hdl.isa import IsaError
    from sim.backend import SimError
    kinds: list[type[BaseException]] = [UsageError, IsaError, SimError, OSError]
    for module, names in (("compiler", ("CompileError",)),
                          ("host.pagetable", ("OutOfPages", "PageTableError")),
                          ("host.paged", ("HostError",)),
                          ("host.window", ("WindowError",)),
                          ("sim.hexfile", ("HexFileError",))):
        try:
            mod = __import__(module, fromlist=list(names))
        except ImportError:
            continue
        kinds += [getattr(mod, n) for n in names if hasattr(mod, n)]
    return tuple(kinds)


def guarded(main, argv=None) -> int:
    """Run `main(argv)` and map the project's errors to a one-line message and exit status 2."""
    try:
        return main(argv) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except user_errors() as e:
        msg = str(e) or type(e).__name__
        print(f"error: {msg.splitlines()[0]}", file=sys.stderr)
        return 2


class Progress:
    """A one-line progress indicator on stderr, shown only on a terminal (quiet in logs and CI)."""

    def __init__(self, label: str, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.label = label
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        width = 30
        filled = width * done // max(total, 1)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()
            self._shown = False
