"""The model and the engine that ``ga2 serve``'s options describe, built in one place for every way it serves
(a synthetic trace, ``--http``).

`model_of` and `make_engine` read the options from `a`, any object with the attributes of ``sim.serve``'s
parsed arguments they use (``model``, ``seed_model``, ``chip``, ``lat``, ``max_batch``, ``window``,
``sinks``, ``page``, ``pages``, ``no_prefix_cache``, ``alloc``, ``mode``, ``prefill``, and, if present,
``max_batched_tokens`` and ``policy``).
"""
from __future__ import annotations

from host import tiny_lm as T
from host.engine import Engine

__all__ = ["model_seed", "model_of", "make_engine"]


def model_seed(a) -> int:
    """The model's seed: ``a.seed_model``, else 1 for the structured model and 2 for the random one."""
    return a.seed_model if a.seed_model is not None else (1 if a.model == "structured" else 2)


def model_of(a) -> dict:
    """The tiny LM of `a`."""
    return T.make_model(a.model, model_seed(a))


def make_engine(a, m, backend, contig_rows: int, max_batch: int | None = None, engine_cls=None) -> Engine:
    """The engine of `a` for model `m` on `backend` (``max_batch`` overrides ``a.max_batch``; ``engine_cls``
    an `host.engine.Engine` subclass); ``contig_rows``: the rows each request reserves with ``--alloc
    contiguous`` (the longest request there may be)."""
    cfg = a.chip
    return (engine_cls or Engine)(
        m, backend, max_batch=max_batch or a.max_batch, window=a.window, sinks=a.sinks, page=a.page,
        n_pages=a.pages, prefix_cache=not a.no_prefix_cache, alloc=a.alloc, contig_rows=contig_rows,
        lat=cfg.lat if a.lat is None else a.lat, config=cfg, mode=a.mode, prefill=a.prefill,
        max_batched_tokens=getattr(a, "max_batched_tokens", None), policy=getattr(a, "policy", "fcfs"))
