"""Untimed execution that still replays the dependency-token protocol.

Each unit runs its instructions in order: an instruction starts when every token it pops is
there, and its pushes wait for space in their token queues (the unit stalls until they are
done, as in the timed model); the units take turns until none can move. The run is correct if
compute executed FINISH, every load and store instruction is ordered before FINISH by tokens,
and nothing is left; otherwise it fails with the timed model's error class. Command-queue
depths are not modelled here (fetch has dispatched the whole stream).

``cycle_limit`` is enforced through a lower bound, in the timed model's unit (cycles): a unit
executes its instructions one after another, each for at least its closed-form duration
(:func:`.work.stream_min_cycles`: a GEMM or ALU loop for its micro-op iterations, a transfer
for its beats), so a unit whose durations add up past the limit makes the timed run exceed it
too.
The sums are taken over the whole stream before it runs (numpy, one pass), and the instruction
that takes its unit past the limit is refused before it executes; nothing of its size is
computed or allocated.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from functools import partial

import numpy as np

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import MemType, Opcode
from vtakit.vta_hw.timing_facts import TOKEN_POPS, TOKEN_PUSHES, n_uops

from . import semantics
from .deadline import Deadline
from .errors import RAISE_CYCLE_LIMIT, ExecFault, SimCycleLimit, SimDeadlock, SimError
from .program import COMPUTE_UNIT, LOAD_UNIT, STORE_UNIT, Program
from .state import ArchState
from .stats import SimStats
from .timing import EXEC_UNITS, check_finish_order, check_tokens
from .work import describe_work, min_cycles, stream_cost

__all__ = ["run_functional", "min_cycles"]

#: Limits below this are checked with int64 sums; larger ones (2^61 cycles are 730 years of a
#: 100 MHz core) with Python ints.
_INT64_SAFE_LIMIT = 1 << 61


def _limit_stops(cfg: HwConfig, prog: Program, queues: Mapping[str, list[int]],
                 cycle_limit: int) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """Per unit, the position in its queue of the instruction that takes the unit past
    ``cycle_limit`` (the queue's length if none does), and the unit's running sums (exact up
    to that one)."""
    cost = stream_cost(cfg, prog)
    if cycle_limit < _INT64_SAFE_LIMIT:
        cost = np.minimum(cost, cycle_limit + 1)  # every sum up to the first past the limit
    else:                                         # is then at most 2 * limit + 1 < 2^63
        cost = cost.astype(object)  # Python ints: exact whatever the limit (slower)
    stops, sums = {}, {}
    for u, q in queues.items():
        sums[u] = np.cumsum(cost[q]) if q else np.zeros(0, np.int64)
        over = sums[u] > cycle_limit  # later sums may wrap: only the first True counts
        stops[u] = int(over.argmax()) if over.any() else len(q)
    return stops, sums


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
    stop = {u: len(q) for u, q in queues.items()}  # the instruction the limit refuses
    sums: dict[str, np.ndarray] = {}
    if cycle_limit is not None:
        stop, sums = _limit_stops(cfg, prog, queues, cycle_limit)
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
                    if pos[u] == stop[u]:
                        assert cycle_limit is not None
                        _raise_limit(cfg, u, k, insn, cycle_limit,
                                     int(sums[u][pos[u] - 1]) if pos[u] else 0, pos[u])
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


def _raise_limit(cfg: HwConfig, unit: str, k: int, insn: dict[str, int], cycle_limit: int,
                 before: int, n_before: int) -> None:
    """Refuse instruction ``k``: ``unit``'s ``n_before`` earlier instructions take at least
    ``before`` cycles, and with this one the unit passes ``cycle_limit``."""
    total = before + min_cycles(cfg, insn)
    earlier = (f"; with the {unit} unit's {n_before} earlier instruction"
               f"{'s' if n_before != 1 else ''} (at least {before} cycles), at least {total}"
               if n_before else "")
    raise SimCycleLimit(
        f"cycle limit {cycle_limit} exceeded (functional run; refused before it executes): "
        f"this instruction alone takes {describe_work(cfg, insn)}{earlier} (expected the run "
        f"to finish within the limit; {RAISE_CYCLE_LIMIT})", k, insn)


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
