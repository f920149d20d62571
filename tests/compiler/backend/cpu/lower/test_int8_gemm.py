"""CONV_INTEGER / MATMUL_INTEGER + REQUANTIZE lowered as one int8 GEMM with the requantisation in
its epilogue: bit-identical to the interpreter, and the fused kernel is the one that runs."""

from __future__ import annotations

import numpy as np
import pytest

from vtakit.compiler.ir import DType, Graph, Node, Op, const, infer, run
from vtakit.compiler.ir import ops as o
from vtakit.compiler.lowering import lower_graph
from vtakit.runtime import GraphExecutor


def mk(op: Op, *src: Node, attrs: o.Attrs = o.NO_ATTRS, dtype: DType | None = None,
       name: str = "") -> Node:
    d, s = infer(op, src, attrs, dtype)
    return Node(op, d, s, src, attrs, name)


def _requant(acc: Node, axis: int, out: DType, rng, lo: int = -128, hi: int = 127,
             clamp: bool = False) -> Node:
    """Random multipliers and shift; with `clamp`, per-channel clamps (0 on a few: none) small
    enough to bite."""
    ch = acc.shape[axis]
    c = tuple(int(v) for v in rng.integers(0, 1 << 16, ch) * (rng.random(ch) < 0.8)) \
        if clamp else (0,)
    a = o.RequantAttrs(tuple(int(v) for v in rng.integers(1, 1 << 15, ch)),
                       (int(rng.integers(10, 24)),), axis, lo, hi, clamp=c)
    bias = const(rng.integers(-(1 << 16), 1 << 16, ch).astype(np.int32), "bias")
    return mk(Op.REQUANTIZE, acc, bias, attrs=a, dtype=out, name="y")


def _check(y: Node, x: Node, xv: np.ndarray, threads: int = 2) -> None:
    g = Graph((x,), (y,), ("y",))
    want = run(g, {"x": xv})["y"]
    ex = GraphExecutor(lower_graph(g, "cpu", threads=threads)[0])
    ex.set_input("x", xv)
    ex.run()
    assert np.array_equal(ex.get_output("y"), want)
    assert "gemm_s8" in {p.op for p in ex.profile()}  # the fused kernel ran


@pytest.mark.parametrize(("shape", "cout", "k", "stride", "pad", "dil"), [
    ((1, 16, 14, 14), 32, 3, 1, 1, 1),
    ((2, 3, 23, 17), 20, 7, 2, 3, 1),
    ((1, 64, 8, 8), 128, 1, 2, 0, 1),
    ((1, 5, 12, 12), 7, 3, 1, 2, 2),
])
@pytest.mark.parametrize("out", [DType.INT8, DType.INT32, DType.UINT8])
@pytest.mark.parametrize("clamp", [False, True], ids=["", "clamp"])
def test_conv(shape, cout, k, stride, pad, dil, out: DType, clamp: bool) -> None:
    rng = np.random.default_rng(sum(shape) + cout)
    x = Node(Op.INPUT, DType.INT8, shape, attrs=o.InputAttrs(0), name="x")
    w = const(rng.integers(-128, 128, (cout, shape[1], k, k)).astype(np.int8), "w")
    at = o.ConvAttrs((k, k), (stride, stride), (pad,) * 4, (dil, dil))
    acc = mk(Op.CONV_INTEGER, x, w, const(np.int8(0)), const(np.int8(0)), attrs=at)
    lo, hi = (0, 127) if out is DType.UINT8 else (-128, 127) if out is DType.INT8 else \
        (-(1 << 31), (1 << 31) - 1)
    xv = rng.integers(-128, 128, shape).astype(np.int8)
    _check(_requant(acc, 1, out, rng, lo, hi, clamp), x, xv)


@pytest.mark.parametrize(("shape", "n"), [((1, 784), 128), ((3, 10, 64), 48), ((7, 5), 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_matmul(shape, n: int, threads: int) -> None:
    rng = np.random.default_rng(n + threads)
    x = Node(Op.INPUT, DType.INT8, shape, attrs=o.InputAttrs(0), name="x")
    w = const(rng.integers(-128, 128, (shape[-1], n)).astype(np.int8), "w")
    acc = mk(Op.MATMUL_INTEGER, x, w, const(np.int8(0)), const(np.int8(0)))
    xv = rng.integers(-128, 128, shape).astype(np.int8)
    _check(_requant(acc, len(shape) - 1, DType.INT8, rng, 0, 100), x, xv, threads)
    _check(_requant(acc, len(shape) - 1, DType.INT8, rng, 0, 100, True), x, xv, threads)


def test_wrapping_multiplier_is_exact() -> None:
    # A multiplier that makes the 32-bit product wrap: the kernel must wrap exactly as the ALU.
    rng = np.random.default_rng(9)
    x = Node(Op.INPUT, DType.INT8, (4, 64), attrs=o.InputAttrs(0), name="x")
    w = const(np.full((64, 16), 127, np.int8), "w")
    acc = mk(Op.MATMUL_INTEGER, x, w, const(np.int8(0)), const(np.int8(0)))
    a = o.RequantAttrs(((1 << 31) - 1,), (31,), 1, -128, 127)
    y = mk(Op.REQUANTIZE, acc, attrs=a, dtype=DType.INT8, name="y")
    _check(y, x, rng.integers(-128, 128, (4, 64)).astype(np.int8))
