"""The shared memory port (docs/timing.md §2): one burst at a time, fixed priority, read
latency, back-to-back bursts in closed form, interrupted only at burst boundaries."""

from __future__ import annotations

import numpy as np

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.timing_facts import PORT_PRIORITY

from .. import memory
from .kernel import Kernel, Proc

__all__ = ["MemoryPort", "Transfer", "PRIORITY"]

#: Memory-port priority of each client (lower wins), from the hardware's fixed order.
PRIORITY = {client: rank for rank, client in enumerate(PORT_PRIORITY)}


class Transfer:
    """Rows of ``nbytes`` bytes starting at ``starts`` (an int for one row); the process
    ``proc`` is resumed when the transfer finishes."""

    __slots__ = ("client", "prio", "write", "starts", "nbytes", "beats", "bursts", "proc")

    def __init__(self, client: str, write: bool, starts: np.ndarray | int, nbytes: int,
                 beats: int, proc: Proc):
        self.client = client
        self.prio = PRIORITY[client]
        self.write = write
        self.starts = starts
        self.nbytes = nbytes
        self.beats = beats  # beats not yet granted
        self.bursts: np.ndarray | None = None  # lengths of the bursts not yet granted (lazy)
        self.proc = proc


class MemoryPort:
    """Grants the pending transfer of the highest-priority client a *run* of all its remaining
    bursts; a higher-priority request cuts the run at the next burst boundary."""

    def __init__(self, kernel: Kernel, cfg: HwConfig, trace: list[dict] | None):
        self.kernel = kernel
        self.cfg = cfg
        self.trace = trace
        self.pending: list[Transfer] = []
        self.holder: Transfer | None = None
        self.run_start = 0
        self.run_end = 0  # the port is free from this cycle
        self.run_cut = False
        self.run_slice: dict | None = None
        self.arb_at = -1

    def request(self, tr: Transfer) -> None:
        now = self.kernel.now
        self.pending.append(tr)
        if self.holder is None or self.run_end <= now:
            self._arbitrate_at(max(now, self.run_end))
        elif tr.prio < self.holder.prio and not self.run_cut:
            self._cut(now)
        else:
            self._arbitrate_at(self.run_end)

    def _arbitrate_at(self, t: int) -> None:
        if self.arb_at != t:
            self.arb_at = t
            self.kernel.at_end_of_cycle(t, self._arbitrate)

    def _bursts(self, tr: Transfer) -> np.ndarray:
        if tr.bursts is None:
            tr.bursts = memory.burst_lengths(np.asarray(tr.starts), tr.nbytes,
                                             self.cfg.bus_bytes, self.cfg.mem_max_burst_beats)
        return tr.bursts

    def _cut(self, now: int) -> None:
        """The holder keeps the bursts granted before the first boundary at or after ``now``."""
        tr = self.holder
        assert tr is not None
        bursts = self._bursts(tr)
        cs = np.cumsum(bursts)
        m = int(np.searchsorted(cs, now - self.run_start, side="left"))
        if m >= len(cs) - 1:  # its last burst: the port frees at run_end anyway
            self._arbitrate_at(self.run_end)
            return
        cut = self.run_start + int(cs[m])
        tr.bursts = bursts[m + 1:]
        tr.beats = int(cs[-1] - cs[m])
        tr.proc.version += 1  # cancel its completion
        self.run_end = cut
        self.run_cut = True
        if self.run_slice is not None:
            self.run_slice["dur"] = cut - self.run_start
        self.pending.append(tr)
        self._arbitrate_at(cut)

    def _arbitrate(self) -> None:
        now = self.kernel.now
        if self.arb_at == now:
            self.arb_at = -1
        if self.holder is not None and self.run_end > now:
            return
        self.holder = None
        if not self.pending:
            return
        tr = min(self.pending, key=lambda p: p.prio)
        self.pending.remove(tr)
        self.holder, self.run_start, self.run_end = tr, now, now + tr.beats
        self.run_cut = False
        done = self.run_end + (0 if tr.write else self.cfg.mem_read_latency_cycles)
        self.kernel.schedule(done, tr.proc)
        if self.pending:  # otherwise the next request arbitrates
            self._arbitrate_at(self.run_end)
        if self.trace is not None:
            self.run_slice = {"name": f"{tr.client} {'write' if tr.write else 'read'}",
                              "ph": "X", "ts": now, "dur": tr.beats, "pid": 0, "tid": 5,
                              "args": {"beats": tr.beats}}
            self.trace.append(self.run_slice)
