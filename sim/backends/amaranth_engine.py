"""A faster engine for Amaranth's Python simulator (``pysim``), the same results in less time.

Where a window-4 decode's time went with the stock engine (a profile per compiled process): about half in
the clocked processes, which pysim runs at every edge, the idle units' included; most of the rest in a few
large combinational processes (the sequencer's, the MM unit's), run whole several times a cycle as the
units' outputs settle; then pysim's own loop, which looks at every process in every delta cycle; and per
run, the testbench's word-by-word loading and read-back of the memories. `SkipIdleEngine` changes these
four (and more, below), and nothing of the design:

- *Idle clocked processes are skipped.* A compiled clocked process is pure: what it writes depends only on
  the current values of what it reads (right-hand sides, conditions, the domain's reset and, for a
  memory's ports, the memory's contents), and its registers are driven by it alone. When none of those has
  changed since its last run, that run's values are still in its registers and running it again changes
  nothing. Each clocked process is run at an active edge only if it is *stale*: a waker on each of its
  inputs (on a change of a word, for a memory) marks it, and at the edge the stale ones are queued, after
  the whole commit of the edge (an input that changes together with the clock is seen).
- *Statements are cut* (`_split`) into parts that each run only when their own inputs change (a clocked
  part: is skipped while they stay still), each Assert apart. Every signal keeps its assignments in order,
  each check its conditions, and loop-free logic settles to the same values in any order of evaluation.
- *A queue instead of a scan*: the compiled processes leave pysim's list; raising their ``runnable`` flag
  puts them in a set that the delta cycle takes whole (`step_design`). The processes of one delta cycle
  read current values and write next ones, so their order is free (pysim's is a set's too).
- *Memories in one go* (`write_rows`, `read_rows`): ``ctx.set`` settles the design after every word.
- *A memory's write ports apart from its read ports* (`_split_reads`), their process run only at an edge
  where an enable is high (`_skip_disabled`): pysim builds every write mask at every run of the memory's
  one process, which the scratchpad's banks ran nearly every cycle for their read ports.
- *One waker per signal* (`_merge_wakers`) for all the processes it queues or marks stale, and the commit
  of a delta cycle inlined (`step_design`): a few hundred signals change a cycle.
- *Sign extension inlined* (`_InlineSign`) in the code pysim generates: a call of its helper per signed
  operand, over 300 a cycle on the fast chip's systolic array. *Integer identities* (`_Peephole`) on the
  same code: shifts by 0 and nested constant masks (every slice pysim writes has a few), consecutive
  fields of one value joined (a Cat of a signal's slices in order); a signal's ``update`` call written
  out in place (`_Rewrite.visit_Expr`).
- *Values computed once* (`_hoist_reads`) in that code: a signal's current value read more than once goes
  to a local, a constant field of it used more than once too, and a repeated test or expression is
  computed once (the systolic array's ``acc_nxt`` read its inputs 64 times; the MM unit's operand-row
  muxes computed one test per lane). Then consecutive matches on one such value are made one
  (`_merge_matches`): those muxes matched the same two tests once per lane, 64 times.

- *Combinational processes settle rank by rank* (`_rank_comb`, `_settle`): each has the rank of its strongly
  connected component in the graph of "reads what that one drives"; a woken process waits in its rank's
  bucket and the ranks run in order, a commit after each, so a process runs once as the logic settles
  instead of again whenever one more of its inputs does (pysim: every woken process, each delta cycle).
- *Wires inlined* (`_inline_wires`, when the engine is given `keep`): a signal that is one whole-signal copy
  of a signal or of constant slices of one is replaced by that value wherever it is read.
- *Compiled code cached on disk* (`sim.backends.code_cache`): the rewritten code of a source seen before.

Asserts are evaluated as before: a skipped process's Asserts saw the same values at its last run.

This uses pysim's internals (``PySimEngine``, ``_FragmentCompiler``, ``PyRTLProcess``, the state's slots),
which are not a public API: `engine_class` gives the stock engine when they are not there (another Amaranth
than the 0.5 series pyproject.toml pins) or a waveform is asked for (this engine records none).
"""
from __future__ import annotations

__all__ = ["SkipIdleEngine", "engine_class"]

import ast
import builtins
import re
import threading
from pathlib import Path

from sim.backends.code_cache import CodeCache, default_cache_dir

# what the code the engine compiles depends on besides the generated source: this module (the rewriter)
_ENGINE_SOURCE = Path(__file__).read_bytes()

# SkipIdleEngine swaps a module-level name of pysim while it builds: one build at a time (the server builds a
# simulator per chip, possibly on several threads)
_BUILD_LOCK = threading.Lock()

try:
    from amaranth.hdl import Cat, Const, Fragment, Signal, Value
    from amaranth.hdl._ast import Assign, Operator, Print, Property, SignalDict, SignalSet, Slice, Switch
    from amaranth.hdl._mem import MemoryInstance
    from amaranth.hdl._xfrm import StatementTransformer, ValueTransformer
    from amaranth.sim import pysim as _pysim
    from amaranth.sim import _pyrtl
    from amaranth.sim._pyrtl import PyRTLProcess, _FragmentCompiler
    _AVAILABLE = all(hasattr(_pysim, name) for name in ("PySimEngine", "_FragmentCompiler", "_PySignalState"))
except ImportError:                                       # pragma: no cover - another Amaranth
    _AVAILABLE = False


def engine_class(vcd: bool = False, keep=None):
    """The engine for ``Simulator(..., engine=...)``: `SkipIdleEngine` where pysim's internals are the ones it
    was written for, else (or to write a waveform, which it does not) the stock ``"pysim"``. With `keep` (the
    signals a testbench may await), wires other than those are inlined (`SkipIdleEngine.keep`)."""
    if not _AVAILABLE or vcd:
        return "pysim"
    if keep is None:
        return SkipIdleEngine
    return type("SkipIdleEngineInlined", (SkipIdleEngine,), {"keep": tuple(keep)})


if _AVAILABLE:
    class _RecordingCompiler(_FragmentCompiler):
        """pysim's fragment compiler that also notes, for every fragment, the clocked processes it made
        (the ones of its own statements and memory ports, not its subfragments')."""

        def __init__(self, state):
            super().__init__(state)
            self.clocked = []            # (process, fragment, domain name)
            self.comb = []               # (process, fragment): a fragment's own combinational process
            self._made = []              # the processes made under each fragment being compiled

        def __call__(self, fragment):
            self._made.append(set())
            processes = super().__call__(fragment)      # compiles the subfragments through self(...)
            below = self._made.pop()
            if self._made:
                self._made[-1].update(processes)
            self.comb.extend((p, fragment) for p in processes if p not in below and p.is_comb)
            own = [p for p in processes if p not in below and not p.is_comb]
            domains = {name for name in fragment.statements if name != "comb"}
            if isinstance(fragment, MemoryInstance):
                domains |= {port._domain for port in (*fragment._read_ports, *fragment._write_ports)
                            if port._domain != "comb"}
            # one clocked domain per fragment on this chip; with more, which process is which domain's is not
            # known here, and those processes keep running at every edge (correct, only slower)
            if len(domains) == 1 and len(own) == 1:
                self.clocked.append((own[0], fragment, domains.pop()))
            return processes

    def _inputs(fragment, domain_name):
        """The signals a clocked process reads, and the memory whose contents it reads (or None)."""
        signals = SignalSet()
        for stmt in fragment.statements.get(domain_name, ()):
            signals |= stmt._rhs_signals()
        domain = fragment.domains[domain_name]
        if domain.rst is not None:
            signals |= Value.cast(domain.rst)._rhs_signals()
        memory = None
        if isinstance(fragment, MemoryInstance):
            for port in fragment._write_ports:
                if port._domain == domain_name:
                    for value in (port._addr, port._data, port._en):
                        signals |= value._rhs_signals()
            for port in fragment._read_ports:
                if port._domain == domain_name:
                    for value in (port._addr, port._en):
                        signals |= value._rhs_signals()
                    # the data a read port returns lives in the memory; a transparent one also reads the
                    # write ports (above)
                    memory = fragment._data
        return signals, memory

    def _project(stmts, key_of, check_key):
        """`stmts` cut by key: {key: its statements, in order}. An Assign goes to the key of the signals it
        assigns (`key_of`, a SignalDict; the signals of one Assign share theirs), a Property or Print to
        ``check_key[id(statement)]``. A Switch goes to every key one of its cases has something for, with all
        its cases (an emptied case still stops the later ones from matching), so each signal gets exactly
        the values `stmts` give it and each check is made when it was."""
        out = {}
        for stmt in stmts:
            if isinstance(stmt, Switch):
                bodies = [_project(body, key_of, check_key) for _patterns, body, _src_loc in stmt.cases]
                for key in {key: None for body in bodies for key in body}:        # first seen, first
                    cases = [(patterns, body.get(key, []), src_loc)
                             for (patterns, _, src_loc), body in zip(stmt.cases, bodies)]
                    out.setdefault(key, []).append(Switch(stmt.test, cases, src_loc=stmt.src_loc))
            elif isinstance(stmt, Assign):
                out.setdefault(key_of[next(iter(stmt._lhs_signals()))], []).append(stmt)
            else:
                out.setdefault(check_key[id(stmt)], []).append(stmt)
        return out

    def _fragments(fragment):
        yield fragment
        for sub, _name, _src_loc in fragment.subfragments:
            yield from _fragments(sub)

    class _Replace(ValueTransformer):
        def __init__(self, table):
            self.table = table

        def on_Signal(self, value):
            return self.table.get(value, value)

    class _ReplaceInStatements(StatementTransformer):
        def __init__(self, values):
            self.values = values

        def on_value(self, value):
            return self.values(value)

        def on_Property(self, stmt):
            new = super().on_Property(stmt)
            new.src_loc = stmt.src_loc
            return new

    def _with_shape(value, signal):
        """`value` as `signal` holds it after ``signal.eq(value)``: cut or extended to its width, its sign."""
        value, width, signed = Value.cast(value), len(signal), signal.shape().signed
        if len(value) == width:
            pass
        elif len(value) > width:
            value = value.as_unsigned()[:width]
        elif value.shape().signed:
            value = Cat(value, value[-1].replicate(width - len(value)))
        else:
            value = Cat(value, Const(0, width - len(value)))
        if value.shape().signed != signed:
            value = value.as_signed() if signed else value.as_unsigned()
        return value

    def _plain(value):
        """Whether `value` is a signal, or constant slices and sign views of one (what a wire copies)."""
        while isinstance(value, Slice) or (isinstance(value, Operator) and value.operator in ("s", "u")):
            value = value.value if isinstance(value, Slice) else value.operands[0]
        return isinstance(value, Signal)

    def _inline_wires(root, keep):
        """Wires of the fragment tree `root` (a signal assigned, whole, by one top-level combinational statement
        from a signal or constant slices of one, `_plain`: port connections, instruction fields) replaced by that
        value, with the wire's shape (`_with_shape`), wherever they are read: every domain's statements,
        Asserts and Prints, memory ports' addresses, data and enables; their statements are dropped. None of
        `keep` (what a testbench awaits), and no domain's clock or reset. Returns {wire: the value it stands
        for} (`SkipIdleEngine.get_value` reads a wire through it).

        A dropped wire's process no longer runs, nor commits, nor wakes its readers one rank later: about 200
        wires on the fast chip, a sixth of the process runs of a cycle. The values are the same: a
        combinational wire always equals its right-hand side once the logic has settled, and every reader
        now reads that right-hand side's settled value."""
        keep = SignalSet(keep)
        for fragment in _fragments(root):
            for domain in fragment.domains.values():
                keep |= SignalSet(s for s in (domain.clk, domain.rst) if s is not None)
            if isinstance(fragment, MemoryInstance):
                # a write port whose address, data and enable are signals keeps its fast write
                # (`SkipIdleEngine._writer`, `_skip_disabled`)
                for port in fragment._write_ports:
                    keep |= SignalSet(v for v in (port._addr, port._data, port._en) if isinstance(v, Signal))
        found = SignalDict()
        for fragment in _fragments(root):
            stmts = fragment.statements.get("comb")
            if not stmts:
                continue
            counts = SignalDict()
            for stmt in stmts:
                for signal in stmt._lhs_signals():
                    counts[signal] = counts.get(signal, 0) + 1
            for stmt in stmts:
                if not isinstance(stmt, Assign) or not isinstance(stmt.lhs, Signal):
                    continue
                x, e = stmt.lhs, stmt.rhs
                if counts[x] != 1 or x in keep or x in e._rhs_signals():
                    continue
                if not _plain(e):
                    continue
                found[x] = (fragment, stmt, e)
        table = SignalDict()

        def resolve(x, seen=()):
            if x in table:
                return table[x]
            _fragment, _stmt, e = found[x]
            inner = [s for s in e._rhs_signals() if s in found and id(s) not in seen]
            for s in inner:
                resolve(s, seen + (id(x),))
            table[x] = _with_shape(_Replace(table)(e), x)
            return table[x]
        for x in list(found.keys()):
            resolve(x)
        replace = _Replace(table)
        statements = _ReplaceInStatements(replace)
        dropped = {id(stmt) for _f, stmt, _e in found.values()}
        for fragment in _fragments(root):
            for domain_name, stmts in list(fragment.statements.items()):
                kept = [stmt for stmt in stmts if id(stmt) not in dropped]
                if kept:
                    fragment.statements[domain_name] = statements.on_statements(kept)
                else:
                    del fragment.statements[domain_name]
            if isinstance(fragment, MemoryInstance):
                for port in fragment._read_ports:
                    port._addr, port._en = replace(port._addr), replace(port._en)
                for port in fragment._write_ports:
                    port._addr, port._data, port._en = replace(port._addr), replace(port._data), replace(port._en)
        return table

    def _split(fragment, clocked=True):
        """Cut the statements of `fragment` (the combinational ones; with `clocked` every domain's) into one
        subfragment per group of signals that read the same inputs, recursively (signals assigned together
        by one statement stay together, each Property or Print is a group of its own, and a group whose
        inputs all belong to a bigger group's joins it).

        pysim runs a fragment's combinational statements all together whenever any signal they read changes
        (several times a cycle for the sequencer's, as the units' outputs settle); cut, each part runs only
        when one of its own inputs changes. A clocked part is a clocked process of its own, which
        `SkipIdleEngine` skips while its own inputs stay still. Each signal gets exactly the assignments it
        had, in order, each check is made under the same conditions, and combinational logic without loops
        settles to the same values whatever the order of evaluation, so only the time changes."""
        for sub, _name, _src_loc in fragment.subfragments:
            _split(sub, clocked)
        if isinstance(fragment, MemoryInstance):
            return
        if clocked:
            for sub, name, _src_loc in list(fragment.subfragments):
                reads = _split_reads(sub) if isinstance(sub, MemoryInstance) else None
                if reads is not None:
                    fragment.add_subfragment(reads, f"{name}_reads")
        for domain_name in list(fragment.statements):
            if clocked or domain_name == "comb":
                _split_domain(fragment, domain_name)

    def _split_reads(memory):
        """`memory`'s clocked read ports that are transparent for no write port, taken out of it into a
        MemoryInstance of their own over the same words (pysim keeps one state per ``MemoryData``), when
        `memory` has write ports too; returns that instance (or None).

        pysim compiles a memory's clocked ports into one process, which builds every write port's mask (a
        bit per enable replicated to the granularity) at every run: the scratchpad's banks' processes ran
        nearly every cycle for their read ports while they wrote seldom. Apart, the write ports' process
        runs only at an edge where one of them is enabled (`SkipIdleEngine._skip_disabled`), the read ports'
        when their addresses or enables or a word changed. A transparent read port stays with the write
        ports it reads."""
        apart = [port for port in memory._read_ports if port._domain != "comb" and not port._transparent_for]
        if not apart or not memory._write_ports:
            return None
        memory._read_ports = [port for port in memory._read_ports if not any(port is a for a in apart)]
        reads = MemoryInstance(data=memory._data, attrs=memory._attrs, src_loc=memory.src_loc)
        reads.domains.update(memory.domains)
        reads._read_ports.extend(apart)
        return reads

    def _write_enables(fragment, domain_name):
        """The enable signals of `fragment`'s write ports when it is a memory whose only ports in `domain_name`
        are write ports with a Signal each for an enable (else None): its process in that domain changes
        nothing at an edge where they are all zero."""
        if (not isinstance(fragment, MemoryInstance) or not fragment._write_ports or fragment.statements
                or any(port._domain == domain_name for port in fragment._read_ports)):
            return None
        if any(port._domain != domain_name or not isinstance(port._en, Signal) for port in fragment._write_ports):
            return None
        return [port._en for port in fragment._write_ports]

    # Write masks remembered per enable value, per port: a port's enable takes a handful of values (the MM
    # operand memory's: one group of lanes a cycle), so a small bound only guards against a design whose enable
    # takes many.
    _MASKS_KEPT = 256

    def _enable_mask(count, granularity, width):
        """The function from a write port's enable value (`count` bits) to its write mask (`width` bits, each
        enable bit replicated `granularity` times)."""
        full = (1 << width) - 1
        if count == 1:
            return lambda bits: full                      # called only with the bit set
        if granularity == 1:
            return lambda bits: full & bits
        masks, unit = {}, (1 << granularity) - 1

        def mask_of(bits):
            mask = masks.get(bits)
            if mask is None:
                mask = 0
                for k in range(count):
                    if bits >> k & 1:
                        mask |= unit << (k * granularity)
                if len(masks) < _MASKS_KEPT:              # the few values a port's enable takes
                    masks[bits] = mask
            return mask
        return mask_of

    def _split_domain(fragment, domain_name):
        stmts = fragment.statements[domain_name]
        if any(not isinstance(stmt, (Assign, Switch, Property, Print)) for stmt in stmts):
            return                                        # something this function does not know: leave it
        # signals assigned by one Assign (a Cat on the left) go together
        groups = SignalDict()                             # signal -> its group (a SignalSet shared by members)
        checks = []
        for stmt in stmts:
            for inner in _leaves(stmt):
                if not isinstance(inner, Assign):
                    checks.append(inner)
                    continue
                together = SignalSet(inner._lhs_signals())
                for signal in list(together):
                    together |= groups.get(signal, SignalSet())
                for signal in together:
                    groups[signal] = together
        key_of = SignalDict((signal, id(group)) for signal, group in groups.items())
        check_key = {id(check): ("check", id(check)) for check in checks}
        # a group whose inputs all wake another group anyway joins it: it then costs no extra run, and pysim
        # has one process fewer
        found = []                                        # (the inputs' ids, the group's key)
        for key, body in _project(stmts, key_of, check_key).items():
            inputs = SignalSet()
            for stmt in body:
                inputs |= stmt._rhs_signals()
            found.append((frozenset(id(signal) for signal in inputs), key))
        found.sort(key=lambda item: -len(item[0]))
        parts = []                                        # [inputs' ids, the groups' keys]
        for inputs, key in found:
            home = next((part for part in parts if inputs <= part[0]), None)
            if home is None:
                parts.append([inputs, [key]])
            else:
                home[1].append(key)
        if len(parts) < 2:
            return
        part_of_key = {key: k for k, (_inputs, keys) in enumerate(parts) for key in keys}
        part_of = SignalDict((signal, part_of_key[key]) for signal, key in key_of.items())
        part_of_check = {ident: part_of_key[key] for ident, key in check_key.items()}
        del fragment.statements[domain_name]
        for k, body in _project(stmts, part_of, part_of_check).items():
            part = Fragment()
            part.add_statements(domain_name, _one_assign(body) if domain_name == "comb" else body)
            if domain_name != "comb":
                part.domains[domain_name] = fragment.domains[domain_name]     # its clock and reset
            fragment.add_subfragment(part, f"{domain_name}_part{k}")

    def _one_assign(body):
        """`body` as one Assign of a Cat when it assigns one signal slice by slice (constant, disjoint slices,
        the rest of the signal at its initial value): pysim then builds the signal once instead of masking
        every slice into the whole width (the systolic array's 64 accumulators of the fast chip, 2,048 bits).
        Each slice gets its right-hand side cut or extended to its width as the Assign would; otherwise
        `body` as it is."""
        if not body or not all(isinstance(stmt, Assign) for stmt in body):
            return body
        slices = [_bits(stmt.lhs) for stmt in body]
        if not all(isinstance(lhs, Slice) and isinstance(lhs.value, Signal) for lhs in slices):
            return body
        signal = slices[0].value
        if len(body) < 2 or any(lhs.value is not signal for lhs in slices):
            return body
        spans = sorted(((lhs.start, lhs.stop, stmt.rhs) for lhs, stmt in zip(slices, body)), key=lambda x: x[0])
        if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
            return body                                   # overlapping slices: the later Assign wins
        init = Const(signal.init, len(signal)).as_unsigned() if signal.init else None
        pieces, at = [], 0
        for start, stop, rhs in spans:
            if start > at:
                pieces.append(init[at:start] if init is not None else Const(0, start - at))
            width, rhs = stop - start, Value.cast(rhs)
            if len(rhs) >= width:
                pieces.append(rhs.as_unsigned()[:width])
            elif rhs.shape().signed:
                pieces.append(Cat(rhs, rhs[-1].replicate(width - len(rhs))))
            else:
                pieces.append(Cat(rhs, Const(0, width - len(rhs))))
            at = stop
        if at < len(signal):
            pieces.append(init[at:] if init is not None else Const(0, len(signal) - at))
        return [signal.eq(Cat(*pieces))]

    def _bits(lhs):
        """The left-hand side `lhs` without its as_signed/as_unsigned views (assigning them assigns the bits)."""
        while isinstance(lhs, Operator) and lhs.operator in ("s", "u"):
            lhs = lhs.operands[0]
        return lhs

    def _leaves(stmt):
        """The statements of `stmt` other than Switches, nested ones included."""
        if isinstance(stmt, Switch):
            for _patterns, body, _src_loc in stmt.cases:
                for inner in body:
                    yield from _leaves(inner)
        else:
            yield stmt

    def _raised(waker):
        """(pysim's maker of `waker`: ``"comb_waker.<locals>.waker"`` or ``"memory_waker.<locals>.waker"``,
        the process whose flag it raises) when `waker` is one of those (they hold the process alone), else
        (its name, None)."""
        name = getattr(waker, "__qualname__", "")
        cells = [cell.cell_contents for cell in getattr(waker, "__closure__", None) or ()]
        if name in ("comb_waker.<locals>.waker", "memory_waker.<locals>.waker") and len(cells) == 1:
            return name, cells[0]
        return name, None

    def _direct_waker(waker, home):
        """pysim's `waker` itself, or, if it only raises the flag of a compiled process (a key of `home`: the
        wakers of ``comb_waker`` and ``memory_waker`` in ``amaranth.sim._pyrtl``), one that puts it in its
        set ``home[process]``."""
        name, process = _raised(waker)
        if process not in home:
            return waker
        add = home[process].add
        if name == "comb_waker.<locals>.waker":
            def on_signal(curr, next):
                add(process)
                return True
            on_signal.queues = process           # for _merge_wakers
            return on_signal
        if name == "memory_waker.<locals>.waker":
            def on_memory():
                add(process)
                return True
            return on_memory
        return waker

    class _InlineSign(ast.NodeTransformer):
        """pysim's generated code sign-extends every signed operand with a call of its helper,
        ``sign((MASK & x), -H)`` where MASK = 2*H - 1 (over 300 calls a cycle on the fast chip's systolic
        array, a call each); here the same value without a call: ``((MASK & x) ^ H) - H``. For a value v
        in [0, 2H), v ^ H - H is v below H and v - 2H from H on, which is what the helper gives
        (v | -H sets the bits above the sign bit). A call of another shape is left as it is."""

        def visit_Call(self, node):
            self.generic_visit(node)
            if not (isinstance(node.func, ast.Name) and node.func.id == "sign" and len(node.args) == 2
                    and not node.keywords):
                return node
            value, low = node.args
            half = ast.literal_eval(low) if isinstance(low, (ast.Constant, ast.UnaryOp)) else None
            if not isinstance(half, int) or half >= 0 or half & (-half - 1):
                return node                                   # not -H with H a power of two
            half = -half
            if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitAnd)
                    and isinstance(value.left, ast.Constant) and value.left.value == 2 * half - 1):
                return node                                   # not masked to the sign bit
            flipped = _at(ast.BinOp(value, ast.BitXor(), _at(ast.Constant(half), node)), node)
            return _at(ast.BinOp(flipped, ast.Sub(), _at(ast.Constant(half), node)), node)

    def _at(new, old):
        """`new` placed where `old` is in the source (compile needs a place for every node)."""
        return ast.copy_location(new, old)

    def _int(node):
        """The value of `node` when it is an integer constant, else None."""
        return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None

    def _field(node):
        """(X, s, w, t) when `node` is bits [s, s + w) of X put at bit t, as pysim writes a slice in a Cat:
        ``(M & (X >> s)) << t``, with M = 2**w - 1 (``>> s`` or ``<< t`` left out when 0); else None."""
        t = 0
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.LShift) and _int(node.right) is not None:
            node, t = node.left, _int(node.right)
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd) and _int(node.left) is not None):
            return None
        mask, value = _int(node.left), node.right
        if mask <= 0 or mask & (mask + 1):
            return None                                       # not 2**w - 1
        shift = 0
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.RShift) and _int(value.right) is not None:
            value, shift = value.left, _int(value.right)
        return value, shift, mask.bit_length(), t

    def _make_field(value, shift, width, at):
        node = value if shift == 0 else _at(ast.BinOp(value, ast.RShift(), _at(ast.Constant(shift), value)), value)
        node = _at(ast.BinOp(_at(ast.Constant((1 << width) - 1), value), ast.BitAnd(), node), value)
        return node if at == 0 else _at(ast.BinOp(node, ast.LShift(), _at(ast.Constant(at), value)), value)

    class _Peephole(ast.NodeTransformer):
        """Integer identities on the code pysim generates, the values unchanged: ``x >> 0`` and ``x << 0`` are
        x; ``C1 & (C2 & x)`` is ``(C1 & C2) & x``; and an OR of fields that are consecutive bits of one value
        put at consecutive places (a Cat of a signal's slices in order: the systolic array's ``b_nxt``
        copies a 512-bit signal byte by byte) is one field: bits [s, s + w1) at t and [s + w1, s + w1 + w2)
        at t + w1 are bits [s, s + w1 + w2) at t."""

        def visit_BinOp(self, node):
            if isinstance(node.op, ast.BitOr):
                return self._merge_fields(node)
            self.generic_visit(node)
            op, right = node.op, _int(node.right)
            if isinstance(op, (ast.RShift, ast.LShift)) and right == 0:
                return node.left
            left = _int(node.left)
            if (isinstance(op, ast.BitAnd) and left is not None and isinstance(node.right, ast.BinOp)
                    and isinstance(node.right.op, ast.BitAnd) and _int(node.right.left) is not None):
                folded = _at(ast.Constant(left & _int(node.right.left)), node)
                return _at(ast.BinOp(folded, ast.BitAnd(), node.right.right), node)
            return node

        def _merge_fields(self, node):
            terms = []                                        # the OR chain, left to right
            while isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
                terms.append(node.right)
                node = node.left
            terms.append(node)
            terms = [self.visit(term) for term in reversed(terms)]   # the chain's own nodes walked once
            merged, last, changed = [], None, False
            for term in terms:
                field = _field(term)
                if (field is not None and last is not None and field[1] == last[1] + last[2]
                        and field[3] == last[3] + last[2] and ast.dump(field[0]) == ast.dump(last[0])):
                    last = (last[0], last[1], last[2] + field[2], last[3])
                    merged[-1] = _make_field(*last)
                    changed = True
                    continue
                merged.append(term)
                last = field
            if not changed:
                return self._chain(terms)
            return self._chain(merged)

        @staticmethod
        def _chain(terms):
            node = terms[0]
            for term in terms[1:]:
                node = _at(ast.BinOp(node, ast.BitOr(), term), term)
            return node

    class _Rewrite(_InlineSign, _Peephole):
        """`_InlineSign` and `_Peephole` in one walk of the tree; a signal's value (``slots[i].curr``) and the
        leaves are not walked into (nothing in them to rewrite): the build stays short."""

        def visit_Attribute(self, node):
            return node

        visit_Subscript = visit_Name = visit_Constant = visit_Attribute

        def visit_Expr(self, node):
            """``slots[i].update(value, MASK)`` (how a process hands a signal its next value, about 150 a
            cycle on the fast chip) as pysim's method does it, without the call: the new next value is the
            old one outside MASK and `value` inside; a change puts the signal in the pending set."""
            call = node.value
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "update" and len(call.args) == 2 and not call.keywords
                    and isinstance(call.func.value, ast.Subscript)
                    and isinstance(call.func.value.value, ast.Name) and call.func.value.value.id == "slots"
                    and _int(call.func.value.slice) is not None and isinstance(call.args[0], ast.Name)):
                return self.generic_visit(node)
            try:
                mask = ast.literal_eval(call.args[1])
            except ValueError:
                return self.generic_visit(node)
            if type(mask) is not int:
                return self.generic_visit(node)
            index, value = _int(call.func.value.slice), call.args[0].id
            slot, new = f"slot_{index}_", f"value_{index}_"
            kept = f"({slot}.next & {~mask}) | " if ~mask else ""
            code = (f"{slot} = slots[{index}]\n"
                    f"{new} = {kept}({value} & {mask})\n"
                    f"if {slot}.next != {new}:\n"
                    f"    {slot}.next = {new}\n"
                    f"    {slot}.pending.add({slot})\n")
            body = ast.parse(code).body
            for stmt in body:
                for inner in ast.walk(stmt):
                    if "lineno" in inner._attributes:
                        ast.copy_location(inner, node)
            return body

    _CURR = re.compile(r"slots\[(\d+)\]\.curr")
    # a field of a signal's value at a constant place, sign-extended or not, as pysim writes a Slice
    _SIGNED_FIELD = re.compile(r"sign\(\((0x[0-9a-f]+) & \(\1 & \(curr_\d+_ >> \d+\)\)\), -0x[0-9a-f]+\)")
    _FIELD = re.compile(r"\((0x[0-9a-f]+) & \(\1 & \(curr_\d+_ >> \d+\)\)\)")
    _ASSIGN = re.compile(r"^( *)(\w+) = (.*)$")
    _NAME = re.compile(r"\b[A-Za-z_]\w*")
    _HOISTED = re.compile(r"(?:curr|field)_\d+_")
    _OPERATORS = re.compile(r"[\w\s&|^~<>=!+\-*()]*")

    def _hoist_reads(source):
        """The code pysim generates for a process (``def run():`` and its body), each value computed once:

        - a signal's current value read more than once (``slots[i].curr``, an attribute lookup each) is read
          once into a local at the top (the systolic array's ``acc_nxt`` read its three inputs 64 times);
        - a field at a constant place of such a value (pysim's Slice: ``(M & (M & (x >> s)))``, possibly in
          ``sign(...)``) computed more than once is computed once at the top (each A lane feeds 8 PEs);
        - an assignment ``name = E`` where E was already assigned, whole, to a name assigned once in the
          function by a statement of the function's top level (so it ran before), takes that name instead
          (the MM unit computes its operand-row test once per lane).

        What is moved to the top reads only current values, which no process changes while it runs (a run
        reads ``curr`` and writes ``next``), through integer operators with constant shifts: it computes the
        same values and cannot fail. Code with a string in it (a Print's or an Assert's message) is left
        as it is: the patterns are then matched on code alone."""
        if not source.startswith("def run():\n") or '"' in source or "'" in source:
            return source
        counts = {}
        for index in _CURR.findall(source):
            counts[index] = counts.get(index, 0) + 1
        hoisted = [index for index, count in counts.items() if count > 1]
        if hoisted:
            source = _CURR.sub(lambda m: f"curr_{m[1]}_" if counts[m[1]] > 1 else m[0], source)
        header = [f"    curr_{index}_ = slots[{index}].curr" for index in hoisted]
        for pattern in (_SIGNED_FIELD, _FIELD):
            counts = {}
            for match in pattern.finditer(source):
                counts[match[0]] = counts.get(match[0], 0) + 1
            for text, count in counts.items():
                if count > 1:
                    name = f"field_{len(header)}_"
                    header.append(f"    {name} = {text}")
                    # masked once more where it is sign-extended: `_InlineSign` knows the value's width
                    mask = text[1:text.index(" ")]
                    source = source.replace(f"sign({text}", f"sign(({mask} & {name})").replace(text, name)
        lines = source.split("\n")
        found = {}                                          # a pure right-hand side -> the lines assigning it
        assigned = {}
        for k, line in enumerate(lines):
            match = _ASSIGN.match(line)
            if match is None:
                continue
            indent, name, rhs = match.groups()
            assigned[name] = assigned.get(name, 0) + 1
            words = _NAME.findall(rhs)                      # a constant alone costs no more than a name
            if (words and _OPERATORS.fullmatch(rhs) and "**" not in rhs
                    and all(_HOISTED.fullmatch(word) for word in words)):
                found.setdefault(rhs, []).append(k)
        for rhs, where in found.items():
            if len(where) < 2:
                continue
            if "<<" not in rhs and ">>" not in rhs:
                # no shift by a computed amount (which could be huge): computed once at the top, whether
                # or not the branches it was in are taken
                value = f"same_{len(header)}_"
                header.append(f"    {value} = {rhs}")
            else:
                # computed where it first is, if that is at the top level (so before the others) and
                # that name keeps it
                indent, value, _rhs = _ASSIGN.match(lines[where[0]]).groups()
                if len(indent) != 4 or assigned[value] != 1:
                    continue
                where = where[1:]
            for k in where:
                indent, name, _rhs = _ASSIGN.match(lines[k]).groups()
                lines[k] = f"{indent}{name} = {value}"
        return "\n".join(lines[:1] + header + lines[1:])

    def _names(nodes):
        """(the names `nodes` read, the names they assign)."""
        read, written = set(), set()
        for node in nodes:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Name):
                    (written if isinstance(inner.ctx, ast.Store) else read).add(inner.id)
        return read, written

    def _merge_matches(body):
        """`body` (statements) with consecutive ``match`` statements on one value made one (their cases'
        bodies joined, in order), recursively: the MM unit's operand-row muxes matched the same two tests
        once per lane, 64 times. A subject counts as one value when it is a name `_hoist_reads` assigns once
        at the top (``same_``, ``field_``, ``curr_``) or was assigned one in `body`. Between two such
        matches only plain assignments of a constant or a name may stand; they move before the first match,
        which must neither read nor assign what they assign nor assign what they read. The joined match
        takes the case each of the two took (one value, the same patterns), and runs the first's body then
        the second's, as before: every statement sees the values it saw."""
        value = {}                                       # a name -> the hoisted name it was given
        out = []
        group = None                                     # [the match being grown, its key, read, written]
        for stmt in body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, (ast.Constant, ast.Name))):
                name = stmt.targets[0].id
                value.pop(name, None)
                if isinstance(stmt.value, ast.Name) and _HOISTED_ONCE.fullmatch(stmt.value.id):
                    value[name] = stmt.value.id
                if group is not None:
                    moved_read, moved_written = _names([stmt])
                    if not (moved_written & (group[2] | group[3]) or moved_read & group[3]):
                        out.insert(out.index(group[0]), stmt)        # before the match being grown
                        continue
                    group = None
                out.append(stmt)
                continue
            if isinstance(stmt, ast.Match) and isinstance(stmt.subject, ast.Name):
                subject = stmt.subject.id
                key = (subject if _HOISTED_ONCE.fullmatch(subject) else value.get(subject),
                       [(ast.dump(case.pattern), ast.dump(case.guard) if case.guard else None)
                        for case in stmt.cases])
                read, written = _names(stmt.cases)
                read.add(subject)                        # read when the match starts
                for name in written:
                    value.pop(name, None)
                if key[0] is not None:
                    if group is not None and group[1] == key:
                        for grown, case in zip(group[0].cases, stmt.cases):
                            grown.body.extend(case.body)
                        group[2] |= read
                        group[3] |= written
                        continue
                    group = [stmt, key, read, written]
                    out.append(stmt)
                    continue
            else:
                for name in _names([stmt])[1]:
                    value.pop(name, None)
            group = None
            out.append(stmt)
        for stmt in out:
            if isinstance(stmt, ast.Match):
                for case in stmt.cases:
                    case.body[:] = _merge_matches(case.body)
        return out

    _HOISTED_ONCE = re.compile(r"(?:curr|field|same)_\d+_")

    def _compile_inlined(source, filename, mode, *args, **kwargs):
        """``compile`` for the code pysim generates, its values computed once (`_hoist_reads`), its sign
        extensions inlined (`_InlineSign`), integer identities applied (`_Peephole`) and its matches on one
        value made one (`_merge_matches`)."""
        tree = _Rewrite().visit(ast.parse(_hoist_reads(source), filename, mode))
        for function in tree.body:
            if isinstance(function, ast.FunctionDef):
                function.body[:] = _merge_matches(function.body)
        return builtins.compile(tree, filename, mode, *args, **kwargs)

    def _ranks(nodes, after):
        """{node: rank} over the graph whose edges are ``after[node]`` (the nodes that read what it drives):
        the nodes of one strongly connected component share a rank, one above the highest of the components
        with an edge into it (0 for none). Tarjan's algorithm, without recursion; it finds the components
        sinks first."""
        index, low, on_stack, stack, found = {}, {}, set(), [], []
        for root in nodes:
            if root in index:
                continue
            work = [(root, iter(after[root]))]
            index[root] = low[root] = len(index)
            stack.append(root)
            on_stack.add(root)
            while work:
                node, edges = work[-1]
                for succ in edges:
                    if succ not in index:
                        index[succ] = low[succ] = len(index)
                        stack.append(succ)
                        on_stack.add(succ)
                        work.append((succ, iter(after[succ])))
                        break
                    if succ in on_stack:
                        low[node] = min(low[node], index[succ])
                else:
                    work.pop()
                    if work:
                        parent = work[-1][0]
                        low[parent] = min(low[parent], low[node])
                    if low[node] == index[node]:
                        members = []
                        while True:
                            member = stack.pop()
                            on_stack.discard(member)
                            members.append(member)
                            if member is node:
                                break
                        found.append(members)
        component = {node: k for k, members in enumerate(found) for node in members}
        rank_of = [0] * len(found)
        for k in reversed(range(len(found))):             # sources first
            for node in found[k]:
                for succ in after[node]:
                    j = component[succ]
                    if j != k and rank_of[j] < rank_of[k] + 1:
                        rank_of[j] = rank_of[k] + 1
        return {node: rank_of[component[node]] for node in nodes}

    _MEMORY_STATE_CLASSES = {}

    def _memory_state_class(depth):
        """pysim's memory state with a `read` that compares the address with the depth it was made for, not
        with ``range(memory.depth)`` built anew at every read (a property and a range: about 30 reads a
        cycle on the fast chip). The same words: an address past the depth reads 0."""
        cls = _MEMORY_STATE_CLASSES.get(depth)
        if cls is None:
            def read(self, addr):
                return self.data[addr] if 0 <= addr < depth else 0
            cls = _MEMORY_STATE_CLASSES[depth] = type(f"MemoryState{depth}", (_pysim._PyMemoryState,),
                                                      {"__slots__": (), "read": read})
        return cls

    class SkipIdleEngine(_pysim.PySimEngine):
        """``PySimEngine`` whose clocked processes run at an edge only when one of their inputs has changed
        since their last run, whose processes are cut by `_split`, and whose delta cycle
        runs the compiled processes from a queue (the module's docstring says why each is exact)."""

        #: cut the clocked statements too, not only the combinational ones (measured: book ~6% faster,
        #: fast the same)
        split_clocked = True
        #: the signals a testbench may await (a trigger): never inlined; None inlines no wire at all
        keep = None

        def __init__(self, design):
            # pysim builds its processes with the module-level name `_FragmentCompiler`; the recording
            # subclass stands in for it while the base class compiles the design (one construction at a
            # time, under _BUILD_LOCK, and the name is put back whatever happens)
            compiler = {}

            def recording(state):
                compiler["made"] = _RecordingCompiler(state)
                return compiler["made"]

            self._wires = _inline_wires(design.fragment, self.keep) if self.keep is not None else SignalDict()
            _split(design.fragment, self.split_clocked)
            # the rewritten code of a source compiled before is read back from disk (sim.backends.code_cache)
            self.code_cache = cache = CodeCache(default_cache_dir(), _ENGINE_SOURCE)

            def compile_cached(source, filename, mode, *args, **kwargs):
                if args or kwargs:
                    return _compile_inlined(source, filename, mode, *args, **kwargs)
                return cache.compile(_compile_inlined, source, filename, mode)

            with _BUILD_LOCK:                    # simulators built on several threads (the server's chips)
                _pysim._FragmentCompiler = recording
                # the code pysim generates goes through _compile_inlined (pysim's module calls `compile`)
                _pyrtl.compile = compile_cached
                try:
                    super().__init__(design)
                finally:
                    _pysim._FragmentCompiler = _FragmentCompiler
                    del _pyrtl.compile
            self._queue = set()                  # the compiled processes to run in the next delta cycle
            self._edges = []                     # the stale sets of the clocks that had an active edge
            self._guarded = []                   # (process, its clock's stale set)
            self._stale_sets = {}                # (clock's state id, polarity) -> that clock's stale set
            self._read_plans = {}                # id(rows) -> (rows, read_rows's plan for them)
            for process, fragment, domain_name in compiler["made"].clocked:
                self._guard(process, fragment.domains[domain_name], *_inputs(fragment, domain_name))
                enables = _write_enables(fragment, domain_name)
                if enables is not None:
                    self._skip_disabled(process, enables)
                    if all(isinstance(port._addr, Signal) and isinstance(port._data, Signal)
                           for port in fragment._write_ports):
                        process.run = self._writer(fragment)
            self._take_rtl_processes(compiler["made"].comb)
            for slot in self._state.slots:
                if type(slot) is _pysim._PyMemoryState:
                    slot.__class__ = _memory_state_class(slot.memory.depth)

        def _guard(self, process, domain, signals, memory):
            """Run `process` (clocked in `domain`) at an active edge only if it is stale: an input changed, a
            word of `memory` changed, or a reset, since its last run."""
            if domain.async_reset and domain.rst is not None:
                return                           # woken by its reset too: left as pysim made it
            clk = self._state.slots[self._state.get_signal(domain.clk)]
            polarity = 1 if domain.clk_edge == "pos" else 0
            pysim_wakers = [w for w in clk.wakers if w.__qualname__.startswith("edge_waker.")
                            and any(cell.cell_contents is process for cell in w.__closure__ or ())]
            if len(pysim_wakers) != 1:
                return                           # not made the way this was written for: left alone
            clk.wakers.remove(pysim_wakers[0])
            stale = self._clock_stale(clk, polarity)
            stale.add(process)
            self._guarded.append((process, stale))

            def on_signal(curr, next):           # pysim calls it only when the value changed
                stale.add(process)
                return True
            on_signal.stales = (stale, process)  # for _merge_wakers

            for signal in signals:
                self._state.add_signal_waker(signal, on_signal)
            if memory is not None:
                mem_state = self._state.slots[self._state.get_memory(memory)]

                def on_memory():
                    # pysim wakes a memory's wakers for every queued write, a write with its enable low
                    # (every edge of a write port) included: only a write that changes a word counts
                    data = mem_state.data
                    if any(data[addr] != value for addr, value in mem_state.write_queue.items()):
                        stale.add(process)
                    return True

                self._state.add_memory_waker(memory, on_memory)

        def _skip_disabled(self, process, enables):
            """`process` (a memory's write ports alone) runs only at an edge where one of `enables` is not zero.

            Such a process only queues writes, each masked by its port's enable: with every enable zero it
            writes nothing (pysim would still queue the old words and wake the memory's readers). Building
            the mask is the costly part (a 512-bit row with an enable per byte: 64 bits each replicated 8
            times); a write port's data changes at most edges while its enable stays low."""
            run = process.run
            slots = [self._state.slots[self._state.get_signal(signal)] for signal in enables]
            if len(slots) == 1:
                (enable,) = slots

                def run_if_enabled():
                    if enable.curr:
                        run()
            else:
                def run_if_enabled():
                    for enable in slots:
                        if enable.curr:
                            run()
                            return
            process.run = run_if_enabled

        def _writer(self, memory):
            """The run of the process of `memory`'s write ports (of one domain, the memory's only ports there,
            each with a Signal for its address, data and enable; no statements, so the domain's reset does
            nothing in it) as pysim's does it: each port in turn, where its enable is not zero, writes its
            data masked by its enable bits each replicated to the port's granularity. pysim builds that mask
            bit by bit at every run (32 shifts for a scratchpad bank, 512 for the MM unit's operand rows); here
            a 1-bit enable is the whole word, a granularity of 1 the enable itself, and other masks are
            remembered per enable value. A port whose enable is zero writes nothing (pysim queues the old
            word)."""
            state = self._state
            mem_write = state.slots[state.get_memory(memory._data)].write
            writes = []
            for port in memory._write_ports:
                slot = state.slots[state.get_signal(port._en)], state.slots[state.get_signal(port._addr)]
                width = len(port._data)
                writes.append((*slot, (1 << len(port._addr)) - 1, state.slots[state.get_signal(port._data)],
                               (1 << width) - 1, _enable_mask(len(port._en), port._granularity, width)))

            def write():
                for enable, addr, addr_mask, data, data_mask, mask_of in writes:
                    bits = enable.curr
                    if bits:
                        mem_write(addr_mask & addr.curr, data_mask & data.curr, mask_of(bits))
            return write

        def _clock_stale(self, clk, polarity):
            """The set of stale processes of the clock `clk` at edges of `polarity`, its waker made once."""
            key = (id(clk), polarity)
            if key not in self._stale_sets:
                stale = self._stale_sets[key] = set()
                edges = self._edges

                def on_edge(curr, next):
                    # the processes are queued after the whole commit (`step_design`): an input that
                    # changes in the same commit as the clock is then in the set too
                    if next == polarity:
                        edges.append(stale)
                    return True

                clk.add_waker(on_edge)
            return self._stale_sets[key]

        def _take_rtl_processes(self, comb):
            # pysim's delta cycle looks at every process's `runnable` flag (and `advance` at every one's
            # `critical`), hundreds of them once the logic is cut (`_split`), to run the few that are
            # set. The compiled processes are taken out of its list: raising the flag of a clocked one puts
            # it in a queue that the next delta cycle takes whole, that of a combinational one puts it in the
            # bucket of its rank (`_rank_comb`), which `_settle` empties rank by rank; the clock and coroutine
            # processes stay in the list. The processes of one batch read only current values and write only
            # next ones, so their order within it is free (pysim's own is that of a set too).
            queue = self._queue
            flag = PyRTLProcess.runnable         # the slot the base class keeps the flag in
            self._rtl = [p for p in self._processes if type(p) is PyRTLProcess]
            home = self._home = {p: queue for p in self._rtl if not p.is_comb}
            self._buckets = self._rank_comb([p for p, _ in comb if type(p) is PyRTLProcess], comb)
            home.update((p, self._buckets[rank]) for p, rank in self._ranks.items())
            for p in self._rtl:
                home.setdefault(p, queue)        # a comb process _rank_comb did not see: the queue, as before

            def set_runnable(process, value):
                if value:
                    home[process].add(process)
                else:
                    home[process].discard(process)

            # the flag is now "in its set" (the slot is no longer used)
            queued = type("QueuedRTLProcess", (PyRTLProcess,),
                          {"__slots__": (), "runnable": property(lambda p: p in home[p], set_runnable)})
            for process in self._rtl:
                runnable = flag.__get__(process)
                process.__class__ = queued
                process.runnable = runnable
            # a new set: one emptied by discards keeps its table, and iterating it walks every slot
            self._processes = {p for p in self._processes if type(p) is not queued}
            # pysim's wakers of a compiled combinational process (on its inputs, on a memory it reads) raise
            # the flag through the property above; the same in one call: put it in its bucket
            for slot in self._state.slots:
                slot.wakers[:] = [_direct_waker(waker, home) for waker in slot.wakers]
            self._merge_wakers()

        def _rank_comb(self, processes, comb):
            """The buckets of the combinational `processes` (of `comb`'s (process, fragment) pairs), one set per
            rank, and ``self._ranks`` (process -> rank): a process's rank is above those of the processes
            whose outputs it reads, so that running the ranks in order runs each once as the logic settles
            (pysim's delta cycles ran a process again whenever one more of its inputs settled, and ran
            every process woken in a delta cycle, the ones whose inputs were still to change included).
            The processes of a loop (each reads what the next drives, as two units' handshake logic may) share
            a rank; the ranks only order the work, `_settle` runs every woken process whatever they are."""
            state = self._state
            readers = {}                          # slot index -> the comb processes it wakes
            wanted = set(processes)
            for index, slot in enumerate(state.slots):
                for waker in slot.wakers:
                    name, process = _raised(waker)
                    if name == "comb_waker.<locals>.waker" and process in wanted:
                        readers.setdefault(index, set()).add(process)
            after = {p: set() for p in processes}  # process -> the processes that read what it drives
            for process, fragment in comb:
                if process not in wanted:
                    continue
                driven = SignalSet()
                for stmt in fragment.statements.get("comb", ()):
                    driven |= stmt._lhs_signals()
                if isinstance(fragment, MemoryInstance):
                    for port in fragment._read_ports:
                        if port._domain == "comb":
                            driven |= port._data._lhs_signals()
                for signal in driven:
                    after[process] |= readers.get(state.get_signal(signal), set())
            ranks = _ranks(processes, after)
            rank = max(ranks.values(), default=0)
            self._ranks = ranks
            return [set() for _ in range(rank + 1)]

        def _merge_wakers(self):
            # a signal read by many processes had a waker for each (one call per process at every change,
            # a few hundred changes a cycle, each call returning True to be kept): the ones that put a
            # combinational process in its bucket or mark a clocked one stale become the signal's *marks*,
            # (a set's add or update, its argument) pairs that the commit applies itself without calling a
            # waker; the signal keeps its other wakers (a clock edge's, a testbench's triggers). They only add
            # to sets, so their order among the signal's other wakers is free.
            home, self._marks = self._home, {}
            for slot in self._state.slots:
                if not isinstance(slot, _pysim._PySignalState):
                    continue
                targets, others = {}, []
                for waker in slot.wakers:
                    if hasattr(waker, "queues"):
                        target, process = home[waker.queues], waker.queues
                    elif hasattr(waker, "stales"):
                        target, process = waker.stales
                    else:
                        others.append(waker)
                        continue
                    targets.setdefault(id(target), (target, set()))[1].add(process)
                if targets:
                    self._marks[slot] = tuple((target.add, next(iter(processes))) if len(processes) == 1 else
                                              (target.update, frozenset(processes))
                                              for target, processes in targets.values())
                    slot.wakers[:] = others

        def _settle(self):
            """Commit what is pending (pysim's state.commit() without a waveform, its signals' commit and
            _run_wakers written in: ~90 signal changes a cycle), then run the woken combinational processes
            rank by rank, committing after each rank, until none is left; whether any signal or memory
            changed. A process woken at a rank already passed (a loop of processes) is taken on the next
            sweep."""
            buckets, pending, signal_state = self._buckets, self._state.pending, _pysim._PySignalState
            marks_of, changed, rank, ranks = self._marks.get, False, 0, len(self._buckets)
            while True:
                for slot in pending:
                    if type(slot) is signal_state:
                        curr, next = slot.curr, slot.next
                        if curr != next:
                            marks = marks_of(slot)
                            if marks is not None:
                                for mark, what in marks:
                                    mark(what)
                            wakers = slot.wakers
                            if wakers:
                                kept = 0
                                for waker in wakers:
                                    if waker(curr, next):
                                        wakers[kept] = waker
                                        kept += 1
                                del wakers[kept:]
                            slot.curr = next
                            changed = True
                    elif slot.commit():
                        changed = True
                pending.clear()
                while rank < ranks and not buckets[rank]:
                    rank += 1
                if rank == ranks:
                    if not any(buckets):
                        return changed
                    rank = 0                             # a loop of processes: sweep again
                    continue
                bucket = buckets[rank]
                batch = list(bucket)
                bucket.clear()
                for process in batch:
                    process.run()
                rank += 1

        def step_design(self):
            queue, others, triggers, edges = self._queue, self._processes, self._active_triggers, self._edges
            settle = self._settle
            converged = False
            while not converged:
                for trigger_state in triggers:
                    trigger_state.run()
                triggers.clear()
                for process in others:
                    if process.runnable:
                        process.runnable = False
                        process.run()
                # the clocked processes of the last edge, all together: each reads the values from before it
                batch = list(queue)
                queue.clear()
                for process in batch:
                    process.run()
                converged = not settle()
                if edges:
                    for stale in edges:
                        queue.update(stale)              # what raising each one's runnable flag does
                        stale.clear()
                    edges.clear()
                    converged = False
                self._delta_cycles += 1

        def write_rows(self, ctx, pairs):
            """Write each (``MemoryData`` row, word) of `pairs` as ``ctx.set`` would, then settle the design
            once (``ctx.set`` settles it after every word). For a testbench, between its awaits."""
            state = self._state
            for row, word in pairs:
                memory = state.slots[state.get_memory(row._memory)]
                memory.write(row._index, word, (1 << memory.shape.width) - 1)     # as wide as the row
            self.step_design()

        def read_rows(self, ctx, rows):
            """The words of ``MemoryData`` rows `rows` (valid indices), as ``ctx.get`` returns them.

            The rows a backend reads are the same list every time (a memory in order, or the scratchpad's
            banks interleaved): its plan, one slice of a memory's words per stretch of rows, is made once."""
            plan = self._read_plans.get(id(rows))
            if plan is None or plan[0] is not rows:
                plan = self._read_plans[id(rows)] = (rows, self._read_plan(rows))
            out = [0] * len(rows)
            for memory, positions, indices in plan[1]:
                out[positions] = memory.data[indices]
            return out

        def _read_plan(self, rows):
            """[(a memory's state, a slice of `rows`, the slice of its words they are)], covering `rows`."""
            state = self._state
            by_memory = {}
            for position, row in enumerate(rows):
                memory = state.slots[state.get_memory(row._memory)]
                by_memory.setdefault(id(memory), (memory, []))[1].append((position, row._index))
            plan = []
            for memory, pairs in by_memory.values():
                # cut into stretches where both the position and the index advance by a fixed step
                start = 0
                while start < len(pairs):
                    end = start + 1
                    if end < len(pairs):
                        dp, di = pairs[end][0] - pairs[start][0], pairs[end][1] - pairs[start][1]
                        while (end < len(pairs) and pairs[end][0] - pairs[end - 1][0] == dp
                               and pairs[end][1] - pairs[end - 1][1] == di and dp > 0 and di > 0):
                            end += 1
                    if end == start + 1:
                        dp = di = 1                     # a stretch of one row
                    (p0, i0), (p1, i1) = pairs[start], pairs[end - 1]
                    plan.append((memory, slice(p0, p1 + 1, dp), slice(i0, i1 + 1, di)))
                    start = end
            return plan

        def add_trigger_combination(self, combination, *, oneshot):
            # an inlined wire no longer changes: awaiting or sampling one is refused, naming it
            for trigger in combination._triggers:
                watched = getattr(trigger, "signal", None)
                watched = getattr(trigger, "value", None) if watched is None else watched
                if watched is None or not self._wires:
                    continue
                for signal in Value.cast(watched)._rhs_signals():
                    if signal in self._wires:
                        raise ValueError(f"SkipIdleEngine inlined the wire {signal.name!r}: a testbench that "
                                         f"awaits or samples it must name it in the engine's `keep`")
            return super().add_trigger_combination(combination, oneshot=oneshot)

        def get_value(self, expr):
            # a wire `_inline_wires` dropped is read as the value it stands for
            if self._wires:
                expr = _Replace(self._wires)(Value.cast(expr))
            return super().get_value(expr)

        def write_vcd(self, **kwargs):
            raise NotImplementedError("SkipIdleEngine records no waveform: use the stock engine (engine_class(vcd=True))")

        def reset(self):
            super().reset()
            for process in self._rtl:
                process.reset()                  # the comb ones queue themselves, as at the start
            # every signal and memory is back at its initial value without a waker seeing it
            for process, stale in self._guarded:
                stale.add(process)
            self._edges.clear()
