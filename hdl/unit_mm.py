"""MM, the chip's matrix unit (hardware spec 4.7): C[m][n] = sum_k A[m][k] B[k][n] on an array x array
systolic array (4 x 4 on the book's chip; ``config.array``).

Timing: start is sampled at E0; then LA (M*K + 2 cycles) stages A, LB (K*N + 2) stages B, PRE (1) clears
the array, RUN (K+M+N-2) streams the skewed operands, OUT (M*N) writes C m-major, FIN (1) ends, and the
done pulse follows, so done is high in W_B with B = M*K + K*N + (K+M+N-2) + M*N + 7
(``hdl.isa.mm_busy_cycles``). None of it depends on the array's size: RUN streams K+M+N-2 cycles of
the instruction's M and N, and the rows and columns past them are fed zeros they never use.
"""
from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data
from amaranth.lib.memory import Memory

from hdl.isa import Op
from hdl.systolic import SystolicArray
from hdl.unit import SpadUnit, operand

__all__ = ["MatrixUnit"]


class MatrixUnit(SpadUnit):
    """The MM unit: stages A and B into operand memories, runs the array, writes C to the scratchpad.

    The ports are `SpadUnit`'s. dst, A, B, lda, ldb, M, K, N, tb and ldc are latched at E0; ``ra`` is
    the ``ptr`` register; only ``sp_rd[7:0]`` is used; the write port is active in OUT. All operands
    are staged before any result is written, so the operand and result regions may overlap freely.
    Results wrap at 32 bits.
    """

    OP = Op.MM

    def elaborate(self, platform):
        m = Module()

        cfg = self.config
        n_arr = cfg.array           # the array is n_arr x n_arr; M and N are 1..n_arr
        m.submodules.array = array = SystolicArray(config=cfg)
        # The n_arr A and the n_arr B operand memories (spec 5.2) as one memory of 2*n_arr int8 lanes:
        # lane i at address k is A memory i at k, lane n_arr+i is B memory i at k. Each lane has its
        # own write enable, and read port i serves A memory i and B memory i (both read at
        # (t - i) mod row_depth), so they are the same memories; a simulator sees one write port per
        # edge instead of 2*n_arr.
        m.submodules.opmem = opmem = Memory(shape=data.ArrayLayout(signed(8), 2 * n_arr),
                                            depth=cfg.row_depth, init=[])
        wr = opmem.write_port(granularity=1)
        rd = [opmem.read_port(domain="comb") for _ in range(n_arr)]

        # Operands, latched at E0.
        opr = self.operand_register()
        dst, b_base, lda, ldb, ldc = opr.dst, opr.B, opr.lda, opr.ldb, opr.ldc
        M, K, N, tb = opr.M, opr.K, opr.N, opr.tb

        # Counters as wide as the instruction's M, K and N fields; t runs to K+M+N-3; pointers are
        # scratchpad addresses.
        mi = Signal(len(M))
        ni = Signal(len(N))
        ki = Signal(len(K))
        t = Signal(range(2 ** len(K) + 2 ** len(M) + 2 ** len(N)))
        ptr = self.addr_signal("ptr")
        rowbase = self.addr_signal("rowbase")
        orow = self.addr_signal("orow")
        oaddr = self.addr_signal("oaddr")
        # The read issued in one cycle returns in the next: iss says an address is out this cycle,
        # v that sp_rd holds the element (m_d/n_d, k_d) issued in the previous cycle.
        iss = Signal()
        v = Signal()
        m_d = Signal.like(mi)
        n_d = Signal.like(ni)
        k_d = Signal.like(ki)

        m.d.comb += self.ra.eq(ptr)
        self.done_pulse(m)

        # The combinational logic in submodules, so that a simulator re-evaluates each only when its own
        # inputs move: staging writes (LA, LB; the data, which follows sp_rd, apart from the address and
        # enables, which follow the counters), the skewed feed (RUN), the result port (OUT).
        m.submodules.stage = stage = Module()
        m.submodules.stage_data = stage_data = Module()
        m.submodules.feed = feed = Module()
        m.submodules.result = result = Module()

        # Operand memories: written while staging, read at (t - i) mod row_depth while running.
        staged = self.sp_rd[:8].as_signed()
        for i in range(2 * n_arr):
            stage_data.d.comb += wr.data[i].eq(staged)
        stage.d.comb += wr.addr.eq(k_d)
        for i in range(n_arr):
            feed.d.comb += rd[i].addr.eq(t - i)

        # Skewed feed: row i gets A[i][t-i] and column i gets B[t-i][i] while they exist, else 0.
        running = Signal()
        for i in range(n_arr):
            in_k = (t < K) if i == 0 else (t >= i) & (t - i < K)
            feed.d.comb += [
                array.a_edge[i].eq(Mux(running & (i < M) & in_k, rd[i].data[i], 0)),
                array.b_edge[i].eq(Mux(running & (i < N) & in_k, rd[i].data[n_arr + i], 0)),
            ]

        # PE(m, n)'s accumulator is c[m * n_arr + n]: the low log2(n_arr) bits of each counter.
        lg = (n_arr - 1).bit_length()
        result.d.comb += [
            self.wa.eq(oaddr),
            self.wd.eq(array.c[Cat(ni[:lg], mi[:lg])] if lg else array.c[0]),
        ]

        with m.FSM(name="mm_state") as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    a_base = operand(self.ins, Op.MM, "A")
                    self.begin(m, opr)
                    m.d.sync += [
                        ptr.eq(a_base), rowbase.eq(a_base),
                        mi.eq(0), ki.eq(0),
                        iss.eq(1), v.eq(0),
                    ]
                    m.next = "LA"

            with m.State("LA"):
                # A, m major and k minor; row m goes to A memory m.
                m.d.sync += [v.eq(iss), m_d.eq(mi), k_d.eq(ki)]
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
                m.d.sync += t.eq(t + 1)
                with m.If(t == K + M + N - 3):
                    m.d.sync += [mi.eq(0), ni.eq(0), orow.eq(dst), oaddr.eq(dst)]
                    m.next = "OUT"

            with m.State("OUT"):
                # The array keeps clocking with zero edges, so the accumulators hold.
                with m.If(ni == N - 1):
                    m.d.sync += ni.eq(0)
                    with m.If(mi == M - 1):
                        m.next = "FIN"
                    with m.Else():
                        m.d.sync += [mi.eq(mi + 1), orow.eq(orow + ldc), oaddr.eq(orow + ldc)]
                with m.Else():
                    m.d.sync += [ni.eq(ni + 1), oaddr.eq(oaddr + 1)]

            with m.State("FIN"):
                self.finish(m)
                m.next = "IDLE"

        # Row m of A goes to A memory m, element (k, n) of B to B memory n, both at address k.
        stage.d.comb += wr.en.eq(Cat(
            Cat(fsm.ongoing("LA") & v & (m_d == i) for i in range(n_arr)),
            Cat(fsm.ongoing("LB") & v & (n_d == i) for i in range(n_arr)),
        ))
        feed.d.comb += running.eq(fsm.ongoing("RUN"))
        result.d.comb += self.we.eq(fsm.ongoing("OUT"))

        self.check_protocol(m, opr)
        return m
