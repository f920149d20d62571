"""Integer inference on the CPU: our int8 path against our fp32 path and onnxruntime (fp32, and
int8 running the same model quantised by its own quantize_static, QDQ), measured in one run.

    .venv/bin/python benchmarks/int8_cpu.py [--threads 1 2] [--repeat 50] [--calib 32] [--quick]
                                            [--models resnet18 mobilenet_v2] [--ort-calib 8]
                                            [--ort-activations QUInt8 QInt8]

Prints:
- digits CNN: fp32 and int8 test accuracy on the shipped test split (target: within 1 point);
- per model and thread count: quantise + compile time (32 calibration images), the median
  latency of ours fp32 / ours int8 / onnxruntime fp32 / onnxruntime int8, and the ratios of ours
  int8 to the others (target: below 1 against ours fp32 and onnxruntime fp32 and int8);
- the same file for both engines, the model as users quantise it: onnxruntime's
  quant_pre_process + quantize_static (QDQ, QUInt8 or QInt8 activations, QInt8 per-channel
  weights, 8 calibration images; `ort_models.py`) compiled by us for the CPU (compile time) and
  run by onnxruntime, per model, activation type and thread count: the median latencies and
  ours / onnxruntime (target <= 1.0x).
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


def _same_file(names: list[str], threads: list[int], acts: list[str], repeat: int,
               calib_n: int) -> None:
    """The model as users quantise it, one file for both engines: onnxruntime's
    quant_pre_process + quantize_static (QDQ, `acts` activations, QInt8 per-channel weights),
    compiled by us for the CPU against onnxruntime running the same file."""
    import onnxruntime as ort
    from ort_models import ort_quantize  # type: ignore[import-not-found]

    from vtakit import models
    from vtakit.compiler.compile import compile_model
    from vtakit.runtime import InferenceSession

    print("\nthe same file: onnxruntime's quant_pre_process + quantize_static (QDQ, QInt8 "
          "per-channel weights), our CPU-int8 vs onnxruntime on it")
    print(f"{'model':13s} {'activations':11s} {'thr':>3s} {'compile s':>9s} {'ours ms':>8s} "
          f"{'ort ms':>8s}  ours/ort (target <= 1.0)")
    for name in names:
        model = getattr(models, name)()
        inp = model.graph.input[0].name
        rng = np.random.default_rng(0)
        calib = [rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
                 for _ in range(calib_n)]
        for act in acts:
            blob = ort_quantize(model, calib, activation=act).SerializeToString()
            feeds = {inp: calib[0]}
            for t in threads:
                t0 = time.perf_counter()
                art = compile_model(blob, threads=t)
                c_s = time.perf_counter() - t0
                ours = InferenceSession(art, threads=t)
                so = ort.SessionOptions()
                so.intra_op_num_threads = t
                so.inter_op_num_threads = 1
                theirs = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
                ms = _median_ms([lambda s=s, f=feeds: s.run(None, f) for s in (ours, theirs)],
                                repeat)
                print(f"{name:13s} {act:11s} {t:3d} {c_s:9.2f} {ms[0]:8.2f} {ms[1]:8.2f}  "
                      f"{ms[0] / ms[1]:5.2f}x")


def main() -> None:
    import onnxruntime as ort
    from ort_models import ort_quantize  # type: ignore[import-not-found]

    from vtakit import models
    from vtakit.compiler.compile import compile_model
    from vtakit.runtime import InferenceSession

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--calib", type=int, default=32, help="calibration images")
    ap.add_argument("--ort-calib", type=int, default=8,
                    help="calibration images for onnxruntime's quantize_static")
    ap.add_argument("--ort-activations", nargs="+", choices=["QUInt8", "QInt8"],
                    default=["QUInt8", "QInt8"],
                    help="activation types of the same-file comparison (uint8 or int8, "
                         "with their zero points)")
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2"])
    ap.add_argument("--quick", action="store_true", help="digits and resnet18 only, 2 threads")
    args = ap.parse_args()
    _digits()
    names = ["resnet18"] if args.quick else args.models
    threads = [2] if args.quick else args.threads
    print(f"{'model':13s} {'thr':>3s} {'q+compile s':>11s} {'fp32 ms':>8s} {'int8 ms':>8s} "
          f"{'ort fp32':>8s} {'ort int8':>8s}  int8 vs: {'fp32':>5s} {'ort32':>5s} {'ort8':>5s}")
    for name in names:
        model = getattr(models, name)()
        inp = model.graph.input[0].name
        rng = np.random.default_rng(0)
        shape = (1, 3, 224, 224)
        calib = [rng.standard_normal(shape).astype(np.float32) for _ in range(args.calib)]
        ort_q = ort_quantize(model, calib[:args.ort_calib], activation="QInt8",
                             pre_process=False).SerializeToString()
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
    _same_file(names, threads, args.ort_activations, args.repeat, args.ort_calib)


if __name__ == "__main__":
    main()
