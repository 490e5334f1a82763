"""The hardware flow: Verilog of every block with its lint (`verilog`), Yosys synthesis (`synth`) and the
ULX3S bitstream (`fpga`); the commands stay ``python -m sim.verilog``,
``python -m sim.synth`` and ``python -m sim.fpga``.
"""
