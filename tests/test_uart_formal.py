"""sim.verify.formal's `uart` target: its properties are proved by k-induction on the real UART, and each
fails on a UART broken for it (SymbiYosys finds the counterexample in a bounded check from reset).

The broken receivers need whole frames from reset before they can misbehave, so they are built at the
shortest bit the UART allows (clk_hz = 4 * baud: 4 cycles a bit, a frame in 40 cycles). Each proof takes a
few seconds; the generous time-outs cover the first yowasp run on a fresh machine (it compiles Yosys's
WebAssembly, minutes).
"""
import pytest

from hdl.uart import UART, UART_PROPERTIES, UARTRx, UARTTx, rx_sample, SYNC_STAGES
from sim.verify import formal

TOOLS = formal.find_tools()
TARGET = {t.name: t for t in formal.targets()}["uart"]
SHORT = (12, 3)                     # 4 cycles a bit


def verdict(prop, depth, build=None, mode="prove"):
    return formal.prove(TARGET, [prop], depth, TOOLS, build=build, mode=mode)


class EarlyStartTx(UARTTx):
    """Pulls the line low as soon as a byte is offered while idle, before taking it."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.i.valid & ~self.busy):
            m.d.comb += self.tx.eq(0)
        return m


class EmitOnFramingErrorRx(UARTRx):
    """Delivers the byte in the cycle after a framing error (a receiver that does not check the stop bit
    before filling its buffer)."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.framing_error):
            m.d.sync += self.o.valid.eq(1)
        return m


class OverwriteRx(UARTRx):
    """On an overrun, changes the byte still waiting in the buffer (keeping the new byte's bits, say)."""
    def elaborate(self, platform):
        m = super().elaborate(platform)
        with m.If(self.overrun):
            m.d.sync += self.o.payload.eq(~self.o.payload)
        return m


@pytest.mark.timeout(600)
def test_target_is_registered():
    assert set(TARGET.properties) == set(UART_PROPERTIES) == set(TARGET.induct)
    assert formal.properties("uart") == [(TARGET, p) for p in UART_PROPERTIES]


@pytest.mark.parametrize("rate", [(25_000_000, 3_000_000), (9, 2)], ids=["25M/3M", "9/2"])
@pytest.mark.timeout(600)
def test_uart_properties_proved_by_induction(rate):
    got = formal.prove(TARGET, list(UART_PROPERTIES), 4, TOOLS, build=lambda: UART(*rate))
    assert got[0] == "proved", got


@pytest.mark.timeout(600)
def test_tx_idle_high_fails_on_an_early_start():
    result, _, detail = verdict("tx_idle_high", 4, build=lambda: EarlyStartTx(*SHORT), mode="bmc")
    assert result == "FAIL", detail


@pytest.mark.timeout(600)
def test_no_byte_on_framing_error_fails_on_an_unchecked_stop_bit():
    # the first framing error can be shown SYNC_STAGES + rx_sample(9) cycles after reset, its byte one later
    depth = SYNC_STAGES + rx_sample(*SHORT, 9) + 4
    result, _, detail = verdict("rx_no_byte_on_framing_error", depth, build=lambda: EmitOnFramingErrorRx(*SHORT),
                                mode="bmc")
    assert result == "FAIL", detail


@pytest.mark.timeout(600)
def test_stream_stable_fails_on_an_overwritten_byte():
    # two good frames: the second completes while the first waits (the solver holds ready low)
    depth = 2 * (SYNC_STAGES + rx_sample(*SHORT, 9) + 2) + 2
    result, _, detail = verdict("rx_stream_stable", depth, build=lambda: OverwriteRx(*SHORT), mode="bmc")
    assert result == "FAIL", detail
