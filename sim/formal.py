"""``python -m sim.formal``: the ``ga2 formal`` command; its implementation is `sim.verify.formal`."""
from sim.cli import guarded
from sim.verify.formal import main

if __name__ == "__main__":
    raise SystemExit(guarded(main))
