"""fuse_epilogues: bias, residual and activation into CONV / GEMM / MATMUL epilogues."""

from __future__ import annotations

import numpy as np
import pytest

from vtakit.compiler.ir import Graph, Op, const, verify
from vtakit.compiler.ir import ops as o
from vtakit.compiler.passes import fuse_epilogues

RNG = np.random.default_rng(5)
CONV = o.ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))


def _w(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_conv_bias_add_residual_relu_become_one_conv(ir):
    x = ir.inp("x", (1, 3, 5, 5))
    r = ir.inp("r", (1, 4, 5, 5), index=1)
    w, b = _w(4, 3, 3, 3), _w(4, 1, 1)
    conv = ir.node(Op.CONV, x, const(w), attrs=CONV)
    y = ir.node(Op.RELU, ir.node(Op.ADD, r, ir.node(Op.ADD, conv, const(b))))
    before = Graph((x, r), (y,), ("y",))
    ep = o.Epilogue(activation="relu", residual=True)
    fused = ir.node(Op.CONV, x, const(w), const(b.reshape(4)), r,
                    attrs=o.ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), epilogue=ep))
    ir.check_pass(fuse_epilogues, before, Graph((x, r), (fused,), ("y",)))


def test_residual_without_a_bias_gets_a_zero_bias_first(ir):
    x = ir.inp("x", (1, 3, 5, 5))
    r = ir.inp("r", (1, 4, 5, 5), index=1)
    w = _w(4, 3, 3, 3)
    before = Graph((x, r), (ir.node(Op.ADD, ir.node(Op.CONV, x, const(w), attrs=CONV), r),),
                   ("y",))
    fused = ir.node(Op.CONV, x, const(w), const(np.zeros(4, np.float32)), r,
                    attrs=o.ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1),
                                      epilogue=o.Epilogue(residual=True)))
    ir.check_pass(fuse_epilogues, before, Graph((x, r), (fused,), ("y",)))


def test_gemm_bias_and_clip(ir):
    x = ir.inp("x", (2, 3))
    w, c, b = _w(3, 4), _w(4), _w(1, 4)
    gemm = ir.node(Op.GEMM, x, const(w), const(c), attrs=o.GemmAttrs(beta=0.5))
    y = ir.node(Op.CLIP, ir.node(Op.ADD, gemm, const(b)), attrs=o.ClipAttrs(0.0, 6.0))
    before = Graph((x,), (y,), ("y",))
    fused = ir.node(Op.GEMM, x, const(w), const(c * np.float32(0.5) + b.reshape(4)),
                    attrs=o.GemmAttrs(beta=1.0, epilogue=o.Epilogue("clip", clip_min=0.0,
                                                                   clip_max=6.0)))
    ir.check_pass(fuse_epilogues, before, Graph((x,), (fused,), ("y",)))


def test_matmul_bias_and_leaky_relu(ir):
    x = ir.inp("x", (2, 5, 3))
    w, b = _w(3, 4), _w(4)
    y = ir.node(Op.LEAKY_RELU, ir.node(Op.ADD, ir.node(Op.MATMUL, x, const(w)), const(b)),
                attrs=o.AlphaAttrs(0.1))
    before = Graph((x,), (y,), ("y",))
    fused = ir.node(Op.MATMUL, x, const(w), const(b),
                    attrs=o.MatMulAttrs(o.Epilogue("leaky_relu", alpha=0.1)))
    ir.check_pass(fuse_epilogues, before, Graph((x,), (fused,), ("y",)))


def test_nothing_fuses_into_a_producer_with_another_user(ir):
    x = ir.inp("x", (1, 3, 5, 5))
    conv = ir.node(Op.CONV, x, const(_w(4, 3, 3, 3)), attrs=CONV)
    before = Graph((x,), (ir.node(Op.SIGMOID, conv), ir.node(Op.EXP, conv)), ("a", "b"))
    assert fuse_epilogues(before).structurally_equal(before)


def test_a_bias_varying_off_the_channel_axis_is_not_folded(ir):
    x = ir.inp("x", (1, 3, 5, 5))
    conv = ir.node(Op.CONV, x, const(_w(4, 3, 3, 3)), attrs=CONV)
    before = Graph((x,), (ir.node(Op.ADD, conv, const(_w(5))),), ("y",))  # along the width
    assert fuse_epilogues(before).structurally_equal(before)


def test_activation_after_sigmoid_epilogue_is_not_fused_twice(ir):
    x = ir.inp("x", (2, 3))
    mm = ir.node(Op.MATMUL, x, const(_w(3, 4)))
    before = Graph((x,), (ir.node(Op.RELU, ir.node(Op.SIGMOID, mm)),), ("y",))
    after = verify(fuse_epilogues(before))
    assert [n.op for n in after.nodes] == [Op.INPUT, Op.CONST, Op.MATMUL, Op.RELU]
    assert o.epilogue_of(after.nodes[2]) == o.Epilogue("sigmoid")


@pytest.mark.parametrize("bad", [
    o.Epilogue("swish"), o.Epilogue("relu", clip_min=0.0), o.Epilogue(residual=True),
])
def test_verify_rejects_malformed_epilogues(ir, bad):
    x = ir.inp("x", (2, 3))
    w = const(_w(3, 4))
    with pytest.raises(ValueError):
        ir.node(Op.MATMUL, x, w, const(_w(4)), attrs=o.MatMulAttrs(bad))
