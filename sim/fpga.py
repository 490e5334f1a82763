"""``python -m sim.fpga``: the ``ga2 fpga`` command; its implementation is `sim.flow.fpga`."""
from sim.cli import guarded
from sim.flow.fpga import main

if __name__ == "__main__":
    raise SystemExit(guarded(main))
