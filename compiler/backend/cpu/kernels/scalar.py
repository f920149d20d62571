"""Scalar code for every IR dtype: storage and compute types, loads, stores, conversions, and
the elementwise operators, emitted with `llvmlite.ir`.

A value is computed in the *compute type* of its dtype: float16 in float (loaded with ``fpext``,
stored with ``fptrunc``), bool as ``i1`` (stored as one byte, like numpy), the others as
themselves. The generic loop-nest generators (``loops.py`` and the generic kernels of the
op-family modules) call `emit` for each instruction of an elementwise program, so one table
defines the arithmetic of every op.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import llvmlite.ir as ir

from ....ir.dtypes import DType
from . import irutil as U

F16 = ir.HalfType()
F64 = ir.DoubleType()

_STORAGE: dict[DType, ir.Type] = {
    DType.FLOAT16: F16, DType.FLOAT32: U.F32, DType.FLOAT64: F64, DType.BOOL: U.I8,
    DType.INT8: U.I8, DType.UINT8: U.I8, DType.INT16: U.I16, DType.UINT16: U.I16,
    DType.INT32: U.I32, DType.UINT32: U.I32, DType.INT64: U.I64, DType.UINT64: U.I64,
}


class Unsupported(Exception):
    """An op/dtype combination this code generator has no code for (the caller reports it)."""


def storage(dt: DType) -> ir.Type:
    return _STORAGE[dt]


def compute(dt: DType) -> ir.Type:
    if dt is DType.FLOAT16:
        return U.F32
    if dt is DType.BOOL:
        return U.I1
    return _STORAGE[dt]


def load(b: ir.IRBuilder, dt: DType, ptr: ir.Value, idx: ir.Value) -> ir.Value:
    v = U.load(b, storage(dt), ptr, idx)
    if dt is DType.FLOAT16:
        return b.fpext(v, U.F32)
    if dt is DType.BOOL:
        return b.icmp_unsigned("!=", v, ir.Constant(U.I8, 0))
    return v


def store(b: ir.IRBuilder, dt: DType, v: ir.Value, ptr: ir.Value, idx: ir.Value) -> None:
    if dt is DType.FLOAT16:
        v = b.fptrunc(v, F16)
    elif dt is DType.BOOL:
        v = b.zext(v, U.I8)
    U.store(b, storage(dt), v, ptr, idx)


def const(dt: DType, v: float | int | bool) -> ir.Constant:
    t = compute(dt)
    if dt.is_float:
        return ir.Constant(t, float(v))
    if dt is DType.BOOL:
        return ir.Constant(U.I1, int(bool(v)))
    bits = t.width
    iv = int(v) & ((1 << bits) - 1)
    return ir.Constant(t, iv)


def int_const(dt: DType, v: float) -> ir.Constant:
    """A float bound cast to an integer dtype as numpy does (np.array(v).astype(dt))."""
    import numpy as np

    with np.errstate(all="ignore"):
        return const(dt, int(np.array(v).astype(dt.np)))


def convert(b: ir.IRBuilder, v: ir.Value, src: DType, dst: DType) -> ir.Value:
    """numpy ``astype`` between compute values."""
    if src is dst:
        return v
    st, dt_ = compute(src), compute(dst)
    if src.is_float and dst.is_float:
        if st == dt_:
            return v
        return b.fpext(v, dt_) if _fbits(st) < _fbits(dt_) else b.fptrunc(v, dt_)
    if src.is_float:
        if dst is DType.BOOL:
            return b.fcmp_unordered("!=", v, ir.Constant(st, 0.0))
        # Out-of-range and NaN are undefined in ONNX; convert through i64 so the common
        # "negative float to unsigned" wraps like numpy instead of producing poison.
        wide = b.fptosi(v, U.I64) if dst.is_signed or dt_.width < 64 else b.fptoui(v, U.I64)
        return b.trunc(wide, dt_) if dt_.width < 64 else wide
    if dst.is_float:
        if src is DType.BOOL or not src.is_signed:
            return b.uitofp(v, dt_)
        return b.sitofp(v, dt_)
    if dst is DType.BOOL:
        return b.icmp_unsigned("!=", v, ir.Constant(st, 0))
    if st.width == dt_.width:
        return v
    if st.width > dt_.width:
        return b.trunc(v, dt_)
    if src is DType.BOOL or not src.is_signed:
        return b.zext(v, dt_)
    return b.sext(v, dt_)


def _fbits(t: ir.Type) -> int:
    return 64 if isinstance(t, ir.DoubleType) else 32


def _fsuffix(t: ir.Type) -> str:
    return "f64" if isinstance(t, ir.DoubleType) else "f32"


def intrinsic(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    t = args[0].type
    fn = U.intrinsic(b.module, f"llvm.{name}.{_fsuffix(t)}", t, [a.type for a in args])
    return b.call(fn, list(args))


def libm(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """A C math library call: ``tanhf`` for float, ``tanh`` for double."""
    t = args[0].type
    cname = name if isinstance(t, ir.DoubleType) else name + "f"
    fn = U.intrinsic(b.module, cname, t, [a.type for a in args])
    return b.call(fn, list(args))


def _fc(t: ir.Type, v: float) -> ir.Constant:
    return ir.Constant(t, v)


def fmax_nan(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """numpy.maximum: NaN in either operand gives NaN."""
    r = b.select(b.fcmp_ordered(">", x, y), x, y)
    return b.select(b.fcmp_unordered("uno", x, x), x, r)


def fmin_nan(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    r = b.select(b.fcmp_ordered("<", x, y), x, y)
    return b.select(b.fcmp_unordered("uno", x, x), x, r)


def _imax(b: ir.IRBuilder, dt: DType, x: ir.Value, y: ir.Value) -> ir.Value:
    cmp = b.icmp_signed if dt.is_signed else b.icmp_unsigned
    return b.select(cmp(">", x, y), x, y)


def _imin(b: ir.IRBuilder, dt: DType, x: ir.Value, y: ir.Value) -> ir.Value:
    cmp = b.icmp_signed if dt.is_signed else b.icmp_unsigned
    return b.select(cmp("<", x, y), x, y)


def _expm1(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return libm(b, "expm1", x)


def _softplus(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    t = x.type
    ax = intrinsic(b, "fabs", x)
    e = libm(b, "log1p", intrinsic(b, "exp", b.fneg(ax)))
    return b.fadd(fmax_nan(b, x, _fc(t, 0.0)), e)


_FLOAT_UNARY_INTRINSIC = {"exp": "exp", "log": "log", "sqrt": "sqrt", "floor": "floor",
                          "ceil": "ceil", "round": "roundeven", "sin": "sin", "cos": "cos"}
_FLOAT_UNARY_LIBM = {"tanh": "tanh", "erf": "erf", "tan": "tan", "asin": "asin",
                     "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
                     "asinh": "asinh", "acosh": "acosh", "atanh": "atanh"}
_CMP = {"equal": "==", "less": "<", "greater": ">", "less_equal": "<=", "greater_equal": ">="}


def emit(b: ir.IRBuilder, op: str, args: Sequence[ir.Value], dts: Sequence[DType],
         out: DType, params: Sequence[Any] = ()) -> ir.Value:
    """Emit one elementwise op on compute values `args` (of dtypes `dts`); the result has the
    compute type of `out`. Raises `Unsupported` for a combination without code."""
    dt = dts[0] if dts else out
    x = args[0]
    if op == "identity":
        return x
    if op == "cast":
        return convert(b, x, dt, out)
    if op in _CMP:
        y = args[1]
        if dt.is_float:
            return b.fcmp_ordered(_CMP[op], x, y)
        cmp = b.icmp_signed if dt.is_signed else b.icmp_unsigned
        return cmp(_CMP[op], x, y)
    if op in ("and", "or", "xor"):
        return getattr(b, op + "_" if op in ("and", "or") else op)(x, args[1])
    if op == "not":
        return b.xor(x, ir.Constant(U.I1, 1))
    if op == "where":
        return b.select(x, args[1], args[2])
    if op == "isnan":
        return b.fcmp_unordered("uno", x, x) if dt.is_float else ir.Constant(U.I1, 0)
    if op == "isinf":
        pos, neg = params
        t = x.type
        r = ir.Constant(U.I1, 0)
        if pos:
            r = b.or_(r, b.fcmp_ordered("==", x, _fc(t, math.inf)))
        if neg:
            r = b.or_(r, b.fcmp_ordered("==", x, _fc(t, -math.inf)))
        return r
    if op == "quantize":  # (x, scale, zero point) -> saturate(rint(x / scale) + zp)
        s, zp = args[1], args[2]
        q = intrinsic(b, "roundeven", b.fdiv(x, convert(b, s, dts[1], dt)))
        q = b.fadd(convert(b, q, dt, DType.FLOAT64), convert(b, zp, dts[2], DType.FLOAT64))
        import numpy as np

        info = np.iinfo(out.np)
        q = fmin_nan(b, fmax_nan(b, q, _fc(F64, float(info.min))), _fc(F64, float(info.max)))
        return convert(b, q, DType.FLOAT64, out)
    if op == "dequantize":  # (x, scale, zero point) -> (x - zp) * scale
        s, zp = args[1], args[2]
        d = b.sub(convert(b, x, dt, DType.INT32), convert(b, zp, dts[2], DType.INT32))
        return b.fmul(convert(b, d, DType.INT32, dts[1]), s)
    if op in ("shl", "shr", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"):
        if not dt.is_int:
            raise Unsupported(f"{op} on {dt.value}")
        if op == "bitwise_not":
            return b.not_(x)
        y = args[1]
        if op in ("shl", "shr"):
            # numpy: a shift by >= the width (or a negative one) gives 0, or -1 for a
            # negative signed value shifted right; signed right shifts are arithmetic.
            width = ir.Constant(y.type, x.type.width)
            if op == "shl":
                r, far = b.shl(x, y), ir.Constant(x.type, 0)
            elif dt.is_signed:
                r = b.ashr(x, y)
                far = b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)),
                               ir.Constant(x.type, -1), ir.Constant(x.type, 0))
            else:
                r, far = b.lshr(x, y), ir.Constant(x.type, 0)
            return b.select(b.icmp_unsigned(">=", y, width), far, r)
        return {"bitwise_and": b.and_, "bitwise_or": b.or_, "bitwise_xor": b.xor}[op](x, y)
    if dt is DType.BOOL:
        if op in ("max", "min"):
            return (b.or_ if op == "max" else b.and_)(x, args[1])
        raise Unsupported(f"{op} on bool")
    if dt.is_float:
        return _emit_float(b, op, args, dts, out, params)
    return _emit_int(b, op, args, dts, out, params)


def _emit_float(b: ir.IRBuilder, op: str, args: Sequence[ir.Value], dts: Sequence[DType],
                out: DType, params: Sequence[Any]) -> ir.Value:
    x = args[0]
    t = x.type
    one, zero = _fc(t, 1.0), _fc(t, 0.0)
    if op in _FLOAT_UNARY_INTRINSIC:
        return intrinsic(b, _FLOAT_UNARY_INTRINSIC[op], x)
    if op in _FLOAT_UNARY_LIBM:
        return libm(b, _FLOAT_UNARY_LIBM[op], x)
    if op == "relu":
        return b.select(b.fcmp_ordered("<", x, zero), zero, x)
    if op == "sigmoid":
        return b.fdiv(one, b.fadd(one, intrinsic(b, "exp", b.fneg(x))))
    if op == "neg":
        return b.fneg(x)
    if op == "abs":
        return intrinsic(b, "fabs", x)
    if op == "reciprocal":
        return b.fdiv(one, x)
    if op == "sign":
        r = b.select(b.fcmp_ordered(">", x, zero), one, x)
        return b.select(b.fcmp_ordered("<", x, zero), _fc(t, -1.0), r)
    if op == "softplus":
        return _softplus(b, x)
    if op == "softsign":
        return b.fdiv(x, b.fadd(one, intrinsic(b, "fabs", x)))
    if op == "hard_swish":
        h = b.fadd(b.fdiv(x, _fc(t, 6.0)), _fc(t, 0.5))
        return b.fmul(x, fmin_nan(b, fmax_nan(b, h, zero), one))
    if op == "mish":
        return b.fmul(x, libm(b, "tanh", _softplus(b, x)))
    if op == "leaky_relu":
        return b.select(b.fcmp_ordered(">=", x, zero), x, b.fmul(x, _fc(t, params[0])))
    if op == "elu":
        neg = b.fmul(_fc(t, params[0]), _expm1(b, fmin_nan(b, x, zero)))
        return b.select(b.fcmp_ordered(">", x, zero), x, neg)
    if op == "selu":
        neg = b.fmul(_fc(t, params[0]), _expm1(b, fmin_nan(b, x, zero)))
        return b.fmul(_fc(t, params[1]), b.select(b.fcmp_ordered(">", x, zero), x, neg))
    if op == "celu":
        a = _fc(t, params[0])
        return b.fadd(fmax_nan(b, x, zero),
                      fmin_nan(b, zero, b.fmul(a, _expm1(b, b.fdiv(x, a)))))
    if op == "thresholded_relu":
        return b.select(b.fcmp_ordered(">", x, _fc(t, params[0])), x, zero)
    if op == "hard_sigmoid":
        v = b.fadd(b.fmul(x, _fc(t, params[0])), _fc(t, params[1]))
        return fmin_nan(b, fmax_nan(b, v, zero), one)
    if op == "gelu":
        half = _fc(t, 0.5)
        if params and params[0] == "tanh":
            c = _fc(t, math.sqrt(2 / math.pi))
            inner = b.fmul(c, b.fadd(x, b.fmul(_fc(t, 0.044715), b.fmul(x, b.fmul(x, x)))))
            return b.fmul(b.fmul(half, x), b.fadd(one, libm(b, "tanh", inner)))
        e = libm(b, "erf", b.fdiv(x, _fc(t, math.sqrt(2.0))))
        return b.fmul(b.fmul(half, x), b.fadd(one, e))
    if op == "clip":
        lo, hi = params
        if lo is not None:
            x = b.select(b.fcmp_ordered("<", x, _fc(t, lo)), _fc(t, lo), x)
        if hi is not None:
            x = b.select(b.fcmp_ordered(">", x, _fc(t, hi)), _fc(t, hi), x)
        return x
    if len(args) < 2:
        raise Unsupported(f"{op} on {dts[0].value}")
    y = args[1]
    if op == "pow":
        y = convert(b, y, dts[1], dts[0])
        return intrinsic(b, "pow", x, y)
    if op == "add":
        return b.fadd(x, y)
    if op == "sub":
        return b.fsub(x, y)
    if op == "mul":
        return b.fmul(x, y)
    if op == "div":
        return b.fdiv(x, y)
    if op == "max":
        return fmax_nan(b, x, y)
    if op == "min":
        return fmin_nan(b, x, y)
    if op == "prelu":
        return b.select(b.fcmp_ordered(">=", x, zero), x, b.fmul(x, y))
    if op in ("fmod", "mod"):
        r = b.frem(x, y)
        if op == "fmod":
            return r
        fix = b.and_(b.fcmp_ordered("!=", r, zero),
                     b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", y, zero)))
        return b.select(fix, b.fadd(r, y), r)
    raise Unsupported(f"{op} on {dts[0].value}")


def _emit_int(b: ir.IRBuilder, op: str, args: Sequence[ir.Value], dts: Sequence[DType],
              out: DType, params: Sequence[Any]) -> ir.Value:
    x = args[0]
    dt = dts[0]
    t = x.type
    zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
    signed = dt.is_signed
    if op == "relu":
        return b.select(b.icmp_signed("<", x, zero), zero, x) if signed else x
    if op == "neg":
        return b.neg(x)
    if op == "abs":
        return b.select(b.icmp_signed("<", x, zero), b.neg(x), x) if signed else x
    if op == "sign":
        if not signed:
            return b.select(b.icmp_unsigned(">", x, zero), one, zero)
        r = b.select(b.icmp_signed(">", x, zero), one, zero)
        return b.select(b.icmp_signed("<", x, zero), ir.Constant(t, -1), r)
    if op == "clip":
        lo, hi = params
        if lo is not None:
            x = _imax(b, dt, x, int_const(dt, lo))
        if hi is not None:
            x = _imin(b, dt, x, int_const(dt, hi))
        return x
    if len(args) < 2:
        raise Unsupported(f"{op} on {dt.value}")
    y = args[1]
    if op == "add":
        return b.add(x, y)
    if op == "sub":
        return b.sub(x, y)
    if op == "mul":
        return b.mul(x, y)
    if op == "max":
        return _imax(b, dt, x, y)
    if op == "min":
        return _imin(b, dt, x, y)
    if op == "prelu":
        return b.select(b.icmp_signed(">=", x, zero), x, b.mul(x, y)) if signed else x
    if op in ("div", "mod", "fmod"):
        # Division by zero would trap: such lanes give 0 (numpy does the same, with a warning).
        nz = b.icmp_unsigned("!=", y, zero)
        ys = b.select(nz, y, one)
        if op == "div":
            r = b.sdiv(x, ys) if signed else b.udiv(x, ys)
        else:
            r = b.srem(x, ys) if signed else b.urem(x, ys)
            if op == "mod" and signed:
                fix = b.and_(b.icmp_signed("!=", r, zero),
                             b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", ys, zero)))
                r = b.select(fix, b.add(r, ys), r)
        return b.select(nz, r, zero)
    if op == "pow":
        xd = convert(b, x, dt, DType.FLOAT64)
        yd = convert(b, y, dts[1], DType.FLOAT64)
        return convert(b, intrinsic(b, "pow", xd, yd), DType.FLOAT64, dt)
    raise Unsupported(f"{op} on {dt.value}")
