"""The load, compute and store units (docs/timing.md §4): take a command, pop its tokens,
occupy the unit for the instruction's closed-form duration (memory transfers through the port),
apply its data effect, push its tokens."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from vtakit.vta_hw.isa import MemType, Opcode

from .. import memory, semantics
from ..errors import DeviceError, ExecFault
from .kernel import Proc
from .port import Transfer

if TYPE_CHECKING:
    from ..timing import TimedRun

__all__ = ["unit", "gemm_cycles", "alu_cycles", "pad_elems", "n_uops",
           "GEMM_PIPELINE_CYCLES", "ALU_PIPELINE_CYCLES", "STORE_SETUP_CYCLES", "POPS", "PUSHES"]

#: Cycles a GEMM adds to its micro-op count: decode, uop read, operand read, multiply, adder
#: tree + ACC write.
GEMM_PIPELINE_CYCLES = 5
#: Cycles an ALU instruction adds to its micro-op issue cycles: decode, uop read, ACC read,
#: ALU, ACC write.
ALU_PIPELINE_CYCLES = 5
#: Cycles between a STORE's start and its first port request: the OUT buffer is a block RAM
#: with a registered read port, so the first beat's data exists one cycle after the start.
STORE_SETUP_CYCLES = 1

#: (flag, token queue) pairs each unit pops and pushes (vta-reference.md §1).
POPS = {"load": (("pop_next", "g2l"),),
        "compute": (("pop_prev", "l2g"), ("pop_next", "s2g")),
        "store": (("pop_prev", "g2s"),)}
PUSHES = {"load": (("push_next", "l2g"),),
          "compute": (("push_prev", "g2l"), ("push_next", "g2s")),
          "store": (("push_prev", "s2g"),)}

_OPNAME = {int(o): o.name for o in Opcode}
_MTNAME = {int(m): m.name for m in MemType}


def n_uops(insn: dict[str, int]) -> int:
    """Micro-op iterations of a GEMM/ALU: ``max(0, uop_end - uop_bgn) * iter_out * iter_in``."""
    return max(0, insn["uop_end"] - insn["uop_bgn"]) * insn["iter_out"] * insn["iter_in"]


def gemm_cycles(n: int) -> int:
    """Cycles of a GEMM with ``n`` micro-op iterations."""
    return n + GEMM_PIPELINE_CYCLES if n > 0 else 1


def alu_cycles(n: int, use_imm: bool) -> int:
    """Cycles of an ALU instruction: 1 (immediate) or 2 (tensor) cycles per micro-op + fill."""
    return n * (1 if use_imm else 2) + ALU_PIPELINE_CYCLES if n > 0 else 1


def pad_elems(insn: dict[str, int]) -> int:
    """Zero elements a LOAD writes around its block (one SRAM write per cycle each)."""
    rows = insn["y_pad_0"] + insn["y_size"] + insn["y_pad_1"]
    cols = insn["x_pad_0"] + insn["x_size"] + insn["x_pad_1"]
    return rows * cols - insn["y_size"] * insn["x_size"]


def _mem_insn(run: TimedRun, name: str, proc: Proc,
              insn: dict[str, int]) -> Generator[tuple, Any, None]:
    """A LOAD or STORE from its start cycle."""
    cfg = run.cfg
    mt = insn["memory_type"]
    eb = semantics.elem_bytes(cfg, mt)
    x, y = insn["x_size"], insn["y_size"]
    write = insn["opcode"] == Opcode.STORE
    if x == 0:  # NOP: only carries flags
        yield ("delay", 1)
        return
    nbytes = x * eb
    starts: np.ndarray | int = (insn["dram_base"] * eb if y == 1 else
                                memory.row_starts(insn["dram_base"], y, insn["x_stride"], eb))
    beats = memory.total_beats(starts, nbytes, cfg.bus_bytes)
    if beats:
        if write:  # one cycle to read the first OUT element before the port may take it
            yield ("delay", STORE_SETUP_CYCLES)
        yield ("xfer", Transfer(name, write, starts, nbytes, beats, proc))
    else:
        yield ("delay", 1)
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
    pops = [(flag, run.tokq[t]) for flag, t in POPS[name]]
    pushes = [(flag, run.tokq[t]) for flag, t in PUSHES[name]]
    macs = run.cfg.macs_per_cycle
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
            yield ("delay", 1)
        end = kernel.now
        try:
            semantics.execute(run.state, run.dram, insn)
        except ExecFault as err:
            raise DeviceError(str(err), k, insn) from None
        key = _OPNAME[op]
        stats.insn_counts[key] = stats.insn_counts.get(key, 0) + 1
        ust.busy_cycles += end - start
        ust.insns += 1
        run.slice(name, k, start, end)
        out = [tq for flag, tq in pushes if insn[flag]]
        if out:
            yield ("push", out)
        ust.stall_cycles += (start - t_take) + (kernel.now - end)
        if op == Opcode.FINISH:
            run.done_at = kernel.now
            return
