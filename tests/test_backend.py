"""`sim.backends.first_difference`, the one comparison behind every simulator-versus-reference check: a
difference in any one counter, external word or scratchpad word, first, middle or last, is found and named."""
import pytest

from sim.backends import COUNTER_NAMES, RunResult, first_difference

COUNTERS = [9039, 5196, 3203, 490, 74]
EXT = [0x11111111 * (i % 15) for i in range(40)]


SPAD = [(7 * i) & 0xFFFFFFFF for i in range(4096)]


def _result(counters=COUNTERS, ext=EXT, spad=SPAD):
    return RunResult(ext=list(ext), counters=list(counters), scratchpad=list(spad))


def test_identical_runs_have_no_difference():
    assert first_difference(_result(), _result()) is None


@pytest.mark.parametrize("k", range(5))
def test_every_counter_is_compared(k):
    got = list(COUNTERS)
    got[k] += 1 << 31                   # a difference in the top bit as well as a small one
    assert first_difference(_result(), _result(counters=got)) == \
        f"counter {COUNTER_NAMES[k]}: expected {COUNTERS[k]}, got {got[k]}"


@pytest.mark.parametrize("i", [0, 1, 20, len(EXT) - 1])
def test_every_external_word_is_compared(i):
    got = list(EXT)
    got[i] ^= 0x80000000
    assert first_difference(_result(), _result(ext=got)) == \
        f"external word {i}: expected 0x{EXT[i]:08x}, got 0x{got[i]:08x}"


def test_counters_come_before_words():
    got = list(EXT)
    got[0] += 1
    diff = first_difference(_result(), _result(counters=COUNTERS[:4] + [75], ext=got))
    assert diff == "counter n_inst: expected 74, got 75"


@pytest.mark.parametrize("i", [0, 2047, 4095])
def test_every_scratchpad_word_is_compared(i):
    got = list(SPAD)
    got[i] += 1
    assert first_difference(_result(), _result(spad=got)) == \
        f"scratchpad word {i}: expected 0x{SPAD[i]:08x}, got 0x{got[i]:08x}"
    assert first_difference(_result(), _result(spad=got), scratchpad=False) is None


class _BookOnly:
    """A backend class that does not take a configuration (as the RTL backends did before issue 12)."""

    def __init__(self, **options):
        self.options = options


def test_get_backend_hands_the_configuration_on(monkeypatch):
    from hdl.config import BOOK, parse_chip
    from sim import backends as B
    cfg = parse_chip("array=8")
    assert B.get_backend("reference", config=cfg).config == cfg
    assert B.get_backend("reference").config == BOOK
    monkeypatch.setitem(B.BACKENDS, "bookonly", f"{__name__}:_BookOnly")
    assert B.get_backend("bookonly", trace=True).options == {"trace": True}      # the book's chip: no config=
    with pytest.raises(B.BackendUnavailable, match=r"only the book's chip so far, not --chip array=8"):
        B.get_backend("bookonly", config=cfg)


# ---- an RTL trace from the sequencer's changes (the Verilator driver's "GA2T" jobs) -----------------

def _changes(*rows):
    from hdl.chip import SeqState
    return [(cycle, SeqState[state].value, pc) for cycle, state, pc in rows]


@pytest.mark.parametrize("rows, want", [
    # the book's way: FETCH, ISSUE, WAIT to the done cycle; HALT after its own FETCH and ISSUE
    ([(0, "FETCH", 0), (1, "ISSUE", 0), (2, "WAIT", 0), (6, "FETCH", 1), (7, "ISSUE", 1), (8, "HALT", 1)],
     [(0, 0, 1, 5, 2), (1, 6, 7, 7, 2)]),
    # a prefetch chip: the second word is issued in the first one's done cycle (5), the HALT in the
    # second's (9); each was read in the issue cycle of the one before
    ([(0, "FETCH", 0), (1, "ISSUE", 0), (2, "WAIT", 0), (6, "WAIT", 1), (10, "HALT", 2)],
     [(0, 0, 1, 5, 2), (1, 1, 5, 9, 0), (2, 5, 9, 9, 0)]),
    # an error stop's HALT comes the book's way even on a prefetch chip
    ([(0, "FETCH", 0), (1, "ISSUE", 0), (2, "WAIT", 0), (4, "WAIT", 1), (7, "FETCH", 2), (8, "ISSUE", 2),
      (9, "HALT", 2)],
     [(0, 0, 1, 3, 2), (1, 1, 3, 6, 0), (2, 7, 8, 8, 2)]),
    # a one-cycle WAIT (RQC) between two others
    ([(0, "FETCH", 0), (1, "ISSUE", 0), (2, "WAIT", 0), (3, "WAIT", 1), (4, "WAIT", 2), (9, "HALT", 3)],
     [(0, 0, 1, 2, 2), (1, 1, 2, 3, 0), (2, 2, 3, 8, 0), (3, 3, 8, 8, 0)]),
])
def test_trace_from_changes_reads_every_way_an_instruction_runs(rows, want):
    from sim.backends import TraceEntry, trace_from_changes
    assert trace_from_changes(_changes(*rows)) == [TraceEntry(*w) for w in want]
