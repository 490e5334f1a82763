"""A UART (8N1) for the host link (issue 20): `UARTTx`, `UARTRx` and the two together as `UART`.

A frame is ten bits on the line, each one bit period long: the start bit (0), the eight data bits LSB
first, the stop bit (1). The line idles high.

The bit period is exact: P = clk_hz / baud as a reduced fraction (`bit_period`). The default link, 3 Mbaud
on the ULX3S's 25 MHz clock, has P = 25/3 = 8.333 cycles, which no integer divisor hits within 2% (8
cycles is +4.2%), so both directions count cycles with a fractional remainder (`_Pacer`, Bresenham-like):
every event that should fall at a fractional time x falls in cycle floor(x), and the error never adds
up along a frame. The times, in whole cycles, are the pure-Python helpers below, which a line model or
a host-side simulator can use to drive or decode the line bit by bit:

- `tx_edge(clk_hz, baud, k)` = floor(k * clk_hz / baud): the transmitter drives bit k of a frame (k = 0
  the start bit, 1..8 the data bits LSB first, 9 the stop bit) from this cycle of the frame, until
  ``tx_edge(k + 1) - 1``. Cycle 0 of a frame is the cycle after the one in which the byte was taken from
  the input stream (``i.valid & i.ready``). `frame_cycles` = ``tx_edge(10)``: a byte taken in the last
  cycle of the stop bit (``i.ready`` is high there) starts its start bit right at ``tx_edge(10)``, back to
  back; a later byte starts one cycle after it is taken. Each frame starts its count afresh: frames are
  ``frame_cycles`` long, not ``10 * P``, at most one cycle short (a receiver resynchronizes on every
  start bit).
- `rx_sample(clk_hz, baud, k)` = floor((k + 1/2) * clk_hz / baud): the receiver samples bit k (same
  numbering) in this cycle counted from its detection cycle, the first cycle in which it sees the line
  low while hunting. It sees the pin through a `SYNC_STAGES`-flip-flop synchronizer: the pin's level in
  cycle c is what the receiver sees in cycle c + SYNC_STAGES. The delay cancels out: counted from the
  first cycle in which the *pin* is low, sample k reads the pin's level of cycle ``rx_sample(k)``, and a
  good byte is offered (``o.valid``) from cycle ``SYNC_STAGES + rx_sample(9) + 1`` on.

Receiver behaviour, in order of the samples: sample 0 must still be low (else the low was a glitch and the
receiver hunts again, nothing reported); samples 1..8 are the data; sample 9 is the stop bit. A high stop
bit delivers the byte into the output stream's one-byte buffer. A low one pulses `framing_error` and the
byte is dropped; if all ten samples were low (the line held low for a whole frame: a *break*), `break_`
pulses too, like a 16550's FE and BI bits. After either, the receiver waits until it sees the line high
before it hunts for a start bit again, so a long break is reported once.

The output buffer (`o`, an `amaranth.lib.stream` interface) holds one byte: ``o.valid`` is high from the
cycle after the stop sample until the consumer takes the byte (``o.valid & o.ready``). When a byte
completes while the buffer is still full and not being taken in that very cycle, `overrun` pulses and the
*new* byte is dropped: a stream may not change its payload while valid waits for ready, so the byte the
consumer was offered is the one it gets. A consumer that takes a byte at least once per frame time never
loses one.

The status outputs `framing_error`, `break_` and `overrun` are one-cycle pulses in the cycle of the stop
sample (combinational from registers); the buffer is loaded at the edge that ends that cycle.

Properties (`hdl.properties.History`, scope ``uart``; ``python -m sim.formal --only uart``):
`UART_PROPERTIES`.
"""
from fractions import Fraction
from math import gcd

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from hdl.properties import History

__all__ = ["UARTTx", "UARTRx", "UART", "bit_period", "tx_edge", "rx_sample", "frame_cycles", "frame_bits",
           "check_rate", "SYNC_STAGES", "FRAME_BITS", "DEFAULT_CLK_HZ", "DEFAULT_BAUD", "UART_PROPERTIES"]

DEFAULT_CLK_HZ = 25_000_000         # the ULX3S's oscillator
DEFAULT_BAUD = 3_000_000
SYNC_STAGES = 2                     # flip-flops between the rx pin and the receiver's logic
FRAME_BITS = 10                     # start, 8 data, stop

UART_PROPERTIES = {
    "tx_idle_high": "the tx line is high whenever the transmitter is not sending a frame (busy low)",
    "rx_no_byte_on_framing_error": "in the cycle after a framing error no new byte is in the output buffer "
                                   "(o.valid only if the byte offered before is still waiting, unchanged)",
    "rx_stream_stable": "a byte offered and not taken stays offered, unchanged (o.valid, o.payload)",
}


def check_rate(clk_hz, baud):
    """Refuse a clock or baud rate the UART cannot use (a one-line ValueError naming the value).

    Both must be positive integers, and a bit must last at least 4 cycles (baud <= clk_hz / 4): the
    receiver needs the half-bit to its first sample and room for its synchronizer.
    """
    for name, value in (("clk_hz", clk_hz), ("baud", baud)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, not {value!r}")
        if value <= 0:
            raise ValueError(f"{name} must be positive, not {value}")
    if 4 * baud > clk_hz:
        raise ValueError(f"baud {baud} is higher than clk_hz/4 = {clk_hz / 4:g} (a bit must last at least "
                         f"4 clock cycles)")


def bit_period(clk_hz, baud):
    """The exact bit period in clock cycles, clk_hz / baud as a reduced `fractions.Fraction`."""
    check_rate(clk_hz, baud)
    return Fraction(clk_hz, baud)


def tx_edge(clk_hz, baud, k):
    """The cycle of a frame from which the transmitter drives bit k: floor(k * clk_hz / baud).

    k = 0 is the start bit (cycle 0, the cycle after the byte was taken), 1..8 the data bits LSB first,
    9 the stop bit; k = 10 is `frame_cycles`, where a back-to-back frame's start bit begins.
    """
    check_rate(clk_hz, baud)
    if not 0 <= k <= FRAME_BITS:
        raise ValueError(f"bit index k must be in 0..{FRAME_BITS}, not {k}")
    return k * clk_hz // baud


def rx_sample(clk_hz, baud, k):
    """The cycle, counted from the receiver's detection cycle (0), in which it samples bit k:
    floor((2k + 1) * clk_hz / (2 * baud)). k = 0 the start bit (checked still low), 1..8 data, 9 stop."""
    check_rate(clk_hz, baud)
    if not 0 <= k < FRAME_BITS:
        raise ValueError(f"bit index k must be in 0..{FRAME_BITS - 1}, not {k}")
    return (2 * k + 1) * clk_hz // (2 * baud)


def frame_cycles(clk_hz, baud):
    """Cycles from a frame's start bit to the earliest start bit of the next: ``tx_edge(clk_hz, baud, 10)``."""
    return tx_edge(clk_hz, baud, FRAME_BITS)


def frame_bits(byte, stop=1):
    """The ten line levels of the frame of `byte`: [0, b0, ..., b7, stop] (`stop=0`: a framing error)."""
    if not 0 <= byte <= 255:
        raise ValueError(f"byte must be in 0..255, not {byte}")
    return [0] + [(byte >> i) & 1 for i in range(8)] + [stop]


class _Pacer:
    """A cycle counter with a fractional remainder: ticks at the cycles floor((k*A + B) / C).

    Armed in some cycle (its cycle 0), it ticks (``tick`` high, ``cnt == 0``) in each cycle
    t_k = floor((k*A + B) / C) with t_k >= 1, for k = 0, 1, ... (A >= C: at most one tick a cycle).
    Between ticks ``cnt`` counts down; at a tick the next interval is floor((r_k + A) / C) cycles, r_k =
    (k*A + B) mod C being the remainder kept in ``rem``. Only the first interval is computed in Python.
    """

    def __init__(self, a, b, c, name):
        g = gcd(gcd(a, b), c)
        self.a, self.b, self.c = a // g, b // g, c // g
        self.q, self.frac = divmod(self.a, self.c)
        assert self.q >= 1
        k = 0
        while (k * self.a + self.b) // self.c < 1:
            k += 1
        self.first = (k * self.a + self.b) // self.c        # the first tick, >= 1
        self.first_rem = (k * self.a + self.b) % self.c
        self.cnt = Signal(range(max(self.q, self.first) + 1), name=f"{name}_cnt")
        self.rem = Signal(range(max(self.c, 2)), name=f"{name}_rem")
        self.tick = Signal(name=f"{name}_tick")

    def elaborate(self, m):
        m.d.comb += self.tick.eq(self.cnt == 0)

    def arm(self, m):
        """At this edge (the end of cycle 0): the first tick falls in cycle `first`."""
        m.d.sync += [self.cnt.eq(self.first - 1), self.rem.eq(self.first_rem)]

    def step(self, m):
        """Count one cycle: down between ticks, the next interval at a tick."""
        with m.If(self.tick):
            wrap = self.rem >= self.c - self.frac               # r + frac >= C: one cycle more
            m.d.sync += [
                self.cnt.eq(Mux(wrap, self.q, self.q - 1)),
                self.rem.eq(Mux(wrap, self.rem - (self.c - self.frac), self.rem + self.frac)),
            ]
        with m.Else():
            m.d.sync += self.cnt.eq(self.cnt - 1)


class _RatedComponent(wiring.Component):
    """A component of a UART at `clk_hz` and `baud` (checked by `check_rate`), both kept as attributes."""

    def __init__(self, clk_hz=DEFAULT_CLK_HZ, baud=DEFAULT_BAUD):
        check_rate(clk_hz, baud)
        self.clk_hz, self.baud = clk_hz, baud
        super().__init__()


class UARTTx(_RatedComponent):
    """The transmitter: bytes from the stream `i` out on `tx` as 8N1 frames (module docstring for timing).

    Parameters
    ----------
    clk_hz, baud : int
        The clock's and the line's rates (`check_rate`); the bit period is exactly clk_hz / baud cycles.

    Ports
    -----
    i : In(stream.Signature(8))
        The bytes to send; one is taken when ``valid & ready``. ``ready`` is high while idle and in the
        last cycle of a stop bit (for back-to-back frames).
    tx : Out(1, init=1)
        The line, from a register (no glitches); high while idle.
    busy : Out(1)
        High from the first cycle of a frame's start bit to the last cycle of its stop bit.
    """

    i:    In(stream.Signature(8))
    tx:   Out(1, init=1)
    busy: Out(1)

    def elaborate(self, platform):
        m = Module()
        # Ticks at accept-relative cycles floor(k*clk/baud), k >= 1: the last cycle of bit k-1.
        pace = _Pacer(self.clk_hz, 0, self.baud, "tx")
        pace.elaborate(m)
        line = Signal(init=1, name="tx_line")
        shreg = Signal(9, name="tx_shreg")           # the bits still to drive, next first; the stop bit last
        left = Signal(range(FRAME_BITS), name="tx_left")    # how many of them
        m.d.comb += self.tx.eq(line)

        def begin():
            m.d.sync += [line.eq(0), shreg.eq(Cat(self.i.payload, 1)), left.eq(FRAME_BITS - 1)]
            pace.arm(m)

        with m.FSM(name="uart_tx_state") as fsm:
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(1)
                m.d.sync += line.eq(1)
                with m.If(self.i.valid):
                    begin()
                    m.next = "SEND"
            with m.State("SEND"):
                pace.step(m)
                with m.If(pace.tick & (left != 0)):
                    m.d.sync += [line.eq(shreg[0]), shreg.eq(shreg[1:]), left.eq(left - 1)]
                with m.If(pace.tick & (left == 0)):         # the stop bit's last cycle
                    m.d.comb += self.i.ready.eq(1)
                    with m.If(self.i.valid):
                        begin()
                    with m.Else():
                        m.d.sync += line.eq(1)
                        m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))

        h = History(m, "uart")
        h.check("tx_idle_high", self.busy | self.tx, UART_PROPERTIES["tx_idle_high"],
                covers={"a byte taken": self.i.valid & self.i.ready})
        return m


class UARTRx(_RatedComponent):
    """The receiver: 8N1 frames on `rx` into the one-byte stream buffer `o` (module docstring for timing).

    Parameters
    ----------
    clk_hz, baud : int
        As for `UARTTx`.

    Ports
    -----
    rx : In(1, init=1)
        The line (asynchronous: it goes through `SYNC_STAGES` flip-flops first).
    o : Out(stream.Signature(8))
        The received bytes, one buffered: ``valid`` from the cycle after the stop sample until taken.
    framing_error : Out(1)
        One-cycle pulse: the stop bit was sampled low; no byte is delivered.
    break_ : Out(1)
        One-cycle pulse (with `framing_error`): every sample of the frame, start to stop, was low.
    overrun : Out(1)
        One-cycle pulse: a good byte completed while the buffer was full and not being taken; the new
        byte is dropped, the buffered one stays.
    busy : Out(1)
        High while a frame is being received (from the detection cycle to the stop sample) and while the
        receiver waits for the line to go high after a framing error or break.
    """

    rx:            In(1, init=1)
    o:             Out(stream.Signature(8))
    framing_error: Out(1)
    break_:        Out(1)
    overrun:       Out(1)
    busy:          Out(1)

    def elaborate(self, platform):
        m = Module()
        line = Signal(init=1, name="rx_line")
        m.submodules.rx_sync = FFSynchronizer(self.rx, line, init=1, stages=SYNC_STAGES)
        # Ticks at detection-relative cycles floor((2k+1) * clk / (2 * baud)), k >= 0: the mid-bit samples.
        pace = _Pacer(2 * self.clk_hz, self.clk_hz, 2 * self.baud, "rx")
        pace.elaborate(m)
        shreg = Signal(8, name="rx_shreg")
        nbits = Signal(range(8), name="rx_nbits")
        stop_tick = Signal(name="rx_stop_tick")
        with m.FSM(name="uart_rx_state") as fsm:
            with m.State("IDLE"):
                with m.If(~line):
                    pace.arm(m)
                    m.next = "START"
            with m.State("START"):
                pace.step(m)
                with m.If(pace.tick):
                    m.d.sync += nbits.eq(0)
                    with m.If(line):                        # high again at mid-start: a glitch
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "DATA"
            with m.State("DATA"):
                pace.step(m)
                with m.If(pace.tick):
                    m.d.sync += [shreg.eq(Cat(shreg[1:], line)), nbits.eq(nbits + 1)]
                    with m.If(nbits == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                pace.step(m)
                m.d.comb += stop_tick.eq(pace.tick)
                with m.If(pace.tick):
                    with m.If(line):
                        m.next = "IDLE"
                    with m.Else():                          # framing error or break
                        m.next = "WAIT_HIGH"
            with m.State("WAIT_HIGH"):
                with m.If(line):
                    m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))

        good = stop_tick & line
        m.d.comb += [
            self.framing_error.eq(stop_tick & ~line),
            self.break_.eq(stop_tick & ~line & (shreg == 0)),
            self.overrun.eq(good & self.o.valid & ~self.o.ready),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(good & ~(self.o.valid & ~self.o.ready)):
            m.d.sync += [self.o.valid.eq(1), self.o.payload.eq(shreg)]

        h = History(m, "uart")
        p_fe = h.past(self.framing_error, "rx_fe")
        p_valid = h.past(self.o.valid, "rx_valid")
        p_ready = h.past(self.o.ready, "rx_ready")
        p_payload = h.past(self.o.payload, "rx_payload")
        waiting = h.valid & p_valid & ~p_ready
        same = self.o.valid & (self.o.payload == p_payload)
        h.check("rx_no_byte_on_framing_error", ~(h.valid & p_fe & self.o.valid) | (waiting & same),
                UART_PROPERTIES["rx_no_byte_on_framing_error"], covers={"a framing error": p_fe})
        h.check("rx_stream_stable", ~waiting | same, UART_PROPERTIES["rx_stream_stable"],
                covers={"a byte waits unread": waiting})
        return m


class UART(_RatedComponent):
    """`UARTTx` and `UARTRx` side by side, for a board's top: pins `rx`/`tx`, streams `i` (to send) and
    `o` (received), and the receiver's status pulses.

    Ports
    -----
    rx : In(1, init=1)
    tx : Out(1, init=1)
    i : In(stream.Signature(8))
    o : Out(stream.Signature(8))
    tx_busy, rx_busy, framing_error, break_, overrun : Out(1)
        As `UARTTx.busy`, `UARTRx.busy` and the receiver's pulses.
    """

    rx:            In(1, init=1)
    tx:            Out(1, init=1)
    i:             In(stream.Signature(8))
    o:             Out(stream.Signature(8))
    tx_busy:       Out(1)
    rx_busy:       Out(1)
    framing_error: Out(1)
    break_:        Out(1)
    overrun:       Out(1)

    def elaborate(self, platform):
        m = Module()
        m.submodules.utx = utx = UARTTx(self.clk_hz, self.baud)
        m.submodules.urx = urx = UARTRx(self.clk_hz, self.baud)
        wiring.connect(m, wiring.flipped(self.i), utx.i)
        wiring.connect(m, urx.o, wiring.flipped(self.o))
        m.d.comb += [
            self.tx.eq(utx.tx),
            self.tx_busy.eq(utx.busy),
            urx.rx.eq(self.rx),
            self.rx_busy.eq(urx.busy),
            self.framing_error.eq(urx.framing_error),
            self.break_.eq(urx.break_),
            self.overrun.eq(urx.overrun),
        ]
        return m
