"""QDQ patterns and QLinear operators → the integer graph (frontend.qdq), one pattern per case:
the integer ops it becomes, agreement with onnxruntime running the same model (within one step;
see the module docstring of frontend.qdq for where rounding differs), the CPU backend equal to
the interpreter bit for bit, and the errors for quantised forms that cannot be made integer."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_reference import reference_session

from vtakit.compiler.errors import UnsupportedError
from vtakit.compiler.frontend import import_onnx
from vtakit.compiler.ir import Op, run
from vtakit.compiler.lowering import lower_graph
from vtakit.compiler.pipeline import optimize
from vtakit.runtime import GraphExecutor

ort = pytest.importorskip("onnxruntime", reason="pip install 'vtakit[dev]'")

FLOAT_OPS = {Op.CONV, Op.GEMM, Op.MATMUL, Op.ADD, Op.MAX_POOL, Op.AVG_POOL, Op.GLOBAL_AVG_POOL,
             Op.RELU, Op.CLIP, Op.CONCAT}


@dataclass
class Qdq:
    """A QDQ model under construction: the float input 'x' is quantised to 'xq'."""

    shape: tuple[int, ...]
    act: int = TensorProto.UINT8
    x_scale: float = 0.03
    x_zp: int = 120
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.np_act = np.uint8 if self.act == TensorProto.UINT8 else np.int8
        self.quantize("x", "xq", self.x_scale, self.x_zp)

    def init(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, ins: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def quantize(self, x: str, out: str, scale: float, zp: int) -> str:
        s = self.init(f"{out}_s", np.float32(scale))
        z = self.init(f"{out}_z", self.np_act(zp))
        return self.node("QuantizeLinear", [x, s, z], out)

    def dq(self, q: str, out: str | None = None) -> str:
        """DequantizeLinear of q (made by quantize) with its scale and zero point."""
        return self.node("DequantizeLinear", [q, f"{q}_s", f"{q}_z"], out or f"{q}_dq")

    def weight(self, name: str, shape: tuple[int, ...], axis: int | None = 0,
               dtype=np.int8) -> str:
        """DQ of random int8 weights, per channel along axis (None: per tensor)."""
        w = self.rng.integers(-127, 128, shape).astype(dtype)
        n = 1 if axis is None else shape[axis]
        s = self.rng.uniform(0.002, 0.01, n).astype(np.float32)
        z = np.zeros(n, dtype)
        args = [self.init(name, w), self.init(f"{name}_s", s if axis is not None else s[0]),
                self.init(f"{name}_z", z if axis is not None else z[0])]
        return self.node("DequantizeLinear", args, f"{name}_dq",
                         **({} if axis is None else {"axis": axis}))

    def bias(self, name: str, n: int, x_scale: float, w: str) -> str:
        """DQ of an int32 bias in the scale x_scale * w_scale."""
        ws = next(numpy_helper.to_array(i) for i in self.inits if i.name == f"{w}_s")
        b = self.rng.integers(-2000, 2000, n).astype(np.int32)
        args = [self.init(name, b), self.init(f"{name}_s", (x_scale * ws).astype(np.float32)),
                self.init(f"{name}_z", np.zeros(n, np.int32))]
        return self.node("DequantizeLinear", args, f"{name}_dq", axis=0)

    def model(self, q_out: str, out_shape: tuple[int, ...], opset: int = 13):
        """The model whose output is the int8/uint8 tensor q_out."""
        graph = helper.make_graph(
            self.nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              list(self.shape))],
            [helper.make_tensor_value_info(q_out, self.act, list(out_shape))], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m


def _check(model, ops: set[Op], *, seeds: int = 3, exact: float = 0.9) -> None:
    """Imported integer (ops present, no float op of FLOAT_OPS), within one step of ORT on
    every output, equal to ORT on at least `exact` of them, CPU = interpreter."""
    g = import_onnx(model)
    have = {n.op for n in g.nodes}
    assert ops <= have, (ops - have, have)
    assert not [n for n in g.nodes if n.op in FLOAT_OPS and n.dtype.is_float]
    sess = reference_session(model)
    ex = GraphExecutor(lower_graph(optimize(g), "cpu", threads=2)[0])
    shape = g.inputs[0].shape
    diffs = []
    for seed in range(seeds):
        x = (np.random.default_rng(seed).standard_normal(shape) * 2).astype(np.float32)
        (ours,) = run(g, {"x": x}).values()
        (ref,) = sess.run(None, {"x": x})
        ex.set_input("x", x)
        ex.run()
        np.testing.assert_array_equal(ex.get_output(0), ours)
        assert ours.dtype == ref.dtype
        diffs.append((ours.astype(int) - ref.astype(int)).ravel())
    d = np.concatenate(diffs)
    assert np.abs(d).max() <= 1 and np.mean(d == 0) >= exact, (np.abs(d).max(), np.mean(d == 0))


def _conv_model(act, group: int, relu: str | None, weights: str, bias: str):
    b = Qdq((1, 4, 9, 9), act, x_zp=120 if act == TensorProto.UINT8 else -7)
    cout, cin = (4, 1) if group == 4 else (6, 4)
    if weights == "q_of_float":  # PyTorch-style: the float weights with their own Q -> DQ
        wf = b.init("wf", b.rng.standard_normal((cout, cin, 3, 3)).astype(np.float32) * 0.1)
        s = b.init("w_s", np.full(cout, 0.003, np.float32))
        z = b.init("w_z", np.zeros(cout, np.int8))
        w = b.node("DequantizeLinear", [b.node("QuantizeLinear", [wf, s, z], "wq", axis=0), s,
                                        z], "w_dq", axis=0)
    else:
        w = b.weight("w", (cout, cin, 3, 3), 0 if weights == "per_channel" else None)
    ins = [b.dq("xq"), w]
    if bias == "int32":
        ins.append(b.bias("b", cout, b.x_scale, "w") if weights != "q_of_float" else
                   b.init("bf", np.linspace(-0.5, 0.5, cout, dtype=np.float32)))
    elif bias == "float":
        ins.append(b.init("bf", np.linspace(-0.5, 0.5, cout, dtype=np.float32)))
    y = b.node("Conv", ins, "y", pads=[1, 1, 1, 1], strides=[2, 2], group=group)
    if relu == "relu":
        y = b.node("Relu", [y], "y_relu")
    elif relu == "clip":
        y = b.node("Clip", [y, b.init("lo", np.float32(0)), b.init("hi", np.float32(0.6))],
                   "y_clip")
    b.quantize(y, "yq", 0.02, 0 if relu and act == TensorProto.UINT8 else
               (-128 if relu else 3))
    return b.model("yq", (1, cout, 5, 5))


@pytest.mark.parametrize(("act", "group", "relu", "weights", "bias"), [
    (TensorProto.UINT8, 1, "relu", "per_channel", "int32"),
    (TensorProto.INT8, 1, None, "per_tensor", "float"),
    (TensorProto.INT8, 4, "clip", "per_channel", "none"),  # depthwise
    (TensorProto.UINT8, 1, "clip", "q_of_float", "int32"),
])
def test_conv(act, group, relu, weights, bias):
    _check(_conv_model(act, group, relu, weights, bias), {Op.CONV_INTEGER, Op.REQUANTIZE})


@pytest.mark.parametrize("form", ["gemm", "matmul", "two_activations"])
def test_gemm_and_matmul(form):
    b = Qdq((4, 16), TensorProto.INT8, x_zp=5)
    if form == "gemm":
        w = b.weight("w", (8, 16), 0)
        y = b.node("Gemm", [b.dq("xq"), w, b.bias("b", 8, b.x_scale, "w")], "y", transB=1)
        shape = (4, 8)
    elif form == "matmul":  # per output column
        y = b.node("MatMul", [b.dq("xq"), b.weight("w", (16, 8), 1)], "y")
        shape = (4, 8)
    else:  # per tensor
        t = b.node("Transpose", [b.dq("xq", "xq_dq2")], "t", perm=[1, 0])
        b.quantize(t, "tq", b.x_scale, b.x_zp)
        y = b.node("MatMul", [b.dq("xq"), b.dq("tq")], "y")
        shape = (4, 4)
    b.quantize(y, "yq", 0.5 if form == "two_activations" else 0.05, -2)
    _check(b.model("yq", shape), {Op.MATMUL_INTEGER, Op.REQUANTIZE})


@pytest.mark.parametrize("act", [TensorProto.UINT8, TensorProto.INT8])
def test_add_relu_and_pools(act):
    b = Qdq((1, 4, 8, 8), act, x_zp=128 if act == TensorProto.UINT8 else 0)
    lo = 0 if act == TensorProto.UINT8 else -128
    w = b.weight("w", (4, 4, 1, 1), 0)
    y = b.node("Conv", [b.dq("xq"), w], "y")
    b.quantize(y, "yq", 0.05, lo + 100)
    a = b.node("Relu", [b.node("Add", [b.dq("xq", "xq_dq2"), b.dq("yq")], "a")],
               "a_relu")
    b.quantize(a, "aq", 0.04, lo)
    p = b.node("MaxPool", [b.dq("aq")], "p", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
               strides=[2, 2])
    b.quantize(p, "pq", 0.04, lo)  # same scale: MAX_POOL on the integers
    p2 = b.node("AveragePool", [b.dq("pq")], "p2", kernel_shape=[2, 2], strides=[1, 1],
                pads=[1, 1, 0, 0], count_include_pad=1)
    b.quantize(p2, "p2q", 0.03, lo + 2)
    gp = b.node("GlobalAveragePool", [b.dq("p2q")], "gp")
    b.quantize(gp, "gpq", 0.02, lo + 5)
    _check(b.model("gpq", (1, 4, 1, 1)), {Op.CONV_INTEGER, Op.ADD, Op.MAX_POOL, Op.REDUCE_SUM},
           exact=0.5)


def test_moves_concat_and_rescale():
    b = Qdq((1, 3, 4, 4), TensorProto.INT8, x_zp=-3)
    t = b.node("Transpose", [b.dq("xq")], "t", perm=[0, 2, 3, 1])
    b.quantize(t, "tq", b.x_scale, b.x_zp)
    f = b.node("Flatten", [b.dq("tq")], "f")
    b.quantize(f, "fq", 0.05, 4)  # another scale: the reshape, then a rescale
    c = b.node("Clip", [b.dq("fq"), b.init("c_lo", np.float32(-1)),
                        b.init("c_hi", np.float32(1.5))], "c")
    b.quantize(c, "cq", 0.05, 4)
    r = b.node("Reshape", [b.dq("xq", "xq_dq2"), b.init("shape", np.array([1, 48]))], "r")
    b.quantize(r, "rq", b.x_scale, b.x_zp)
    cat = b.node("Concat", [b.dq("cq"), b.dq("rq")], "cat", axis=1)
    b.quantize(cat, "catq", 0.04, 0)
    req = b.dq("catq", "req")  # Q(DQ(x)) with another scale: a rescale
    b.quantize(req, "reqq", 0.07, -10)
    _check(b.model("reqq", (1, 96)), {Op.TRANSPOSE, Op.RESHAPE, Op.CONCAT, Op.REQUANTIZE},
           exact=0.8)


def test_average_pool_with_partial_windows_stays_float():
    b = Qdq((1, 2, 5, 5), TensorProto.UINT8)
    p = b.node("AveragePool", [b.dq("xq")], "p", kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    b.quantize(p, "pq", 0.03, 120)
    g = import_onnx(b.model("pq", (1, 2, 6, 6)))
    assert [n.op for n in g.nodes if n.op is Op.AVG_POOL] == [Op.AVG_POOL]


def test_qlinear_operators_become_integer_ops():
    b = Qdq((1, 4, 6, 6), TensorProto.UINT8, x_zp=128)
    w = b.rng.integers(-127, 128, (5, 4, 3, 3)).astype(np.int8)
    args = ["xq", "xq_s", "xq_z", b.init("w", w),
            b.init("ws", b.rng.uniform(0.002, 0.01, 5).astype(np.float32)),
            b.init("wz", np.zeros(5, np.int8)), b.init("ys", np.float32(0.1)),
            b.init("yz", np.uint8(100)), b.init("b", np.arange(-2, 3, dtype=np.int32) * 500)]
    y = b.node("QLinearConv", args, "y", pads=[1, 1, 1, 1])
    b.node("Reshape", [y, b.init("shape", np.array([5, 36]))], "r")
    m = b.rng.integers(-127, 128, (36, 3)).astype(np.int8)
    args = ["r", "ys", "yz", b.init("m", m), b.init("ms", np.float32(0.01)),
            b.init("mz", np.int8(0)), b.init("zs", np.float32(0.5)), b.init("zz", np.uint8(7))]
    b.node("QLinearMatMul", args, "z")
    _check(b.model("z", (5, 3)), {Op.CONV_INTEGER, Op.MATMUL_INTEGER, Op.REQUANTIZE})
    literal = {n.op for n in import_onnx(b.model("z", (5, 3)), integer=False).nodes}
    assert {Op.QLINEAR_CONV, Op.QLINEAR_MATMUL} <= literal


def test_single_q_dq_nodes_and_float_weights_stay_as_written():
    b = Qdq((1, 3, 4, 4))
    y = b.node("Conv", [b.dq("xq"), b.init("w", np.ones((2, 3, 1, 1), np.float32))], "y")
    b.quantize(y, "yq", 0.1, 0)  # float weights: not a quantised conv, it stays float
    g = import_onnx(b.model("yq", (1, 2, 4, 4)))
    assert {Op.CONV, Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR} <= {n.op for n in g.nodes}


def _error_model(case: str):
    b = Qdq((1, 2, 4, 4), TensorProto.INT8, x_zp=0)
    x = b.dq("xq")
    w = b.weight("w", (3, 2, 1, 1), 1 if case == "weight_axis" else 0)
    if case == "runtime_scale":
        b.nodes[-1].input[1] = "w_scale_in"  # the weights' scale is a graph input
        b.nodes.insert(0, helper.make_node("Identity", ["x_scale"], ["w_scale_in"]))
    if case == "per_channel_activation":
        b.init("xc_s", np.full(2, 0.1, np.float32))
        b.init("xc_z", np.zeros(2, np.int8))
        x = b.node("DequantizeLinear", ["xq2", "xc_s", "xc_z"], "x_pc", axis=1)
        b.nodes.insert(1, helper.make_node("QuantizeLinear", ["x", "xc_s", "xc_z"], ["xq2"],
                                           axis=1))
    b.node("Conv", [x, w], "y")
    if case == "int16":
        b.init("y_s", np.float32(0.1))
        b.init("y_z", np.int16(0))
        b.node("QuantizeLinear", ["y", "y_s", "y_z"], "yq")
        out, t = "yq", TensorProto.INT16
    else:
        out, t = b.quantize("y", "yq", 0.1, 0), TensorProto.INT8
    graph = helper.make_graph(b.nodes, "e", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
        *([helper.make_tensor_value_info("x_scale", TensorProto.FLOAT, [3])]
          if case == "runtime_scale" else [])],
        [helper.make_tensor_value_info(out, t, [1, 3, 4, 4])], b.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize(("case", "message"), [
    ("runtime_scale", r"quantised CONV 'y': DequantizeLinear 'w_dq' has a scale or zero point "
                      r"computed at run time; supported: constants \(initializers\)"),
    ("int16", r"quantised CONV 'y': QuantizeLinear 'yq' is int16; supported: int8, uint8"),
    ("weight_axis", r"quantised CONV 'y': DequantizeLinear 'w_dq' has per-channel scales along "
                    r"axis 1; supported: one scale, or one per output channel \(axis 0\)"),
    ("per_channel_activation", r"quantised CONV 'y': DequantizeLinear 'x_pc' has 2 scales \(per "
                               r"channel\) on an activation; supported: one scale per tensor"),
])
def test_unsupported_quantised_forms(case, message):
    with pytest.raises(UnsupportedError, match=message):
        import_onnx(_error_model(case))


def test_blocked_and_int4_quantisation_name_the_node():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])
    w4 = helper.make_tensor("w4", TensorProto.INT4, [4, 4], [1] * 16)
    s = numpy_helper.from_array(np.full((4, 2), 0.1, np.float32), "s")
    dq = helper.make_node("DequantizeLinear", ["w4", "s"], ["w"], name="dq_w", axis=1,
                          block_size=2)
    mm = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    graph = helper.make_graph([dq, mm], "g", [x], [y], [w4, s])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    with pytest.raises(UnsupportedError, match=r"initializer 'w4' read by node 'dq_w' "
                                               r"\(DequantizeLinear\): INT4 tensors are not"):
        import_onnx(m)
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((4, 4), np.int8), "w4"))
    with pytest.raises(UnsupportedError, match=r"node 'dq_w' \(DequantizeLinear\): blocked "
                                               r"quantisation \(block_size > 0\) is not"):
        import_onnx(m)
