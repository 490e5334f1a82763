"""Verification tools: random and the spec's directed programs (`progen`, `programs`), the fuzzer
(`fuzz`), mutation testing (`mutants`) and formal proofs (`formal`).

Their commands stay ``python -m sim.progen``, ``python -m sim.fuzz``, ``python -m sim.mutants`` and
``python -m sim.formal`` (thin entries at the top of `sim`).
"""
