"""The external memory model of the book's testbench (hardware spec 6.3), as a synthesizable block.

A read requested in cycle c is answered in cycle c+LAT with the data as it was in cycle c (0xDEADBEEF
past the end); a write lands at the edge when `wr_valid` is high, and writes past the end are dropped.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hdl.config import BOOK

__all__ = ["ExtMemory", "POISON", "SHIFT_MAX_LAT", "ext_signature"]

POISON = 0xDEADBEEF     # what a read past the end returns
# Longest LAT whose delay line is a shift register (see ExtMemory, `delay`). In Amaranth's simulator the
# shift register is the faster of the two at every LAT (one signal a cycle; the buffer costs a memory
# write and read), but the simulator writes the register's constants in decimal, and Python refuses
# integers of more decimal digits than its int_max_str_digits: 4300 by default (LAT 433 is the last that
# works) and as few as 640 when a user lowers it (LAT 65). Up to 64 works under every setting. Measured:
# the buffer at LAT 8 costs 10-15% more CPU on a 6-step pysim decode.
SHIFT_MAX_LAT = 64


def ext_signature(port, extra=None):
    """The members of an external memory's chip side with an `port`-word port (``config.ext_port``,
    docs/ext-port.md), then `extra`: a read request (`req_addr`, its words ``req_addr + k``), its response
    (word k in ``resp_data[32k:32k+32]``), and a write of up to `port` consecutive words (lane k writes
    ``wr_data[32k:32k+32]`` at ``wr_addr + k`` when ``wr_valid[k]``). One word: the book's ports."""
    return wiring.Signature({
        "req_valid":  In(1),
        "req_addr":   In(16),
        "resp_valid": Out(1),
        "resp_data":  Out(32 * port),
        "wr_valid":   In(port),
        "wr_addr":    In(16),
        "wr_data":    In(32 * port),
        **(extra or {}),
    })


class ExtMemory(wiring.Component):
    """`depth` words of 32 bits behind a LAT-stage read pipeline.

    Parameters
    ----------
    depth : int, optional
        Number of words (EXT); addresses at or above it read 0xDEADBEEF and ignore writes. Default
        ``config.ext_words``.
    lat : int, optional
        Read latency in cycles, at least 1; default ``config.lat``.
    backdoor : bool
        Build the backdoor ports; without them ``bd_we``/``bd_wdata`` are ignored and ``bd_rdata``
        reads 0 (a simulator then reads and writes ``memory`` directly).
    delay : {None, "shift", "ring"}
        How read stages 1 .. LAT-1 are built: one shift register, or a circular buffer of LAT-1 entries
        in a Memory; both answer identically, cycle for cycle. ``None`` (the default) picks the shift
        register while it holds no more bits than `SHIFT_MAX_LAT` one-word stages (LAT up to 64 with one
        word, 17 with four: docs/ext-port.md) and the buffer above it.
    config : hdl.config.ChipConfig
        The chip whose testbench memory this is (keyword only; the book's chip by default).

    Ports
    -----
    req_valid, req_addr : In(1), In(16)
        Read request (the chip's DMA).
    resp_valid, resp_data : Out(1), Out(32 * config.ext_port)
        The response, LAT cycles after the request (the last pipeline stage): the words at req_addr ..
        req_addr + ext_port - 1 (`ext_signature`; one read port of `memory` a word).
    wr_valid, wr_addr, wr_data : In(config.ext_port), In(16), In(32 * config.ext_port)
        Write port (the chip's ST and SCATTER units): lane k writes word wr_addr + k (one write port a lane).
    bd_we, bd_addr, bd_wdata : In(1), In(16), In(32)
        Backdoor write, for loading an image before a run; a write from the chip wins.
    bd_rdata : Out(32)
        Combinational read of the word at ``bd_addr`` (0 past the end).

    Attributes
    ----------
    memory : amaranth.lib.memory.Memory
        The storage, so that a simulator can read and write it directly.
    """

    def __init__(self, depth=None, lat=None, backdoor=True, delay=None, *, config=BOOK):
        depth = config.ext_words if depth is None else depth
        lat = config.lat if lat is None else lat
        if not isinstance(depth, int) or not 1 <= depth <= 1 << 16:
            raise ValueError(f"ExtMemory depth must be an integer in 1..65536, not {depth!r}")
        if not isinstance(lat, int) or lat < 1:
            raise ValueError(f"ExtMemory lat must be an integer >= 1, not {lat!r}")
        if delay is None:
            # the shift register's bits stay within those of SHIFT_MAX_LAT one-word stages
            delay = "shift" if (lat - 1) * (32 * config.ext_port + 1) <= (SHIFT_MAX_LAT - 1) * 33 else "ring"
        if delay not in ("shift", "ring"):
            raise ValueError(f"ExtMemory delay must be 'shift', 'ring' or None, not {delay!r}")
        self._depth = depth
        self._lat = lat
        self._delay = delay
        self._backdoor = bool(backdoor)
        self._port = config.ext_port
        self.memory = Memory(shape=32, depth=depth, init=[])
        super().__init__(ext_signature(config.ext_port, {
            "bd_we":    In(1),
            "bd_addr":  In(16),
            "bd_wdata": In(32),
            "bd_rdata": Out(32),
        }))

    @property
    def depth(self):
        return self._depth

    @property
    def lat(self):
        return self._lat

    @property
    def delay(self):
        """``"shift"`` or ``"ring"``: how the read stages after the first are built."""
        return self._delay

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = mem = self.memory
        aw = max(1, (self._depth - 1).bit_length())
        P = self._port
        # read path, write path and backdoor in separate submodules: a simulator then re-evaluates
        # each one only when its own inputs change (flattened: 4-7% more CPU on a 6-step pysim decode)
        m.submodules.rd = rdm = Module()
        m.submodules.wr = wrm = Module()

        # Stage 0 is the read port's own output register, so its data is the value before any write
        # of the same edge (non-transparent port). With ext_port = P (docs/ext-port.md) lane k reads
        # req_addr + k (16-bit wrap) through a read port of its own, each lane POISON past the end.
        rd = mem.read_port(transparent_for=())
        rdm.d.comb += rd.addr.eq(self.req_addr[:aw])
        valid = Signal(name="valid0")
        oob = Signal(name="oob0")
        rdm.d.sync += [valid.eq(self.req_valid), oob.eq(self.req_addr >= self._depth)]
        data = Signal(32 * P, name="data0")
        if P == 1:
            rdm.d.comb += data.eq(Mux(oob, POISON, rd.data))
        else:
            lanes = [Mux(oob, POISON, rd.data)]
            for k in range(1, P):
                addr = (self.req_addr + k)[:16]
                rd_k = mem.read_port(transparent_for=())
                oob_k = Signal(name=f"oob0_{k}")
                rdm.d.comb += rd_k.addr.eq(addr[:aw])
                rdm.d.sync += oob_k.eq(addr >= self._depth)
                lanes.append(Mux(oob_k, POISON, rd_k.data))
            rdm.d.comb += data.eq(Cat(*lanes))
        # Stages 1 .. LAT-1: the (valid, data) pair of stage 0 delayed by LAT-1 more cycles.
        w = 32 * P + 1
        if self._lat > 1 and self._delay == "shift":
            # One shift register, 32P+1 bits a stage, stage 1 lowest: the same registers, but one signal
            # for the simulator to update instead of 2(LAT-1).
            pipe = Signal(w * (self._lat - 1), name="pipe")
            rdm.d.sync += pipe.eq(Cat(data, valid, pipe[:-w]))
            data, valid = pipe[-w:-1], pipe[-1]
        elif self._lat > 1:
            data, valid = self._ring(rdm, data, valid)
        rdm.d.comb += [self.resp_valid.eq(valid), self.resp_data.eq(data)]

        for k in range(1, P):
            # the write lanes past 0: word wr_addr + k, where lane 0's port (and the backdoor) cannot be
            addr = (self.wr_addr + k)[:16]
            wk = mem.write_port()
            wrm.d.comb += [wk.en.eq(self.wr_valid[k] & (addr < self._depth)), wk.addr.eq(addr[:aw]),
                           wk.data.eq(self.wr_data[32 * k:32 * (k + 1)])]
        wp = mem.write_port()
        chip_we = self.wr_valid[0] & (self.wr_addr < self._depth)
        if self._backdoor:
            bd_we = self.bd_we & (self.bd_addr < self._depth)
            wrm.d.comb += [
                wp.en.eq(chip_we | bd_we),
                wp.addr.eq(Mux(chip_we, self.wr_addr, self.bd_addr)[:aw]),
                wp.data.eq(Mux(chip_we, self.wr_data[:32], self.bd_wdata)),
            ]
            bd = mem.read_port(domain="comb")
            m.d.comb += [
                bd.addr.eq(self.bd_addr[:aw]),
                self.bd_rdata.eq(Mux(self.bd_addr < self._depth, bd.data, 0)),
            ]
        else:
            wrm.d.comb += [wp.en.eq(chip_we), wp.addr.eq(self.wr_addr[:aw]), wp.data.eq(self.wr_data[:32])]
        return m

    def _ring(self, m, data, valid):
        """Stages 1 .. LAT-1 as a circular buffer of LAT-1 (valid, data) entries; returns the last stage.

        In cycle t the pointer names the entry written in cycle t-(LAT-1): it is read (combinationally)
        as the output and overwritten at the edge with this cycle's stage 0. A reset cannot clear a
        memory, so the output is held at zero until every entry has been written once since the reset,
        which is what the cleared registers of the shift register give.
        """
        n = self._lat - 1
        w = len(data) + 1
        m.submodules.ring = ring = Memory(shape=w, depth=n, init=[])
        ptr = Signal(range(n), name="ring_ptr")
        primed = Signal(name="ring_primed")
        m.d.sync += ptr.eq(Mux(ptr == n - 1, 0, ptr + 1))
        with m.If(ptr == n - 1):
            m.d.sync += primed.eq(1)
        wp = ring.write_port()
        rp = ring.read_port(domain="comb")
        m.d.comb += [wp.en.eq(1), wp.addr.eq(ptr), wp.data.eq(Cat(data, valid)), rp.addr.eq(ptr)]
        out = Signal(w, name="ring_out")
        m.d.comb += out.eq(Mux(primed, rp.data, 0))
        return out[:-1], out[-1]
