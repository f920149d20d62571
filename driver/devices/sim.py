"""The ``sim`` device: the cycle-accurate simulator with a numpy array as DRAM."""

from __future__ import annotations

import os

from vtakit.driver.device import DeviceInfo, HostMemoryDevice, RunResult
from vtakit.driver.errors import CycleLimitError, DeadlockError, DeviceError
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_sim.errors import DEFAULT_CYCLE_LIMIT

__all__ = ["SimDevice"]


class SimDevice(HostMemoryDevice):
    """Runs streams on :class:`vtakit.vta_sim.Simulator`.

    Parameters
    ----------
    cfg : HwConfig
    dram_bytes : int
        Size of the simulated DRAM (allocated lazily by the OS, so a large value is cheap).
    timing : bool
        Model time (cycle counts, statistics); ``False`` runs the functional model only.
    cycle_limit : int | None
        Stop a run that has not finished after this many cycles (``CycleLimitError``);
        ``None`` for no limit. The default, :data:`vtakit.vta_sim.DEFAULT_CYCLE_LIMIT`
        (2^32), is 400x a ResNet-18 region (about 10^7 cycles) and refuses at once a corrupt
        instruction that would run for longer. With ``timing=False`` the same limit holds, on
        the instructions' closed-form cycles (a lower bound of the timed count): an
        instruction that would take its unit past it is refused before it executes.
    trace : str | os.PathLike | None
        Write a Chrome-trace/Perfetto timeline of every run to this path (the last run wins).

    Attributes
    ----------
    dram : np.ndarray
        The device memory, uint8.
    last_stats : vtakit.vta_sim.SimStats | None
        Statistics of the last run.
    """

    def __init__(self, cfg: HwConfig, *, dram_bytes: int = 256 << 20, timing: bool = True,
                 cycle_limit: int | None = DEFAULT_CYCLE_LIMIT,
                 trace: str | os.PathLike | None = None):
        from vtakit.vta_sim import Simulator

        if cycle_limit is not None and cycle_limit < 0:
            raise ValueError(f"SimDevice: cycle_limit={cycle_limit}: expected a non-negative "
                             f"int or None")
        super().__init__(cfg, dram_bytes)
        self.sim = Simulator(self.cfg, self.dram)
        self.timing = timing
        self.cycle_limit = cycle_limit
        self.trace = trace
        self.last_stats = None
        self._pending: tuple[int, int] | None = None

    def run(self, insn_addr: int, insn_count: int) -> None:
        if self._pending is not None:
            raise RuntimeError("the sim device is already running a stream; wait() for it first")
        self._check_range("instruction fetch", insn_addr, insn_count * isa.INSN_BYTES)
        self._pending = (insn_addr, insn_count)

    def wait(self, timeout_s: float) -> RunResult:
        """Simulate the pending run in the calling thread.

        ``TimeoutError`` once the simulation has taken ``timeout_s`` wall-clock seconds
        (checked inside long runs and long instructions); ``cycle_limit`` (constructor) bounds
        the simulated time. The simulator's faults come out as
        :class:`~vtakit.driver.errors.DeviceError` (or ``DeadlockError``, ``CycleLimitError``)
        with the same message, ``index`` and ``insn``."""
        from vtakit.vta_sim.errors import SimCycleLimit, SimDeadlock, SimError, SimTimeout

        if self._pending is None:
            raise RuntimeError("wait() without a run(): nothing is running on the sim device")
        insn_addr, insn_count = self._pending
        self._pending = None
        try:
            stats = self.sim.run(insn_addr, insn_count, timing=self.timing,
                                 cycle_limit=self.cycle_limit, trace=self.trace,
                                 timeout_s=timeout_s)
        except SimTimeout as err:
            raise TimeoutError(f"sim device: {err}") from None
        except SimError as err:
            kind = (DeadlockError if isinstance(err, SimDeadlock) else
                    CycleLimitError if isinstance(err, SimCycleLimit) else DeviceError)
            raise kind(str(err), err.index, err.insn) from None
        self.last_stats = stats
        return RunResult(cycles=int(getattr(stats, "cycles", 0) or 0), stats=stats)

    def identify(self) -> DeviceInfo:
        return DeviceInfo(name="sim", hw_ver=isa.HW_VER, config_hash=self.cfg.hash)
