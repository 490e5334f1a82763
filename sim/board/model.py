"""BoardModel: the FPGA top's host link in plain Python, the behaviour the hardware engine is checked
against (`hdl.hostlink` has the protocol; the chip's runs go to the reference machine).

It takes the bytes the host sends (`feed`) and returns the bytes the board would answer, frame for frame,
with the same rules as the hardware: SYNC hunting, CRC, NAK reasons, retries answered but not executed
twice, dirty maps. Time is not modelled: a frame cut short stays pending until `gap` (the line was
silent for `FRAME_GAP_BYTES` byte times) drops it.
"""
from __future__ import annotations

from hdl.config import BOOK, ChipConfig
from hdl.hostlink import (DIRTY_BLOCK, MAX_BOARD_LAT, MAX_PAYLOAD, REQUEST_HEADER,
                          SYNC_REQUEST, Answer, Cmd, HelloInfo, RunArgs, RunResultFields, Space, Status,
                          crc16, dirty_map_bytes, pack_answer, request_payload_length, word_bytes)

__all__ = ["BoardModel"]

_POISON = 0xDEADBEEF


class BoardModel:
    """The board's memories and link engine.

    Parameters
    ----------
    config : hdl.config.ChipConfig
        The chip the board was built for; its ``ext_words`` is the external memory's capacity.
    clk_hz, baud : int
        Reported by HELLO.
    """

    def __init__(self, config: ChipConfig = BOOK, clk_hz: int = 25_000_000, baud: int = 3_000_000):
        self.config = config
        self.clk_hz, self.baud = clk_hz, baud
        self.mem = {Space.PROGRAM: [0] * config.rom_words, Space.EXT: [0] * config.ext_words,
                    Space.SPAD: [0] * config.spad_depth}
        self.last = None            # (seq, cmd) of the last executed frame, None after HELLO
        self.last_run = None        # the payload of the last RUN answer
        self.runs = 0               # RUNs executed (a retry does not count)
        self._buf = bytearray()

    @property
    def max_lat(self) -> int:
        return self.config.lat if self.config.gather else MAX_BOARD_LAT

    def hello(self) -> HelloInfo:
        c = self.config
        return HelloInfo(self.clk_hz, self.baud, c.ext_words, c.spad_depth, c.rom_words, self.max_lat,
                         DIRTY_BLOCK, MAX_PAYLOAD, c.key())

    # ---- the byte stream -------------------------------------------------------------------------
    def feed(self, data: bytes) -> bytes:
        """Take bytes from the line; return the answers of the frames they complete."""
        self._buf += data
        out = bytearray()
        while True:
            start = self._buf.find(bytes([SYNC_REQUEST]))
            if start < 0:
                self._buf.clear()
                break
            del self._buf[:start]
            if len(self._buf) < REQUEST_HEADER.size:
                break
            _, seq, cmd, space, addr, count = REQUEST_HEADER.unpack_from(self._buf)
            n = request_payload_length(cmd, space, count)
            if n > MAX_PAYLOAD:
                # the header cannot be right: answer BAD_LENGTH at once, without waiting for a payload
                out += pack_answer(Answer(seq, cmd, Status.BAD_LENGTH))
                del self._buf[:REQUEST_HEADER.size]
                continue
            size = REQUEST_HEADER.size + n + 2
            if len(self._buf) < size:
                break
            frame = bytes(self._buf[:size])
            del self._buf[:size]
            if crc16(frame[1:-2]) != int.from_bytes(frame[-2:], "little"):
                out += pack_answer(Answer(seq, cmd, Status.BAD_CRC))
                continue
            out += pack_answer(self._execute(seq, cmd, space, addr, count, frame[REQUEST_HEADER.size:-2]))
        return bytes(out)

    def gap(self) -> None:
        """The line fell silent: a frame cut short is dropped."""
        self._buf.clear()

    # ---- commands --------------------------------------------------------------------------------
    def _execute(self, seq, cmd, space, addr, count, payload) -> Answer:
        def answer(status=Status.ACK, data=b""):
            return Answer(seq, cmd, status, data)

        if cmd == Cmd.HELLO:
            self.last = None
            return answer(data=self.hello().pack())
        if cmd not in iter(Cmd):
            return answer(Status.BAD_COMMAND)
        retry = self.last == (seq, cmd)
        if cmd == Cmd.RESET:
            self.last = (seq, cmd)
            return answer()
        if cmd == Cmd.RUN:
            if not retry:
                args = RunArgs.unpack(payload)
                if not (1 <= args.ext_words <= self.config.ext_words and 1 <= args.lat <= self.max_lat
                        and (not self.config.gather or args.lat == self.config.lat) and args.max_cycles >= 1):
                    return answer(Status.BAD_ARGUMENT)
                self.last_run = self._run(args)
                self.runs += 1
            self.last = (seq, cmd)
            return answer(data=self.last_run)
        # WRITE, READ
        if space not in iter(Space):
            return answer(Status.BAD_COMMAND)
        space = Space(space)
        wb = word_bytes(space)
        if count == 0 or count * wb > MAX_PAYLOAD:
            return answer(Status.BAD_LENGTH)
        mem = self.mem[space]
        if addr + count > len(mem):
            return answer(Status.BAD_ADDRESS)
        if cmd == Cmd.READ:
            self.last = (seq, cmd)
            return answer(data=b"".join(w.to_bytes(wb, "little") for w in mem[addr:addr + count]))
        if not retry:
            for i in range(count):
                mem[addr + i] = int.from_bytes(payload[i * wb:(i + 1) * wb], "little")
        self.last = (seq, cmd)
        return answer()

    def _run(self, args: RunArgs) -> bytes:
        from sim.backends import DidNotHalt, ErrorStop
        from sim.backends.reference import ReferenceMachine
        ext, spad = self.mem[Space.EXT], self.mem[Space.SPAD]
        ref = ReferenceMachine(max_cycles=args.max_cycles, check=False, config=self.config)
        try:
            r = ref.run(self.mem[Space.PROGRAM], ext[:args.ext_words], args.lat, scratchpad=list(spad))
        except DidNotHalt:
            return RunResultFields(0, 0, 0, 0, (0,) * 5, bytes(dirty_map_bytes(len(ext))),
                                   bytes(dirty_map_bytes(len(spad)))).pack()
        ext_dirty = self._mark(ext, r.ext)
        spad_dirty = self._mark(spad, r.scratchpad)
        kinds = {label: code for code, label in ErrorStop.KINDS.items()}     # the chip's error_kind codes
        e = r.error
        return RunResultFields(1, kinds[e.kind] if e else 0, e.pc if e else 0, e.info if e else 0,
                               tuple(r.counters), ext_dirty, spad_dirty).pack()

    @staticmethod
    def _mark(mem: list[int], new: list[int]) -> bytes:
        """Copy `new` over the start of `mem`; the dirty map of the blocks whose words changed (the
        hardware marks every block the chip wrote: a superset)."""
        bits = bytearray(dirty_map_bytes(len(mem)))
        for i, w in enumerate(new):
            if mem[i] != w:
                mem[i] = w
                b = i // DIRTY_BLOCK
                bits[b // 8] |= 1 << (b % 8)
        return bytes(bits)
