"""The SCATTER unit alone (hdl/units/scatter.py) against the cycle model of docs/resident.md.

Same fixture and cases as tests/test_unit_gather.py (`expected` has both instructions): two lookup cycles
per run, one scratchpad read per word right after L2, each word written to external memory one cycle
after its read, ``done`` two cycles after the last read cycle or after the failing L2; then the same
instruction on the reference machine must leave the same external memory, busy time and error.
"""
import pytest

from hdl.isa import Op
from hdl.units.gather import ErrorKind
from tests.test_unit_gather import CASES, base_spad, check_reference, expected, fields, simulate, with_table


@pytest.mark.parametrize("lat", [1, 8])     # LAT does not change SCATTER; the unit is built for it anyway
def test_scatter_against_doc_and_reference(lat):
    spad0 = base_spad(10 + lat)
    jobs = [(f, with_table(spad0, f["table"], entries)) for _, f, entries in CASES]
    results = simulate(Op.SCATTER, jobs, lat, seed=lat)
    for (name, f, entries), (_, spad), (b, events, err, spad_after, ext) in zip(CASES, jobs, results):
        want_b, want_events, want_err = expected(Op.SCATTER, f, spad, lat)
        assert (b, err) == (want_b, want_err), name
        assert events == want_events, name
        assert spad_after == spad, name                 # SCATTER never writes the scratchpad
        check_reference(Op.SCATTER, f, spad, lat, b, err, spad, ext, name)


def test_scatter_empty_range_and_error_cleared():
    spad0 = with_table(base_spad(7), 3000, [99, 1])
    jobs = [(fields(lo=6, hi=2), spad0), (fields(lo=0, hi=2, pool_pages=50), spad0),
            (fields(lo=0, hi=2, table=3001), spad0)]
    (b0, ev0, err0, _, _), (b1, _, err1, _, _), (b2, ev2, err2, _, _) = simulate(Op.SCATTER, jobs, 4)
    assert (b0, ev0, err0) == (2, {}, None)
    assert (b1, err1) == (2 + 2, (ErrorKind.PAGE, 99))
    assert (b2, ev2, err2) == expected(Op.SCATTER, jobs[2][0], spad0, 4)
