"""``python -m sim.fuzz``: the ``ga2 fuzz`` command; its implementation is `sim.verify.fuzz`."""
from sim.cli import guarded
from sim.verify.fuzz import main

if __name__ == "__main__":
    raise SystemExit(guarded(main))
