"""The IR extensions the passes produce: epilogues and FUSED_ELEMENTWISE, in the interpreter
(their executable specification), the verifier and the printer."""

from __future__ import annotations

import numpy as np
import pytest

from vtakit.compiler.errors import VerifyError
from vtakit.compiler.ir import DType, Graph, Node, Op, const, format_graph, run, verify
from vtakit.compiler.ir import ops as o
from vtakit.compiler.ir.interpreter import erf

RNG = np.random.default_rng(11)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


ACTIVATIONS = [
    (o.Epilogue("relu"), lambda y: np.maximum(y, 0)),
    (o.Epilogue("clip", clip_min=-0.5, clip_max=0.5), lambda y: np.clip(y, -0.5, 0.5)),
    (o.Epilogue("clip", clip_max=0.0), lambda y: np.minimum(y, 0)),
    (o.Epilogue("leaky_relu", alpha=0.2), lambda y: np.where(y >= 0, y, 0.2 * y)),
    (o.Epilogue("sigmoid"), _sigmoid),
    (o.Epilogue("tanh"), np.tanh),
    (o.Epilogue("gelu"), lambda y: 0.5 * y * (1 + erf(y / np.sqrt(2)))),
]


@pytest.mark.parametrize("ep, act", ACTIVATIONS)
def test_conv_epilogue_is_act_of_conv_plus_bias_plus_residual(ir, ep, act):
    x = ir.inp("x", (1, 2, 4, 4))
    r = ir.inp("r", (1, 3, 4, 4), index=1)
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    base = o.ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    plain = Graph((x,), (ir.node(Op.CONV, x, const(w), const(b), attrs=base),), ("y",))
    attrs = o.ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1),
                        epilogue=o.Epilogue(ep.activation, ep.alpha, ep.clip_min, ep.clip_max,
                                            residual=True))
    fused = Graph((x, r), (ir.node(Op.CONV, x, const(w), const(b), r, attrs=attrs),), ("y",))
    feeds = ir.feeds_for(fused)
    (y,) = run(plain, {"x": feeds["x"]}).values()
    (got,) = run(verify(fused), feeds).values()
    np.testing.assert_allclose(got, act(y + feeds["r"]), rtol=1e-6, atol=1e-6)


def test_gemm_and_matmul_epilogues(ir):
    a = ir.inp("a", (2, 3))
    r = ir.inp("r", (2, 4), index=1)
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    c = RNG.standard_normal(4).astype(np.float32)
    ep = o.Epilogue("relu", residual=True)
    gemm = ir.node(Op.GEMM, a, const(w), const(c), r,
                   attrs=o.GemmAttrs(alpha=2.0, beta=0.5, trans_b=True, epilogue=ep))
    mm = ir.node(Op.MATMUL, a, const(w.T.copy()), const(c), r, attrs=o.MatMulAttrs(ep))
    g = verify(Graph((a, r), (gemm, mm), ("gemm", "mm")))
    feeds = ir.feeds_for(g)
    out = run(g, feeds)
    y = feeds["a"] @ w.T
    np.testing.assert_allclose(out["gemm"], np.maximum(2 * y + 0.5 * c + feeds["r"], 0),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["mm"], np.maximum(y + c + feeds["r"], 0), rtol=1e-6,
                               atol=1e-6)


def test_verifier_checks_operand_counts_and_residual_shape(ir):
    x = ir.inp("x", (2, 3))
    w = const(np.ones((3, 4), np.float32))
    b = const(np.ones(4, np.float32))
    ep = o.MatMulAttrs(o.Epilogue(residual=True))
    bad_shape = Node(Op.MATMUL, DType.FLOAT32, (2, 4), (x, w, b, x), ep)
    with pytest.raises(VerifyError, match="residual"):
        verify(Graph((x,), (bad_shape,), ("y",)))
    four_without_flag = Node(Op.MATMUL, DType.FLOAT32, (2, 4), (x, w, b, b), o.MatMulAttrs())
    with pytest.raises(VerifyError, match="residual"):
        verify(Graph((x,), (four_without_flag,), ("y",)))
    bias_without_attrs = Node(Op.MATMUL, DType.FLOAT32, (2, 4), (x, w, b))
    with pytest.raises(VerifyError, match="MatMulAttrs"):
        verify(Graph((x,), (bias_without_attrs,), ("y",)))
    pool_with_epilogue = o.ConvAttrs((1,), (1,), (0, 0), (1,), epilogue=o.Epilogue("relu"))
    i = ir.inp("i", (1, 1, 3), dtype=DType.INT8)
    ci = Node(Op.CONV_INTEGER, DType.INT32, (1, 1, 3),
              (i, const(np.zeros((1, 1, 1), np.int8)), const(np.int8(0)), const(np.int8(0))),
              pool_with_epilogue)
    with pytest.raises(VerifyError, match="epilogue"):
        verify(Graph((i,), (ci,), ("y",)))


def test_fused_elementwise_broadcasts_and_matches_the_unfused_ops(ir):
    x = ir.inp("x", (2, 3))
    b = const(RNG.standard_normal(3).astype(np.float32))
    program = (("add", (0, 1), ()), ("hard_sigmoid", (2,), (0.2, 0.5)), ("mul", (3,), (3.0,)),
               ("clip", (4,), (-np.inf, 2.0)), ("pow", (5, 0), ()))
    fused = Node(Op.FUSED_ELEMENTWISE, DType.FLOAT32, (2, 3), (x, b),
                 o.FusedElementwiseAttrs(program))
    g = verify(Graph((x,), (fused,), ("y",)))
    xv = np.abs(ir.feeds_for(g)["x"]) + 0.5
    (got,) = run(g, {"x": xv}).values()
    h = np.clip((xv + b.value) * np.float32(0.2) + np.float32(0.5), 0, 1) * np.float32(3)
    np.testing.assert_allclose(got, np.power(np.minimum(h, 2), xv), rtol=1e-6)
    assert got.dtype == np.float32


def test_printer_shows_epilogues_and_programs(ir):
    x = ir.inp("x", (2, 3))
    mm = ir.node(Op.MATMUL, x, const(np.ones((3, 3), np.float32)), const(np.ones(3, np.float32)),
                 attrs=o.MatMulAttrs(o.Epilogue("clip", clip_min=0.0, clip_max=6.0)))
    fused = Node(Op.FUSED_ELEMENTWISE, DType.FLOAT32, (2, 3), (mm,),
                 o.FusedElementwiseAttrs((("exp", (0,), ()), ("add", (1,), (1.0,)))))
    text = format_graph(Graph((x,), (fused,), ("y",)))
    assert "{epilogue=clip(0.0, 6.0)}" in text
    assert "fused_elementwise(%3) {exp($0); add($1, 1.0)}" in text
    plain = format_graph(Graph((x,), (ir.node(Op.GEMM, x, x, attrs=o.GemmAttrs(trans_b=True)),),
                               ("y",)))
    assert "epilogue" not in plain
