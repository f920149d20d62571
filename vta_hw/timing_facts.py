"""The constants and closed forms of the timing contract (docs/timing.md), in one place.

Pure Python (no Amaranth): the RTL (:mod:`vtakit.vta_hw`) is built from these numbers and the
simulator (:mod:`vtakit.vta_sim`) replays them, so the two cannot drift apart. Sizes that depend
on the configuration (``L``, ``W``, ``M``, queue depths, element bytes) are :class:`HwConfig`
properties; what is here is fixed by this implementation.

Worked example (docs/timing.md §5 B): a GEMM of ``n = 64`` micro-op iterations takes
``gemm_cycles(64) = 64 + GEMM_PIPELINE_CYCLES = 70`` cycles; an ALU ADD over the same loop takes
``alu_cycles(64, use_imm=False) = 2*64 + ALU_PIPELINE_CYCLES = 133``.
"""

from __future__ import annotations

from collections.abc import Mapping

from vtakit.vta_hw.isa import MemType

__all__ = [
    "PORT_PRIORITY", "READ_CLIENTS", "WRITE_CLIENT", "GEMM_PIPELINE_CYCLES",
    "ALU_PIPELINE_CYCLES", "LOAD_SETUP_CYCLES", "STORE_SETUP_CYCLES", "NOP_CYCLES",
    "PAD_ONLY_SETUP_CYCLES", "LOAD_UNIT_MEMORY_TYPES", "TOKEN_POPS", "TOKEN_PUSHES", "n_uops",
    "gemm_cycles", "alu_cycles", "pad_elems",
]

#: Clients of the shared memory port, highest priority first (§2): fetch (instruction reads),
#: compute (LOAD UOP / ACC / ACC_8BIT), load (LOAD INP / WGT), store (STORE OUT writes).
PORT_PRIORITY: tuple[str, ...] = ("fetch", "compute", "load", "store")
#: The clients that read, in priority order, and the one that writes (it comes last).
READ_CLIENTS: tuple[str, ...] = PORT_PRIORITY[:-1]
WRITE_CLIENT = PORT_PRIORITY[-1]

#: Cycles a GEMM adds to its micro-op iterations (``s + n + 6``): an iteration issued at ``t``
#: reads its micro-op at ``t - 1`` and forms its indices at ``t``; the wider cores' registered
#: datapath registers the INP and WGT indices (the micro-op RAM, the index adders and the
#: route to the WGT buffer's block RAMs would otherwise fall in one cycle: the ECP5 clock),
#: reads INP and WGT at ``t + 1``, multiplies, sums and reads ACC over the next cycles, adds
#: at ``t + 5`` and writes at ``t + 6``; the instruction finishes 6 cycles after its last
#: issue, with that write.
GEMM_PIPELINE_CYCLES = 6
#: The same for ALU instructions: ``s + n + 5`` with an immediate, ``s + 2n + 5`` with a tensor
#: operand (one issue every two cycles, the last at ``s + 2n - 1``).
ALU_PIPELINE_CYCLES = 5
#: Cycles between the start of a LOAD that reads DRAM (``x_size > 0``, ``y_size > 0``) and its
#: first memory-port request: the read DMA plans the walk in the cycle after the start, from
#: the unit's instruction register (a row's beats, the first burst's length, whether it ends
#: the row), and requests from registers only. Otherwise the start cycle's choice of
#: instruction, or a row's length through its adders, would run into the request and the
#: port's grant in one cycle, across the core (the ECP5 clock).
LOAD_SETUP_CYCLES = 2
#: Cycles between a STORE's start (``x_size > 0``, ``y_size > 0``) and its first memory-port
#: request: as a LOAD's, the walk is planned in the cycle after the start from the unit's
#: instruction register, and the request comes from registers only (the OUT buffer's
#: registered read has the first beat's data from the cycle after the start).
STORE_SETUP_CYCLES = 2
#: Duration of an instruction with nothing to do: FINISH, LOAD/STORE with ``x_size = 0``, GEMM
#: or ALU with ``n = 0``, STORE with ``y_size = 0``.
NOP_CYCLES = 1
#: A LOAD with ``x_size > 0`` and ``y_size = 0`` moves no data and starts writing its padding
#: this many cycles after its start (it finishes at ``s + 2 + P``): the read DMA chooses the
#: first padding segment in the cycle after the start, from the unit's instruction register
#: (as it forms a transfer's first SRAM index), not from the start cycle's choice of
#: instruction.
PAD_ONLY_SETUP_CYCLES = 2

#: LOADs of these memory types go to the load unit's command queue; every other LOAD (UOP, ACC,
#: ACC_8BIT), GEMM, ALU and FINISH to the compute unit's, STORE to the store unit's (§3).
LOAD_UNIT_MEMORY_TYPES: tuple[MemType, ...] = (MemType.INP, MemType.WGT)

#: (flag, token queue) pairs each unit pops and pushes (§4's table).
TOKEN_POPS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "load": (("pop_next", "g2l"),),
    "compute": (("pop_prev", "l2g"), ("pop_next", "s2g")),
    "store": (("pop_prev", "g2s"),),
}
TOKEN_PUSHES: Mapping[str, tuple[tuple[str, str], ...]] = {
    "load": (("push_next", "l2g"),),
    "compute": (("push_prev", "g2l"), ("push_next", "g2s")),
    "store": (("push_prev", "s2g"),),
}


def n_uops(insn: Mapping[str, int]) -> int:
    """Micro-op iterations of a GEMM/ALU: ``max(0, uop_end - uop_bgn) * iter_out * iter_in``."""
    return max(0, insn["uop_end"] - insn["uop_bgn"]) * insn["iter_out"] * insn["iter_in"]


def gemm_cycles(n: int) -> int:
    """Cycles of a GEMM with ``n`` micro-op iterations (``reset`` has the same issue rate)."""
    return n + GEMM_PIPELINE_CYCLES if n > 0 else NOP_CYCLES


def alu_cycles(n: int, use_imm: bool) -> int:
    """Cycles of an ALU instruction: 1 (immediate) or 2 (tensor) cycles per micro-op + fill."""
    return n * (1 if use_imm else 2) + ALU_PIPELINE_CYCLES if n > 0 else NOP_CYCLES


def pad_elems(insn: Mapping[str, int]) -> int:
    """Zero elements a LOAD writes around its block, one SRAM element per cycle (§4's ``P``)."""
    rows = insn["y_pad_0"] + insn["y_size"] + insn["y_pad_1"]
    cols = insn["x_pad_0"] + insn["x_size"] + insn["x_pad_1"]
    return rows * cols - insn["y_size"] * insn["x_size"]
