"""The instruction set: the only definition of every instruction and micro-op field.

Pure Python and numpy (no Amaranth), so the simulator, driver and compiler can import it cheaply;
the hardware derives its Amaranth layouts from the same tables.

Bit-compatible with VTA's ``hw_spec.h``, hardware version 0.0.2, for the same configuration:

- Instructions are 128 bits, stored little-endian (16 bytes each). Fields are packed from bit 0
  in the order of the tables below; a field never straddles bit 64 (it moves up to bit 64, as the
  ``uint64_t`` bitfields of VTA's C structs do).
- Micro-ops are 32 bits: ``dst | src | wgt`` from bit 0.
- Index fields are as wide as log2 of the buffer they index; everything else has a fixed width.

Worked example (``default`` preset): load a 4x4 tile of INP elements from DRAM element 256,
with one element of zero padding on every side, into INP SRAM index 0::

    LoadInsn(memory_type=INP, sram_base=0, dram_base=256, y_size=4, x_size=4, x_stride=4,
             y_pad_0=1, y_pad_1=1, x_pad_0=1, x_pad_1=1)

fills SRAM rows 0..35 (a 6x6 block whose border is zero). docs/isa.md has more examples.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from vtakit.vta_hw.config import UOP_WIDTH_BITS, HwConfig

__all__ = [
    "HW_VER", "INSN_WIDTH_BITS", "INSN_BYTES", "UOP_BYTES", "Opcode", "MemType", "AluOp",
    "Field", "Layout", "IsaLayouts", "layouts", "check_config",
    "MemInsn", "GemmInsn", "AluInsn", "FinishInsn", "Insn", "Uop",
    "encode", "decode", "encode_stream", "decode_stream", "DecodedStream",
    "encode_uops", "decode_uops",
]

#: Hardware/ISA version (VTA's HW_VER). 0.0.2 has 3-bit memory_type and alu_opcode fields.
HW_VER = (0, 0, 2)

INSN_WIDTH_BITS = 128
INSN_BYTES = INSN_WIDTH_BITS // 8
UOP_BYTES = UOP_WIDTH_BITS // 8
_WORD_BITS = 64

# Fixed field widths of hw_spec.h (not derived from the configuration).
OPCODE_BITS = 3
MEMORY_TYPE_BITS = 3
ALU_OPCODE_BITS = 3
SRAM_ADDR_BITS = 16
DRAM_ADDR_BITS = 32
SIZE_BITS = 16
STRIDE_BITS = 16
PAD_BITS = 4
LOOP_ITER_BITS = 14
IMM_BITS = 16


class Opcode(IntEnum):
    LOAD = 0
    STORE = 1
    GEMM = 2
    FINISH = 3
    ALU = 4


class MemType(IntEnum):
    """Which buffer a LOAD or STORE moves (``memory_type``)."""

    UOP = 0
    WGT = 1
    INP = 2
    ACC = 3
    OUT = 4
    ACC_8BIT = 5  # int8 in DRAM, sign-extended into the 32-bit accumulator


class AluOp(IntEnum):
    """``alu_opcode``: ``ACC[dst] = op(ACC[dst], imm or ACC[src])``."""

    MIN = 0
    MAX = 1
    ADD = 2
    SHR = 3  # arithmetic shift right; a negative amount shifts left
    MUL = 4  # low 32 bits of the product (our hardware implements it; VTA's HLS did not)


@dataclass(frozen=True)
class Field:
    """One bit field: ``width`` bits starting at bit ``lsb`` (two's complement if ``signed``)."""

    name: str
    lsb: int
    width: int
    signed: bool = False

    @property
    def msb(self) -> int:
        return self.lsb + self.width - 1

    @property
    def mask(self) -> int:
        return (1 << self.width) - 1

    @property
    def min(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def max(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else self.mask


@dataclass(frozen=True)
class Layout:
    """The fields of one instruction kind, in bit order."""

    kind: str
    width_bits: int
    fields: tuple[Field, ...]

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.kind} has no field {name!r}")

    def __contains__(self, name: object) -> bool:
        return any(f.name == name for f in self.fields)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)


# (name, width, signed, which configuration fields set the width) for one instruction kind;
# the last item is only used in error messages.
_Spec = tuple[str, int, bool, str]


def _pack(kind: str, specs: Sequence[_Spec], total_bits: int,
          word_bits: int | None = _WORD_BITS) -> Layout:
    out: list[Field] = []
    pos = 0
    for name, width, signed, _source in specs:
        if word_bits and pos // word_bits != (pos + width - 1) // word_bits:
            pos = (pos // word_bits + 1) * word_bits  # never straddle a word boundary
        if pos + width > total_bits:
            derived = ", ".join(f"{n} {w} bits (from {src})" for n, w, _, src in specs
                                if src != "the ISA")
            raise ValueError(
                f"{kind} fields do not fit in {total_bits} bits: '{name}' would end at bit "
                f"{pos + width - 1}. Index widths of this configuration: {derived}; reduce the "
                f"buffer sizes that set them")
        out.append(Field(name, pos, width, signed))
        pos += width
    return Layout(kind, total_bits, tuple(out))


_HEADER: tuple[_Spec, ...] = (
    ("opcode", OPCODE_BITS, False, "the ISA"),
    ("pop_prev", 1, False, "the ISA"),
    ("pop_next", 1, False, "the ISA"),
    ("push_prev", 1, False, "the ISA"),
    ("push_next", 1, False, "the ISA"),
)


@dataclass(frozen=True)
class IsaLayouts:
    """Every layout for one configuration; build it with :func:`layouts`."""

    mem: Layout
    gemm: Layout
    alu: Layout
    finish: Layout
    uop: Layout

    def for_opcode(self, opcode: int) -> Layout:
        try:
            return getattr(self, _LAYOUT_OF_OPCODE[Opcode(opcode)])
        except ValueError:
            raise ValueError(f"malformed instruction: opcode {opcode} is not one of "
                             f"{', '.join(f'{o.name}={o.value}' for o in Opcode)}") from None


_LAYOUT_OF_OPCODE = {Opcode.LOAD: "mem", Opcode.STORE: "mem", Opcode.GEMM: "gemm",
                     Opcode.ALU: "alu", Opcode.FINISH: "finish"}


@functools.lru_cache(maxsize=64)
def layouts(cfg: HwConfig) -> IsaLayouts:
    """The field tables for ``cfg``; raises ``ValueError`` when an index field does not fit."""
    uop_w = cfg.log_uop_depth
    inp_w, wgt_w, acc_w = cfg.log_inp_depth, cfg.log_wgt_depth, cfg.log_acc_depth
    max_idx = max(uop_w, inp_w, wgt_w, acc_w)
    if max_idx > SRAM_ADDR_BITS:
        raise ValueError(f"a buffer has 2^{max_idx} elements but sram_base is "
                         f"{SRAM_ADDR_BITS} bits; reduce the buffer sizes")
    uop_src = "log_uop_buff_size"
    inp_src = "log_inp_buff_size and the core shape"
    wgt_src = "log_wgt_buff_size and the core shape"
    acc_src = "log_acc_buff_size and the core shape"
    mem = _pack("MEM", _HEADER + (
        ("memory_type", MEMORY_TYPE_BITS, False, "the ISA"),
        ("sram_base", SRAM_ADDR_BITS, False, "the ISA"),
        ("dram_base", DRAM_ADDR_BITS, False, "the ISA"),
        ("y_size", SIZE_BITS, False, "the ISA"),
        ("x_size", SIZE_BITS, False, "the ISA"),
        ("x_stride", STRIDE_BITS, False, "the ISA"),
        ("y_pad_0", PAD_BITS, False, "the ISA"),
        ("y_pad_1", PAD_BITS, False, "the ISA"),
        ("x_pad_0", PAD_BITS, False, "the ISA"),
        ("x_pad_1", PAD_BITS, False, "the ISA"),
    ), INSN_WIDTH_BITS)
    loop: tuple[_Spec, ...] = _HEADER + (
        ("reset", 1, False, "the ISA"),
        ("uop_bgn", uop_w, False, uop_src),
        ("uop_end", uop_w + 1, False, uop_src),
        ("iter_out", LOOP_ITER_BITS, False, "the ISA"),
        ("iter_in", LOOP_ITER_BITS, False, "the ISA"),
        ("dst_factor_out", acc_w, False, acc_src),
        ("dst_factor_in", acc_w, False, acc_src),
    )
    gemm = _pack("GEMM", loop + (
        ("src_factor_out", inp_w, False, inp_src),
        ("src_factor_in", inp_w, False, inp_src),
        ("wgt_factor_out", wgt_w, False, wgt_src),
        ("wgt_factor_in", wgt_w, False, wgt_src),
    ), INSN_WIDTH_BITS)
    alu = _pack("ALU", loop + (
        ("src_factor_out", acc_w, False, acc_src),  # ALU sources index the accumulator
        ("src_factor_in", acc_w, False, acc_src),
        ("alu_opcode", ALU_OPCODE_BITS, False, "the ISA"),
        ("use_imm", 1, False, "the ISA"),
        ("imm", IMM_BITS, True, "the ISA"),
    ), INSN_WIDTH_BITS)
    finish = _pack("FINISH", _HEADER, INSN_WIDTH_BITS)
    uop = _pack("UOP", (
        ("dst", acc_w, False, acc_src),
        ("src", max(acc_w, inp_w), False, "the larger of the ACC and INP index widths"),
        ("wgt", wgt_w, False, wgt_src),
    ), UOP_WIDTH_BITS, word_bits=None)
    return IsaLayouts(mem=mem, gemm=gemm, alu=alu, finish=finish, uop=uop)


def check_config(cfg: HwConfig) -> None:
    """Raise ``ValueError`` if ``cfg``'s index widths do not fit the instruction formats."""
    try:
        layouts(cfg)
    except ValueError as err:
        raise ValueError(f"HwConfig {cfg.bitstream_name}: {err}") from None


# ---- instructions as Python objects ---------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class _Deps:
    pop_prev: int = 0
    pop_next: int = 0
    push_prev: int = 0
    push_next: int = 0


@dataclass(frozen=True, kw_only=True)
class MemInsn(_Deps):
    """LOAD or STORE of a 2-D strided block; sizes, strides and addresses count elements.

    DRAM element ``dram_base + y * x_stride + x`` for ``y < y_size, x < x_size`` lands in SRAM
    element ``sram_base + (y + y_pad_0) * (x_pad_0 + x_size + x_pad_1) + x + x_pad_0``; the
    padding rows and columns are zero. ``x_size == 0`` makes it a NOP that only carries tokens.
    """

    opcode: Opcode = Opcode.LOAD
    memory_type: MemType = MemType.INP
    sram_base: int = 0
    dram_base: int = 0
    y_size: int = 0
    x_size: int = 0
    x_stride: int = 0
    y_pad_0: int = 0
    y_pad_1: int = 0
    x_pad_0: int = 0
    x_pad_1: int = 0


@dataclass(frozen=True, kw_only=True)
class _LoopInsn(_Deps):
    reset: int = 0
    uop_bgn: int = 0
    uop_end: int = 0
    iter_out: int = 1
    iter_in: int = 1
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0


@dataclass(frozen=True, kw_only=True)
class GemmInsn(_LoopInsn):
    """``ACC[dst] (+)= INP[src] @ WGT[wgt].T`` over the micro-ops ``uop_bgn..uop_end-1``."""

    opcode: Opcode = Opcode.GEMM
    wgt_factor_out: int = 0
    wgt_factor_in: int = 0


@dataclass(frozen=True, kw_only=True)
class AluInsn(_LoopInsn):
    """``ACC[dst] = alu_opcode(ACC[dst], imm if use_imm else ACC[src])``."""

    opcode: Opcode = Opcode.ALU
    alu_opcode: AluOp = AluOp.ADD
    use_imm: int = 0
    imm: int = 0


@dataclass(frozen=True, kw_only=True)
class FinishInsn(_Deps):
    opcode: Opcode = Opcode.FINISH


Insn = MemInsn | GemmInsn | AluInsn | FinishInsn

_CLASS_OF_OPCODE: dict[Opcode, type] = {
    Opcode.LOAD: MemInsn, Opcode.STORE: MemInsn, Opcode.GEMM: GemmInsn,
    Opcode.ALU: AluInsn, Opcode.FINISH: FinishInsn,
}
_ENUM_OF_FIELD: dict[str, type[IntEnum]] = {
    "opcode": Opcode, "memory_type": MemType, "alu_opcode": AluOp,
}


@dataclass(frozen=True)
class Uop:
    """One micro-op: accumulator row ``dst``, source row ``src`` (INP for GEMM, ACC for ALU)
    and weight tile ``wgt`` (ignored by the ALU)."""

    dst: int = 0
    src: int = 0
    wgt: int = 0


def _check(kind: str, f: Field, value: int) -> int:
    if not f.min <= value <= f.max:
        raise ValueError(f"{kind} field '{f.name}' = {value} does not fit in {f.width} bits "
                         f"(expected {f.min}..{f.max})")
    return value & f.mask


def _as_int(kind: str, name: str, value: object) -> int:
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise TypeError(f"{kind} field '{name}': expected an int, got {type(value).__name__} "
                    f"{value!r}")


def encode(insn: Insn, cfg: HwConfig) -> int:
    """The 128-bit instruction word of ``insn`` as an int; ``ValueError`` if a field overflows."""
    if not isinstance(insn, (MemInsn, GemmInsn, AluInsn, FinishInsn)):
        raise TypeError(f"expected an instruction (MemInsn, GemmInsn, AluInsn, FinishInsn), "
                        f"got {type(insn).__name__}")
    opcode = Opcode(insn.opcode)
    if not isinstance(insn, _CLASS_OF_OPCODE[opcode]):
        raise ValueError(f"{type(insn).__name__} cannot have opcode {opcode.name}")
    lay = layouts(cfg).for_opcode(opcode)
    word = 0
    for f in lay.fields:
        word |= _check(opcode.name, f, _as_int(opcode.name, f.name, getattr(insn, f.name))) \
            << f.lsb
    return word


def decode(word: int | bytes, cfg: HwConfig) -> Insn:
    """The instruction in a 128-bit word (an int, or 16 little-endian bytes)."""
    if isinstance(word, (bytes, bytearray, memoryview)):
        if len(word) != INSN_BYTES:
            raise ValueError(f"an instruction is {INSN_BYTES} bytes, got {len(word)}")
        word = int.from_bytes(word, "little")
    if not 0 <= word < (1 << INSN_WIDTH_BITS):
        raise ValueError(f"instruction word {word:#x} is not a 128-bit unsigned value")
    opcode = word & ((1 << OPCODE_BITS) - 1)
    lay = layouts(cfg).for_opcode(opcode)
    values: dict[str, object] = {}
    for f in lay.fields:
        v = (word >> f.lsb) & f.mask
        if f.signed and v > f.max:
            v -= 1 << f.width
        enum = _ENUM_OF_FIELD.get(f.name)
        if enum is not None:
            try:
                values[f.name] = enum(v)
            except ValueError:
                raise ValueError(
                    f"malformed {Opcode(opcode).name} instruction: {f.name}={v} is not one of "
                    f"{', '.join(f'{e.name}={e.value}' for e in enum)}") from None
        else:
            values[f.name] = v
    return _CLASS_OF_OPCODE[Opcode(opcode)](**values)


def encode_stream(insns: Iterable[Insn], cfg: HwConfig) -> bytes:
    """Instructions as consecutive 16-byte little-endian words (the DRAM image fetch reads)."""
    return b"".join(encode(i, cfg).to_bytes(INSN_BYTES, "little") for i in insns)


class DecodedStream(Mapping[str, np.ndarray]):
    """Every field of every instruction of a stream, decoded at once with numpy.

    ``stream["opcode"]`` is an int64 array with one entry per instruction; ``stream[name]`` gives,
    for each instruction, the value of ``name`` in that instruction's own layout and 0 where its
    kind has no such field (so ``stream["uop_end"]`` is meaningful where the opcode is GEMM or ALU).
    """

    def __init__(self, words: np.ndarray, cfg: HwConfig):
        self.cfg = cfg
        self._lo = words[:, 0]
        self._hi = words[:, 1]
        self.opcode = (self._lo & np.uint64((1 << OPCODE_BITS) - 1)).astype(np.int64)
        lay = layouts(cfg)
        self._kinds = ((lay.mem, (Opcode.LOAD, Opcode.STORE)), (lay.gemm, (Opcode.GEMM,)),
                       (lay.alu, (Opcode.ALU,)), (lay.finish, (Opcode.FINISH,)))
        self._names = list(dict.fromkeys(n for lay_, _ in self._kinds for n in lay_.names))
        self._cache: dict[str, np.ndarray] = {"opcode": self.opcode}

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self):
        return iter(self._names)

    @property
    def count(self) -> int:
        return len(self.opcode)

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._cache:
            return self._cache[name]
        if name not in self._names:
            raise KeyError(f"no instruction has a field {name!r}")
        out = np.zeros(self.count, dtype=np.int64)
        for lay, opcodes in self._kinds:
            if name not in lay:
                continue
            f = lay[name]
            rows = np.isin(self.opcode, [int(o) for o in opcodes])
            word = self._lo if f.lsb < _WORD_BITS else self._hi
            v = ((word[rows] >> np.uint64(f.lsb % _WORD_BITS)) & np.uint64(f.mask))
            v = v.astype(np.int64)
            if f.signed:
                v = np.where(v > f.max, v - (1 << f.width), v)
            out[rows] = v
        self._cache[name] = out
        return out

    def malformed(self) -> np.ndarray:
        """Indices of instructions whose opcode or enum fields name nothing."""
        bad = self.opcode > max(Opcode)
        mem = np.isin(self.opcode, [Opcode.LOAD, Opcode.STORE])
        bad |= mem & (self["memory_type"] > max(MemType))
        bad |= (self.opcode == Opcode.ALU) & (self["alu_opcode"] > max(AluOp))
        return np.flatnonzero(bad)


def decode_stream(data: bytes | bytearray | memoryview | np.ndarray,
                  cfg: HwConfig) -> DecodedStream:
    """Decode a whole instruction stream (bytes, or a uint8/uint64 array) without a Python loop
    per instruction."""
    arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if arr.dtype == np.uint8:
        if arr.size % INSN_BYTES:
            raise ValueError(f"an instruction stream is a whole number of {INSN_BYTES}-byte "
                             f"instructions, got {arr.size} bytes")
        words = np.ascontiguousarray(arr).reshape(-1).view("<u8").reshape(-1, 2)
    elif arr.dtype == np.uint64:
        words = arr.reshape(-1, 2)
    else:
        raise TypeError(f"expected bytes or a uint8/uint64 array, got a {arr.dtype} array")
    return DecodedStream(words.astype(np.uint64, copy=False), cfg)


def encode_uops(uops: Iterable[Uop] | np.ndarray, cfg: HwConfig) -> np.ndarray:
    """Micro-ops as a little-endian uint32 array.

    Takes ``Uop`` objects, or an integer array of shape (n, 3) holding dst, src, wgt columns.
    """
    lay = layouts(cfg).uop
    if isinstance(uops, np.ndarray):
        cols = np.asarray(uops, dtype=np.int64).reshape(-1, 3)
    else:
        cols = np.array([(u.dst, u.src, u.wgt) for u in uops], dtype=np.int64).reshape(-1, 3)
    word = np.zeros(len(cols), dtype=np.uint64)
    for k, f in enumerate(lay.fields):
        col = cols[:, k]
        bad = (col < f.min) | (col > f.max)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"micro-op {i}: field '{f.name}' = {int(col[i])} does not fit in "
                             f"{f.width} bits (expected {f.min}..{f.max})")
        word |= col.astype(np.uint64) << np.uint64(f.lsb)
    return word.astype("<u4")


def decode_uops(words: np.ndarray | bytes, cfg: HwConfig) -> tuple[np.ndarray, np.ndarray,
                                                                      np.ndarray]:
    """(dst, src, wgt) int64 arrays of a micro-op array (uint32 words or raw bytes)."""
    if isinstance(words, (bytes, bytearray, memoryview)):
        if len(words) % UOP_BYTES:
            raise ValueError(f"a micro-op array is a whole number of {UOP_BYTES}-byte words, "
                             f"got {len(words)} bytes")
        words = np.frombuffer(words, dtype="<u4")
    w = np.asarray(words).astype(np.int64)
    lay = layouts(cfg).uop
    dst, src, wgt = ((w >> f.lsb) & f.mask for f in lay.fields)
    return dst, src, wgt


def replace(insn: Insn, **changes: object) -> Insn:
    """A copy of ``insn`` with some fields changed (the driver uses it to set token flags)."""
    return dataclasses.replace(insn, **changes)  # type: ignore[arg-type]
