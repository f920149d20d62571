"""The ``pynq`` device: the core on a Zynq board (``vtakit hw export --board pynq-z1``, built by
Vivado), driven from the board's own Linux through the `pynq <https://pynq.readthedocs.io>`_
package: registers by MMIO, device memory as contiguous (CMA) buffers of the PS DDR.

* Registers: ``pynq.MMIO`` on the AXI4-Lite window (:data:`vtakit.vta_hw.regmap.CsrAddr`, plus
  ``AXI_STATUS``); the base comes from the overlay's ``ip_dict`` (the block design's ``vta``
  cell), or ``csr_base``.
* Memory: :meth:`PynqDevice.allocate` is one ``pynq.allocate`` buffer per block (a physically
  contiguous uint8 array; the core's DRAM addresses are its ``physical_address``);
  :meth:`~PynqDevice.write` / :meth:`~PynqDevice.read` copy into / out of the buffer that holds
  the range. The HP port does not snoop the CPU's caches, so before a run every buffer the host
  wrote is flushed, and after a run every buffer is invalidated before the host reads it.
* A run writes INSN_ADDR, INSN_COUNT and CTRL START; :meth:`~PynqDevice.wait` polls CTRL until
  DONE (and AXI_STATUS, which says when the memory broke the fixed-latency contract), then
  reads CYCLES; a fault reads FAULT and resets the core (CTRL RESET), as the ``fpga`` device
  does.

The ``pynq`` package exists only on the boards (``pip install pynq`` there); a test passes a
module-like object with ``allocate``, ``MMIO`` and ``Overlay`` (``pynq=``), or the MMIO object
itself (``mmio=``). The runtime's ``device="pynq"`` / ``"pynq:BITFILE"`` opens one through
:meth:`PynqDevice.from_spec`.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

import numpy as np

from vtakit.driver.device import Device, DeviceInfo, RunResult
from vtakit.driver.devices.fpga import _config_label
from vtakit.driver.errors import DeadlockError, DeviceError
from vtakit.driver.stream_check import StreamChecker
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.faults import Fault, describe_fault
from vtakit.vta_hw.regmap import (
    AXI_REG_BYTES,
    CTRL_DONE,
    CTRL_FAULT,
    CTRL_RESET,
    CTRL_START,
    AxiAddr,
    CsrAddr,
)

__all__ = ["PynqDevice", "PynqStats", "NEEDS_PYNQ", "VTA_CELL", "describe_axi_status"]

NEEDS_PYNQ = ("the pynq device runs on a Zynq board's Linux and needs the pynq package there "
              "(pip install pynq, or a PYNQ image)")
#: the block design's cell of the core (vtakit.boards.zynq.VTA_CELL): its ip_dict entry
VTA_CELL = "vta"

_AXI_CAUSES = ("LATE: a read beat was due and had not arrived (the memory answered later than "
               "mem_read_latency_cycles)", "OVERFLOW: a request or write-data queue overflowed",
               "RESP: the memory answered SLVERR/DECERR")


def describe_axi_status(status: int) -> str:
    """AXI_STATUS in words (:class:`~vtakit.vta_hw.regmap.AxiAddr`)."""
    return "; ".join(text for bit, text in enumerate(_AXI_CAUSES) if status >> bit & 1)


class PynqStats(dict):
    """Statistics of one run: ``cycles``, ``wall_s`` (START to DONE seen), ``polls`` (CTRL
    reads), ``flushed`` (buffers flushed before the run)."""

    @property
    def cycles(self) -> int:
        return self["cycles"]


def _import_pynq() -> Any:
    try:
        import pynq  # type: ignore[import-not-found]
    except ImportError:
        raise ImportError(NEEDS_PYNQ) from None
    return pynq


def _physical_address(buf: Any) -> int:
    addr = getattr(buf, "physical_address", None)
    if addr is None:  # pynq before 2.5
        addr = getattr(buf, "device_address", None)
    if addr is None:
        raise TypeError(f"pynq device: the allocator returned a {type(buf).__name__} without "
                        f"physical_address (expected a pynq buffer)")
    return int(addr)


class _Block:
    """One allocation: the pynq buffer, where the core sees it, the aligned range handed out."""

    def __init__(self, buf: Any, addr: int, nbytes: int):
        self.buf, self.base = buf, _physical_address(buf)
        self.addr, self.nbytes = addr, nbytes
        self.view = np.asarray(buf).reshape(-1).view(np.uint8)
        self.dirty = False   # the host wrote it since the last flush
        self.stale = False   # the core may have written it since the host last looked

    def contains(self, addr: int, nbytes: int) -> bool:
        return self.base <= addr and addr + nbytes <= self.base + self.view.size


class PynqDevice(Device):
    """Runs streams on a Zynq board's core through ``pynq``.

    Parameters
    ----------
    cfg : HwConfig
        The configuration the driver builds streams for; the core's HW_ID must be its hash
        (``ValueError`` naming both configurations otherwise).
    bitfile : str | None
        A bitstream written by the export's Vivado script (``vta_zynq.bit``, with its
        ``vta_zynq.hwh`` beside it): loaded with ``pynq.Overlay`` (``download``), which also
        gives the register base. ``None``: the PL is already programmed; pass ``csr_base``.
    csr_base : int | None
        Physical address of the register window (default: the overlay's ``vta`` cell).
    pynq : module | None
        The ``pynq`` module or an object with its ``allocate``, ``MMIO`` and ``Overlay``
        (default: ``import pynq``, with an error saying what to install).
    mmio : object | None
        A register window with ``read(offset)`` and ``write(offset, value)`` to use instead of
        ``pynq.MMIO(csr_base, ...)``.
    download : bool
        Load ``bitfile`` into the PL (``False``: only read its ``.hwh``).
    poll_interval_s : float
        Pause between two polls of CTRL while a run goes on.

    Attributes
    ----------
    mmio : object
    csr_base : int | None
    overlay : object | None
    last_stats : PynqStats | None
    keeps_sram : bool
        ``True``: the core keeps its buffers between runs (and across CTRL RESET).
    stream_check : StreamChecker
        The host-side SRAM range check of every stream (the core wraps indices around).
    """

    keeps_sram = True

    def __init__(self, cfg: HwConfig, bitfile: str | None = None, *,
                 csr_base: int | None = None, pynq: Any = None, mmio: Any = None,
                 download: bool = True, poll_interval_s: float = 0.0):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"PynqDevice: cfg must be an HwConfig, got {type(cfg).__name__}")
        super().__init__(cfg)
        self.overlay: Any = None
        self._pynq = pynq
        if mmio is None:
            self._pynq = pynq if pynq is not None else _import_pynq()
            if bitfile is not None:
                self.overlay = self._pynq.Overlay(bitfile, download=download)
                if csr_base is None:
                    csr_base = self._overlay_base(bitfile)
            if csr_base is None:
                raise ValueError("PynqDevice: no register base: pass the bitstream (bitfile=, "
                                 "its .hwh names the base) or csr_base= (the export's "
                                 "vta_zynq.json, registers.base)")
            mmio = self._pynq.MMIO(csr_base, AXI_REG_BYTES)
        self.mmio = mmio
        self.csr_base = csr_base
        self.where = bitfile or (f"registers at {csr_base:#x}" if csr_base is not None
                                 else "the given MMIO")
        self.poll_interval_s = poll_interval_s
        self.stream_check = StreamChecker(self.cfg)
        self.last_stats: PynqStats | None = None
        self._blocks: list[_Block] = []   # sorted by base
        self._bases: list[int] = []
        self._pending: dict[str, Any] | None = None
        self._closed = False
        self._check_board()

    @classmethod
    def from_spec(cls, cfg: HwConfig, spec: str, **kwargs: Any) -> PynqDevice:
        """``""`` (the PL is programmed; base ``csr_base=``) or ``BITFILE``: the runtime's
        ``device="pynq"`` / ``"pynq:vta_zynq.bit"``."""
        return cls(cfg, spec or None, **kwargs)

    def _overlay_base(self, bitfile: str) -> int:
        ips = getattr(self.overlay, "ip_dict", {}) or {}
        for name, ip in ips.items():
            if name == VTA_CELL or name.endswith(f"/{VTA_CELL}"):
                return int(ip["phys_addr"])
        raise ValueError(f"PynqDevice: the overlay {bitfile} has no '{VTA_CELL}' cell (its "
                         f"AXI-Lite IPs: {', '.join(sorted(ips)) or 'none'}); expected a "
                         f"bitstream built from `vtakit hw export`, or pass csr_base=")

    # ---- registers ------------------------------------------------------------------------
    def _rd(self, addr: int) -> int:
        return int(self.mmio.read(int(addr))) & 0xFFFF_FFFF

    def _wr(self, addr: int, value: int) -> None:
        self.mmio.write(int(addr), int(value))

    def _check_board(self) -> None:
        ver, ident = self._rd(CsrAddr.HW_VER), self._rd(CsrAddr.HW_ID)
        hw_ver = ((ver >> 16) & 0xFF, (ver >> 8) & 0xFF, ver & 0xFF)
        board_hash = f"{ident:08x}"
        if board_hash != self.cfg.hash or hw_ver != isa.HW_VER:
            cfg = self.cfg
            raise ValueError(
                f"the core at {self.where} was built for configuration {board_hash} "
                f"({_config_label(board_hash)}), ISA {'.'.join(map(str, hw_ver))}; the driver "
                f"was given configuration {cfg.hash} ({_config_label(cfg.hash)}, "
                f"{cfg.bitstream_name}), ISA {'.'.join(map(str, isa.HW_VER))}: load a "
                f"bitstream exported for configuration {cfg.hash} (vtakit hw export --config) "
                f"or create the device with the core's configuration")

    def identify(self) -> DeviceInfo:
        ver, ident = self._rd(CsrAddr.HW_VER), self._rd(CsrAddr.HW_ID)
        return DeviceInfo(name="pynq", hw_ver=((ver >> 16) & 0xFF, (ver >> 8) & 0xFF,
                                               ver & 0xFF), config_hash=f"{ident:08x}")

    # ---- memory ---------------------------------------------------------------------------
    def allocate(self, nbytes: int, align: int) -> int:
        """A new contiguous buffer (``pynq.allocate``) of at least ``nbytes``; its first
        ``align``-aligned physical address."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 1:
            raise ValueError(f"pynq device: allocate({nbytes!r}): expected a positive size")
        if align < 1 or align & (align - 1):
            raise ValueError(f"pynq device: align={align} must be a power of two")
        if self._closed:
            raise RuntimeError(f"pynq device at {self.where} is closed")
        if self._pynq is None:
            raise RuntimeError("pynq device: no allocator (the device was given only an MMIO "
                               "object; pass pynq= for memory)")
        buf = self._pynq.allocate(shape=(int(nbytes) + align - 1,), dtype=np.uint8)
        base = _physical_address(buf)
        addr = -(-base // align) * align
        block = _Block(buf, addr, int(nbytes))
        k = bisect.bisect(self._bases, block.base)
        self._blocks.insert(k, block)
        self._bases.insert(k, block.base)
        return addr

    def free(self, addr: int) -> None:
        """Release a block (``pynq``'s ``freebuffer``); after :meth:`close`, which released
        them all, nothing."""
        if self._closed:
            return
        for k, b in enumerate(self._blocks):
            if b.addr == addr:
                del self._blocks[k], self._bases[k]
                closer = getattr(b.buf, "freebuffer", None) or getattr(b.buf, "close", None)
                if closer is not None:
                    closer()
                return
        raise ValueError(f"pynq device: free({addr:#x}): not an address allocate() returned")

    def _block(self, what: str, addr: int, nbytes: int) -> _Block:
        k = bisect.bisect(self._bases, addr) - 1
        if k >= 0 and self._blocks[k].contains(addr, nbytes):
            return self._blocks[k]
        raise ValueError(f"pynq device: {what} of {nbytes} bytes at {addr:#x} is not inside one "
                         f"buffer of this device (expected a range within a block that "
                         f"allocate() returned; {len(self._blocks)} blocks)")

    def write(self, addr: int, data: bytes | np.ndarray) -> None:
        src = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) \
            else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        b = self._block("write", addr, src.size)
        if b.stale:  # bytes the host does not overwrite must be the core's, not stale lines
            b.buf.invalidate()
            b.stale = False
        b.view[addr - b.base:addr - b.base + src.size] = src
        b.dirty = True

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        b = self._block("read", addr, nbytes)
        if b.stale:
            b.buf.invalidate()
            b.stale = False
        return b.view[addr - b.base:addr - b.base + nbytes].copy()

    def _read_for_check(self, addr: int, nbytes: int) -> np.ndarray | None:
        try:
            return self.read(addr, nbytes)
        except ValueError:
            return None  # outside the buffers: the core would read whatever is there

    # ---- runs -----------------------------------------------------------------------------
    def run(self, insn_addr: int, insn_count: int) -> None:
        """Flush what the host wrote, then start the stream (INSN_ADDR, INSN_COUNT, CTRL
        START). A stream whose SRAM indices leave their buffer is refused first with the ``sim``
        device's ``DeviceError`` (:mod:`vtakit.driver.stream_check`)."""
        if self._pending is not None:
            raise RuntimeError(f"the pynq device at {self.where} is already running a stream; "
                               f"wait() for it first")
        if insn_addr % isa.INSN_BYTES or insn_count < 1:
            raise ValueError(f"insn_addr={insn_addr:#x}, insn_count={insn_count}: expected a "
                             f"{isa.INSN_BYTES}-byte aligned address and at least 1 instruction")
        stream = self.read(insn_addr, insn_count * isa.INSN_BYTES)
        self.stream_check.check(stream, self._read_for_check)
        flushed = 0
        for b in self._blocks:
            if b.dirty:
                b.buf.flush()
                b.dirty = False
                flushed += 1
        self._wr(CsrAddr.INSN_ADDR, insn_addr)
        self._wr(CsrAddr.INSN_COUNT, insn_count)
        self._wr(CsrAddr.CTRL, CTRL_START)
        for b in self._blocks:  # the core may write any of them from now on
            b.stale = True
        self._pending = {"insn_addr": insn_addr, "insn_count": insn_count,
                         "started": time.monotonic(), "flushed": flushed}

    def wait(self, timeout_s: float) -> RunResult:
        """Poll CTRL (and AXI_STATUS) until DONE, then read CYCLES.

        ``DeadlockError`` / ``DeviceError`` for a fault of the core (FAULT, as the ``rtl`` and
        ``fpga`` devices word it) and ``DeviceError`` when AXI_STATUS is not 0 (the memory was
        slower than ``mem_read_latency_cycles`` or answered an error: the results are not
        valid); ``TimeoutError`` after ``timeout_s``. Each resets the core (CTRL RESET); the
        core keeps its buffers."""
        if self._pending is None:
            raise RuntimeError("wait() without a run(): nothing is running on the pynq device")
        pending, self._pending = self._pending, None
        deadline = pending["started"] + timeout_s
        polls = 0
        completed = False
        try:
            while True:
                ctrl = self._rd(CsrAddr.CTRL)
                status = self._rd(AxiAddr.AXI_STATUS)
                polls += 1
                if status:
                    cycles = self._rd(CsrAddr.CYCLES)
                    self._wr(CsrAddr.CTRL, CTRL_RESET)
                    raise DeviceError(
                        f"pynq: the AXI memory port reported AXI_STATUS={status:#x} at cycle "
                        f"{cycles} ({describe_axi_status(status)}); the run's results are not "
                        f"valid and the core was reset: raise mem_read_latency_cycles in the "
                        f"configuration (now {self.cfg.mem_read_latency_cycles}) or relieve "
                        f"the DDR")
                if ctrl & CTRL_DONE:
                    break
                if time.monotonic() >= deadline:
                    cycles = self._rd(CsrAddr.CYCLES)
                    self._wr(CsrAddr.CTRL, CTRL_RESET)
                    raise TimeoutError(
                        f"pynq device at {self.where}: the run of {pending['insn_count']} "
                        f"instructions at {pending['insn_addr']:#x} did not finish within "
                        f"{timeout_s:g} s (CTRL={ctrl:#x}, CYCLES={cycles}); the core was "
                        f"reset")
                if self.poll_interval_s > 0:
                    time.sleep(self.poll_interval_s)
            wall_s = time.monotonic() - pending["started"]
            cycles = self._rd(CsrAddr.CYCLES)
            if ctrl & CTRL_FAULT:
                fault = self._rd(CsrAddr.FAULT)
                self._wr(CsrAddr.CTRL, CTRL_RESET)
                kind = DeadlockError if fault & Fault.DEADLOCK else DeviceError
                raise kind(f"pynq: {describe_fault(fault, cycles)}")
            completed = True
        finally:
            self.stream_check.settle(completed)
        self.last_stats = PynqStats(cycles=cycles, wall_s=wall_s, polls=polls,
                                    flushed=pending["flushed"])
        return RunResult(cycles=cycles, stats=self.last_stats)

    def close(self) -> None:
        """Free every buffer this device allocated (idempotent; a session's later frees are
        no-ops)."""
        for b in list(getattr(self, "_blocks", [])):
            self.free(b.addr)
        self._closed = True
