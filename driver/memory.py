"""Device-memory allocation: a first-fit allocator over one physical address range."""

from __future__ import annotations

import bisect

__all__ = ["Allocator", "OutOfDeviceMemory"]


class OutOfDeviceMemory(MemoryError):
    """No free block is large enough."""


class Allocator:
    """First-fit allocator of ``[base, base + size_bytes)`` with power-of-two alignment.

    Parameters
    ----------
    size_bytes : int
        Bytes of device memory managed.
    base : int
        Physical address of the first byte. Address 0 is never handed out, so that 0 can mean
        "no buffer".
    """

    def __init__(self, size_bytes: int, base: int = 0):
        if size_bytes <= 0:
            raise ValueError(f"device memory size must be positive, got {size_bytes}")
        self.base = base
        self.size_bytes = size_bytes
        self._free: list[tuple[int, int]] = [(max(base, 1), base + size_bytes)]  # [start, end)
        self._used: dict[int, int] = {}  # start -> end

    def alloc(self, nbytes: int, align: int = 64) -> int:
        if nbytes <= 0:
            raise ValueError(f"allocation size must be positive, got {nbytes} bytes")
        if align <= 0 or align & (align - 1):
            raise ValueError(f"alignment must be a power of two, got {align}")
        for k, (start, end) in enumerate(self._free):
            addr = (start + align - 1) & ~(align - 1)
            if addr + nbytes <= end:
                pieces = [(s, e) for s, e in ((start, addr), (addr + nbytes, end)) if e > s]
                self._free[k:k + 1] = pieces
                self._used[addr] = addr + nbytes
                return addr
        raise OutOfDeviceMemory(
            f"cannot allocate {nbytes} bytes (alignment {align}) in device memory: "
            f"{self.free_bytes} of {self.size_bytes} bytes free, largest free block "
            f"{max((e - s for s, e in self._free), default=0)} bytes")

    def reserve(self, addr: int, nbytes: int) -> int:
        """Take the fixed range ``[addr, addr + nbytes)`` (which may start at 0) as one block,
        released by :meth:`free` (``addr``); ``ValueError`` naming the block in the way if any
        of it is allocated, or if it leaves the managed range."""
        end = addr + nbytes
        if nbytes <= 0 or addr < self.base or end > self.base + self.size_bytes:
            raise ValueError(f"cannot reserve {nbytes} bytes at {addr:#x}: expected a positive "
                             f"size inside [{self.base:#x}, {self.base + self.size_bytes:#x})")
        for start, stop in sorted(self._used.items()):
            if start < end and addr < stop:
                raise ValueError(f"cannot reserve [{addr:#x}, {end:#x}) of device memory: block "
                                 f"[{start:#x}, {stop:#x}) is allocated there (free it, or use a "
                                 f"device with that range free)")
        pieces: list[tuple[int, int]] = []
        for s, e in self._free:
            pieces += [(a, b) for a, b in ((s, min(e, addr)), (max(s, end), e)) if b > a]
        self._free = pieces
        self._used[addr] = end
        return addr

    def free(self, addr: int) -> None:
        end = self._used.pop(addr, None)
        if end is None:
            raise ValueError(f"free of address {addr:#x}, which is not an allocated block")
        addr = max(addr, self.base, 1)  # address 0 is never handed out, even after a reserve
        if addr >= end:
            return
        k = bisect.bisect(self._free, (addr, end))
        self._free.insert(k, (addr, end))
        merged: list[tuple[int, int]] = []
        for s, e in self._free:
            if merged and merged[-1][1] == s:
                merged[-1] = (merged[-1][0], e)
            else:
                merged.append((s, e))
        self._free = merged

    @property
    def free_bytes(self) -> int:
        return sum(e - s for s, e in self._free)

    def owner(self, addr: int) -> tuple[int, int] | None:
        """(start, end) of the allocated block containing ``addr``, or ``None``."""
        starts = sorted(self._used)
        k = bisect.bisect_right(starts, addr) - 1
        if k >= 0 and addr < self._used[starts[k]]:
            return starts[k], self._used[starts[k]]
        return None
