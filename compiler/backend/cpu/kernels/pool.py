"""Pooling as LLVM IR: the float32 NCHW 2-D kernels and the generic N-d pooling.

Float32 2-D (`pool2d`, `max_pool2d`, `avg_pool2d`, `global_avg_pool` from numpy; `_pool_module`
for the lowering): max pooling is the row-vectorised window kernel of ``conv.py`` (the depthwise
walk with ``max``, `max_pool_module`), average pooling a scalar loop per output. 8-bit 2-D max
pooling (int8 / uint8, the integer graph's) walks the same way with up to 64 byte lanes
(`max_pool_8bit_module`).

The generic pooling (`PoolSpec`, `pool`): a loop nest (a `loops.Kernel`) for every other
MaxPool / AveragePool of the lowering (N-d, dilated, ceil mode, any dtype), LpPool, and the
indices of MaxPool. The lowering's GlobalAveragePool / GlobalMaxPool are `loops.reduce`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import llvmlite.ir as ir
import numpy as np

from vtakit.runtime.cpu.llvm import CACHE
from vtakit.runtime.cpu.parallel import run_parallel, split_range

from ....ir.dtypes import DType
from . import gemm as G
from . import irutil as U
from . import scalar as S
from .conv import window_module
from .loops import Kernel, contiguous_strides, entry_alloca, kernel_function, lowest, nest, offset

PoolKind = Literal["max", "avg"]


@dataclass(frozen=True)
class PoolGeom:
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    count_include_pad: bool = False

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.ph - self.kh) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.pw - self.kw) // self.sw + 1


def max_pool_module(g: PoolGeom) -> ir.Module:
    """``pool(x, y, p0, p1)``: 2-D max pooling of planes [p0, p1) for geometry `g`;
    padding is ignored (read as -inf), as ONNX MaxPool specifies."""
    return window_module(g, "max", "none")


def _pool_module(kind: PoolKind, g: PoolGeom) -> ir.Module:
    """pool(x, y, p0, p1): planes [p0, p1) (a plane is one (n, c) image). Max pooling is the
    row-vectorised window kernel of ``conv.py``; average pooling a scalar loop per output."""
    if kind == "max":
        return max_pool_module(g)
    m = ir.Module(name=f"pool_{kind}_{g.h}x{g.w}_k{g.kh}x{g.kw}_s{g.sh}x{g.sw}_p{g.ph}x{g.pw}")
    _, b = U.new_function(m, "pool", [("x", U.PTR), ("y", U.PTR), ("p0", U.I64),
                                       ("p1", U.I64)])
    x, y, p0, p1 = b.function.args
    acc = b.alloca(U.F32)
    with U.loop(b, p0, p1, 1, "pl") as pl:
        xb = b.mul(pl, U.i64(g.h * g.w))
        yb = b.mul(pl, U.i64(g.oh * g.ow))
        with U.loop(b, 0, U.i64(g.oh), 1, "oh") as oh:
            h0 = b.sub(b.mul(oh, U.i64(g.sh)), U.i64(g.ph))
            hs, he = U.imax(b, h0, U.i64(0)), U.imin(b, b.add(h0, U.i64(g.kh)), U.i64(g.h))
            with U.loop(b, 0, U.i64(g.ow), 1, "ow") as ow:
                w0 = b.sub(b.mul(ow, U.i64(g.sw)), U.i64(g.pw))
                ws, we = U.imax(b, w0, U.i64(0)), U.imin(b, b.add(w0, U.i64(g.kw)), U.i64(g.w))
                b.store(U.f32(float("-inf") if kind == "max" else 0.0), acc)
                with U.loop(b, hs, he, 1, "ih") as ih:
                    with U.loop(b, ws, we, 1, "iw") as iw:
                        v = U.load(b, U.F32, x, b.add(xb, b.add(b.mul(ih, U.i64(g.w)), iw)))
                        cur = b.load(acc)
                        b.store(U.fmax(b, cur, v) if kind == "max" else b.fadd(cur, v), acc)
                r = b.load(acc)
                if kind == "avg":
                    if g.count_include_pad:
                        # the window clipped to the padded image, as ONNX / PyTorch count it
                        hp = b.sub(U.imin(b, b.add(h0, U.i64(g.kh)), U.i64(g.h + g.ph)), h0)
                        wp = b.sub(U.imin(b, b.add(w0, U.i64(g.kw)), U.i64(g.w + g.pw)), w0)
                        cnt = b.mul(hp, wp)
                    else:
                        cnt = b.mul(b.sub(he, hs), b.sub(we, ws))
                    r = b.fdiv(r, b.sitofp(cnt, U.F32))
                U.store(b, U.F32, r, y, b.add(yb, b.add(b.mul(oh, U.i64(g.ow)), ow)))
    b.ret_void()
    return m


def _gap_module() -> ir.Module:
    """gap(x, y, p0, p1, hw): y[p] = mean(x[p, :hw])."""
    m = ir.Module(name="global_avg_pool")
    _, b = U.new_function(m, "gap", [("x", U.PTR), ("y", U.PTR), ("p0", U.I64), ("p1", U.I64),
                                      ("hw", U.I64)])
    x, y, p0, p1, hw = b.function.args
    acc = b.alloca(U.F32)
    with U.loop(b, p0, p1, 1, "p") as p:
        b.store(U.f32(0.0), acc)
        base = b.mul(p, hw)
        with U.loop(b, 0, hw, 1, "i") as i:
            b.store(b.fadd(b.load(acc), U.load(b, U.F32, x, b.add(base, i)),
                           flags=("reassoc", "nsz")), acc)
        U.store(b, U.F32, b.fdiv(b.load(acc), b.sitofp(hw, U.F32)), y, p)
    b.ret_void()
    return m


def pool2d(kind: PoolKind, x: np.ndarray, kernel: int | tuple[int, int],
           stride: int | tuple[int, int] | None = None, padding: int | tuple[int, int] = 0,
           count_include_pad: bool = False, threads: int = 1) -> np.ndarray:
    """Max or average pooling of an NCHW float32 array (padding is symmetric and never wins a
    max; average divides by the in-image count unless `count_include_pad`)."""
    if kind not in ("max", "avg"):
        raise ValueError(f"pool2d: kind={kind!r} not supported (expected 'max' or 'avg')")
    G.check_array(x, f"{kind}_pool2d: x", 4)
    kh, kw = U.pair(kernel, "pool2d", "kernel")
    sh, sw = U.pair(stride if stride is not None else kernel, "pool2d", "stride")
    ph, pw = U.pair(padding, "pool2d", "padding")
    if min(kh, kw, sh, sw) < 1 or min(ph, pw) < 0 or ph >= kh or pw >= kw:
        raise ValueError(f"{kind}_pool2d: kernel={(kh, kw)}, stride={(sh, sw)} must be >= 1 and "
                         f"0 <= padding={(ph, pw)} < kernel")
    n, c, h, w = x.shape
    g = PoolGeom(h, w, kh, kw, sh, sw, ph, pw, count_include_pad)
    if g.oh < 1 or g.ow < 1:
        raise ValueError(f"{kind}_pool2d: input {h}x{w} smaller than kernel {kh}x{kw}")
    y = np.empty((n, c, g.oh, g.ow), np.float32)
    fn = CACHE.get(("pool", kind, g), lambda: _pool_module(kind, g)).cfunc(
        "pool", None, G._P, G._P, G._L, G._L)
    run_parallel([lambda s=s, e=e: fn(x.ctypes.data, y.ctypes.data, s, e)
                  for s, e in split_range(n * c, threads)])
    return y


def max_pool2d(x: np.ndarray, kernel: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None, padding: int | tuple[int, int] = 0,
               threads: int = 1) -> np.ndarray:
    return pool2d("max", x, kernel, stride, padding, threads=threads)


def avg_pool2d(x: np.ndarray, kernel: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None, padding: int | tuple[int, int] = 0,
               count_include_pad: bool = False, threads: int = 1) -> np.ndarray:
    return pool2d("avg", x, kernel, stride, padding, count_include_pad, threads)


def global_avg_pool(x: np.ndarray, threads: int = 1) -> np.ndarray:
    """Mean over H and W of an NCHW float32 array; output (N, C, 1, 1)."""
    G.check_array(x, "global_avg_pool: x", 4)
    n, c, h, w = x.shape
    if h * w == 0:
        raise ValueError(f"global_avg_pool: x has an empty spatial extent, shape {x.shape}")
    y = np.empty((n, c, 1, 1), np.float32)
    fn = CACHE.get(("gap",), _gap_module).cfunc("gap", None, G._P, G._P, G._L, G._L, G._L)
    run_parallel([lambda s=s, e=e: fn(x.ctypes.data, y.ctypes.data, s, e, h * w)
                  for s, e in split_range(n * c, threads)])
    return y


def max_pool_8bit_module(g: PoolGeom, unsigned: bool) -> ir.Module:
    """``pool(x, y, p0, p1)``: 2-D max pooling of int8 (uint8 with `unsigned`) planes
    [p0, p1) for geometry `g`; padding is ignored, as ONNX MaxPool specifies (read as the
    type's least value, which no max can return unless the whole window is padding: the
    lowering takes only ``2 * pad < kernel``).

    The walk of `conv.window_module`: an output row in chunks of ``V`` columns (``V`` = 16,
    32 or 64 byte lanes, the least that holds a row, at most 64), per tap one masked load of
    ``V * sw`` bytes of the input row (masked-off lanes, and rows outside the image, hold the
    least value), every ``sw``-th byte kept by a shuffle, ``smax`` / ``umax``; one masked store
    per chunk."""
    h, w, kh, kw, sh, sw, ph, pw = g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw
    oh, ow = g.oh, g.ow
    vw = 16 if ow <= 16 else 32 if ow <= 32 else 64
    n = vw * sw
    chunks = -(-ow // vw)
    m = ir.Module(name=f"max_pool_{'u8' if unsigned else 's8'}_{h}x{w}_k{kh}x{kw}_s{sh}x{sw}"
                       f"_p{ph}x{pw}")
    fn, b = U.new_function(m, "pool", [("x", U.PTR), ("y", U.PTR), ("p0", U.I64),
                                        ("p1", U.I64)])
    x, y, p0, p1 = fn.args
    least = ir.Constant(U.I8, 0 if unsigned else -128)
    vt = U.vec(U.I8, vw)
    fill = ir.Constant(U.vec(U.I8, n), [least.constant] * n)
    keep = ir.Constant(U.vec(U.I32, vw), [sw * lane for lane in range(vw)])
    lane_col = ir.Constant(U.vec(U.I64, n), list(range(n)))
    lane_out = ir.Constant(U.vec(U.I64, n), [lane // sw for lane in range(n)])
    out_lane = ir.Constant(U.vec(U.I64, vw), list(range(vw)))
    mx = U.intrinsic(m, f"llvm.{'umax' if unsigned else 'smax'}.v{vw}i8", vt, [vt, vt])

    with U.loop(b, p0, p1, 1, "pl") as pl:
        xc = b.mul(pl, U.i64(h * w))
        yc = b.mul(pl, U.i64(oh * ow))
        with U.loop(b, 0, U.i64(oh), 1, "oh") as o_h:
            rows, row_ok = [], []
            for i in range(kh):
                ih = b.add(b.mul(o_h, U.i64(sh)), U.i64(i - ph))
                row_ok.append(U.splat(b, b.icmp_unsigned("<", ih, U.i64(h)), n))
                ihc = U.imin(b, U.imax(b, ih, U.i64(0)), U.i64(h - 1))
                rows.append(b.add(xc, b.mul(ihc, U.i64(w))))
            yrow = b.add(yc, b.mul(o_h, U.i64(ow)))

            def chunk(q0: ir.Value) -> None:
                """Output columns [q0, q0 + vw) of this row (q0 a multiple of vw)."""
                acc = ir.Constant(vt, [least.constant] * vw)
                out_ok = b.icmp_signed("<", b.add(U.splat(b, q0, n), lane_out),
                                       ir.Constant(U.vec(U.I64, n), [ow] * n))
                for j in range(kw):
                    col0 = b.add(b.mul(q0, U.i64(sw)), U.i64(j - pw))
                    col = b.add(U.splat(b, col0, n), lane_col)
                    mask = b.and_(out_ok, b.and_(
                        b.icmp_signed(">=", col, ir.Constant(U.vec(U.I64, n), [0] * n)),
                        b.icmp_signed("<", col, ir.Constant(U.vec(U.I64, n), [w] * n))))
                    for i in range(kh):
                        v = G._masked_load_i8(b, U.gep(b, U.I8, x, b.add(rows[i], col0)),
                                              b.and_(mask, row_ok[i]), fill)
                        if sw > 1:
                            v = b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), keep)
                        acc = b.call(mx, [acc, v])
                store_ok = b.icmp_signed("<", b.add(U.splat(b, q0, vw), out_lane),
                                         ir.Constant(U.vec(U.I64, vw), [ow] * vw))
                G._masked_store(b, acc, U.gep(b, U.I8, y, b.add(yrow, q0)), store_ok)

            for q in range(chunks):
                chunk(U.i64(q * vw))
    b.ret_void()
    return m


# -- generic: every dtype, for the lowering -------------------------------------------------------

@dataclass(frozen=True)
class PoolSpec:
    kind: str  # "max", "avg" or "index" (where the max is: a flat input index, int64)
    dt: DType
    x_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    count_include_pad: bool
    column_major: bool = False  # "index": spatial axes counted innermost-first
    p: int = 2  # "lp": (sum of |x|^p over the window)^(1/p), padding counts as 0


def pool(spec: PoolSpec) -> Kernel:
    """N-d max / average pooling over (n, c) planes; cells past the end padding (ceil mode)
    never count, padding cells count for average pooling only with count_include_pad."""
    key = ("pool", spec)
    s = spec
    nsp = len(s.kernel)
    ins, outs = s.x_shape[2:], s.out_shape[2:]
    planes = s.x_shape[0] * s.x_shape[1]

    def build() -> ir.Module:
        m, b, (out, x, lo, hi) = kernel_function(key, 2)
        dt = s.dt
        ct = S.compute(dt) if dt.is_float else S.compute(dt)
        acc = entry_alloca(b, ct)
        cnt = entry_alloca(b, U.I64)
        best = entry_alloca(b, U.I64)
        lst = contiguous_strides(ins[::-1])[::-1] if s.column_major else contiguous_strides(ins)
        with U.loop(b, lo, hi, 1, "plane") as plane:
            xbase = b.mul(plane, U.i64(math.prod(ins)))
            with nest(b, outs, name="o") as ovs:
                init = lowest(dt) if s.kind in ("max", "index") else 0
                b.store(U.i64(-1), best)
                b.store(S.const(dt, init) if dt.is_float else S.int_const(dt, init), acc)
                b.store(U.i64(0), cnt)
                with nest(b, s.kernel, name="k") as kvs:
                    ok: ir.Value = ir.Constant(U.I1, 1)
                    inpad: ir.Value = ir.Constant(U.I1, 1)
                    xi: ir.Value = xbase
                    li: ir.Value = b.mul(plane, U.i64(math.prod(ins)))
                    xst = contiguous_strides(ins)
                    for d in range(nsp):
                        p = b.add(b.mul(ovs[d], U.i64(s.strides[d])), U.i64(-s.pads[d]))
                        p = b.add(p, b.mul(kvs[d], U.i64(s.dilations[d])))
                        li = b.add(li, b.mul(p, U.i64(lst[d])))
                        ok = b.and_(ok, b.icmp_unsigned("<", p, U.i64(ins[d])))
                        inpad = b.and_(inpad, b.icmp_signed(
                            "<", b.add(p, U.i64(s.pads[d])),
                            U.i64(ins[d] + s.pads[d] + s.pads[nsp + d])))
                        xi = b.add(xi, b.mul(p, U.i64(xst[d])))
                    counted = inpad if s.count_include_pad else ok
                    b.store(b.add(b.load(cnt), b.zext(counted, U.I64)), cnt)
                    with b.if_then(ok):
                        v = S.load(b, dt, x, xi)
                        cur = b.load(acc)
                        if s.kind == "index":
                            # onnxruntime: the first cell in the image starts, a later one
                            # replaces it only if greater (so NaN wins only when first, and a
                            # window of -inf or NaN gives its first cell, never -1)
                            better = (b.fcmp_ordered(">", v, cur) if dt.is_float else
                                      (b.icmp_signed if dt.is_signed else b.icmp_unsigned)(
                                          ">", v, cur))
                            better = b.or_(better, b.icmp_signed("<", b.load(best), U.i64(0)))
                            b.store(b.select(better, v, cur), acc)
                            b.store(b.select(better, li, b.load(best)), best)
                        elif s.kind == "max":
                            b.store(S.emit(b, "max", [cur, v], [dt, dt], dt), acc)
                        elif s.kind == "lp":
                            av = S.intrinsic(b, "fabs", v)
                            b.store(b.fadd(cur, S.intrinsic(b, "pow", av, ir.Constant(
                                av.type, float(s.p)))), acc)
                        else:
                            b.store(b.fadd(cur, v), acc)
                r = b.load(acc)
                if s.kind == "avg":
                    r = b.fdiv(r, b.sitofp(b.load(cnt), ct))
                elif s.kind == "lp":
                    r = S.intrinsic(b, "pow", r, ir.Constant(r.type, 1.0 / s.p))
                odt = dt
                if s.kind == "index":
                    r, odt = b.load(best), DType.INT64
                S.store(b, odt, r, out, b.add(b.mul(plane, U.i64(math.prod(outs))),
                                             offset(b, ovs, contiguous_strides(outs))))
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, planes)
