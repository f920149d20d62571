"""GridSample as one loop nest: each output point reads its grid coordinates, turns them into
a few taps per spatial axis (input index, weight, inside-the-image flag), and sums the weighted
input values of every combination of taps for each channel.

The arithmetic follows the reference interpreter (``_grid_sample`` in compiler/ir/interpreter.py)
operation by operation in float64, so results agree with it to the last bit: the same
unnormalisation, padding (border clamp, reflection, zeros), taps (nearest rounds half to even,
linear, cubic with A = -0.75) and summation order (taps of the last axis fastest).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import llvmlite.ir as ir

from ....ir.dtypes import DType
from . import irutil as U
from . import scalar as S
from .loops import Kernel, contiguous_strides, kernel_function

F64 = DType.FLOAT64
CUBIC_A = -0.75  # ONNX GridSample's bicubic coefficient
# Tap offsets from the coordinate (rounded for nearest, floored otherwise), per mode.
TAPS = {"nearest": (0,), "linear": (0, 1), "cubic": (-1, 0, 1, 2)}


def _f(v: float) -> ir.Constant:
    return ir.Constant(S.F64, float(v))


def _to_index(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """numpy ``astype(int64)`` (truncation) of a float64, saturating so that NaN and huge
    values give a defined index (which the caller then clamps into the image)."""
    fn = U.intrinsic(b.module, "llvm.fptosi.sat.i64.f64", U.I64, [S.F64])
    return b.call(fn, [v])


def _outside(b: ir.IRBuilder, c: ir.Value, lo: float, hi: float) -> ir.Value:
    return b.or_(b.fcmp_ordered("<", c, _f(lo)), b.fcmp_ordered(">", c, _f(hi)))


def _reflect(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    """Fold x into [lo, hi] by reflecting at the borders (np.mod's sign rule: the remainder
    takes the sign of the positive period)."""
    span = hi - lo
    if span <= 0:
        return _f(lo)
    t = b.frem(b.fsub(x, _f(lo)), _f(2 * span))
    t = b.select(b.fcmp_ordered("<", t, _f(0.0)), b.fadd(t, _f(2 * span)), t)
    t = b.select(b.fcmp_ordered(">", t, _f(span)), b.fsub(_f(2 * span), t), t)
    return b.fadd(_f(lo), t)


def _cubic_weight(b: ir.IRBuilder, d: ir.Value) -> ir.Value:
    """Keys' kernel at distance d >= 0 (as the interpreter's Resize taps evaluate it)."""
    a = CUBIC_A
    near = b.fadd(b.fmul(b.fmul(b.fsub(b.fmul(_f(a + 2), d), _f(a + 3)), d), d), _f(1.0))
    far = b.fmul(b.fadd(b.fmul(b.fsub(b.fmul(_f(a), d), _f(5 * a)), d), _f(8 * a)), d)
    far = b.fsub(far, _f(4 * a))
    return b.select(b.fcmp_ordered("<=", d, _f(1.0)), near, far)


def grid_sample(dt: DType, grid_dt: DType, x_shape: Sequence[int], npoints: int, mode: str,
                padding_mode: str, align_corners: bool) -> Kernel:
    """out[n, c, p] = sum over tap combinations of x[n, c, taps] * weights, for x of shape
    (N, C, *dims) and a grid of (N, P, len(dims)) coordinates in [-1, 1], innermost axis first;
    split over the N * P output points (each point computes all channels)."""
    x_shape = tuple(x_shape)
    key = ("grid_sample", dt, grid_dt, x_shape, npoints, mode, padding_mode, align_corners)
    nb, nc, dims = x_shape[0], x_shape[1], x_shape[2:]
    nsp = len(dims)
    image = math.prod(dims)
    dst = contiguous_strides(dims)
    offsets = TAPS[mode]
    ntaps = len(offsets)
    lo = [0.0 if align_corners else -0.5 for _ in dims]
    hi = [d - 1.0 if align_corners else d - 0.5 for d in dims]

    def axis_taps(b: ir.IRBuilder, g: ir.Value, i: int
                  ) -> list[tuple[ir.Value, ir.Value, ir.Value | None]]:
        """(index clamped into the image, weight, inside flag or None) for each tap of axis i
        at the normalised coordinate g."""
        d = dims[i]
        if align_corners:
            c = b.fmul(b.fdiv(b.fadd(g, _f(1.0)), _f(2.0)), _f(d - 1))
        else:
            c = b.fdiv(b.fsub(b.fmul(b.fadd(g, _f(1.0)), _f(d)), _f(1.0)), _f(2.0))
        if mode == "nearest":
            c = S.intrinsic(b, "roundeven", c)
        if padding_mode == "border":
            clipped = S.fmin_nan(b, S.fmax_nan(b, c, _f(0.0)), _f(d - 1))
            c = b.select(_outside(b, c, lo[i], hi[i]), clipped, c)
        elif padding_mode == "reflection":
            c = b.select(_outside(b, c, lo[i], hi[i]), _reflect(b, c, lo[i], hi[i]), c)
        if mode == "nearest":
            base, weights = _to_index(b, c), [_f(1.0)]
        else:
            c0 = S.intrinsic(b, "floor", c)
            r = b.fsub(c, c0)
            base = _to_index(b, c0)
            if mode == "linear":
                weights = [b.fsub(_f(1.0), r), r]
            else:
                dist = [b.fadd(r, _f(1.0)), r, b.fsub(_f(1.0), r), b.fsub(_f(2.0), r)]
                weights = [_cubic_weight(b, t) for t in dist]
        taps = []
        for off, w in zip(offsets, weights, strict=True):
            idx = b.add(base, U.i64(off)) if off else base
            inside = None
            if padding_mode == "zeros":
                inside = b.and_(b.icmp_signed(">=", idx, U.i64(0)),
                                b.icmp_signed("<", idx, U.i64(d)))
            elif padding_mode == "reflection":
                idx = _to_index(b, _reflect(b, b.sitofp(idx, S.F64), lo[i], hi[i]))
            idx = U.imin(b, U.imax(b, idx, U.i64(0)), U.i64(d - 1))
            taps.append((idx, w, inside))
        return taps

    def build() -> ir.Module:
        m, b, (out, x, grid, lo_, hi_) = kernel_function(key, 3)
        acc = b.alloca(S.F64)
        with U.loop(b, lo_, hi_, 1, "pt") as pt:
            n = b.udiv(pt, U.i64(npoints))
            p = b.urem(pt, U.i64(npoints))
            per_axis = []
            for i in range(nsp):
                gi = b.add(b.mul(pt, U.i64(nsp)), U.i64(nsp - 1 - i))
                g = S.convert(b, S.load(b, grid_dt, grid, gi), grid_dt, F64)
                per_axis.append(axis_taps(b, g, i))
            # Each combination: spatial offset, weight (axis 0 first), inside flag.
            combos = []
            for combo in itertools.product(range(ntaps), repeat=nsp):
                off: ir.Value = U.i64(0)
                w: ir.Value | None = None
                inside: ir.Value | None = None
                for i, k in enumerate(combo):
                    idx, wk, ok = per_axis[i][k]
                    off = b.add(off, b.mul(idx, U.i64(dst[i])))
                    w = wk if w is None else b.fmul(w, wk)
                    if ok is not None:
                        inside = ok if inside is None else b.and_(inside, ok)
                assert w is not None
                combos.append((off, w, inside))
            row = b.mul(n, U.i64(nc))
            with U.loop(b, 0, U.i64(nc), 1, "c") as c:
                base = b.mul(b.add(row, c), U.i64(image))
                b.store(_f(0.0), acc)
                for off, w, inside in combos:
                    v = S.convert(b, S.load(b, dt, x, b.add(base, off)), dt, F64)
                    if inside is not None:
                        v = b.select(inside, v, _f(0.0))
                    b.store(b.fadd(b.load(acc), b.fmul(v, w)), acc)
                oi = b.add(b.mul(b.add(row, c), U.i64(npoints)), p)
                S.store(b, dt, S.convert(b, b.load(acc), F64, dt), out, oi)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "pppll", build, nb * npoints)
