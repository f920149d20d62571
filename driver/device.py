"""The one small interface every device implements: allocate, write, read, run, wait, identify."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from vtakit.driver.memory import Allocator
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig

__all__ = ["Device", "HostMemoryDevice", "DeviceInfo", "RunResult"]


@dataclass(frozen=True)
class DeviceInfo:
    """What a device says about itself (on hardware: the read-only ID register).

    Attributes
    ----------
    name : str
        ``"sim"``, ``"rtl"``, ``"fpga"``.
    hw_ver : tuple[int, int, int]
        ISA/hardware version.
    config_hash : str
        ``HwConfig.hash`` of the configuration the device was built for.
    """

    name: str
    hw_ver: tuple[int, int, int]
    config_hash: str


@dataclass(frozen=True)
class RunResult:
    """What one run reports: total cycles and the device's own statistics (if any)."""

    cycles: int
    stats: Any = None


_D = TypeVar("_D", bound="Device")


class Device(ABC):
    """An accelerator with its own DRAM.

    Parameters
    ----------
    cfg : HwConfig
        The configuration the device implements.
    """

    def __init__(self, cfg: HwConfig):
        self.cfg = cfg.validate()

    def close(self) -> None:  # noqa: B027 - an optional hook: most devices hold nothing
        """Release what the device holds (a simulator process, a serial port); nothing by
        default. A device is also a context manager that closes on exit."""

    def __enter__(self: _D) -> _D:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def allocate(self, nbytes: int, align: int) -> int:
        """Reserve ``nbytes`` of device memory; return its physical byte address."""

    @abstractmethod
    def free(self, addr: int) -> None:
        """Release a block returned by :meth:`allocate`."""

    def reserve(self, addr: int, nbytes: int) -> int:
        """Reserve the fixed range ``[addr, addr + nbytes)`` (replaying a memory image at its
        own addresses); release it with :meth:`free` (``addr``). ``ValueError`` if any of it is
        in use."""
        raise NotImplementedError(f"{type(self).__name__} cannot reserve fixed addresses")

    @abstractmethod
    def write(self, addr: int, data: bytes | np.ndarray) -> None:
        """Copy host bytes into device memory at ``addr``."""

    @abstractmethod
    def read(self, addr: int, nbytes: int) -> np.ndarray:
        """Copy ``nbytes`` of device memory at ``addr`` to a new uint8 array."""

    @abstractmethod
    def run(self, insn_addr: int, insn_count: int) -> None:
        """Start the accelerator on ``insn_count`` instructions at ``insn_addr``.

        A device whose core does not check SRAM indices (they would wrap around) refuses a
        stream with an index past a buffer's end here, before starting it, with the ``sim``
        device's :class:`~vtakit.driver.errors.DeviceError` for it
        (:class:`vtakit.driver.stream_check.StreamChecker`)."""

    @abstractmethod
    def wait(self, timeout_s: float) -> RunResult:
        """Wait for the run to finish (FINISH executed); raise ``TimeoutError`` after
        ``timeout_s`` seconds and :class:`~vtakit.driver.errors.DeviceError` (or a subclass) if
        the device reports a fault."""

    @abstractmethod
    def identify(self) -> DeviceInfo:
        """Version and configuration hash of the device."""

    def check_compatible(self) -> None:
        """Raise ``ValueError`` if the device was built for another configuration or ISA."""
        info = self.identify()
        if info.config_hash != self.cfg.hash or info.hw_ver != isa.HW_VER:
            raise ValueError(
                f"device {info.name} reports configuration {info.config_hash}, ISA "
                f"{'.'.join(map(str, info.hw_ver))}; the driver expects {self.cfg.hash}, "
                f"{'.'.join(map(str, isa.HW_VER))} ({self.cfg.bitstream_name})")


class HostMemoryDevice(Device):
    """A device whose DRAM is a numpy array in this process (the simulators).

    Parameters
    ----------
    cfg : HwConfig
    dram_bytes : int
        Size of the device memory.

    Attributes
    ----------
    dram : np.ndarray
        The device memory, uint8.
    allocator : Allocator
    """

    def __init__(self, cfg: HwConfig, dram_bytes: int):
        super().__init__(cfg)
        self.dram = np.zeros(dram_bytes, dtype=np.uint8)
        self.allocator = Allocator(dram_bytes)

    def allocate(self, nbytes: int, align: int) -> int:
        return self.allocator.alloc(nbytes, align)

    def free(self, addr: int) -> None:
        self.allocator.free(addr)

    def reserve(self, addr: int, nbytes: int) -> int:
        return self.allocator.reserve(addr, nbytes)

    def _check_range(self, what: str, addr: int, nbytes: int) -> None:
        if addr < 0 or nbytes < 0 or addr + nbytes > self.dram.size:
            raise ValueError(f"{what} of {nbytes} bytes at {addr:#x} is outside device memory "
                             f"[0, {self.dram.size:#x})")

    def _written(self, start: int, end: int) -> None:
        """Called after the host wrote ``[start, end)`` (a device that mirrors memory
        elsewhere records it)."""

    def write(self, addr: int, data: bytes | np.ndarray) -> None:
        buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) \
            else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        self._check_range("write", addr, buf.size)
        self.dram[addr:addr + buf.size] = buf
        self._written(addr, addr + buf.size)

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        self._check_range("read", addr, nbytes)
        return self.dram[addr:addr + nbytes].copy()
