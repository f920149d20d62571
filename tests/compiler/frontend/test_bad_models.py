"""ONNX import of invalid models: each is built with onnx.helper (TensorProtos written by hand
where make_tensor would refuse the data) and must raise the project's error naming the tensor or
node, what it holds and what was expected; never an AssertionError or numpy's own message."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from vtakit.compiler.errors import InvalidModelError, TensorTooLargeError, UnsupportedError
from vtakit.compiler.frontend import import_onnx
from vtakit.compiler.frontend.onnx import MAX_TENSOR_BYTES

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, inits=(), value_info=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits),
                              value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _relu(out_shape, out_dtype=F, in_shape=(2, 3)):
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")], [_vi("x", in_shape)],
                  [_vi("y", out_shape, out_dtype)])


def _raw_tensor(name, dtype, dims, raw=None, floats=None):
    """A TensorProto whose data need not fit its dims (make_tensor checks that they do)."""
    t = TensorProto(name=name, data_type=dtype, dims=dims)
    if raw is not None:
        t.raw_data = raw
    if floats is not None:
        t.float_data[:] = floats
    return t


def _add_w(w):
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add0")], [_vi("x", [2, 2])],
                  [_vi("y", [2, 2])], [w])


BAD_MODELS = [
    ("declared output shape contradicts the node",
     _relu([3, 2]), InvalidModelError,
     r"^node 'relu0' \(Relu\): output 'y' is declared as float32\[3, 2\] \(in the graph's "
     r"outputs\), but the node computes float32\[2, 3\] from its inputs$"),
    ("declared value_info contradicts the node",
     _model([helper.make_node("Relu", ["x"], ["t"], name="r0"),
             helper.make_node("Relu", ["t"], ["y"], name="r1")], [_vi("x", [2, 3])],
            [_vi("y", [2, 3])], value_info=[_vi("t", [2, 4])]), InvalidModelError,
     r"^node 'r0' \(Relu\): output 't' is declared as float32\[2, 4\] \(in value_info\), but "
     r"the node computes float32\[2, 3\]"),
    ("negative dimension of a graph input",
     _relu([2, -3], in_shape=(2, -3)), InvalidModelError,
     r"^graph input 'x': dimension 1 is -3 \(shape \[2, -3\]\); expected a size >= 0"),
    # What onnx.checker already rejects keeps the checker's words (they name the tensor too).
    ("negative dimension of an initializer (the checker's message)",
     _add_w(_raw_tensor("w", F, [2, -2], raw=b"")), InvalidModelError,
     r"^not a valid ONNX model: Negative dimension value \(tensor name: w\)"),
    ("initializer float_data shorter than its dims (the checker's message)",
     _add_w(_raw_tensor("w", F, [2, 2], floats=[1.0, 2.0, 3.0])), InvalidModelError,
     r"^not a valid ONNX model: .*tensor name: w\) float_data size \(3\) is too small for the "
     r"declared shape \(4 float values required\)"),
    ("initializer raw_data larger than its dims",
     _add_w(_raw_tensor("w", F, [2, 2], raw=np.zeros(6, np.float32).tobytes())),
     InvalidModelError,
     r"^initializer 'w': dims \[2, 2\] need 4 float32 elements, but its raw_data holds 24 "
     r"bytes = 6 elements$"),
    ("initializer raw_data not a whole number of elements",
     _add_w(_raw_tensor("w", F, [2, 2], raw=b"\0" * 19)), InvalidModelError,
     r"^initializer 'w': dims \[2, 2\] need 4 float32 elements, but its raw_data holds 19 "
     r"bytes, not a whole number of 4-byte elements$"),
    ("initializer float_data longer than its dims",
     _add_w(_raw_tensor("w", F, [2, 2], floats=[1.0] * 5)), InvalidModelError,
     r"^initializer 'w': dims \[2, 2\] need 4 float32 elements, but its float_data holds 5 "
     r"elements$"),
    ("Constant node value whose data does not fit",
     _model([helper.make_node("Constant", [], ["c"], name="k",
                              value=_raw_tensor("v", F, [3], floats=[1.0] * 4)),
             helper.make_node("Add", ["x", "c"], ["y"])], [_vi("x", [3])], [_vi("y", [3])]),
     InvalidModelError,
     r"^node 'k' \(Constant\): attribute 'value': dims \[3\] need 3 float32 elements, but its "
     r"float_data holds 4 elements$"),
    ("initializer shadows a graph input with another dtype",
     _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")], [_vi("x", [2, 2])],
            [_vi("y", [2, 2])], [numpy_helper.from_array(np.ones((2, 2), np.int64), "x")]),
     InvalidModelError,
     r"^graph input 'x' is declared as float32\[2, 2\], but the initializer of the same name "
     r"\(its default value\) is int64\[2, 2\]; expected the type the input declares$"),
    ("initializer shadows a graph input with another shape",
     _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")], [_vi("x", ["N", 3])],
            [_vi("y", ["N", 3])], [numpy_helper.from_array(np.ones((2, 2), np.float32), "x")]),
     InvalidModelError,
     r"^graph input 'x' is declared as float32\[N, 3\], but the initializer of the same name "
     r"\(its default value\) is float32\[2, 2\]"),
]


@pytest.mark.parametrize("model, error, message",
                         [pytest.param(*case[1:], id=case[0]) for case in BAD_MODELS])
def test_bad_model_is_rejected_by_name(model, error, message):
    with pytest.raises(error, match=message):
        import_onnx(model)
    with pytest.raises(error, match=message):  # the same from the serialised bytes
        import_onnx(model.SerializeToString())


# A few hundred bytes of file declaring 4 TiB: it must fail from the shapes, before any
# allocation (a MemoryError, or the machine swapping, would be the failure mode otherwise).
HUGE = [1 << 20, 1 << 20]
TOO_LARGE = r"float32\[1048576, 1048576\] would take 4.0 TiB \(4398046511104 bytes\); " \
            r"expected at most 16.0 GiB \(17179869184 bytes\) per tensor$"

HUGE_MODELS = [
    ("graph input",
     _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")], [_vi("x", HUGE)],
            [_vi("y", HUGE)]),
     r"^graph input 'x': "),
    ("Expand of a constant shape",
     _model([helper.make_node("Expand", ["x", "s"], ["y"], name="exp0")], [_vi("x", [1])],
            [_vi("y", HUGE)], [numpy_helper.from_array(np.array(HUGE, np.int64), "s")]),
     r"^node 'exp0' \(Expand\): output 'y': "),
    ("ConstantOfShape",
     _model([helper.make_node("ConstantOfShape", ["s"], ["c"], name="cos0"),
             helper.make_node("Add", ["x", "c"], ["y"])], [_vi("x", [1])], [_vi("y", HUGE)],
            [numpy_helper.from_array(np.array(HUGE, np.int64), "s")]),
     r"^node 'cos0' \(ConstantOfShape\): output 'c': "),
]


@pytest.mark.parametrize("model, where", [pytest.param(*c[1:], id=c[0]) for c in HUGE_MODELS])
def test_huge_tensors_fail_at_import_from_their_shapes(model, where):
    data = model.SerializeToString()
    assert len(data) < 500
    with pytest.raises(TensorTooLargeError, match=where + TOO_LARGE) as info:
        import_onnx(data)
    assert info.value.size_bytes == 4 * 2**40
    assert isinstance(info.value, UnsupportedError)  # a valid model, beyond what is supported


def test_a_tensor_of_exactly_the_limit_is_accepted_and_one_byte_more_is_not():
    n = MAX_TENSOR_BYTES  # uint8 elements: one byte each
    ok = _model([helper.make_node("Identity", ["x"], ["y"])], [_vi("x", [n], TensorProto.UINT8)],
                [_vi("y", [n], TensorProto.UINT8)])
    assert import_onnx(ok).inputs[0].shape == (n,)
    big = _model([helper.make_node("Identity", ["x"], ["y"])],
                 [_vi("x", [n + 1], TensorProto.UINT8)], [_vi("y", [n + 1], TensorProto.UINT8)])
    with pytest.raises(TensorTooLargeError, match=rf"graph input 'x': uint8\[{n + 1}\] would "
                                                  rf"take 16.0 GiB \({n + 1} bytes\)"):
        import_onnx(big)


def test_a_huge_batch_size_is_caught_like_a_declared_shape():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")], [_vi("x", ["N", 1 << 30])],
               [_vi("y", ["N", 1 << 30])])
    with pytest.raises(TensorTooLargeError, match=r"^graph input 'x': float32\[64, 1073741824\]"):
        import_onnx(m, batch_size=64)
