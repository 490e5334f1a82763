"""Where every cycle of a run goes: the instruction classes, their ideal under the chip's own limits, and the
bounds of a generated token.

The source is the reference machine's per-instruction trace (``ReferenceMachine(trace=True)``, the RTL's
cycles), a list of runs ``(program words, trace, counters)`` as `sim.timeline.TracingBackend` keeps them.

How the classes add up to the five counters (checked with ``==`` by `check_breakdown`): an instruction costs
its sequencer cycles (`hdl.isa.seq_cycles`, ``TraceEntry.seq``: its FETCH and ISSUE cycles, 2, or 0 for an
instruction a prefetch chip read ahead and issued in the previous one's done cycle) and its WAIT (busy) cycles,
and nothing else (the sequencer waits only for the unit it issued to), so summed over the runs

- ``cyc_total`` = the busy cycles of every class + ``fetch/issue`` (the sequencer cycles of every instruction,
  HALT's included; its count is every instruction, HALT included);
- ``cyc_mm`` = MM + MM+rq + RQC, ``cyc_dma`` = LD + ST + GATHER + SCATTER, ``cyc_vec`` = RQ + SM + VADD + AMAX
  + UNPACK (`hdl.isa.COUNTER_OF`);
- ``n_inst`` = the count of every class but ``fetch/issue`` (HALT is fetched but not counted).

Each class's ideal is the sum of `hdl.isa.ideal_cycles` over its instructions (0 for fetch/issue: a chip could
overlap them with the previous instruction's work); the gap is busy - ideal, and its share is of cyc_total.

The runs are normal ends (a decode's and a served trace's are: the host raises at an error stop). A run that
ended in a GATHER/SCATTER error stop is not one: its failing instruction moved fewer words than its fields say
and the instruction after it acted as a HALT whatever its word, so its classes and ideals would not mean what
they say (the ideal may then pass the busy cycles, which `breakdown` refuses).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from hdl.config import ChipConfig
from hdl.isa import (COUNTER_INDEX, COUNTER_OF, Op, ext_port_words, ext_words, ideal_cycles, macs, operands,
                     vector_lanes)
from sim.backends import SimError

__all__ = ["CLASSES", "FETCH_ISSUE", "ClassFigures", "ProfileMismatch", "instr_class", "class_counter",
           "breakdown", "run_figures", "run_bounds", "per_token", "limits", "check_breakdown", "summed_counters",
           "class_table"]

FETCH_ISSUE = "fetch/issue"
# the rows of a profile, in the order they are printed; RQC (the fused requantizer's load, an mm_rq chip) is
# a class of its own: its one busy cycle goes to cyc_mm and must be counted somewhere
CLASSES = ("MM", "MM+rq", "RQC", "RQ", "SM", "VADD", "AMAX", "UNPACK", "LD", "ST", "GATHER", "SCATTER",
           FETCH_ISSUE)


class ProfileMismatch(SimError):
    """A profile whose classes do not add up to the counters, or whose ideal passes a busy figure."""


@dataclass
class ClassFigures:
    """The figures of one class over a set of runs (all integers)."""
    count: int = 0          # instructions (fetch/issue: every instruction, HALTs included)
    busy: int = 0           # cycles: the WAIT cycles (fetch/issue: the sequencer's, hdl.isa.seq_cycles)
    ideal: int = 0          # the sum of hdl.isa.ideal_cycles (fetch/issue: 0)
    macs: int = 0           # multiply-accumulates (MM and MM+rq)
    ext_words: int = 0      # words across the external-memory port (LD, ST, GATHER, SCATTER)

    @property
    def gap(self) -> int:
        return self.busy - self.ideal


def instr_class(word: int, config: ChipConfig) -> str | None:
    """The class of one instruction word on the chip `config`: its opcode's name, ``MM+rq`` for an MM whose
    ``rq`` flag the chip reads (an mm_rq chip), None for HALT."""
    o = operands(word, config)
    op = o["op"]
    if op == Op.HALT:
        return None
    if op == Op.MM and config.mm_rq and o["rq"]:
        return "MM+rq"
    return Op(op).name


def class_counter(cls: str) -> str | None:
    """The counter (``mm``, ``dma``, ``vec``) a class's busy cycles go to; None for fetch/issue."""
    if cls == FETCH_ISSUE:
        return None
    return COUNTER_OF[Op.MM if cls == "MM+rq" else Op[cls]]


def _words_of(program) -> list:
    return [w if isinstance(w, int) else w.word for w in program]


def breakdown(runs, config: ChipConfig) -> dict[str, ClassFigures]:
    """The figures of every class (`CLASSES`) over `runs`, a list of ``(program, trace, counters)``.

    Raises `ProfileMismatch` at the first instruction whose ideal passes its busy cycles (naming it)."""
    rows = {c: ClassFigures() for c in CLASSES}
    fi = rows[FETCH_ISSUE]
    for i, (program, trace, _) in enumerate(runs):
        words = _words_of(program)
        for e in trace:
            word = words[e.pc] if e.pc < len(words) else 0      # past the end: a zero word, the chip's HALT
            fi.count += 1
            fi.busy += e.seq
            cls = instr_class(word, config)
            if cls is None:
                continue
            ideal = ideal_cycles(word, config)
            if ideal > e.busy:
                raise ProfileMismatch(f"run {i}, pc {e.pc} ({cls}): ideal {ideal} cycles exceeds its busy {e.busy}")
            f = rows[cls]
            f.count += 1
            f.busy += e.busy
            f.ideal += ideal
            f.macs += macs(word, config)
            f.ext_words += ext_words(word)
    return rows


def summed_counters(runs) -> list[int]:
    """The five counters of `runs` added up."""
    return [sum(int(c[k]) for _, _, c in runs) for k in range(5)]


def check_breakdown(rows: dict[str, ClassFigures], counters) -> None:
    """Raise `ProfileMismatch` unless `rows` add up to `counters` (five integers) exactly as the module's
    docstring says, and no class's ideal passes its busy cycles."""
    got = [sum(f.busy for f in rows.values()), 0, 0, 0, 0]
    for cls, f in rows.items():
        counter = class_counter(cls)
        if counter is not None:
            got[COUNTER_INDEX[counter]] += f.busy
            got[4] += f.count
    problems = []
    if got != [int(c) for c in counters]:
        problems.append(f"the classes give counters {got}, the runs' counters are {list(counters)}")
    problems += [f"{cls}: ideal {f.ideal} exceeds busy {f.busy}" for cls, f in rows.items() if f.ideal > f.busy]
    if problems:
        raise ProfileMismatch("; ".join(problems))


def class_table(rows: dict[str, ClassFigures], total: int) -> list[dict]:
    """The rows as JSON-ready dicts, with the gap and its share of `total` (cyc_total)."""
    return [{"class": cls, **asdict(f), "gap": f.gap, "gap_share": f.gap / total if total else 0.0,
             "counter": class_counter(cls) or "total only"} for cls, f in rows.items()]


def run_figures(program, trace, config: ChipConfig) -> dict:
    """One run's integers from its trace: ``macs`` and ``ext_words`` (what its MMs and its external-memory
    instructions do) and ``rows`` (the largest M of its MMs: the array rows its batch fills; 0 without MM)."""
    words = _words_of(program)
    out = {"macs": 0, "ext_words": 0, "rows": 0}
    for e in trace:
        word = words[e.pc] if e.pc < len(words) else 0
        o = operands(word, config)
        out["macs"] += macs(word, config)
        out["ext_words"] += ext_words(word)
        if o["op"] == Op.MM:
            out["rows"] = max(out["rows"], o["M"])
    return out


def run_bounds(fig: dict, config: ChipConfig) -> dict:
    """The bounds of one run, from `run_figures`'s integers: ``rows_used``, min(rows, array) (at least 1); the
    MAC bound ``macs / (rows_used * array)`` (every PE of the rows its batch fills busy every cycle) and the
    external-memory bound ``ext_words / ext_port_words`` (the port busy every cycle), in cycles."""
    used = min(max(fig["rows"], 1), config.array)
    return {"rows_used": used, "mac_bound": fig["macs"] / (used * config.array),
            "ext_bound": fig["ext_words"] / ext_port_words(config)}


def per_token(runs: list[dict], tokens: int) -> dict:
    """The figures per generated token of `runs` (dicts with ``cycles``, ``macs``, ``ext_words`` and the
    `run_bounds`) that generated `tokens` tokens: each summed over the runs and divided by `tokens`, and the
    ratio of the cycles to the larger bound."""
    per = {k: sum(r[k] for r in runs) / tokens for k in ("cycles", "macs", "ext_words", "mac_bound", "ext_bound")}
    top = max(per["mac_bound"], per["ext_bound"])
    return {"tokens": tokens, **per, "bound": "MAC" if per["mac_bound"] >= per["ext_bound"] else "EXT",
            "ratio": per["cycles"] / top if top else float("inf")}


def limits(config: ChipConfig) -> dict:
    """The chip's own limits the ideals and bounds use."""
    return {"array": config.array, "pes": config.array * config.array, "vector_lanes": vector_lanes(config),
            "ext_port_words": ext_port_words(config)}
