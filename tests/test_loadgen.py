"""The load generator (host.serving.loadgen, ``ga2 bench --serve --url``): its arithmetic by hand, its schedule,
its reading of a stream and its counting of errors (against httpx's mock transport), and a run against the
real server."""
from __future__ import annotations

import contextlib
import json
import socket

import httpx
import pytest

from host.serving import loadgen as L


# ---- arithmetic, by hand ---------------------------------------------------------------------------------

def test_percentile_is_nearest_rank():
    hundred = list(range(100, 0, -1))              # 1..100, unsorted
    assert [L.percentile(hundred, p) for p in (50, 90, 99, 100)] == [50, 90, 99, 100]
    # ten values: rank ceil(p * 10 / 100) -> 5, 9, 10
    assert [L.percentile(range(1, 11), p) for p in (50, 90, 99)] == [5, 9, 10]
    # four values: ranks 2, ceil(3.6) = 4, ceil(3.96) = 4
    assert [L.percentile([4, 1, 3, 2], p) for p in (50, 90, 99)] == [2, 4, 4]
    assert [L.percentile([7], p) for p in (0, 50, 99)] == [7, 7, 7]
    # the rank rounds up, never to the nearest: ceil(2.5) = 3 of five, ceil(6.3) = 7 of seven
    assert L.percentile([50, 40, 30, 20, 10], 50) == 30 and L.percentile(range(1, 8), 90) == 7
    assert L.percentile([], 50) is None
    with pytest.raises(ValueError):
        L.percentile([1], 101)


def _rec(i, tokens=(), ttft=None, e2e=None, kind=None, error=None):
    return {"id": i, "tokens": list(tokens), "ttft_s": ttft, "e2e_s": e2e, "error_kind": kind, "error": error}


def test_summary_by_hand():
    # binary fractions of a second: every figure below is exact
    records = [_rec(0, [1, 2, 3], 0.25, 0.75),         # TPOT (0.75 - 0.25) / 2 = 0.25
               _rec(1, [4], 0.5, 0.5),                  # one token: no TPOT
               _rec(2, [1, 2], 0.75, 1.25),             # TPOT 0.5
               _rec(3, kind="429", error="queue full"), _rec(4, kind="429", error="again"),
               _rec(5, kind="connection", error="ConnectError: refused")]
    s = L.summarize(records, 2.0)
    assert (s["requests"], s["succeeded"], s["failed"]) == (6, 3, 3)
    assert s["errors"] == {"429": 2, "connection": 1}
    assert s["error_examples"] == {"429": "queue full", "connection": "ConnectError: refused"}
    assert s["output_tokens"] == 6 and s["output_tokens_per_s"] == 3.0 and s["requests_per_s"] == 1.5
    assert s["ttft_s"] == {"p50": 0.5, "p90": 0.75, "p99": 0.75, "mean": 0.5, "max": 0.75}
    assert s["tpot_s"] == {"p50": 0.25, "p90": 0.5, "p99": 0.5, "mean": 0.375, "max": 0.5}
    assert s["e2e_s"] == {"p50": 0.75, "p90": 1.25, "p99": 1.25, "mean": 2.5 / 3, "max": 1.25}
    text = "\n".join(L.report_lines(s))
    assert "HTTP 429 2 (e.g. 'queue full')" in text and "connection 1" in text
    assert "0.7500" in text.splitlines()[-3]            # the TTFT row's p90


def test_arrivals_are_the_seed_s_and_the_prompts_do_not_depend_on_the_rate():
    a = L.arrival_times(500, 4.0, seed=3)
    assert a == L.arrival_times(500, 4.0, seed=3)
    assert a != L.arrival_times(500, 4.0, seed=4)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    # exponential gaps: at twice the rate every gap is half as long (a power of two: exact)
    assert L.arrival_times(500, 8.0, seed=3) == [t / 2 for t in a]
    mean_gap = a[-1] / (len(a) - 1)
    assert abs(mean_gap - 0.25) < 0.025, mean_gap
    assert L.arrival_times(5, float("inf"), seed=3) == [0.0] * 5
    from host.serving.trace import make_trace
    prompts = L.trace_prompts(40, 7, (3, 9), (2, 5), 0.5)
    assert prompts == [(r.prompt, r.gen) for r in make_trace(40, 7, (3, 9), (2, 5), 0.5)]
    assert prompts != L.trace_prompts(40, 8, (3, 9), (2, 5), 0.5)


def test_check_url():
    assert L.check_url("http://127.0.0.1:8123") == "http://127.0.0.1:8123"
    assert L.check_url("http://127.0.0.1:8123/") == "http://127.0.0.1:8123"
    assert L.check_url("https://h.example/api/v1/") == "https://h.example/api"
    for bad in ("127.0.0.1:8123", "ftp://h:1", "http://h:port", "http://:80", "http://h:1/?q=1", ""):
        with pytest.raises(L.LoadGenError, match="--url"):
            L.check_url(bad)
    # credentials in the URL would go as Basic auth and be printed in every line naming the URL
    for bad in ("http://user:s3cret@127.0.0.1:8123", "http://s3cret@h:1"):
        with pytest.raises(L.LoadGenError, match="--api-key") as exc:
            L.check_url(bad)
        assert "s3cret" not in str(exc.value)


# ---- streams and errors, against a mock transport ----------------------------------------------------

def _sse(*events) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def _chunk(text, finish=None):
    return {"id": "cmpl-7", "object": "text_completion",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def _mock_server(seen):
    """A server that answers by the prompt's first token: 0 streams "abc", the others fail one way each."""
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "ga2-mock", "object": "model"}]})
        body = json.loads(request.content)
        seen.append((body, request.headers.get("authorization")))
        first = body["prompt"][0]
        if first == 0:
            return httpx.Response(200, content=b": a comment\n\n" + _sse(_chunk("a"), _chunk("b"), _chunk("c", "length"),
                                                                        b"[DONE]"))
        if first == 1:
            return httpx.Response(429, headers={"Retry-After": "1"},
                                  json={"error": {"message": "the waiting queue is full", "type": "rate_limit"}})
        if first == 2:
            return httpx.Response(500, text="Internal Server Error")
        if first == 3:
            return httpx.Response(200, content=_sse(_chunk("1")))             # no [DONE]
        if first == 4:
            raise httpx.ConnectError("connection refused", request=request)
        if first == 5:
            return httpx.Response(200, content=_sse(_chunk("xy"), b"[DONE]"))   # not hex digits
        if first == 6:
            return httpx.Response(200, content=_sse(_chunk("1234"), b"[DONE]"))  # more than max_tokens 3
        return httpx.Response(401, json={"error": {"message": "bad key"}})
    return handle


@pytest.mark.timeout(60)
def test_stream_read_and_every_failure_counted():
    seen = []
    transport = httpx.MockTransport(_mock_server(seen))
    assert L.probe("http://mock", transport=transport) == "ga2-mock"
    prompts = [([k, 1, 2], 3) for k in range(8)]
    calls = []
    records, duration = L.run_load("http://mock", prompts, [0.0] * 8, "ga2-mock", api_key="k1",
                                   progress=lambda d, t: calls.append((d, t)), transport=transport)
    assert calls[-1] == (8, 8) and len(calls) == 8
    assert [r["id"] for r in records] == list(range(8))
    assert records[0]["tokens"] == [10, 11, 12] and records[0]["finish_reason"] == "length"
    assert records[0]["error_kind"] is None and records[0]["status"] == 200 and records[0]["response_id"] == "cmpl-7"
    assert 0 <= records[0]["ttft_s"] <= records[0]["e2e_s"] <= duration
    assert [r["error_kind"] for r in records] == [None, "429", "500", "stream", "connection", "stream", "stream",
                                                  "401"]
    assert records[1]["error"] == "the waiting queue is full" and records[7]["error"] == "bad key"
    assert "[DONE]" in records[3]["error"] and "hex" in records[5]["error"] and "max_tokens" in records[6]["error"]
    s = L.summarize(records, duration)
    assert s["errors"] == {"401": 1, "429": 1, "500": 1, "connection": 1, "stream": 3}
    assert (s["succeeded"], s["failed"], s["output_tokens"]) == (1, 7, 3)
    bodies = sorted(seen, key=lambda b: b[0]["prompt"][0])
    assert bodies[0] == ({"model": "ga2-mock", "prompt": [0, 1, 2], "max_tokens": 3, "stream": True}, "Bearer k1")
    assert len(bodies) == 8


@pytest.mark.timeout(60)
def test_a_malformed_stream_is_a_counted_failure_not_a_crash():
    # what an OpenAI-compatible server could send that is not a completion chunk: each request fails as
    # "stream", and the run goes on to the end with every record
    answers = [b'data: {"choices": [1]}\n\n', b'data: {"choices": "ab"}\n\n', b'data: {"choices": 5}\n\n',
               b'data: {"choices": [{"index": 0, "text": "1", "finish_reason": []}]}\n\n']

    def handle(request):
        k = json.loads(request.content)["prompt"][0]
        if k == len(answers):               # a body that does not decode as its Content-Encoding says
            return httpx.Response(200, headers={"content-encoding": "gzip"}, content=b"not gzip")
        return httpx.Response(200, content=answers[k] + b"data: [DONE]\n\n")
    n = len(answers) + 1
    records, _ = L.run_load("http://mock", [([k], 3) for k in range(n)], [0.0] * n, "m",
                            transport=httpx.MockTransport(handle))
    assert [r["error_kind"] for r in records] == ["stream"] * n, [r["error"] for r in records]
    assert all(r["error"] for r in records)


def test_probe_names_the_url():
    with socket.socket() as s:           # a port nothing listens on: bound, never listened
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(L.LoadGenError, match=f"cannot connect to {url}"):
            L.probe(url, timeout=5)
    transport = httpx.MockTransport(lambda r: httpx.Response(401, json={"error": {"message": "no key"}}))
    with pytest.raises(L.LoadGenError, match="401.*--api-key"):
        L.probe("http://mock", transport=transport)
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json={"data": []}))
    with pytest.raises(L.LoadGenError, match="lists no model"):
        L.probe("http://mock", transport=transport)


# ---- the command: one-line errors before any request -------------------------------------------------

def _ga2(capsys, *argv):
    from sim import ga2
    code = ga2.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@contextlib.contextmanager
def refusing_port():
    """A port bound but not listening while the block runs: a connection to it is refused, and no other
    process can take it meanwhile (a port freed and then named could be)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.mark.timeout(60)
def test_command_refuses_in_one_line(capsys, tmp_path):
    with refusing_port() as port:
        _refusals_in_one_line(capsys, tmp_path, f"http://127.0.0.1:{port}")


def _refusals_in_one_line(capsys, tmp_path, url):
    cases = [(("--serve", "--url", url), f"error: cannot connect to {url}: "),
             (("--serve", "--url", "127.0.0.1:80"), "error: --url must be http://HOST:PORT"),
             (("--url", url), f"error: --url {url} needs --serve"),
             (("--rate", "5"), "error: --rate is an option of the load generator"),
             (("--serve", "--url", url, "--rate", "-1"), "error: --rate must be requests per second > 0"),
             (("--serve", "--url", url, "--trace", str(tmp_path / "t.json")), "error: --trace is for the simulator")]
    for argv, start in cases:
        code, out, err = _ga2(capsys, "bench", *argv)
        assert code == 2 and out == "" and err.startswith(start) and err.count("\n") == 1, (argv, err)
    assert not list(tmp_path.iterdir())


# ---- against the real server -----------------------------------------------------------------------------

@pytest.mark.timeout(180)
def test_the_load_generator_against_the_server_every_request_equal_alone(capsys, tmp_path):
    from test_http_server import running_server, log_lines

    from host import tiny_lm as T
    from host.engine import decode_alone
    from host.serving.trace import make_trace
    from sim.backends.reference import ReferenceMachine
    n, seed, window = 20, 5, 8
    jpath, png = tmp_path / "load.json", tmp_path / "load.png"
    with running_server(["--window", str(window), "--max-batch", "8"], tmp_path) as (url, _, log):
        code, out, err = _ga2(capsys, "bench", "--serve", "--url", url, "--requests", str(n), "--rate", "200",
                              "--seed", str(seed), "--json", str(jpath), "--png", str(png))
        assert code == 0, err
        doc = json.loads(jpath.read_text())
        records = doc["records"]
        lines = {x["id"]: x for x in log_lines(log, n, [r["response_id"] for r in records])}
    s = doc["summary"]
    assert (s["requests"], s["succeeded"], s["failed"], s["errors"]) == (n, n, 0, {})
    assert "time to first token" in out and f"{n} of {n} succeeded" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the prompts are ga2 serve's trace of the seed; every client got its prompt's tokens alone, and the
    # server's replay log says the same of the same request
    trace = make_trace(n, seed)
    m, ref = T.make_model("structured", 1), ReferenceMachine()
    assert [(r["prompt"], r["max_tokens"]) for r in records] == [(q.prompt, q.gen) for q in trace]
    for r in records:
        want, _, _ = decode_alone(m, r["prompt"], r["max_tokens"], ref, window)
        assert r["tokens"] == want and r["finish_reason"] == "length", r["id"]
        (choice,) = lines[r["response_id"]]["choices"]
        assert choice["tokens"] == want and choice["identical"] is True
    # the summary is the records' own figures
    assert s["output_tokens"] == sum(len(r["tokens"]) for r in records)
    assert s["ttft_s"]["p50"] == L.percentile([r["ttft_s"] for r in records], 50)
    assert s["e2e_s"]["p99"] == max(r["e2e_s"] for r in records)     # 20 values: rank ceil(19.8) = 20
