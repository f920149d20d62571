"""The generic loop-nest code generator: its machinery, and the kernels of the ops that have no
fast kernel family of their own.

Machinery (used by every generic kernel, here and in the op-family modules): `Kernel`,
`kernel_function`, `nest`, `offset`, `entry_alloca`, strides (`contiguous_strides`,
`broadcast_strides`, `collapse`), `lowest`. Kernels: data movement (`copy`: transpose, slice,
expand, tile, pad, concat; gathers), reductions (`reduce`, arg-max/min), `layer_norm`, `lrn`,
scans, `trilu`, `hardmax`, `topk`, resampling taps (Resize), scatters, `reverse_sequence`,
`col2im`, `einsum`. The generic elementwise programs and softmax are in ``elementwise.py``, the
naive matmul in ``gemm.py``, the N-d / integer convolution in ``conv.py``, the N-d pooling in
``pool.py``.

Every generator returns a `Kernel`: a cache key, the entry function's name and ctypes signature,
and a builder of the `llvmlite.ir.Module`. Shapes, strides and attributes are compile-time
constants of the module (so LLVM sees counted loops with constant strides and vectorises the
contiguous inner loop), and the key holds all of them, so a kernel is compiled once per process
for each distinct (op, dtypes, shapes, attributes) however many graphs use it.

The entry function is always ``kernel(p0, ..., pn, lo, hi)``: buffer pointers, then the range
``[lo, hi)`` of the outermost loop that this call computes, so that threads split the work.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from ....ir.dtypes import DType
from . import irutil as U
from . import scalar as S

FAST = ("reassoc", "nsz", "contract")


@dataclass(frozen=True)
class Kernel:
    """One compiled function: `key` identifies its module, `sig` its ctypes arguments
    (``p`` pointer, ``l`` int64, ``f`` float32), `extent` the size of the split loop."""

    key: tuple
    fname: str
    sig: str
    build: Callable[[], ir.Module]
    extent: int


def kernel_function(key: tuple, nptr: int) -> tuple[ir.Module, ir.IRBuilder, list[ir.Value]]:
    m = ir.Module(name=f"{key[0]}_{abs(hash(key)):x}")
    args = [(f"p{i}", U.PTR) for i in range(nptr)] + [("lo", U.I64), ("hi", U.I64)]
    fn, b = U.new_function(m, "kernel", args, noalias=False)
    return m, b, list(fn.args)


def entry_alloca(b: ir.IRBuilder, t: ir.Type) -> ir.Value:
    with b.goto_entry_block():
        return b.alloca(t)


@contextlib.contextmanager
def nest(b: ir.IRBuilder, dims: Sequence[int], lo: ir.Value | None = None,
         hi: ir.Value | None = None, name: str = "d") -> Iterator[list[ir.Value]]:
    """Nested counted loops over dims; the first loop runs over [lo, hi) when given."""
    with contextlib.ExitStack() as stack:
        ivs = []
        for k, n in enumerate(dims):
            start = lo if (k == 0 and lo is not None) else U.i64(0)
            stop = hi if (k == 0 and hi is not None) else U.i64(n)
            ivs.append(stack.enter_context(U.loop(b, start, stop, 1, f"{name}{k}")))
        yield ivs


def offset(b: ir.IRBuilder, ivs: Sequence[ir.Value], strides: Sequence[int],
           base: int = 0) -> ir.Value:
    acc: ir.Value = U.i64(base)
    for iv, s in zip(ivs, strides, strict=True):
        if s == 1:
            acc = b.add(acc, iv)
        elif s:
            acc = b.add(acc, b.mul(iv, U.i64(s)))
    return acc


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Strides (in elements) of a contiguous operand of `shape` read at each index of
    `out_shape` under numpy broadcasting (0 along broadcast axes)."""
    pad = len(out_shape) - len(shape)
    full = (1,) * pad + tuple(shape)
    st = contiguous_strides(full)
    return tuple(0 if full[i] == 1 else st[i] for i in range(len(out_shape)))


def collapse(shape: Sequence[int], strides: Sequence[Sequence[int]]
             ) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Drop unit axes and merge neighbouring axes along which every operand is contiguous."""
    dims = [i for i, n in enumerate(shape) if n != 1]
    ns = [shape[i] for i in dims]
    ss = [[s[i] for i in dims] for s in strides]
    k = len(ns) - 1
    while k > 0:
        if all(s[k - 1] == s[k] * ns[k] for s in ss):
            ns[k - 1] *= ns[k]
            for s in ss:
                s[k - 1] = s[k]
            del ns[k]
            for s in ss:
                del s[k]
        k -= 1
    if not ns:
        return (1,), tuple((0,) for _ in ss)
    return tuple(ns), tuple(tuple(s) for s in ss)


# -- data movement -------------------------------------------------------------------------------

# How output index o along one axis picks an input index i (then multiplied by in_stride):
#   ("affine", start, step, n): i = start + step * o
#   ("const", start, 1, n):     i = o - start, the pad value where i is outside [0, n)
#   ("edge", start, 1, n):      clamp(o - start, 0, n - 1)
#   ("reflect", start, 1, n):   reflect o - start at the borders
#   ("wrap", start, 1, n):      (o - start) mod n
AxisMap = tuple[str, int, int, int, int]  # (kind, start, step, n, in_stride)


def copy(dt: DType, region: Sequence[int], maps: Sequence[AxisMap], out_strides: Sequence[int],
         out_offset: int = 0, in_offset: int = 0, pad_value: float = 0.0) -> Kernel:
    """out[out_offset + sum o*out_stride] = in[in_offset + sum map(o)*in_stride] over the
    output region; transpose, slice, expand, tile, pad and concat are all such copies."""
    region = tuple(region) or (1,)
    maps = tuple(maps) or (("affine", 0, 1, 1, 0),)
    out_strides = tuple(out_strides) or (0,)
    key = ("copy", dt, region, maps, out_strides, out_offset, in_offset, float(pad_value))

    def build() -> ir.Module:
        m, b, (out, inp, lo, hi) = kernel_function(key, 2)
        with nest(b, region, lo, hi) as ivs:
            src: ir.Value = U.i64(in_offset)
            valid: ir.Value | None = None
            for iv, (kind, start, step, n, stride) in zip(ivs, maps, strict=True):
                if kind == "affine":
                    i = b.add(U.i64(start), b.mul(iv, U.i64(step))) if (start or step != 1) \
                        else iv
                else:
                    i = b.sub(iv, U.i64(start)) if start else iv
                    if kind == "const":
                        ok = b.icmp_unsigned("<", i, U.i64(n))
                        valid = ok if valid is None else b.and_(valid, ok)
                        i = b.select(ok, i, U.i64(0))
                    elif kind == "edge":
                        i = U.imin(b, U.imax(b, i, U.i64(0)), U.i64(n - 1))
                    elif kind == "wrap":
                        r = b.srem(i, U.i64(n))
                        i = b.select(b.icmp_signed("<", r, U.i64(0)), b.add(r, U.i64(n)), r)
                    elif kind == "reflect":
                        if n == 1:
                            i = U.i64(0)
                        else:  # period 2(n-1): fold into [0, 2n-2), then mirror
                            p = 2 * (n - 1)
                            r = b.srem(i, U.i64(p))
                            r = b.select(b.icmp_signed("<", r, U.i64(0)), b.add(r, U.i64(p)), r)
                            i = b.select(b.icmp_signed(">=", r, U.i64(n)),
                                         b.sub(U.i64(p), r), r)
                if stride:
                    src = b.add(src, b.mul(i, U.i64(stride)))
            v = S.load(b, dt, inp, src)
            if valid is not None:
                v = b.select(valid, v, S.const(dt, pad_value) if dt.is_float or dt is DType.BOOL
                             else S.int_const(dt, pad_value))
            S.store(b, dt, v, out, offset(b, ivs, out_strides, out_offset))
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, region[0])


def gather_elements(dt: DType, idx_dt: DType, x_shape: Sequence[int],
                    idx_shape: Sequence[int], axis: int) -> Kernel:
    """out[i...] = x[i... with i[axis] replaced by idx[i...]] (negative counts from the end)."""
    x_shape, idx_shape = tuple(x_shape), tuple(idx_shape)
    key = ("gather_elements", dt, idx_dt, x_shape, idx_shape, axis)
    xst = contiguous_strides(x_shape)
    ist = contiguous_strides(idx_shape)

    def build() -> ir.Module:
        m, b, (out, x, idx, lo, hi) = kernel_function(key, 3)
        with nest(b, idx_shape, lo, hi) as ivs:
            flat = offset(b, ivs, ist)
            k = S.convert(b, S.load(b, idx_dt, idx, flat), idx_dt, DType.INT64)
            k = b.select(b.icmp_signed("<", k, U.i64(0)), b.add(k, U.i64(x_shape[axis])), k)
            src = offset(b, [k if d == axis else iv for d, iv in enumerate(ivs)], xst)
            S.store(b, dt, S.load(b, dt, x, src), out, flat)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "pppll", build, idx_shape[0] if idx_shape else 1)


def gather(dt: DType, idx_dt: DType, outer: int, axis_len: int, nidx: int, inner: int) -> Kernel:
    """out[o, j, i] = x[o, idx[j] (negative counts from the end), i]."""
    key = ("gather", dt, idx_dt, outer, axis_len, nidx, inner)

    def build() -> ir.Module:
        m, b, (out, x, idx, lo, hi) = kernel_function(key, 3)
        with nest(b, (outer, nidx), lo, hi) as (o, j):
            k = S.convert(b, S.load(b, idx_dt, idx, j), idx_dt, DType.INT64)
            k = b.select(b.icmp_signed("<", k, U.i64(0)), b.add(k, U.i64(axis_len)), k)
            src = b.mul(b.add(b.mul(o, U.i64(axis_len)), k), U.i64(inner))
            dst = b.mul(b.add(b.mul(o, U.i64(nidx)), j), U.i64(inner))
            with U.loop(b, 0, U.i64(inner), 1, "in") as i:
                S.store(b, dt, S.load(b, dt, x, b.add(src, i)), out, b.add(dst, i))
        b.ret_void()
        return m

    return Kernel(key, "kernel", "pppll", build, outer)


# -- reductions ----------------------------------------------------------------------------------

def _acc_dtype(dt: DType) -> DType:
    if dt in (DType.FLOAT16, DType.FLOAT32):
        return DType.FLOAT32
    if dt is DType.FLOAT64:
        return DType.FLOAT64
    if dt is DType.BOOL:
        return DType.INT64
    return DType.INT64 if dt.is_signed else DType.UINT64


def lowest(dt: DType) -> float:
    if dt.is_float:
        return -math.inf
    return 0 if dt is DType.BOOL else int(np.iinfo(dt.np).min)


def highest(dt: DType) -> float:
    if dt.is_float:
        return math.inf
    return 1 if dt is DType.BOOL else int(np.iinfo(dt.np).max)


def reduce(kind: str, dt: DType, out_dt: DType, shape: Sequence[int],
           axes: Sequence[int]) -> Kernel:
    """Reduce `shape` over `axes` (output laid out as the kept axes, keepdims or not).

    kind: sum, mean, max, min, prod, l1, l2, sum_square, log_sum, log_sum_exp, argmax,
    argmin, argmax_last, argmin_last (argmax/argmin reduce one axis)."""
    shape = tuple(shape)
    axes = tuple(axes)
    st = contiguous_strides(shape)
    kept = [i for i in range(len(shape)) if i not in axes]
    kshape = tuple(shape[i] for i in kept) or (1,)
    kstr = tuple(st[i] for i in kept) or (0,)
    rshape = tuple(shape[i] for i in axes)
    rstr = tuple(st[i] for i in axes)
    count = math.prod(rshape)
    key = ("reduce", kind, dt, out_dt, shape, axes)
    arg = kind.startswith("arg")
    if kind in ("max", "min") or arg:
        acc_dt = dt
    elif dt.is_float:
        acc_dt = _acc_dtype(dt)
    elif kind in ("mean", "l2", "log_sum", "log_sum_exp"):
        acc_dt = DType.FLOAT64
    else:
        acc_dt = _acc_dtype(dt)

    def build() -> ir.Module:
        m, b, (out, x, lo, hi) = kernel_function(key, 2)
        ct = S.compute(acc_dt)
        acc = entry_alloca(b, ct)
        best = entry_alloca(b, U.I64) if arg else None
        shift = entry_alloca(b, S.compute(dt)) if kind == "log_sum_exp" else None
        with U.loop(b, lo, hi, 1, "o") as o:
            # o is the flat index of the kept axes: unflatten it into a base offset
            base: ir.Value = U.i64(0)
            rem = o
            for n, s in zip(reversed(kshape), reversed(kstr), strict=True):
                base = b.add(base, b.mul(b.urem(rem, U.i64(n)), U.i64(s)))
                rem = b.udiv(rem, U.i64(n))
            if kind == "log_sum_exp":
                b.store(S.const(dt, -math.inf), shift)
                with nest(b, rshape, name="m") as ivs:
                    v = S.load(b, dt, x, b.add(base, offset(b, ivs, rstr)))
                    b.store(S.fmax_nan(b, b.load(shift), v), shift)
                sh = b.load(shift)
                finite = b.fcmp_ordered("<", S.intrinsic(b, "fabs", sh), ir.Constant(sh.type,
                                                                                        math.inf))
                b.store(b.select(finite, sh, ir.Constant(sh.type, 0.0)), shift)
            init = {"max": lowest(dt), "min": highest(dt), "prod": 1,
                    "argmax": lowest(dt), "argmin": highest(dt),
                    "argmax_last": lowest(dt), "argmin_last": highest(dt)}.get(kind, 0)
            if arg and dt.is_float:
                # the first element starts the search (NaN compares false)
                init_v = S.load(b, dt, x, base)
                b.store(init_v, acc)
            else:
                b.store(S.const(acc_dt, init), acc)
            if arg:
                b.store(U.i64(0), best)
            with nest(b, rshape, name="r") as ivs:
                v = S.load(b, dt, x, b.add(base, offset(b, ivs, rstr)))
                cur = b.load(acc)
                if arg:
                    flat = offset(b, ivs, contiguous_strides(rshape))
                    cmp = {"argmax": ">", "argmin": "<", "argmax_last": ">=",
                           "argmin_last": "<="}[kind]
                    if dt.is_float:
                        better = b.fcmp_ordered(cmp, v, cur)
                    elif dt.is_signed:
                        better = b.icmp_signed(cmp, v, cur)
                    else:
                        better = b.icmp_unsigned(cmp, v, cur)
                    b.store(b.select(better, v, cur), acc)
                    b.store(b.select(better, flat, b.load(best)), best)
                else:
                    if kind in ("max", "min"):
                        nxt = S.emit(b, kind, [cur, v], [dt, dt], dt)
                    else:
                        w = S.convert(b, v, dt, acc_dt)
                        if kind == "l1":
                            w = S.emit(b, "abs", [w], [acc_dt], acc_dt)
                        elif kind in ("l2", "sum_square"):
                            w = S.emit(b, "mul", [w, w], [acc_dt, acc_dt], acc_dt)
                        elif kind == "log_sum_exp":
                            sh = S.convert(b, b.load(shift), dt, acc_dt)
                            w = S.intrinsic(b, "exp", b.fsub(w, sh))
                        op = "mul" if kind == "prod" else "add"
                        if acc_dt.is_float:
                            nxt = (b.fmul if op == "mul" else b.fadd)(cur, w, flags=FAST)
                        else:
                            nxt = S.emit(b, op, [cur, w], [acc_dt, acc_dt], acc_dt)
                    b.store(nxt, acc)
            if arg:
                S.store(b, out_dt, b.load(best), out, o)
            else:
                r = b.load(acc)
                if kind == "mean":
                    r = b.fdiv(r, ir.Constant(r.type, float(count)))
                elif kind == "l2":
                    r = S.intrinsic(b, "sqrt", r)
                elif kind == "log_sum":
                    r = S.intrinsic(b, "log", r)
                elif kind == "log_sum_exp":
                    r = b.fadd(S.intrinsic(b, "log", r),
                               S.convert(b, b.load(shift), dt, acc_dt))
                S.store(b, out_dt, S.convert(b, r, acc_dt, out_dt), out, o)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, math.prod(kshape))


def layer_norm(dt: DType, rows: int, cols: int, eps: float) -> Kernel:
    """(x - mean) / sqrt(var + eps) over each row of a (rows, cols) array (scale and bias are
    applied by a following elementwise program)."""
    key = ("layer_norm", dt, rows, cols, float(eps))

    def build() -> ir.Module:
        m, b, (out, x, lo, hi) = kernel_function(key, 2)
        ct = S.compute(dt) if dt is not DType.FLOAT16 else U.F32
        acc = entry_alloca(b, ct)
        with U.loop(b, lo, hi, 1, "r") as r:
            base = b.mul(r, U.i64(cols))
            b.store(ir.Constant(ct, 0.0), acc)
            with U.loop(b, 0, U.i64(cols), 1, "s") as j:
                b.store(b.fadd(b.load(acc), S.load(b, dt, x, b.add(base, j)), flags=FAST), acc)
            mean = b.fdiv(b.load(acc), ir.Constant(ct, float(cols)))
            b.store(ir.Constant(ct, 0.0), acc)
            with U.loop(b, 0, U.i64(cols), 1, "v") as j:
                d = b.fsub(S.load(b, dt, x, b.add(base, j)), mean)
                b.store(b.fadd(b.load(acc), b.fmul(d, d), flags=FAST), acc)
            var = b.fdiv(b.load(acc), ir.Constant(ct, float(cols)))
            inv = b.fdiv(ir.Constant(ct, 1.0),
                         S.intrinsic(b, "sqrt", b.fadd(var, ir.Constant(ct, eps))))
            with U.loop(b, 0, U.i64(cols), 1, "w") as j:
                idx = b.add(base, j)
                S.store(b, dt, b.fmul(b.fsub(S.load(b, dt, x, idx), mean), inv), out, idx)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, rows)


# -- other ops ------------------------------------------------------------------------------------


def scan(kind: str, dt: DType, outer: int, n: int, inner: int, exclusive: bool,
         reverse: bool) -> Kernel:
    """Cumulative sum ("add") or product ("mul") of an (outer, n, inner) array along n."""
    key = ("scan", kind, dt, outer, n, inner, exclusive, reverse)

    def build() -> ir.Module:
        m, b, (out, x, lo, hi) = kernel_function(key, 2)
        acc = entry_alloca(b, S.compute(dt))
        with nest(b, (outer, inner), lo, hi) as (o, i):
            base = b.add(b.mul(o, U.i64(n * inner)), i)
            b.store(S.const(dt, 1 if kind == "mul" else 0), acc)
            with U.loop(b, 0, U.i64(n), 1, "j") as j:
                jj = b.sub(U.i64(n - 1), j) if reverse else j
                idx = b.add(base, b.mul(jj, U.i64(inner)))
                v = S.load(b, dt, x, idx)
                cur = b.load(acc)
                nxt = S.emit(b, kind, [cur, v], [dt, dt], dt)
                S.store(b, dt, cur if exclusive else nxt, out, idx)
                b.store(nxt, acc)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, outer)


def trilu(dt: DType, batch: int, rows: int, cols: int, upper: bool, k: int) -> Kernel:
    """Keep x[b, i, j] where j - i >= k (upper) or j - i <= k (lower), else 0."""
    key = ("trilu", dt, batch, rows, cols, upper, k)

    def build() -> ir.Module:
        m, b, (out, x, lo, hi) = kernel_function(key, 2)
        with nest(b, (batch, rows, cols), lo, hi) as (bb, i, j):
            idx = b.add(b.mul(b.add(b.mul(bb, U.i64(rows)), i), U.i64(cols)), j)
            d = b.sub(j, i)
            keep = b.icmp_signed(">=" if upper else "<=", d, U.i64(k))
            zero = S.const(dt, 0)
            S.store(b, dt, b.select(keep, S.load(b, dt, x, idx), zero), out, idx)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, batch)


def hardmax(dt: DType, outer: int, n: int, inner: int) -> Kernel:
    """1 at the first maximum along n of an (outer, n, inner) array, 0 elsewhere."""
    key = ("hardmax", dt, outer, n, inner)

    def build() -> ir.Module:
        m, b, (out, x, lo, hi) = kernel_function(key, 2)
        best = entry_alloca(b, U.I64)
        mx = entry_alloca(b, S.compute(dt))
        with nest(b, (outer, inner), lo, hi) as (o, i):
            base = b.add(b.mul(o, U.i64(n * inner)), i)
            b.store(S.load(b, dt, x, base), mx)
            b.store(U.i64(0), best)
            with U.loop(b, 1, U.i64(n), 1, "j") as j:
                v = S.load(b, dt, x, b.add(base, b.mul(j, U.i64(inner))))
                cur = b.load(mx)
                better = (b.fcmp_ordered(">", v, cur) if dt.is_float else
                          (b.icmp_signed if dt.is_signed else b.icmp_unsigned)(">", v, cur))
                b.store(b.select(better, v, cur), mx)
                b.store(b.select(better, j, b.load(best)), best)
            with U.loop(b, 0, U.i64(n), 1, "w") as j:
                one = b.icmp_signed("==", j, b.load(best))
                v = b.select(one, S.const(dt, 1), S.const(dt, 0))
                S.store(b, dt, v, out, b.add(base, b.mul(j, U.i64(inner))))
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, outer)


def taps(in_dt: DType, out_dt: DType, outer: int, n_in: int, n_out: int, inner: int,
         ntaps: int, saturate: bool) -> Kernel:
    """out[o, i, t] = bias[i] + sum_k w[i, k] * x[o, idx[i, k], t] along one axis, in float64
    (resampling: Resize, one axis at a time). Operands: x, idx (int64), w and bias (float64).
    With saturate, an integer output is rounded half to even and clamped."""
    key = ("taps", in_dt, out_dt, outer, n_in, n_out, inner, ntaps, saturate)
    f64 = DType.FLOAT64

    def build() -> ir.Module:
        m, b, (out, x, idx, w, bias, lo, hi) = kernel_function(key, 5)
        with nest(b, (outer, n_out, inner), lo, hi) as (o, i, t):
            acc = S.load(b, f64, bias, i)
            for k in range(ntaps):
                j = b.add(b.mul(i, U.i64(ntaps)), U.i64(k))
                src = S.load(b, DType.INT64, idx, j)
                xi = b.add(b.mul(b.add(b.mul(o, U.i64(n_in)), src), U.i64(inner)), t)
                xv = S.convert(b, S.load(b, in_dt, x, xi), in_dt, f64)
                acc = b.fadd(acc, b.fmul(S.load(b, f64, w, j), xv))
            if saturate and not out_dt.is_float and out_dt is not DType.BOOL:
                info = np.iinfo(out_dt.np)
                acc = S.intrinsic(b, "roundeven", acc)
                acc = S.fmin_nan(b, S.fmax_nan(b, acc, ir.Constant(S.F64, float(info.min))),
                                 ir.Constant(S.F64, float(info.max)))
            oi = b.add(b.mul(b.add(b.mul(o, U.i64(n_out)), i), U.i64(inner)), t)
            S.store(b, out_dt, S.convert(b, acc, f64, out_dt), out, oi)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "pppppll", build, outer)


def _combine(b: ir.IRBuilder, reduction: str, dt: DType, cur: ir.Value, v: ir.Value) -> ir.Value:
    if reduction == "none":
        return v
    op = {"add": "add", "mul": "mul", "max": "max", "min": "min"}[reduction]
    return S.emit(b, op, [cur, v], [dt, dt], dt)


def scatter_elements(dt: DType, idx_dt: DType, x_shape: Sequence[int],
                     idx_shape: Sequence[int], axis: int, reduction: str) -> Kernel:
    """out (already a copy of x)[i... with i[axis] = idx[i...]] (reduction)= upd[i...], in
    order (the last of duplicate indices wins). Not split: updates may collide."""
    x_shape, idx_shape = tuple(x_shape), tuple(idx_shape)
    key = ("scatter_elements", dt, idx_dt, x_shape, idx_shape, axis, reduction)
    xst, ist = contiguous_strides(x_shape), contiguous_strides(idx_shape)

    def build() -> ir.Module:
        m, b, (out, idx, upd, lo, hi) = kernel_function(key, 3)
        with nest(b, idx_shape, lo, hi) as ivs:
            flat = offset(b, ivs, ist)
            k = S.convert(b, S.load(b, idx_dt, idx, flat), idx_dt, DType.INT64)
            k = b.select(b.icmp_signed("<", k, U.i64(0)), b.add(k, U.i64(x_shape[axis])), k)
            dst = offset(b, [k if d == axis else iv for d, iv in enumerate(ivs)], xst)
            v = _combine(b, reduction, dt, S.load(b, dt, out, dst), S.load(b, dt, upd, flat))
            S.store(b, dt, v, out, dst)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "pppll", build, idx_shape[0] if idx_shape else 1)


def index_rows(dt: DType, idx_dt: DType, x_shape: Sequence[int], nbatch: int, rows: int,
               k: int, scatter: bool, reduction: str = "none") -> Kernel:
    """GatherND / ScatterND over `batch` leading axes of x: row r of idx (k indices into the
    next k axes, negative from the end) names a slice of the remaining axes.
    gather: out[bt, r, :] = x[bt, idx[bt, r], :];
    scatter: out[bt, idx[bt, r], :] (reduction)= upd[bt, r, :] (out already holds x)."""
    x_shape = tuple(x_shape)
    key = ("index_rows", dt, idx_dt, x_shape, nbatch, rows, k, scatter, reduction)
    xst = contiguous_strides(x_shape)
    batch = math.prod(x_shape[:nbatch])
    inner = math.prod(x_shape[nbatch + k:])
    xbatch = math.prod(x_shape[nbatch:])

    def build() -> ir.Module:
        m, b, (out, x, idx, lo, hi) = kernel_function(key, 3)
        with nest(b, (batch, rows), lo, hi) as (bt, r):
            src: ir.Value = b.mul(bt, U.i64(xbatch))
            ibase = b.mul(b.add(b.mul(bt, U.i64(rows)), r), U.i64(k))
            for j in range(k):
                v = S.convert(b, S.load(b, idx_dt, idx, b.add(ibase, U.i64(j))), idx_dt,
                              DType.INT64)
                dim = x_shape[nbatch + j]
                v = b.select(b.icmp_signed("<", v, U.i64(0)), b.add(v, U.i64(dim)), v)
                src = b.add(src, b.mul(v, U.i64(xst[nbatch + j])))
            row = b.mul(b.add(b.mul(bt, U.i64(rows)), r), U.i64(inner))
            with U.loop(b, 0, U.i64(inner), 1, "t") as t:
                if scatter:  # x is the updates here
                    d = b.add(src, t)
                    v = _combine(b, reduction, dt, S.load(b, dt, out, d),
                                 S.load(b, dt, x, b.add(row, t)))
                    S.store(b, dt, v, out, d)
                else:
                    S.store(b, dt, S.load(b, dt, x, b.add(src, t)), out, b.add(row, t))
        b.ret_void()
        return m

    return Kernel(key, "kernel", "pppll", build, batch)


def topk(dt: DType, outer: int, n: int, inner: int, k: int, largest: bool) -> Kernel:
    """Indices (int64) of the k largest (smallest) along n of an (outer, n, inner) array,
    ties broken by the lower index: element j goes to position rank(j) when that is < k,
    rank(j) = #{i: x[i] beats x[j] or (x[i] == x[j] and i < j)} (O(n^2), small axes).
    NaN is above every number (the first of the largest, the last of the smallest)."""
    key = ("topk", dt, outer, n, inner, k, largest)

    def build() -> ir.Module:
        m, b, (out, x, lo, hi) = kernel_function(key, 2)
        rank = entry_alloca(b, U.I64)
        cmp = ">" if largest else "<"
        with nest(b, (outer, inner), lo, hi) as (o, t):
            base = b.add(b.mul(o, U.i64(n * inner)), t)
            obase = b.add(b.mul(o, U.i64(k * inner)), t)
            with U.loop(b, 0, U.i64(n), 1, "j") as j:
                xj = S.load(b, dt, x, b.add(base, b.mul(j, U.i64(inner))))
                b.store(U.i64(0), rank)
                with U.loop(b, 0, U.i64(n), 1, "i") as i:
                    xi = S.load(b, dt, x, b.add(base, b.mul(i, U.i64(inner))))
                    if dt.is_float:
                        # NaN ranks above every number and equal to NaN, for largest and
                        # smallest alike (onnxruntime's order, numpy's sort order)
                        ni, nj = (b.fcmp_unordered("uno", v, v) for v in (xi, xj))
                        nan_beats = b.and_(ni, b.not_(nj)) if largest else \
                            b.and_(nj, b.not_(ni))
                        beats = b.or_(b.fcmp_ordered(cmp, xi, xj), nan_beats)
                        eq = b.or_(b.fcmp_ordered("==", xi, xj), b.and_(ni, nj))
                    else:
                        ic = b.icmp_signed if dt.is_signed else b.icmp_unsigned
                        beats, eq = ic(cmp, xi, xj), ic("==", xi, xj)
                    ahead = b.or_(beats, b.and_(eq, b.icmp_signed("<", i, j)))
                    b.store(b.add(b.load(rank), b.zext(ahead, U.I64)), rank)
                r = b.load(rank)
                with b.if_then(b.icmp_signed("<", r, U.i64(k))):
                    U.store(b, U.I64, j, out, b.add(obase, b.mul(r, U.i64(inner))))
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, outer)


def lrn(dt: DType, n: int, c: int, inner: int, size: int, alpha: float, beta: float,
        bias: float) -> Kernel:
    """Local response normalisation across channels of (n, c, inner):
    y = x / (bias + alpha / size * sum of x^2 over channels [c - (size-1)//2, c + size//2])^beta."""
    key = ("lrn", dt, n, c, inner, size, alpha, beta, bias)
    lo_off, hi_off = (size - 1) // 2, size // 2

    def build() -> ir.Module:
        m, b, (out, x, lo, hi) = kernel_function(key, 2)
        ct = S.compute(dt)
        acc = entry_alloca(b, ct)
        with nest(b, (n, c, inner), lo, hi) as (i, ch, t):
            b.store(ir.Constant(ct, 0.0), acc)
            c0 = U.imax(b, b.sub(ch, U.i64(lo_off)), U.i64(0))
            c1 = U.imin(b, b.add(ch, U.i64(hi_off + 1)), U.i64(c))
            with U.loop(b, c0, c1, 1, "k") as k:
                v = S.load(b, dt, x, b.add(b.mul(b.add(b.mul(i, U.i64(c)), k), U.i64(inner)), t))
                b.store(b.fadd(b.load(acc), b.fmul(v, v)), acc)
            idx = b.add(b.mul(b.add(b.mul(i, U.i64(c)), ch), U.i64(inner)), t)
            d = b.fadd(ir.Constant(ct, bias), b.fmul(ir.Constant(ct, alpha / size), b.load(acc)))
            d = S.intrinsic(b, "pow", d, ir.Constant(ct, beta))
            S.store(b, dt, b.fdiv(S.load(b, dt, x, idx), d), out, idx)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, n)


def reverse_sequence(dt: DType, len_dt: DType, shape: Sequence[int], batch_axis: int,
                     time_axis: int) -> Kernel:
    """out[..., b, ..., t, ...] = x[..., b, ..., len[b] - 1 - t, ...] for t < len[b], else
    x at t (ReverseSequence)."""
    shape = tuple(shape)
    key = ("reverse_sequence", dt, len_dt, shape, batch_axis, time_axis)
    st = contiguous_strides(shape)

    def build() -> ir.Module:
        m, b, (out, x, lens, lo, hi) = kernel_function(key, 3)
        with nest(b, shape, lo, hi) as ivs:
            bt, t = ivs[batch_axis], ivs[time_axis]
            n = S.convert(b, S.load(b, len_dt, lens, bt), len_dt, DType.INT64)
            src_t = b.select(b.icmp_signed("<", t, n), b.sub(b.sub(n, U.i64(1)), t), t)
            src = offset(b, [src_t if d == time_axis else iv for d, iv in enumerate(ivs)], st)
            S.store(b, dt, S.load(b, dt, x, src), out, offset(b, ivs, st))
        b.ret_void()
        return m

    return Kernel(key, "kernel", "pppll", build, shape[0])


def col2im(dt: DType, out_shape: Sequence[int], kernel: Sequence[int], blocks: Sequence[int],
           strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int]) -> Kernel:
    """The adjoint of im2col: out[n, c, *y] = sum over taps k and block positions p with
    p * stride + k * dilation - pad_begin == y of x[n, c * K + k, flat(p)]."""
    out_shape = tuple(out_shape)
    key = ("col2im", dt, out_shape, tuple(kernel), tuple(blocks), tuple(strides), tuple(pads),
           tuple(dilations))
    nsp = len(kernel)
    image = out_shape[2:]
    ktot, ltot = math.prod(kernel), math.prod(blocks)
    kst, bst = contiguous_strides(kernel), contiguous_strides(blocks)

    def build() -> ir.Module:
        m, b, (out, x, lo, hi) = kernel_function(key, 2)
        ct = S.compute(dt)
        acc = entry_alloca(b, ct)
        with nest(b, (out_shape[0] * out_shape[1],), lo, hi) as (nc,):
            with nest(b, image, name="y") as ys:
                b.store(ir.Constant(ct, 0.0), acc)
                with nest(b, kernel, name="k") as ks:
                    ok: ir.Value = ir.Constant(U.I1, 1)
                    pflat: ir.Value = U.i64(0)
                    for d in range(nsp):
                        t = b.sub(b.add(ys[d], U.i64(pads[d])), b.mul(ks[d], U.i64(dilations[d])))
                        ok = b.and_(ok, b.icmp_signed(">=", t, U.i64(0)))
                        ok = b.and_(ok, b.icmp_signed("==", b.srem(t, U.i64(strides[d])),
                                                      U.i64(0)))
                        p = b.sdiv(t, U.i64(strides[d]))
                        ok = b.and_(ok, b.icmp_signed("<", p, U.i64(blocks[d])))
                        pflat = b.add(pflat, b.mul(p, U.i64(bst[d])))
                    with b.if_then(ok):
                        row = b.add(b.mul(nc, U.i64(ktot)), offset(b, ks, kst))
                        v = S.load(b, dt, x, b.add(b.mul(row, U.i64(ltot)), pflat))
                        b.store(b.fadd(b.load(acc), v), acc)
                oi = b.add(b.mul(nc, U.i64(math.prod(image))),
                           offset(b, ys, contiguous_strides(image)))
                S.store(b, dt, b.load(acc), out, oi)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, out_shape[0] * out_shape[1])


def einsum(dt: DType, inputs: Sequence[tuple[str, tuple[int, ...]]], output: str,
           sizes: dict[str, int]) -> Kernel:
    """out[output letters] = sum over the other letters of the product of the operands, each
    indexed by its letters (a repeated letter walks the diagonal): Einsum as one loop nest."""
    inputs = tuple(inputs)
    summed = sorted({c for sub, _ in inputs for c in sub} - set(output))
    key = ("einsum", dt, inputs, output, tuple(sorted(sizes.items())))
    oshape = tuple(sizes[c] for c in output) or (1,)
    acc_dt = DType.FLOAT32 if dt is DType.FLOAT16 else dt

    def strides(sub: str, shape: tuple[int, ...], letters: str) -> list[int]:
        st = contiguous_strides(shape)  # a broadcast (size-1) axis does not move
        return [sum(st[i] for i, c in enumerate(sub) if c == L_ and shape[i] != 1)
                for L_ in letters]

    def build() -> ir.Module:
        m, b, args = kernel_function(key, 1 + len(inputs))
        out, ins, lo, hi = args[0], args[1:-2], args[-2], args[-1]
        acc = entry_alloca(b, S.compute(acc_dt))
        with nest(b, oshape, lo, hi, "o") as ovs:
            ovs = ovs if output else []
            b.store(S.const(acc_dt, 0), acc)
            with nest(b, [sizes[c] for c in summed], name="s") as svs:
                prod: ir.Value | None = None
                for (sub, shape), p in zip(inputs, ins, strict=True):
                    idx = b.add(offset(b, ovs, strides(sub, shape, output)),
                                offset(b, svs, strides(sub, shape, "".join(summed))))
                    v = S.convert(b, S.load(b, dt, p, idx), dt, acc_dt)
                    prod = v if prod is None else S.emit(b, "mul", [prod, v], [acc_dt] * 2,
                                                         acc_dt)
                assert prod is not None
                b.store(S.emit(b, "add", [b.load(acc), prod], [acc_dt] * 2, acc_dt), acc)
            S.store(b, dt, S.convert(b, b.load(acc), acc_dt, dt), out,
                    offset(b, ovs, contiguous_strides(oshape)) if output else U.i64(0))
        b.ret_void()
        return m

    return Kernel(key, "kernel", "p" * (1 + len(inputs)) + "ll", build, oshape[0])
