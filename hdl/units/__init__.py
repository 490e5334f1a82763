"""The chip's execution units, one module each (hardware spec 4): `base` (what they share: the port block,
operand latching, the start/busy/done skeleton, the scope of their properties), `ld` (the LD unit, the
book's DMA), `st`, `mm`, `rq`, `sm`, `vadd`, `amax`, `unpack`, and the resident mode's `gather` and
`scatter`. Every unit reaches the scratchpad through one `hdl.scratchpad.SpadPort` member, ``spad``.
"""

__all__ = ["unit_classes"]


def unit_classes(cfg):
    """The unit class of every opcode that the chip `cfg` runs on a unit, by opcode, LD's engine first
    (the units `hdl.chip.GA2` builds): ``sim.verify.formal`` proves each one's properties under its scope
    (`hdl.units.base.Scoped`)."""
    from hdl.isa import Op, legal_ops

    from .amax import ArgmaxUnit
    from .gather import GatherUnit
    from .ld import DMA
    from .mm import MatrixUnit
    from .rq import RequantUnit
    from .scatter import ScatterUnit
    from .sm import SoftmaxUnit
    from .st import StoreUnit
    from .unpack import UnpackUnit
    from .vadd import VaddUnit
    every = {Op.LD: DMA, Op.ST: StoreUnit, Op.MM: MatrixUnit, Op.RQ: RequantUnit, Op.SM: SoftmaxUnit,
             Op.VADD: VaddUnit, Op.AMAX: ArgmaxUnit, Op.UNPACK: UnpackUnit, Op.GATHER: GatherUnit,
             Op.SCATTER: ScatterUnit}
    legal = legal_ops(cfg)
    return {op: cls for op, cls in every.items() if op in legal}
