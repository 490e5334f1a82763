"""Mutation testing (issue 6): one-line broken versions of the host, the hardware and the compiler, each
run against the tests that should notice it, in a throw-away copy of the project (the work tree is never
touched).

Contract: ``python -m sim.mutants [--only KIND] [--jobs N] [--list] [--timeout S]`` first runs
the union of the chosen mutants' checks on an unmutated copy (exit 1 if that fails), then every mutant:
copy the tree (no .git, no build products), replace its anchor (which must occur exactly once in its file),
run ``pytest -x -q -p no:cacheprovider <checks>`` there with PYTHONPATH on the copy and a time limit, and
give one verdict per mutant:

- ``caught``: pytest exited 1 because a test failed in its body, with no error in collection, import,
  setup or teardown: on an assertion (``assert``, ``pytest.fail``, a ``pytest.raises`` that saw nothing
  raised), or on an exception that the mutated code raised into the test (named in the verdict's detail,
  and counted apart in the summary);
- ``INCONCLUSIVE``: anything else that is not a pass -- the time limit, a collection or import error, an
  error outside a test's body, a test that died of an exception saying the code could not be run at all
  (`NOT_A_VERDICT`: syntax and import errors, a model that cannot be built, a time-out or memory error
  inside the test), pytest exit 2-5 or a signal, an anchor that cannot be applied, an equivalence that
  is claimed but not shown;
- ``SURVIVED``: every check passed;
- ``EQUIVALENT``: every check passed, and the mutant's `shown_by` test, run on the unmutated copy first,
  demonstrates that the mutated and the original code give the same outputs.

How each test ended is recorded by a small pytest plugin (`PROBE_SOURCE`) loaded into the checks' run, not
parsed from pytest's text. The last line counts the four verdicts; the exit status is 0 only when nothing
is inconclusive and nothing survived.

Nothing is written into the work tree or its build/: every run (the baseline and each mutant) gets its own
$GA2_BUILD_DIR inside its copy, seeded with a copy of the cached Verilator models (the model key covers the
hdl/ sources, the driver and the flags, so a mutant of any of them builds its own model there).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Mutant", "Outcome", "MUTANTS", "KINDS", "PROJECT_ROOT", "anchor_problem", "mutated_source",
           "copy_project", "project_build_dir", "run_checks", "run_mutant", "mutant_task", "baseline", "main"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
KINDS = ("host", "hdl", "compiler", "sim")
DEFAULT_TIMEOUT = 300.0
# Never copied: version control, build products and caches (a copy gets its own).
_IGNORE = shutil.ignore_patterns(".git", "build", "out", "__pycache__", ".pytest_cache", ".hypothesis",
                                 ".benchmarks", "*.egg-info", "*.vcd", "*.pyc")


@dataclass(frozen=True)
class Mutant:
    """One broken version of the project: a single-line text replacement in one source file.

    Parameters
    ----------
    kind : str
        ``host``, ``hdl``, ``compiler`` or ``sim`` (the reference machine and the comparisons that
        judge the simulators; what ``--only`` selects).
    file : str
        Path of the mutated file, relative to the project root.
    anchor : str
        Text that must occur exactly once in `file`, on one line.
    replacement : str
        What replaces `anchor` (one line as well).
    description : str
        What is broken, in words.
    checks : tuple of str
        Test files or pytest node ids (relative to the root) that must notice the change.
    equivalent : str or None
        When set, the argument that the mutant cannot be told apart from the original (the reason).
    shown_by : str or None
        With `equivalent`: the pytest node id of a test that demonstrates the equivalence by running the
        original and the mutated code (built with `mutated_source`) on an exhaustive or large random
        domain, or by a formal proof. An equivalence without it is inconclusive.
    """
    kind: str
    file: str
    anchor: str
    replacement: str
    description: str
    checks: tuple
    equivalent: str | None = None
    shown_by: str | None = None


def _m(kind, file, anchor, replacement, description, *checks, equivalent=None, shown_by=None):
    return Mutant(kind, file, anchor, replacement, description, tuple(checks), equivalent, shown_by)


PT, WIN, PAGED, LM = "host/pagetable.py", "host/window.py", "host/paged.py", "host/tiny_lm.py"
T_PT = "tests/test_pagetable.py"
T_EDGES = "tests/test_engine_edges.py"
# two lines of host/engine.py several mutants replace: the prefix hash, and the recency stamp of a released page
_HASH = """return hashlib.sha256(f"{parent}|{','.join(map(str, toks))}|W={W}|S={S}".encode()).hexdigest()[:16]"""
_STAMP = "if p is not None and p not in after and p in self.page_hash and self.pt.refcount(p) == 0:"
T_WIN = "tests/test_window.py"
T_HOST = "tests/test_paged_host.py"
T_LM = "tests/test_tiny_lm.py"
T_COMP = "tests/test_compiler.py"

MUTANTS: tuple[Mutant, ...] = (
    # ---- host: the 18 mutants of model spec 5.7, in its order --------------------------------------
    _m("host", PT, "            self._free.append(p)", "            pass",
       "page table: a page freed by its last owner is not returned to the free list", T_PT),
    _m("host", PT, "if self._ref[p] == 0 and", "if self._ref[p] <= 1 and",
       "page table: a freed page is put on the free list while others still share it", T_PT),
    _m("host", PT, "            self._ref[p] += 1", "            pass",
       "page table: fork does not count the new owner", T_PT),
    _m("host", PT, "elif self._ref[t[-1]] > 1 or", "elif False or",
       "page table: no copy before writing into a shared page", T_PT),
    _m("host", PT, "self._pool[q][:] = self._pool[shared]", "self._pool[q][:] = [None] * self._page",
       "page table: the copy-on-write copy is empty", T_PT),
    _m("host", PT, "            self._drop(shared)", "            pass",
       "page table: the copy keeps the shared page's reference", T_PT),
    _m("host", PT, "off = i % self._page", "off = i % (self._page + 1)",
       "page table: the in-page offset is taken modulo page+1", T_PT),
    _m("host", PT, "self._pool[t[i // P - d]][i % P]", "self._pool[t[i // P]][i % P]",
       "page table: the block-table lookup ignores pages already dropped", T_PT),
    _m("host", PT, "(self._dropped[rid] + 1) * self._page <= keep_from",
       "(self._dropped[rid] + 1) * self._page <= keep_from + 1",
       "page table: trim releases a page that still holds the row at keep_from", T_PT),
    _m("host", PT, "(self._dropped[rid] + 1) * self._page <= keep_from",
       "(self._dropped[rid] + 2) * self._page <= keep_from",
       "page table: trim keeps a page that lies completely before the window", T_PT),
    _m("host", PT, "            self._drop(p)", "            pass",
       "page table: release forgets the request's table without dropping its page references", T_PT),
    _m("host", PT, 'raise OutOfPages(f"no free page', 'self._free.append(0); (f"no free page',
       "page table: an empty free list hands out page 0 instead of raising OutOfPages", T_PT),
    _m("host", LM, "kc, vc = kc[len(kc) - (W - 1):], vc[len(vc) - (W - 1):]",
       "kc, vc = kc[len(kc) - W:], vc[len(vc) - W:]",
       "window: the float reference keeps W previous rows, not W-1",
       T_WIN + "::test_5b_windowed_step_equals_recomputation", T_LM, T_HOST),
    _m("host", WIN, "return L if W is None else min(L, W)", "return L if W is None else min(L, W + 1)",
       "window: the chip's context is min(L, W+1)", T_WIN, T_HOST),
    _m("host", PAGED, "rows = pt.rows(0, lo, hi) if self.paged", "rows = pt.rows(0, lo + 1, hi) if self.paged",
       "host: the paged gather starts one row late (the plain-list path is unchanged)",
       # a test that decodes in its body: the module fixture of the others would turn the failure into an
       # error in their setup, which is inconclusive
       T_HOST + "::test_32_step_decodes"),
    _m("host", PAGED, "            pt.append(0, row)", "            pt.append(0, row[::-1])",
       "host: the paged gather returns values where keys belong (the plain-list path is unchanged)", T_HOST),
    _m("host", PAGED, "                pt.trim(0, trim_point(L, self.W))", "                pass",
       "host: pages outside the window are never released", T_HOST),
    _m("host", WIN, "return 0 if W is None else max(0, L + 1 - W)", "return 0 if W is None else max(0, L - W)",
       "host: the trim point is one token too late", T_WIN, T_HOST),

    # ---- hardware: the Amaranth blocks ---------------------------------------------------------------
    _m("hdl", "hdl/requant.py", "m.d.comb += shifted.eq(biased >> shift)",
       "m.d.comb += shifted.eq((biased >> shift) - ((((p + half) & (one_s - 1)) == 0) & (shift != 0)"
       " & ~neg & (biased >> shift)[0]))",
       "requantizer: positive ties round half to even instead of away from zero", "tests/test_requant.py"),
    _m("hdl", "hdl/requant.py", "m.d.comb += half.eq(one_s[1:])", "m.d.comb += half.eq(0)",
       "requantizer: the rounding half is dropped (truncation)", "tests/test_requant.py"),
    _m("hdl", "hdl/requant.py", "m.d.comb += biased.eq(p + half - (neg & (shift != 0)))",
       "m.d.comb += biased.eq(p + half)",
       "requantizer: negative ties round toward zero (the -1 of the signed floor is missing)",
       "tests/test_requant.py"),
    _m("hdl", "hdl/requant.py", "self.q.eq(Mux(relu & q[7], 0, q))", "self.q.eq(Mux(relu & q[7], -1, q))",
       "requantizer: relu clamps negatives at -1 instead of 0", "tests/test_requant.py"),
    _m("hdl", "hdl/exp_lut.py", "init=EXP_TABLE)", "init=[e + (d == 40) for d, e in enumerate(EXP_TABLE)])",
       "exp table: entry 40 is one too large", "tests/test_exp_lut.py"),
    _m("hdl", "hdl/divider.py", "cnt.eq(w // self._bits), self.busy.eq(1)]", "cnt.eq(w // self._bits - 1), self.busy.eq(1)]",
       "divider: runs 39 iterations instead of 40", "tests/test_divider.py"),
    _m("hdl", "hdl/units/ld.py", "return self.recvd == n - 1", "return self.recvd == n - 2",
       "DMA: the LD engine finishes one response early (its last word is never written)", "tests/test_dma.py"),
    _m("hdl", "hdl/units/ld.py", "spad.waddr.eq(base + self.recvd)", "spad.waddr.eq(base + self.issued)",
       "DMA: a word is written at the request count, not the response count", "tests/test_dma.py"),
    _m("hdl", "hdl/units/mm.py", 'lane_of = read_at(rd[i], t - i, f"k_feed{i}")',
       'lane_of = read_at(rd[i], t - i - (i == 2), f"k_feed{i}")',
       "MM: the systolic skew of A row 2 and B column 2 is one cycle late", "tests/test_unit_mm.py"),
    _m("hdl", "hdl/units/mm.py", "step = Mux(tb, 1, ldb)", "step = Mux(tb, ldb, ldb)",
       "MM: the transposed B operand advances k by ldb instead of 1 (wrong stride)", "tests/test_unit_mm.py"),
    _m("hdl", "hdl/units/amax.py", "(self.spad.rdata.as_signed() > best)", "(self.spad.rdata.as_signed() >= best)",
       "AMAX: keeps the last maximum on ties", "tests/test_units_simple.py"),
    _m("hdl", "hdl/units/vadd.py", "Mux(total > 127, 127,", "Mux(total > 128, 127,",
       "VADD: saturates at 128 (a sum of 128 wraps to -128)", "tests/test_units_simple.py"),
    _m("hdl", "hdl/units/vadd.py", "m.d.comb += fwd.eq(gap == 0)", "m.d.comb += fwd.eq(0)",
       "VADD with two read ports: no forwarding when dst = src2 + 1 (src2[k] misses element k-1's write)",
       "tests/test_vadd_ports.py"),
    _m("hdl", "hdl/chip.py", "if (ops := [op for op in answered if COUNTER_OF[op] == cls])}",
       "if (ops := [op for op in answered if COUNTER_OF[op] == cls or (cls, op) == ('mm', Op.RQ)])}",
       "sequencer: a WAIT cycle of an RQ is counted as MM", "tests/test_chip_amaranth.py"),
    # error stops on a generated chip (docs/error-stop.md)
    _m("hdl", "hdl/chip.py", "m.d.comb += launch.eq(go & ~stop)", "m.d.comb += launch.eq(go)",
       "sequencer: a word the chip stops on still starts its unit (which runs on after the HALT)",
       "tests/test_error_stop.py::test_rtl_equals_the_reference"),
    _m("sim", "hdl/isa.py", 'return {"M": (1, cfg.mm_max_mn), "K": (1, cfg.mm_max_k), "N": (1, cfg.mm_max_n)}',
       'return {"M": (1, cfg.mm_max_mn), "K": (1, cfg.mm_max_k + 1), "N": (1, cfg.mm_max_n)}',
       "issue limits: an MM with K one past the operand memories is run instead of stopped",
       "tests/test_error_stop.py::test_issue_stop_kinds"),
    _m("hdl", "hdl/units/mm.py", "self.spad.wdata.eq(Mux(opr.rq, rq.q, c_out))",
       "self.spad.wdata.eq(Mux(opr.rq, rq.q.as_unsigned(), c_out))",
       "MM with rq: the int8 result is zero-extended instead of sign-extended",
       "tests/test_fused_rq.py::test_mm_unit_requantizes_its_output"),
    _m("hdl", "hdl/chip.py", "dec.d.comb += units[Op.MM].rqc.eq(launch & (opcode == Op.RQC))",
       "dec.d.comb += units[Op.MM].rqc.eq(launch & (opcode == Op.MM))",
       "sequencer: the MM unit's requantizer registers are loaded at an MM instead of an RQC",
       "tests/test_fused_rq.py::test_directed_program_on_the_amaranth_chip_equals_the_reference"),
    _m("sim", "sim/backends/reference.py", 'mm_rq = (o["m"], o["s"], o["relu"])', 'mm_rq = (o["m"], o["s"], 0)',
       "reference: RQC drops its relu", "tests/test_fused_rq.py::test_fused_mm_equals_mm_then_rq_on_the_reference"),
    # the faster MM unit (docs/mm-fast.md)
    _m("hdl", "hdl/units/mm.py", "(1 + c_b_i if cfg.mm_bcast else 2)", "(1 + c_b_i if cfg.mm_bcast else 1)",
       "MM overlapped: the array starts a cycle before the last k's operands are staged",
       "tests/test_mm_fast.py::test_unit_equals_golden_and_cycle_model"),
    _m("hdl", "hdl/units/mm.py", "return words[(i // 4) % L][8 * (i % 4):8 * (i % 4) + 8].as_signed(), i // (4 * L)",
       "return words[(i // 4) % L][8 * (3 - i % 4):8 * (3 - i % 4) + 8].as_signed(), i // (4 * L)",
       "MM with pb (both schedules: packed_column): the bytes of a packed word are taken in reverse order",
       "tests/test_mm_fast.py::test_unit_equals_golden_and_cycle_model"),
    _m("hdl", "hdl/units/mm.py", "b_grp = Mux(pb, g_d == group, b_grp)", "b_grp = Mux(pb, g_d == i // L, b_grp)",
       "MM with pb (overlapped): a packed column is staged in the group of an unpacked one (4L columns a group forgotten)",
       "tests/test_mm_fast.py::test_unit_equals_golden_and_cycle_model"),
    _m("sim", "sim/backends/reference.py", ">> (8 * (j & 3))) & 0xFF] for k in range(K)]",
       ">> (8 * (3 - (j & 3)))) & 0xFF] for k in range(K)]",
       "reference: the bytes of a packed B word are taken in reverse order",
       "tests/test_mm_fast.py::test_reference_packed_equals_unpacked"),
    _m("sim", "hdl/isa.py", "return (K - 1) * c + max(3 + skew, c - 1) + M * g + 1",
       "return (K - 1) * c + max(3 + skew, c - 1) + M * g + 2",
       "cycle model: an overlapped MM costs one cycle more than the unit takes",
       "tests/test_mm_fast.py::test_mm_busy_cycles"),
    # the requantizer's pipeline register (docs/rq-pipe.md)
    _m("hdl", "hdl/units/rq.py", "we, waddr = wv, dst + wj", "we, waddr = v, dst + j",
       "RQ with rq_pipe: the write is not delayed with the requantizer (each word gets its predecessor's q)",
       "tests/test_units_simple.py::test_rq_matches_golden_requant"),
    _m("hdl", "hdl/units/rq.py", "m.d.sync += [fwd.eq((gap == 0) & wv), last.eq(rq.q)]",
       "m.d.sync += [fwd.eq(0), last.eq(rq.q)]",
       "RQ with rq_pipe: no forwarding when dst = src + 2 (src[k] misses element k-2's write)",
       "tests/test_units_simple.py::test_rq_overlapping_operands_give_the_book_result"),
    _m("sim", "hdl/isa.py", "return -(-n // cfg.vec_lanes) + 2 + RQ_PIPE_CYCLES * cfg.rq_pipe",
       "return -(-n // cfg.vec_lanes) + 2",
       "cycle model: an RQ on an rq_pipe chip costs the book's len + 2 (one cycle less than the unit takes)",
       "tests/test_units_simple.py::test_rq_matches_golden_requant"),
    _m("hdl", "hdl/units/mm.py", 'm.next = "LAST"', "self.finish(m)",
       "MM overlapped with rq_pipe: a fused MM finishes with its last element still in the requantizer",
       "tests/test_fused_rq.py::test_mm_unit_requantizes_its_output"),
    _m("hdl", "hdl/chip.py", "st.eq(SeqState.ISSUE)]", "st.eq(SeqState.WAIT), cur.eq(self.imem_data[124:128])]",
       "sequencer: skips the ISSUE cycle (FETCH goes straight to WAIT, no unit is started)",
       "tests/test_chip_amaranth.py"),
    # the SM unit's divider, several bits a cycle (docs/sm-div.md)
    _m("hdl", "hdl/divider.py", "n_in = n_in << 1", "n_in = n_in",
       "divider with bits > 1: every chained step takes the same numerator bit",
       "tests/test_divider.py::test_several_bits_a_cycle_against_golden"),
    _m("sim", "hdl/isa.py", "return 3 * n + 7 + SM_DIV_WIDTH // cfg.sm_div", "return 3 * n + 7 + SM_DIV_WIDTH",
       "cycle model: an SM on an sm_div chip costs the book's 3n + 47", "tests/test_sm_div.py::test_cycle_table"),
    # a packed C and a packed transposed B (docs/mm-pack-c.md)
    _m("hdl", "hdl/units/mm.py", "b_row = Mux(tb, Mux(pk, ks[:2] == 3, 1), ldb)",
       "b_row = Mux(tb, Mux(pk, ks[:2] == 2, 1), ldb)",
       "MM with tb and pb (mm_pack_c): the packed transposed B moves to its next word after every third k",
       "tests/test_mm_pack_c.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/units/mm.py", "Mux(pos > j, held[8 * j:8 * j + 8], 0)", "held[8 * j:8 * j + 8]",
       "MM with pc: the bytes past a row's last element are not zeroed (an earlier word's bytes)",
       "tests/test_mm_pack_c.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/units/mm.py", "ends.eq((pos == 3) | (n_e == opr.N - 1))", "ends.eq(pos == 3)",
       "MM with pc: a row's partial last word (N % 4 != 0) is never written",
       "tests/test_mm_pack_c.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/units/mm.py", "n_e = Mux(opr.rq, ni_d, ni)", "n_e = ni",
       "MM with pc and rq_pipe: the element's column is not delayed with the piped requantizer",
       "tests/test_mm_pack_c.py::test_unit_equals_reference_and_cycle_model"),
    _m("sim", "sim/backends/reference.py", ">> (8 * (k & 3))) & 0xFF] for k in range(K)]",
       ">> (8 * (3 - (k & 3)))) & 0xFF] for k in range(K)]",
       "reference: the bytes of a packed transposed B word are taken in reverse order",
       "tests/test_mm_pack_c.py::test_reference_matches_numpy"),
    _m("sim", "sim/backends/reference.py", "spad[(row + (w >> 2)) & sp] = sum((c & 0xFF) << (8 * s)",
       "spad[(row + (w >> 2)) & sp] = sum((c & 0xFF) << (8 * (3 - s))",
       "reference: the bytes of a packed C word are written in reverse order",
       "tests/test_mm_pack_c.py::test_reference_matches_numpy"),
    _m("sim", "hdl/isa.py", "along_n = pb and not (tb and cfg.mm_pack_c)", "along_n = pb",
       "cycle model: a packed transposed B (mm_pack_c) is counted as read packed along n (ceil(ceil(N/4)/L) "
       "groups a k)", "tests/test_mm_pack_c.py::test_cycles"),
    # drain lanes and the banked scratchpad (docs/spad-lanes.md)
    _m("hdl", "hdl/scratchpad.py", 'rd = bank.read_port(domain="sync", transparent_for=())',
       'rd = bank.read_port(domain="sync", transparent_for=(wr,))',
       "banked scratchpad: a bank's read port forwards the same edge's write (not read-before-write)",
       "tests/test_spad_lanes.py::test_banks_every_alignment_read_before_write"),
    _m("hdl", "hdl/chip.py", "m.d.comb += sp.we_x.eq(port.we_x)", "pass",
       "PortOwner: the MM unit's write lanes past 0 never reach the banked scratchpad",
       "tests/test_spad_lanes.py::test_program_on_the_amaranth_chip_equals_the_reference"),
    _m("hdl", "hdl/units/mm.py", "late_i.eq(3 + N_i - ", "late_i.eq(2 + N_i - ",
       "MM with drain lanes: the first group goes out a cycle early (row 0's last column not yet final)",
       "tests/test_spad_lanes.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/units/mm.py", "m.d.comb += [valid[i].eq(n_e + i < opr.N) for i in range(1, lanes)]",
       "m.d.comb += [valid[i].eq(n_e + i <= opr.N) for i in range(1, lanes)]",
       "MM with drain lanes: a row's partial last group writes one lane past N",
       "tests/test_spad_lanes.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/units/mm.py", "ends.eq((pos == 4 - lanes) | (n_e + lanes >= opr.N))", "ends.eq(pos == 4 - lanes)",
       "MM with drain lanes and pc: a row's partial last word (a first half only) is never written",
       "tests/test_spad_lanes.py::test_unit_equals_reference_and_cycle_model"),
    _m("sim", "hdl/isa.py", "skew = groups_b - 1 if cfg.mm_bcast else N - g", "skew = groups_b - 1 if cfg.mm_bcast else 0",
       "cycle model: drain lanes start writing when one lane would (the later last column ignored)",
       "tests/test_spad_lanes.py::test_formula_is_the_schedule"),
    # the broadcast array (docs/mm-bcast.md)
    _m("hdl", "hdl/systolic.py", "a_in = self.a_edge[i] if j == 0 or self._bcast else a_out[pe - 1]",
       "a_in = self.a_edge[i] if j == 0 else a_out[pe - 1]",
       "broadcast array: A passed along the row again, through pass-through registers it no longer has",
       "tests/test_mm_bcast.py::test_array_row_is_final_at_once"),
    _m("hdl", "hdl/units/mm.py", "fed[i][1], 0)),", "fed[i][1], 0)) if not cfg.mm_bcast else array.b_edge[i].eq(0),",
       "broadcast array: B never reaches the columns (the feed's B lanes held at 0)",
       "tests/test_mm_bcast.py::test_program_on_the_amaranth_chip_equals_the_reference"),
    _m("hdl", "hdl/units/mm.py", "(1 + c_b_i if cfg.mm_bcast else 2)", "(2 if cfg.mm_bcast else 2)",
       "broadcast array: the array starts before B's last group of a k is staged (cB > 1)",
       "tests/test_mm_bcast.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/units/mm.py", "late = 2 + groups_b if cfg.mm_bcast", "late = 3 if cfg.mm_bcast",
       "broadcast array: the completion monitor's busy time without B's later start",
       "tests/test_mm_bcast.py::test_unit_equals_reference_and_cycle_model"),
    _m("sim", "hdl/isa.py", "skew = groups_b - 1 if cfg.mm_bcast else N - g", "skew = N - g",
       "cycle model: the broadcast array still waits for the row's last column",
       "tests/test_mm_bcast.py::test_formula_is_the_schedule"),
    # the folded MM (docs/mm-fold.md)
    _m("hdl", "hdl/systolic.py", "b_in = Mux(self.fold, self.b_fold[j], b_in)", "b_in = Mux(self.fold, b_in, b_in)",
       "folding array: the middle row keeps taking B from the row above (the second column group never enters)",
       "tests/test_mm_fold.py::test_array_folds_the_second_column_group"),
    _m("hdl", "hdl/units/mm.py", "row = Cat(mi[:lg - 1], mi[lg - 1] | ni[lg])", "row = mi[:lg]",
       "folded MM: the drain reads the columns past the array from the upper rows",
       "tests/test_mm_fold.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/units/mm.py", "m.d.comb += [array.a_edge[h + i].eq(a_row[i]) for i in range(h)]",
       "m.d.comb += [array.a_edge[h + i].eq(0) for i in range(h)]",
       "folded MM: the lower rows get no A (the second column group is all zeros)",
       "tests/test_mm_fold.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/chip.py", "above.append((fields[\"N\"] > cfg.array) & (fields[\"M\"] > cfg.array // 2))",
       "above.append((fields[\"N\"] > cfg.array) & (fields[\"M\"] > cfg.array))",
       "folding chip: a wide MM of more than half the rows is issued instead of stopping with RANGE",
       "tests/test_mm_fold.py::test_a_wide_mm_with_too_many_rows_stops_the_amaranth_chip"),
    _m("sim", "hdl/isa.py", "return bool(cfg.mm_fold) and N > cfg.array and M > cfg.array // 2",
       "return bool(cfg.mm_fold) and N > cfg.array and M > cfg.array",
       "ISA: a wide MM of more than half the array's rows is legal",
       "tests/test_mm_fold.py::test_a_wide_mm_needs_half_the_rows"),
    _m("compiler", "compiler/emit.py",
       "return config.mm_max_n if rows <= config.mm_max_mn // 2 else config.mm_max_mn", "return config.mm_max_mn",
       "compiler: a folding chip still gets tiles of the array's width only",
       "tests/test_mm_fold.py::test_compiler_emits_wide_tiles"),
    _m("compiler", "compiler/emit.py", "return min((tile, tile // 2), key=cost)", "return tile",
       "compiler: a wide matmul of more than half the array's rows is not cut into halves (its tiles cannot fold)",
       "tests/test_mm_fold.py::test_compiler_emits_wide_tiles"),
    _m("compiler", "compiler/emit.py", "return min((tile, tile // 2), key=cost)", "return tile // 2",
       "compiler: a wide matmul's rows are halved even where the cycle model says it costs more (unpacked B)",
       "tests/test_mm_fold.py::test_rows_are_halved_only_when_the_cycle_model_says_so"),
    # ---- the external port of ext_port words (docs/ext-port.md) ---------------------------------------
    _m("hdl", "hdl/units/ld.py", "lane_valid = Cat(first + j < len_r for j in range(1, P))",
       "lane_valid = Cat(first + j <= len_r for j in range(1, P))",
       "ext_port LD: a partial last group writes one word past the length",
       "tests/test_ext_port.py::test_units_on_the_amaranth_chip_equal_the_reference"),
    _m("hdl", "hdl/units/ld.py", "self.req_addr.eq(src_r + (count.issued << lg)),",
       "self.req_addr.eq(src_r + count.issued),",
       "ext_port LD: request k asks for the words from src + k instead of src + k*P",
       "tests/test_ext_port.py::test_units_on_the_amaranth_chip_equal_the_reference"),
    _m("hdl", "hdl/units/gather.py", "self.group_log2.eq(Mux(opr.row_log2 >= lg, lg, opr.row_log2)),",
       "self.group_log2.eq(Mux(opr.row_log2 >= lg, lg, 0)),",
       "ext_port GATHER/SCATTER: a row shorter than the port moves a word a cycle (its cycles are not the model's)",
       "tests/test_ext_port.py::test_units_on_the_amaranth_chip_equal_the_reference"),
    _m("hdl", "hdl/units/scatter.py", "lanes = Cat(1, *(walk.group_mask >= k for k in range(1, cfg.ext_port)))",
       "lanes = Cat(1, *(walk.group_mask > k for k in range(1, cfg.ext_port)))",
       "ext_port SCATTER: the last word of every group is read but never written",
       "tests/test_ext_port.py::test_units_on_the_amaranth_chip_equal_the_reference"),
    _m("hdl", "hdl/extmem.py", "addr = (self.req_addr + k)[:16]", "addr = (self.req_addr + k + 1)[:16]",
       "ext_port harness memory: read lane k answers the word after its own",
       "tests/test_ext_port.py::test_memory_answers_a_group_of_words"),
    _m("hdl", "hdl/board_top.py", "m.d.comb += [wlane.eq(b - self.wr_addr[:lg]), waddr.eq(self.wr_addr + wlane)]",
       "m.d.comb += [wlane.eq(b - self.wr_addr[:lg]), waddr.eq(self.wr_addr + wlane + 1)]",
       "ext_port board memory: a bank writes its lane's word one row off when the lane wraps",
       "tests/test_ext_port.py::test_memory_answers_a_group_of_words"),
    _m("hdl", "hdl/board_top.py", "self._lane_span(m, ext.landed, ", "self._lane_span(m, ext.landed[:1], ",
       "ext_port board: the dirty map marks only lane 0's block of a store group",
       "tests/test_ext_port.py::test_board_marks_every_block_a_store_group_writes"),
    _m("sim", "hdl/isa.py", "return -(-words // cfg.ext_port)", "return words // cfg.ext_port",
       "ext_port cycle model: a partial last group of an LD or ST is free",
       "tests/test_ext_port.py::test_cycle_model_moves_groups"),
    _m("sim", "sim/backends/reference.py",
       "busy = resident_busy_cycles(op, runs, row_groups(words >> o[\"row_log2\"], o[\"row_log2\"], cfg), lat)",
       "busy = resident_busy_cycles(op, runs, words, lat)",
       "ext_port reference: GATHER and SCATTER still take a cycle a word",
       "tests/test_ext_port.py::test_units_on_the_amaranth_chip_equal_the_reference"),
    # vector lanes: RQ and VADD a group of words a cycle through the banks (docs/vec-lanes.md)
    _m("hdl", "hdl/scratchpad.py", "raddr_b.eq(a + rlane)", "raddr_b.eq(a)",
       "banked scratchpad: a read port with lanes reads every bank at raddr's row (an unaligned group gets "
       "words of the block below)", "tests/test_vec_lanes.py::test_read_lanes_every_alignment"),
    _m("hdl", "hdl/scratchpad.py", "bank.eq(sels[r] + i)", "bank.eq(sels[r] + i + 1)",
       "banked scratchpad: read lane i gives the word at raddr + i + 1",
       "tests/test_vec_lanes.py::test_read_lanes_every_alignment"),
    _m("hdl", "hdl/units/lanes.py", "with m.If(j + l >= n):", "with m.If(j + l > n):",
       "vector lanes: a length that fills its last group runs one group more (writes past len, done late)",
       "tests/test_vec_lanes.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/units/vadd.py", "ys = [self.spad.rdata_x[0]] + [self.spad.rdata_l[1][k]",
       "ys = [self.spad.rdata_x[0]] + [self.spad.rdata_l[0][k]",
       "VADD with lanes: src2's lanes past 0 taken from port 0 (src1's words)",
       "tests/test_vec_lanes.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/units/rq.py", "valid, j = wvalid, wj", "j = wj",
       "RQ with lanes and rq_pipe: the write enables not delayed with the product (the last group never "
       "written, the first written a cycle early)", "tests/test_vec_lanes.py::test_unit_equals_reference_and_cycle_model"),
    _m("hdl", "hdl/chip.py",
       "m.d.comb += sp.wdata_x.as_value()[:lanes * len(port.wdata)].eq(port.wdata_x.as_value())", "pass",
       "PortOwner: RQ's and VADD's write lanes past 0 write MM's data",
       "tests/test_vec_lanes.py::test_program_on_the_amaranth_chip_equals_the_reference"),
    _m("sim", "sim/backends/reference.py", "lag = 2 + cfg.rq_pipe", "lag = 2",
       "reference: a lanes RQ with the piped requantizer modelled as seeing the writes of groups <= g - 2",
       "tests/test_vec_lanes.py::test_unit_equals_reference_and_cycle_model"),
    _m("sim", "hdl/isa.py", "return -(-n // cfg.vec_lanes) + 2 + RQ_PIPE_CYCLES * cfg.rq_pipe",
       "return n // cfg.vec_lanes + 2 + RQ_PIPE_CYCLES * cfg.rq_pipe",
       "cycle model: RQ with lanes counts floor(len/l) groups (a partial last group free)",
       "tests/test_vec_lanes.py::test_formulas_are_the_schedule"),
    # the overlapped issue (docs/prefetch.md)
    _m("hdl", "hdl/chip.py", "m.d.sync += [ins.eq(issue), ahead.eq(pc + 3)]",
       "m.d.sync += [ins.eq(issue), ahead.eq(pc + 2)]",
       "prefetch: after an overlapped issue the read-ahead address is pc + 1 (the next overlapped issue takes "
       "the word just issued again, which runs twice)", "tests/test_prefetch.py::test_the_rtl_issues_in_the_done_cycle"),
    _m("hdl", "hdl/chip.py", "with m.If((st == SeqState.FETCH) | (st == SeqState.ISSUE) | overlap):",
       "with m.If((st == SeqState.FETCH) | overlap):", "prefetch: ISSUE does not read the next word (the first overlapped issue "
       "repeats the first instruction)", "tests/test_prefetch.py::test_r1_and_random_programs_on_the_chip"),
    _m("hdl", "hdl/chip.py", "overlap = overlap & ~failed", "overlap = overlap",
       "prefetch: a failed GATHER/SCATTER's done cycle still issues the next instruction (the error stop runs "
       "one instruction more)", "tests/test_prefetch.py::test_an_error_stop_on_a_prefetch_chip"),
    _m("sim", "hdl/isa.py", "if cfg.prefetch and index > 0 and not after_error:",
       "if cfg.prefetch and index > 0:",
       "cycle model: on a prefetch chip an error stop's HALT costs no cycle (it goes through FETCH and ISSUE)",
       "tests/test_prefetch.py::test_an_error_stop_on_a_prefetch_chip"),
    _m("hdl", "hdl/scratchpad.py", "read_port(transparent_for=())", "read_port(transparent_for=(wr,))",
       "scratchpad: the read port is transparent (a same-edge write is forwarded)", "tests/test_scratchpad.py"),
    _m("hdl", "hdl/units/sm.py", "mx.eq(-128), total.eq(0)", "mx.eq(0), total.eq(0)",
       "SM: the running maximum starts at 0 instead of -128", "tests/test_unit_sm.py"),
    _m("hdl", "hdl/units/unpack.py", "w.word_select(j, 4).as_signed()", "w.word_select(j, 4).as_unsigned()",
       "UNPACK: nibbles are zero-extended instead of sign-extended", "tests/test_units_simple.py"),
    _m("hdl", "hdl/units/st.py", "self.store_path(m, src + i, v, dst + j)", "self.store_path(m, src + i, v, dst + i)",
       "ST: the external address uses the read count (one ahead of the data)", "tests/test_units_simple.py"),
    _m("hdl", "hdl/systolic.py", "b_in = self.b_edge[j] if i == 0 else b_out[pe - n]",
       "b_in = self.b_edge[j] if i == 0 else b_out[pe - n - (i == 3 and j == 3)]",
       "systolic array: PE(3,3) takes its B operand from the wrong column", "tests/test_systolic.py"),
    _m("hdl", "hdl/divider.py", "fits.eq(sh >= d),", "fits.eq(sh > d),",
       "divider: a partial remainder equal to the divisor does not subtract", "tests/test_divider.py"),
    _m("hdl", "hdl/units/mm.py", "M, N, ldc = opr.M, opr.N, opr.ldc", "M, N, ldc = opr.M, opr.N, opr.N",
       "MM: result rows are N words apart instead of ldc", "tests/test_unit_mm.py"),
    _m("hdl", "hdl/units/rq.py", "self.spad.wdata.eq(rq.q),", "self.spad.wdata.eq(rq.q.as_unsigned()),",
       "RQ: the int8 result is zero-extended to 32 bits instead of sign-extended", "tests/test_units_simple.py"),
    _m("hdl", "hdl/units/sm.py", "scaled = ((self.spad.rdata[:16] * r) + (1 << 21))[22:39]",
       "scaled = ((self.spad.rdata[:16] * r) + (1 << 20))[22:39]",
       "SM: the final rounding adds 2^20 instead of 2^21", "tests/test_unit_sm.py"),
    _m("hdl", "hdl/softmax.py", "scaled.eq(er[i] * r + (1 << 21))", "scaled.eq(er[i] * r)",
       "softmax block (Chapter 6): the final product is truncated, not rounded", "tests/test_softmax_block.py"),
    _m("hdl", "hdl/chip.py", "for cls, ops in ops_of.items():",
       "for cls, ops in ((c, [o for o in os if o != Op.ST]) for c, os in ops_of.items()):",
       "sequencer: WAIT cycles of ST are counted as vector cycles, not DMA", "tests/test_chip_amaranth.py"),
    _m("hdl", "hdl/chip.py", "st.eq(SeqState.HALT), self.halted.eq(1), cur.eq(CUR_NONE)]",
       "st.eq(SeqState.HALT), self.halted.eq(1), cur.eq(CUR_NONE), self.n_inst.eq(self.n_inst + 1)]",
       "sequencer: the HALT is counted as a completed instruction (checked on the Verilator model)",
       "tests/test_verilator.py::test_book_figures_r1_r3_r5_r11", "tests/test_chip_amaranth.py"),
    _m("hdl", "hdl/chip.py", "if op != Op.AMAX:", "if True:",
       "scratchpad port: AMAX's write address and data are also routed inside its own case",
       "tests/test_chip_amaranth.py",
       equivalent="the defaults before the switch already drive waddr/wdata from AMAX, so its case assigns "
                  "the same two values again and the netlist computes the same function",
       shown_by="tests/test_mutants.py::test_equivalent_amax_port_routing_is_the_same_function"),
    _m("hdl", "hdl/extmem.py", "data, valid = pipe[-w:-1], pipe[-1]", "data, valid = pipe[-2 * w:-w - 1], pipe[-w - 1]",
       "external memory (harness): answers after LAT-1 cycles, so every LD word is written one cycle early",
       "tests/test_chip_amaranth.py"),

    # ---- compiler -------------------------------------------------------------------------------------
    _m("compiler", "compiler/buffers.py", "if merged and merged[-1][0] + merged[-1][1] >= s:", "if False:",
       "allocator: freed extents are never coalesced", T_COMP),
    _m("compiler", "compiler/emit.py", "if b.last_use == n.id and b.addr is not None:",
       "if b.last_use == n.id + 1 and b.addr is not None:",
       "emission: a buffer is released one node before its last use", T_COMP),
    _m("compiler", "compiler/scales.py", "SOFTMAX_IN_SCALE = 1.0 / 16", "SOFTMAX_IN_SCALE = 1.0 / 15",
       "scales: the softmax input is pinned to 1/15 instead of Q4.4", T_COMP),
    _m("compiler", "compiler/emit.py", "relu = int(n.id in relu_fused)", "relu = 0",
       "emission: the relu flag is not fused into the matmul's RQ (or RQC)", T_COMP),
    _m("compiler", "compiler/emit.py", "if abs(ratio - 1) < 1e-9:", "if abs(ratio - 1) > 1e-9:",
       "emission: the add's rescale test uses > instead of <", T_COMP),
    _m("compiler", "hdl/arith.py", "m = round(M * 2.0 ** s)", "m = math.floor(M * 2.0 ** s)",
       "multipliers: the requantizer mantissa is rounded down (golden hdl/arith.mantissa_shift)", T_COMP),
    _m("compiler", "compiler/buffers.py", 'order = [n for n in graph.nodes if n.op in ("input", "weight")] + \\',
       'order = [n for n in graph.nodes if n.op == "output"] + '
       '[n for n in graph.nodes if n.op in ("input", "weight")] or \\',
       "external layout: the outputs are placed before the inputs and weights", T_COMP),
    _m("compiler", "compiler/buffers.py", "for src, o in ((a, off), (b, off + a.rows)):",
       "for src, o in ((a, off + b.rows), (b, off)):",
       "buffers: the concat offsets are swapped (new row first)", T_COMP),
    _m("compiler", "compiler/emit.py", "b_row = row_words(B, pb)",
       "b_row = nn if tb else row_words(B, pb)",
       "emission: a transposed MM tile gets ldb = N instead of K", T_COMP),
    # packed weights (mm_pack chips, docs/mm-fast.md)
    _m("compiler", "compiler/buffers.py", "w |= (v & 0xFF) << (8 * b)", "w |= (v & 0xFF) << (8 * (3 - b))",
       "packed weights: the four int8 of a word in reverse byte order",
       "tests/test_compile_packed.py::test_a_weight_read_any_other_way_stays_unpacked"),
    _m("compiler", "compiler/buffers.py", "return -(-node.cols // PACK) if packed else node.cols",
       "return node.cols // PACK if packed else node.cols",
       "emission: a packed B's ldb rounds N/4 down (rows of a width not a multiple of 4 overlap)",
       "tests/test_compile_packed.py::test_a_weight_read_any_other_way_stays_unpacked"),
    # packed activations (mm_pack_c chips, docs/mm-pack-c.md)
    _m("compiler", "compiler/buffers.py",
       "if not (user.op == \"matmul\" and user.ins[1] == i and user.ins[0] != i):",
       "if not (user.op == \"matmul\"):",
       "packed activations: a tensor read as a matmul's A operand is packed too",
       "tests/test_compile_packed_kv.py"),
    _m("compiler", "compiler/emit.py", "pc = fused_rq and n.id in packed", "pc = False",
       "packed activations: a packed result is written one int8 a word (pc never set)",
       "tests/test_compile_packed_kv.py"),
    _m("compiler", "compiler/emit.py", "SOFTMAX_RQ_MULTIPLIER = 127 / 65536", "SOFTMAX_RQ_MULTIPLIER = 127 / 65535",
       "emission: the softmax Q0.16 -> int8 multiplier uses 65535", T_COMP),
    _m("compiler", "compiler/scales.py", "gmax[root] = max(gmax[root], rng[i])", "pass",
       "scales: an add's scale ignores its operands' ranges", T_COMP),
    _m("compiler", "compiler/image.py", "sc = P.scales[node.id]", "sc = P.scales[src.id]",
       "readback: an output is dequantized at its source's scale instead of its own", T_COMP,
       "tests/test_random_graphs.py::test_random_graphs_fixed_seeds",
       "tests/test_random_graphs.py::test_4bit_weight_sliced_concatenated_output",
       equivalent="plan_scales unites an output with its source and gives a scale group one scale, decided "
                  "once (issue 10; tests/test_random_graphs.py checks that rule on every random graph), so "
                  "both scales are the same float for every compiled program",
       shown_by="tests/test_random_graphs.py::test_readback_at_the_source_scale_is_the_same_function"),

    # ---- added for issue 10: addressing, lengths, routing and the checkers themselves -----------------
    _m("host", PT, "            t[-1] = q", "            pass",
       "page table: after the copy-on-write copy the table still points at the shared page", T_PT),
    _m("host", PT, "elif self._ref[t[-1]] > 1 or", "elif self._ref[t[-1]] > 2 or",
       "page table: a page shared by two owners is written in place (copy only from three owners on)", T_PT),
    _m("hdl", "hdl/units/ld.py", "len_r.eq(self.length)", "len_r.eq(self.length[:8])",
       "DMA: the length register keeps only 8 bits (an LD of 257 words moves 1)", "tests/test_dma.py"),
    _m("hdl", "hdl/units/ld.py", "groups = len_r  # P == 1: a group is a word", "groups = len_r + 1  # P == 1: a group is a word",
       "DMA: the LD engine issues one read request more than its length", "tests/test_dma.py"),
    _m("hdl", "hdl/units/unpack.py", "self.spad.waddr.eq(dst + (i << 3) + j)", "self.spad.waddr.eq(dst + (i << 2) + j)",
       "UNPACK: the nibbles of word i are written at dst + 4i instead of dst + 8i", "tests/test_units_simple.py"),
    _m("hdl", "hdl/units/unpack.py", "self.spad.raddr.eq(src + i)", "self.spad.raddr.eq(src)",
       "UNPACK: every packed word is read from src (the source address does not advance)",
       "tests/test_units_simple.py"),
    _m("hdl", "hdl/units/vadd.py", "self.spad.waddr.eq(dst + j)", "self.spad.waddr.eq(s1 + j)",
       "VADD: the sums are written over src1 instead of dst", "tests/test_units_simple.py"),
    _m("hdl", "hdl/units/vadd.py", "Mux(cnt[0], s2, s1) + cnt[1:]", "Mux(cnt[0], s2, s1) + cnt[2:]",
       "VADD: the read address advances every fourth cycle instead of every second", "tests/test_units_simple.py"),
    _m("hdl", "hdl/chip.py", "[sp.raddr.eq(port.raddr), port.rdata", "[sp.raddr.eq(port.raddr + 1), port.rdata",
       "scratchpad port: the owner's read address is routed one word too far", "tests/test_chip_amaranth.py"),
    _m("hdl", "hdl/chip.py", "sp.waddr.eq(port.waddr)", "sp.waddr.eq(port.waddr ^ (op == Op.LD))",
       "scratchpad port: LD's write address is routed with its lowest bit flipped", "tests/test_chip_amaranth.py"),
    _m("hdl", "hdl/scratchpad.py", "wr.addr.eq(p.waddr),", "wr.addr.eq(p.raddr),",
       "scratchpad: the write port takes the read address", "tests/test_scratchpad.py"),
    _m("sim", "sim/backends/reference.py", "counters[0] += seq + busy", "counters[0] += seq + busy - 1",
       "reference machine: an instruction costs one cycle less (no ISSUE cycle)", "tests/test_reference.py"),
    _m("sim", "hdl/isa.py", 'Op.ST: "dma"', 'Op.ST: "vec"',
       "reference machine: ST's busy cycles are counted as vector cycles, not DMA", "tests/test_reference.py"),
    _m("sim", "sim/backends/reference.py", "prev = vadd_sat(x, y) & _W", "prev = vadd_sat(x, x) & _W",
       "reference machine: VADD adds src1 to itself", "tests/test_reference.py"),
    _m("sim", "sim/backends/__init__.py", "for name, a, b in zip(COUNTER_NAMES, expected.counters, got.counters):",
       "for name, a, b in zip(COUNTER_NAMES[:4], expected.counters, got.counters):",
       "comparison: first_difference never compares n_inst", "tests/test_backend.py"),
    _m("sim", "sim/backends/__init__.py", "    for i, (a, b) in enumerate(zip(expected, got)):",
       "    for i, (a, b) in enumerate(zip(expected[:-1], got[:-1])):",
       "comparison: the last word of a memory is never compared", "tests/test_backend.py"),
    _m("sim", "sim/backends/__init__.py", "    if diff is not None or not scratchpad:", "    if True:",
       "comparison: the scratchpads are never compared", "tests/test_backend.py"),
    _m("sim", "sim/verify/fuzz.py", "        if diff is not None:", "        if diff is not None and self.runs > 1:",
       "decode check: the first run (step 1) is never compared with the reference",
       "tests/test_decode.py::test_check_names_the_step_and_the_first_differing_instruction"),
    _m("sim", "sim/decode.py", "    if a.check:", "    if False:",
       "decode: --check runs no reference beside the simulator",
       "tests/test_decode.py::test_check_option_puts_the_reference_beside_the_simulator"),
    # ---- resident mode (issue 13): the reference's GATHER/SCATTER, the resident lowering and host ---------
    _m("sim", "sim/backends/reference.py", "        if page >= pool_pages:", "        if page > pool_pages:",
       "reference machine: a block-table entry equal to pool_pages passes the isolation check",
       "tests/test_resident_isa.py::test_error_stop"),
    _m("sim", "hdl/isa.py", "    return 2 * runs + words + lat + 1", "    return runs + words + lat + 1",
       "cycle model: a run of a GATHER that ends normally costs one lookup cycle instead of two",
       "tests/test_resident_isa.py::test_busy_cycles"),
    _m("compiler", "compiler/resident.py", 'targets[a] = (base + rw, "c", "d")', 'targets[a] = (base, "c", "d")',
       "resident lowering: the attention reads the K half of the interleaved pool rows as its values",
       "tests/test_resident.py::test_paged_equals_plain_in_both_modes"),
    _m("compiler", "compiler/resident.py", "        if got[name][0] != scale:", "        if False:",
       "resident lowering: a step program whose weight scale differs from the loaded one is accepted",
       "tests/test_resident.py::test_step_programs_must_use_the_loaded_weights"),
    _m("host", "host/resident.py", "        if off and before[-1] != after[-1]:", "        if False:",
       "resident host: copy-on-write of a shared partly filled page copies nothing on the chip",
       "tests/test_resident.py::test_copy_on_write_is_a_chip_side_page_copy"),
    # ---- resident mode: the GATHER/SCATTER units and the chip's error stop ---------------------------------
    _m("hdl", "hdl/units/gather.py", "        self.bad_page = entry >= opr.pool_pages",
       "        self.bad_page = entry > opr.pool_pages",
       "GATHER/SCATTER: a block-table entry equal to pool_pages passes the lookup check",
       "tests/test_unit_gather.py::test_gather_against_doc_and_reference"),
    _m("hdl", "hdl/units/scatter.py", "if cfg.ext_port > 1 else moving)",
       "if cfg.ext_port > 1 else moving & ~walk.row_end)",
       "SCATTER: the last word of every row is read but never written",
       "tests/test_unit_scatter.py::test_scatter_against_doc_and_reference"),
    _m("hdl", "hdl/chip.py", "            m.d.comb += go.eq((st == SeqState.ISSUE) & ~self.error)",
       "            m.d.comb += go.eq(st == SeqState.ISSUE)",
       "chip: the instruction after an error stop still starts its unit (the chip halts with it running)",
       "tests/test_resident_rtl.py::test_bad_table_stops_amaranth"),
    # ---- issue 14: the serving engine, its page-table extensions and the batched programs ------------------
    _m("host", PT, "if self._ref[p] == 0 and p not in self._retained:", "if self._ref[p] == 0:",
       "page table: a cached page is freed when its last request lets go (the cache then names a free page)",
       "tests/test_engine.py::test_batch_invariance_over_traces",
       "tests/test_engine.py::test_prefix_cache_skips_the_shared_rows_with_identical_tokens"),
    _m("host", "host/engine.py", "while t < P and n + t < limit and ptoks[t] == toks[n + t]:",
       "while t < P and n + t < limit:",
       "prefix cache: a cached page is adopted as a partial tail whatever its tokens",
       "tests/test_engine.py::test_prefix_cache_skips_the_shared_rows_with_identical_tokens"),
    _m("host", "host/engine.py", "victim = max(self.running, key=lambda s: s.order)",
       "victim = min(self.running, key=lambda s: s.order)",
       "engine: preemption takes the earliest admitted request instead of the most recent",
       "tests/test_engine.py::test_preemption_by_recompute_gives_identical_results"),
    _m("host", "host/batch.py", """res[i] = {"tok": int(out["tok"][0][j][0])""", """res[i] = {"tok": int(out["tok"][0][i][0])""",
       "batched programs: row i gets the token of the i-th program row, not its own",
       "tests/test_engine.py::test_a_row_gives_the_same_integers_in_any_batch_and_the_cycle_model_holds",
       "tests/test_engine.py::test_batch_invariance_over_traces"),
    # ---- issue 21: the engine's policies that no equality test sees ------------------------------------
    _m("host", PT, "elif self._ref[t[-1]] > 1 or t[-1] in self._retained:", "elif self._ref[t[-1]] > 1:",
       "page table: a cached page held by one request is written in place, not copied (the cache's rows change)",
       f"{T_EDGES}::test_a_cached_page_held_by_one_request_is_copied_before_it_is_written",
       f"{T_EDGES}::test_a_partial_prefix_hit_leaves_the_cached_page_intact"),
    _m("host", "host/engine.py", _HASH, _HASH.replace('f"{parent}|', 'f"'),
       "prefix cache: a page's hash ignores its parent (the same tokens after another prefix hit)",
       f"{T_EDGES}::test_the_same_page_tokens_after_another_prefix_do_not_hit",
       f"{T_EDGES}::test_the_prefix_hash_names_the_parent_the_window_and_the_sinks"),
    _m("host", "host/engine.py", _HASH, _HASH.replace("|W={W}", ""),
       "prefix cache: a page's hash ignores the window",
       f"{T_EDGES}::test_the_same_page_tokens_after_another_prefix_do_not_hit"),
    _m("host", "host/engine.py", _HASH, _HASH.replace("|S={S}", ""),
       "prefix cache: a page's hash ignores the sinks",
       f"{T_EDGES}::test_the_same_page_tokens_after_another_prefix_do_not_hit"),
    _m("host", "host/engine.py", "spare = self.watermark if self.running else 0", "spare = 0",
       "engine: admission ignores the watermark of spare pages",
       f"{T_EDGES}::test_admission_keeps_the_watermark_of_spare_pages"),
    _m("host", "host/engine.py", _STAMP, _STAMP.replace(" == 0:", " == 0 and p not in self.lru:"),
       "engine: a cached page's recency is that of its first release (a prefix hit does not refresh it)",
       f"{T_EDGES}::test_a_prefix_hit_refreshes_the_recency_of_the_pages_it_reuses"),
    _m("host", "host/engine.py", 'if s.tokens[s.pos + 1] != tok or s.logits[g] != res["logits_int"]:',
       "if False:", "engine: a recomputed row is not checked against the first computation",
       f"{T_EDGES}::test_a_recomputed_row_that_differs_stops_the_engine"),
    _m("host", "host/engine.py", "    if n % page:", "    if False:",
       "engine invariants: the partly filled page the next row goes into is not allowed (window 1 stops)",
       f"{T_EDGES}::test_window_one_keeps_the_partly_filled_page_the_next_row_goes_into"),
    _m("host", "host/engine.py", "        return leaves + [p for p in free if self.children.get(self.page_hash[p])]",
       "        return free", "engine: eviction is least recently used alone (a windowed chain loses its head first)",
       f"{T_EDGES}::test_a_window_lets_go_of_a_chains_head_first_but_eviction_still_takes_its_tail"),
)


# ---- applying a mutant ---------------------------------------------------------------------------------
def anchor_problem(m: Mutant, root: Path = PROJECT_ROOT, compiles: bool = True) -> str | None:
    """Why `m` cannot be applied to the sources under `root` (None when it can).

    With `compiles` (the default, for the table's own mutants) a mutated file that is not valid Python is
    a problem as well; `mutated_source` and the runs do not ask that (such a mutant runs, and pytest's
    import error makes it inconclusive).
    """
    if "\n" in m.anchor or "\n" in m.replacement:
        return "anchor and replacement must each be on one line"
    if m.anchor == m.replacement:
        return "the replacement equals the anchor"
    path = root / m.file
    try:
        text = path.read_text()
    except OSError as e:
        return f"cannot read {m.file}: {e.strerror or e}"
    n = text.count(m.anchor)
    if n != 1:
        return f"anchor occurs {n} times in {m.file} (must be exactly once): {m.anchor!r}"
    if not compiles or not m.file.endswith(".py"):
        return None
    try:
        compile(text.replace(m.anchor, m.replacement), m.file, "exec")
    except SyntaxError as e:
        return f"the mutated {m.file} does not compile: {e.msg} (line {e.lineno})"
    return None


def mutated_source(m: Mutant, root: Path = PROJECT_ROOT) -> str:
    """The text of `m.file` with the mutant applied (ValueError when the anchor is not usable)."""
    problem = anchor_problem(m, root, compiles=False)
    if problem:
        raise ValueError(problem)
    return (root / m.file).read_text().replace(m.anchor, m.replacement)


def copy_project(dst: Path, root: Path = PROJECT_ROOT) -> Path:
    """Copy the project tree (no .git, no build products or caches) to a new directory `dst`."""
    shutil.copytree(root, dst, ignore=_IGNORE)
    return dst


def seed_build(dst: Path, src: Path | None) -> Path:
    """Make `dst` a private build directory holding a copy of the finished Verilator models under `src`.

    Only finished models (a directory with the executable) and the source-key shortcuts are copied; `src`
    is only read. Every key is a hash of what the model is built from, so a copied model is used only by
    a run whose sources are the same, and a run with other sources builds its own model inside `dst`.
    """
    dst.mkdir(parents=True, exist_ok=True)
    models = src / "verilator" if src is not None else None
    if models is None or not models.is_dir():
        return dst
    out = dst / "verilator"
    out.mkdir(exist_ok=True)
    for entry in models.iterdir():
        if entry.name.startswith("."):          # a build in progress (renamed into place when finished)
            continue
        if entry.name == "by-source" and entry.is_dir():
            shutil.copytree(entry, out / entry.name, dirs_exist_ok=True)
        elif entry.is_dir() and (entry / "ga2sim").is_file():
            shutil.copytree(entry, out / entry.name, dirs_exist_ok=True)
    return dst


# ---- running checks --------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one pytest run of a list of checks said.

    Attributes
    ----------
    status : str
        ``passed``; ``failed`` (a test failed in its body and nothing else went wrong: the only status
        that catches a mutant); ``timeout``; or ``error`` (anything else: see `classify`).
    first_failure : str or None
        Node id (or file) of the failing test when ``failed``; of the test or file in trouble when
        ``error``, if one is known.
    seconds : float
        Wall time of the run.
    tail : str
        The last 2,000 characters of pytest's output.
    skipped : int
        Tests reported as skipped by a run that passed.
    reason : str
        For ``error`` and ``timeout``: what went wrong, in words.
    """
    status: str
    first_failure: str | None
    seconds: float
    tail: str
    skipped: int = 0
    reason: str = ""


# The plugin loaded into every run of checks (``-p ga2_mutant_probe``, from a directory outside the copy):
# one JSON line per test report and per failed collection, with the exception's type and whether it is an
# assertion. pytest's own text is for people; the verdict is taken from these records.
PROBE_SOURCE = '''\
"""Written by sim.verify.mutants: how each test of this run ended, one JSON line per report."""
import json
import os

import pytest

_OUT = os.environ["GA2_MUTANT_PROBE"]
_ASSERTIONS = (AssertionError, pytest.fail.Exception)


def _write(record):
    with open(_OUT, "a") as f:
        f.write(json.dumps(record) + "\\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if call.excinfo is not None:    # user_properties travel to the xdist controller with the report
        report.user_properties.append(("ga2_exc", call.excinfo.typename))
        report.user_properties.append(("ga2_assertion", bool(call.excinfo.errisinstance(_ASSERTIONS))))


def pytest_runtest_logreport(report):
    props = dict(p for p in report.user_properties if isinstance(p, tuple) and len(p) == 2)
    _write({"kind": "test", "node": report.nodeid, "when": report.when, "outcome": report.outcome,
            "exc": props.get("ga2_exc"), "assertion": bool(props.get("ga2_assertion"))})


def pytest_collectreport(report):
    if report.failed:
        _write({"kind": "collect", "node": report.nodeid or "(session)", "outcome": "failed"})
'''
PROBE_MODULE = "ga2_mutant_probe"
# Exceptions that end a test because the code could not be run (a broken mutant, a missing tool, a
# time-out or exhaustion inside the test), not because it ran and gave a wrong answer: never a catch.
NOT_A_VERDICT = frozenset({"SyntaxError", "IndentationError", "TabError", "ImportError", "ModuleNotFoundError",
                           "BackendUnavailable", "TimeoutExpired", "TimeoutError", "MemoryError", "RecursionError"})
_PYTEST_EXIT = {2: "interrupted (a collection error or a signal)", 3: "an internal error",
                4: "a usage error", 5: "no tests collected"}


def classify(returncode: int | None, records: list[dict]) -> tuple[str, str | None, str]:
    """The status of one run of checks from pytest's exit status and the probe's records.

    Parameters
    ----------
    returncode : int or None
        pytest's exit status (negative: killed by that signal); None when the time limit ended it.
    records : list of dict
        The probe's records (``kind`` ``test`` with ``node``, ``when``, ``outcome``, ``exc``,
        ``assertion``; ``kind`` ``collect`` with ``node``).

    Returns
    -------
    (status, node, reason)
        `status` as in `Outcome`; `node` names the test or file concerned; `reason` says why, in words.
    """
    if returncode is None:
        failed = next((r["node"] for r in records if r.get("outcome") == "failed"), None)
        return "timeout", failed, "the time limit ended the checks" + (f" ({failed} had failed)" if failed else "")
    for r in records:
        if r.get("kind") == "collect":
            return "error", r["node"], f"a collection or import error in {r['node']}"
    tests = [r for r in records if r.get("kind") == "test"]
    for r in tests:
        if r["when"] != "call" and r["outcome"] == "failed":
            return "error", r["node"], f"an error in the {r['when']} of {r['node']} ({r['exc'] or 'no exception'})"
    failures = [r for r in tests if r["when"] == "call" and r["outcome"] == "failed"]
    ran = [r for r in tests if r["when"] == "call" and r["outcome"] != "skipped"]
    if returncode == 0:
        if failures or not ran:
            return "error", None, "pytest exited 0 but its records show " + (
                "a failed test" if failures else "no test that ran")
        return "passed", None, ""
    # 1: tests failed; 2 with a failure on record and no collection error: -x under pytest-xdist
    if returncode == 1 or (returncode == 2 and failures):
        if not failures:
            return "error", None, "pytest exited 1 without a failed test on record (a crash of the run?)"
        first = failures[0]
        if first["assertion"]:
            return "failed", first["node"], "an assertion failed"
        if first["exc"] and first["exc"] not in NOT_A_VERDICT:
            return "failed", first["node"], f"the code under test raised {first['exc']}"
        return "error", first["node"], f"{first['node']} died of {first['exc']}: the code could not be run"
    if returncode < 0:
        return "error", None, f"pytest was killed by signal {-returncode}"
    return "error", None, f"pytest exit status {returncode}: {_PYTEST_EXIT.get(returncode, 'a crash')}"


# Check runs in flight, so that an interrupted run can end them (they run in their own sessions).
_live: set = set()
_live_lock = threading.Lock()
_stopping = threading.Event()


class Interrupted(Exception):
    """The run was interrupted; no further checks start."""


def _stop_all() -> None:
    _stopping.set()
    with _live_lock:
        for proc in list(_live):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _read_records(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:      # a line cut short by a kill: the run is not a pass anyway
            pass
    return out


def project_build_dir(root: Path = PROJECT_ROOT) -> Path:
    """The build directory the project's own tests use (``$GA2_BUILD_DIR`` or ``<root>/build``)."""
    env = os.environ.get("GA2_BUILD_DIR")
    return Path(env) if env else root / "build"


def run_checks(root: Path, checks, timeout: float = DEFAULT_TIMEOUT, workers: int = 0,
               build_dir: Path | None = None) -> Outcome:
    """Run ``pytest -x -q -p no:cacheprovider checks`` in `root` with PYTHONPATH = `root`.

    `build_dir` becomes ``$GA2_BUILD_DIR`` (default: ``root/build``, i.e. nothing cached is shared).
    The status comes from `classify`.
    """
    with tempfile.TemporaryDirectory(prefix="ga2-probe-") as probe_dir:
        probe = Path(probe_dir)
        (probe / f"{PROBE_MODULE}.py").write_text(PROBE_SOURCE)
        records = probe / "records.jsonl"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join((str(root), str(probe)))
        env["GA2_BUILD_DIR"] = str(build_dir if build_dir is not None else root / "build")
        env["GA2_MUTANT_PROBE"] = str(records)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        for var in ("GA2_VCD", "PYTEST_ADDOPTS", "PYTEST_PLUGINS"):    # the command line below is the whole story
            env.pop(var, None)
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", PROBE_MODULE,
               "-rfE", "--tb=line", "-o", "addopts="]
        if workers > 1:
            cmd += ["-n", str(workers)]
        cmd += list(checks)
        t0 = time.monotonic()
        with _live_lock:
            if _stopping.is_set():
                raise Interrupted("interrupted")
            proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            _live.add(proc)
        returncode = None
        try:
            out, _ = proc.communicate(timeout=timeout)
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)      # the whole group: pytest and anything it started
            out, _ = proc.communicate()
        finally:
            with _live_lock:
                _live.discard(proc)
        if _stopping.is_set():
            raise Interrupted("interrupted")
        status, node, reason = classify(returncode, _read_records(records))
    secs = time.monotonic() - t0
    tail = out[-2000:]
    skipped = 0
    if status == "passed":
        last = out.strip().splitlines()[-1] if out.strip() else ""
        skipped = sum(int(n) for n in re.findall(r"(\d+) skipped", last))
    return Outcome(status, node, secs, tail, skipped, reason)


VERDICTS = ("caught", "INCONCLUSIVE", "SURVIVED", "EQUIVALENT")


def run_mutant(m: Mutant, timeout: float = DEFAULT_TIMEOUT, root: Path = PROJECT_ROOT,
               seed: Path | None = None) -> tuple[str, str, float]:
    """Apply `m` to a fresh copy of `root` and run its checks there.

    The copy's build directory is seeded from `seed` (default: the project's build directory, read only).
    Returns ``(verdict, detail, seconds)`` with a verdict of `VERDICTS` (see the module doc).
    """
    t0 = time.monotonic()
    try:
        text = mutated_source(m, root)
    except ValueError as e:
        return "INCONCLUSIVE", f"the mutant cannot be applied: {e}", 0.0
    if m.equivalent and not m.shown_by:
        return "INCONCLUSIVE", "argued equivalent, but no test demonstrates it (shown_by is not set)", 0.0
    with tempfile.TemporaryDirectory(prefix="ga2-mutant-") as tmp:
        copy = copy_project(Path(tmp) / "project", root)
        build = seed_build(copy / "build", project_build_dir(root) if seed is None else seed)
        if m.equivalent:
            # the demonstration reads the original file, so it runs before the mutant is written
            shown = run_checks(copy, [m.shown_by], timeout, build_dir=build)
            if shown.status != "passed":
                why = shown.reason or f"{shown.first_failure} failed"
                return "INCONCLUSIVE", f"the equivalence test {m.shown_by} does not pass: {why}", \
                    time.monotonic() - t0
        (copy / m.file).write_text(text)
        res = run_checks(copy, m.checks, timeout, build_dir=build)
    secs = time.monotonic() - t0
    if res.status == "failed":
        claim = " (although argued equivalent)" if m.equivalent else ""
        how = "" if res.reason == "an assertion failed" else f", {res.reason}"
        return "caught", f"by {res.first_failure}{how}{claim}", secs
    if res.status == "passed":
        if m.equivalent:
            return "EQUIVALENT", f"because {m.equivalent} (shown by {m.shown_by})", secs
        skipped = f" ({res.skipped} skipped)" if res.skipped else ""
        return "SURVIVED", f"every check passed{skipped}: " + " ".join(m.checks), secs
    if res.status == "timeout":
        return "INCONCLUSIVE", f"the time limit ({timeout:.0f} s) ended the checks", secs
    return "INCONCLUSIVE", res.reason, secs


def baseline(mutants, timeout: float, jobs: int, root: Path = PROJECT_ROOT, build: Path | None = None) -> Outcome:
    """Run the union of the mutants' checks and equivalence tests on an unmutated copy of `root`.

    `build` is the run's private build directory (seeded from the project's, read only); the models the
    baseline builds there seed every mutant's copy.
    """
    checks = list(dict.fromkeys(c for m in mutants for c in m.checks + ((m.shown_by,) if m.shown_by else ())))
    with tempfile.TemporaryDirectory(prefix="ga2-mutant-base-") as tmp:
        copy = copy_project(Path(tmp) / "project", root)
        if build is None:
            build = copy / "build"
        seed_build(build, project_build_dir(root))
        # the union of every mutant's checks, Verilator builds included: four mutants' time
        return run_checks(copy, checks, timeout * 4, workers=jobs, build_dir=build)


def mutant_task(m: Mutant, timeout: float, seed: str | None) -> tuple[str, str, float]:
    """One task of ``--cluster`` (`sim.cluster`): `run_mutant` on the worker's own checkout.

    `seed` is the driver's private build directory: used where it can be seen (a worker on the driver's
    machine); a worker on another node seeds its copies from its own project build directory.
    """
    return run_mutant(m, timeout, seed=Path(seed) if seed and Path(seed).is_dir() else None)


# ---- command line ------------------------------------------------------------------------------------------
def _label(i: int, m: Mutant) -> str:
    return f"{m.kind:8s} {i:2d}  {m.description}"


def build_parser():
    from sim.cli import Parser, int_range
    ap = Parser("python -m sim.mutants",
                "Mutation testing: run one-line broken versions of the project against the tests that should "
                "catch them, each in a temporary copy of the project. 'caught' is the expected answer; the "
                "exit status is 0 only if every mutant not argued equivalent is caught. A full run takes "
                "minutes (see README); --only and --list for less.",
                "python -m sim.mutants --jobs 2\npython -m sim.mutants --only host --list")
    ap.add_argument("--only", choices=KINDS, help="run only the mutants of this kind (default: every kind)")
    ap.add_argument("--jobs", type=int_range(1, 64), default=1, metavar="N", help="mutants run at once, 1..64")
    ap.add_argument("--list", action="store_true", help="list the mutants and their checks, run nothing")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                    help=f"seconds allowed to one mutant's checks (default {DEFAULT_TIMEOUT:.0f})")
    from sim.cluster import cluster_option
    cluster_option(ap, "one mutant a task; the baseline runs here, with --jobs")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not args.timeout > 0:
        ap.error(f"--timeout must be > 0, got {args.timeout}")
    from sim.cluster import check_cluster_args
    check_cluster_args(args)
    chosen = [(i, m) for i, m in enumerate(MUTANTS, 1) if args.only in (None, m.kind)]

    if args.list:
        for i, m in chosen:
            problem = anchor_problem(m)
            print(_label(i, m) + ("  [argued equivalent]" if m.equivalent else "")
                  + (f"  [cannot be applied: {problem}]" if problem else ""))
            print(f"{'':12s}{m.file}: {m.anchor.strip()!r} -> {m.replacement.strip()!r}")
            print(f"{'':12s}checks: {' '.join(m.checks)}")
            if m.equivalent:
                print(f"{'':12s}equivalent because {m.equivalent}; shown by {m.shown_by or 'no test'}")
        return 0

    t_start = time.monotonic()
    _stopping.clear()
    pool = ThreadPoolExecutor(max_workers=args.jobs)
    try:
        return _run(chosen, args, pool, t_start)
    except KeyboardInterrupt:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)    # a second ^C must not skip the cleanup
        try:
            _stop_all()
            pool.shutdown(wait=True, cancel_futures=True)
        finally:
            signal.signal(signal.SIGINT, previous)
        print("interrupted: the checks still running were stopped", file=sys.stderr)
        return 130
    finally:
        pool.shutdown()


def _run(chosen, args, pool, t_start) -> int:
    print("NOTE: each mutant deliberately breaks a copy of the project; 'caught' is the expected answer.")
    with tempfile.TemporaryDirectory(prefix="ga2-mutant-build-") as tmp:
        # one private build for the run: the baseline fills it, every mutant starts from a copy of it
        build = Path(tmp) / "build"
        base = baseline([m for _, m in chosen], args.timeout, args.jobs, build=build)
        if base.status != "passed":
            print(f"the unmutated project does not pass the checks ({base.status}"
                  f"{', first failure ' + base.first_failure if base.first_failure else ''}"
                  f"{': ' + base.reason if base.reason else ''}):")
            print(base.tail)
            return 1
        print(f"unmutated project passes the checks: yes ({base.seconds:.0f} s)")

        counts = dict.fromkeys(VERDICTS, 0)
        inconclusive = []
        raised = 0                  # caught by an exception of the mutated code, not by an assertion
        with contextlib.ExitStack() as stack:
            if args.cluster is not None:
                from sim.cluster import Cluster
                cluster = stack.enter_context(Cluster(args.cluster, args.workers))
                results = cluster.map(mutant_task, [(m, args.timeout, str(build)) for _, m in chosen],
                                      label="mutants", unit="mutant")
            else:
                results = pool.map(lambda im: run_mutant(im[1], args.timeout, seed=build), chosen)
            for (i, m), (verdict, detail, secs) in zip(chosen, results):
                counts[verdict] += 1
                raised += verdict == "caught" and ", the code under test raised " in detail
                if verdict == "INCONCLUSIVE":
                    inconclusive.append((i, m, detail))
                print(f"{verdict:13s}{_label(i, m)}  ({detail}, {secs:.1f} s)", flush=True)

    if inconclusive:
        print(f"{len(inconclusive)} inconclusive (neither caught nor survived; fix the run or the checks):")
        for i, m, detail in inconclusive:
            print(f"  {_label(i, m)}: {detail}")
    print(f"wall time {time.monotonic() - t_start:.0f} s")
    print(f"{len(chosen)} mutants: {counts['caught']} caught ({counts['caught'] - raised} by a failed assertion, "
          f"{raised} by an exception in a test's body), {counts['INCONCLUSIVE']} inconclusive, "
          f"{counts['SURVIVED']} survived, {counts['EQUIVALENT']} equivalent")
    return 0 if counts["caught"] + counts["EQUIVALENT"] == len(chosen) else 1


if __name__ == "__main__":
    from sim.cli import guarded
    sys.exit(guarded(main))
