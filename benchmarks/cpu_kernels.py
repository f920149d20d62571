"""CPU backend kernels vs the references, measured in the same run.

    python benchmarks/cpu_kernels.py [--quick] [--threads 1 2]

1. float32 GEMM GFLOP/s of our LLVM-generated kernel (weights pre-packed with `pack_b`) vs
   ``numpy.matmul`` (OpenBLAS, its thread count set to the same number) on 512³ and conv-like
   shapes, with the ratio ours / numpy.
2. ResNet-18's 20 convolutions (224×224, batch 1, bias + ReLU fused where the network has it):
   our summed time vs onnxruntime running a one-Conv model per layer with
   ``intra_op_num_threads`` = the same thread count, with the ratio ours / onnxruntime.
3. int8 GEMM (`gemm_s8`, requantising to int8 with ReLU as the clamp) vs the float32 packed GEMM
   (bias + ReLU) on ResNet-18's distinct convolutions as GEMMs, in `Conv2d`'s orientation
   (M = Cout, K = Cin·KH·KW, N = OH·OW; weights are A): GOP/s of the kernels on packed operands
   (VNNI and the portable variant), of the whole ``gemm_s8`` call (activations packed, offset
   by 128, on every call), and the ratios int8 / float32.

    python benchmarks/cpu_kernels.py --only int8 [--quick] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import time
from collections.abc import Callable

import numpy as np

from vtakit.compiler.backend.cpu.kernels import gemm as G
from vtakit.compiler.backend.cpu.kernels.conv import Conv2d

GEMM_SHAPES = [(512, 512, 512), (3136, 576, 64), (49, 4608, 512), (12544, 147, 64)]

# (name, Cin, H, W, Cout, k, stride, pad, relu): ResNet-18 at 224x224.
RESNET18_CONVS = (
    [("conv1", 3, 224, 224, 64, 7, 2, 3, True)]
    + [(f"layer1.{i}", 64, 56, 56, 64, 3, 1, 1, True) for i in range(4)]
    + [("layer2.0.conv1", 64, 56, 56, 128, 3, 2, 1, True),
       ("layer2.0.down", 64, 56, 56, 128, 1, 2, 0, False)]
    + [(f"layer2.{i}", 128, 28, 28, 128, 3, 1, 1, True) for i in range(3)]
    + [("layer3.0.conv1", 128, 28, 28, 256, 3, 2, 1, True),
       ("layer3.0.down", 128, 28, 28, 256, 1, 2, 0, False)]
    + [(f"layer3.{i}", 256, 14, 14, 256, 3, 1, 1, True) for i in range(3)]
    + [("layer4.0.conv1", 256, 14, 14, 512, 3, 2, 1, True),
       ("layer4.0.down", 256, 14, 14, 512, 1, 2, 0, False)]
    + [(f"layer4.{i}", 512, 7, 7, 512, 3, 1, 1, True) for i in range(3)]
)


def best_time(fn: Callable[[], object], min_s: float = 0.3, reps: int = 5) -> float:
    """Best of `reps` timings, each averaging calls over at least `min_s` / reps seconds."""
    fn()
    best = float("inf")
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_s / reps:
                break
        best = min(best, dt / n)
    return best


def set_blas_threads(n: int) -> bool:
    """Set OpenBLAS's thread count inside numpy's bundled library; False if not found."""
    import numpy

    libdir = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
    for path in glob.glob(os.path.join(libdir, "libscipy_openblas*.so")):
        lib = ctypes.CDLL(path)
        for sym in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                return True
    return False


def bench_gemm(threads: list[int], min_s: float) -> None:
    print("float32 GEMM, C = A @ B, B pre-packed (GFLOP/s)")
    print(f"{'M':>6} {'K':>5} {'N':>5} {'thr':>3} {'ours':>8} {'numpy':>8} {'ratio':>6}")
    rng = np.random.default_rng(0)
    for m, k, n in GEMM_SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        pb = G.pack_b(b)
        out = np.empty((m, n), np.float32)
        G.gemm(a, pb, out)
        np.testing.assert_allclose(out, a @ b, rtol=1e-3, atol=1e-3)
        flops = 2.0 * m * n * k
        for t in threads:
            ok = set_blas_threads(t)
            def ours_fn(a=a, pb=pb, out=out, t=t):
                return G.gemm(a, pb, out, threads=t)

            ours = flops / best_time(ours_fn, min_s) / 1e9
            ref = flops / best_time(lambda a=a, b=b: np.matmul(a, b), min_s) / 1e9
            note = "" if ok else "  (numpy threads not set)"
            print(f"{m:>6} {k:>5} {n:>5} {t:>3} {ours:>8.1f} {ref:>8.1f} {ours / ref:>6.2f}{note}")


def _ort_conv(cin: int, h: int, w: int, cout: int, k: int, s: int, p: int, relu: bool,
              wt: np.ndarray, bias: np.ndarray, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu else "y"],
                              kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(wt, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def bench_resnet18_convs(threads: list[int], min_s: float) -> None:
    rng = np.random.default_rng(1)
    layers = []
    for name, cin, h, w, cout, k, s, p, relu in RESNET18_CONVS:
        x = rng.standard_normal((1, cin, h, w), dtype=np.float32)
        wt = (rng.standard_normal((cout, cin, k, k), dtype=np.float32)
              / np.sqrt(cin * k * k)).astype(np.float32)
        bias = rng.standard_normal(cout, dtype=np.float32)
        conv = Conv2d(wt, bias, s, p, act="relu" if relu else None)
        layers.append((name, cin, h, w, cout, k, s, p, relu, x, wt, bias, conv))
    print("\nResNet-18 convolutions (224x224, batch 1, bias+ReLU fused), ms")
    for t in threads:
        print(f"threads={t}: {'layer':<16} {'ours':>7} {'ort':>7} {'ratio':>6}")
        tot_ours = tot_ort = 0.0
        for name, cin, h, w, cout, k, s, p, relu, x, wt, bias, conv in layers:
            sess = _ort_conv(cin, h, w, cout, k, s, p, relu, wt, bias, t)
            y = np.empty(conv.output_shape(x.shape), np.float32)
            conv(x, y, threads=t)
            ref = sess.run(None, {"x": x})[0]
            np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-3)
            ours = best_time(lambda c=conv, x=x, y=y, t=t: c(x, y, threads=t), min_s) * 1e3
            theirs = best_time(lambda s_=sess, x=x: s_.run(None, {"x": x}), min_s) * 1e3
            tot_ours += ours
            tot_ort += theirs
            print(f"{'':>10} {name:<16} {ours:>7.3f} {theirs:>7.3f} {ours / theirs:>6.2f}")
        print(f"{'':>10} {'TOTAL':<16} {tot_ours:>7.3f} {tot_ort:>7.3f} {tot_ours / tot_ort:>6.2f}")


def resnet18_gemm_shapes() -> list[tuple[str, int, int, int]]:
    """(first layer, M = Cout, K = Cin*k*k, N = OH*OW) of ResNet-18's distinct convolutions."""
    shapes: dict[tuple[int, int, int], str] = {}
    for name, cin, h, _w, cout, k, s, p, _relu in RESNET18_CONVS:
        oh = (h + 2 * p - k) // s + 1
        shapes.setdefault((cout, cin * k * k, oh * oh), name)
    return [(name, *shape) for shape, name in shapes.items()]


def bench_gemm_s8(threads: list[int], min_s: float) -> None:
    vnni_ok = G.default_vnni()
    print("\nint8 GEMM (requantised to int8) vs float32 GEMM, ResNet-18 convolutions as GEMMs "
          "(M=Cout, K=Cin*k*k, N=pixels), GOP/s")
    print("  kernels on packed operands; 's8call' = gemm_s8() with activation packing")
    if not vnni_ok:
        print("  (no AVX-512 VNNI on this CPU: VNNI column skipped)")
    print(f"{'layer':<15} {'M':>4} {'K':>5} {'N':>5} {'thr':>3} {'f32':>6} {'s8vnni':>7} "
          f"{'s8port':>7} {'s8call':>7} {'vnni/f32':>8} {'port/f32':>8}")
    rng = np.random.default_rng(2)
    for name, m, k, n in resnet18_gemm_shapes():
        _bench_s8_shape(name, m, k, n, threads, min_s, rng, vnni_ok)


def _bench_s8_shape(name: str, m: int, k: int, n: int, threads: list[int], min_s: float,
                    rng: np.random.Generator, vnni_ok: bool) -> None:
    w = rng.integers(-128, 128, (m, k), dtype=np.int8)
    x = rng.integers(-128, 128, (k, n), dtype=np.int8)
    fcfg = G.choose_config(n)  # as Conv2d: weights packed as A, pixels as B panels
    pa = G.pack_a(w.astype(np.float32), fcfg)
    pb = G.pack_b(x.astype(np.float32), fcfg)
    fbias = rng.standard_normal(m, dtype=np.float32)
    fout = np.empty((m, n), np.float32)
    cfg = G.choose_s8_config(m, n, "a")
    packed = G.pack_s8_weights(w, cfg, "nk")
    bias = rng.integers(-(1 << 16), 1 << 16, m)
    mult = rng.integers(1 << 10, 1 << 12, m)
    shift = np.full(m, 24)
    params = G.s8_channel_params(packed, bias, mult, shift)
    act = G.pack_s8_activations(x, cfg)
    out = np.empty((m, n), np.int8)
    def wrap(v: np.ndarray) -> np.ndarray:  # int32 wrap-around, as the kernel
        return v.astype(np.int32).astype(np.int64)

    acc = wrap(w.astype(np.int64) @ x.astype(np.int64) + bias[:, None])
    want = np.clip(wrap(wrap(acc * mult[:, None]) + (1 << 23)) >> 24, 0, 127)
    ops = 2.0 * m * n * k
    for t in threads:
        def f32(t: int = t) -> None:
            G.gemm_packed(pa, pb, fout, fbias, "row", "relu", 0.0, 0.0, t)

        def s8(vnni: bool, t: int = t) -> None:
            G.gemm_s8_packed(act, packed, out, params, True, 0, 127, t, vnni)

        def call(t: int = t) -> None:
            G.gemm_s8(x, packed, bias=bias, multiplier=mult, shift=shift, lo=0, hi=127,
                      out=out, threads=t)

        rates = {}
        for key, fn in [("f32", f32), ("vnni", lambda: s8(True)), ("port", lambda: s8(False)),
                        ("call", call)]:
            if key == "vnni" and not vnni_ok:
                continue
            out[...] = 0
            rates[key] = ops / best_time(fn, min_s) / 1e9
            if key != "f32":
                np.testing.assert_array_equal(out, want)
        vn = rates.get("vnni", float("nan"))
        print(f"{name:<15} {m:>4} {k:>5} {n:>5} {t:>3} {rates['f32']:>6.1f} {vn:>7.1f} "
              f"{rates['port']:>7.1f} {rates['call']:>7.1f} {vn / rates['f32']:>8.2f} "
              f"{rates['port'] / rates['f32']:>8.2f}")


SECTIONS = {"gemm": bench_gemm, "convs": bench_resnet18_convs, "int8": bench_gemm_s8}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--quick", action="store_true", help="shorter timings")
    ap.add_argument("--only", nargs="+", choices=list(SECTIONS), default=list(SECTIONS),
                    help="sections to run (default: all)")
    args = ap.parse_args()
    min_s = 0.1 if args.quick else 0.4
    for name in args.only:
        SECTIONS[name](args.threads, min_s)


if __name__ == "__main__":
    main()
