"""The board: a behavioural model of the FPGA top's host link (`model`), and more to come (the
Verilator-simulated board behind a pseudo-terminal)."""
