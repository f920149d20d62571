"""Helpers shared by the simulator tests: build a DRAM image holding a stream and its data."""

from __future__ import annotations

import numpy as np

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import AluInsn, FinishInsn, GemmInsn, MemInsn, MemType, Opcode


class Image:
    """A DRAM array with a bump allocator; addresses are bytes."""

    def __init__(self, cfg: HwConfig, size: int = 1 << 20):
        self.cfg = cfg
        self.dram = np.zeros(size, np.uint8)
        self.top = 0

    def alloc(self, nbytes: int, align: int = 256) -> int:
        self.top = -(-self.top // align) * align
        addr = self.top
        self.top += nbytes
        assert self.top <= self.dram.size
        return addr

    def put(self, data: np.ndarray, align: int = 256) -> int:
        raw = np.ascontiguousarray(data).view(np.uint8).ravel()
        addr = self.alloc(raw.size, align)
        self.dram[addr: addr + raw.size] = raw
        return addr

    def put_insns(self, insns: list) -> tuple[int, int]:
        raw = np.frombuffer(isa.encode_stream(insns, self.cfg), np.uint8)
        return self.put(raw, 16), len(insns)


def load(mt: MemType, sram: int, dram_elem: int, y: int, x: int, stride: int | None = None,
         pads: tuple[int, int, int, int] = (0, 0, 0, 0), **flags) -> MemInsn:
    return MemInsn(opcode=Opcode.LOAD, memory_type=mt, sram_base=sram, dram_base=dram_elem,
                   y_size=y, x_size=x, x_stride=x if stride is None else stride,
                   y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3], **flags)


def store(sram: int, dram_elem: int, y: int, x: int, stride: int | None = None,
          **flags) -> MemInsn:
    return MemInsn(opcode=Opcode.STORE, memory_type=MemType.OUT, sram_base=sram,
                   dram_base=dram_elem, y_size=y, x_size=x,
                   x_stride=x if stride is None else stride, **flags)


__all__ = ["Image", "load", "store", "AluInsn", "GemmInsn", "FinishInsn", "MemInsn"]
