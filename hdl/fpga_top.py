"""DecodeStepTop: the GA-2 chip with its program in a ROM and its external memory in block RAM, for an FPGA.

Out of reset the top pulses `start` once; the chip runs the program to HALT (its cycle counts are the
chip's own: the top adds nothing in between). Then the top reads the token word through the external
memory's own read port (LAT cycles) and shows it on the LEDs, with a 'halted' LED.
"""

from dataclasses import replace

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import io, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import Out

from .chip import GA2
from .config import BOOK
from .extmem import ExtMemory

__all__ = ["DecodeStepTop", "LED_HALTED", "LED_TOKEN_BITS"]

LED_TOKEN_BITS = 7      # leds[0:7]: the token's low 7 bits (a tiny-LM token is 0..15)
LED_HALTED = 7          # leds[7]: the chip has halted


def _check_words(what, words, bits, most):
    words = list(words)
    if not 1 <= len(words) <= most:
        raise ValueError(f"{what} has {len(words)} words; 1..{most} allowed")
    for i, w in enumerate(words):
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < 1 << bits:
            raise ValueError(f"{what} word {i} = {w!r} is not a {bits}-bit unsigned integer")
    return words


class DecodeStepTop(wiring.Component):
    """One program run at reset on GA-2, its program and external memory initialised from lists.

    Parameters
    ----------
    program : list of int
        128-bit instruction words, HALT last (at most ``config.rom_words``); held in a ROM read
        combinationally, as the chip's ``imem_data`` requires, of the next power-of-two depth.
    image : list of int
        The external memory's initial contents (32-bit words); its length is the memory size EXT.
    tok_addr : int
        External address of the word shown on the LEDs after HALT (the program's ``tok`` output).
    lat : int, optional
        External read latency LAT of the memory model; default ``config.lat``.
    config : hdl.config.ChipConfig
        The chip to build (keyword only; the book's chip by default).

    Ports
    -----
    leds : Out(8)
        ``leds[0:7]``: the token (0 until it has been read back), ``leds[7]``: halted.
    token : Out(config.word_bits)
        The word read at `tok_addr` after HALT.
    token_valid : Out(1)
        High from the cycle `token` holds that word.
    halted : Out(1)
        The chip's ``halted``.

    Attributes
    ----------
    chip : GA2
    extmem : ExtMemory
        Built without backdoor ports: a combinational read of 8192 words would not fit in block RAM.
    rom : amaranth.lib.memory.Memory
    """

    def __init__(self, program, image, tok_addr, lat=None, *, config=BOOK):
        lat = config.lat if lat is None else lat
        program = _check_words("program", program, 128, config.rom_words)
        image = _check_words("external image", image, config.word_bits, 1 << config.ext_addr_bits)
        if isinstance(tok_addr, bool) or not isinstance(tok_addr, int) or not 0 <= tok_addr < len(image):
            raise ValueError(f"tok_addr = {tok_addr!r} is not an address of the {len(image)}-word image")
        self.tok_addr = tok_addr
        self.config = config
        # a resident-mode chip times its error stop by the memory's LAT (hdl.harness does the same)
        self.chip = GA2(config=replace(config, lat=lat) if config.gather else config)
        self.extmem = ExtMemory(len(image), lat, backdoor=False, config=config)
        self.extmem.memory.init = image
        depth = max(2, 1 << (len(program) - 1).bit_length())
        self.rom = Memory(shape=128, depth=depth, init=program)
        self._rom_bits = (depth - 1).bit_length()
        super().__init__({
            "leds":        Out(8),
            "token":       Out(config.word_bits),
            "token_valid": Out(1),
            "halted":      Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.chip = chip = self.chip
        m.submodules.extmem = ext = self.extmem
        m.submodules.rom = self.rom

        fetch = self.rom.read_port(domain="comb")
        m.d.comb += [fetch.addr.eq(chip.imem_addr[:self._rom_bits]), chip.imem_data.eq(fetch.data)]

        # start: high in the first cycle after reset only (the chip samples it in IDLE).
        started = Signal()
        m.d.sync += started.eq(1)
        m.d.comb += chip.start.eq(~started)

        # After HALT the DMA is idle for good, so the top can borrow the memory's read port: one
        # request at tok_addr, whose answer comes back LAT cycles later like any other.
        asked = Signal()
        ask = Signal()
        m.d.comb += ask.eq(chip.halted & ~asked)
        m.d.sync += asked.eq(asked | ask)
        m.d.comb += [
            ext.req_valid.eq(chip.req_valid | ask),
            ext.req_addr.eq(Mux(ask, self.tok_addr, chip.req_addr)),
            # The top's own answer is not the chip's: an LD engine seeing a response while idle would
            # raise its write enable without owning the scratchpad (the chip's owner_writes Assert).
            chip.resp_valid.eq(ext.resp_valid & ~asked),
            chip.resp_data.eq(ext.resp_data),
            ext.wr_valid.eq(chip.wr_valid),
            ext.wr_addr.eq(chip.wr_addr),
            ext.wr_data.eq(chip.wr_data),
        ]
        with m.If(asked & ext.resp_valid & ~self.token_valid):
            m.d.sync += [self.token.eq(ext.resp_data), self.token_valid.eq(1)]

        m.d.comb += [
            self.halted.eq(chip.halted),
            self.leds.eq(Cat(Mux(self.token_valid, self.token[:LED_TOKEN_BITS], 0), chip.halted)),
        ]
        if platform is not None:
            for i in range(len(self.leds)):
                led = platform.request("led", i, dir="-")
                m.submodules[f"led{i}"] = buf = io.Buffer("o", led)
                m.d.comb += buf.o.eq(self.leds[i])
        return m
