"""float32 NCHW Conv2d as LLVM IR: im2col packed straight into GEMM panels, depthwise loop nest.

``groups == 1``: the output of one image is ``Y[Cout, OH*OW] = W[Cout, Cin*KH*KW] @ col``, with the
weights pre-packed once as the GEMM's ``A`` (``MR``-row panels) and ``col`` built at run time by
an IR kernel that writes the ``NR``-pixel panels of ``B`` directly (no separate im2col matrix).
Bias is per output channel (a row of ``Y``), fused with ReLU / clip in the GEMM epilogue.
Threads split the pixel panels: each thread packs its panels and multiplies them, no barrier.

``groups == Cin == Cout`` (depthwise): its own loop nest, row by row, the inner loop over output
columns vectorised. Other group counts run one GEMM per group.

Every loop-nest parameter of a layer (shape, stride, padding, dilation) is a compile-time constant
of its im2col / depthwise kernel, compiled once per distinct layer shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from vtakit.runtime.cpu.llvm import CACHE
from vtakit.runtime.cpu.parallel import run_parallel, split_range

from . import gemm as G
from . import irutil as U
from .depthwise import depthwise_module


@dataclass(frozen=True)
class ConvGeom:
    """Shape of one convolution on one image (channels of one group)."""

    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1


def _im2col_module(g: ConvGeom, nr: int) -> ir.Module:
    """im2col_pack(x, dst, jp0, jp1): dst[jp, k, c] = x[ci, ih, iw] for pixel jp*nr + c and
    k = (ci, kh, kw).

    A panel's pixels split into segments that lie in one output row; for each segment and tap
    (kh, kw) the in-bounds columns are a strided copy along the input row, the rest zero. The
    bounds are computed once per (segment, tap) and reused over all input channels.
    """
    m = ir.Module(name=f"im2col_{g.c}x{g.h}x{g.w}_k{g.kh}x{g.kw}_s{g.sh}x{g.sw}_p{g.ph}x{g.pw}"
                       f"_d{g.dh}x{g.dw}_nr{nr}")
    _, b = U.new_function(m, "im2col_pack", [("x", U.PTR), ("dst", U.PTR), ("jp0", U.I64),
                                              ("jp1", U.I64)])
    x, dst, jp0, jp1 = b.function.args
    ow, npix = g.ow, g.oh * g.ow
    ktot, khw, hw = g.c * g.kh * g.kw, g.kh * g.kw, g.h * g.w
    zero = U.f32(0.0)
    with U.loop(b, jp0, jp1, 1, "jp") as jp:
        p0 = b.mul(jp, U.i64(nr))
        base = b.mul(jp, U.i64(ktot * nr))
        valid = U.imin(b, U.i64(nr), b.sub(U.i64(npix), p0))  # pixels in this panel
        # columns past the last pixel: zero in every row
        with U.loop(b, 0, U.i64(ktot), 1, "zk") as k:
            with U.loop(b, valid, U.i64(nr), 1, "zc") as c:
                U.store(b, U.F32, zero, dst, b.add(base, b.add(b.mul(k, U.i64(nr)), c)))
        # segments: c0 = first panel column, oh, ow0, seg_len; loop while c0 < valid
        pre = b.block
        fn = pre.function
        head, body, done = (fn.append_basic_block(n) for n in ("seg.head", "seg.body", "seg.end"))
        b.branch(head)
        b.position_at_end(head)
        c0 = b.phi(U.I64, "c0")
        c0.add_incoming(U.i64(0), pre)
        b.cbranch(b.icmp_signed("<", c0, valid), body, done)
        b.position_at_end(body)
        p = b.add(p0, c0)
        o_h = b.sdiv(p, U.i64(ow))
        ow0 = b.srem(p, U.i64(ow))
        seg_len = U.imin(b, b.sub(U.i64(ow), ow0), b.sub(valid, c0))
        ow1 = b.add(ow0, seg_len)
        def taps(khv: ir.Value, label: str) -> None:
            ih = b.add(b.mul(o_h, U.i64(g.sh)), b.sub(b.mul(khv, U.i64(g.dh)), U.i64(g.ph)))
            row_ok = b.icmp_unsigned("<", ih, U.i64(g.h))
            for kw in range(g.kw):
                off = kw * g.dw - g.pw  # iw = ow*sw + off
                lo_c = 0 if off >= 0 else (-off + g.sw - 1) // g.sw
                hi_c = max(0, min(ow, (g.w - 1 - off) // g.sw + 1)) if g.w - 1 - off >= 0 else 0
                lo_c = min(lo_c, hi_c)
                # copy ow in [lo, hi), zero [ow0, lo) and [hi, ow1); all of it when row is out
                lo = U.imin(b, U.imax(b, ow0, U.i64(lo_c)), ow1)
                hi = U.imax(b, U.imin(b, ow1, U.i64(hi_c)), lo)
                lo = b.select(row_ok, lo, ow1)
                hi = b.select(row_ok, hi, ow1)
                src0 = b.add(b.mul(ih, U.i64(g.w)), U.i64(off))
                # dst column of pixel ow: c0 + (ow - ow0)
                dshift = b.sub(c0, ow0)
                with U.loop(b, 0, U.i64(g.c), 1, f"ci{label}_{kw}") as ci:
                    tap = b.add(b.mul(khv, U.i64(g.kw)), U.i64(kw))
                    drow = b.add(base, b.mul(b.add(b.mul(ci, U.i64(khw)), tap), U.i64(nr)))
                    drow = b.add(drow, dshift)
                    srow = b.add(b.mul(ci, U.i64(hw)), src0)
                    with U.loop(b, ow0, lo, 1, "zl") as o:
                        U.store(b, U.F32, zero, dst, b.add(drow, o))
                    with U.loop(b, lo, hi, 1, "cp") as o:
                        v = U.load(b, U.F32, x, b.add(srow, b.mul(o, U.i64(g.sw))))
                        U.store(b, U.F32, v, dst, b.add(drow, o))
                    with U.loop(b, hi, ow1, 1, "zr") as o:
                        U.store(b, U.F32, zero, dst, b.add(drow, o))

        # Large kernels (a 7x7 stem) loop over kh at run time: unrolling all kh*kw taps makes
        # the optimiser take tens of seconds on that one module.
        if g.kh * g.kw > 9:
            with U.loop(b, 0, U.i64(g.kh), 1, "kh") as kh_iv:
                taps(kh_iv, "r")
        else:
            for kh in range(g.kh):
                taps(U.i64(kh), str(kh))
        c0.add_incoming(b.add(c0, seg_len), b.block)
        b.branch(head)
        b.position_at_end(done)
    b.ret_void()
    return m


def _im2col_fn(g: ConvGeom, nr: int):
    jm = CACHE.get(("im2col", g, nr), lambda: _im2col_module(g, nr))
    return jm.cfunc("im2col_pack", None, G._P, G._P, G._L, G._L)


class Conv2d:
    """A float32 NCHW convolution with constant weights, prepared (packed, compiled) once.

    Parameters
    ----------
    weight : (Cout, Cin/groups, KH, KW) float32
    bias : optional (Cout,) float32
    stride, padding, dilation : int or (h, w); padding is symmetric
    groups : 1, Cin (depthwise, with Cout == Cin) or any divisor of Cin and Cout
    act : None, 'relu' or 'clip' (with ``clip=(lo, hi)``), fused after the bias
    """

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None,
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
                 dilation: int | tuple[int, int] = 1, groups: int = 1, act: str | None = None,
                 clip: tuple[float, float] | None = None,
                 cfg: G.GemmConfig | None = None) -> None:
        G.check_array(weight, "Conv2d: weight", 4)
        cout, cin_g, kh, kw = weight.shape
        if not isinstance(groups, int) or groups < 1 or cout % groups:
            raise ValueError(f"Conv2d: groups={groups!r} must be a positive divisor of "
                             f"Cout={cout}")
        if bias is not None:
            G.check_array(bias, "Conv2d: bias", 1)
            if bias.shape != (cout,):
                raise ValueError(f"Conv2d: bias has shape {bias.shape}, expected ({cout},)")
        self.stride = U.pair(stride, "Conv2d", "stride")
        self.padding = U.pair(padding, "Conv2d", "padding")
        self.dilation = U.pair(dilation, "Conv2d", "dilation")
        if min(self.stride) < 1 or min(self.dilation) < 1 or min(self.padding) < 0:
            raise ValueError(f"Conv2d: stride={self.stride} and dilation={self.dilation} must be "
                             f">= 1 and padding={self.padding} >= 0")
        self.act, self.lo, self.hi = G._check_act(act, clip)
        self.weight, self.groups = weight, groups
        self.cout, self.cin = cout, cin_g * groups
        self.kh, self.kw = kh, kw
        self.bias = (np.ascontiguousarray(bias) if bias is not None
                     else np.zeros(cout, np.float32))
        self.depthwise = groups > 1 and cin_g == 1 and cout == groups
        self.cfg = cfg
        self._packed: dict[G.GemmConfig, tuple[list[G.PackedA], np.ndarray]] = {}

    def geom(self, h: int, w: int) -> ConvGeom:
        cin_g = self.cin // self.groups
        return ConvGeom(cin_g, h, w, self.kh, self.kw, *self.stride, *self.padding,
                        *self.dilation)

    def output_shape(self, x_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
        n, _, h, w = x_shape
        g = self.geom(h, w)
        return n, self.cout, g.oh, g.ow

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None,
                 threads: int = 1) -> np.ndarray:
        G.check_array(x, "Conv2d: x", 4)
        n, c, h, w = x.shape
        if c != self.cin:
            raise ValueError(f"Conv2d: x has {c} channels (shape {x.shape}), expected "
                             f"{self.cin} (weight shape {self.weight.shape}, groups={self.groups})")
        g = self.geom(h, w)
        if g.oh < 1 or g.ow < 1:
            raise ValueError(f"Conv2d: input {h}x{w} is smaller than the dilated kernel "
                             f"{self.kh}x{self.kw} with padding {self.padding}")
        shape = (n, self.cout, g.oh, g.ow)
        if out is None:
            out = np.empty(shape, np.float32)
        else:
            G.check_array(out, "Conv2d: out", 4)
            if out.shape != shape:
                raise ValueError(f"Conv2d: out has shape {out.shape}, expected {shape}")
        if threads < 1:
            raise ValueError(f"Conv2d: threads={threads}, expected >= 1")
        if self.depthwise:
            self._depthwise(x, out, g, threads)
        else:
            self._gemm(x, out, g, threads)
        return out

    def _depthwise(self, x: np.ndarray, out: np.ndarray, g: ConvGeom, threads: int) -> None:
        geom = ConvGeom(1, *dataclass_fields(g)[1:])
        jm = CACHE.get(("dw", geom, self.act), lambda: depthwise_module(geom, str(self.act)))
        fn = jm.cfunc("depthwise", None, G._P, G._P, G._P, G._P, G._L, G._L, G._F, G._F)
        wp, bp = self.weight.ctypes.data, self.bias.ctypes.data
        tasks = []
        for i in range(x.shape[0]):
            xp, yp = x[i].ctypes.data, out[i].ctypes.data
            tasks += [lambda xp=xp, yp=yp, lo=lo, hi=hi: fn(xp, wp, bp, yp, lo, hi, self.lo,
                                                               self.hi)
                      for lo, hi in split_range(self.cout, threads)]
        run_parallel(tasks) if threads > 1 else [t() for t in tasks]

    def _prepared(self, cfg: G.GemmConfig) -> tuple[list[G.PackedA], np.ndarray]:
        """Weights packed as ``MR``-row panels per group, and the bias padded to whole panels."""
        got = self._packed.get(cfg)
        if got is None:
            cg = self.cout // self.groups
            packed = [G.pack_a(np.ascontiguousarray(
                self.weight[i * cg:(i + 1) * cg].reshape(cg, -1)), cfg)
                for i in range(self.groups)]
            bias = np.zeros((self.groups, packed[0].panels * cfg.mr), np.float32)
            bias[:, :cg] = self.bias.reshape(self.groups, cg)
            got = self._packed[cfg] = (packed, bias)
        return got

    def _gemm(self, x: np.ndarray, out: np.ndarray, g: ConvGeom, threads: int) -> None:
        npix = g.oh * g.ow
        cfg = self.cfg or G.choose_config(npix)
        packed, bias = self._prepared(cfg)
        panels = -(-npix // cfg.nr)
        im2col = _im2col_fn(g, cfg.nr)
        k = g.c * g.kh * g.kw
        macro = G.kernels(cfg, "row", self.act).cfunc("gemm_packed", None, *G.MACRO_ARGS)
        cg = self.cout // self.groups
        mpad, npad = packed[0].panels * cfg.mr, panels * cfg.nr
        # Partial tiles would go through the micro-kernel's slow edge path on every K block;
        # instead compute whole tiles into a padded buffer and copy the valid part out once.
        padded = (mpad, npad) != (cg, npix)
        ybuf = np.empty((mpad, npad), np.float32) if padded else None
        copy = _copy2d_fn() if padded else None
        col = np.empty((panels, k, cfg.nr), np.float32)  # reused by every image and group
        hw = g.h * g.w
        for i in range(x.shape[0]):
            for grp in range(self.groups):
                pa = packed[grp]
                xp = x.ctypes.data + 4 * (i * self.cin + grp * g.c) * hw
                yp = out.ctypes.data + 4 * (i * self.cout + grp * cg) * npix
                bp = bias[grp].ctypes.data

                def part(lo: int, hi: int, xp: int = xp, yp: int = yp, bp: int = bp,
                         pa: G.PackedA = pa) -> None:
                    im2col(xp, col.ctypes.data, lo, hi)
                    if ybuf is None:
                        macro(pa.data.ctypes.data, col.ctypes.data, yp, bp, cg, npix, k, npix,
                              0, pa.panels, lo, hi, self.lo, self.hi)
                    else:
                        macro(pa.data.ctypes.data, col.ctypes.data, ybuf.ctypes.data, bp, mpad,
                              npad, k, npad, 0, pa.panels, lo, hi, self.lo, self.hi)
                        c0, c1 = lo * cfg.nr, min(hi * cfg.nr, npix)
                        assert copy is not None
                        copy(ybuf.ctypes.data + 4 * c0, yp + 4 * c0, cg, c1 - c0, npad, npix)

                run_parallel([lambda lo=lo, hi=hi: part(lo, hi)
                              for lo, hi in split_range(panels, threads)])


def _copy2d_module() -> ir.Module:
    m = ir.Module(name="copy2d")
    _, b = U.new_function(m, "copy2d", [("src", U.PTR), ("dst", U.PTR), ("rows", U.I64),
                                         ("cols", U.I64), ("lds", U.I64), ("ldd", U.I64)])
    src, dst, rows, cols, lds, ldd = b.function.args
    with U.loop(b, 0, rows, 1, "r") as r:
        with U.loop(b, 0, cols, 1, "c") as c:
            v = U.load(b, U.F32, src, b.add(b.mul(r, lds), c))
            U.store(b, U.F32, v, dst, b.add(b.mul(r, ldd), c))
    b.ret_void()
    return m


def _copy2d_fn():
    return CACHE.get(("copy2d",), _copy2d_module).cfunc("copy2d", None, G._P, G._P, G._L, G._L,
                                                         G._L, G._L)


def dataclass_fields(g: ConvGeom) -> tuple[int, ...]:
    return (g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw)


def conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
           stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
           dilation: int | tuple[int, int] = 1, groups: int = 1, act: str | None = None,
           clip: tuple[float, float] | None = None, threads: int = 1) -> np.ndarray:
    """One-shot convolution (packs the weights on every call; prefer `Conv2d` for reuse)."""
    return Conv2d(weight, bias, stride, padding, dilation, groups, act, clip)(x, threads=threads)
