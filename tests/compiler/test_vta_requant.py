"""REQUANTIZE as ALU steps (compiler/backend/vta/requant.py) equals the integer definition
(`ir.interpreter.requantize`) bit for bit: random multipliers, shifts, biases, clamps, zero
points and output ranges, the ALU simulated step by step in 32-bit arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from vtakit.compiler.backend.vta.requant import IMM_MAX, IMM_MIN, requant_program
from vtakit.compiler.ir.interpreter import requantize
from vtakit.compiler.ir.ops import RequantAttrs
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset

CFG = preset("default")


def _wrap(v):
    return (v.astype(np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)


def _alu(x: np.ndarray, prog, channels: int) -> np.ndarray:
    """x: (rows, channels) int32 accumulators -> the ALU's result, per docs/isa.md."""
    bo = CFG.block_out
    cp = prog.table.shape[0] * bo
    acc = np.zeros((x.shape[0], cp), np.int64)
    acc[:, :channels] = x
    for st in prog.steps:
        if st.imm is not None:
            assert IMM_MIN <= st.imm <= IMM_MAX
            operand = np.full(cp, st.imm, np.int64)
        else:
            operand = prog.table[:, st.row, 0, :].reshape(cp).astype(np.int64)
        op = isa.AluOp(st.op)
        if op == isa.AluOp.ADD:
            acc = _wrap(acc + operand)
        elif op == isa.AluOp.MUL:
            acc = _wrap(acc * operand)
        elif op == isa.AluOp.SHR:
            acc = np.where(operand >= 0, acc >> np.maximum(operand, 0),
                           _wrap(acc << np.maximum(-operand, 0)))
        elif op == isa.AluOp.MIN:
            acc = np.minimum(acc, operand)
        elif op == isa.AluOp.MAX:
            acc = np.maximum(acc, operand)
    return acc[:, :channels]


@pytest.mark.parametrize("seed", range(40))
def test_alu_steps_equal_the_definition(seed):
    rng = np.random.default_rng(seed)
    c = int(rng.integers(1, 40))
    per = rng.random() < 0.7
    n_m = c if per else 1
    shift = int(rng.integers(0, 31))
    mult = tuple(int(v) for v in rng.integers(0, 1 << 15, n_m))
    clamp = tuple(int(v) for v in rng.integers(1, 1 << 20, n_m)) if rng.random() < 0.5 \
        else (0,)
    out = rng.choice(["i8", "u8", "i32"])
    lo, hi = {"i8": (-128, 127), "u8": (0, 255), "i32": (-(1 << 31), (1 << 31) - 1)}[out]
    if out == "i8" and rng.random() < 0.5:
        lo = 0  # ReLU
    zp = int(rng.integers(0, 20)) if out == "u8" else 0
    a = RequantAttrs(mult, (shift,), 1, lo, hi, zp, clamp)
    bias = rng.integers(-(1 << 20), 1 << 20, c).astype(np.int32) if rng.random() < 0.8 \
        else None
    x = rng.integers(-(1 << 31), (1 << 31) - 1, (64, c), dtype=np.int64).astype(np.int32)
    x[:8] = rng.integers(-3000, 3000, (8, c))
    want = requantize(x, bias, a, np.dtype(np.int32))
    prog = requant_program(a, bias, c, CFG)
    np.testing.assert_array_equal(_alu(x, prog, c), want)


def test_uniform_small_values_are_immediates_and_per_channel_values_rows():
    a = RequantAttrs((3, 5), (4,), 1, -128, 127, 0, (0,))
    prog = requant_program(a, np.array([1, 2], np.int32), 2, CFG)
    kinds = [(isa.AluOp(s.op).name, "imm" if s.imm is not None else "row") for s in prog.steps]
    assert kinds == [("MUL", "row"), ("ADD", "row"), ("SHR", "imm"), ("MAX", "imm"),
                     ("MIN", "imm")]
    assert prog.table.shape == (1, 2, 1, 16)
