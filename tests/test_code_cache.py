"""sim.backends.code_cache: the compiled code of the pysim engine kept on disk, used only for its own source.

The engine's toy design (tests/test_amaranth_engine.py) is built twice on one cache directory: the second
build compiles nothing and still gives the stock engine's values cycle by cycle. An entry is never used
for another compiler (salt), a damaged entry is compiled again, and a cache turned off or not writable
only costs time.
"""
import marshal

import pytest

from sim.backends.amaranth_engine import SkipIdleEngine
from sim.backends.code_cache import CodeCache, default_cache_dir
from tests.test_amaranth_engine import _trace

pytestmark = pytest.mark.timeout(120)


def _entries(root):
    return sorted(p for p in root.rglob("*.code"))


def test_second_build_compiles_nothing_and_gives_the_same_values(tmp_path, monkeypatch):
    monkeypatch.setenv("GA2_PYSIM_CACHE", str(tmp_path))
    want, _ = _trace("pysim", 120)
    first, sim1 = _trace(SkipIdleEngine, 120)
    cache1 = sim1._engine.code_cache
    assert cache1.hits == 0 and cache1.misses > 5
    assert len(_entries(tmp_path)) == cache1.misses
    second, sim2 = _trace(SkipIdleEngine, 120)
    cache2 = sim2._engine.code_cache
    assert (cache2.hits, cache2.misses) == (cache1.misses, 0)
    assert first == want and second == want


def test_damaged_entries_are_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setenv("GA2_PYSIM_CACHE", str(tmp_path))
    want, _ = _trace("pysim", 80)
    _trace(SkipIdleEngine, 80)
    entries = _entries(tmp_path)
    damaged = [b"\x00garbage", b"", marshal.dumps(compile("x = 1", "<x>", "exec"))[:7], marshal.dumps(42)]
    for k, path in enumerate(entries):            # not marshal data, empty, cut short, not code
        path.write_bytes(damaged[k % len(damaged)])
    got, sim = _trace(SkipIdleEngine, 80)
    assert sim._engine.code_cache.misses == len(entries)
    assert got == want


def test_an_entry_is_only_for_its_own_compiler(tmp_path):
    calls = []

    def compile_fn(source, filename, mode):
        calls.append(source)
        return compile(source, filename, mode)

    source = "def run():\n    return 41 + 1\n"
    a = CodeCache(tmp_path, b"rewriter one")
    for _ in range(2):
        namespace = {}
        exec(a.compile(compile_fn, source, "<string>", "exec"), namespace)
        assert namespace["run"]() == 42
    assert (a.hits, a.misses, len(calls)) == (1, 1, 1)
    b = CodeCache(tmp_path, b"rewriter two")
    b.compile(compile_fn, source, "<string>", "exec")
    assert (b.hits, b.misses, len(calls)) == (0, 1, 2)
    other = "def run():\n    return 41 + 2\n"
    a.compile(compile_fn, other, "<string>", "exec")
    assert (a.misses, len(_entries(tmp_path))) == (2, 3)


@pytest.mark.parametrize("setting", ["off", "0", ""])
def test_cache_turned_off_keeps_nothing(tmp_path, monkeypatch, setting):
    monkeypatch.setenv("GA2_PYSIM_CACHE", setting)
    monkeypatch.setenv("GA2_BUILD_DIR", str(tmp_path))
    assert default_cache_dir() is None
    want, _ = _trace("pysim", 40)
    got, sim = _trace(SkipIdleEngine, 40)
    assert got == want
    assert sim._engine.code_cache.root is None and not list(tmp_path.iterdir())


def test_default_directory_is_under_the_build_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("GA2_PYSIM_CACHE", raising=False)
    monkeypatch.setenv("GA2_BUILD_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "pysim"


def test_unwritable_directory_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("GA2_PYSIM_CACHE", str(blocker / "pysim"))
    want, _ = _trace("pysim", 40)
    got, sim = _trace(SkipIdleEngine, 40)
    assert got == want
    assert sim._engine.code_cache.hits == 0 and sim._engine.code_cache.misses > 5
