"""MM, the chip's matrix unit (hardware spec 4.7): C[m][n] = sum_k A[m][k] B[k][n] on a 4x4 systolic array.

Timing: start is sampled at E0; then LA (M*K + 2 cycles) stages A, LB (K*N + 2) stages B, PRE (1) clears
the array, RUN (K+M+N-2) streams the skewed operands, OUT (M*N) writes C m-major, FIN (1) ends, and the
done pulse follows, so done is high in W_B with B = M*K + K*N + (K+M+N-2) + M*N + 7.
"""
from amaranth.hdl import Module, Mux, Signal, Cat
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hdl.isa import HW_OPERANDS, Op
from hdl.rowmem import RowMem
from hdl.systolic import SystolicArray

__all__ = ["MatrixUnit"]

ARRAY_N = 4         # the systolic array is ARRAY_N x ARRAY_N; M and N are 1..ARRAY_N
ROW_DEPTH = 64      # operand memories hold K <= 64 int8 values


def _operand(ins, name):
    hi, lo = HW_OPERANDS[Op.MM][name]
    return ins[lo:hi + 1]


class MatrixUnit(wiring.Component):
    """The MM unit: stages A and B into operand memories, runs the array, writes C to the scratchpad.

    Operands (latched at E0 from ``ins``): dst, A, B, lda, ldb, M, K, N, tb, ldc, with the bit positions of
    ``hdl.isa.HW_OPERANDS[Op.MM]``. All operands are staged before any result is written, so the
    operand and result regions may overlap freely. Results wrap at 32 bits.

    Attributes
    ----------
    start : In(1)
        One-cycle pulse in the sequencer's ISSUE cycle; sampled when the unit is not busy.
    ins : In(128)
        The instruction register.
    busy : Out(1)
        High from E0 until the FIN cycle's closing edge.
    done : Out(1)
        Registered one-cycle pulse, in cycle W_B.
    ra : Out(12)
        Scratchpad read address (the ``ptr`` register).
    sp_rd : In(32)
        The scratchpad's registered read data; only bits [7:0] are used.
    we, wa, wd : Out(1), Out(12), Out(32)
        Scratchpad write port, active in OUT.
    """

    start: In(1)
    ins:   In(128)
    busy:  Out(1)
    done:  Out(1)
    ra:    Out(12)
    sp_rd: In(32)
    we:    Out(1)
    wa:    Out(12)
    wd:    Out(32)

    def elaborate(self, platform):
        m = Module()

        m.submodules.array = array = SystolicArray(ARRAY_N)
        amem = [RowMem(ROW_DEPTH) for _ in range(ARRAY_N)]
        bmem = [RowMem(ROW_DEPTH) for _ in range(ARRAY_N)]
        for i in range(ARRAY_N):
            m.submodules[f"amem{i}"] = amem[i]
            m.submodules[f"bmem{i}"] = bmem[i]

        # Operands, latched at E0.
        dst = Signal(12)
        b_base = Signal(12)
        lda = Signal(12)
        ldb = Signal(12)
        ldc = Signal(12)
        M = Signal(4)
        K = Signal(7)
        N = Signal(4)
        tb = Signal(1)

        # Counters and pointers.
        mi = Signal(4)
        ni = Signal(4)
        ki = Signal(7)
        t = Signal(8)
        ptr = Signal(12)
        rowbase = Signal(12)
        orow = Signal(12)
        oaddr = Signal(12)
        # The read issued in one cycle returns in the next: iss says an address is out this cycle,
        # v that sp_rd holds the element (m_d/n_d, k_d) issued in the previous cycle.
        iss = Signal()
        v = Signal()
        m_d = Signal(4)
        n_d = Signal(4)
        k_d = Signal(7)

        m.d.comb += self.ra.eq(ptr)
        m.d.sync += self.done.eq(0)

        # Operand memories: written while staging, read at (t - i) mod 64 while running.
        staged = self.sp_rd[:8].as_signed()
        for i in range(ARRAY_N):
            m.d.comb += [
                amem[i].waddr.eq(k_d), amem[i].wdata.eq(staged),
                bmem[i].waddr.eq(k_d), bmem[i].wdata.eq(staged),
                amem[i].raddr.eq(t - i), bmem[i].raddr.eq(t - i),
            ]

        # Skewed feed: row i gets A[i][t-i] and column i gets B[t-i][i] while they exist, else 0.
        running = Signal()
        for i in range(ARRAY_N):
            in_k = (t < K) if i == 0 else (t >= i) & (t - i < K)
            m.d.comb += [
                array.a_edge[i].eq(Mux(running & (i < M) & in_k, amem[i].rdata, 0)),
                array.b_edge[i].eq(Mux(running & (i < N) & in_k, bmem[i].rdata, 0)),
            ]

        m.d.comb += [
            self.wa.eq(oaddr),
            self.wd.eq(array.c[Cat(ni[:2], mi[:2])]),
        ]

        with m.FSM(name="mm_state"):
            with m.State("IDLE"):
                with m.If(self.start):
                    a_base = _operand(self.ins, "A")
                    m.d.sync += [
                        dst.eq(_operand(self.ins, "dst")),
                        b_base.eq(_operand(self.ins, "B")),
                        lda.eq(_operand(self.ins, "lda")),
                        ldb.eq(_operand(self.ins, "ldb")),
                        ldc.eq(_operand(self.ins, "ldc")),
                        M.eq(_operand(self.ins, "M")),
                        K.eq(_operand(self.ins, "K")),
                        N.eq(_operand(self.ins, "N")),
                        tb.eq(_operand(self.ins, "tb")),
                        ptr.eq(a_base), rowbase.eq(a_base),
                        mi.eq(0), ki.eq(0),
                        iss.eq(1), v.eq(0),
                        self.busy.eq(1),
                    ]
                    m.next = "LA"

            with m.State("LA"):
                # A, m major and k minor; row m goes to A memory m.
                m.d.sync += [v.eq(iss), m_d.eq(mi), k_d.eq(ki)]
                for i in range(ARRAY_N):
                    m.d.comb += amem[i].we.eq(v & (m_d == i))
                with m.If(iss):
                    with m.If(ki == K - 1):
                        m.d.sync += ki.eq(0)
                        with m.If(mi == M - 1):
                            m.d.sync += iss.eq(0)
                        with m.Else():
                            m.d.sync += [mi.eq(mi + 1), rowbase.eq(rowbase + lda), ptr.eq(rowbase + lda)]
                    with m.Else():
                        m.d.sync += [ki.eq(ki + 1), ptr.eq(ptr + 1)]
                with m.Elif(~v):
                    m.d.sync += [iss.eq(1), ki.eq(0), ni.eq(0), ptr.eq(b_base), rowbase.eq(b_base)]
                    m.next = "LB"

            with m.State("LB"):
                # B, k major and n minor; element (k, n) goes to B memory n at address k.
                m.d.sync += [v.eq(iss), n_d.eq(ni), k_d.eq(ki)]
                for i in range(ARRAY_N):
                    m.d.comb += bmem[i].we.eq(v & (n_d == i))
                with m.If(iss):
                    with m.If(ni == N - 1):
                        m.d.sync += ni.eq(0)
                        with m.If(ki == K - 1):
                            m.d.sync += iss.eq(0)
                        with m.Else():
                            step = Mux(tb, 1, ldb)
                            m.d.sync += [ki.eq(ki + 1), rowbase.eq(rowbase + step), ptr.eq(rowbase + step)]
                    with m.Else():
                        m.d.sync += [ni.eq(ni + 1), ptr.eq(ptr + Mux(tb, ldb, 1))]
                with m.Elif(~v):
                    m.next = "PRE"

            with m.State("PRE"):
                m.d.comb += array.clr.eq(1)
                m.d.sync += t.eq(0)
                m.next = "RUN"

            with m.State("RUN"):
                # PE(i, j) takes (A[i][k], B[k][j]) at the edge closing t = k + i + j.
                m.d.comb += running.eq(1)
                m.d.sync += t.eq(t + 1)
                with m.If(t == K + M + N - 3):
                    m.d.sync += [mi.eq(0), ni.eq(0), orow.eq(dst), oaddr.eq(dst)]
                    m.next = "OUT"

            with m.State("OUT"):
                # The array keeps clocking with zero edges, so the accumulators hold.
                m.d.comb += self.we.eq(1)
                with m.If(ni == N - 1):
                    m.d.sync += ni.eq(0)
                    with m.If(mi == M - 1):
                        m.next = "FIN"
                    with m.Else():
                        m.d.sync += [mi.eq(mi + 1), orow.eq(orow + ldc), oaddr.eq(orow + ldc)]
                with m.Else():
                    m.d.sync += [ni.eq(ni + 1), oaddr.eq(oaddr + 1)]

            with m.State("FIN"):
                m.d.sync += [self.busy.eq(0), self.done.eq(1)]
                m.next = "IDLE"

        return m
