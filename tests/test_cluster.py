"""``--cluster`` (issue 15, campaigns): the commands' work as Ray tasks on a real Ray runtime, no mocks.

A small fuzz campaign (50 programs on the Verilator model of EXT 2048 / LAT 8, two tasks) must print the
local run's summary line on a head started here with ``ray start --head`` on 127.0.0.1 (joined as HOST:PORT
with 1 worker and with 2, and with 2 while a worker process is killed in the middle of a task: Ray runs the
task again, and the retry is reported); failing programs (a copy of the project with a broken reference
machine) give the local run's FAIL lines on a local runtime (``--cluster local``). A sweep on the reference
machine and two serving chips (Ray actors; in a second run one of them is killed) join the same head. Ray is
part of the test extra, so these tests run wherever the suite runs.

Ray starts twice in this module (each start costs tens of seconds of CPU on a loaded machine): one local
runtime (``--cluster local``, the failing programs) and one head for the whole module (`head`, a module
fixture) that the 1- and 2-worker campaigns, the sweep, the killed worker and the two chip actors all
join. The tests are one ``xdist_group`` (tests/conftest.py runs ``-n N`` with xdist's loadgroup
distribution), so they run on one worker, one after the other, and the head is started once per session.
"""
import contextlib
import fcntl
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import ray  # noqa: F401 - the test extra brings Ray: missing, these tests fail here instead of skipping

ROOT = Path(__file__).resolve().parents[1]
SEED = 15
CAMPAIGN = ["--sim", "verilator", "--seed", str(SEED), "--count", "50", "--ext", "2048", "--lat", "8",
            "--budget", "30000"]
# the summary line without its wall times (the one part that depends on the machine and the run)
_TIMES = re.compile(r"; verilator [0-9.]+ s, reference [0-9.]+ s\)$")


pytestmark = pytest.mark.xdist_group("ray")


_held = []      # the lock file while this process holds it (taken again inside: no second flock)


@contextlib.contextmanager
def one_ray_at_a_time():
    """One Ray runtime of these tests on the machine at a time (another pytest session, or this module's
    tests on two workers when xdist does not group them): held while a runtime of ours is up."""
    if _held:
        yield
        return
    with open(Path(tempfile.gettempdir()) / "ga2-test-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _held.append(lock)
        try:
            yield
        finally:
            _held.pop()


def _run(*args, timeout=600, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT), GA2_PROGRESS_SECONDS="5")
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, **kw)


def _summary(p) -> str:
    """The last line of a fuzz run's stdout with the times taken out; the run must have passed."""
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("PASS: 50/50 programs identical") and _TIMES.search(last), last
    return _TIMES.sub(")", last)


@pytest.fixture(scope="module")
def local_summary():
    """The campaign without --cluster: the line every cluster run must print."""
    p = _run("sim.verify.fuzz", *CAMPAIGN)
    assert "cluster:" not in p.stderr
    return _summary(p)


def test_a_failing_program_is_reported_as_the_local_run_reports_it(tmp_path):
    """A copy of the project whose reference machine is broken (AMAX's index one too large when len is 3
    mod 16; the Verilator model, built from the untouched hdl/, is the cached one) makes programs fail:
    the cluster prints the local run's FAIL lines, word for word (seed, index, pc, reproduce command), in
    the same order, and the same summary line."""
    from sim.verify.mutants import copy_project
    copy = copy_project(tmp_path / "project", ROOT)
    ref = copy / "sim" / "backends" / "reference.py"
    anchor = '    spad[o["dst"]] = argmax_first([spad[(src + k) & sp] for k in range(n)])'
    assert ref.read_text().count(anchor) == 1
    ref.write_text(ref.read_text().replace(anchor, anchor + " + (n % 16 == 3)"))
    from sim.backends.verilator_backend import default_build_root
    env = dict(os.environ, PYTHONPATH=str(copy), GA2_BUILD_DIR=str(default_build_root().parent))
    args = [sys.executable, "-m", "sim.fuzz", "--sim", "verilator", "--seed", "4", "--count", "60", "--ext", "2048",
            "--lat", "8", "--budget", "30000"]
    local = subprocess.run(args, cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    with one_ray_at_a_time():
        remote = subprocess.run(args + ["--cluster", "local", "--workers", "2"], cwd=copy, env=env,
                                capture_output=True, text=True, timeout=600)
    fails = [ln for ln in local.stdout.splitlines() if ln.startswith("FAIL program")]
    first = sorted(int(ln.split()[2]) for ln in fails)
    assert local.returncode == 1 and first[0] < 25 <= first[-1], local.stdout[-3000:]    # in two tasks
    assert remote.returncode == 1, remote.stderr[-3000:]
    assert [ln for ln in remote.stdout.splitlines() if ln.startswith("FAIL program")] == fails
    assert _TIMES.sub(")", remote.stdout.splitlines()[-1]) == _TIMES.sub(")", local.stdout.splitlines()[-1])
    assert local.stdout.splitlines()[-1].startswith(f"FAIL: {60 - len(fails)}/60 programs identical")
    assert "cluster: a local Ray runtime, 1 node, 2 CPUs" in remote.stderr
    assert "cluster: fuzz on verilator: 3 tasks, 3 attempts, 0 retries" in remote.stderr, remote.stderr[-2000:]


# ---- a head started here -----------------------------------------------------------------------------------

def _free_port() -> int:
    """A port that binds now, below the kernel's ephemeral range: Ray binds it later, and a port the kernel
    handed out (bind to 0, or an outgoing connection) could meanwhile go to another socket."""
    low, _ = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, max(20001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (read from /proc), children first-found order."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_tree(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """End `proc` (started here, in its own session) and everything it started, by process id."""
    below = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid] + below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(30)


@contextlib.contextmanager
def ray_head():
    """``ray start --head --block`` on 127.0.0.1 with free ports, in its own session; stopped afterwards,
    even when the test fails. Yields (GCS port, Ray client port, the head's process)."""
    tmp = tempfile.mkdtemp(prefix="ga2ray", dir="/tmp")     # short: Ray's socket paths must fit 107 bytes
    port, client = _free_port(), _free_port()
    ray_cli = Path(sys.executable).parent / "ray"
    cmd = [str(ray_cli), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
           "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(_free_port()),
           "--num-cpus", "2", "--temp-dir", tmp, "--include-dashboard=false", "--disable-usage-stats"]
    log = Path(tmp) / "head.log"
    with open(log, "w") as out:
        head = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield port, client, head
    finally:
        _kill_tree(head)
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def head():
    """One head for the module's tests that join a running cluster: (GCS port, the head's process)."""
    with one_ray_at_a_time(), ray_head() as (port, _client, proc):
        yield port, proc


def test_a_head_started_with_ray_start_gives_the_same_summary_with_1_or_2_workers(local_summary, head, tmp_path):
    """The same seed on a running cluster, joined as HOST:PORT with at most 1 and at most 2 tasks at a time:
    both print the local run's summary line. A sweep (on the reference machine, one configuration a task)
    joined to the same head writes the local sweep's JSON. (Not through the Ray client, ray://HOST:PORT:
    it worked here, but once failed to start its server on a loaded machine.)"""
    sweep = ["sim.sweep", "--sim", "reference", "--configs", "book;mm_load=4"]
    here = _run(*sweep, "--out", str(tmp_path / "here"))
    port = head[0]
    one = _run("sim.verify.fuzz", *CAMPAIGN, "--cluster", f"127.0.0.1:{port}", "--workers", "1")
    assert f"cluster: the Ray cluster at 127.0.0.1:{port}, 1 node, 2 CPUs, at most 1 task at once" \
        in one.stderr, one.stderr[-3000:]
    two = _run("sim.verify.fuzz", *CAMPAIGN, "--cluster", f"127.0.0.1:{port}", "--workers", "2")
    assert "at most 2 tasks at once" in two.stderr, two.stderr[-3000:]
    there = _run(*sweep, "--out", str(tmp_path / "there"), "--cluster", f"127.0.0.1:{port}")
    assert _summary(one) == _summary(two) == local_summary
    assert here.returncode == there.returncode == 0, there.stderr[-3000:]
    assert "cluster: sweep on reference: 2 tasks, 2 attempts, 0 retries" in there.stderr
    assert (tmp_path / "here" / "sweep.json").read_text() == (tmp_path / "there" / "sweep.json").read_text()


# ---- a worker killed in the middle of a task ---------------------------------------------------------------

def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _busy_worker(node: int) -> int | None:
    """A Ray worker process below `node` (the head's process: workers are the raylet's children) in the
    middle of a task of ours: Ray names the process after the task, and the task is running the Verilator
    model (its ga2sim child), so the attempt has begun."""
    for pid in _descendants(node):
        if _cmdline(pid).startswith(b"ray::ga2 fuzz") and \
                any(b"ga2sim" in _cmdline(c) for c in _descendants(pid)):
            return pid
    return None


def test_a_killed_worker_costs_a_retry_not_the_campaign(local_summary, head):
    """A worker of the cluster killed while it runs a task of the campaign: Ray runs the task again, the
    summary is the local run's and the retry is reported."""
    port, node = head
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    driver = subprocess.Popen([sys.executable, "-m", "sim.fuzz", *CAMPAIGN, "--cluster", f"127.0.0.1:{port}",
                               "--workers", "2"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        victim, deadline = None, time.monotonic() + 300
        while victim is None and driver.poll() is None and time.monotonic() < deadline:
            victim = _busy_worker(node.pid)
            if victim is not None:
                os.kill(victim, signal.SIGKILL)
            time.sleep(0.02)
        out, err = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            _kill_tree(driver)
    assert victim is not None, "no worker was seen running a task: nothing was killed"
    p = subprocess.CompletedProcess(driver.args, driver.returncode, out, err)
    assert _summary(p) == local_summary
    m = re.search(r"cluster: fuzz on verilator: 2 tasks, 3 attempts, 1 retry: task (\d) ran 2 times", err)
    assert m, err[-3000:]


def test_without_cluster_ray_is_not_imported():
    code = ("import sys; from sim import serve, sweep; from sim.verify import fuzz, mutants\n"
            "for m in (fuzz, mutants, serve, sweep): m.build_parser().parse_args(['--out', '/tmp'] if m is sweep else [])\n"
            "assert serve.main(['--requests', '2', '--chips', '2', '--no-verify'], out=open('/dev/null', 'w')) == 0\n"
            "print('ray' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.stdout.strip() == "False", p.stderr


def test_bad_cluster_options_are_one_line_before_any_work():
    for args, says in ((["--cluster", "6379"], "--cluster must be 'local', HOST:PORT or ray://HOST:PORT"),
                       (["--cluster", "ray://h:99999"], "--cluster must be"),
                       (["--workers", "2"], "--workers needs --cluster")):
        p = _run("sim.verify.fuzz", "--count", "1", *args, timeout=120)
        assert p.returncode == 2 and p.stderr.startswith("error: ") and says in p.stderr, p.stderr
        assert len(p.stderr.splitlines()) == 1


def test_an_unreachable_cluster_is_one_line():
    from test_loadgen import refusing_port
    with refusing_port() as port:
        p = _run("sim.verify.fuzz", "--count", "1", "--cluster", f"127.0.0.1:{port}", timeout=300)
    assert p.returncode == 2 and p.stderr.splitlines()[-1].startswith("error: cannot join the Ray cluster at "), \
        p.stderr[-2000:]


# ---- serving on several chips (sim.serving.multichip) --------------------------------------------------------------

def test_a_chip_actor_killed_mid_trace_moves_its_requests_as_the_chips_here_do(head, tmp_path):
    """32 requests on 2 chips as Ray actors (on the module's head), chip 1's actor killed by ``ray.kill``
    before its engine step 8 (``--kill-chip 1@8``): the lost chip's running and waiting requests are
    computed again on chip 0, every request is answered once and equals its replay alone, and the JSON
    equals the same run with the chips here but for why the chip was lost (Ray's ActorDiedError there).
    Every request's tokens are those of the run without the kill. (The router's choices and the throughput
    of 2 chips: tests/test_router.py.)"""
    import json
    base = ["sim.serve", "--requests", "32", "--seed", "7", "--sim", "reference", "--chips", "2"]
    kill = ["--kill-chip", "1@8"]
    runs = {"plain": _run(*base, "--json", str(tmp_path / "plain.json")),
            "here": _run(*base, *kill, "--json", str(tmp_path / "here.json")),
            "there": _run(*base, *kill, "--cluster", f"127.0.0.1:{head[0]}", "--json", str(tmp_path / "there.json"))}
    for p in runs.values():
        assert p.returncode == 0, p.stdout + p.stderr[-3000:]
        assert "answers: 32 of 32 answered once each" in p.stdout, p.stdout
        assert "replays alone: 32 of 32 requests identical" in p.stdout, p.stdout
    assert "cluster: chip: 2 actors" in runs["there"].stderr, runs["there"].stderr[-3000:]
    assert "failover: chip 1 lost after 8 engine steps" in runs["there"].stdout
    plain, here, there = (json.loads((tmp_path / f"{n}.json").read_text()) for n in runs)
    for d in (plain, here, there):
        d.pop("run")
    (f_here,), (f_there,) = here["failover_events"], there["failover_events"]
    assert f_here.pop("why").startswith("killed") and f_there.pop("why").startswith("ActorDiedError: ")
    assert here["per_chip"][1].pop("lost").startswith("killed")
    assert there["per_chip"][1].pop("lost").startswith("ActorDiedError: ")
    assert here == there
    assert f_there["chip"] == 1 and f_there["after_steps"] == 8 and f_there["killed"] and f_there["running"]
    moved = [r for r in there["requests"] if "moved_from" in r]
    assert sorted(r["id"] for r in moved) == f_there["moved"] and {r["chip"] for r in moved} == {0}
    assert sorted(r["id"] for r in there["requests"]) == list(range(32))
    assert plain["failovers"] == 0 and {r["chip"] for r in plain["requests"]} == {0, 1}
    assert [(r["tokens"], r["logits_int"]) for r in there["requests"]] == \
        [(r["tokens"], r["logits_int"]) for r in plain["requests"]]
