"""A timeline a person can open (issue 23 part 2): Chrome trace-event JSON for Perfetto and chrome://tracing.

Built from the reference machine's per-instruction trace (`sim.backends.TraceEntry`, the same cycles as the
RTL). One process, the chip; its tracks (threads):

- ``steps``: one slice per run (a decode step, the resident load), its five counters as arguments;
- ``sequencer``: per instruction a ``fetch`` and an ``issue`` slice of one cycle each (HALT's too), except
  for an instruction a prefetch chip read ahead and issued in the previous one's done cycle (docs/prefetch.md:
  every instruction of a run but the first and an error stop's HALT), which costs the sequencer no cycle;
- one track per unit the chip has (LD, ST, MM, RQ, SM, VADD, AMAX, UNPACK, and GATHER, SCATTER, RQC where
  the chip has them): per instruction one complete slice for its busy (WAIT) cycles, named by opcode, with
  the operands the hardware reads (`hdl.isa.operands`, `hdl.isa.hw_operands`) as arguments.

Time is in chip cycles: one unit of ``ts``/``dur`` (a microsecond to the viewers) is one chip cycle. Runs are
laid one after another: each run's cycles are offset by the ``cyc_total`` of the runs before it.

Per run the durations add up to the five counters exactly (`check_against_counters`): the unit slices of
class mm / dma / vec give cyc_mm / cyc_dma / cyc_vec, their number n_inst, and all of a run's slices together
(the sequencer's included: 2 per instruction on the book's chip, 2 per run on a prefetch chip) give cyc_total.
"""
from __future__ import annotations

from hdl.config import ChipConfig
from hdl.isa import COUNTER_OF, Op, describe, hw_operands, legal_ops, operands
from sim.backends import SimError, first_trace_difference, program_words

__all__ = ["PID", "STEPS_TID", "SEQ_TID", "ENGINE_PID", "unit_tracks", "build_events", "trace_document",
           "check_against_counters", "TimelineMismatch", "TracingBackend", "recording_engine", "engine_events",
           "check_request_tracks", "serve_run_labels", "serve_trace_document"]

PID = 1
ENGINE_PID = 2          # `ga2 serve --trace`: the engine's steps and one track per request
STEPS_TID = 1
SEQ_TID = 2
CLOCK_NOTE = "1 time unit (shown as 1 us) = 1 chip cycle; ts and dur count chip cycles from the first run's fetch"


class TimelineMismatch(SimError):
    """A timeline whose track durations do not add up to the run's counters."""


def unit_tracks(config: ChipConfig) -> dict[int, tuple[int, str]]:
    """opcode -> (tid, track name) for each unit of the chip `config` (HALT has none)."""
    ops = [op for op in legal_ops(config) if op != Op.HALT]
    return {int(op): (SEQ_TID + 1 + i, op.name) for i, op in enumerate(ops)}


def _meta(name, tid, args, pid=PID):
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def build_events(config: ChipConfig, runs, labels=None) -> list[dict]:
    """The trace events of `runs`, a list of ``(program, trace, counters)``.

    program : list of 128-bit instruction words (or `hdl.isa.Instr`) the run executed;
    trace : its `TraceEntry` list from ``ReferenceMachine(trace=True)``;
    counters : the run's five counters ``[cyc_total, cyc_mm, cyc_dma, cyc_vec, n_inst]``.
    labels : optional list of names for the runs' slices on the steps track (default ``run i``).
    """
    tracks = unit_tracks(config)
    ev = [_meta("process_name", 0, {"name": f"GA-2 chip {config.spec()} (time in chip cycles)"}),
          _meta("process_sort_index", 0, {"sort_index": 0}),
          _meta("thread_name", STEPS_TID, {"name": "steps"}),
          _meta("thread_sort_index", STEPS_TID, {"sort_index": STEPS_TID}),
          _meta("thread_name", SEQ_TID, {"name": "sequencer"}),
          _meta("thread_sort_index", SEQ_TID, {"sort_index": SEQ_TID})]
    for tid, name in tracks.values():
        ev.append(_meta("thread_name", tid, {"name": name}))
        ev.append(_meta("thread_sort_index", tid, {"sort_index": tid}))
    offset = 0
    for i, (program, trace, counters) in enumerate(runs):
        words = [w if isinstance(w, int) else w.word for w in program]
        label = labels[i] if labels is not None else f"run {i}"
        c = [int(x) for x in counters]
        ev.append({"name": label, "cat": "step", "ph": "X", "ts": offset, "dur": c[0], "pid": PID,
                   "tid": STEPS_TID, "args": {"run": i, "cyc_total": c[0], "cyc_mm": c[1], "cyc_dma": c[2],
                                              "cyc_vec": c[3], "n_inst": c[4], "instructions": len(trace)}})
        for e in trace:
            word = words[e.pc % len(words)] if e.pc < len(words) else 0     # past the end: a zero word, HALT
            if e is trace[-1] and operands(word)["op"] != Op.HALT:
                # a run's last entry is its HALT: here an error stop's, issued whatever the ROM holds
                # (docs/resident.md)
                word = 0
            o = operands(word, config)
            op = o.pop("op")
            name = Op(op).name
            fields = {k: v for k, v in o.items() if k in hw_operands(op, config)}
            common = {"pc": e.pc, "op": name, "run": i}
            if e.seq:               # 0: read ahead and issued in the previous one's done cycle
                ev.append({"name": "fetch", "cat": "fetch", "ph": "X", "ts": offset + e.fetch, "dur": 1,
                           "pid": PID, "tid": SEQ_TID, "args": dict(common)})
                ev.append({"name": "issue", "cat": "issue", "ph": "X", "ts": offset + e.issue, "dur": 1,
                           "pid": PID, "tid": SEQ_TID, "args": dict(common)})
            if op != Op.HALT:
                tid = tracks[op][0]
                ev.append({"name": name, "cat": COUNTER_OF[Op(op)], "ph": "X", "ts": offset + e.issue + 1,
                           "dur": e.busy, "pid": PID, "tid": tid,
                           "args": {**common, **fields, "asm": describe(word, config)}})
        offset += c[0]
    return ev


REFERENCE_SOURCE = "reference machine (sim.backends.reference), the RTL's cycles"
# the simulators of the RTL whose runs carry their own trace (sim.backends.trace_from_changes)
RTL_TRACERS = {"verilator": "the Verilator model", "amaranth": "Amaranth's simulation of the chip"}


def rtl_source(sim: str) -> str:
    return (f"{RTL_TRACERS[sim]}: its own trace (the sequencer's state and pc), equal to the reference machine's "
            f"run by run")


def trace_document(config: ChipConfig, events: list[dict], what: str = "", source: str = REFERENCE_SOURCE) -> dict:
    """The JSON object a viewer opens: the events, the clock stated and where the cycles come from."""
    return {"traceEvents": events,
            "otherData": {"clock": CLOCK_NOTE, "time_unit": "chip cycle", "chip": config.spec(),
                          "source": source,
                          **({"what": what} if what else {})}}


def check_against_counters(events: list[dict], counters_list) -> None:
    """Raise `TimelineMismatch` unless, for every run i, its tracks add up to ``counters_list[i]``."""
    for i, c in enumerate(counters_list):
        mine = [e for e in events if e["ph"] == "X" and e["args"].get("run") == i]
        sums = {"mm": 0, "dma": 0, "vec": 0}
        seq = halt = units = 0
        step = None
        for e in mine:
            if e["cat"] == "step":
                step = e["dur"]
            elif e["cat"] in ("fetch", "issue"):
                if e["args"]["op"] == "HALT":
                    halt += e["dur"]
                else:
                    seq += e["dur"]
            else:
                sums[e["cat"]] += e["dur"]
                units += 1
        got = [seq + halt + sums["mm"] + sums["dma"] + sums["vec"], sums["mm"], sums["dma"], sums["vec"], units]
        problems = []
        if got != list(c):
            problems.append(f"tracks give {got}, counters are {list(c)}")
        if seq % 2:
            problems.append(f"the sequencer's non-HALT slices give {seq} cycles, not 2 per instruction fetched")
        if halt not in (0, 2):
            problems.append(f"HALT's fetch and issue give {halt} cycles, not 2 (or 0, read ahead)")
        if step != c[0]:
            problems.append(f"the step slice lasts {step}, cyc_total is {c[0]}")
        if problems:
            raise TimelineMismatch(f"run {i}: " + "; ".join(problems))


class TracingBackend:
    """A backend passed through that also runs every program on the reference machine with ``trace=True``
    (the timeline's source, whatever simulator runs the chip) and keeps ``(program, trace, counters)``.
    With `inner` None the traced reference run is the run: its result is returned (one simulation, not two).
    A Verilator or Amaranth `inner` is switched to its own trace (``trace=True``): the timeline is then the
    RTL's, and a run whose trace differs from the reference's (or has none) raises `TimelineMismatch`."""

    def __init__(self, inner, config: ChipConfig):
        from sim.backends.reference import ReferenceMachine
        self.inner = inner
        self.source = REFERENCE_SOURCE
        if getattr(inner, "name", None) in RTL_TRACERS:
            inner.trace = True
            self.source = rtl_source(inner.name)
        self.config = config
        self.ref = ReferenceMachine(trace=True, config=config)
        self.runs = []
        self.cycles = 0             # the runs' cyc_total so far: "now" on the timeline

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, program, image, lat=8, scratchpad=None):
        kw = {} if scratchpad is None else {"scratchpad": scratchpad}
        words, mine = program_words(program), list(image)     # copies: the inner run may not mutate them
        ref_kw = {} if scratchpad is None else {"scratchpad": list(scratchpad)}
        r = self.inner.run(program, image, lat, **kw) if self.inner is not None else None
        t = self.ref.run(words, mine, lat, **ref_kw)
        trace = t.trace
        if self.source != REFERENCE_SOURCE and r is not None:
            if r.trace is None:
                raise TimelineMismatch(f"run {len(self.runs)}: the {self.inner.name} run gave no trace")
            where = first_trace_difference(t.trace, r.trace)
            if where is not None:
                raise TimelineMismatch(f"run {len(self.runs)}: the {self.inner.name} trace differs from the "
                                       f"reference machine's at {where}")
            trace = r.trace
        self.runs.append((words, trace, list(t.counters)))
        self.cycles += int(t.counters[0])
        return t if r is None else r


# ---- the serving engine (`ga2 serve --trace`): a second process, same chip-cycle time base ------------

def recording_engine(tracer: TracingBackend):
    """A `host.engine.Engine` subclass that records, on `tracer`'s time base (the chip cycles of the runs so
    far), each step's programs (their rows: request, position, prompt row or not; start and end) in
    ``tl_steps`` and each request's arrival, admission, preemption, refusal and finish in ``tl_life``."""
    from host.engine import Engine

    class RecordingEngine(Engine):
        def run(self, reqs, progress=None):
            self.tl_base, self.tl_steps, self.tl_life = tracer.cycles, [], []
            res = super().run(reqs, progress=progress)
            for s in self.done:
                if s.refused:
                    self.tl_life.append((self.tl_base + s.arrival_cycles, s.rid, "refused"))
                elif s.finish_cycles is not None:
                    self.tl_life.append((self.tl_base + s.finish_cycles, s.rid, "finish"))
            return res

        def _admit(self, s):
            ok = super()._admit(s)
            if ok:
                if not any(r == s.rid for _, r, _ in self.tl_life):       # the first admission
                    self.tl_life.append((self.tl_base + s.arrival_cycles, s.rid, "arrive"))
                self.tl_life.append((tracer.cycles, s.rid, "admit"))
            return ok

        def _preempt(self, s):
            super()._preempt(s)
            self.tl_life.append((tracer.cycles, s.rid, "preempt"))

        def _plan(self, rows):
            progs = super()._plan(rows)
            pos = self._positions([s for prog in progs for s in prog])
            out, i = [], 0
            for prog in progs:
                out.append([(s.rid, p, p < len(s.req.prompt)) for s, p in zip(prog, pos[i:i + len(prog)])])
                i += len(prog)
            self._tl_progs = out
            return progs

        def _step(self):
            i0, t0 = len(tracer.runs), tracer.cycles
            super()._step()
            runs = tracer.runs[i0:]
            progs = self._tl_progs
            t = tracer.cycles - sum(c[0] for _, _, c in runs[len(runs) - len(progs):])   # after page copies
            spans = []
            for prog, (_, _, c) in zip(progs, runs[len(runs) - len(progs):]):
                spans.append((t, t + c[0], prog))
                t += c[0]
            self.tl_steps.append({"step": self.step_no, "start": t0, "end": tracer.cycles, "programs": spans,
                                  "runs": (i0, len(tracer.runs))})

    return RecordingEngine


def _ev(name, cat, ts, dur, tid, args):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": ENGINE_PID, "tid": tid,
            "args": args}


def engine_events(steps, life) -> list[dict]:
    """The engine process's events: a track ``engine steps`` (a slice per step, its batch as arguments) and
    one track per request, its life as slices ``waiting`` (arrival to admission), ``prefill`` / ``decode``
    (the programs of a step holding its rows: prefill if one is a prompt row), ``preempted`` (to its
    readmission); instants ``finish`` / ``refused``. `steps` and `life` are a `recording_engine`'s."""
    rids = sorted({r for _, r, _ in life} | {r for st in steps for _, _, p in st["programs"] for r, _, _ in p},
                  key=lambda r: (r, 0) if isinstance(r, int) else tuple(r))
    tid_of = {r: STEPS_TID + 1 + i for i, r in enumerate(rids)}
    ev = [_meta("process_name", 0, {"name": "engine"}, ENGINE_PID),
          _meta("process_sort_index", 0, {"sort_index": 1}, ENGINE_PID),
          _meta("thread_name", STEPS_TID, {"name": "engine steps"}, ENGINE_PID),
          _meta("thread_sort_index", STEPS_TID, {"sort_index": STEPS_TID}, ENGINE_PID)]
    for r, tid in tid_of.items():
        ev.append(_meta("thread_name", tid, {"name": f"request {r}"}, ENGINE_PID))
        ev.append(_meta("thread_sort_index", tid, {"sort_index": tid}, ENGINE_PID))
    rows_of: dict = {}            # rid -> [(start, end, step, prompt rows, rows)]
    for st in steps:
        rows = [row for _, _, p in st["programs"] for row in p]
        ev.append(_ev(f"step {st['step']}", "engine step", st["start"], st["end"] - st["start"], STEPS_TID,
                      {"step": st["step"], "requests": sorted({str(r) for r, _, _ in rows}), "rows": len(rows),
                       "programs": len(st["programs"]), "program_rows": [len(p) for _, _, p in st["programs"]],
                       "runs": list(st["runs"]), "cycles": st["end"] - st["start"]}))
        mine: dict = {}
        for a, b, p in st["programs"]:
            for r, pos, prompt in p:
                m = mine.setdefault(r, [a, b, 0, []])
                m[1] = b
                m[2] += prompt
                m[3].append(pos)
        for r, (a, b, n_prompt, pos) in mine.items():
            rows_of.setdefault(r, []).append((a, b, st["step"], n_prompt, pos))
    for r, tid in tid_of.items():
        marks = sorted((t, k) for t, rr, k in life if rr == r)
        since = None
        for t, k in marks:
            if k in ("arrive", "preempt"):
                since = (t, "waiting" if k == "arrive" else "preempted")
            elif k == "admit" and since is not None:
                ev.append(_ev(since[1], since[1], since[0], t - since[0], tid, {"request": str(r)}))
                since = None
            elif k in ("finish", "refused"):
                ev.append({"name": k, "cat": k, "ph": "i", "s": "t", "ts": t, "pid": ENGINE_PID, "tid": tid,
                           "args": {"request": str(r)}})
        for a, b, step, n_prompt, pos in rows_of.get(r, ()):
            kind = "prefill" if n_prompt else "decode"
            ev.append(_ev(kind, kind, a, b - a, tid, {"request": str(r), "step": step, "rows": len(pos),
                                                      "positions": pos, "prompt_rows": n_prompt}))
    return ev


def check_request_tracks(events: list[dict]) -> None:
    """Raise `TimelineMismatch` unless every request track of the engine process holds its slices in order,
    none overlapping the next."""
    by: dict = {}
    for e in events:
        if e["pid"] == ENGINE_PID and e["ph"] == "X" and e["tid"] != STEPS_TID:
            by.setdefault(e["tid"], []).append(e)
    for tid, es in by.items():
        es.sort(key=lambda e: (e["ts"], e["ts"] + e["dur"]))
        for x, y in zip(es, es[1:]):
            if x["ts"] + x["dur"] > y["ts"]:
                raise TimelineMismatch(f"request {x['args']['request']}: {x['name']} [{x['ts']}, "
                                       f"{x['ts'] + x['dur']}) overlaps {y['name']} from {y['ts']}")


def serve_run_labels(n_runs: int, steps, mode: str) -> list:
    """Names of a served trace's chip runs: ``load (weights)`` for a resident engine's load program (the run
    before the first step), ``step S program K`` and ``step S page copy`` for a step's runs. `steps` are a
    `recording_engine`'s ``tl_steps``."""
    labels = [f"run {i}" for i in range(n_runs)]
    if steps and steps[0]["runs"][0] == 1 and mode == "resident":
        labels[0] = "load (weights)"
    for st in steps:
        i0, i1 = st["runs"]
        n = len(st["programs"])
        for j in range(i0, i1):
            k = j - (i1 - n)
            labels[j] = f"step {st['step']} program {k}" if k >= 0 else f"step {st['step']} page copy"
    return labels


def serve_trace_document(config: ChipConfig, runs, engine, mode: str, what: str,
                         source: str = REFERENCE_SOURCE) -> dict:
    """The timeline of a served trace: the chip's `runs` (a `TracingBackend`'s) and the process of `engine`
    (a `recording_engine`'s, after its run), both checked (tracks against counters, request slices in order)
    before it is returned."""
    events = build_events(config, runs, serve_run_labels(len(runs), engine.tl_steps, mode))
    check_against_counters(events, [c for _, _, c in runs])
    events += engine_events(engine.tl_steps, engine.tl_life)
    check_request_tracks(events)
    return trace_document(config, events, what, source)
