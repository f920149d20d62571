"""One simulator process (Verilator or Icarus with cocotb) serving many runs.

The host keeps the authoritative copy of the DRAM. Before a run it sends the bytes that
changed since the last run as a sparse ``$readmemh`` file; after the run the bench's write log
(every written beat with its strobes) is replayed onto the host copy. Starting the process
costs about a second; the SRAMs keep their contents from one run to the next, as on a board.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from vtakit.vta_hw.faults import Fault, describe_fault

from .build import TOPLEVEL, RtlBuild
from .tb import ERRORS

#: How long after a run's ``timeout_s`` the host waits for the bench (which stops the run
#: itself, within a chunk of cycles) before it kills the simulator.
TIMEOUT_GRACE_S = 30.0

__all__ = ["SimulatorProcess", "RtlSimulation", "RtlRun", "RtlProtocolError", "RtlCycleLimit",
           "RtlFault", "RtlTimeout"]


class RtlProtocolError(RuntimeError):
    """The core violated the memory protocol (the DRAM model's check)."""


class RtlCycleLimit(RuntimeError):
    """The core did not raise ``done`` within the cycle limit."""


class RtlTimeout(TimeoutError):
    """The run took longer than its wall-clock ``timeout_s``; the bench stopped it and reset
    the core (the simulator process and the buffers' contents survive)."""


class RtlFault(RuntimeError):
    """The core reported a fault (its ``fault`` port, :class:`vtakit.vta_hw.faults.Fault`).

    Attributes
    ----------
    fault : vtakit.vta_hw.faults.Fault
    cycles : int
        The core's ``cycles`` when ``done`` rose (FINISH's finish cycle, or the cycle the
        deadlock was detected).
    """

    def __init__(self, message: str, fault: int, cycles: int):
        super().__init__(message)
        self.fault = Fault(fault)
        self.cycles = cycles


@dataclass(frozen=True)
class RtlRun:
    """What one run reports.

    Attributes
    ----------
    cycles : int
        The core's ``cycles`` register when ``done`` rose.
    tb_cycles : int
        The bench's own count of cycles from ``start`` to ``done`` (cycle 0 is the one after
        ``start``): equal to ``cycles`` for a core that counts per docs/timing.md.
    write_beats : int
        Bus beats the core wrote.
    wall_s : float
        Wall-clock seconds of the run, loading and write-back included.
    """

    cycles: int
    tb_cycles: int
    write_beats: int
    wall_s: float


class SimulatorProcess:
    """A simulator in a process of its own that answers requests over a socket: the start-up
    handshake, a request and its answer, the console output and the shutdown, which the core's
    bench (:class:`RtlSimulation`) and the SoC's (``boards.soc_sim.SocSimulation``) share.
    A subclass sets ``workdir`` (a temporary folder this object removes) and ``what`` (the
    simulator's name in messages), then calls :meth:`_start`."""

    what = "the simulator"
    workdir: Path
    proc: subprocess.Popen
    conn: Connection

    def _start(self, cmd: list[str], env: dict[str, str], sock_path: str,
               start_timeout_s: float) -> None:
        """Run `cmd` in ``workdir`` with its console output in ``sim.out`` and wait until it
        connects to the Unix socket `sock_path` (whose path it finds in `env`)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(sock_path)
        listener.listen(1)
        listener.settimeout(0.2)
        self._out = open(self.workdir / "sim.out", "w+")
        self.proc = subprocess.Popen(cmd, cwd=self.workdir, env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + start_timeout_s
        try:
            while True:
                try:
                    sock, _ = listener.accept()
                    break
                except TimeoutError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.kill()
                        raise RuntimeError(f"{self.what} did not start within "
                                           f"{start_timeout_s:g} s:\n{self.output()}") from None
        finally:
            listener.close()
        sock.setblocking(True)
        self.conn = Connection(sock.detach())

    def output(self) -> str:
        """The simulator's console output so far (the last 4000 characters)."""
        self._out.flush()
        self._out.seek(0)
        return self._out.read()[-4000:]

    def _expect(self, timeout_s: float | None, *kinds: str) -> tuple:
        if timeout_s is not None and not self.conn.poll(timeout_s):
            self.kill()
            raise TimeoutError(f"{self.what} did not answer within {timeout_s:g} s "
                               f"(killed it):\n{self.output()}")
        try:
            reply = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"{self.what} exited:\n{self.output()}") from None
        if reply[0] not in kinds:
            raise RuntimeError(f"{self.what} answered {reply!r}; expected "
                               f"{' or '.join(kinds)}")
        return reply

    def _request(self, msg: tuple, timeout_s: float | None, *kinds: str) -> tuple:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.what} has exited ({self.proc.returncode}):\n"
                               f"{self.output()}")
        self.conn.send(msg)
        return self._expect(timeout_s, *kinds)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Stop the simulator (letting it finish its files, a waveform say) and remove its
        folder (idempotent)."""
        if self.proc.poll() is None:
            try:
                self.conn.send(("quit",))
                if self.conn.poll(30):
                    self.conn.recv()
                self.proc.wait(30)
            except (OSError, EOFError, subprocess.TimeoutExpired):
                self.kill()
        if hasattr(self, "conn"):
            self.conn.close()
        self._out.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> SimulatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RtlSimulation(SimulatorProcess):
    """A running simulator of one :class:`RtlBuild`.

    Parameters
    ----------
    build : RtlBuild
    waves : str | os.PathLike | None
        Write a waveform of the whole session to this path (Verilator only); needs a build
        with ``waves`` set. The file is complete after :meth:`close`.
    dram_bytes : int | None
        The DRAM size the core may use (at most, and by default, ``build.dram_bytes``).
    start_timeout_s : float
        How long the simulator may take to start.
    """

    def __init__(self, build: RtlBuild, *, waves: str | os.PathLike | None = None,
                 dram_bytes: int | None = None, start_timeout_s: float = 120.0):
        self.dram_bytes = build.dram_bytes if dram_bytes is None else dram_bytes
        if not 0 < self.dram_bytes <= build.dram_bytes:
            raise ValueError(f"dram_bytes={self.dram_bytes}: the build holds at most "
                             f"{build.dram_bytes} bytes")
        if waves is not None and not build.waves:
            raise ValueError("waves= needs a simulator built with waves='fst' or 'vcd'")
        self.build = build
        self.wb = build.cfg.bus_bytes
        self.workdir = Path(tempfile.mkdtemp(prefix="vtakit-rtl-"))
        self.load_path = self.workdir / "dram.hex"
        self.log_path = self.workdir / "dram.log"
        sock_path = str(self.workdir / "sock")
        env = _cocotb_env()
        env["VTAKIT_RTL_SOCKET"] = sock_path
        env["VTAKIT_RTL_DRAM_BYTES"] = str(self.dram_bytes)
        waves_path = None
        if waves is not None:
            waves_path = str(Path(waves).resolve())
        cmd = build.command([f"+DRAM_LOAD={self.load_path}", f"+DRAM_LOG={self.log_path}"],
                            waves_path)
        self.what = f"the {build.simulator} simulator"
        self._start(cmd, env, sock_path, start_timeout_s)
        self._expect(start_timeout_s, "ready")

    def load(self, dram: np.ndarray, ranges: list[tuple[int, int]]) -> None:
        """Copy the byte ranges ``[lo, hi)`` of the host ``dram`` into the simulated DRAM."""
        wb = self.wb
        words = _merge([(lo // wb, -(-hi // wb)) for lo, hi in ranges if hi > lo])
        if not words:
            return
        parts = []
        for w0, w1 in words:
            raw = dram[w0 * wb:w1 * wb].reshape(-1, wb)[:, ::-1]
            hexed = np.frombuffer(raw.tobytes().hex().encode(), dtype=f"S{2 * wb}")
            parts.append(b"@%x\n" % w0 + b"\n".join(hexed) + b"\n")
        self.load_path.write_bytes(b"".join(parts))
        self._request(("load",), 600, "ok")

    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int, *,
            cycle_limit: int = 1 << 40, timeout_s: float | None = None) -> RtlRun:
        """Run a stream; the core's writes are applied to the host ``dram``.

        After a failed run (:class:`RtlProtocolError`, :class:`RtlCycleLimit`,
        :class:`RtlTimeout`, :class:`RtlFault`) the core is reset, so the next run starts
        clean; the buffers keep their contents. The bench itself stops a run at ``timeout_s``;
        only if it does not answer ``TIMEOUT_GRACE_S`` later is the simulator killed."""
        t0 = time.perf_counter()
        reply = self._request(("run", insn_addr, insn_count, cycle_limit, timeout_s),
                              None if timeout_s is None else timeout_s + TIMEOUT_GRACE_S,
                              "done", "error", "limit", "timeout")
        self._replay_writes(dram)
        if reply[0] == "error":
            code, cycle, addr, beats, is_write = reply[1:]
            self._request(("reset",), 60, "ok")
            raise RtlProtocolError(
                f"DRAM protocol violation at cycle {cycle}: {ERRORS.get(code, code)} "
                f"({'write' if is_write else 'read'} burst addr={addr:#x} beats={beats}; "
                f"DRAM {self.dram_bytes:#x} bytes, W={self.wb} bytes, "
                f"M={self.build.cfg.mem_max_burst_beats} beats)")
        if reply[0] == "limit":
            self._request(("reset",), 60, "ok")
            raise RtlCycleLimit(f"the core did not finish within {cycle_limit} cycles "
                                f"(stopped at cycle {reply[1]})")
        if reply[0] == "timeout":
            self._request(("reset",), 60, "ok")
            raise RtlTimeout(f"the run took longer than {timeout_s} s (stopped at cycle "
                             f"{reply[1]}; the core was reset, its buffers kept)")
        _, cycles, tb_cycles, beats, fault = reply
        if fault:
            self._request(("reset",), 60, "ok")
            raise RtlFault(describe_fault(fault, cycles), fault, cycles)
        return RtlRun(cycles, tb_cycles, beats, time.perf_counter() - t0)

    def _replay_writes(self, dram: np.ndarray) -> None:
        if not self.log_path.exists():
            return
        wb = self.wb
        for line in self.log_path.read_text().split("\n"):
            if not line:
                continue
            word, data, strb = line.split()
            if "x" in data or "x" in strb:
                raise RtlProtocolError(f"write beat with undefined bits: {line}")
            addr = int(word, 16) * wb
            raw = np.frombuffer(int(data, 16).to_bytes(wb, "little"), np.uint8)
            mask = np.unpackbits(np.array([int(strb, 16)], ">u8").view(np.uint8),
                                 bitorder="big")[::-1][:wb].astype(bool)
            dram[addr:addr + wb][mask] = raw[mask]

    def identify(self) -> tuple[int, int]:
        """(hw_ver, hw_id) as the core reports them."""
        _, ver, ident = self._request(("id",), 60, "id")
        return ver, ident


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _cocotb_env() -> dict[str, str]:
    """The environment cocotb's runner would give a test run."""
    import find_libpython
    from cocotb_tools import config

    env = dict(os.environ)
    libpython = env.get("LIBPYTHON_LOC") or find_libpython.find_libpython()
    if libpython is None:
        raise RuntimeError("cannot find libpython, which cocotb needs to embed Python")
    env["PATH"] = env.get("PATH", "") + os.pathsep + str(config.libs_dir)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env["PYGPI_PYTHON_BIN"] = sys.executable
    env.setdefault("GPI_USERS", f"{libpython};{config.pygpi_entry_point()}")
    env["COCOTB_TOPLEVEL"] = TOPLEVEL
    env["COCOTB_TEST_MODULES"] = "vtakit.vta_hw.sim.server"
    env["TOPLEVEL_LANG"] = "verilog"
    env.setdefault("COCOTB_LOG_LEVEL", "WARNING")
    env["COCOTB_RESULTS_FILE"] = "results.xml"
    return env
