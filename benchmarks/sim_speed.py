"""Simulator speed: a 1024x1024x1024 int8 GEMM and ResNet-18's 3x3 conv layers, hand-tiled
through the driver API, on the default preset.

    python benchmarks/sim_speed.py [--quick] [--config default]

For every workload it prints the simulated cycles, the host time to build the stream (driver)
and to simulate it, simulated cycles per second, host GMAC/s, MAC utilisation, and checks the
result against numpy. Ratios are against the targets (20 M cycles/s on GEMM-bound streams; 3 s
for the conv-layer set; 1 s for the driver's range check of a 100,000-instruction stream) and
against the functional (untimed) run measured in the same run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from vtakit.driver import Session, SimDevice
from vtakit.driver import kernels as K
from vtakit.driver.stream_check import check_stream, dram_reader, unknown_uops
from vtakit.vta_hw.config import preset
from vtakit.vta_sim.testing import compiled_mix_stream

# ResNet-18's 3x3 convolutions (VTA's C2, C3, C5, C6, C8, C9, C11), batch 1.
RESNET18_3X3 = {
    "C2": K.Conv2dShape(1, 64, 56, 56, 64, 3, 3, 1, 1),
    "C3": K.Conv2dShape(1, 64, 56, 56, 128, 3, 3, 2, 1),
    "C5": K.Conv2dShape(1, 128, 28, 28, 128, 3, 3, 1, 1),
    "C6": K.Conv2dShape(1, 128, 28, 28, 256, 3, 3, 2, 1),
    "C8": K.Conv2dShape(1, 256, 14, 14, 256, 3, 3, 1, 1),
    "C9": K.Conv2dShape(1, 256, 14, 14, 512, 3, 3, 2, 1),
    "C11": K.Conv2dShape(1, 512, 7, 7, 512, 3, 3, 1, 1),
}
TARGET_CYCLES_PER_S = 20e6
TARGET_CONV_SET_S = 3.0
TARGET_CHECK_100K_S = 1.0  # the driver's range check of a 100,000-instruction stream


def run_conv(cfg, shape, timing, rng, check=True):
    x = rng.integers(-128, 128, (shape.n, shape.c, shape.h, shape.w), dtype=np.int8)
    w = rng.integers(-128, 128, (shape.o, shape.c, shape.kh, shape.kw), dtype=np.int8)
    s = Session(SimDevice(cfg, dram_bytes=64 << 20, timing=timing))
    xd, wd = s.array(K.pack_activations(x, cfg)), s.array(K.pack_weights(w, cfg))
    yd = s.alloc((shape.n // cfg.batch, shape.o // cfg.block_out, shape.oh, shape.ow,
                  cfg.batch, cfg.block_out), np.int8)
    t0 = time.perf_counter()
    K.conv2d(s, xd, wd, yd, shape, shift=10)
    program = s.finalize()
    t1 = time.perf_counter()
    result = s.run_program(program)
    t2 = time.perf_counter()
    if check:
        np.testing.assert_array_equal(K.unpack_outputs(yd.numpy()),
                                      K.conv2d_reference(x, w, shape, 10))
    return result.stats, len(program), t1 - t0, t2 - t1


def row(name, stats, insns, build_s, sim_s, macs):
    cps = stats.cycles / sim_s if stats.cycles else float("nan")
    print(f"{name:<14}{insns:>8,}{stats.cycles:>13,}{build_s:>9.3f}{sim_s:>9.3f}"
          f"{cps / 1e6:>10.1f}{macs / sim_s / 1e9:>9.2f}{100 * stats.mac_utilisation:>8.1f}%"
          f"{cps / TARGET_CYCLES_PER_S:>9.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--quick", action="store_true", help="a 256^3 GEMM and C11 only")
    args = parser.parse_args()
    cfg = preset(args.config)
    rng = np.random.default_rng(0)
    print(f"config {args.config} ({cfg.bitstream_name}), {cfg.clock_mhz} MHz")
    print(f"{'workload':<14}{'insns':>8}{'cycles':>13}{'build s':>9}{'sim s':>9}"
          f"{'Mcyc/s':>10}{'GMAC/s':>9}{'MAC use':>9}{'vs 20M':>10}")
    size = 256 if args.quick else 1024
    gemm = K.matmul_shape(cfg, size, size, size)
    stats, insns, b, t = run_conv(cfg, gemm, True, rng)
    row(f"gemm {size}^3", stats, insns, b, t, gemm.macs)
    _, _, _, t_f = run_conv(cfg, gemm, False, rng, check=False)
    print(f"  functional (untimed) run {t_f:.3f} s: timing costs {t / t_f:.2f}x")
    layers = {"C11": RESNET18_3X3["C11"]} if args.quick else RESNET18_3X3
    total_sim = total_cycles = 0.0
    for name, shape in layers.items():
        stats, insns, b, t = run_conv(cfg, shape, True, rng)
        row(f"resnet18 {name}", stats, insns, b, t, shape.macs)
        total_sim += t
        total_cycles += stats.cycles
    print(f"conv set: {int(total_cycles):,} cycles ({total_cycles / cfg.clock_mhz / 1e3:.2f} ms "
          f"at {cfg.clock_mhz} MHz), simulated in {total_sim:.2f} s: "
          f"{total_sim / TARGET_CONV_SET_S:.2f}x of the {TARGET_CONV_SET_S:.0f} s budget")
    c_cfg, raw, dram = compiled_mix_stream(100_000, 20)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        check_stream(c_cfg, raw, unknown_uops(c_cfg), dram_reader(dram))
        best = min(best, time.perf_counter() - t0)
    print(f"stream check (driver) of 100,000 instructions ({c_cfg.bitstream_name}): "
          f"{best:.3f} s, {best / TARGET_CHECK_100K_S:.2f}x of the "
          f"{TARGET_CHECK_100K_S:.0f} s budget")


if __name__ == "__main__":
    main()
