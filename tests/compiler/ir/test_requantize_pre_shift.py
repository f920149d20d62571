"""REQUANTIZE's pre-shift (`ops.RequantAttrs.pre_shift`): ``floor((x + bias + 2**(p-1)) /
2**p)`` before the clamp and the multiply, computed without forming ``x + bias`` (which may
leave int32 when the bias is near its limits, as onnxruntime writes it when it enlarges a weight
scale to fit the bias). Checked against Python integers, and the CPU backend and the
accelerator's ALU steps against the interpreter bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from vtakit.compiler.backend.cpu.lower import lower
from vtakit.compiler.backend.vta.requant import IMM_MAX, IMM_MIN, requant_program
from vtakit.compiler.ir import DType, Graph, Node, Op, const, run
from vtakit.compiler.ir.infer import InferError, infer
from vtakit.compiler.ir.interpreter import requantize
from vtakit.compiler.ir.ops import InputAttrs, RequantAttrs
from vtakit.runtime import GraphExecutor
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


def _graph(shape: tuple[int, ...], a: RequantAttrs, out: DType,
           bias: np.ndarray | None) -> Graph:
    x = Node(Op.INPUT, DType.INT32, shape, attrs=InputAttrs(0), name="x")
    src = (x,) if bias is None else (x, const(bias.astype(np.int32), "bias"))
    d, s = infer(Op.REQUANTIZE, src, a, out)
    return Graph((x,), (Node(Op.REQUANTIZE, d, s, src, a, name="rq"),), ("y",))


def _reference(x: int, b: int, p: int, m: int, s: int, lo: int, hi: int, zp: int,
               clamp: int = 0) -> int:
    """The definition on Python integers (nothing wraps): the pre-shift as a floor division."""
    t = (x + b + (1 << p >> 1)) // (1 << p)
    if clamp:
        t = min(max(t, -clamp), clamp)
    return min(max(((t * m + (1 << s >> 1)) >> s) + zp, lo), hi)


def test_worked_example_of_the_docstring() -> None:
    # pre_shift 8, x = 1000, bias = 2**31 - 5: 1000 + (251 + 128) = 1379, >> 8 = 5,
    # + 8388607 = 8388612, which x + bias (past int32) could not give
    a = RequantAttrs((1,), (0,), 0, I32_MIN, I32_MAX, pre_shift=(8,))
    g = _graph((1,), a, DType.INT32, np.array([(1 << 31) - 5]))
    assert run(g, {"x": np.array([1000], np.int32)})["y"].tolist() == [8388612]


@pytest.mark.parametrize("seed", range(6))
def test_matches_python_integers_with_a_bias_at_the_int32_limits(seed: int) -> None:
    rng = np.random.default_rng(seed)
    c, p = 5, int(rng.integers(1, 31))
    bias = np.array([I32_MAX, I32_MIN, -1, 0, int(rng.integers(I32_MIN, I32_MAX))])
    m, s = int(rng.integers(1, 1 << 15)), int(rng.integers(0, 32))
    # |x| + 1.5 * 2**p below 2**31, and |t1| * m + 2**(s-1) too: the definition's proof
    lim = min((1 << 31) - 3 * (1 << p >> 1) - 1, 1 << 28)
    t1max = ((1 << 31) - 1 - (1 << s >> 1)) // m
    x = rng.integers(-lim, lim, (40, c), endpoint=True)
    x[:4] = [[lim] * c, [-lim] * c, [0] * c, [1] * c]
    zp, lo, hi = 3, -128, 127
    a = RequantAttrs((m,), (s,), 1, lo, hi, zp, pre_shift=(p,))
    got = requantize(x.astype(np.int32), bias.astype(np.int32), a, np.dtype(np.int8))
    for (i, k), v in np.ndenumerate(x):
        t1 = (int(v) + int(bias[k]) + (1 << p >> 1)) // (1 << p)
        if abs(t1) > t1max:
            continue  # the product would wrap: the caller's proof excludes it
        assert got[i, k] == _reference(int(v), int(bias[k]), p, m, s, lo, hi, zp), (i, k)


def _alu(x: np.ndarray, prog, channels: int, cfg) -> np.ndarray:
    """The ALU steps on (rows, channels) int32 accumulators, 32-bit wrapping (docs/isa.md)."""
    cp = prog.table.shape[0] * cfg.block_out
    acc = np.zeros((x.shape[0], cp), np.int64)
    acc[:, :channels] = x
    wrap = lambda v: (v + (1 << 31)) % (1 << 32) - (1 << 31)  # noqa: E731
    for st in prog.steps:
        if st.imm is not None:
            assert IMM_MIN <= st.imm <= IMM_MAX
            b = np.full(cp, st.imm, np.int64)
        else:
            b = prog.table[:, st.row, 0, :].reshape(cp).astype(np.int64)
        op = isa.AluOp(st.op)
        if op == isa.AluOp.ADD:
            acc = wrap(acc + b)
        elif op == isa.AluOp.MUL:
            acc = wrap(acc * b)
        elif op == isa.AluOp.SHR:
            assert (b >= 0).all()
            acc = acc >> np.minimum(b, 31)
        elif op == isa.AluOp.MIN:
            acc = np.minimum(acc, b)
        elif op == isa.AluOp.MAX:
            acc = np.maximum(acc, b)
    return acc[:, :channels]


def _random_attrs(rng: np.random.Generator, c: int, axis: int) -> tuple[RequantAttrs, DType]:
    out = [DType.INT8, DType.UINT8, DType.INT32][int(rng.integers(0, 3))]
    info = np.iinfo(out.np)
    lo, hi = int(info.min), int(info.max)
    if out is DType.INT8 and rng.random() < 0.5:
        lo = 0
    zp = int(rng.integers(0, 20)) if out is DType.UINT8 else 0
    per = rng.random() < 0.5
    n = c if per else 1
    mult = tuple(int(v) for v in rng.integers(0, 1 << 15, n))
    pre = tuple(int(v) for v in rng.integers(0, 31, n if rng.random() < 0.3 else 1))
    clamp = tuple(int(v) for v in rng.integers(1, 1 << 20, n)) if rng.random() < 0.4 else (0,)
    shift = (int(rng.integers(0, 32)),)
    return RequantAttrs(mult, shift, axis, lo, hi, zp, clamp, pre), out


@pytest.mark.parametrize("seed", range(24))
def test_alu_steps_equal_the_definition(seed: int) -> None:
    cfg = preset("default")
    rng = np.random.default_rng(seed)
    c = int(rng.integers(1, 40))
    a, _ = _random_attrs(rng, c, 1)
    kind = seed % 3
    bias = (None if kind == 0 else
            rng.integers(I32_MIN, I32_MAX, c, endpoint=True).astype(np.int32) if kind == 1 else
            rng.integers(-(1 << 20), 1 << 20, c).astype(np.int32))
    x = rng.integers(I32_MIN, I32_MAX, (64, c), endpoint=True).astype(np.int32)
    x[:8] = rng.integers(-3000, 3000, (8, c))
    want = requantize(x, bias, a, np.dtype(np.int32))
    prog = requant_program(a, bias, c, cfg)
    np.testing.assert_array_equal(_alu(x.astype(np.int64), prog, c, cfg), want)
    ops = [isa.AluOp(s.op) for s in prog.steps]
    if any(a.pre_shift):  # ADD (low bits + rounding), SHR, [ADD (high bits)], then the rest
        assert ops[:2] == [isa.AluOp.ADD, isa.AluOp.SHR]


def test_uniform_pre_shift_is_an_immediate_and_the_bias_splits_into_two_rows() -> None:
    a = RequantAttrs((3, 5), (4,), 1, -128, 127, 0, (0,), (10,))
    prog = requant_program(a, np.array([(1 << 31) - 1, -7], np.int32), 2, preset("default"))
    kinds = [(isa.AluOp(s.op).name, "imm" if s.imm is not None else "row") for s in prog.steps]
    assert kinds == [("ADD", "row"), ("SHR", "imm"), ("ADD", "row"), ("MUL", "row"),
                     ("ADD", "imm"), ("SHR", "imm"), ("MAX", "imm"), ("MIN", "imm")]
    assert prog.steps[1].imm == 10


@pytest.mark.parametrize("axis", [0, 1, 3])
def test_cpu_backend_equals_the_interpreter_bit_for_bit(axis: int) -> None:
    rng = np.random.default_rng(100 + axis)
    shape = (2, 5, 3, 4)
    ch = shape[axis]
    x = rng.integers(I32_MIN, I32_MAX, shape, endpoint=True).astype(np.int32)
    x[0] = rng.integers(-40000, 40000, shape[1:])
    for k in range(8):
        a, out = _random_attrs(rng, ch, axis)
        bias = None if k % 4 == 0 else rng.integers(I32_MIN, I32_MAX, ch, endpoint=True)
        if k % 2:
            a = RequantAttrs(a.multiplier, a.shift, axis, a.lo, a.hi, a.zero_point, a.clamp,
                             (int(rng.integers(1, 31)),))
        g = _graph(shape, a, out, bias)
        want = run(g, {"x": x})["y"]
        ex = GraphExecutor(lower(g, threads=2))
        ex.set_input("x", x)
        ex.run()
        got = ex.get_output("y")
        assert got.dtype == want.dtype and np.array_equal(got, want), (k, a)


@pytest.mark.parametrize(("pre", "match"), [
    ((31,), r"REQUANTIZE pre-shifts must be in 0..30, got \[31\]"),
    ((-1,), r"REQUANTIZE pre-shifts must be in 0..30, got \[-1\]"),
    ((1, 2), r"REQUANTIZE pre_shift has 2 values, expected 1 or 4 \(the size of axis 0\)"),
])
def test_bad_pre_shift_says_what_is_wrong(pre, match) -> None:
    x = Node(Op.INPUT, DType.INT32, (4, 2), attrs=InputAttrs(0), name="x")
    with pytest.raises(InferError, match=match):
        infer(Op.REQUANTIZE, (x,), RequantAttrs((1,), (0,), 0, -128, 127, pre_shift=pre),
              DType.INT8)
