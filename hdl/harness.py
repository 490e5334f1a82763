"""ChipHarness: the GA-2 chip, its program ROM and the external memory model in one design.

Run protocol: reset for one edge, load ROM and ext (backdoor ports or the Memories directly), pulse
`start` for one edge, clock until `halted`, then read the counters, ext and the scratchpad (backdoor
ports or the Memories).
"""

from dataclasses import replace

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .chip import GA2, SeqState
from .config import BOOK
from .extmem import ExtMemory
from .isa import ERROR_KIND_BITS

__all__ = ["ChipHarness", "HARNESS_SIGNATURE", "harness_signature"]


def harness_signature(config=BOOK):
    """The ports every simulator drives (documented in `ChipHarness`) for the chip `config`.

    Shared so that a stand-in with the same ports (the Verilator tests' toy machine) cannot drift from
    the real harness.
    """
    c, w = config.counter_bits, config.word_bits
    return wiring.Signature({
        "start":     In(1),
        "halted":    Out(1),
        "cyc_total": Out(c),
        "cyc_mm":    Out(c),
        "cyc_dma":   Out(c),
        "cyc_vec":   Out(c),
        "n_inst":    Out(c),
        "rom_we":    In(1),
        "rom_addr":  In(8),
        "rom_wdata": In(128),
        "ext_we":    In(1),
        "ext_addr":  In(config.ext_addr_bits),
        "ext_wdata": In(w),
        "ext_rdata": Out(w),
        "spad_addr": In(range(config.spad_depth)),
        "spad_rdata": Out(w),
        # where the sequencer stands: what a simulator says of a program that did not halt
        "seq_pc":    Out(16),
        "seq_cur":   Out(4),
        "seq_state": Out(SeqState),
        # resident mode (docs/resident.md) only: an initial scratchpad
        **({"spad_we": In(1), "spad_wdata": In(w)} if config.gather else {}),
        # a chip other than the book's: the error state
        **({"error": Out(1), "error_kind": Out(ERROR_KIND_BITS), "error_pc": Out(16), "error_info": Out(w)}
           if config.generated else {}),
    })


# The book's chip's harness ports.
HARNESS_SIGNATURE = harness_signature(BOOK)


class ChipHarness(wiring.Component):
    """GA-2 + program ROM of 128-bit words (combinational read) + `ExtMemory`.

    Parameters
    ----------
    ext_words : int, optional
        External memory size EXT (2048 for the book's suites, 8192 for the decode); default
        ``config.ext_words``.
    lat : int, optional
        External read latency LAT; default ``config.lat``.
    rom_words : int, optional
        Program ROM depth; the chip's ``imem_addr`` is taken modulo it; default ``config.rom_words``
        (the book's ROM: 256).
    backdoor : bool
        Build the backdoor ports (needed by simulators that cannot poke memories). Without them the
        ``rom_*``/``ext_*``/``spad_*`` ports are ignored (``ext_rdata``, ``spad_rdata`` read 0) and the
        memories must be loaded and read directly;
        Amaranth's simulator runs faster that way (a write port is evaluated on every cycle).
    config : hdl.config.ChipConfig
        The chip to build (keyword only; the book's chip by default).
    chip_lat : int, optional
        The LAT the chip is built for (keyword only; default `lat`, the memory's). A different one makes
        the memory slower or faster than a resident-mode chip's error tail assumes
        (``hdl.isa.resident_busy_cycles`` with ``built_lat``), and than the exact completion of LD and
        GATHER speaks of (a check of `hdl.properties.checks`): for tests.

    Ports
    -----
    start : In(1)
        Start pulse (sampled by the chip only in IDLE).
    halted : Out(1)
        High once a HALT has been issued.
    cyc_total, cyc_mm, cyc_dma, cyc_vec, n_inst : Out(config.counter_bits)
        The chip's counters.
    rom_we, rom_addr, rom_wdata : In(1), In(8), In(128)
        Backdoor ROM write (before ``start``).
    ext_we, ext_addr, ext_wdata : In(1), In(16), In(32)
        Backdoor external-memory write (before ``start``; the chip's own writes take priority).
    ext_rdata : Out(32)
        Combinational read of external memory at ``ext_addr``.
    spad_addr : In(config.spad_addr_bits)
        Backdoor scratchpad read address (after the run).
    spad_rdata : Out(32)
        Combinational read of the chip's scratchpad at ``spad_addr``.
    seq_pc, seq_cur, seq_state : Out(16), Out(4), Out(SeqState)
        The sequencer's program counter, the opcode in flight and its state, read by a simulator that
        cannot look inside the design (Verilator) to say where a program that did not halt stands. Built
        with the backdoor ports only (else they read 0).
    spad_we, spad_wdata : In(1), In(32)
        Only with ``config.gather``: backdoor scratchpad write at ``spad_addr`` (before ``start``), the
        initial scratchpad of a resident-mode run.
    error, error_kind, error_pc, error_info : Out(1), Out(hdl.isa.ERROR_KIND_BITS), Out(16), Out(32)
        Only on a chip other than the book's (``config.generated``): the chip's error state.

    Attributes
    ----------
    chip : GA2
    rom : amaranth.lib.memory.Memory
    ext : amaranth.lib.memory.Memory
        The external memory's storage (``extmem.memory``).
    extmem : ExtMemory
    """

    def __init__(self, ext_words=None, lat=None, rom_words=None, backdoor=True, *, config=BOOK, chip_lat=None):
        ext_words = config.ext_words if ext_words is None else ext_words
        lat = config.lat if lat is None else lat
        rom_words = config.rom_words if rom_words is None else rom_words
        if not isinstance(rom_words, int) or rom_words < 1 or rom_words & (rom_words - 1):
            raise ValueError(f"rom_words must be a power of two, not {rom_words!r}")
        if rom_words > BOOK.rom_words:
            raise ValueError(f"rom_words = {rom_words}: the backdoor ROM address has 8 bits "
                             f"(at most {BOOK.rom_words})")
        self.config = config
        # The chip is built for the memory's LAT (unless a test asks for another: `chip_lat`): a resident-mode
        # chip times its error stop by config.lat, and LD's and GATHER's exact completion (a check of
        # hdl.properties.checks) speaks of a memory answering in config.lat; nothing else depends on it.
        self.chip = GA2(config=replace(config, lat=lat if chip_lat is None else chip_lat))
        self.backdoor = bool(backdoor)
        self.extmem = ExtMemory(ext_words, lat, backdoor=self.backdoor, config=config)
        self.ext = self.extmem.memory
        self.rom = Memory(shape=128, depth=rom_words, init=[])
        self._rom_bits = max(1, (rom_words - 1).bit_length())
        super().__init__(harness_signature(config))

    def elaborate(self, platform):
        m = Module()
        m.submodules.chip = chip = self.chip
        m.submodules.extmem = ext = self.extmem
        m.submodules.rom = rom = self.rom

        # Small submodules, grouped by how often their signals change, keep the simulator from
        # re-evaluating all the wiring every cycle (flattened: 4-6% more CPU on a 6-step pysim decode).
        m.submodules.fetch = fw = Module()
        m.submodules.rdbus = rw = Module()
        m.submodules.wrbus = ww = Module()
        m.submodules.status = sw = Module()

        fetch = rom.read_port(domain="comb")
        fw.d.comb += [
            fetch.addr.eq(chip.imem_addr[:self._rom_bits]),
            chip.imem_data.eq(fetch.data),
        ]
        if self.backdoor:
            load = rom.write_port()
            m.d.comb += [
                load.en.eq(self.rom_we),
                load.addr.eq(self.rom_addr[:self._rom_bits]),
                load.data.eq(self.rom_wdata),
            ]
            m.d.comb += [
                ext.bd_we.eq(self.ext_we),
                ext.bd_wdata.eq(self.ext_wdata),
                ext.bd_addr.eq(self.ext_addr),
                self.ext_rdata.eq(ext.bd_rdata),
            ]
            m.d.comb += [self.seq_pc.eq(chip.pc), self.seq_cur.eq(chip.cur), self.seq_state.eq(chip.state)]
            # a read port of its own on the chip's scratchpad: the chip's port is busy with the chip
            if self.config.gather:
                chip.scratchpad.backdoor(m, self.spad_addr, self.spad_rdata, self.spad_we, self.spad_wdata)
            else:
                chip.scratchpad.backdoor(m, self.spad_addr, self.spad_rdata)

        rw.d.comb += [
            ext.req_valid.eq(chip.req_valid),
            ext.req_addr.eq(chip.req_addr),
            chip.resp_valid.eq(ext.resp_valid),
            chip.resp_data.eq(ext.resp_data),
        ]
        ww.d.comb += [
            ext.wr_valid.eq(chip.wr_valid),
            ext.wr_addr.eq(chip.wr_addr),
            ext.wr_data.eq(chip.wr_data),
        ]
        sw.d.comb += [
            chip.start.eq(self.start),
            self.halted.eq(chip.halted),
            self.cyc_total.eq(chip.cyc_total),
            self.cyc_mm.eq(chip.cyc_mm),
            self.cyc_dma.eq(chip.cyc_dma),
            self.cyc_vec.eq(chip.cyc_vec),
            self.n_inst.eq(chip.n_inst),
        ]
        if self.config.generated:
            sw.d.comb += [self.error.eq(chip.error), self.error_kind.eq(chip.error_kind),
                          self.error_pc.eq(chip.error_pc), self.error_info.eq(chip.error_info)]
        return m
