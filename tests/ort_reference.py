"""onnxruntime as the tests' reference, exact on every x86-64 CPU.

On an x86-64 CPU without VNNI (AVX2 only, as on many AMD EPYC hosts), onnxruntime's integer GEMM
kernels multiply uint8 by int8 with vpmaddubsw, which saturates the sum of each pair of adjacent
products at int16: wherever two products add up past 32,767, QLinearConv, QLinearMatMul,
ConvInteger and MatMulInteger come out several steps off (up to tens of steps seen here). With
VNNI, on ARM, or with the session option ``session.x64quantprecision`` (operands widened to int16
first: slower, exact) they are exact. A reference has to be exact, so every test that compares
with onnxruntime builds its session here.

The option makes onnxruntime turn int8 weights into uint8; where it then has no kernel for the
operand types (QLinearMatMul with int8 activations before opset 21: int8 × uint8) the session is
the default one, whose int8 × int8 kernels came out exact here even with ±128 operands.
"""

from __future__ import annotations

from typing import Any


def reference_session(model: Any) -> Any:
    """An onnxruntime CPU session for the ModelProto `model`, with exact integer arithmetic.
    The caller has already imported onnxruntime (``pytest.importorskip``), so a missing
    install skips there, with its reason."""
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as NoKernel

    blob = model.SerializeToString()
    options = ort.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    try:
        return ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])
    except NoKernel:
        return ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
