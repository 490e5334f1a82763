"""MM, the chip's matrix unit (hardware spec 4.7): C[m][n] = sum_k A[m][k] B[k][n] on an array x array
systolic array (4 x 4 on the book's chip; ``config.array``).

Timing contract (``hdl.isa.mm_busy_cycles``). With L = ``config.mm_load`` (1 on the book's chip): start
is sampled at E0; then LA (M*ceil(K/L) + 2 cycles) stages A, LB (K*ceil(N/L) + 2) stages B, PRE (1)
clears the array, RUN (K+M+N-2) streams the skewed operands, OUT (M*N) writes C m-major, FIN (1) ends,
and the done pulse follows, so done is high in W_B with

    B = M*ceil(K/L) + K*ceil(N/L) + (K+M+N-2) + M*N + 7      (L = 1: M*K + K*N + (K+M+N-2) + M*N + 7).

Loading L elements a cycle: an MM operand element is the low byte of its own scratchpad word (spec 3.3:
A[m][k] = s8(spad[A + m*lda + k])), so one word read brings one element whatever the packing of the
other layers; the unit therefore reads L words a cycle through the scratchpad's L read ports (port j at
``ptr + j*step``). LA reads L consecutive k of one row of A a cycle (step 1); LB reads L consecutive n of
one k of B (step ``ldb`` when tb, else 1). A row's or a k's last group may be partial (then the
addresses past it are read and dropped), so any M, K, N, strides and bases work and the time depends on
M, K, N and L only. The operand memories hold L consecutive k per entry, so that one write stores a
group of A; B's group of L columns goes to L lanes at one k.

None of it depends on the array's size: RUN streams K+M+N-2 cycles of the instruction's M and N, and
the rows and columns past them are fed zeros they never use.

Fused requantization (``config.mm_rq``, docs/fused-rq.md): the unit has three output-requantizer
registers (m, s, relu), reset to 0, loaded from the instruction register at the edge where the ``rqc``
input is high (the chip raises it at E0 of an RQC; the unit need not be idle, and nothing else changes).
An MM whose rq flag (latched at E0 with the other operands) is set writes every C element through one
combinational `hdl.requant.Requantizer` fed by those registers: ``sext8(requant(C, m, s, relu))``, in the
same OUT cycle, so the timing contract above is unchanged. With ``mm_rq = 0`` none of it exists.

The piped requantizer (``config.rq_pipe`` with ``mm_rq``, docs/rq-pipe.md): the Requantizer registers
its product, so an MM with rq writes C element e one cycle after OUT selects it (the write enable and
address follow in ``we_d``, ``oaddr_d``; an MM with rq = 0 writes as above). In series the last element is
written at FIN's edge and B is unchanged; overlapped, a fused MM's last OUT edge goes to the state LAST,
whose edge writes the last element and finishes: B one more (``hdl.isa.mm_busy_cycles`` with ``rq``).

Packed B (``config.mm_pack``, docs/mm-fast.md): an MM with its pb flag reads B's element (k, n) as byte
n % 4 of word ``B + k*ldb + n // 4``; LB then reads L words (4L columns) of one k a cycle, so it takes
K*ceil(ceil(N/4)/L) + 2 cycles, and tb is not read. Overlapped phases (``config.mm_overlap``,
docs/mm-fast.md "The schedule"): states IDLE, LOAD, OUT. From W1 on A and B are staged k by k at once, C =
max(ceil(M/L), cB) cycles a k (A's column k, L rows a cycle, through read ports 0..L-1; B's k through
ports L..2L-1), the array runs its cycle t in x = S + t with S = (K-1)*(C-1) + 2 (x counts from W1 = 0),
OUT writes C from x = X0 = (K-1)*C + max(3, C-1) while the array finishes, and the last write finishes:

    B = (K-1)*C + max(3, C-1) + M*N + 1.

C, S, X0 and the group counts are computed from the instruction register's fields and latched at E0 with
the operands (no arithmetic between the operand register and the array's feed; docs/rq-pipe.md).

With both at 0 none of it exists (the Verilog is the same as without these parameters).

Packed K/V rows (``config.mm_pack_c``, on an overlapped fused chip only; docs/mm-pack-c.md): tb with pb reads
B's element (k, n) as byte k % 4 of word ``B + n*ldb + k // 4`` with tb's reads (the next k's base moves on
after every fourth k); an MM with pc writes C's int8 results four a word, element (m, n) as byte n % 4 of
word ``dst + m*ldc + n // 4``: the drain's order and cycles are as before, bytes 0..2 wait in ``pc_held``
and each word is written whole (zeros past N) in the cycle of its last element, so B does not change.

Drain lanes (``config.spad_lanes`` = l > 1, overlapped only; docs/spad-lanes.md): the port has l write lanes
(lane i at waddr + i, the scratchpad's banks), and OUT writes a group of l results of a row a cycle (each
through its own requantizer with rq; with pc the group's bytes go into their word, written whole by lane 0
in its last group's cycle), from X0 = (K-1)*C + max(3 + N - G, C - 1), G = ceil(N/l): B = X0 + M*G + 1
(+ rq_pipe with rq). With l = 1 none of it exists.

The broadcast array (``config.mm_bcast``, on a drain-lanes chip only; docs/mm-bcast.md): A[m][k] reaches
every PE of row m in the same cycle and column n takes B[k][n] with no column skew, read through one more
port of the operand memories at t, so row m is final in one cycle. The array starts cB - 1 cycles later
(S = (K-1)*(C-1) + 1 + cB, cB = B's groups a k: the last group of a k must be staged when every column
takes it), and X0 = (K-1)*C + max(2 + cB, C - 1): B = X0 + M*G + 1 (+ rq_pipe with rq).

The folded MM (``config.mm_fold``, on a broadcast chip only; docs/mm-fold.md): N is read with one bit more and
may reach 2 x array when M <= array/2 (``folded``, latched at E0: N > array). Columns array .. 2 x array - 1 of
B have operand-memory lanes of their own, staged as the others; rows array/2 + m repeat row m's A, and the
array's middle row takes those columns from the broadcast port (``b_fold``) instead of from the row above. The
drain reads result (m, n) from PE(m + array/2, n - array) past the array. B is the broadcast formula with the
wide row's cB and G.
"""
from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hdl.config import BOOK

from hdl.isa import RQ_PIPE_CYCLES, Op
from hdl.properties import History
from hdl.requant import Requantizer
from hdl.scratchpad import SpadPort
from hdl.systolic import SystolicArray

from .base import SpadUnit, operand, operand_bits, operand_layout
from .rq import RQ_PIPE_PROPERTIES, check_write_in_busy

__all__ = ["MatrixUnit", "MM_RQ_PROPERTIES", "MM_PACK_C_PROPERTIES", "packed_column"]

# The output requantizer's properties (a unit with mm_rq only, scope "mm_rq": sim.verify.formal's target of
# that name proves them with the unit contract), by name, with the statement the formal tool prints.
MM_RQ_PROPERTIES = {
    "rq_hold": "the requantizer registers change only at an edge where rqc is high, to RQC's fields of ins",
    "rq_range": "with the MM's rq set, every word written is an int8 in [-127, 127], sign-extended (>= 0 with relu)",
}
# A packed C's properties (a unit with mm_pack_c only, scope "mm_pack_c", docs/mm-pack-c.md); rq_range then
# holds for the words an MM without pc writes.
MM_PACK_C_PROPERTIES = {
    "pc_range": "with the MM's rq and pc set, every word written holds int8s in [-127, 127] up to its newest "
                "element's byte (that one >= 0 with relu) and zeros past it",
}


def packed_column(words, i):
    """Where column `i` of a packed B is (docs/mm-fast.md): the L words read at once for one k (`words`,
    read ports in order) hold 4L columns; column i is byte i % 4 of word (i // 4) % L of the group
    i // (4L). Returns (that byte as a signed value, the group)."""
    L = len(words)
    return words[(i // 4) % L][8 * (i % 4):8 * (i % 4) + 8].as_signed(), i // (4 * L)


class MatrixUnit(SpadUnit):
    """The MM unit: stages A and B into operand memories, runs the array, writes C to the scratchpad.

    The ports are `SpadUnit`'s, with L = ``config.mm_load`` read ports in ``spad`` (2L with
    ``config.mm_overlap``: ports 0..L-1 stage A, ports L..2L-1 stage B). dst, A, B, lda, ldb, M, K, N, tb and ldc are latched at E0; ``spad.raddr`` is the ``ptr`` register;
    only bits 7:0 of the read data are used; the write port is active in OUT. All operands are staged
    before any result is written, so the operand and result regions may overlap freely. Results wrap
    at 32 bits.

    Ports
    -----
    spad : Out(SpadPort.of(config, reads=L))
        The scratchpad port; when L > 1, ``spad.raddr_x[j]`` is the address of read port j+1,
        ``ptr + (j+1)*step``, and ``spad.rdata_x[j]`` its registered read data.
    rqc : In(1)
        Only with ``config.mm_rq``: at an edge where it is high the requantizer registers take (m, s,
        relu) from ``ins`` (RQC's fields, ``hdl.isa.HW_OPERANDS[Op.RQC]``).

    Attributes
    ----------
    rq_regs : Signal or None
        With ``config.mm_rq``, the output-requantizer registers as one struct (m, s, relu), for tests.
    """

    OP = Op.MM

    def ports(self, cfg):
        extra = {"rqc": In(1)} if cfg.mm_rq else {}
        reads = cfg.mm_load * (1 + cfg.mm_overlap)     # A's own L ports with mm_overlap (docs/mm-fast.md)
        # the drain's write lanes with spad_lanes (docs/spad-lanes.md; 1 otherwise)
        return {**super().ports(cfg), "spad": Out(SpadPort.of(cfg, reads=reads, lanes=cfg.spad_lanes)), **extra}

    def __init__(self, *, config=BOOK):
        super().__init__(config=config)
        self.rq_regs = Signal(operand_layout(Op.RQC), name="rq_regs") if config.mm_rq else None

    def elaborate(self, platform):
        m = Module()

        cfg = self.config
        n_arr = cfg.array           # the array is n_arr x n_arr; M and N are 1..n_arr
        L = cfg.mm_load             # operand elements staged per cycle
        lg_load = (L - 1).bit_length()
        m.submodules.array = array = SystolicArray(config=cfg)
        # The n_arr A and the n_arr B operand memories (spec 5.2) as one memory of 2*n_arr int8 lanes
        # of L elements: element (lane, s) at entry e holds k = e*L + s; lane i is A memory i, lane
        # n_arr+i is B memory i. Each element has its own write enable, and read port i serves A
        # memory i and B memory i (both read at k = (t - i) mod row_depth), so they are the same
        # memories; a simulator sees one write port per edge instead of 2*n_arr.
        # A folding chip (docs/mm-fold.md) has n_arr more B lanes: columns n_arr .. 2*n_arr-1 of a wide B.
        m.submodules.opmem = opmem = Memory(shape=data.ArrayLayout(signed(8), (2 + cfg.mm_fold) * n_arr * L),
                                            depth=max(1, cfg.row_depth // L), init=[])
        wr = opmem.write_port(granularity=1)
        # a broadcast array (docs/mm-bcast.md) reads every column's B at one k: one more port, at t
        rd = [opmem.read_port(domain="comb") for _ in range(n_arr + cfg.mm_bcast)]

        # Operands, latched at E0.
        opr = self.operand_register()
        if cfg.mm_overlap:
            return self._elaborate_overlap(m, opr, array, wr, rd)
        dst, b_base, lda, ldb = opr.dst, opr.B, opr.lda, opr.ldb
        M, K, N, tb = opr.M, opr.K, opr.N, opr.tb
        if cfg.mm_pack:
            # pb (docs/mm-fast.md): B's words hold four columns each; a packed B is never transposed
            pb = opr.pb
            tb = tb & ~pb
            n_step = Mux(pb, 4 * L, L)      # columns of B staged per cycle
        else:
            n_step = L

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
        # v that spad.rdata holds the element (m_d/n_d, k_d) issued in the previous cycle.
        iss = Signal()
        v = Signal()
        m_d = Signal.like(mi)
        n_d = Signal.like(ni)
        k_d = Signal.like(ki)

        m.d.comb += self.spad.raddr.eq(ptr)
        # The last group of a row of A (k) or of a k of B (n): with L = 1 the last element itself.
        if L == 1:
            last_k, last_n = ki == K - 1, ni == N - 1
        else:
            last_k, last_n = ki + L >= K, ni + L >= N
        if cfg.mm_pack:
            last_n = Mux(pb, ni + 4 * L >= N, last_n)

        # Operand memories: written while staging, read at k = (t - i) mod row_depth while running.
        # Word j of a group (read port j) carries element k_d + j of A's row, or column n_d + j of B's
        # k; n_d is a multiple of L, so B lane i always takes word i mod L.
        words = [self.spad.rdata] + ([self.spad.rdata_x[j] for j in range(L - 1)] if L > 1 else [])
        staged = [w[:8].as_signed() for w in words]
        packed = [packed_column(words, i) for i in range(n_arr)] if cfg.mm_pack else None
        for lane in range(2 * n_arr):
            for sub in range(L):
                word = sub if lane < n_arr else (lane - n_arr) % L
                if cfg.mm_pack and lane >= n_arr:
                    m.d.comb += wr.data[lane * L + sub].eq(Mux(pb, packed[lane - n_arr][0], staged[word]))
                else:
                    m.d.comb += wr.data[lane * L + sub].eq(staged[word])
        m.d.comb += wr.addr.eq(k_d >> lg_load)
        running = self._feed(m, array, rd, t, M, K, N)
        self._drain(m, array, mi, ni, oaddr, opr)

        with self.control(m) as fsm:
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
                    with m.If(last_k):
                        m.d.sync += ki.eq(0)
                        with m.If(mi == M - 1):
                            m.d.sync += iss.eq(0)
                        with m.Else():
                            m.d.sync += [mi.eq(mi + 1), rowbase.eq(rowbase + lda), ptr.eq(rowbase + lda)]
                    with m.Else():
                        m.d.sync += [ki.eq(ki + L), ptr.eq(ptr + L)]
                with m.Elif(~v):
                    m.d.sync += [iss.eq(1), ki.eq(0), ni.eq(0), ptr.eq(b_base), rowbase.eq(b_base)]
                    m.next = "LB"

            with m.State("LB"):
                # B, k major and n minor; element (k, n) goes to B memory n at address k.
                m.d.sync += [v.eq(iss), n_d.eq(ni), k_d.eq(ki)]
                with m.If(iss):
                    with m.If(last_n):
                        m.d.sync += ni.eq(0)
                        with m.If(ki == K - 1):
                            m.d.sync += iss.eq(0)
                        with m.Else():
                            step = Mux(tb, 1, ldb)
                            m.d.sync += [ki.eq(ki + 1), rowbase.eq(rowbase + step), ptr.eq(rowbase + step)]
                    with m.Else():
                        m.d.sync += [ni.eq(ni + n_step), ptr.eq(ptr + (Mux(tb, ldb, 1) << lg_load))]
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
                def to_fin():
                    m.next = "FIN"
                self._out_walk(m, opr, mi, ni, orow, oaddr, to_fin)

            with m.State("FIN"):
                self.finish(m)

        # Row m of A goes to A memory m, element (k, n) of B to B memory n, both at address k.
        if L == 1:
            b_lane = [n_d == i for i in range(n_arr)]
            if cfg.mm_pack:
                b_lane = [Mux(pb, n_d == packed[i][1] * 4, b_lane[i]) for i in range(n_arr)]
            m.d.comb += wr.en.eq(Cat(
                Cat(fsm.ongoing("LA") & v & (m_d == i) for i in range(n_arr)),
                Cat(fsm.ongoing("LB") & v & b_lane[i] for i in range(n_arr)),
            ))
        else:
            # A group of A writes the elements k_d .. k_d+L-1 (those below K) of lane m_d; a group of
            # B writes element k_d mod L of lanes n_d .. n_d+L-1 (n_d a multiple of L).
            b_lane = [n_d == i // L * L for i in range(n_arr)]
            if cfg.mm_pack:
                # n_d counts columns: a packed group holds 4L of them
                b_lane = [Mux(pb, n_d == packed[i][1] * (4 * L), b_lane[i]) for i in range(n_arr)]
            m.d.comb += wr.en.eq(Cat(
                Cat(fsm.ongoing("LA") & v & (m_d == i) & (k_d + s < K) for i in range(n_arr) for s in range(L)),
                Cat(fsm.ongoing("LB") & v & b_lane[i] & (k_d[:lg_load] == s)
                    for i in range(n_arr) for s in range(L)),
            ))
            # Read port j+1 reads element j+1 of the group: step 1 along A's row, B's n step otherwise.
            step_x = Mux(fsm.ongoing("LB") & tb, ldb, 1)
            m.d.comb += [self.spad.raddr_x[j].eq(ptr + (j + 1) * step_x) for j in range(L - 1)]
        m.d.comb += running.eq(fsm.ongoing("RUN"))
        self._write_enable(m, fsm, opr)

        self._check(m, opr)
        return m

    @property
    def _piped(self):
        """The output requantizer has its pipeline register (``mm_rq`` and ``rq_pipe``, docs/rq-pipe.md)."""
        return bool(self.config.mm_rq and self.config.rq_pipe)

    def _finish_out(self, m, opr):
        """The overlapped unit's last OUT edge: finish, or with the piped requantizer and rq set go to
        LAST, whose edge writes the last element (one cycle more, ``hdl.isa.mm_busy_cycles``)."""
        if self._piped:
            with m.If(opr.rq):
                m.next = "LAST"
            with m.Else():
                self.finish(m)
        else:
            self.finish(m)

    def _write_enable(self, m, fsm, opr):
        """The write port's enable: high in OUT; with the piped requantizer and rq set, one cycle later
        (the cycle after each OUT cycle: the serial unit's FIN or the overlapped unit's LAST writes the
        last element)."""
        if self.config.spad_lanes > 1:
            return self._write_lanes(m, fsm, opr)
        out_now = fsm.ongoing("OUT")
        # with a packed C the element's enable goes to `_pack_c`, which writes only a word's last element
        we = Signal(name="we_element") if self.config.mm_pack_c else self.spad.we
        if self._piped:
            we_d = Signal(name="we_d")
            m.d.sync += we_d.eq(out_now)
            m.d.comb += we.eq(Mux(opr.rq, we_d, out_now))
        else:
            m.d.comb += we.eq(out_now)
        if self.config.mm_pack_c:
            self._pack_c(m, opr, we)

    def _pack_c(self, m, opr, we_element):
        """A packed C (``pc``, docs/mm-pack-c.md): the drain's elements come one a cycle as without pc (the
        element in ``_element``, valid when `we_element`); element (m, n)'s low byte is byte n % 4 of its
        word. Bytes 0..2 wait in ``pc_held``; the word is written whole, bytes past n zero, in the cycle of
        its last element (n % 4 = 3 or n = N-1), at the address the OUT walk keeps (orow + n // 4)."""
        ni = self._ni
        if self._piped:
            # the piped requantizer's element was selected a cycle ago: so was its column
            ni_d = Signal.like(ni, name="ni_d")
            m.d.sync += ni_d.eq(ni)
            n_e = Mux(opr.rq, ni_d, ni)
        else:
            n_e = ni
        pos = self._pc_pos = Signal(2, name="pc_pos")
        ends = Signal(name="pc_ends")
        held = Signal(24, name="pc_held")
        byte = self._element[:8]
        m.d.comb += [pos.eq(n_e[:2]), ends.eq((pos == 3) | (n_e == opr.N - 1))]
        for j in range(3):
            with m.If(we_element & (pos == j)):
                m.d.sync += held[8 * j:8 * j + 8].eq(byte)
        word = Cat(*(Mux(pos == j, byte, Mux(pos > j, held[8 * j:8 * j + 8], 0)) for j in range(3)),
                   Mux(pos == 3, byte, 0))
        m.d.comb += [self.spad.wdata.eq(Mux(opr.pc, word, self._element)),
                     self.spad.we.eq(we_element & (~opr.pc | ends))]

    def _drain_lanes(self, m, array, mi, ni, oaddr, opr):
        """`_drain` with ``spad_lanes`` = l > 1 (docs/spad-lanes.md): lane i carries PE(mi, ni + i)'s
        accumulator (ni is a multiple of l, so its column is ni's high bits with i below them), each
        lane through a Requantizer of its own on an mm_rq chip; the elements go to `_write_lanes` in
        ``_elements``, lane 0's address to ``spad.waddr`` (the port writes lane i at waddr + i)."""
        cfg = self.config
        n_arr, lanes = cfg.array, cfg.spad_lanes
        lg, lg_l = (n_arr - 1).bit_length(), lanes.bit_length() - 1
        self._drive_waddr(m, oaddr, opr)
        if cfg.mm_rq:
            regs = self._load_rq_regs(m)
        self._elements = []
        row = mi[:lg]
        if cfg.mm_fold:
            # a folded MM's columns n_arr.. (ni's bit lg) are in rows n_arr/2 + m (docs/mm-fold.md); then m
            # < n_arr/2, and without the fold ni < n_arr: the row's top bit is either's
            row = Cat(mi[:lg - 1], mi[lg - 1] | ni[lg])
        for i in range(lanes):
            col = Cat(Const(i, lg_l), ni[lg_l:])[:lg]
            c_out = array.c[Cat(col, row)] if lg else array.c[0]
            element = Signal(32, name=f"element{i}")
            if cfg.mm_rq:
                rq = Requantizer(config=cfg)
                m.submodules["requant" if i == 0 else f"requant{i}"] = rq
                m.d.comb += [rq.acc.eq(c_out), rq.m.eq(regs.m), rq.s.eq(regs.s), rq.relu.eq(regs.relu),
                             element.eq(Mux(opr.rq, rq.q, c_out))]      # q is signed(8): sign-extended
            else:
                m.d.comb += element.eq(c_out)
            self._elements.append(element)

    def _write_lanes(self, m, fsm, opr):
        """`_write_enable` with ``spad_lanes`` = l > 1 (docs/spad-lanes.md): in each OUT cycle (a cycle later
        with the piped requantizer and rq) lane i writes element (m, n + i) when n + i < N. With a packed C
        (pc) the group's bytes go to bytes n % 4 .. of their word, earlier groups' bytes of the word wait in
        ``pc_held`` (l = 2), and lane 0 writes the word whole in the cycle of its last group."""
        cfg, lanes = self.config, self.config.spad_lanes
        out_now = fsm.ongoing("OUT")
        ni = self._ni
        if self._piped:
            we_d = Signal(name="we_d")
            ni_d = Signal.like(ni, name="ni_d")
            m.d.sync += [we_d.eq(out_now), ni_d.eq(ni)]
            we_el, n_e = Mux(opr.rq, we_d, out_now), Mux(opr.rq, ni_d, ni)
        else:
            we_el, n_e = out_now, ni
        valid = [1] + [Signal(name=f"lane_valid{i}") for i in range(1, lanes)]
        m.d.comb += [valid[i].eq(n_e + i < opr.N) for i in range(1, lanes)]
        el = self._elements
        m.d.comb += self.spad.wdata_x.eq(Cat(*el[1:]))
        lane_we = [we_el & valid[i] for i in range(1, lanes)]
        if not cfg.mm_pack_c:
            m.d.comb += [self.spad.wdata.eq(el[0]), self.spad.we.eq(we_el), self.spad.we_x.eq(Cat(*lane_we))]
            return
        pos = Signal(2, name="pc_first")                  # the group's first byte in its word
        newest = self._pc_pos = Signal(2, name="pc_pos")  # its last valid byte (pc_range)
        ends = Signal(name="pc_ends")
        m.d.comb += [pos.eq(n_e[:2]), newest.eq(pos + sum(valid[1:])),
                     ends.eq((pos == 4 - lanes) | (n_e + lanes >= opr.N))]
        held = Signal(24, name="pc_held") if lanes < 4 else None
        byte = [Mux(valid[i], el[i][:8], 0) for i in range(lanes)]
        word = []
        for j in range(4):
            b = 0
            for p in range(0, 4, lanes):
                here = byte[j - p] if p <= j < p + lanes else (held[8 * j:8 * j + 8] if j < p else 0)
                b = Mux(pos == p, here, b)
                if held is not None and p <= j < p + lanes and j < 3:
                    with m.If(we_el & (pos == p)):
                        m.d.sync += held[8 * j:8 * j + 8].eq(el[j - p][:8])
            word.append(b)
        m.d.comb += [self.spad.wdata.eq(Mux(opr.pc, Cat(*word), el[0])),
                     self.spad.we.eq(we_el & (~opr.pc | ends)),
                     self.spad.we_x.eq(Cat(*(w & ~opr.pc for w in lane_we)))]

    @classmethod
    def scope_of(cls, cfg):
        """"mm"; "mm_rq" on an mm_rq chip, "mm_rq_pipe" on one with rq_pipe too; "mm_fast" on an mm_pack or
        mm_overlap chip without mm_rq; "mm_pack_c" on an mm_pack_c chip (docs/mm-pack-c.md); "mm_lanes" on a chip
        with drain lanes (``spad_lanes`` > 1, docs/spad-lanes.md); "mm_bcast" with a broadcast array too
        (docs/mm-bcast.md); "mm_fold" with the folded second column group too (docs/mm-fold.md)."""
        if cfg.mm_fold:
            return "mm_fold"
        if cfg.mm_bcast:
            return "mm_bcast"
        if cfg.spad_lanes > 1:
            return "mm_lanes"
        if cfg.mm_pack_c:
            return "mm_pack_c"
        if cfg.mm_rq:
            return "mm_rq_pipe" if cfg.rq_pipe else "mm_rq"
        return "mm_fast" if cfg.mm_pack or cfg.mm_overlap else "mm"

    @classmethod
    def properties_of(cls, cfg):
        """The unit contract; with mm_rq the requantizer's `MM_RQ_PROPERTIES`, and with rq_pipe too
        `hdl.units.rq.RQ_PIPE_PROPERTIES`."""
        return {**super().properties_of(cfg), **(MM_RQ_PROPERTIES if cfg.mm_rq else {}),
                **(RQ_PIPE_PROPERTIES if cfg.mm_rq and cfg.rq_pipe else {}),
                **(MM_PACK_C_PROPERTIES if cfg.mm_pack_c else {})}

    def write_inside(self, m, opr):
        """The write this cycle is C element (m, n) at dst + m*ldc + n (modulo the depth), m < M, n < N, with
        (m, n) a monitor of its own stepping m-major at each write from (0, 0) at the start; with a packed C
        (pc, docs/mm-pack-c.md) word (m, w) at dst + m*ldc + w, w < ceil(N/4)."""
        mon_m, mon_n = Signal.like(opr.M, name="mon_m"), Signal.like(opr.N, name="mon_n")
        mon_row = self.addr_signal("mon_row")          # dst + m*ldc, kept by adding ldc a row (no multiplier)
        # a packed C (docs/mm-pack-c.md): (m, w), the word w < ceil(N/4) of row m, at dst + m*ldc + w
        row_words = Mux(opr.pc, (opr.N + 3) >> 2, opr.N) if self.config.mm_pack_c else opr.N
        lanes = self.config.spad_lanes
        if lanes > 1:
            return self._write_inside_lanes(m, opr, mon_m, mon_n, mon_row, row_words)
        with m.If(self.start & ~self.busy):
            m.d.sync += [mon_m.eq(0), mon_n.eq(0), mon_row.eq(operand(self.ins, Op.MM, "dst"))]
        with m.Elif(self.spad.we):
            with m.If(mon_n == row_words - 1):
                m.d.sync += [mon_n.eq(0), mon_m.eq(mon_m + 1), mon_row.eq(mon_row + opr.ldc)]
            with m.Else():
                m.d.sync += mon_n.eq(mon_n + 1)
        want = (mon_row + mon_n)[:self.config.spad_addr_bits]
        return (self.spad.waddr == want) & (mon_m < opr.M) & (mon_n < row_words)

    def _write_inside_lanes(self, m, opr, mon_m, mon_n, mon_row, row_words):
        """`write_inside` with ``spad_lanes`` = l > 1 (docs/spad-lanes.md): the monitor steps a group of l
        elements (one word with pc) at each write; lane 0 writes at dst + m*ldc + n, and lane i, which the
        port writes at waddr + i, only when n + i < N (never with pc). Lane i > 0 writes only with lane 0
        (`_write_lanes`), so the write this property looks at (``spad.we``) carries every lane's."""
        lanes = self.config.spad_lanes
        step = Mux(opr.pc, 1, lanes) if self.config.mm_pack_c else lanes
        with m.If(self.start & ~self.busy):
            m.d.sync += [mon_m.eq(0), mon_n.eq(0), mon_row.eq(operand(self.ins, Op.MM, "dst"))]
        with m.Elif(self.spad.we):
            with m.If(mon_n + step >= row_words):
                m.d.sync += [mon_n.eq(0), mon_m.eq(mon_m + 1), mon_row.eq(mon_row + opr.ldc)]
            with m.Else():
                m.d.sync += mon_n.eq(mon_n + step)
        want = (mon_row + mon_n)[:self.config.spad_addr_bits]
        lane_in = [(mon_n + i < opr.N) for i in range(1, lanes)]
        if self.config.mm_pack_c:
            lane_in = [~opr.pc & inside for inside in lane_in]        # a packed word is lane 0's only
        lanes_in = Cat(*(~self.spad.we_x[i - 1] | inside for i, inside in enumerate(lane_in, 1))).all()
        return (self.spad.waddr == want) & (mon_m < opr.M) & (mon_n < row_words) & lanes_in

    def busy_cycles(self, opr):
        """``hdl.isa.mm_busy_cycles`` of the MM latched in `opr`, as a value (the same formula, written with
        the unit's widths: L a power of two, so ceil(x/L) is a shift)."""
        cfg = self.config
        L = cfg.mm_load
        lg = (L - 1).bit_length()
        M, K, N = opr.M, opr.K, opr.N
        words = Mux(opr.pb, (N + 3) >> 2, N) if cfg.mm_pack else N      # B's words a k: ceil(N/4) packed
        if cfg.mm_pack_c:
            words = Mux(opr.pb & ~opr.tb, (N + 3) >> 2, N)                # packed along k: tb's reads
        groups_b = (words + (L - 1)) >> lg
        if cfg.mm_overlap:
            groups_a = (M + (L - 1)) >> lg
            c = Mux(groups_a > groups_b, groups_a, groups_b)
            last = (opr.rq if cfg.mm_rq else 0) * (RQ_PIPE_CYCLES * cfg.rq_pipe)
            if cfg.spad_lanes > 1:
                groups = (N + (cfg.spad_lanes - 1)) >> (cfg.spad_lanes.bit_length() - 1)
                late = 2 + groups_b if cfg.mm_bcast else 3 + N - groups      # docs/mm-bcast.md
                return (K - 1) * c + Mux(c - 1 > late, c - 1, late) + M * groups + 1 + last
            return (K - 1) * c + Mux(c > 4, c - 1, 3) + M * N + 1 + last
        return M * ((K + (L - 1)) >> lg) + K * groups_b + (K + M + N - 2) + M * N + 7

    def _check(self, m, opr):
        """`properties_of`'s properties as Asserts, under the unit's `scope`."""
        self.check_protocol(m, opr)
        if self.config.mm_rq:
            self._check_rq(m, opr, self.scope)
            if self._piped:
                check_write_in_busy(m, self.scope, self.spad.we, self.busy)

    @staticmethod
    def _out_walk(m, opr, mi, ni, orow, oaddr, last, pc=None, lanes=1):
        """One OUT cycle: C element (mi, ni) is written at oaddr; step m-major, or `last()` after
        element (M-1, N-1). With `pc` set (a packed C, docs/mm-pack-c.md) oaddr is the word of element
        (mi, ni), orow + ni // 4: it steps after every fourth element of a row. With `lanes` > 1
        (docs/spad-lanes.md) the cycle's group is elements (mi, ni) .. (mi, ni+lanes-1) below N: ni steps
        by `lanes`, oaddr by `lanes` (packed: by one after a group ending a word)."""
        M, N, ldc = opr.M, opr.N, opr.ldc
        if lanes > 1:
            with m.If(ni + lanes >= N):
                m.d.sync += ni.eq(0)
                with m.If(mi == M - 1):
                    last()
                with m.Else():
                    m.d.sync += [mi.eq(mi + 1), orow.eq(orow + ldc), oaddr.eq(orow + ldc)]
            with m.Else():
                step = lanes if pc is None else Mux(pc, ni[:2] == 4 - lanes, lanes)
                m.d.sync += [ni.eq(ni + lanes), oaddr.eq(oaddr + step)]
            return
        with m.If(ni == N - 1):
            m.d.sync += ni.eq(0)
            with m.If(mi == M - 1):
                last()
            with m.Else():
                m.d.sync += [mi.eq(mi + 1), orow.eq(orow + ldc), oaddr.eq(orow + ldc)]
        with m.Else():
            m.d.sync += [ni.eq(ni + 1), oaddr.eq(oaddr + (1 if pc is None else Mux(pc, ni[:2] == 3, 1)))]

    def _feed(self, m, array, rd, t, M, K, N):
        """The array's skewed feed from the operand memories in its cycle `t`; returns `running`, the
        signal that lets it through (else the edges are 0)."""
        cfg = self.config
        n_arr, L = cfg.array, cfg.mm_load
        lg_load = (L - 1).bit_length()

        def read_at(port, k, name):
            """Point `port` at the entry of k (t - i for row i); returns `lane_of`, lane's element of k there
            (an entry holds L consecutive k of every lane)."""
            if L == 1:
                m.d.comb += port.addr.eq(k)
                return lambda lane: port.data[lane]
            k_sig = Signal(range(cfg.row_depth), name=name)
            m.d.comb += [k_sig.eq(k), port.addr.eq(k_sig >> lg_load)]
            sub = k_sig[:lg_load]
            return lambda lane: port.data.as_value().word_select(lane * L + sub, 8).as_signed()

        fed = []
        for i in range(n_arr):
            lane_of = read_at(rd[i], t - i, f"k_feed{i}")
            fed.append((lane_of(i), lane_of(n_arr + i)))

        if cfg.mm_bcast:
            # A broadcast along the rows (docs/mm-bcast.md): column i gets B[t][i], every column the same
            # k, through the extra read port at t; A stays skewed by rows.
            b_lane_of = read_at(rd[n_arr], t, "k_feed_b")
            fed = [(a, b_lane_of(n_arr + i)) for i, (a, _) in enumerate(fed)]

        # Skewed feed: row i gets A[i][t-i] and column i gets B[t-i][i] (B[t][i] when broadcast) while they
        # exist, else 0.
        running = Signal()
        a_row = []
        for i in range(n_arr):
            in_k = (t < K) if i == 0 else (t >= i) & (t - i < K)
            a_row.append(Mux(running & (i < M) & in_k, fed[i][0], 0))
            m.d.comb += [
                array.a_edge[i].eq(a_row[i]),
                array.b_edge[i].eq(Mux(running & (i < N) & ((t < K) if cfg.mm_bcast else in_k), fed[i][1], 0)),
            ]
        if cfg.mm_fold:
            # A folded MM (docs/mm-fold.md): rows h + i repeat rows i's A, and the second B feed, entering at
            # row h, carries columns n_arr .. N-1 unskewed (B[t][n_arr + j]) from the broadcast port's lanes
            folded, h = self._folded, n_arr // 2
            m.d.comb += array.fold.eq(folded)
            with m.If(folded):
                m.d.comb += [array.a_edge[h + i].eq(a_row[i]) for i in range(h)]
            for j in range(n_arr):
                m.d.comb += array.b_fold[j].eq(Mux(running & (n_arr + j < N) & (t < K), b_lane_of(2 * n_arr + j), 0))
        return running

    def _drive_waddr(self, m, oaddr, opr):
        """C's write address: `oaddr`, or with the piped requantizer (which holds the element selected in
        the previous cycle) the address a cycle late when the MM requantizes."""
        if self._piped:
            oaddr_d = self.addr_signal("oaddr_d")
            m.d.sync += oaddr_d.eq(oaddr)
            m.d.comb += self.spad.waddr.eq(Mux(opr.rq, oaddr_d, oaddr))
        else:
            m.d.comb += self.spad.waddr.eq(oaddr)

    def _load_rq_regs(self, m):
        """The requantizer's registers, loaded by an RQC (docs/fused-rq.md); returns them."""
        regs = self.rq_regs
        with m.If(self.rqc):
            m.d.sync += regs.eq(operand_bits(self.ins, Op.RQC))
        return regs

    def _drain(self, m, array, mi, ni, oaddr, opr):
        """C's write port: PE(mi, ni)'s accumulator (requantized on an mm_rq chip when rq) to `oaddr`."""
        cfg = self.config
        if cfg.spad_lanes > 1:
            return self._drain_lanes(m, array, mi, ni, oaddr, opr)
        n_arr = cfg.array
        # PE(m, n)'s accumulator is c[m * n_arr + n]: the low log2(n_arr) bits of each counter.
        lg = (n_arr - 1).bit_length()
        c_out = array.c[Cat(ni[:lg], mi[:lg])] if lg else array.c[0]
        self._drive_waddr(m, oaddr, opr)
        if cfg.mm_rq:
            # the output requantizer (docs/fused-rq.md): C through one Requantizer when the MM's rq is set
            regs = self._load_rq_regs(m)
            m.submodules.requant = rq = Requantizer(config=cfg)
            m.d.comb += [rq.acc.eq(c_out), rq.m.eq(regs.m), rq.s.eq(regs.s), rq.relu.eq(regs.relu)]
            if cfg.mm_pack_c:
                # the element as an unpacked C writes it; `_pack_c` packs its low byte when pc
                self._element = Signal(32, name="element")
                m.d.comb += self._element.eq(Mux(opr.rq, rq.q, c_out))
            else:
                m.d.comb += self.spad.wdata.eq(Mux(opr.rq, rq.q, c_out))     # q is signed(8): sign-extended
        else:
            m.d.comb += self.spad.wdata.eq(c_out)

    def _check_rq(self, m, opr, scope):
        """`MM_RQ_PROPERTIES` as Asserts (scope ``mm_rq`` or ``mm_rq_pipe``)."""
        h = History(m, scope)
        t = MM_RQ_PROPERTIES
        regs = self.rq_regs.as_value()
        was_rqc, was_ins, was_regs = h.past(self.rqc, "rqc"), h.past(self.ins, "ins"), h.past(regs, "regs")
        loaded = operand_bits(was_ins, Op.RQC)
        h.check("rq_hold", ~h.valid | Mux(was_rqc, regs == loaded, regs == was_regs), t["rq_hold"],
                covers={"RQC loads the registers": was_rqc})
        w = self.spad.wdata.as_signed()
        # the relu the word was requantized with: the registers' now, or a cycle ago through the pipeline
        relu = h.past(self.rq_regs.relu, "relu") if self._piped else self.rq_regs.relu
        in_range = (w >= Mux(relu, 0, -127)) & (w <= 127)
        for i in range(1, self.config.spad_lanes):
            # the other write lanes' words (docs/spad-lanes.md), written only with lane 0's
            w_i = self.spad.wdata_x[i - 1].as_signed()
            in_range = in_range & (~self.spad.we_x[i - 1] | ((w_i >= Mux(relu, 0, -127)) & (w_i <= 127)))
        fused = opr.rq & ~opr.pc if self.config.mm_pack_c else opr.rq
        h.check("rq_range", ~(self.spad.we & fused) | in_range, t["rq_range"],
                covers={"a requantized write": self.spad.we & fused,
                        "a requantized write with relu": self.spad.we & fused & relu})
        if self.config.mm_pack_c:
            pos = self._pc_pos
            lanes = [w[8 * j:8 * j + 8].as_signed() for j in range(4)]
            newest = w.word_select(pos, 8).as_signed()
            # byte 0 is always valid (no "pos >= 0": an unsigned compare that is always true, a lint warning)
            packed_ok = Cat(*(Mux(pos >= j, lane != -128, lane == 0) if j else lane != -128
                              for j, lane in enumerate(lanes))).all() & \
                (~relu | (newest >= 0))
            packed = self.spad.we & opr.rq & opr.pc
            h.check("pc_range", ~packed | packed_ok, MM_PACK_C_PROPERTIES["pc_range"],
                    covers={"a packed write": packed, "a packed write of a partial word": packed & (pos != 3),
                            "a packed write with relu": packed & relu})

    def _elaborate_overlap(self, m, opr, array, wr, rd):
        """The unit of a chip with ``mm_overlap`` (docs/mm-fast.md "The schedule"): states IDLE, LOAD
        (staging A and B k by k at once; the array runs from cycle S on) and OUT (C written m-major while
        the array's last skew cycles run; the last write finishes). x counts the cycles from W1 (x = 0)."""
        cfg = self.config
        n_arr, L = cfg.array, cfg.mm_load
        n_b = cfg.mm_max_n             # B's columns: twice the array's on a folding chip (docs/mm-fold.md)
        lg_load = (L - 1).bit_length()
        dst, lda, ldb = opr.dst, opr.lda, opr.ldb
        M, K, N = opr.M, opr.K, opr.N
        pk = None
        if cfg.mm_pack_c:
            # tb with pb: N rows packed four a word, read transposed as tb reads (docs/mm-pack-c.md)
            tb = opr.tb
            pk = opr.pb & tb
            pb = opr.pb & ~tb
        elif cfg.mm_pack:
            pb = opr.pb
            tb = opr.tb & ~pb           # a packed B is never transposed
        else:
            pb, tb = None, opr.tb

        # C = max(ceil(M/L), cB) cycles a k; S = (K-1)*(C-1) + 2 the array's first cycle; X0 =
        # (K-1)*C + max(3, C-1) the first write (hdl.isa.mm_busy_cycles). They depend on M, K, N and pb
        # only, so they are computed from the instruction register's fields and latched at E0 with the
        # operands (`sched`): no arithmetic between the operand register and the array's feed, where the
        # chip's longest path ran once the requantizer had its register (docs/synthesis.md).
        M_i, K_i, N_i = (operand(self.ins, Op.MM, f, cfg) for f in ("M", "K", "N"))
        if cfg.mm_pack_c:
            packed_n = operand(self.ins, Op.MM, "pb") & ~operand(self.ins, Op.MM, "tb")
            b_words_i = Mux(packed_n, (N_i + 3) >> 2, N_i)
        elif cfg.mm_pack:
            b_words_i = Mux(operand(self.ins, Op.MM, "pb"), (N_i + 3) >> 2, N_i)
        else:
            b_words_i = N_i
        c_a_i = Signal(range(n_arr + 1), name="c_a_i")
        c_b_i = Signal(range(n_b + 1), name="c_b_i")
        c_i = Signal(range(n_b + 1), name="c_k_i")
        km1 = Signal(len(K), name="km1")
        span = cfg.row_depth * n_b
        prod = Signal(range(span + 1), name="prod")
        m.d.comb += [
            c_a_i.eq((M_i + (L - 1)) >> lg_load), c_b_i.eq((b_words_i + (L - 1)) >> lg_load),
            c_i.eq(Mux(c_a_i > c_b_i, c_a_i, c_b_i)),
            km1.eq(K_i - 1), prod.eq(km1 * c_i),
        ]
        c_a = Signal(range(n_arr + 1), name="c_a")
        c_b = Signal(range(n_b + 1), name="c_b")
        c = Signal(range(n_b + 1), name="c_k")
        s_run = Signal(range(span + 3), name="s_run")
        if cfg.spad_lanes > 1:
            # drain lanes (docs/spad-lanes.md): X0 = (K-1)*C + max(3 + N - G, C - 1), G = ceil(N/lanes)
            late_i = Signal(range(n_b + 4), name="late_i")
            if cfg.mm_bcast:
                # a broadcast array's row is final at once, but its start waits cB - 1 cycles for B's last
                # group of a k (docs/mm-bcast.md): X0 = (K-1)*C + max(2 + cB, C - 1)
                m.d.comb += late_i.eq(2 + c_b_i)
            else:
                m.d.comb += late_i.eq(3 + N_i - ((N_i + (cfg.spad_lanes - 1)) >> (cfg.spad_lanes.bit_length() - 1)))
            first_i, slack = Mux(c_i - 1 > late_i, c_i - 1, late_i), 3
        else:
            first_i, slack = Mux(c_i > 4, c_i - 1, 3), 0
        x_out = Signal(range(span + n_arr + 1 + slack), name="x_out")
        # S = (K-1)*(C-1) + 2, or + cB - 1 on a broadcast array: every column takes k at once, B's last
        # group of a k too (docs/mm-bcast.md)
        start = prod - km1 + (1 + c_b_i if cfg.mm_bcast else 2)
        sched = [c_a.eq(c_a_i), c_b.eq(c_b_i), c.eq(c_i), s_run.eq(start),
                 x_out.eq(prod + first_i)]
        self._folded = None
        if cfg.mm_fold:
            # N past the array: its columns n_arr.. in rows n_arr/2.. (docs/mm-fold.md), latched at E0 too
            self._folded = Signal(name="folded")
            sched.append(self._folded.eq(N_i > n_arr))
        # x runs to the last write, X0 + M*N - 1; t = x - S, as wide (no wrap back into 0..K+M+N-3)
        x = Signal(range(span + n_arr + n_arr * n_arr + 2 + slack), name="x")
        t = Signal.like(x, name="t")
        m.d.comb += t.eq(x - s_run)

        # Staging: k and group g of the read going out now; pointers of A's and B's group and k bases.
        ks = Signal(len(K), name="ks")
        gs = Signal(range(n_b + 1), name="gs")
        stg = Signal(name="stg")
        pa, ra = self.addr_signal("pa"), self.addr_signal("ra")
        pbp, rb = self.addr_signal("pbp"), self.addr_signal("rb")
        # the reads of the previous cycle, whose words are in rdata now
        va, vb = Signal(name="va"), Signal(name="vb")
        k_d = Signal.like(ks, name="k_d")
        g_d = Signal.like(gs, name="g_d")
        b_port = Mux(tb, ldb, 1)            # B's read-port step: along a k (tb = 0, packed) or down (tb)
        b_row = Mux(tb, 1, ldb)             # B's next k
        if cfg.mm_pack_c:
            # packed along k: the next k is in the same word of each n but after every fourth k
            b_row = Mux(tb, Mux(pk, ks[:2] == 3, 1), ldb)
        # A's column k: L rows a group through read ports 0..L-1 (port j at pa + j*lda)
        m.d.comb += self.spad.raddr.eq(pa)
        for j in range(1, L):
            m.d.comb += self.spad.raddr_x[j - 1].eq(pa + j * lda)
        # B's k: L words a group through read ports L..2L-1 (port L+j at pbp + j*step)
        for j in range(L):
            m.d.comb += self.spad.raddr_x[L - 1 + j].eq(pbp + j * b_port)
        a_words = [self.spad.rdata] + [self.spad.rdata_x[j - 1] for j in range(1, L)]
        b_words_in = [self.spad.rdata_x[L - 1 + j] for j in range(L)]

        # Operand memories: row i of A (lane i) from A's port i % L in group i // L; column i of B (lane
        # n_arr + i) from B's port i % L in group i // L, or packed byte i % 4 of port (i // 4) % L in
        # group i // (4L); element k_d mod L of entry k_d // L.
        sub_ok = [k_d[:lg_load] == s for s in range(L)] if L > 1 else [1]

        def b_column(i):
            """Column i of B in the words read now: its value, and whether this cycle's group holds it."""
            b_val = b_words_in[i % L][:8].as_signed()
            b_grp = g_d == i // L
            if cfg.mm_pack:
                byte, group = packed_column(b_words_in, i)
                b_val = Mux(pb, byte, b_val)
                b_grp = Mux(pb, g_d == group, b_grp)
            if cfg.mm_pack_c:
                # packed along k: byte k % 4 of column i's word, in tb's group
                b_val = Mux(pk, b_words_in[i % L].word_select(k_d[:2], 8).as_signed(), b_val)
            return b_val, b_grp

        en_a, en_b = [], []
        for i in range(n_arr):
            a_val = a_words[i % L][:8].as_signed()
            b_val, b_grp = b_column(i)
            for s in range(L):
                m.d.comb += [wr.data[i * L + s].eq(a_val), wr.data[(n_arr + i) * L + s].eq(b_val)]
                en_a.append(va & (g_d == i // L) & sub_ok[s])
                en_b.append(vb & b_grp & sub_ok[s])
        # a folding chip's columns n_arr .. 2*n_arr-1 (docs/mm-fold.md): B lanes staged as the others, from
        # the same ports and groups their column numbers give
        for i in range(n_arr, n_arr * (1 + cfg.mm_fold)):
            b_val, b_grp = b_column(i)
            for s in range(L):
                m.d.comb += wr.data[(n_arr + i) * L + s].eq(b_val)
                en_b.append(vb & b_grp & sub_ok[s])
        m.d.comb += [wr.addr.eq(k_d >> lg_load), wr.en.eq(Cat(*en_a, *en_b))]

        running = self._feed(m, array, rd, t, M, K, N)
        mi, ni = Signal(len(M), name="mi"), Signal(len(N), name="ni")
        orow, oaddr = self.addr_signal("orow"), self.addr_signal("oaddr")
        self._ni = ni
        self._drain(m, array, mi, ni, oaddr, opr)

        with self.control(m) as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    a_base = operand(self.ins, Op.MM, "A")
                    b_base = operand(self.ins, Op.MM, "B")
                    self.begin(m, opr)
                    m.d.sync += sched
                    m.d.sync += [x.eq(0), ks.eq(0), gs.eq(0), stg.eq(1), va.eq(0), vb.eq(0),
                                 pa.eq(a_base), ra.eq(a_base), pbp.eq(b_base), rb.eq(b_base)]
                    m.next = "LOAD"

            with m.State("LOAD"):
                # M, K or N = 0 (illegal) never reaches OUT: the unit hangs and writes nothing
                with m.If((x == x_out - 1) & (M != 0) & (K != 0) & (N != 0)):
                    m.d.sync += [mi.eq(0), ni.eq(0), orow.eq(dst), oaddr.eq(dst)]
                    m.next = "OUT"

            with m.State("OUT"):
                self._out_walk(m, opr, mi, ni, orow, oaddr, lambda: self._finish_out(m, opr),
                               pc=opr.pc if cfg.mm_pack_c else None, lanes=cfg.spad_lanes)

            if self._piped:
                with m.State("LAST"):
                    # the piped requantizer's last write (docs/rq-pipe.md)
                    self.finish(m)

        # Staging runs in LOAD and, for its last cycles, in OUT (x_out may be the last read's cycle).
        with m.If(~fsm.ongoing("IDLE")):
            m.d.sync += [x.eq(x + 1), va.eq(stg & (gs < c_a)), vb.eq(stg & (gs < c_b)),
                         k_d.eq(ks), g_d.eq(gs)]
            with m.If(stg):
                with m.If(gs == c - 1):
                    m.d.sync += gs.eq(0)
                    with m.If(ks == K - 1):
                        m.d.sync += stg.eq(0)
                    with m.Else():
                        m.d.sync += [ks.eq(ks + 1), ra.eq(ra + 1), pa.eq(ra + 1),
                                     rb.eq(rb + b_row), pbp.eq(rb + b_row)]
                with m.Else():
                    m.d.sync += [gs.eq(gs + 1), pa.eq(pa + (lda << lg_load)), pbp.eq(pbp + (b_port << lg_load))]
        m.d.comb += [array.clr.eq(fsm.ongoing("LOAD") & (x == 0)),
                     running.eq(~fsm.ongoing("IDLE") & (x >= s_run))]
        self._write_enable(m, fsm, opr)
        self._check(m, opr)
        return m
