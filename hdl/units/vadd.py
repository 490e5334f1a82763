"""VADD unit: saturating int8 vector add (hardware spec 4.4), over one or two scratchpad read ports
(``config.vadd_ports``, docs/vadd-ports.md).

One port (the book's): B = 2·len + 2. The two operands are read alternately: src1[k] in W(2k+1), src2[k]
in W(2k+2); the first is held in `x`, the sum is written at the end of W(2k+3) and `done` is high in
W(2·len+2). States: IDLE, RUN.

Two ports: B = len + 2. src1[k] (port 0) and src2[k] (port 1) are read in W(k+1), the sum is written at
the end of W(k+2) and `done` is high in W(len+2). States: IDLE, STREAM (`Unit.one_pass`). Reading src2[k]
one cycle later than with one port would miss the write of element k-1, made at the same edge as the
read, when src2[k] is that word (dst = src2 + 1 modulo the scratchpad's depth); the unit then takes the
sum it is writing instead (`fwd`), so every placement of the operands gives the one-port result.

``vec_lanes`` = l > 1 (docs/vec-lanes.md; two ports), B = ceil(len/l) + 2: the two-port schedule a group of
l consecutive elements at a time (`lanes`): both sources' group g is read in W(g+1) through the ports'
read lanes (2l words), l adders sum it in W(g+2) and the write lanes write it at the end of W(g+2). No
forwarding: group g's reads see the writes of groups <= g-2, which ``sim.backends.reference`` models.
"""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib.wiring import Out

from hdl.isa import Op
from hdl.scratchpad import SpadPort

from .base import SpadUnit
from .lanes import VectorLanes, lane_pass

__all__ = ["VaddUnit"]


class VaddUnit(VectorLanes, SpadUnit):
    """spad[dst+i] = sext(clamp(s8(spad[src1+i]) + s8(spad[src2+i]), -127, 127)).

    The ports are `SpadUnit`'s, with ``config.vadd_ports`` read ports in ``spad``. dst, src1, src2 (12
    bits) and len (16 bits) are latched at E0; only bits 7:0 of the read data are used. With one port
    ``spad.raddr`` is ``src1 + cnt/2`` on even counts and ``src2 + cnt/2`` on odd ones and ``done`` is
    high in W(2·len+2); with two, ``spad.raddr`` is ``src1 + i``, ``spad.raddr_x[0]`` is ``src2 + i``
    and ``done`` is high in W(len+2).
    """

    OP = Op.VADD

    def ports(self, cfg):
        members = super().ports(cfg)
        if cfg.vec_lanes > 1:
            l = cfg.vec_lanes
            members["spad"] = Out(SpadPort.of(cfg, reads=2, lanes=l, read_lanes=l))
        elif cfg.vadd_ports == 2:
            members["spad"] = Out(SpadPort.of(cfg, reads=2))
        return members

    def elaborate(self, platform):
        m = Module()
        opr = self.operand_register()
        if self.config.vec_lanes > 1:
            self.lanes(m, opr)
        elif self.config.vadd_ports == 2:
            self.one_cycle(m, opr)
        else:
            self.two_cycles(m, opr)
        self.check_protocol(m, opr)
        return m

    @classmethod
    def scope_of(cls, cfg):
        """``vadd``, or ``vadd_ports`` for the unit with two read ports (the book's unit keeps "vadd"),
        ``vadd_lanes`` for the unit with ``vec_lanes`` > 1."""
        if cfg.vec_lanes > 1:
            return "vadd_lanes"
        return "vadd_ports" if cfg.vadd_ports == 2 else "vadd"

    def saturated_sum(self, m, a, b):
        """clamp(a + b, -127, 127) of two int8 values, as a signed 8-bit signal."""
        total = Signal(signed(9))
        m.d.comb += total.eq(a + b)
        result = Signal(signed(8))
        m.d.comb += result.eq(Mux(total > 127, 127, Mux(total < -127, -127, total[:8])))
        return result

    def write_port(self, we, dst, j, result):
        """The write side: element j's sum (sign-extended) to dst + j while `we`."""
        return [
            self.spad.we.eq(we),
            self.spad.waddr.eq(dst + j),
            self.spad.wdata.eq(result),
        ]

    def two_cycles(self, m, opr):
        """One read port: src1[k] and src2[k] in two cycles (B = 2·len + 2)."""
        s1, s2, dst, n = opr.src1, opr.src2, opr.dst, opr.len
        j = self.addr_signal("j")
        cnt = Signal(17)
        v = Signal()
        par = Signal()
        x = Signal(signed(8))

        result = self.saturated_sum(m, x, self.spad.rdata[:8].as_signed())

        m.d.comb += [
            self.spad.raddr.eq(Mux(cnt[0], s2, s1) + cnt[1:]),
            *self.write_port(v & par, dst, j, result),
        ]
        with self.control(m):
            with m.State("IDLE"):
                with m.If(self.start):
                    self.begin(m, opr)
                    m.d.sync += [cnt.eq(0), j.eq(0), v.eq(0)]
                    m.next = "RUN"
            with m.State("RUN"):
                more = cnt < (n << 1)
                m.d.sync += [v.eq(more), par.eq(cnt[0])]
                with m.If(more):
                    m.d.sync += cnt.eq(cnt + 1)
                with m.If(v & ~par):
                    m.d.sync += x.eq(self.spad.rdata[:8])
                with m.If(v & par):
                    m.d.sync += j.eq(j + 1)
                    with m.If(j == n - 1):
                        self.finish(m)
                        m.d.sync += v.eq(0)

    def one_cycle(self, m, opr):
        """Two read ports: src1[k] and src2[k] in one cycle (B = len + 2), the sum written the next."""
        s1, s2, dst, n = opr.src1, opr.src2, opr.dst, opr.len
        i, j, v = self.one_pass(m, opr, n)
        # fwd: src2[k] is the word element k-1 is written to (dst = src2 + 1 modulo the depth), so its
        # read missed that write; `last` holds the sum written in the previous cycle
        gap = self.addr_signal("gap")              # dst - src2 - 1 modulo the depth
        m.d.comb += gap.eq(dst - s2 - 1)
        fwd = Signal()
        m.d.comb += fwd.eq(gap == 0)
        last = Signal(signed(8))
        y = Mux(fwd & (j != 0), last, self.spad.rdata_x[0][:8].as_signed())
        result = self.saturated_sum(m, self.spad.rdata[:8].as_signed(), y)
        with m.If(v):
            m.d.sync += last.eq(result)
        m.d.comb += [
            self.spad.raddr.eq(s1 + i),
            self.spad.raddr_x[0].eq(s2 + i),
            *self.write_port(v, dst, j, result),
        ]

    def lanes(self, m, opr):
        """``vec_lanes`` = l: src1's and src2's group of l elements in one cycle through the two ports' read
        lanes, the l sums written the next through the write lanes (B = ceil(len/l) + 2)."""
        l = self.config.vec_lanes
        s1, s2, dst, n = opr.src1, opr.src2, opr.dst, opr.len
        i, j, v, valid = lane_pass(self, m, opr, n, l)
        xs = [self.spad.rdata] + [self.spad.rdata_l[0][k] for k in range(l - 1)]
        ys = [self.spad.rdata_x[0]] + [self.spad.rdata_l[1][k] for k in range(l - 1)]
        sums = [self.saturated_sum(m, x[:8].as_signed(), y[:8].as_signed()) for x, y in zip(xs, ys)]
        m.d.comb += [
            self.spad.raddr.eq(s1 + i),
            self.spad.raddr_x[0].eq(s2 + i),
            *self.write_port(valid[0], dst, j, sums[0]),
            self.spad.we_x.eq(valid[1:]),
            *(self.spad.wdata_x[k - 1].eq(sums[k]) for k in range(1, l)),
        ]
