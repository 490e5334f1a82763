"""What every command of the project shares: its parser, one-line errors, output paths and progress.

A command builds its parser with `Parser` (a description, an example, a default shown for every option;
a bad option or value is one ``error: ...`` line and exit status 2, never argparse's usage block). Its
`main(argv)` raises one of the project's own error types for bad input or a failed run; `guarded` turns
those into ``error: <message>`` on stderr and exit status 2. Anything else is a bug and keeps its
traceback. Output paths are checked while parsing (`output_file`, `output_dir`), before any work, and
written atomically (`write_text`, `write_json`). `Progress` shows a tqdm bar on a terminal and a plain line
every few seconds in a log.

The commands themselves are listed once, in `sim.ga2.COMMANDS` (the ``ga2`` tool); ``python -m sim.X``
runs the same `main`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

__all__ = ["write_png", "UsageError", "user_errors", "guarded", "Parser", "int_range", "window", "sim_option", "chip",
           "chip_option", "positive_seconds", "board_options", "assert_option", "backend_options", "link_report",
           "output_file", "output_dir", "make_dir", "write_text", "write_json", "Progress",
           "PROGRESS_ENV", "progress_interval", "CommandError"]

PROGRESS_ENV = "GA2_PROGRESS_SECONDS"   # seconds between plain progress lines when not on a terminal
_DEFAULT_INTERVAL = 10.0

# Set by the `ga2` dispatcher so that --help and the error lines name the command as it was typed.
invoked_as: str | None = None


class UsageError(ValueError):
    """Bad command-line input (the message names the option and the value)."""


class CommandError(RuntimeError):
    """A run that failed for a reason its message states, not a bug: the base of the error types of the
    modules above this one (e.g. `sim.cluster.ClusterError`), so that `guarded` catches them without
    importing those modules (which import this one)."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception types that describe a user's mistake or a failed run, not a bug.

    Explicit imports on purpose: a renamed or moved exception fails here, loudly (and in
    tests/test_cli.py), instead of silently turning back into a traceback. A module that imports this one
    derives its error type from `CommandError` instead (tests/test_cli.py checks those too).
    """
    from compiler.graph import CompileError
    from hdl.config import ChipSpecError
    from hdl.isa import IsaError
    from host.engine import EngineError
    from host.paged import HostError
    from host.pagetable import OutOfPages, PageTableError
    from host.window import WindowError
    from sim.backends import SimError
    from sim.backends.board_backend import BoardError
    from sim.formats.hexfile import HexFileError
    return (UsageError, ChipSpecError, IsaError, SimError, CompileError, OutOfPages, PageTableError, HostError,
            WindowError, HexFileError, CommandError, EngineError, BoardError, OSError)


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"      # not "[Errno 2] ..." from OSError's str()
    msg = str(e) or type(e).__name__
    return msg.splitlines()[0]


def guarded(main, argv=None) -> int:
    """Run `main(argv)` and map the project's errors to a one-line message and exit status 2."""
    try:
        return main(argv) or 0
    except SystemExit as e:         # the parser's own exit (--help: 0, a bad option: 2, already printed)
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except user_errors() as e:
        print(f"error: {_message(e)}", file=sys.stderr)
        return 2


# ---- the parser ----------------------------------------------------------------------------------------

class _Formatter(argparse.HelpFormatter):
    """Wraps each paragraph of the description, keeps the example's lines as they are, and shows a
    default for every option that does not say it."""

    def _fill_text(self, text, width, indent):
        import textwrap
        paragraphs = text.split("\n\n")
        return "\n\n".join(p if p.startswith("example:") else
                            textwrap.fill(" ".join(p.split()), width, initial_indent=indent,
                                          subsequent_indent=indent) for p in paragraphs)

    def _get_help_string(self, action):
        text = action.help or ""
        if not action.option_strings or action.help is argparse.SUPPRESS or "default" in text.lower():
            return text
        if action.required:
            return f"{text} (required)"
        if isinstance(action, (argparse._StoreTrueAction, argparse._HelpAction)):
            return text if isinstance(action, argparse._HelpAction) else f"{text} (default: off)"
        value = action.default
        shown = "none" if value is None else ",".join(map(str, value)) if isinstance(value, (list, tuple)) \
            else str(value)
        return f"{text} (default: {shown})"


_INVALID_CHOICE = re.compile(r"argument (?P<option>[^:]+): invalid choice: (?P<value>.*) \(choose from (?P<choices>.*)\)")


class Parser(argparse.ArgumentParser):
    """The parser of every command: description, example, defaults in --help, errors in one line.

    Parameters
    ----------
    prog : str
        How the command is run without the dispatcher, e.g. ``python -m sim.decode``; under ``ga2`` the
        dispatcher's name for it is shown instead.
    description : str
        What the command does (the first paragraph of --help).
    example : str
        One or more example command lines (shown at the end of --help).
    """

    def __init__(self, prog: str, description: str, example: str, **kwargs):
        if not description or not example:
            raise TypeError("every command needs a description and an example")
        lines = "\n".join("  " + ln for ln in example.strip().splitlines())
        super().__init__(prog=invoked_as or prog, description=description, epilog=f"example:\n{lines}",
                         formatter_class=_Formatter, **kwargs)
        self.example = example

    def error(self, message):
        """One line on stderr and exit status 2 (argparse's own errors: unknown option, bad value)."""
        message = message.splitlines()[0] if message else "bad command line"
        m = _INVALID_CHOICE.fullmatch(message)
        if m:       # the project's wording for a bad choice, the same as the commands' own checks
            choices = ", ".join(c.strip().strip("'") for c in m["choices"].split(","))
            message = f"{m['option']} must be one of {choices}, got {m['value']}"
        elif message.startswith("argument "):
            # "argument --steps: must be ..." -> "--steps must be ...": the option first, as in our own checks;
            # a message that already names its option ("--chip 'x': ...") keeps one copy of the name
            message = re.sub(r"^(\S+): (must |\1 )", r"\1 \2", message[len("argument "):])
            message = re.sub(r"^(\S+) \1 ", r"\1 ", message)
        self.exit(2, f"error: {message}\n")


def int_range(lo: int | None = None, hi: int | None = None):
    """An argparse type: a whole number within lo..hi (either bound may be None)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number{_bounds(lo, hi)}, got {text!r}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be{_bounds(lo, hi)}, got {v}")
        return v
    parse.__name__ = "whole number"
    return parse


def _bounds(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f" within {lo}..{hi}"
    if lo is not None:
        return f" at least {lo}"
    return f" at most {hi}" if hi is not None else ""


def window(text: str) -> int | None:
    """An argparse type for a sliding window: 'none' or a whole number >= 1."""
    if text.lower() == "none":
        return None
    try:
        w = int(text)
    except ValueError:
        w = 0
    if w < 1:
        raise argparse.ArgumentTypeError(f"must be 'none' or a whole number >= 1, got {text!r}")
    return w


def sim_option(parser: argparse.ArgumentParser, default: str, help: str = "which simulator runs the chip",
               flag: str = "--sim") -> None:
    """Add ``--sim`` with the choices of the backend registry (`sim.backends.BACKENDS`), never a copy."""
    from sim.backends import BACKENDS
    parser.add_argument(flag, default=default, choices=tuple(BACKENDS), metavar="{" + "|".join(BACKENDS) + "}",
                        help=help)


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0 (at most a day)."""
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0 < v <= 86400:
        raise argparse.ArgumentTypeError(f"must be a number of seconds within 0..86400, got {text!r}")
    return v


def board_options(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``--sim board`` (`sim.backends.board_backend`): ``--port``, ``--baud``,
    ``--timeout`` and ``--retries``; `backend_options` turns them into the backend's arguments."""
    from sim.backends.board_backend import DEFAULT_BAUD, DEFAULT_RETRIES, DEFAULT_TIMEOUT
    g = parser.add_argument_group("the board (--sim board)")
    g.add_argument("--port", default=None, metavar="DEVICE",
                   help="with --sim board: the board's serial port, e.g. /dev/ttyUSB0 or the pty: path that "
                        "ga2 board-sim prints (default: none)")
    g.add_argument("--baud", type=int_range(1200, 100_000_000), default=DEFAULT_BAUD, metavar="N",
                   help="with --sim board: the serial line's rate, as the board was built for")
    g.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT, metavar="S",
                   help="with --sim board: seconds the board may stay silent while an answer is due")
    g.add_argument("--retries", type=int_range(0, 1000), default=DEFAULT_RETRIES, metavar="N",
                   help="with --sim board: frames that may fail in a row (NAK, garbled or lost) before the run fails")


def assert_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--assert`` (``args.asserts``): with --sim verilator, `backend_options` asks for the model built
    with the design's assertions evaluated."""
    parser.add_argument("--assert", dest="asserts", action="store_true",
                        help="with --sim verilator: run the model built with the design's assertions evaluated "
                             "(hdl.properties; a model of its own, cached apart, slower to build and run); a failed "
                             "one stops its program with an error naming the property and the cycle")


def backend_options(a, sim: str | None = None) -> dict:
    """The backend arguments of the parsed options `a` for the simulator `sim` (default ``a.sim``): the
    board's port, baud, timeout and retries for ``board``, ``asserts`` for ``verilator`` with --assert,
    nothing for the others. A --port without --sim board, --sim board without a --port, or --assert
    without --sim verilator is a `UsageError`."""
    sim = getattr(a, "sim", None) if sim is None else sim
    port = getattr(a, "port", None)
    if getattr(a, "asserts", False):
        if sim != "verilator":
            raise UsageError(f"--assert builds the Verilator model with the design's assertions: it needs --sim "
                             f"verilator, not --sim {sim}" + (" (Amaranth's simulator evaluates every Assert "
                                                               "anyway)" if sim == "amaranth" else ""))
        if port is not None:
            raise UsageError(f"--port {port} is for --sim board (the board's serial port), not --sim {sim}")
        return {"asserts": True}
    if sim != "board":
        if port is not None:
            raise UsageError(f"--port {port} is for --sim board (the board's serial port), not --sim {sim}")
        return {}
    if not port:
        raise UsageError("--sim board needs --port DEVICE: the board's serial port, or the pty: path that "
                         "ga2 board-sim prints")
    return {"port": port, "baud": a.baud, "timeout": a.timeout, "retries": a.retries}


def link_report(backend, out=None) -> None:
    """Print the board link's one-line summary (frames, retries, bytes) if `backend` is the board's."""
    summary = getattr(backend, "link_summary", None)
    if callable(summary):
        print(summary(), file=out or sys.stdout)


def chip(text: str):
    """An argparse type for ``--chip``: a preset name or ``name=value`` overrides (`hdl.config.parse_chip`),
    returned as a `hdl.config.ChipConfig`. A bad spec is refused while parsing, in one line."""
    from hdl.config import ChipSpecError, parse_chip
    try:
        return parse_chip(text)
    except ChipSpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


chip.__name__ = "chip spec"


def chip_option(parser: argparse.ArgumentParser, help: str = "the chip generated and simulated") -> None:
    """Add ``--chip SPEC`` (default ``book``) to a command: every command that builds, compiles for or
    simulates a chip takes it the same way; ``args.chip`` is the `hdl.config.ChipConfig`."""
    from dataclasses import fields

    from hdl.config import BOOK, PRESETS, ChipConfig
    names = ", ".join(PRESETS)
    params = ", ".join(f.name for f in fields(ChipConfig))
    parser.add_argument("--chip", type=chip, default=BOOK, metavar="SPEC",
                        help=f"{help}: a preset ({names}) or comma-separated name=value overrides of the book's "
                             f"chip, e.g. array=8,mm_load=4 (parameters: {params}; default: book)")


# ---- output paths: checked while parsing, written atomically -----------------------------------------

def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def output_file(text: str) -> str:
    """An argparse type for a file the command will write: refused now (naming the option) if it is a
    directory, its directory does not exist or cannot be written, or the file exists read-only."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"directory {parent} does not exist")
    if not _writable_dir(parent):
        raise argparse.ArgumentTypeError(f"directory {parent} is not writable")
    if os.path.exists(text) and not os.access(text, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text} exists and is not writable")
    return text


def output_dir(text: str) -> str:
    """An argparse type for a directory the command will write into: it exists and is writable, or the
    nearest existing directory above it is (the command then creates the missing levels with `make_dir`,
    which says so)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    if os.path.isdir(text):
        if not _writable_dir(text):
            raise argparse.ArgumentTypeError(f"directory {text} is not writable")
        return text
    above = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise argparse.ArgumentTypeError(f"{above} is a file, so {text} cannot be created")
    if not _writable_dir(above):
        raise argparse.ArgumentTypeError(f"directory {above} is not writable, so {text} cannot be created")
    return text


def make_dir(path, out=None) -> None:
    """Create the output directory `path` and the missing levels above it (checked by `output_dir`), and
    say so: a mistyped path must not become a silent tree."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        os.makedirs(path)
        print(f"created directory {path}", file=out or sys.stdout)


def write_text(path, text: str, out=None, say: bool = True) -> None:
    """Write `text` to `path` atomically (a temporary file beside it, then a rename); a failed write
    leaves neither a half-written file nor the temporary one. Prints ``wrote PATH`` unless `say` is off."""
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if say:
        print(f"wrote {path}", file=out or sys.stdout)


def write_png(path, fig, out=None, say: bool = True) -> None:
    """Save the matplotlib figure `fig` to `path` as PNG, atomically like `write_text`, and close it."""
    import matplotlib.pyplot as plt
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    if say:
        print(f"wrote {path}", file=out or sys.stdout)


def write_json(path, doc, out=None, say: bool = True) -> None:
    """`write_text` of `doc` as indented JSON (serialized first: an unserializable doc writes nothing)."""
    write_text(path, json.dumps(doc, indent=1) + "\n", out=out, say=say)


# ---- progress ------------------------------------------------------------------------------------------

def progress_interval() -> float:
    """Seconds between plain progress lines in a log ($GA2_PROGRESS_SECONDS, default 10)."""
    text = os.environ.get(PROGRESS_ENV, "")
    try:
        return max(0.0, float(text)) if text else _DEFAULT_INTERVAL
    except ValueError:
        return _DEFAULT_INTERVAL


class Progress:
    """Progress of a long run, called as ``progress(done, total)``.

    On a terminal: a tqdm bar on stderr, removed at the end. Otherwise (a log, CI, a pipe): one plain line
    ``label: done/total unit (p %), t s`` on stderr at most every `interval` seconds, so a long run in a
    log still shows that it is alive.

    Parameters
    ----------
    label : str
        What is progressing, e.g. ``decoding on amaranth``.
    unit : str
        What `done` counts (shown in the plural in a log line).
    enabled : bool, optional
        False: show nothing (default: shown).
    stream : file, optional
        Where to show it (default: sys.stderr at construction).
    interval : float, optional
        Seconds between log lines (default: `progress_interval()`).
    """

    def __init__(self, label: str, unit: str = "step", enabled: bool | None = None, stream=None,
                 interval: float | None = None):
        self.stream = stream or sys.stderr
        self.label = label
        self.unit = unit
        self.enabled = True if enabled is None else enabled
        self.tty = _isatty(self.stream)
        self.interval = progress_interval() if interval is None else interval
        self.t0 = self._last = time.monotonic()
        self._bar = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.tty:
            if self._bar is None:
                from tqdm import tqdm
                self._bar = tqdm(total=total, desc=self.label, unit=self.unit, file=self.stream, leave=False,
                                 dynamic_ncols=True)
            self._bar.total = total
            self._bar.update(done - self._bar.n)
            return
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            pct = 100 * done // max(total, 1)
            print(f"{self.label}: {done}/{total} {self.unit}s ({pct} %), {now - self.t0:.1f} s",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
