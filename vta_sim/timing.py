"""When instructions happen: wires fetch, load, compute and store (:mod:`.units`) to the
command queues, the four token queues and the memory port, and runs them (docs/timing.md).

Each unit is a generator that yields what it waits for; the kernel advances time from event to
event, never cycle by cycle. Data effects come from :mod:`.semantics`, applied when an
instruction finishes.
"""

from __future__ import annotations

import json
import os

import numpy as np

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.timing_facts import (
    ALU_PIPELINE_CYCLES,
    GEMM_PIPELINE_CYCLES,
    PORT_PRIORITY,
    TOKEN_POPS,
    alu_cycles,
    gemm_cycles,
    n_uops,
    pad_elems,
)

from .deadline import Deadline
from .errors import RAISE_CYCLE_LIMIT, SimCycleLimit, SimDeadlock, SimError
from .program import COMPUTE_UNIT, EXEC_UNITS, LOAD_UNIT, STORE_UNIT, Program
from .state import ArchState
from .stats import SimStats
from .units.execute import unit
from .units.fetch import fetch
from .units.kernel import CmdQueue, Kernel, Proc, TokenQueue
from .units.port import MemoryPort
from .work import describe_work

# The timing contract's constants and closed forms are vta_hw.timing_facts's, re-exported here
# for users of the simulator's cycle model.
__all__ = ["run_timed", "TimedRun", "check_tokens", "check_finish_order", "EXEC_UNITS",
           "GEMM_PIPELINE_CYCLES", "ALU_PIPELINE_CYCLES", "PORT_PRIORITY", "gemm_cycles",
           "alu_cycles", "pad_elems", "n_uops"]

TOKEN_QUEUES = ("l2g", "g2l", "g2s", "s2g")
_TID = {"fetch": 1, LOAD_UNIT: 2, COMPUTE_UNIT: 3, STORE_UNIT: 4}
_PORT_TID = 5


class TimedRun:
    """One timed run: the units, their queues and the memory port over shared state."""

    def __init__(self, cfg: HwConfig, state: ArchState, dram: np.ndarray, prog: Program,
                 insn_addr: int, stats: SimStats, cycle_limit: int | None, tracing: bool,
                 deadline: Deadline | None = None):
        self.cfg, self.state, self.dram, self.prog = cfg, state, dram, prog
        self.insn_addr = insn_addr
        self.stats = stats
        self.cycle_limit = cycle_limit
        self.trace: list[dict] | None = [] if tracing else None
        self.done_at: int | None = None
        self.finish_clock: list[int] | None = None  # the compute unit's clock at FINISH
        self.deadline = deadline
        flags = {(u, t): flag for u in EXEC_UNITS for flag, t in TOKEN_POPS[u]}
        self.kernel = Kernel(flags)
        self.kernel.port = MemoryPort(self.kernel, cfg, self.trace)
        self.cmdq = {u: CmdQueue(u, cfg.cmd_queue_depth) for u in EXEC_UNITS}
        self.tokq = {t: TokenQueue(t, cfg.dep_queue_depth) for t in TOKEN_QUEUES}
        self.procs = {name: Proc(name) for name in ("fetch",) + EXEC_UNITS}

    def slice(self, unit_name: str, k: int, start: int, end: int) -> None:
        """Record instruction ``k`` on ``unit_name``'s trace track."""
        if self.trace is not None:
            insn = self.prog.insns[k]
            self.trace.append({"name": insn["kind"], "ph": "X", "ts": start,
                               "dur": max(end - start, 0), "pid": 0, "tid": _TID[unit_name],
                               "args": {"index": k, **insn}})

    def run(self) -> None:
        p = self.procs
        p["fetch"].gen = fetch(self, p["fetch"])
        for u in EXEC_UNITS:
            p[u].gen = unit(self, u, p[u])
        for proc in p.values():
            self.kernel.schedule(0, proc)
        # after FINISH the rest of its cycle still runs: a unit finishing then is idle
        self.kernel.run(lambda: self.done_at, self.cycle_limit, self._raise_limit,
                        None if self.deadline is None else lambda: self.check_deadline(None))
        if self.done_at is None:
            self._raise_deadlock()
        assert self.done_at is not None
        self.stats.cycles = self.done_at
        self._check_end()

    def check_deadline(self, index: int | None) -> None:
        """Raise :class:`SimTimeout` past the wall-clock deadline, naming instruction
        ``index`` (``None``: the one a unit is blocked on)."""
        if self.deadline is not None:
            self.deadline.check(self._blamed() if index is None else index, self.kernel.now)

    # ---- failures -------------------------------------------------------------------------
    def _describe_units(self) -> str:
        parts = []
        for name in EXEC_UNITS + ("fetch",):
            proc = self.procs[name]
            if proc.index is None:
                parts.append(f"{name}: all instructions dispatched" if name == "fetch"
                             else f"{name}: idle, waiting for a command")
            else:
                insn = self.prog.insns[proc.index]
                parts.append(f"{name}: #{proc.index} {insn['kind']} waiting for "
                             f"{proc.waiting}")
        counts = ", ".join(f"{q.name}={q.count}" for q in self.tokq.values())
        return "; ".join(parts) + f"; token counts {counts}"

    def _blamed(self) -> int | None:
        for name in (COMPUTE_UNIT, LOAD_UNIT, STORE_UNIT, "fetch"):
            if self.procs[name].index is not None:
                return self.procs[name].index
        return None

    def _raise_deadlock(self) -> None:
        k = self._blamed()
        raise SimDeadlock(
            f"deadlock at cycle {self.kernel.now}: every unit waits for a token nobody will "
            f"push ({self._describe_units()}; expected each pop to be matched by an earlier "
            f"push)", k, self.prog.insns[k] if k is not None else None)

    def _raise_limit(self, limit: int) -> None:
        k = self._blamed()
        insn = self.prog.insns[k] if k is not None else None
        alone = f"; #{k} alone takes {describe_work(self.cfg, insn)}" if insn is not None else ""
        raise SimCycleLimit(
            f"cycle limit {limit} reached before FINISH completed ({self._describe_units()}"
            f"{alone}; expected the run to finish within the limit; {RAISE_CYCLE_LIMIT})",
            k, insn)

    def _check_end(self) -> None:
        for name in (LOAD_UNIT, STORE_UNIT):
            proc = self.procs[name]
            q = self.cmdq[name]
            if proc.index is not None or q.entries:
                k = proc.index if proc.index is not None else q.entries[0][1]
                raise SimError(
                    f"FINISH completed at cycle {self.done_at} while the {name} unit still had "
                    f"this instruction to finish (expected the compute unit to pop a token "
                    f"from the {name} unit before FINISH)", k, self.prog.insns[k])
        assert self.finish_clock is not None
        units = {u: [k for k, unit in enumerate(self.prog.unit) if unit == u]
                 for u in (LOAD_UNIT, STORE_UNIT)}
        check_finish_order(self.prog, {u: (self.finish_clock[EXEC_UNITS.index(u)], q)
                                       for u, q in units.items()}, self.done_at)
        check_tokens({q.name: q.count for q in self.tokq.values()}, self.prog)

    def write_trace(self, path: str | os.PathLike) -> None:
        """Write the Chrome-trace / Perfetto JSON (1 trace microsecond = 1 cycle)."""
        meta = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
                 "args": {"name": name}} for name, tid in _TID.items()]
        meta.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": _PORT_TID,
                     "args": {"name": "memory port"}})
        for tid in list(_TID.values()) + [_PORT_TID]:
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid,
                         "args": {"sort_index": tid}})
        doc = {"traceEvents": meta + (self.trace or []), "displayTimeUnit": "ns",
               "otherData": {"time_unit": "1 trace microsecond = 1 cycle"}}
        with open(path, "w") as f:
            json.dump(doc, f, default=int)


def check_tokens(counts: dict[str, int], prog: Program) -> None:
    """A run must leave no token behind: it would wrongly satisfy a pop of the next run."""
    left = {q: n for q, n in counts.items() if n}
    if left:
        k = len(prog.insns) - 1
        raise SimError(
            "run ended with tokens still in the dependency queues "
            + ", ".join(f"{q}={n}" for q, n in left.items())
            + " (expected every push to be popped before FINISH)", k, prog.insns[k])


def check_finish_order(prog: Program, before: dict[str, tuple[int, list[int]]],
                       cycle: int | None) -> None:
    """Every load and store instruction must happen before FINISH through the token protocol
    (program order in each unit plus push -> pop), or the host could see the run end while
    it still moves data. ``before[unit]`` is (how many of the unit's instructions happen
    before FINISH, the unit's instruction indices)."""
    for u, (n, q) in before.items():
        if n < len(q):
            k = q[n]
            at = f" at cycle {cycle}" if cycle is not None else ""
            raise SimError(
                f"FINISH completed{at} while the {u} unit still had this instruction to finish, "
                f"or could have: no chain of tokens orders it before FINISH (expected the "
                f"compute unit to pop a token from the {u} unit before FINISH)", k, prog.insns[k])


def run_timed(cfg: HwConfig, state: ArchState, dram: np.ndarray, prog: Program,
              insn_addr: int, stats: SimStats, cycle_limit: int | None = None,
              trace: str | os.PathLike | None = None, deadline: Deadline | None = None
              ) -> None:
    """Run ``prog`` cycle-accurately, updating ``state``, ``dram`` and ``stats``; the trace (if
    asked for) is written even when the run fails."""
    r = TimedRun(cfg, state, dram, prog, insn_addr, stats, cycle_limit, trace is not None,
                 deadline)
    try:
        r.run()
    finally:
        if trace is not None:
            r.write_trace(trace)
