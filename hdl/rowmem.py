"""The MM unit's operand memory: row_depth x int8 (64 on the book's chip), written at the clock edge, read combinationally (spec 5.2).

`rdata` shows mem[raddr] in the same cycle; a write in cycle c is visible from cycle c+1 on, so a read of
the address being written returns the old value during the write cycle. No reset. The MM unit holds its
eight operand memories as the lanes of one Memory with this same behaviour per lane (hdl/units/mm.py).
"""
from amaranth.hdl import Module, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hdl._checks import check_pow2
from hdl.config import BOOK

__all__ = ["RowMem"]



class RowMem(wiring.Component):
    """Operand memory of signed bytes with one write port and one combinational read port.

    Parameters
    ----------
    depth : int, optional
        Number of entries, a power of two (default ``config.row_depth``). Addresses are log2(depth) bits.
    config : hdl.config.ChipConfig
        The chip whose MM unit this memory belongs to (keyword only; the book's chip by default).

    Ports
    -----
    we : In(1)
        Write enable; mem[waddr] <- wdata at the closing edge.
    waddr : In(log2(depth))
    wdata : In(signed(8))
    raddr : In(log2(depth))
    rdata : Out(signed(8))
        mem[raddr], combinational.

    Attributes
    ----------
    memory : amaranth.lib.memory.Memory
        The storage (simulators may read or poke `memory.data[i]`).

    Raises
    ------
    TypeError, ValueError
        If `depth` is not an integer power of two of at least 2.
    """

    def __init__(self, depth=None, *, config=BOOK):
        depth = config.row_depth if depth is None else depth
        aw = check_pow2(self, "depth", depth)
        self._depth = depth
        super().__init__({
            "we":    In(1),
            "waddr": In(aw),
            "wdata": In(signed(8)),
            "raddr": In(aw),
            "rdata": Out(signed(8)),
        })
        self.memory = Memory(shape=signed(8), depth=depth, init=[])

    @property
    def depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = self.memory
        wr = self.memory.write_port()
        rd = self.memory.read_port(domain="comb")
        m.d.comb += [
            wr.en.eq(self.we),
            wr.addr.eq(self.waddr),
            wr.data.eq(self.wdata),
            rd.addr.eq(self.raddr),
            self.rdata.eq(rd.data),
        ]
        return m
