"""The ``fpga`` device: a board running the core behind the UART host bridge
(:mod:`vtakit.boards.bridge`), spoken to through :mod:`vtakit.vta_hw.bridge_protocol`.

The host keeps a shadow of the board's memory (``dram``) and moves only what it must over the
slow serial line: ranges the host wrote go to the board before a run (whole 32-bit words;
a partly written word whose other bytes the host does not know is read first), and ranges the
board owns (all of memory when the device opens, the footprint of every STORE of a run after
it) are read from the board when the host reads them, and only then. A run writes INSN_ADDR,
INSN_COUNT and CTRL START; :meth:`FpgaDevice.wait` polls CTRL until DONE and reads CYCLES (and
FAULT, then resets the core, after a fault), as docs/hardware.md ("Register map") describes.

``FpgaDevice(cfg, "/dev/ttyUSB1")`` opens a serial port through pyserial's
``serial_for_url``, so ``socket://host:port``, ``rfc2217://...``, ``loop://`` and pty paths
work too; any object with ``read``, ``write`` and ``timeout`` (a ``serial.Serial``) does as
well. The runtime's ``device="fpga:/dev/ttyUSB1"`` (``fpga:PORT@BAUD`` for another rate) opens
one through :meth:`FpgaDevice.from_spec`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from vtakit.driver.device import DeviceInfo, HostMemoryDevice, RunResult
from vtakit.driver.errors import DeadlockError, DeviceError
from vtakit.driver.stream_check import StreamChecker
from vtakit.vta_hw import isa
from vtakit.vta_hw.bridge_protocol import BridgeLink, IdError, PortError, SerialLike
from vtakit.vta_hw.config import PRESETS, HwConfig
from vtakit.vta_hw.faults import Fault, describe_fault
from vtakit.vta_hw.regmap import CTRL_DONE, CTRL_FAULT, CTRL_RESET, CTRL_START, CsrAddr

__all__ = ["FpgaDevice", "FpgaStats", "DEFAULT_BAUD", "MAX_MEM_BYTES"]

#: The boards' line rate (``vtakit.boards.boards.Board.baud``).
DEFAULT_BAUD = 1_000_000

#: The most board memory the device shadows on the host (256 MiB; the boards here have at
#: most 192 KiB, and reading 256 MiB through a 1 Mbaud line takes 45 minutes). A board that
#: reports more is refused unless ``mem_bytes`` says how much of it to use.
MAX_MEM_BYTES = 1 << 28

CTRL, CYCLES, INSN_COUNT, INSN_ADDR, FAULT = (CsrAddr.CTRL, CsrAddr.CYCLES, CsrAddr.INSN_COUNT,
                                              CsrAddr.INSN_ADDR, CsrAddr.FAULT)


class FpgaStats(dict):
    """Statistics of one run on a board: ``cycles``, ``wall_s`` (from START to DONE seen),
    ``polls`` (CTRL reads), ``frames`` (requests sent during :meth:`FpgaDevice.run` and
    :meth:`FpgaDevice.wait`, retries included), ``retries``, ``bytes_written`` (memory sent
    before the run)."""

    @property
    def cycles(self) -> int:
        return self["cycles"]


def _config_label(config_hash: str) -> str:
    names = [name for name, c in PRESETS.items() if c.hash == config_hash]
    return f"preset {names[0]!r}" if names else "not a preset"


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of every run of True in a bool array."""
    edges = np.flatnonzero(np.diff(np.concatenate(([False], mask, [False])).astype(np.int8)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def _open_port(port: str | os.PathLike, baud: int, timeout_s: float) -> Any:
    try:
        import serial
    except ImportError:
        raise ImportError("the fpga device needs pyserial: pip install 'vtakit[fpga]'") from None
    try:
        # write_timeout: a stalled write (flow control, a socket nobody reads) is a
        # SerialTimeoutException, which the link reports, not a hang
        return serial.serial_for_url(os.fspath(port), baudrate=baud, timeout=timeout_s,
                                     write_timeout=timeout_s)
    except (OSError, ValueError) as err:  # serial.SerialException is an OSError
        raise OSError(f"fpga device: cannot open port {os.fspath(port)!r} at {baud} baud: "
                      f"{err}") from err


class FpgaDevice(HostMemoryDevice):
    """Runs streams on a board through its UART host bridge.

    Parameters
    ----------
    cfg : HwConfig
        The configuration the driver builds streams for; the board's HW_ID must be its hash
        (``ValueError`` naming both configurations otherwise).
    port : str | os.PathLike | SerialLike
        A port name or URL for ``serial.serial_for_url`` (opened here, closed by
        :meth:`close`), or an open port-like object (left open).
    baud : int
        Line rate when opening ``port`` by name (the bitstream's rate).
    timeout_s : float
        Time of one attempt of a request: a request is tried at most ``1 + retries`` times
        (after a damaged request or response, or no response) and returns or raises within
        ``(1 + retries) * timeout_s`` in all, however the board or the line behaves (a
        monotonic deadline; a line that streams bytes forever does not extend it). A board
        that stopped answering raises :class:`~vtakit.vta_hw.bridge_protocol.NoResponse`, a
        ``TimeoutError``; a port that fails (pyserial's ``SerialException``, a closed or
        disconnected port, end of file) :class:`~vtakit.vta_hw.bridge_protocol.PortError`.
        Also the write timeout of a port opened here.
    retries : int
    mem_bytes : int | None
        Device memory the driver allocates from (default: all the board reports, which must
        then be at most :data:`MAX_MEM_BYTES`; at most what the board reports).
    poll_interval_s : float
        Pause between two reads of CTRL while a run is going on.

    Attributes
    ----------
    dram : np.ndarray
        The host's shadow of the board memory (uint8); current where the host wrote or read
        since the last run touched it.
    link : BridgeLink
    board : vtakit.vta_hw.bridge_protocol.BoardId
        The board's ID at open (protocol version, max_payload, mem_words, HW_VER, HW_ID).
    last_stats : FpgaStats | None
    keeps_sram : bool
        Always ``True``: the board keeps its on-chip buffers between runs.
    stream_check : StreamChecker
        The host-side SRAM range check of every stream (the core wraps SRAM indices around;
        the simulator refuses them), with what the host knows of the board's UOP SRAM.
    """

    keeps_sram = True

    def __init__(self, cfg: HwConfig, port: str | os.PathLike | SerialLike, *,
                 baud: int = DEFAULT_BAUD, timeout_s: float = 1.0, retries: int = 2,
                 mem_bytes: int | None = None, poll_interval_s: float = 0.001):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"FpgaDevice: cfg must be an HwConfig, got {type(cfg).__name__}")
        cfg = cfg.validate()
        self._own_port = isinstance(port, (str, os.PathLike))
        name = os.fspath(port) if isinstance(port, (str, os.PathLike)) else None
        self._port: Any = _open_port(port, baud, timeout_s) if isinstance(
            port, (str, os.PathLike)) else port
        try:
            self.link = BridgeLink(self._port, timeout_s=timeout_s, retries=retries, name=name)
            self.board = self.link.ident()  # its fields in the protocol's ranges
            self._check_board(cfg)
            mem_bytes = self._memory_size(cfg, mem_bytes)  # before anything is allocated
            super().__init__(cfg, mem_bytes)
        except BaseException as err:
            try:
                self.close()
            except PortError as close_err:
                # the first error is the one to raise; the second goes with it (a note on
                # Python 3.11+, the chained context before)
                if hasattr(err, "add_note"):
                    err.add_note(f"closing the port failed as well: {close_err}")
                elif err.__context__ is None:
                    err.__context__ = close_err
            raise
        words = (mem_bytes + 3) // 4
        self._stale = np.ones(words, dtype=bool)   # the board's copy is newer
        self._dirty = np.zeros(words, dtype=bool)  # the host's copy is newer
        self.poll_interval_s = poll_interval_s
        self.stream_check = StreamChecker(self.cfg)
        self.last_stats: FpgaStats | None = None
        self._pending: dict[str, Any] | None = None

    @classmethod
    def from_spec(cls, cfg: HwConfig, spec: str, **kwargs: Any) -> FpgaDevice:
        """``PORT`` or ``PORT@BAUD`` (``/dev/ttyUSB1@1000000``): the device on that port."""
        port, at, rate = spec.rpartition("@")
        if not at or not rate.isdigit():
            port, rate = spec, ""
        if not port:
            raise ValueError(f"fpga device spec {spec!r}: expected PORT or PORT@BAUD, e.g. "
                             f"'/dev/ttyUSB1' or 'socket://localhost:7777@115200'")
        return cls(cfg, port, **({"baud": int(rate)} if rate else {}), **kwargs)

    def _memory_size(self, cfg: HwConfig, mem_bytes: int | None) -> int:
        """The shadow's size: ``mem_bytes`` or the board's memory, checked against the
        configuration (whole bus words) and :data:`MAX_MEM_BYTES`."""
        words = self.board.mem_words
        size = 4 * words
        bus_words = max(cfg.bus_bytes // 4, 1)
        if words % bus_words:
            raise IdError(f"the board on {self.link.name} reports mem_words={words} (ID word "
                          f"2); expected a multiple of {bus_words}: the configuration's memory "
                          f"is whole {cfg.bus_bytes}-byte bus words")
        if mem_bytes is None:
            if size > MAX_MEM_BYTES:
                raise IdError(f"the board on {self.link.name} reports mem_words={words} "
                              f"({size} bytes); expected at most {MAX_MEM_BYTES // 4} words "
                              f"({MAX_MEM_BYTES} bytes, the most the fpga device shadows): "
                              f"pass mem_bytes= to use part of it")
            return size
        limit = min(size, MAX_MEM_BYTES)
        if isinstance(mem_bytes, bool) or not isinstance(mem_bytes, int) \
                or not 0 < mem_bytes <= limit:
            raise ValueError(f"FpgaDevice: mem_bytes={mem_bytes!r}; the board on "
                             f"{self.link.name} has {size} bytes (expected 1..{limit})")
        return mem_bytes

    def _check_board(self, cfg: HwConfig) -> None:
        b = self.board
        board_hash = f"{b.hw_id:08x}"
        if board_hash != cfg.hash or b.hw_ver_tuple != isa.HW_VER:
            ver = ".".join(map(str, isa.HW_VER))
            raise ValueError(
                f"the board on {self.link.name} was built for configuration {board_hash} "
                f"({_config_label(board_hash)}), ISA {'.'.join(map(str, b.hw_ver_tuple))}; "
                f"the driver was given configuration {cfg.hash} ({_config_label(cfg.hash)}, "
                f"{cfg.bitstream_name}), ISA {ver}: program the board with a bitstream of "
                f"configuration {cfg.hash} or create the device with the board's configuration")

    # ---- memory ---------------------------------------------------------------------------
    def _fetch(self, wlo: int, whi: int) -> None:
        """Read the stale words of ``[wlo, whi)`` from the board into the shadow."""
        for lo, hi in _runs(self._stale[wlo:whi]):
            lo, hi = lo + wlo, hi + wlo
            end = min(4 * hi, self.dram.size)
            data = self.link.read_mem(4 * lo, 4 * (hi - lo))
            self.dram[4 * lo:end] = np.frombuffer(data, np.uint8)[:end - 4 * lo]
            self._stale[lo:hi] = False

    def _written(self, start: int, end: int) -> None:
        self._dirty[start // 4:(end + 3) // 4] = True
        self._stale[start // 4:(end + 3) // 4] = False

    def write(self, addr: int, data: bytes | np.ndarray) -> None:
        nbytes = len(data) if isinstance(data, (bytes, bytearray)) else \
            np.asarray(data).nbytes
        self._check_range("write", addr, nbytes)
        if nbytes:
            # a word the host writes only in part: its other bytes come from the board first
            end = addr + nbytes
            if addr % 4 and self._stale[addr // 4]:
                self._fetch(addr // 4, addr // 4 + 1)
            if end % 4 and self._stale[end // 4]:
                self._fetch(end // 4, end // 4 + 1)
        super().write(addr, data)

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        self._check_range("read", addr, nbytes)
        self._fetch(addr // 4, (addr + nbytes + 3) // 4)
        return super().read(addr, nbytes)

    def _flush(self) -> int:
        """Send every range the host wrote; the bytes sent."""
        sent = 0
        for lo, hi in _runs(self._dirty):
            data = self.dram[4 * lo:min(4 * hi, self.dram.size)].tobytes()
            self.link.write_mem(4 * lo, data.ljust(4 * (hi - lo), b"\0"))  # dram's last word
            self._dirty[lo:hi] = False
            sent += 4 * (hi - lo)
        return sent

    def _store_footprint(self, insn_addr: int, insn_count: int) -> list[tuple[int, int]]:
        """Word ranges the STOREs of the stream may write."""
        d = isa.decode_stream(self.dram[insn_addr:insn_addr + insn_count * isa.INSN_BYTES],
                              self.cfg)
        stores = np.flatnonzero((d.opcode == isa.Opcode.STORE) & (d["x_size"] > 0)
                                & (d["y_size"] > 0))
        if stores.size == 0:
            return []
        nwords = self._stale.size
        try:
            elem = np.array([self.cfg.elem_bytes(int(t)) for t in d["memory_type"][stores]])
        except (ValueError, KeyError, IndexError):
            return [(0, nwords)]  # a STORE of no known memory type: the core faults anyway
        ys = d["y_size"][stores]
        rows = np.repeat(np.arange(stores.size), ys)
        y = np.arange(rows.size) - np.repeat(np.cumsum(ys) - ys, ys)
        start = (d["dram_base"][stores][rows] + y * d["x_stride"][stores][rows]) * elem[rows]
        end = start + d["x_size"][stores][rows] * elem[rows]
        lo = np.clip(start // 4, 0, nwords)
        hi = np.clip((end + 3) // 4, 0, nwords)
        base, top = int(lo.min()), int(hi.max())
        if top <= base:
            return []
        cover = np.zeros(top - base + 1, np.int64)
        np.add.at(cover, lo - base, 1)
        np.add.at(cover, hi - base, -1)
        return [(a + base, b + base) for a, b in _runs(np.cumsum(cover)[:-1] > 0)]

    # ---- runs -----------------------------------------------------------------------------
    def _read_for_check(self, addr: int, nbytes: int) -> np.ndarray | None:
        """Device memory for the range check (micro-ops a LOAD UOP reads), current."""
        if addr < 0 or nbytes < 0 or addr + nbytes > self.dram.size:
            return None
        self._fetch(addr // 4, (addr + nbytes + 3) // 4)
        return self.dram[addr:addr + nbytes]

    def run(self, insn_addr: int, insn_count: int) -> None:
        """Send what the host wrote, then start the stream (INSN_ADDR, INSN_COUNT, CTRL
        START). A stream whose SRAM indices leave their buffer is refused first, with the
        ``sim`` device's ``DeviceError`` for it (:mod:`vtakit.driver.stream_check`): the core
        would wrap the index around silently."""
        if self._pending is not None:
            raise RuntimeError(f"the fpga device on {self.link.name} is already running a "
                               f"stream; wait() for it first")
        if insn_addr % isa.INSN_BYTES or insn_count < 1:
            raise ValueError(f"insn_addr={insn_addr:#x}, insn_count={insn_count}: expected a "
                             f"{isa.INSN_BYTES}-byte aligned address and at least 1 instruction")
        self._check_range("instruction fetch", insn_addr, insn_count * isa.INSN_BYTES)
        frames = self.link.attempts
        failures = self.link.failures
        self._fetch(insn_addr // 4, (insn_addr + insn_count * isa.INSN_BYTES) // 4)
        stream = self.dram[insn_addr:insn_addr + insn_count * isa.INSN_BYTES]
        self.stream_check.check(stream, self._read_for_check)
        footprint = self._store_footprint(insn_addr, insn_count)
        try:
            sent = self._flush()
            self.link.write_csr(INSN_ADDR, insn_addr)
            self.link.write_csr(INSN_COUNT, insn_count)
            self.link.write_csr(CTRL, CTRL_START)
        except BaseException:  # the link failed; the run may have started all the same
            self._settle({"footprint": footprint})
            self.stream_check.settle(False)
            raise
        self._pending = {"insn_addr": insn_addr, "insn_count": insn_count,
                         "footprint": footprint, "started": time.monotonic(),
                         "frames": frames, "failures": failures, "sent": sent}

    def _settle(self, pending: dict[str, Any]) -> None:
        """The run is over (or abandoned): what its STOREs wrote now lives on the board."""
        for lo, hi in pending["footprint"]:
            self._stale[lo:hi] = True
            # the host wrote there after run(): the run's STORE wins, as on the sim device,
            # which runs the stream in wait()
            self._dirty[lo:hi] = False

    def wait(self, timeout_s: float) -> RunResult:
        """Poll CTRL until DONE (wall-clock ``timeout_s``), then read CYCLES.

        A fault (CTRL bit 2) reads FAULT, resets the core (CTRL RESET) and raises
        ``DeadlockError`` or ``DeviceError``, as the ``rtl`` device does for the same fault
        register; a run still going after ``timeout_s`` resets the core and raises
        ``TimeoutError``. The board keeps its buffers across the reset. A board that stops
        answering raises :class:`~vtakit.vta_hw.bridge_protocol.NoResponse` (a ``TimeoutError``) and
        damaged frames past the retries a :class:`~vtakit.vta_hw.bridge_protocol.ProtocolError`."""
        if self._pending is None:
            raise RuntimeError("wait() without a run(): nothing is running on the fpga device")
        pending, self._pending = self._pending, None
        deadline = pending["started"] + timeout_s
        polls = 0
        completed = False
        try:
            while True:
                ctrl = self.link.read_csr(CTRL)
                polls += 1
                if ctrl & CTRL_DONE:
                    break
                if time.monotonic() >= deadline:
                    cycles = self.link.read_csr(CYCLES)
                    self.link.write_csr(CTRL, CTRL_RESET)
                    raise TimeoutError(
                        f"fpga device on {self.link.name}: the run of "
                        f"{pending['insn_count']} instructions at {pending['insn_addr']:#x} did "
                        f"not finish within {timeout_s:g} s (CTRL={ctrl:#x}, CYCLES={cycles}); "
                        f"the core was reset")
                if self.poll_interval_s > 0:
                    time.sleep(self.poll_interval_s)
            wall_s = time.monotonic() - pending["started"]
            cycles = self.link.read_csr(CYCLES)
            if ctrl & CTRL_FAULT:
                fault = self.link.read_csr(FAULT)
                self.link.write_csr(CTRL, CTRL_RESET)
                kind = DeadlockError if fault & Fault.DEADLOCK else DeviceError
                raise kind(f"fpga: {describe_fault(fault, cycles)}")
            completed = True
        finally:
            self._settle(pending)
            self.stream_check.settle(completed)
        self.last_stats = FpgaStats(cycles=cycles, wall_s=wall_s, polls=polls,
                                    frames=self.link.attempts - pending["frames"],
                                    retries=self.link.failures - pending["failures"],
                                    bytes_written=pending["sent"])
        return RunResult(cycles=cycles, stats=self.last_stats)

    def identify(self) -> DeviceInfo:
        """Reads the board's ID again (it may have been reprogrammed since the device opened)."""
        b = self.link.ident()
        return DeviceInfo(name="fpga", hw_ver=b.hw_ver_tuple, config_hash=f"{b.hw_id:08x}")

    # ---- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close the port if the device opened it (idempotent); a
        :class:`~vtakit.vta_hw.bridge_protocol.PortError` if closing fails."""
        port, self._port = getattr(self, "_port", None), None
        if port is not None and getattr(self, "_own_port", False):
            try:
                port.close()
            except (OSError, ValueError) as err:
                raise PortError(f"fpga device: closing the port {getattr(port, 'name', port)} "
                                f"failed: {type(err).__name__}: {err}") from err

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing left to report to
            pass
