"""Untimed execution that still replays the dependency-token protocol.

Each unit runs its instructions in order: an instruction starts when every token it pops is
there, and its pushes wait for space in their token queues (the unit stalls until they are
done, as in the timed model); the units take turns until none can move. The run is correct if
compute executed FINISH, every load and store instruction is ordered before FINISH by tokens,
and nothing is left; otherwise it fails with the timed model's error class. Command-queue
depths are not modelled here (fetch has dispatched the whole stream).

``cycle_limit`` is enforced through a lower bound: a unit executes its instructions one after
another, each for at least its closed-form duration (a transfer for at least its beats), so a
unit whose durations add up past the limit would make the timed run exceed it too.
"""

from __future__ import annotations

from collections import deque
from functools import partial

import numpy as np

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import MemType, Opcode
from vtakit.vta_hw.timing_facts import (
    NOP_CYCLES,
    TOKEN_POPS,
    TOKEN_PUSHES,
    alu_cycles,
    gemm_cycles,
    n_uops,
    pad_elems,
)

from . import memory, semantics
from .deadline import Deadline
from .errors import ExecFault, SimCycleLimit, SimDeadlock, SimError
from .program import COMPUTE_UNIT, LOAD_UNIT, STORE_UNIT, Program
from .state import ArchState
from .stats import SimStats
from .timing import EXEC_UNITS, check_finish_order, check_tokens

__all__ = ["run_functional", "min_cycles"]


def min_cycles(cfg: HwConfig, insn: dict[str, int]) -> int:
    """A lower bound on the cycles ``insn`` occupies its unit (docs/timing.md §4); call it on a
    checked instruction (its transfer is in range, so its rows are few)."""
    op = insn["opcode"]
    if op == Opcode.GEMM:
        return gemm_cycles(n_uops(insn))
    if op == Opcode.ALU:
        return alu_cycles(n_uops(insn), bool(insn["use_imm"]))
    if op in (Opcode.LOAD, Opcode.STORE) and insn["x_size"]:
        eb = cfg.elem_bytes(insn["memory_type"])
        beats = 0
        if insn["y_size"]:
            starts = memory.row_starts(insn["dram_base"], insn["y_size"], insn["x_stride"], eb)
            beats = memory.total_beats(starts, insn["x_size"] * eb, cfg.bus_bytes)
        return max(NOP_CYCLES, beats + (pad_elems(insn) if op == Opcode.LOAD else 0))
    return NOP_CYCLES


def run_functional(cfg: HwConfig, state: ArchState, dram: np.ndarray, prog: Program,
                   stats: SimStats, cycle_limit: int | None = None,
                   deadline: Deadline | None = None) -> None:
    """Execute ``prog`` without timing, updating ``state``, ``dram`` and ``stats``."""
    units = EXEC_UNITS
    slot = {u: n for n, u in enumerate(units)}
    queues = {u: [k for k, unit in enumerate(prog.unit) if unit == u] for u in units}
    pos = dict.fromkeys(units, 0)
    # A token carries the vector clock of its pusher: how many instructions of each unit
    # happen before it. A unit's clock is its own count merged with the tokens it popped.
    tokens: dict[str, deque[tuple[int, ...]]] = {t: deque() for t in ("l2g", "g2l", "g2s",
                                                                        "s2g")}
    clock = {u: [0, 0, 0] for u in units}
    pending: dict[str, list[str]] = {u: [] for u in units}  # pushes of the last instruction
    busy = dict.fromkeys(units, 0)
    depth = cfg.dep_queue_depth
    finish_clock: list[int] | None = None
    moved = True
    while moved:
        moved = False
        for u in units:
            q = queues[u]
            while True:
                if pending[u]:
                    if any(len(tokens[t]) >= depth for t in pending[u]):
                        break
                    for t in pending[u]:
                        tokens[t].append(tuple(clock[u]))
                    pending[u] = []
                    moved = True
                if pos[u] >= len(q):
                    break
                k = q[pos[u]]
                insn = prog.insns[k]
                pops = [t for flag, t in TOKEN_POPS[u] if insn[flag]]
                if any(not tokens[t] for t in pops):
                    break
                for t in pops:
                    clock[u] = [max(a, b) for a, b in zip(clock[u], tokens[t].popleft())]
                if deadline is not None:
                    deadline.check(k)
                try:
                    semantics.check(state, dram, insn)
                    busy[u] += min_cycles(cfg, insn)
                    if cycle_limit is not None and busy[u] > cycle_limit:
                        raise SimCycleLimit(
                            f"cycle limit {cycle_limit} exceeded: the {u} unit's instructions "
                            f"up to this one take at least {busy[u]} cycles (expected the run "
                            f"to finish within the limit)", k, insn)
                    semantics.execute(state, dram, insn, None if deadline is None
                                      else partial(deadline.check, k))
                except ExecFault as err:
                    raise SimError(str(err), k, insn) from None
                _count(cfg, stats, u, insn)
                pos[u] += 1
                clock[u][slot[u]] = pos[u]
                pending[u] = [t for flag, t in TOKEN_PUSHES[u] if insn[flag]]
                moved = True
                if insn["opcode"] == Opcode.FINISH:
                    finish_clock = list(clock[u])
    if finish_clock is None:
        _raise_deadlock(prog, queues, pos, pending, tokens, depth)
    assert finish_clock is not None
    check_finish_order(prog, {u: (finish_clock[slot[u]], queues[u])
                              for u in (LOAD_UNIT, STORE_UNIT)}, None)
    check_tokens({t: len(v) + sum(t in p for p in pending.values())
                  for t, v in tokens.items()}, prog)


def _raise_deadlock(prog: Program, queues: dict[str, list[int]], pos: dict[str, int],
                    pending: dict[str, list[str]], tokens: dict[str, deque],
                    depth: int) -> None:
    parts = []
    blamed = None
    for u in EXEC_UNITS:
        if pending[u]:
            k = queues[u][pos[u] - 1]
            full = [t for t in pending[u] if len(tokens[t]) >= depth]
            what = "space in token queue " + " and ".join(full)
        elif pos[u] >= len(queues[u]):
            parts.append(f"{u}: no instruction left")
            continue
        else:
            k = queues[u][pos[u]]
            insn = prog.insns[k]
            what = "token " + " and ".join(f"{t} ({flag})" for flag, t in TOKEN_POPS[u]
                                           if insn[flag] and not tokens[t])
        blamed = k if blamed is None or u == COMPUTE_UNIT else blamed
        parts.append(f"{u}: #{k} {prog.insns[k]['kind']} waiting for {what}")
    counts = ", ".join(f"{q}={len(n)}" for q, n in tokens.items())
    raise SimDeadlock(
        f"deadlock: every unit waits for a token nobody will push ({'; '.join(parts)}; "
        f"token counts {counts}; expected each pop to be matched by an earlier push)",
        blamed, prog.insns[blamed] if blamed is not None else None)


def _count(cfg: HwConfig, stats: SimStats, unit: str, insn: dict[str, int]) -> None:
    """Count ``insn``, executed by ``unit``, in ``stats``."""
    op = insn["opcode"]
    name = Opcode(op).name
    stats.insn_counts[name] = stats.insn_counts.get(name, 0) + 1
    stats.units[unit].insns += 1
    if op == Opcode.GEMM:
        nu = n_uops(insn)
        stats.gemm_uops += nu
        if not insn["reset"]:
            stats.gemm_macs += nu * cfg.macs_per_cycle
    elif op == Opcode.ALU:
        stats.alu_uops += n_uops(insn)
    elif op in (Opcode.LOAD, Opcode.STORE) and insn["x_size"]:
        nbytes = insn["x_size"] * insn["y_size"] * cfg.elem_bytes(insn["memory_type"])
        if op == Opcode.STORE:
            stats.dram_write_bytes += nbytes
        else:
            mt = MemType(insn["memory_type"]).name
            stats.dram_read_bytes[mt] = stats.dram_read_bytes.get(mt, 0) + nbytes
