"""Each unit's assertion scope is chosen in one place (`hdl.units.base.Scoped.scope_of`, issue 24 part 4):
on every preset chip the Asserts of each unit are exactly its `properties_of` under that scope, and
``sim.verify.formal`` has a target of that name proving the same properties.
"""
import re

import pytest
from amaranth.back import rtlil

from hdl.config import PRESETS
from hdl.properties import checks
from hdl.units import unit_classes
from sim.verify import formal

_ASSERT = re.compile(r'parameter \\FORMAT "([a-z_0-9]+)\.([a-z_0-9]+): ')


def asserted(design):
    """{scope: {property}} of the Asserts in `design`'s RTLIL (covers and other cells left out)."""
    out = {}
    with checks():                      # the simulation-only checks (exact completion) as well
        text = rtlil.convert(design, name="top")
    for scope, prop in _ASSERT.findall(text):
        out.setdefault(scope, set()).add(prop)
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_unit_asserts_are_under_the_scope_the_unit_chooses(preset):
    cfg = PRESETS[preset]
    targets = {t.name: t for t in formal.targets()}
    for op, cls in unit_classes(cfg).items():
        scope, props = cls.scope_of(cfg), cls.properties_of(cfg)
        assert asserted(cls(config=cfg)) == {scope: set(props)}, (preset, op)
        assert scope in targets, (preset, op, scope)
        assert targets[scope].properties == props, (preset, op, scope)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_one_chips_formal_targets_follow_its_scopes(preset):
    """``python -m sim.formal --chip SPEC``: that chip's units under their scopes there, then the chip."""
    from hdl.chip import RESIDENT_CHIP_PROPERTIES
    cfg = PRESETS[preset]
    targets = formal.targets(cfg)
    assert [t.name for t in targets] == ([cls.scope_of(cfg) for cls in unit_classes(cfg).values()] +
                                         ["prefetch" if cfg.prefetch else "chip"])
    chip = targets[-1]
    assert (set(RESIDENT_CHIP_PROPERTIES) <= set(chip.properties)) == cfg.generated
    # every chip property by induction but wait_bounded (bounded from reset), with the units' write_in_busy kept
    assert chip.induct == set(chip.properties) - {"wait_bounded"} and chip.keep == ("*.write_in_busy",)
