"""The external port of ext_port words (docs/ext-port.md): LD, ST, GATHER and SCATTER move up to that many
consecutive words a cycle. The cycle model, the harness's memory and the board's banked one, the four units on
the chip against the reference machine (hand-made edge cases and the fuzz's own programs), the board's dirty
map, and a served trace whose tokens and logits do not move."""
import random
from dataclasses import replace

import pytest
from amaranth.sim import Simulator

from hdl import isa
from hdl.board_top import BoardExtMemory
from hdl.config import BOOK, parse_chip
from hdl.extmem import POISON, ExtMemory
from sim.backends import first_difference
from sim.backends.reference import ReferenceMachine

PORT2 = parse_chip("fast,ext_port=2")
PORT4 = parse_chip("fast,ext_port=4")


def _ceil(a, b):
    return -(-a // b)


# ---- the cycle model --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [BOOK, PORT2, PORT4], ids=["1", "2", "4"])
def test_cycle_model_moves_groups(cfg):
    """LD and ST take ceil(len/P) cycles of data, a GATHER or SCATTER row 2**row_log2 / P of them (one at
    least: a group never crosses a row), each run still two lookups."""
    P, lat = cfg.ext_port, 8
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 100, 4095):
        assert isa.busy_cycles(isa.ld(0, 0, n).word, lat, cfg) == _ceil(n, P) + lat + 1
        assert isa.busy_cycles(isa.st(0, 0, n).word, lat, cfg) == _ceil(n, P) + 2
    for row_log2 in range(5):
        # rows 3..9 of pages of 4 rows: three runs (3 | 4..7 | 8..9), seven rows
        per_row = max(1, (1 << row_log2) // P)
        g = isa.gather(0, 3000, 4, 0, 2, 3, 10, row_log2, 64)
        s = isa.scatter(0, 3000, 4, 0, 2, 3, 10, row_log2, 64)
        assert isa.busy_cycles(g.word, lat, cfg) == 2 * 3 + 7 * per_row + lat + 1
        assert isa.busy_cycles(s.word, lat, cfg) == 2 * 3 + 7 * per_row + 2
    assert isa.ext_port_words(cfg) == P


# ---- the memories -----------------------------------------------------------------------------------------

class MemoryModel:
    """What either memory must answer: lane k of a read of `a` is word a + k (16-bit wrap), POISON at or past
    `ext`, `lat` cycles later, as the memory was when asked; write lane k lands at w + k below `ext`."""

    def __init__(self, words, ext, lat, P):
        self.mem, self.ext, self.lat, self.P = list(words), ext, lat, P
        self.pipe = [None] * lat

    def cycle(self, req, wr):
        out = self.pipe[-1]
        if req is None:
            now = None
        else:
            now = [self.mem[(req + k) & 0xFFFF] if (req + k) & 0xFFFF < self.ext else POISON
                   for k in range(self.P)]
        self.pipe = [now] + self.pipe[:-1]
        if wr is not None:
            w, valid, data = wr
            for k in range(self.P):
                a = (w + k) & 0xFFFF
                if valid >> k & 1 and a < self.ext:
                    self.mem[a] = data[k]
        return out


def _memory_traffic(rng, ext, n):
    """`n` cycles of random reads and writes, addresses near both ends and across the 16-bit wrap."""
    def addr():
        return rng.choice([rng.randrange(ext), ext - rng.randrange(1, 5), 0x10000 - rng.randrange(1, 4),
                           rng.randrange(1 << 16)]) & 0xFFFF
    out = []
    for _ in range(n):
        req = addr() if rng.random() < 0.7 else None
        wr = None
        if rng.random() < 0.5:
            wr = (addr(), rng.randrange(1, 16), [rng.getrandbits(32) for _ in range(4)])
        out.append((req, wr))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("P, board", [(2, False), (4, False), (2, True), (4, True)])
def test_memory_answers_a_group_of_words(P, board):
    """The harness's memory (one storage, a read and a write port a lane) and the board's (P banks, EXT and
    LAT set per run) against `MemoryModel`, cycle by cycle, over random traffic."""
    rng = random.Random(P * 10 + board)
    capacity, ext, lat = 64, 60, 3
    init = [rng.getrandbits(32) for _ in range(capacity)]
    cfg = replace(PORT4 if P == 4 else PORT2, ext_words=capacity, lat=lat)
    dut = BoardExtMemory(capacity, 8, P) if board else ExtMemory(ext, lat, config=cfg)
    model = MemoryModel(init[:ext] + [0] * (1 << 16), ext, lat, P)
    traffic = _memory_traffic(rng, ext, 300)
    seen = []

    async def bench(ctx):
        if board:
            ctx.set(dut.ext_words, ext)
            ctx.set(dut.lat, lat)
            for b, bank in enumerate(dut.banks):            # the link's writes, bank by bank
                for row in range(capacity // P):
                    ctx.set(bank.data[row], init[row * P + b])
        else:
            for a in range(ext):
                ctx.set(dut.memory.data[a], init[a])
        for req, wr in traffic:
            ctx.set(dut.req_valid, req is not None)
            ctx.set(dut.req_addr, req or 0)
            w, valid, data = wr or (0, 0, [0] * 4)
            ctx.set(dut.wr_valid, valid & ((1 << P) - 1))
            ctx.set(dut.wr_addr, w)
            ctx.set(dut.wr_data, sum(d << (32 * k) for k, d in enumerate(data[:P])))
            got = None
            if ctx.get(dut.resp_valid):
                r = ctx.get(dut.resp_data)
                got = [(r >> (32 * k)) & 0xFFFFFFFF for k in range(P)]
            seen.append(got)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    want = []
    for req, wr in traffic:
        lanes = None if wr is None else (wr[0], wr[1] & ((1 << P) - 1), wr[2][:P])
        want.append(model.cycle(req, lanes))
    assert seen == want


# ---- the units on the chip against the reference ----------------------------------------------------------

def _table_program():
    """LD and ST of every length 1..9 at every alignment, a read past EXT (POISON lanes), a store across EXT's
    end and one across the 16-bit wrap; GATHER and SCATTER of rows of 1, 2, 4 and 8 words over a table."""
    out = []
    for n in range(1, 10):
        out += [isa.ld(100 + 16 * n + n % 4, 200 + 3 * n, n), isa.st(100 + 16 * n + n % 4, 1200 + 11 * n, n)]
    out += [isa.ld(400, 2045, 7), isa.st(400, 2044, 7), isa.st(400, 0xFFFE, 5)]
    table = 3000
    for row_log2 in range(4):
        base = 1024 + 64 * row_log2
        out += [isa.gather(500 + 40 * row_log2, table, 3, base, 1, 1, 6, row_log2, 8),
                isa.scatter(500 + 40 * row_log2, table, 3, base + 256, 1, 0, 5, row_log2, 8)]
    return [i.word for i in out] + [isa.halt().word], table


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cfg", [PORT2, PORT4], ids=["2", "4"])
def test_units_on_the_amaranth_chip_equal_the_reference(cfg):
    """Every external word, the scratchpad and the five counters of `_table_program` on the Amaranth chip are
    the reference machine's (which runs the book's data semantics with the groups' cycles)."""
    from sim.backends.amaranth_backend import AmaranthBackend
    words, table = _table_program()
    rng = random.Random(7)
    image = [rng.getrandbits(32) for _ in range(2048)]
    spad = [rng.getrandbits(32) for _ in range(cfg.spad_depth)]
    spad[table:table + 3] = [5, 2, 7]
    want = ReferenceMachine(config=cfg, check=False).run(words, list(image), 3, scratchpad=list(spad))
    assert want.error is None
    got = AmaranthBackend(config=cfg, max_cycles=20_000).run(words, list(image), 3, scratchpad=list(spad))
    assert first_difference(want, got) is None
    # the same words cost more cycles on the book's port: the groups are what the cycles count
    one = ReferenceMachine(config=replace(cfg, ext_port=1), check=False).run(words, list(image), 3, scratchpad=list(spad))
    assert one.ext == want.ext and one.counters[2] > want.counters[2]


@pytest.mark.timeout(600)
def test_fuzz_programs_on_the_amaranth_chip_equal_the_reference():
    """The fuzz's own programs (half resident: GATHER/SCATTER over random tables, some failing) on the
    four-word port."""
    from sim.backends.amaranth_backend import AmaranthBackend
    from sim.verify.progen import fuzz_case
    cfg = PORT4
    for index in range(4):
        case = fuzz_case(41, index, configs=((2048, 3),), budget=10_000, config=cfg)
        kw = {} if case.scratchpad is None else {"scratchpad": case.scratchpad}
        want = ReferenceMachine(config=cfg, check=False).run(case.program, list(case.image), case.lat,
                                                             **({k: list(v) for k, v in kw.items()}))
        got = AmaranthBackend(config=cfg, max_cycles=30_000).run(case.program, list(case.image), case.lat, **kw)
        assert first_difference(want, got) is None, f"program {index}"


# ---- the board's dirty map --------------------------------------------------------------------------------

@pytest.mark.timeout(240)
def test_board_marks_every_block_a_store_group_writes():
    """On the board (hdl.board_top.BoardCore through its byte streams, tests/test_link_engine.py) an ST of
    four-word groups that straddle 16-word blocks, one cut by the run's EXT, marks exactly the blocks it wrote,
    and the READs of external memory equal the board model's."""
    from hdl.hostlink import Cmd, RunResultFields, Space, Status, parse_answer
    from test_link_engine import CFG, Frame, Host, check, program
    cfg = replace(CFG, mm_overlap=1, spad_lanes=4, ext_port=4)
    ext = cfg.ext_words - 2                         # the run's EXT: the last group's two top lanes do not land
    h = Host()
    rng = random.Random(29)
    steps = [Frame(h.write(Space.SPAD, 0, [rng.getrandbits(32) for _ in range(64)]))]
    cases = [(13, 6), (30, 3), (47, 17), (ext - 5, 5 + 2)]     # (dst, len): blocks 0|1, 1|2, 2..3|4, the end
    runs = []
    for dst, n in cases:
        steps += [Frame(h.write(Space.PROGRAM, 0, program(isa.st(rng.randrange(64 - n), dst, n)))),
                  Frame(h.run(ext, 8))]
        runs.append(len(steps) - 1)
        steps.append(Frame(h.read(Space.EXT, dst, min(n, ext - dst))))
    hw, board = check(cfg, steps)
    for k, (dst, n) in zip(runs, cases):
        a = parse_answer(hw[k])
        assert (a.cmd, a.status) == (Cmd.RUN, Status.ACK)
        r = RunResultFields.unpack(a.payload, cfg.ext_words, cfg.spad_depth)
        marked = {b for b in range(8 * len(r.ext_dirty)) if r.ext_dirty[b // 8] >> (b % 8) & 1}
        written = {a // 16 for a in range(dst, dst + n) if a < ext}
        assert marked == written, f"ST at {dst}: the map marks {sorted(marked)}, it wrote {sorted(written)}"


# ---- serving ----------------------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_served_tokens_and_logits_do_not_move():
    """The resident serving trace at batch 8 gives the same tokens and integer logits on the four-word port,
    in fewer DMA cycles."""
    from sim.serve import build_parser, serve
    out = {}
    for cfg in (parse_chip("fast,ext_port=1"), PORT4):
        a = build_parser().parse_args(["--mode", "resident", "--max-batch", "8", "--sim", "reference"])
        a.chip = cfg
        res = serve(a)
        out[cfg.ext_port] = res
    one, four = out[1], out[4]
    assert [r["tokens"] for r in one["requests"]] == [r["tokens"] for r in four["requests"]]
    assert [r["logits_int"] for r in one["requests"]] == [r["logits_int"] for r in four["requests"]]
    assert four["total_cycles"] < one["total_cycles"]
