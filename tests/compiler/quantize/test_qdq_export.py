"""QDQ export (quantize.qdq.to_qdq): onnxruntime runs the exported model and agrees with our
integer graph (same top-1, int8 outputs within one step on >= 99%), and importing the export
gives our integer graph back, output for output."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_reference import reference_session

from vtakit import digits, models
from vtakit.compiler.errors import UnsupportedError
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.ir import Op, run
from vtakit.compiler.quantize import QuantOptions, quantize_graph
from vtakit.compiler.quantize.qdq import to_qdq

ort = pytest.importorskip("onnxruntime", reason="pip install 'vtakit[dev]'")


def _samples(name: str, shape: tuple[int, ...], n: int, seed: int) -> list[np.ndarray]:
    if name == "digits":
        x = digits.test_split()[0] if seed else digits.calibration_set()
        return [v[None] for v in x[:n]]
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


# (model, mode, samples, fraction of int8 outputs within one step of onnxruntime). In shift mode
# every multiplier is a power of two, 2**-s: an accumulator that is an odd multiple of 2**(s-1)
# is a tie, which onnxruntime rounds to even and we round up, so steps differ more often.
CASES = [("lenet", "fixed", 8, 0.99), ("lenet", "shift", 8, 0.95), ("mlp", "fixed", 8, 0.99),
         ("digits", "fixed", 100, 0.99), ("transformer_block", "fixed", 4, 0.99),
         pytest.param("resnet18", "fixed", 4, 0.99, marks=pytest.mark.slow)]


@pytest.mark.parametrize(("name", "mode", "n", "within"), CASES)
def test_export_runs_in_onnxruntime_and_imports_back(name: str, mode: str, n: int,
                                                     within: float) -> None:
    g = import_onnx(digits.load_model() if name == "digits" else getattr(models, name)())
    inp = g.inputs[0]
    qg, report = quantize_graph(g, _samples(name, inp.shape, 16 if name == "digits" else 2, 0),
                                QuantOptions(mode=mode, observer="minmax", report_samples=1))
    model = to_qdq(report)
    sess = reference_session(model)
    back = import_onnx(model)
    assert {n.op for n in back.nodes} >= {Op.REQUANTIZE} and not any(
        n.op in (Op.CONV, Op.GEMM) for n in back.nodes)
    assert qg.outputs[0].op is Op.DEQUANTIZE_LINEAR
    step = float(qg.outputs[0].src[1].value)
    same, diffs = 0, []
    for x in _samples(name, inp.shape, n, 1):
        (ours,) = run(qg, {inp.name: x}).values()
        (ref,) = sess.run(None, {inp.name: x})
        (again,) = run(back, {inp.name: x}).values()
        np.testing.assert_array_equal(again, ours)  # the round trip is exact
        same += int(np.argmax(ours) == np.argmax(ref))
        diffs.append(np.abs(np.rint(ours / step) - np.rint(ref / step)).ravel())
    d = np.concatenate(diffs)
    assert same == n and np.mean(d <= 1) >= within, (same, np.mean(d <= 1), d.max())


def test_export_layout() -> None:
    g = import_onnx(models.lenet())
    qg, report = quantize_graph(g, _samples("lenet", (1, 1, 28, 28), 2, 0),
                                QuantOptions(report_samples=1))
    model = to_qdq(report)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    by_out = {n.output[0]: n for n in model.graph.node}
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2 and {n.op_type for n in model.graph.node} == {
        "QuantizeLinear", "DequantizeLinear", "Conv", "Relu", "MaxPool", "Reshape", "Gemm"}
    for conv in convs:
        x, w, b = (by_out[t] for t in conv.input)
        assert x.op_type == w.op_type == b.op_type == "DequantizeLinear"
        wq, ws, wz = (inits[t] for t in w.input)
        assert wq.dtype == np.int8 and ws.shape == wz.shape == (wq.shape[0],) and not wz.any()
        assert helper.get_attribute_value(w.attribute[0]) == 0  # axis: output channels
        bq, bs, _ = (inits[t] for t in b.input)
        xs = inits[x.input[1]]
        assert bq.dtype == np.int32 and np.allclose(bs, xs * ws, rtol=1e-6)
    for q in (n for n in model.graph.node if n.op_type == "QuantizeLinear"):
        assert inits[q.input[2]].dtype == np.int8 and inits[q.input[2]] == 0


def test_an_op_it_cannot_write_is_named() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])
    w = numpy_helper.from_array(np.ones((3, 2, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sin", ["c"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]),
                          opset_imports=[helper.make_opsetid("", 13)])
    _, report = quantize_graph(import_onnx(m), [np.ones((1, 2, 4, 4), np.float32)],
                               QuantOptions(report_samples=1))
    with pytest.raises(UnsupportedError, match=r"QDQ export: node 'y' \(SIN\) cannot be written "
                                               r"as ONNX; supported: \["):
        to_qdq(report)
