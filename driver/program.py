"""Micro-op kernels and relocatable instruction streams.

A :class:`Program` is an encoded instruction stream whose DRAM addresses are left open: every
LOAD/STORE names a *slot* (a buffer) and an element offset inside it, and :meth:`Program.link`
patches ``dram_base`` for whatever physical addresses the slots get, without re-encoding. The
compiler's artifacts store programs in this form.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig, check_saved_config

__all__ = ["Loop", "UopKernel", "KernelBuilder", "Reloc", "Program"]


@dataclass(frozen=True)
class Loop:
    """One of the (at most two) loops around a kernel's micro-ops: ``extent`` iterations, each
    adding the factors to the micro-op's dst, src and wgt indices."""

    extent: int
    dst: int = 0
    src: int = 0
    wgt: int = 0


@dataclass(frozen=True)
class UopKernel:
    """A micro-op kernel: the micro-ops, their loops and what the GEMM/ALU does with them.

    Attributes
    ----------
    mode : str
        ``"gemm"`` or ``"alu"``.
    uops : np.ndarray
        int64 array (n, 3): dst, src, wgt of each micro-op.
    loops : tuple[Loop, ...]
        Outer loop first; ``iter_out``/``iter_in`` of the instruction (one loop is ``iter_in``).
    reset : bool
        Write zeros instead of computing.
    alu_opcode, use_imm, imm :
        The ALU operation (ALU kernels only).
    """

    mode: str
    uops: np.ndarray
    loops: tuple[Loop, ...] = ()
    reset: bool = False
    alu_opcode: isa.AluOp = isa.AluOp.ADD
    use_imm: bool = False
    imm: int = 0

    def __post_init__(self):
        if self.mode not in ("gemm", "alu"):
            raise ValueError(f"kernel mode must be 'gemm' or 'alu', got {self.mode!r}")
        if len(self.loops) > 2:
            raise ValueError(f"a micro-op kernel has at most 2 loops, got {len(self.loops)}")
        if len(self.uops) == 0:
            raise ValueError("a micro-op kernel needs at least one micro-op")

    @property
    def signature(self) -> str:
        """Content hash: two kernels with the same signature are interchangeable."""
        h = hashlib.sha256(np.ascontiguousarray(self.uops, dtype=np.int64).tobytes())
        h.update(repr((self.mode, self.loops, self.reset, int(self.alu_opcode),
                       self.use_imm, self.imm)).encode())
        return h.hexdigest()[:16]

    @property
    def uop_signature(self) -> str:
        """Hash of the micro-ops alone, what a LOAD puts in the UOP SRAM: kernels that differ
        only in loops or ALU fields (which live in the GEMM/ALU instruction) share one load."""
        return hashlib.sha256(np.ascontiguousarray(self.uops, dtype=np.int64).tobytes()
                              ).hexdigest()[:16]

    def describe(self) -> str:
        """One line: mode fields, loops and the first micro-ops (for error messages)."""
        head = ", ".join(f"({d}, {s}, {w})" for d, s, w in self.uops[:3].tolist())
        more = f", ... ({len(self.uops)} in all)" if len(self.uops) > 3 else ""
        loops = " x ".join(f"{lp.extent}(dst+{lp.dst}, src+{lp.src}, wgt+{lp.wgt})"
                           for lp in self.loops) or "none"
        fields = f"reset={self.reset}" if self.mode == "gemm" else (
            f"{isa.AluOp(self.alu_opcode).name}, use_imm={self.use_imm}, imm={self.imm}")
        return f"{self.mode} [{fields}; loops {loops}; micro-ops {head}{more}]"

    def words(self, cfg: HwConfig) -> np.ndarray:
        return isa.encode_uops(self.uops, cfg)

    def insn(self, uop_bgn: int, **deps: int) -> isa.GemmInsn | isa.AluInsn:
        """The GEMM/ALU instruction running this kernel from UOP SRAM index ``uop_bgn``."""
        outer = self.loops[0] if len(self.loops) == 2 else Loop(1)
        inner = self.loops[-1] if self.loops else Loop(1)
        common = dict(reset=int(self.reset), uop_bgn=uop_bgn, uop_end=uop_bgn + len(self.uops),
                      iter_out=outer.extent, iter_in=inner.extent,
                      dst_factor_out=outer.dst, dst_factor_in=inner.dst,
                      src_factor_out=outer.src, src_factor_in=inner.src, **deps)
        if self.mode == "gemm":
            return isa.GemmInsn(wgt_factor_out=outer.wgt, wgt_factor_in=inner.wgt, **common)
        return isa.AluInsn(alu_opcode=isa.AluOp(self.alu_opcode), use_imm=int(self.use_imm),
                           imm=self.imm, **common)


class KernelBuilder:
    """Records a kernel the VTA way: declare up to two loops, then push micro-ops."""

    def __init__(self, mode: str, *, reset: bool = False, alu_opcode: isa.AluOp = isa.AluOp.ADD,
                 use_imm: bool = False, imm: int = 0):
        self.mode, self.reset = mode, reset
        self.alu_opcode, self.use_imm, self.imm = alu_opcode, use_imm, imm
        self._loops: list[Loop] = []
        self._uops: list[tuple[int, int, int]] = []

    def loop(self, extent: int, dst: int = 0, src: int = 0, wgt: int = 0) -> KernelBuilder:
        if self._uops:
            raise ValueError("declare the kernel's loops before its first micro-op")
        if len(self._loops) == 2:
            raise ValueError("a micro-op kernel has at most 2 loops")
        if extent < 1:
            raise ValueError(f"loop extent must be at least 1, got {extent}")
        self._loops.append(Loop(extent, dst, src, wgt))
        return self

    def push(self, dst: int, src: int = 0, wgt: int = 0) -> KernelBuilder:
        self._uops.append((dst, src, wgt))
        return self

    def build(self) -> UopKernel:
        return UopKernel(self.mode, np.array(self._uops, dtype=np.int64).reshape(-1, 3),
                         tuple(self._loops), self.reset, isa.AluOp(self.alu_opcode),
                         self.use_imm, self.imm)


@dataclass(frozen=True)
class Reloc:
    """Instruction ``index`` addresses slot ``slot`` at element ``elem_offset``
    (elements of ``elem_bytes`` bytes)."""

    index: int
    slot: str
    elem_offset: int
    elem_bytes: int


@dataclass
class Program:
    """A relocatable instruction stream.

    Attributes
    ----------
    cfg : HwConfig
    words : np.ndarray
        uint64 (n, 2): the encoded instructions with ``dram_base`` = 0 where relocated.
    relocs : list[Reloc]
    constants : dict[str, np.ndarray]
        Slots whose contents belong to the program (micro-op arrays): the runner allocates and
        writes them; every other slot is an argument bound at link time.
    """

    cfg: HwConfig
    words: np.ndarray
    relocs: list[Reloc] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.words)

    @property
    def arguments(self) -> list[str]:
        """Slots that the caller binds to buffers (in first-use order)."""
        seen = dict.fromkeys(r.slot for r in self.relocs if r.slot not in self.constants)
        return list(seen)

    def link(self, addresses: Mapping[str, int]) -> bytes:
        """The stream with every ``dram_base`` set for the slots' physical byte addresses."""
        missing = [s for s in dict.fromkeys(r.slot for r in self.relocs) if s not in addresses]
        if missing:
            raise ValueError(f"cannot link: no address for slot(s) {', '.join(missing)} "
                             f"(got {', '.join(addresses) or 'none'})")
        f = isa.layouts(self.cfg).mem["dram_base"]
        words = self.words.copy()
        if self.relocs:
            idx = np.array([r.index for r in self.relocs], dtype=np.int64)
            base = np.empty(len(self.relocs), dtype=np.int64)
            for k, r in enumerate(self.relocs):
                addr = int(addresses[r.slot])
                if addr % r.elem_bytes:
                    raise ValueError(
                        f"cannot link instruction {r.index}: slot {r.slot!r} is at {addr:#x}, "
                        f"not a multiple of its {r.elem_bytes}-byte elements")
                base[k] = addr // r.elem_bytes + r.elem_offset
            bad = (base < 0) | (base > f.max)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                raise ValueError(f"cannot link instruction {self.relocs[k].index}: dram_base "
                                 f"{int(base[k])} does not fit in {f.width} bits")
            word = f.lsb // 64
            mask = np.uint64(f.mask << (f.lsb % 64))
            words[idx, word] = (words[idx, word] & ~mask) | \
                (base.astype(np.uint64) << np.uint64(f.lsb % 64))
        return words.astype("<u8").tobytes()

    def insns(self) -> list[isa.Insn]:
        """The (unlinked) instructions, decoded."""
        return [isa.decode(int(lo) | (int(hi) << 64), self.cfg) for lo, hi in self.words]

    def listing(self, uops: bool = False) -> list[str]:
        """The disassembly, one instruction per line; a relocated LOAD/STORE names its slot and
        element offset (``dram_base`` is 0 until linked), and with ``uops`` every micro-op
        kernel the program loads follows."""
        from vtakit.vta_hw.disasm import format_insn, format_uops

        where = {r.index: r for r in self.relocs}
        lines = []
        for i, insn in enumerate(self.insns()):
            line = format_insn(i, insn, self.cfg)
            r = where.get(i)
            if r is not None:
                line += f"   ; dram_base = &{r.slot} + {r.elem_offset}"
            lines.append(line)
        if uops:
            for slot, words in self.constants.items():
                lines.append(f"; {slot}: {len(words)} micro-ops")
                lines += format_uops(np.ascontiguousarray(words, "<u4").tobytes(), self.cfg)
        return lines

    def save(self, path: str | Path | io.BytesIO) -> None:
        """Write the program as one ``.npz``: the words, the micro-op constants, and its
        configuration with that configuration's hash (`load` checks both)."""
        meta = {"config": self.cfg.to_dict(), "config_hash": self.cfg.hash,
                "hw_ver": list(isa.HW_VER),
                "relocs": [[r.index, r.slot, r.elem_offset, r.elem_bytes] for r in self.relocs],
                "constants": list(self.constants)}
        arrays = {f"const_{k}": v for k, v in enumerate(self.constants.values())}
        arrays["words"] = self.words
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy stubs: allow_pickle

    @classmethod
    def load(cls, path: str | Path | io.BytesIO, cfg: HwConfig | None = None) -> Program:
        """Read a program written by `save`. `ValueError` if the file is not one, if its stored
        configuration does not hash to its stored hash, or if `cfg` is given and the program
        was built for another configuration."""
        where = "program" if isinstance(path, io.BytesIO) else f"program {path}"
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(z["meta"].tobytes())
                words = np.array(z["words"])
                consts = {name: np.array(z[f"const_{k}"])
                          for k, name in enumerate(meta["constants"])}
        except (OSError, EOFError, KeyError, TypeError, ValueError, AttributeError,
                zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError) as e:
            raise ValueError(f"{where}: not a saved vtakit program ({type(e).__name__}: {e}; "
                             f"expected the .npz of Program.save)") from None
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: its metadata is a {type(meta).__name__}, expected a JSON "
                             f"object")
        if tuple(meta.get("hw_ver", ())) != isa.HW_VER:
            raise ValueError(f"{where}: built for ISA {meta.get('hw_ver')}, this is "
                             f"{list(isa.HW_VER)}")
        try:
            stored = HwConfig.from_dict(meta.get("config"))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: config: {e}") from None
        check_saved_config(stored, meta.get("config_hash"), cfg, where)
        if words.dtype != np.uint64 or words.ndim != 2 or words.shape[1] != 2:
            raise ValueError(f"{where}: words: expected uint64 (n, 2), got {words.dtype} "
                             f"{words.shape}")
        try:
            relocs = [Reloc(*r) for r in meta["relocs"]]
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: relocs: expected [index, slot, elem_offset, "
                             f"elem_bytes] each ({e})") from None
        for r in relocs:
            ok = (all(isinstance(v, int) and not isinstance(v, bool)
                      for v in (r.index, r.elem_offset, r.elem_bytes))
                  and isinstance(r.slot, str) and 0 <= r.index < len(words) and r.elem_bytes > 0)
            if not ok:
                raise ValueError(f"{where}: relocation {r}: expected an instruction index < "
                                 f"{len(words)}, a slot name and element sizes > 0")
        return cls(stored, words, relocs, consts)

    @classmethod
    def from_insns(cls, cfg: HwConfig, insns: Sequence[isa.Insn], relocs: Sequence[Reloc] = (),
                   constants: Mapping[str, np.ndarray] | None = None) -> Program:
        data = isa.encode_stream(insns, cfg)
        words = np.frombuffer(data, dtype="<u8").reshape(-1, 2).astype(np.uint64)
        return cls(cfg, words, list(relocs), dict(constants or {}))
