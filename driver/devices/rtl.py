"""The ``rtl`` device: the core's emitted Verilog under Verilator (or Icarus), driven by cocotb.

The simulator process starts on first use and stays alive until :meth:`RtlDevice.close`, so the
on-chip buffers keep their contents between runs exactly as on a board (``keeps_sram``): the
Session's resident micro-op cache stays valid. The host keeps the authoritative copy of the
DRAM (``dram``); each run sends what changed and replays the core's writes back (see
:mod:`vtakit.vta_hw.sim.process`).

Creating the first device of a configuration emits the core's Verilog and builds the simulator
(seconds to minutes); both are cached on disk (:mod:`vtakit.vta_hw.sim.verilog_cache`,
:mod:`vtakit.vta_hw.sim.build`), so later devices of it, in any process, are created in
milliseconds and start their simulator (on first use) in about a second.
"""

from __future__ import annotations

import os

from vtakit.driver.device import DeviceInfo, HostMemoryDevice, RunResult
from vtakit.driver.errors import CycleLimitError, DeadlockError, DeviceError
from vtakit.driver.stream_check import StreamChecker, dram_reader
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.faults import Fault
from vtakit.vta_sim.errors import DEFAULT_CYCLE_LIMIT

__all__ = ["RtlDevice", "RtlStats"]


class RtlStats(dict):
    """Statistics of one RTL run: ``cycles``, ``tb_cycles`` (the bench's own count from start to
    done), ``write_beats`` and ``wall_s``."""

    @property
    def cycles(self) -> int:
        return self["cycles"]


class RtlDevice(HostMemoryDevice):
    """Runs streams on the RTL of the core.

    Parameters
    ----------
    cfg : HwConfig
    dram_bytes : int
        Size of the simulated DRAM (a Verilog array in the bench).
    simulator : str
        ``"verilator"`` (default) or ``"icarus"`` (much slower; for a second opinion).
    waves : str | os.PathLike | None
        Write a waveform of every run of this device to this path, FST if it ends in ``.fst``
        (needs ``apt-get install liblz4-dev`` to build), VCD otherwise; GTKWave and Surfer read
        both. The file is complete after :meth:`close`. Uses a separately cached tracing build
        (Verilator only).
    cycle_limit : int | None
        Fail a run that has not raised ``done`` after this many cycles (``CycleLimitError``;
        ``None``: no limit). The default is the ``sim`` device's,
        :data:`vtakit.vta_sim.DEFAULT_CYCLE_LIMIT` (2^32). A deadlock does not wait for it:
        the core detects one within :data:`vtakit.vta_hw.faults.DEADLOCK_QUIET_CYCLES` cycles
        (``DeadlockError``).
    verilog : str | None
        Verilog of ``vta_core`` to simulate instead of ``vtakit.vta_hw.top.Core`` (tests of
        the harness use a stand-in, whose words are not instructions: its streams are not
        range-checked).

    Attributes
    ----------
    dram : np.ndarray
        The host copy of the device memory (uint8), current after every run.
    keeps_sram : bool
        Always ``True``: one simulator process serves every run of the device.
    stream_check : StreamChecker | None
        The host-side SRAM range check of every stream (the core wraps SRAM indices around;
        the simulator refuses them), with what the host knows of the UOP SRAM; ``None`` for a
        stand-in ``verilog``.
    """

    keeps_sram = True

    def __init__(self, cfg: HwConfig, *, dram_bytes: int = 64 << 20, simulator: str = "verilator",
                 waves: str | os.PathLike | None = None,
                 cycle_limit: int | None = DEFAULT_CYCLE_LIMIT,
                 verilog: str | None = None):
        from vtakit.vta_hw.sim import build
        from vtakit.vta_hw.sim.build import DRAM_CAPACITY

        if not 0 < dram_bytes <= DRAM_CAPACITY:
            raise ValueError(f"RtlDevice: dram_bytes={dram_bytes} must be in 1..{DRAM_CAPACITY}")
        if cycle_limit is not None and cycle_limit < 0:
            raise ValueError(f"RtlDevice: cycle_limit={cycle_limit}: expected a non-negative "
                             f"int or None")
        super().__init__(cfg, dram_bytes)
        # Verilator: one build (of the largest DRAM) serves every size; Icarus zero-fills its
        # DRAM array at start-up, so it gets exactly the size asked for
        self.build = build(self.cfg, verilog=verilog, simulator=simulator,
                           waves=None if waves is None else
                           "fst" if os.fspath(waves).endswith(".fst") else "vcd",
                           dram_bytes=DRAM_CAPACITY if simulator == "verilator" else dram_bytes)
        self.waves = waves
        self.cycle_limit = cycle_limit
        self.last_stats: RtlStats | None = None
        self._sim = None
        self._dirty: list[tuple[int, int]] = []
        self._pending: tuple[int, int] | None = None
        self.stream_check = StreamChecker(self.cfg) if verilog is None else None

    def _simulation(self):
        if self._sim is None:
            from vtakit.vta_hw.sim import RtlSimulation

            self._sim = RtlSimulation(self.build, waves=self.waves, dram_bytes=self.dram.size)
        return self._sim

    def _written(self, start: int, end: int) -> None:
        self._dirty.append((start, end))

    def run(self, insn_addr: int, insn_count: int) -> None:
        """Start ``insn_count`` instructions at ``insn_addr`` (the simulation runs in
        :meth:`wait`). A stream whose SRAM indices leave their buffer is refused here, before
        anything runs, with the ``sim`` device's ``DeviceError`` for it (the same message,
        ``index`` and ``insn``; :mod:`vtakit.driver.stream_check`): the core would wrap the
        index around silently."""
        if self._pending is not None:
            raise RuntimeError("the rtl device is already running a stream; wait() for it first")
        if insn_addr % isa.INSN_BYTES or insn_count < 1:
            raise ValueError(f"insn_addr={insn_addr:#x}, insn_count={insn_count}: expected a "
                             f"{isa.INSN_BYTES}-byte aligned address and at least 1 instruction")
        self._check_range("instruction fetch", insn_addr, insn_count * isa.INSN_BYTES)
        if self.stream_check is not None:
            self.stream_check.check(self.dram[insn_addr:insn_addr + insn_count * isa.INSN_BYTES],
                                    dram_reader(self.dram))
        self._pending = (insn_addr, insn_count)

    def wait(self, timeout_s: float) -> RunResult:
        """Simulate the pending run. The errors are the ``sim`` device's for the same faults:
        ``DeadlockError`` (the core detected a deadlock), ``DeviceError`` (tokens left in a
        dependency queue or a load/store not finished at FINISH, as the core's FAULT register
        reports; or the core broke the memory protocol), ``CycleLimitError`` (past
        ``cycle_limit``), ``TimeoutError`` (past ``timeout_s`` wall-clock seconds). After any of
        them the core is reset and the simulator keeps running with the buffers' contents, so
        the next run is correct; only a simulator that stops answering is killed (then the
        next run starts a fresh one, and the buffers are lost)."""
        from vtakit.vta_hw.sim import RtlCycleLimit, RtlFault, RtlProtocolError, RtlTimeout

        if self._pending is None:
            raise RuntimeError("wait() without a run(): nothing is running on the rtl device")
        insn_addr, insn_count = self._pending
        self._pending = None
        sim = self._simulation()
        sim.load(self.dram, self._dirty)
        self._dirty = []
        completed = False
        try:
            r = sim.run(self.dram, insn_addr, insn_count,
                        cycle_limit=self.cycle_limit if self.cycle_limit is not None else 1 << 62,
                        timeout_s=timeout_s)
            completed = True
        except RtlFault as e:
            kind = DeadlockError if e.fault & Fault.DEADLOCK else DeviceError
            raise kind(f"rtl: {e}") from None
        except RtlProtocolError as e:
            raise DeviceError(f"rtl: {e}") from None
        except RtlCycleLimit as e:
            raise CycleLimitError(f"rtl: {e}") from None
        except RtlTimeout as e:
            raise TimeoutError(f"rtl device: {e}") from None
        except TimeoutError:
            self._sim = None  # killed; the next run starts a fresh simulator (SRAMs lost)
            if self.stream_check is not None:
                self.stream_check.forget()
            raise
        finally:  # a run that stopped early may or may not have done its LOAD UOPs
            if self.stream_check is not None:
                self.stream_check.settle(completed)
        self.last_stats = RtlStats(cycles=r.cycles, tb_cycles=r.tb_cycles,
                                   write_beats=r.write_beats, wall_s=r.wall_s)
        return RunResult(cycles=r.cycles, stats=self.last_stats)

    def identify(self) -> DeviceInfo:
        ver, ident = self._simulation().identify()
        return DeviceInfo(name="rtl", hw_ver=((ver >> 16) & 0xFF, (ver >> 8) & 0xFF, ver & 0xFF),
                          config_hash=f"{ident:08x}")

    def close(self) -> None:
        """Stop the simulator (the waveform file, if any, is complete afterwards)."""
        if self._sim is not None:
            self._sim.close()
            self._sim = None
            if self.stream_check is not None:  # the next simulator has buffers of its own
                self.stream_check.forget()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing left to report to
            pass
