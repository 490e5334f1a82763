"""The scratchpad: spad_depth x 32 bits (4096 on the book's chip), one write port, one synchronous NON-transparent read port (spec 5.1, 2.4).

The address presented in cycle c is sampled at the end of c and its data is visible in c+1; a write to
the same address at that edge is not seen (the old word comes out). The read register has no enable.
"""
from amaranth.hdl import Module
from amaranth.lib import wiring
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

    Attributes
    ----------
    memory : amaranth.lib.memory.Memory
        The storage; simulators load and inspect it with ``ctx.set/ctx.get(memory.data[i])``.

    Raises
    ------
    TypeError, ValueError
        If `depth` is not an integer power of two of at least 2 or `width` not a positive integer.
    """

    def __init__(self, depth=None, width=None, *, config=BOOK):
        depth = config.spad_depth if depth is None else depth
        width = config.word_bits if width is None else width
        aw = check_pow2(self, "depth", depth)
        check_int(self, "width", width, 1)
        self._depth, self._width = depth, width
        super().__init__({
            "raddr": In(aw),
            "rdata": Out(width),
            "we":    In(1),
            "waddr": In(aw),
            "wdata": In(width),
        })
        self.memory = Memory(shape=width, depth=depth, init=[])

    @property
    def depth(self):
        return self._depth

    @property
    def width(self):
        return self._width

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
        return m
