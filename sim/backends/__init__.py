"""The one interface every simulator of the chip answers (architecture: "The backend interface").

A backend runs a program (a list of 128-bit instruction words, HALT last) on an external-memory image
(a list of 32-bit words; its length is EXT) with read latency LAT, and returns the final external memory,
the final scratchpad (all of its words) and the five counters ``[total, mm, dma, vec, instructions]``. The
reference machine, the Amaranth simulation and Verilator must return identical results for every program
and every LAT in 1..MAX_LAT; `first_difference` is the one comparison.
"""
from __future__ import annotations

import operator
import os
from dataclasses import dataclass, field
from pathlib import Path

from hdl.isa import ErrorKind as _ErrorKind

__all__ = ["RunResult", "ErrorStop", "TraceEntry", "SimError", "DidNotHalt", "AssertionFailed", "BackendUnavailable",
           "BadInput", "Backend", "BACKENDS", "get_backend", "MAX_CYCLES", "MAX_LAT", "first_difference",
           "program_words", "image_words", "scratchpad_words", "check_lat", "check_max_cycles", "build_base"]

MAX_CYCLES = 100_000        # the book's testbench gives up after this many cycles
MAX_LAT = 1024              # longest external read latency a backend accepts
_W = 0xFFFFFFFF


def build_base() -> Path:
    """The directory the simulators cache what they build in (Verilator models, the pysim engine's compiled
    code): ``$GA2_BUILD_DIR``, else ``build/`` at the repository's root."""
    env = os.environ.get("GA2_BUILD_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "build"


@dataclass
class TraceEntry:
    """One executed instruction: its pc and the cyc_total values in its FETCH, ISSUE and done cycles.

    `seq` is the cycles the sequencer spent on it outside every unit's WAIT cycles (`hdl.isa.seq_cycles`):
    2, its FETCH and ISSUE, or 0 for an instruction that a prefetch chip (docs/prefetch.md) read ahead and
    issued in the previous one's done cycle; then ``issue`` is that done cycle and ``fetch`` the cycle its
    word was read in (the previous instruction's issue cycle).
    """
    pc: int
    fetch: int
    issue: int
    done: int
    seq: int = 2

    @property
    def busy(self) -> int:
        return self.done - self.issue


def trace_from_changes(changes) -> list[TraceEntry]:
    """The executed instructions of an RTL run, from its sequencer's changes.

    `changes` are ``(cycle, state, pc)``: the ``cyc_total`` value, the `hdl.chip.SeqState` value and the pc
    of a cycle, for the first cycle after the start pulse and then for every cycle whose state or pc differs
    from the cycle before, ending with the HALT state (the Verilator driver samples them: a "GA2T" job
    file). An instruction runs FETCH, ISSUE, then its WAIT cycles, the last one its done cycle; on a
    prefetch chip (docs/prefetch.md) one issued in the previous one's done cycle goes from WAIT to WAIT with
    the next pc (or to HALT), with no FETCH or ISSUE of its own. The entries follow `TraceEntry`'s meaning,
    which the reference machine's trace has too.
    """
    from hdl.chip import SeqState              # late: the reference machine's users need no Amaranth
    trace: list[TraceEntry] = []
    before = None
    for k, (cycle, state, pc) in enumerate(changes):
        state = SeqState(state)
        if state == SeqState.FETCH:
            trace.append(TraceEntry(pc, cycle, -1, -1))
        elif state == SeqState.ISSUE:
            trace[-1].issue = cycle
        elif state == SeqState.WAIT:
            if before == SeqState.WAIT:         # issued in the last one's done cycle, read in its issue
                last = trace[-1]
                trace.append(TraceEntry(pc, last.issue, last.done, -1, 0))
            # its done cycle: the last before the next change (every cycle but HALT's counts)
            trace[-1].done = changes[k + 1][0] - 1 if k + 1 < len(changes) else -1
        elif state == SeqState.HALT:
            if before == SeqState.ISSUE:
                trace[-1].done = trace[-1].issue
            elif before == SeqState.WAIT:       # a HALT issued in the last one's done cycle
                last = trace[-1]
                trace.append(TraceEntry(pc, last.issue, last.done, last.done, 0))
            break
        before = state
    return trace


def first_trace_difference(expected, got) -> str | None:
    """None when two traces (`TraceEntry` lists) are equal, else where they first part: "entry k: expected
    ..., got ..." (an entry missing on one side is "no entry")."""
    if expected == got:
        return None
    k = next((k for k, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    def entry(t):
        return str(t[k]) if k < len(t) else "no entry"
    return f"entry {k}: expected {entry(expected)}, got {entry(got)}"


@dataclass(frozen=True)
class ErrorStop:
    """The chip's error state after an error stop (a chip other than the book's, ``hdl.isa.ErrorKind``).

    Attributes
    ----------
    kind : str
        ``hdl.isa.ErrorKind``'s label of the chip's ``error_kind``: ``"row"`` (a GATHER/SCATTER row beyond
        its block table) or ``"page"`` (a page number outside the pool), docs/resident.md; ``"opcode"`` (an
        opcode the chip does not have), ``"length"`` (a zero length or MM dimension) or ``"range"`` (an MM
        dimension past the array or the operand memories), the words ``hdl.isa.issue_stop`` stops on.
    pc : int
        The failing instruction's pc (``error_pc``).
    info : int
        The table index for a row error, the bad table entry (the whole 32-bit word) for a page error, the
        opcode for the others (``error_info``).
    """
    kind: str
    pc: int
    info: int

    # the chip's error_kind code -> kind (hdl.isa.ErrorKind, NONE left out)
    KINDS = {int(k): k.label for k in _ErrorKind if k}

    def __str__(self) -> str:
        what = {"row": "row beyond the table, index", "page": "page outside the pool, entry",
                "opcode": "an opcode this chip does not have:", "length": "a zero length, opcode",
                "range": "a field past the chip's limits, opcode"}[self.kind]
        return f"error stop at pc {self.pc}: {what} {self.info}"


@dataclass
class RunResult:
    """What a run leaves behind.

    Attributes
    ----------
    ext : list of int
        The final external memory, EXT unsigned 32-bit words.
    counters : list of int
        ``[cyc_total, cyc_mm, cyc_dma, cyc_vec, n_inst]``.
    scratchpad : list of int or None
        The final scratchpad, ``hdl.isa.SPAD_WORDS`` unsigned words. Every backend fills it; only an
        expectation read from a record file (the book's format has no scratchpad) leaves it None.
    trace : list of TraceEntry or None
        One entry per executed instruction, when the backend was asked for it.
    error : ErrorStop or None
        None when the program ended at a HALT; the error state when a GATHER/SCATTER stopped the chip
        (resident mode, docs/resident.md).
    """
    ext: list[int]
    counters: list[int]
    scratchpad: list[int] | None = field(default=None)
    trace: list[TraceEntry] | None = field(default=None)
    error: ErrorStop | None = field(default=None)

    @property
    def cycles(self) -> int:
        return self.counters[0]


class SimError(RuntimeError):
    """A program that the chip cannot run to completion (the message says which and why)."""


class DidNotHalt(SimError):
    pass


def where_stuck(pc: int, cur: int, state: int, config=None) -> str:
    """Say where a chip that did not halt stands, from its sequencer's `pc`, `cur` (the opcode in flight)
    and `state` (an `hdl.chip.SeqState` value): the words an RTL simulator's `DidNotHalt` ends with."""
    from hdl.chip import SeqState              # late: the reference machine's users need no Amaranth
    from hdl.config import BOOK
    from hdl.isa import Op, legal_ops
    state = SeqState(state)
    if state == SeqState.HALT:
        return f"halted after the limit, pc {pc}"
    if state == SeqState.WAIT:
        # an opcode this chip has no unit for (9/10 without gather=1, 11..15) is illegal here
        if cur not in legal_ops(BOOK if config is None else config):
            return f"pc {pc}: illegal opcode {cur} waits forever"
        return f"pc {pc}: still waiting on {Op(cur).name}"
    return f"pc {pc}, sequencer in {state.name}"


class AssertionFailed(SimError):
    """A property of the design (an `Assert` of `hdl.properties`) failed while the program ran: the message
    names the property and where (the run, the cycle) when the simulator knows."""


class BackendUnavailable(SimError):
    pass


class BadInput(SimError):
    """A program, image, latency or limit that no backend can take (the message names the value)."""


# ---- the checks every backend applies to its inputs ----------------------------------------------

def program_words(program) -> list[int]:
    """The program as 128-bit unsigned words (`hdl.isa.Instr` accepted); at most the ROM's 256."""
    from hdl.isa import ROM_WORDS, Instr, encode
    words = []
    for i, w in enumerate(program):
        if isinstance(w, Instr):
            w = encode(w)
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < (1 << 128):
            raise BadInput(f"program word {i} = {w!r} is not a 128-bit unsigned integer or Instr")
        words.append(w)
    if len(words) > ROM_WORDS:
        raise BadInput(f"the program has {len(words)} instructions; the program ROM holds {ROM_WORDS}")
    return words


def image_words(image) -> list[int]:
    """The external-memory image as unsigned 32-bit words; signed values are stored as the chip stores
    them. EXT = len(image) must be 1..65536 (the chip's external addresses are 16 bits)."""
    ext = list(image)
    if not 1 <= len(ext) <= 1 << 16:
        raise BadInput(f"the external memory image has {len(ext)} words (1..65536 allowed)")
    if set(map(type, ext)) == {int} and min(ext) >= 0 and max(ext) <= _W:
        return ext                      # the usual case, checked at C speed
    out = []
    for i, w in enumerate(ext):
        try:
            v = operator.index(w)
        except TypeError:
            v = None
        if v is None or isinstance(w, bool) or not -(1 << 31) <= v < (1 << 32):
            raise BadInput(f"external word {i} = {w!r} is not a 32-bit value")
        out.append(v & _W)
    return out


def scratchpad_words(scratchpad, depth: int) -> list[int] | None:
    """The initial scratchpad of a run (resident mode, docs/resident.md): None (all zero, the book's
    start) or exactly `depth` unsigned 32-bit words, returned as a fresh list."""
    if scratchpad is None:
        return None
    try:
        words = list(scratchpad)
    except TypeError:
        raise BadInput(f"scratchpad = {scratchpad!r} is not a list of words") from None
    if len(words) != depth:
        raise BadInput(f"the initial scratchpad has {len(words)} words; the chip's scratchpad has {depth}")
    for i, w in enumerate(words):
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= _W:
            raise BadInput(f"scratchpad word {i} = {w!r} is not an unsigned 32-bit value")
    return words


def check_lat(lat) -> int:
    if isinstance(lat, bool) or not isinstance(lat, int) or not 1 <= lat <= MAX_LAT:
        raise BadInput(f"lat = {lat!r} must be a whole number in 1..{MAX_LAT}")
    return lat


def check_max_cycles(max_cycles) -> int:
    if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or not 1 <= max_cycles < (1 << 32):
        raise BadInput(f"max_cycles = {max_cycles!r} must be a whole number in 1..2^32-1")
    return max_cycles


class Backend:
    """Base class: subclasses set `name` and implement `run`; `run_many` runs a batch through `run`
    (a backend that can do better, like Verilator in one process, overrides it)."""
    name = "?"

    def run(self, program, image, lat: int = 8, scratchpad=None) -> RunResult:   # pragma: no cover
        """Run `program` on `image` with read latency `lat`, the scratchpad starting as `scratchpad`
        (None: all zero; else ``config.spad_depth`` words, checked by `scratchpad_words`)."""
        raise NotImplementedError

    def run_many(self, jobs, lat: int = 8, return_errors: bool = False) -> list:
        """Run ``(program, image[, lat[, scratchpad]])`` jobs in turn (``lat`` is the default; a
        scratchpad of None starts from zeros).

        A job that does not halt raises `DidNotHalt` naming its index, or, with `return_errors`, leaves
        the exception in its place in the returned list.
        """
        out = []
        for n, job in enumerate(jobs):
            job = tuple(job)
            if len(job) not in (2, 3, 4):
                raise BadInput(f"job {n}: expected (program, image[, lat[, scratchpad]]), got {len(job)} items")
            extra = {} if len(job) < 4 or job[3] is None else {"scratchpad": job[3]}
            try:
                out.append(self.run(job[0], job[1], job[2] if len(job) >= 3 else lat, **extra))
            except DidNotHalt as e:
                if not return_errors:
                    raise DidNotHalt(f"job {n}: {e}") from None
                out.append(e)
            except SimError as e:
                raise type(e)(f"job {n}: {e}") from None
        return out


COUNTER_NAMES = ("cyc_total", "cyc_mm", "cyc_dma", "cyc_vec", "n_inst")

# name -> "module:Class"; imported lazily so that a missing toolchain only hurts the backend that needs it
BACKENDS = {
    "reference": "sim.backends.reference:ReferenceMachine",
    "amaranth": "sim.backends.amaranth_backend:AmaranthBackend",
    "verilator": "sim.backends.verilator_backend:VerilatorBackend",
    "board": "sim.backends.board_backend:BoardBackend",     # a board (or ga2 board-sim) on a serial port
}


def get_backend(name: str, config=None, **options) -> Backend:
    """Instantiate a backend by name for the chip `config`; raises `BackendUnavailable` with a one-line reason.

    Parameters
    ----------
    name : str
        A key of `BACKENDS`.
    config : hdl.config.ChipConfig, optional
        The chip to simulate (default: the book's). Handed to every backend that takes ``config=``; a
        backend that does not yet is available only for the book's chip.
    **options
        The backend's own options (``vcd=``, ``trace=``, ...).
    """
    from hdl.config import BOOK
    config = BOOK if config is None else config
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown simulator {name!r} (choose from {', '.join(BACKENDS)})")
    module_name, cls_name = BACKENDS[name].split(":")
    import importlib
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            raise BackendUnavailable(f"the {name} simulator is not available yet") from None
        raise
    cls = getattr(module, cls_name)
    import inspect
    if "config" in inspect.signature(cls).parameters:
        options["config"] = config
    elif config != BOOK:
        raise BackendUnavailable(f"the {name} simulator builds only the book's chip so far, not --chip "
                                 f"{config.spec()} (use --sim reference)")
    return cls(**options)


def first_difference(expected: RunResult, got: RunResult, scratchpad: bool = True) -> str | None:
    """A one-line description of the first difference between two runs, or None if they are identical.

    Compared in this order, each list's length before its words: the five counters, the error state
    (`ErrorStop` or None), the external memory, the scratchpad.

    Parameters
    ----------
    expected, got : RunResult
    scratchpad : bool
        Compare the scratchpads too (the default). Only a comparison with an expectation that has none
        (a record file's) passes False; when compared, a missing scratchpad is itself a difference.
    """
    for name, a, b in (("counters", expected.counters, got.counters), ("external memory", expected.ext, got.ext)):
        if len(a) != len(b):
            return f"{name}: expected {len(a)} values, got {len(b)}"
    for name, a, b in zip(COUNTER_NAMES, expected.counters, got.counters):
        if a != b:
            return f"counter {name}: expected {a}, got {b}"
    if expected.error != got.error:
        return f"error state: expected {expected.error or 'none'}, got {got.error or 'none'}"
    diff = _first_word(expected.ext, got.ext, "external word")
    if diff is not None or not scratchpad:
        return diff
    if expected.scratchpad is None or got.scratchpad is None:
        which = [side for side, r in (("expected", expected), ("got", got)) if r.scratchpad is None]
        return f"scratchpad: missing in the {' and the '.join(which)} result"
    if len(expected.scratchpad) != len(got.scratchpad):
        return f"scratchpad: expected {len(expected.scratchpad)} words, got {len(got.scratchpad)}"
    return _first_word(expected.scratchpad, got.scratchpad, "scratchpad word")


def _first_word(expected: list[int], got: list[int], what: str) -> str | None:
    """The first index where two lists of the same length differ, described, or None."""
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return f"{what} {i}: expected 0x{a:08x}, got 0x{b:08x}"
    return None
