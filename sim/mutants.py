"""``python -m sim.mutants``: the ``ga2 mutants`` command; its implementation is `sim.verify.mutants`."""
from sim.cli import guarded
from sim.verify.mutants import main

if __name__ == "__main__":
    raise SystemExit(guarded(main))
