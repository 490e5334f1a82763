"""Named design properties as Amaranth `Assert` statements (issue 10: verification that cannot be fooled).

Every property lives in the design itself: Amaranth's simulator evaluates it at every clock edge of every
run, Verilator sees it as an immediate ``assert``, and ``python -m sim.formal`` proves it with SymbiYosys.
A property is one synchronous `Assert` whose message starts with its name, ``"<scope>.<name>: ..."``;
the formal harness keeps the properties it proves by that prefix (Yosys ``r:FORMAT=<name>:*``).

The checks are synchronous: the Assert at the edge that closes cycle t looks at the values of cycle t,
and `History.past` registers give the values of cycle t-1. A cycle has *no valid past* when it is the
first one or when ``rst`` was high in the cycle before it (a reset is not a transition of the design).

Each property also names its *triggers*: the events that make it say something (an MM write for the
chip's ownership property, a start for a unit's contract). They become `Cover` statements, message
``"<scope>.<name>.cover: <event>"``, only inside `covers()`: ``python -m sim.formal`` emits its targets so
and shows each trigger reached, so that no property holds only because its trigger never happens. Outside
it the design is its Asserts alone (the Verilog and every simulation are unchanged by the covers).
"""
import contextlib
import contextvars

from amaranth.hdl import Assert, Cover, ResetSignal, Signal, Value

__all__ = ["History", "unit_protocol", "UNIT_PROPERTIES", "covers", "COVER_TAG", "checks", "checking"]

# The cover of property "<scope>.<name>" has the message "<scope>.<name>" + COVER_TAG + " <event>".
COVER_TAG = ".cover:"
_COVERS = contextvars.ContextVar("ga2_property_covers", default=False)


@contextlib.contextmanager
def covers():
    """Within this block, designs elaborated (``rtlil.convert`` elaborates) carry their properties' covers."""
    token = _COVERS.set(True)
    try:
        yield
    finally:
        _COVERS.reset(token)


_CHECKS = contextvars.ContextVar("ga2_simulation_checks", default=False)


@contextlib.contextmanager
def checks():
    """Within this block, designs elaborated also carry the checks that only a simulation or a proof needs:
    a unit's exact completion, a generated chip's WAIT bound (issue 24), counters and arithmetic that the
    synthesized chip would carry for nothing. The Amaranth backend, the tests' simulations and
    ``sim.formal`` elaborate inside it; outside it (``sim.verilog``, synthesis, the Verilator models) the
    design is as without these checks."""
    token = _CHECKS.set(True)
    try:
        yield
    finally:
        _CHECKS.reset(token)


def checking() -> bool:
    """True inside `checks`."""
    return _CHECKS.get()

# The start/busy/done contract that every unit (the seven of hdl/units/ and the LD engine) obeys,
# by property name; the text is the one-line statement printed by sim.verify.formal and used in the message.
UNIT_PROPERTIES = {
    "done_ends_busy": "done only in the cycle after a busy one, with busy low (never while idle)",
    "busy_drops_with_done": "busy falls only together with a done pulse",
    "done_one_cycle": "done is never high two cycles in a row",
    "busy_after_start": "busy rises only in the cycle after start (nothing works without a start)",
    "start_while_busy_ignored": "a start while busy leaves the latched operands as they were",
}


class History:
    """Past values for the properties of one module, and the named `Assert` they go into.

    The history registers are ``reset_less``: they keep following their signal through a reset, so
    that ``valid`` can tell a reset cycle apart from a real transition.

    Parameters
    ----------
    m : Module
        The module the registers and Asserts are added to (its ``sync`` domain).
    scope : str
        Prefix of every property name, e.g. ``"st"`` or ``"chip"``.
    """

    def __init__(self, m, scope):
        self.m = m
        self.scope = scope
        started = Signal(name=f"{scope}_prop_started", reset_less=True)
        was_rst = Signal(name=f"{scope}_prop_was_rst", reset_less=True)
        # A board's clock domain may have no reset (the ULX3S top's): then its reset reads 0.
        m.d.sync += [started.eq(1), was_rst.eq(ResetSignal(allow_reset_less=True))]
        self.valid = Signal(name=f"{scope}_prop_valid")
        m.d.comb += self.valid.eq(started & ~was_rst)

    def past(self, value, name):
        """A register holding `value` as it was in the previous cycle."""
        value = Value.cast(value)
        reg = Signal(value.shape(), name=f"{self.scope}_past_{name}", reset_less=True)
        self.m.d.sync += reg.eq(value)
        return reg

    def check(self, name, holds, text, covers=None):
        """Assert `holds` at every edge; the message is ``"<scope>.<name>: <text>"``.

        `covers` maps each trigger of the property (its event, in words) to the condition that it happens
        in the current cycle; inside `covers()` each becomes a `Cover` of that condition in a cycle with a
        valid past (see the module doc).
        """
        self.m.d.sync += Assert(holds, f"{self.scope}.{name}: {text}")
        if covers and _COVERS.get():
            for event, happens in covers.items():
                self.m.d.sync += Cover(self.valid & happens, f"{self.scope}.{name}{COVER_TAG} {event}")


def unit_protocol(m, scope, start, busy, done, operands):
    """Add the `UNIT_PROPERTIES` of one unit to `m`.

    Parameters
    ----------
    m : Module
        The unit's module.
    scope : str
        The unit's name (``"st"``, ``"mm"``, ..., ``"ld"``).
    start, busy, done : Signal
        The unit's protocol ports.
    operands : Value
        Everything the unit latches at its start edge.
    """
    h = History(m, scope)
    t = UNIT_PROPERTIES
    p_start, p_busy, p_done = h.past(start, "start"), h.past(busy, "busy"), h.past(done, "done")
    p_opr = h.past(operands, "opr")
    fell = h.valid & p_busy & ~busy
    h.check("done_ends_busy", ~done | fell, t["done_ends_busy"], covers={"done": done})
    h.check("busy_drops_with_done", ~fell | done, t["busy_drops_with_done"], covers={"busy falls": fell})
    h.check("done_one_cycle", ~(h.valid & p_done & done), t["done_one_cycle"],
            covers={"the cycle after done": p_done})
    h.check("busy_after_start", ~busy | (h.valid & (p_busy | p_start)), t["busy_after_start"],
            covers={"busy rises": busy & ~p_busy})
    h.check("start_while_busy_ignored", ~(h.valid & p_start & p_busy) | (operands == p_opr),
            t["start_while_busy_ignored"], covers={"a start while busy": p_start & p_busy})
