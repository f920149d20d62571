"""fold_batch_norm: BN into the producer's weights, or into a multiply-add."""

from __future__ import annotations

import numpy as np

from vtakit.compiler.ir import Graph, Op, const
from vtakit.compiler.ir import ops as o
from vtakit.compiler.passes import fold_batch_norm

RNG = np.random.default_rng(3)
C = 4


def _bn_params() -> tuple[np.ndarray, ...]:
    scale = RNG.uniform(0.5, 1.5, C).astype(np.float32)
    bias, mean = (RNG.standard_normal(C).astype(np.float32) for _ in range(2))
    var = RNG.uniform(0.5, 1.5, C).astype(np.float32)
    return scale, bias, mean, var


def _bn(ir, x, params, eps=1e-5):
    return ir.node(Op.BATCH_NORM, x, *(const(p) for p in params), attrs=o.EpsilonAttrs(eps))


def _st(params, eps=1e-5):
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    s = scale / np.sqrt(var + eps)
    return s, bias - mean * s


CONV = o.ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))


def test_conv_without_bias_gets_scaled_weights_and_a_bias(ir):
    x = ir.inp("x", (1, 3, 5, 5))
    w = RNG.standard_normal((C, 3, 3, 3)).astype(np.float32)
    params = _bn_params()
    before = Graph((x,), (_bn(ir, ir.node(Op.CONV, x, const(w), attrs=CONV), params),), ("y",))
    s, t = _st(params)
    w2 = (w * s[:, None, None, None]).astype(np.float32)
    expected = Graph((x,), (ir.node(Op.CONV, x, const(w2), const(t.astype(np.float32)),
                                    attrs=CONV),), ("y",))
    ir.check_pass(fold_batch_norm, before, expected)


def test_gemm_with_transposed_weights_and_bias(ir):
    x = ir.inp("x", (2, 3))
    w = RNG.standard_normal((C, 3)).astype(np.float32)
    b = RNG.standard_normal(C).astype(np.float32)
    at = o.GemmAttrs(alpha=0.5, beta=2.0, trans_b=True)
    params = _bn_params()
    before = Graph((x,), (_bn(ir, ir.node(Op.GEMM, x, const(w), const(b), attrs=at), params),),
                   ("y",))
    s, t = _st(params)
    expected = Graph((x,), (ir.node(
        Op.GEMM, x, const((w * s[:, None]).astype(np.float32)),
        const((2.0 * b * s + t).astype(np.float32)),
        attrs=o.GemmAttrs(alpha=0.5, beta=1.0, trans_b=True)),), ("y",))
    ir.check_pass(fold_batch_norm, before, expected)


def test_matmul_gets_a_bias_operand(ir):
    x = ir.inp("x", (2, 3))
    w = RNG.standard_normal((3, C)).astype(np.float32)
    params = _bn_params()
    before = Graph((x,), (_bn(ir, ir.node(Op.MATMUL, x, const(w)), params),), ("y",))
    s, t = _st(params)
    expected = Graph((x,), (ir.node(Op.MATMUL, x, const((w * s).astype(np.float32)),
                                    const(t.astype(np.float32)), attrs=o.MatMulAttrs()),), ("y",))
    ir.check_pass(fold_batch_norm, before, expected)


def test_standalone_bn_becomes_a_per_channel_multiply_add(ir):
    # The conv's result is also an output, so the BN cannot go into its weights.
    x = ir.inp("x", (1, 3, 5, 5))
    w = RNG.standard_normal((C, 3, 3, 3)).astype(np.float32)
    conv = ir.node(Op.CONV, x, const(w), attrs=CONV)
    params = _bn_params()
    before = Graph((x,), (_bn(ir, conv, params), conv), ("y", "conv"))
    s, t = _st(params)
    mul = ir.node(Op.MUL, conv, const(s.astype(np.float32).reshape(C, 1, 1)))
    add = ir.node(Op.ADD, mul, const(t.astype(np.float32).reshape(C, 1, 1)))
    ir.check_pass(fold_batch_norm, before, Graph((x,), (add, conv), ("y", "conv")))


def test_bn_with_a_computed_parameter_is_left_alone(ir):
    x = ir.inp("x", (2, C))
    v = ir.inp("v", (C,), index=1)
    scale, bias, mean, _ = (const(p) for p in _bn_params())
    bn = ir.node(Op.BATCH_NORM, x, scale, bias, mean, v, attrs=o.EpsilonAttrs(1e-5))
    before = Graph((x, v), (bn,), ("y",))
    assert fold_batch_norm(before).structurally_equal(before)
