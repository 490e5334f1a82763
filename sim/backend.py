"""The one interface every simulator of the chip answers (architecture: "The backend interface").

A backend runs a program (a list of 128-bit instruction words, HALT last) on an external-memory image
(a list of 32-bit words; its length is EXT) with read latency LAT, and returns the final external memory
and the five counters ``[total, mm, dma, vec, instructions]``. The reference machine, the Amaranth
simulation and Verilator must return identical results for every program.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RunResult", "TraceEntry", "SimError", "DidNotHalt", "BackendUnavailable",
           "Backend", "BACKENDS", "get_backend", "MAX_CYCLES", "first_difference"]

MAX_CYCLES = 100_000        # the book's testbench gives up after this many cycles


@dataclass
class TraceEntry:
    """One executed instruction: its pc and the cyc_total values in its FETCH, ISSUE and done cycles."""
    pc: int
    fetch: int
    issue: int
    done: int

    @property
    def busy(self) -> int:
        return self.done - self.issue


@dataclass
class RunResult:
    ext: list[int]                  # final external memory, unsigned 32-bit words
    counters: list[int]             # [cyc_total, cyc_mm, cyc_dma, cyc_vec, n_inst]
    trace: list[TraceEntry] | None = field(default=None)

    @property
    def cycles(self) -> int:
        return self.counters[0]


class SimError(RuntimeError):
    """A program that the chip cannot run to completion (the message says which and why)."""


class DidNotHalt(SimError):
    pass


class BackendUnavailable(SimError):
    pass


class Backend:
    """Base class: subclasses set `name` and implement `run`."""
    name = "?"

    def run(self, program, image, lat: int = 8) -> RunResult:   # pragma: no cover - interface
        raise NotImplementedError


COUNTER_NAMES = ("cyc_total", "cyc_mm", "cyc_dma", "cyc_vec", "n_inst")

# name -> "module:Class"; imported lazily so that a missing toolchain only hurts the backend that needs it
BACKENDS = {
    "reference": "sim.reference:ReferenceMachine",
    "amaranth": "sim.amaranth_backend:AmaranthBackend",
    "verilator": "sim.verilator_backend:VerilatorBackend",
}


def get_backend(name: str, **options) -> Backend:
    """Instantiate a backend by name; raises `BackendUnavailable` with a one-line reason."""
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
    return getattr(module, cls_name)(**options)


def first_difference(expected: RunResult, got: RunResult) -> str | None:
    """A one-line description of the first differing counter or external word, or None if identical."""
    for name, a, b in zip(COUNTER_NAMES, expected.counters, got.counters):
        if a != b:
            return f"counter {name}: expected {a}, got {b}"
    if len(expected.ext) != len(got.ext):
        return f"external memory size: expected {len(expected.ext)} words, got {len(got.ext)}"
    for i, (a, b) in enumerate(zip(expected.ext, got.ext)):
        if a != b:
            return f"external word {i}: expected 0x{a:08x}, got 0x{b:08x}"
    return None
