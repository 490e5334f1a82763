"""Performance accounting on the reference machine (issue 23): where every chip cycle of a run goes
(`sim.perf.breakdown`) and the roofline figure of it (`sim.perf.roofline`). ``ga2 profile`` (sim/profile.py)
is the command."""
