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
                    cfg: HwConfig, acc_bound: np.ndarray | int | None = None
                    ) -> RequantProgram:
    """The ALU steps of ``requantize(x, bias, a)`` over `channels` output channels (padded to
    the block; padding channels get multiplier 0, so they hold the zero point, clipped).

    ``acc_bound`` (per channel, or one for all) bounds ``|x + bias|`` as the integer graph
    computes it (exactly, before any wrap-around) for every input the layer can see; with it,
    an output zero point joins the rounding constant where that provably never wraps:
    ``((t*m + r) >> s) + z == (t*m + r + (z << s)) >> s`` while ``|t*m| + |r| + |z << s| <
    2**31`` (one ALU operation less per output row)."""
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
    pre = per_channel(getattr(a, "pre_shift", (0,)), 0)
    if pre.any():
        # floor((x + b + 2**(p-1)) / 2**p) without forming x + b: ADD (low bits and rounding),
        # SHR, ADD (high bits); the bias is then spent, as with a clamp
        step(isa.AluOp.ADD, (b & ((1 << pre) - 1)) + np.where(
            pre > 0, np.left_shift(1, np.maximum(pre - 1, 0)), 0), channels)
        step(isa.AluOp.SHR, pre, channels)
        if (b >> pre).any():
            step(isa.AluOp.ADD, b >> pre, channels)
        b = np.zeros(cp, np.int64)
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
    z = int(a.zero_point)
    if z and s.any() and _zero_point_folds(acc_bound, clamp, m, rnd, s, z, channels,
                                           bool(pre.any())):
        offset = _wrap32(offset + (np.int64(z) << s))
        z = 0
    if offset.any():
        step(isa.AluOp.ADD, offset, channels)
    if s.any():
        step(isa.AluOp.SHR, s, channels)
    if z:
        steps.append(AluStep(isa.AluOp.ADD, imm=z))
    if a.lo > INT32_MIN:
        step(isa.AluOp.MAX, np.full(cp, a.lo, np.int64), channels)
    if a.hi < INT32_MAX:
        step(isa.AluOp.MIN, np.full(cp, a.hi, np.int64), channels)
    nb = cp // bo
    table = np.zeros((nb, len(rows), cfg.batch, bo), np.int32)
    for k, r in enumerate(rows):
        table[:, k] = r.astype(np.int64).astype(np.int32).reshape(nb, 1, bo)
    return RequantProgram(steps, table)


def _zero_point_folds(acc_bound: np.ndarray | int | None, clamp: np.ndarray, m: np.ndarray,
                      rnd: np.ndarray, s: np.ndarray, z: int, channels: int,
                      pre_shifted: bool) -> bool:
    """Whether ``t*m + r + (z << s)`` stays inside int32 for every value ``t`` the multiply
    can see (then adding the zero point before the shift is the same as after it): ``|t|`` is
    at most `acc_bound`, and at most the clamp where there is one."""
    if acc_bound is None or pre_shifted:
        return False
    t = [int(v) for v in np.broadcast_to(np.abs(np.asarray(acc_bound, np.int64)).reshape(-1),
                                         (channels,))]
    c = np.broadcast_to(clamp.reshape(-1), (channels,))
    for k in range(channels):
        tk = min(t[k], int(c[k])) if c[k] > 0 else t[k]
        if tk * abs(int(m[k])) + abs(int(rnd[k])) + (abs(z) << int(s[k])) >= 1 << 31:
            return False
    return True
