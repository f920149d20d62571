"""The public entry point: :class:`Simulator`."""

from __future__ import annotations

import numbers
import os

import numpy as np
from threadpoolctl import threadpool_limits

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig

from .deadline import Deadline
from .errors import DEFAULT_CYCLE_LIMIT
from .functional import run_functional
from .program import decode_program
from .state import ArchState
from .stats import SimStats
from .timing import run_timed

__all__ = ["Simulator"]


class Simulator:
    """The accelerator in Python: architectural state plus a cycle-accurate timing model.

    Parameters
    ----------
    cfg : HwConfig
        The configuration to model.
    dram : np.ndarray
        The device memory: a writable, C-contiguous, 1-D ``uint8`` array owned by the caller;
        LOAD reads it and STORE writes it in place.

    Attributes
    ----------
    cfg : HwConfig
    dram : np.ndarray
    state : ArchState
        The on-chip buffers; they persist from one :meth:`run` to the next.
    """

    def __init__(self, cfg: HwConfig, dram: np.ndarray):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Simulator: cfg must be an HwConfig, got {type(cfg).__name__}")
        if not isinstance(dram, np.ndarray):
            raise TypeError(f"Simulator: dram must be a numpy uint8 array, got "
                            f"{type(dram).__name__}")
        if dram.dtype != np.uint8 or dram.ndim != 1 or not dram.flags.c_contiguous \
                or not dram.flags.writeable:
            raise ValueError(f"Simulator: dram must be a writable C-contiguous 1-D uint8 array, "
                             f"got dtype={dram.dtype}, shape={dram.shape}, "
                             f"contiguous={dram.flags.c_contiguous}, "
                             f"writeable={dram.flags.writeable}")
        self.cfg = cfg.validate()
        self.dram = dram
        self.state = ArchState.zeros(cfg)

    def run(self, insn_addr: int, insn_count: int, *, timing: bool = True,
            cycle_limit: int | None = DEFAULT_CYCLE_LIMIT,
            trace: str | os.PathLike | None = None,
            timeout_s: float | None = None) -> SimStats:
        """Execute ``insn_count`` instructions starting at byte address ``insn_addr`` of DRAM.

        The stream must end with FINISH. With ``timing=False`` only the data effects and the
        token protocol are modelled (``cycles`` is 0, and ``trace`` is ignored: there is no
        time to draw). ``trace`` names a Chrome-trace / Perfetto JSON file to write, one track
        per unit and one for the memory port (written even when the run fails).

        ``cycle_limit`` (default :data:`~vtakit.vta_sim.errors.DEFAULT_CYCLE_LIMIT`, 2^32;
        ``None``: no limit) fails the run once it passes that cycle
        (:class:`~vtakit.vta_sim.errors.SimCycleLimit`). The functional model counts the same
        cycles in closed form, as a lower bound (:mod:`vtakit.vta_sim.work`): it refuses,
        before executing it, the instruction with which one unit's instructions would take
        longer than the limit, so whatever it refuses the timed model refuses too.
        ``timeout_s`` (``None``: none) abandons the run after that many wall-clock seconds
        (:class:`~vtakit.vta_sim.errors.SimTimeout`, a ``TimeoutError``), checked between
        instructions, every few thousand timing events, between the pieces of a long loop and
        every few hundred steps of a dependent chain within one.
        Every instruction is range-checked before it is timed or executed, and a loop's work
        and memory are bounded by its own iterations, so neither limit needs memory to act.

        Raises :class:`~vtakit.vta_sim.errors.SimError` (or ``SimDeadlock``,
        ``SimCycleLimit``, ``SimTimeout``) naming the offending instruction; the driver's
        ``sim`` device turns them into :class:`vtakit.driver.DeviceError` and its subclasses
        (``TimeoutError`` for a timeout).
        """
        if insn_addr < 0 or insn_addr % isa.INSN_BYTES:
            raise ValueError(f"insn_addr={insn_addr:#x} must be a non-negative multiple of "
                             f"{isa.INSN_BYTES}")
        if insn_count < 1:
            raise ValueError(f"insn_count={insn_count}: expected at least 1 (a FINISH)")
        end = insn_addr + insn_count * isa.INSN_BYTES
        if end > self.dram.size:
            raise ValueError(f"instruction stream [{insn_addr:#x}, {end:#x}) lies outside DRAM "
                             f"of {self.dram.size:#x} bytes")
        if cycle_limit is not None and (isinstance(cycle_limit, bool)
                                        or not isinstance(cycle_limit, numbers.Integral)):
            raise TypeError(f"cycle_limit={cycle_limit!r}: expected an int or None, got "
                            f"{type(cycle_limit).__name__}")
        if cycle_limit is not None and cycle_limit < 0:
            raise ValueError(f"cycle_limit={cycle_limit}: expected a non-negative int or None")
        if cycle_limit is not None:
            cycle_limit = int(cycle_limit)
        prog = decode_program(self.dram[insn_addr:end], self.cfg)
        deadline = Deadline(timeout_s, prog.insns) if timeout_s is not None else None
        stats = SimStats(timing=timing, macs_per_cycle=self.cfg.macs_per_cycle)
        # The matrix products of one instruction are small: a multi-threaded BLAS spends more
        # time waking its threads than computing (10x slower when another process is busy).
        with threadpool_limits(limits=1, user_api="blas"):
            if timing:
                run_timed(self.cfg, self.state, self.dram, prog, insn_addr, stats, cycle_limit,
                          trace, deadline)
            else:
                stats.dram_read_bytes["INSN"] = insn_count * isa.INSN_BYTES
                run_functional(self.cfg, self.state, self.dram, prog, stats, cycle_limit,
                               deadline)
        return stats
