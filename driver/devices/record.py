"""The ``record`` device: device-memory addresses without memory, for recording relocatable
programs ahead of time (the compiler's accelerator backend records its streams on one; the
runtime links them to a real device's buffers later)."""

from __future__ import annotations

import numpy as np

from vtakit.driver.device import Device, DeviceInfo, RunResult
from vtakit.driver.memory import Allocator
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig

__all__ = ["RecordDevice"]


class RecordDevice(Device):
    """Allocates addresses (so a `Session` can name buffers) but holds no data and runs
    nothing: use it with ``Session.record()``."""

    def __init__(self, cfg: HwConfig, address_space: int = 1 << 32):
        super().__init__(cfg)
        self.allocator = Allocator(address_space)

    def allocate(self, nbytes: int, align: int) -> int:
        return self.allocator.alloc(nbytes, align)

    def free(self, addr: int) -> None:
        self.allocator.free(addr)

    def _refuse(self, what: str) -> None:
        raise RuntimeError(f"the record device has no memory and runs nothing ({what}); record "
                           f"programs with Session.record() and run them on sim, rtl or fpga")

    def write(self, addr: int, data: bytes | np.ndarray) -> None:
        self._refuse("write")

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        self._refuse("read")
        raise AssertionError  # unreachable

    def run(self, insn_addr: int, insn_count: int) -> None:
        self._refuse("run")

    def wait(self, timeout_s: float) -> RunResult:
        self._refuse("wait")
        raise AssertionError  # unreachable

    def identify(self) -> DeviceInfo:
        return DeviceInfo(name="record", hw_ver=isa.HW_VER, config_hash=self.cfg.hash)
