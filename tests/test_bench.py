"""sim.bench: the Amaranth simulator's build is timed apart, still counted in its wall time, and its code cache named."""
import io
import time

import pytest

import sim.backends.amaranth_backend as amaranth_backend
from hdl.config import BOOK
from sim.backends import build_base
from sim.bench import bench, random_jobs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cache", ["default", "off"])
def test_amaranth_build_is_timed_apart_and_counted_in_the_wall_time_and_names_its_code_cache(monkeypatch, cache):
    if cache == "off":
        monkeypatch.setenv("GA2_PYSIM_CACHE", "off")
    else:
        monkeypatch.delenv("GA2_PYSIM_CACHE", raising=False)
    build = amaranth_backend.AmaranthBackend.build

    def slow_build(self, ext_words, lat):          # a build that surely outlasts the few runs below
        time.sleep(0.5)
        build(self, ext_words, lat)
    monkeypatch.setattr(amaranth_backend.AmaranthBackend, "build", slow_build)
    jobs = random_jobs(400, seed=3, ext=8192, config=BOOK)
    out = io.StringIO()
    result = bench(jobs, ["amaranth"], out=out, config=BOOK)
    row = result["backends"]["amaranth"]
    cycles = result["cycles"]
    assert row["identical"]
    assert 0.5 <= row["build_s"] < row["wall_s"]
    assert row["cycles_per_s"] == cycles / row["wall_s"]
    assert row["simulating_cycles_per_s"] == cycles / (row["wall_s"] - row["build_s"])
    assert len(result["objects"]["amaranth"]._rigs) == 1           # built once, then reused by every run
    text = out.getvalue()
    assert "building the simulator" in text and f"{row['simulating_cycles_per_s']:,.0f} cycles/s" in text
    said = ("its code cache off by $GA2_PYSIM_CACHE" if cache == "off"
            else f"its code cached in {build_base() / 'pysim'}")
    assert said in text and text.count("its code cache") == 1
