"""fold_constants: all-constant subgraphs become one CONST."""

from __future__ import annotations

import numpy as np

from vtakit.compiler.ir import Graph, Op, const
from vtakit.compiler.ir import ops as o
from vtakit.compiler.passes import fold_constants
from vtakit.compiler.passes.fold_constants import MAX_FOLDED_BYTES


def test_folds_a_constant_chain_feeding_a_matmul(ir):
    # y = x @ transpose(w * 2): the weight computation folds, the matmul stays.
    x = ir.inp("x", (2, 3))
    w = const(np.arange(12, dtype=np.float32).reshape(4, 3))
    two = const(np.float32(2))
    wt = ir.node(Op.TRANSPOSE, ir.node(Op.MUL, w, two), attrs=o.TransposeAttrs((1, 0)))
    before = Graph((x,), (ir.node(Op.MATMUL, x, wt),), ("y",))
    folded = const((np.arange(12, dtype=np.float32).reshape(4, 3) * 2).T)
    expected = Graph((x,), (ir.node(Op.MATMUL, x, folded),), ("y",))
    ir.check_pass(fold_constants, before, expected)


def test_a_constant_output_is_folded_and_keeps_its_name(ir):
    x = ir.inp("x", (2,))
    c = ir.node(Op.ADD, const(np.ones(2, np.float32)), const(np.ones(2, np.float32)))
    before = Graph((x,), (ir.node(Op.NEG, x), c.replace(name="c")), ("y", "c"))
    after = fold_constants(before)
    assert after.outputs[1].op is Op.CONST and after.outputs[1].name == "c"
    np.testing.assert_array_equal(after.outputs[1].value, [2, 2])
    assert after.outputs[0] is before.outputs[0]  # untouched nodes are kept as they are


def test_huge_results_are_not_folded(ir):
    x = ir.inp("x", (1,))
    n = MAX_FOLDED_BYTES // 4 + 1
    big = ir.node(Op.EXPAND, const(np.float32(1)), shape=(n,))
    before = Graph((x,), (ir.node(Op.ADD, x, big),), ("y",))
    after = fold_constants(before)
    assert after.structurally_equal(before)
