# amaranth: UnusedElaboratable=no
"""hdl.uart: the 8N1 transmitter and receiver against a Python line model, cycle by cycle.

The line model drives the receiver's pin from frames laid on a continuous time axis (a bit period that may
differ from the receiver's by a factor) and checks the transmitter's pin against the exact cycles of
`hdl.uart.tx_edge`; a plain software decoder (falling edge, then mid-bit samples) reads it back as a host
would. The design's own properties (`uart.*` Asserts) are evaluated by the simulator at every edge here.
"""
import random
from fractions import Fraction

import pytest
from amaranth.hdl import Module

from hdl.uart import (SYNC_STAGES, UART, UARTRx, UARTTx, bit_period, check_rate, frame_bits, frame_cycles,
                      rx_sample, tx_edge)
from tests.simutil import run

DEFAULT = (25_000_000, 3_000_000)           # 25/3 = 8.333 cycles a bit
RATES = [
    DEFAULT,
    (12_000_000, 3_000_000),                # integer divisor 4: the shortest bit allowed
    (48_000_000, 3_000_000),                # integer divisor 16
    (9, 2),                                 # 4.5 cycles: the shortest fractional bit
    (1_000_000, 115_200),                   # 625/72 = 8.68 cycles
]


# ---- the line model ----

def line_levels(frames, period, *, lead=5, gaps=None, tail=None):
    """Per-cycle levels of a line carrying `frames` (lists of ten levels) at `period` cycles a bit (a
    Fraction). Frame j starts at time T_j; bit k covers [T_j + k*period, T_j + (k+1)*period), and cycle c
    shows the level at time c. T_0 = lead; T_{j+1} = T_j + (10 + gaps[j]) * period (gaps in bits, default
    0: back to back). The line is high outside frames, `tail` cycles after the last (default 2 frames)."""
    period = Fraction(period)
    gaps = gaps or [0] * len(frames)
    t = Fraction(lead)
    spans = []
    for bits, gap in zip(frames, gaps):
        for k, level in enumerate(bits):
            lo, hi = t + k * period, t + (k + 1) * period
            spans.append((-(-lo // 1), -(-hi // 1), level))         # cycles ceil(lo) .. ceil(hi) - 1
        t += (len(bits) + gap) * period
    end = -(-t // 1) + (tail if tail is not None else int(20 * period))
    levels = [1] * end
    for lo, hi, level in spans:
        for c in range(lo, hi):
            levels[c] = level
    return levels


def decode_line(levels, period):
    """A host's decoder: on each falling edge at cycle e, samples bit k at e + floor((k + 1/2) * period);
    returns (bytes, framing errors)."""
    out, errors = [], 0
    c, prev = 0, 1
    while c < len(levels):
        if prev == 1 and levels[c] == 0:
            at = [c + int((k + Fraction(1, 2)) * period) for k in range(10)]
            if at[-1] >= len(levels):
                break
            bits = [levels[a] for a in at]
            if bits[0] == 0 and bits[9] == 1:
                out.append(sum(b << i for i, b in enumerate(bits[1:9])))
            elif bits[0] == 0:
                errors += 1
            c = at[9] + 1 if bits[0] == 0 else c + 1
            prev = levels[c - 1]
            continue
        prev = levels[c]
        c += 1
    return out, errors


# ---- simulation runners ----

def run_rx(clk, baud, levels, ready=None):
    """Drive the receiver's pin with `levels` (one a cycle); `ready(c)` is the consumer's ready in cycle c
    (default always). Returns the bytes taken and the cycles of each status pulse."""
    dut = UARTRx(clk, baud)
    got = {"bytes": [], "framing_error": [], "break_": [], "overrun": [], "taken_at": []}

    async def bench(ctx):
        for c, level in enumerate(levels):
            ctx.set(dut.rx, level)
            rdy = 1 if ready is None else ready(c)
            ctx.set(dut.o.ready, rdy)
            if rdy and ctx.get(dut.o.valid):
                got["bytes"].append(ctx.get(dut.o.payload))
                got["taken_at"].append(c)
            for name in ("framing_error", "break_", "overrun"):
                if ctx.get(getattr(dut, name)):
                    got[name].append(c)
            await ctx.tick()

    run(dut, bench)
    return got


def run_tx(clk, baud, data, cycles, valid=None):
    """Offer `data` on the transmitter's input (`valid(c)`: whether a byte is offered in cycle c, default
    always while any is left). Returns the tx level and busy of every cycle and the cycle each byte was
    taken in."""
    dut = UARTTx(clk, baud)
    got = {"tx": [], "busy": [], "taken": []}

    async def bench(ctx):
        n = 0
        for c in range(cycles):
            offer = n < len(data) and (valid is None or valid(c))
            ctx.set(dut.i.valid, offer)
            if n < len(data):
                ctx.set(dut.i.payload, data[n])
            got["tx"].append(ctx.get(dut.tx))
            got["busy"].append(ctx.get(dut.busy))
            if offer and ctx.get(dut.i.ready):
                got["taken"].append(c)
                n += 1
            await ctx.tick()

    run(dut, bench)
    return got


def expected_tx(clk, baud, data, taken, cycles):
    """The exact line and busy a transmitter must show: the frame of byte j from cycle taken[j] + 1,
    bit k from its cycle `tx_edge(k)` on."""
    tx, busy = [1] * cycles, [0] * cycles
    for byte, a in zip(data, taken):
        bits = frame_bits(byte)
        for k in range(10):
            for c in range(a + 1 + tx_edge(clk, baud, k), min(cycles, a + 1 + tx_edge(clk, baud, k + 1))):
                tx[c], busy[c] = bits[k], 1
    return tx, busy


def rand_bytes(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def count_for(rate, heavy=150, light=40):
    """Fewer bytes for the slow rates (the simulator's cost is per cycle)."""
    return heavy if bit_period(*rate) < 9 else light


# ---- the timing helpers ----

@pytest.mark.timeout(60)
def test_helpers_default_link():
    assert bit_period(*DEFAULT) == Fraction(25, 3)
    assert [tx_edge(*DEFAULT, k) for k in range(11)] == [0, 8, 16, 25, 33, 41, 50, 58, 66, 75, 83]
    assert frame_cycles(*DEFAULT) == 83
    assert [rx_sample(*DEFAULT, k) for k in range(10)] == [4, 12, 20, 29, 37, 45, 54, 62, 70, 79]
    assert frame_bits(0xA5) == [0, 1, 0, 1, 0, 0, 1, 0, 1, 1]
    # an integer divisor: the edges and samples on the grid
    assert [tx_edge(48, 3, k) for k in (0, 1, 9, 10)] == [0, 16, 144, 160]
    assert [rx_sample(48, 3, k) for k in (0, 1, 9)] == [8, 24, 152]


@pytest.mark.parametrize("clk, baud, word", [
    (0, 1, "clk_hz must be positive, not 0"),
    (25_000_000, -5, "baud must be positive, not -5"),
    (25_000_000, 7_000_000, "baud 7000000 is higher than clk_hz/4"),
    (25_000_000, 3.0, "baud must be an integer, not 3.0"),
    (True, 1, "clk_hz must be an integer"),
])
@pytest.mark.timeout(60)
def test_bad_rates_are_one_line_errors(clk, baud, word):
    for make in (check_rate, bit_period, UARTTx, UARTRx, UART):
        with pytest.raises(ValueError, match="^" + word.replace(".", r"\.")) as e:
            make(clk, baud)
        assert "\n" not in str(e.value)
    check_rate(12, 3)                                   # exactly clk/4 is allowed


@pytest.mark.timeout(60)
def test_helpers_refuse_bad_bit_indices():
    with pytest.raises(ValueError, match="bit index"):
        tx_edge(*DEFAULT, 11)
    with pytest.raises(ValueError, match="bit index"):
        rx_sample(*DEFAULT, 10)
    with pytest.raises(ValueError, match="byte"):
        frame_bits(256)


# ---- transmitter ----

@pytest.mark.parametrize("rate", RATES, ids=lambda r: f"{r[0]}/{r[1]}")
@pytest.mark.timeout(60)
def test_tx_exact_waveform_back_to_back(rate):
    """Bytes offered all the time: each frame starts right at the previous one's frame_cycles, every bit
    on its tx_edge cycle, busy exactly during frames; a host's decoder reads the bytes back."""
    data = rand_bytes(rate[0] ^ 1, count_for(rate))
    cycles = 3 + len(data) * frame_cycles(*rate) + 10
    got = run_tx(*rate, data, cycles)
    assert len(got["taken"]) == len(data)
    assert [b - a for a, b in zip(got["taken"], got["taken"][1:])] == [frame_cycles(*rate)] * (len(data) - 1)
    tx, busy = expected_tx(*rate, data, got["taken"], cycles)
    assert got["tx"] == tx
    assert got["busy"] == busy
    assert decode_line(got["tx"], bit_period(*rate)) == (data, 0)


@pytest.mark.timeout(60)
def test_tx_gaps_and_stable_payload():
    """Bytes offered at random times: a byte taken while idle starts one cycle later; the line is exact."""
    rng = random.Random(7)
    data = rand_bytes(8, 60)
    offer = [rng.random() < 0.03 for _ in range(200_000)]
    cycles = 60 * 150
    got = run_tx(*DEFAULT, data, cycles, valid=lambda c: offer[c])
    n = len(got["taken"])
    assert n > 30
    tx, busy = expected_tx(*DEFAULT, data[:n], got["taken"], cycles)
    assert got["tx"] == tx and got["busy"] == busy
    assert decode_line(got["tx"], bit_period(*DEFAULT))[0] == data[:n]
    assert any(b - a > frame_cycles(*DEFAULT) for a, b in zip(got["taken"], got["taken"][1:]))


# ---- receiver ----

@pytest.mark.parametrize("rate", RATES, ids=lambda r: f"{r[0]}/{r[1]}")
@pytest.mark.timeout(60)
def test_rx_random_bytes_back_to_back(rate):
    data = rand_bytes(rate[1], count_for(rate))
    got = run_rx(*rate, line_levels([frame_bits(b) for b in data], bit_period(*rate), lead=3))
    assert got["bytes"] == data
    assert got["framing_error"] == got["break_"] == got["overrun"] == []


@pytest.mark.parametrize("factor", [Fraction(102, 100), Fraction(98, 100)], ids=["+2%", "-2%"])
@pytest.mark.timeout(60)
def test_rx_tolerates_two_percent(factor):
    """The sender's bit period off by 2% either way (back to back and with random idle gaps)."""
    data = rand_bytes(int(factor * 100), 150)
    rng = random.Random(3)
    gaps = [0 if j < 75 else rng.choice([0, 0, 1, 2.5]) for j in range(len(data))]
    levels = line_levels([frame_bits(b) for b in data], bit_period(*DEFAULT) * factor,
                         gaps=[Fraction(g) for g in gaps], lead=Fraction(17, 7))
    got = run_rx(*DEFAULT, levels)
    assert got["bytes"] == data
    assert got["framing_error"] == []


def pinpoint_line(data, offset):
    """A line on which each bit of a frame is right only in the cycle rx_sample(k) + offset after the
    pin fell (the start bit low from the fall through its sample), wrong in every other cycle. Returns
    (levels, the cycle of each frame's fall)."""
    levels, falls = [1] * 7, []
    for byte in data:
        falls.append(len(levels))
        bits = frame_bits(byte)
        frame = [0] * (rx_sample(*DEFAULT, 0) + offset + 1)
        for k in range(1, 10):
            at = rx_sample(*DEFAULT, k) + offset
            frame += [1 - bits[k]] * (at - len(frame)) + [bits[k]]
        frame += [1] * 3                # back high (the stop bit was 1 in its sample cycle only)
        levels += frame
    return levels + [1] * 20, falls


@pytest.mark.timeout(60)
def test_rx_samples_at_the_documented_cycles():
    """The receiver samples the pin rx_sample(k) cycles after the pin fell (the synchronizer delays the
    detection and the samples alike) and nowhere else: a line right only in those cycles decodes, the
    same line one cycle late or early does not. A byte is offered from SYNC_STAGES + rx_sample(9) + 1
    cycles after the fall."""
    data = rand_bytes(5, 20)
    levels, falls = pinpoint_line(data, 0)
    got = run_rx(*DEFAULT, levels)
    assert got["bytes"] == data
    assert got["taken_at"] == [f + SYNC_STAGES + rx_sample(*DEFAULT, 9) + 1 for f in falls]
    for offset in (1, -1):
        assert run_rx(*DEFAULT, pinpoint_line(data, offset)[0])["bytes"] != data


@pytest.mark.timeout(60)
def test_rx_framing_errors_drop_the_byte():
    """Frames with a low stop bit (data never all zero): no byte, one framing_error each, no break, and
    the good bytes around them are received."""
    rng = random.Random(11)
    frames, want, bad = [], [], 0
    for j in range(60):
        byte = rng.randrange(1, 256)
        if j % 4 == 1:
            frames.append(frame_bits(byte, stop=0))
            bad += 1
        else:
            frames.append(frame_bits(byte))
            want.append(byte)
    # after a bad frame the line goes high for one bit before the next start bit
    gaps = [Fraction(1) if f[9] == 0 else Fraction(0) for f in frames]
    got = run_rx(*DEFAULT, line_levels(frames, bit_period(*DEFAULT), gaps=gaps))
    assert got["bytes"] == want
    assert len(got["framing_error"]) == bad
    assert got["break_"] == [] and got["overrun"] == []


@pytest.mark.timeout(60)
def test_rx_break_then_normal_reception():
    """The line held low for three frame times: no byte, one break (and its framing error); the receiver
    waits for the line to go high, then receives normally."""
    p = bit_period(*DEFAULT)
    before, after = rand_bytes(21, 10), rand_bytes(22, 30)
    levels = line_levels([frame_bits(b) for b in before], p, tail=0)
    levels += [1] * 3 + [0] * int(30 * p) + [1] * int(2 * p)
    levels += line_levels([frame_bits(b) for b in after], p, lead=0)
    got = run_rx(*DEFAULT, levels)
    assert got["bytes"] == before + after
    assert len(got["break_"]) == 1 and got["framing_error"] == got["break_"]


@pytest.mark.timeout(60)
def test_rx_ignores_glitches():
    """Lows shorter than half a bit (1 to 3 cycles at 8.33 a bit) between frames are no start bit."""
    p = bit_period(*DEFAULT)
    data = rand_bytes(31, 20)
    levels = []
    for j, byte in enumerate(data):
        levels += [1] * 12 + [0] * (1 + j % 3) + [1] * 12
        levels += line_levels([frame_bits(byte)], p, lead=0, tail=2)
    got = run_rx(*DEFAULT, levels)
    assert got["bytes"] == data and got["framing_error"] == []


@pytest.mark.timeout(60)
def test_rx_handshake_overrun_keeps_the_old_byte():
    """A consumer that is not ready: the first byte waits (valid and payload held, the design's
    rx_stream_stable Assert checks every cycle), each byte completing meanwhile pulses overrun and is
    dropped; a consumer that takes a byte at least once a frame loses nothing."""
    p = bit_period(*DEFAULT)
    data = rand_bytes(41, 100)
    levels = line_levels([frame_bits(b) for b in data], p)
    frame = int(10 * p)
    stall_end = 3 + 5 * frame                     # not ready during the first five frames
    rng = random.Random(42)
    ready_at = [0 if c < stall_end else int(rng.random() < 0.05) for c in range(len(levels))]
    # at least one ready cycle in every stretch of 40 (well under a frame of 83 cycles)
    for c in range(stall_end, len(levels), 40):
        ready_at[c] = 1
    got = run_rx(*DEFAULT, levels, ready=lambda c: ready_at[c])
    # bytes 1..3 completed while byte 0 waited (byte 4 completes after the stall)
    assert got["bytes"][0] == data[0]
    assert len(got["overrun"]) == 3
    assert got["bytes"] == [data[0]] + data[4:]


# ---- both ----

@pytest.mark.timeout(60)
def test_loopback_through_the_wrapper():
    """UART's tx wired to its rx: what goes into `i` comes out of `o`, frames back to back."""
    data = rand_bytes(51, 150)
    uart = UART(*DEFAULT)
    top = Module()
    top.submodules.uart = uart
    top.d.comb += uart.rx.eq(uart.tx)
    got = []

    async def bench(ctx):
        n = 0
        ctx.set(uart.o.ready, 1)
        for _ in range(len(data) * frame_cycles(*DEFAULT) + 200):
            ctx.set(uart.i.valid, n < len(data))
            ctx.set(uart.i.payload, data[min(n, len(data) - 1)])
            if n < len(data) and ctx.get(uart.i.ready):
                n += 1
            if ctx.get(uart.o.valid):
                got.append(ctx.get(uart.o.payload))
            assert not ctx.get(uart.framing_error) and not ctx.get(uart.overrun)
            await ctx.tick()

    run(top, bench)
    assert got == data
