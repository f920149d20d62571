"""REQUANTIZE as a sequence of ALU instructions (bit-exact with `ir.interpreter.requantize`).

Each step of the integer definition (`ir.ops.RequantAttrs`) becomes one ALU operation over the
tile's accumulator rows: with an immediate when the value is the same for every channel and
fits the ALU's signed 16-bit immediate, else with a tensor operand, a row of per-channel values
(one ACC row per output-channel block, loaded with the tile). The ALU computes in 32-bit
two's-complement like the definition, so the result is the same bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig

from ...ir.ops import RequantAttrs

__all__ = ["AluStep", "RequantProgram", "requant_program"]

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
IMM_MIN, IMM_MAX = -(1 << 15), (1 << 15) - 1


@dataclass(frozen=True)
class AluStep:
    """One ALU operation: ``ACC = op(ACC, imm)`` or ``op(ACC, constants row `row`)``."""

    op: isa.AluOp
    imm: int | None = None
    row: int = -1


@dataclass
class RequantProgram:
    """The steps and the per-channel constant table: (channel blocks, rows, batch, block_out)
    int32, row `k` of block `b` holding the values of step operand `k` for that block's
    channels (replicated over the batch)."""

    steps: list[AluStep]
    table: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.table.shape[1])


def _wrap32(v: np.ndarray) -> np.ndarray:
    return (v.astype(np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)


def requant_program(a: RequantAttrs, bias: np.ndarray | None, channels: int,
                    cfg: HwConfig) -> RequantProgram:
    """The ALU steps of ``requantize(x, bias, a)`` over `channels` output channels (padded to
    the block; padding channels get multiplier 0, so they hold the zero point, clipped)."""
    bo = cfg.block_out
    cp = -(-channels // bo) * bo
    rows: list[np.ndarray] = []
    steps: list[AluStep] = []

    def per_channel(vals: tuple[int, ...] | np.ndarray, fill: int) -> np.ndarray:
        v = np.asarray(vals, np.int64).reshape(-1)
        v = np.broadcast_to(v, (channels,)) if v.size == 1 else v
        if v.size != channels:
            raise ValueError(f"requantisation has {v.size} values for {channels} channels")
        return np.concatenate([v, np.full(cp - channels, fill, np.int64)])

    def step(op: isa.AluOp, v: np.ndarray, real: int) -> None:
        head = v[:real]
        if (head == head[0]).all() and IMM_MIN <= int(head[0]) <= IMM_MAX:
            steps.append(AluStep(op, imm=int(head[0])))
            return
        rows.append(v)
        steps.append(AluStep(op, row=len(rows) - 1))

    b = per_channel(bias, 0) if bias is not None else np.zeros(cp, np.int64)
    clamp = np.asarray(getattr(a, "clamp", ()) or (0,), np.int64)
    m = per_channel(a.multiplier, 0)
    s = per_channel(a.shift, 0)
    rnd = np.where(s > 0, np.left_shift(1, np.maximum(s - 1, 0)), 0)
    if clamp.any():
        if b.any():
            step(isa.AluOp.ADD, b, channels)
        c = per_channel(clamp, 0)
        step(isa.AluOp.MIN, np.where(c > 0, c, INT32_MAX), channels)
        step(isa.AluOp.MAX, np.where(c > 0, -c, INT32_MIN), channels)
        b = np.zeros(cp, np.int64)
    if not (m[:channels] == 1).all():
        step(isa.AluOp.MUL, m, channels)
    # (x + b) * m + r == x * m + (b * m + r) in 32-bit wrap-around arithmetic: without a clamp
    # between them, the bias joins the rounding constant and one ADD does both
    offset = _wrap32(b * m + rnd)
    if offset.any():
        step(isa.AluOp.ADD, offset, channels)
    if s.any():
        step(isa.AluOp.SHR, s, channels)
    if a.zero_point:
        steps.append(AluStep(isa.AluOp.ADD, imm=int(a.zero_point)))
    if a.lo > INT32_MIN:
        step(isa.AluOp.MAX, np.full(cp, a.lo, np.int64), channels)
    if a.hi < INT32_MAX:
        step(isa.AluOp.MIN, np.full(cp, a.hi, np.int64), channels)
    nb = cp // bo
    table = np.zeros((nb, len(rows), cfg.batch, bo), np.int32)
    for k, r in enumerate(rows):
        table[:, k] = r.astype(np.int64).astype(np.int32).reshape(nb, 1, bo)
    return RequantProgram(steps, table)
