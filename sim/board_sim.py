"""``python -m sim.board_sim``: the ``ga2 board-sim`` command; its implementation is `sim.board.boardsim`."""
from sim.board.boardsim import main
from sim.cli import guarded

if __name__ == "__main__":
    raise SystemExit(guarded(main))
