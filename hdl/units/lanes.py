"""What the RQ and VADD units share on a chip with ``vec_lanes`` = l > 1 (docs/vec-lanes.md): a pass over
`len` elements a group of l consecutive ones a cycle, the busy time of that pass, and the write region of
every write lane.

The group schedule is `Unit.one_pass`'s with the counters stepping by l: group g (elements g*l .. g*l+l-1,
the last group cut at len) has its address out in W(g+1) and its words in the read lanes in W(g+2). The
counters count elements, 17 bits, so a length up to 65,535 ends whatever the scratchpad's depth; the
addresses are the counters' low bits added to src or dst (modulo the depth).
"""
from amaranth.hdl import Cat, Signal

from hdl.isa import HW_OPERANDS, busy_cycles

__all__ = ["VectorLanes", "lane_pass", "lanes_busy"]

# Bits of an element counter: a length (16 bits) plus the step past it.
COUNT_BITS = 17


def lanes_busy(op, cfg, l=None):
    """(l, b) with ``hdl.isa.busy_cycles`` of an instruction of `op` and length n equal to ceil(n/l) + b on
    the chip `cfg` (RQ and VADD with ``vec_lanes`` = l; LD and ST with ``ext_port`` = l, docs/ext-port.md,
    when `l` is given), read from the cycle model itself, the one definition; a model of another form
    raises ValueError."""
    l = cfg.vec_lanes if l is None else l
    hi, lo = HW_OPERANDS[op]["len"]
    lengths = (1, 2, 3, 4, 5, 8, 9, 1000, (1 << (hi - lo + 1)) - 1)      # the longest the field holds
    times = [busy_cycles((int(op) << 124) | (n << lo), cfg.lat, cfg=cfg) for n in lengths]
    b = times[0] - 1
    if any(t != -(-n // l) + b for n, t in zip(lengths, times)):
        raise ValueError(f"the busy time of {op.name} on {cfg.spec()} is not ceil(len/{l}) + a constant")
    return l, b


def lane_pass(unit, m, opr, n, l, drain=False):
    """The control of a unit that streams `n` elements once, `l` a cycle; returns (i, j, v, valid).

    States IDLE, STREAM (and DRAIN with `drain`), as `Unit.one_pass`: at E0 the operands are latched and
    i = j = v = 0; each cycle the group at element i has its address out (i steps by l while i < n); v is
    set in the cycle the read lanes hold the group at element j, which then steps by l; the cycle of the
    last group (j + l >= n) finishes the unit, done in W(ceil(n/l) + 2), or goes to DRAIN, done a cycle
    later. `valid` (l bits, combinational) has bit k set when v and j + k < n: lane k's word is an element.
    """
    i = Signal(COUNT_BITS, name="i")
    j = Signal(COUNT_BITS, name="j")
    v = Signal(name="v")
    valid = Signal(l, name="valid")
    m.d.comb += valid.eq(Cat(v & (j + k < n) for k in range(l)))
    with unit.control(m):
        with m.State("IDLE"):
            with m.If(unit.start):
                unit.begin(m, opr)
                m.d.sync += [i.eq(0), j.eq(0), v.eq(0)]
                m.next = "STREAM"
        with m.State("STREAM"):
            m.d.sync += v.eq(i < n)
            with m.If(i < n):
                m.d.sync += i.eq(i + l)
            with m.If(v):
                m.d.sync += j.eq(j + l)
                with m.If(j + l >= n):
                    if drain:
                        m.next = "DRAIN"
                    else:
                        unit.finish(m)
                    m.d.sync += v.eq(0)
        if drain:
            with m.State("DRAIN"):
                unit.finish(m)
    return i, j, v, valid


class VectorLanes:
    """A mixin for a `SpadUnit` (before it in the bases) that takes ``vec_lanes`` = l > 1 elements a cycle:
    its busy time as a value is ceil(len/l) + b (`lanes_busy`), and the write region covers every write lane
    (lane k writes ``waddr + k`` when ``we_x[k-1]``). With one lane both are the `SpadUnit`'s."""

    def busy_cycles(self, opr):
        if self.config.vec_lanes == 1:
            return super().busy_cycles(opr)
        l, b = lanes_busy(self.OP, self.config)
        return ((opr.len + (l - 1)) >> (l.bit_length() - 1)) + b

    def write_inside(self, m, opr):
        inside = super().write_inside(m, opr)
        if self.config.vec_lanes == 1:
            return inside
        aw = self.config.spad_addr_bits
        for k in range(1, self.config.vec_lanes):
            lane = (self.spad.waddr + k - opr.dst)[:aw] < self.out_words(opr)
            inside = inside & (~self.spad.we_x[k - 1] | lane)
        return inside
