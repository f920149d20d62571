"""fuse_elementwise: single-user float32 elementwise chains become FUSED_ELEMENTWISE."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vtakit.compiler.ir import DType, Graph, Node, Op, const, verify
from vtakit.compiler.ir import ops as o
from vtakit.compiler.passes import fuse_elementwise


def _fused(src, program, shape):
    return Node(Op.FUSED_ELEMENTWISE, DType.FLOAT32, shape, tuple(src),
                o.FusedElementwiseAttrs(tuple(program)))


def test_chain_with_broadcast_and_scalar_constants(ir):
    # relu(x * 2 + b) - y, with b broadcast along axis 1 and the 2 inlined as a constant.
    x = ir.inp("x", (2, 3, 4))
    y = ir.inp("y", (2, 3, 4), index=1)
    b = const(np.arange(3, dtype=np.float32).reshape(3, 1))
    a = ir.node(Op.ADD, ir.node(Op.MUL, x, const(np.float32(2))), b)
    out = ir.node(Op.SUB, ir.node(Op.RELU, a), y)
    before = Graph((x, y), (out,), ("out",))
    program = [("mul", (0,), (2.0,)), ("add", (3, 1), ()), ("relu", (4,), ()),
               ("sub", (5, 2), ())]
    expected = Graph((x, y), (_fused((x, b, y), program, (2, 3, 4)),), ("out",))
    ir.check_pass(fuse_elementwise, before, expected, rtol=0, atol=0)


def test_shared_operand_appears_once_and_clip_bounds(ir):
    # x * sigmoid(x), then clip(., min=0) (unbounded above): a swish.
    x = ir.inp("x", (5,))
    s = ir.node(Op.MUL, x, ir.node(Op.SIGMOID, x))
    before = Graph((x,), (ir.node(Op.CLIP, s, attrs=o.ClipAttrs(0.0, None)),), ("y",))
    program = [("sigmoid", (0,), ()), ("mul", (0, 1), ()), ("clip", (2,), (0.0, math.inf))]
    ir.check_pass(fuse_elementwise, before, Graph((x,), (_fused((x,), program, (5,)),), ("y",)),
                  rtol=0, atol=0)


def test_stops_at_values_with_several_users_and_non_float32(ir):
    x = ir.inp("x", (4,))
    e = ir.node(Op.EXP, x)  # two users: stays a node of its own
    a, b = ir.node(Op.NEG, e), ir.node(Op.ABS, e)
    total = ir.node(Op.ADD, ir.node(Op.TANH, a), b)
    i = ir.inp("i", (4,), index=1, dtype=DType.INT32)
    ineg = ir.node(Op.NEG, ir.node(Op.ABS, i))  # int32: not fused
    before = Graph((x, i), (total, ineg), ("y", "i"))
    # e is the one operand (0); neg(e) = 1, tanh(1) = 2, abs(e) = 3, add(2, 3).
    program = [("neg", (0,), ()), ("tanh", (1,), ()), ("abs", (0,), ()), ("add", (2, 3), ())]
    expected = Graph((x, i), (_fused((e,), program, (4,)), ineg), ("y", "i"))
    ir.check_pass(fuse_elementwise, before, expected, rtol=0, atol=0)


def test_a_lone_elementwise_op_is_left_alone(ir):
    x = ir.inp("x", (3,))
    before = Graph((x,), (ir.node(Op.ADD, ir.node(Op.MATMUL, ir.node(Op.RESHAPE, x, shape=(1, 3)),
                                                       const(np.ones((3, 2), np.float32))),
                                  const(np.float32(1))),), ("y",))
    assert fuse_elementwise(before).structurally_equal(before)


@pytest.mark.parametrize("program, error", [
    ((("frobnicate", (0,), ()),), "unknown"),
    ((("add", (0,), ()),), "cannot take"),
    ((("relu", (1,), ()),), "earlier"),
    ((), "empty"),
])
def test_verify_rejects_malformed_programs(ir, program, error):
    x = ir.inp("x", (3,))
    g = Graph((x,), (_fused((x,), program, (3,)),), ("y",))
    with pytest.raises(ValueError, match=error):
        verify(g)


def test_a_fused_node_absorbs_its_fused_operand_on_a_second_run(ir):
    x = ir.inp("x", (3,))
    first = _fused((x,), [("exp", (0,), ()), ("add", (1,), (1.0,))], (3,))
    y = ir.inp("y", (3,), index=1)
    second = _fused((first, y), [("mul", (0, 1), ()), ("relu", (2,), ())], (3,))
    before = Graph((x, y), (second,), ("out",))
    program = [("exp", (0,), ()), ("add", (2,), (1.0,)), ("mul", (3, 1), ()), ("relu", (4,), ())]
    expected = Graph((x, y), (_fused((x, y), program, (3,)),), ("out",))
    ir.check_pass(fuse_elementwise, before, expected, rtol=0, atol=0)
