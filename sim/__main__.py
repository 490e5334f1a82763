"""``python -m sim COMMAND ...``: the ``ga2`` command without the console script installed."""
from sim.ga2 import entry

entry()
