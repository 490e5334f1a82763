"""The N x N output-stationary systolic array of the MM unit (hardware spec 5.3; N = 4 on the book's chip).

PE(i,j) takes its A operand from the left (row edge i when j = 0) and its B operand from above (column
edge j when i = 0), both used directly without an input register. At each edge it passes them on and adds
their signed 8x8 product to a 32-bit wrapping accumulator; `clr` zeroes accumulators and pass-throughs.
Fed skewed (a_edge[i] = A[i][t-i], b_edge[j] = B[t-j][j] in cycle t), PE(i,j) holds
sum_{k <= t-i-j} A[i][k] B[k][j] after edge t.

With ``config.mm_bcast`` (docs/mm-bcast.md) row edge i goes to every PE of row i at once (no A
pass-through registers): fed a_edge[i] = A[i][t-i] and b_edge[j] = B[t][j] (no column skew), PE(i,j) holds
sum_{k <= t-i} A[i][k] B[k][j] after edge t, so a row is final in one cycle.

With ``config.mm_fold`` too (docs/mm-fold.md) row n/2 takes its B from a second edge, ``b_fold``, instead of
from row n/2 - 1 while ``fold`` is high: fed b_fold[j] = B'[t][j] and a_edge[n/2 + i] = A[i][t-i], the
lower half computes A x B' in the rows n/2 .. as the upper half computes A x B in the rows 0 .. .
"""
from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl._checks import check_int
from hdl.config import BOOK

__all__ = ["SystolicArray"]


class SystolicArray(wiring.Component):
    """Output-stationary array of N x N multiply-accumulate cells.

    Parameters
    ----------
    n : int, optional
        Rows and columns, at least 1 (default ``config.array``).
    config : hdl.config.ChipConfig
        The chip whose array this is (keyword only; the book's chip by default).

    Ports
    -----
    clr : In(1)
        Synchronous clear of every accumulator and every pass-through register.
    a_edge : In(ArrayLayout(signed(8), n))
        Element i enters row i at PE(i,0), or with ``config.mm_bcast`` every PE of row i.
    b_edge : In(ArrayLayout(signed(8), n))
        Element j enters column j at PE(0,j).
    c : Out(ArrayLayout(signed(32), n*n))
        PE(i,j)'s accumulator at index i*n+j: the accumulator registers themselves.
    fold : In(1)
        Only with ``config.mm_fold``: row n/2 takes B from ``b_fold`` instead of from the row above.
    b_fold : In(ArrayLayout(signed(8), n))
        Only with ``config.mm_fold``: element j enters column j at PE(n/2, j) while ``fold`` is high.

    Raises
    ------
    TypeError, ValueError
        If `n` is not an integer of at least 1.
    """

    def __init__(self, n=None, *, config=BOOK):
        n = config.array if n is None else n
        check_int(self, "n", n, 1)
        self._n = n
        self._bcast = config.mm_bcast
        self._fold = config.mm_fold
        super().__init__({
            "clr":    In(1),
            "a_edge": In(data.ArrayLayout(signed(8), n)),
            "b_edge": In(data.ArrayLayout(signed(8), n)),
            "c":      Out(data.ArrayLayout(signed(32), n * n)),
            **({"fold": In(1), "b_fold": In(data.ArrayLayout(signed(8), n))} if config.mm_fold else {}),
        })

    @property
    def n(self):
        return self._n

    def elaborate(self, platform):
        m = Module()
        n = self._n
        # The pass-through registers of all PEs in two arrays and the accumulators in the `c` port
        # itself (PE(i,j) at index i*n+j): the same 2*8 + 32 bits per PE, but three signals for a
        # simulator to update at each edge instead of 3*n*n, and no copy from accumulators to `c`.
        pe_bytes = data.ArrayLayout(signed(8), n * n)
        # (a broadcast array has no A pass-through registers: docs/mm-bcast.md)
        a_out = None if self._bcast else Signal(pe_bytes, name="a_out")
        b_out = Signal(pe_bytes)
        acc = self.c
        # The registers' next values (their D inputs) as named wires: the same logic, but a simulator
        # re-evaluates the n*n multiply-adds only when an input moves, not at every edge of a run in
        # which the array holds (zero edges, zero pass-throughs). Without them: 4-8% more CPU on a 6-step
        # pysim decode.
        a_nxt = None if self._bcast else Signal(pe_bytes, name="a_nxt")
        b_nxt = Signal(pe_bytes)
        acc_nxt = Signal.like(self.c)
        for i in range(n):
            for j in range(n):
                pe = i * n + j
                a_in = self.a_edge[i] if j == 0 or self._bcast else a_out[pe - 1]
                b_in = self.b_edge[j] if i == 0 else b_out[pe - n]
                if self._fold and i == n // 2:
                    # the folded MM's second column group enters here (docs/mm-fold.md)
                    b_in = Mux(self.fold, self.b_fold[j], b_in)
                # The 16-bit signed product added into 32 bits; .eq truncates the sum (wrap).
                a_pass = [] if self._bcast else [a_nxt[pe].eq(a_in)]
                m.d.comb += [*a_pass, b_nxt[pe].eq(b_in), acc_nxt[pe].eq(acc[pe] + a_in * b_in)]
        # a broadcast array has no A pass-through registers (docs/mm-bcast.md)
        regs = [(b_out, b_nxt), (acc, acc_nxt)] if self._bcast else [(a_out, a_nxt), (b_out, b_nxt), (acc, acc_nxt)]
        with m.If(self.clr):
            m.d.sync += [r.eq(0) for r, _ in regs]
        with m.Else():
            m.d.sync += [r.eq(d) for r, d in regs]
        return m
