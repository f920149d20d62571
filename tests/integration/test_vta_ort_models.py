"""ResNet-18 and MobileNetV2 quantised by onnxruntime's quantize_static with its defaults (QDQ,
uint8 activations, int8 per-channel weights, after quant_pre_process as its docs ask) on the
accelerator: every convolution offloaded but the depthwise ones (the cycle model keeps those on
the CPU), the outputs bit for bit the CPU-int8 path's, and within one step of onnxruntime's
(ResNet-18: on >= 99 % of them) with the same top-1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ort_reference import reference_session
from test_qdq_onnxruntime import ort_quantize, output_scale

from vtakit import models
from vtakit.compiler.compile import compile_model
from vtakit.runtime import Artifact
from vtakit.runtime.executor import GraphExecutor

pytest.importorskip("onnxruntime.quantization", reason="pip install 'vtakit[dev]'")

SHAPE = (1, 3, 224, 224)


def _samples(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(n)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_onnxruntime_default_model_on_the_accelerator(name, tmp_path: Path):
    q = ort_quantize(getattr(models, name)(), _samples(2, 0), tmp_path, act="QUInt8",
                     per_channel=True, pre_process=True)
    art = Artifact.load(compile_model(q, target="vta").to_bytes())
    fallback = art.plan.sections["vta"].meta["cpu_fallback"]
    assert all(why.startswith("group=") for why in fallback.values()), fallback
    vta, cpu = GraphExecutor(art), GraphExecutor(compile_model(q, target="cpu"))
    sess = reference_session(q)
    scale = output_scale(q)
    (x,) = _samples(1, 1)
    try:
        for ex in (vta, cpu):
            ex.set_input(0, x)
            ex.run()
        ours = vta.get_output(0)
        np.testing.assert_array_equal(ours, cpu.get_output(0))
    finally:
        vta.close()
    (ref,) = sess.run(None, {q.graph.input[0].name: x})
    steps = np.abs(np.rint(ours / scale) - np.rint(ref / scale))
    # MobileNetV2: 98.9 % here; its requantisations keep one shift per layer and a 32-bit
    # product, and this random network carries one-step differences through 17 blocks (see
    # test_qdq_onnxruntime.test_mobilenet_v2, which holds the CPU path to the same 97.5 %)
    within = 0.99 if name == "resnet18" else 0.975
    assert np.mean(steps <= 1) >= within, (np.mean(steps <= 1), steps.max())
    assert np.argmax(ours) == np.argmax(ref)
