"""The reference machine: GA-2 executed one instruction at a time in plain Python (the oracle).

Contract: the final external memory, the final scratchpad and the five counters equal the chip's bit for
bit; each instruction costs ``hdl.isa.seq_cycles + hdl.isa.busy_cycles`` cycles (2 + B on the book's chip,
HALT 2; on a prefetch chip B, the run's first instruction and an error stop's HALT 2 more), so the counters
need no cycle loop.
Operands are the bits the hardware reads (``hdl.isa.operands``), arithmetic is ``hdl.arith``, and the
order of scratchpad reads and writes inside a unit follows its pipeline (hardware spec 4), so even a
legal-but-odd program (partially overlapping RQ/VADD/SM operands) gives what the chip gives.

Program ROM: the chip fetches ``rom[pc mod R]`` from an R-entry ROM (``config.rom_words``, 256 on the
book's chip) whose unused entries are zero. This machine mirrors it: a program that does not end with a
HALT runs into a zero word (a HALT) at ``pc = len(program)``, and a full R-word program without HALT
wraps to ``pc mod R`` and eventually runs out of cycles. Instructions are validated only when they are executed (words after the HALT are
never fetched by the chip either).
"""
from __future__ import annotations

from hdl.arith import (EXP_TABLE, SOFTMAX_NUM, argmax_first, divu, requant, s8, softmax_q16,
                       unpack_word, vadd_sat)
from hdl.config import BOOK, ChipConfig
from hdl.isa import (COUNTER_INDEX, COUNTER_OF, RESIDENT_OPS, ErrorKind, IsaError, Op, busy_cycles, issue_stop,
                     legal_ops, mm_fold_conflict, operands, resident_busy_cycles, resident_runs, row_groups, seq_cycles,
                     validate)
from hdl.isa import MM_RQ_OPS

from sim.backends import (MAX_CYCLES, Backend, BadInput, DidNotHalt, ErrorStop, RunResult, SimError,
                         TraceEntry, check_lat, check_max_cycles, image_words, program_words,
                         scratchpad_words)

__all__ = ["ReferenceMachine", "IllegalInstruction", "BadInput"]

_XA = 0xFFFF                # external addresses wrap at 16 bits
_W = 0xFFFFFFFF
_S8 = tuple(s8(b) for b in range(256))     # s8 of a low byte, as a table for the MM loops
_DEADBEEF = 0xDEADBEEF      # what the memory model answers past its end (hardware spec 6.3)

# the counter list's index for each opcode's busy cycles, from the ISA's one classification
_COUNTER = {op: COUNTER_INDEX[cls] for op, cls in COUNTER_OF.items()}


class IllegalInstruction(SimError):
    """An executed instruction has a field the chip cannot run as intended (message names pc and field)."""


class ReferenceMachine(Backend):
    """Instruction-level model of the GA-2 chip.

    Parameters
    ----------
    max_cycles : int
        A run whose cyc_total would pass this raises `DidNotHalt` (the book's testbench gives up
        after 100,000 cycles).
    trace : bool
        When true, `run` returns one `TraceEntry` per executed instruction, HALT included (its
        ``done`` equals its ``issue``: HALT has no WAIT cycle).
    check : bool
        When true (the default) every executed instruction goes through ``hdl.isa.validate`` and an
        illegal one raises `IllegalInstruction`. When false the machine does what the hardware does:
        addresses wrap, external reads past the end give 0xDEADBEEF, writes past the end are
        dropped, and a zero length or M/K/N hangs the book's chip (`DidNotHalt`) and stops any other
        (``hdl.isa.issue_stop``: the word is issued as a HALT and the result's ``error`` says why). An
        opcode the chip does not have hangs the book's chip and stops any other in both modes.
    config : hdl.config.ChipConfig
        The chip modelled (the book's by default): its scratchpad depth, program ROM, the MM unit's
        limits and cycle model, the counters' width.
    """
    name = "reference"

    def __init__(self, max_cycles: int = MAX_CYCLES, trace: bool = False, check: bool = True,
                 config: ChipConfig = BOOK):
        self.max_cycles = check_max_cycles(max_cycles)
        self.trace = trace
        self.check = check
        if not isinstance(config, ChipConfig):
            raise BadInput(f"config must be an hdl.config.ChipConfig, got {type(config).__name__}")
        self.config = config

    # ---- the run -----------------------------------------------------------------------------

    def run(self, program, image, lat: int = 8, scratchpad=None) -> RunResult:
        """Run `program` on a copy of `image` with external read latency `lat`; see the class doc.

        `scratchpad` is the scratchpad the run starts from (resident mode: what the previous run left,
        docs/resident.md): None for all zero, else ``config.spad_depth`` unsigned 32-bit words.
        """
        check_lat(lat)
        cfg = self.config
        rom = program_words(program)
        if len(rom) > cfg.rom_words:
            raise BadInput(f"the program has {len(rom)} instructions; the program ROM holds {cfg.rom_words}")
        rom_mask = cfg.rom_words - 1
        rom += [0] * (cfg.rom_words - len(rom))
        ext = image_words(image)
        n_ext = len(ext)
        sp = cfg.spad_depth - 1         # scratchpad addresses wrap at the depth (a power of two)
        spad = scratchpad_words(scratchpad, cfg.spad_depth) or [0] * cfg.spad_depth
        legal = set(legal_ops(cfg))
        error = None
        # the MM unit's output requantizer (docs/fused-rq.md): (m, s, relu), from reset at every run
        mm_rq = (0, 0, 0)
        counters = [0, 0, 0, 0, 0]
        trace = [] if self.trace else None
        check = self.check
        limit = self.max_cycles
        pc = 0
        issued = 0              # instructions issued so far (the first one is fetched and issued the book's way)
        last_issue = 0          # the cycle the last instruction was issued in
        while True:
            word = rom[pc & rom_mask]
            o = operands(word, cfg)
            op = o["op"]
            seq = seq_cycles(issued, cfg)
            if seq:
                fetch, issue = counters[0], counters[0] + 1
            else:
                # read ahead while the last instruction worked, issued in its done cycle (docs/prefetch.md)
                fetch, issue = last_issue, counters[0] - 1
            if op == Op.HALT:
                counters[0] += seq
                if counters[0] > limit:
                    raise DidNotHalt(f"did not halt within {limit} cycles (pc {pc}: HALT fetched at cycle {fetch})")
                if trace is not None:
                    trace.append(TraceEntry(pc, fetch, issue, issue, seq))
                break
            stop = None
            if op not in legal:
                if not cfg.generated:
                    # no unit answers: the sequencer waits forever while cyc_vec counts
                    raise DidNotHalt(f"did not halt within {limit} cycles (pc {pc}: illegal opcode {op})")
                stop = ErrorKind.OPCODE, op
            elif check:
                try:
                    validate(word, ext_words=n_ext, index=pc, cfg=cfg)
                except IsaError as e:
                    raise IllegalInstruction(str(e)) from None
            elif cfg.generated:
                stop = issue_stop(word, cfg)
            if stop is not None:
                # a chip other than the book's issues the word as a HALT with its error state set
                counters[0] += seq
                if counters[0] > limit:
                    raise DidNotHalt(f"did not halt within {limit} cycles (pc {pc}: an error stop issued at "
                                     f"cycle {issue})")
                if trace is not None:
                    trace.append(TraceEntry(pc, fetch, issue, issue, seq))
                error = ErrorStop(stop[0].label, pc, stop[1])
                break
            if not check:
                self._hang_check(o, pc, limit, cfg)
            if op in RESIDENT_OPS:
                # the data moves before the counters here: an error stop shortens the busy time
                error, runs, words = _resident(o, spad, ext, n_ext, sp)
                # the rows moved, in groups of the external port's width (docs/ext-port.md)
                busy = resident_busy_cycles(op, runs, row_groups(words >> o["row_log2"], o["row_log2"], cfg), lat)
                if error is not None:
                    error = ErrorStop(error[0], pc, error[1])
            else:
                busy = busy_cycles(word, lat, cfg)
            counters[0] += seq + busy
            if counters[0] > limit:
                raise DidNotHalt(f"did not halt within {limit} cycles (pc {pc}: {Op(op).name} "
                                 f"would end at cycle {counters[0]})")
            counters[_COUNTER[op]] += busy
            counters[4] += 1
            if trace is not None:
                trace.append(TraceEntry(pc, fetch, issue, issue + busy, seq))
            issued, last_issue = issued + 1, issue
            if op == Op.MM and not cfg.mm_pack:
                o["pb"] = 0         # bit 20 is read only on a chip with mm_pack = 1 (docs/mm-fast.md)
            if op == Op.MM:
                # bit 21 is read only on a chip with mm_pack_c = 1, where tb with pb reads B packed along k
                # (docs/mm-pack-c.md); elsewhere a packed B is never transposed (pb wins)
                o["pc"] = o["pc"] if cfg.mm_pack_c else 0
                o["tb"] = o["tb"] if cfg.mm_pack_c or not o["pb"] else 0
            if op in MM_RQ_OPS:
                mm_rq = (o["m"], o["s"], o["relu"])
            elif op == Op.MM and cfg.mm_rq and o["rq"]:
                _mm(o, spad, ext, n_ext, sp, mm_rq)
            elif op in (Op.RQ, Op.VADD) and cfg.vec_lanes > 1:
                _vector_lanes(o, spad, sp, cfg)
            elif op not in RESIDENT_OPS:
                _EXEC[op](o, spad, ext, n_ext, sp)
            pc = (pc + 1) & 0xFFFF
            if error is not None:
                # docs/resident.md: the next instruction acts as a HALT whatever the ROM holds
                fetch = counters[0]
                counters[0] += seq_cycles(issued, cfg, after_error=True)
                if counters[0] > limit:
                    raise DidNotHalt(f"did not halt within {limit} cycles (pc {pc}: the HALT of an error "
                                     f"stop fetched at cycle {fetch})")
                if trace is not None:
                    trace.append(TraceEntry(pc, fetch, fetch + 1, fetch + 1))
                break
        return RunResult(ext=ext, counters=[c & cfg.counter_mask for c in counters], scratchpad=spad,
                         trace=trace, error=error)

    @staticmethod
    def _hang_check(o, pc, limit, cfg):
        """Unchecked mode: the cases where the hardware never raises done (hardware spec 3.3)."""
        op = Op(o["op"])
        if op == Op.MM:
            if 0 in (o["M"], o["K"], o["N"]):
                raise DidNotHalt(f"did not halt within {limit} cycles (pc {pc}: MM with M, K or N = 0)")
            n, k = cfg.mm_max_mn, cfg.mm_max_k
            if o["M"] > n or o["N"] > cfg.mm_max_n or o["K"] > k or mm_fold_conflict(o["M"], o["N"], cfg):
                raise IllegalInstruction(f"instruction {pc} (MM): M={o['M']} K={o['K']} N={o['N']} "
                                         f"exceeds the {n}x{n} array / {k}-deep operand memories (not modelled)")
        elif op in RESIDENT_OPS or op in MM_RQ_OPS:
            pass                # no length: RQC always ends, and hi <= lo is an empty walk (no lookup, no word)
        elif o["len"] == 0:
            raise DidNotHalt(f"did not halt within {limit} cycles (pc {pc}: {op.name} with len = 0)")


# ---- one function per unit: (operands, scratchpad, external memory, EXT, scratchpad address mask) ----

def _ld(o, spad, ext, n_ext, sp):
    dst, src = o["dst"], o["src"]
    for k in range(o["len"]):
        a = (src + k) & _XA
        spad[(dst + k) & sp] = ext[a] if a < n_ext else _DEADBEEF


def _st(o, spad, ext, n_ext, sp):
    src, dst = o["src"], o["dst"]
    for k in range(o["len"]):
        a = (dst + k) & _XA
        if a < n_ext:
            ext[a] = spad[(src + k) & sp]


def _rq(o, spad, ext, n_ext, sp):
    # element k is read at the edge that writes element k-1: a read sees the writes of elements <= k-2
    dst, src, n, m, s, relu = o["dst"], o["src"], o["len"], o["m"], o["s"], o["relu"]
    out = []
    for k in range(n):
        if k >= 2:
            spad[(dst + k - 2) & sp] = out[k - 2]
        out.append(requant(spad[(src + k) & sp], m, s, relu) & _W)
    for k in range(max(0, n - 2), n):
        spad[(dst + k) & sp] = out[k]


def _vadd(o, spad, ext, n_ext, sp):
    # src1[k] is sampled with the writes of elements <= k-2 done, src2[k] with those <= k-1 done
    dst, s1, s2, n = o["dst"], o["src1"], o["src2"], o["len"]
    prev = None
    for k in range(n):
        x = spad[(s1 + k) & sp]
        if prev is not None:
            spad[(dst + k - 1) & sp] = prev
        y = spad[(s2 + k) & sp]
        prev = vadd_sat(x, y) & _W
    spad[(dst + n - 1) & sp] = prev


def _vector_lanes(o, spad, sp, cfg):
    """RQ or VADD on a chip with ``vec_lanes`` = l > 1 (docs/vec-lanes.md): G = ceil(len/l) groups of l
    consecutive elements (the last one shorter), one group read a cycle and written `lag` cycles later, so
    the reads of group g see the writes of groups <= g - lag: lag = 2 (VADD, both sources; RQ), 3 (RQ with
    the requantizer's pipeline register). Within a group every read comes before every write."""
    l, n, dst = cfg.vec_lanes, o["len"], o["dst"]
    if o["op"] == Op.RQ:
        lag = 2 + cfg.rq_pipe
        m, s, relu, src = o["m"], o["s"], o["relu"], o["src"]

        def compute(k):
            return requant(spad[(src + k) & sp], m, s, relu) & _W
    else:
        lag = 2
        s1, s2 = o["src1"], o["src2"]

        def compute(k):
            return vadd_sat(spad[(s1 + k) & sp], spad[(s2 + k) & sp]) & _W
    groups = [range(g * l, min(g * l + l, n)) for g in range(-(-n // l))]
    out = {}

    def write(g):
        for k in groups[g]:
            spad[(dst + k) & sp] = out[k]
    for g, group in enumerate(groups):
        if g >= lag:
            write(g - lag)
        out.update({k: compute(k) for k in group})
    for g in range(max(0, len(groups) - lag), len(groups)):
        write(g)


def _amax(o, spad, ext, n_ext, sp):
    # the index is written once, after every element has been read
    src, n = o["src"], o["len"]
    spad[o["dst"]] = argmax_first([spad[(src + k) & sp] for k in range(n)])


def _sm(o, spad, ext, n_ext, sp):
    dst, src, n = o["dst"], o["src"], o["len"]
    xs = [spad[(src + k) & sp] for k in range(n)]
    d = (dst - src) & sp
    if d == 0 or n <= d <= sp + 1 - n:
        # in place or disjoint: pass 2 reads exactly the scores pass 1 read
        p = softmax_q16(xs)
        for k in range(n):
            spad[(dst + k) & sp] = p[k]
    else:
        _sm_partial_overlap(dst, src, n, xs, spad, sp)


def _sm_partial_overlap(dst, src, n, xs, spad, sp):
    """SM whose dst partially overlaps src: pass 2 re-reads scores it may already have overwritten.

    Pass 1 only reads (the maximum comes from the clean scores); pass 2 reads element k after the
    exponentials of elements <= k-2 were written; pass 3 rewrites dst in place, which is exact.
    """
    m = max(s8(x) for x in xs)
    e = []
    total = 0
    for k in range(n):
        if k >= 2:
            spad[(dst + k - 2) & sp] = e[k - 2]
        e.append(EXP_TABLE[(m - s8(spad[(src + k) & sp])) & 0xFF])
        total = (total + e[k]) & _W
    for k in range(max(0, n - 2), n):
        spad[(dst + k) & sp] = e[k]
    r, _ = divu(SOFTMAX_NUM, total, 40)
    for k in range(n):
        a = (dst + k) & sp
        spad[a] = (((spad[a] & 0xFFFF) * r + (1 << 21)) >> 22) & 0x1FFFF


def _unpack(o, spad, ext, n_ext, sp):
    # word i is read before any nibble of word i is written and after all of word i-1's
    dst, src = o["dst"], o["src"]
    for i in range(o["len"]):
        base = dst + 8 * i
        for j, v in enumerate(unpack_word(spad[(src + i) & sp])):
            spad[(base + j) & sp] = v & _W


def _mm(o, spad, ext, n_ext, sp, rq=None):
    # every operand is staged in the operand memories before the first result is written; with `rq`,
    # (m, s, relu) of the MM unit's output requantizer, each element is written requantized (an MM with
    # rq = 1 on a chip with mm_rq = 1, docs/fused-rq.md)
    dst, A, B, lda, ldb, ldc = o["dst"], o["A"], o["B"], o["lda"], o["ldb"], o["ldc"]
    M, K, N, tb = o["M"], o["K"], o["N"], o["tb"]
    a = [[_S8[spad[(A + i * lda + k) & sp] & 0xFF] for k in range(K)] for i in range(M)]
    if o["pb"] and tb:
        # packed and transposed (an mm_pack_c chip, docs/mm-pack-c.md): byte k % 4 of word B + j*ldb + k // 4
        b = [[_S8[(spad[(B + j * ldb + (k >> 2)) & sp] >> (8 * (k & 3))) & 0xFF] for k in range(K)]
             for j in range(N)]
    elif o["pb"]:
        # packed (docs/mm-fast.md): byte j % 4 of word B + k*ldb + j // 4; tb is not read
        b = [[_S8[(spad[(B + k * ldb + (j >> 2)) & sp] >> (8 * (j & 3))) & 0xFF] for k in range(K)]
             for j in range(N)]
    elif tb:
        b = [[_S8[spad[(B + j * ldb + k) & sp] & 0xFF] for k in range(K)] for j in range(N)]
    else:
        b = [[_S8[spad[(B + k * ldb + j) & sp] & 0xFF] for k in range(K)] for j in range(N)]
    for i in range(M):
        ai = a[i]
        row = dst + i * ldc
        out = [sum(x * y for x, y in zip(ai, bj)) for bj in b]
        out = [(c if rq is None else requant(c, *rq)) & _W for c in out]
        if o["pc"]:
            # packed C (docs/mm-pack-c.md): byte j % 4 of word row + j // 4 is the low byte of what the
            # unpacked MM writes at row + j; each of the row's ceil(N/4) words whole, bytes past N zero
            for w in range(0, N, 4):
                spad[(row + (w >> 2)) & sp] = sum((c & 0xFF) << (8 * s) for s, c in enumerate(out[w:w + 4]))
        else:
            for j in range(N):
                spad[(row + j) & sp] = out[j]


def _resident(o, spad, ext, n_ext, sp):
    """GATHER or SCATTER (docs/resident.md): walk the block table run by run.

    Returns ``(error, runs, words)``: error is None or ``(kind, info)`` of the error stop; runs is the
    number of table lookups made (the failing one included) and words the words moved, which is what
    the cycle model needs (`hdl.isa.resident_busy_cycles`). The runs before a failing one are moved
    completely, nothing of it or after it.
    """
    gather = o["op"] == Op.GATHER
    spad0, table, table_len, base = o["spad"], o["table"], o["table_len"], o["base"]
    page_log2, lo, row_log2, pool_pages = o["page_log2"], o["lo"], o["row_log2"], o["pool_pages"]
    row_words = 1 << row_log2
    in_page = (1 << page_log2) - 1
    runs = words = 0
    for index, first, rows in resident_runs(lo, o["hi"], page_log2):
        runs += 1
        if index >= table_len:
            return ("row", index), runs, words
        page = spad[(table + index) & sp]
        if page >= pool_pages:
            return ("page", page), runs, words
        for r in range(first, first + rows):
            s = spad0 + ((r - lo) << row_log2)
            e = base + (((page << page_log2) | (r & in_page)) << row_log2)
            for w in range(row_words):
                a = (e + w) & _XA
                if gather:
                    spad[(s + w) & sp] = ext[a] if a < n_ext else _DEADBEEF
                elif a < n_ext:
                    ext[a] = spad[(s + w) & sp]
        words += rows << row_log2
    return None, runs, words


_EXEC = {Op.LD: _ld, Op.ST: _st, Op.MM: _mm, Op.RQ: _rq, Op.SM: _sm, Op.VADD: _vadd,
         Op.AMAX: _amax, Op.UNPACK: _unpack}
