"""Models quantised by onnxruntime with uint8 activations (QUInt8: QDQ per channel and per
tensor, reduce_range, with and without quant_pre_process; QOperator's QLinearConv /
QLinearMatMul) → `import_onnx` → `shift_uint8`: the reference interpreter's outputs before and
after the pass are bit-identical, no uint8 value is left, and the CPU backend (whose pipeline
runs the pass) equals the interpreter on the graph as imported."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vtakit import digits, models
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.ir import DType, Graph, Op, run, verify
from vtakit.compiler.lowering import lower_graph
from vtakit.compiler.passes import shift_uint8
from vtakit.compiler.pipeline import optimize
from vtakit.runtime import GraphExecutor

pytest.importorskip("onnxruntime.quantization", reason="pip install 'vtakit[dev]'")
from test_qdq_onnxruntime import ort_quantize  # noqa: E402  (needs onnxruntime)

IMAGENET = (1, 3, 224, 224)
SHAPES = {"mlp": (1, 784), "lenet": (1, 1, 28, 28), "digits": (1, 1, 8, 8),
          "mobilenet_v2": IMAGENET, "resnet18": IMAGENET}
QOPERATOR = dict(fmt="QOperator", op_types=["Conv", "MatMul"])
CASES = [
    ("digits", dict(per_channel=True)),
    ("digits", dict(per_channel=False, reduce_range=True, pre_process=True)),
    ("digits", QOPERATOR),
    ("lenet", dict(per_channel=True, pre_process=True)),
    ("lenet", dict(per_channel=False, reduce_range=True)),
    ("lenet", QOPERATOR),
    ("mlp", dict(per_channel=False)),
    ("mlp", QOPERATOR),
    pytest.param(("mobilenet_v2", dict(per_channel=False, pre_process=True)),
                 marks=pytest.mark.slow),
    pytest.param(("resnet18", dict(per_channel=False, pre_process=True)),
                 marks=pytest.mark.slow),
]


def _id(case) -> str:
    name, o = case.values[0] if hasattr(case, "values") else case
    if o.get("fmt") == "QOperator":
        return f"{name}-qop"
    return (f"{name}-{'pc' if o['per_channel'] else 'pt'}{'-rr' if o.get('reduce_range') else ''}"
            f"{'-pre' if o.get('pre_process') else ''}")


def _gemm_as_matmul(m: onnx.ModelProto) -> onnx.ModelProto:
    """Gemm (transB) as MatMul + Add: ORT writes a quantised Gemm as com.microsoft.QGemm, a
    domain the importer rejects; QLinearMatMul is standard."""
    inits = {i.name: i for i in m.graph.initializer}
    nodes = []
    for n in m.graph.node:
        if n.op_type != "Gemm":
            nodes.append(n)
            continue
        w = numpy_helper.to_array(inits[n.input[1]])
        inits[n.input[1]] = numpy_helper.from_array(np.ascontiguousarray(w.T), n.input[1])
        nodes += [helper.make_node("MatMul", n.input[:2], [f"{n.output[0]}_mm"]),
                  helper.make_node("Add", [f"{n.output[0]}_mm", n.input[2]], [n.output[0]])]
    del m.graph.node[:], m.graph.initializer[:]
    m.graph.node.extend(nodes)
    m.graph.initializer.extend(inits.values())
    return m


def _samples(name: str, n: int, seed: int) -> list[np.ndarray]:
    if name == "digits":
        x = digits.calibration_set() if seed == 0 else digits.test_split()[0]
        return [v[None] for v in x[:n]]
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPES[name]).astype(np.float32) for _ in range(n)]


@pytest.fixture(scope="module", params=CASES, ids=[_id(c) for c in CASES])
def case(request, tmp_path_factory) -> tuple[str, Graph, Graph]:
    """(model name, the imported integer graph, the graph after shift_uint8)."""
    name, options = request.param
    m = digits.load_model() if name == "digits" else getattr(models, name)()
    if options.get("fmt") == "QOperator":
        m = _gemm_as_matmul(m)
    q = ort_quantize(m, _samples(name, 8 if name == "digits" else 2, 0),
                     tmp_path_factory.mktemp(_id((name, options))), act="QUInt8", **options)
    g = import_onnx(q)
    assert any(n.dtype is DType.UINT8 and n.op is not Op.CONST for n in g.nodes)
    return name, g, verify(shift_uint8(g))


def test_no_uint8_value_is_left(case):
    name, g, h = case
    assert [n for n in h.nodes if n.dtype is DType.UINT8] == []
    for n in h.nodes:
        if n.op in (Op.CONV_INTEGER, Op.MATMUL_INTEGER):
            assert n.src[0].dtype is DType.INT8 and n.src[1].dtype is DType.INT8, n
    assert [n.dtype for n in h.inputs] == [n.dtype for n in g.inputs]
    assert [n.dtype for n in h.outputs] == [n.dtype for n in g.outputs]


def test_the_interpreter_computes_the_same_bits(case):
    name, g, h = case
    feed = g.inputs[0].name
    for x in _samples(name, 1 if SHAPES[name] == IMAGENET else 3, 1):
        want, got = run(g, {feed: x}), run(h, {feed: x})
        for k, v in want.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k


def test_the_cpu_backend_equals_the_interpreter(case):
    name, g, _ = case
    opt = optimize(g)
    assert not [n for n in opt.nodes if n.dtype is DType.UINT8]
    ex = GraphExecutor(lower_graph(opt, "cpu", threads=2)[0])
    feed = g.inputs[0].name
    for x in _samples(name, 1, 2):
        (want,) = run(g, {feed: x}).values()
        ex.set_input(feed, x)
        ex.run()
        np.testing.assert_array_equal(ex.get_output(0), want)


def _uint8_model() -> onnx.ModelProto:
    """A QOperator model that takes and returns uint8: QLinearConv → MaxPool → QLinearConv."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "xs": np.float32(0.02), "xz": np.uint8(131), "w1": rng.integers(-127, 128, (6, 3, 3, 3),
                                                                        dtype=np.int8),
        "w1s": rng.uniform(0.002, 0.01, 6).astype(np.float32), "w1z": np.zeros(6, np.int8),
        "ys": np.float32(0.05), "yz": np.uint8(0), "w2": rng.integers(-127, 128, (4, 6, 1, 1),
                                                                      dtype=np.int8),
        "w2s": np.float32(0.004), "w2z": np.int8(0), "zs": np.float32(0.03),
        "zz": np.uint8(100), "b2": rng.integers(-3000, 3000, 4).astype(np.int32)}.items()]
    nodes = [
        helper.make_node("QLinearConv", ["x", "xs", "xz", "w1", "w1s", "w1z", "ys", "yz"], ["c"],
                         pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("QLinearConv", ["p", "ys", "yz", "w2", "w2s", "w2z", "zs", "zz", "b2"],
                         ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "u8", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 4, 4, 4])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_uint8_graph_input_and_output_keep_their_type():
    """The signature stays uint8; inside, one conversion at the input and one at the output."""
    g = import_onnx(_uint8_model())
    h = verify(shift_uint8(g))
    assert h.inputs[0].dtype is DType.UINT8 and h.outputs[0].dtype is DType.UINT8
    u8 = [n for n in h.nodes if n.dtype is DType.UINT8]
    assert [n.op for n in u8] == [Op.INPUT, Op.REQUANTIZE], u8  # the input, the conversion
    assert all(n.src[0].dtype is DType.INT8 for n in h.nodes if n.op is Op.CONV_INTEGER)
    ex = GraphExecutor(lower_graph(optimize(g), "cpu", threads=2)[0])
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.integers(0, 256, (1, 3, 8, 8)).astype(np.uint8)
        (want,) = run(g, {"x": x}).values()
        (got,) = run(h, {"x": x}).values()
        assert got.dtype == np.uint8 and np.array_equal(got, want)
        ex.set_input("x", x)
        ex.run()
        np.testing.assert_array_equal(ex.get_output(0), want)
