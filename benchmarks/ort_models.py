"""Models quantised as users quantise them: onnxruntime's `quant_pre_process` then
`quantize_static` (QDQ), for the benchmarks.

    ort_quantize(model, calib, activation="QUInt8") -> onnx.ModelProto

`activation` is ``QUInt8`` (uint8 activations with their zero points) or ``QInt8`` (int8
activations, asymmetric too); weights are QInt8 per channel (quantize_static's own defaults in
onnxruntime 1.32 are QInt8 activations and per-tensor weights: both are set here explicitly);
MinMax calibration on `calib` (one array per sample, batch 1). `pre_process` runs
onnxruntime's `quant_pre_process` first, as its documentation asks (ONNX shape inference and
onnxruntime's graph optimisation: batch norms folded into the convolutions; not its symbolic
shape inference, which needs sympy).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

# --model choices of the benchmarks: onnxruntime's activation type.
ACTIVATIONS = {"ort-quint8": "QUInt8", "ort-qint8": "QInt8"}


def ort_quantize(model: onnx.ModelProto, calib: Sequence[np.ndarray], *,
                 activation: str = "QUInt8", per_channel: bool = True,
                 pre_process: bool = True) -> onnx.ModelProto:
    """`model` quantised by onnxruntime's quantize_static (QDQ, `activation` activations,
    QInt8 weights, per channel unless told otherwise) on the samples `calib`."""
    from onnxruntime.quantization import CalibrationDataReader

    name = model.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([{name: x} for x in calib])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.samples, None)

    # onnxruntime's quantisation tools log their advice at WARNING on the root logger (per
    # weight, in the hundreds for these models): errors only while they run.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        return _quantize(model, Reader(), activation, per_channel, pre_process)
    finally:
        root.setLevel(level)


def _quantize(model: onnx.ModelProto, reader: object, activation: str, per_channel: bool,
              pre_process: bool) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "float.onnx", Path(d) / "quantized.onnx"
        onnx.save(model, src)
        if pre_process:
            pre = Path(d) / "pre.onnx"
            # Symbolic shape inference is for dynamic shapes (transformers) and needs sympy,
            # which the project does not install; ONNX's shape inference covers these CNNs.
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
            src = pre
        quantize_static(str(src), str(out), reader, quant_format=QuantFormat.QDQ,
                        activation_type=getattr(QuantType, activation),
                        weight_type=QuantType.QInt8, per_channel=per_channel)
        return onnx.load(out)
