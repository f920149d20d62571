"""eliminate_dead_code: unreachable nodes and no-ops disappear."""

from __future__ import annotations

from vtakit.compiler.ir import DType, Graph, Op
from vtakit.compiler.ir import ops as o
from vtakit.compiler.passes import eliminate_dead_code


def test_removes_identity_noop_reshape_and_same_dtype_cast(ir):
    x = ir.inp("x", (2, 3))
    a = ir.node(Op.IDENTITY, x)
    b = ir.node(Op.RESHAPE, a, shape=(2, 3))
    c = ir.node(Op.CAST, b, dtype=DType.FLOAT32)
    before = Graph((x,), (ir.node(Op.EXP, c),), ("y",))
    expected = Graph((x,), (ir.node(Op.EXP, x),), ("y",))
    ir.check_pass(eliminate_dead_code, before, expected)


def test_collapses_reshape_chains_and_keeps_real_work(ir):
    x = ir.inp("x", (2, 3))
    r = ir.node(Op.RESHAPE, ir.node(Op.RESHAPE, x, shape=(6,)), shape=(3, 2))
    t = ir.node(Op.TRANSPOSE, r, attrs=o.TransposeAttrs((1, 0)))
    before = Graph((x,), (t,), ("y",))
    expected = Graph((x,), (ir.node(Op.TRANSPOSE, ir.node(Op.RESHAPE, x, shape=(3, 2)),
                                    attrs=o.TransposeAttrs((1, 0))),), ("y",))
    ir.check_pass(eliminate_dead_code, before, expected)


def test_an_identity_of_an_input_that_is_an_output_stays(ir):
    # The output must stay a tensor of its own, not the caller's input buffer.
    x = ir.inp("x", (2,))
    before = Graph((x,), (ir.node(Op.IDENTITY, x),), ("y",))
    assert eliminate_dead_code(before).structurally_equal(before)


def test_unreachable_nodes_are_gone_after_a_rewrite(ir):
    x = ir.inp("x", (2,))
    e = ir.node(Op.EXP, x)
    before = Graph((x,), (ir.node(Op.NEG, ir.node(Op.IDENTITY, e)),), ("y",))
    after = eliminate_dead_code(before)
    assert [n.op for n in after.nodes] == [Op.INPUT, Op.EXP, Op.NEG]
