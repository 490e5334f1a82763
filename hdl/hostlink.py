"""The host link's protocol: frames, commands, answers and the CRC, defined here and nowhere else.

Pure Python (no Amaranth), like `hdl.isa`: the FPGA top's protocol engine (`hdl.link_engine`) takes its
byte layout, command and reason codes from this module, and so do the host's packer
(`sim.backends.board_backend`) and the behavioural board model (`sim.board.model`).

A request (host -> board), every multi-byte field little-endian::

    0  SYNC_REQUEST (0xA5)
    1  seq      u8   the host's sequence number; a retry repeats it
    2  cmd      u8   a `Cmd`
    3  space    u8   a `Space` (WRITE, READ); 0 for the other commands
    4  addr     u16  first word (WRITE, READ)
    6  count    u16  words (WRITE, READ); 0 for the other commands
    8  payload       WRITE: count words of the space's width; RUN: `RUN_ARGS`; else nothing
    .  crc      u16  `crc16` of bytes 1 .. the payload's last (the SYNC byte is not covered)

An answer (board -> host)::

    0  SYNC_ANSWER (0x5A)
    1  seq      u8   the request's seq
    2  cmd      u8   the request's cmd
    3  status   u8   `Status.ACK`, or a NAK reason
    4  length   u16  payload bytes
    6  payload       HELLO: `HELLO` fields + the chip's key; READ: the words; RUN: `RUN_RESULT` + dirty maps
    .  crc      u16  `crc16` of bytes 1 .. the payload's last

Rules the board keeps:

- Every frame it parses is answered, with ACK or a NAK whose status names the reason; a NAK'd frame
  changes nothing.
- A frame with a good CRC whose (seq, cmd) equal the last executed frame's is a retry: it is answered
  again (a RUN with the results it stored) but not executed again. HELLO always executes and starts a
  new session (the next frame is never taken for a retry).
- A frame that stops arriving for `FRAME_GAP_BYTES` byte times is dropped without an answer; the board
  then hunts for the next SYNC byte. While the chip runs, incoming bytes are dropped; the RUN answer is
  sent when the chip halts (or when the RUN's cycle limit stops it, with ``halted = 0``).
- The chip's writes during a RUN mark blocks of `DIRTY_BLOCK` words dirty (external memory and
  scratchpad); the RUN answer carries both maps, so the host reads back only what the run changed. The
  host's own WRITEs mark nothing.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

__all__ = ["SYNC_REQUEST", "SYNC_ANSWER", "Cmd", "Space", "Status", "MAX_PAYLOAD", "DIRTY_BLOCK",
           "FRAME_GAP_BYTES", "MAX_BOARD_LAT", "PROTOCOL_VERSION", "MAGIC", "REQUEST_HEADER",
           "ANSWER_HEADER", "RUN_ARGS", "RUN_RESULT", "HELLO", "crc16", "word_bytes", "LinkError",
           "Request", "Answer", "pack_request", "pack_answer", "parse_request", "parse_answer",
           "RunArgs", "RunResultFields", "HelloInfo", "dirty_map_bytes"]

SYNC_REQUEST = 0xA5
SYNC_ANSWER = 0x5A
PROTOCOL_VERSION = 1
MAGIC = b"GA2L"

MAX_PAYLOAD = 1024          # bytes of one frame's payload: the engine buffers a WRITE whole before its CRC
DIRTY_BLOCK = 16            # words a dirty bit stands for
FRAME_GAP_BYTES = 64        # a frame that pauses this many byte times is dropped
MAX_BOARD_LAT = 64          # the board's external memory takes LAT 1..64 at run time (chip without gather)

REQUEST_HEADER = struct.Struct("<BBBBHH")   # sync, seq, cmd, space, addr, count
ANSWER_HEADER = struct.Struct("<BBBBH")     # sync, seq, cmd, status, length
CRC = struct.Struct("<H")


class Cmd(enum.IntEnum):
    HELLO = 1       # answer the board's build: `HELLO` fields, then the chip's `ChipConfig.key()`
    WRITE = 2       # write count words at addr of a space (the chip must not be running)
    READ = 3        # read count words at addr of a space
    RUN = 4         # pulse start, answer at HALT (or at the cycle limit) with `RUN_RESULT`
    RESET = 5       # reset the chip (the memories keep their words)


class Space(enum.IntEnum):
    PROGRAM = 0     # the program memory: 128-bit words, `rom_words` of them
    EXT = 1         # the external memory: 32-bit words, the board's capacity
    SPAD = 2        # the chip's scratchpad: 32-bit words, `spad_depth` of them


class Status(enum.IntEnum):
    ACK = 0
    BAD_CRC = 1         # the CRC does not match: nothing was done (seq and cmd echo what arrived)
    BAD_LENGTH = 2      # count 0 or too many words for one frame (`MAX_PAYLOAD`), or a payload on a
                        # command that has none
    BAD_ADDRESS = 3     # addr + count runs past the end of the space
    BAD_COMMAND = 4     # an unknown cmd or space
    BAD_ARGUMENT = 5    # a RUN whose ext_words or lat the board cannot take


# RUN's payload: the external memory's size EXT for this run (reads at or past it give 0xDEADBEEF and
# writes there are dropped, as hdl.extmem), its read latency LAT, and the cycle limit.
RUN_ARGS = struct.Struct("<IHI")            # ext_words, lat, max_cycles
# RUN's answer, followed by the external memory's dirty map, then the scratchpad's: one bit a
# DIRTY_BLOCK-word block, block b in byte b // 8, bit b % 8; `dirty_map_bytes` bytes each.
RUN_RESULT = struct.Struct("<BBHI5Q")       # halted, error_kind, error_pc, error_info, 5 counters
# HELLO's answer, followed by the chip's key (ASCII, `key_length` bytes).
HELLO = struct.Struct("<4sBIIIIHHHHH")      # magic, version, clk_hz, baud, ext_capacity, spad_depth,
                                            # rom_words, max_lat, dirty_block, max_payload, key_length


def word_bytes(space: Space) -> int:
    """Bytes of one word of `space` on the link (little-endian)."""
    return 16 if space == Space.PROGRAM else 4


def dirty_map_bytes(words: int) -> int:
    """Bytes of the dirty map of a memory of `words` words."""
    blocks = -(-words // DIRTY_BLOCK)
    return -(-blocks // 8)


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        r = byte << 8
        for _ in range(8):
            r = ((r << 1) ^ 0x1021) if r & 0x8000 else r << 1
        table.append(r & 0xFFFF)
    return table


_CRC_TABLE = _crc_table()


def crc16(data: bytes, crc: int = 0xFFFF) -> int:
    """CRC-16/CCITT-FALSE (polynomial 0x1021, initial 0xFFFF, no reflection, no final xor) of `data`;
    ``crc16(b"123456789") == 0x29B1``. The engine computes the same one byte at a time."""
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC_TABLE[((crc >> 8) ^ b) & 0xFF]
    return crc


class LinkError(ValueError):
    """Bytes that are not a well-formed frame (the message says how)."""


@dataclass(frozen=True)
class Request:
    seq: int
    cmd: int
    space: int = 0
    addr: int = 0
    count: int = 0
    payload: bytes = b""


@dataclass(frozen=True)
class Answer:
    seq: int
    cmd: int
    status: int
    payload: bytes = b""


def request_payload_length(cmd: int, space: int, count: int) -> int:
    """Payload bytes the board expects after a request header: the rule both sides apply."""
    if cmd == Cmd.WRITE and space in iter(Space):
        return count * word_bytes(Space(space))
    if cmd == Cmd.RUN:
        return RUN_ARGS.size
    return 0


def pack_request(r: Request) -> bytes:
    body = REQUEST_HEADER.pack(SYNC_REQUEST, r.seq, r.cmd, r.space, r.addr, r.count)[1:] + r.payload
    return bytes([SYNC_REQUEST]) + body + CRC.pack(crc16(body))


def pack_answer(a: Answer) -> bytes:
    body = ANSWER_HEADER.pack(SYNC_ANSWER, a.seq, a.cmd, a.status, len(a.payload))[1:] + a.payload
    return bytes([SYNC_ANSWER]) + body + CRC.pack(crc16(body))


def parse_request(frame: bytes) -> Request:
    """A whole request frame back into a `Request` (raises `LinkError` on a bad SYNC, size or CRC)."""
    if len(frame) < REQUEST_HEADER.size + CRC.size or frame[0] != SYNC_REQUEST:
        raise LinkError("not a request frame")
    _, seq, cmd, space, addr, count = REQUEST_HEADER.unpack_from(frame)
    n = request_payload_length(cmd, space, count)
    if len(frame) != REQUEST_HEADER.size + n + CRC.size:
        raise LinkError(f"request frame of {len(frame)} bytes, expected {REQUEST_HEADER.size + n + CRC.size}")
    if crc16(frame[1:-2]) != CRC.unpack_from(frame, len(frame) - 2)[0]:
        raise LinkError("request CRC mismatch")
    return Request(seq, cmd, space, addr, count, bytes(frame[REQUEST_HEADER.size:-2]))


def parse_answer(frame: bytes) -> Answer:
    """A whole answer frame back into an `Answer` (raises `LinkError` on a bad SYNC, size or CRC)."""
    if len(frame) < ANSWER_HEADER.size + CRC.size or frame[0] != SYNC_ANSWER:
        raise LinkError("not an answer frame")
    _, seq, cmd, status, length = ANSWER_HEADER.unpack_from(frame)
    if len(frame) != ANSWER_HEADER.size + length + CRC.size:
        raise LinkError(f"answer frame of {len(frame)} bytes, its header says {ANSWER_HEADER.size + length + CRC.size}")
    if crc16(frame[1:-2]) != CRC.unpack_from(frame, len(frame) - 2)[0]:
        raise LinkError("answer CRC mismatch")
    return Answer(seq, cmd, status, bytes(frame[ANSWER_HEADER.size:-2]))


@dataclass(frozen=True)
class RunArgs:
    ext_words: int
    lat: int
    max_cycles: int

    def pack(self) -> bytes:
        return RUN_ARGS.pack(self.ext_words, self.lat, self.max_cycles)

    @classmethod
    def unpack(cls, data: bytes) -> "RunArgs":
        return cls(*RUN_ARGS.unpack(data))


@dataclass(frozen=True)
class RunResultFields:
    halted: int
    error_kind: int
    error_pc: int
    error_info: int
    counters: tuple
    ext_dirty: bytes
    spad_dirty: bytes

    def pack(self) -> bytes:
        return (RUN_RESULT.pack(self.halted, self.error_kind, self.error_pc, self.error_info, *self.counters)
                + self.ext_dirty + self.spad_dirty)

    @classmethod
    def unpack(cls, data: bytes, ext_capacity: int, spad_depth: int) -> "RunResultFields":
        ne, ns = dirty_map_bytes(ext_capacity), dirty_map_bytes(spad_depth)
        if len(data) != RUN_RESULT.size + ne + ns:
            raise LinkError(f"RUN answer of {len(data)} bytes, expected {RUN_RESULT.size + ne + ns}")
        halted, kind, pc, info, *counters = RUN_RESULT.unpack_from(data)
        rest = data[RUN_RESULT.size:]
        return cls(halted, kind, pc, info, tuple(counters), bytes(rest[:ne]), bytes(rest[ne:]))


@dataclass(frozen=True)
class HelloInfo:
    clk_hz: int
    baud: int
    ext_capacity: int
    spad_depth: int
    rom_words: int
    max_lat: int
    dirty_block: int
    max_payload: int
    chip_key: str
    version: int = PROTOCOL_VERSION

    def pack(self) -> bytes:
        key = self.chip_key.encode("ascii")
        return HELLO.pack(MAGIC, self.version, self.clk_hz, self.baud, self.ext_capacity, self.spad_depth,
                          self.rom_words, self.max_lat, self.dirty_block, self.max_payload, len(key)) + key

    @classmethod
    def unpack(cls, data: bytes) -> "HelloInfo":
        if len(data) < HELLO.size:
            raise LinkError(f"HELLO answer of {len(data)} bytes, expected at least {HELLO.size}")
        magic, version, clk, baud, ext, spad, rom, lat, block, payload, n = HELLO.unpack_from(data)
        if magic != MAGIC:
            raise LinkError(f"HELLO answer starts with {magic!r}, not {MAGIC!r}: not a GA-2 board")
        key = data[HELLO.size:]
        if len(key) != n:
            raise LinkError(f"HELLO answer's key has {len(key)} bytes, its header says {n}")
        return cls(clk, baud, ext, spad, rom, lat, block, payload, key.decode("ascii", "replace"), version)
