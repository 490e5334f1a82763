"""The external memory model of the book's testbench (hardware spec 6.3), as a synthesizable block.

A read requested in cycle c is answered in cycle c+LAT with the data as it was in cycle c (0xDEADBEEF
past the end); a write lands at the edge when `wr_valid` is high, and writes past the end are dropped.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["ExtMemory", "POISON"]

POISON = 0xDEADBEEF     # what a read past the end returns


class ExtMemory(wiring.Component):
    """`depth` words of 32 bits behind a LAT-stage read pipeline.

    Parameters
    ----------
    depth : int
        Number of words (EXT); addresses at or above it read 0xDEADBEEF and ignore writes.
    lat : int
        Read latency in cycles, at least 1.
    backdoor : bool
        Build the backdoor ports; without them ``bd_we``/``bd_wdata`` are ignored and ``bd_rdata``
        reads 0 (a simulator then reads and writes ``memory`` directly).

    Ports
    -----
    req_valid, req_addr : In(1), In(16)
        Read request (the chip's DMA).
    resp_valid, resp_data : Out(1), Out(32)
        The response, LAT cycles after the request (the last pipeline stage).
    wr_valid, wr_addr, wr_data : In(1), In(16), In(32)
        Write port (the chip's ST unit).
    bd_we, bd_addr, bd_wdata : In(1), In(16), In(32)
        Backdoor write, for loading an image before a run; a write from the chip wins.
    bd_rdata : Out(32)
        Combinational read of the word at ``bd_addr`` (0 past the end).

    Attributes
    ----------
    memory : amaranth.lib.memory.Memory
        The storage, so that a simulator can read and write it directly.
    """

    req_valid:  In(1)
    req_addr:   In(16)
    resp_valid: Out(1)
    resp_data:  Out(32)
    wr_valid:   In(1)
    wr_addr:    In(16)
    wr_data:    In(32)
    bd_we:      In(1)
    bd_addr:    In(16)
    bd_wdata:   In(32)
    bd_rdata:   Out(32)

    def __init__(self, depth=8192, lat=8, backdoor=True):
        if not isinstance(depth, int) or not 1 <= depth <= 1 << 16:
            raise ValueError(f"ExtMemory depth must be an integer in 1..65536, not {depth!r}")
        if not isinstance(lat, int) or lat < 1:
            raise ValueError(f"ExtMemory lat must be an integer >= 1, not {lat!r}")
        self._depth = depth
        self._lat = lat
        self._backdoor = bool(backdoor)
        self.memory = Memory(shape=32, depth=depth, init=[])
        super().__init__()

    @property
    def depth(self):
        return self._depth

    @property
    def lat(self):
        return self._lat

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = mem = self.memory
        aw = max(1, (self._depth - 1).bit_length())
        # read path, write path and backdoor in separate submodules: a simulator then re-evaluates
        # each one only when its own inputs change
        m.submodules.rd = rdm = Module()
        m.submodules.wr = wrm = Module()

        # Stage 0 is the read port's own output register, so its data is the value before any write
        # of the same edge (non-transparent port).
        rd = mem.read_port(transparent_for=())
        rdm.d.comb += rd.addr.eq(self.req_addr[:aw])
        valid = Signal(name="valid0")
        oob = Signal(name="oob0")
        rdm.d.sync += [valid.eq(self.req_valid), oob.eq(self.req_addr >= self._depth)]
        data = Signal(32, name="data0")
        rdm.d.comb += data.eq(Mux(oob, POISON, rd.data))
        # Stages 1 .. LAT-1 as one shift register of (valid, data) pairs, 33 bits a stage, stage 1
        # lowest: the same registers, but one signal for the simulator to update instead of 2(LAT-1).
        if self._lat > 1:
            pipe = Signal(33 * (self._lat - 1), name="pipe")
            rdm.d.sync += pipe.eq(Cat(data, valid, pipe[:-33]))
            data, valid = pipe[-33:-1], pipe[-1]
        rdm.d.comb += [self.resp_valid.eq(valid), self.resp_data.eq(data)]

        wp = mem.write_port()
        chip_we = self.wr_valid & (self.wr_addr < self._depth)
        if self._backdoor:
            bd_we = self.bd_we & (self.bd_addr < self._depth)
            wrm.d.comb += [
                wp.en.eq(chip_we | bd_we),
                wp.addr.eq(Mux(chip_we, self.wr_addr, self.bd_addr)[:aw]),
                wp.data.eq(Mux(chip_we, self.wr_data, self.bd_wdata)),
            ]
            bd = mem.read_port(domain="comb")
            m.d.comb += [
                bd.addr.eq(self.bd_addr[:aw]),
                self.bd_rdata.eq(Mux(self.bd_addr < self._depth, bd.data, 0)),
            ]
        else:
            wrm.d.comb += [wp.en.eq(chip_we), wp.addr.eq(self.wr_addr[:aw]), wp.data.eq(self.wr_data)]
        return m
