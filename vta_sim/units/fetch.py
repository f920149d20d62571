"""The fetch unit (docs/timing.md §3): reads the stream in burst-window groups and dispatches
each instruction, one per cycle, to the load, compute or store command queue."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from vtakit.vta_hw import isa

from .. import memory
from .kernel import Proc
from .port import Transfer

if TYPE_CHECKING:
    from ..timing import TimedRun

__all__ = ["fetch"]


def group_end(insn_addr: int, i: int, n: int, window_bytes: int) -> int:
    """One past the last instruction of the group that starts with instruction ``i``: the
    instructions whose first byte lies in the ``window_bytes``-aligned window of instruction
    ``i`` (at least one)."""
    a = insn_addr + i * isa.INSN_BYTES
    room = (a // window_bytes + 1) * window_bytes - a
    return min(n, i + max(1, -(-room // isa.INSN_BYTES)))


def fetch(run: TimedRun, proc: Proc) -> Generator[tuple, Any, None]:
    """The fetch process."""
    cfg = run.cfg
    kernel = run.kernel
    n = len(run.prog.insns)
    window = cfg.mem_max_burst_beats * cfg.bus_bytes
    ust = run.stats.units["fetch"]
    reads = run.stats.dram_read_bytes
    i = 0
    while i < n:
        j = group_end(run.insn_addr, i, n, window)
        a = run.insn_addr + i * isa.INSN_BYTES
        nbytes = (j - i) * isa.INSN_BYTES
        t0 = kernel.now
        proc.index = i
        yield ("xfer", Transfer("fetch", False, a, nbytes,
                                memory.total_beats(a, nbytes, cfg.bus_bytes), proc))
        reads["INSN"] = reads.get("INSN", 0) + nbytes
        busy = kernel.now - t0
        for k in range(i, j):
            t1 = kernel.now
            proc.index = k
            yield ("dispatch", run.cmdq[run.prog.unit[k]], k)
            ust.stall_cycles += kernel.now - 1 - t1
            ust.insns += 1
            busy += 1
        proc.index = None
        ust.busy_cycles += busy
        i = j
