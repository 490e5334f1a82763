"""The scratchpad: spad_depth x 32 bits (4096 on the book's chip), one write port, one synchronous NON-transparent read port (spec 5.1, 2.4).

With ``spad_lanes`` = l > 1 (docs/spad-lanes.md) it is l banks interleaved by address (bank = address mod
l), one write port a bank: a port then has l write lanes, lane i writing ``waddr + i``, so any l
consecutive addresses, whatever the alignment, fall in distinct banks. Every read port reads every bank
and selects by the registered low address bits. With l = 1 it is the book's single memory. With
``vec_lanes`` > 1 (docs/vec-lanes.md) the first read ports also have read lanes: each bank reads its word
among the l from the port's address (a row per bank), and lane i gives the word at the address + i.

The address presented in cycle c is sampled at the end of c and its data is visible in c+1; a write to
the same address at that edge is not seen (the old word comes out). The read register has no enable.

`SpadPort` is the one description of that port: every unit drives it (``unit.spad``), the scratchpad
takes it flipped (``Scratchpad.port``), and the chip joins them with ``wiring.connect`` through its
ownership decoder (`hdl.chip.PortOwner`).
"""
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hdl._checks import check_int, check_pow2
from hdl.config import BOOK

__all__ = ["SpadPort", "Scratchpad"]


class SpadPort(wiring.Signature):
    """The scratchpad port as a unit sees it: it drives the addresses and the write, it receives the read data.

    Parameters
    ----------
    addr_bits : int
        Width of the read and write addresses, at least 1.
    data_bits : int
        Width of a word, at least 1.
    reads : int, optional
        Read ports, at least 1 (default 1). Port 0 is ``raddr``/``rdata``, the others
        ``raddr_x``/``rdata_x`` (only the MM unit of a chip with ``mm_load`` > 1 has them, and the VADD
        unit of a chip with ``vadd_ports`` = 2).
    lanes : int, optional
        Write lanes, 1, 2 or 4 (default 1). Lane 0 is ``we``/``waddr``/``wdata``; lane i > 0 writes
        ``wdata_x[i-1]`` at ``waddr + i`` (modulo the depth) when ``we_x[i-1]`` (only the MM unit of a
        chip with ``spad_lanes`` > 1 has them, docs/spad-lanes.md).
    read_lanes : int, optional
        Read lanes, 1, 2 or 4 (default 1): with r > 1 each of the first `lane_reads` read ports also gives
        the words at its address + 1 .. + r-1, from the same cycle (the RQ and VADD units of a chip with
        ``vec_lanes`` > 1, docs/vec-lanes.md).
    lane_reads : int, optional
        The read ports with read lanes, the first ones (default: all `reads` when `read_lanes` > 1, else 0).

    Members
    -------
    raddr : Out(addr_bits)
        Read address, sampled by the scratchpad at the closing edge.
    rdata : In(data_bits)
        The registered read data: the word at the previous cycle's ``raddr``, as it was before that
        edge's write.
    we : Out(1)
        Write enable.
    waddr : Out(addr_bits)
    wdata : Out(data_bits)
    raddr_x, rdata_x : Out(ArrayLayout(addr_bits, reads-1)), In(ArrayLayout(data_bits, reads-1))
        Read ports 1 .. reads-1, each like port 0; only when `reads` > 1.
    we_x, wdata_x : Out(lanes-1), Out(ArrayLayout(data_bits, lanes-1))
        Write lanes 1 .. lanes-1; only when `lanes` > 1.
    rdata_l : In(ArrayLayout(ArrayLayout(data_bits, read_lanes-1), lane_reads))
        ``rdata_l[r][i-1]`` is the word at read port r's previous address + i (modulo the depth), read like
        that port's; only when `read_lanes` > 1.

    Raises
    ------
    TypeError, ValueError
        If a width or `reads` is not an integer of at least 1, `lanes` or `read_lanes` not 1, 2 or 4, or
        `lane_reads` outside 1..reads with read lanes.
    """

    def __init__(self, addr_bits, data_bits, reads=1, lanes=1, read_lanes=1, lane_reads=None):
        self.addr_bits = check_int(None, "addr_bits", addr_bits, 1)
        self.data_bits = check_int(None, "data_bits", data_bits, 1)
        self.reads = check_int(None, "reads", reads, 1)
        self.lanes = check_lanes(None, lanes)
        self.read_lanes = check_lanes(None, read_lanes)
        self.lane_reads = check_lane_reads(None, reads, read_lanes, lane_reads)
        members = {
            "raddr": Out(addr_bits),
            "rdata": In(data_bits),
            "we":    Out(1),
            "waddr": Out(addr_bits),
            "wdata": Out(data_bits),
        }
        if reads > 1:
            members["raddr_x"] = Out(data.ArrayLayout(addr_bits, reads - 1))
            members["rdata_x"] = In(data.ArrayLayout(data_bits, reads - 1))
        if lanes > 1:
            members["we_x"] = Out(lanes - 1)
            members["wdata_x"] = Out(data.ArrayLayout(data_bits, lanes - 1))
        if read_lanes > 1:
            members["rdata_l"] = In(data.ArrayLayout(data.ArrayLayout(data_bits, read_lanes - 1),
                                                     self.lane_reads))
        super().__init__(members)

    @classmethod
    def of(cls, config=BOOK, reads=1, lanes=1, read_lanes=1, lane_reads=None):
        """The port of the scratchpad of chip `config` with `reads` read ports, `lanes` write lanes and
        `read_lanes` read lanes on the first `lane_reads` read ports."""
        return cls(config.spad_addr_bits, config.word_bits, reads, lanes, read_lanes, lane_reads)

    def _key(self):
        return (self.addr_bits, self.data_bits, self.reads, self.lanes, self.read_lanes, self.lane_reads)

    def __eq__(self, other):
        return type(other) is SpadPort and self._key() == other._key()

    def __hash__(self):
        return hash((SpadPort, *self._key()))

    def __repr__(self):
        lanes = f", lanes={self.lanes}" if self.lanes > 1 else ""
        if self.read_lanes > 1:
            lanes += f", read_lanes={self.read_lanes}, lane_reads={self.lane_reads}"
        return f"SpadPort({self.addr_bits}, {self.data_bits}, reads={self.reads}{lanes})"


def check_lanes(owner, lanes):
    """`lanes` if it is 1, 2 or 4 (write lanes of a port, banks of a scratchpad), else TypeError/ValueError
    naming it."""
    check_int(owner, "lanes", lanes, 1)
    if lanes not in (1, 2, 4):
        raise ValueError(f"lanes must be 1, 2 or 4, not {lanes}")
    return lanes


def check_lane_reads(owner, reads, read_lanes, lane_reads):
    """The read ports with read lanes: `lane_reads` (default all `reads`) when `read_lanes` > 1, else 0;
    ValueError naming it if outside 1..reads."""
    if read_lanes == 1:
        return 0
    lane_reads = reads if lane_reads is None else check_int(owner, "lane_reads", lane_reads, 1)
    if lane_reads > reads:
        raise ValueError(f"lane_reads must be at most the {reads} read ports, not {lane_reads}")
    return lane_reads


class Scratchpad(wiring.Component):
    """Single-port-write, single-port-read word memory with a registered, read-before-write output.

    Parameters
    ----------
    depth : int, optional
        Number of words, a power of two (default ``config.spad_depth``). Addresses are log2(depth) bits.
    width : int, optional
        Bits per word, at least 1 (default ``config.word_bits``).
    reads : int, optional
        Read ports, at least 1 (default ``config.spad_reads``: the MM unit stages ``mm_load`` operand
        elements a cycle, one a port, and a VADD unit with ``vadd_ports`` = 2 reads through two).
    lanes : int, optional
        Write lanes, 1, 2 or 4 (default ``config.spad_lanes``): with l > 1 the words are stored in l banks
        interleaved by address (docs/spad-lanes.md), bank b holding the words of addresses a = b (mod l)
        at row a // l, each bank with one write port, so the l lanes' consecutive addresses always meet
        l distinct banks. Every read port reads every bank at row a // l and a register of a's low
        bits selects the word in the next cycle (one multiplexer level more on the read path).
    read_lanes : int, optional
        Read lanes of the first `lane_reads` read ports, 1, 2 or 4 and at most `lanes` (default
        ``config.vec_lanes``, docs/vec-lanes.md): such a port reads, in bank b, row (raddr + i_b) // lanes
        with i_b = (b - raddr) mod lanes (the write lanes' adder, on the read address), so it has the
        words at raddr .. raddr + lanes - 1 whatever raddr's alignment, and gives raddr + i in lane i.
    lane_reads : int, optional
        The read ports with read lanes (default ``config.vadd_ports`` when `read_lanes` > 1: VADD's two).
    config : hdl.config.ChipConfig
        The chip whose scratchpad this is (keyword only; the book's chip by default).

    Ports
    -----
    port : In(SpadPort(log2(depth), width, reads, lanes))
        The port, flipped: the scratchpad takes the addresses and the writes and returns ``rdata``
        (and ``rdata_x``), the word at the previous cycle's address before that edge's writes.

    Attributes
    ----------
    banks : list of amaranth.lib.memory.Memory
        The storage, `lanes` memories of depth // lanes words; simulators load and inspect word a with
        ``ctx.set/ctx.get(scratchpad.row(a))``.
    memory : amaranth.lib.memory.Memory or None
        With one lane, the one memory (``banks[0]``: ``memory.data[i]`` is word i); None with more.

    Raises
    ------
    TypeError, ValueError
        If `depth` is not an integer power of two of at least 2 (and of at least 2*lanes), `width` not a
        positive integer, `lanes` not 1, 2 or 4, or `read_lanes` not 1, 2 or 4 or above `lanes`.
    """

    def __init__(self, depth=None, width=None, reads=None, lanes=None, read_lanes=None, lane_reads=None, *,
                 config=BOOK):
        depth = config.spad_depth if depth is None else depth
        width = config.word_bits if width is None else width
        reads = config.spad_reads if reads is None else reads
        lanes = config.spad_lanes if lanes is None else lanes
        if read_lanes is None:
            of = self.read_lanes_of(config, reads)
            read_lanes = of["read_lanes"]
            lane_reads = of["lane_reads"] if lane_reads is None else lane_reads
        aw = check_pow2(self, "depth", depth)
        check_int(self, "width", width, 1)
        check_int(self, "reads", reads, 1)
        check_lanes(self, lanes)
        check_lanes(self, read_lanes)
        if depth < 2 * lanes:
            raise ValueError(f"Scratchpad depth {depth} is below two rows of {lanes} banks")
        if read_lanes > lanes:
            raise ValueError(f"Scratchpad read_lanes {read_lanes} is above its {lanes} banks")
        self._depth, self._width, self._reads, self._lanes = depth, width, reads, lanes
        self._read_lanes = read_lanes
        super().__init__({"port": In(SpadPort(aw, width, reads, lanes, read_lanes, lane_reads))})
        if lanes == 1:
            self.memory = Memory(shape=width, depth=depth, init=[])
            self.banks = [self.memory]
        else:
            self.memory = None
            self.banks = [Memory(shape=width, depth=depth // lanes, init=[]) for _ in range(lanes)]

    @staticmethod
    def read_lanes_of(config, reads=None):
        """The read lanes of the scratchpad of chip `config` (with `reads` read ports, default
        ``config.spad_reads``) as keyword arguments of `SpadPort`: ``config.vec_lanes`` lanes on the first
        ``vadd_ports`` read ports (RQ's port 0, VADD's 0 and 1; none with one lane), and at least
        ``config.ext_port`` lanes on port 0 (ST's and SCATTER's groups, docs/ext-port.md)."""
        reads = config.spad_reads if reads is None else reads
        lanes = max(config.vec_lanes, config.ext_port)
        if lanes == 1:
            return {"read_lanes": 1, "lane_reads": None}
        # ST's and SCATTER's groups (docs/ext-port.md) come through port 0's lanes, RQ's and VADD's through
        # the first vadd_ports
        return {"read_lanes": lanes, "lane_reads": min(reads, config.vadd_ports) if config.vec_lanes > 1 else 1}

    @property
    def depth(self):
        return self._depth

    @property
    def read_lanes(self):
        return self._read_lanes

    @property
    def width(self):
        return self._width

    @property
    def reads(self):
        return self._reads

    @property
    def lanes(self):
        return self._lanes

    def row(self, addr):
        """Word `addr` as a simulator's ``ctx.get``/``ctx.set`` take it: row addr // lanes of bank addr % lanes."""
        return self.banks[addr % self._lanes].data[addr // self._lanes]

    def backdoor(self, m, addr, rdata, we=None, wdata=None):
        """Ports of the testbench's own in module `m`: `rdata` is word `addr` now (a combinational read),
        and with `we` the word `wdata` is written at `addr` at the edge (the harness's backdoor, next to
        the chip's port)."""
        lanes = self._lanes
        if lanes == 1:
            peek = self.memory.read_port(domain="comb")
            m.d.comb += [peek.addr.eq(addr), rdata.eq(peek.data)]
            if we is not None:
                poke = self.memory.write_port()
                m.d.comb += [poke.en.eq(we), poke.addr.eq(addr), poke.data.eq(wdata)]
            return
        lg = lanes.bit_length() - 1
        peeks = []
        for b, bank in enumerate(self.banks):
            peek = bank.read_port(domain="comb")
            m.d.comb += peek.addr.eq(addr[lg:])
            peeks.append(peek.data)
            if we is not None:
                poke = bank.write_port()
                m.d.comb += [poke.en.eq(we & (addr[:lg] == b)), poke.addr.eq(addr[lg:]), poke.data.eq(wdata)]
        m.d.comb += rdata.eq(Cat(*peeks).word_select(addr[:lg], self._width))

    def elaborate(self, platform):
        m = Module()
        if self._lanes > 1:
            return self._elaborate_banks(m)
        m.submodules.memory = self.memory
        wr = self.memory.write_port()
        # transparent_for=() : the read port does not forward the same-edge write (read-before-write).
        rd = self.memory.read_port(transparent_for=())
        p = self.port
        m.d.comb += [
            wr.en.eq(p.we),
            wr.addr.eq(p.waddr),
            wr.data.eq(p.wdata),
            rd.addr.eq(p.raddr),
        ]
        m.d.comb += p.rdata.eq(rd.data)
        for j in range(self._reads - 1):
            rd_x = self.memory.read_port(domain="sync", transparent_for=())    # like port 0
            m.d.comb += rd_x.addr.eq(p.raddr_x[j])
            m.d.comb += p.rdata_x[j].eq(rd_x.data)
        return m

    def _elaborate_banks(self, m):
        """The banked scratchpad (docs/spad-lanes.md): bank b takes the lane whose address falls in it,
        lane i = (b - waddr) mod lanes, at row (waddr + i) // lanes; read port r reads row raddr // lanes
        of every bank and gives the bank of the registered raddr % lanes."""
        p = self.port
        lanes, width = self._lanes, self._width
        lg = lanes.bit_length() - 1
        aw = len(p.waddr)
        we = Cat(p.we, p.we_x)
        wdata = Cat(p.wdata, p.wdata_x.as_value())
        raddrs = [p.raddr] + [p.raddr_x[j] for j in range(self._reads - 1)]
        rdatas = [p.rdata] + [p.rdata_x[j] for j in range(self._reads - 1)]
        laned = p.signature.lane_reads     # the first `laned` read ports have read lanes (docs/vec-lanes.md)
        sels = [Signal(lg, name=f"rsel{r}") for r in range(self._reads)]
        m.d.sync += [sel.eq(a[:lg]) for sel, a in zip(sels, raddrs)]
        words = [[] for _ in raddrs]
        for b, bank in enumerate(self.banks):
            m.submodules[f"bank{b}"] = bank
            lane = Signal(lg, name=f"lane{b}")
            addr = Signal(aw, name=f"waddr{b}")
            m.d.comb += [lane.eq(b - p.waddr[:lg]), addr.eq(p.waddr + lane)]
            wr = bank.write_port()
            m.d.comb += [wr.en.eq(we.bit_select(lane, 1)), wr.addr.eq(addr[lg:]),
                         wr.data.eq(wdata.word_select(lane, width))]
            for r, a in enumerate(raddrs):
                # transparent_for=() : read-before-write, as with one memory
                rd = bank.read_port(domain="sync", transparent_for=())
                if r < laned:
                    # the word of this bank among raddr .. raddr + lanes - 1: lane (b - raddr) mod lanes
                    rlane = Signal(lg, name=f"rlane{r}_{b}")
                    raddr_b = Signal(aw, name=f"raddr{r}_{b}")
                    m.d.comb += [rlane.eq(b - a[:lg]), raddr_b.eq(a + rlane), rd.addr.eq(raddr_b[lg:])]
                else:
                    m.d.comb += rd.addr.eq(a[lg:])
                words[r].append(rd.data)
        for r, out in enumerate(rdatas):
            m.d.comb += out.eq(Cat(*words[r]).word_select(sels[r], width))
        for r in range(laned):
            # lane i of port r: the bank after the registered raddr's by i (modulo the banks)
            for i in range(1, self._read_lanes):
                bank = Signal(lg, name=f"rbank{r}_{i}")
                m.d.comb += [bank.eq(sels[r] + i), p.rdata_l[r][i - 1].eq(Cat(*words[r]).word_select(bank, width))]
        return m
