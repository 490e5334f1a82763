"""The N x N output-stationary systolic array of the MM unit (hardware spec 5.3).

PE(i,j) takes its A operand from the left (row edge i when j = 0) and its B operand from above (column
edge j when i = 0), both used directly without an input register. At each edge it passes them on and adds
their signed 8x8 product to a 32-bit wrapping accumulator; `clr` zeroes accumulators and pass-throughs.
Fed skewed (a_edge[i] = A[i][t-i], b_edge[j] = B[t-j][j] in cycle t), PE(i,j) holds
sum_{k <= t-i-j} A[i][k] B[k][j] after edge t.
"""
from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hdl._checks import check_int

__all__ = ["SystolicArray"]


class SystolicArray(wiring.Component):
    """Output-stationary array of N x N multiply-accumulate cells.

    Parameters
    ----------
    n : int
        Rows and columns (4 on the chip), at least 1.

    Ports
    -----
    clr : In(1)
        Synchronous clear of every accumulator and every pass-through register.
    a_edge : In(ArrayLayout(signed(8), n))
        Element i enters row i at PE(i,0).
    b_edge : In(ArrayLayout(signed(8), n))
        Element j enters column j at PE(0,j).
    c : Out(ArrayLayout(signed(32), n*n))
        PE(i,j)'s accumulator at index i*n+j, straight from the registers.

    Raises
    ------
    TypeError, ValueError
        If `n` is not an integer of at least 1.
    """

    def __init__(self, n=4):
        check_int(self, "n", n, 1)
        self._n = n
        super().__init__({
            "clr":    In(1),
            "a_edge": In(data.ArrayLayout(signed(8), n)),
            "b_edge": In(data.ArrayLayout(signed(8), n)),
            "c":      Out(data.ArrayLayout(signed(32), n * n)),
        })

    @property
    def n(self):
        return self._n

    def elaborate(self, platform):
        m = Module()
        n = self._n
        a_out = [[Signal(signed(8), name=f"a_{i}_{j}") for j in range(n)] for i in range(n)]
        b_out = [[Signal(signed(8), name=f"b_{i}_{j}") for j in range(n)] for i in range(n)]
        acc = [[Signal(signed(32), name=f"acc_{i}_{j}") for j in range(n)] for i in range(n)]
        for i in range(n):
            for j in range(n):
                a_in = self.a_edge[i] if j == 0 else a_out[i][j - 1]
                b_in = self.b_edge[j] if i == 0 else b_out[i - 1][j]
                with m.If(self.clr):
                    m.d.sync += [a_out[i][j].eq(0), b_out[i][j].eq(0), acc[i][j].eq(0)]
                with m.Else():
                    # The 16-bit signed product added into 32 bits; .eq truncates the sum (wrap).
                    m.d.sync += [a_out[i][j].eq(a_in), b_out[i][j].eq(b_in),
                                 acc[i][j].eq(acc[i][j] + a_in * b_in)]
                m.d.comb += self.c[i * n + j].eq(acc[i][j])
        return m
