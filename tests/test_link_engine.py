# amaranth: UnusedElaboratable=no
"""hdl.link_engine through hdl.board_top.BoardCore's byte streams (no UART), against sim.board.model.

Every frame goes to the hardware and to `BoardModel` (which runs the chip's programs on the reference
machine); the answers must be equal byte for byte, except a RUN's dirty maps, where the hardware's
must contain every block the model saw change (it marks every block the chip wrote). The memories are
compared through READ answers, so a NAK that wrote something, a retry executed twice or a run that
differs from the reference shows up as a different answer.

One simulation a session (the chip's elaboration and the simulator's start cost seconds): a session is a
list of steps, run in one testbench, whose answers the tests then compare.
"""
import random
from dataclasses import dataclass, replace

import pytest
from amaranth.sim import Simulator

from hdl import isa
from hdl.board_top import BoardCore
from hdl.config import BOOK
from hdl.hostlink import (ANSWER_HEADER, MAX_BOARD_LAT, MAX_PAYLOAD, RUN_RESULT, Cmd, Request,
                          RunArgs, RunResultFields, Space, Status, crc16, pack_request,
                          parse_answer, word_bytes)
from hdl.link_engine import crc16_step, gap_cycles, struct_fields
from sim.board.model import BoardModel

CFG = replace(BOOK, ext_words=2048)         # the book's chip; a smaller external memory: shorter maps
CLK, BAUD = 1_000_000, 250_000              # four cycles a bit: the gap timer is 2,560 cycles
SPACING = 3                                 # cycles from one request byte to the next


# ---- sessions ----

@dataclass
class Frame:
    """Send `data`, then wait until the engine is idle again; `during_run`: bytes sent from `after`
    cycles after the frame's RUN started (dropped by the hardware, never given to the model)."""
    data: bytes
    during_run: bytes = b""
    after: int = 0


@dataclass
class Send:
    """Send `data` and go on at once (a frame cut short, or its first part)."""
    data: bytes


@dataclass
class Idle:
    """`cycles` of silence on the line (longer than the gap timer: the model's `gap()`)."""
    cycles: int


def run_session(config, steps, clk_hz=CLK, baud=BAUD, budget=200_000):
    """Run `steps` on a BoardCore in one simulation; the hardware's answer bytes per step."""
    core = BoardCore(config, clk_hz, baud)
    got = []
    answers = []

    async def collect(ctx):
        async for _, payload in ctx.posedge(core.o.valid).sample(core.o.payload):
            got.append(payload)

    async def drive(ctx):
        ctx.set(core.o.ready, 1)

        async def send(data):
            for b in data:
                ctx.set(core.i.payload, b)
                ctx.set(core.i.valid, 1)
                while True:
                    ready = ctx.get(core.i.ready)
                    await ctx.tick()
                    if ready:
                        break
                ctx.set(core.i.valid, 0)
                await ctx.tick().repeat(SPACING - 1)

        async def idle(limit):
            for _ in range(limit):
                if not ctx.get(core.busy):
                    break
                await ctx.tick()
            else:
                raise AssertionError(f"the engine still busy after {limit} cycles")
            await ctx.tick().repeat(4)

        for step in steps:
            start = len(got)
            if isinstance(step, Idle):
                await ctx.tick().repeat(step.cycles)
            elif isinstance(step, Send):
                await send(step.data)
            else:
                await send(step.data)
                if step.during_run:
                    while not ctx.get(core.running):
                        await ctx.tick()
                    await ctx.tick().repeat(step.after)
                    assert ctx.get(core.running), "the RUN was over before the bytes sent during it"
                    await send(step.during_run)
                await idle(budget)
            answers.append(bytes(got[start:]))

    sim = Simulator(core)
    sim.add_clock(1e-6)
    sim.add_testbench(collect, background=True)
    sim.add_testbench(drive)
    sim.run()
    return answers


def model_answers(config, steps, clk_hz=CLK, baud=BAUD):
    model = BoardModel(config, clk_hz, baud)
    out = []
    for step in steps:
        if isinstance(step, Idle):
            if step.cycles >= gap_cycles(clk_hz, baud):
                model.gap()
            out.append(b"")
        else:
            out.append(model.feed(step.data))
    return out, model


def split(data):
    """Answer frames of a byte string."""
    frames = []
    while data:
        n = ANSWER_HEADER.size + int.from_bytes(data[4:6], "little") + 2
        frames.append(data[:n])
        data = data[n:]
    return frames


def compare(hw, model, config):
    """Equal answers, a RUN's dirty maps excepted: the hardware's must cover the model's."""
    hf, mf = split(hw), split(model)
    assert len(hf) == len(mf), f"{len(hf)} answers from the hardware, {len(mf)} from the model"
    for h, m in zip(hf, mf):
        ha, ma = parse_answer(h), parse_answer(m)        # both CRCs checked here
        if ma.cmd == Cmd.RUN and ma.status == Status.ACK and ma.payload[0] == 1:
            assert (ha.seq, ha.cmd, ha.status) == (ma.seq, ma.cmd, ma.status)
            hr = RunResultFields.unpack(ha.payload, config.ext_words, config.spad_depth)
            mr = RunResultFields.unpack(ma.payload, config.ext_words, config.spad_depth)
            assert (hr.halted, hr.error_kind, hr.error_pc, hr.error_info, hr.counters) == \
                   (mr.halted, mr.error_kind, mr.error_pc, mr.error_info, mr.counters)
            for hm, mm in ((hr.ext_dirty, mr.ext_dirty), (hr.spad_dirty, mr.spad_dirty)):
                assert all(a & b == b for a, b in zip(hm, mm)), f"dirty map {hm.hex()} misses {mm.hex()}"
        else:
            assert h == m, f"hardware {h.hex()} != model {m.hex()}"


def check(config, steps, **kw):
    hw = run_session(config, steps, **kw)
    model, board = model_answers(config, steps)
    for k, (h, m) in enumerate(zip(hw, model)):
        try:
            compare(h, m, config)
        except AssertionError as e:
            raise AssertionError(f"step {k} ({steps[k]}): {e}") from None
    return hw, board


# ---- frames ----

class Host:
    """Sequence numbers and packing, as a host would."""

    def __init__(self):
        self.seq = 0

    def frame(self, cmd, space=0, addr=0, count=0, payload=b"", seq=None):
        if seq is None:
            self.seq = (self.seq + 1) & 0xFF
            seq = self.seq
        return pack_request(Request(seq, cmd, space, addr, count, payload))

    def write(self, space, addr, words, seq=None):
        wb = word_bytes(space)
        return self.frame(Cmd.WRITE, space, addr, len(words),
                          b"".join(w.to_bytes(wb, "little") for w in words), seq)

    def read(self, space, addr, count=1):
        return self.frame(Cmd.READ, space, addr, count)

    def run(self, ext_words, lat, max_cycles=100_000, seq=None):
        return self.frame(Cmd.RUN, payload=RunArgs(ext_words, lat, max_cycles).pack(), seq=seq)


def program(*instrs):
    return [i.word for i in instrs] + [isa.halt().word]


# doubles ext[100] (as four int8 lanes): a second execution would double it again
DOUBLE = program(isa.ld(0, 100, 1), isa.vadd(1, 0, 0, 1), isa.st(1, 100, 1))


# ---- tests ----

@pytest.mark.timeout(60)
def test_crc_network_is_hostlink_crc16():
    from amaranth.hdl import Signal
    from tests.simutil import run
    from amaranth.hdl import Module
    rng = random.Random(5)
    cases = [(0xFFFF, 0x31)] + [(rng.randrange(1 << 16), rng.randrange(256)) for _ in range(40)]
    crc, byte, out = Signal(16), Signal(8), Signal(16)
    m = Module()
    m.d.comb += out.eq(crc16_step(crc, byte))

    async def bench(ctx):
        for c, b in cases:
            ctx.set(crc, c)
            ctx.set(byte, b)
            assert ctx.get(out) == crc16(bytes([b]), c)
    run(m, bench, clocked=False)
    assert crc16(b"123456789") == 0x29B1


def test_struct_fields():
    assert struct_fields(RUN_RESULT) == [(1, 1), (1, 1), (2, 1), (4, 1), (8, 5)]


@pytest.mark.timeout(120)
def test_hello_write_read_both_ends_and_naks():
    h = Host()
    last = {s: CFG.rom_words - 1 if s == Space.PROGRAM else (CFG.ext_words if s == Space.EXT else CFG.spad_depth) - 1
            for s in Space}
    rng = random.Random(1)
    steps = [Frame(h.frame(Cmd.HELLO))]
    for s in Space:
        bits = 8 * word_bytes(s)
        for addr in (0, last[s]):
            steps.append(Frame(h.write(s, addr, [rng.getrandbits(bits)])))
            steps.append(Frame(h.read(s, addr)))
    # a READ of several words at the end of EXT, and a WRITE of many words of SPAD
    steps.append(Frame(h.write(Space.SPAD, 40, [rng.getrandbits(32) for _ in range(20)])))
    steps.append(Frame(h.read(Space.SPAD, 38, 24)))
    steps.append(Frame(h.read(Space.EXT, CFG.ext_words - 3, 3)))
    # NAKs: each followed by a READ of what it would have written
    bad = bytearray(h.write(Space.EXT, 5, [0x12345678]))
    bad[-1] ^= 0x40
    steps += [Frame(bytes(bad)), Frame(h.read(Space.EXT, 5))]                             # BAD_CRC
    steps += [Frame(h.frame(Cmd.WRITE, Space.SPAD, 7, 0)), Frame(h.read(Space.SPAD, 7))]  # BAD_LENGTH: count 0
    steps += [Frame(h.frame(Cmd.READ, Space.EXT, 0, 0))]                                  # READ count 0
    steps += [Frame(h.frame(Cmd.READ, Space.EXT, 0, MAX_PAYLOAD // 4 + 1))]               # READ too long
    too_long = h.frame(Cmd.WRITE, Space.PROGRAM, 0, MAX_PAYLOAD // 16 + 1,
                       bytes((MAX_PAYLOAD // 16 + 1) * 16))
    steps += [Frame(too_long[:8])]                                                       # NAK'd from its header
    steps += [Frame(h.write(Space.EXT, CFG.ext_words - 1, [1, 2])),                       # BAD_ADDRESS
              Frame(h.read(Space.EXT, CFG.ext_words - 1))]
    steps += [Frame(h.write(Space.PROGRAM, CFG.rom_words, [3])), Frame(h.read(Space.PROGRAM, CFG.rom_words - 1))]
    steps += [Frame(h.write(Space.SPAD, CFG.spad_depth - 1, [4, 5])),
              Frame(h.read(Space.SPAD, CFG.spad_depth - 1))]
    steps += [Frame(h.read(Space.SPAD, 0xFFFF, 2))]                                        # wraps 16 bits
    steps += [Frame(h.frame(9)), Frame(h.frame(0))]                                       # BAD_COMMAND
    steps += [Frame(h.write(3, 0, [])), Frame(h.frame(Cmd.READ, 3, 0, 1))]                 # unknown space
    for args in ((0, 1, 10), (CFG.ext_words + 1, 1, 10), (16, 0, 10), (16, MAX_BOARD_LAT + 1, 10), (16, 1, 0)):
        steps.append(Frame(h.run(*args)))                                                 # BAD_ARGUMENT
    steps.append(Frame(h.read(Space.EXT, 100)))
    # garbage before a frame is hunted through
    steps.append(Frame(bytes([0x00, 0x5A, 0x13]) + h.read(Space.SPAD, 40)))
    hw, board = check(CFG, steps)
    statuses = [parse_answer(a).status for step in hw for a in split(step)]
    for st in Status:
        assert st in statuses, f"no answer with status {st.name}"
    assert board.runs == 0


@pytest.mark.timeout(120)
def test_runs_retries_gap_and_bytes_while_running():
    h = Host()
    rng = random.Random(2)
    ext = [rng.getrandbits(32) & 0x3F3F3F3F for _ in range(128)]
    spad = [rng.getrandbits(32) for _ in range(16)]
    steps = [Frame(h.write(Space.EXT, 0, ext)), Frame(h.write(Space.SPAD, 200, spad))]
    # a program that doubles ext[100]; the RUN retried (same seq): not run again
    steps.append(Frame(h.write(Space.PROGRAM, 0, DOUBLE)))
    seq = h.seq + 1
    steps += [Frame(h.run(2048, 8, seq=seq)), Frame(h.run(2048, 8, seq=seq)), Frame(h.read(Space.EXT, 100)),
              Frame(h.run(2048, 8)), Frame(h.read(Space.EXT, 100))]                        # a new seq: runs
    # a retried WRITE: answered, not written (its payload differs, so a second write would show)
    seq = h.seq + 1
    steps += [Frame(h.write(Space.EXT, 10, [111], seq=seq)), Frame(h.write(Space.EXT, 10, [222], seq=seq)),
              Frame(h.read(Space.EXT, 10))]
    # LD/ST around the end of EXT (poison and dropped writes), the scratchpad kept from the WRITE
    # above (resident mode), every LAT class of the delay line
    prog = program(isa.ld(300, 56, 12), isa.st(200, 60, 8), isa.vadd(320, 300, 200, 12), isa.st(320, 0, 12),
                   isa.ld(400, 0, 4))
    steps.append(Frame(h.write(Space.PROGRAM, 0, prog)))
    for lat in (1, 2, 3, 17, MAX_BOARD_LAT):
        steps += [Frame(h.run(64, lat)), Frame(h.read(Space.EXT, 0, 16)), Frame(h.read(Space.EXT, 56, 12)),
                  Frame(h.read(Space.SPAD, 300, 24))]
    # RESET, and a retried RESET
    seq = h.seq + 1
    steps += [Frame(h.frame(Cmd.RESET, seq=seq)), Frame(h.frame(Cmd.RESET, seq=seq))]
    # the gap timer drops a frame cut short; the next frame is answered
    steps += [Send(h.write(Space.EXT, 3, [0xAAAA])[:11]), Idle(gap_cycles(CLK, BAUD) + 20),
              Frame(h.read(Space.EXT, 3))]
    # a pause shorter than the gap does not drop a frame
    whole = h.write(Space.EXT, 4, [0xBBBB])
    steps += [Send(whole[:9]), Idle(gap_cycles(CLK, BAUD) - 50), Frame(whole[9:]), Frame(h.read(Space.EXT, 4))]
    # bytes sent while the chip runs are dropped (a whole WRITE frame here)
    slow = program(*[isa.ld(500 + 64 * k, 0, 64) for k in range(6)])
    steps.append(Frame(h.write(Space.PROGRAM, 0, slow)))
    steps += [Frame(h.run(2048, MAX_BOARD_LAT), during_run=h.write(Space.EXT, 7, [0xCCCC]), after=40),
              Frame(h.read(Space.EXT, 7)), Frame(h.read(Space.SPAD, 500, 8))]
    # HELLO starts a session: the same (seq, cmd) as the last frame is not a retry after it
    seq = h.seq + 1
    steps += [Frame(h.write(Space.EXT, 11, [5], seq=seq)), Frame(h.frame(Cmd.HELLO)),
              Frame(h.write(Space.EXT, 11, [6], seq=seq)), Frame(h.read(Space.EXT, 11))]
    hw, board = check(CFG, steps)
    assert board.runs == 2 + 5 + 1


@pytest.mark.timeout(60)
def test_watchdog_stops_the_chip_at_the_references_limit():
    from sim.backends.reference import ReferenceMachine
    prog = program(*[isa.ld(64 * k, 0, 64) for k in range(4)])
    total = ReferenceMachine(check=False, config=CFG).run(prog, [0] * 2048, 8).counters[0]
    h = Host()
    steps = [Frame(h.write(Space.PROGRAM, 0, prog)), Frame(h.write(Space.EXT, 0, list(range(1, 65)))),
             Frame(h.run(2048, 8, max_cycles=total - 1)),       # one cycle short: stopped
             Frame(h.run(2048, 8, max_cycles=total)),           # exactly enough: halts
             Frame(h.run(2048, 8, max_cycles=100)),             # stopped mid-LD
             Frame(h.write(Space.EXT, 0, [7] * 64)), Frame(h.run(2048, 8)), Frame(h.read(Space.SPAD, 0, 256))]
    hw = run_session(CFG, steps)
    model, _ = model_answers(CFG, steps)
    for k, limit in ((2, total - 1), (4, 100)):
        stopped = parse_answer(hw[k])
        r = RunResultFields.unpack(stopped.payload, CFG.ext_words, CFG.spad_depth)
        assert stopped.status == Status.ACK and r.halted == 0
        assert r.counters[0] == limit                    # cyc_total when the limit stopped it
        assert parse_answer(model[k]).payload[0] == 0
    # halts within its limit; after a watchdog stop the chip runs again, to the reference's result
    for k in (3, 5, 6, 7):
        compare(hw[k], model[k], CFG)


@pytest.mark.timeout(90)
def test_gather_chip_error_state_and_its_one_lat():
    cfg = replace(CFG, gather=1)
    h = Host()
    table, dst, base = 900, 1000, 0
    ext = [(0xB000 + k) for k in range(1024)]
    steps = [Frame(h.write(Space.EXT, 0, ext[:256])), Frame(h.write(Space.EXT, 256, ext[256:512])),
             Frame(h.write(Space.SPAD, table, [5, 6, 20]))]
    for table_len, lo, hi in ((2, 2, 12),          # row 8 needs entry 2 of a 2-entry table: ROW
                              (3, 6, 12),          # entry 2 is page 20 of a 16-page pool: PAGE
                              (2, 1, 7)):          # no error: rows 1..6 gathered
        prog = program(isa.ld(0, 0, 4),
                       isa.gather(dst, table, table_len, base, 2, lo, hi, 4, 16),
                       isa.ld(4, 0, 4))
        steps += [Frame(h.write(Space.PROGRAM, 0, prog)), Frame(h.run(2048, cfg.lat)),
                  Frame(h.read(Space.SPAD, dst, 160)), Frame(h.read(Space.SPAD, 0, 8))]
    steps += [Frame(h.run(2048, cfg.lat - 1)), Frame(h.run(2048, cfg.lat + 1))]     # BAD_ARGUMENT
    hw, board = check(cfg, steps)
    kinds = [RunResultFields.unpack(parse_answer(a).payload, cfg.ext_words, cfg.spad_depth).error_kind
             for a in hw if a and parse_answer(a).cmd == Cmd.RUN and parse_answer(a).status == Status.ACK]
    assert kinds == [1, 2, 0]
    assert [parse_answer(a).status for a in hw[-2:]] == [Status.BAD_ARGUMENT] * 2


@pytest.mark.timeout(180)
def test_lanes_chip_dirty_map_has_every_lanes_block():
    """A chip with ``spad_lanes`` = 4 (docs/spad-lanes.md): the MM drain writes up to four consecutive
    words a cycle, lane i at waddr + i. Rows of C that straddle a 16-word block (and one that wraps past
    the scratchpad's last word) leave blocks that only lanes 1..3 write: the hardware's scratchpad map must
    be exactly the blocks the MM wrote, and the READs of C equal the reference's."""
    cfg = replace(CFG, mm_overlap=1, spad_lanes=4)
    depth = cfg.spad_depth
    h = Host()
    rng = random.Random(23)
    a_at, b_at, K = 3000, 3200, 8
    steps = [Frame(h.write(Space.SPAD, a_at, [rng.randint(-128, 127) & 0xFFFFFFFF for _ in range(4 * K)])),
             Frame(h.write(Space.SPAD, b_at, [rng.randint(-128, 127) & 0xFFFFFFFF for _ in range(4 * K)]))]
    # (dst, ldc, M, N): row m is dst + m*ldc .. + N-1, all in one cycle when N <= 4
    cases = [(14, 32, 4, 4),            # 14,15 | 16,17: blocks 1, 3, 5, 7 written by lanes 2 and 3 only
             (302, 16, 3, 3),           # 302,303 | 304: block 21 by lane 2 only
             (depth - 3, 5, 2, 4)]      # depth-3 .. depth-1 | 0: lane 3 wraps to word 0
    runs = []
    for dst, ldc, M, N in cases:
        steps += [Frame(h.write(Space.PROGRAM, 0, program(isa.mm(dst, a_at, b_at, M, K, N, ldc=ldc)))),
                  Frame(h.run(cfg.ext_words, 8))]
        runs.append(len(steps) - 1)
        for m in range(M):
            row = (dst + m * ldc) % depth
            steps.append(Frame(h.read(Space.SPAD, row, min(N, depth - row))))
            if row + N > depth:
                steps.append(Frame(h.read(Space.SPAD, 0, row + N - depth)))
    hw, board = check(cfg, steps)
    assert board.runs == len(cases)
    for k, (dst, ldc, M, N) in zip(runs, cases):
        r = RunResultFields.unpack(parse_answer(hw[k]).payload, cfg.ext_words, cfg.spad_depth)
        marked = {b for b in range(8 * len(r.spad_dirty)) if r.spad_dirty[b // 8] >> (b % 8) & 1}
        written = {((dst + m * ldc + n) % depth) // 16 for m in range(M) for n in range(N)}
        assert marked == written, f"MM at {dst}: the map marks blocks {sorted(marked)}, it wrote {sorted(written)}"
        assert not any(r.ext_dirty)
