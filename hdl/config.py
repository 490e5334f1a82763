"""The chip generator's one configuration: every parameter of a GA-2, and every width derived from it.

Pure Python (no Amaranth), so that the ISA, the compiler, the reference machine, the host and the
commands read the same numbers as the Amaranth blocks. ``BOOK`` is the book's chip; any other chip is
``ChipConfig(...)`` with overrides, or :func:`parse_chip` of a command-line spec such as
``"array=8,mm_load=4"``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

__all__ = ["ChipConfig", "BOOK", "PRESETS", "parse_chip", "ChipSpecError"]


class ChipSpecError(ValueError):
    """A ``--chip`` spec that names no preset or carries a bad override (the message names it)."""


def _power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class ChipConfig:
    """The parameters of one GA-2 chip.

    Parameters
    ----------
    array : int
        The systolic array is ``array x array`` processing elements: the largest M and N of one MM
        instruction. A power of two, 1..16.
    mm_load : int
        Operand elements the MM unit loads from the scratchpad per cycle (the book loads 1). Divides the
        int8 elements of one scratchpad word (``word_bits // 8``).
    spad_depth : int
        Scratchpad words, a power of two in 256..65536 (the ISA's address fields are 16 bits).
    word_bits : int
        Bits of one scratchpad and external-memory word. Only 32 exists: four int8 per word is
        part of the instruction set.
    row_depth : int
        Depth of the MM unit's operand memories: the largest K of one MM instruction. A power of two,
        ``array``..128 (the K field holds 8 bits).
    ext_words : int
        Words of the external memory of the testbench and of the backends' default image, 1..65536.
    lat : int
        Read latency of the external memory in cycles, 1..1024.
    counter_bits : int
        Width of the five cycle counters, 16..64.
    rom_words : int
        Instructions the program ROM holds (the testbench indexes it with ``imem_addr[7:0]``).
    gather : int
        1 gives the chip the resident mode's GATHER and SCATTER instructions (``docs/resident.md``);
        0, the book's chip, leaves their opcodes illegal.
    mm_rq : int
        1 gives the MM unit an output requantizer (``docs/fused-rq.md``): the RQC instruction loads its
        (m, s, relu) and an MM with its ``rq`` flag writes every C element requantized to int8. 0, the
        book's chip, leaves opcode 11 illegal, and MM's ``rq`` flag must be 0.
    vadd_ports : int
        Scratchpad read ports the VADD unit reads through (``docs/vadd-ports.md``): 1, the book's, reads
        src1[i] and src2[i] in two cycles (B = 2*len + 2); 2 reads both in one cycle (B = len + 2), through
        read port 1 of the scratchpad, which a chip with ``mm_load`` >= 2 already has for the MM unit
        and any other chip gets for VADD (``spad_reads``).
    mm_pack : int
        1 lets an MM read its B operand packed four int8 per word (its ``pb`` flag, fl[2];
        ``docs/mm-fast.md``): staging B then takes ``K*ceil(ceil(N/4)/L)`` cycles instead of
        ``K*ceil(N/L)``. 0, the book's chip, leaves the flag unread and ``validate`` refuses it set.
    mm_overlap : int
        1 builds the MM unit with overlapped phases (``docs/mm-fast.md``): A and B are staged at the
        same time, A through ``mm_load`` read ports of its own (the scratchpad then has
        ``2*mm_load`` read ports, ``spad_reads``), the array runs as soon as the operands it needs are
        staged and C is written while the array's last skew cycles run. Same words, fewer cycles
        (``hdl.isa.mm_busy_cycles``). 0, the book's chip, keeps the phases one after the other.
    rq_pipe : int
        1 puts a pipeline register in the requantizer (``docs/rq-pipe.md``): the 32 x 24 product is
        registered, so the requantizer's result comes one cycle after its input. RQ then takes B = len + 3
        (``hdl.isa.rq_busy_cycles``), and an MM with its ``rq`` flag on an ``mm_rq`` chip writes each C
        element one cycle later (one more cycle with ``mm_overlap``, none without:
        ``hdl.isa.mm_busy_cycles``). 0, the book's chip, keeps the requantizer combinational (hardware
        spec 5.4).
    prefetch : int
        1 lets the sequencer fetch the next instruction while the current one works and issue it in the
        current one's done cycle (``docs/prefetch.md``): an instruction then costs its busy cycles B only,
        not 2 + B; the run's first instruction (and the HALT of an error stop) still costs its FETCH and
        ISSUE cycles (``hdl.isa.seq_cycles``). 0, the book's chip, keeps the sequencer of hardware spec 2.2.
    sm_div : int
        Quotient bits the SM unit's divider finds a cycle (``docs/sm-div.md``): 1, the book's, takes 40
        cycles for the 40-bit division; 2 or 4 chain that many restoring steps between two edges, 20 or 10
        cycles. SM then takes B = 3*len + 7 + 40/sm_div (``hdl.isa.sm_busy_cycles``); the words are the same.
    mm_pack_c : int
        1 lets an MM write its int8 results packed four a word (its ``pc`` flag, fl[3]) and read a B of N
        rows packed four a word transposed (``tb`` with ``pb``), for K/V rows stored four int8 a word
        (``docs/mm-pack-c.md``). Needs ``mm_pack``, ``mm_rq`` and ``mm_overlap``. 0, the book's chip,
        leaves the flag unread and ``validate`` refuses it set, and tb with pb; 1 on ``fast``.
    spad_lanes : int
        Results the scratchpad takes a cycle from the MM unit's drain (``docs/spad-lanes.md``): 1, the
        book's, one write port; 2 or 4 store the scratchpad as that many banks interleaved by address
        (bank = address mod lanes), one write port each, so the drain writes up to `spad_lanes`
        consecutive results of a row of C a cycle (``hdl.isa.mm_busy_cycles``). Needs ``mm_overlap``;
        the other units still write one word a cycle, but RQ's and VADD's `vec_lanes`. 4 on ``fast``.
    vec_lanes : int
        Words the RQ and VADD units read and write a cycle through the banks (``docs/vec-lanes.md``): 1,
        the book's; 2 or 4 make RQ l requantizers and VADD l adders wide, reading l consecutive words of
        each source and writing l of the result a cycle, so B = ceil(len/l) + 2 (+ rq_pipe for RQ)
        (``hdl.isa.rq_busy_cycles``, ``vadd_busy_cycles``). Needs ``spad_lanes`` >= vec_lanes and
        ``vadd_ports`` = 2. 2 on ``fast``.
    mm_bcast : int
        1 broadcasts each A element along its row of the systolic array instead of passing it from PE to
        PE (``docs/mm-bcast.md``): every column sees k in the same cycle, so a row of C is final at once
        and the drain's first write no longer waits for the array's last column (``3 + N - G`` becomes
        ``2 + cB``, B's read groups a k, in ``hdl.isa.mm_busy_cycles``). Same words, fewer cycles. Needs ``spad_lanes`` > 1 (with
        one drain lane the column skew costs nothing). 0, the book's chip, keeps the book's array; 1 on
        ``fast``.
    mm_fold : int
        1 lets one MM compute up to twice the array's columns when it uses at most half its rows
        (``docs/mm-fold.md``): with N > array and M <= array/2, rows array/2 + m of the broadcast array compute
        columns array .. N-1 of C's row m from a second B feed entering at row array/2. N is then read with
        one more bit (``h[4:0]`` on the 8x8 array) and may be 1 .. 2*array. A wide tile is staged and run
        once where two tiles were, so the second tile's start, pipeline and finish cycles go. Needs
        ``mm_bcast`` and an even ``array``. 0, the book's chip.
    ext_port : int
        Words the external-memory port moves a cycle (``docs/ext-port.md``): 1, the book's; 2 or 4 make LD,
        ST, GATHER and SCATTER move that many consecutive words a cycle, a group (LD and ST ``ceil(len/P)``
        groups, B = ``ceil(len/P) + LAT + 1`` and ``ceil(len/P) + 2``; a GATHER or SCATTER row in groups of
        ``min(P, row words)``, ``hdl.isa.dma_groups``). LD and GATHER write a group through the scratchpad's
        write lanes, ST and SCATTER read it through read port 0's read lanes, so it needs ``spad_lanes`` >=
        ext_port; ``ext_words`` must be a multiple of it (the board's memory is that many banks).
    """

    array: int = 4
    mm_load: int = 1
    spad_depth: int = 4096
    word_bits: int = 32
    row_depth: int = 64
    ext_words: int = 8192
    lat: int = 8
    counter_bits: int = 32
    rom_words: int = 256
    gather: int = 0
    mm_rq: int = 0
    vadd_ports: int = 1
    mm_pack: int = 0
    mm_overlap: int = 0
    rq_pipe: int = 0
    prefetch: int = 0
    sm_div: int = 1
    mm_pack_c: int = 0
    spad_lanes: int = 1
    vec_lanes: int = 1
    mm_bcast: int = 0
    mm_fold: int = 0
    ext_port: int = 1

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"ChipConfig {f.name} must be an integer, not {v!r}")
        if not (_power_of_two(self.array) and self.array <= 16):
            raise ValueError(f"ChipConfig array must be a power of two in 1..16, not {self.array}")
        if self.word_bits != 32:
            raise ValueError(f"ChipConfig word_bits must be 32 (four int8 per word is in the ISA), "
                             f"not {self.word_bits}")
        if self.mm_load < 1 or (self.word_bits // 8) % self.mm_load:
            raise ValueError(f"ChipConfig mm_load must divide the {self.word_bits // 8} int8 elements of "
                             f"a word, not {self.mm_load}")
        if not (_power_of_two(self.spad_depth) and 256 <= self.spad_depth <= 1 << 16):
            raise ValueError(f"ChipConfig spad_depth must be a power of two in 256..65536 (16-bit address "
                             f"fields), not {self.spad_depth}")
        if not (_power_of_two(self.row_depth) and self.array <= self.row_depth <= 128):
            raise ValueError(f"ChipConfig row_depth must be a power of two in {self.array}..128 "
                             f"(the 8-bit K field), not {self.row_depth}")
        if not 1 <= self.ext_words <= 1 << 16:
            raise ValueError(f"ChipConfig ext_words must be in 1..65536 (16-bit external addresses), "
                             f"not {self.ext_words}")
        if not 1 <= self.lat <= 1024:
            raise ValueError(f"ChipConfig lat must be in 1..1024, not {self.lat}")
        if not 16 <= self.counter_bits <= 64:
            raise ValueError(f"ChipConfig counter_bits must be in 16..64, not {self.counter_bits}")
        if not (_power_of_two(self.rom_words) and self.rom_words <= 256):
            raise ValueError(f"ChipConfig rom_words must be a power of two up to 256, not {self.rom_words}")
        if self.gather not in (0, 1):
            raise ValueError(f"ChipConfig gather must be 0 or 1, not {self.gather}")
        if self.mm_rq not in (0, 1):
            raise ValueError(f"ChipConfig mm_rq must be 0 or 1, not {self.mm_rq}")
        if self.vadd_ports not in (1, 2):
            raise ValueError(f"ChipConfig vadd_ports must be 1 or 2, not {self.vadd_ports}")
        if self.mm_pack not in (0, 1):
            raise ValueError(f"ChipConfig mm_pack must be 0 or 1, not {self.mm_pack}")
        if self.mm_overlap not in (0, 1):
            raise ValueError(f"ChipConfig mm_overlap must be 0 or 1, not {self.mm_overlap}")
        if self.rq_pipe not in (0, 1):
            raise ValueError(f"ChipConfig rq_pipe must be 0 or 1, not {self.rq_pipe}")
        if self.prefetch not in (0, 1):
            raise ValueError(f"ChipConfig prefetch must be 0 or 1, not {self.prefetch}")
        if self.sm_div not in (1, 2, 4):
            raise ValueError(f"ChipConfig sm_div must be 1, 2 or 4, not {self.sm_div}")
        if self.mm_pack_c not in (0, 1):
            raise ValueError(f"ChipConfig mm_pack_c must be 0 or 1, not {self.mm_pack_c}")
        if self.mm_pack_c and not (self.mm_pack and self.mm_rq and self.mm_overlap):
            raise ValueError(f"ChipConfig mm_pack_c = {self.mm_pack_c} needs mm_pack=1, mm_rq=1 and mm_overlap=1 "
                             f"(not mm_pack={self.mm_pack}, mm_rq={self.mm_rq}, mm_overlap={self.mm_overlap})")
        if self.spad_lanes not in (1, 2, 4):
            raise ValueError(f"ChipConfig spad_lanes must be 1, 2 or 4, not {self.spad_lanes}")
        if self.spad_lanes > 1 and not self.mm_overlap:
            raise ValueError(f"ChipConfig spad_lanes = {self.spad_lanes} needs mm_overlap=1 (the overlapped "
                             f"MM unit's drain writes the lanes), not mm_overlap={self.mm_overlap}")
        if self.vec_lanes not in (1, 2, 4):
            raise ValueError(f"ChipConfig vec_lanes must be 1, 2 or 4, not {self.vec_lanes}")
        if self.vec_lanes > self.spad_lanes:
            raise ValueError(f"ChipConfig vec_lanes = {self.vec_lanes} needs spad_lanes >= {self.vec_lanes} "
                             f"(the banks carry the lanes), not spad_lanes={self.spad_lanes}")
        if self.vec_lanes > 1 and self.vadd_ports != 2:
            raise ValueError(f"ChipConfig vec_lanes = {self.vec_lanes} needs vadd_ports=2 (VADD reads both "
                             f"sources' lanes at once), not vadd_ports={self.vadd_ports}")
        if self.mm_bcast not in (0, 1):
            raise ValueError(f"ChipConfig mm_bcast must be 0 or 1, not {self.mm_bcast}")
        if self.mm_bcast and self.spad_lanes == 1:
            raise ValueError(f"ChipConfig mm_bcast = {self.mm_bcast} needs spad_lanes > 1 (with one drain lane "
                             f"the array's column skew costs no cycle), not spad_lanes={self.spad_lanes}")
        if self.mm_fold not in (0, 1):
            raise ValueError(f"ChipConfig mm_fold must be 0 or 1, not {self.mm_fold}")
        if self.mm_fold and not self.mm_bcast:
            raise ValueError(f"ChipConfig mm_fold = {self.mm_fold} needs mm_bcast=1 (the second B feed enters "
                             f"unskewed at the array's middle row), not mm_bcast={self.mm_bcast}")
        if self.mm_fold and self.array % 2:
            raise ValueError(f"ChipConfig mm_fold = {self.mm_fold} needs an even array (its halves hold the two "
                             f"column groups), not array={self.array}")
        if self.ext_port not in (1, 2, 4):
            raise ValueError(f"ChipConfig ext_port must be 1, 2 or 4, not {self.ext_port}")
        if self.ext_port > self.spad_lanes:
            raise ValueError(f"ChipConfig ext_port = {self.ext_port} needs spad_lanes >= {self.ext_port} (a "
                             f"group is written through the banks' lanes), not spad_lanes={self.spad_lanes}")
        if self.ext_words % self.ext_port:
            raise ValueError(f"ChipConfig ext_port = {self.ext_port} needs ext_words a multiple of it (the "
                             f"board's memory is {self.ext_port} banks), not ext_words={self.ext_words}")

    # ---- derived widths and limits -----------------------------------------------------------------
    @property
    def spad_addr_bits(self) -> int:
        """Bits of a scratchpad address (12 on the book's chip)."""
        return (self.spad_depth - 1).bit_length()

    @property
    def spad_reads(self) -> int:
        """Read ports of the scratchpad: the MM unit's ``mm_load`` (twice that with ``mm_overlap``: A and B
        staged at once), or VADD's ``vadd_ports`` if more."""
        return max(self.mm_load * (1 + self.mm_overlap), self.vadd_ports)

    @property
    def ext_addr_bits(self) -> int:
        """Bits of an external-memory address on the chip's ports (16: the ISA's field)."""
        return 16

    @property
    def elems_per_word(self) -> int:
        """int8 elements in one word (4)."""
        return self.word_bits // 8

    @property
    def mm_max_mn(self) -> int:
        """The largest M and N of one MM instruction (the array size)."""
        return self.array

    @property
    def mm_max_n(self) -> int:
        """The largest N of one MM instruction: the array size, twice it with ``mm_fold`` (for an M of at
        most half the array, docs/mm-fold.md)."""
        return self.array * (1 + self.mm_fold)

    @property
    def mm_max_k(self) -> int:
        """The largest K of one MM instruction (the operand memories' depth)."""
        return self.row_depth

    @property
    def max_len(self) -> int:
        """The largest length of a vector instruction whose length field holds addresses (4095)."""
        return self.spad_depth - 1

    @property
    def counter_mask(self) -> int:
        return (1 << self.counter_bits) - 1

    @property
    def generated(self) -> bool:
        """A chip other than the book's: some parameter of the design (every one but the testbench's
        ``ext_words``, ``lat`` and ``rom_words``) differs from ``BOOK``'s. A generated chip has the error
        state and stops on a word it cannot run (``hdl.isa.issue_stop``); the book's hangs there, as hardware
        spec 2.2 says."""
        return any(getattr(self, f.name) != getattr(BOOK, f.name) for f in fields(self)
                   if f.name not in _TESTBENCH_FIELDS)

    def overrides(self) -> dict[str, int]:
        """The parameters that differ from the book's chip."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(BOOK, f.name)}

    def spec(self) -> str:
        """The ``--chip`` spec that gives back this configuration (``book`` for the book's chip)."""
        for name, preset in PRESETS.items():
            if preset == self:
                return name
        return ",".join(f"{k}={v}" for k, v in self.overrides().items())

    def key(self) -> str:
        """A stable text naming every parameter (for build caches)."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


BOOK = ChipConfig()
# The parameters of the testbench around a chip, not of the chip's design (`ChipConfig.generated`).
_TESTBENCH_FIELDS = ("ext_words", "lat", "rom_words")

# Named configurations a user can give to --chip. ``fast`` is the serving chip of issues 13 and 14: the
# 8x8 array with four operand words a cycle, GATHER/SCATTER, and 16,384 external words for two pools of 64
# pages of 4 rows of 16 words beside the mailbox and the weights' staging area
# (compiler.resident.plan_layout); since issue 14 also the MM unit's fused requantization (docs/fused-rq.md),
# packed weights and overlapped phases (docs/mm-fast.md) and the two-port VADD (docs/vadd-ports.md); since
# issue 20 the requantizer's pipeline register (docs/rq-pipe.md), for the ULX3S's 25 MHz; since issue 23 the
# sequencer's issue in the done cycle (docs/prefetch.md), the softmax's division four bits a cycle
# (docs/sm-div.md), K/V rows packed four int8 a word (docs/mm-pack-c.md), a scratchpad of four banks taking
# four MM results a cycle (docs/spad-lanes.md), RQ and VADD two words a cycle (docs/vec-lanes.md: four lanes
# save 25 cycles a token more but did not route on the ULX3S-85F), the broadcast array (docs/mm-bcast.md) and
# the folded MM, twice the columns in the idle rows (docs/mm-fold.md) and the external port of four words
# (docs/ext-port.md); placed and routed on the served board (docs/synthesis.md, docs/figures/fpga-fast.json).
# Issue 13's chip is ``fast,mm_rq=0,vadd_ports=1,mm_pack=0,mm_overlap=0,rq_pipe=0,prefetch=0,sm_div=1,
# mm_pack_c=0,spad_lanes=1,vec_lanes=1,mm_bcast=0,mm_fold=0,ext_port=1``.
PRESETS: dict[str, ChipConfig] = {
    "book": BOOK,
    "fast": ChipConfig(array=8, mm_load=4, gather=1, ext_words=16384, mm_rq=1, vadd_ports=2, mm_pack=1,
                       mm_overlap=1, rq_pipe=1, prefetch=1, sm_div=4, mm_pack_c=1, spad_lanes=4, vec_lanes=2,
                       mm_bcast=1, mm_fold=1, ext_port=4),
}


def parse_chip(spec: str) -> ChipConfig:
    """A configuration from a ``--chip`` spec: a preset name, or ``name=value`` overrides of the book's
    chip separated by commas (``array=8,mm_load=4``), optionally after a preset (``book,array=8``)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ChipSpecError(f"--chip {spec!r}: give a preset ({', '.join(PRESETS)}) or name=value overrides")
    names = {f.name for f in fields(ChipConfig)}
    base, overrides = BOOK, {}
    for i, part in enumerate(p.strip() for p in spec.split(",")):
        if "=" not in part:
            if i == 0 and part in PRESETS:
                base = PRESETS[part]
                continue
            raise ChipSpecError(f"--chip {spec!r}: {part!r} is neither a preset ({', '.join(PRESETS)}) "
                                f"nor name=value")
        name, _, value = (s.strip() for s in part.partition("="))
        if name not in names:
            raise ChipSpecError(f"--chip {spec!r}: unknown parameter {name!r} "
                                f"(parameters: {', '.join(sorted(names))})")
        if name in overrides:
            raise ChipSpecError(f"--chip {spec!r}: {name} given twice")
        try:
            overrides[name] = int(value, 0)
        except ValueError:
            raise ChipSpecError(f"--chip {spec!r}: {name}={value!r} is not a whole number") from None
    try:
        return replace(base, **overrides)
    except (TypeError, ValueError) as e:
        raise ChipSpecError(f"--chip {spec!r}: {e}") from None
