"""Quantised operators of the reference interpreter against onnxruntime, bit for bit.

onnxruntime requantises QLinearConv/QLinearMatMul with a float32 scale, the interpreter with
float64; a value within float32 rounding error of a .5 boundary could round differently. These
cases have none; if a new case does, the difference is one step and this note applies.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_reference import reference_session

from vtakit.compiler.frontend import import_onnx
from vtakit.compiler.ir import run, verify


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _compare(model, feeds):
    pytest.importorskip("onnxruntime", reason="pip install 'vtakit[dev]'")
    # integer=False: the QLINEAR ops as written (the reference interpreter's own kernels, float
    # requantisation like onnxruntime), not the integer graph the importer makes of them
    (ours,) = run(verify(import_onnx(model, integer=False)), feeds).values()
    session = reference_session(model)
    (ref,) = session.run(None, feeds)
    assert ours.dtype == ref.dtype
    np.testing.assert_array_equal(ours, ref)


def test_quantize_qlinear_conv_per_channel():
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    inits = [_init("xs", np.float32(0.05)), _init("xz", np.uint8(128)), _init("w", w),
             _init("ws", rng.uniform(0.001, 0.01, 8).astype(np.float32)),
             _init("wz", np.zeros(8, np.int8)), _init("ys", np.float32(0.2)),
             _init("yz", np.uint8(100)), _init("b", rng.integers(-500, 500, 8).astype(np.int32))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                              ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    graph = helper.make_graph(
        nodes, "qconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 8, 5, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    _compare(model, {"x": rng.standard_normal((1, 4, 9, 9)).astype(np.float32) * 3})


def test_qlinear_matmul_and_dequantize():
    rng = np.random.default_rng(1)
    inits = [_init("as", np.float32(0.02)), _init("az", np.int8(3)),
             _init("b", rng.integers(-127, 128, (16, 8)).astype(np.int8)),
             _init("bs", np.float32(0.01)), _init("bz", np.int8(0)),
             _init("ys", np.float32(0.05)), _init("yz", np.int8(-4))]
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                              ["y"])]
    graph = helper.make_graph(
        nodes, "qmm", [helper.make_tensor_value_info("a", TensorProto.INT8, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [2, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    _compare(model, {"a": rng.integers(-128, 128, (2, 16)).astype(np.int8)})
