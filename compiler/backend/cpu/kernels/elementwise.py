"""Elementwise kernels as LLVM IR, and softmax: the fast float32 ones and the generic ones.

Float32, called from numpy (`add` / `mul` with one broadcast block, `relu`, `clip`, `softmax`
over the last axis): the loops are written scalar and vectorised by LLVM's loop vectoriser
(pointer arguments are ``noalias``; reductions carry ``reassoc`` so they vectorise too).

Generic, for the lowering (`eltwise`, `softmax_axis`): loop-nest `loops.Kernel`s over every
dtype. `eltwise` runs an elementwise program (a list of `Instr`, each op's arithmetic from
`scalar.emit`) over operands broadcast numpy-style: one op, a fused chain, batch norm, the
(de)quantisation, an epilogue. `softmax_axis` is (log-)softmax along any axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import llvmlite.ir as ir
import numpy as np

from vtakit.runtime.cpu.llvm import CACHE
from vtakit.runtime.cpu.parallel import run_parallel, split_range

from ....ir.dtypes import DType
from . import gemm as G
from . import irutil as U
from . import scalar as S
from .loops import FAST as GENERIC_FAST
from .loops import Kernel, collapse, contiguous_strides, entry_alloca, kernel_function, nest, offset

# -- float32, called from numpy -------------------------------------------------------------------

BinOp = Literal["add", "mul"]
FAST = ("reassoc", "nsz", "arcp", "contract")  # the generic kernels: GENERIC_FAST, no arcp


def _binary_module(op: BinOp) -> ir.Module:
    """binary(a, b, out, o0, o1, nb, inner): out[o, j, t] = a[o, j, t] op b[j] for o in [o0, o1)."""
    m = ir.Module(name=f"binary_{op}")
    _, b = U.new_function(m, "binary", [("a", U.PTR), ("b", U.PTR), ("out", U.PTR),
                                         ("o0", U.I64), ("o1", U.I64), ("nb", U.I64),
                                         ("inner", U.I64)], noalias=False)
    a, bb, out, o0, o1, nb, inner = b.function.args
    with U.loop(b, o0, o1, 1, "o") as o:
        with U.loop(b, 0, nb, 1, "j") as j:
            bv = U.load(b, U.F32, bb, j)
            base = b.mul(b.add(b.mul(o, nb), j), inner)
            with U.loop(b, 0, inner, 1, "t") as t:
                idx = b.add(base, t)
                av = U.load(b, U.F32, a, idx)
                r = b.fadd(av, bv) if op == "add" else b.fmul(av, bv)
                U.store(b, U.F32, r, out, idx)
    b.ret_void()
    return m


def _unary_module(kind: Literal["relu", "clip"]) -> ir.Module:
    m = ir.Module(name=f"unary_{kind}")
    _, b = U.new_function(m, "unary", [("a", U.PTR), ("out", U.PTR), ("i0", U.I64),
                                        ("i1", U.I64), ("lo", U.F32), ("hi", U.F32)],
                          noalias=False)
    a, out, i0, i1, lo, hi = b.function.args
    with U.loop(b, i0, i1, 1, "i") as i:
        v = U.load(b, U.F32, a, i)
        v = U.fmax(b, v, U.f32(0.0)) if kind == "relu" else U.fmin(b, U.fmax(b, v, lo), hi)
        U.store(b, U.F32, v, out, i)
    b.ret_void()
    return m


def _softmax_module() -> ir.Module:
    """softmax(x, y, r0, r1, n): rows [r0, r1) of an (rows, n) matrix, along the last axis."""
    m = ir.Module(name="softmax")
    _, b = U.new_function(m, "softmax", [("x", U.PTR), ("y", U.PTR), ("r0", U.I64),
                                          ("r1", U.I64), ("n", U.I64)], noalias=False)
    x, y, r0, r1, n = b.function.args
    exp = U.intrinsic(m, "llvm.exp.f32", U.F32, [U.F32])
    mx_slot = b.alloca(U.F32)  # allocas in the entry block, not in the loop
    s_slot = b.alloca(U.F32)
    with U.loop(b, r0, r1, 1, "r") as r:
        base = b.mul(r, n)
        b.store(U.f32(float("-inf")), mx_slot)
        with U.loop(b, 0, n, 1, "j") as j:
            b.store(U.fmax(b, b.load(mx_slot), U.load(b, U.F32, x, b.add(base, j))), mx_slot)
        mx = b.load(mx_slot)
        b.store(U.f32(0.0), s_slot)
        with U.loop(b, 0, n, 1, "e") as j:
            e = b.call(exp, [b.fsub(U.load(b, U.F32, x, b.add(base, j)), mx)])
            U.store(b, U.F32, e, y, b.add(base, j))
            b.store(b.fadd(b.load(s_slot), e, flags=FAST), s_slot)
        inv = b.fdiv(U.f32(1.0), b.load(s_slot))
        with U.loop(b, 0, n, 1, "d") as j:
            idx = b.add(base, j)
            U.store(b, U.F32, b.fmul(U.load(b, U.F32, y, idx), inv), y, idx)
    b.ret_void()
    return m


def _out(x: np.ndarray, out: np.ndarray | None, name: str) -> np.ndarray:
    if out is None:
        return np.empty_like(x)
    G.check_array(out, f"{name}: out", x.ndim)
    if out.shape != x.shape:
        raise ValueError(f"{name}: out has shape {out.shape}, expected {x.shape}")
    return out


def _check_any(x: object, name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray of float32, got {type(x).__name__}")
    return G.check_array(x, name, x.ndim)


def _broadcast_split(a_shape: tuple[int, ...], b_shape: tuple[int, ...],
                     name: str) -> tuple[int, int, int]:
    """(outer, nb, inner) such that b, after dropping leading and trailing 1s, is a block of a."""
    bs = list(b_shape)
    while bs and bs[0] == 1:
        bs.pop(0)
    trail = 0
    while bs and bs[-1] == 1:
        bs.pop()
        trail += 1
    if len(b_shape) > len(a_shape):
        raise ValueError(f"{name}: b has shape {b_shape}, more dimensions than a {a_shape}")
    end = len(a_shape) - trail
    start = end - len(bs)
    if start < 0 or tuple(a_shape[start:end]) != tuple(bs):
        raise ValueError(f"{name}: cannot broadcast b of shape {b_shape} to a of shape "
                         f"{a_shape}; expected b's non-1 dimensions to match a block of a's "
                         "dimensions (numpy broadcasting with one contiguous block)")
    outer = int(np.prod(a_shape[:start], dtype=np.int64))
    return outer, int(np.prod(bs, dtype=np.int64)), int(np.prod(a_shape[end:], dtype=np.int64))


def binary(op: BinOp, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
           threads: int = 1) -> np.ndarray:
    """``out = a op b`` (op: 'add' or 'mul'); b broadcasts as one block of a's dimensions, e.g.
    a trailing suffix ``(C,)`` or a channel ``(C, 1, 1)`` against ``(N, C, H, W)``, or a scalar."""
    if op not in ("add", "mul"):
        raise ValueError(f"binary: op={op!r} not supported (expected 'add' or 'mul')")
    _check_any(a, f"{op}: a")
    _check_any(b, f"{op}: b")
    outer, nb, inner = _broadcast_split(a.shape, b.shape, op)
    y = _out(a, out, op)
    fn = CACHE.get(("binary", op), lambda: _binary_module(op)).cfunc(
        "binary", None, G._P, G._P, G._P, G._L, G._L, G._L, G._L)
    if a.size == 0:
        return y
    run_parallel([lambda lo=lo, hi=hi: fn(a.ctypes.data, b.ctypes.data, y.ctypes.data, lo, hi,
                                          nb, inner)
                  for lo, hi in split_range(outer, threads)])
    return y


def add(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
        threads: int = 1) -> np.ndarray:
    return binary("add", a, b, out, threads)


def mul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
        threads: int = 1) -> np.ndarray:
    return binary("mul", a, b, out, threads)


def _unary(kind: Literal["relu", "clip"], x: np.ndarray, out: np.ndarray | None, lo: float,
           hi: float, threads: int) -> np.ndarray:
    _check_any(x, f"{kind}: x")
    y = _out(x, out, kind)
    fn = CACHE.get(("unary", kind), lambda: _unary_module(kind)).cfunc(
        "unary", None, G._P, G._P, G._L, G._L, G._F, G._F)
    run_parallel([lambda s=s, e=e: fn(x.ctypes.data, y.ctypes.data, s, e, lo, hi)
                  for s, e in split_range(x.size, threads)])
    return y


def relu(x: np.ndarray, out: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
    return _unary("relu", x, out, 0.0, 0.0, threads)


def clip(x: np.ndarray, lo: float, hi: float, out: np.ndarray | None = None,
         threads: int = 1) -> np.ndarray:
    if not lo <= hi:
        raise ValueError(f"clip: lo={lo} must be <= hi={hi}")
    return _unary("clip", x, out, float(lo), float(hi), threads)


def softmax(x: np.ndarray, out: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
    """Softmax over the last axis (numerically stable: subtracts the row maximum)."""
    _check_any(x, "softmax: x")
    if x.ndim == 0:
        raise ValueError("softmax: x is 0-D, expected at least one axis")
    y = _out(x, out, "softmax")
    n = x.shape[-1]
    rows = x.size // n if n else 0
    fn = CACHE.get(("softmax",), _softmax_module).cfunc("softmax", None, G._P, G._P, G._L,
                                                          G._L, G._L)
    run_parallel([lambda s=s, e=e: fn(x.ctypes.data, y.ctypes.data, s, e, n)
                  for s, e in split_range(rows, threads)])
    return y


# -- generic: every dtype, for the lowering -------------------------------------------------------

Instr = tuple[str, tuple[int, ...], tuple, DType]  # (op, operand value indices, params, dtype)


def eltwise(out_dt: DType, out_shape: Sequence[int], operands: Sequence[tuple[DType, tuple]],
            program: Sequence[Instr]) -> Kernel:
    """out = program(operands): operand k has dtype and per-output-axis strides (0 where it
    broadcasts); value k+j is the result of instruction j; the last one is stored."""
    shape, strides = collapse(out_shape, [contiguous_strides(out_shape)] +
                              [s for _, s in operands])
    key = ("eltwise", out_dt, shape, strides, tuple(d for d, _ in operands), tuple(program))
    nops = len(operands)

    def build() -> ir.Module:
        m, b, args = kernel_function(key, nops + 1)
        out, ins, lo, hi = args[0], args[1:nops + 1], args[-2], args[-1]
        with nest(b, shape, lo, hi) as ivs:
            vals = [S.load(b, dt, p, offset(b, ivs, st)) for (dt, _), p, st in
                    zip(operands, ins, strides[1:], strict=True)]
            dts = [dt for dt, _ in operands]
            for op, srcs, params, dt in program:
                args, adts = [vals[i] for i in srcs], [dts[i] for i in srcs]
                if op in _BINARY and len(srcs) == 1:  # x op constant (fused programs)
                    args.append(S.const(dt, params[0]))
                    adts.append(dt)
                vals.append(S.emit(b, op, args, adts, dt, params))
                dts.append(dt)
            S.store(b, out_dt, vals[-1], out, offset(b, ivs, strides[0]))
        b.ret_void()
        return m

    return Kernel(key, "kernel", "p" * (nops + 1) + "ll", build, shape[0])


_BINARY = {"add", "sub", "mul", "div", "max", "min", "pow"}


def softmax_axis(dt: DType, outer: int, n: int, inner: int, log: bool) -> Kernel:
    """Softmax (or log-softmax) of an (outer, n, inner) array along n; split over outer."""
    key = ("softmax", dt, outer, n, inner, log)

    def build() -> ir.Module:
        m, b, (out, x, lo, hi) = kernel_function(key, 2)
        ct = S.compute(dt)
        mx, sm = entry_alloca(b, ct), entry_alloca(b, ct)
        with nest(b, (outer, inner), lo, hi) as (o, i):
            base = b.add(b.mul(o, U.i64(n * inner)), i)
            b.store(ir.Constant(ct, -math.inf), mx)
            with U.loop(b, 0, U.i64(n), 1, "j") as j:
                v = S.load(b, dt, x, b.add(base, b.mul(j, U.i64(inner))))
                b.store(S.fmax_nan(b, b.load(mx), v), mx)
            b.store(ir.Constant(ct, 0.0), sm)
            mxv = b.load(mx)
            with U.loop(b, 0, U.i64(n), 1, "e") as j:
                idx = b.add(base, b.mul(j, U.i64(inner)))
                e = S.intrinsic(b, "exp", b.fsub(S.load(b, dt, x, idx), mxv))
                if not log:
                    S.store(b, dt, e, out, idx)
                b.store(b.fadd(b.load(sm), e, flags=GENERIC_FAST), sm)
            s = b.load(sm)
            with U.loop(b, 0, U.i64(n), 1, "w") as j:
                idx = b.add(base, b.mul(j, U.i64(inner)))
                if log:
                    r = b.fsub(b.fsub(S.load(b, dt, x, idx), mxv), S.intrinsic(b, "log", s))
                else:
                    r = b.fdiv(S.load(b, dt, out, idx), s)
                S.store(b, dt, r, out, idx)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "ppll", build, outer)
