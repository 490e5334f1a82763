"""Host-side serving code, no simulator in it: the synthetic request trace (`trace`), the multi-chip router
(`router`) and the figures and replays of a served trace (`results`). The engine itself is `host.engine`;
the commands that wire these to a backend are `sim.serve` and `sim.serving.multichip`."""
