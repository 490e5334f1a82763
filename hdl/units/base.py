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

from amaranth.hdl import Cat, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl.config import BOOK
from hdl.isa import HW_OPERANDS, Op, hw_operands
from hdl.properties import UNIT_PROPERTIES, unit_protocol
from hdl.scratchpad import SpadPort

__all__ = ["Scoped", "Unit", "SpadUnit", "operand", "operand_layout", "operand_bits"]


def operand(ins, op, name):
    """Operand `name` of opcode `op`, sliced from the instruction word `ins` (``HW_OPERANDS`` bits)."""
    hi, lo = HW_OPERANDS[op][name]
    return ins[lo:hi + 1]


def operand_layout(op, cfg=None):
    """A struct of every operand of `op`, each as wide as its field in ``HW_OPERANDS``; with a chip `cfg`,
    only the operands that chip reads (``hdl.isa.hw_operands``: the book's MM has no rq flag)."""
    fields = HW_OPERANDS[op] if cfg is None else hw_operands(op, cfg)
    return data.StructLayout({name: hi - lo + 1 for name, (hi, lo) in fields.items()})


def operand_bits(ins, op, cfg=None):
    """Every operand of `op` from `ins`, concatenated in `operand_layout(op, cfg)` order."""
    return Cat(operand(ins, op, name) for name in (HW_OPERANDS[op] if cfg is None else hw_operands(op, cfg)))


class Scoped:
    """Where a unit's properties live (`hdl.properties`): the one place their scope is chosen.

    A unit's Asserts carry the scope (``"<scope>.<property>: ..."``) and ``sim.verify.formal`` names the
    target that proves them by it, so a generator parameter that gives the unit another design gives it
    another scope here (and a target there) and nowhere else. A class sets `OP`; an instance has
    ``config``.
    """

    OP: Op = None

    @classmethod
    def scope_of(cls, cfg):
        """The scope of this unit's properties on the chip `cfg`: its opcode's name by default."""
        return cls.OP.name.lower()

    @classmethod
    def properties_of(cls, cfg):
        """The properties (name -> statement) this unit has on the chip `cfg`: the unit contract
        (`hdl.properties.UNIT_PROPERTIES`) and, in a subclass, its own."""
        return dict(UNIT_PROPERTIES)

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
        """The start/busy/done contract (`hdl.properties.UNIT_PROPERTIES`) as Asserts in `m`, under the
        unit's `scope`."""
        unit_protocol(m, self.scope, self.start, self.busy, self.done, opr.as_value())


class SpadUnit(Unit):
    """A unit that also writes the scratchpad: the chip routes its ``spad.we/waddr/wdata`` by ``cur``."""

    WRITES = True
