"""Nodes, graphs, the verifier and the printer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vtakit.compiler.errors import VerifyError
from vtakit.compiler.ir import DType, Graph, Node, Op, const, format_graph, verify
from vtakit.compiler.ir import ops as o


def _input(name: str, shape: tuple[int, ...], index: int = 0,
           dtype: DType = DType.FLOAT32) -> Node:
    return Node(Op.INPUT, dtype, shape, attrs=o.InputAttrs(index), name=name)


def small_graph() -> Graph:
    x = _input("x", (1, 4))
    w = const(np.ones((4, 3), np.float32), name="w")
    y = Node(Op.MATMUL, DType.FLOAT32, (1, 3), (x, w), name="mm")
    z = Node(Op.RELU, DType.FLOAT32, (1, 3), (y,), name="act")
    return Graph((x,), (z,), ("out",), name="small")


def test_nodes_are_immutable_and_replace_returns_a_new_node():
    g = small_graph()
    relu = g.outputs[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        relu.op = Op.SIGMOID  # type: ignore[misc]
    sig = relu.replace(op=Op.SIGMOID)
    assert sig is not relu and sig.op is Op.SIGMOID and sig.src == relu.src


def test_nodes_are_listed_operands_first():
    g = small_graph()
    assert [n.op for n in g.nodes] == [Op.INPUT, Op.CONST, Op.MATMUL, Op.RELU]
    assert list(g.constants) == ["w"]
    assert g.users()[g.nodes[2]] == [g.outputs[0]]


def test_shared_operands_appear_once():
    x = _input("x", (2,))
    a = Node(Op.EXP, DType.FLOAT32, (2,), (x,))
    y = Node(Op.ADD, DType.FLOAT32, (2,), (a, a))
    assert len(Graph((x,), (y,), ("y",)).nodes) == 3


def test_const_values_are_read_only():
    c = const(np.arange(3, dtype=np.int64))
    with pytest.raises(ValueError):
        c.value[0] = 5
    assert c.dtype is DType.INT64 and c.shape == (3,)


def test_verify_accepts_a_good_graph():
    g = small_graph()
    assert verify(g) is g


def _bad(kind: str) -> Graph:
    x = _input("x", (1, 4))
    w = const(np.ones((4, 3), np.float32), name="w")
    if kind == "shape":
        y = Node(Op.MATMUL, DType.FLOAT32, (1, 4), (x, w), name="mm")
    elif kind == "dtype":
        y = Node(Op.MATMUL, DType.INT32, (1, 3), (x, w), name="mm")
    elif kind == "attrs":
        y = Node(Op.SOFTMAX, DType.FLOAT32, (1, 4), (x,), o.NO_ATTRS, name="sm")
    elif kind == "arity":
        y = Node(Op.RELU, DType.FLOAT32, (1, 4), (x, x), name="act")
    elif kind == "dangling":
        stray = _input("stray", (1, 4))
        y = Node(Op.ADD, DType.FLOAT32, (1, 4), (x, stray), name="add")
    else:
        y = Node(Op.TRANSPOSE, DType.FLOAT32, (4, 1), (x,), o.TransposeAttrs((0, 0)), name="t")
    return Graph((x,), (y,), ("y",))


@pytest.mark.parametrize("kind, message", [
    ("shape", r"node 2 MATMUL 'mm': declared f32\[1, 4\], expected f32\[1, 3\]"),
    ("dtype", r"node 2 MATMUL 'mm': declared i32\[1, 3\], expected f32\[1, 3\]"),
    ("attrs", r"node 1 SOFTMAX 'sm': SOFTMAX takes AxisAttrs, got NoAttrs"),
    ("arity", r"node 1 RELU 'act': RELU takes 1..1 operands, got 2"),
    ("dangling", r"node 1 INPUT 'stray': dangling INPUT"),
    ("perm", r"node 1 TRANSPOSE 't': perm \[0, 0\] is not a permutation of rank 2"),
])
def test_verify_names_the_bad_node(kind: str, message: str):
    with pytest.raises(VerifyError, match=message):
        verify(_bad(kind))


def test_verify_rejects_duplicate_input_names():
    x, y = _input("x", (1,)), _input("x", (1,), index=1)
    g = Graph((x, y), (Node(Op.ADD, DType.FLOAT32, (1,), (x, y)),), ("z",))
    with pytest.raises(VerifyError, match=r"duplicate input names \['x', 'x'\]"):
        verify(g)


def test_printer():
    assert format_graph(small_graph()) == "\n".join([
        "graph small(%0 x: f32[1, 4]) -> (out: %3)",
        "  %1 = const f32[4, 3]  # w",
        "  %2 = matmul(%0, %1) f32[1, 3]  # mm",
        "  %3 = relu(%2) f32[1, 3]  # act",
    ])


def test_printer_shows_attributes_and_small_constants():
    x = _input("x", (2, 3))
    t = Node(Op.TRANSPOSE, DType.FLOAT32, (3, 2), (x,), o.TransposeAttrs((1, 0)))
    s = Node(Op.ADD, DType.FLOAT32, (3, 2), (t, const(np.float32(1))))
    text = str(Graph((x,), (s,), ("y",)))
    assert "%1 = transpose(%0) {perm=(1, 0)} f32[3, 2]" in text
    assert "%2 = const 1.0 f32[]" in text


def test_dtype_mappings():
    assert DType.from_numpy(np.int8) is DType.INT8
    assert DType.FLOAT16.np == np.float16
    assert DType.from_onnx(DType.UINT8.onnx) is DType.UINT8
    assert DType.from_onnx(8) is None  # STRING
    with pytest.raises(TypeError, match="numpy dtype complex64 has no IR dtype"):
        DType.from_numpy(np.complex64)


def test_structural_equality_ignores_identity_and_internal_names():
    a, b = small_graph(), small_graph()
    assert a.structurally_equal(b)
    relu = b.outputs[0]
    renamed = Graph(b.inputs, (relu.replace(name="other"),), b.output_names)
    assert a.structurally_equal(renamed)
    sigmoid = Graph(b.inputs, (relu.replace(op=Op.SIGMOID),), b.output_names)
    assert not a.structurally_equal(sigmoid)
    w = const(np.full((4, 3), 2, np.float32), name="w")
    mm = Node(Op.MATMUL, DType.FLOAT32, (1, 3), (b.inputs[0], w))
    other_weights = Graph(b.inputs, (relu.replace(src=(mm,)),), b.output_names)
    assert not a.structurally_equal(other_weights)
