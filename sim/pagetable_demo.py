"""Example A of the chapter: the page table at work, event by event (``python -m sim.pagetable_demo``).

Part 1: one request decodes 14 tokens with pages of 4 rows, a window of 6 tokens and a pool of 8 pages.
Part 2: a request B is forked from a 10-row request A and appends one row (copy on write), then is released.
Instant; ``--json PATH`` also writes the events as JSON.
"""
from __future__ import annotations

import sys

from host.pagetable import PageTable
from host.window import gather_bounds, trim_point
from sim.cli import Parser, guarded, output_file, write_json

POOL, PAGE, WINDOW, STEPS = 8, 4, 6, 14


def windowed_request(steps: int = STEPS, window: int = WINDOW, page: int = PAGE, pool: int = POOL) -> list[dict]:
    """Part 1: per step the rows gathered, then the block table, dropped pages and sorted free list."""
    pt = PageTable(pool, page)
    pt.new("A")
    log = []
    for L in range(1, steps + 1):
        lo, hi = gather_bounds(L, window)
        gathered = pt.rows("A", lo, hi)
        pt.append("A", L - 1)                 # the row is written as its token index
        pt.trim("A", trim_point(L, window))
        log.append({"step": L, "gathered": gathered, "table": list(pt.table("A")),
                    "dropped": pt.dropped("A"), "free": sorted(pt.free_pages()), "used": pt.used()})
    return log


def fork_and_write(pool: int = POOL, page: int = PAGE) -> dict:
    """Part 2: A holds rows 0..9; B = fork(A); B appends row 100; B is released."""
    pt = PageTable(pool, page)
    pt.new("A")
    for i in range(10):
        pt.append("A", i)

    def refs(*rids):
        pages = sorted({p for r in rids for p in pt.table(r)})
        return {p: pt.refcount(p) for p in pages}

    ev = {"before": {"A": list(pt.table("A")), "ref": refs("A")}}
    pt.fork("A", "B")
    ev["forked"] = {"A": list(pt.table("A")), "B": list(pt.table("B")), "ref": refs("A")}
    pt.append("B", 100)
    ev["written"] = {"A": list(pt.table("A")), "B": list(pt.table("B")), "ref": refs("A", "B")}
    ev["rows"] = {"A": pt.rows("A", 0, 10), "B": pt.rows("B", 0, 11)}
    pt.release("B")
    ev["released"] = {"ref": refs("A"), "free": sorted(pt.free_pages())}
    return ev


def report(log: list[dict], ev: dict) -> list[str]:
    """The printed lines (numbers, tables and free lists as in the chapter's recorded output)."""
    out = [f"== 1. one request: pages of {PAGE} rows, window of {WINDOW} tokens "
           f"(a step reads the new token and up to {WINDOW - 1} cached rows)",
           f"   rows hold their token index; pool of {POOL} physical pages numbered 0..{POOL - 1}, "
           "taken from the end of the free list"]
    for e in log:
        out.append(f"  step {e['step']:2d}: reads rows {e['gathered']} + the new one; wrote row {e['step'] - 1} -> "
                   f"table {e['table']}  dropped pages {e['dropped']}  free {e['free']}")
    out.append(f"   pages in use at the end: {log[-1]['used']} (without a window the request would hold "
               f"{-(-len(log) // PAGE)})")
    out.append("")
    out.append("== 2. B = fork(A) shares every page; B's first append finds its last page shared and copies it")
    b, f, w, r = ev["before"], ev["forked"], ev["written"], ev["released"]
    out.append(f"   before the fork:  A {b['A']} refcounts {b['ref']}")
    out.append(f"   after the fork:   A {f['A']}  B {f['B']} refcounts {f['ref']}  (the prefix is stored once)")
    out.append(f"   B appends row 100 (A's last page, rows 8 and 9, has room but is shared): A {w['A']}  B {w['B']} "
               f"refcounts {w['ref']}")
    out.append(f"   A's rows are untouched: {ev['rows']['A']}   B's rows: {ev['rows']['B']}")
    out.append(f"   release B: A's pages keep their counts: {r['ref']} free {r['free']}")
    return out


def build_parser() -> Parser:
    p = Parser("python -m sim.pagetable_demo",
               f"Example A of the chapter, event by event: part 1 one request decodes {STEPS} tokens with pages "
               f"of {PAGE} rows, a window of {WINDOW} tokens and a pool of {POOL} pages; part 2 a request is "
               "forked, appends one row (copy on write) and is released. Instant.",
               "python -m sim.pagetable_demo --json out/example_a.json")
    p.add_argument("--json", type=output_file, metavar="PATH", help="also write the events to PATH as JSON")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    log, ev = windowed_request(), fork_and_write()
    print("\n".join(report(log, ev)))
    if args.json:
        write_json(args.json, {"log": log, "fork": {k: {kk: ({str(p): c for p, c in vv.items()} if isinstance(vv, dict)
                                                               else vv) for kk, vv in v.items()}
                                                      for k, v in ev.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
