"""Every model of compiler.models: ONNX → artifact (object code) → load → run, against
onnxruntime. Tolerance for float32: rtol=1e-4, atol=1e-4 times the output's largest magnitude
(summation order differs between the GEMMs)."""

from __future__ import annotations

import numpy as np
import pytest
from ort_reference import reference_session

from vtakit import models
from vtakit.compiler.compile import compile_model
from vtakit.runtime.artifact import Artifact
from vtakit.runtime.session import InferenceSession

ort = pytest.importorskip("onnxruntime")

CASES = [("mlp", 1), ("mlp", 2), ("lenet", 1), ("lenet", 2), ("transformer_block", 1),
         ("mobilenet_v2", 1), ("resnet18", 1)]


@pytest.mark.parametrize(("name", "batch"), CASES)
def test_model_matches_onnxruntime(name: str, batch: int, tmp_path) -> None:
    model = getattr(models, name)()
    path = tmp_path / f"{name}.vtak"
    compile_model(model, threads=2, batch_size=batch).save(path)
    sess = InferenceSession(Artifact.load(path))
    assert sess.executor.runners["cpu"].code_source == "object"  # not the IR compiled here
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}
    assert all(i.shape[0] == batch for i in sess.get_inputs())
    ref = reference_session(model)
    want = ref.run(None, feeds)
    got = sess.run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))
