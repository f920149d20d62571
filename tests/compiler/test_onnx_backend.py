"""The onnx Backend over the reference interpreter (the node tests live in tests/conformance)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from vtakit.compiler.onnx_backend import ReferenceBackend


def test_run_node():
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=2.0)
    a, b, c = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.ones(4, np.float32)
    (y,) = ReferenceBackend.run_node(node, [a, b, c])
    np.testing.assert_allclose(y, np.full((2, 4), 7.0))


def test_shape_inputs_are_bound_per_run():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    x = np.arange(6, dtype=np.float32)
    (y,) = ReferenceBackend.run_node(node, [x, np.array([3, 2])])
    assert y.shape == (3, 2)
