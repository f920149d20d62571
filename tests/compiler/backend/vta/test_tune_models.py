"""`tune` on every model the integration tests compile for the accelerator
(tests/integration/test_vta_models.py, ``test_small_models_bit_exact``): the tuner sizes the
buffers `compile` lowers (an im2col first convolution by its patches: LeNet's 5x5 stem failed
with an out-of-range DRAM access before), its log has a record per layer, and compiling with
the log takes the logged schedules and leaves the same int8 outputs on the simulator as
compiling without it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from vtakit import models
from vtakit.compiler.backend.vta import resolve_config
from vtakit.compiler.backend.vta.layers import find_layers
from vtakit.compiler.backend.vta.tune import TuningLog, buffer_shapes, tune_model
from vtakit.compiler.compile import lower_model
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.pipeline import optimize
from vtakit.compiler.quantize import QuantOptions, quantize_graph
from vtakit.runtime.executor import GraphExecutor

CFG = resolve_config("default")
# the models test_small_models_bit_exact compiles for the vta target (resnet18 and
# mobilenet_v2 there are `slow` compile tests; tuning them takes minutes per model)
CI_MODELS = ["mlp", "lenet", "transformer_block"]


def _random_inputs(model: onnx.ModelProto, n: int, seed: int) -> list[np.ndarray]:
    shape = import_onnx(model).inputs[0].shape
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _vta(model, calib, log=None):
    return lower_model(model, target="vta", quantize=True, calib=calib,
                       options={"tuning_log": str(log)} if log else None)


def _layer_meta(plan):
    return {lm["name"]: (lm, r) for r in plan.sections["vta"].meta["regions"]
            for lm in r["layers"]}


@pytest.mark.parametrize("name", CI_MODELS)
def test_tune_then_compile_with_the_log(name, tmp_path):
    model = getattr(models, name)()
    calib = _random_inputs(model, 4, 0)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)  # as `vtakit tune` reads it
    log = tmp_path / f"{name}.jsonl"
    report = tune_model(str(path), calib=calib, log=log, top_k=2)
    records = TuningLog.load(log).records
    assert records and report.records
    assert {r.layer for r in records} <= {r.layer for r in report.records}

    plain, tuned = _vta(model, calib), _vta(model, calib, log)
    # every accelerator layer of the compiled model was tuned, and compile took its schedule
    got = _layer_meta(tuned)
    assert {r.layer for r in report.records} == set(got) == set(_layer_meta(plain))
    for r in report.records:
        assert got[r.layer][0]["schedule"] == r.schedule
    # the tuner's buffers are the ones compile allocates (an im2col input: its patches)
    g = optimize(quantize_graph(import_onnx(model), calib, QuantOptions())[0])
    layers, _ = find_layers(g, CFG)
    for L in layers:
        lm, region = got[L.name]
        compiled = [tuple(region["slots"][s]["shape"]) for s in lm["inputs"] + [lm["output"]]]
        assert buffer_shapes(L, CFG) == compiled, L.name
    if name == "lenet":  # the case that failed: a 1-channel 5x5 stem run over its patches
        first = _layer_meta(tuned)[layers[0].name][1]["inputs"][0]
        assert first["im2col"] == [5, 5, 1, 1, 2, 2, 2, 2]

    a, b = GraphExecutor(plain), GraphExecutor(tuned)
    for x in _random_inputs(model, 2, 1):
        a.set_input(0, x)
        a.run()
        b.set_input(0, x)
        b.run()
        assert np.array_equal(a.get_output(0), b.get_output(0))
