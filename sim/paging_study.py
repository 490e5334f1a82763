"""Example B of the chapter: what paging, prefix sharing and a window buy (``python -m sim.paging_study``).

Part 1 memory (contiguous reservation against pages of 1..256 rows, 400 sampled request lengths), part 2
prefix sharing with copy-on-write, part 3 the accuracy a window costs on the random models (float, about
10 s), part 4 serving arithmetic (derived). Prints the four tables, writes ``paging_study.json`` and PNG
figures into ``--out DIR``; with ``decode_none.json``, ``decode_8.json``, ``decode_4.json`` in DIR (from
``python -m sim.decode --json``) it also plots the chip's cycles per step.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys

from host.pagetable import OutOfPages, PageTable
from sim.cli import Parser, UsageError, guarded, make_dir, output_dir, write_json
from sim.plot import pyplot

CAP = 8192                  # part 1: pool of cache rows
LONGEST = 2048              # part 1: longest allowed request, what a contiguous scheme must reserve
PAGES_1 = (1, 4, 16, 64, 256)
SHARE_CASES = [(prompt, page) for prompt in (96, 100, 250) for page in (16, 40)]
N_SHARERS, OWN_ROWS = 8, 40
WINDOWS_3 = (2, 4, 8, 16, 24)
SEEDS_3, STARTS_3, STEPS_3 = (1, 2, 3), 16, 24
CONTEXTS_4 = (2048, 8192, 32768, 131072)
HBM, WEIGHTS, KV_PER_TOKEN, WINDOW_4 = 80e9, 7e9, 256 * 1024, 4096
DECODE_FILES = {"none": "decode_none.json", "8": "decode_8.json", "4": "decode_4.json"}


# ---- part 1 ------------------------------------------------------------------------------------------
def sample_lengths() -> list[int]:
    """The 400 request lengths of the chapter: long-tailed (lognormal), clamped to 16..2048 rows."""
    R = random.Random(11)
    return [min(LONGEST, max(16, int(R.lognormvariate(5.2, 0.9)))) for _ in range(400)]


def admit_contiguous(lens) -> tuple[int, int, int]:
    """Admit requests in order, each reserving LONGEST rows: (held, rows used, rows reserved)."""
    n = used = 0
    for L in lens:
        if (n + 1) * LONGEST > CAP:
            break
        n, used = n + 1, used + L
    return n, used, n * LONGEST


def admit_paged(lens, page: int) -> tuple[int, int, int]:
    """Admit requests in order, each growing page by page until the pool runs out (the failing
    request is given back and admission stops): (held, rows used, rows in the pages taken)."""
    pt = PageTable(CAP // page, page)
    n = used = 0
    for i, L in enumerate(lens):
        pt.new(i)
        try:
            for _ in range(L):
                pt.append(i, None)
        except OutOfPages:
            pt.release(i)
            break
        n, used = n + 1, used + L
    return n, used, pt.used() * page


def memory_study() -> dict:
    lens = sample_lengths()
    res = {"lengths": {"mean": sum(lens) / len(lens), "median": sorted(lens)[len(lens) // 2], "max": max(lens)},
           "contiguous": list(admit_contiguous(lens)), "paged": {}}
    for page in PAGES_1:
        res["paged"][page] = list(admit_paged(lens, page))
    return res


# ---- part 2 ------------------------------------------------------------------------------------------
def share_case(prompt: int, page: int) -> tuple[int, int, int]:
    """(pages when every request holds its own copy of the prompt, pages when the prompt is shared,
    copy-on-write copies made)."""
    copied = PageTable(400, page)
    for i in range(N_SHARERS):
        copied.new(i)
        for _ in range(prompt + OWN_ROWS):
            copied.append(i, None)
    shared = PageTable(400, page)
    shared.new("prompt")
    for _ in range(prompt):
        shared.append("prompt", None)
    copies = 0
    for i in range(N_SHARERS):
        shared.fork("prompt", i)
        for _ in range(OWN_ROWS):
            boundary = shared.length(i) % page == 0          # a new page is due anyway
            before = shared.used()
            shared.append(i, None)
            copies += shared.used() > before and not boundary
    shared.release("prompt")
    return copied.used(), shared.used(), copies


def sharing_study() -> dict:
    return {f"{prompt}/{page}": list(share_case(prompt, page)) for prompt, page in SHARE_CASES}


# ---- part 3 ------------------------------------------------------------------------------------------
def window_case(m, start: int, W: int, steps: int = STEPS_3) -> tuple[int, list[float]]:
    """Teacher-forced on the full-context float tokens: (decisions that agree, relative RMS logit errors)."""
    from host import tiny_lm as T
    ft = T.float_generate(m, start, steps, None)
    fk, fv, wk, wv = [], [], [], []
    agree, errs = 0, []
    for L in range(1, steps + 1):
        a, ka, va, _ = T.float_step(m, ft[L - 1], fk, fv)
        b, kb, vb, _ = T.float_windowed(m, ft[L - 1], wk, wv, W)
        fk.append(ka), fv.append(va), wk.append(kb), wv.append(vb)
        agree += T.argmax(a) == T.argmax(b)
        errs.append(math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / sum(x * x for x in a)))
    return agree, errs


def window_study() -> dict:
    from host import tiny_lm as T
    models = [T.make_model("random", s) for s in SEEDS_3]
    res = {}
    for W in WINDOWS_3:
        agree, errs = 0, []
        for m in models:
            for s in range(STARTS_3):
                a, e = window_case(m, s, W)
                agree += a
                errs += e
        res[W] = [agree, len(errs), sum(errs) / len(errs)]
    return res


# ---- part 4 ------------------------------------------------------------------------------------------
def max_batch(kv_bytes_per_request: float) -> int:
    return int((HBM - WEIGHTS) // kv_bytes_per_request)


def serving_study() -> dict:
    res = {}
    for ctx in CONTEXTS_4:
        full, win = KV_PER_TOKEN * ctx, KV_PER_TOKEN * min(ctx, WINDOW_4)
        res[ctx] = [full, win, max_batch(full), max_batch(win)]
    return res


# ---- printing ------------------------------------------------------------------------------------------
def table_memory(r) -> list[str]:
    ln = r["lengths"]
    out = [f"== 1. memory: how many requests fit in a pool of {CAP:,} cache rows? The contiguous scheme reserves "
           f"the longest allowed length ({LONGEST:,}) per request; the paged one takes a page when it needs one.",
           f"   400 sample lengths: mean {ln['mean']:.0f}, median {ln['median']}, max {ln['max']}",
           f"{'scheme':26s} {'requests held':>14s} {'rows used':>10s} {'rows reserved':>14s} {'wasted':>8s}"]
    rows = [(f"contiguous (reserve {LONGEST})", r["contiguous"])]
    rows += [(f"paged, page = {p}", r["paged"][p]) for p in PAGES_1]
    for name, (n, u, res) in rows:
        out.append(f"{name:26s} {n:14d} {u:10d} {res:14d} {100 * (res - u) / res:7.1f}%")
    out.append("   (a paged request wastes only the unused tail of its last page, half a page on average)")
    return out


def table_sharing(r) -> list[str]:
    out = [f"== 2. prefix sharing: {N_SHARERS} requests start with the same prompt, then each writes "
           f"{OWN_ROWS} rows of its own",
           f"{'prompt rows':>12s} {'page':>5s} {'pages, copied':>14s} {'pages, shared':>14s} {'saved':>7s} "
           f"{'copy-on-write copies':>21s}"]
    for prompt, page in SHARE_CASES:
        c, s, cow = r[f"{prompt}/{page}"]
        out.append(f"{prompt:12d} {page:5d} {c:14d} {s:14d} {100 * (c - s) / c:6.0f}% {cow:21d}")
    out.append("   a prompt ending inside a page makes each request copy that page on its first append")
    return out


def table_window(r) -> list[str]:
    out = [f"== 3. accuracy a window costs: random models {', '.join(map(str, SEEDS_3))} x {STARTS_3} starts x "
           f"{STEPS_3} steps, teacher-forced on the full-context float tokens; window W against none",
           f"{'W':>4s} {'agreement':>18s} {'mean logit error':>17s}"]
    for W in WINDOWS_3:
        a, t, e = r[W]
        out.append(f"{W:4d} {a:6d}/{t} ({100 * a / t:5.1f}%) {100 * e:16.1f}%")
    out.append(f"   W = {STEPS_3} covers the whole {STEPS_3}-step context, so it is exact by construction")
    return out


def table_serving(r) -> list[str]:
    out = [f"== 4. serving arithmetic (derived; assumed: {HBM / 1e9:.0f} GB chip, 7B-class model with "
           f"{WEIGHTS / 1e9:.0f} GB of int8 weights, {KV_PER_TOKEN // 1024} KiB of cache per token)",
           f"{'context':>8s} {'KV GiB, full':>13s} {'max batch, full':>16s} {f'KV GiB, window {WINDOW_4}':>20s} "
           f"{'max batch, window':>18s}"]
    for ctx in CONTEXTS_4:
        full, win, bf, bw = r[ctx]
        out.append(f"{ctx:8d} {full / 2**30:13.2f} {bf:16d} {win / 2**30:20.2f} {bw:18d}")
    out.append("   with a window the cache stops growing, so the batch no longer shrinks with the context")
    return out


# ---- figures -------------------------------------------------------------------------------------------

FIGURES_HINT = "; --no-figures prints the tables alone"     # after a missing matplotlib's error


def fig_memory(r, path):
    plt = pyplot(hint=FIGURES_HINT)
    names = [f"contiguous\n(reserve {LONGEST})"] + [f"paged\npage {p}" for p in PAGES_1]
    vals = [r["contiguous"]] + [r["paged"][p] for p in PAGES_1]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    x = range(len(names))
    ax1.bar([i - 0.2 for i in x], [v[2] for v in vals], 0.4, label="rows reserved", color="tab:gray")
    ax1.bar([i + 0.2 for i in x], [v[1] for v in vals], 0.4, label="rows used", color="tab:blue")
    ax1.axhline(CAP, color="k", lw=0.8, ls="--", label=f"pool ({CAP} rows)")
    ax1.set_xticks(list(x), names, fontsize=8)
    ax1.set_ylabel("cache rows")
    ax1.set_title("Memory held per scheme")
    ax1.set_ylim(0, CAP * 1.25)
    ax1.legend(fontsize=8, loc="upper center", ncol=3)
    ax2.bar(list(x), [v[0] for v in vals], color="tab:green")
    for i, v in enumerate(vals):
        ax2.text(i, v[0] + 0.5, f"{v[0]}\n({100 * (v[2] - v[1]) / v[2]:.1f}% wasted)", ha="center", fontsize=7)
    ax2.set_xticks(list(x), names, fontsize=8)
    ax2.set_ylabel("requests held")
    ax2.set_ylim(0, max(v[0] for v in vals) * 1.3)
    ax2.set_title("Requests that fit (400 sampled lengths, in order)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig_sharing(r, path):
    plt = pyplot(hint=FIGURES_HINT)
    keys = [f"{p}/{g}" for p, g in SHARE_CASES]
    fig, ax = plt.subplots(figsize=(9, 4.6))
    x = range(len(keys))
    ax.bar([i - 0.2 for i in x], [r[k][0] for k in keys], 0.4, label="prompt copied per request", color="tab:gray")
    ax.bar([i + 0.2 for i in x], [r[k][1] for k in keys], 0.4, label="prompt shared (fork + copy-on-write)",
           color="tab:orange")
    for i, k in enumerate(keys):
        ax.text(i + 0.2, r[k][1] + 1, f"{r[k][2]} CoW", ha="center", fontsize=8)
    ax.set_xticks(list(x), [f"prompt {p}\npage {g}" for p, g in SHARE_CASES], fontsize=8)
    ax.set_ylabel("pages in use")
    ax.set_title(f"Prefix sharing: {N_SHARERS} requests, a common prompt, then {OWN_ROWS} own rows each")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig_window(r, path):
    plt = pyplot(hint=FIGURES_HINT)
    Ws = list(WINDOWS_3)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    ax.plot(Ws, [100 * r[W][0] / r[W][1] for W in Ws], "o-", color="tab:blue", label="decisions agreeing (%)")
    ax.plot(Ws, [100 * r[W][2] for W in Ws], "s--", color="tab:red", label="mean relative logit error (%)")
    for W in Ws:
        ax.annotate(f"{r[W][0]}/{r[W][1]}", (W, 100 * r[W][0] / r[W][1]), textcoords="offset points",
                    xytext=(0, 7), ha="center", fontsize=8)
    ax.set_xlabel("window W (tokens)")
    ax.set_ylabel("percent")
    ax.set_xticks(Ws)
    ax.set_xlim(0, max(Ws) + 3)
    ax.set_ylim(0, 108)
    ax.set_title("Window against full attention (random models, teacher-forced)")
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig_serving(r, path):
    plt = pyplot(hint=FIGURES_HINT)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    ax.plot(CONTEXTS_4, [r[c][2] for c in CONTEXTS_4], "o-", label="full attention")
    ax.plot(CONTEXTS_4, [r[c][3] for c in CONTEXTS_4], "s-", label=f"window {WINDOW_4}")
    for c in CONTEXTS_4:
        ax.annotate(str(r[c][2]), (c, r[c][2]), textcoords="offset points", xytext=(6, -12), fontsize=8)
        if r[c][3] != r[c][2]:
            ax.annotate(str(r[c][3]), (c, r[c][3]), textcoords="offset points", xytext=(0, 7), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("max batch (requests)")
    ax.set_title("Derived max batch on an 80 GB chip (7B-class model)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_decodes(out_dir) -> dict | None:
    """Per-step total cycles of the three decodes from DIR, or None if any file is missing."""
    cycles = {}
    for w, name in DECODE_FILES.items():
        p = os.path.join(out_dir, name)
        if not os.path.exists(p):
            return None
        try:
            with open(p) as fh:
                cycles[w] = [int(rec["counters"][0]) for rec in json.load(fh)["records"]]
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise StudyError(f"{p} is not a decode JSON file ({type(e).__name__}: {e})") from None
    return cycles


def fig_cycles(cycles, path):
    plt = pyplot(hint=FIGURES_HINT)
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for (w, c), style in zip(cycles.items(), ("o-", "s-", "^-")):
        ax.plot(range(1, len(c) + 1), c, style, ms=3, label="no window" if w == "none" else f"window {w}")
    ax.set_xlabel("decode step L")
    ax.set_ylabel("chip cycles per step")
    ax.set_title("GA-2 cycles per decode step: a window stops the growth")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- command -------------------------------------------------------------------------------------------
class StudyError(UsageError):
    """Bad command-line input for the study (one line)."""


def parse_parts(text: str) -> list[int]:
    try:
        parts = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise StudyError(f"--parts must be a comma-separated list of 1, 2, 3, 4, got {text!r}") from None
    if not parts or any(p not in (1, 2, 3, 4) for p in parts):
        raise StudyError(f"--parts must be a comma-separated list of 1, 2, 3, 4, got {text!r}")
    return parts


def run_decodes(out_dir, missing, out=None) -> None:
    """Run the decodes of `missing` (keys of DECODE_FILES) on the reference machine, as ``sim.decode
    --sim reference --json DIR/decode_W.json`` would, and write their JSON files into `out_dir`."""
    import io

    from sim import decode
    out = out or sys.stdout
    for w in missing:
        path = os.path.join(out_dir, DECODE_FILES[w])
        a = decode.build_parser().parse_args(["--window", w, "--sim", "reference", "--quiet", "--json", path])
        decode.check_args(a)
        print(f"decode with window {w} on the reference machine (its file was missing) ...", file=out, flush=True)
        write_json(path, decode.run_decode(a, out=io.StringIO()), out=out)


def build_parser() -> Parser:
    p = Parser("python -m sim.paging_study",
               "Example B of the chapter: part 1 memory (contiguous reservation against pages), part 2 prefix "
               "sharing with copy-on-write, part 3 the accuracy a window costs (about 10 s), part 4 serving "
               "arithmetic. Prints the tables, writes paging_study.json and the PNG figures into --out; the "
               "cycles-per-step figure comes from decode_none.json, decode_8.json and decode_4.json in --out "
               "(written by sim.decode --json, or run here on the reference machine when missing). Results of "
               "parts not run this time are kept in paging_study.json.",
               "python -m sim.paging_study --out docs/figures\npython -m sim.paging_study --out out --parts 1,2 "
               "--no-figures")
    p.add_argument("--out", type=output_dir, default="out", metavar="DIR",
                   help="where the JSON and PNG files go (created if missing)")
    p.add_argument("--parts", default="1,2,3,4", metavar="LIST",
                   help="which parts to run, e.g. 1,2,4 (part 3 takes ~10 s)")
    p.add_argument("--no-figures", action="store_true",
                   help="print and write JSON only (no matplotlib needed, no decodes run)")
    return p


def _previous_results(path) -> dict:
    """The results already in paging_study.json (other parts' runs), or {} if there is none readable."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    parts = parse_parts(args.parts)
    if not args.no_figures:
        pyplot(hint=FIGURES_HINT)   # say now, not after the tables, if matplotlib is missing
    make_dir(args.out)
    cycles = load_decodes(args.out)     # a bad decode file is refused before any work
    studies = {1: ("memory", memory_study, table_memory, fig_memory),
               2: ("sharing", sharing_study, table_sharing, fig_sharing),
               3: ("window", window_study, table_window, fig_window),
               4: ("serving", serving_study, table_serving, fig_serving)}
    results, written = {}, []
    for part in parts:
        key, study, table, fig = studies[part]
        results[key] = study()
        print("\n".join(table(results[key])) + "\n")
        if not args.no_figures:
            path = os.path.join(args.out, f"paging_{key}.png")
            fig(results[key], path)
            written.append(path)
    if cycles is None and not args.no_figures:
        missing = [w for w, name in DECODE_FILES.items() if not os.path.exists(os.path.join(args.out, name))]
        run_decodes(args.out, missing)
        cycles = load_decodes(args.out)
    if cycles is not None:
        results["cycles"] = cycles
        print("cycles per step from the decode files: " + "; ".join(
            f"{'no window' if w == 'none' else 'window ' + w}: step 1 {c[0]}, last {c[-1]}, total {sum(c)}"
            for w, c in cycles.items()))
        if not args.no_figures:
            path = os.path.join(args.out, "paging_cycles.png")
            fig_cycles(cycles, path)
            written.append(path)
    else:
        print(f"(no decode_none/8/4.json in {args.out}: run python -m sim.decode --json, or this command without "
              "--no-figures, to add the cycles figure)")
    path = os.path.join(args.out, "paging_study.json")
    doc = _previous_results(path)
    doc.update({k: ({str(kk): vv for kk, vv in v.items()} if isinstance(v, dict) else v)
                for k, v in results.items()})
    write_json(path, doc, say=False)
    written.append(path)
    print("wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
