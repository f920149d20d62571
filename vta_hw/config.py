"""HwConfig: the single definition of every size in the accelerator.

The hardware (vta_hw), the simulator (vta_sim), the driver and the compiler all take one frozen
:class:`HwConfig` and derive everything else from it. Field names follow VTA's
``vta_config.json`` (``log_inp_width`` ... ``log_acc_buff_size``) so that users of VTA recognise
them; buffer sizes are in bytes, as in VTA, and every other size is a derived property.

Worked example, the ``default`` preset (VTA's Pynq configuration)::

    batch x block_in x block_out = 1 x 16 x 16
    INP element  = 1x16 int8   =  16 B, 32 KiB buffer  -> inp_depth = 2048 (11 index bits)
    WGT element  = 16x16 int8  = 256 B, 256 KiB buffer -> wgt_depth = 1024 (10 index bits)
    ACC element  = 1x16 int32  =  64 B, 128 KiB buffer -> acc_depth = 2048 (11 index bits)
    OUT element  = 1x16 int8   =  16 B (same depth as ACC)
    UOP element  = 32 bits     =   4 B, 32 KiB buffer  -> uop_depth = 8192 (13 index bits)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["HwConfig", "PRESETS", "preset", "preset_names", "UOP_WIDTH_BITS"]

#: Width of one micro-op in bits (VTA_UOP_WIDTH); fixed by the ISA, not configurable.
LOG_UOP_WIDTH = 5
UOP_WIDTH_BITS = 1 << LOG_UOP_WIDTH


@dataclass(frozen=True)
class HwConfig:
    """One accelerator configuration.

    Parameters
    ----------
    log_inp_width, log_wgt_width, log_acc_width : int
        log2 of the element width in bits of inputs, weights and accumulators
        (3, 3, 5 = int8, int8, int32; the only widths this implementation builds).
    log_batch, log_block_in, log_block_out : int
        log2 of the GEMM core shape BATCH x BLOCK_IN x BLOCK_OUT.
    log_uop_buff_size, log_inp_buff_size, log_wgt_buff_size, log_acc_buff_size : int
        log2 of the on-chip buffer sizes in bytes. The OUT buffer has as many elements as ACC.
    log_bus_width : int
        log2 of the memory bus width in bits (6 = 64-bit AXI, as on the Pynq).
    clock_mhz : int
        Target clock frequency, used to convert cycles into time and by the board builds.
    mem_read_latency_cycles : int
        Cycles from a read burst being granted to its first data beat (memory model, see
        docs/timing.md).
    mem_max_burst_beats : int
        Longest burst the memory port issues; longer transfers are split (power of two).
    cmd_queue_depth : int
        Entries of each of the load, compute and store command queues (power of two).
    dep_queue_depth : int
        Capacity of each of the four dependency-token queues (power of two).
    """

    log_inp_width: int = 3
    log_wgt_width: int = 3
    log_acc_width: int = 5
    log_batch: int = 0
    log_block_in: int = 4
    log_block_out: int = 4
    log_uop_buff_size: int = 15
    log_inp_buff_size: int = 15
    log_wgt_buff_size: int = 18
    log_acc_buff_size: int = 17
    log_bus_width: int = 6
    clock_mhz: int = 100
    mem_read_latency_cycles: int = 32
    mem_max_burst_beats: int = 16
    cmd_queue_depth: int = 512
    dep_queue_depth: int = 256

    # ---- element widths -------------------------------------------------------------------
    @property
    def inp_width_bits(self) -> int:
        return 1 << self.log_inp_width

    @property
    def wgt_width_bits(self) -> int:
        return 1 << self.log_wgt_width

    @property
    def acc_width_bits(self) -> int:
        return 1 << self.log_acc_width

    @property
    def log_out_width(self) -> int:
        """Outputs are as wide as inputs (VTA: LOG_OUT_WIDTH = LOG_INP_WIDTH)."""
        return self.log_inp_width

    @property
    def out_width_bits(self) -> int:
        return 1 << self.log_out_width

    # ---- GEMM core shape ------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return 1 << self.log_batch

    @property
    def block_in(self) -> int:
        return 1 << self.log_block_in

    @property
    def block_out(self) -> int:
        return 1 << self.log_block_out

    @property
    def macs_per_cycle(self) -> int:
        """Multiply-accumulates of one GEMM micro-op (peak per cycle)."""
        return self.batch * self.block_in * self.block_out

    # ---- one buffer element (the unit every SRAM index and DRAM address counts) -----------
    @property
    def inp_elem_bits(self) -> int:
        return self.batch * self.block_in * self.inp_width_bits

    @property
    def wgt_elem_bits(self) -> int:
        return self.block_out * self.block_in * self.wgt_width_bits

    @property
    def acc_elem_bits(self) -> int:
        return self.batch * self.block_out * self.acc_width_bits

    @property
    def out_elem_bits(self) -> int:
        return self.batch * self.block_out * self.out_width_bits

    @property
    def uop_elem_bits(self) -> int:
        return UOP_WIDTH_BITS

    @property
    def inp_elem_bytes(self) -> int:
        return self.inp_elem_bits // 8

    @property
    def wgt_elem_bytes(self) -> int:
        return self.wgt_elem_bits // 8

    @property
    def acc_elem_bytes(self) -> int:
        return self.acc_elem_bits // 8

    @property
    def out_elem_bytes(self) -> int:
        return self.out_elem_bits // 8

    @property
    def uop_elem_bytes(self) -> int:
        return UOP_WIDTH_BITS // 8

    # ---- buffer sizes and depths ----------------------------------------------------------
    @property
    def log_out_buff_size(self) -> int:
        """OUT has one element per ACC element (VTA: ACC + OUT - ACC width)."""
        return self.log_acc_buff_size + self.log_out_width - self.log_acc_width

    @property
    def uop_buff_bytes(self) -> int:
        return 1 << self.log_uop_buff_size

    @property
    def inp_buff_bytes(self) -> int:
        return 1 << self.log_inp_buff_size

    @property
    def wgt_buff_bytes(self) -> int:
        return 1 << self.log_wgt_buff_size

    @property
    def acc_buff_bytes(self) -> int:
        return 1 << self.log_acc_buff_size

    @property
    def out_buff_bytes(self) -> int:
        return 1 << self.log_out_buff_size

    @property
    def log_uop_depth(self) -> int:
        return self.log_uop_buff_size + 3 - LOG_UOP_WIDTH

    @property
    def log_inp_depth(self) -> int:
        return self.log_inp_buff_size + 3 - (self.log_batch + self.log_block_in
                                             + self.log_inp_width)

    @property
    def log_wgt_depth(self) -> int:
        return self.log_wgt_buff_size + 3 - (self.log_block_out + self.log_block_in
                                             + self.log_wgt_width)

    @property
    def log_acc_depth(self) -> int:
        return self.log_acc_buff_size + 3 - (self.log_batch + self.log_block_out
                                             + self.log_acc_width)

    @property
    def log_out_depth(self) -> int:
        return self.log_acc_depth

    @property
    def uop_depth(self) -> int:
        return 1 << self.log_uop_depth

    @property
    def inp_depth(self) -> int:
        return 1 << self.log_inp_depth

    @property
    def wgt_depth(self) -> int:
        return 1 << self.log_wgt_depth

    @property
    def acc_depth(self) -> int:
        return 1 << self.log_acc_depth

    @property
    def out_depth(self) -> int:
        return 1 << self.log_out_depth

    # ---- the same facts by memory type (the ``memory_type`` field of LOAD and STORE) -------
    @functools.cached_property
    def _by_memory_type(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(DRAM bytes of one element, log2 of the buffer's depth), indexed by the code of
        :class:`vtakit.vta_hw.isa.MemType`; computed once per configuration (the simulator
        asks for every instruction)."""
        # isa owns the memory-type codes and imports this module, so the import is deferred
        from vtakit.vta_hw.isa import MemType

        elem_bytes = {MemType.UOP: self.uop_elem_bytes, MemType.WGT: self.wgt_elem_bytes,
                      MemType.INP: self.inp_elem_bytes, MemType.ACC: self.acc_elem_bytes,
                      MemType.OUT: self.out_elem_bytes,
                      # int8 in DRAM, sign-extended into the accumulator: one byte per value
                      MemType.ACC_8BIT: self.batch * self.block_out}
        log_depth = {MemType.UOP: self.log_uop_depth, MemType.WGT: self.log_wgt_depth,
                     MemType.INP: self.log_inp_depth, MemType.ACC: self.log_acc_depth,
                     MemType.OUT: self.log_out_depth, MemType.ACC_8BIT: self.log_acc_depth}
        order = sorted(MemType)
        assert [int(t) for t in order] == list(range(len(order)))
        return tuple(elem_bytes[t] for t in order), tuple(log_depth[t] for t in order)

    def _memory_type_index(self, memory_type: int) -> int:
        n = len(self._by_memory_type[0])
        if isinstance(memory_type, bool) or not 0 <= memory_type < n:
            raise ValueError(f"memory_type={memory_type!r} is not a memory type (expected "
                             f"an isa.MemType, 0..{n - 1})")
        return memory_type

    def elem_bytes(self, memory_type: int) -> int:
        """DRAM bytes of one element of ``memory_type`` (an :class:`~vtakit.vta_hw.isa.MemType`;
        the unit ``dram_base``, ``x_size`` and ``x_stride`` count; docs/timing.md's ``E``).

        ``default`` preset: UOP 4, WGT 256, INP 16, ACC 64, OUT 16, ACC_8BIT 16 (``batch *
        block_out`` int8 values, sign-extended into one ACC element).
        """
        return self._by_memory_type[0][self._memory_type_index(memory_type)]

    def log_depth(self, memory_type: int) -> int:
        """log2 of the elements of the buffer that ``memory_type`` loads into or stores from
        (ACC_8BIT: the ACC buffer)."""
        return self._by_memory_type[1][self._memory_type_index(memory_type)]

    def depth(self, memory_type: int) -> int:
        """Elements of the buffer that ``memory_type`` loads into or stores from."""
        return 1 << self.log_depth(memory_type)

    # ---- memory bus -----------------------------------------------------------------------
    @property
    def bus_width_bits(self) -> int:
        return 1 << self.log_bus_width

    @property
    def bus_bytes(self) -> int:
        return self.bus_width_bits // 8

    @property
    def peak_gops(self) -> float:
        """Peak int8 throughput in GOP/s (2 operations per MAC) at ``clock_mhz``."""
        return 2 * self.macs_per_cycle * self.clock_mhz / 1000.0

    # ---- checking ---------------------------------------------------------------------------
    def validate(self) -> HwConfig:
        """Check that the configuration can be built; return ``self`` or raise ``ValueError``.

        The instruction-field checks (index widths against the 128-bit instruction and the 32-bit
        micro-op) live in :mod:`vtakit.vta_hw.isa`, which owns the layouts; they run here too.
        """
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"HwConfig.{f.name}: expected an int, got "
                                f"{type(value).__name__} {value!r}")
        exact = {"log_inp_width": 3, "log_wgt_width": 3, "log_acc_width": 5}
        for name, want in exact.items():
            got = getattr(self, name)
            if got != want:
                raise ValueError(
                    f"HwConfig.{name}={got} is not supported: vtakit builds int8 inputs and "
                    f"weights with int32 accumulators (expected {name}={want})")
        ranges = {
            "log_batch": (0, 4), "log_block_in": (0, 6), "log_block_out": (0, 6),
            "log_uop_buff_size": (2, 24), "log_inp_buff_size": (0, 26),
            "log_wgt_buff_size": (0, 28), "log_acc_buff_size": (0, 28),
            "log_bus_width": (3, 10), "clock_mhz": (1, 2000),
            "mem_read_latency_cycles": (1, 4096), "mem_max_burst_beats": (1, 256),
            "cmd_queue_depth": (1, 1 << 16), "dep_queue_depth": (1, 1 << 16),
        }
        for name, (lo, hi) in ranges.items():
            got = getattr(self, name)
            if not lo <= got <= hi:
                raise ValueError(f"HwConfig.{name}={got} is out of range "
                                 f"(expected {lo} <= {name} <= {hi})")
        for name in ("mem_max_burst_beats", "cmd_queue_depth", "dep_queue_depth"):
            got = getattr(self, name)
            if got & (got - 1):
                raise ValueError(f"HwConfig.{name}={got} is not a power of two "
                                 f"(expected 1, 2, 4, ...)")
        for buf, elem_bits in (("uop", self.uop_elem_bits), ("inp", self.inp_elem_bits),
                               ("wgt", self.wgt_elem_bits), ("acc", self.acc_elem_bits)):
            name = f"log_{buf}_buff_size"
            size_bytes = 1 << getattr(self, name)
            if size_bytes * 8 < elem_bits:
                raise ValueError(
                    f"HwConfig.{name}={getattr(self, name)} gives a {size_bytes}-byte "
                    f"{buf.upper()} buffer, too small for one {elem_bits // 8}-byte tile "
                    f"of a {self.batch}x{self.block_in}x{self.block_out} core (expected "
                    f"{name} >= {(elem_bits // 8).bit_length() - 1})")
        from vtakit.vta_hw import isa  # the ISA owns the field layouts; it imports us

        isa.check_config(self)
        return self

    # ---- naming, hashing, JSON --------------------------------------------------------------
    @property
    def bitstream_name(self) -> str:
        """VTA's naming scheme, e.g. ``1x16x16_i8w8a32_15_15_18_17``."""
        return (f"{self.batch}x{self.block_in}x{self.block_out}_i{self.inp_width_bits}"
                f"w{self.wgt_width_bits}a{self.acc_width_bits}_{self.log_uop_buff_size}_"
                f"{self.log_inp_buff_size}_{self.log_wgt_buff_size}_{self.log_acc_buff_size}")

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @property
    def hash(self) -> str:
        """Stable 8-hex-digit hash of every field (the hardware ID register holds it as 32 bits).

        Computed from the canonical JSON (sorted keys, no spaces), so it does not depend on the
        Python version, on field order or on how the configuration was created.
        """
        canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:8]

    @property
    def hash_u32(self) -> int:
        return int(self.hash, 16)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HwConfig:
        """Build and validate a configuration from a mapping.

        Accepts our own field names and, for convenience, VTA's ``vta_config.json`` keys
        (upper case, ``LOG_BLOCK`` setting both block sizes; ``TARGET`` is ignored and
        ``HW_VER`` must be 0.0.2). Missing fields take the ``default`` preset's values.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"HwConfig: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            name = str(key).lower()
            if name == "target":
                continue
            if name == "hw_ver":
                if value != "0.0.2":
                    raise ValueError(f"HwConfig: HW_VER={value!r} is not supported "
                                     f"(expected '0.0.2')")
                continue
            if name == "log_block":
                kwargs.setdefault("log_block_in", value)
                kwargs.setdefault("log_block_out", value)
                continue
            if name not in known:
                raise ValueError(f"HwConfig: unknown field {key!r} (expected one of "
                                 f"{', '.join(sorted(known))})")
            kwargs[name] = value
        return cls(**kwargs).validate()

    @classmethod
    def from_json(cls, text: str | bytes) -> HwConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"HwConfig: not valid JSON ({err})") from None
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> HwConfig:
        """A copy with some fields changed, validated."""
        return dataclasses.replace(self, **changes).validate()


PRESETS: dict[str, HwConfig] = {
    # VTA's Pynq configuration (vta_config.json defaults): 1x16x16, 64-bit AXI at 100 MHz.
    "default": HwConfig(),
    # Lattice ECP5-85F (156 MULT18X18D, 208 x 18-kbit EBR): an 8x8 int8 array takes 64 DSPs.
    # Buffers: 16 KiB UOP + 16 KiB INP + 64 KiB WGT + 64 KiB ACC + 16 KiB OUT = 176 KiB, about
    # 88 of the 208 EBRs, leaving room for queues and the SoC.
    "ecp5": HwConfig(log_block_in=3, log_block_out=3, log_uop_buff_size=14,
                     log_inp_buff_size=14, log_wgt_buff_size=16, log_acc_buff_size=16,
                     clock_mhz=50, cmd_queue_depth=128, dep_queue_depth=64),
    # default's arithmetic (1x16x16, int8/int32, 64-bit bus) on the ECP5-85F, an opt-in board
    # build (docs/boards.md). default's 480 KiB of buffers exceed the part's 416 KiB of EBR;
    # these take the widths' natural depths: a WGT tile is 2048 bits wide, 57 EBRs of 512
    # entries, so 512 tiles (128 KiB) cost what 256 would; ACC 512 rows (32 KiB, 15 EBRs).
    # 256 products against 156 MULT18X18D: the board builds part of the GEMM core as Booth
    # multipliers in logic (vta_hw/gemm.py).
    "ecp5-16x16": HwConfig(log_uop_buff_size=14, log_inp_buff_size=14, log_wgt_buff_size=17,
                           log_acc_buff_size=15, clock_mhz=50, cmd_queue_depth=128,
                           dep_queue_depth=64),
    # Lattice iCE40 UP5K (5,280 LCs, 8 SB_MAC16, 30 x 4-kbit EBR, 4 single-port SPRAMs). The
    # buffers need a read and a write port in the same cycle (the GEMM pipeline, load/store
    # overlapping compute), so they live in EBR, not SPRAM: 2 KiB UOP (512 micro-ops) + 2 KiB
    # INP + 2 KiB WGT + 4 KiB ACC + 1 KiB OUT = 88 kbit (24 EBRs with the banking, measured
    # by synth_ice40). A command queue entry is 128 bits (8 EBRs wide), so the queues hold one
    # instruction each, in registers. 1x1x1: one DSP for GEMM, three for the ALU's MUL; LUTs
    # are the scarce resource (docs/hardware.md). 12 MHz: the UP5K boards' oscillator
    # (iCEBreaker); nextpnr closes timing at about 15 MHz. The memory model is the UP5K's own
    # DRAM, its SPRAMs: a read beat one cycle after its grant (no delay line in the SoC), and
    # bursts of 4 beats, one instruction, so fetch buffers one instruction rather than two
    # (together about 200 logic cells, what lets the core and the UART bridge fit the part).
    "ice40": HwConfig(log_block_in=0, log_block_out=0, log_uop_buff_size=11,
                      log_inp_buff_size=11, log_wgt_buff_size=11, log_acc_buff_size=12,
                      log_bus_width=5, clock_mhz=12, mem_read_latency_cycles=1,
                      mem_max_burst_beats=4, cmd_queue_depth=1, dep_queue_depth=16),
    # A big core for large FPGAs (UltraScale+ class): 1x32x32 on a 128-bit bus.
    "large": HwConfig(log_block_in=5, log_block_out=5, log_uop_buff_size=15,
                      log_inp_buff_size=16, log_wgt_buff_size=20, log_acc_buff_size=18,
                      log_bus_width=7, clock_mhz=200, mem_max_burst_beats=32),
}


def preset_names() -> list[str]:
    return list(PRESETS)


def preset(name: str) -> HwConfig:
    """The named preset, validated; ``ValueError`` naming the known presets otherwise."""
    try:
        cfg = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown hardware configuration {name!r} (expected one of "
                         f"{', '.join(PRESETS)})") from None
    return cfg.validate()


def check_saved_config(stored: HwConfig, claimed_hash: object, expected: HwConfig | None,
                       where: str) -> None:
    """A file (a program, a run image) saved with configuration `stored` and the hash
    `claimed_hash` written beside it: ``ValueError`` naming `where` if the hash is missing or
    does not match (the file is corrupt or older than hashes), or if `expected` is given and
    is another configuration."""
    if claimed_hash is None:
        raise ValueError(f"{where}: no config_hash (saved by an older vtakit); save it again")
    if stored.hash != claimed_hash:
        raise ValueError(f"{where}: its configuration hashes to {stored.hash}, but it says "
                         f"{claimed_hash!r}: the file is corrupt")
    if expected is not None and expected.hash != stored.hash:
        raise ValueError(f"{where}: built for configuration {stored.hash} "
                         f"({stored.bitstream_name}), expected {expected.hash} "
                         f"({expected.bitstream_name})")
