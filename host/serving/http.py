"""The OpenAI-compatible HTTP API over a `host.serving.service.CompletionService` (issue 22): FastAPI.

Endpoints (`create_app`):

- ``POST /v1/completions``: OpenAI's legacy completions. ``prompt`` is a list of token ids 0..15 or a string
  of hex digits (one digit a token: the tiny LM's vocabulary is 16 tokens); a choice's ``text`` is its
  generated tokens as hex digits, so prompt and completion read the same way. ``max_tokens`` (default 16),
  ``stream`` (server-sent events: one ``data: {json}`` chunk per token as the chip makes it, the last
  token's chunk with its ``finish_reason``, then ``data: [DONE]``; ``stream_options.include_usage`` adds a
  usage chunk), ``stop`` (stop tokens: a hex digit, or a list of hex digits or token ids; a stop token
  ends its choice and, as in OpenAI's API, is not in ``text``; it is counted in ``usage``),
  ``temperature`` (0..2, default 0: the chip's argmax), ``top_k`` (vLLM's extra: 0 or -1 all, else 1..16),
  ``seed``, ``n``, ``priority`` (vLLM's extra: lower is served first; needs the priority policy). The
  response has ``usage``; each choice a ``finish_reason`` (``stop``, ``length``).
- ``GET /v1/models``, ``GET /health`` (200, or 503 once the service broke), ``GET /metrics`` (Prometheus).

Bad input gets an OpenAI-style error object ``{"error": {"message", "type", "param", "code"}}`` naming
the field: 400 for bad JSON, a bad field, a token outside 0..15, an unknown model, a prompt the chip could
never serve (the engine's own refusal), a prompt, ``max_tokens`` or ``n`` past the server's bounds; 404 and
405 for a path not served or a wrong method; 408 for a body that does not arrive within its time; 413 for a
body past its bound; 401 without ``Authorization: Bearer KEY`` (or with a wrong key) when the server has an
API key (the /v1 routes, as vLLM); 429 with ``Retry-After`` when the waiting queue is at its bound; 503
while shutting down. A client that disconnects aborts its request (its pages return at once).

Metrics (a `prometheus_client.CollectorRegistry` per app; named after vLLM's, ``ga2:`` for ``vllm:``, each
with the ``model_name`` label): requests running and waiting, KV-cache usage (the fraction of pages
requests hold, and the pages), prefix-cache queries and hits (rows), preemptions, prompt and generation
tokens, chip cycles, engine steps, finished requests by reason, refusals, 429s, replays checked and those
that differ; histograms of the time to first token and per output token, in seconds and in chip cycles,
and of the end-to-end latency in seconds.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from host.serving.service import (Accepted, Completion, CompletionService, Draining, Failed, Finished, QueueFull,
                                  Refused, Token)

__all__ = ["Limits", "ApiError", "HEX", "parse_completion", "create_app", "token_text"]

HEX = "0123456789abcdef"
# OpenAI's default for the legacy completions endpoint
DEFAULT_MAX_TOKENS = 16
# fields of OpenAI's completions request this server cannot honour unless at their neutral value
_NEUTRAL = {"echo": (None, False), "logprobs": (None,), "suffix": (None,), "presence_penalty": (None, 0, 0.0),
            "frequency_penalty": (None, 0, 0.0), "top_p": (None, 1, 1.0), "logit_bias": (None, {})}
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0)
CYCLES_BUCKETS = tuple(float(m * 10 ** e) for e in range(3, 9) for m in (1, 2, 5))


@dataclass(frozen=True)
class Limits:
    """The server's bounds on a request: its body in bytes, its prompt in tokens, ``max_tokens`` and ``n``, and
    the seconds its body may take to arrive once its headers have (a client that stops sending it would
    otherwise hold its connection, and the server's shutdown, for ever)."""
    max_body_bytes: int = 65536
    max_prompt_tokens: int = 1024
    max_tokens: int = 1024
    max_n: int = 16
    body_timeout: float = 30.0


class ApiError(Exception):
    """An HTTP error with OpenAI's error object: ``status``, ``message``, the ``param`` it is about."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status, headers=self.headers)


def token_text(tokens) -> str:
    """Tokens 0..15 as hex digits, one a token."""
    return "".join(HEX[t] for t in tokens)


def _int(body: dict, name: str, default, lo=None, hi=None, limit_name: str | None = None):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"{name} must be an integer, got {json.dumps(v)}", name)
    if lo is not None and v < lo:
        raise ApiError(400, f"{name} must be >= {lo}, got {v}", name)
    if hi is not None and v > hi:
        what = f"the server's limit ({limit_name}) is {hi}" if limit_name else f"it must be <= {hi}"
        raise ApiError(400, f"{name} is {v}; {what}", name)
    return v


def _token(v, name: str) -> int:
    """A token: an id 0..15, or one hex digit."""
    if isinstance(v, str) and len(v) == 1 and v.lower() in HEX:
        return HEX.index(v.lower())
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 16:
        return v
    raise ApiError(400, f"{name} must be tokens 0..15 (ids, or hex digits one a token), got {json.dumps(v)}", name)


def _prompt(v, limits: Limits) -> tuple:
    if v is None:
        raise ApiError(400, "prompt is required: a list of token ids 0..15 or a string of hex digits", "prompt")
    if isinstance(v, str):
        bad = next((ch for ch in v if ch.lower() not in HEX), None)
        if bad is not None:
            raise ApiError(400, f"prompt: {bad!r} is not a hex digit (one hex digit a token 0..15)", "prompt")
        toks = tuple(HEX.index(ch.lower()) for ch in v)
    elif isinstance(v, list):
        if v and all(isinstance(x, (str, list)) for x in v):
            raise ApiError(400, "prompt: a batch of prompts is not served; send one request per prompt", "prompt")
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 16:
                raise ApiError(400, f"prompt[{i}] is {json.dumps(x)}: a token must be an integer 0..15", "prompt")
        toks = tuple(v)
    else:
        raise ApiError(400, f"prompt must be a list of token ids 0..15 or a string of hex digits, got "
                            f"{type(v).__name__}", "prompt")
    if not toks:
        raise ApiError(400, "prompt is empty: it needs at least one token", "prompt")
    if len(toks) > limits.max_prompt_tokens:
        raise ApiError(400, f"prompt has {len(toks)} tokens; the server's limit (max_prompt_tokens) is "
                            f"{limits.max_prompt_tokens}", "prompt")
    return toks


def _stop(v) -> tuple:
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v if isinstance(v, list) else None
    if items is None:
        raise ApiError(400, f"stop must be a hex digit or a list of them (or of token ids), got {json.dumps(v)}",
                       "stop")
    if len(items) > 16:
        raise ApiError(400, f"stop has {len(items)} entries; at most 16 (the vocabulary)", "stop")
    for x in items:
        if isinstance(x, str) and len(x) != 1:
            raise ApiError(400, f"stop: {json.dumps(x)} is not one token; a stop sequence here is one hex digit "
                                f"(multi-token stop sequences are not served)", "stop")
    return tuple(sorted({_token(x, "stop") for x in items}))


def parse_completion(body, model: str, limits: Limits, priority_policy: bool, tag: str = "") -> tuple:
    """Check a ``/v1/completions`` body; returns ``(Completion, stream, include_usage)`` or raises
    `ApiError` (400) naming the first bad field."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    name = body.get("model")
    if name is None:
        raise ApiError(400, f"model is required (this server serves {model!r})", "model")
    if name != model:
        raise ApiError(400, f"model {json.dumps(name)} does not exist; this server serves {model!r}", "model",
                       code="model_not_found")
    prompt = _prompt(body.get("prompt"), limits)
    max_tokens = _int(body, "max_tokens", DEFAULT_MAX_TOKENS, 1, limits.max_tokens, "max_tokens")
    n = _int(body, "n", 1, 1, limits.max_n, "max_n")
    if _int(body, "best_of", n) != n:
        raise ApiError(400, f"best_of must equal n ({n}) or be absent, got {json.dumps(body['best_of'])}", "best_of")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream must be true or false, got {json.dumps(stream)}", "stream")
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool)):
        raise ApiError(400, f"stream_options must be an object with include_usage true or false, got "
                            f"{json.dumps(opts)}", "stream_options")
    if opts and not stream:
        raise ApiError(400, "stream_options is only allowed with stream true", "stream_options")
    temperature = body.get("temperature")
    if temperature is None:
        temperature = 0.0
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not (math.isfinite(temperature) and 0 <= temperature <= 2):
        raise ApiError(400, f"temperature must be a number within 0..2, got {json.dumps(temperature)}", "temperature")
    top_k = _int(body, "top_k", 0, -1, 16)
    seed = _int(body, "seed", None, -(2 ** 63), 2 ** 63 - 1)
    priority = _int(body, "priority", 0, -(2 ** 31), 2 ** 31 - 1)
    if priority and not priority_policy:
        raise ApiError(400, "priority is only served with the priority policy (ga2 serve --policy priority)",
                       "priority")
    for key, neutral in _NEUTRAL.items():
        if key in body and not any(body[key] == x and type(body[key]) is type(x) for x in neutral):
            raise ApiError(400, f"{key} is not served here (only {', '.join(json.dumps(x) for x in neutral)})", key)
    c = Completion(prompt, max_tokens, n, _stop(body.get("stop")), float(temperature), max(top_k, 0), seed,
                   -priority, tag)           # vLLM's priority: lower first; the engine's: higher first
    return c, stream, bool(opts and opts.get("include_usage"))


# ---- metrics ------------------------------------------------------------------------------------------------

class _ServiceCollector:
    """The service's figures, read at every scrape."""

    def __init__(self, service: CompletionService, model: str):
        self.service, self.model = service, model

    def describe(self):
        return []

    def collect(self):
        s = self.service.stats()
        lab = [self.model]

        def gauge(name, doc, value):
            g = GaugeMetricFamily(f"ga2:{name}", doc, labels=["model_name"])
            g.add_metric(lab, value)
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(f"ga2:{name}", doc, labels=["model_name"])
            c.add_metric(lab, value)
            return c
        yield gauge("num_requests_running", "Requests running on the chip (a request's n choices count n).",
                    s.running)
        yield gauge("num_requests_waiting", "Requests waiting for admission.", s.waiting)
        yield gauge("kv_cache_usage_perc", "KV-cache usage: the fraction of the pool's pages requests hold (0..1).",
                    s.kv_usage)
        yield gauge("kv_cache_pages_used", "Pages of the KV-cache pool requests hold.", s.pages_used)
        yield gauge("kv_cache_pages_total", "Pages of the KV-cache pool.", s.pages_total)
        yield counter("prefix_cache_queries", "Prefix-cache queries: prompt rows looked up at admission.",
                      s.prefix_queries)
        yield counter("prefix_cache_hits", "Prefix-cache hits: rows found cached (not computed).", s.prefix_hits)
        yield counter("num_preemptions", "Preemptions (by recompute).", s.preemptions)
        yield counter("prompt_tokens", "Prompt tokens of the requests admitted.", s.prompt_tokens)
        yield counter("generation_tokens", "Tokens generated.", s.generation_tokens)
        yield counter("chip_cycles", "Chip cycles run (the engine's clock).", s.chip_cycles)
        yield counter("engine_steps", "Engine steps run.", s.engine_steps)
        done = CounterMetricFamily("ga2:request_success", "Choices finished, by reason.",
                                   labels=["model_name", "finished_reason"])
        for reason in ("stop", "length", "abort"):
            done.add_metric(lab + [reason], s.finished.get(reason, 0))
        yield done
        yield counter("requests_refused", "Requests the chip could never serve (400).", s.refused)
        yield counter("replays_checked", "Choices compared with their replay alone.", s.replays_checked)
        yield counter("replays_differ", "Choices that differ from their replay alone.", s.replays_differ)


class _Metrics:
    def __init__(self, service: CompletionService, model: str):
        self.registry = CollectorRegistry()
        self.registry.register(_ServiceCollector(service, model))
        r, lab = self.registry, ["model_name"]
        self.ttft_s = Histogram("ga2:time_to_first_token_seconds", "Time to first token (s), from the request's "
                                "arrival at the server.", lab, buckets=SECONDS_BUCKETS, registry=r).labels(model)
        self.ttft_c = Histogram("ga2:time_to_first_token_cycles", "Time to first token in chip cycles, from the "
                                "request's arrival at the engine.", lab, buckets=CYCLES_BUCKETS, registry=r).labels(model)
        self.tpot_s = Histogram("ga2:time_per_output_token_seconds", "Time between a choice's consecutive tokens "
                                "(s).", lab, buckets=SECONDS_BUCKETS, registry=r).labels(model)
        self.tpot_c = Histogram("ga2:time_per_output_token_cycles", "Time between a choice's consecutive tokens "
                                "in chip cycles.", lab, buckets=CYCLES_BUCKETS, registry=r).labels(model)
        self.e2e_s = Histogram("ga2:e2e_request_latency_seconds", "Time from a request's arrival to its last "
                               "choice's end (s).", lab, buckets=SECONDS_BUCKETS, registry=r).labels(model)
        self.rejected = Counter("ga2:requests_rejected_queue_full", "Requests answered 429 (the waiting queue at "
                                "its bound).", lab, registry=r).labels(model)


class _Timing:
    """One request's clock: observes TTFT and TPOT, in seconds and cycles, as its tokens arrive."""

    def __init__(self, metrics: _Metrics, t0: float):
        self.m, self.t0 = metrics, t0
        self.last: dict = {}

    def tokens(self, events) -> None:
        now = time.perf_counter()
        for ev in events:
            if not isinstance(ev, Token):
                continue
            if ev.index == 0:
                self.m.ttft_s.observe(now - self.t0)
                self.m.ttft_c.observe(ev.cycles)
            elif ev.choice in self.last:
                t, c = self.last[ev.choice]
                self.m.tpot_s.observe(now - t)
                self.m.tpot_c.observe(ev.cycles - c)
            self.last[ev.choice] = (now, ev.cycles)

    def end(self) -> None:
        self.m.e2e_s.observe(time.perf_counter() - self.t0)


# ---- the app --------------------------------------------------------------------------------------------------

async def _read_body(request: Request, limits: Limits) -> bytes:
    limit = limits.max_body_bytes
    size = request.headers.get("content-length")
    too_big = ApiError(413, f"the request body exceeds the server's limit (max_body_bytes) of {limit} bytes")
    if size is not None and size.isdigit() and int(size) > limit:
        raise too_big
    data = bytearray()
    try:
        async with asyncio.timeout(limits.body_timeout):
            async for chunk in request.stream():
                data += chunk
                if len(data) > limit:
                    raise too_big
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within the server's limit (body_timeout) of "
                            f"{limits.body_timeout:g} s") from None
    except ClientDisconnect:            # nobody reads the answer; raised so that nothing else runs
        raise ApiError(400, "the client went before its body arrived") from None
    return bytes(data)


async def _until_disconnect(receive) -> None:
    while True:
        if (await receive())["type"] == "http.disconnect":
            return


def create_app(service: CompletionService, model: str, limits: Limits = Limits(), api_key: str | None = None,
               priority_policy: bool = False, drain_on_shutdown: bool = True) -> FastAPI:
    """The FastAPI app serving `service` under the model name `model` (see the module's docstring).

    Parameters
    ----------
    service : CompletionService
        Started; the app drains it at shutdown when ``drain_on_shutdown``.
    limits : Limits
    api_key : str or None
        Required as ``Authorization: Bearer KEY`` on the /v1 routes when given.
    priority_policy : bool
        Whether the engine orders by priority (else a request with a priority is refused, as in vLLM).
    """
    metrics = _Metrics(service, model)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        if drain_on_shutdown:
            service.begin_drain()
            await asyncio.to_thread(service.drain)

    app = FastAPI(title="GA-2", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = metrics
    app.state.service = service

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, key = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), api_key.encode()):
            raise ApiError(401, "a valid API key is required: Authorization: Bearer KEY", None,
                           "invalid_request_error", "invalid_api_key")

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        # Starlette's own answers (a path not served, a wrong method): OpenAI's error object, not {"detail"}
        return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                        headers=exc.headers).response()

    @app.get("/health")
    async def health():
        if not service.healthy:
            return JSONResponse({"error": {"message": "the engine stopped", "type": "server_error", "param": None,
                                           "code": None}}, status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "ga2"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        authorize(request)
        t0 = time.perf_counter()
        raw = await _read_body(request, limits)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, f"the body is not valid JSON: {exc}") from None
        except RecursionError:          # within max_body_bytes a body can still nest past the parser's stack
            raise ApiError(400, "the body is not valid JSON here: it nests too deeply") from None
        cid = f"cmpl-{uuid.uuid4().hex}"
        c, stream_it, include_usage = parse_completion(body, model, limits, priority_policy, cid)
        try:
            stream = service.submit(c)
        except QueueFull as exc:
            metrics.rejected.inc()
            raise ApiError(429, f"the server is busy: {exc}; retry after {exc.retry_after} s", None,
                           "rate_limit_error", "queue_full", {"Retry-After": str(exc.retry_after)}) from None
        except Draining:
            raise ApiError(503, "the server is shutting down", None, "server_error", "draining") from None
        timing = _Timing(metrics, t0)
        try:
            first = await stream.next_events()
        except asyncio.CancelledError:
            stream.abort()
            raise
        ev = first[0]
        if isinstance(ev, Refused):
            raise ApiError(400, f"prompt of {len(c.prompt)} tokens with max_tokens {c.max_tokens} and n {c.n}: "
                                f"{ev.message}", "prompt")
        if isinstance(ev, Failed):
            raise ApiError(500, f"the engine failed: {ev.message}", None, "server_error")
        assert isinstance(ev, Accepted), ev
        created_at = int(time.time())
        head = {"id": cid, "object": "text_completion", "created": created_at, "model": model}
        if stream_it:
            return StreamingResponse(_sse(stream, c, head, timing, include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _whole(request, stream, c, head, timing)

    return app


def _usage(c: Completion, tokens: dict) -> dict:
    done = sum(len(t) for t in tokens.values())
    return {"prompt_tokens": len(c.prompt), "completion_tokens": done, "total_tokens": len(c.prompt) + done}


def _visible(fin: Finished | None, ev: Token) -> str:
    # a stop token ends its choice and is not in the text (OpenAI's stop sequences are not)
    last = fin is not None and ev.index == len(fin.tokens) - 1
    return "" if last and fin.reason == "stop" else HEX[ev.token]


def _event(doc) -> str:
    # one server-sent event: compact JSON on one line
    return "data: " + json.dumps(doc, separators=(",", ":")) + "\n\n"


async def _sse(stream, c: Completion, head: dict, timing: _Timing, include_usage: bool):

    """The server-sent events of a streamed completion: a chunk per token (the last one of a choice with its
    finish_reason), then the usage (if asked) and ``[DONE]``; aborts the request if the client goes."""
    tokens: dict = {}
    try:
        while not stream.ended:
            events = await stream.next_events()
            timing.tokens(events)
            fins = {ev.choice: ev for ev in events if isinstance(ev, Finished)}
            told = set()
            out = []
            for ev in events:
                if isinstance(ev, Failed):
                    yield _event({"error": {"message": f"the engine failed: {ev.message}", "type": "server_error",
                                            "param": None, "code": None}})
                    return
                if isinstance(ev, Token):
                    tokens.setdefault(ev.choice, []).append(ev.token)
                    fin = fins.get(ev.choice)
                    last = fin is not None and ev.index == len(fin.tokens) - 1
                    out.append({"index": ev.choice, "text": _visible(fin, ev), "logprobs": None,
                                "finish_reason": fin.reason if last else None})
                    if last:
                        told.add(ev.choice)
                elif isinstance(ev, Finished) and ev.choice not in told:
                    out.append({"index": ev.choice, "text": "", "logprobs": None, "finish_reason": ev.reason})
            for choice in out:
                yield _event({**head, "choices": [choice]})
        timing.end()
        if include_usage:
            yield _event({**head, "choices": [], "usage": _usage(c, tokens)})
        yield "data: [DONE]\n\n"
    finally:
        stream.abort()          # no effect once it ended; a client gone mid-stream cancels its request


async def _whole(request: Request, stream, c: Completion, head: dict, timing: _Timing):
    """A completion answered at once, when every choice has ended; a client gone meanwhile aborts it."""
    gone = asyncio.ensure_future(_until_disconnect(request.receive))
    tokens: dict = {}
    reasons: dict = {}
    try:
        while not stream.ended:
            nxt = asyncio.ensure_future(stream.next_events())
            await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                nxt.cancel()
                stream.abort()
                return Response(status_code=499)
            events = nxt.result()
            timing.tokens(events)
            for ev in events:
                if isinstance(ev, Failed):
                    raise ApiError(500, f"the engine failed: {ev.message}", None, "server_error")
                if isinstance(ev, Finished):
                    reasons[ev.choice] = ev.reason
                    tokens[ev.choice] = list(ev.tokens)
        timing.end()
    finally:
        gone.cancel()
        stream.abort()
    choices = []
    for j in range(c.n):
        toks = tokens[j]
        shown = toks[:-1] if reasons[j] == "stop" else toks
        choices.append({"index": j, "text": token_text(shown), "logprobs": None, "finish_reason": reasons[j]})
    return JSONResponse({**head, "choices": choices, "usage": _usage(c, tokens)})
