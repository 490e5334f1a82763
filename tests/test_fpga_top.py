# amaranth: UnusedElaboratable=no
"""The FPGA top: one decode step run out of reset in Amaranth's simulator, and its elaboration for the ULX3S.

Expected values come from the reference machine (sim.backends.reference) on the same program and image, and
from the chapter's rule f(t) = 5t+3 mod 16 that the structured model follows.
"""
import pytest
from amaranth.sim import Simulator

from compiler import readback
from hdl.fpga_top import LED_HALTED, LED_TOKEN_BITS, DecodeStepTop
from host.tiny_lm import f_next
from sim.cli import guarded
from sim.flow.fpga import BOARDS, DESIGN_NAME, decode_step, main, make_top, platform_for
from sim.backends.reference import ReferenceMachine

PERIOD = 1e-6


@pytest.fixture(scope="module")
def step():
    return decode_step(0)


@pytest.fixture(scope="module")
def reference(step):
    result = ReferenceMachine().run(step.program, step.image, 8)
    return result, readback(step.compiled, result.ext)["tok"][0][0][0]


def run_top(top, budget):
    """Simulate `top` from reset until the token is read back; the observations at that point."""
    seen = {}

    async def bench(ctx):
        # LEDs right after reset: nothing shown yet
        seen["leds_at_reset"] = ctx.get(top.leds)
        # sleep until halted, then until the token has been read (no Python per cycle)
        await ctx.posedge(top.halted).delay(budget * PERIOD)
        seen["halted"] = ctx.get(top.halted)
        seen["leds_at_halt"] = ctx.get(top.leds)
        seen["cycles"] = [ctx.get(c) for c in (top.chip.cyc_total, top.chip.cyc_mm, top.chip.cyc_dma,
                                               top.chip.cyc_vec, top.chip.n_inst)]
        if not ctx.get(top.token_valid):
            await ctx.posedge(top.token_valid).delay(100 * PERIOD)
        seen["token_valid"] = ctx.get(top.token_valid)
        seen["token"] = ctx.get(top.token)
        seen["leds"] = ctx.get(top.leds)

    sim = Simulator(top)
    sim.add_clock(PERIOD)
    sim.add_testbench(bench)
    sim.run()
    return seen


def test_step_runs_at_reset_and_leds_show_the_reference_token(step, reference):
    result, tok = reference
    assert tok == f_next(step.start) == 3            # the structured model follows the chapter's rule
    seen = run_top(make_top(step), budget=result.counters[0] + 50)
    assert seen["leds_at_reset"] == 0
    assert seen["halted"] == 1
    assert seen["cycles"] == list(result.counters)   # the top adds no cycle to the chip's own run
    # at the halt edge the token is not read yet: only the halted LED is on
    assert seen["leds_at_halt"] == 1 << LED_HALTED
    assert seen["token_valid"] == 1
    assert seen["token"] == tok
    assert seen["leds"] == (1 << LED_HALTED) | (tok & ((1 << LED_TOKEN_BITS) - 1))


def test_other_start_token_changes_the_leds():
    # a second step, so that a top that ignored its image could not pass by luck
    other = decode_step(5)
    result = ReferenceMachine().run(other.program, other.image, 8)
    tok = readback(other.compiled, result.ext)["tok"][0][0][0]
    seen = run_top(make_top(other), budget=result.counters[0] + 50)
    assert seen["token"] == tok == f_next(5)
    assert seen["leds"] == (1 << LED_HALTED) | tok


def test_top_elaborates_for_the_ulx3s(step):
    platform = platform_for("ulx3s-85f")
    plan = platform.prepare(make_top(step), name=DESIGN_NAME)     # RTLIL and constraints, no toolchain run
    files = plan.files
    assert f"{DESIGN_NAME}.il" in files and f"{DESIGN_NAME}.lpf" in files
    lpf = files[f"{DESIGN_NAME}.lpf"]
    # the eight LEDs are placed, and the 25 MHz board clock is the timing constraint
    assert sum(1 for line in lpf.splitlines() if line.strip().startswith('LOCATE COMP "led_')) == 8
    assert "FREQUENCY PORT" in lpf and "25000000" in lpf
    assert "module \\" + DESIGN_NAME in files[f"{DESIGN_NAME}.il"]


@pytest.mark.parametrize("kwargs, needle", [
    (dict(program=[], image=[0], tok_addr=0), "program has 0 words"),
    (dict(program=[0] * 257, image=[0], tok_addr=0), "program has 257 words"),
    (dict(program=[1 << 128], image=[0], tok_addr=0), "program word 0"),
    (dict(program=[0], image=[0, -1], tok_addr=0), "external image word 1 = -1"),
    (dict(program=[0], image=[0] * 4, tok_addr=4), "tok_addr = 4"),
])
def test_bad_top_arguments_are_named(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        DecodeStepTop(**kwargs)


def test_unknown_board_is_one_line(capsys):
    assert guarded(main, ["--board", "icebreaker"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "icebreaker" in err and "ulx3s-85f" in err
    assert list(BOARDS) == ["ulx3s-85f"]


def test_missing_yowasp_tool_is_one_line(monkeypatch, capsys, tmp_path):
    import sim.flow.fpga as F
    monkeypatch.setattr(F, "_tool_path", lambda name: None)
    assert guarded(main, ["--board", "ulx3s-85f", "--build-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not installed" in err and "yowasp-" in err


def test_report_summary_and_critical_sources():
    from sim.flow.fpga import critical_sources, format_summary, summarize_report
    report = {
        "fmax": {"clk": {"achieved": 23.3249, "constraint": 25}},
        "utilization": {"DP16KD": {"available": 208, "used": 26}, "DCUA": {"available": 2, "used": 0}},
        "critical_paths": [{"from": "posedge clk", "to": "posedge clk", "path": [
            {"delay": 5.5, "type": "clk-to-q", "from": {"cell": "a"}, "to": {"cell": "a"}},
            {"delay": 1.25, "type": "routing", "from": {"cell": "a"}, "to": {"cell": "b"}},
            {"delay": 0.25, "type": "logic", "from": {"cell": "b"}, "to": {"cell": "c"}}]}],
    }
    s = summarize_report(report)
    assert s["fmax"] == {"clk": {"achieved_mhz": 23.32, "constraint_mhz": 25}}
    assert s["utilization"] == {"DP16KD": {"used": 26, "available": 208}}      # unused kinds left out
    assert s["critical_paths"][0]["delay_ns"] == 7.0
    assert (s["critical_paths"][0]["start"], s["critical_paths"][0]["end"]) == ("a", "c")
    log = "\n".join([
        "Info: Critical path report for clock 'clk' (posedge -> posedge):",
        "Info:                          Defined in:",
        "Info:                               /repo/hdl/requant.py:42",
        "Info:                               /share/lattice/arith_map_ccu2c.v:74.7-80.4",
        "Info:                               /repo/hdl/requant.py:52",
        "Info:                               /repo/hdl/requant.py:42",
        "Info: Critical path report for cross-domain path '<async>' -> '<async>':",
        "Info:                               /repo/hdl/fpga_top.py:68",
    ])
    assert critical_sources(log, root="/repo") == ["hdl/requant.py:42", "hdl/requant.py:52"]
    text = format_summary({**s, "bitstream": "x.bit", "bitstream_bytes": 3, "build_seconds": 1.0,
                           "critical_path_sources": ["hdl/requant.py:42"]})
    assert "23.32 MHz (FAILS the 25 MHz constraint)" in text and "through hdl/requant.py:42" in text


@pytest.mark.parametrize("argv, needle", [([], "--board"), (["--board", "ulx3s-85f", "--seed", "q"], "'q'")])
def test_bad_command_line_is_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error:") and needle in err
