"""The scratchpad: spad_depth x 32 bits (4096 on the book's chip), one write port, one synchronous NON-transparent read port (spec 5.1, 2.4).

The address presented in cycle c is sampled at the end of c and its data is visible in c+1; a write to
the same address at that edge is not seen (the old word comes out). The read register has no enable.
"""
from amaranth.hdl import Module
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hdl._checks import check_int, check_pow2
from hdl.config import BOOK

__all__ = ["Scratchpad"]


class Scratchpad(wiring.Component):
    """Single-port-write, single-port-read word memory with a registered, read-before-write output.

    Parameters
    ----------
    depth : int, optional
        Number of words, a power of two (default ``config.spad_depth``). Addresses are log2(depth) bits.
    width : int, optional
        Bits per word, at least 1 (default ``config.word_bits``).
    reads : int, optional
        Read ports, at least 1 (default ``config.mm_load``: the MM unit stages that many operand
        elements a cycle, one a port). Port 0 is ``raddr``/``rdata``, the others ``raddr_x``/``rdata_x``.
    config : hdl.config.ChipConfig
        The chip whose scratchpad this is (keyword only; the book's chip by default).

    Ports
    -----
    raddr : In(log2(depth))
        Read address, sampled at the closing edge.
    rdata : Out(width)
        The word at the raddr of the previous cycle (contents before that edge's write).
    we : In(1)
        Write enable.
    waddr : In(log2(depth))
    wdata : In(width)
    raddr_x, rdata_x : In(ArrayLayout(log2(depth), reads-1)), Out(ArrayLayout(width, reads-1))
        Read ports 1 .. reads-1, each like port 0; only when `reads` > 1.

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
        reads = config.mm_load if reads is None else reads
        aw = check_pow2(self, "depth", depth)
        check_int(self, "width", width, 1)
        check_int(self, "reads", reads, 1)
        self._depth, self._width, self._reads = depth, width, reads
        ports = {
            "raddr": In(aw),
            "rdata": Out(width),
            "we":    In(1),
            "waddr": In(aw),
            "wdata": In(width),
        }
        if reads > 1:
            ports["raddr_x"] = In(data.ArrayLayout(aw, reads - 1))
            ports["rdata_x"] = Out(data.ArrayLayout(width, reads - 1))
        super().__init__(ports)
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
        # The two directions in separate submodules: a simulator then re-evaluates the input side when
        # the addresses move and the output side when the read data does, each alone.
        m.submodules.ports_in = ports_in = Module()
        ports_in.d.comb += [
            wr.en.eq(self.we),
            wr.addr.eq(self.waddr),
            wr.data.eq(self.wdata),
            rd.addr.eq(self.raddr),
        ]
        m.d.comb += self.rdata.eq(rd.data)
        for j in range(self._reads - 1):
            rd_x = self.memory.read_port(domain="sync", transparent_for=())    # like port 0
            ports_in.d.comb += rd_x.addr.eq(self.raddr_x[j])
            m.d.comb += self.rdata_x[j].eq(rd_x.data)
        return m
