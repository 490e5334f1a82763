"""What the chip's seven execution units share: their port block, operand latching and done pulse (spec 4).

A unit acts on `start` (the sequencer's ISSUE cycle) only while not busy: at that edge E0 it latches its
operands from `ins` and raises `busy`; at its last working edge it drops `busy` and raises the registered
one-cycle `done`, which the sequencer sees in the last WAIT cycle W_B.

One control idiom for every unit: an ``m.FSM`` (`Unit.control`) whose states are the phases of the unit's
timing contract, first ``IDLE``; ``busy`` is "not in IDLE". Chosen over explicit counters and flags because
the phases then carry the names the contracts and spec 4 use (in a VCD and in the emitted Verilog too),
and ``busy`` cannot disagree with the phase, which lets the formal tools prove the contract by induction. Every unit talks to the
scratchpad through one member, ``spad`` (`hdl.scratchpad.SpadPort`); the chip routes the owner's by ``cur``.
"""
from contextlib import contextmanager

from amaranth.hdl import Cat, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl.config import BOOK
from hdl.isa import HW_OPERANDS, Op, busy_cycles, field_bits, hw_operands, issue_limits
from hdl.properties import UNIT_PROPERTIES, History, checking, unit_protocol
from hdl.scratchpad import SpadPort

__all__ = ["Scoped", "Unit", "SpadUnit", "operand", "operand_layout", "operand_bits", "COMPLETION_PROPERTIES",
           "WRITE_PROPERTIES", "WRITE_BUSY_PROPERTIES", "linear_busy", "completion_counter"]

# The timing contract as a property (issue 24): a unit's done comes exactly the instruction's busy time after
# the start edge. sim.verify.formal checks it bounded (a job that ends within the target's depth); every
# simulation evaluates it (a check of `hdl.properties.checks`: not in the emitted Verilog).
COMPLETION_PROPERTIES = {
    "exact_completion": "done comes exactly hdl.isa.busy_cycles(ins, cfg) cycles after the start edge, for the "
                        "instruction latched at it when the chip runs it (hdl.isa.issue_limits); LD's and "
                        "GATHER's with the memory answering in config.lat cycles, GATHER's and SCATTER's "
                        "error stop's too (hdl.isa.resident_busy_cycles)",
}
# Where a unit writes (issue 24): every scratchpad write of a unit lies in the destination region of the
# instruction it runs (checked as `COMPLETION_PROPERTIES`: a check of `hdl.properties.checks`, bounded in
# sim.formal).
WRITE_PROPERTIES = {
    "write_region": "every scratchpad write lies in the instruction's destination region: [dst, dst + words) "
                    "modulo the depth (RQ, SM, VADD: len words; UNPACK 8*len; AMAX 1), MM's dst + m*ldc + n in "
                    "m-major order, GATHER's [spad, spad + words) for a response to one of its requests; for an "
                    "instruction the chip runs (hdl.isa.issue_limits)",
}
# A unit writes only while it works (issue 24): the unit's half of the chip's owner_writes proof by induction
# (a busy unit is the one `cur` names: hdl.chip.CHIP_INVARIANTS). Every unit that writes the scratchpad from its
# own state asserts it (a check of `hdl.properties.checks`; proved by induction on the unit's target and kept
# as a strengthening in the chip's); not LD and GATHER, whose write is a memory response (their writes are
# tied to their requests at chip level, sim.verify.formal.IN_FLIGHT_PROPERTIES). RQ and MM with the piped
# requantizer carry the same property outside checks() (hdl.units.rq.RQ_PIPE_PROPERTIES).
WRITE_BUSY_PROPERTIES = {
    "write_in_busy": "the scratchpad is written only in a busy cycle",
}
# Bits of the cycle count since the start: a VADD of 65,535 elements on one port takes 131,072.
COMPLETION_BITS = 20


def linear_busy(op, cfg):
    """(a, b) with ``hdl.isa.busy_cycles`` of an instruction of `op` and length n equal to a*n + b on the chip
    `cfg` (the units whose busy time is linear in their length: LD with ``cfg.lat``, ST, RQ, SM, VADD, AMAX,
    UNPACK), taken from
    the cycle model itself, the one definition; a model that is not linear raises ValueError."""
    hi, lo = HW_OPERANDS[op]["len"]
    # LD's time has the memory's LAT in it: the one the chip is built for
    times = [busy_cycles((int(op) << 124) | (n << lo), cfg.lat, cfg=cfg) for n in (0, 1, 2, 1000)]
    a, b = times[1] - times[0], times[0]
    if any(t != a * n + b for n, t in zip((0, 1, 2, 1000), times)):
        raise ValueError(f"the busy time of {Op(op).name} on {cfg.spec()} is not linear in its length")
    return a, b


def completion_counter(m, start, busy, width=COMPLETION_BITS):
    """The cycles since a start edge: 1 in W1, k in Wk (and in the done cycle W_B, B), counted while busy
    (`width` bits)."""
    waited = Signal(width, name="waited")
    with m.If(start & ~busy):
        m.d.sync += waited.eq(1)
    with m.Elif(busy):
        m.d.sync += waited.eq(waited + 1)
    return waited


def operand(ins, op, name, cfg=None):
    """Operand `name` of opcode `op`, sliced from the instruction word `ins` (``HW_OPERANDS`` bits, or with
    a chip `cfg` the bits it reads: ``hdl.isa.field_bits``)."""
    hi, lo = field_bits(op, name, cfg)
    return ins[lo:hi + 1]


def operand_layout(op, cfg=None):
    """A struct of every operand of `op`, each as wide as its field in ``HW_OPERANDS``; with a chip `cfg`,
    only the operands that chip reads (``hdl.isa.hw_operands``: the book's MM has no rq flag)."""
    fields = HW_OPERANDS[op] if cfg is None else hw_operands(op, cfg)
    return data.StructLayout({name: hi - lo + 1 for name, (hi, lo) in fields.items()})


def operand_bits(ins, op, cfg=None):
    """Every operand of `op` from `ins`, concatenated in `operand_layout(op, cfg)` order."""
    return Cat(operand(ins, op, name, cfg) for name in (HW_OPERANDS[op] if cfg is None else hw_operands(op, cfg)))


class Scoped:
    """Where a unit's properties live (`hdl.properties`): the one place their scope is chosen.

    A unit's Asserts carry the scope (``"<scope>.<property>: ..."``) and ``sim.verify.formal`` names the
    target that proves them by it, so a generator parameter that gives the unit another design gives it
    another scope here (and a target there) and nowhere else. A class sets `OP`; an instance has
    ``config``.
    """

    OP: Op = None
    # The unit's scratchpad write is a memory response arriving (LD, GATHER), not a step of its own state: no
    # `WRITE_BUSY_PROPERTIES` at unit level (a free environment answers whenever it likes).
    RESPONSE_WRITES = False
    # The unit asserts `COMPLETION_PROPERTIES`: its busy time is the instruction's (`busy_cycles`), for LD
    # and GATHER with the memory's latency the chip is built for (``config.lat``), and GATHER's and
    # SCATTER's also the table's (where an error stops them). Every unit so far.
    TIMED = True
    # Bits of the cycle count the exact completion compares (`completion_counter`).
    COMPLETION_WIDTH = COMPLETION_BITS

    # A unit of the external port (LD, ST, GATHER, SCATTER): on a chip with ``ext_port`` > 1 it moves groups of
    # words (docs/ext-port.md), another design, under the scope ``<op>_port``.
    PORT_UNIT = False

    @classmethod
    def scope_of(cls, cfg):
        """The scope of this unit's properties on the chip `cfg`: its opcode's name by default, with ``_port``
        for a `PORT_UNIT` on a chip with ``ext_port`` > 1."""
        name = cls.OP.name.lower()
        return f"{name}_port" if cls.PORT_UNIT and cfg.ext_port > 1 else name

    @classmethod
    def properties_of(cls, cfg):
        """The properties (name -> statement) this unit has on the chip `cfg`: the unit contract
        (`hdl.properties.UNIT_PROPERTIES`), `COMPLETION_PROPERTIES` when `TIMED` and, in a subclass, its
        own."""
        writes = getattr(cls, "WRITES", False)
        return {**UNIT_PROPERTIES, **(COMPLETION_PROPERTIES if cls.TIMED else {}),
                **(WRITE_PROPERTIES if writes and cls.OP != Op.LD else {}),
                **(WRITE_BUSY_PROPERTIES if writes and not cls.RESPONSE_WRITES else {})}

    @property
    def scope(self):
        """This unit's scope: ``scope_of(self.config)``."""
        return self.scope_of(self.config)


class Unit(Scoped, wiring.Component):
    """Base class of the units: the ports the chip connects by name, and the start/done skeleton.

    A subclass sets `OP` to its opcode and adds its ports in `ports`. Its operands are latched into one
    register of ``operand_layout(OP)``: one signal for a simulator to update. `READS` and `WRITES` say
    which side of the scratchpad port the unit uses (hardware spec 2.3: the chip routes only those); a
    plain `Unit` reads, a `SpadUnit` also writes.

    Parameters
    ----------
    config : hdl.config.ChipConfig
        The chip this unit belongs to (keyword only; the book's chip by default): it sets the width of
        the scratchpad addresses and of the counters that step through them.

    Ports
    -----
    start : In(1)
        One-cycle pulse in the sequencer's ISSUE cycle; ignored while busy.
    ins : In(128)
        The instruction register; the operands are taken from it at E0.
    busy : Out(1)
        High from E0 until the unit's last working edge.
    done : Out(1)
        Registered one-cycle pulse in the unit's last WAIT cycle.
    spad : Out(SpadPort.of(config))
        The scratchpad port: ``raddr`` out, the registered ``rdata`` (the word at the previous cycle's
        ``raddr``) in; ``we``/``waddr``/``wdata`` stay 0 unless the unit writes (`SpadUnit`).
    """

    OP: Op = None
    READS = True
    WRITES = False

    def __init__(self, *, config=BOOK):
        self.config = config
        # The signature depends on the configuration, so it is built here rather than annotated.
        super().__init__(self.ports(config))

    def ports(self, cfg):
        """The members of this unit's signature for configuration `cfg` (a subclass adds its own)."""
        return {
            "start": In(1),
            "ins":   In(128),
            "busy":  Out(1),
            "done":  Out(1),
            "spad":  Out(SpadPort.of(cfg)),
        }

    def addr_signal(self, name):
        """A counter or pointer as wide as a scratchpad address (it wraps with the addresses)."""
        return Signal(self.config.spad_addr_bits, name=name)

    def operand_register(self):
        """A new register for this unit's operands, laid out as ``operand_layout(self.OP, self.config)``."""
        return Signal(operand_layout(self.OP, self.config), name="opr")

    @contextmanager
    def control(self, m):
        """The unit's FSM (named ``<op>_state``): yields it; the caller's first state must be ``IDLE``.

        ``busy`` is driven as "the FSM is not in IDLE", and ``done`` is low after every edge that does
        not `finish`. In IDLE a unit waits for ``start`` and then calls `begin` and leaves IDLE.
        """
        self.done_pulse(m)
        with m.FSM(name=f"{self.OP.name.lower()}_state") as fsm:
            yield fsm
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))

    def begin(self, m, opr):
        """At E0 (under ``start`` in IDLE): latch the operands into `opr`."""
        m.d.sync += opr.eq(operand_bits(self.ins, self.OP, self.config))

    def finish(self, m):
        """The last working edge (inside a state of `control`): pulse done, cleared by `done_pulse` one
        edge later, and go back to IDLE."""
        m.d.sync += self.done.eq(1)
        m.next = "IDLE"

    def stream(self, m, i, j, v, n, last, each=None):
        """The read skeleton: element i's address goes out now, its word is in ``spad.rdata`` next cycle.

        `v` is set in the cycle in which ``spad.rdata`` holds element `j`; then `each` (if any) runs and j
        steps. `last` runs in the cycle of element n-1, under that condition. ``n - 1`` is signed in
        Amaranth: with n = 0 it is -1 and never matches, as in the RTL.
        """
        m.d.sync += v.eq(i < n)
        with m.If(i < n):
            m.d.sync += i.eq(i + 1)
        with m.If(v):
            if each is not None:
                each()
            m.d.sync += j.eq(j + 1)
            with m.If(j == n - 1):
                last()

    def one_pass(self, m, opr, n, drain=False):
        """The whole control of a unit that streams `n` words once (ST, RQ); returns (i, j, v).

        States IDLE and STREAM. At E0 the operands are latched into `opr` and i = j = v = 0; then
        `stream` runs until element n-1 is in ``spad.rdata``, whose cycle finishes the unit: ``done`` is
        high in W(n+2). With `drain` (a unit whose write is a cycle later: RQ on an rq_pipe chip) that
        cycle goes to a state DRAIN instead, whose edge writes the last word and finishes: W(n+3).
        """
        i = self.addr_signal("i")
        j = self.addr_signal("j")
        v = Signal(name="v")
        with self.control(m):
            with m.State("IDLE"):
                with m.If(self.start):
                    self.begin(m, opr)
                    m.d.sync += [i.eq(0), j.eq(0), v.eq(0)]
                    m.next = "STREAM"
            with m.State("STREAM"):
                def last():
                    if drain:
                        m.next = "DRAIN"
                    else:
                        self.finish(m)
                    m.d.sync += v.eq(0)
                self.stream(m, i, j, v, n, last)
            if drain:
                with m.State("DRAIN"):
                    self.finish(m)
        return i, j, v

    def done_pulse(self, m):
        """`done` is low after every edge that does not `finish`."""
        m.d.sync += self.done.eq(0)

    def check_protocol(self, m, opr):
        """The start/busy/done contract (`hdl.properties.UNIT_PROPERTIES`) and, for a `TIMED` unit, the
        exact completion (`COMPLETION_PROPERTIES`), as Asserts in `m` under the unit's `scope`."""
        unit_protocol(m, self.scope, self.start, self.busy, self.done, opr.as_value())
        if not checking():
            return
        # both for an instruction the chip runs (hdl.isa.issue_limits: a chip other than the book's stops on
        # the others; the book's hangs on a zero length, and an MM past the array is not this unit's to time)
        limits = issue_limits(self.OP, self.config).items()
        legal = Cat(*(getattr(opr, name) >= least for name, (least, _) in limits),
                    *(getattr(opr, name) <= most for name, (_, most) in limits)).all()
        if self.TIMED:
            waited = completion_counter(m, self.start, self.busy, self.COMPLETION_WIDTH)
            applies, cycles = self.completion(m, opr)
            applies = Value.cast(applies)       # a 1-bit value (~ of the Python int 1 would be -2: all ones)
            History(m, self.scope).check("exact_completion", ~self.done | ~legal | ~applies | (waited == cycles),
                                         COMPLETION_PROPERTIES["exact_completion"],
                                         covers={"done": self.done & applies})
        # write_in_busy, unless the unit asserts it outside checks() already (its properties_of then carries
        # that statement: RQ_PIPE_PROPERTIES')
        statement = self.properties_of(self.config).get("write_in_busy")
        if statement is WRITE_BUSY_PROPERTIES["write_in_busy"]:
            History(m, self.scope).check("write_in_busy", ~self.spad.we | self.busy, statement,
                                         covers={"a write": self.spad.we})
        if self.WRITES:
            write = self.spad.we & self.write_counts(opr)
            History(m, self.scope).check("write_region", ~write | ~legal | self.write_inside(m, opr),
                                         WRITE_PROPERTIES["write_region"], covers={"a write": write})

    def completion(self, m, opr):
        """(applies, cycles) of the exact completion: the busy time of the instruction in `opr` as a value
        (`busy_cycles`), and when the property speaks (always, but for a unit that reads the external
        memory: when it answered on time). Monitors it needs are added to `m`."""
        return 1, self.busy_cycles(opr)

    def write_counts(self, opr):
        """Whether a write this cycle is one of the instruction's (1; GATHER: a response to its requests)."""
        return 1

    def write_inside(self, m, opr):
        """The write this cycle (``spad.waddr``) lies in [dst, dst + `out_words`) modulo the depth."""
        return (self.spad.waddr - opr.dst)[:self.config.spad_addr_bits] < self.out_words(opr)

    def out_words(self, opr):
        """The words the instruction in `opr` writes from its dst: len (RQ, SM, VADD)."""
        return opr.len

    def busy_cycles(self, opr):
        """``hdl.isa.busy_cycles`` of the instruction latched in `opr`, as a value: ``a*len + b``
        (`linear_busy`); the MM unit has its own."""
        a, b = linear_busy(self.OP, self.config)
        return a * opr.len + b


class SpadUnit(Unit):
    """A unit that also writes the scratchpad: the chip routes its ``spad.we/waddr/wdata`` by ``cur``."""

    WRITES = True
