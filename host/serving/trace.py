"""The synthetic request trace of ``sim.serve``: lengths of Example B's long-tailed shape, shared prefixes,
arrivals all at once or Poisson, optional priorities; a pure function of its arguments."""
from __future__ import annotations

import random

from host.engine import Request

__all__ = ["N_PREFIXES", "PREFIX_LEN", "make_trace"]

N_PREFIXES = 2           # shared prefixes of a trace
PREFIX_LEN = 24          # tokens of each (a long shared system prompt)


def _long_tail(gen, lo: int, hi: int) -> int:
    # Example B's lengths (lognormal(5.2, 0.9) within 16..2048 rows) mapped linearly onto lo..hi
    x = min(2048, max(16, int(gen.lognormvariate(5.2, 0.9))))
    return min(hi, lo + (x - 16) * (hi - lo + 1) // (2048 - 16 + 1))


def make_trace(n: int, seed: int, prompt_len=(2, 16), gen_len=(2, 16), prefix_share: float = 0.0,
               arrivals=("all", 0.0), priorities: int = 1) -> list:
    """The synthetic trace: a list of `host.engine.Request` (ids 0..n-1), a function of its arguments.

    Parameters
    ----------
    n, seed
        Requests, and the seed every draw derives from.
    prompt_len, gen_len
        ``(A, B)``: prompt tokens and tokens to generate, long-tailed within A..B.
    prefix_share
        The fraction of prompts that begin with one of `N_PREFIXES` shared prefixes of `PREFIX_LEN` tokens.
    arrivals
        ``("all", 0.0)``: every request at step 0; ``("poisson", rate)``: Poisson arrivals of `rate` requests
        per engine step.
    priorities
        With K > 1 each request gets a priority 0..K-1, drawn apart (the rest of the trace is unchanged).
    """
    gen = random.Random(seed)
    prio = random.Random(f"{seed}:priority")
    prefixes = [[gen.randrange(16) for _ in range(PREFIX_LEN)] for _ in range(N_PREFIXES)]
    t, reqs = 0.0, []
    for i in range(n):
        pl = _long_tail(gen, *prompt_len)
        gl = _long_tail(gen, *gen_len)
        if gen.random() < prefix_share:
            pre = prefixes[gen.randrange(N_PREFIXES)]
            prompt = pre[:pl] + [gen.randrange(16) for _ in range(pl - len(pre))]
        else:
            prompt = [gen.randrange(16) for _ in range(pl)]
        if arrivals[0] == "poisson" and i:
            t += gen.expovariate(arrivals[1])
        reqs.append(Request(i, prompt, gl, int(t), priority=prio.randrange(priorities) if priorities > 1 else 0))
    return reqs
