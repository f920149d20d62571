"""Models quantised as users quantise them (onnxruntime's quantize_static: asymmetric uint8 or
int8 activations, per-channel or per-tensor weights, reduce_range; QDQ) on the accelerator: every
convolution, pooling, residual add and dense layer offloaded, and the outputs bit for bit those
of the CPU-int8 path.

The class: seeded random networks (channels, kernel, stride, padding, pooling with padding over
negative values, residual adds of differently scaled operands, global pooling, a dense head),
each quantised by onnxruntime, so the zero points and scales are the ones it chooses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_qdq_onnxruntime import ort_quantize

from vtakit import digits, models
from vtakit.compiler.compile import compile_model
from vtakit.runtime import Artifact
from vtakit.runtime.executor import GraphExecutor

pytest.importorskip("onnxruntime.quantization", reason="pip install 'vtakit[dev]'")


def random_net(seed: int) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """conv (k x k, stride, padding) -> relu? -> max pool with padding? -> conv 3x3 pad 1 ->
    residual add with the first conv's output -> global average pool -> flatten -> dense."""
    rng = np.random.default_rng(seed)
    c = int(rng.choice([1, 3, 8, 16]))
    k = int(rng.choice([16, 24, 32]))
    ks = int(rng.choice([1, 3, 5]))
    pad = int(rng.integers(0, ks // 2 + 2)) if ks > 1 else int(rng.integers(0, 2))
    stride = int(rng.choice([1, 2]))
    hw = int(rng.choice([8, 10, 12]))
    relu = bool(rng.integers(0, 2))
    pool = bool(rng.integers(0, 2))
    init, nodes = [], []

    def weight(name: str, *shape: int) -> str:
        init.append(numpy_helper.from_array(
            (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
            name))
        return name

    def bias(name: str, n: int) -> str:
        init.append(numpy_helper.from_array((0.1 * rng.standard_normal(n)).astype(np.float32),
                                            name))
        return name

    nodes.append(helper.make_node("Conv", ["x", weight("w1", k, c, ks, ks), bias("b1", k)],
                                  ["c1"], kernel_shape=[ks, ks], pads=[pad] * 4,
                                  strides=[stride] * 2))
    last = "c1"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["r1"]))
        last = "r1"
    if pool:
        nodes.append(helper.make_node("MaxPool", [last], ["p1"], kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1], strides=[2, 2]))
        last = "p1"
    nodes.append(helper.make_node("Conv", [last, weight("w2", k, k, 3, 3), bias("b2", k)],
                                  ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Add", [last, "c2"], ["s"]))
    nodes.append(helper.make_node("GlobalAveragePool", ["s"], ["g"]))
    nodes.append(helper.make_node("Flatten", ["g"], ["f"]))
    nodes.append(helper.make_node("Gemm", ["f", weight("wd", 10, k), bias("bd", 10)], ["y"],
                                  transB=1))
    shape = (1, c, hw, hw)
    graph = helper.make_graph(nodes, f"net{seed}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, shape


def samples(shape: tuple[int, ...], n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def offloaded_and_exact(q: onnx.ModelProto, xs: list[np.ndarray]) -> dict:
    """Compile `q` for the accelerator and the CPU; every accelerator candidate is offloaded
    (no CPU fallback) and the outputs are equal on every sample. The fallbacks, for the
    message."""
    art = Artifact.load(compile_model(q, target="vta").to_bytes())
    fallback = art.plan.sections["vta"].meta["cpu_fallback"]
    vta, cpu = GraphExecutor(art), GraphExecutor(compile_model(q, target="cpu"))
    try:
        for x in xs:
            for ex in (vta, cpu):
                ex.set_input(0, x)
                ex.run()
            np.testing.assert_array_equal(vta.get_output(0), cpu.get_output(0))
    finally:
        vta.close()
    return fallback


@pytest.mark.parametrize("seed", range(12))
def test_random_networks_quantised_by_onnxruntime(seed, tmp_path: Path):
    model, shape = random_net(seed)
    q = ort_quantize(model, samples(shape, 4, seed), tmp_path,
                     act="QUInt8" if seed % 4 < 2 else "QInt8", per_channel=bool(seed % 2),
                     reduce_range=seed % 3 == 0)
    fallback = offloaded_and_exact(q, samples(shape, 2, 100 + seed))
    assert not fallback, fallback


@pytest.mark.parametrize("options", [dict(act="QUInt8", per_channel=True),
                                     dict(act="QUInt8", per_channel=False, reduce_range=True),
                                     dict(act="QUInt8", per_channel=True, pre_process=True),
                                     dict(act="QInt8", per_channel=True),
                                     dict(act="QInt8", per_channel=False, reduce_range=True),
                                     dict(act="QInt8", per_channel=True, pre_process=True)],
                         ids=["u8-pc", "u8-pt-rr", "u8-pc-pre", "s8-pc", "s8-pt-rr",
                              "s8-pc-pre"])
def test_the_digits_cnn_and_lenet(options, tmp_path: Path):
    x, _ = digits.test_split()
    q = ort_quantize(digits.load_model(), [x[i:i + 1] for i in range(8)], tmp_path, **options)
    assert not offloaded_and_exact(q, [x[i:i + 1] for i in range(8, 11)])
    shape = (1, 1, 28, 28)
    q = ort_quantize(models.lenet(), samples(shape, 4, 0), tmp_path, **options)
    assert not offloaded_and_exact(q, samples(shape, 2, 1))


def test_a_tflite_scheme_model(tmp_path: Path):
    """TFLite's int8 scheme, written as QDQ: asymmetric int8 activations, symmetric per-channel
    int8 weights (zero points 0)."""
    model, shape = random_net(5)
    q = ort_quantize(model, samples(shape, 4, 5), tmp_path, act="QInt8", per_channel=True)
    init = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    zps = [init[n.input[2]] for n in q.graph.node if n.op_type == "DequantizeLinear"
           and len(n.input) > 2 and init.get(n.input[0]) is not None
           and init[n.input[0]].dtype == np.int8 and init[n.input[0]].ndim == 4]
    assert zps and not any(np.any(z) for z in zps)  # the weights are symmetric
    acts = [init[n.input[2]] for n in q.graph.node if n.op_type == "QuantizeLinear"]
    assert any(np.any(z) for z in acts)  # the activations are not
    assert not offloaded_and_exact(q, samples(shape, 2, 6))


@pytest.mark.rtl
def test_the_digits_cnn_quantised_by_onnxruntime_on_rtl(tmp_path: Path):
    from rtl_helpers import require_rtl

    require_rtl()
    x, _ = digits.test_split()
    q = ort_quantize(digits.load_model(), [x[i:i + 1] for i in range(8)], tmp_path,
                     act="QInt8", per_channel=True)
    art = Artifact.load(compile_model(q, target="vta").to_bytes())
    sim = GraphExecutor(art, runner_options={"vta": {"device": "sim"}})
    rtl = GraphExecutor(art, runner_options={"vta": {"device": "rtl"}})
    try:
        for i in range(2):
            for ex in (sim, rtl):
                ex.set_input(0, x[i:i + 1])
                ex.run()
            np.testing.assert_array_equal(sim.get_output(0), rtl.get_output(0))
            assert sim.runners["vta"].last_runs[0].cycles == rtl.runners["vta"].last_runs[0].cycles
    finally:
        rtl.close()


def test_readers_that_need_different_padding(tmp_path: Path):
    """An activation read by a padded convolution (its padding must hold the zero point) and
    by a padded max pool over values that can be -128 (its padding must be -128): the first
    reader keeps the frame, the other runs on the CPU with its reason; the results stay
    exact."""
    rng = np.random.default_rng(3)
    w = [numpy_helper.from_array((rng.standard_normal(s) / 4).astype(np.float32), n)
         for n, s in (("w1", (16, 3, 3, 3)), ("w2", (16, 16, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3]),
             helper.make_node("Conv", ["c1", "w2"], ["y1"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c1"], ["y2"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1])]
    shape = (1, 3, 10, 10)
    graph = helper.make_graph(
        nodes, "two_readers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2")], w)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    q = ort_quantize(model, samples(shape, 4, 0), tmp_path, act="QInt8")
    art = compile_model(q, target="vta")
    fallback = art.plan.sections["vta"].meta["cpu_fallback"]
    assert len(fallback) == 1, fallback
    (why,) = fallback.values()
    assert "reads the same activation with padding" in why, why
    vta, cpu = GraphExecutor(art), GraphExecutor(compile_model(q, target="cpu"))
    for x in samples(shape, 2, 1):
        for ex in (vta, cpu):
            ex.set_input(0, x)
            ex.run()
        for k in range(2):
            np.testing.assert_array_equal(vta.get_output(k), cpu.get_output(k))


@pytest.mark.parametrize("edit, message", [
    (lambda info: info.update(frame=16), r"a frame of 1\.\.15 elements and an int8 fill"),
    (lambda info: info.update(fill=200), r"got frame 1, fill 200"),
    (lambda info: info.update(param=True), r"on an int8 activation"),
    (lambda info: info.pop("frame"), r"got frame None"),
])
def test_a_corrupt_frame_is_refused_at_load(edit, message, tmp_path: Path):
    x, _ = digits.test_split()
    q = ort_quantize(digits.load_model(), [x[i:i + 1] for i in range(4)], tmp_path,
                     act="QInt8")
    art = Artifact.load(compile_model(q, target="vta").to_bytes())
    slots = art.plan.sections["vta"].meta["regions"][0]["slots"]
    framed = [info for info in slots.values() if "frame" in info]
    assert framed
    edit(framed[0])
    from vtakit.runtime import ArtifactError

    with pytest.raises(ArtifactError, match=message):
        Artifact.load(Artifact(art.manifest, art.plan).to_bytes())
@pytest.mark.parametrize("seed", [0, 3, 7])
def test_operator_form_models(seed, tmp_path: Path):
    """QLinearConv / QLinearMatMul / QLinearAdd / QLinearGlobalAveragePool (the QOperator
    format), as onnxruntime writes them."""
    model, shape = random_net(seed)
    q = ort_quantize(model, samples(shape, 4, seed), tmp_path, act="QInt8", fmt="QOperator",
                     per_channel=True)
    ops = {n.op_type for n in q.graph.node}
    assert "QLinearConv" in ops, ops
    fallback = offloaded_and_exact(q, samples(shape, 2, 100 + seed))
    assert not fallback, fallback
