"""The ``ga2`` command: one subcommand per task of the project (``ga2 --help`` lists them).

``ga2 decode --window 4`` runs exactly what ``python -m sim.decode --window 4`` runs: each subcommand is
the `main(argv)` of one module, named here by module path and imported only when it is asked for, so a
module that is missing (or needs a tool that is) cannot break the others or ``ga2 --help``.
"""
from __future__ import annotations

import importlib
import sys

from sim import cli

__all__ = ["COMMANDS", "main", "entry"]

# subcommand -> (module whose main(argv) it runs, one-line summary for `ga2 --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "decode": ("sim.decode", "decode tokens with the tiny LM on the chip through the paged KV cache"),
    "replay": ("sim.replay", "replay a program-record file on a simulator: PASS or the first difference"),
    "progen": ("sim.verify.progen", "write a suite of random (or the spec's directed) programs with expected results"),
    "fuzz": ("sim.verify.fuzz", "random programs on the reference machine and a simulator, compared"),
    "bench": ("sim.bench", "the same decode on every simulator: cycles per second"),
    "verilog": ("sim.flow.verilog", "every block as Verilog, optionally linted by Verilator"),
    "synth": ("sim.flow.synth", "Yosys synthesis of every block and of the chip (minutes)"),
    "fpga": ("sim.flow.fpga", "a bitstream for the ULX3S board (minutes)"),
    "mutants": ("sim.verify.mutants", "mutation testing: every broken version must be caught (minutes)"),
    "pagetable-demo": ("sim.pagetable_demo", "example A: the page table event by event, fork, copy-on-write"),
    "paging-study": ("sim.paging_study", "example B: memory, prefix sharing, window accuracy; JSON and figures"),
    "agreement": ("sim.agreement", "the random-model chip-vs-float agreement study (559/576)"),
    "formal": ("sim.verify.formal", "formal properties of the chip's blocks (SymbiYosys)"),
    "serve": ("sim.serve", "serve a trace of requests: continuous batching, prefix cache, preemption, replays"),
    "board-sim": ("sim.board.boardsim", "a GA-2 board in simulation behind a pseudo-terminal, for --sim board --port"),
    "profile": ("sim.profile", "where every cycle of a decode or a served trace goes: classes, ideals, roofline"),
    "sweep": ("sim.sweep", "the decode on a grid of chip configurations: cycles (and ECP5 size), integers checked"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:{width}s}  {summary}" for name, (_, summary) in COMMANDS.items())
    return ("usage: ga2 COMMAND [options]   (ga2 COMMAND --help for the options of one command)\n\n"
            "The GA-2 tiny language-model accelerator: its simulators, compiler, paged host and hardware flow.\n\n"
            f"commands:\n{rows}\n\n"
            "example:\n  ga2 decode --window 4 --sim reference\n")


def main(argv=None) -> int:
    """Dispatch to a subcommand; returns its exit status (2 with one ``error:`` line for a bad one)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name = COMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise                           # a missing dependency inside the module is a real failure
        print(f"error: ga2 {name} is not available in this checkout (no module {module_name})", file=sys.stderr)
        return 2
    previous, cli.invoked_as = cli.invoked_as, f"ga2 {name}"
    try:
        return cli.guarded(module.main, rest)
    finally:
        cli.invoked_as = previous


def entry() -> None:
    """The console script (`[project.scripts]` in pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
