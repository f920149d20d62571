"""`vtakit demo --layer`: one hand-tiled int8 convolution layer on the simulated accelerator."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from vtakit.driver import kernels as K
from vtakit.driver.devices.sim import SimDevice
from vtakit.driver.session import Session
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.disasm import format_insn

__all__ = ["DEMO_LAYER", "run_demo"]

#: A ResNet-18 stage-4 3x3 convolution (VTA's C11): 512 -> 512 channels on 7x7.
DEMO_LAYER = K.Conv2dShape(n=1, c=512, h=7, w=7, o=512, kh=3, kw=3, stride=1, pad=1)


def run_demo(cfg: HwConfig, echo: Callable[[str], object] = print, *, shape: K.Conv2dShape
             = DEMO_LAYER, save: str | None = None, trace: str | None = None) -> bool:
    """Compile the layer by hand-tiling it through the driver, run it on the simulator, check
    it against numpy and print the statistics. Returns whether the outputs matched."""
    shape = K.Conv2dShape(n=max(shape.n, cfg.batch), c=shape.c, h=shape.h, w=shape.w,
                          o=shape.o, kh=shape.kh, kw=shape.kw, stride=shape.stride,
                          pad=shape.pad)
    rng = np.random.default_rng(2026)
    x = rng.integers(-128, 128, (shape.n, shape.c, shape.h, shape.w), dtype=np.int8)
    w = rng.integers(-128, 128, (shape.o, shape.c, shape.kh, shape.kw), dtype=np.int8)
    shift = 12
    echo(f"vtakit demo: conv2d {shape.c}x{shape.h}x{shape.w} -> {shape.o}x{shape.oh}x"
         f"{shape.ow}, {shape.kh}x{shape.kw} kernel, stride {shape.stride}, pad {shape.pad}; "
         f"int8, requantised by >> {shift} and a clip")
    echo(f"accelerator: {cfg.bitstream_name} ({cfg.hash}), {cfg.macs_per_cycle} MACs/cycle "
         f"at {cfg.clock_mhz} MHz")
    session = Session(SimDevice(cfg, dram_bytes=64 << 20, trace=trace))
    xd = session.array(K.pack_activations(x, cfg), name="x")
    wd = session.array(K.pack_weights(w, cfg), name="w")
    yd = session.alloc((shape.n // cfg.batch, shape.o // cfg.block_out, shape.oh, shape.ow,
                        cfg.batch, cfg.block_out), np.int8, name="y")
    t0 = time.perf_counter()
    tiling = K.conv2d(session, xd, wd, yd, shape, shift)
    program = session.finalize()
    t1 = time.perf_counter()
    echo(f"driver: {len(program)} instructions, tiles of {tiling.toh} output rows x "
         f"{tiling.tob * cfg.block_out} output channels x {tiling.tib * cfg.block_in} input "
         f"channels, two virtual threads ({1e3 * (t1 - t0):.1f} ms to build); the first "
         f"ones, before linking (dram_base is relocated to the buffers at run time):")
    for i, insn in enumerate(program.insns()[:4]):
        echo("  " + format_insn(i, insn, cfg))
    echo("  ...")
    if save:
        session.save_image(program, save, description=f"vtakit demo: {shape}")
        echo(f"run image saved to {save} (replay: vtakit sim {save})")
    result = session.run_program(program)
    t2 = time.perf_counter()
    got = K.unpack_outputs(yd.numpy())
    want = K.conv2d_reference(x, w, shape, shift)
    ok = bool(np.array_equal(got, want))
    stats = result.stats
    echo(f"simulated in {t2 - t1:.2f} s: {stats.cycles:,} cycles = "
         f"{stats.cycles / cfg.clock_mhz / 1e3:.3f} ms at {cfg.clock_mhz} MHz, "
         f"{2 * shape.macs / (stats.cycles / cfg.clock_mhz / 1e6) / 1e9:.1f} GOP/s "
         f"(peak {cfg.peak_gops:.1f})")
    echo(stats.summary())
    echo(f"outputs {'match' if ok else 'DIFFER FROM'} numpy "
         f"({got.size:,} int8 values{'' if ok else f', {int((got != want).sum())} differ'})")
    if trace:
        echo(f"timeline written to {trace} (open it in ui.perfetto.dev or chrome://tracing)")
    return ok
