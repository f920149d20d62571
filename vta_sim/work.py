"""What an instruction asks of its unit, in cycles, in closed form (docs/timing.md §4): the
functional model's cycle limit and both models' cycle-limit messages.

Per instruction, :func:`stream_min_cycles` is a lower bound on the cycles the timed model keeps
the instruction's unit busy (exact for GEMM and ALU); per unit, their sum is a lower bound on
the timed run's cycles, since a unit runs its instructions one at a time and FINISH completes
after every one of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import MemType, Opcode
from vtakit.vta_hw.timing_facts import (
    ALU_PIPELINE_CYCLES,
    GEMM_PIPELINE_CYCLES,
    NOP_CYCLES,
    n_uops,
    pad_elems,
)

from .program import EXEC_UNITS, Program

__all__ = ["stream_min_cycles", "min_cycles", "stream_cost", "unit_min_cycles",
           "describe_work"]

_FIELDS = ("opcode", "uop_bgn", "uop_end", "iter_out", "iter_in", "use_imm", "memory_type",
           "dram_base", "x_size", "y_size", "x_stride", "y_pad_0", "y_pad_1", "x_pad_0",
           "x_pad_1")


def stream_min_cycles(cfg: HwConfig, fields: Mapping[str, np.ndarray]) -> np.ndarray:
    """A lower bound on the cycles each instruction of a decoded stream occupies its unit
    (docs/timing.md §4), as an int64 array, in closed form and without a Python loop.

    ``fields`` maps field names to int64 arrays (an :class:`~vtakit.vta_hw.isa.DecodedStream`:
    0 where a kind has no such field). GEMM: ``gemm_cycles(n)`` and ALU: ``alu_cycles(n,
    use_imm)`` of its ``n`` micro-op iterations, exactly the timed model's durations. LOAD and
    STORE: at least 1, else the beats of its rows (exact when every row starts at the same
    offset in a bus word; otherwise ``ceil(row bytes / bus bytes)`` per row, which no row can
    take less than) plus a LOAD's padding elements; the timed model adds its setup cycles and
    waits on the memory port. Worked example: ``ALU(uop_end=8192, iter_out=16383,
    iter_in=16383)`` is ``2 * 8192 * 16383**2 + 5 = 4397509656581`` cycles.
    """
    f = {k: np.asarray(fields[k], dtype=np.int64) for k in _FIELDS}
    op = f["opcode"]
    n = np.maximum(0, f["uop_end"] - f["uop_bgn"]) * f["iter_out"] * f["iter_in"]
    gemm = np.where(n > 0, n + GEMM_PIPELINE_CYCLES, NOP_CYCLES)
    alu = np.where(n > 0, n * np.where(f["use_imm"] != 0, 1, 2) + ALU_PIPELINE_CYCLES,
                   NOP_CYCLES)
    eb_of = np.array([cfg.elem_bytes(m) for m in MemType], dtype=np.int64)
    is_mem = (op == Opcode.LOAD) | (op == Opcode.STORE)
    eb = eb_of[np.where(is_mem, np.clip(f["memory_type"], 0, eb_of.size - 1), 0)]
    x, y, bus = f["x_size"], f["y_size"], cfg.bus_bytes
    nbytes = x * eb
    offset = (f["dram_base"] * eb) % bus  # of the first row in its bus word
    same_offset = (y <= 1) | ((f["x_stride"] * eb) % bus == 0)
    per_row = np.where(same_offset, (offset + nbytes - 1) // bus + 1, -(-nbytes // bus))
    beats = np.where(x > 0, y * per_row, 0)
    pad = ((f["y_pad_0"] + y + f["y_pad_1"]) * (f["x_pad_0"] + x + f["x_pad_1"]) - y * x)
    mem = np.where(x > 0, np.maximum(NOP_CYCLES, beats + np.where(op == Opcode.LOAD, pad, 0)),
                   NOP_CYCLES)
    return np.select([op == Opcode.GEMM, op == Opcode.ALU, is_mem], [gemm, alu, mem],
                     NOP_CYCLES).astype(np.int64)


def stream_cost(cfg: HwConfig, prog: Program) -> np.ndarray:
    """:func:`stream_min_cycles` of every instruction of ``prog`` (from its decoded arrays)."""
    return stream_min_cycles(cfg, prog.fields if prog.fields is not None
                             else _fields_of(prog.insns))


def _fields_of(insns: Sequence[Mapping[str, int]]) -> dict[str, np.ndarray]:
    return {k: np.array([int(i.get(k, 0)) for i in insns], dtype=np.int64) for k in _FIELDS}


def min_cycles(cfg: HwConfig, insn: Mapping[str, int]) -> int:
    """:func:`stream_min_cycles` of one decoded instruction."""
    return int(stream_min_cycles(cfg, _fields_of([insn]))[0])


def unit_min_cycles(cfg: HwConfig, prog: Program) -> dict[str, int]:
    """Per unit, the sum of :func:`min_cycles` over its instructions: a lower bound on the
    cycles of the timed run of ``prog`` (each unit runs its instructions one at a time, and
    FINISH completes after all of them)."""
    cost = stream_cost(cfg, prog).tolist()  # Python ints: the sums may pass 2^63
    return {u: sum(c for c, v in zip(cost, prog.unit) if v == u) for u in EXEC_UNITS}


def describe_work(cfg: HwConfig, insn: Mapping[str, int]) -> str:
    """What one instruction asks of its unit, for messages: ``at least 4397509656581 cycles
    (8192 micro-ops x iter_out 16383 x iter_in 16383 = 2198754828288 micro-op iterations)``."""
    cycles = min_cycles(cfg, insn)
    op = insn["opcode"]
    if op in (Opcode.GEMM, Opcode.ALU):
        nu = max(0, insn["uop_end"] - insn["uop_bgn"])
        what = (f"{nu} micro-ops x iter_out {insn['iter_out']} x iter_in {insn['iter_in']} "
                f"= {n_uops(insn)} micro-op iterations")
    elif op in (Opcode.LOAD, Opcode.STORE) and insn["x_size"]:
        what = (f"{insn['y_size']} rows of {insn['x_size']} elements"
                + (f" and {pad_elems(insn)} padding elements" if op == Opcode.LOAD else ""))
    else:
        return f"{cycles} cycle{'s' if cycles != 1 else ''}"
    return f"at least {cycles} cycles ({what})"
