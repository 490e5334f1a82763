"""hdl.units.base: the operand register every unit latches holds the fields hdl.isa.operands reads from the word.

hdl.isa.operands extracts the fields with plain integer shifts; here the same words go through the Amaranth
slicing and packing (operand_bits into an operand_layout register), so a wrong field order, width or
offset in hdl/units/base.py shows as a mismatch.
"""
import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib.wiring import Out

from hdl.isa import HW_OPERANDS, Op, operands
from hdl.config import ChipConfig
from hdl.scratchpad import SpadPort
from hdl.units.base import SpadUnit, Unit, operand, operand_bits, operand_layout
from hdl.units.ld import DMA
from hdl.units.mm import MatrixUnit
from hdl.units.st import StoreUnit
from hdl.units.vadd import VaddUnit
from tests.simutil import built, run

OPS = [op for op in Op if HW_OPERANDS[op]]


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_operand_register_matches_isa_operands(op):
    rng = random.Random(int(op))
    # random words with this opcode (operands() reads the fields of the word's own opcode)
    fields = [rng.getrandbits(124) for _ in range(40)] + [0, (1 << 124) - 1]
    words = [f | int(op) << 124 for f in fields]
    m = Module()
    ins = Signal(128)
    opr = Signal(operand_layout(op))
    single = {name: Signal(hi - lo + 1, name=f"f_{name}") for name, (hi, lo) in HW_OPERANDS[op].items()}
    m.d.comb += opr.eq(operand_bits(ins, op))
    m.d.comb += [sig.eq(operand(ins, op, name)) for name, sig in single.items()]

    async def bench(ctx):
        for w in words:
            ctx.set(ins, w)
            want = operands(w)
            for name in HW_OPERANDS[op]:
                assert ctx.get(getattr(opr, name)) == want[name], (op.name, name, hex(w))
                assert ctx.get(single[name]) == want[name], (op.name, name, hex(w))

    run(m, bench, clocked=False)


def test_port_blocks():
    """Every unit has the same scratchpad port, ``spad`` (SpadPort of its chip); READS/WRITES say which
    side the chip routes (spec 2.3: ST only reads, LD only writes)."""
    common = {"start": 1, "ins": 128, "busy": 1, "done": 1}
    vadd = built(VaddUnit())
    store = built(StoreUnit())
    assert {n: len(getattr(vadd, n)) for n in vadd.signature.members if n != "spad"} == common
    assert {n: len(getattr(store, n)) for n in store.signature.members if n != "spad"} == {
        **common, "wr_valid": 1, "wr_addr": 16, "wr_data": 32}
    for unit in (vadd, store, built(DMA()), built(MatrixUnit())):
        assert unit.signature.members["spad"] == Out(SpadPort(12, 32))
    wide = ChipConfig(mm_load=4)
    assert built(MatrixUnit(config=wide)).signature.members["spad"] == Out(SpadPort.of(wide, reads=4))
    assert built(VaddUnit(config=wide)).signature.members["spad"] == Out(SpadPort.of(wide))
    assert issubclass(VaddUnit, SpadUnit) and issubclass(StoreUnit, Unit)
    assert not issubclass(StoreUnit, SpadUnit)
    assert [(c.READS, c.WRITES) for c in (StoreUnit, VaddUnit, MatrixUnit, DMA)] == [
        (True, False), (True, True), (True, True), (False, True)]
