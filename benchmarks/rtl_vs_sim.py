"""RTL (Verilator) vs the Python simulator on the same streams: cycles and speed.

    python benchmarks/rtl_vs_sim.py [--config default] [--gemm 1024] [--quick]

For a GEMM-bound stream (``--gemm``\\ ^3 int8 matmul, 1024^3 as in sim_speed.py, about 20 s of
Verilator) and one ResNet-18 conv layer (C11, 3x3, 512 -> 512 channels on 7x7; ``--quick``: a
256^3 GEMM and a 64-channel 14x14 layer) it prints the simulated
cycles of ``sim`` and ``rtl`` (they must be equal), the wall time of each (stream execution only;
building the Verilator model is cached and reported separately), and the speed ratio.
Results are checked against numpy on both devices.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from vtakit.driver import Session, SimDevice
from vtakit.driver import kernels as K
from vtakit.driver.devices.rtl import RtlDevice
from vtakit.vta_hw.config import preset

C11 = K.Conv2dShape(1, 512, 7, 7, 512, 3, 3, 1, 1)
SMALL = K.Conv2dShape(1, 64, 14, 14, 64, 3, 3, 1, 1)


def run(device, cfg, shape, rng_seed):
    rng = np.random.default_rng(rng_seed)
    x = rng.integers(-128, 128, (shape.n, shape.c, shape.h, shape.w), dtype=np.int8)
    w = rng.integers(-128, 128, (shape.o, shape.c, shape.kh, shape.kw), dtype=np.int8)
    s = Session(device)
    xd, wd = s.array(K.pack_activations(x, cfg)), s.array(K.pack_weights(w, cfg))
    yd = s.alloc((shape.n // cfg.batch, shape.o // cfg.block_out, shape.oh, shape.ow,
                  cfg.batch, cfg.block_out), np.int8)
    K.conv2d(s, xd, wd, yd, shape, shift=10)
    program = s.finalize()
    t0 = time.perf_counter()
    result = s.run_program(program)
    dt = time.perf_counter() - t0
    np.testing.assert_array_equal(K.unpack_outputs(yd.numpy()),
                                  K.conv2d_reference(x, w, shape, 10))
    return result.cycles, dt, len(program)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default")
    ap.add_argument("--gemm", type=int, default=None, help="GEMM size (m = k = n; default 1024, "
                    "256 with --quick)")
    ap.add_argument("--quick", action="store_true", help="a smaller GEMM and conv layer")
    args = ap.parse_args()
    if args.gemm is None:
        args.gemm = 256 if args.quick else 1024
    cfg = preset(args.config)
    t0 = time.perf_counter()
    rtl = RtlDevice(cfg, dram_bytes=32 << 20)
    rtl.identify()
    print(f"config {args.config} ({cfg.hash}); Verilator model built (or found in the cache) in "
          f"{time.perf_counter() - t0:.1f} s")
    print(f"{'workload':<18}{'insns':>7}{'sim cycles':>13}{'rtl cycles':>13}{'sim s':>9}"
          f"{'rtl s':>9}{'rtl/sim':>9}{'rtl cyc/s':>12}")
    work = {f"gemm {args.gemm}^3": K.matmul_shape(cfg, args.gemm, args.gemm, args.gemm),
            "conv " + ("14x14x64" if args.quick else "resnet18 C11"): SMALL if args.quick
            else C11}
    ok = True
    try:
        for name, shape in work.items():
            sc, st, n = run(SimDevice(cfg, dram_bytes=32 << 20), cfg, shape, 1)
            rc, rt, _ = run(rtl, cfg, shape, 1)
            ok &= sc == rc
            print(f"{name:<18}{n:>7,}{sc:>13,}{rc:>13,}{st:>9.3f}{rt:>9.3f}{rt / st:>8.1f}x"
                  f"{rc / rt:>12,.0f}" + ("" if sc == rc else "   CYCLES DIFFER"))
    finally:
        rtl.close()
    print("cycles equal" if ok else "MISMATCH: sim and rtl report different cycle counts")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
