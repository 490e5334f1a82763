"""The scratchpad: spad_depth x 32 bits (4096 on the book's chip), one write port, one synchronous NON-transparent read port (spec 5.1, 2.4).

The address presented in cycle c is sampled at the end of c and its data is visible in c+1; a write to
the same address at that edge is not seen (the old word comes out). The read register has no enable.

`SpadPort` is the one description of that port: every unit drives it (``unit.spad``), the scratchpad
takes it flipped (``Scratchpad.port``), and the chip joins them with ``wiring.connect`` through its
ownership decoder (`hdl.chip.PortOwner`).
"""
from amaranth.hdl import Module
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

    Raises
    ------
    TypeError, ValueError
        If a width or `reads` is not an integer of at least 1.
    """

    def __init__(self, addr_bits, data_bits, reads=1):
        self.addr_bits = check_int(None, "addr_bits", addr_bits, 1)
        self.data_bits = check_int(None, "data_bits", data_bits, 1)
        self.reads = check_int(None, "reads", reads, 1)
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
        super().__init__(members)

    @classmethod
    def of(cls, config=BOOK, reads=1):
        """The port of the scratchpad of chip `config` with `reads` read ports."""
        return cls(config.spad_addr_bits, config.word_bits, reads)

    def __eq__(self, other):
        return (type(other) is SpadPort and
                (self.addr_bits, self.data_bits, self.reads) == (other.addr_bits, other.data_bits, other.reads))

    def __hash__(self):
        return hash((SpadPort, self.addr_bits, self.data_bits, self.reads))

    def __repr__(self):
        return f"SpadPort({self.addr_bits}, {self.data_bits}, reads={self.reads})"


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
    config : hdl.config.ChipConfig
        The chip whose scratchpad this is (keyword only; the book's chip by default).

    Ports
    -----
    port : In(SpadPort(log2(depth), width, reads))
        The port, flipped: the scratchpad takes the addresses and the write and returns ``rdata``
        (and ``rdata_x``), the word at the previous cycle's address before that edge's write.

    Attributes
    ----------
    memory : amaranth.lib.memory.Memory
        The storage; simulators load and inspect it with ``ctx.set/ctx.get(memory.data[i])``.

    Raises
    ------
    TypeError, ValueError
        If `depth` is not an integer power of two of at least 2 or `width` not a positive integer.
    """

    def __init__(self, depth=None, width=None, reads=None, *, config=BOOK):
        depth = config.spad_depth if depth is None else depth
        width = config.word_bits if width is None else width
        reads = config.spad_reads if reads is None else reads
        aw = check_pow2(self, "depth", depth)
        check_int(self, "width", width, 1)
        check_int(self, "reads", reads, 1)
        self._depth, self._width, self._reads = depth, width, reads
        super().__init__({"port": In(SpadPort(aw, width, reads))})
        self.memory = Memory(shape=width, depth=depth, init=[])

    @property
    def depth(self):
        return self._depth

    @property
    def width(self):
        return self._width

    @property
    def reads(self):
        return self._reads

    def elaborate(self, platform):
        m = Module()
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
