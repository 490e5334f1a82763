"""The board backend: programs run on a GA-2 board (the FPGA, or `ga2 board-sim`) over its serial link.

``--sim board --port DEVICE [--baud N]``: the same ``run(program, image, lat, scratchpad)`` as every other
backend, carried by the host link's protocol (`hdl.hostlink`: frames, CRC, NAK reasons, retries, dirty
maps) through pyserial. The port is anything pyserial opens: ``/dev/ttyUSB0``, the ``pty:`` path that
`ga2 board-sim` prints, or a pyserial URL.

The board keeps its memories between runs, so the backend keeps a *shadow* of them (the program memory,
the external memory and the scratchpad as the board holds them): unknown at first (everything is written
once), then only the words that differ from what a run needs are written, coalesced into WRITE frames of
at most `MAX_PAYLOAD` bytes. After RUN only the blocks the run's dirty maps name are read back (the
external memory's within EXT). A resident decode step therefore sends its mailbox (~18 words) and a few
changed instructions, not its image. A run that starts from no scratchpad (None) needs the board's
scratchpad all zero: the blocks the previous run dirtied are written back to zero.

Exchanges are stop-and-wait: one request, its answer, the next request. A request whose answer does not
come within a short, adaptive wait, comes NAK'd, or comes garbled (bad CRC, impossible header) is sent
again with the same sequence number; the board answers a repeated (seq, cmd) again without executing it
twice (`hdl.hostlink`'s rules), so a retry never writes or runs twice. A RUN may legitimately take long
(the chip runs until HALT or the cycle limit, and a simulated board is slow): while its answer is out the
RUN is sent again every wait (a *poll*: bytes that arrive while the chip runs are dropped, and after the
halt a repeat is answered from the stored result) until the board has been silent for `timeout` seconds.

Failures are one line (`BoardError`, listed in `sim.cli.user_errors`; deliberately not a `SimError`,
which the fuzzer and the checked backend take as a program's outcome): a port that cannot be opened or
goes away (a killed board-sim closes its pty: the next read fails at once), a board silent for `timeout`
seconds, a HELLO naming another chip, a frame failing `retries` times in a row.
"""
from __future__ import annotations

import collections
import select
import sys
import time
from array import array
from dataclasses import dataclass, field

from hdl.config import BOOK, ChipConfig
from hdl.hostlink import (ANSWER_HEADER, HELLO, MAX_PAYLOAD, PROTOCOL_VERSION, RUN_RESULT, SYNC_ANSWER, Answer,
                          Cmd, HelloInfo, LinkError, Request, RunArgs, RunResultFields, Space, Status,
                          dirty_map_bytes, pack_request, parse_answer, word_bytes)
from sim.backends import (MAX_CYCLES, Backend, BackendUnavailable, BadInput, DidNotHalt, ErrorStop, RunResult,
                          check_lat, check_max_cycles, image_words, program_words, scratchpad_words)

__all__ = ["BoardBackend", "BoardError", "LinkStats", "SerialLine", "DEFAULT_BAUD", "DEFAULT_TIMEOUT",
           "DEFAULT_RETRIES"]

DEFAULT_BAUD = 3_000_000
DEFAULT_TIMEOUT = 5.0           # seconds the board may stay silent while an answer is due
DEFAULT_RETRIES = 8             # repeats of one frame (NAK, garbled or lost answer) before giving up
MIN_WAIT = 0.05                 # the shortest wait for an answer before a frame is sent again (seconds)
MIN_CHUNK = 64                  # the smallest WRITE/READ payload a failing frame is cut down to (bytes)
MERGE_GAP_BYTES = 24            # two runs of changed words closer than this many bytes go in one WRITE
_MAX_ANSWER = max(MAX_PAYLOAD, RUN_RESULT.size + 2 * dirty_map_bytes(1 << 16), HELLO.size + 255)


class BoardError(RuntimeError):
    """The board cannot be used: the port, a silent or vanished board, another chip, a frame that keeps
    failing. One line; not a property of the program that was being run."""


@dataclass
class LinkStats:
    """What the link carried: requests (distinct frames), frames sent (retries and polls included),
    retries by reason, RUN polls, line bytes each way, payload bytes each way (WRITE and READ words),
    answers that were not the one awaited (stale repeats), runs, and seconds spent in exchanges."""
    requests: int = 0
    frames: int = 0
    retries: int = 0
    reasons: collections.Counter = field(default_factory=collections.Counter)
    polls: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    payload_out: int = 0
    payload_in: int = 0
    stale: int = 0
    runs: int = 0
    seconds: float = 0.0

    def copy(self) -> "LinkStats":
        c = LinkStats(**{k: v for k, v in self.__dict__.items() if k != "reasons"})
        c.reasons = collections.Counter(self.reasons)
        return c

    def minus(self, before: "LinkStats") -> dict:
        return {k: getattr(self, k) - getattr(before, k) for k in
                ("requests", "frames", "retries", "polls", "bytes_out", "bytes_in", "payload_out",
                 "payload_in", "runs", "seconds")}

    def summary(self) -> str:
        why = ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items()))
        return (f"{self.runs} runs, {self.requests} requests in {self.frames} frames, {self.retries} retries"
                f"{' (' + why + ')' if why else ''}, {self.polls} RUN polls; {self.bytes_out:,} bytes to the "
                f"board, {self.bytes_in:,} from it")


class SerialLine:
    """The byte pipe to the board: a pyserial port (`serial.serial_for_url`: a device path or a URL)."""

    def __init__(self, port: str, baud: int):
        try:
            import serial
        except ImportError:
            raise BackendUnavailable("the board backend needs pyserial: pip install pyserial") from None
        self._serial = serial
        self.port = port
        try:
            self.ser = serial.serial_for_url(port, baudrate=baud, timeout=0, write_timeout=DEFAULT_TIMEOUT)
        except (serial.SerialException, ValueError, OSError) as e:
            raise BoardError(f"cannot open the board's port {port}: {_reason(e)}") from None
        try:
            self._fd = self.ser.fileno()
        except Exception:           # a URL without a file descriptor (loop://, socket://): pyserial's timeouts
            self._fd = None

    def write(self, data: bytes, timeout: float) -> None:
        try:
            if self.ser.write_timeout != timeout:
                self.ser.write_timeout = timeout
            self.ser.write(data)
        except self._serial.SerialTimeoutException:
            raise BoardError(f"the board on {self.port} does not take bytes (write timed out after "
                             f"{timeout:g} s)") from None
        except (self._serial.SerialException, OSError) as e:
            raise BoardError(f"the board on {self.port} is gone: {_reason(e)}") from None

    def read(self, timeout: float) -> bytes:
        """What arrives within `timeout` seconds (at least one byte, or none at the timeout)."""
        try:
            if self._fd is not None:        # a device: wait with select, the port stays non-blocking
                if not select.select([self._fd], [], [], max(timeout, 0.0))[0]:
                    return b""
                data = self.ser.read(max(self.ser.in_waiting, 1))
                if not data:                # readable, and nothing there: the other side is gone
                    raise self._serial.SerialException("the device reports data and returns none")
                return data
            self.ser.timeout = max(timeout, 0.0)
            data = self.ser.read(1)
            if data:
                waiting = self.ser.in_waiting
                if waiting:
                    self.ser.timeout = 0
                    data += self.ser.read(waiting)
            return data
        except (self._serial.SerialException, OSError) as e:
            raise BoardError(f"the board on {self.port} is gone: {_reason(e)}") from None

    def reset_input(self) -> None:
        try:
            self.ser.reset_input_buffer()
        except (self._serial.SerialException, OSError) as e:
            raise BoardError(f"the board on {self.port} is gone: {_reason(e)}") from None

    def close(self) -> None:
        try:
            self.ser.close()
        except Exception:           # closing a port that already failed: nothing left to do
            pass


def _reason(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text


_NAK_NAMES = {s.value: s.name for s in Status}
_CMD_NAMES = {c.value: c.name for c in Cmd}


class Link:
    """The protocol's client side over a line (`SerialLine`, or any object with its four methods):
    sequence numbers, stop-and-wait exchanges, retries, the answer parser and the statistics."""

    def __init__(self, line, where: str, timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES,
                 min_wait: float = MIN_WAIT):
        self.line, self.where = line, where
        self.timeout, self.retries, self.min_wait = timeout, retries, min_wait
        self.seq = 0
        self.stats = LinkStats()
        self._buf = bytearray()
        self._spb = 0.0             # seconds per line byte beyond the latency (the slowest recent exchange)
        self._latency = 0.0         # seconds of a small exchange's round trip (the slowest recent one)
        self._run_rtt = 0.0         # seconds from a RUN to its answer (the longest recent one)
        self.streak = 0             # attempts failed in a row (any request): more than `retries` ends the run
        self.streak_heard = False   # whether the board sent anything during the streak
        self.chunk = MAX_PAYLOAD    # payload bytes of the WRITE and READ frames now: halved on a failure
        self.good = 0               # exchanges in a row that went through at this chunk

    def _wait(self, nbytes: int) -> float:
        """How long to wait for the answer of an exchange of `nbytes` line bytes before sending the frame
        again: three times the round trip the recent exchanges predict (`_learn`), plus `min_wait`; a
        second while nothing was learned yet (the first HELLO)."""
        if self._latency == 0 and self._spb == 0:
            return min(self.timeout, max(1.0, self.min_wait))
        return min(self.timeout, self.min_wait + 3 * (self._latency + nbytes * self._spb))

    def _learn(self, nbytes: int, seconds: float) -> None:
        """An exchange of `nbytes` line bytes took `seconds` from its (last) send to its answer: small ones
        tell the fixed latency, larger ones the time per byte beyond it (each the slowest recent one)."""
        if nbytes <= 128:
            self._latency = max(seconds, 0.9 * self._latency)
            if self._spb == 0:              # a first guess for large ones: the small one's time per byte
                self._spb = seconds / nbytes
        else:
            self._spb = max(max(seconds - self._latency, 0.0) / nbytes, 0.9 * self._spb)

    def request(self, cmd: int, space: int = 0, addr: int = 0, count: int = 0, payload: bytes = b"",
                expect: int | None = None, what: str = "", split_ok: bool = False) -> Answer | None:
        """Send one request until its ACK arrives; returns the answer. `expect` is the answer's payload
        length when known (an ACK of another length is a protocol mismatch). With `split_ok` (a WRITE or
        READ the caller can cut in two: both are idempotent, so a piece may repeat what a lost answer had
        done) the first failed attempt returns None instead of sending the frame again."""
        self.seq = (self.seq + 1) & 0xFF
        seq = self.seq
        frame = pack_request(Request(seq, cmd, space, addr, count, payload))
        name = what or _CMD_NAMES.get(cmd, str(cmd))
        self.stats.requests += 1
        t_start = heard = time.monotonic()      # heard: the last time a byte came from the board
        wait = self._wait(len(frame) + (expect or 0) + ANSWER_HEADER.size + 2)
        if cmd == Cmd.RUN:                      # a run takes its time: as long as the longest lately, twice,
            # but at most a third of the timeout: a RUN frame or answer the line loses is then polled for
            # again while the board's silence is still far from the timeout (with a wait of the whole
            # timeout, one loss would read as a silent board)
            wait = max(wait, min(2 * self._run_rtt, self.timeout / 3))
        sends = 0
        try:
            while True:
                t_send = time.monotonic()
                self.line.write(frame, self.timeout)
                sends += 1
                self.stats.frames += 1
                self.stats.bytes_out += len(frame)
                before = heard
                outcome, got, heard = self._await(seq, cmd, expect, min(t_send + wait, heard + self.timeout), heard)
                now = time.monotonic()
                if outcome == "answer" and got.status == Status.ACK:
                    if expect is not None and len(got.payload) != expect:
                        raise BoardError(f"the board on {self.where} answered {name} with {len(got.payload)} "
                                         f"bytes, expected {expect}: not this protocol version")
                    if cmd != Cmd.RUN:
                        self._learn(len(frame) + ANSWER_HEADER.size + 2 + len(got.payload), now - t_send)
                    else:
                        # the run's time: from the first send if that one was answered; after a lost frame
                        # or answer only the last send's round trip (the waits spent on the loss are not
                        # the run's: counted in, each RUN needing a poll would double the next one's wait)
                        took = now - (t_start if sends == 1 else t_send)
                        self._run_rtt = max(took, 0.9 * self._run_rtt)
                    self.streak, self.streak_heard = 0, False
                    return got
                self.streak_heard |= heard != before
                if outcome == "timeout":
                    if now - heard >= self.timeout:
                        raise BoardError(f"no answer from the board on {self.where} for {self.timeout:g} s "
                                         f"(waiting for {name}): is it running, on this port, at this baud?")
                    if cmd == Cmd.RUN:
                        self.stats.polls += 1       # the chip may still be running: ask again
                        continue
                    last = "no answer"
                elif outcome == "garbled":
                    last = "garbled answer"
                else:
                    last = f"NAK {_NAK_NAMES.get(got.status, got.status)}"
                self.streak += 1
                if self.streak > self.retries:
                    if not self.streak_heard:
                        raise BoardError(f"no answer from the board on {self.where} (waiting for {name}; "
                                         f"{self.streak} frames unanswered): is it running, on this port, at "
                                         f"this baud?")
                    raise BoardError(f"the board on {self.where}: {self.streak} frames failed in a row, the last "
                                     f"{name} ({last}); giving up after {self.retries} retries")
                self.stats.retries += 1
                self.stats.reasons[last] += 1
                if split_ok:
                    return None
        finally:
            self.stats.seconds += time.monotonic() - t_start

    def _await(self, seq: int, cmd: int, expect: int | None, until: float, heard: float):
        """Read until the answer to (seq, cmd) arrives ("answer", the Answer), a garbled frame was seen and
        nothing more is buffered ("garbled", None), or `until` passes ("timeout", None). Also returns the
        time the board was last heard from."""
        garbled, looked = False, False
        while True:
            while True:
                kind, a = self._next_frame(seq, cmd, expect)
                if kind is None:
                    break
                if kind == "garbled":
                    garbled = True
                elif a.seq == seq and a.cmd == cmd:
                    return "answer", a, heard
                else:
                    self.stats.stale += 1           # a repeat's answer to an earlier frame: already taken
            if garbled:
                return "garbled", None, heard
            now = time.monotonic()
            if looked and now >= until:     # (a noisy line that never stops sending ends here too)
                if self._buf:               # a frame begun and not finished in time: one that lost bytes
                    del self._buf[:1]
                return "timeout", None, heard
            data = self.line.read(max(until - now, 0.0))    # at least one look, even when the write was slow
            looked = True
            if data:
                heard = time.monotonic()
                self.stats.bytes_in += len(data)
                self._buf += data

    def _next_frame(self, seq: int, cmd: int, expect: int | None):
        """The next whole answer in the buffer: ("answer", Answer), ("garbled", None) after dropping a
        frame that fails its CRC (hunting resumes one byte after its SYNC), or (None, None) when more
        bytes are needed. A header is believed only if it could be the answer awaited (seq and cmd, and
        a length of 0 or `expect`) or a repeated answer to one of the eight requests before."""
        buf = self._buf
        while True:
            i = buf.find(SYNC_ANSWER)
            if i < 0:
                buf.clear()
                return None, None
            if i:
                del buf[:i]
            if len(buf) < ANSWER_HEADER.size:
                return None, None
            _, a_seq, a_cmd, status, length = ANSWER_HEADER.unpack_from(buf)
            if a_seq == seq and a_cmd == cmd:
                plausible = status in _NAK_NAMES and (length == 0 or (status == Status.ACK and
                                                                      (expect is None or length == expect)))
            else:
                plausible = (1 <= (seq - a_seq) & 0xFF <= 8 and a_cmd in _CMD_NAMES and status in _NAK_NAMES
                             and length <= _MAX_ANSWER and (status == Status.ACK or length == 0))
            if not plausible:
                del buf[:1]                         # not a header: a 0x5A inside other bytes, or damaged
                continue
            need = ANSWER_HEADER.size + length + 2
            if len(buf) < need:
                return None, None
            try:
                a = parse_answer(bytes(buf[:need]))
            except LinkError:
                del buf[:1]
                return "garbled", None
            del buf[:need]
            return "answer", a


class BoardBackend(Backend):
    """Runs programs on a GA-2 board over its serial link (module docstring).

    Parameters
    ----------
    port : str
        The board's serial port (a device path, the ``pty:`` path of `ga2 board-sim`, or a pyserial URL).
    baud : int
        The line's rate, as the board was built for (a pseudo-terminal ignores it).
    timeout : float
        Seconds the board may stay silent while an answer is due before the run fails.
    retries : int
        Times one frame is sent again (NAK, garbled or lost answer) before the run fails.
    max_cycles : int
        The cycle limit handed to every RUN (`DidNotHalt` past it), as the other backends'.
    config : hdl.config.ChipConfig
        The chip the programs are for; the board's HELLO must name the same one.
    line : object, optional
        The byte pipe instead of opening `port` (tests): ``write(data, timeout)``, ``read(timeout)``,
        ``reset_input()``, ``close()``.
    min_wait : float, optional
        The shortest wait for an answer before a frame is sent again (`MIN_WAIT`; tests shorten it).

    Attributes
    ----------
    stats : LinkStats
        Everything the link carried so far (``link_summary()`` says it in one line).
    run_log : list of dict
        Per run: the `LinkStats.minus` of the run (bytes, frames, retries, payload), ``words_written``
        and ``words_read`` per space, and the run's cycles.
    hello : hdl.hostlink.HelloInfo or None
        What the board said about itself (after the first run or `connect`).
    """
    name = "board"

    def __init__(self, port: str | None = None, baud: int = DEFAULT_BAUD, timeout: float = DEFAULT_TIMEOUT,
                 retries: int = DEFAULT_RETRIES, max_cycles: int = MAX_CYCLES, *, config: ChipConfig = BOOK,
                 line=None, min_wait: float = MIN_WAIT):
        if port is None and line is None:
            raise BackendUnavailable("--sim board needs --port DEVICE (the board's serial port, or the pty: "
                                     "path printed by ga2 board-sim)")
        if isinstance(baud, bool) or not isinstance(baud, int) or baud <= 0:
            raise BadInput(f"baud = {baud!r} must be a positive whole number")
        if not timeout > 0:
            raise BadInput(f"timeout = {timeout!r} must be a positive number of seconds")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise BadInput(f"retries = {retries!r} must be a whole number >= 0")
        self.port = port if port is not None else "(test line)"
        self.baud, self.timeout, self.retries = baud, float(timeout), retries
        self.max_cycles = check_max_cycles(max_cycles)
        self.config = config
        self._line = line
        self.min_wait = min_wait
        self.link: Link | None = None
        self.hello: HelloInfo | None = None
        self.shadow: dict[Space, list] = {}
        self.run_log: list[dict] = []

    # ---- the session --------------------------------------------------------------------------------
    @property
    def stats(self) -> LinkStats:
        return self.link.stats if self.link is not None else LinkStats()

    def connect(self) -> HelloInfo:
        """Open the port and say HELLO (once): the board's build, checked against `config`."""
        if self.hello is not None:
            return self.hello
        if self.link is None:
            line = self._line if self._line is not None else SerialLine(self.port, self.baud)
            self.link = Link(line, self.port, self.timeout, self.retries, self.min_wait)
        self.link.line.reset_input()
        ans = self.link.request(Cmd.HELLO)
        try:
            info = HelloInfo.unpack(ans.payload)
        except LinkError as e:
            raise BoardError(f"the board on {self.port}: {e}") from None
        if info.version != PROTOCOL_VERSION:
            raise BoardError(f"the board on {self.port} speaks link protocol version {info.version}; this host "
                             f"speaks {PROTOCOL_VERSION}")
        if info.chip_key != self.config.key():
            raise BoardError(f"the board on {self.port} carries the chip {_chip_name(info.chip_key)}, and this run "
                             f"is for the chip {self.config.spec()} (give --chip to match, or start the board "
                             f"with the other chip)")
        self.hello = info
        self.shadow = {Space.PROGRAM: [None] * info.rom_words, Space.EXT: [None] * info.ext_capacity,
                       Space.SPAD: [None] * info.spad_depth}
        return info

    def close(self) -> None:
        if self.link is not None:
            self.link.line.close()
        self.link = self.hello = None

    def link_summary(self) -> str:
        """One line: what the link carried (runs, frames, retries and why, polls, bytes each way)."""
        return f"board link on {self.port}: {self.stats.summary()}"

    # ---- a run --------------------------------------------------------------------------------------
    def run(self, program, image, lat: int = 8, scratchpad=None) -> RunResult:
        words = program_words(program)
        ext = image_words(image)
        check_lat(lat)
        spad = scratchpad_words(scratchpad, self.config.spad_depth)
        try:
            info = self.connect()
        except BoardError:
            self.close()
            raise
        if len(ext) > info.ext_capacity:
            raise BadInput(f"the external memory image has {len(ext)} words; the board's holds "
                           f"{info.ext_capacity}")
        if lat > info.max_lat or (self.config.gather and lat != self.config.lat):
            allowed = f"only {self.config.lat}" if self.config.gather else f"1..{info.max_lat}"
            raise BadInput(f"lat = {lat}: the board's external memory takes {allowed}")
        if len(words) > info.rom_words:
            raise BadInput(f"the program has {len(words)} instructions; the board's program memory holds "
                           f"{info.rom_words}")
        try:
            return self._run(words, ext, lat, spad, info)
        except BoardError:
            self.close()                # the board's memories are unknown now: a new session starts afresh
            raise

    def _run(self, words, ext, lat, spad, info) -> RunResult:
        link = self.link
        before = link.stats.copy()
        written = {}
        written["program"] = self._sync(Space.PROGRAM, words + [0] * (info.rom_words - len(words)))
        written["ext"] = self._sync(Space.EXT, ext)
        written["spad"] = self._sync(Space.SPAD, spad if spad is not None else [0] * info.spad_depth)
        ne, ns = dirty_map_bytes(info.ext_capacity), dirty_map_bytes(info.spad_depth)
        ans = link.request(Cmd.RUN, payload=RunArgs(len(ext), lat, self.max_cycles).pack(),
                           expect=RUN_RESULT.size + ne + ns)
        link.stats.runs += 1
        res = RunResultFields.unpack(ans.payload, info.ext_capacity, info.spad_depth)
        read = {"ext": self._read_dirty(Space.EXT, res.ext_dirty, len(ext)),
                "spad": self._read_dirty(Space.SPAD, res.spad_dirty, info.spad_depth)}
        self.run_log.append({**link.stats.minus(before), "words_written": written, "words_read": read,
                             "cycles": res.counters[0] if res.halted else None})
        if not res.halted:             # the board's watchdog stopped it (a RUN resets the chip first anyway)
            raise DidNotHalt(f"did not halt within {self.max_cycles} cycles (on the board)")
        error = None
        if res.error_kind:
            if res.error_kind not in ErrorStop.KINDS:
                raise BoardError(f"the board on {self.port} reports error kind {res.error_kind}, which this host "
                                 f"does not know")
            error = ErrorStop(ErrorStop.KINDS[res.error_kind], res.error_pc, res.error_info)
        shadow = self.shadow
        return RunResult(ext=list(shadow[Space.EXT][:len(ext)]), counters=list(res.counters),
                         scratchpad=list(shadow[Space.SPAD]), error=error)

    def measure_link(self, words: int | None = None, seed: int = 1) -> dict:
        """Time the link: WRITE `words` words (default: the whole scratchpad) of random data to the board's
        scratchpad and READ them back, in the largest frames. Returns the payload bytes per second each
        way and the line bytes per second (both directions together, headers and answers included). The
        shadow follows: the next run writes back whatever it needs."""
        import random
        info = self.connect()
        n = min(words or info.spad_depth, info.spad_depth)
        gen = random.Random(seed)
        want = [gen.getrandbits(32) for _ in range(n)]
        shadow = self.shadow[Space.SPAD]
        shadow[:n] = [None] * n                     # written whole, as one stream
        stats = self.link.stats
        before = stats.copy()
        t0 = time.perf_counter()
        self._sync(Space.SPAD, want)
        t1 = time.perf_counter()
        got = [0] * n

        def done(lo, hi, answer):
            got[lo:hi] = _unpack(answer.payload, 4)
        self._transfer(Cmd.READ, Space.SPAD, [(0, n)], done)
        t2 = time.perf_counter()
        if got != want:
            raise BoardError(f"the board on {self.port} read back other words than were written to its scratchpad")
        moved = stats.minus(before)
        return {"words": n, "payload_out_per_s": 4 * n / (t1 - t0), "payload_in_per_s": 4 * n / (t2 - t1),
                "line_bytes_per_s": (moved["bytes_out"] + moved["bytes_in"]) / (t2 - t0),
                "seconds": t2 - t0, "retries": moved["retries"]}

    # ---- the shadow ---------------------------------------------------------------------------------
    def _sync(self, space: Space, want: list[int]) -> int:
        """Write the words of `want` (from address 0) that the board does not hold; returns how many."""
        shadow = self.shadow[space]
        n = len(want)
        if shadow[:n] == want:
            return 0
        gap = max(1, MERGE_GAP_BYTES // word_bytes(space))
        changed = [i for i in range(n) if shadow[i] != want[i]]
        spans = []
        lo = hi = changed[0]
        for i in changed[1:]:
            if i - hi <= gap:
                hi = i
            else:
                spans.append((lo, hi + 1))
                lo = hi = i
        spans.append((lo, hi + 1))

        def done(lo, hi, answer):
            shadow[lo:hi] = want[lo:hi]
        return self._transfer(Cmd.WRITE, space, spans, done, want)

    def _read_dirty(self, space: Space, bits: bytes, limit: int) -> int:
        """Read back the blocks marked in `bits` (below word `limit`) into the shadow; returns the words."""
        if not any(bits):
            return 0
        block = self.hello.dirty_block
        shadow = self.shadow[space]
        spans = []
        for b in range(len(bits) * 8):
            if bits[b // 8] >> (b % 8) & 1:
                lo, hi = b * block, min((b + 1) * block, limit)
                if lo >= hi:
                    continue
                if spans and spans[-1][1] == lo:
                    spans[-1] = (spans[-1][0], hi)
                else:
                    spans.append((lo, hi))

        def done(lo, hi, answer):
            self.link.stats.payload_in += len(answer.payload)
            shadow[lo:hi] = _unpack(answer.payload, word_bytes(space))
        return self._transfer(Cmd.READ, space, spans, done)

    def _transfer(self, cmd: Cmd, space: Space, spans, done, want=None) -> int:
        """WRITE (the words of `want`) or READ the word ranges `spans` of `space` in frames of at most the
        link's current chunk; a frame that fails is cut in two (down to `MIN_CHUNK` bytes) and the chunk
        halves, sixteen good frames in a row double it again (up to the board's max_payload). `done(lo, hi,
        answer)` takes each acknowledged range. Returns the words moved."""
        link = self.link
        wb = word_bytes(space)
        top = self.hello.max_payload
        queue = collections.deque(spans)
        moved = 0
        verb = "WRITE" if cmd == Cmd.WRITE else "READ"
        while queue:
            lo, hi = queue.popleft()
            per = max(1, min(link.chunk, top) // wb)
            if hi - lo > per:
                queue.appendleft((lo + per, hi))
                hi = lo + per
            payload = _pack(want[lo:hi], wb) if cmd == Cmd.WRITE else b""
            answer = link.request(cmd, space, lo, hi - lo, payload, expect=0 if cmd == Cmd.WRITE else (hi - lo) * wb,
                                  what=f"{verb} of {hi - lo} {space.name} words at {lo}",
                                  split_ok=(hi - lo) * wb > MIN_CHUNK)
            if answer is None:
                link.chunk = max(MIN_CHUNK, min(link.chunk, top) // 2)
                link.good = 0
                queue.appendleft((lo, hi))
                continue
            link.good += 1
            if link.good >= 16 and link.chunk < top:
                link.chunk, link.good = min(top, 2 * link.chunk), 0
            if cmd == Cmd.WRITE:
                link.stats.payload_out += len(payload)
            done(lo, hi, answer)
            moved += hi - lo
        return moved


def _pack(words: list[int], wb: int) -> bytes:
    """Words as the link carries them: `wb` bytes each, little-endian."""
    if wb == 4 and array("I").itemsize == 4:
        a = array("I", words)
        if sys.byteorder == "big":
            a.byteswap()
        return a.tobytes()
    return b"".join(w.to_bytes(wb, "little") for w in words)


def _unpack(data: bytes, wb: int) -> list[int]:
    if wb == 4 and array("I").itemsize == 4:
        a = array("I", data)
        if sys.byteorder == "big":
            a.byteswap()
        return a.tolist()
    return [int.from_bytes(data[k:k + wb], "little") for k in range(0, len(data), wb)]


def _chip_name(key: str) -> str:
    """The ``--chip`` spec of a board's chip key, or the key itself when this host cannot parse it."""
    from hdl.config import ChipSpecError, parse_chip
    try:
        return parse_chip(key).spec()
    except ChipSpecError:
        return f"with the key {key!r} (not a chip this host knows)"
