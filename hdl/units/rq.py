"""RQ unit: requantizes `len` int32 words to int8 (hardware spec 4.3). B = ``hdl.isa.rq_busy_cycles``.

Timing contract. The ST skeleton with the scratchpad as destination: element k's address goes out in
W(k+1) and its word is in the read register in W(k+2).

- The book's chip (``rq_pipe`` = 0), B = len + 2: the word goes through the combinational requantizer and
  is written at the end of W(k+2); `done` is high in W(len+2). States IDLE, STREAM.
- ``rq_pipe`` = 1 (docs/rq-pipe.md), B = len + 3: the requantizer registers the product at the end of
  W(k+2), and q is written at the end of W(k+3) (the write enable and the address follow the word one
  cycle late, in ``wv`` and ``wj``); after the last word's read cycle the unit spends one cycle in DRAIN,
  which writes it, and `done` is high in W(len+3). States IDLE, STREAM, DRAIN.
  Element k's read (the edge closing W(k+1)) is the edge that writes element k-2 now, not k-1: when
  src[k] is that word (dst = src + 2 modulo the scratchpad's depth) the read misses it, so the unit then
  feeds the requantizer the value it wrote instead (`fwd`, `last`), and every placement of the operands
  gives the book's result (a read sees the writes of elements <= k-2, ``sim.backends.reference``).
- ``vec_lanes`` = l > 1 (docs/vec-lanes.md), B = ceil(len/l) + 2 (+1 with rq_pipe): the same schedule a
  group of l consecutive words at a time (`_lanes`): group g's address goes out in W(g+1), its l words come
  through the port's read lanes in W(g+2), through l requantizers, and are written through the write lanes
  at the end of W(g+2) (W(g+3) with rq_pipe). No forwarding: group g's read sees the writes of groups
  <= g-2 (g-3 with rq_pipe), which ``sim.backends.reference`` models.
"""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib.wiring import Out

from hdl.isa import Op
from hdl.properties import History
from hdl.requant import Requantizer
from hdl.scratchpad import SpadPort

from .base import SpadUnit
from .lanes import VectorLanes, lane_pass

__all__ = ["RequantUnit", "RQ_PIPE_PROPERTIES"]

# The property of a unit whose requantizer has the pipeline register (the RQ unit of an rq_pipe chip, scope
# "rq_pipe"; the MM unit of an mm_rq and rq_pipe chip, scope "mm_rq_pipe"): sim.verify.formal's targets of
# those names prove it with the unit contract.
RQ_PIPE_PROPERTIES = {
    "write_in_busy": "the scratchpad is written only in a busy cycle (the word left in the requantizer's "
                     "register is written before done)",
}


class RequantUnit(VectorLanes, SpadUnit):
    """Vector requantizer: spad[dst+i] = sext(requant(s32(spad[src+i]), m, s, relu)).

    The ports are `SpadUnit`'s. dst, src, len, m, s and relu are latched at E0; ``spad.raddr = src + i``;
    ``done`` is high in W(len+2), or W(len+3) with ``config.rq_pipe``.
    """

    OP = Op.RQ

    def ports(self, cfg):
        members = super().ports(cfg)
        if cfg.vec_lanes > 1:
            l = cfg.vec_lanes
            members["spad"] = Out(SpadPort.of(cfg, lanes=l, read_lanes=l))
        return members

    def elaborate(self, platform):
        m = Module()
        if self.config.vec_lanes > 1:
            return self._lanes(m)
        m.submodules.requant = rq = Requantizer(config=self.config)
        opr = self.operand_register()
        src, dst, n, mant, shift, relu = opr.src, opr.dst, opr.len, opr.m, opr.s, opr.relu
        acc = self.spad.rdata
        if self.config.rq_pipe:
            i, j, v = self._piped(m, opr, n)
            # the word read in the previous cycle is in the requantizer's register: write it now
            wv, wj = Signal(name="wv"), self.addr_signal("wj")
            m.d.sync += [wv.eq(v), wj.eq(j)]
            we, waddr = wv, dst + wj
            # fwd: the word in the read register was read at the edge that wrote it (dst = src + 2
            # modulo the depth, and a word was written), so the read missed that write; `last` holds
            # the value written, q of the previous cycle
            gap = self.addr_signal("gap")           # dst - src - 2 modulo the depth
            m.d.comb += gap.eq(dst - src - 2)
            fwd, last = Signal(name="fwd"), Signal(signed(8), name="last")
            m.d.sync += [fwd.eq((gap == 0) & wv), last.eq(rq.q)]
            acc = Mux(fwd, last, acc)
        else:
            i, j, v = self.one_pass(m, opr, n)
            we, waddr = v, dst + j

        m.d.comb += [
            rq.acc.eq(acc),
            rq.m.eq(mant),
            rq.s.eq(shift),
            rq.relu.eq(relu),
            self.spad.raddr.eq(src + i),
            self.spad.we.eq(we),
            self.spad.waddr.eq(waddr),
            self.spad.wdata.eq(rq.q),        # q is signed(8): the assignment sign-extends it
        ]
        self._check(m, opr)
        return m

    def _lanes(self, m):
        """The unit with ``vec_lanes`` = l requantizers (docs/vec-lanes.md): a group of l words a cycle."""
        cfg = self.config
        l = cfg.vec_lanes
        opr = self.operand_register()
        src, dst, n = opr.src, opr.dst, opr.len
        i, j, v, valid = lane_pass(self, m, opr, n, l, drain=bool(cfg.rq_pipe))
        words = [self.spad.rdata] + [self.spad.rdata_l[0][k] for k in range(l - 1)]
        qs = []
        for k, word in enumerate(words):
            rq = m.submodules[f"requant{k}"] = Requantizer(config=cfg)
            m.d.comb += [rq.acc.eq(word), rq.m.eq(opr.m), rq.s.eq(opr.s), rq.relu.eq(opr.relu)]
            qs.append(rq.q)
        if cfg.rq_pipe:
            # the products are in the requantizers' registers: write them a cycle later
            wvalid, wj = Signal(l, name="wvalid"), Signal(len(j), name="wj")
            m.d.sync += [wvalid.eq(valid), wj.eq(j)]
            valid, j = wvalid, wj
        m.d.comb += [
            self.spad.raddr.eq(src + i),
            self.spad.we.eq(valid[0]),
            self.spad.waddr.eq(dst + j),
            self.spad.wdata.eq(qs[0]),          # q is signed(8): the assignment sign-extends it
            self.spad.we_x.eq(valid[1:]),
            *(self.spad.wdata_x[k - 1].eq(qs[k]) for k in range(1, l)),
        ]
        self._check(m, opr)
        return m

    def _piped(self, m, opr, n):
        """`Unit.one_pass` with one cycle more (its DRAIN state, whose edge writes the last word and
        finishes). Returns (i, j, v)."""
        return self.one_pass(m, opr, n, drain=True)

    @classmethod
    def scope_of(cls, cfg):
        """``rq``, or ``rq_pipe`` for the piped unit (an rq_pipe chip), ``rq_lanes`` for the unit with
        ``vec_lanes`` > 1 (either requantizer)."""
        if cfg.vec_lanes > 1:
            return "rq_lanes"
        return "rq_pipe" if cfg.rq_pipe else "rq"

    @classmethod
    def properties_of(cls, cfg):
        """The unit contract, and `RQ_PIPE_PROPERTIES` on an rq_pipe chip."""
        return {**super().properties_of(cfg), **(RQ_PIPE_PROPERTIES if cfg.rq_pipe else {})}

    def _check(self, m, opr):
        """The unit contract, and the piped unit's `RQ_PIPE_PROPERTIES`, under its `scope`."""
        self.check_protocol(m, opr)
        if self.config.rq_pipe:
            check_write_in_busy(m, self.scope, self.spad.we, self.busy)


def check_write_in_busy(m, scope, we, busy):
    """`RQ_PIPE_PROPERTIES` as an Assert under `scope`."""
    h = History(m, scope)
    h.check("write_in_busy", ~we | busy, RQ_PIPE_PROPERTIES["write_in_busy"], covers={"a write": we})
