"""``python -m sim.verilog``: the ``ga2 verilog`` command; its implementation is `sim.flow.verilog`."""
from sim.cli import guarded
from sim.flow.verilog import main

if __name__ == "__main__":
    raise SystemExit(guarded(main))
