"""``ga2 serve --http`` with real clients over a socket (issue 22 parts 1 and 2): httpx (streaming and not), the
official openai client, 64 concurrent streams each equal to its replay alone, a client that disconnects
mid-stream (its pages free at once), /metrics parsed by prometheus-client's parser, the API key, every bad
field's 400, the queue bound's 429, and the real command stopped by SIGTERM (exit status 0).

Each server binds 127.0.0.1 on a free port (port 0) and runs the reference machine; the tests stop it
themselves. Loops are bounded in count and time."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from host import tiny_lm as T
from host.batch import BatchRunner
from host.engine import Engine, decode_alone
from host.serving.service import Accepted, Completion, EngineService, Failed, Finished, Token
from sim.backends.reference import ReferenceMachine
from sim.serve import build_parser
from sim.serving.http_serve import make_server

M = T.make_model("structured", 1)
MODEL = "ga2-structured"
HEX = "0123456789abcdef"
# the shared server: no window (a prompt too long for the chip is refused), small bounds to test; the tests
# replay its requests themselves (the servers of the other tests check their replay logs)
SHARED = ["--window", "none", "--max-batch", "4", "--max-prompt-tokens", "100", "--max-tokens-limit", "64",
          "--max-n", "4", "--max-body-bytes", "4096", "--body-timeout", "1", "--no-verify"]
WAIT = 20.0                  # seconds any wait on the server may take at most


@contextlib.contextmanager
def running_server(args, tmp_path):
    """A server of ``ga2 serve --http 127.0.0.1:0 ARGS`` on a thread (uvicorn), stopped on exit: yields
    ``(url, service, replay log path)``."""
    log = str(tmp_path / f"replay-{time.monotonic_ns()}.jsonl")
    a = build_parser().parse_args(["--http", "127.0.0.1:0", "--sim", "reference", "--replay-log", log, *args])
    app, service, name, _ = make_server(a)
    assert name == MODEL
    service.start()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, http="h11", loop="asyncio"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    end = time.monotonic() + WAIT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < end, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", service, log
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with running_server(SHARED, tmp_path_factory.mktemp("http")) as srv:
        yield srv


def alone(prompt, gen, window=None, **kw):
    toks, logits, _ = decode_alone(M, prompt, gen, ReferenceMachine(), window, **kw)
    return toks


def completion(**kw):
    return {"model": MODEL, **kw}


def sse_chunks(lines):
    """The JSON chunks of a server-sent event stream, checked to end with ``data: [DONE]``."""
    chunks, done = [], False
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: ") and not done, line
        if line == "data: [DONE]":
            done = True
        else:
            chunks.append(json.loads(line[6:]))
    assert done
    return chunks


def metrics(url) -> dict:
    """(name, labels without model_name) -> value, from /metrics through prometheus-client's parser."""
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=WAIT).text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[s.name, labels] = s.value
            if "model_name" in s.labels:
                assert s.labels["model_name"] == MODEL
    return out


def settled(url) -> dict:
    """The metrics once no request runs or waits (earlier tests on a shared server may still be finishing)."""
    end = time.monotonic() + WAIT
    while True:
        m = metrics(url)
        if (m["ga2:num_requests_running", ()], m["ga2:num_requests_waiting", ()]) == (0, 0) \
                or time.monotonic() > end:
            return m
        time.sleep(0.02)


def log_lines(path, n=0, ids=()):
    """The replay log's lines once there are `n` and those of the requests `ids` are among them (the server
    writes them on its worker thread)."""
    end = time.monotonic() + WAIT
    while True:
        text = open(path).read() if os.path.exists(path) else ""
        # whole lines only: the writer may be mid-line
        lines = [json.loads(x) for x in text.split("\n")[:-1]]
        if (len(lines) >= n and set(ids) <= {x["id"] for x in lines}) or time.monotonic() > end:
            return lines
        time.sleep(0.02)


# ---- the API ------------------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_a_streamed_and_a_whole_completion_give_the_structured_models_tokens(shared):
    url, _, log = shared
    want = alone([3], 5)
    assert want == [T.f_next(t) for t in [3] + want[:-1]]         # the structured model's rule, 5t+3 mod 16
    text = "".join(HEX[t] for t in want)
    with httpx.stream("POST", url + "/v1/completions", timeout=WAIT,
                      json=completion(prompt="3", max_tokens=5, stream=True,
                                      stream_options={"include_usage": True})) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = sse_chunks(r.iter_lines())
    *tokens, usage = chunks
    assert [c["choices"][0]["text"] for c in tokens] == list(text)            # one chunk per token
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 4 + ["length"]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and chunks[0]["object"] == "text_completion"
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
    r = httpx.post(url + "/v1/completions", json=completion(prompt=[3], max_tokens=5), timeout=WAIT)
    body = r.json()
    assert r.status_code == 200 and body["choices"] == [{"index": 0, "text": text, "logprobs": None,
                                                          "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6} and body["model"] == MODEL
    # a stop token ends its choice and, as in OpenAI's API, is not in the text (it is in the usage)
    r = httpx.post(url + "/v1/completions", json=completion(prompt="3", max_tokens=5, stop=HEX[want[2]]),
                   timeout=WAIT).json()
    k = want.index(want[2])
    assert r["choices"][0]["text"] == text[:k] and r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] == k + 1
    with httpx.stream("POST", url + "/v1/completions", timeout=WAIT,
                      json=completion(prompt="3", max_tokens=5, stop=[want[2]], stream=True)) as s:
        stopped = [c["choices"][0] for c in sse_chunks(s.iter_lines())]
    assert [c["text"] for c in stopped] == list(text[:k]) + [""] and stopped[-1]["finish_reason"] == "stop"
    ids = {line["id"] for line in log_lines(log, ids=(chunks[0]["id"], body["id"], r["id"]))}
    assert {chunks[0]["id"], body["id"], r["id"]} <= ids


@pytest.mark.timeout(120)
def test_the_openai_client_streams_the_same_tokens(shared):
    url, _, _ = shared
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=WAIT, max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    parts = [(c.choices[0].text, c.choices[0].finish_reason)
             for c in client.completions.create(model=MODEL, prompt="3", max_tokens=5, stream=True)]
    assert "".join(t for t, _ in parts) == "".join(HEX[t] for t in alone([3], 5))
    assert len(parts) == 5 and parts[-1][1] == "length"
    got = client.completions.create(model=MODEL, prompt=[7, 1], max_tokens=3, n=2, temperature=1.2, seed=11,
                                    extra_body={"top_k": 4})
    for ch in got.choices:
        toks = alone([7, 1], 3, temperature=1.2, top_k=4, seed=11, sample=ch.index)
        assert ch.text == "".join(HEX[t] for t in toks)
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="gpt-4", prompt="3", max_tokens=2)
    assert exc.value.body["param"] == "model"


@pytest.mark.timeout(180)
def test_64_concurrent_streams_each_equal_their_replay_alone(shared):
    url, _, log = shared
    gen = random.Random(22)
    reqs = []
    for i in range(64):
        prompt = [gen.randrange(16) for _ in range(gen.randint(1, 5))]
        body = completion(prompt=prompt if i % 2 else "".join(HEX[t] for t in prompt), max_tokens=gen.randint(1, 5),
                          stream=True)
        if i % 5 == 0:
            body.update(temperature=0.9, top_k=gen.randint(0, 16), seed=gen.randrange(1000))
        if i % 7 == 0:
            body["stop"] = [gen.randrange(16)]
        if i % 11 == 0:
            body["n"] = 2
        reqs.append(body)

    async def one(client, body):
        texts, reasons = {}, {}
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = [line async for line in r.aiter_lines()]
        for c in sse_chunks(lines):
            (ch,) = c["choices"]
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
            if ch["finish_reason"]:
                reasons[ch["index"]] = ch["finish_reason"]
        return texts, reasons, c["id"]

    async def all_of_them():
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
            return await asyncio.gather(*(one(client, b) for b in reqs))
    before = len(log_lines(log))
    results = asyncio.run(asyncio.wait_for(all_of_them(), 120))
    runner = BatchRunner(M, ReferenceMachine())
    for body, (texts, reasons, _) in zip(reqs, results):
        prompt = body["prompt"] if isinstance(body["prompt"], list) else [HEX.index(c) for c in body["prompt"]]
        assert sorted(texts) == list(range(body.get("n", 1)))
        for j, text in texts.items():
            toks, _, _ = decode_alone(M, prompt, body["max_tokens"], None, None, runner=runner,
                                      stop=body.get("stop", ()), temperature=body.get("temperature", 0.0),
                                      top_k=body.get("top_k", 0), seed=body.get("seed", 0), sample=j)
            stopped = bool(body.get("stop")) and toks[-1] in body["stop"]
            assert text == "".join(HEX[t] for t in (toks[:-1] if stopped else toks))
            assert reasons[j] == ("stop" if stopped else "length")
    # Other tests share this server, and the log line of a request is written on the engine's worker thread
    # after its last chunk is sent: a line of an earlier test may land among these. Pick ours by id; each of
    # the 64 must be there exactly once.
    ours = sorted(r[2] for r in results)
    lines = [x for x in log_lines(log, before + 64, ids=ours)[before:] if x["id"] in set(ours)]
    assert sorted(x["id"] for x in lines) == ours
    assert all(ch["replay_cmd"].startswith("python -m sim.decode --prompt ") and "identical" not in ch
               for x in lines for ch in x["choices"])


@pytest.mark.timeout(120)
def test_a_client_gone_mid_stream_aborts_its_request_and_its_pages_are_free(tmp_path):
    # a window keeps the context within the chip's, so the request could run for thousands of tokens
    with running_server(["--window", "8", "--max-tokens-limit", "5000"], tmp_path) as (url, _, log):
        seen = 0
        with httpx.stream("POST", url + "/v1/completions", timeout=WAIT,
                          json=completion(prompt="12345", max_tokens=5000, stream=True)) as r:
            lines = r.iter_lines()          # kept: a line iterator dropped half-read closes the connection
            for line in lines:
                seen += line.startswith("data: {")
                if seen == 3:
                    break
            during = metrics(url)
            assert during["ga2:num_requests_running", ()] == 1 and during["ga2:kv_cache_pages_used", ()] >= 2
        end = time.monotonic() + WAIT
        while True:                         # the abort goes in at the engine's next step
            after = metrics(url)
            if after["ga2:request_success_total", (("finished_reason", "abort"),)] or time.monotonic() > end:
                break
            time.sleep(0.02)
        assert after["ga2:request_success_total", (("finished_reason", "abort"),)] == 1
        assert after["ga2:num_requests_running", ()] == 0 and after["ga2:kv_cache_pages_used", ()] == 0
        assert after["ga2:kv_cache_usage_perc", ()] == 0.0
        made = int(after["ga2:generation_tokens_total", ()])
        assert 3 <= made < 5000                     # cut mid-generation
        (line,) = log_lines(log, 1)
        (ch,) = line["choices"]
        assert ch["finish_reason"] == "abort" and len(ch["tokens"]) == made and ch["identical"] is True
        assert ch["tokens"] == alone([1, 2, 3, 4, 5], made, window=8)


@pytest.mark.timeout(120)
def test_metrics_count_what_was_served(shared):
    url, _, log = shared
    text = httpx.get(url + "/metrics", timeout=WAIT).text
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name, kind in (("ga2:num_requests_running", "gauge"), ("ga2:num_requests_waiting", "gauge"),
                       ("ga2:kv_cache_usage_perc", "gauge"), ("ga2:prefix_cache_queries", "counter"),
                       ("ga2:prefix_cache_hits", "counter"), ("ga2:num_preemptions", "counter"),
                       ("ga2:prompt_tokens", "counter"), ("ga2:generation_tokens", "counter"),
                       ("ga2:chip_cycles", "counter"), ("ga2:time_to_first_token_seconds", "histogram"),
                       ("ga2:time_to_first_token_cycles", "histogram"), ("ga2:time_per_output_token_seconds",
                                                                         "histogram"),
                       ("ga2:time_per_output_token_cycles", "histogram")):
        assert kinds[name] == kind, name
    before = settled(url)
    r = httpx.post(url + "/v1/completions", json=completion(prompt="9a", max_tokens=6), timeout=WAIT).json()
    (line,) = [x for x in log_lines(log, ids=(r["id"],)) if x["id"] == r["id"]]
    after = metrics(url)

    def delta(name, labels=()):
        return after[name, labels] - before[name, labels]
    (ch,) = line["choices"]
    assert delta("ga2:generation_tokens_total") == 6 and delta("ga2:prompt_tokens_total") == 2
    assert delta("ga2:time_to_first_token_cycles_count") == 1
    assert delta("ga2:time_to_first_token_cycles_sum") == ch["ttft_cycles"]
    assert delta("ga2:time_per_output_token_cycles_count") == 5
    assert delta("ga2:time_per_output_token_cycles_sum") == ch["finish_cycles"] - ch["ttft_cycles"]
    assert delta("ga2:time_to_first_token_seconds_count") == 1 and delta("ga2:time_per_output_token_seconds_count") == 5
    assert delta("ga2:chip_cycles_total") >= ch["finish_cycles"] > 0
    assert delta("ga2:request_success_total", (("finished_reason", "length"),)) == 1
    assert delta("ga2:prefix_cache_queries_total") == 1 and after["ga2:kv_cache_pages_total", ()] == 64


@pytest.mark.timeout(120)
def test_each_bad_field_gets_a_400_naming_it(shared):
    url, _, _ = shared
    cases = [
        (b"{not json", 400, None, "not valid JSON"),
        (completion(prompt=[3, 16]), 400, "prompt", "0..15"),
        (completion(prompt="3g"), 400, "prompt", "hex digit"),
        (completion(prompt=[]), 400, "prompt", "empty"),
        (completion(prompt=["3", "4"]), 400, "prompt", "batch"),
        ({"model": "gpt-4", "prompt": "3"}, 400, "model", "does not exist"),
        ({"prompt": "3"}, 400, "model", "required"),
        (completion(prompt="1" * 70, max_tokens=5), 400, "prompt", "attends at most 64"),   # the engine's refusal
        (completion(prompt="1" * 101), 400, "prompt", "max_prompt_tokens) is 100"),
        (completion(prompt="3", max_tokens=65), 400, "max_tokens", "is 64"),
        (completion(prompt="3", max_tokens=0), 400, "max_tokens", ">= 1"),
        (completion(prompt="3", n=5), 400, "n", "max_n) is 4"),
        (completion(prompt="3", stop="12"), 400, "stop", "one token"),
        (completion(prompt="3", temperature=2.5), 400, "temperature", "0..2"),
        (completion(prompt="3", top_k=17), 400, "top_k", "<= 16"),
        (completion(prompt="3", priority=1), 400, "priority", "--policy priority"),
        (completion(prompt="3", echo=True), 400, "echo", "not served"),
        (completion(prompt="3", stream="yes"), 400, "stream", "true or false"),
        (completion(prompt="3", user="x" * 5000), 413, None, "max_body_bytes) of 4096"),
    ]
    for body, status, param, words in cases:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = httpx.post(url + "/v1/completions", timeout=WAIT, **kw)
        err = r.json()["error"]
        assert (r.status_code, err["param"]) == (status, param), (body, r.text)
        assert words in err["message"] and err["type"] == "invalid_request_error", (body, err)
    assert httpx.get(url + "/health", timeout=WAIT).status_code == 200
    assert httpx.post(url + "/v1/completions", json=completion(prompt="3", max_tokens=1), timeout=WAIT).status_code == 200


def _raw_request(url, head: bytes, body: bytes = b"") -> socket.socket:
    """A socket that sent `head` (the request line and headers) and `body` to the server at `url`."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=WAIT)
    s.sendall(head + b"\r\n\r\n" + body)
    return s


def _raw_answer(s: socket.socket) -> tuple:
    """``(status, headers in lower case, body)`` of the answer on `s` (its headers, then Content-Length bytes)."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        got = s.recv(65536)
        assert got, f"the server closed the connection without an answer: {data!r}"
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    head = head.decode("latin-1").lower()
    size = int(re.search(r"content-length: (\d+)", head).group(1))
    while len(body) < size:
        got = s.recv(65536)
        assert got, f"the answer was cut: {data!r}"
        body += got
    return int(head.split()[1]), head, body


@pytest.mark.timeout(60)
def test_hostile_bodies_unknown_routes_and_methods_get_openai_error_objects(shared):
    url, _, log = shared
    # the replay log holds every client's prompts and tokens: readable by the server's user alone
    assert os.stat(log).st_mode & 0o077 == 0, oct(os.stat(log).st_mode)
    # nested past the JSON parser's recursion, within max_body_bytes: a 400 naming the body, not a 500
    r = httpx.post(url + "/v1/completions", content=b"[" * 2000 + b"]" * 2000, timeout=WAIT)
    assert r.status_code == 400 and "nests too deeply" in r.json()["error"]["message"], r.text
    # best_of is an integer like n (a boolean or a float is a 400, as for max_tokens)
    for best_of in (True, 1.0):
        r = httpx.post(url + "/v1/completions", json=completion(prompt="3", max_tokens=1, best_of=best_of),
                       timeout=WAIT)
        assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text
    # an endpoint not served, a wrong method: OpenAI's error object too (the openai client reads its message)
    for method, path, status in (("POST", "/v1/chat/completions", 404), ("GET", "/v1/completions", 405),
                                 ("DELETE", "/v1/models", 405)):
        r = httpx.request(method, url + path, timeout=WAIT)
        err = r.json()["error"]
        assert r.status_code == status and err["type"] == "invalid_request_error" and path in err["message"], r.text
    assert r.headers["allow"] == "GET"
    # a body that stops coming (slowloris) is answered 408 once --body-timeout (1 s here) has passed
    t = time.monotonic()
    with _raw_request(url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 60", b'{"model": "ga2-') as s:
        status, _, body = _raw_answer(s)
    assert status == 408 and "body_timeout" in json.loads(body)["error"]["message"] and time.monotonic() - t < WAIT
    assert httpx.post(url + "/v1/completions", json=completion(prompt="3", max_tokens=1), timeout=WAIT).status_code == 200


@pytest.mark.timeout(120)
def test_the_api_key_is_required_on_v1(tmp_path, monkeypatch):
    monkeypatch.setenv("GA2_API_KEY", "from-the-environment")
    for args, key in (([], "from-the-environment"), (["--api-key", "s3cret"], "s3cret")):
        with running_server(args, tmp_path) as (url, _, _):
            body = completion(prompt="3", max_tokens=2)
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {key}"}):
                r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=WAIT)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert httpx.get(url + "/v1/models", timeout=WAIT).status_code == 401
            r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                           timeout=WAIT)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "".join(HEX[t] for t in alone([3], 2))
            assert httpx.get(url + "/health", timeout=WAIT).status_code == 200      # as vLLM: /v1 only
            client = openai.OpenAI(base_url=url + "/v1", api_key=key, timeout=WAIT, max_retries=0)
            assert [c.choices[0].text for c in client.completions.create(model=MODEL, prompt="3", max_tokens=2,
                                                                         stream=True)] == list(r.json()["choices"][0]["text"])


@pytest.mark.timeout(120)
def test_past_the_queue_bound_a_request_gets_429_with_retry_after(tmp_path):
    # a sliding window lets the first run long (without one, a context stops at 64 tokens)
    with running_server(["--window", "8", "--max-batch", "1", "--max-waiting", "1"], tmp_path) as (url, service, _):
        body = completion(prompt="3", max_tokens=60, stream=True)
        with httpx.Client(timeout=WAIT) as client:
            # the first outlasts the test (cut when its stream closes): the third must find it still running
            with client.stream("POST", url + "/v1/completions", json={**body, "max_tokens": 1000}) as first:
                lines = first.iter_lines()             # kept: dropped half-read, it would close the connection
                next(lines)                            # running: its first token came
                with httpx.Client(timeout=WAIT) as client2:
                    with client2.stream("POST", url + "/v1/completions", json=body) as second:
                        assert second.status_code == 200       # accepted: it waits (one runs at a time)
                        r = httpx.post(url + "/v1/completions", json=body, timeout=WAIT)
                        assert r.status_code == 429 and r.headers["retry-after"] == "1"
                        assert r.json()["error"]["code"] == "queue_full"
                        end = time.monotonic() + WAIT      # the engine's figures follow its step
                        while (st := service.stats()) and (st.running, st.waiting) != (1, 1) \
                                and time.monotonic() < end:
                            time.sleep(0.01)
                        assert (st.running, st.waiting) == (1, 1)
        m = metrics(url)
        assert m["ga2:requests_rejected_queue_full_total", ()] == 1


# ---- the service alone: failures -----------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_broken_engine_fails_every_request_and_a_broken_replay_still_logs_and_drains(tmp_path):
    class Breaking(ReferenceMachine):
        runs = 0

        def run(self, *args, **kw):
            Breaking.runs += 1
            if Breaking.runs > 12:
                raise RuntimeError("the chip is gone")
            return super().run(*args, **kw)

    def verify(r):
        if r["tokens"][0] == T.f_next(5):
            raise ValueError("no replay for this one")
        return True
    log = tmp_path / "log.jsonl"
    svc = EngineService(Engine(M, Breaking(), window=8), log_path=str(log), replay=lambda r: ["replay"],
                        verify=verify).start()

    async def until_end(c):
        stream, events = svc.submit(c), []
        while not stream.ended:
            events += await asyncio.wait_for(stream.next_events(), WAIT)
        return events

    async def scenario():
        a = await until_end(Completion((3,), 2))
        b = await until_end(Completion((5,), 2))
        c = await until_end(Completion((3,), 50))          # the backend breaks under this one
        return a, b, c, await until_end(Completion((3,), 2))
    a, b, c, d = asyncio.run(scenario())
    assert [type(ev) for ev in a] == [Accepted, Token, Token, Finished] and isinstance(b[-1], Finished)
    assert isinstance(c[0], Accepted) and isinstance(c[-1], Failed) and "the chip is gone" in c[-1].message
    assert [type(ev) for ev in d] == [Failed] and not svc.healthy
    assert svc.drain(WAIT)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [("error" in x, x["prompt"] if "prompt" in x else None) for x in lines] == [(False, [3]), (True, None)]
    assert lines[0]["choices"][0]["identical"] is True and "no replay" in lines[1]["error"]
    st = svc.stats()
    assert (st.replays_checked, st.replays_differ) == (2, 1)


# ---- the command --------------------------------------------------------------------------------------------

def _ga2(*args):
    return [sys.executable, "-m", "sim", "serve", *args]


@pytest.mark.timeout(120)
def test_the_command_serves_until_sigterm_finishes_the_running_request_and_exits_0(tmp_path):
    log = tmp_path / "replay.jsonl"
    proc = subprocess.Popen(_ga2("--http", "127.0.0.1:0", "--sim", "reference", "--window", "none", "--body-timeout",
                                 "1", "--replay-log", str(log)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split("listening on ")[1].split()[0]
        assert str(log) in line
        toks = alone([3], 20)
        want = "".join(HEX[t] for t in toks)
        partial = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 60"
        # a client that goes while sending its body (no traceback on the server's stderr)
        _raw_request(url, partial, b'{"model"').close()
        stuck = _raw_request(url, partial, b'{"model"')     # and one whose body never ends: it must not hold the exit
        with stuck, httpx.stream("POST", url + "/v1/completions", timeout=WAIT,
                                 json=completion(prompt="3", max_tokens=20, stream=True)) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            proc.send_signal(signal.SIGTERM)            # mid-stream: it stops admitting, this one finishes
            chunks = sse_chunks(list(lines))
            out, err = proc.communicate(timeout=WAIT)   # with the stuck body's connection still open
            assert _raw_answer(stuck)[0] == 408
        got = want[0] + "".join(c["choices"][0]["text"] for c in chunks)
        assert got == want and chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert proc.returncode == 0 and "Traceback" not in err, err
        assert "replays alone: 1 of 1 identical" in out
        (entry,) = [json.loads(x) for x in log.read_text().splitlines()]
        assert entry["choices"][0]["identical"] is True and entry["choices"][0]["tokens"] == toks
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)


@pytest.mark.timeout(120)
def test_a_second_sigint_forces_the_exit_and_says_so(tmp_path):
    # uvicorn's force quit skips the app's drain: the running request is cut (aborted, its log line still
    # written), and the exit status is not the drained server's 0 (nor does it come with tracebacks)
    proc = subprocess.Popen(_ga2("--http", "127.0.0.1:0", "--sim", "reference", "--window", "8", "--no-verify",
                                 "--replay-log", str(tmp_path / "replay.jsonl")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().split("listening on ")[1].split()[0]
        with httpx.stream("POST", url + "/v1/completions", timeout=WAIT,
                          json=completion(prompt="3", max_tokens=1000, stream=True)) as r:
            lines = r.iter_lines()          # kept: dropped half-read, it would close the connection
            assert next(lines).startswith("data: {")
            proc.send_signal(signal.SIGINT)
            # two SIGINTs sent at once may arrive as one: the second waits until the first closed the listener
            end = time.monotonic() + WAIT
            while time.monotonic() < end:
                try:
                    httpx.get(url + "/health", timeout=WAIT)
                except httpx.TransportError:
                    break
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 1 and "Traceback" not in err, (out, err)
        assert err.strip().splitlines()[-1] == "error: forced to stop (a second SIGINT): the requests in flight were cut"
        (line,) = [json.loads(x) for x in (tmp_path / "replay.jsonl").read_text().splitlines()]
        assert line["choices"][0]["finish_reason"] == "abort" and 0 < len(line["choices"][0]["tokens"]) < 1000
        assert "stopped: 1 choices finished (abort 1)" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)


@pytest.mark.timeout(60)
def test_the_command_refuses_trace_options_with_http_and_http_options_without_it(capsys, monkeypatch):
    from sim.cli import guarded
    from sim.serve import main
    assert guarded(main, ["--http", "127.0.0.1:0", "--requests", "5"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --requests is about the synthetic trace: not with --http (clients send the requests and their "
        "parameters)"]
    for option, words in (("--json=x.json", "--json writes a trace run's results"),
                          ("--out=x", "--out writes a trace run's results")):
        assert guarded(main, ["--http", "8123", option]) == 2
        assert words in capsys.readouterr().err
    assert guarded(main, ["--api-key", "k"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: --api-key is an option of --http (serve an HTTP API): give --http HOST:PORT"
    assert guarded(main, ["--http", "127.0.0.1:99999"]) == 2
    assert "--http must be HOST:PORT" in capsys.readouterr().err
    # an empty key would let 'Authorization: Bearer' in; a padded one could never match (the header's is stripped)
    for argv, words in ((["--api-key", ""], "error: --api-key is empty"),
                        (["--api-key", " k"], "error: --api-key ' k' begins or ends with white space"),
                        (["--served-model-name", ""], "error: --served-model-name is empty")):
        assert guarded(main, ["--http", "127.0.0.1:0", *argv]) == 2
        assert capsys.readouterr().err.strip().startswith(words)
    monkeypatch.setenv("GA2_API_KEY", "k\t")
    assert guarded(main, ["--http", "127.0.0.1:0"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: GA2_API_KEY 'k\\t' begins or ends with white space")
