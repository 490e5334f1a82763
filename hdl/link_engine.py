"""LinkEngine: the host link's protocol (`hdl.hostlink`) in hardware, a byte at a time.

The engine sits between a byte stream from the host (a UART's receiver) and a byte stream back (its
transmitter). It hunts for `SYNC_REQUEST`, takes the request header, the payload whose length
`hostlink.request_payload_length` gives and the CRC-16, checks the CRC before anything is done, and
answers every frame it parsed with ACK or a NAK reason, exactly as `sim.board.model.BoardModel` does.
Everything the engine touches outside itself goes through two ports the board top serves:

- `bus` (`link_bus`): one word of one `Space` at a time, written in one cycle (``we``) or read with a
  fixed latency (``re``; `READ_LATENCY` cycles later ``rdata`` holds the word). The engine uses it only
  while the chip is stopped.
- `run` (`run_signature`): a ``start`` pulse with the RUN's arguments held on ``ext_words``, ``lat`` and
  ``max_cycles``; the top resets and starts the chip and, when it halts or the cycle limit stops it,
  pulses ``done`` with ``halted``, the error state and the counters valid in that cycle. ``reset`` is a
  pulse for the RESET command.

and it watches the chip's writes (`ext_we`/`ext_waddr`, `spad_we`/`spad_waddr`; the top passes the
chip's only): each marks its `DIRTY_BLOCK`-word block, a cycle later, in a one-bit memory per map
(cleared at the start of every RUN that executes; a retried RUN answers the same maps).

What the engine keeps, all registered:

- the request header in a shift register; the payload in a `Memory` of `MAX_PAYLOAD` bytes (a WRITE is
  copied into its space word by word only after its CRC matched), and the last `RUN_ARGS` bytes in a
  shift register;
- the CRC register, updated a byte at a time by an XOR network derived from `hostlink.crc16` itself (the
  update is linear in the register and the byte, so 24 calls of `crc16` give its matrix);
- (seq, cmd) of the last executed frame (a valid bit cleared by HELLO): a frame with a good CRC and the
  same pair is answered again without being executed (a WRITE is not written, a RUN not run: its
  stored result and maps are sent again, a RESET does not reset);
- the RUN's result: the fields of `RUN_RESULT` taken in the cycle of ``done`` (only their bits that can
  be non-zero are registers), sent by a byte select; kept for a retry;
- a gap counter: a frame that pauses for `FRAME_GAP_BYTES` byte times (ten bits at ``clk_hz / baud``
  cycles a bit, `gap_cycles`) is dropped without an answer and the engine hunts again.

Input flow: ``i.ready`` is high while the engine hunts, takes a frame, waits for a run or sends an
answer; in the last two the bytes are dropped (bytes sent while the chip runs are lost, as the protocol
says; so are bytes sent while an answer goes out: the protocol is one request, then its answer). In the
few internal cycles between (deciding, copying a WRITE into its space, clearing the dirty maps) ``ready``
is low and a UART's one-byte buffer holds what arrives. A request whose header alone shows a payload
longer than `MAX_PAYLOAD` is answered BAD_LENGTH at once (like the model); its payload then arrives while
that answer is sent and is dropped, where the model hunts through it for a SYNC byte.

Output flow: a byte is offered on ``o`` from a register and the next one is loaded in the cycle after it
was taken (at most one byte every two cycles: a UART needs ten bit times).
"""
from __future__ import annotations

import operator
import struct
from functools import reduce

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hdl import hostlink as hl
from hdl.config import BOOK
from hdl.hostlink import (ANSWER_HEADER, DIRTY_BLOCK, FRAME_GAP_BYTES, MAX_BOARD_LAT, MAX_PAYLOAD, REQUEST_HEADER,
                          RUN_ARGS, RUN_RESULT, SYNC_ANSWER, SYNC_REQUEST, Cmd, HelloInfo, Space, Status, crc16,
                          dirty_map_bytes, word_bytes)
from hdl.uart import FRAME_BITS

__all__ = ["LinkEngine", "link_bus", "run_signature", "board_hello", "board_max_lat", "gap_cycles",
           "space_depth", "crc16_step", "struct_fields", "READ_LATENCY"]

READ_LATENCY = 2            # cycles from a `bus.re` to the word on `bus.rdata`


def struct_fields(st: struct.Struct) -> list[tuple[int, int]]:
    """The fields of a little-endian `struct` as (bytes of one item, items): ``"<BBHI5Q"`` gives
    ``[(1, 1), (1, 1), (2, 1), (4, 1), (8, 5)]``; ``"4s"`` is one field of (4, 1)."""
    fmt = st.format
    if fmt[0] not in "<":
        raise ValueError(f"struct {fmt!r} is not little-endian")
    out, count = [], ""
    for ch in fmt[1:]:
        if ch.isdigit():
            count += ch
        elif ch == "s":
            out.append((int(count or 1), 1))
            count = ""
        else:
            out.append((struct.calcsize("<" + ch), int(count or 1)))
            count = ""
    assert sum(size * n for size, n in out) == st.size
    return out


def board_max_lat(config=BOOK) -> int:
    """The largest LAT a RUN may ask: `MAX_BOARD_LAT`, or the chip's own on a gather chip (its error stop
    is built for ``config.lat``: only that one is accepted)."""
    return config.lat if config.gather else MAX_BOARD_LAT


def board_hello(config=BOOK, clk_hz=25_000_000, baud=3_000_000) -> HelloInfo:
    """What HELLO answers on a board built for `config`: the external memory's capacity is ``ext_words``."""
    return HelloInfo(clk_hz, baud, config.ext_words, config.spad_depth, config.rom_words, board_max_lat(config),
                     DIRTY_BLOCK, MAX_PAYLOAD, config.key())


def space_depth(config, space) -> int:
    """Words of `space` on a board built for `config`."""
    return {Space.PROGRAM: config.rom_words, Space.EXT: config.ext_words, Space.SPAD: config.spad_depth}[Space(space)]


def gap_cycles(clk_hz, baud) -> int:
    """Cycles of silence that drop a frame cut short: `FRAME_GAP_BYTES` bytes of ten bits each."""
    return FRAME_GAP_BYTES * FRAME_BITS * clk_hz // baud


# CRC-16 of hdl.hostlink as a matrix over GF(2): the new register's bit k is the XOR of the register bits
# and byte bits whose columns have bit k set (crc16 with no final xor is linear in both).
_CRC_INIT = crc16(b"")
_CRC_COLS = [crc16(b"\x00", 1 << i) for i in range(16)]
_BYTE_COLS = [crc16(bytes([1 << j]), 0) for j in range(8)]


def crc16_step(crc, byte):
    """The Amaranth expression of ``hostlink.crc16(bytes([byte]), crc)``: the CRC register after one byte."""
    bits = []
    for k in range(16):
        terms = [crc[i] for i in range(16) if _CRC_COLS[i] >> k & 1]
        terms += [byte[j] for j in range(8) if _BYTE_COLS[j] >> k & 1]
        bits.append(reduce(operator.xor, terms))
    return Cat(*bits)


_SPACES = list(Space)
_CMDS = list(Cmd)
_WORD_BITS = 8 * max(word_bytes(s) for s in Space)
_HDR = struct_fields(REQUEST_HEADER)            # sync, seq, cmd, space, addr, count
_ANS = struct_fields(ANSWER_HEADER)             # sync, seq, cmd, status, length
_ARGS = struct_fields(RUN_ARGS)                 # ext_words, lat, max_cycles
_RESULT = struct_fields(RUN_RESULT)             # halted, error_kind, error_pc, error_info, counters
assert len(_HDR) == 6 and len(_ANS) == 5 and len(_ARGS) == 3 and len(_RESULT) == 5, "hdl.hostlink changed"
_CRC_BYTES = hl.CRC.size


def _offsets(fields):
    """Bit offsets and widths of the fields of `struct_fields` (one item each)."""
    out, at = [], 0
    for size, n in fields:
        out.append((8 * at, 8 * size * n))
        at += size * n
    return out


def link_bus(config=BOOK) -> wiring.Signature:
    """The engine's memory port, from the engine's side.

    Members: ``space`` (a `Space`), ``addr`` (a word address), ``we`` (write ``wdata``'s low
    ``8*word_bytes(space)`` bits at this edge), ``re`` (read: ``rdata`` holds the word `READ_LATENCY`
    cycles later), ``wdata``/``rdata`` (the widest word, `Space.PROGRAM`'s 128 bits; narrower words in
    the low bits, the rest of ``rdata`` ignored).
    """
    return wiring.Signature({
        "space": Out(range(max(Space) + 1)),
        "addr":  Out(8 * _HDR[4][0]),
        "we":    Out(1),
        "re":    Out(1),
        "wdata": Out(_WORD_BITS),
        "rdata": In(_WORD_BITS),
    })


def run_signature(config=BOOK) -> wiring.Signature:
    """The engine's run-control port, from the engine's side.

    ``start`` pulses once a RUN's arguments are checked (``ext_words`` 1..config.ext_words, ``lat``
    1..`board_max_lat`, ``max_cycles`` >= 1), held from then until the next RUN. ``reset`` pulses for
    RESET. The top answers ``done`` (one cycle) with ``halted`` (0: the cycle limit stopped the chip) and
    the error state and counters as they are in that cycle (widths: `RUN_RESULT`'s fields).
    """
    widths = [8 * size for size, _ in _RESULT]
    return wiring.Signature({
        "start":      Out(1),
        "reset":      Out(1),
        "ext_words":  Out(range(config.ext_words + 1)),
        "lat":        Out(range(board_max_lat(config) + 1)),
        "max_cycles": Out(8 * _ARGS[2][0]),
        "done":       In(1),
        "halted":     In(1),
        "error_kind": In(widths[1]),
        "error_pc":   In(widths[2]),
        "error_info": In(widths[3]),
        "counters":   In(data.ArrayLayout(config.counter_bits, _RESULT[4][1])),
    })


def _fit(value, bits):
    """`value` zero-extended (or cut) to exactly `bits` bits, for a Cat of fixed fields."""
    v = value.as_value() if hasattr(value, "as_value") else value
    if len(v) >= bits:
        return v[:bits]
    return Cat(v, Const(0, bits - len(v)))


class LinkEngine(wiring.Component):
    """The host link's protocol engine (module docstring; the protocol is `hdl.hostlink`'s).

    Parameters
    ----------
    config : hdl.config.ChipConfig
        The chip on the board: HELLO answers its key and the memories' sizes, WRITE/READ check
        addresses against them, RUN checks LAT against `board_max_lat`.
    clk_hz, baud : int
        The clock and the line's rate: reported by HELLO, and the gap timer's byte time.

    Ports
    -----
    i : In(stream.Signature(8))
        Bytes from the host.
    o : Out(stream.Signature(8))
        Bytes to the host.
    bus : Out(link_bus(config))
        The memories (the board top serves it; used only while the chip is stopped).
    run : Out(run_signature(config))
        Chip control (the board top serves it).
    ext_we, ext_waddr : In(1), In(16)
        The chip's external-memory writes that land (below the run's EXT): each marks the dirty map
        (the top passes the chip's writes only; the link's own never mark).
    spad_we, spad_waddr : In(1), In(config.spad_addr_bits)
        The chip's scratchpad writes, likewise. With ``config.spad_lanes`` > 1 (docs/spad-lanes.md) a
        cycle writes up to `spad_lanes` consecutive words: `spad_waddr` is then the lowest lane's address
        that writes and `spad_waddr_last` the highest's. With ``config.ext_port`` > 1 (docs/ext-port.md)
        `ext_waddr` and `ext_waddr_last` are the same for the external writes that land.
    spad_waddr_last : In(config.spad_addr_bits)
        Only with ``config.spad_lanes`` > 1: the address of the highest write lane that writes this
        cycle. The lanes span fewer than `DIRTY_BLOCK` words, so the blocks of `spad_waddr` and
        `spad_waddr_last` are every block the cycle writes: both are marked (a second write port on
        the scratchpad's map).
    ext_waddr_last : In(16)
        Only with ``config.ext_port`` > 1: the address of the highest external write lane that lands this
        cycle, marked as `spad_waddr_last` is.
    busy : Out(1)
        A frame is being taken, executed or answered (not hunting): the link-activity LED.
    running : Out(1)
        A RUN waits for the chip.

    Attributes
    ----------
    hello : bytes
        HELLO's payload (`board_hello(...).pack()`), the ROM's contents.
    payload : amaranth.lib.memory.Memory
        The frame buffer (`MAX_PAYLOAD` bytes).
    ext_dirty, spad_dirty : amaranth.lib.memory.Memory
        The dirty maps, one bit a block (depth a multiple of 8: the map's bytes).
    """

    def __init__(self, config=BOOK, clk_hz=25_000_000, baud=3_000_000):
        self.config = config
        self.clk_hz, self.baud = clk_hz, baud
        self.gap = gap_cycles(clk_hz, baud)
        if self.gap < 1:
            raise ValueError(f"clk_hz {clk_hz} and baud {baud} give a gap timer of {self.gap} cycles")
        self.hello = board_hello(config, clk_hz, baud).pack()
        self.ext_map_bytes = dirty_map_bytes(config.ext_words)
        self.spad_map_bytes = dirty_map_bytes(config.spad_depth)
        self.payload = Memory(shape=8, depth=MAX_PAYLOAD, init=[])
        self.hello_rom = Memory(shape=8, depth=len(self.hello), init=list(self.hello))
        self.ext_dirty = Memory(shape=1, depth=8 * self.ext_map_bytes, init=[])
        self.spad_dirty = Memory(shape=1, depth=8 * self.spad_map_bytes, init=[])
        members = {
            "i":          In(stream.Signature(8)),
            "o":          Out(stream.Signature(8)),
            "bus":        Out(link_bus(config)),
            "run":        Out(run_signature(config)),
            "ext_we":     In(1),
            "ext_waddr":  In(config.ext_addr_bits),
            "spad_we":    In(1),
            "spad_waddr": In(config.spad_addr_bits),
            "busy":       Out(1),
            "running":    Out(1),
        }
        if config.spad_lanes > 1:
            # the lanes' span must stay within two blocks for two marks to cover it
            assert config.spad_lanes <= DIRTY_BLOCK
            members["spad_waddr_last"] = In(config.spad_addr_bits)
        if config.ext_port > 1:
            # likewise the external port's write lanes (docs/ext-port.md)
            members["ext_waddr_last"] = In(config.ext_addr_bits)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.payload = self.payload
        m.submodules.hello_rom = self.hello_rom
        m.submodules.ext_dirty = self.ext_dirty
        m.submodules.spad_dirty = self.spad_dirty
        i, o, bus, run = self.i, self.o, self.bus, self.run

        # ---- the request: header, payload, CRC ----
        hdr_bytes = REQUEST_HEADER.size - 1                 # after the SYNC byte
        hdr = Signal(8 * hdr_bytes)
        fields = [hdr[lo - 8:lo - 8 + w] for lo, w in _offsets(_HDR)[1:]]
        seq, cmd, space, addr, count = fields
        hcnt = Signal(range(max(hdr_bytes, ANSWER_HEADER.size) + 1))
        args = Signal(8 * RUN_ARGS.size)
        (a_ext, a_lat, a_cycles) = (args[lo:lo + w] for lo, w in _offsets(_ARGS))
        nleft = Signal(range(MAX_PAYLOAD + 1))
        pidx = Signal(range(MAX_PAYLOAD + 1))
        crc = Signal(16, init=_CRC_INIT)
        crc_lo = Signal(8)
        crc_ok = Signal()
        gap = Signal(range(self.gap + 1))

        # the request's payload length: hostlink.request_payload_length, as logic
        is_space = {s: space == s for s in _SPACES}
        space_known = reduce(operator.or_, is_space.values())
        nbytes = Signal(range(((1 << len(count)) - 1) * max(word_bytes(s) for s in Space) + 1))
        with m.Switch(space):
            for s in _SPACES:
                with m.Case(s):
                    m.d.comb += nbytes.eq(count * word_bytes(s))
        plen = Signal.like(nbytes)
        with m.If((cmd == Cmd.WRITE) & space_known):
            m.d.comb += plen.eq(nbytes)
        with m.Elif(cmd == Cmd.RUN):
            m.d.comb += plen.eq(RUN_ARGS.size)

        # ---- checks (registered in CHECK, used in DECIDE) ----
        f_known = Signal()
        f_retry = Signal()
        f_space = Signal()
        f_len = Signal()
        f_addr = Signal()
        f_args = Signal()
        last_valid = Signal()
        last_seq = Signal(8)
        last_cmd = Signal(8)
        wb_last = Signal(range(_WORD_BITS // 8))          # bytes of a word of `space`, minus one
        end = Signal(len(addr) + 1)
        m.d.comb += end.eq(addr + count)
        addr_ok = Signal()
        with m.Switch(space):
            for s in _SPACES:
                with m.Case(s):
                    m.d.comb += addr_ok.eq(end <= space_depth(cfg, s))
        max_lat = board_max_lat(cfg)
        args_ok = ((a_ext >= 1) & (a_ext <= cfg.ext_words) & (a_lat >= 1) & (a_lat <= max_lat)
                   & (a_cycles >= 1))
        if cfg.gather:
            args_ok = args_ok & (a_lat == cfg.lat)

        # ---- the answer ----
        hsr = Signal(8 * ANSWER_HEADER.size)
        obyte = Signal(8)
        ovalid = Signal()
        m.d.comb += [o.payload.eq(obyte), o.valid.eq(ovalid)]
        with m.If(ovalid & o.ready):
            m.d.sync += ovalid.eq(0)
        free = ~ovalid

        def load(value, counted=True):
            """Offer `value` next (call only while `free`), folded into the answer's CRC if `counted`."""
            m.d.sync += [obyte.eq(value), ovalid.eq(1)]
            if counted is True:
                m.d.sync += crc.eq(crc16_step(crc, value))
            elif counted is not False:
                with m.If(counted):
                    m.d.sync += crc.eq(crc16_step(crc, value))

        K_NONE, K_HELLO, K_READ, K_RUN = range(4)
        kind = Signal(range(4))

        def answer(st, k=K_NONE, length=0):
            values = [SYNC_ANSWER, seq, cmd, st, length]
            m.d.sync += [hsr.eq(Cat(*(_fit(Const(v) if isinstance(v, int) else v, w)
                                      for v, (_, w) in zip(values, _offsets(_ANS))))),
                         hcnt.eq(0), kind.eq(k), crc.eq(_CRC_INIT)]
            m.next = "A_HDR"

        # words of a READ or WRITE
        cur = Signal(len(addr))
        words = Signal(len(count))
        bpos = Signal(range(_WORD_BITS // 8))
        wsr = Signal(_WORD_BITS)
        m.d.comb += [bus.space.eq(space), bus.addr.eq(cur), bus.wdata.eq(wsr)]
        pay_wr = self.payload.write_port()
        pay_rd = self.payload.read_port(transparent_for=())
        m.d.comb += [pay_wr.addr.eq(pidx), pay_wr.data.eq(i.payload), pay_rd.addr.eq(pidx)]
        # synchronous: the byte at pidx is there a cycle after pidx changed, and a load (which moves
        # pidx) always leaves the output register busy for the next cycle (`free` low)
        hello_rd = self.hello_rom.read_port(transparent_for=())
        m.d.comb += hello_rd.addr.eq(pidx)

        # ---- the RUN's result and the dirty maps ----
        res_halted = Signal()
        res_kind = Signal.like(run.error_kind)
        res_pc = Signal.like(run.error_pc)
        res_info = Signal.like(run.error_info)
        res_counters = Signal.like(run.counters)
        widths = [8 * size * n for size, n in _RESULT]
        result = Cat(*(_fit(v, w) for v, w in zip(
            [res_halted, res_kind, res_pc, res_info,
             Cat(*(_fit(c, 8 * _RESULT[4][0]) for c in res_counters))], widths)))
        rcnt = Signal(range(RUN_RESULT.size))
        shift = (DIRTY_BLOCK - 1).bit_length()
        assert 1 << shift == DIRTY_BLOCK
        n_clear = 8 * max(self.ext_map_bytes, self.spad_map_bytes)
        clr = Signal(range(n_clear + 1))
        dmap = Signal()                 # 0: the external memory's map, 1: the scratchpad's
        dj = Signal(range(max(self.ext_map_bytes, self.spad_map_bytes)))
        db = Signal(3)
        dbyte = Signal(8)
        marks = []
        for mem, we, waddr in ((self.ext_dirty, self.ext_we, self.ext_waddr),
                               (self.spad_dirty, self.spad_we, self.spad_waddr)):
            bits = max(1, (mem.depth - 1).bit_length())
            mv, ma = Signal(), Signal(bits)
            marks.append((mem, mv, ma, bits, we, waddr))
        clearing = Signal()
        dirty_rd = []
        for mem, mv, ma, bits, we, waddr in marks:
            m.d.sync += [mv.eq(we), ma.eq(waddr[shift:shift + bits] if len(waddr) > shift else 0)]
            wp = mem.write_port()
            m.d.comb += [
                wp.en.eq(Mux(clearing, clr < mem.depth, mv)),
                wp.addr.eq(Mux(clearing, clr, ma)),
                wp.data.eq(~clearing),
            ]
            if (mem is self.spad_dirty and cfg.spad_lanes > 1) or (mem is self.ext_dirty and cfg.ext_port > 1):
                # the highest lane's block (the lowest's is marked by the first port, which also
                # does the clearing: this one stays off meanwhile, as marks do on the first)
                mv2, ma2 = Signal(), Signal(bits)
                last = self.spad_waddr_last if mem is self.spad_dirty else self.ext_waddr_last
                m.d.sync += [mv2.eq(we), ma2.eq(last[shift:shift + bits] if len(last) > shift else 0)]
                wp2 = mem.write_port()
                m.d.comb += [wp2.en.eq(~clearing & mv2), wp2.addr.eq(ma2), wp2.data.eq(1)]
            rp = mem.read_port(transparent_for=())
            m.d.comb += rp.addr.eq(Cat(db, dj))
            dirty_rd.append(rp.data)
        map_last = Mux(dmap, self.spad_map_bytes - 1, self.ext_map_bytes - 1)

        run_len = RUN_RESULT.size + self.ext_map_bytes + self.spad_map_bytes
        ra_ext = Signal.like(run.ext_words)
        ra_lat = Signal.like(run.lat)
        ra_cycles = Signal.like(run.max_cycles)
        m.d.comb += [run.ext_words.eq(ra_ext), run.lat.eq(ra_lat), run.max_cycles.eq(ra_cycles)]

        def receiving(on_byte):
            """A state that takes the frame's bytes: each one restarts the gap timer, silence drops the frame."""
            m.d.comb += i.ready.eq(1)
            with m.If(i.valid):
                m.d.sync += gap.eq(0)
                on_byte()
            with m.Elif(gap == self.gap - 1):
                m.next = "HUNT"
            with m.Else():
                m.d.sync += gap.eq(gap + 1)

        with m.FSM(name="link_state") as fsm:
            with m.State("HUNT"):
                m.d.comb += i.ready.eq(1)
                with m.If(i.valid & (i.payload == SYNC_REQUEST)):
                    m.d.sync += [crc.eq(_CRC_INIT), hcnt.eq(0), gap.eq(0)]
                    m.next = "HDR"

            with m.State("HDR"):
                def hdr_byte():
                    m.d.sync += [crc.eq(crc16_step(crc, i.payload)), hdr.eq(Cat(hdr[8:], i.payload)),
                                 hcnt.eq(hcnt + 1)]
                    with m.If(hcnt == hdr_bytes - 1):
                        m.next = "LEN"
                receiving(hdr_byte)

            with m.State("LEN"):
                m.d.sync += [nleft.eq(plen), pidx.eq(0)]
                with m.If(plen > MAX_PAYLOAD):
                    answer(Status.BAD_LENGTH)           # the header cannot be right: at once
                with m.Elif(plen == 0):
                    m.next = "CRC0"
                with m.Else():
                    m.next = "PAYLOAD"

            with m.State("PAYLOAD"):
                def pay_byte():
                    m.d.comb += pay_wr.en.eq(1)
                    m.d.sync += [crc.eq(crc16_step(crc, i.payload)), args.eq(Cat(args[8:], i.payload)),
                                 pidx.eq(pidx + 1), nleft.eq(nleft - 1)]
                    with m.If(nleft == 1):
                        m.next = "CRC0"
                receiving(pay_byte)

            with m.State("CRC0"):
                def crc0():
                    m.d.sync += crc_lo.eq(i.payload)
                    m.next = "CRC1"
                receiving(crc0)

            with m.State("CRC1"):
                def crc1():
                    m.d.sync += crc_ok.eq(Cat(crc_lo, i.payload) == crc)
                    m.next = "CHECK"
                receiving(crc1)

            with m.State("CHECK"):
                m.d.sync += [
                    f_known.eq(reduce(operator.or_, [cmd == c for c in _CMDS])),
                    f_retry.eq(last_valid & (last_seq == seq) & (last_cmd == cmd)),
                    f_space.eq(space_known),
                    f_len.eq((count != 0) & (nbytes <= MAX_PAYLOAD)),
                    f_addr.eq(addr_ok),
                    f_args.eq(args_ok),
                    cur.eq(addr), words.eq(count), bpos.eq(0), pidx.eq(0),
                ]
                with m.Switch(space):
                    for s in _SPACES:
                        with m.Case(s):
                            m.d.sync += wb_last.eq(word_bytes(s) - 1)
                m.next = "DECIDE"

            with m.State("DECIDE"):
                def executed():
                    m.d.sync += [last_valid.eq(1), last_seq.eq(seq), last_cmd.eq(cmd)]

                with m.If(~crc_ok):
                    answer(Status.BAD_CRC)
                with m.Elif(cmd == Cmd.HELLO):
                    m.d.sync += last_valid.eq(0)         # a new session: nothing is a retry
                    answer(Status.ACK, K_HELLO, len(self.hello))
                with m.Elif(~f_known):
                    answer(Status.BAD_COMMAND)
                with m.Elif(cmd == Cmd.RESET):
                    executed()
                    m.d.comb += run.reset.eq(~f_retry)
                    answer(Status.ACK)
                with m.Elif(cmd == Cmd.RUN):
                    with m.If(f_retry):
                        answer(Status.ACK, K_RUN, run_len)
                    with m.Elif(~f_args):
                        answer(Status.BAD_ARGUMENT)
                    with m.Else():
                        executed()
                        m.d.sync += [ra_ext.eq(a_ext), ra_lat.eq(a_lat), ra_cycles.eq(a_cycles), clr.eq(0)]
                        m.next = "CLEAR"
                with m.Elif(~f_space):
                    answer(Status.BAD_COMMAND)
                with m.Elif(~f_len):
                    answer(Status.BAD_LENGTH)
                with m.Elif(~f_addr):
                    answer(Status.BAD_ADDRESS)
                with m.Elif(cmd == Cmd.READ):
                    executed()
                    answer(Status.ACK, K_READ, nbytes)
                with m.Else():                          # WRITE
                    executed()
                    with m.If(f_retry):
                        answer(Status.ACK)
                    with m.Else():
                        m.next = "COPY_RD"

            # ---- WRITE: the buffered payload into its space, a word at a time ----
            with m.State("COPY_RD"):                    # pay_rd.addr = pidx now, its byte next cycle
                m.next = "COPY_GET"
            with m.State("COPY_GET"):
                m.d.sync += [wsr.word_select(bpos, 8).eq(pay_rd.data), pidx.eq(pidx + 1), bpos.eq(bpos + 1)]
                with m.If(bpos == wb_last):
                    m.next = "COPY_WR"
                with m.Else():
                    m.next = "COPY_RD"
            with m.State("COPY_WR"):
                m.d.comb += bus.we.eq(1)
                m.d.sync += [cur.eq(cur + 1), words.eq(words - 1), bpos.eq(0)]
                with m.If(words == 1):
                    answer(Status.ACK)
                with m.Else():
                    m.next = "COPY_RD"

            # ---- RUN: clear the maps, start, wait for the chip ----
            with m.State("CLEAR"):
                m.d.comb += clearing.eq(1)
                m.d.sync += clr.eq(clr + 1)
                with m.If(clr == n_clear - 1):
                    m.next = "RUN_GO"
            with m.State("RUN_GO"):
                m.d.comb += run.start.eq(1)
                m.next = "RUN_WAIT"
            with m.State("RUN_WAIT"):
                m.d.comb += [i.ready.eq(1), self.running.eq(1)]     # bytes dropped
                with m.If(run.done):
                    m.d.sync += [res_halted.eq(run.halted), res_kind.eq(run.error_kind), res_pc.eq(run.error_pc),
                                 res_info.eq(run.error_info), res_counters.eq(run.counters)]
                    answer(Status.ACK, K_RUN, run_len)

            # ---- the answer: header, payload, CRC; arriving bytes are dropped ----
            with m.State("A_HDR"):
                m.d.comb += i.ready.eq(1)
                with m.If(free):
                    load(hsr[:8], counted=hcnt != 0)
                    m.d.sync += [hsr.eq(hsr >> 8), hcnt.eq(hcnt + 1)]
                    with m.If(hcnt == ANSWER_HEADER.size - 1):
                        m.d.sync += [pidx.eq(0), rcnt.eq(0), dmap.eq(0), dj.eq(0), db.eq(0)]
                        with m.Switch(kind):
                            with m.Case(K_HELLO):
                                m.next = "A_HELLO"
                            with m.Case(K_READ):
                                m.next = "A_RD0"
                            with m.Case(K_RUN):
                                m.next = "A_RES"
                            with m.Default():
                                m.next = "A_CRC0"
            with m.State("A_HELLO"):
                m.d.comb += i.ready.eq(1)
                with m.If(free):
                    load(hello_rd.data)
                    m.d.sync += pidx.eq(pidx + 1)
                    with m.If(pidx == len(self.hello) - 1):
                        m.next = "A_CRC0"
            with m.State("A_RD0"):
                m.d.comb += [i.ready.eq(1), bus.re.eq(1)]
                m.d.sync += hcnt.eq(0)
                m.next = "A_RD1"
            with m.State("A_RD1"):
                m.d.comb += i.ready.eq(1)
                m.d.sync += hcnt.eq(hcnt + 1)
                with m.If(hcnt == READ_LATENCY - 2):
                    m.next = "A_RD2"
            with m.State("A_RD2"):
                m.d.comb += i.ready.eq(1)
                m.d.sync += [wsr.eq(bus.rdata), bpos.eq(0)]
                m.next = "A_RDB"
            with m.State("A_RDB"):
                m.d.comb += i.ready.eq(1)
                with m.If(free):
                    load(wsr[:8])
                    m.d.sync += [wsr.eq(wsr >> 8), bpos.eq(bpos + 1)]
                    with m.If(bpos == wb_last):
                        m.d.sync += [cur.eq(cur + 1), words.eq(words - 1)]
                        with m.If(words == 1):
                            m.next = "A_CRC0"
                        with m.Else():
                            m.next = "A_RD0"
            with m.State("A_RES"):
                m.d.comb += i.ready.eq(1)
                with m.If(free):
                    load(result.word_select(rcnt, 8))
                    m.d.sync += rcnt.eq(rcnt + 1)
                    with m.If(rcnt == RUN_RESULT.size - 1):
                        m.next = "A_DRD"
            with m.State("A_DRD"):                      # the map's bit Cat(db, dj) is read this cycle
                m.d.comb += i.ready.eq(1)
                m.next = "A_DGET"
            with m.State("A_DGET"):
                m.d.comb += i.ready.eq(1)
                m.d.sync += [dbyte.eq(Cat(dbyte[1:], Mux(dmap, dirty_rd[1], dirty_rd[0]))), db.eq(db + 1)]
                with m.If(db == 7):
                    m.next = "A_DOUT"
                with m.Else():
                    m.next = "A_DRD"
            with m.State("A_DOUT"):
                m.d.comb += i.ready.eq(1)
                with m.If(free):
                    load(dbyte)
                    with m.If(dj == map_last):
                        m.d.sync += dj.eq(0)
                        with m.If(dmap):
                            m.next = "A_CRC0"
                        with m.Else():
                            m.d.sync += dmap.eq(1)
                            m.next = "A_DRD"
                    with m.Else():
                        m.d.sync += dj.eq(dj + 1)
                        m.next = "A_DRD"
            with m.State("A_CRC0"):
                m.d.comb += i.ready.eq(1)
                with m.If(free):
                    load(crc[:8], counted=False)
                    m.next = "A_CRC1"
            with m.State("A_CRC1"):
                m.d.comb += i.ready.eq(1)
                with m.If(free):
                    load(crc[8:], counted=False)
                    m.next = "HUNT"

        m.d.comb += self.busy.eq(~fsm.ongoing("HUNT"))
        return m
