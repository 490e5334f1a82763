"""``ga2 agreement`` (``python -m sim.agreement``): print the chip-against-float agreement study of
`host.agreement` (book: 559/576, mean 2.3 %, worst 6.1 %).

    python -m sim.agreement --steps 12 --seeds 1 2 3
"""
from __future__ import annotations

import sys

from host.agreement import MAX_STEPS, agreement_study
from host.tiny_lm import V
from sim.cli import Parser, Progress, guarded, int_range

__all__ = ["build_parser", "main"]


def build_parser() -> Parser:
    p = Parser("python -m sim.agreement",
               "The chip-against-float agreement study (model spec 6.1): random models, teacher-forced on the "
               "float model's tokens, the chip's token compared with the float token at every step of every "
               "start; the integer interpreter stands in for the chip. The book's figure: 559/576 with the "
               "default options (about 10 s); time grows with seeds x steps^2.",
               "python -m sim.agreement --steps 12 --seeds 1 2 3")
    p.add_argument("--steps", type=int_range(1, MAX_STEPS), default=12, metavar="N",
                   help=f"decode steps per start, 1..{MAX_STEPS} (the chip's longest context)")
    p.add_argument("--seeds", type=int_range(0, 2**32 - 1), nargs="+", default=[1, 2, 3], metavar="S",
                   help="random-model seeds")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    # the integer interpreter stands in for the chip here (host/ never imports a simulator); pass a
    # backend to agreement_study to run the programs on one
    with Progress("agreement", unit="decode") as bar:
        r = agreement_study(tuple(a.seeds), range(V), a.steps, progress=bar)
    print(f"random models {a.seeds} x {V} starts x {a.steps} steps, teacher-forced on the float tokens")
    print(f"{'agreement':>12s} {'mean rel. RMS logit error':>26s} {'worst':>8s}")
    print(f"{r['agree']:5d}/{r['total']:<6d} {100 * r['mean_err']:25.1f}% {100 * r['worst_err']:7.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
