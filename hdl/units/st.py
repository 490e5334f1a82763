"""ST unit: copies `len` scratchpad words to external memory (hardware spec 4.2). B = len + 2.

Element k is read in W(k+1) and written to external memory at the end of W(k+2), straight from the
scratchpad's read register; `done` is high in W(len+2).
"""

from amaranth.hdl import Module
from amaranth.lib.wiring import Out

from hdl.isa import Op

from .base import Unit

__all__ = ["StoreUnit"]


class StoreUnit(Unit):
    """Scratchpad -> external memory copy engine.

    `Unit`'s ports plus the external write port below. src = a[11:0], dst = b (16 bits) and
    len = c[11:0] are latched at E0; ``spad.raddr = src + i``; ``done`` is high in W(len+2).

    Ports
    -----
    wr_valid, wr_addr, wr_data : Out(1), Out(config.ext_addr_bits), Out(config.word_bits)
        External write port; ``wr_data`` is ``spad.rdata`` passed through.
    """

    OP = Op.ST

    def ports(self, cfg):
        return {**super().ports(cfg),
                "wr_valid": Out(1), "wr_addr": Out(cfg.ext_addr_bits), "wr_data": Out(cfg.word_bits)}

    def elaborate(self, platform):
        m = Module()
        opr = self.operand_register()
        src, dst, n = opr.src, opr.dst, opr.len
        i, j, v = self.one_pass(m, opr, n)
        self.store_path(m, src + i, v, dst + j)
        self.check_protocol(m, opr)
        return m

    def store_path(self, m, raddr, v, waddr):
        """ST's datapath (SCATTER's too, `hdl.units.scatter`): the scratchpad word read at `raddr` in one
        cycle is in ``spad.rdata`` the next, and goes to external memory then, at `waddr`, if `v`."""
        m.d.comb += [
            self.spad.raddr.eq(raddr),
            self.wr_valid.eq(v),
            self.wr_addr.eq(waddr),
            self.wr_data.eq(self.spad.rdata),
        ]
