"""The load generator: a Poisson trace of streaming completions sent to a running OpenAI-compatible server.

    ga2 bench --serve --url http://127.0.0.1:8123 --requests 200 --rate 50

The prompts and their lengths to generate are the synthetic trace of ``ga2 serve`` (`make_trace` with the same
seed, lengths and prefix share: the same seed gives the same prompts whatever the rate). The arrival times
are drawn apart, from the seed too (`arrival_times`: Poisson at ``rate`` requests per second, or all at
once). Each request is a ``POST /v1/completions`` with ``stream: true``; the client times its first token
(TTFT), its last one and the gaps between (TPOT), and `summarize` reports them at p50, p90 and p99 with the
output tokens per second. A request that fails is counted by its HTTP status (or by what went wrong
without one: ``connection``, ``timeout``, ``stream``), never dropped.

Percentiles are nearest-rank: p of n values is the ceil(p n / 100)-th smallest, a value that was measured.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
import urllib.parse
from collections import Counter
from fractions import Fraction

__all__ = ["LoadGenError", "PERCENTILES", "check_url", "arrival_times", "trace_prompts", "percentile",
           "probe", "run_load", "request_tpot", "summarize", "report_lines"]

PERCENTILES = (50, 90, 99)
CONNECT_TIMEOUT = 10.0          # seconds to open a connection
READ_TIMEOUT = 120.0            # seconds the server may stay silent while a request's stream is open
REQUEST_TIMEOUT = 600.0         # seconds a request may take in all (a stream that trickles forever ends)
ERROR_BODY_BYTES = 65536        # of a failed request's body, read for its message


class LoadGenError(Exception):
    """The load cannot be sent: a bad URL, or a server that cannot be reached or lists no model (the
    message is one line and names the URL)."""


def check_url(text: str) -> str:
    """The server's base URL from `text` (``http[s]://HOST[:PORT][/PREFIX]``; a trailing ``/v1`` or ``/`` is
    dropped, the OpenAI paths are appended to it); a `LoadGenError` naming `text` if it is not one."""
    try:
        u = urllib.parse.urlsplit(text)
        _ = u.port                      # a port that is not a number raises here
    except ValueError:
        u = None
    if u is not None and "@" in u.netloc:
        # user:password@ would be sent as Basic auth, and printed in every line that names the URL
        shown = text.replace(u.netloc, "***@" + u.netloc.rpartition("@")[2], 1)
        raise LoadGenError(f"--url must not carry credentials; give the server's key with --api-key, got {shown!r}")
    if u is None or u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
        raise LoadGenError(f"--url must be http://HOST:PORT or https://HOST:PORT (a server's base URL), got {text!r}")
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urllib.parse.urlunsplit((u.scheme, u.netloc, path, "", ""))


def arrival_times(n: int, rate: float, seed: int) -> list:
    """When each of `n` requests is sent, in seconds after the first: a Poisson process of `rate` requests per
    second (exponential gaps drawn from `seed` alone, so the prompts, drawn from the same seed by the trace,
    do not depend on the rate), or all at 0 with ``rate`` infinite."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if math.isinf(rate):
        return [0.0] * n
    gen = random.Random(f"{seed}:arrival")
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += gen.expovariate(rate)
        out.append(t)
    return out


def trace_prompts(n: int, seed: int, prompt_len=(2, 16), gen_len=(2, 16), prefix_share: float = 0.0) -> list:
    """``(prompt, max_tokens)`` of the `n` requests of ``ga2 serve``'s synthetic trace of `seed` (its
    arrivals all at once: the prompts are the ones ``ga2 serve --seed S`` serves)."""
    from host.serving.trace import make_trace
    return [(list(r.prompt), r.gen) for r in make_trace(n, seed, prompt_len, gen_len, prefix_share)]


def percentile(values, p) -> float | None:
    """The nearest-rank `p`-th percentile of `values` (the ceil(p n / 100)-th smallest; p within 0..100, 0
    gives the smallest); None for no values."""
    v = sorted(values)
    if not v:
        return None
    frac = Fraction(str(p))
    if not 0 <= frac <= 100:
        raise ValueError(f"a percentile is within 0..100, got {p}")
    rank = max(1, math.ceil(frac * len(v) / 100))
    return v[rank - 1]


def _headers(api_key) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _error_text(raw: bytes) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``), else its first line."""
    text = raw.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
        err = doc.get("error", doc) if isinstance(doc, dict) else doc
        msg = err.get("message") or err.get("detail") if isinstance(err, dict) else None
        if msg:
            return str(msg).splitlines()[0][:300]
    except ValueError:
        pass
    return (text.strip().splitlines() or [""])[0][:300]


def probe(url: str, api_key=None, timeout: float = CONNECT_TIMEOUT, transport=None) -> str:
    """The model the server at `url` serves (the first of ``GET /v1/models``); a `LoadGenError` naming `url`
    when there is no server there, it refuses the key, or it lists no model."""
    import httpx
    try:
        with httpx.Client(timeout=timeout, transport=transport) as client:
            resp = client.get(f"{url}/v1/models", headers=_headers(api_key))
    except httpx.TimeoutException:
        raise LoadGenError(f"no answer from {url} within {timeout:g} s") from None
    except (httpx.TransportError, httpx.InvalidURL) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise LoadGenError(f"cannot connect to {url}: {reason}") from None
    if resp.status_code == 401:
        raise LoadGenError(f"{url}/v1/models answered 401 ({_error_text(resp.content)}): "
                           f"give the server's key with --api-key")
    if resp.status_code != 200:
        raise LoadGenError(f"{url}/v1/models answered {resp.status_code}: {_error_text(resp.content)}")
    try:
        return str(resp.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise LoadGenError(f"{url}/v1/models lists no model (is it an OpenAI-compatible server?)") from None


class _Failed(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _tokens_of(text) -> list:
    if not isinstance(text, str) or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise _Failed("stream", f"a choice's text is not hex digits: {str(text)[:40]!r}")
    return [int(c, 16) for c in text]


async def _stream(client, url, body, headers, rec, t_sent) -> None:
    """One streaming completion: fills `rec` with its status, tokens and times, or raises `_Failed`."""
    async with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as resp:
        rec["status"] = resp.status_code
        if resp.status_code != 200:
            raw = b""
            async for chunk in resp.aiter_bytes():
                raw += chunk
                if len(raw) >= ERROR_BODY_BYTES:
                    break
            raise _Failed(str(resp.status_code), _error_text(raw))
        done = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue                    # blank separators, comments and other SSE fields
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise _Failed("stream", f"an event that is not JSON: {data[:60]!r}") from None
            if not isinstance(chunk, dict):
                raise _Failed("stream", f"an event that is not a JSON object: {data[:60]!r}")
            if "error" in chunk:
                raise _Failed("stream", f"the server's error mid-stream: {_error_text(data.encode())}")
            now = time.perf_counter()
            if rec["response_id"] is None and chunk.get("id") is not None:
                rec["response_id"] = str(chunk["id"])      # the server's name for it (its replay log's)
            choices = chunk.get("choices") or []
            if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
                raise _Failed("stream", f"an event whose choices are not a list of objects: {data[:60]!r}")
            for choice in choices:
                if not isinstance(choice.get("finish_reason"), (str, type(None))):
                    raise _Failed("stream", f"a finish_reason that is not a string: {data[:60]!r}")
                if choice.get("index", 0) != 0:
                    raise _Failed("stream", f"a choice of index {choice.get('index')} for a request of n=1")
                toks = _tokens_of(choice.get("text", ""))
                if toks:
                    if rec["ttft_s"] is None:
                        rec["ttft_s"] = now - t_sent
                    rec["last_token_s"] = now - t_sent
                    rec["tokens"] += toks
                if choice.get("finish_reason"):
                    rec["finish_reason"] = choice["finish_reason"]
        if not done:
            raise _Failed("stream", "the stream ended before its [DONE]")
        if len(rec["tokens"]) > body["max_tokens"]:
            raise _Failed("stream", f"{len(rec['tokens'])} tokens for max_tokens {body['max_tokens']}")


async def _one(client, url, model, i, prompt, max_tokens, start_at, t0, headers, request_timeout) -> dict:
    import httpx
    rec = {"id": i, "prompt": prompt, "max_tokens": max_tokens, "scheduled_s": start_at - t0, "sent_s": None,
           "response_id": None, "status": None, "error": None, "error_kind": None, "tokens": [], "finish_reason": None,
           "ttft_s": None, "last_token_s": None, "e2e_s": None}
    delay = start_at - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    t_sent = time.perf_counter()
    rec["sent_s"] = t_sent - t0
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    try:
        await asyncio.wait_for(_stream(client, url, body, headers, rec, t_sent), request_timeout)
        rec["e2e_s"] = time.perf_counter() - t_sent
    except _Failed as e:
        rec["error_kind"], rec["error"] = e.kind, str(e)
    except (asyncio.TimeoutError, httpx.TimeoutException) as e:
        rec["error_kind"] = "timeout"
        rec["error"] = (f"no end within {request_timeout:g} s" if isinstance(e, asyncio.TimeoutError) else
                        f"{type(e).__name__}: the server was silent too long")
    except httpx.DecodingError as e:        # a body that is not what its Content-Encoding says
        rec["error_kind"], rec["error"] = "stream", f"DecodingError: {str(e).splitlines()[0] if str(e) else 'bad body'}"
    except httpx.TransportError as e:
        rec["error_kind"] = "connection"
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'connection lost'}"
    return rec


async def _run(url, model, prompts, times, api_key, progress, transport, request_timeout):
    import httpx
    timeout = httpx.Timeout(CONNECT_TIMEOUT, read=READ_TIMEOUT, pool=None)
    # no cap on connections: with a pool of httpx's default 100 a request would wait for a free connection
    # and the wait would be counted in its time to first token
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=len(prompts))
    headers = _headers(api_key)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport) as client:
        t0 = time.perf_counter() + 0.01        # the tasks are created before the first is due
        tasks = [asyncio.create_task(_one(client, url, model, i, p, g, t0 + at, t0, headers, request_timeout))
                 for i, ((p, g), at) in enumerate(zip(prompts, times))]
        done = 0
        for fut in asyncio.as_completed(tasks):
            await fut
            done += 1
            if progress is not None:
                progress(done, len(tasks))
        duration = time.perf_counter() - t0
    return [t.result() for t in tasks], duration


def run_load(url: str, prompts, times, model: str, api_key=None, progress=None, transport=None,
             request_timeout: float = REQUEST_TIMEOUT) -> tuple:
    """Send the completions ``prompts[i] = (prompt, max_tokens)`` to `url` at ``times[i]`` seconds (see
    `arrival_times`), streamed, and wait for all. Returns ``(records, duration)``: one dict a request (its
    tokens and times in seconds, or its ``error_kind`` and ``error``) and the seconds from the first send
    to the last end. ``progress(done, total)`` is called as each request ends; `transport` is an httpx
    transport (tests)."""
    if len(prompts) != len(times):
        raise ValueError(f"{len(prompts)} prompts for {len(times)} arrival times")
    return asyncio.run(_run(url, model, list(prompts), list(times), api_key, progress, transport,
                            request_timeout))


def _figures(values) -> dict:
    out = {f"p{p}": percentile(values, p) for p in PERCENTILES}
    out["mean"] = sum(values) / len(values) if values else None
    out["max"] = max(values, default=None)
    return out


def request_tpot(r: dict) -> float | None:
    """The time per output token of a succeeded request `r` (a record of `run_load`): the seconds from its first
    token to its end over the tokens after the first; None with fewer than two tokens or an error."""
    if r["error_kind"] is not None or len(r["tokens"]) < 2:
        return None
    return (r["e2e_s"] - r["ttft_s"]) / (len(r["tokens"]) - 1)


def summarize(records, duration: float) -> dict:
    """The figures of a run's `records` (`run_load`): requests succeeded and failed (``errors``: counts by HTTP
    status or kind, ``error_examples``: the first message of each), output tokens and tokens per second
    over `duration`, and TTFT, TPOT (a request's (end - first token) / (tokens - 1), for requests of two
    tokens or more) and end-to-end latency at `PERCENTILES` with mean and max, in seconds."""
    ok = [r for r in records if r["error_kind"] is None]
    bad = [r for r in records if r["error_kind"] is not None]
    errors = Counter(r["error_kind"] for r in bad)
    examples = {}
    for r in bad:
        examples.setdefault(r["error_kind"], r["error"])
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    tpot = [t for t in map(request_tpot, ok) if t is not None]
    e2e = [r["e2e_s"] for r in ok]
    tokens = sum(len(r["tokens"]) for r in ok)
    return {"requests": len(records), "succeeded": len(ok), "failed": len(bad),
            "errors": dict(sorted(errors.items())), "error_examples": dict(sorted(examples.items())),
            "output_tokens": tokens, "duration_s": duration,
            "output_tokens_per_s": tokens / duration if duration > 0 else None,
            "requests_per_s": len(ok) / duration if duration > 0 else None,
            "ttft_s": _figures(ttft), "tpot_s": _figures(tpot), "e2e_s": _figures(e2e)}


def _seconds(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def report_lines(s: dict) -> list:
    """The summary `s` (`summarize`) as printed lines: the counts, then one row a latency."""
    rate = s["output_tokens_per_s"]
    lines = [f"requests: {s['succeeded']} of {s['requests']} succeeded, {s['failed']} failed; "
             f"{s['output_tokens']} output tokens in {s['duration_s']:.2f} s: "
             f"{'-' if rate is None else f'{rate:,.1f}'} output tokens per second, "
             f"{'-' if s['requests_per_s'] is None else format(s['requests_per_s'], ',.1f')} requests per second"]
    if s["failed"]:
        kinds = ", ".join(f"{'HTTP ' + k if k.isdigit() else k} {n} (e.g. {s['error_examples'][k]!r})"
                          for k, n in s["errors"].items())
        lines.append(f"errors: {kinds}")
    head = "".join(f"{'p' + str(p):>10}" for p in PERCENTILES)
    lines.append(f"{'seconds':<24}{head}{'mean':>10}{'max':>10}")
    for key, label in (("ttft_s", "time to first token"), ("tpot_s", "time per output token"),
                       ("e2e_s", "end-to-end latency")):
        f = s[key]
        cells = "".join(f"{_seconds(f['p' + str(p)]):>10}" for p in PERCENTILES)
        lines.append(f"{label:<24}{cells}{_seconds(f['mean']):>10}{_seconds(f['max']):>10}")
    return lines
