"""onnxruntime's quantised 'com.microsoft' operators (frontend.ms_ops): each imports as the graph
of its QDQ form (the same ops, the same bits), and the errors for what is not supported or not
valid. The comparisons with onnxruntime are in tests/integration/test_qoperator_onnxruntime.py."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from vtakit.compiler.errors import InvalidModelError, UnsupportedError
from vtakit.compiler.frontend import import_onnx
from vtakit.compiler.ir import Graph, Op, run

U8, I8 = TensorProto.UINT8, TensorProto.INT8
MS = "com.microsoft"


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                   helper.make_opsetid(MS, 1)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _n(op, inputs, output, **attrs):
    domain = MS if op.startswith(("QLinear", "QGemm")) else ""
    return helper.make_node(op, inputs, [output], name=output, domain=domain, **attrs)


def _params(np_type):
    """Scales and zero points of the inputs a, b, c and the output y."""
    s = {k: np.array(v, np.float32) for k, v in dict(sa=0.04, sb=0.025, sc=0.05, sy=0.06).items()}
    signed = np_type is np.int8
    z = {k: np.array(v, np_type) for k, v in dict(za=7, zb=-3 if signed else 130, zc=1,
                                                   zy=-20 if signed else 100).items()}
    return s | z


def _same_graph(contrib: Graph, qdq: Graph, feeds: dict[str, np.ndarray]) -> None:
    ops = [Counter(n.op for n in g.nodes if n.op is not Op.CONST) for g in (contrib, qdq)]
    assert ops[0] == ops[1], (ops[0] - ops[1], ops[1] - ops[0])
    ours, want = (list(run(g, feeds).values()) for g in (contrib, qdq))
    for a, b in zip(ours, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def _dq(x, s, z, out):
    return _n("DequantizeLinear", [x, s, z], out)


# (name, contrib nodes, the same as QDQ nodes, input shapes a / b, output shape); every model
# reads the int8 / uint8 inputs 'a' and 'b' and writes 'y'.
CASES = [
    ("add", [_n("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], "y")],
     [_dq("a", "sa", "za", "fa"), _dq("b", "sb", "zb", "fb"), _n("Add", ["fa", "fb"], "f"),
      _n("QuantizeLinear", ["f", "sy", "zy"], "y")], (1, 4, 3, 3), (1, 4, 3, 3), (1, 4, 3, 3)),
    # Zero points left out are 0 of the operands' type.
    ("add-no-zero-points", [_n("QLinearAdd", ["a", "sa", "", "b", "sb", "", "sy", ""], "y")],
     [_n("DequantizeLinear", ["a", "sa"], "fa"), _n("DequantizeLinear", ["b", "sb"], "fb"),
      _n("Add", ["fa", "fb"], "f"), _n("QuantizeLinear", ["f", "sy", "z0"], "y")],
     (1, 4, 3, 3), (1, 4, 3, 3), (1, 4, 3, 3)),
    ("mul", [_n("QLinearMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], "y")],
     [_dq("a", "sa", "za", "fa"), _dq("b", "sb", "zb", "fb"), _n("Mul", ["fa", "fb"], "f"),
      _n("QuantizeLinear", ["f", "sy", "zy"], "y")], (1, 4, 3, 3), (1, 4, 1, 1), (1, 4, 3, 3)),
    ("concat", [_n("QLinearConcat", ["sy", "zy", "a", "sa", "za", "b", "sb", "zb"], "y",
                   axis=1)],
     [_dq("a", "sa", "za", "fa"), _dq("b", "sb", "zb", "fb"),
      _n("Concat", ["fa", "fb"], "f", axis=1), _n("QuantizeLinear", ["f", "sy", "zy"], "y")],
     (1, 4, 3, 3), (1, 2, 3, 3), (1, 6, 3, 3)),
    ("average-pool", [_n("QLinearAveragePool", ["a", "sa", "za", "sy", "zy"], "y",
                         kernel_shape=[2, 2], strides=[2, 2])],
     [_dq("a", "sa", "za", "fa"), _n("AveragePool", ["fa"], "f", kernel_shape=[2, 2],
                                     strides=[2, 2]),
      _n("QuantizeLinear", ["f", "sy", "zy"], "y")], (1, 4, 4, 4), None, (1, 4, 2, 2)),
    ("global-average-pool", [_n("QLinearGlobalAveragePool", ["a", "sa", "za", "sy", "zy"], "y",
                                channels_last=0)],
     [_dq("a", "sa", "za", "fa"), _n("GlobalAveragePool", ["fa"], "f"),
      _n("QuantizeLinear", ["f", "sy", "zy"], "y")], (1, 4, 3, 3), None, (1, 4, 1, 1)),
    # NHWC: the integer tensor is transposed around the pool.
    ("global-average-pool-nhwc", [_n("QLinearGlobalAveragePool", ["a", "sa", "za", "sy", "zy"],
                                     "y", channels_last=1)],
     [_n("Transpose", ["a"], "t", perm=[0, 3, 1, 2]), _dq("t", "sa", "za", "fa"),
      _n("GlobalAveragePool", ["fa"], "f"), _n("QuantizeLinear", ["f", "sy", "zy"], "q"),
      _n("Transpose", ["q"], "y", perm=[0, 2, 3, 1])], (1, 3, 3, 4), None, (1, 1, 1, 4)),
    ("leaky-relu", [_n("QLinearLeakyRelu", ["a", "sa", "za", "sy", "zy"], "y", alpha=0.2)],
     [_dq("a", "sa", "za", "fa"), _n("LeakyRelu", ["fa"], "f", alpha=0.2),
      _n("QuantizeLinear", ["f", "sy", "zy"], "y")], (1, 4, 3, 3), None, (1, 4, 3, 3)),
    ("sigmoid", [_n("QLinearSigmoid", ["a", "sa", "za", "sy", "zy"], "y")],
     [_dq("a", "sa", "za", "fa"), _n("Sigmoid", ["fa"], "f"),
      _n("QuantizeLinear", ["f", "sy", "zy"], "y")], (1, 4, 3, 3), None, (1, 4, 3, 3)),
    # QGemm: b per column (transB: axis 0), C int32 in the scale a_scale * b_scale * alpha.
    ("gemm", [_n("QGemm", ["a", "sa", "za", "w", "sw", "zw", "c", "sy", "zy"], "y", transB=1,
                 alpha=0.5)],
     [_dq("a", "sa", "za", "fa"), _n("DequantizeLinear", ["w", "sw", "zw"], "fw", axis=0),
      _n("DequantizeLinear", ["c", "sc_gemm"], "fc", axis=0),
      _n("Gemm", ["fa", "fw", "fc"], "f", transB=1, alpha=0.5),
      _n("QuantizeLinear", ["f", "sy", "zy"], "y")], (2, 6), None, (2, 5)),
]


@pytest.mark.parametrize("act", [U8, I8], ids=["uint8", "int8"])
@pytest.mark.parametrize(("name", "contrib", "qdq", "a", "b", "y"), CASES,
                         ids=[c[0] for c in CASES])
def test_imports_as_its_qdq_form(name, contrib, qdq, a, b, y, act):
    np_type = np.uint8 if act == U8 else np.int8
    rng = np.random.default_rng(0)
    inits = _params(np_type)
    inits["z0"] = np.array(0, np_type)
    w = rng.integers(-127, 128, (5, 6)).astype(np.int8)
    sw = rng.uniform(0.01, 0.02, 5).astype(np.float32)
    inits.update(w=w, sw=sw, zw=np.zeros(5, np.int8),
                 c=rng.integers(-3000, 3000, 5).astype(np.int32),
                 sc_gemm=(0.5 * np.float64(inits["sa"]) * sw).astype(np.float32))
    shapes = {"a": a, "b": b}
    inputs = [_vi(k, act, s) for k, s in shapes.items() if s is not None]
    info = np.iinfo(np_type)
    feeds = {k: rng.integers(info.min, info.max + 1, s).astype(np_type)
             for k, s in shapes.items() if s is not None}
    graphs = [import_onnx(_model(nodes, inputs, [_vi("y", act, y)], inits))
              for nodes in (contrib, qdq)]
    _same_graph(*graphs, feeds)
    assert not any(n.op in (Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR) for n in graphs[0].nodes) \
        or name in ("mul", "leaky-relu", "sigmoid")  # float ops with no integer form


def _add(inputs=("a", "sa", "za", "b", "sb", "zb", "sy", "zy"), a=U8, b=U8):
    np_type = np.uint8
    return _model([_n("QLinearAdd", list(inputs), "y")], [_vi("a", a, [2]), _vi("b", b, [2])],
                  [_vi("y", U8, [2])], _params(np_type))


def test_another_contrib_operator_is_refused_naming_it():
    node = helper.make_node("FusedGemm", ["a", "b"], ["y"], name="fc", domain=MS)
    m = _model([node], [_vi("a", TensorProto.FLOAT, [2, 2]), _vi("b", TensorProto.FLOAT, [2, 2])],
               [_vi("y", TensorProto.FLOAT, [2, 2])], {})
    with pytest.raises(UnsupportedError, match=r"node 'fc' \(FusedGemm\): operator 'FusedGemm' "
                       r"of domain 'com.microsoft' is not supported; supported in that domain: "
                       r"QGemm, QLinearAdd, .*QLinearWhere \(onnxruntime's quantised operators\)"):
        import_onnx(m)


def test_a_missing_required_input_is_invalid():
    with pytest.raises(InvalidModelError, match=r"node 'y' \(QLinearAdd\): required input 4 "
                                                r"\(B's scale\) is missing"):
        import_onnx(_add(("a", "sa", "za", "b", "", "zb", "sy", "zy")))


def test_an_operand_that_is_not_8_bit_is_refused():
    m = _add(b=TensorProto.INT16)
    m.graph.initializer.append(numpy_helper.from_array(np.array(0, np.int16), "zb16"))
    m.graph.node[0].input[5] = "zb16"
    with pytest.raises(UnsupportedError, match=r"node 'y' \(QLinearAdd\): input 3 \(B\) 'b' is "
                                               r"int16; supported: int8, uint8"):
        import_onnx(m)


def test_concat_needs_its_axis_and_triples():
    p = _params(np.uint8)
    inputs = [_vi("a", U8, [1, 2]), _vi("b", U8, [1, 2])]
    no_axis = _n("QLinearConcat", ["sy", "zy", "a", "sa", "za", "b", "sb", "zb"], "y")
    with pytest.raises(InvalidModelError, match=r"\(QLinearConcat\): required attribute 'axis' "
                                                r"is missing"):
        import_onnx(_model([no_axis], inputs, [_vi("y", U8, [1, 4])], p))
    short = _n("QLinearConcat", ["sy", "zy", "a", "sa", "za", "b", "sb"], "y", axis=1)
    with pytest.raises(InvalidModelError, match=r"\(QLinearConcat\): 7 inputs; expected "
                                                r"Y_scale, Y_zero_point, then \(X, X_scale, "
                                                r"X_zero_point\) for each input"):
        import_onnx(_model([short], inputs, [_vi("y", U8, [1, 4])], p))


def test_gemm_output_scale_without_zero_point_is_refused():
    p = _params(np.uint8)
    p.update(w=np.ones((3, 2), np.int8), sw=np.array(0.1, np.float32), zw=np.array(0, np.int8))
    node = _n("QGemm", ["a", "sa", "za", "w", "sw", "zw", "", "sy"], "y")
    m = _model([node], [_vi("a", U8, [1, 3])], [_vi("y", U8, [1, 2])], p)
    with pytest.raises(UnsupportedError, match=r"\(QGemm\): y_scale and y_zero_point must be "
                                               r"given together"):
        import_onnx(m)


def test_gemm_without_output_scale_is_the_float_gemm():
    p = _params(np.uint8)
    p.update(w=np.ones((3, 2), np.int8), sw=np.array(0.1, np.float32), zw=np.array(0, np.int8))
    node = _n("QGemm", ["a", "sa", "za", "w", "sw", "zw"], "y")
    g = import_onnx(_model([node], [_vi("a", U8, [1, 3])],
                           [_vi("y", TensorProto.FLOAT, [1, 2])], p))
    a = np.array([[9, 7, 200]], np.uint8)
    (y,) = run(g, {"a": a}).values()
    np.testing.assert_allclose(y, np.full((1, 2), (a.astype(int) - 7).sum() * 0.04 * 0.1),
                               rtol=1e-6)


def test_without_integer_rewrite_the_qdq_form_stays():
    g = import_onnx(_add(), integer=False)
    assert Counter(n.op for n in g.nodes if n.op is not Op.CONST) == Counter(
        {Op.INPUT: 2, Op.DEQUANTIZE_LINEAR: 2, Op.ADD: 1, Op.QUANTIZE_LINEAR: 1})
    assert g.outputs[0].name == "y"
