"""Integer inference on the CPU: our int8 path against our fp32 path and onnxruntime (fp32, and
int8 running the same model quantised by its own quantize_static, QDQ), measured in one run.

    .venv/bin/python benchmarks/int8_cpu.py [--threads 1 2] [--repeat 50] [--calib 32] [--quick]

Prints:
- digits CNN: fp32 and int8 test accuracy on the shipped test split (target: within 1 point);
- per model and thread count: quantise + compile time (32 calibration images), the median
  latency of ours fp32 / ours int8 / onnxruntime fp32 / onnxruntime int8, and the ratios of ours
  int8 to the others (target: below 1 against ours fp32 and onnxruntime fp32 and int8).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from cpu_vs_ort import _median_ms  # type: ignore[import-not-found]


def _digits() -> None:
    from vtakit import digits
    from vtakit.compiler.compile import compile_model
    from vtakit.runtime import InferenceSession

    x, y = digits.test_split()
    model = digits.load_model()
    name = model.graph.input[0].name
    acc = {}
    for key, q in (("fp32", None), ("int8", True)):
        sess = InferenceSession(compile_model(model, threads=1, quantize=q,
                                              calib=digits.calibration_set() if q else None),
                                threads=1)
        hits = sum(int(np.argmax(sess.run(None, {name: x[i:i + 1]})[0]) == y[i])
                   for i in range(len(x)))
        acc[key] = 100.0 * hits / len(x)
    print(f"digits CNN: fp32 {acc['fp32']:.2f}%  int8 {acc['int8']:.2f}%  "
          f"difference {acc['int8'] - acc['fp32']:+.2f} points (target >= -1)")


def _ort_int8(model, calib: list[np.ndarray], name: str) -> bytes:
    """The model quantised by onnxruntime (static, QDQ, per-channel int8), as bytes."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(calib)

        def get_next(self):  # noqa: ANN202
            x = next(self.it, None)
            return None if x is None else {name: x}

    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "f.onnx", Path(d) / "q.onnx"
        onnx.save(model, src)
        quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8)
        return dst.read_bytes()


def main() -> None:
    import onnxruntime as ort

    from vtakit import models
    from vtakit.compiler.compile import compile_model
    from vtakit.runtime import InferenceSession

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--calib", type=int, default=32, help="calibration images")
    ap.add_argument("--quick", action="store_true", help="digits and resnet18 only, 2 threads")
    args = ap.parse_args()
    _digits()
    names = ["resnet18"] if args.quick else ["resnet18", "mobilenet_v2"]
    threads = [2] if args.quick else args.threads
    print(f"{'model':13s} {'thr':>3s} {'q+compile s':>11s} {'fp32 ms':>8s} {'int8 ms':>8s} "
          f"{'ort fp32':>8s} {'ort int8':>8s}  int8 vs: {'fp32':>5s} {'ort32':>5s} {'ort8':>5s}")
    for name in names:
        model = getattr(models, name)()
        inp = model.graph.input[0].name
        rng = np.random.default_rng(0)
        shape = (1, 3, 224, 224)
        calib = [rng.standard_normal(shape).astype(np.float32) for _ in range(args.calib)]
        ort_q = _ort_int8(model, calib[:8], inp)
        for t in threads:
            fp = InferenceSession(compile_model(model, threads=t), threads=t)
            t0 = time.perf_counter()
            art = compile_model(model, threads=t, quantize=True, calib=calib)
            qc_s = time.perf_counter() - t0
            q8 = InferenceSession(art, threads=t)
            so = ort.SessionOptions()
            so.intra_op_num_threads = t
            so.inter_op_num_threads = 1
            o32 = ort.InferenceSession(model.SerializeToString(), so,
                                       providers=["CPUExecutionProvider"])
            o8 = ort.InferenceSession(ort_q, so, providers=["CPUExecutionProvider"])
            feeds = {inp: calib[0]}
            ms = _median_ms([lambda s=s, f=feeds: s.run(None, f) for s in (fp, q8, o32, o8)],
                            args.repeat)
            print(f"{name:13s} {t:3d} {qc_s:11.2f} {ms[0]:8.2f} {ms[1]:8.2f} {ms[2]:8.2f} "
                  f"{ms[3]:8.2f}  {'':8s} {ms[1] / ms[0]:5.2f} {ms[1] / ms[2]:5.2f} "
                  f"{ms[1] / ms[3]:5.2f}")


if __name__ == "__main__":
    main()
