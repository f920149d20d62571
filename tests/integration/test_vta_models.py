"""Models on the accelerator: the CPU-int8 path is the reference the accelerator must equal bit
for bit (issue: the VTA backend). Each model is quantised once, lowered for ``cpu`` and for
``vta``, and both plans run on the same inputs; the accelerator runs on the simulator."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from vtakit import digits, models
from vtakit.compiler.compile import lower_model
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.runtime.executor import GraphExecutor


def _pair(model, calib, options=None):
    cpu = lower_model(model, target="cpu", quantize=True, calib=calib)
    vta = lower_model(model, target="vta", quantize=True, calib=calib, options=options)
    return GraphExecutor(cpu), GraphExecutor(vta), vta


def _same(ec, ev, xs):
    for x in xs:
        ec.set_input(0, x)
        ec.run()
        ev.set_input(0, x)
        ev.run()
        a, b = ec.get_output(0), ev.get_output(0)
        assert a.dtype == b.dtype and np.array_equal(a, b), np.abs(a - b).max()


def _random_inputs(model, n, seed):
    shape = import_onnx(model).inputs[0].shape
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _vta_steps(plan):
    return [s.name for s in plan.steps if s.backend == "vta"]


def test_digits_cnn_runs_wholly_on_the_accelerator_and_bit_exact():
    ec, ev, plan = _pair(digits.load_model(), digits.calibration_set())
    meta = plan.sections["vta"].meta
    assert len(meta["regions"]) == 1  # one stream, one synchronisation
    assert [lm["kind"] for lm in meta["regions"][0]["layers"]] == [
        "conv2d", "conv2d", "max_pool", "conv2d", "dense", "dense"]
    assert [s.backend for s in plan.steps] == ["cpu"] + ["vta"] * 6 + ["cpu"]
    # the 1-channel first layer runs as a 1x1 convolution over its 3x3 patches (im2col)
    (inp,) = meta["regions"][0]["inputs"]
    assert inp["im2col"] == [3, 3, 1, 1, 1, 1, 1, 1]
    x, y = digits.test_split()
    _same(ec, ev, [x[i:i + 1] for i in range(12)])
    cycles = ev.runners["vta"].last_runs[0].cycles
    assert cycles > 0


@pytest.mark.parametrize("name", ["mlp", "lenet", "transformer_block"])
def test_small_models_bit_exact(name):
    m = getattr(models, name)()
    ec, ev, plan = _pair(m, _random_inputs(m, 4, 0))
    assert _vta_steps(plan)
    _same(ec, ev, _random_inputs(m, 3, 1))


def test_transformer_attention_products_stay_on_the_cpu_with_reasons():
    m = models.transformer_block()
    _, _, plan = _pair(m, _random_inputs(m, 2, 0))
    why = plan.sections["vta"].meta["cpu_fallback"]
    assert any("weights that are not an int8 constant" in r for r in why.values())


@pytest.mark.parametrize("config", ["ecp5", "ice40"])
def test_digits_on_other_configurations(config):
    """Other block sizes (8x8, 1x1) and one-entry command queues: still bit-exact."""
    ec, ev, _ = _pair(digits.load_model(), digits.calibration_set(), {"config": config})
    x, _ = digits.test_split()
    _same(ec, ev, [x[i:i + 1] for i in range(3)])


def test_profile_runs_each_layer_alone_with_the_same_result():
    _, ev, plan = _pair(digits.load_model(), digits.calibration_set())
    x, _ = digits.test_split()
    ev.set_input(0, x[:1])
    ev.run()
    whole = ev.get_output(0).copy()
    prof = ev.profile()
    assert [p.backend for p in prof].count("vta") == 6
    assert np.array_equal(ev.get_output(0), whole)
    runs = ev.runners["vta"].layer_runs
    assert [r.kind for r in runs] == ["conv2d", "conv2d", "max_pool", "conv2d", "dense", "dense"]
    assert all(r.cycles > 0 for r in runs)
    # one stream for the region overlaps what per-layer streams cannot
    assert ev.runners["vta"].last_runs[0].cycles <= sum(r.cycles for r in runs)


def _pool_head(c: int, h: int, w: int) -> onnx.ModelProto:
    """conv 3x3 (c channels, h x w) -> ReLU -> GlobalAveragePool -> Flatten -> dense(10)."""
    b = models._Builder(3)
    x = b.op("Relu", [b.conv("input", 3, c, 3, bias=True)])
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    return b.model("pool_head", ["N", 3, h, w], b.dense(x, c, 10), ["N", 10], 13)


@pytest.mark.parametrize("c, h, w, config", [(40, 5, 6, "default"), (24, 9, 4, "ecp5"),
                                             (16, 13, 13, "default")])
def test_global_average_pool_runs_on_the_accelerator(c, h, w, config):
    """The window's sum on the ALU and its requantisation: bit-exact with the CPU, for channel
    counts that are not a multiple of the block, non-square planes and another block size;
    conv, pool and dense form one region."""
    m = _pool_head(c, h, w)
    ec, ev, plan = _pair(m, _random_inputs(m, 3, 0), {"config": config})
    (region,) = plan.sections["vta"].meta["regions"]
    assert [lm["kind"] for lm in region["layers"]][-2:] == ["avg_pool", "dense"]
    _same(ec, ev, _random_inputs(m, 3, 1))


@pytest.mark.parametrize("config", ["default", "ice40"])
def test_global_average_pool_larger_than_acc_runs_in_chunks(config):
    """A plane larger than one ACC half (72x72 = 5,184 rows against 1,024 on `default`, 256 on
    `ice40`) is summed a chunk of rows at a time: still on the accelerator, still exact."""
    m = _pool_head(16, 72, 72)
    ec, ev, plan = _pair(m, _random_inputs(m, 2, 0), {"config": config})
    (region,) = plan.sections["vta"].meta["regions"]
    pool = next(lm for lm in region["layers"] if lm["kind"] == "avg_pool")
    assert 1 <= pool["schedule"]["chunk"] < 72
    _same(ec, ev, _random_inputs(m, 1, 1))


@pytest.mark.slow
def test_resnet18_bit_exact():
    m = models.resnet18()
    ec, ev, plan = _pair(m, _random_inputs(m, 2, 0))
    # every conv, the residual adds, both pools and the dense layer: one stream
    assert len(_vta_steps(plan)) == 31
    assert len(plan.sections["vta"].meta["regions"]) == 1
    _same(ec, ev, _random_inputs(m, 1, 1))


@pytest.mark.slow
def test_mobilenet_v2_bit_exact():
    """Depthwise convolutions stay on the CPU (docs/vta.md); everything else runs on the
    accelerator."""
    m = models.mobilenet_v2()
    ec, ev, plan = _pair(m, _random_inputs(m, 2, 0))
    why = plan.sections["vta"].meta["cpu_fallback"]
    assert why and all("group=" in r for r in why.values())
    _same(ec, ev, _random_inputs(m, 1, 1))


def _ort_qdq(ort, model, calib, tmp_path):
    """`model` quantised by onnxruntime's quantize_static on `calib` (QDQ, int8 per-channel
    weights, symmetric int8 activations, so zero points are 0)."""
    src, out = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(model, src)
    input_name = model.graph.input[0].name

    class Reader(ort.CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([{input_name: x} for x in calib])

        def get_next(self):
            return next(self.samples, None)

    ort.quantize_static(str(src), str(out), Reader(), quant_format=ort.QuantFormat.QDQ,
                        activation_type=ort.QuantType.QInt8, weight_type=ort.QuantType.QInt8,
                        per_channel=True, extra_options={"ActivationSymmetric": True})
    return onnx.load(out)


@pytest.mark.parametrize("name", ["digits", "lenet"])
def test_onnxruntime_quantised_qdq_model_bit_exact(name, tmp_path):
    """A model quantised by onnxruntime (QDQ, int8 per-channel weights, symmetric int8
    activations, so zero points are 0) imports as the same integer graph; the accelerator
    equals the CPU-int8 path on it."""

    ort = pytest.importorskip("onnxruntime.quantization", reason="pip install 'vtakit[dev]'")
    model = digits.load_model() if name == "digits" else models.lenet()
    calib = digits.calibration_set()[:16] if name == "digits" else _random_inputs(model, 4, 0)
    qdq = _ort_qdq(ort, model, [x[None] if x.ndim == 3 else x for x in calib], tmp_path)
    cpu = GraphExecutor(lower_model(qdq, target="cpu"))
    plan = lower_model(qdq, target="vta")
    vta = GraphExecutor(plan)
    kinds = {lm["kind"] for r in plan.sections["vta"].meta["regions"] for lm in r["layers"]}
    assert {"conv2d", "dense"} <= kinds
    xs = [x[None] if x.ndim == 3 else x for x in calib[:3]]
    _same(cpu, vta, xs)


def test_clamped_requantisation_is_bit_exact_too():
    """QuantOptions(clamp=True): the pre-multiply saturation runs as MIN/MAX with tensor rows."""
    from vtakit.compiler.quantize import QuantOptions

    m = models.lenet()
    calib = _random_inputs(m, 4, 0)
    q = QuantOptions(clamp=True)
    cpu = lower_model(m, target="cpu", quantize=q, calib=calib)
    vta = lower_model(m, target="vta", quantize=q, calib=calib)
    _same(GraphExecutor(cpu), GraphExecutor(vta), _random_inputs(m, 2, 1))


@pytest.mark.parametrize("sched, loads", [
    ({"threads": 2, "order": 1}, {"INP": 8, "WGT": 4}),   # each WGT half keeps its group
    ({"threads": 2, "order": 2}, {"INP": 8, "WGT": 2}),   # the two groups alternate halves
    ({"threads": 1, "order": 2}, {"INP": 4, "WGT": 8}),   # the input window stays for both
    ({"threads": 1, "order": 1}, {"INP": 8, "WGT": 2}),   # the group's weights stay
])
def test_loads_of_data_a_half_already_holds_are_skipped(sched, loads):
    """conv3x3_2 of the digits CNN (16 -> 32 channels, 8x8) in 4 row tiles x 2 channel
    groups: the loop order decides what stays on chip; the result never changes."""
    from vtakit.vta_hw import isa

    forced = {"conv3x3_2": dict(toh=2, tow=8, tob=1, tib=1, **sched)}
    ec, ev, plan = _pair(digits.load_model(), digits.calibration_set(),
                         {"schedules": forced})
    k = [lm["name"] for lm in plan.sections["vta"].meta["regions"][0]["layers"]].index(
        "conv3x3_2")
    prog = plan.sections["vta"].live["programs"][f"region0_layer{k}.npz"]
    counts = {m: sum(1 for i in prog.insns() if isinstance(i, isa.MemInsn) and i.x_size
                     and i.opcode == isa.Opcode.LOAD and i.memory_type == isa.MemType[m])
              for m in ("INP", "WGT")}
    assert counts == loads
    x, _ = digits.test_split()
    _same(ec, ev, [x[i:i + 1] for i in range(3)])


def test_onnxruntime_quantised_average_pools_run_on_the_accelerator(tmp_path):
    """AveragePool (with count_include_pad padding) and GlobalAveragePool of an
    onnxruntime-quantised QDQ model: the windowed pool imports as a depthwise convolution with
    unit weights, the global one as a sum; both run on the ALU, bit-exact with the CPU."""
    ort = pytest.importorskip("onnxruntime.quantization", reason="pip install 'vtakit[dev]'")
    b = models._Builder(5)
    x = b.op("Relu", [b.conv("input", 3, 24, 3, bias=True)])
    x = b.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = b.op("AveragePool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    model = b.model("pools", ["N", 3, 12, 10], b.dense(x, 24, 10), ["N", 10], 13)
    qdq = _ort_qdq(ort, model, _random_inputs(model, 8, 0), tmp_path)
    plan = lower_model(qdq, target="vta")
    (region,) = plan.sections["vta"].meta["regions"]
    assert [lm["kind"] for lm in region["layers"]] == [
        "conv2d", "avg_pool", "avg_pool", "avg_pool", "dense"]
    _same(GraphExecutor(lower_model(qdq, target="cpu")), GraphExecutor(plan),
          _random_inputs(model, 3, 1))
