"""Serving beyond one chip: `multichip`, K chips behind a router (``python -m sim.serve --chips K``)."""
