"""Models quantised by onnxruntime in its operator form (``quantize_static(...,
quant_format=QuantFormat.QOperator)``: QLinearConv, QLinearMatMul and the 'com.microsoft'
QLinearAdd, QLinearAveragePool, QLinearGlobalAveragePool, QLinearConcat, QGemm...) → `import_onnx`:
against onnxruntime running the same model the same top-1 and >= 99% of the int8 outputs within a
step (see test_qdq_onnxruntime.py for why a step); the same integer ops as the QDQ form of the
same model, and no float op the QDQ form does not have; on the accelerator, every layer offloaded
and the outputs bit for bit the CPU-int8 path's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_reference import reference_session
from test_qdq_onnxruntime import compare, ort_quantize

from vtakit import digits, models
from vtakit.compiler.compile import compile_model
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.ir import DType, Graph, Op, run, verify
from vtakit.compiler.passes import shift_uint8
from vtakit.runtime import Artifact
from vtakit.runtime.executor import GraphExecutor

pytest.importorskip("onnxruntime.quantization", reason="pip install 'vtakit[dev]'")

MS = "com.microsoft"


def _samples(shape: tuple[int, ...], n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _contrib_ops(q: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in q.graph.node if n.domain == MS}


def _ops(g: Graph) -> Counter:
    return Counter(n.op for n in g.nodes if n.op is not Op.CONST)


def _float_ops(g: Graph) -> set[Op]:
    """The float computations (quantisation at the edges aside)."""
    edge = (Op.INPUT, Op.CONST, Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR)
    return {n.op for n in g.nodes if n.dtype.is_float and n.op not in edge}


def check_shift_uint8(g: Graph, x: np.ndarray) -> None:
    """shift_uint8 leaves no uint8 value inside the graph and computes the same bits."""
    h = verify(shift_uint8(g))
    left = [n.name for n in h.nodes if n.dtype is DType.UINT8 and n.op is not Op.INPUT]
    assert not left, left
    feed = g.inputs[0].name
    for want, got in zip(run(g, {feed: x}).values(), run(h, {feed: x}).values(), strict=True):
        np.testing.assert_array_equal(got, want)


def both_forms(model: onnx.ModelProto, calib: list[np.ndarray], tmp_path: Path,
               **options) -> tuple[onnx.ModelProto, Graph, Graph]:
    """(the QOperator model, its integer graph, the QDQ model's integer graph)."""
    for d in ("qop", "qdq"):
        (tmp_path / d).mkdir()
    q = ort_quantize(model, calib, tmp_path / "qop", fmt="QOperator", **options)
    qdq = ort_quantize(model, calib, tmp_path / "qdq", fmt="QDQ", **options)
    return q, import_onnx(q), import_onnx(qdq)


OPTIONS = {"s8-pc": dict(act="QInt8", per_channel=True),
           "s8-pt": dict(act="QInt8", per_channel=False),
           "u8-pc": dict(act="QUInt8", per_channel=True),
           "u8-pt": dict(act="QUInt8", per_channel=False, reduce_range=True)}


def _model(name: str) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    if name == "digits":
        return digits.load_model(), (1, 1, 8, 8)
    return getattr(models, name)(), {"lenet": (1, 1, 28, 28), "resnet18": (1, 3, 224, 224)}[name]


def _calibration(name: str, shape: tuple[int, ...], n: int, seed: int) -> list[np.ndarray]:
    if name == "digits":
        x = digits.calibration_set() if seed == 0 else digits.test_split()[0]
        return [v[None] for v in x[:n]]
    return _samples(shape, n, seed)


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("name", ["digits", "lenet"])
def test_small_models(name, options, tmp_path):
    """With the same calibration, onnxruntime's two formats carry the same scales here: the
    QOperator model's integer graph is the QDQ model's, bit for bit."""
    m, shape = _model(name)
    q, g, g_qdq = both_forms(m, _calibration(name, shape, 8, 0), tmp_path, **options)
    assert "QGemm" in _contrib_ops(q)
    assert _ops(g) == _ops(g_qdq) and not _float_ops(g)
    tests = _calibration(name, shape, 32 if name == "digits" else 8, 1)
    feed = g.inputs[0].name
    for x in tests[:4]:
        (ours,), (theirs,) = run(g, {feed: x}).values(), run(g_qdq, {feed: x}).values()
        np.testing.assert_array_equal(ours, theirs)
    check_shift_uint8(g, tests[0])
    top1, within, worst = compare(q, tests, cpu_samples=2)
    assert top1 == 1.0 and within >= 0.99, (top1, within, worst)


@pytest.mark.slow
@pytest.mark.parametrize("act", ["QInt8", "QUInt8"])
def test_resnet18(act, tmp_path):
    """QLinearAdd (8 residual adds), QLinearGlobalAveragePool and QGemm, batch norms folded by
    quant_pre_process first."""
    m, shape = _model("resnet18")
    q, g, g_qdq = both_forms(m, _samples(shape, 2, 0), tmp_path, act=act, per_channel=True,
                             pre_process=True)
    assert {"QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= _contrib_ops(q)
    assert _ops(g) == _ops(g_qdq) and not _float_ops(g)
    tests = _samples(shape, 2, 1)
    feed = g.inputs[0].name
    (ours,), (theirs,) = run(g, {feed: tests[0]}).values(), run(g_qdq, {feed: tests[0]}).values()
    np.testing.assert_array_equal(ours, theirs)
    check_shift_uint8(g, tests[1])
    top1, within, worst = compare(q, tests)
    assert top1 == 1.0 and within >= 0.99, (top1, within, worst)


def hand_built(kind: str) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """conv -> relu -> average pool -> two convs, then for "integer": a residual Add, Concat,
    AveragePool (padded, count_include_pad), GlobalAveragePool; for "float": LeakyRelu,
    Sigmoid, Mul, AveragePool with partial windows, GlobalAveragePool; -> Flatten -> Gemm
    (-> Softmax for "float")."""
    rng = np.random.default_rng(0)
    init: list[onnx.TensorProto] = []

    def w(name: str, *shape: int) -> str:
        v = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        init.append(numpy_helper.from_array(v.astype(np.float32), name))
        return name

    def b(name: str, n: int) -> str:
        init.append(numpy_helper.from_array((0.1 * rng.standard_normal(n)).astype(np.float32),
                                            name))
        return name

    node = helper.make_node
    nodes = [node("Conv", ["x", w("w1", 16, 3, 3, 3), b("b1", 16)], ["c1"], kernel_shape=[3, 3],
                  pads=[1] * 4),
             node("Relu", ["c1"], ["r1"]),
             node("AveragePool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             node("Conv", ["p1", w("w2", 16, 16, 3, 3), b("b2", 16)], ["c2"],
                  kernel_shape=[3, 3], pads=[1] * 4),
             node("Conv", ["p1", w("w3", 8, 16, 1, 1), b("b3", 8)], ["c3"], kernel_shape=[1, 1])]
    if kind == "integer":
        nodes += [node("Add", ["p1", "c2"], ["s"]),
                  node("Concat", ["s", "c3"], ["cat"], axis=1),
                  node("AveragePool", ["cat"], ["p2"], kernel_shape=[3, 3], pads=[1] * 4,
                       count_include_pad=1),
                  node("GlobalAveragePool", ["p2"], ["g"])]
        features, last = 24, "y"
    else:
        for name, v in (("start", [0]), ("end", [8]), ("axis", [1])):
            init.append(numpy_helper.from_array(np.array(v, np.int64), name))
        nodes += [node("LeakyRelu", ["c2"], ["l"], alpha=0.1),
                  node("Slice", ["l", "start", "end", "axis"], ["half"]),
                  node("Sigmoid", ["c3"], ["sg"]),
                  node("Mul", ["half", "sg"], ["s"]),
                  node("AveragePool", ["s"], ["p2"], kernel_shape=[3, 3], pads=[1] * 4),
                  node("GlobalAveragePool", ["p2"], ["g"])]
        features, last = 8, "z"
    nodes += [node("Flatten", ["g"], ["f"]),
              node("Gemm", ["f", w("wd", 10, features), b("bd", 10)], [last], transB=1)]
    if kind == "float":
        nodes.append(node("Softmax", ["z"], ["y"], axis=1))
    shape = (1, 3, 12, 12)
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                           shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, shape


CONTRIB = {"integer": {"QLinearAdd", "QLinearConcat", "QLinearAveragePool",
                       "QLinearGlobalAveragePool", "QGemm"},
           "float": {"QLinearLeakyRelu", "QLinearSigmoid", "QLinearMul", "QLinearAveragePool",
                     "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax"}}


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("kind", ["integer", "float"])
def test_hand_built(kind, options, tmp_path):
    """The QDQ form's ops (its scales differ: in QDQ onnxruntime gives an AveragePool its
    input's scale); "float" keeps as float what the QDQ form keeps (LeakyRelu, Sigmoid, Mul,
    Softmax, the AveragePool with partial windows)."""
    m, shape = hand_built(kind)
    q, g, g_qdq = both_forms(m, _samples(shape, 4, 0), tmp_path, **options)
    assert _contrib_ops(q) == CONTRIB[kind]
    assert _ops(g) == _ops(g_qdq)
    assert _float_ops(g) == _float_ops(g_qdq) == (
        set() if kind == "integer" else
        {Op.LEAKY_RELU, Op.SIGMOID, Op.MUL, Op.AVG_POOL, Op.SOFTMAX})
    check_shift_uint8(g, _samples(shape, 1, 2)[0])
    top1, within, worst = compare(q, _samples(shape, 8, 1), cpu_samples=2)
    assert top1 == 1.0 and within >= 0.99, (top1, within, worst)


def test_an_opset_11_model(tmp_path):
    """Converted to opset 13 on import (`upgrade_opset`) with its contrib operators."""
    m, shape = hand_built("integer")
    m.opset_import[0].version = 11
    q = ort_quantize(m, _samples(shape, 4, 0), tmp_path, fmt="QOperator")
    assert _default_opset(q) == 11 and _contrib_ops(q) == CONTRIB["integer"]
    top1, within, worst = compare(q, _samples(shape, 4, 1))
    assert top1 == 1.0 and within >= 0.99, (top1, within, worst)


def _default_opset(q: onnx.ModelProto) -> int:
    return next(o.version for o in q.opset_import if o.domain in ("", "ai.onnx"))


def offloaded(q: onnx.ModelProto, xs: list[np.ndarray]) -> Counter:
    """Compile q for the accelerator: nothing falls back to the CPU and the outputs are the
    CPU-int8 path's bit for bit; the kinds of the accelerator's layers."""
    art = Artifact.load(compile_model(q, target="vta").to_bytes())
    meta = art.plan.sections["vta"].meta
    assert meta["cpu_fallback"] == {}
    vta, cpu = GraphExecutor(art), GraphExecutor(compile_model(q, target="cpu"))
    try:
        for x in xs:
            for ex in (vta, cpu):
                ex.set_input(0, x)
                ex.run()
            np.testing.assert_array_equal(vta.get_output(0), cpu.get_output(0))
    finally:
        vta.close()
    return Counter(L["kind"] for r in meta["regions"] for L in r["layers"])


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
@pytest.mark.parametrize("name", ["digits", "lenet"])
def test_on_the_accelerator(name, options, tmp_path):
    m, shape = _model(name)
    q = ort_quantize(m, _calibration(name, shape, 8, 0), tmp_path, fmt="QOperator", **options)
    kinds = offloaded(q, _calibration(name, shape, 3, 1))
    types = Counter(n.op_type for n in q.graph.node)
    assert kinds == Counter(conv2d=types["QLinearConv"], dense=types["QGemm"],
                            max_pool=types["MaxPool"]), kinds


@pytest.mark.parametrize("options", [OPTIONS["s8-pc"], OPTIONS["u8-pt"]], ids=["s8-pc", "u8-pt"])
def test_add_and_pools_on_the_accelerator(options, tmp_path):
    """QLinearAdd, QLinearAveragePool and QLinearGlobalAveragePool become the accelerator's add
    and pool layers, as their QDQ forms do."""
    m, shape = hand_built("integer")
    calib, xs = _samples(shape, 4, 0), _samples(shape, 2, 1)
    for d in ("qop", "qdq"):
        (tmp_path / d).mkdir()
    kinds = [offloaded(ort_quantize(m, calib, tmp_path / d, fmt=fmt, **options), xs)
             for d, fmt in (("qop", "QOperator"), ("qdq", "QDQ"))]
    assert kinds[0] == kinds[1] and kinds[0]["add"] == 1 and kinds[0]["avg_pool"] == 3, kinds


def _one_node(node: onnx.NodeProto, inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray],
              out_type: int, out_shape: tuple[int, ...]) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in inputs.items()]
    graph = helper.make_graph([node], node.op_type, vis,
                              [helper.make_tensor_value_info("y", out_type, out_shape)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def _cases(np_type: type) -> list[tuple[str, onnx.NodeProto, dict, tuple[int, ...], bool]]:
    """(id, node, inputs, output shape, integer form expected): the forms ORT's quantiser does
    not write for the models above."""
    rng = np.random.default_rng(0)
    info = np.iinfo(np_type)

    def ints(*shape: int) -> np.ndarray:
        return rng.integers(info.min, info.max + 1, shape).astype(np_type)

    nhwc, x3 = ints(1, 6, 6, 4), ints(2, 3, 5)
    q = ["x", "xs", "xz", "ys", "yz"]
    ms = dict(domain=MS)
    node = helper.make_node
    gemm = ["x", "xs", "xz", "w", "ws", "wz"]
    return [
        ("avgpool-nhwc", node("QLinearAveragePool", q, ["y"], kernel_shape=[3, 3],
                              channels_last=1, **ms), {"x": nhwc}, (1, 4, 4, 4), True),
        ("gap-nhwc", node("QLinearGlobalAveragePool", q, ["y"], channels_last=1, **ms),
         {"x": nhwc}, (1, 1, 1, 4), True),
        # Before opset 13 Softmax normalises over the flattened axes from `axis` on.
        ("softmax-opset12", node("QLinearSoftmax", q, ["y"], axis=1, opset=12, **ms),
         {"x": x3}, x3.shape, False),
        ("softmax", node("QLinearSoftmax", q, ["y"], axis=1, opset=13, **ms), {"x": x3},
         x3.shape, False),
        ("where", node("QLinearWhere", ["cond", "x", "xs", "xz", "x2", "ys", "xz", "ys", "yz"],
                       ["y"], **ms),
         {"cond": rng.integers(0, 2, x3.shape).astype(bool), "x": x3, "x2": ints(2, 3, 5)},
         x3.shape, False),
        # One int32 C for every column, per-column b, alpha: C is in the scale alpha * a_s * b_s.
        ("gemm-scalar-c-alpha", node("QGemm", [*gemm, "c", "ys", "yz"], ["y"], alpha=0.5, **ms),
         {"x": ints(3, 7)}, (3, 5), True),
        ("gemm-no-c", node("QGemm", [*gemm, "", "ys", "yz"], ["y"], **ms), {"x": ints(3, 7)},
         (3, 5), True),
    ]


@pytest.mark.parametrize("np_type", [np.uint8, np.int8], ids=["uint8", "int8"])
@pytest.mark.parametrize("case", range(7))
def test_other_forms_against_onnxruntime(case, np_type):
    case_id, node, inputs, out_shape, integer = _cases(np_type)[case]
    rng = np.random.default_rng(1)
    inits = {"xs": np.array(0.05, np.float32), "xz": np.array(3, np_type),
             "ys": np.array(1 / 256 if "softmax" in case_id else 0.03, np.float32),
             "yz": np.array(-128 if np_type is np.int8 else 0, np_type),
             "w": rng.integers(-127, 128, (7, 5)).astype(np.int8),
             "ws": rng.uniform(0.01, 0.02, 5).astype(np.float32),
             "wz": np.zeros(5, np.int8), "c": np.array(1000, np.int32)}
    used = set(node.input)
    m = _one_node(node, inputs, {k: v for k, v in inits.items() if k in used},
                  helper.np_dtype_to_tensor_dtype(np.dtype(np_type)), out_shape)
    g = import_onnx(m)
    has_float = bool(_float_ops(g))
    assert has_float != integer, (case_id, _ops(g))
    (ours,) = run(g, inputs).values()
    (ref,) = reference_session(m).run(None, inputs)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    steps = np.abs(ours.astype(np.int64) - ref.astype(np.int64))
    assert np.mean(steps <= 1) >= 0.99 and steps.max() <= 2, (case_id, steps.max())
