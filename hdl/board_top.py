"""BoardTop: the GA-2 board served over a serial link (issue 20): UART, protocol engine, chip, memories.

The host talks `hdl.hostlink`'s protocol over the UART (`hdl.uart`, 8N1); the engine (`hdl.link_engine`)
parses the frames and, through this top, writes and reads the three memories and runs the chip:

- the program memory, ``config.rom_words`` x 128 bits, writable by the link; the chip fetches through a
  combinational read port at ``imem_addr`` (as `hdl.fpga_top.DecodeStepTop`'s ROM), the link reads
  through a port of its own;
- the external memory, ``config.ext_words`` x 32 bits (`BoardExtMemory`): a RUN sets the size EXT the
  chip sees (reads at or past it answer 0xDEADBEEF, writes there are dropped) and the read latency LAT,
  and the chip's requests are answered exactly as `hdl.extmem.ExtMemory(depth=EXT, lat=LAT)` would;
- the chip's scratchpad, through the chip's ``host`` port (`GA2(host_port=True)`) while it is stopped.

A RUN resets the chip for a cycle (the reference machine starts every run from reset: the MM unit's
requantizer registers among them), pulses ``start`` and counts the cycles: when the chip halts, or when
``max_cycles`` have passed without a halt (the watchdog: the chip is then held in reset until every read
in flight has come back, `BoardExtMemory.max_lat` cycles), the engine takes the counters and the error
state of that cycle and answers. RESET resets the chip for a cycle. The memories keep their words.

Clock domains: `BoardTop` (or a `BoardCore` simulated alone) defines ``sync``, and `BoardCore` a local
``chip`` domain for the chip whose clock is the very same signal and whose reset is ``sync``'s reset or the top's chip reset. So the chip's
own properties (its `hdl.properties.History` registers watch their domain's reset) see every chip reset,
and no clock is derived through logic (Amaranth's simulator would race a derived clock by a delta
cycle). With a platform, `BoardTop` drives ``sync``'s clock from the board's oscillator (``clk25``, no
PLL) and leaves its reset low: the registers start from their initial values at configuration, and every
block is idle there (the line high, the chip in IDLE).

For a Verilog simulation of the whole board, `board_verilog` gives the top with the ports ``clk``, ``rst``
(active high, synchronous), ``rx`` (input, idle high), ``tx`` (output, idle high) and ``leds`` (8
outputs, bit `LED_HALTED`, `LED_LINK`, `LED_LINE_ERROR`, `LED_RUNNING`; the others 0). Drive ``rx`` with
8N1 frames at ``clk_hz / baud`` cycles a bit (`hdl.uart.rx_sample`, `tx_edge` give the exact cycles).
"""

from amaranth.hdl import Cat, ClockDomain, DomainRenamer, Module, Mux, Signal
from amaranth.lib import io, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out, connect, flipped

from .chip import GA2
from .config import BOOK
from .extmem import POISON, ext_signature
from .hostlink import Space
from .link_engine import READ_LATENCY, LinkEngine, board_max_lat
from .uart import UART, check_rate

__all__ = ["BoardTop", "BoardCore", "BoardExtMemory", "board_verilog", "LED_HALTED", "LED_LINK",
           "LED_LINE_ERROR", "LED_RUNNING", "DEFAULT_CLK_HZ", "DEFAULT_BAUD"]

DEFAULT_CLK_HZ = 25_000_000     # the ULX3S's oscillator
DEFAULT_BAUD = 3_000_000
LED_HALTED = 0                  # the chip has halted
LED_LINK = 1                    # a frame is being taken or answered (stretched to ~0.1 s)
LED_LINE_ERROR = 2              # the UART saw a framing error or an overrun (stretched to ~0.1 s)
LED_RUNNING = 3                 # a RUN waits for the chip


class BoardExtMemory(wiring.Component):
    """The board's external memory: `capacity` words of 32 bits; EXT and LAT are inputs, set per run.

    The chip's side behaves as `hdl.extmem.ExtMemory(depth=ext_words, lat=lat)`: a read requested in
    cycle c is answered in cycle c + lat with the word as it was in cycle c (`POISON` at or past
    ``ext_words``), and a write below ``ext_words`` lands at its edge (others are dropped). Stage 0 is
    the block RAM's read register; the next stages are a ring of `max_lat` (rounded up to a power of two)
    entries in a second memory, read ``lat - 1`` entries behind the one written (a register for LAT 2).
    The ring is written every cycle and not reset: a new run must not start until `max_lat` cycles after
    the last request of the previous one was answered (the board top holds the chip in reset that long
    after a watchdog stop; after a halt nothing is in flight).

    Parameters
    ----------
    capacity : int
        Words of storage (``config.ext_words``), 1..65536.
    max_lat : int
        The largest LAT the ring serves, at least 1.

    Ports
    -----
    req_valid, req_addr, resp_valid, resp_data, wr_valid, wr_addr, wr_data
        The chip's, as on `hdl.extmem.ExtMemory`.
    ext_words : In(range(capacity + 1))
        EXT, held for the run.
    lat : In(range(max_lat + 1))
        LAT, 1..max_lat, held for the run.
    landed : Out(1)
        The chip's write of this cycle lands (``wr_valid`` and ``wr_addr < ext_words``).
    link_sel : In(1)
        The link owns the read port's address (the chip must be stopped).
    link_addr, link_we, link_wdata : In(16), In(1), In(32)
        The link's word address (below `capacity`) and write (the chip must be stopped).
    link_rdata : Out(32)
        The word at the previous cycle's ``link_addr`` (while ``link_sel``).

    Attributes
    ----------
    memory : amaranth.lib.memory.Memory
        The storage.
    """

    def __init__(self, capacity, max_lat, port=1):
        if not isinstance(capacity, int) or not 1 <= capacity <= 1 << 16:
            raise ValueError(f"BoardExtMemory capacity must be an integer in 1..65536, not {capacity!r}")
        if not isinstance(max_lat, int) or max_lat < 1:
            raise ValueError(f"BoardExtMemory max_lat must be an integer >= 1, not {max_lat!r}")
        if port not in (1, 2, 4) or capacity % port:
            raise ValueError(f"BoardExtMemory port must be 1, 2 or 4 and divide the capacity {capacity}, "
                             f"not {port!r}")
        self.capacity, self.max_lat, self.port = capacity, max_lat, port
        self.ring_depth = 1 << max(1, (max_lat - 1).bit_length())
        if port == 1:
            self.memory = Memory(shape=32, depth=capacity, init=[])
            self.banks = [self.memory]
        else:
            # docs/ext-port.md: `port` banks interleaved by address, so the words of a group, any
            # alignment, are in distinct banks
            self.memory = None
            self.banks = [Memory(shape=32, depth=capacity // port, init=[]) for _ in range(port)]
        self.ring = Memory(shape=32 * port + 1, depth=self.ring_depth, init=[])
        super().__init__(ext_signature(port, {
            "ext_words":  In(range(capacity + 1)),
            "lat":        In(range(max_lat + 1)),
            "landed":     Out(port),
            "link_sel":   In(1),
            "link_addr":  In(16),
            "link_we":    In(1),
            "link_wdata": In(32),
            "link_rdata": Out(32),
        }))

    def elaborate(self, platform):
        m = Module()
        if self.port > 1:
            return self._elaborate_banks(m)
        m.submodules.memory = mem = self.memory
        m.submodules.ring = self.ring
        aw = max(1, (self.capacity - 1).bit_length())

        rd = mem.read_port(transparent_for=())
        m.d.comb += [rd.addr.eq(Mux(self.link_sel, self.link_addr, self.req_addr)[:aw]),
                     self.link_rdata.eq(rd.data)]
        valid0, oob0 = Signal(name="valid0"), Signal(name="oob0")
        m.d.sync += [valid0.eq(self.req_valid), oob0.eq(self.req_addr >= self.ext_words)]
        stage0 = Signal(33)
        m.d.comb += stage0.eq(Cat(Mux(oob0, POISON, rd.data), valid0))

        out = self._delay(m, stage0)
        m.d.comb += [self.resp_data.eq(out[:32]), self.resp_valid.eq(out[32])]

        wp = mem.write_port()
        m.d.comb += self.landed.eq(self.wr_valid & (self.wr_addr < self.ext_words))
        m.d.comb += [
            wp.en.eq(self.landed | self.link_we),
            wp.addr.eq(Mux(self.link_we, self.link_addr, self.wr_addr)[:aw]),
            wp.data.eq(Mux(self.link_we, self.link_wdata, self.wr_data)),
        ]
        return m

    def _delay(self, m, stage0):
        """Stages 1 .. lat-1 after `stage0` (valid on top): a register for LAT 2, the ring beyond; returns the
        stage of the run's LAT."""
        stage1 = Signal(len(stage0))
        m.d.sync += stage1.eq(stage0)
        rbits = (self.ring_depth - 1).bit_length()
        wptr = Signal(rbits)
        m.d.sync += wptr.eq(wptr + 1)
        rw = self.ring.write_port()
        rr = self.ring.read_port(transparent_for=())
        m.d.comb += [rw.en.eq(1), rw.addr.eq(wptr), rw.data.eq(stage0),
                     rr.addr.eq((wptr - (self.lat - 2))[:rbits])]
        lat1, lat2 = Signal(), Signal()
        m.d.sync += [lat1.eq(self.lat == 1), lat2.eq(self.lat == 2)]
        out = Signal(len(stage0))
        m.d.comb += out.eq(Mux(lat1, stage0, Mux(lat2, stage1, rr.data)))
        return out

    def _elaborate_banks(self, m):
        """The memory of a chip with ``ext_port`` = P > 1 (docs/ext-port.md): P banks, bank b holding the
        words a = b (mod P) at row a // P. A read asks for the P words from its address (the link's, while
        it owns the port, or the chip's), bank b serving the one of them it holds; lane k of the response is
        the word at the address + k, POISON at or past EXT. Write lane k lands at wr_addr + k below EXT; a
        link write goes to its word's bank."""
        P, lg = self.port, self.port.bit_length() - 1
        m.submodules.ring = self.ring
        rows = self.capacity // P
        rw_bits = max(1, (rows - 1).bit_length())
        base = Signal(16, name="rbase")
        m.d.comb += base.eq(Mux(self.link_sel, self.link_addr, self.req_addr))
        sel = Signal(lg, name="rsel")           # the bank of lane 0, registered with the read
        m.d.sync += sel.eq(base[:lg])
        waddr_l = [(self.wr_addr + k)[:16] for k in range(P)]
        m.d.comb += self.landed.eq(Cat(self.wr_valid[k] & (waddr_l[k] < self.ext_words) for k in range(P)))
        words = []
        for b, bank in enumerate(self.banks):
            m.submodules[f"bank{b}"] = bank
            rd = bank.read_port(transparent_for=())
            rlane = Signal(lg, name=f"rlane{b}")
            raddr = Signal(16, name=f"raddr{b}")
            m.d.comb += [rlane.eq(b - base[:lg]), raddr.eq(base + rlane), rd.addr.eq(raddr[lg:lg + rw_bits])]
            words.append(rd.data)
            wlane = Signal(lg, name=f"wlane{b}")
            waddr = Signal(16, name=f"waddr{b}")
            wp = bank.write_port()
            m.d.comb += [wlane.eq(b - self.wr_addr[:lg]), waddr.eq(self.wr_addr + wlane)]
            link_here = self.link_we & (self.link_addr[:lg] == b)
            m.d.comb += [
                wp.en.eq(link_here | (~self.link_we & self.landed.bit_select(wlane, 1))),
                wp.addr.eq(Mux(self.link_we, self.link_addr[lg:lg + rw_bits], waddr[lg:lg + rw_bits])),
                wp.data.eq(Mux(self.link_we, self.link_wdata, self.wr_data.word_select(wlane, 32))),
            ]
        banked = Cat(*words)
        m.d.comb += self.link_rdata.eq(banked.word_select(sel, 32))
        valid0 = Signal(name="valid0")
        oob0 = Signal(P, name="oob0")
        m.d.sync += [valid0.eq(self.req_valid),
                     oob0.eq(Cat((self.req_addr + k)[:16] >= self.ext_words for k in range(P)))]
        lanes = []
        for k in range(P):
            bank = Signal(lg, name=f"rbank{k}")
            m.d.comb += bank.eq(sel + k)
            lanes.append(Mux(oob0[k], POISON, banked.word_select(bank, 32)))
        stage0 = Signal(32 * P + 1, name="stage0")
        m.d.comb += stage0.eq(Cat(*lanes, valid0))
        out = self._delay(m, stage0)
        m.d.comb += [self.resp_data.eq(out[:-1]), self.resp_valid.eq(out[-1])]
        return m


class BoardCore(wiring.Component):
    """The board without its UART: the engine's byte streams, the chip and the memories (module docstring).

    Parameters
    ----------
    config : hdl.config.ChipConfig
        The chip (its ``ext_words`` is the external memory's capacity; a gather chip is built for
        ``config.lat`` and RUN accepts only that LAT).
    clk_hz, baud : int
        For HELLO and the engine's gap timer.
    sync : amaranth.hdl.ClockDomain, optional
        The ``sync`` domain, when a parent defines it (keyword only; `BoardTop` does); by default this
        component defines its own, as the top of a simulation.

    Ports
    -----
    i : In(stream.Signature(8))
        Request bytes.
    o : Out(stream.Signature(8))
        Answer bytes.
    halted, running, busy : Out(1)
        The chip's ``halted``; a RUN in progress; the engine is not hunting (a frame in or out).

    Attributes
    ----------
    engine : LinkEngine
    chip : GA2
        Built with ``host_port=True``, in the ``chip`` domain.
    program : amaranth.lib.memory.Memory
        ``config.rom_words`` x 128.
    ext : BoardExtMemory
    cd_sync, cd_chip : amaranth.hdl.ClockDomain
        The domains (module docstring): ``cd_chip.clk is cd_sync.clk``; this component defines
        ``cd_chip``, and ``cd_sync`` unless `sync` was given.
    """

    i:       In(stream.Signature(8))
    o:       Out(stream.Signature(8))
    halted:  Out(1)
    running: Out(1)
    busy:    Out(1)

    def __init__(self, config=BOOK, clk_hz=DEFAULT_CLK_HZ, baud=DEFAULT_BAUD, *, sync=None):
        self.config = config
        self.engine = LinkEngine(config, clk_hz, baud)
        self.chip = GA2(config=config, host_port=True)
        self.program = Memory(shape=128, depth=config.rom_words, init=[])
        self.ext = BoardExtMemory(config.ext_words, board_max_lat(config), config.ext_port)
        self._own_sync = sync is None
        self.cd_sync = ClockDomain("sync") if sync is None else sync
        self.cd_chip = ClockDomain("chip", local=True)
        self.cd_chip.clk = self.cd_sync.clk              # one clock signal: no delta-cycle skew
        super().__init__()

    @staticmethod
    def _lane_span(m, lanes, base, we, waddr, waddr_last, name):
        """Drive a dirty map's marks from write `lanes` (bit i: the word at `base` + i is written): `we` when
        any is, `waddr` the lowest's address and `waddr_last` the highest's, modulo the address width (the
        lanes span fewer words than a dirty block, so the two blocks hold every word written)."""
        n = len(lanes)
        low = Signal(range(n), name=f"{name}_lane_low")
        high = Signal(range(n), name=f"{name}_lane_high")
        for i in reversed(range(n)):        # the last If to hold wins: the lowest
            with m.If(lanes[i]):
                m.d.comb += low.eq(i)
        for i in range(n):                  # ... the highest
            with m.If(lanes[i]):
                m.d.comb += high.eq(i)
        m.d.comb += [we.eq(lanes.any()), waddr.eq(base + low), waddr_last.eq(base + high)]

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        eng, chip, ext = self.engine, self.chip, self.ext
        if self._own_sync:
            m.domains.sync = self.cd_sync
        m.domains.chip = self.cd_chip
        m.submodules.engine = eng
        chip_rst = Signal()
        m.d.comb += self.cd_chip.rst.eq(self.cd_sync.rst | chip_rst)
        m.submodules.chip = DomainRenamer("chip")(chip)
        m.submodules.ext = ext
        m.submodules.program = prog = self.program
        connect(m, flipped(self.i), eng.i)
        connect(m, eng.o, flipped(self.o))
        bus, run = eng.bus, eng.run

        # ---- program memory: the chip's fetch (combinational), the link's read and write ----
        rom_bits = max(1, (cfg.rom_words - 1).bit_length())
        fetch = prog.read_port(domain="comb")
        m.d.comb += [fetch.addr.eq(chip.imem_addr[:rom_bits]), chip.imem_data.eq(fetch.data)]
        pw = prog.write_port()
        pr = prog.read_port(transparent_for=())
        m.d.comb += [pw.en.eq(bus.we & (bus.space == Space.PROGRAM)), pw.addr.eq(bus.addr[:rom_bits]),
                     pw.data.eq(bus.wdata), pr.addr.eq(bus.addr[:rom_bits])]

        # ---- external memory: the chip's ports, the run's EXT and LAT, the link's word ----
        active = Signal()           # the chip is being reset, started or run
        live = Signal()             # the run goes on: the chip takes the read responses
        m.d.comb += [
            ext.req_valid.eq(chip.req_valid), ext.req_addr.eq(chip.req_addr),
            # a response after a watchdog stop is not the chip's: an idle LD engine would write it
            chip.resp_valid.eq(ext.resp_valid & live), chip.resp_data.eq(ext.resp_data),
            ext.wr_valid.eq(chip.wr_valid), ext.wr_addr.eq(chip.wr_addr), ext.wr_data.eq(chip.wr_data),
            ext.ext_words.eq(run.ext_words), ext.lat.eq(run.lat),
            ext.link_sel.eq(~active), ext.link_addr.eq(bus.addr),
            ext.link_we.eq(bus.we & (bus.space == Space.EXT)), ext.link_wdata.eq(bus.wdata[:32]),
        ]

        # ---- scratchpad: the chip's host port ----
        m.d.comb += [chip.host.raddr.eq(bus.addr), chip.host.we.eq(bus.we & (bus.space == Space.SPAD)),
                     chip.host.waddr.eq(bus.addr), chip.host.wdata.eq(bus.wdata[:32])]

        # ---- the link's reads: READ_LATENCY = 2 (memory register, then this one) ----
        assert READ_LATENCY == 2
        space_d = Signal.like(bus.space)
        rdata = Signal.like(bus.rdata)
        m.d.sync += space_d.eq(bus.space)
        with m.Switch(space_d):
            with m.Case(Space.PROGRAM):
                m.d.sync += rdata.eq(pr.data)
            with m.Case(Space.EXT):
                m.d.sync += rdata.eq(ext.link_rdata)
            with m.Case(Space.SPAD):
                m.d.sync += rdata.eq(chip.host.rdata)
        m.d.comb += bus.rdata.eq(rdata)

        # ---- the dirty maps watch the chip's writes only ----
        spad = chip.scratchpad.port
        if cfg.ext_port == 1:
            m.d.comb += [eng.ext_we.eq(ext.landed), eng.ext_waddr.eq(chip.wr_addr)]
        else:
            # the write lanes that land (docs/ext-port.md): the lowest's and the highest's blocks, as the
            # scratchpad's lanes below (a lane past EXT, or wrapped below it, may not land)
            self._lane_span(m, ext.landed, chip.wr_addr, eng.ext_we, eng.ext_waddr, eng.ext_waddr_last, "ext")
        if cfg.spad_lanes == 1:
            m.d.comb += [eng.spad_we.eq(spad.we & ~chip.host.we), eng.spad_waddr.eq(spad.waddr)]
        else:
            # the MM drain writes up to spad_lanes consecutive words a cycle, lane i at waddr + i
            # (docs/spad-lanes.md); the engine marks the blocks of the lowest and the highest lane
            # that write, which between them hold every word written (the lanes span < 16 words).
            # The host writes lane 0 only; the other lanes are MM's
            lanes = Cat(spad.we & ~chip.host.we, spad.we_x)
            self._lane_span(m, lanes, spad.waddr, eng.spad_we, eng.spad_waddr, eng.spad_waddr_last, "spad")

        # ---- run control: reset, start, run to HALT or to the cycle limit ----
        remaining = Signal.like(run.max_cycles)
        flush = Signal(range(ext.ring_depth + 2))
        pending = Signal()          # a start that came during FLUSH (never at a UART's pace): kept
        m.d.comb += [run.error_pc.eq(0), run.error_info.eq(0), run.error_kind.eq(0)]
        if cfg.generated:
            m.d.comb += [run.error_kind.eq(chip.error_kind.as_value()), run.error_pc.eq(chip.error_pc),
                         run.error_info.eq(chip.error_info)]
        m.d.comb += [run.counters[k].eq(c) for k, c in enumerate(
            (chip.cyc_total, chip.cyc_mm, chip.cyc_dma, chip.cyc_vec, chip.n_inst))]
        with m.FSM(name="board_run"):
            with m.State("IDLE"):
                m.d.sync += [chip_rst.eq(run.start | pending | run.reset), pending.eq(0)]
                with m.If(run.start | pending):
                    m.next = "RESET"
            with m.State("RESET"):              # chip_rst is high in this cycle
                m.d.comb += active.eq(1)
                m.d.sync += chip_rst.eq(0)
                m.next = "START"
            with m.State("START"):
                m.d.comb += [active.eq(1), chip.start.eq(1)]
                m.d.sync += [remaining.eq(run.max_cycles), live.eq(1)]
                m.next = "RUN"
            with m.State("RUN"):                # cycle k of the run: remaining = max_cycles - k + 1
                m.d.comb += active.eq(1)
                with m.If(chip.halted):
                    m.d.comb += [run.done.eq(1), run.halted.eq(1)]
                    m.d.sync += live.eq(0)
                    m.next = "IDLE"
                with m.Elif(remaining == 0):
                    # the watchdog: cyc_total = max_cycles and no HALT yet; hold the chip in reset until
                    # the reads in flight have come back (an idle LD engine would write them)
                    m.d.comb += run.done.eq(1)
                    m.d.sync += [chip_rst.eq(1), live.eq(0), flush.eq(ext.ring_depth + 1)]
                    m.next = "FLUSH"
                with m.Else():
                    m.d.sync += remaining.eq(remaining - 1)
            with m.State("FLUSH"):
                m.d.comb += active.eq(1)
                m.d.sync += flush.eq(flush - 1)
                with m.If(run.start):
                    m.d.sync += pending.eq(1)
                with m.If(flush == 0):
                    m.d.sync += chip_rst.eq(0)
                    m.next = "IDLE"

        m.d.comb += [self.halted.eq(chip.halted), self.running.eq(eng.running), self.busy.eq(eng.busy)]
        return m


class BoardTop(wiring.Component):
    """The board: `hdl.uart.UART` + `BoardCore` (module docstring), pins ``rx``/``tx`` and ``leds``.

    Parameters
    ----------
    config : hdl.config.ChipConfig
        The chip on the board (the book's by default).
    clk_hz : int
        The clock (25 MHz: the ULX3S's oscillator, no PLL).
    baud : int
        The line's rate (3 Mbaud by default; at most clk_hz / 4).

    Ports
    -----
    rx : In(1, init=1)
        The line from the host (idle high).
    tx : Out(1, init=1)
        The line to the host (idle high).
    leds : Out(8)
        `LED_HALTED`, `LED_LINK`, `LED_LINE_ERROR`, `LED_RUNNING`; the others 0.

    With a platform, ``rx``/``tx`` are the ULX3S's FTDI UART pins (resource ``uart`` 0: ``rx`` an input to
    the FPGA, ``tx`` an output) and ``leds`` its LEDs 0..7; the ports themselves are then unused.

    Attributes
    ----------
    core : BoardCore
    uart : hdl.uart.UART
    cd_sync : amaranth.hdl.ClockDomain
        The ``sync`` domain this top defines (its ``clk`` and ``rst`` are `board_verilog`'s ports).
    """

    rx:   In(1, init=1)
    tx:   Out(1, init=1)
    leds: Out(8)

    def __init__(self, config=BOOK, clk_hz=DEFAULT_CLK_HZ, baud=DEFAULT_BAUD):
        check_rate(clk_hz, baud)
        self.config, self.clk_hz, self.baud = config, clk_hz, baud
        self.cd_sync = ClockDomain("sync")
        self.core = BoardCore(config, clk_hz, baud, sync=self.cd_sync)
        self.uart = UART(clk_hz, baud)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self.cd_sync
        m.submodules.core = core = self.core
        m.submodules.uart = uart = self.uart
        connect(m, uart.o, core.i)
        connect(m, core.o, uart.i)
        if platform is None:
            m.d.comb += [uart.rx.eq(self.rx), self.tx.eq(uart.tx)]
        else:
            clk = platform.request(platform.default_clk, dir="-")
            m.submodules.clk_buf = clk_buf = io.Buffer("i", clk)
            m.d.comb += self.cd_sync.clk.eq(clk_buf.i)
            # the FTDI's RTS and DTR (the ULX3S resource has them) are not used by the link
            pins = platform.request("uart", 0, dir={"rx": "-", "tx": "-", "rts": "-", "dtr": "-"})
            m.submodules.rx_buf = rx_buf = io.Buffer("i", pins.rx)
            m.submodules.tx_buf = tx_buf = io.Buffer("o", pins.tx)
            m.d.comb += [uart.rx.eq(rx_buf.i), tx_buf.o.eq(uart.tx), self.tx.eq(uart.tx)]

        # LEDs: the link's and the line's events stretched to ~0.1 s so that they can be seen
        stretch = max(1, self.clk_hz // 10)

        def stretched(event, name):
            count = Signal(range(stretch + 1), name=f"{name}_stretch")
            with m.If(event):
                m.d.sync += count.eq(stretch)
            with m.Elif(count != 0):
                m.d.sync += count.eq(count - 1)
            return event | (count != 0)

        leds = [0] * 8
        leds[LED_HALTED] = core.halted
        leds[LED_LINK] = stretched(core.busy, "link")
        leds[LED_LINE_ERROR] = stretched(uart.framing_error | uart.overrun, "line_error")
        leds[LED_RUNNING] = core.running
        m.d.comb += self.leds.eq(Cat(*leds))
        if platform is not None:
            for k in range(len(self.leds)):
                led = platform.request("led", k, dir="-")
                m.submodules[f"led{k}"] = buf = io.Buffer("o", led)
                m.d.comb += buf.o.eq(self.leds[k])
        return m


def board_verilog(config=BOOK, clk_hz=DEFAULT_CLK_HZ, baud=DEFAULT_BAUD, name="board_top") -> str:
    """The Verilog of `BoardTop` (no platform) as one file with top module `name`.

    Its ports: ``clk``, ``rst`` (synchronous, active high), ``rx`` (idle high), ``tx`` (idle high),
    ``leds[7:0]`` (module docstring). For a cycle-accurate board simulator (Verilator): reset for a cycle,
    then drive ``rx`` bit by bit at ``clk_hz / baud`` cycles a bit and decode ``tx`` likewise.
    """
    from amaranth.back import verilog
    top = BoardTop(config, clk_hz, baud)
    cd = top.cd_sync
    return verilog.convert(top, name=name, emit_src=False, ports=[cd.clk, cd.rst, top.rx, top.tx, top.leds])
