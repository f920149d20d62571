"""CPU backend vs onnxruntime, fp32, batch 1, same thread count, measured in the same run.

    .venv/bin/python benchmarks/cpu_vs_ort.py [--threads 2] [--repeat 100]

Prints, per model: our compile time (ONNX → artifact with object code), the median latency of
ours and of onnxruntime (intra_op_num_threads = threads; blocks of runs of the two alternate),
and the ratio ours / onnxruntime.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

BLOCK = 25  # runs of one engine before switching to the other
WARMUP_S = 1.0  # seconds of runs of each engine before measuring


def _median_ms(fns, repeat: int) -> list[float]:
    """Median latency of each of `fns`: after `WARMUP_S` of runs of each (this machine's cores
    reach their steady speed only after a few hundred milliseconds of work), measured in
    alternating blocks of `BLOCK` runs (a, a, ..., b, b, ..., a, ...) so that a change in the
    machine's load affects both alike. Not run by run: both engines' worker threads poll for a
    while after a run, which would slow the other engine's next run."""
    for fn in fns:
        t_end = time.perf_counter() + WARMUP_S
        while time.perf_counter() < t_end:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(-(-repeat // BLOCK)):
        for fn, ts in zip(fns, times):
            for _ in range(3):  # the other engine's threads may still be polling
                fn()
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
    return [1e3 * statistics.median(ts) for ts in times]


def main() -> None:
    import onnxruntime as ort

    from vtakit import models
    from vtakit.compiler.compile import compile_model
    from vtakit.runtime.session import InferenceSession

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=100)
    args = ap.parse_args()
    print(f"{'model':14s} {'compile s':>9s} {'ours ms':>9s} {'ort ms':>9s} {'ratio':>7s}")
    for name in ("resnet18", "mobilenet_v2"):
        model = getattr(models, name)()
        t0 = time.perf_counter()
        art = compile_model(model, threads=args.threads)
        compile_s = time.perf_counter() - t0
        sess = InferenceSession(art.to_bytes(), threads=args.threads)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        ref = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).standard_normal(
            sess.get_inputs()[0].shape).astype(np.float32)
        feeds = {sess.get_inputs()[0].name: x}
        ours, theirs = _median_ms([lambda s=sess, f=feeds: s.run(None, f),
                                   lambda r=ref, f=feeds: r.run(None, f)], args.repeat)
        print(f"{name:14s} {compile_s:9.2f} {ours:9.2f} {theirs:9.2f} {ours / theirs:7.2f}")


if __name__ == "__main__":
    main()
