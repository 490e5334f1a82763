"""ST unit: copies `len` scratchpad words to external memory (hardware spec 4.2). B = len + 2.

Element k is read in W(k+1) and written to external memory at the end of W(k+2), straight from the
scratchpad's read register; `done` is high in W(len+2). With ``ext_port`` = P > 1 (docs/ext-port.md) the
same a group of P consecutive words at a time: B = ceil(len/P) + 2.
"""

from amaranth.hdl import Cat, Module
from amaranth.lib.wiring import Out

from hdl.isa import Op
from hdl.scratchpad import SpadPort

from .base import Unit
from .lanes import lane_pass, lanes_busy

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
    PORT_UNIT = True

    def ports(self, cfg):
        members = {**super().ports(cfg), "wr_valid": Out(cfg.ext_port), "wr_addr": Out(cfg.ext_addr_bits),
                   "wr_data": Out(cfg.word_bits * cfg.ext_port)}
        if cfg.ext_port > 1:
            # a group of ext_port words a cycle through read port 0's lanes (docs/ext-port.md)
            members["spad"] = Out(SpadPort.of(cfg, read_lanes=cfg.ext_port))
        return members

    def elaborate(self, platform):
        m = Module()
        opr = self.operand_register()
        src, dst, n = opr.src, opr.dst, opr.len
        P = self.config.ext_port
        if P == 1:
            i, j, v = self.one_pass(m, opr, n)
        else:
            # lane_pass counts elements, P a cycle: group g read in W(g+1), written in W(g+2)
            i, j, _, v = lane_pass(self, m, opr, n, P)
        self.store_path(m, src + i, v, dst + j)
        self.check_protocol(m, opr)
        return m

    def busy_cycles(self, opr):
        if self.config.ext_port == 1:
            return super().busy_cycles(opr)
        l, b = lanes_busy(self.OP, self.config, self.config.ext_port)
        return ((opr.len + (l - 1)) >> (l.bit_length() - 1)) + b

    def store_path(self, m, raddr, v, waddr):
        """ST's datapath (SCATTER's too, `hdl.units.scatter`): the scratchpad word read at `raddr` in one
        cycle is in ``spad.rdata`` the next, and goes to external memory then, at `waddr`, if `v`. With
        ``ext_port`` = P > 1 (docs/ext-port.md) the P words from `raddr` come through the read lanes and
        lane k goes to ``waddr + k`` if bit k of `v`."""
        m.d.comb += [
            self.spad.raddr.eq(raddr),
            self.wr_valid.eq(v),
            self.wr_addr.eq(waddr),
            self.wr_data.eq(self.spad.rdata if self.config.ext_port == 1
                            else Cat(self.spad.rdata, self.spad.rdata_l[0].as_value())),
        ]
