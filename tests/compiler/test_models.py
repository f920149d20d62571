"""The model builders, imported and run by the reference interpreter, against onnxruntime.

Tolerance: float32 throughout, rtol=1e-4 and atol=1e-4 (the largest differences seen are about
1e-5 on ResNet-18, whose outputs reach ~20; the difference comes from summation order).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from ort_reference import reference_session

from vtakit import models
from vtakit.compiler.frontend import import_onnx
from vtakit.compiler.ir import Op, run, verify

RTOL = ATOL = 1e-4

BUILDERS = {
    "mlp": (models.mlp, (784,)), "lenet": (models.lenet, (1, 28, 28)),
    "resnet18": (models.resnet18, (3, 224, 224)),
    "mobilenet_v2": (models.mobilenet_v2, (3, 224, 224)),
    "transformer_block": (models.transformer_block, (16, 64)),
}


@pytest.fixture(scope="module")
def built() -> dict:
    return {name: f() for name, (f, _) in BUILDERS.items()}


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_reference_matches_onnxruntime(built, name: str, batch: int):
    pytest.importorskip("onnxruntime", reason="pip install 'vtakit[dev]'")
    model = built[name]
    g = verify(import_onnx(model, batch_size=batch))
    x = np.random.default_rng(7).standard_normal((batch, *BUILDERS[name][1])).astype(np.float32)
    (ours,) = run(g, {"input": x}).values()
    session = reference_session(model)
    (ref,) = session.run(None, {"input": x})
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


def test_resnet18_runs_in_seconds(built):
    g = import_onnx(built["resnet18"])
    x = np.zeros((1, 3, 224, 224), np.float32)
    start = time.perf_counter()
    run(g, {"input": x})
    assert time.perf_counter() - start < 5.0


def test_builders_are_deterministic_and_seeded():
    assert models.mlp(seed=1) == models.mlp(seed=1)
    assert models.mlp(seed=1) != models.mlp(seed=2)


def test_model_structure(built):
    ops = {name: {n.op for n in import_onnx(m).nodes} for name, m in built.items()}
    assert {Op.CONV, Op.BATCH_NORM, Op.MAX_POOL, Op.GLOBAL_AVG_POOL, Op.ADD} <= ops["resnet18"]
    assert Op.CLIP in ops["mobilenet_v2"]
    assert any(n.op is Op.CONV and n.attrs.group > 1  # type: ignore[attr-defined]
               for n in import_onnx(built["mobilenet_v2"]).nodes)
    assert {Op.LAYER_NORM, Op.SOFTMAX, Op.GELU, Op.MATMUL} <= ops["transformer_block"]
