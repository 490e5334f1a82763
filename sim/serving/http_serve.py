"""``ga2 serve --http HOST:PORT``: the serving engine behind an OpenAI-compatible HTTP API (issue 22).

    ga2 serve --http 127.0.0.1:8123 --sim reference
    curl -N http://127.0.0.1:8123/v1/completions -H 'Content-Type: application/json' \\
         -d '{"model": "ga2-structured", "prompt": "3", "max_tokens": 5, "stream": true}'

The backend (any ``--sim``, ``--chip``, ``--mode``) and the engine are those of ``ga2 serve``; the requests
come from clients instead of a synthetic trace (`host.serving.service.EngineService`, `host.serving.http`).
The server binds 127.0.0.1 unless a host is given (``--http 0.0.0.0:8123``; port 0 takes a free port, and
the line printed at start names it). It writes a replay log (``--replay-log``; one JSON line per finished
request, with its replay command and, unless ``--no-verify``, whether it is identical alone, replayed on
the reference machine on a worker thread). SIGTERM or SIGINT: it stops admitting (503), finishes the
running requests, writes their log lines and exits 0 (1 if a replay differed); a second SIGINT cuts the
running requests (aborted, logged) and exits 1.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import tempfile
import time

from sim.cli import UsageError

__all__ = ["http_address", "add_http_options", "check_http_args", "given_options", "make_server", "main_http",
           "TRACE_OPTIONS", "OUTPUT_OPTIONS", "HTTP_OPTIONS", "API_KEY_ENV"]

# options of `ga2 serve` that make no sense with --http: the synthetic trace (clients send the requests and
# their parameters), a trace run's outputs (--chips K serves through the router, host.serving.router)
TRACE_OPTIONS = ("--requests", "--seed", "--arrival", "--prompt-len", "--gen-len", "--prefix-share", "--stop",
                 "--temperature", "--top-k", "--n", "--priorities")
OUTPUT_OPTIONS = ("--json", "--out", "--trace")
# options that mean something only with --http
HTTP_OPTIONS = ("--api-key", "--replay-log", "--max-waiting", "--max-body-bytes", "--body-timeout",
                "--max-prompt-tokens", "--max-tokens-limit", "--max-n", "--served-model-name")
API_KEY_ENV = "GA2_API_KEY"
FORCED_DRAIN_SECONDS = 5        # after a second SIGINT: how long the cut requests' log lines may take


def http_address(text: str) -> tuple:
    """An argparse type: ``HOST:PORT``, or ``PORT`` / ``:PORT`` for 127.0.0.1 (port 0: any free port)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") if sep else ""
    try:
        p = int(port)
    except ValueError:
        p = -1
    if not 0 <= p <= 65535:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT (or PORT, for 127.0.0.1) with PORT 0..65535, got {text!r}")
    return (host or "127.0.0.1", p)


def add_http_options(p) -> None:
    """The options of ``ga2 serve --http``."""
    from sim.cli import int_range, positive_seconds
    p.add_argument("--http", type=http_address, default=None, metavar="HOST:PORT",
                   help="serve an OpenAI-compatible HTTP API (POST /v1/completions, GET /v1/models, /health, "
                        "/metrics) on HOST:PORT until SIGTERM or SIGINT, instead of a synthetic trace; PORT alone "
                        "binds 127.0.0.1; port 0 takes a free port (docs/http-server.md)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"with --http: require 'Authorization: Bearer KEY' on /v1 (default: the environment "
                        f"variable {API_KEY_ENV}, else none)")
    p.add_argument("--replay-log", default=None, metavar="PATH",
                   help="with --http: the replay log, one JSON line per finished request (default: "
                        "ga2-serve-DATE-PID.jsonl in the system's temporary directory, printed at start)")
    p.add_argument("--max-waiting", type=int_range(1, 1 << 20), default=256, metavar="N",
                   help="with --http: requests waiting for admission at most; past it 429 with Retry-After")
    p.add_argument("--max-body-bytes", type=int_range(64, 1 << 26), default=65536, metavar="N",
                   help="with --http: the request body's bound (413 past it)")
    p.add_argument("--body-timeout", type=positive_seconds, default=30.0, metavar="SECONDS",
                   help="with --http: seconds a request's body may take to arrive after its headers (408 past it: a "
                        "client that stops sending holds no connection, nor the shutdown)")
    p.add_argument("--max-prompt-tokens", type=int_range(1, 1 << 20), default=1024, metavar="N",
                   help="with --http: the prompt's bound in tokens (400 past it)")
    p.add_argument("--max-tokens-limit", type=int_range(1, 1 << 20), default=1024, metavar="N",
                   help="with --http: the bound of a request's max_tokens (400 past it)")
    p.add_argument("--max-n", type=int_range(1, 64), default=16, metavar="N",
                   help="with --http: the bound of a request's n (400 past it)")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="with --http: the model's name in the API (default: ga2-MODEL, e.g. ga2-structured)")


def given_options(parser, argv) -> set:
    """The options `argv` gives (their first long name), as `parser` reads it: every destination starts as a
    marker that argparse's defaults leave alone, so the ones still holding it were not given."""
    marker = object()
    acts = [act for act in parser._actions if act.option_strings and act.dest != argparse.SUPPRESS]
    ns = argparse.Namespace(**{act.dest: marker for act in acts})
    parser.parse_args(argv, namespace=ns)
    return {next(o for o in act.option_strings if o.startswith("--")) for act in acts if getattr(ns, act.dest) is not marker}


def check_http_args(a, given: set) -> None:
    """Refuse in one line what makes no sense with --http, or the --http options without it."""
    if a.http is None:
        extra = sorted(given & set(HTTP_OPTIONS))
        if extra:
            raise UsageError(f"{extra[0]} is an option of --http (serve an HTTP API): give --http HOST:PORT")
        return
    for group, why in ((TRACE_OPTIONS, "is about the synthetic trace: not with --http (clients send the requests "
                                       "and their parameters)"),
                       (OUTPUT_OPTIONS, "writes a trace run's results: not with --http (the server writes its "
                                        "replay log, --replay-log)")):
        bad = [o for o in group if o in given]
        if bad:
            raise UsageError(f"{bad[0]} {why}")
    key, source = (a.api_key, "--api-key") if a.api_key is not None else (os.environ.get(API_KEY_ENV), API_KEY_ENV)
    if a.api_key == "":
        raise UsageError(f"--api-key is empty: give a key, or leave the option out (then {API_KEY_ENV}, else none)")
    if key and key != key.strip():
        # the header's value is read stripped, so such a key could never match
        raise UsageError(f"{source} {key!r} begins or ends with white space: no client could send it")
    if a.served_model_name == "":
        raise UsageError("--served-model-name is empty: give the model's name in the API (default ga2-MODEL)")
    if a.replay_log is not None:
        from sim.cli import output_file
        try:
            output_file(a.replay_log)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"--replay-log {exc}") from None


def _default_log() -> str:
    return os.path.join(tempfile.gettempdir(), f"ga2-serve-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl")


def make_server(a, cluster=None):
    """The service (not started) and the app of parsed arguments `a`: ``(app, service, model name, replay log
    path)``. With ``--chips K`` (or ``--cluster``, ``--order``, ``--kill-chip``) the service runs K chips behind
    the router (`sim.serving.multichip.router_engine`), Ray actors of `cluster` (a `sim.cluster.Cluster`,
    entered) when one is given."""
    from host.batch import BatchRunner
    from host.serving.build import make_engine, model_of
    from host.serving.results import replay_cmd, replay_mismatches
    from host.serving.http import Limits, create_app
    from host.serving.service import EngineService
    from sim.backends import get_backend
    from sim.backends.reference import ReferenceMachine
    from sim.cli import backend_options
    from sim.serving.multichip import router_engine, uses_router
    m = model_of(a)
    contig_rows = a.max_prompt_tokens + a.max_tokens_limit - 1
    if uses_router(a):
        engine = router_engine(a, contig_rows, cluster)
    else:
        engine = make_engine(a, m, get_backend(a.sim, config=a.chip, **backend_options(a)), contig_rows=contig_rows)
    runner = None if a.no_verify else \
        BatchRunner(m, ReferenceMachine(config=a.chip), a.chip.lat if a.lat is None else a.lat, a.chip)

    def verify(r) -> bool:              # on the log's worker thread: the runner is its own
        return not replay_mismatches(m, [r], a.window, a.sinks, runner)
    log = a.replay_log or _default_log()
    service = EngineService(engine, max_waiting=a.max_waiting, log_path=log, replay=lambda r: replay_cmd(a, r),
                            verify=None if runner is None else verify)
    name = a.served_model_name or f"ga2-{a.model}"
    key = a.api_key if a.api_key is not None else os.environ.get(API_KEY_ENV) or None
    limits = Limits(a.max_body_bytes, a.max_prompt_tokens, a.max_tokens_limit, a.max_n, a.body_timeout)
    app = create_app(service, name, limits, api_key=key, priority_policy=a.policy == "priority")
    return app, service, name, log


def main_http(a, out) -> int:
    """Serve until SIGTERM or SIGINT (see the module's docstring); 0 once drained, 1 if a replay differed."""
    host, port = a.http
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        raise UsageError(f"--http {host}:{port}: {exc.strerror or exc}") from None
    import contextlib
    from sim.serving.multichip import uses_router
    stack = contextlib.ExitStack()
    cluster = None
    if a.cluster is not None:
        from sim.cluster import Cluster
        cluster = stack.enter_context(Cluster(a.cluster, a.workers))
    with stack:
        return _serve_http(a, out, sock, host, make_server(a, cluster), uses_router(a))


def _serve_http(a, out, sock, host, server_parts, chips: bool) -> int:
    import uvicorn
    app, service, name, log = server_parts
    service.start()
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    where = (f"{a.chips} chip{'s' * (a.chips != 1)} behind the router (route {a.route}, {a.order or 'longest'} "
             f"first{', Ray actors on ' + a.cluster if a.cluster else ''}), each " if chips else "")
    print(f"GA-2 serve --http: model {name} on {where}chip {a.chip.spec()}, mode {a.mode}, simulator {a.sim}, max batch "
          f"{a.max_batch}, pool {a.pages} pages of {a.page} rows; listening on http://{shown}:{bound} "
          f"(/v1/completions, /v1/models, /health, /metrics); replay log {log}"
          f"{'' if a.no_verify else ' (each request replayed alone on the reference)'}", file=out, flush=True)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            service.begin_drain()       # from now on 503; the running requests finish
            super().handle_exit(sig, frame)
            if self.force_exit:         # a second SIGINT: uvicorn cancels the requests in flight, each cancel
                logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)    # logged as a traceback

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http="h11", loop="asyncio")
    server = _Server(config)
    # uvicorn re-raises the signal it caught once it has shut down: a no-op handler lets the drain end in
    # exit status 0 instead of the signal's default (death by SIGTERM)
    old = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        sock.close()
    # a second SIGINT: uvicorn skipped the app's shutdown (its drain); the requests it cut were aborted, so the
    # engine ends them at once, and their replay-log lines are written unless that takes too long
    logged = service.drain(FORCED_DRAIN_SECONDS) if server.force_exit else True
    st = service.stats()
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(st.finished.items())) or "none"
    checked = "replays not checked (--no-verify)" if a.no_verify else \
        f"replays alone: {st.replays_checked - st.replays_differ} of {st.replays_checked} identical"
    print(f"stopped: {sum(st.finished.values())} choices finished ({reasons}), {st.refused} requests refused, "
          f"{st.generation_tokens} tokens generated in {st.chip_cycles:,} chip cycles; {checked}; replay log {log}",
          file=out, flush=True)
    if chips:
        from sim.serving.multichip import failover_lines
        router = service.engine.router
        for line in failover_lines({"failovers": router.failovers, "kills_not_reached": sorted(router.kills.items())}):
            print(line, file=out, flush=True)
    if server.force_exit:
        print(f"error: forced to stop (a second SIGINT): the requests in flight were cut"
              f"{'' if logged else f'; their replay-log lines not all written within {FORCED_DRAIN_SECONDS} s'}",
              file=sys.stderr)
        return 1
    if not service.healthy:
        print("error: the engine stopped serving (see the replay log and the 500 answers)", file=sys.stderr)
        return 1
    return 1 if st.replays_differ else 0
