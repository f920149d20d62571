"""Type rules: the dtype and shape each operator produces from its operands and attributes.

`infer` is used by the frontend to build nodes and by the verifier to check them. It raises
`InferError` with a message saying what is wrong; callers add the node's name. `infer` does the
checks every operator shares (SIGNATURES, the epilogue, the dtype sets FLOAT_ONLY, INT_ONLY,
BOOL_ONLY and SAME_DTYPE), then the operator's own rule in RULES gives the result.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from . import ops as o
from .dtypes import DType
from .ops import Op


class InferError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Signature:
    """min_src..max_src operands and the attribute class (or classes) an operator takes."""

    min_src: int
    max_src: int
    attrs: type[o.Attrs] | tuple[type[o.Attrs], ...]

    @property
    def attrs_name(self) -> str:
        if isinstance(self.attrs, tuple):
            return " or ".join(a.__name__ for a in self.attrs)
        return self.attrs.__name__


UNARY = frozenset({
    Op.IDENTITY, Op.RELU, Op.SIGMOID, Op.TANH, Op.EXP, Op.LOG, Op.SQRT, Op.ERF, Op.NEG, Op.ABS,
    Op.RECIPROCAL, Op.FLOOR, Op.CEIL, Op.ROUND, Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS,
    Op.ATAN, Op.SINH, Op.COSH, Op.ASINH, Op.ACOSH, Op.ATANH, Op.SIGN, Op.NOT, Op.SOFTPLUS,
    Op.SOFTSIGN, Op.HARD_SWISH, Op.MISH, Op.BITWISE_NOT,
})
# Elementwise with attributes: same dtype and shape as the operand.
PARAMETRIC_UNARY = frozenset({Op.LEAKY_RELU, Op.ELU, Op.SELU, Op.CELU, Op.THRESHOLDED_RELU,
                              Op.HARD_SIGMOID, Op.GELU, Op.CLIP})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.AND, Op.OR, Op.XOR,
                    Op.PRELU, Op.SHL, Op.SHR, Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR})
INT_ONLY = frozenset({Op.SHL, Op.SHR, Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR,
                      Op.BITWISE_NOT})
COMPARE = frozenset({Op.EQUAL, Op.LESS, Op.GREATER, Op.LESS_EQUAL, Op.GREATER_EQUAL})
REDUCE = frozenset({Op.REDUCE_SUM, Op.REDUCE_MEAN, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_PROD,
                    Op.REDUCE_L1, Op.REDUCE_L2, Op.REDUCE_SUM_SQUARE, Op.REDUCE_LOG_SUM_EXP,
                    Op.REDUCE_LOG_SUM})
FLOAT_ONLY = frozenset({
    Op.SIGMOID, Op.TANH, Op.EXP, Op.LOG, Op.SQRT, Op.ERF, Op.RECIPROCAL, Op.FLOOR, Op.CEIL,
    Op.ROUND, Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH, Op.COSH, Op.ASINH,
    Op.ACOSH, Op.ATANH, Op.SOFTPLUS, Op.SOFTSIGN, Op.HARD_SWISH, Op.MISH, Op.LEAKY_RELU, Op.ELU,
    Op.SELU, Op.CELU, Op.THRESHOLDED_RELU, Op.HARD_SIGMOID, Op.GELU, Op.SOFTMAX,
    Op.LOG_SOFTMAX, Op.BATCH_NORM, Op.LAYER_NORM, Op.AVG_POOL, Op.GLOBAL_AVG_POOL,
    Op.REDUCE_LOG_SUM_EXP, Op.ISNAN, Op.ISINF, Op.HARDMAX, Op.REDUCE_LOG_SUM, Op.LP_POOL,
    Op.LRN, Op.DET,
})
BOOL_ONLY = frozenset({Op.NOT, Op.AND, Op.OR, Op.XOR})
SAME_DTYPE = BINARY | COMPARE | {Op.MOD, Op.CONCAT}  # all operands of the first one's dtype
# The operators that take an Epilogue (and, with a residual, a 4th operand).
EPILOGUE_OPS = frozenset({Op.CONV, Op.GEMM, Op.MATMUL})

SIGNATURES: dict[Op, Signature] = {
    Op.INPUT: Signature(0, 0, o.InputAttrs), Op.CONST: Signature(0, 0, o.ConstAttrs),
    **{op: Signature(1, 1, o.NoAttrs) for op in UNARY | {Op.CAST, Op.ISNAN}},
    **{op: Signature(1, 1, o.AlphaAttrs)
       for op in (Op.LEAKY_RELU, Op.ELU, Op.CELU, Op.THRESHOLDED_RELU)},
    Op.SELU: Signature(1, 1, o.SeluAttrs), Op.HARD_SIGMOID: Signature(1, 1, o.HardSigmoidAttrs),
    Op.GELU: Signature(1, 1, o.GeluAttrs), Op.CLIP: Signature(1, 1, o.ClipAttrs),
    **{op: Signature(2, 2, o.NoAttrs) for op in BINARY | COMPARE | {Op.POW}},
    Op.MOD: Signature(2, 2, o.ModAttrs), Op.WHERE: Signature(3, 3, o.NoAttrs),
    # MATMUL, GEMM and CONV take one more operand, the residual, with an Epilogue(residual=True).
    Op.MATMUL: Signature(2, 4, (o.NoAttrs, o.MatMulAttrs)), Op.GEMM: Signature(2, 4, o.GemmAttrs),
    Op.CONV: Signature(2, 4, o.ConvAttrs),
    Op.CONV_TRANSPOSE: Signature(2, 3, o.ConvTransposeAttrs),
    Op.MAX_POOL: Signature(1, 1, o.PoolAttrs), Op.AVG_POOL: Signature(1, 1, o.PoolAttrs),
    Op.MAX_POOL_INDEX: Signature(1, 1, o.PoolAttrs), Op.COL2IM: Signature(1, 1, o.ConvAttrs),
    Op.GLOBAL_AVG_POOL: Signature(1, 1, o.NoAttrs), Op.GLOBAL_MAX_POOL: Signature(1, 1, o.NoAttrs),
    Op.BATCH_NORM: Signature(5, 5, o.EpsilonAttrs), Op.LAYER_NORM: Signature(2, 3, o.EpsilonAttrs),
    Op.SOFTMAX: Signature(1, 1, o.AxisAttrs), Op.LOG_SOFTMAX: Signature(1, 1, o.AxisAttrs),
    Op.RESHAPE: Signature(1, 1, o.NoAttrs), Op.TRANSPOSE: Signature(1, 1, o.TransposeAttrs),
    Op.CONCAT: Signature(1, 1 << 30, o.AxisAttrs), Op.PAD: Signature(1, 1, o.PadAttrs),
    Op.SLICE: Signature(1, 1, o.SliceAttrs), Op.GATHER: Signature(2, 2, o.AxisAttrs),
    Op.EXPAND: Signature(1, 1, o.NoAttrs), Op.TILE: Signature(1, 1, o.TileAttrs),
    **{op: Signature(1, 1, o.ReduceAttrs) for op in REDUCE},
    Op.ARGMAX: Signature(1, 1, o.ArgAttrs), Op.ARGMIN: Signature(1, 1, o.ArgAttrs),
    Op.QUANTIZE_LINEAR: Signature(3, 3, o.AxisAttrs),
    Op.DEQUANTIZE_LINEAR: Signature(3, 3, o.AxisAttrs),
    Op.QLINEAR_CONV: Signature(8, 9, o.ConvAttrs), Op.QLINEAR_MATMUL: Signature(8, 8, o.NoAttrs),
    Op.MATMUL_INTEGER: Signature(4, 4, o.NoAttrs), Op.CONV_INTEGER: Signature(4, 4, o.ConvAttrs),
    Op.REQUANTIZE: Signature(1, 2, o.RequantAttrs),
    Op.ISINF: Signature(1, 1, o.IsInfAttrs), Op.TRILU: Signature(1, 1, o.TriluAttrs),
    Op.GATHER_ELEMENTS: Signature(2, 2, o.AxisAttrs), Op.HARDMAX: Signature(1, 1, o.AxisAttrs),
    Op.CUMSUM: Signature(1, 1, o.CumAttrs), Op.CUMPROD: Signature(1, 1, o.CumAttrs),
    Op.GATHER_ND: Signature(2, 2, o.GatherNdAttrs), Op.TOPK: Signature(1, 1, o.TopKAttrs),
    Op.RESIZE: Signature(1, 1, o.ResizeAttrs), Op.LP_POOL: Signature(1, 1, o.LpPoolAttrs),
    Op.GRID_SAMPLE: Signature(2, 2, o.GridSampleAttrs),
    Op.LRN: Signature(1, 1, o.LrnAttrs), Op.EINSUM: Signature(1, 1 << 30, o.EinsumAttrs),
    Op.DET: Signature(1, 1, o.NoAttrs),
    Op.REVERSE_SEQUENCE: Signature(2, 2, o.ReverseSequenceAttrs),
    Op.SCATTER_ELEMENTS: Signature(3, 3, o.ScatterAttrs),
    Op.SCATTER_ND: Signature(3, 3, o.ScatterAttrs),
    Op.FUSED_ELEMENTWISE: Signature(1, 1 << 30, o.FusedElementwiseAttrs),
}
assert set(SIGNATURES) == set(Op), set(Op) - set(SIGNATURES)


def broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError:
        raise InferError(f"shapes {[list(s) for s in shapes]} do not broadcast") from None


def matmul_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """numpy.matmul's result shape (1-D operands are promoted and the added axis dropped)."""
    if not a or not b:
        raise InferError("matmul operands must have rank >= 1")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise InferError(f"matmul inner dimensions differ: {list(a)} @ {list(b)}")
    out = (*broadcast(a2[:-2], b2[:-2]), a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def window_out(size: int, k: int, s: int, pb: int, pe: int, d: int, ceil_mode: bool) -> int:
    """Output length of a sliding window (conv or pool) along one axis."""
    span = (k - 1) * d + 1
    num = size + pb + pe - span
    if num < 0:
        raise InferError(f"window {span} is larger than the padded input {size + pb + pe}")
    out = (math.ceil(num / s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + pb:
        out -= 1  # the last window would start inside the end padding
    return out


def _check_window(a: o.ConvAttrs | o.PoolAttrs) -> None:
    if (min(a.kernel, default=1) < 1 or min(a.strides, default=1) < 1
            or min(a.dilations, default=1) < 1 or min(a.pads, default=0) < 0):
        raise InferError(f"kernel, strides and dilations must be >= 1 and pads >= 0: {a}")


def conv_shape(x: Sequence[int], w: Sequence[int], a: o.ConvAttrs) -> tuple[int, ...]:
    _check_window(a)
    nsp = len(x) - 2
    if len(w) != len(x) or nsp < 1:
        raise InferError(f"conv input {list(x)} and weights {list(w)} need equal rank >= 3")
    if not (len(a.kernel) == len(a.strides) == len(a.dilations) == nsp
            and len(a.pads) == 2 * nsp):
        raise InferError(f"conv attributes {a} do not match {nsp} spatial axes")
    if tuple(w[2:]) != a.kernel:
        raise InferError(f"weights {list(w)} do not match kernel {list(a.kernel)}")
    if a.group < 1 or x[1] != w[1] * a.group or w[0] % a.group:
        raise InferError(f"channels: input {x[1]}, weights {list(w[:2])}, group {a.group}")
    sp = [window_out(x[2 + i], a.kernel[i], a.strides[i], a.pads[i], a.pads[nsp + i],
                     a.dilations[i], False) for i in range(nsp)]
    return (x[0], w[0], *sp)


def _float(op: Op, d: DType) -> None:
    if not d.is_float:
        raise InferError(f"{op.name} needs a float operand, got {d.value}")


def _check_axis(axis: int, rank: int) -> None:
    if not 0 <= axis < rank:
        raise InferError(f"axis {axis} out of range for rank {rank}")


Typed = tuple[DType, tuple[int, ...]]
A = TypeVar("A", bound=o.Attrs)


@dataclass(frozen=True, slots=True)
class Call:
    """One application of an operator, as a type rule sees it. dtype and shape are the values
    the caller declares (None: not declared). By the time a rule runs, `infer` has checked src
    against SIGNATURES[op], the attribute class, the epilogue, and the generic dtype sets."""

    op: Op
    src: Sequence[o.Node]
    attrs: o.Attrs
    dtype: DType | None = None
    shape: tuple[int, ...] | None = None

    @property
    def d0(self) -> DType:
        """The first operand's dtype."""
        return self.src[0].dtype

    @property
    def s0(self) -> tuple[int, ...]:
        """The first operand's shape."""
        return self.src[0].shape

    def attrs_as(self, cls: type[A]) -> A:
        assert isinstance(self.attrs, cls), (self.op, self.attrs)
        return self.attrs


# A type rule: the (dtype, shape) of one call, or InferError saying what is wrong with it.
Rule = Callable[[Call], Typed]


def infer(op: Op, src: Sequence[o.Node], attrs: o.Attrs,
          dtype: DType | None = None, shape: tuple[int, ...] | None = None) -> Typed:
    """(dtype, shape) of op applied to src. dtype/shape are the declared values; they are
    required for CAST (dtype), RESHAPE and EXPAND (shape) and are checked for the others."""
    sig = SIGNATURES[op]
    if not sig.min_src <= len(src) <= sig.max_src:
        raise InferError(f"{op.name} takes {sig.min_src}..{sig.max_src} operands, "
                         f"got {len(src)}")
    if not isinstance(attrs, sig.attrs):
        raise InferError(f"{op.name} takes {sig.attrs_name}, got {type(attrs).__name__}")
    ep = getattr(attrs, "epilogue", o.NO_EPILOGUE)
    if ep != o.NO_EPILOGUE:
        if op not in EPILOGUE_OPS:
            raise InferError(f"{op.name} takes no epilogue, got {ep}")
        return _infer_epilogue(op, src, attrs, ep, dtype, shape)
    if op in EPILOGUE_OPS and len(src) > 3:
        raise InferError(f"{op.name} takes a 4th operand only as the residual of an epilogue")
    _check_dtypes(op, src)
    return RULES[op](Call(op, src, attrs, dtype, shape))


def _check_dtypes(op: Op, src: Sequence[o.Node]) -> None:
    """The checks of FLOAT_ONLY, INT_ONLY, BOOL_ONLY and SAME_DTYPE, in that order."""
    if not src:
        return  # INPUT and CONST, which are in none of the sets
    d0 = src[0].dtype
    if op in FLOAT_ONLY:
        _float(op, d0)
    if op in INT_ONLY and not d0.is_int:
        raise InferError(f"{op.name} needs integer operands")
    if op in BOOL_ONLY and any(s.dtype is not DType.BOOL for s in src):
        raise InferError(f"{op.name} needs bool operands")
    if op in SAME_DTYPE and any(s.dtype is not d0 for s in src):
        raise InferError(f"{op.name} operands differ in dtype: {[s.dtype.value for s in src]}")


def _input(c: Call) -> Typed:
    if c.dtype is None or c.shape is None:
        raise InferError("INPUT needs a declared dtype and shape")
    return c.dtype, c.shape


def _const(c: Call) -> Typed:
    value = c.attrs_as(o.ConstAttrs).value
    return DType.from_numpy(value.dtype), tuple(value.shape)


REQUANT_OUT = (DType.INT8, DType.UINT8, DType.INT32)


def _requantize(c: Call) -> Typed:
    a = c.attrs_as(o.RequantAttrs)
    if c.d0 is not DType.INT32:
        raise InferError(f"REQUANTIZE takes an int32 operand, got {c.d0.value}")
    if c.dtype not in REQUANT_OUT:
        raise InferError(f"REQUANTIZE makes one of {[d.value for d in REQUANT_OUT]}, got "
                         f"{c.dtype.value if c.dtype else None}")
    _check_axis(a.axis, len(c.s0))
    ch = c.s0[a.axis]
    if len(c.src) == 2 and (c.src[1].dtype is not DType.INT32 or c.src[1].shape != (ch,)):
        raise InferError(f"REQUANTIZE bias must be int32 of shape ({ch},) (axis {a.axis}), got "
                         f"{c.src[1].dtype.value}{list(c.src[1].shape)}")
    for what, vals in (("multiplier", a.multiplier), ("shift", a.shift), ("clamp", a.clamp),
                       ("pre_shift", a.pre_shift)):
        if len(vals) not in (1, ch):
            raise InferError(f"REQUANTIZE {what} has {len(vals)} values, expected 1 or {ch} "
                             f"(the size of axis {a.axis})")
    if any(not -(1 << 31) <= m < (1 << 31) for m in a.multiplier):
        raise InferError(f"REQUANTIZE multipliers must fit int32, got {list(a.multiplier)}")
    if any(not 0 <= s <= 31 for s in a.shift):
        raise InferError(f"REQUANTIZE shifts must be in 0..31, got {list(a.shift)}")
    if any(not 0 <= s <= 30 for s in a.pre_shift):
        raise InferError(f"REQUANTIZE pre-shifts must be in 0..30, got {list(a.pre_shift)}")
    if any(not 0 <= v < (1 << 31) for v in a.clamp):
        raise InferError(f"REQUANTIZE clamps must be in 0..2**31-1 (0: none), got "
                         f"{list(a.clamp)}")
    info = np.iinfo(c.dtype.np)
    if not info.min <= a.zero_point <= info.max:
        raise InferError(f"REQUANTIZE zero point {a.zero_point} is outside {c.dtype.value}'s "
                         f"[{info.min}, {info.max}]")
    if not info.min <= a.lo <= a.hi <= info.max:
        raise InferError(f"REQUANTIZE bounds [{a.lo}, {a.hi}] are not an interval within "
                         f"{c.dtype.value}'s [{info.min}, {info.max}]")
    return c.dtype, c.s0


def _cast(c: Call) -> Typed:
    if c.dtype is None:
        raise InferError("CAST needs a declared dtype")
    return c.dtype, c.s0


def _unary(c: Call) -> Typed:
    return c.d0, c.s0


def _predicate(c: Call) -> Typed:
    return DType.BOOL, c.s0


def _along_axis(c: Call) -> Typed:
    a = c.attrs
    assert isinstance(a, (o.AxisAttrs, o.CumAttrs))
    _check_axis(a.axis, len(c.s0))
    return c.d0, c.s0


def _binary(c: Call) -> Typed:
    return c.d0, broadcast(*(s.shape for s in c.src))


def _compare(c: Call) -> Typed:
    return DType.BOOL, broadcast(*(s.shape for s in c.src))


def _where(c: Call) -> Typed:
    cond, x, y = c.src
    if cond.dtype is not DType.BOOL or x.dtype is not y.dtype:
        raise InferError("WHERE needs a bool condition and two operands of one dtype")
    return x.dtype, broadcast(*(s.shape for s in c.src))


def _matmul(c: Call) -> Typed:
    if len(c.src) == 3 and not isinstance(c.attrs, o.MatMulAttrs):
        raise InferError("MATMUL with a bias operand needs MatMulAttrs")
    d0 = c.d0
    if c.src[1].dtype is not d0:
        raise InferError("MATMUL operands differ in dtype")
    out = matmul_shape(c.s0, c.src[1].shape)
    if len(c.src) == 3:
        bias = c.src[2]
        if not out or bias.shape != out[-1:] or bias.dtype is not d0:
            raise InferError(f"MATMUL bias {bias.dtype.value}{list(bias.shape)}, expected "
                             f"{d0.value}{list(out[-1:])}")
    return d0, out


def _gemm(c: Call) -> Typed:
    attrs = c.attrs_as(o.GemmAttrs)
    a, b = c.s0, c.src[1].shape
    if len(a) != 2 or len(b) != 2:
        raise InferError(f"GEMM needs 2-D operands, got {list(a)} and {list(b)}")
    m, k = (a[1], a[0]) if attrs.trans_a else a
    k2, n = (b[1], b[0]) if attrs.trans_b else b
    if k != k2:
        raise InferError(f"GEMM inner dimensions differ: {k} and {k2}")
    if len(c.src) == 3:
        broadcast(c.src[2].shape, (m, n))
    return c.d0, (m, n)


def _conv(c: Call) -> Typed:
    w = c.src[1].shape
    out = conv_shape(c.s0, w, c.attrs_as(o.ConvAttrs))
    if len(c.src) == 3 and c.src[2].shape != (w[0],):
        raise InferError(f"bias shape {list(c.src[2].shape)}, expected [{w[0]}]")
    return c.d0, out


def _conv_integer(c: Call) -> Typed:
    return DType.INT32, conv_shape(c.s0, c.src[1].shape, c.attrs_as(o.ConvAttrs))


def _qlinear_conv(c: Call) -> Typed:
    # Operands: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point[, bias].
    out = conv_shape(c.s0, c.src[3].shape, c.attrs_as(o.ConvAttrs))
    return c.src[7].dtype, out


def _conv_transpose(c: Call) -> Typed:
    attrs, s0 = c.attrs_as(o.ConvTransposeAttrs), c.s0
    ws, nsp = c.src[1].shape, len(s0) - 2
    if len(ws) != len(s0) or nsp < 1 or ws[0] != s0[1] or s0[1] % attrs.group:
        raise InferError(f"input {list(s0)} and weights {list(ws)} do not fit group "
                         f"{attrs.group}")
    if tuple(ws[2:]) != attrs.kernel or len(attrs.pads) != 2 * nsp:
        raise InferError(f"attributes {attrs} do not match weights {list(ws)}")
    out_sp = tuple(attrs.strides[i] * (s0[2 + i] - 1) + attrs.output_padding[i]
                   + (attrs.kernel[i] - 1) * attrs.dilations[i] + 1 - attrs.pads[i]
                   - attrs.pads[nsp + i] for i in range(nsp))
    if min(out_sp) < 1:
        raise InferError(f"output size {list(out_sp)} is empty")
    c_out = ws[1] * attrs.group
    if len(c.src) == 3 and c.src[2].shape != (c_out,):
        raise InferError(f"bias shape {list(c.src[2].shape)}, expected [{c_out}]")
    return c.d0, (s0[0], c_out, *out_sp)


def _pool(c: Call) -> Typed:
    attrs, s0 = c.attrs_as(o.PoolAttrs), c.s0
    nsp = len(s0) - 2
    if nsp < 1 or len(attrs.kernel) != nsp or len(attrs.pads) != 2 * nsp:
        raise InferError(f"pool attributes {attrs} do not match input {list(s0)}")
    _check_window(attrs)
    sp = [window_out(s0[2 + i], attrs.kernel[i], attrs.strides[i], attrs.pads[i],
                     attrs.pads[nsp + i], attrs.dilations[i], attrs.ceil_mode)
          for i in range(nsp)]
    return c.d0, (*s0[:2], *sp)


def _max_pool_index(c: Call) -> Typed:
    return DType.INT64, infer(Op.MAX_POOL, c.src, c.attrs)[1]


def _lp_pool(c: Call) -> Typed:
    # Through infer, so that the nested PoolAttrs are checked like MAX_POOL's own.
    return infer(Op.MAX_POOL, c.src, c.attrs_as(o.LpPoolAttrs).pool)


def _global_pool(c: Call) -> Typed:
    s0 = c.s0
    if len(s0) < 3:
        raise InferError(f"{c.op.name} needs rank >= 3, got {list(s0)}")
    return c.d0, (*s0[:2], *([1] * (len(s0) - 2)))


def _col2im(c: Call) -> Typed:
    attrs, s0, shape = c.attrs_as(o.ConvAttrs), c.s0, c.shape
    if shape is None or len(s0) != 3 or len(shape) != 2 + len(attrs.kernel):
        raise InferError(f"COL2IM needs input [N, C * block, L] and a declared image shape, "
                         f"got {list(s0)} -> {shape}")
    cols = conv_shape(shape, (1, shape[1], *attrs.kernel), attrs)[2:]
    if s0 != (shape[0], shape[1] * math.prod(attrs.kernel), math.prod(cols)):
        raise InferError(f"COL2IM input {list(s0)} does not match image {list(shape)} and "
                         f"blocks {list(attrs.kernel)}")
    return c.d0, shape


def _batch_norm(c: Call) -> Typed:
    s0 = c.s0
    if len(s0) < 2 or any(s.shape != (s0[1],) for s in c.src[1:]):
        raise InferError(f"BATCH_NORM parameters must have shape [{s0[1:2]}]")
    return c.d0, s0


def _layer_norm(c: Call) -> Typed:
    axis, s0 = c.attrs_as(o.EpsilonAttrs).axis, c.s0
    _check_axis(axis, len(s0))
    for s in c.src[1:]:
        broadcast(s.shape, s0[axis:])
    return c.d0, s0


def _lrn(c: Call) -> Typed:
    if len(c.s0) < 3:
        raise InferError(f"LRN needs rank >= 3, got {list(c.s0)}")
    return c.d0, c.s0


def _reshape(c: Call) -> Typed:
    if c.shape is None or math.prod(c.shape) != math.prod(c.s0):
        raise InferError(f"cannot reshape {list(c.s0)} to {c.shape}")
    return c.d0, c.shape


def _expand(c: Call) -> Typed:
    if c.shape is None or broadcast(c.s0, c.shape) != c.shape:
        raise InferError(f"cannot expand {list(c.s0)} to {c.shape}")
    return c.d0, c.shape


def _transpose(c: Call) -> Typed:
    perm, s0 = c.attrs_as(o.TransposeAttrs).perm, c.s0
    if sorted(perm) != list(range(len(s0))):
        raise InferError(f"perm {list(perm)} is not a permutation of rank {len(s0)}")
    return c.d0, tuple(s0[p] for p in perm)


def _concat(c: Call) -> Typed:
    ax, s0 = c.attrs_as(o.AxisAttrs).axis, c.s0
    _check_axis(ax, len(s0))
    for s in c.src:
        if len(s.shape) != len(s0) or s.shape[:ax] + s.shape[ax + 1:] != s0[:ax] + s0[ax + 1:]:
            raise InferError(f"CONCAT shapes differ off axis {ax}: "
                             f"{[list(s.shape) for s in c.src]}")
    return c.d0, (*s0[:ax], sum(s.shape[ax] for s in c.src), *s0[ax + 1:])


def _pad(c: Call) -> Typed:
    attrs, s0 = c.attrs_as(o.PadAttrs), c.s0
    r = len(s0)
    if len(attrs.pads) != 2 * r or attrs.mode not in ("constant", "reflect", "edge", "wrap"):
        raise InferError(f"PAD pads {list(attrs.pads)} / mode {attrs.mode!r} invalid for "
                         f"rank {r}")
    out = tuple(s0[i] + attrs.pads[i] + attrs.pads[r + i] for i in range(r))
    if min(out, default=0) < 0:
        raise InferError(f"PAD crops {list(s0)} below zero")
    return c.d0, out


def _slice(c: Call) -> Typed:
    attrs = c.attrs_as(o.SliceAttrs)
    if not len(attrs.starts) == len(attrs.ends) == len(attrs.steps) == len(c.s0):
        raise InferError(f"SLICE needs one start/end/step per axis of {list(c.s0)}")
    if 0 in attrs.steps:
        raise InferError("SLICE step 0")
    return c.d0, tuple(len(range(b, e, st))
                       for b, e, st in zip(attrs.starts, attrs.ends, attrs.steps))


def _gather(c: Call) -> Typed:
    axis, s0, idx = c.attrs_as(o.AxisAttrs).axis, c.s0, c.src[1]
    if not 0 <= axis < len(s0) or idx.dtype not in (DType.INT32, DType.INT64):
        raise InferError(f"GATHER axis {axis} / indices {idx.dtype.value} invalid")
    return c.d0, (*s0[:axis], *idx.shape, *s0[axis + 1:])


def _gather_elements(c: Call) -> Typed:
    axis, s0, ish = c.attrs_as(o.AxisAttrs).axis, c.s0, c.src[1].shape
    if len(ish) != len(s0) or not 0 <= axis < len(s0):
        raise InferError(f"GATHER_ELEMENTS indices {list(ish)} / axis {axis} invalid for data "
                         f"{list(s0)}")
    return c.d0, ish


def _gather_nd(c: Call) -> Typed:
    s0, ish, nb = c.s0, c.src[1].shape, c.attrs_as(o.GatherNdAttrs).batch_dims
    if not ish or ish[-1] > len(s0) - nb or ish[:nb] != s0[:nb]:
        raise InferError(f"GATHER_ND indices {list(ish)} invalid for data {list(s0)}")
    return c.d0, (*ish[:-1], *s0[nb + ish[-1]:])


def _scatter(c: Call) -> Typed:
    reduction, updates = c.attrs_as(o.ScatterAttrs).reduction, c.src[2]
    if updates.dtype is not c.d0 or reduction not in ("none", "add", "mul", "max", "min"):
        raise InferError(f"{c.op.name} updates {updates.dtype.value} / reduction "
                         f"{reduction!r} invalid")
    return c.d0, c.s0


def _tile(c: Call) -> Typed:
    repeats, s0 = c.attrs_as(o.TileAttrs).repeats, c.s0
    if len(repeats) != len(s0) or min(repeats, default=0) < 0:
        raise InferError(f"TILE repeats {list(repeats)} invalid for {list(s0)}")
    return c.d0, tuple(a * b for a, b in zip(s0, repeats))


def _reduce(c: Call) -> Typed:
    attrs, s0 = c.attrs_as(o.ReduceAttrs), c.s0
    axes = attrs.axes
    if not axes or list(axes) != sorted(set(axes)) or axes[0] < 0 or axes[-1] >= len(s0):
        raise InferError(f"reduction axes {list(axes)} invalid for rank {len(s0)}")
    return c.d0, tuple(1 if i in axes else d for i, d in enumerate(s0)
                       if attrs.keepdims or i not in axes)


def _arg_reduce(c: Call) -> Typed:
    attrs, s0 = c.attrs_as(o.ArgAttrs), c.s0
    _check_axis(attrs.axis, len(s0))
    return DType.INT64, tuple(1 if i == attrs.axis else d for i, d in enumerate(s0)
                              if attrs.keepdims or i != attrs.axis)


def _topk(c: Call) -> Typed:
    attrs, s0 = c.attrs_as(o.TopKAttrs), c.s0
    if not 0 <= attrs.axis < len(s0) or not 0 <= attrs.k <= s0[attrs.axis]:
        raise InferError(f"TOPK axis {attrs.axis} / k {attrs.k} invalid for {list(s0)}")
    return DType.INT64, (*s0[:attrs.axis], attrs.k, *s0[attrs.axis + 1:])


def _quantize(c: Call) -> Typed:
    """QUANTIZE_LINEAR (result: the zero point's dtype) and DEQUANTIZE_LINEAR (the scale's)."""
    axis, s0 = c.attrs_as(o.AxisAttrs).axis, c.s0
    scale, zp = c.src[1], c.src[2]
    if scale.shape != zp.shape or scale.rank > 1 or (
            scale.rank == 1 and (axis >= len(s0) or s0[axis] != scale.shape[0])):
        raise InferError(f"scale {list(scale.shape)} / zero point {list(zp.shape)} do not "
                         f"fit input {list(s0)} on axis {axis}")
    _float(c.op, scale.dtype)
    return (zp.dtype if c.op is Op.QUANTIZE_LINEAR else scale.dtype), s0


def _qlinear_matmul(c: Call) -> Typed:
    # Operands: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point.
    return c.src[7].dtype, matmul_shape(c.s0, c.src[3].shape)


def _matmul_integer(c: Call) -> Typed:
    return DType.INT32, matmul_shape(c.s0, c.src[1].shape)


def _trilu(c: Call) -> Typed:
    if len(c.s0) < 2:
        raise InferError(f"TRILU needs rank >= 2, got {list(c.s0)}")
    return c.d0, c.s0


def _det(c: Call) -> Typed:
    s0 = c.s0
    if len(s0) < 2 or s0[-1] != s0[-2]:
        raise InferError(f"DET needs square matrices in the last two axes, got {list(s0)}")
    return c.d0, s0[:-2]


def _reverse_sequence(c: Call) -> Typed:
    attrs, s0, lengths = c.attrs_as(o.ReverseSequenceAttrs), c.s0, c.src[1].shape
    ba, ta = attrs.batch_axis, attrs.time_axis
    if {ba, ta} != {0, 1} or len(s0) < 2 or lengths != (s0[ba],):
        raise InferError(f"REVERSE_SEQUENCE axes {ba}, {ta} / lengths {list(lengths)} "
                         f"invalid for {list(s0)}")
    return c.d0, s0


def _einsum(c: Call) -> Typed:
    equation = c.attrs_as(o.EinsumAttrs).equation
    try:
        # Shapes only: einsum over zero-strided views costs nothing.
        views = [np.broadcast_to(np.zeros((), s.dtype.np), s.shape) for s in c.src]
        out = np.einsum(equation, *views).shape
    except ValueError as e:
        raise InferError(f"EINSUM {equation!r} on {[list(s.shape) for s in c.src]}: "
                         f"{e}") from None
    if any(s.dtype is not c.d0 for s in c.src):
        raise InferError("EINSUM operands differ in dtype")
    return c.d0, tuple(int(d) for d in out)


def _grid_sample(c: Call) -> Typed:
    attrs, s0, g = c.attrs_as(o.GridSampleAttrs), c.s0, c.src[1].shape
    if len(g) != len(s0) or g[0] != s0[0] or g[-1] != len(s0) - 2 or (
            attrs.mode not in ("nearest", "linear", "cubic")
            or attrs.padding_mode not in ("zeros", "border", "reflection")):
        raise InferError(f"GRID_SAMPLE grid {list(g)} / {attrs} invalid for {list(s0)}")
    _float(c.op, c.d0)
    return c.d0, (s0[0], s0[1], *g[1:-1])


def _resize(c: Call) -> Typed:
    attrs, s0, shape = c.attrs_as(o.ResizeAttrs), c.s0, c.shape
    if shape is None or len(shape) != len(s0) or len(attrs.scales) != len(s0):
        raise InferError(f"RESIZE needs a declared shape and one scale per axis of "
                         f"{list(s0)}")
    if attrs.mode not in ("nearest", "linear", "cubic") or attrs.coordinate_mode not in (
            "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
            "asymmetric", "tf_crop_and_resize") or attrs.nearest_mode not in (
            "round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        raise InferError(f"RESIZE modes invalid: {attrs}")
    return c.d0, shape


def _infer_epilogue(op: Op, src: Sequence[o.Node], attrs: o.Attrs, ep: o.Epilogue,
                    dtype: DType | None, shape: tuple[int, ...] | None) -> Typed:
    """CONV/GEMM/MATMUL with a non-default epilogue: check it, then type the plain op."""
    if ep.activation is not None and ep.activation not in o.EPILOGUE_ACTIVATIONS:
        raise InferError(f"epilogue activation {ep.activation!r}; supported: "
                         f"{sorted(o.EPILOGUE_ACTIVATIONS)}")
    if ep.activation != "clip" and (ep.clip_min is not None or ep.clip_max is not None):
        raise InferError(f"clip bounds on a {ep.activation} epilogue")
    if ep.activation != "leaky_relu" and ep.alpha != 0.0:
        raise InferError(f"alpha on a {ep.activation} epilogue")
    plain = list(src)
    if ep.residual:
        if len(src) != 4:
            raise InferError(f"{op.name} with a residual takes 4 operands (the bias is "
                             f"required, then the residual), got {len(src)}")
        plain = plain[:3]
    base = dataclasses.replace(attrs, epilogue=o.NO_EPILOGUE)  # type: ignore[call-arg]
    d, s = infer(op, plain, base, dtype, shape)
    if not d.is_float:
        raise InferError(f"{op.name} epilogues need a float result, got {d.value}")
    if ep.residual and (src[3].dtype is not d or src[3].shape != s):
        raise InferError(f"residual {src[3].dtype.value}{list(src[3].shape)}, expected "
                         f"{d.value}{list(s)}")
    return d, s


def _fused(c: Call) -> Typed:
    src, attrs = c.src, c.attrs_as(o.FusedElementwiseAttrs)
    if any(s.dtype is not DType.FLOAT32 for s in src):
        raise InferError(f"FUSED_ELEMENTWISE operands must be float32, got "
                         f"{[s.dtype.value for s in src]}")
    if not attrs.program:
        raise InferError("FUSED_ELEMENTWISE program is empty")
    for i, step in enumerate(attrs.program):
        if not (isinstance(step, tuple) and len(step) == 3):
            raise InferError(f"step {i} is {step!r}, expected (name, indices, constants)")
        name, idx, consts = step
        n_idx, n_const = len(idx), len(consts)
        if name in o.FUSED_UNARY:
            ok = (n_idx, n_const) == (1, 0)
        elif name in o.FUSED_BINARY:
            ok = (n_idx, n_const) in ((2, 0), (1, 1))
        elif name in o.FUSED_PARAMETRIC:
            ok = (n_idx, n_const) == (1, o.FUSED_PARAMETRIC[name])
        else:
            raise InferError(f"step {i}: unknown operation {name!r}")
        if not ok:
            raise InferError(f"step {i}: {name} cannot take {n_idx} indices and {n_const} "
                             f"constants")
        if any(not isinstance(j, int) or not 0 <= j < len(src) + i for j in idx):
            raise InferError(f"step {i}: indices {list(idx)} must name operands or earlier "
                             f"steps (< {len(src) + i})")
    return DType.FLOAT32, broadcast(*(s.shape for s in src))


RULES: dict[Op, Rule] = {
    Op.INPUT: _input, Op.CONST: _const, Op.CAST: _cast, Op.REQUANTIZE: _requantize,
    **{op: _unary for op in UNARY | PARAMETRIC_UNARY},
    Op.ISNAN: _predicate, Op.ISINF: _predicate,
    **{op: _binary for op in BINARY | {Op.POW, Op.MOD}},
    **{op: _compare for op in COMPARE},
    Op.WHERE: _where,
    Op.MATMUL: _matmul, Op.GEMM: _gemm,
    Op.CONV: _conv, Op.CONV_INTEGER: _conv_integer, Op.QLINEAR_CONV: _qlinear_conv,
    Op.CONV_TRANSPOSE: _conv_transpose, Op.COL2IM: _col2im,
    Op.MAX_POOL: _pool, Op.AVG_POOL: _pool, Op.MAX_POOL_INDEX: _max_pool_index,
    Op.LP_POOL: _lp_pool, Op.GLOBAL_AVG_POOL: _global_pool, Op.GLOBAL_MAX_POOL: _global_pool,
    Op.BATCH_NORM: _batch_norm, Op.LAYER_NORM: _layer_norm, Op.LRN: _lrn,
    **{op: _along_axis
       for op in (Op.SOFTMAX, Op.LOG_SOFTMAX, Op.HARDMAX, Op.CUMSUM, Op.CUMPROD)},
    Op.RESHAPE: _reshape, Op.EXPAND: _expand, Op.TRANSPOSE: _transpose, Op.CONCAT: _concat,
    Op.PAD: _pad, Op.SLICE: _slice, Op.TILE: _tile, Op.GATHER: _gather,
    Op.GATHER_ELEMENTS: _gather_elements, Op.GATHER_ND: _gather_nd,
    Op.SCATTER_ELEMENTS: _scatter, Op.SCATTER_ND: _scatter,
    **{op: _reduce for op in REDUCE},
    Op.ARGMAX: _arg_reduce, Op.ARGMIN: _arg_reduce, Op.TOPK: _topk,
    Op.QUANTIZE_LINEAR: _quantize, Op.DEQUANTIZE_LINEAR: _quantize,
    Op.QLINEAR_MATMUL: _qlinear_matmul, Op.MATMUL_INTEGER: _matmul_integer,
    Op.TRILU: _trilu, Op.DET: _det, Op.REVERSE_SEQUENCE: _reverse_sequence,
    Op.EINSUM: _einsum, Op.GRID_SAMPLE: _grid_sample, Op.RESIZE: _resize,
    Op.FUSED_ELEMENTWISE: _fused,
}
assert set(RULES) == set(Op), set(Op) - set(RULES)
