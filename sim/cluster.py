"""Campaigns on a Ray cluster: ``--cluster ADDRESS`` on `sim.verify.fuzz`, `sim.verify.mutants` and `sim.sweep` (tasks)
and on `sim.serve --chips K` (one actor per chip, `Cluster.spawn`).

The one module of the project that knows Ray (``pip install -e '.[cluster]'``). The commands import it
only when ``--cluster`` is given, and it imports Ray only when a `Cluster` is entered: without the option
nothing changes and Ray is never imported.

- ``--cluster local`` starts a Ray runtime on this machine with ``--workers`` CPUs (default: all of
  them); ``--cluster HOST:PORT`` joins a cluster whose head was started with ``ray start --head --port
  PORT``, ``--cluster ray://HOST:PORT`` joins one through the Ray client (port 10001 on a head); there
  ``--workers N`` caps the tasks running at once (default: every CPU of the cluster).
- A command cuts its work into tasks of a few seconds, each a call of a plain function of the command's
  module (no Ray in it) with picklable arguments; `Cluster.map` submits them, streams the results back in
  the order of the tasks with a `sim.cli.Progress`, and never holds more than a few tasks per worker in
  flight. A result never depends on the number of workers: a task's result depends only on its arguments.
- A task whose worker dies (its process killed, its node lost) is run again by Ray (``max_retries``); a
  small actor counts the attempts of every task, and the retries are reported in a ``cluster:`` line on
  stderr. An exception raised by a task's own code is not retried: it is raised again in the driver as
  itself (a user error still becomes one ``error:`` line), so a failing run reads as the local run does.
- A worker keeps one backend per (simulator, chip, options) for its life (`worker_backend`), and the
  Verilator backend keeps its models in the node's build directory under a per-model lock: the first task
  on a node that needs a model builds it, the node's other workers wait for it and reuse it (once per
  node, not once per task).
- `Cluster.spawn` starts actors (the chips of ``sim.serve --chips K``), called a method at a time
  (`Actor.call`). Ray does not restart an actor that dies: its next call raises `ActorLost`, and the
  caller (the multi-chip router) moves its work to the others. `Actor.kill` is ``ray.kill``.

Every node runs the same checkout of the project, installed with the ``cluster`` extra (docs/cluster.md).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time

from sim.cli import CommandError, UsageError, int_range

__all__ = ["LOCAL", "DEFAULT_RETRIES", "ClusterError", "ActorLost", "Actor", "address", "cluster_option", "check_cluster_args",
           "Cluster", "worker_backend"]

LOCAL = "local"
DEFAULT_RETRIES = 3             # Ray runs a task whose worker died up to this many more times
_OBJECT_STORE = 256 << 20       # bytes of shared memory for a local runtime: results are small summaries
_ADDRESS = re.compile(r"(?P<scheme>ray://)?(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]+)")


class ClusterError(CommandError):
    """The cluster cannot be reached or used, or a task failed beyond its retries (the message says which)."""


class ActorLost(ClusterError):
    """An actor is gone: killed (`Actor.kill`, ``ray.kill``), or its worker process or node died.
    ``reason``: Ray's error, its type and first line."""

    reason = ""


# ---- the option ---------------------------------------------------------------------------------------

def address(text: str) -> str:
    """An argparse type for ``--cluster``: ``local``, ``HOST:PORT`` or ``ray://HOST:PORT`` (port 1..65535)."""
    if text == LOCAL:
        return text
    m = _ADDRESS.fullmatch(text)
    if m is None or not 1 <= int(m["port"]) <= 65535:
        raise argparse.ArgumentTypeError(f"must be 'local', HOST:PORT or ray://HOST:PORT, got {text!r}")
    return text


address.__name__ = "cluster address"


# the largest --workers taken (a sanity bound on a typo, not a Ray limit)
MAX_WORKERS = 1 << 12


def cluster_option(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``--cluster ADDRESS`` and ``--workers N`` to a command; `what` says what becomes a task."""
    parser.add_argument("--cluster", type=address, default=None, metavar="ADDRESS",
                        help=f"run the work as Ray tasks ({what}): 'local' starts Ray on this machine, HOST:PORT "
                             "joins a cluster whose head ran `ray start --head --port PORT`, ray://HOST:PORT joins "
                             "through the Ray client; needs pip install -e '.[cluster]' (default: none, no Ray)")
    parser.add_argument("--workers", type=int_range(1, MAX_WORKERS), default=None, metavar="N",
                        help="with --cluster: tasks at once (CPUs of a local runtime; a cap on an existing "
                             "cluster) (default: every CPU)")


def check_cluster_args(args) -> None:
    """Refuse ``--workers`` without ``--cluster``, and ``--cluster`` without Ray (a UsageError, before any
    work)."""
    if getattr(args, "workers", None) is not None and getattr(args, "cluster", None) is None:
        raise UsageError("--workers needs --cluster (without it the command runs on this machine as before)")
    if getattr(args, "cluster", None) is not None:
        import importlib.util
        if importlib.util.find_spec("ray") is None:     # said before any work, without importing Ray
            raise UsageError("--cluster needs Ray: pip install -e '.[cluster]'")


# ---- on a worker --------------------------------------------------------------------------------------

_backends: dict = {}


def worker_backend(name: str, config=None, **options):
    """The backend `name` for `config` (default: the book's chip), made once per worker process.

    A Ray worker process runs many tasks: keeping its backends keeps the Verilator backend's table of
    models (and, for the Amaranth simulator, its elaborated simulators) from one task to the next. The
    Verilator models themselves live in the node's build directory, built once per node (see the module
    doc).
    """
    from hdl.config import BOOK
    from sim.backends import get_backend
    config = BOOK if config is None else config
    key = (name, config.key(), tuple(sorted(options.items())))
    if key not in _backends:
        _backends[key] = get_backend(name, config=config, **options)
    return _backends[key]


def _attempt(ledger, key, payload: bytes):
    """One attempt of a task: recorded by the ledger first, then `payload` (the function and its arguments,
    pickled by the driver) unpickled and run. Unpickling imports the command's modules (a second or more
    on a fresh worker): done after the record, a worker killed meanwhile still counts as a retry."""
    import ray
    from ray import cloudpickle
    ray.get(ledger.start.remote(key))
    fn, args = cloudpickle.loads(payload)
    return fn(*args)


class _Ledger:
    """Counts the attempts of every task (an actor: it outlives the workers that die)."""

    def __init__(self):
        self.attempts = {}

    def start(self, key):
        self.attempts[key] = self.attempts.get(key, 0) + 1

    def counts(self):
        return dict(self.attempts)


# ---- on the driver ------------------------------------------------------------------------------------

def _ray():
    try:
        import ray
    except ImportError:
        raise UsageError("--cluster needs Ray: pip install -e '.[cluster]'") from None
    return ray


def _token_for_join() -> None:
    """Ray 2.60 turns token authentication on for a head started where a token exists (~/.ray/auth_token),
    but a driver joining it does not look for that token unless RAY_AUTH_MODE says so: say it, when a
    token is there and the user has not chosen a mode."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(path):
        os.environ["RAY_AUTH_MODE"] = "token"


def _answers(text: str, timeout: float = 5.0) -> str | None:
    """None when something accepts a TCP connection at the address `text` (HOST:PORT or ray://HOST:PORT),
    else why not: Ray itself waits a long time for a head that is not there."""
    import socket
    m = _ADDRESS.fullmatch(text)
    host = m["host"].strip("[]")
    try:
        with socket.create_connection((host, int(m["port"])), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def _by_name(obj):
    """`obj` (a function or class) as its importable module holds it: a command run as ``python -m sim.X``
    defines its functions in ``__main__``, which a worker cannot import, and pickling them by value drags in
    the module's globals (locks among them); the same object from ``sim.X`` is pickled by name."""
    if getattr(obj, "__module__", None) != "__main__":
        return obj
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is None or not spec.name or spec.name == "__main__":
        return obj
    import importlib
    return getattr(importlib.import_module(spec.name), obj.__qualname__, obj)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class Cluster:
    """A Ray runtime for one command's run, used as a context manager.

    Parameters
    ----------
    address : str
        ``local`` (start Ray here), ``HOST:PORT`` or ``ray://HOST:PORT`` (join a running cluster).
    workers : int, optional
        For ``local``: the runtime's CPUs (default: this machine's). For a running cluster: the most tasks
        in flight at once (default: twice the cluster's CPUs, so that none waits for work).
    stream : file, optional
        Where the ``cluster:`` lines and the progress go (default: sys.stderr).
    max_retries : int
        Ray's retries of a task whose worker died.

    Attributes
    ----------
    cpus, nodes : int
        The cluster's CPUs and live nodes, once entered.
    tasks, attempts, retries : int
        Over every `map` so far: tasks finished, attempts started, and attempts beyond the first.
    """

    def __init__(self, address: str, workers: int | None = None, stream=None, max_retries: int = DEFAULT_RETRIES):
        self.address = address
        self.workers = workers
        self.stream = stream or sys.stderr
        self.max_retries = max_retries
        self.cpus = self.nodes = 0
        self.tasks = self.attempts = self.retries = 0
        self._maps = 0
        self._ledger = None
        self._ray = None

    def __enter__(self):
        if self.address != LOCAL:
            why = _answers(self.address)
            if why is not None:
                raise ClusterError(f"cannot join the Ray cluster at {self.address}: nothing answers there ({why})")
            _token_for_join()           # before Ray reads its configuration (at import)
        ray = self._ray = _ray()
        import logging
        common = dict(logging_level=logging.WARNING, configure_logging=True, log_to_driver=True)
        try:
            if self.address == LOCAL:
                ray.init(address="local", num_cpus=self.workers or os.cpu_count() or 1, include_dashboard=False,
                         object_store_memory=_OBJECT_STORE, **common)
            else:
                ray.init(address=self.address, **common)
        except Exception as e:      # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, its own types
            raise ClusterError(f"cannot {'start Ray here' if self.address == LOCAL else 'join the Ray cluster at ' + self.address}: "
                               f"{_first_line(e)}") from e
        try:
            self.cpus = int(ray.cluster_resources().get("CPU", 0))
            self.nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
            if self.cpus < 1:
                raise ClusterError(f"the Ray cluster at {self.address} has no CPU for tasks")
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            here = ray.get_runtime_context().get_node_id()
            # the ledger stays beside the driver (num_cpus=0: it takes no worker's place)
            self._ledger = ray.remote(_Ledger).options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote()
            # up before the first task: an attempt must not wait for the actor's process to start (a
            # worker killed while its call is pending takes the call with it, and the retry goes uncounted)
            ray.get(self._ledger.counts.remote())
        except BaseException:
            ray.shutdown()
            raise
        where = "a local Ray runtime" if self.address == LOCAL else f"the Ray cluster at {self.address}"
        print(f"cluster: {where}, {self.nodes} node{'s' * (self.nodes != 1)}, {self.cpus} CPU"
              f"{'s' * (self.cpus != 1)}" + (f", at most {self.workers} task{'s' * (self.workers != 1)} at once"
                                              if self.workers and self.address != LOCAL else ""),
              file=self.stream, flush=True)
        return self

    def __exit__(self, *exc):
        if self._ray is not None:
            self._ray.shutdown()
        return False

    def map(self, fn, arglist, label: str, unit: str = "task", progress: bool = True):
        """Run ``fn(*args)`` for every `args` of `arglist` as Ray tasks; yield the results in that order.

        `fn` (a function of the command's module, pickled with its arguments) must give a result that
        depends only on its arguments. A task whose worker dies is retried by Ray; an exception of `fn` itself is raised
        here as itself (not retried). After the last result a ``cluster:`` line reports the tasks, the
        attempts and which tasks were retried.
        """
        ray = self._ray
        from ray import cloudpickle
        fn = _by_name(fn)
        arglist = [tuple(a) for a in arglist]
        n = len(arglist)
        self._maps += 1
        run = self._maps
        remote = ray.remote(_attempt).options(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False,
                                              name=f"ga2 {label}")
        window = self.workers if self.workers and self.address != LOCAL else 2 * self.cpus
        pending: dict = {}
        ready: dict = {}
        submitted = done = 0
        t0 = time.monotonic()
        from sim.cli import Progress
        with Progress(f"{label} on the cluster", unit=unit, enabled=progress, stream=self.stream) as bar:
            try:
                while done < n:
                    while submitted < n and len(pending) < window:
                        payload = cloudpickle.dumps((fn, arglist[submitted]))
                        ref = remote.remote(self._ledger, (run, submitted), payload)
                        pending[ref] = submitted
                        submitted += 1
                    finished, _ = ray.wait(list(pending), num_returns=1)
                    for ref in finished:
                        i = pending.pop(ref)
                        ready[i] = self._result(ref, i, label)
                    while done in ready:
                        result = ready.pop(done)
                        done += 1
                        bar(done, n)
                        if done == n:   # reported before the last result: a consumer may stop at it (zip)
                            self._report(run, n, label, t0)
                        yield result
            finally:
                for ref in pending:     # a failed task or an interrupt: the rest would only load the cluster
                    try:
                        ray.cancel(ref)
                    except Exception:   # noqa: BLE001 - already finished or gone: nothing to cancel
                        pass
        if n == 0:
            self._report(run, n, label, t0)

    def _report(self, run: int, n: int, label: str, t0: float) -> None:
        """The ``cluster:`` line of map number `run`: its tasks, attempts and retried tasks."""
        counts = {k[1]: v for k, v in self._ray.get(self._ledger.counts.remote()).items() if k[0] == run}
        attempts = sum(counts.values())
        retried = sorted(i for i, c in counts.items() if c > 1)
        self.tasks += n
        self.attempts += attempts
        self.retries += attempts - n
        note = "" if not retried else ": " + ", ".join(f"task {i} ran {counts[i]} times" for i in retried) + \
            " (its worker died; Ray ran it again)"
        print(f"cluster: {label}: {n} tasks, {attempts} attempts, {attempts - n} "
              f"retr{'y' if attempts - n == 1 else 'ies'}{note}; {time.monotonic() - t0:.1f} s",
              file=self.stream, flush=True)

    def spawn(self, cls, init_args, label: str) -> list:
        """One Ray actor of `cls` (a plain class of the command's module) per entry of `init_args`, each
        built with those arguments; an `Actor` for each, in order.

        The actors take no CPU of Ray's count (``num_cpus=0``) and are spread over the nodes: a caller that
        calls them one at a time (the multi-chip router steps the chip whose clock is earliest) keeps them
        all alive at once, more of them than the cluster has CPUs. Ray does not restart one that dies.
        """
        ray = self._ray
        remote = ray.remote(_by_name(cls)).options(num_cpus=0, max_restarts=0, scheduling_strategy="SPREAD")
        actors = [Actor(self, remote.remote(*args), f"{label} {k}") for k, args in enumerate(init_args)]
        print(f"cluster: {label}: {len(actors)} actor{'s' * (len(actors) != 1)}", file=self.stream, flush=True)
        return actors

    def _result(self, ref, i: int, label: str):
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
                raise cause from e          # the task's own exception, as the local run raises it
            raise ClusterError(f"{label}: task {i} failed: {_first_line(e)}") from e
        except ray.exceptions.RayError as e:
            raise ClusterError(f"{label}: task {i} failed after {self.max_retries} retries: "
                               f"{type(e).__name__}: {_first_line(e)}") from e


class Actor:
    """One Ray actor (`Cluster.spawn`), called a method at a time.

    `call` waits for the answer; an exception of the actor's own code is raised here as itself, and an
    actor that is gone (killed, its process or node lost) raises `ActorLost` naming Ray's error."""

    def __init__(self, cluster: Cluster, handle, label: str):
        self._ray, self.handle, self.label = cluster._ray, handle, label
        self.killed = False

    def call(self, method: str, *args):
        """``method(*args)`` on the actor; its answer."""
        ray = self._ray
        try:
            return ray.get(getattr(self.handle, method).remote(*args))
        except ray.exceptions.RayActorError as e:
            lost = ActorLost(f"{self.label}: {type(e).__name__}: {_first_line(e)}")
            lost.reason = f"{type(e).__name__}: {_first_line(e)}"
            raise lost from e
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
                raise cause from e          # the actor's own exception, as the local object raises it
            raise ClusterError(f"{self.label}: {method} failed: {_first_line(e)}") from e

    def kill(self) -> None:
        """End the actor now (``ray.kill``: its process is killed; it is not restarted)."""
        self.killed = True
        with contextlib.suppress(Exception):    # already gone: nothing to end
            self._ray.kill(self.handle, no_restart=True)
