"""Untimed execution that still replays the dependency-token protocol.

Each unit runs its instructions in order until the next one would pop a token that is not there
(or push into a full token queue); the units take turns until none can move. The run is correct
if compute executed FINISH and nothing is left; otherwise it deadlocked. Command-queue depths are
not modelled here (fetch has dispatched the whole stream).
"""

from __future__ import annotations

import numpy as np

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import MemType, Opcode
from vtakit.vta_hw.timing_facts import TOKEN_POPS, TOKEN_PUSHES, n_uops

from . import semantics
from .errors import ExecFault, SimDeadlock, SimError
from .program import COMPUTE_UNIT, LOAD_UNIT, STORE_UNIT, Program
from .state import ArchState
from .stats import SimStats
from .timing import check_tokens

__all__ = ["run_functional"]

def run_functional(cfg: HwConfig, state: ArchState, dram: np.ndarray, prog: Program,
                   stats: SimStats) -> None:
    """Execute ``prog`` without timing, updating ``state``, ``dram`` and ``stats``."""
    units = (LOAD_UNIT, COMPUTE_UNIT, STORE_UNIT)
    queues = {u: [k for k, unit in enumerate(prog.unit) if unit == u] for u in units}
    pos = dict.fromkeys(units, 0)
    tokens = {"l2g": 0, "g2l": 0, "g2s": 0, "s2g": 0}
    depth = cfg.dep_queue_depth
    finished = False
    moved = True
    while moved:
        moved = False
        for u in units:
            q = queues[u]
            while pos[u] < len(q):
                k = q[pos[u]]
                insn = prog.insns[k]
                pops = [t for flag, t in TOKEN_POPS[u] if insn[flag]]
                pushes = [t for flag, t in TOKEN_PUSHES[u] if insn[flag]]
                if any(tokens[t] == 0 for t in pops):
                    break
                if any(tokens[t] - (t in pops) >= depth for t in pushes):
                    break
                for t in pops:
                    tokens[t] -= 1
                try:
                    semantics.execute(state, dram, insn)
                except ExecFault as err:
                    raise SimError(str(err), k, insn) from None
                _count(cfg, stats, u, insn)
                for t in pushes:
                    tokens[t] += 1
                pos[u] += 1
                moved = True
                if insn["opcode"] == Opcode.FINISH:
                    finished = True
    if not finished:
        parts = []
        blamed = None
        for u in units:
            if pos[u] >= len(queues[u]):
                parts.append(f"{u}: no instruction left")
                continue
            k = queues[u][pos[u]]
            insn = prog.insns[k]
            blamed = k if blamed is None or u == COMPUTE_UNIT else blamed
            waits = [f"{t} ({flag})" for flag, t in TOKEN_POPS[u] if insn[flag] and tokens[t] == 0]
            full = [t for flag, t in TOKEN_PUSHES[u] if insn[flag] and tokens[t] >= depth]
            what = ("token " + " and ".join(waits)) if waits else (
                "space in token queue " + " and ".join(full))
            parts.append(f"{u}: #{k} {insn['kind']} waiting for {what}")
        counts = ", ".join(f"{q}={n}" for q, n in tokens.items())
        raise SimDeadlock(
            f"deadlock: every unit waits for a token nobody will push ({'; '.join(parts)}; "
            f"token counts {counts}; expected each pop to be matched by an earlier push)",
            blamed, prog.insns[blamed] if blamed is not None else None)
    for u in (LOAD_UNIT, STORE_UNIT):
        if pos[u] < len(queues[u]):
            k = queues[u][pos[u]]
            raise SimError(f"FINISH completed while the {u} unit still had this instruction "
                           f"to execute (expected the compute unit to pop a token from the "
                           f"{u} unit before FINISH)", k, prog.insns[k])
    check_tokens(tokens, prog)


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
