"""The SCATTER unit: the ST unit (`hdl.units.st.StoreUnit`) with a block-table indirection (docs/resident.md).

ST copies contiguous scratchpad words to a contiguous external block. SCATTER copies rows [lo, hi) from
contiguous scratchpad words (``spad + k`` for the k-th word, ST's ``src + i``) into their slots of the
pool pages a block table names: each run (the rows of one page) is one contiguous external block, so
SCATTER is ST restarted once per run at a destination looked up in the table.

Timing after the start edge E0:

* a run begins with two lookup cycles, L1 (``table + (row >> page_log2)`` on the read port) and L2 (the
  entry in ``spad.rdata``, checked); then one MOVE cycle per word presents ``spad + k`` on the read port;
* the word read in a MOVE cycle is in ``spad.rdata`` the next cycle and written to external memory then
  (that cycle may be the next run's L1: the read port is free again by then);
* ``done`` is high two cycles after the last MOVE cycle: B = 2 * runs + words + 2;
* a failing check in L2 writes nothing more; ``done`` is high two cycles after that L2:
  B = 2 * j + words_done + 2, with ``error``, ``error_kind`` and ``error_info`` as in `GatherUnit`.
"""
from amaranth.hdl import Cat, Module, Mux, Signal

from hdl.isa import Op

from .gather import Isolated, TableWalk, error_ports
from .st import StoreUnit

__all__ = ["ScatterUnit"]


class ScatterUnit(Isolated, StoreUnit):
    """SCATTER: contiguous scratchpad words -> their pool slots, through the block table.

    `StoreUnit`'s ports (``spad`` reads the table and the words; ``wr_*`` is the external write port)
    plus the error report of `hdl.units.gather.GatherUnit` (``error``, ``error_kind``, ``error_info``).
    """

    OP = Op.SCATTER

    def external_access(self):
        # a group's first lane always writes (docs/ext-port.md)
        return self.wr_valid if self.config.ext_port == 1 else self.wr_valid[0]

    def ports(self, cfg):
        return {**super().ports(cfg), **error_ports(cfg)}

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        opr = self.operand_register()
        walk = TableWalk(m, self, opr)
        issued = self.addr_signal("issued")         # words read so far: the next is at spad + issued
        dst = Signal(cfg.ext_addr_bits, name="dst")   # external address of the next word
        v = Signal(name="v")                        # spad.rdata holds a word to write this cycle
        wa = Signal(cfg.ext_addr_bits, name="wa")     # ... and this is its external address
        moving = Signal()

        if cfg.ext_port > 1:
            # a group of min(P, row words) words a MOVE cycle (docs/ext-port.md): lane k writes when the
            # group has a word k
            v = Signal(cfg.ext_port, name="v")
            lanes = Cat(1, *(walk.group_mask >= k for k in range(1, cfg.ext_port)))
        else:
            lanes = 1
        # ST's datapath: the table entry or the next word read, the word read a cycle ago written
        self.store_path(m, Mux(moving, opr.spad + issued, walk.table_addr), v, wa)
        # ST's one-cycle delay from read to write
        m.d.sync += v.eq(Mux(moving, lanes, 0) if cfg.ext_port > 1 else moving)
        with m.If(moving):
            m.d.sync += wa.eq(dst)

        def move():
            m.d.comb += moving.eq(1)
            m.d.sync += [dst.eq(dst + walk.step), issued.eq(issued + walk.step)]

        def finish_now():
            # ST's end: the last word is written this cycle (END) or nothing is left (STOP)
            self.finish(m)

        walk.control(start_extra=[issued.eq(0)], found=[dst.eq(walk.pool_addr)], move=move,
                     stop_entry=[], end=finish_now, stop=finish_now)
        self._walk = walk
        self.check_protocol(m, opr)
        walk.check_isolation(self.wr_valid if cfg.ext_port == 1 else self.wr_valid[0], self.wr_addr, dst)
        return m
