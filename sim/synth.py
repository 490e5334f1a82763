"""``python -m sim.synth``: the ``ga2 synth`` command; its implementation is `sim.flow.synth`."""
from sim.cli import guarded
from sim.flow.synth import main

if __name__ == "__main__":
    raise SystemExit(guarded(main))
