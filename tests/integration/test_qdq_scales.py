"""onnxruntime-quantised models at extreme scales → `import_onnx` → the integer graph (the
reference interpreter, and the CPU backend bit for bit the same), against onnxruntime: the same
top-1 and the int8 outputs within one step on >= 99% of elements, or a clear error.

The case that was silently wrong: a MobileNetV2 whose last feature map is tiny (its
GlobalAveragePool's output scale 3.5e-10). onnxruntime then enlarges the classifier's weight
scales until its bias fits int32 (the bias lands at 2**31 / 1.0001), so the classifier's real
multipliers are 1.5e-10 to 6.3e-8 against accumulators past 2**31: `requant.choose` rounded
every multiplier to 0 and the model answered zeros, top-1 0 of 8, where onnxruntime matches
fp32 (correlation 0.99998). REQUANTIZE's pre-shift keeps them (15-bit multipliers).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from ort_reference import reference_session
from test_qdq_onnxruntime import IMAGENET, _random, compare, ort_quantize

from vtakit import models
from vtakit.compiler.compile import compile_model
from vtakit.compiler.errors import UnsupportedError
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.ir import Op
from vtakit.runtime import Artifact
from vtakit.runtime.executor import GraphExecutor

ort = pytest.importorskip("onnxruntime", reason="pip install 'vtakit[dev]'")


def _scaled(m: onnx.ModelProto, names: list[str], k: float) -> onnx.ModelProto:
    """m with the initializers `names` multiplied by k."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for i in m.graph.initializer:
        if i.name in names:
            v = numpy_helper.to_array(i)
            i.CopyFrom(numpy_helper.from_array((v * k).astype(v.dtype), i.name))
    return m


def _tiny_tail(k: float) -> onnx.ModelProto:
    """MobileNetV2 (seed 0) with the batch norm before the last Clip scaled by k: the
    features the GlobalAveragePool averages, and so its output, are k times smaller."""
    m = models.mobilenet_v2(seed=0)
    nodes = list(m.graph.node)
    gap = next(i for i, n in enumerate(nodes) if n.op_type == "GlobalAveragePool")
    bn = next(n for n in reversed(nodes[:gap]) if n.op_type == "BatchNormalization")
    return _scaled(m, list(bn.input[1:3]), k)


def _scale_of(q: onnx.ModelProto, tensor: str) -> float:
    qn = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    init = {i.name: i for i in q.graph.initializer}
    return float(numpy_helper.to_array(init[qn.input[1]]))


@pytest.fixture(scope="module", params=["QInt8", "QUInt8"])
def tiny_mobilenet(request, tmp_path_factory) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    m = _tiny_tail(3.4e-8)
    q = ort_quantize(m, _random(IMAGENET, 2, 0), tmp_path_factory.mktemp("q"),
                     act=request.param, pre_process=True)
    return m, q


@pytest.mark.slow
def test_mobilenet_v2_with_a_tiny_pooled_scale(tiny_mobilenet) -> None:
    m, q = tiny_mobilenet
    gap = next(n for n in q.graph.node if n.op_type == "GlobalAveragePool").output[0]
    assert 1e-10 < _scale_of(q, gap) < 1e-9  # the scenario: about 3.5e-10
    xs = _random(IMAGENET, 8, 1)
    fp, ref = reference_session(m), reference_session(q)
    r = [(fp.run(None, {"input": x})[0].ravel(), ref.run(None, {"input": x})[0].ravel())
         for x in xs[:2]]
    assert all(np.corrcoef(a, b)[0, 1] > 0.9999 for a, b in r)  # onnxruntime is right
    g = import_onnx(q)
    fc = next(n for n in g.nodes if n.op is Op.REQUANTIZE and n.src[0].op is Op.MATMUL_INTEGER)
    assert fc.attrs.pre_shift[0] > 0 and max(fc.attrs.multiplier) > 1 << 13, fc.attrs
    # all 8 on the CPU backend too (bit for bit the interpreter's)
    top1, within, worst = compare(q, xs, cpu_samples=8)
    assert top1 == 1.0 and within >= 0.99, (top1, within, worst)


LENET = (1, 1, 28, 28)


def _lenet_q(act: str, tmp: Path, float_scale: float = 1.0) -> onnx.ModelProto:
    m = models.lenet()
    if float_scale != 1.0:  # the first convolution's weights and bias: every scale after it
        conv = next(n for n in m.graph.node if n.op_type == "Conv")
        m = _scaled(m, list(conv.input[1:3]), float_scale)
    return ort_quantize(m, _random(LENET, 4, 0), tmp, act=act)


def _tensor_scale(q: onnx.ModelProto, tensor: str, f: float) -> onnx.ModelProto:
    """q with `tensor`'s scale (its QuantizeLinear and DequantizeLinear) times f, and the
    scales of the biases of the Gemm that reads it (input scale x weight scale) too: another
    valid QDQ model, which onnxruntime runs as it is."""
    qn = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    names = [qn.input[1]]
    dq_out = next(n.output[0] for n in q.graph.node
                  if n.op_type == "DequantizeLinear" and n.input[0] == qn.output[0])
    for n in q.graph.node:
        if n.op_type in ("Gemm", "Conv") and n.input[0] == dq_out and len(n.input) > 2:
            b = next(d for d in q.graph.node if d.output[0] == n.input[2])
            names.append(b.input[1])
    return _scaled(q, names, f)


@pytest.mark.parametrize("act", ["QInt8", "QUInt8"])
@pytest.mark.parametrize(("where", "f"), [
    ("output", 1e-9), ("output", 1e-5), ("output", 1e5), ("output", 1e9),  # the last Gemm's
    ("hidden", 1e-6), ("hidden", 1e6),  # the first Gemm's output: its ratio and the next's
    ("float", 1e-8), ("float", 1e8),  # the float model's first layer: every scale after it
])
def test_lenet_at_extreme_scales(act: str, where: str, f: float, tmp_path: Path) -> None:
    if where == "float":
        q = _lenet_q(act, tmp_path, f)
    else:
        q = _lenet_q(act, tmp_path)
        gemms = [n for n in q.graph.node if n.op_type == "Gemm"]
        tensor = next(n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear" and
                      n.input[0] in {gemms[-1 if where == "output" else 0].output[0]})
        q = _tensor_scale(q, tensor, f)
    top1, within, worst = compare(q, _random(LENET, 8, 1), cpu_samples=2)
    assert top1 == 1.0 and within >= 0.99, (top1, within, worst)


def test_a_pre_shifted_convolution_runs_on_the_accelerator_bit_for_bit(tmp_path: Path) -> None:
    # conv 2 reads a tensor of scale ~1e-9: onnxruntime enlarges its weight scales to fit the
    # bias in int32, and its REQUANTIZE needs the pre-shift (the CPU backend runs it unfused;
    # test_lenet_at_extreme_scales[float-1e-08-*] compares it with onnxruntime)
    q = _lenet_q("QInt8", tmp_path, 1e-8)
    g = import_onnx(q)
    pre = [n for n in g.nodes if n.op is Op.REQUANTIZE and any(n.attrs.pre_shift)]
    assert any(n.src[0].op is Op.CONV_INTEGER for n in pre), [n.name for n in pre]
    art = Artifact.load(compile_model(q, target="vta").to_bytes())
    assert art.plan.sections["vta"].meta["cpu_fallback"] == {}  # all offloaded
    vta, cpu = GraphExecutor(art), GraphExecutor(compile_model(q, target="cpu"))
    try:
        for x in _random(LENET, 3, 1):
            for ex in (vta, cpu):
                ex.set_input(0, x)
                ex.run()
            np.testing.assert_array_equal(vta.get_output(0), cpu.get_output(0))
    finally:
        vta.close()


def test_an_add_into_a_tiny_scale_is_a_named_error() -> None:
    # Q(Add(DQ(a), DQ(b))) with the output scale 1e-9 of the inputs': the residual add's
    # integer multipliers (a's scale / the output's) would be 10**9, past the ALU's immediate
    # with the int32 sum it feeds; onnxruntime saturates in float, we say so instead
    f32 = onnx.TensorProto.FLOAT
    inits = [numpy_helper.from_array(np.float32(s), n) for n, s in
             (("s_in", 0.05), ("s_out", 0.05e-9))] + [
        numpy_helper.from_array(np.int8(0), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_in", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s_in", "z"], ["xd"]),
             helper.make_node("QuantizeLinear", ["y", "s_in", "z"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "s_in", "z"], ["yd"]),
             helper.make_node("Add", ["xd", "yd"], ["sum"], name="add"),
             helper.make_node("QuantizeLinear", ["sum", "s_out", "z"], ["sq"]),
             helper.make_node("DequantizeLinear", ["sq", "s_out", "z"], ["out"])]
    g = helper.make_graph(nodes, "add", [helper.make_tensor_value_info(n, f32, [1, 4, 2, 2])
                                         for n in ("x", "y")],
                          [helper.make_tensor_value_info("out", f32, [1, 4, 2, 2])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 10
    reference_session(m)  # onnxruntime accepts it
    with pytest.raises(UnsupportedError, match=r"quantised ADD 'sum': cannot requantise within "
                       r"int32: the operands' scales / the output's: 1e\+09, 1e\+09: "
                       r"multipliers 1e\+09\.\.1e\+09 .* keeps the value"):
        import_onnx(m)
