"""Hand-tiled accelerator kernels written against the public driver API.

These are what a person writes with VTA's runtime: int8 matrix multiply and 2-D convolution,
tiled to fit the on-chip buffers, double-buffered with two virtual threads (each thread owns
half of INP, WGT and ACC; dependency tokens order the halves), requantised on the ALU with an
arithmetic shift and a clip to int8. The benchmarks and the demo use them; the compiler's
accelerator backend generates the same instruction patterns.

Layouts (VTA's): activations NCHW{b}n{c}c, i.e. ``(N/B, C/BI, H, W, B, BI)``; weights
OIHW{o}o{i}i, ``(O/BO, I/BI, KH, KW, BO, BI)``; outputs ``(N/B, O/BO, OH, OW, B, BO)``. A matrix
multiply is a 1x1 convolution of an ``(M/B) x 1`` image (:func:`matmul_shape`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from vtakit.driver.session import DeviceArray, Session
from vtakit.driver.threads import VirtualThreads
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig

__all__ = ["Conv2dShape", "Conv2dTiling", "choose_tiling", "conv2d", "matmul", "matmul_shape",
           "pack_activations", "pack_weights", "unpack_outputs", "pack_matrix",
           "unpack_matrix", "conv2d_reference"]

M, A = isa.MemType, isa.AluOp


@dataclass(frozen=True)
class Conv2dShape:
    """An int8 NCHW convolution: batch ``n``, ``c`` input channels of ``h x w``, ``o`` output
    channels, ``kh x kw`` kernel, ``stride``, symmetric zero ``pad``."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int = 3
    kw: int = 3
    stride: int = 1
    pad: int = 1

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.pad - self.kh) // self.stride + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.pad - self.kw) // self.stride + 1

    @property
    def macs(self) -> int:
        return self.n * self.o * self.oh * self.ow * self.c * self.kh * self.kw

    def check(self, cfg: HwConfig) -> None:
        for name, value, block in (("n", self.n, cfg.batch), ("c", self.c, cfg.block_in),
                                   ("o", self.o, cfg.block_out)):
            if value % block:
                raise ValueError(f"conv2d: {name}={value} is not a multiple of the core's "
                                 f"{block} (pad the tensor or run it on the CPU)")
        if self.oh < 1 or self.ow < 1:
            raise ValueError(f"conv2d: empty output {self.oh}x{self.ow} for {self}")
        if self.pad > 15:
            raise ValueError(f"conv2d: pad={self.pad} exceeds the 4-bit padding fields (<= 15)")


@dataclass(frozen=True)
class Conv2dTiling:
    """Output rows, output-channel blocks and input-channel blocks per tile."""

    toh: int
    tob: int
    tib: int


def _buffer_use(s: Conv2dShape, cfg: HwConfig, t: Conv2dTiling) -> tuple[int, int, int]:
    in_rows = (t.toh - 1) * s.stride + s.kh
    wp = s.w + 2 * s.pad
    return (t.tib * in_rows * wp, t.tob * t.tib * s.kh * s.kw, t.tob * t.toh * s.ow)


def choose_tiling(s: Conv2dShape, cfg: HwConfig) -> Conv2dTiling:
    """The tiling with the fewest estimated cycles whose buffers fit half of each SRAM.

    The estimate per tile is ``max(GEMM micro-ops, bus beats loaded)``: loads overlap compute
    when the two virtual threads alternate.
    """
    s.check(cfg)
    ob, ib = s.o // cfg.block_out, s.c // cfg.block_in
    best: tuple[float, Conv2dTiling] | None = None
    divisors = [d for d in range(1, s.oh + 1) if s.oh % d == 0]
    for toh, tob, tib in itertools.product(divisors, _divisors(ob), _divisors(ib)):
        t = Conv2dTiling(toh, tob, tib)
        inp, wgt, acc = _buffer_use(s, cfg, t)
        if inp > cfg.inp_depth // 2 or wgt > cfg.wgt_depth // 2 or acc > cfg.acc_depth // 2:
            continue
        uops = toh * s.ow * tob * tib * s.kh * s.kw
        if tob * tib * s.kh * s.kw > cfg.uop_depth // 4 or toh >= 1 << 14 or s.ow >= 1 << 14:
            continue
        beats = (inp * cfg.inp_elem_bytes + wgt * cfg.wgt_elem_bytes) / cfg.bus_bytes
        chunks = (s.oh // toh) * (ob // tob) * (ib // tib) * (s.n // cfg.batch)
        cost = chunks * (max(uops, beats) + 64)  # + a fixed cost per chunk
        if best is None or cost < best[0]:
            best = (cost, t)
    if best is None:
        raise ValueError(f"conv2d: no tiling of {s} fits the buffers of "
                         f"{cfg.bitstream_name}")
    return best[1]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def pack_activations(x: np.ndarray, cfg: HwConfig) -> np.ndarray:
    """(N, C, H, W) -> (N/B, C/BI, H, W, B, BI)."""
    n, c, h, w = x.shape
    b, bi = cfg.batch, cfg.block_in
    return np.ascontiguousarray(x.reshape(n // b, b, c // bi, bi, h, w).transpose(0, 2, 4, 5, 1, 3))


def pack_weights(wt: np.ndarray, cfg: HwConfig) -> np.ndarray:
    """(O, I, KH, KW) -> (O/BO, I/BI, KH, KW, BO, BI)."""
    o, i, kh, kw = wt.shape
    bo, bi = cfg.block_out, cfg.block_in
    return np.ascontiguousarray(
        wt.reshape(o // bo, bo, i // bi, bi, kh, kw).transpose(0, 2, 4, 5, 1, 3))


def unpack_outputs(y: np.ndarray) -> np.ndarray:
    """(N/B, O/BO, OH, OW, B, BO) -> (N, O, OH, OW)."""
    nb, ob, oh, ow, b, bo = y.shape
    return np.ascontiguousarray(y.transpose(0, 4, 1, 5, 2, 3).reshape(nb * b, ob * bo, oh, ow))


def conv2d_reference(x: np.ndarray, wt: np.ndarray, s: Conv2dShape, shift: int) -> np.ndarray:
    """numpy: int32 convolution, arithmetic shift right, clip to int8 (NCHW in and out)."""
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (s.pad, s.pad), (s.pad, s.pad)))
    out = np.zeros((s.n, s.o, s.oh, s.ow), dtype=np.int64)
    for ky in range(s.kh):
        for kx in range(s.kw):
            patch = xp[:, :, ky:ky + s.stride * s.oh:s.stride, kx:kx + s.stride * s.ow:s.stride]
            out += np.einsum("nchw,oc->nohw", patch, wt[:, :, ky, kx].astype(np.int64))
    acc = out.astype(np.int32)  # the accelerator's accumulator wraps at 32 bits
    return np.clip(acc >> shift, -128, 127).astype(np.int8)


def conv2d(sess: Session, x: DeviceArray, wt: DeviceArray, y: DeviceArray, s: Conv2dShape,
           shift: int, tiling: Conv2dTiling | None = None) -> Conv2dTiling:
    """Record ``y = clip(conv2d(x, wt) >> shift, -128, 127)`` on ``sess`` (no synchronize).

    ``x``, ``wt`` and ``y`` hold the packed layouts of :func:`pack_activations`,
    :func:`pack_weights` and :func:`unpack_outputs`' input.
    """
    cfg = sess.cfg
    t = tiling or choose_tiling(s, cfg)
    inp, wgt, acc = _buffer_use(s, cfg, t)
    if inp > cfg.inp_depth // 2 or wgt > cfg.wgt_depth // 2 or acc > cfg.acc_depth // 2:
        raise ValueError(f"conv2d: tiling {t} needs INP {inp}, WGT {wgt}, ACC {acc} rows; each "
                         f"thread has {cfg.inp_depth // 2}, {cfg.wgt_depth // 2}, "
                         f"{cfg.acc_depth // 2}")
    nb, ob, ib = s.n // cfg.batch, s.o // cfg.block_out, s.c // cfg.block_in
    wp = s.w + 2 * s.pad
    in_rows = (t.toh - 1) * s.stride + s.kh
    taps = s.kh * s.kw
    vt = VirtualThreads(sess, threads=2)
    for n0, o0, oh0 in itertools.product(range(nb), range(0, ob, t.tob),
                                         range(0, s.oh, t.toh)):
        with vt.tile() as a:
            acc_base = vt.half(cfg.acc_depth, a)
            for i0 in range(0, ib, t.tib):
                with vt.load() as b:
                    inp_base, wgt_base = vt.half(cfg.inp_depth, b), vt.half(cfg.wgt_depth, b)
                    _load_chunk(sess, x, wt, s, t, n0, o0, oh0, i0, inp_base, wgt_base)
                with vt.compute():
                    if i0 == 0:
                        sess.gemm(sess.uop_kernel(
                            ("conv-reset", t, s.ow, a),
                            lambda k, acc_base=acc_base: k.loop(t.tob * t.toh * s.ow,
                                                                dst=1).push(acc_base),
                            reset=True))

                    def record(k, inp_base=inp_base, wgt_base=wgt_base, acc_base=acc_base):
                        k.loop(t.toh, dst=s.ow, src=s.stride * wp).loop(s.ow, dst=1,
                                                                        src=s.stride)
                        for oc, ci, ky, kx in itertools.product(range(t.tob), range(t.tib),
                                                                range(s.kh), range(s.kw)):
                            k.push(acc_base + oc * t.toh * s.ow,
                                   inp_base + ci * in_rows * wp + ky * wp + kx,
                                   wgt_base + (oc * t.tib + ci) * taps + ky * s.kw + kx)
                    sess.gemm(sess.uop_kernel(("conv", s, t, a, b), record))
            rows_acc = t.tob * t.toh * s.ow
            with vt.compute():
                for op, imm in ((A.SHR, shift), (A.MIN, 127), (A.MAX, -128)):
                    sess.alu(sess.uop_kernel(
                        ("requant", op, imm, rows_acc, a),
                        lambda k, n=rows_acc, base=acc_base: k.loop(n, dst=1, src=1).push(
                            base, base),
                        mode="alu", alu_opcode=op, use_imm=True, imm=imm))
            with vt.store():
                for oc in range(t.tob):
                    sess.store_2d(y, ((n0 * ob + o0 + oc) * s.oh + oh0) * s.ow,
                                  x_size=t.toh * s.ow, y_size=1, x_stride=t.toh * s.ow,
                                  sram_base=acc_base + oc * t.toh * s.ow)
    vt.finish()
    return t


def _load_chunk(sess: Session, x: DeviceArray, wt: DeviceArray, s: Conv2dShape,
                t: Conv2dTiling, n0: int, o0: int, oh0: int, i0: int, inp_base: int,
                wgt_base: int) -> None:
    """The LOADs of one chunk: ``t.tib`` input-channel blocks of the input rows that output
    rows ``oh0 ..`` read (zero-padded), and the matching weights."""
    cfg = sess.cfg
    ib = s.c // cfg.block_in
    wp = s.w + 2 * s.pad
    in_rows = (t.toh - 1) * s.stride + s.kh
    taps = s.kh * s.kw
    ih0 = oh0 * s.stride - s.pad
    top, bottom = max(0, -ih0), max(0, ih0 + in_rows - s.h)
    rows = in_rows - top - bottom
    plane = (n0 * ib + i0) * s.h * s.w
    first = plane + max(ih0, 0) * s.w
    if s.pad == 0:
        # whole rows, no padding: the tib channel blocks are tib runs of rows * w elements,
        # h * w apart in DRAM and back to back in SRAM: one 2-D load
        sess.load_2d(x, first, x_size=rows * s.w, y_size=t.tib, x_stride=s.h * s.w,
                     sram_base=inp_base, memory_type=M.INP)
    else:
        for ci in range(t.tib):
            sess.load_2d(x, first + ci * s.h * s.w, x_size=s.w, y_size=rows, x_stride=s.w,
                         x_pad_0=s.pad, x_pad_1=s.pad, y_pad_0=top, y_pad_1=bottom,
                         sram_base=inp_base + ci * in_rows * wp, memory_type=M.INP)
    sess.load_2d(wt, (o0 * ib + i0) * taps, x_size=t.tib * taps, y_size=t.tob,
                 x_stride=ib * taps, sram_base=wgt_base, memory_type=M.WGT)


def matmul(sess: Session, a: DeviceArray, w: DeviceArray, y: DeviceArray, m: int, k: int,
           n: int, shift: int) -> Conv2dTiling:
    """Record ``y = clip((a @ w.T) >> shift, -128, 127)`` for int8 ``a`` (m x k) and ``w``
    (n x k) as a 1x1 convolution over an (m/B) x 1 image (:func:`matmul_shape`): ``a`` packed
    by :func:`pack_matrix`, ``w`` by :func:`pack_weights` of ``w[:, :, None, None]``, and ``y``
    unpacked by :func:`unpack_matrix`."""
    return conv2d(sess, a, w, y, matmul_shape(sess.cfg, m, k, n), shift)


def matmul_shape(cfg: HwConfig, m: int, k: int, n: int) -> Conv2dShape:
    if m % cfg.batch:
        raise ValueError(f"matmul: m={m} is not a multiple of the core's batch {cfg.batch}")
    return Conv2dShape(n=cfg.batch, c=k, h=m // cfg.batch, w=1, o=n, kh=1, kw=1, stride=1,
                       pad=0)


def pack_matrix(a: np.ndarray, cfg: HwConfig) -> np.ndarray:
    """(m, k) -> the activations of :func:`matmul_shape`: row ``r`` is image row
    ``r // B``, batch ``r % B``."""
    m, k = a.shape
    b = cfg.batch
    return pack_activations(a.reshape(m // b, b, k).transpose(1, 2, 0)[:, :, :, None], cfg)


def unpack_matrix(y: np.ndarray) -> np.ndarray:
    """The packed output of :func:`matmul` -> (m, n)."""
    nchw = unpack_outputs(y)  # (B, n, m/B, 1)
    b, n, mb, _ = nchw.shape
    return np.ascontiguousarray(nchw[:, :, :, 0].transpose(2, 0, 1).reshape(mb * b, n))
