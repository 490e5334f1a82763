"""``python -m sim.progen``: the ``ga2 progen`` command; its implementation is `sim.verify.progen`."""
from sim.cli import guarded
from sim.verify.progen import main

if __name__ == "__main__":
    raise SystemExit(guarded(main))
