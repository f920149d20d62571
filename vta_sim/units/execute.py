"""The load, compute and store units (docs/timing.md §4): take a command, pop its tokens,
occupy the unit for the instruction's closed-form duration (memory transfers through the port),
apply its data effect, push its tokens. The durations and token tables are the hardware's own
(:mod:`vtakit.vta_hw.timing_facts`)."""

from __future__ import annotations

from collections.abc import Generator
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from vtakit.vta_hw.isa import MemType, Opcode
from vtakit.vta_hw.timing_facts import (
    LOAD_SETUP_CYCLES,
    NOP_CYCLES,
    PAD_ONLY_SETUP_CYCLES,
    STORE_SETUP_CYCLES,
    TOKEN_POPS,
    TOKEN_PUSHES,
    alu_cycles,
    gemm_cycles,
    n_uops,
    pad_elems,
)

from .. import memory, semantics
from ..errors import ExecFault, SimError
from ..program import EXEC_UNITS
from .kernel import Proc
from .port import Transfer

if TYPE_CHECKING:
    from ..timing import TimedRun

__all__ = ["unit"]

_OPNAME = {int(o): o.name for o in Opcode}
_MTNAME = {int(m): m.name for m in MemType}


def _mem_insn(run: TimedRun, name: str, proc: Proc,
              insn: dict[str, int]) -> Generator[tuple, Any, None]:
    """A LOAD or STORE from its start cycle."""
    cfg = run.cfg
    mt = insn["memory_type"]
    eb = cfg.elem_bytes(mt)
    x, y = insn["x_size"], insn["y_size"]
    write = insn["opcode"] == Opcode.STORE
    if x == 0:  # NOP: only carries flags
        yield ("delay", NOP_CYCLES)
        return
    nbytes = x * eb
    starts: np.ndarray | int = (insn["dram_base"] * eb if y == 1 else
                                memory.row_starts(insn["dram_base"], y, insn["x_stride"], eb))
    beats = memory.total_beats(starts, nbytes, cfg.bus_bytes)
    if beats:
        # the first request: a STORE's once the first OUT element is read (a registered
        # block RAM), a LOAD's from its DMA's registers
        yield ("delay", STORE_SETUP_CYCLES if write else LOAD_SETUP_CYCLES)
        yield ("xfer", Transfer(name, write, starts, nbytes, beats, proc))
    else:  # y_size == 0: a STORE is a NOP, a LOAD writes only its padding
        yield ("delay", NOP_CYCLES if write else PAD_ONLY_SETUP_CYCLES)
    stats = run.stats
    if write:
        stats.dram_write_bytes += y * nbytes
        return
    pad = pad_elems(insn)
    if pad:
        yield ("delay", pad)
    key = _MTNAME[mt]
    stats.dram_read_bytes[key] = stats.dram_read_bytes.get(key, 0) + y * nbytes


def unit(run: TimedRun, name: str, proc: Proc) -> Generator[tuple, Any, None]:
    """The process of the load, compute or store unit ``name``."""
    kernel = run.kernel
    q = run.cmdq[name]
    ust = run.stats.units[name]
    insns = run.prog.insns
    stats = run.stats
    pops = [(flag, run.tokq[t]) for flag, t in TOKEN_POPS[name]]
    pushes = [(flag, run.tokq[t]) for flag, t in TOKEN_PUSHES[name]]
    macs = run.cfg.macs_per_cycle
    slot = EXEC_UNITS.index(name)
    done = 0
    while True:
        proc.index = None
        k = yield ("take", q)
        proc.index = k
        insn = insns[k]
        t_take = kernel.now
        need = [tq for flag, tq in pops if insn[flag]]
        if need:
            yield ("pop", need)
        start = kernel.now
        op = insn["opcode"]
        try:  # in range before any time is spent on it (a transfer's bursts, a loop's length)
            semantics.check(run.state, run.dram, insn)
        except ExecFault as err:
            raise SimError(str(err), k, insn) from None
        if op == Opcode.LOAD or op == Opcode.STORE:
            yield from _mem_insn(run, name, proc, insn)
        elif op == Opcode.GEMM:
            nu = n_uops(insn)
            stats.gemm_uops += nu
            if not insn["reset"]:
                stats.gemm_macs += nu * macs
            yield ("delay", gemm_cycles(nu))
        elif op == Opcode.ALU:
            nu = n_uops(insn)
            stats.alu_uops += nu
            yield ("delay", alu_cycles(nu, bool(insn["use_imm"])))
        else:  # FINISH
            yield ("delay", NOP_CYCLES)
        end = kernel.now
        try:
            semantics.execute(run.state, run.dram, insn, None if run.deadline is None
                              else partial(run.check_deadline, k))
        except ExecFault as err:
            raise SimError(str(err), k, insn) from None
        key = _OPNAME[op]
        stats.insn_counts[key] = stats.insn_counts.get(key, 0) + 1
        ust.busy_cycles += end - start
        ust.insns += 1
        run.slice(name, k, start, end)
        done += 1
        proc.clock[slot] = done
        out = [tq for flag, tq in pushes if insn[flag]]
        if out:
            yield ("push", out)
        ust.stall_cycles += (start - t_take) + (kernel.now - end)
        if op == Opcode.FINISH:
            run.finish_clock = list(proc.clock)
            run.done_at = kernel.now
            return
