"""Differential fuzzing: random programs from `sim.verify.progen` on the reference machine and on a backend.

    python -m sim.fuzz --sim verilator --count 200 --seed S [--first I] [--ext E] [--lat L] [--budget C]

By default the programs are the mix of `sim.verify.progen.fuzz_case`: each draws an (EXT, LAT) pair and the knobs
that push it into the corners (see `MIX_HELP`). Prints one line per program whose memory or counters
differ (with the first differing instruction, found by re-running the program's prefixes, the first
differing counter or word, and the command that reproduces that one program) and a summary line.
Exit status 0 when every program matches, 1 on any mismatch, 2 for bad input.
"""
from __future__ import annotations

import sys
import time

from hdl.isa import describe, halt

from sim.backends import (MAX_CYCLES, Backend, RunResult, SimError, first_difference, first_trace_difference,
                          get_backend)
from sim.cli import (Parser, UsageError, assert_option, backend_options, board_options, chip_option, guarded,
                     int_range, link_report, sim_option)

__all__ = ["fuzz", "locate", "run_batch", "CheckedBackend", "fuzz_task", "fuzz_on_cluster", "build_parser", "main"]

_HALT = halt().word


def run_batch(backend, pairs, lat: int) -> list:
    """Run ``(program, image[, lat[, scratchpad]])`` jobs (`lat` is the default; a scratchpad of None
    starts from zeros); each entry is a `RunResult` or the `SimError` that run raised.

    Uses the Verilator backend's single-invocation batch when there is one.
    """
    if getattr(backend, "name", None) == "verilator":
        return backend.run_many(pairs, lat=lat, return_errors=True)
    out = []
    for job in pairs:
        extra = {"scratchpad": job[3]} if len(job) == 4 and job[3] is not None else {}
        try:
            out.append(backend.run(job[0], job[1], job[2] if len(job) >= 3 else lat, **extra))
        except SimError as e:
            out.append(e)
    return out


def _compare(expected, got) -> str | None:
    """None when the two outcomes agree (equal results, or the same kind of error), else the difference."""
    if isinstance(expected, Exception) or isinstance(got, Exception):
        if type(expected) is type(got):
            return None
        def outcome(r):
            return f"{type(r).__name__} ({r})" if isinstance(r, Exception) else "a normal halt"
        return f"expected {outcome(expected)}, got {outcome(got)}"
    diff = first_difference(expected, got)
    if diff is None and expected.trace is not None and got.trace is not None:
        # equal results and counters, but some instruction may have started or ended in another cycle
        where = first_trace_difference(expected.trace, got.trace)
        diff = None if where is None else f"trace {where}"
    return diff


def locate(program, image, lat, backend, reference, scratchpad=None) -> int | None:
    """The pc of the first instruction after which the backend and the reference disagree.

    Runs every prefix ``program[:k] + [HALT]`` (from the initial `scratchpad`, if any); the first k that
    differs names instruction k-1.
    """
    prefixes = [(list(program[:k]) + [_HALT], image, lat, scratchpad) for k in range(1, len(program))]
    ref = run_batch(reference, prefixes, lat)
    got = run_batch(backend, prefixes, lat)
    for k, (a, b) in enumerate(zip(ref, got), start=1):
        if _compare(a, b) is not None:
            return k - 1
    return None


class CheckedBackend(Backend):
    """A backend that runs every program on the reference machine too and stops at the first difference.

    The error names the run (counted from 1: in a decode, run n is step n), the first instruction after
    which the two disagree (pc and assembly) and the first differing counter or word.
    """

    def __init__(self, backend, reference=None):
        from sim.backends.reference import ReferenceMachine
        self.backend = backend
        self.reference = reference or ReferenceMachine()
        self.name = f"{backend.name} (checked against the reference)"
        self.runs = 0

    def run(self, program, image, lat: int = 8, scratchpad=None) -> RunResult:
        self.runs += 1
        n = self.runs
        extra = {} if scratchpad is None else {"scratchpad": scratchpad}
        try:
            got = self.backend.run(program, image, lat, **extra)
        except SimError as e:
            got = e
        try:
            want = self.reference.run(program, image, lat, **extra)
        except SimError as e:
            want = e
        diff = _compare(want, got)
        if diff is not None:
            pc = locate(list(program), list(image), lat, self.backend, self.reference, scratchpad)
            where = "" if pc is None else f", first at pc {pc} ({describe(program[pc], self.reference.config)})"
            raise SimError(f"run {n} on {self.backend.name} differs from the reference: {diff}{where}")
        if isinstance(got, SimError):
            raise got
        return got


def mix_configs(ext: int | None = None, lat: int | None = None, configs=None) -> tuple:
    """The (EXT, LAT) pairs a run draws from: `configs` (default ``sim.verify.progen.MIX_CONFIGS``) with EXT
    and/or LAT pinned when given (pinning one keeps the mix's values of the other)."""
    from sim.verify.progen import MIX_CONFIGS
    pairs = tuple(configs or MIX_CONFIGS)
    if ext is not None:
        pairs = tuple(sorted({(ext, l) for _, l in pairs}))
    if lat is not None:
        pairs = tuple(sorted({(e, lat) for e, _ in pairs}))
    return pairs


def reproduce_command(sim: str, seed: int, index: int, ext: int, lat: int, budget: int = MAX_CYCLES,
                      chip=None, asserts: bool = False) -> str:
    """The command that runs program `index` of a run of `seed` alone: the same program on the same chip
    (and the same model: with `asserts`, the one with the design's assertions)."""
    cmd = f"python -m sim.fuzz --sim {sim} --seed {seed} --first {index} --count 1 --ext {ext} --lat {lat}"
    if chip is not None and chip.spec() != "book":
        cmd += f" --chip {chip.spec()}"
    return cmd + (f" --budget {budget}" if budget != MAX_CYCLES else "") + (" --assert" if asserts else "")


def fuzz(backend, reference, count: int, seed: int, ext: int | None = None, lat: int | None = None,
         out=None, *, first: int = 0, budget: int = MAX_CYCLES, configs=None, chunk: int = 100,
         progress=None, config=None) -> dict:
    """Compare programs first .. first+count-1 of the mix of `seed` on `reference` and `backend`.

    Program i is ``sim.verify.progen.fuzz_case(seed, i, pairs, budget)`` with the pairs of `mix_configs(ext, lat,
    configs)`. `reference` must run unchecked (``ReferenceMachine(check=False)``): wide programs carry
    junk in bits that ``hdl.isa.validate`` refuses and the hardware ignores. Prints one line per failure
    (the program, its EXT and LAT, the first differing instruction and word or counter, and the command
    that reproduces it) on `out`, and a progress line per `chunk` programs on `progress` when given.
    `config` is the chip (default: the backend's ``config``): on a chip with ``gather=1`` the mix includes
    resident-mode programs (GATHER/SCATTER, each with its initial scratchpad; `sim.verify.progen.fuzz_case`),
    compared error state included.

    On Verilator the per-instruction traces are compared too (both backends are switched to ``trace``).

    Returns a dict: count, failures, failed (the failing indices), cycles (on `backend`), reference_s,
    backend_s, configs ({(EXT, LAT): programs}), traces (whether the traces were compared).
    """
    from sim.verify.progen import fuzz_case
    out = sys.stdout if out is None else out    # the stdout of the call, not the one at import
    pairs = mix_configs(ext, lat, configs)
    sim = getattr(backend, "name", "?")
    config = getattr(backend, "config", None) if config is None else config
    # Verilator gives the RTL's own per-instruction trace (sim.backends.trace_from_changes): compared too,
    # so a program whose instructions start or end in other cycles fails even when the counters agree
    traces = sim == "verilator" and hasattr(reference, "trace")
    if traces:
        backend.trace = reference.trace = True
    summary = {"count": count, "failures": 0, "failed": [], "cycles": 0, "reference_s": 0.0,
               "backend_s": 0.0, "configs": {}, "traces": traces}
    t_start = time.perf_counter()
    for lo in range(first, first + count, chunk):
        # in chunks: 20,000 programs with 65536-word images do not fit in memory at once
        cases = [fuzz_case(seed, i, pairs, budget, config) for i in range(lo, min(lo + chunk, first + count))]
        jobs = [(c.program, c.image, c.lat, c.scratchpad) for c in cases]
        t0 = time.perf_counter()
        expected = run_batch(reference, jobs, 8)
        t1 = time.perf_counter()
        got = run_batch(backend, jobs, 8)
        t2 = time.perf_counter()
        summary["reference_s"] += t1 - t0
        summary["backend_s"] += t2 - t1
        for c, a, b in zip(cases, expected, got):
            summary["configs"][(c.ext, c.lat)] = summary["configs"].get((c.ext, c.lat), 0) + 1
            if isinstance(b, RunResult):
                summary["cycles"] += b.cycles
            diff = _compare(a, b)
            if diff is None:
                continue
            summary["failures"] += 1
            summary["failed"].append(c.index)
            pc = locate(c.program, c.image, c.lat, backend, reference, c.scratchpad)
            where = (f"pc {pc} ({describe(c.program[pc], config)})" if pc is not None
                     else "pc unknown (only the full program differs)")
            print(f"FAIL program {c.index} (seed {seed}, EXT {c.ext}, LAT {c.lat}): first differing instruction "
                  f"{where}; {diff}; reproduce: "
                  f"{reproduce_command(sim, seed, c.index, c.ext, c.lat, budget, config, getattr(backend, 'asserts', False))}"
                  + (f" --port {backend.port}" if sim == "board" else ""),
                  file=out, flush=True)
        if progress is not None:
            done = min(lo + chunk, first + count) - first
            print(f"fuzz: {done}/{count} programs, {summary['failures']} failing, "
                  f"{time.perf_counter() - t_start:.0f} s", file=progress, flush=True)
    return summary


MIX_HELP = """\
the default mix: each program draws its chip from the (EXT, LAT) pairs 2048/1, 2048/2, 2048/3, 2048/4,
2048/8, 8192/1, 8192/8, 8192/20, 65536/1, 65536/7 (sim.verify.progen.MIX_CONFIGS; each pair is one Verilator
model, built once in about a minute) and its knobs (sim.verify.progen.draw_knobs): one program in ten is a classic
one (operand arenas, no partial overlaps, short); the others load the whole scratchpad and set each knob
off, low or high independently: partially overlapping operands for RQ, VADD, SM, UNPACK and AMAX; junk in
every instruction bit the hardware ignores (hdl.isa.HW_OPERANDS), some words with all of them set; maximum
lengths (4095 LD/ST/RQ/SM/AMAX, 4096 VADD, 511 and 512 UNPACK; LD/ST as EXT allows); lengths drawn up to
those maxima; the same unit back to back; an instruction reading what the previous one wrote. Every
program stays within --budget cycles. The reference runs unchecked (the junk is in bits that
hdl.isa.validate refuses). Program i depends only on (seed, i, EXT, LAT, budget): a failure line ends
with the command that reruns it alone. On a chip with gather=1 (--chip fast) half the programs are
resident-mode ones (sim.verify.progen.resident_program): GATHER and SCATTER over random pools, page and row sizes,
ranges and block tables in an initial scratchpad, one in three with tables pointing outside the pool or
too short, whose error stop (kind, pc, info) is compared too.
"""


def board_configs(chip, ext=None, lat=None) -> tuple:
    """The (EXT, LAT) pairs of the mix that a board of `chip` takes (EXT within its external memory, LAT
    within `hdl.hostlink.MAX_BOARD_LAT`, and only the chip's own LAT on a gather chip), with `ext`/`lat`
    pinned when given; a `UsageError` naming the limit when none is left."""
    from hdl.hostlink import MAX_BOARD_LAT
    max_lat = chip.lat if chip.gather else MAX_BOARD_LAT
    pairs = [(e, l) for e, l in mix_configs(ext, lat)
             if e <= chip.ext_words and l <= max_lat and (not chip.gather or l == chip.lat)]
    if not pairs:
        lats = f"--lat {chip.lat}" if chip.gather else f"--lat 1..{max_lat}"
        raise UsageError(f"--sim board: none of the mix's (EXT, LAT) pairs fits the board of --chip {chip.spec()} "
                         f"(external memory {chip.ext_words} words, LAT {'only ' + str(chip.lat) if chip.gather else '1..' + str(max_lat)}): "
                         f"pin --ext 1536..{chip.ext_words} and {lats}")
    return tuple(pairs)


MAX_COUNT = 1_000_000        # programs per run; in chunks of 100 with a progress line per chunk
TASK_PROGRAMS = 25           # programs per cluster task: a few seconds on Verilator across the mix


def fuzz_task(sim: str, config, seed: int, first: int, count: int, ext, lat, budget: int, options=None) -> dict:
    """One cluster task (`sim.cluster`): programs first .. first+count-1 of `seed`, as `fuzz` runs them
    (`options`: the backend's, `sim.cli.backend_options`; ``asserts`` for --assert).

    The backends are the worker's own (`sim.cluster.worker_backend`: a Verilator model is built once per
    node). Returns `fuzz`'s summary with ``lines``, the failure lines `fuzz` printed (the local run's
    lines, word for word), and ``builds``, the models this task built.
    """
    import io

    from sim.cluster import worker_backend
    backend = worker_backend(sim, config, **(options or {}))
    reference = worker_backend("reference", config, check=False)
    before = getattr(backend, "builds", 0)
    out = io.StringIO()
    s = fuzz(backend, reference, count, seed, ext, lat, out, first=first, budget=budget, chunk=count)
    s["lines"] = out.getvalue()
    s["builds"] = getattr(backend, "builds", 0) - before
    return s


def fuzz_on_cluster(a) -> dict:
    """`fuzz` of the parsed command line `a` as tasks of `TASK_PROGRAMS` programs on ``a.cluster``.

    The failure lines are printed in program order as the tasks' results stream back, and the summaries
    add up to the one `fuzz` returns for the same programs (the times are summed over the tasks).
    """
    from sim.cluster import Cluster
    spans = [(lo, min(TASK_PROGRAMS, a.first + a.count - lo)) for lo in range(a.first, a.first + a.count, TASK_PROGRAMS)]
    s = {"count": a.count, "failures": 0, "failed": [], "cycles": 0, "reference_s": 0.0, "backend_s": 0.0,
         "configs": {}, "builds": 0, "traces": True}
    with Cluster(a.cluster, a.workers) as cluster:
        tasks = [(a.sim, a.chip, a.seed, lo, n, a.ext, a.lat, a.budget, backend_options(a)) for lo, n in spans]
        for part in cluster.map(fuzz_task, tasks, label=f"fuzz on {a.sim}"):
            sys.stdout.write(part["lines"])
            sys.stdout.flush()
            for key in ("failures", "cycles", "reference_s", "backend_s", "builds"):
                s[key] += part[key]
            s["failed"] += part["failed"]
            s["traces"] = s["traces"] and part["traces"]
            for pair, k in part["configs"].items():
                s["configs"][pair] = s["configs"].get(pair, 0) + k
    if s["builds"]:
        print(f"cluster: {s['builds']} Verilator model{'s' * (s['builds'] != 1)} built on the workers",
              file=sys.stderr)
    return s


def build_parser() -> Parser:
    p = Parser("python -m sim.fuzz",
               "Run random programs (sim.verify.progen) on the reference machine and on a simulator and compare every "
               "external word and the five counters (on Verilator, every instruction's fetch, issue and done "
               "cycles too); a failure names the first differing instruction and the "
               "command that reruns that program alone.\n\n" + MIX_HELP,
               "python -m sim.fuzz --sim verilator --count 200 --seed 7\n"
               "python -m sim.fuzz --sim verilator --assert --chip fast --count 2000\n"
               "python -m sim.fuzz --sim amaranth --count 20 --ext 2048 --lat 8 --budget 20000")
    sim_option(p, "verilator", help="the simulator to check: amaranth, verilator or a board (--port; with "
                                    "the (EXT, LAT) pairs of the mix the board takes)")
    board_options(p)
    assert_option(p)
    chip_option(p, help="the chip both simulators model (the programs are drawn for the book's limits)")
    p.add_argument("--count", type=int_range(1, MAX_COUNT), default=200, metavar="N",
                   help=f"programs to run, 1..{MAX_COUNT:,}")
    p.add_argument("--seed", type=int, default=1, metavar="S", help="random seed; the same seed, the same run")
    p.add_argument("--first", type=int_range(0, None), default=0, metavar="I", help="index of the first program")
    p.add_argument("--ext", type=int_range(1536, 65536), default=None, metavar="WORDS",
                   help="pin the external memory words, 1536..65536 (default: the mix's)")
    p.add_argument("--lat", type=int_range(1, 1024), default=None, metavar="N",
                   help="pin the external read latency, 1..1024 (default: the mix's)")
    p.add_argument("--budget", type=int_range(10_000, MAX_CYCLES), default=MAX_CYCLES, metavar="CYCLES",
                   help=f"most cycles a program may take, 10000..{MAX_CYCLES} (smaller for the Amaranth simulator)")
    from sim.cluster import cluster_option
    cluster_option(p, f"{TASK_PROGRAMS} programs a task, the same programs and summary as without it")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    from sim.cluster import check_cluster_args
    check_cluster_args(a)
    if a.sim == "reference":
        raise UsageError("--sim reference would compare the reference machine with itself: "
                         "choose amaranth or verilator")
    options = backend_options(a)
    configs = None
    if a.sim == "board":
        if a.cluster is not None:
            raise UsageError("--sim board runs on the one board of --port: not with --cluster")
        configs = board_configs(a.chip, a.ext, a.lat)
    from hdl.config import BOOK
    smaller = [f"{k}={getattr(a.chip, k)}" for k in ("spad_depth", "array", "row_depth", "rom_words")
               if getattr(a.chip, k) < getattr(BOOK, k)]
    if smaller:
        # sim.verify.progen draws its programs for the book's limits: on a smaller chip many would be illegal
        raise UsageError(f"--chip {a.chip.spec()}: the random programs are drawn for the book's chip, and this "
                         f"chip is smaller ({', '.join(smaller)})")
    if a.cluster is not None:
        s = fuzz_on_cluster(a)
    else:
        backend = get_backend(a.sim, config=a.chip, **options)
        reference = get_backend("reference", check=False, config=a.chip)
        s = fuzz(backend, reference, a.count, a.seed, a.ext, a.lat, first=a.first, budget=a.budget,
                 progress=sys.stderr if a.count > 100 else None, configs=configs)
        link_report(backend)
    status = "PASS" if s["failures"] == 0 else "FAIL"
    pairs = sorted(s["configs"])
    chips = (f"EXT {pairs[0][0]}, LAT {pairs[0][1]}" if len(pairs) == 1 else
             f"{len(pairs)} (EXT, LAT) pairs: " + " ".join(f"{e}/{l}" for e, l in pairs))
    first = f", programs {a.first}..{a.first + a.count - 1}" if a.first else ""
    on = f"{a.sim} with assertions" if a.asserts else a.sim
    print(f"{status}: {s['count'] - s['failures']}/{s['count']} programs identical on {on} and reference "
          f"(seed {a.seed}{first}, {chips}; {s['cycles']:,} cycles"
          f"{', every instruction traced' if s['traces'] else ''}; "
          f"{a.sim} {s['backend_s']:.1f} s, reference {s['reference_s']:.1f} s)")
    return 0 if s["failures"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(guarded(main))
