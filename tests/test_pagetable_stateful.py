"""The page table under Hypothesis-chosen sequences of new/append/fork/trim/release and misuse, against a
shadow of plain lists, with every invariant checked after every operation (300 runs of up to 50 steps;
the test requires that at least 10,000 steps were really run)."""
import copy

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from host.pagetable import OutOfPages, PageTable, PageTableError
from test_pagetable import invariant_problems


class PageTableMachine(RuleBasedStateMachine):
    @initialize(n_pages=st.integers(1, 10), page=st.integers(1, 5))
    def start(self, n_pages, page):
        # small pools so that exhaustion, copy-on-write and page reuse happen often
        self.pt = PageTable(n_pages, page)
        self.shadow: dict = {}
        self.dropped: dict = {}
        self.next_id = 0
        self.counter = 0

    def _pick(self, data_index):
        ids = list(self.shadow)
        return ids[data_index % len(ids)]

    @rule()
    def new(self):
        self.pt.new(self.next_id)
        self.shadow[self.next_id] = []
        self.dropped[self.next_id] = 0
        self.next_id += 1

    @precondition(lambda self: self.shadow)
    @rule(i=st.integers(0, 63), k=st.integers(1, 6))
    def append(self, i, k):
        rid = self._pick(i)
        for _ in range(k):
            self.counter += 1
            row = (self.counter, -self.counter)
            snap = copy.deepcopy(vars(self.pt))
            try:
                self.pt.append(rid, row)
            except OutOfPages:
                assert vars(self.pt) == snap, "a failed append changed the table"
                assert self.pt.free_pages() == ()
                return
            self.shadow[rid].append(row)

    @precondition(lambda self: self.shadow)
    @rule(i=st.integers(0, 63))
    def fork(self, i):
        src = self._pick(i)
        self.pt.fork(src, self.next_id)
        self.shadow[self.next_id] = list(self.shadow[src])
        self.dropped[self.next_id] = self.dropped[src]
        self.next_id += 1

    @precondition(lambda self: self.shadow)
    @rule(i=st.integers(0, 63), frac=st.floats(0, 1))
    def trim(self, i, frac):
        rid = self._pick(i)
        n = len(self.shadow[rid])
        keep = int(frac * n)
        self.pt.trim(rid, keep)
        self.dropped[rid] = max(self.dropped[rid], keep // self.pt.page)

    @precondition(lambda self: self.shadow)
    @rule(i=st.integers(0, 63))
    def release(self, i):
        rid = self._pick(i)
        self.pt.release(rid)
        del self.shadow[rid]
        del self.dropped[rid]

    @rule(which=st.integers(0, 7), i=st.integers(0, 63), delta=st.integers(1, 5))
    def misuse(self, which, i, delta):
        pt = self.pt
        snap = copy.deepcopy(vars(pt))
        unknown = -1 - i
        live = self._pick(i) if self.shadow else None
        if live is None or which < 3:
            action = [lambda: pt.append(unknown, 0), lambda: pt.release(unknown),
                      lambda: pt.fork(unknown, "x")][which % 3]
        else:
            n, first = len(self.shadow[live]), pt.dropped(live) * pt.page
            action = {3: lambda: pt.new(live),
                      4: lambda: pt.rows(live, 0, n + delta),
                      5: lambda: pt.trim(live, n + delta),
                      6: lambda: pt.fork(live, live),
                      7: lambda: pt.rows(live, first - delta, n)}[which]
            if which == 7 and first - delta < 0:
                action = lambda: pt.rows(live, first, first - delta)  # noqa: E731 (lo > hi)
        try:
            action()
        except PageTableError:
            pass
        else:
            raise AssertionError(f"misuse {which} did not raise")
        assert vars(pt) == snap, f"misuse {which} changed the table"

    checks = 0                     # invariant checks over the whole run (one per step, plus one at start)

    @invariant()
    def consistent(self):
        PageTableMachine.checks += 1
        problems = invariant_problems(self.pt, self.shadow, self.dropped)
        assert not problems, problems

    def teardown(self):
        for rid in list(self.shadow):
            self.pt.release(rid)
        assert len(self.pt.free_pages()) == self.pt.n_pages, "pages leaked after releasing everything"


def test_page_table_stateful():
    PageTableMachine.checks = 0
    run_state_machine_as_test(PageTableMachine, settings=settings(
        max_examples=300, stateful_step_count=50, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow]))
    # Hypothesis may end a run before its step limit: make sure the CI budget of steps was really spent
    assert PageTableMachine.checks >= 10_000, PageTableMachine.checks
