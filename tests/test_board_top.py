# amaranth: UnusedElaboratable=no
"""hdl.board_top.BoardTop at the bit level: frames as 8N1 levels on `rx`, answers decoded from `tx`, against
sim.board.model.BoardModel; its Verilog ports; its elaboration for the ULX3S.

Four cycles a bit (the UART's shortest), so that the simulation stays small: HELLO, then WRITE / RUN /
READ of one small program.
"""
import re
from dataclasses import replace

import pytest
from amaranth.sim import Simulator

from hdl import isa
from hdl.board_top import LED_HALTED, LED_RUNNING, BoardTop, board_verilog
from hdl.config import BOOK
from hdl.hostlink import Cmd, HelloInfo, Request, RunArgs, RunResultFields, Space, pack_request, parse_answer
from hdl.uart import frame_bits
from sim.board.model import BoardModel

CFG = replace(BOOK, ext_words=256)
CLK, BAUD = 400_000, 100_000                # four cycles a bit
BIT = CLK // BAUD


def line_session(frames):
    """Send each frame on `rx` bit by bit, decode `tx` until the answer is complete; the answers, and the
    LEDs seen after each."""
    top = BoardTop(CFG, CLK, BAUD)
    got = bytearray()
    answers, leds = [], []

    async def listen(ctx):
        # a software receiver: a falling edge, then mid-bit samples
        while True:
            await ctx.negedge(top.tx)
            await ctx.tick().repeat(BIT // 2)
            assert ctx.get(top.tx) == 0, "a glitch on tx"
            byte = 0
            for k in range(8):
                await ctx.tick().repeat(BIT)
                byte |= ctx.get(top.tx) << k
            await ctx.tick().repeat(BIT)
            assert ctx.get(top.tx) == 1, "no stop bit on tx"
            got.append(byte)

    async def drive(ctx):
        ctx.set(top.rx, 1)
        await ctx.tick().repeat(10)
        for data in frames:
            start = len(got)
            for byte in data:
                for level in frame_bits(byte):
                    ctx.set(top.rx, level)
                    await ctx.tick().repeat(BIT)
            # wait for the whole answer: its header says how long it is
            for _ in range(200_000):
                n = len(got) - start
                if n >= 6 and n >= 6 + int.from_bytes(got[start + 4:start + 6], "little") + 2:
                    break
                await ctx.tick()
            else:
                raise AssertionError("no complete answer")
            await ctx.tick().repeat(4 * BIT)
            answers.append(bytes(got[start:]))
            leds.append(ctx.get(top.leds))

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(listen, background=True)
    sim.add_testbench(drive)
    sim.run()
    return answers, leds


@pytest.mark.timeout(120)
def test_hello_write_run_read_through_the_pins():
    prog = [i.word for i in (isa.ld(0, 10, 2), isa.vadd(2, 0, 1, 2), isa.st(2, 20, 2), isa.halt())]
    frames = [pack_request(Request(1, Cmd.HELLO)),
              pack_request(Request(2, Cmd.WRITE, Space.PROGRAM, 0, len(prog),
                                   b"".join(w.to_bytes(16, "little") for w in prog))),
              pack_request(Request(3, Cmd.WRITE, Space.EXT, 10, 3,
                                   b"".join(w.to_bytes(4, "little") for w in (0x01020304, 0x10203040, 7)))),
              pack_request(Request(4, Cmd.RUN, payload=RunArgs(CFG.ext_words, 5, 10_000).pack())),
              pack_request(Request(5, Cmd.READ, Space.EXT, 20, 2))]
    answers, leds = line_session(frames)
    model = BoardModel(CFG, CLK, BAUD)
    want = [model.feed(f) for f in frames]
    assert answers[:3] == want[:3]
    assert answers[4] == want[4]
    hw, mo = parse_answer(answers[3]), parse_answer(want[3])
    r = RunResultFields.unpack(hw.payload, CFG.ext_words, CFG.spad_depth)
    m = RunResultFields.unpack(mo.payload, CFG.ext_words, CFG.spad_depth)
    assert (r.halted, r.counters) == (m.halted, m.counters) and r.halted == 1
    assert r.ext_dirty == m.ext_dirty and r.spad_dirty[0] & 1       # block 1 of ext; block 0 of spad
    assert HelloInfo.unpack(parse_answer(answers[0]).payload).chip_key == CFG.key()
    assert leds[3] >> LED_HALTED & 1 and not leds[3] >> LED_RUNNING & 1


@pytest.mark.timeout(120)
def test_verilog_ports_and_lint(tmp_path):
    v = board_verilog(CFG, CLK, BAUD)
    ports = re.search(r"module board_top\((.*?)\);", v, re.S).group(1)
    assert sorted(p.strip() for p in ports.split(",")) == ["clk", "leds", "rst", "rx", "tx"]
    assert re.search(r"input\s+rx;", v) and re.search(r"output\s+tx;", v) and re.search(r"output\s+\[7:0\]\s+leds;", v)
    # the whole board through Verilator's lint, like sim.flow.verilog's blocks (its own clock and reset
    # ports make it a poor fit for BLOCKS, whose conversion takes the ports from the signature)
    from sim.backends.verilator_backend import verilator_command
    from sim.flow.verilog import lint
    if not verilator_command():
        pytest.skip("Verilator is not installed")
    path = tmp_path / "board_top.v"
    path.write_text(v)
    result = lint(path, "board_top")
    assert result.ok, result.messages


@pytest.mark.timeout(120)
def test_top_elaborates_for_the_ulx3s():
    from sim.flow.fpga import DESIGN_NAME, platform_for
    platform = platform_for("ulx3s-85f")
    plan = platform.prepare(BoardTop(BOOK), name=DESIGN_NAME)
    lpf = plan.files[f"{DESIGN_NAME}.lpf"]
    # the FTDI UART's two pins (rx M1 into the FPGA, tx L4 out of it), the eight LEDs, the 25 MHz clock
    assert re.search(r'LOCATE COMP "uart_0__rx__io" SITE "M1"', lpf)
    assert re.search(r'LOCATE COMP "uart_0__tx__io" SITE "L4"', lpf)
    assert sum(1 for line in lpf.splitlines() if line.strip().startswith('LOCATE COMP "led_')) == 8
    assert "FREQUENCY PORT" in lpf and "25000000" in lpf


@pytest.mark.parametrize("text, want", [("uart", 3_000_000), ("uart:115200", 115_200), ("uart:6250000", 6_250_000)])
def test_link_spec(text, want):
    from sim.flow.fpga import Link, link_spec
    assert link_spec(text) == Link("uart", want)


@pytest.mark.parametrize("value, needle", [("x", "uart or uart:BAUD"), ("uart:", "uart or uart:BAUD"),
                                           ("uart:fast", "'fast'"), ("uart:6250001", "clk_hz/4"),
                                           ("uart:0", "positive")])
def test_bad_link_is_one_line(value, needle, capsys):
    from sim.flow.fpga import main
    with pytest.raises(SystemExit) as e:
        main(["--board", "ulx3s-85f", "--link", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error:") and needle in err
