"""Type rules: the dtype and shape each operator produces from its operands and attributes.

`infer` is used by the frontend to build nodes and by the verifier to check them. It raises
`InferError` with a message saying what is wrong; callers add the node's name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

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


def infer(op: Op, src: Sequence[o.Node], attrs: o.Attrs,
          dtype: DType | None = None, shape: tuple[int, ...] | None = None
          ) -> tuple[DType, tuple[int, ...]]:
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
        if op not in (Op.CONV, Op.GEMM, Op.MATMUL):
            raise InferError(f"{op.name} takes no epilogue, got {ep}")
        return _infer_epilogue(op, src, attrs, ep, dtype, shape)
    if op in (Op.CONV, Op.GEMM, Op.MATMUL) and len(src) > 3:
        raise InferError(f"{op.name} takes a 4th operand only as the residual of an epilogue")
    if op is Op.MATMUL and len(src) == 3 and not isinstance(attrs, o.MatMulAttrs):
        raise InferError("MATMUL with a bias operand needs MatMulAttrs")
    if op is Op.FUSED_ELEMENTWISE:
        assert isinstance(attrs, o.FusedElementwiseAttrs)
        return _infer_fused(src, attrs)
    d0 = src[0].dtype if src else None
    s0 = src[0].shape if src else ()
    if op in FLOAT_ONLY:
        _float(op, d0)  # type: ignore[arg-type]
    if op in INT_ONLY and not d0.is_int:  # type: ignore[union-attr]
        raise InferError(f"{op.name} needs integer operands")
    if op in BOOL_ONLY and any(s.dtype is not DType.BOOL for s in src):
        raise InferError(f"{op.name} needs bool operands")
    if op in BINARY | COMPARE | {Op.MOD, Op.CONCAT} and any(s.dtype is not d0 for s in src):
        raise InferError(f"{op.name} operands differ in dtype: {[s.dtype.value for s in src]}")

    if op is Op.INPUT:
        if dtype is None or shape is None:
            raise InferError("INPUT needs a declared dtype and shape")
        return dtype, shape
    if op is Op.CONST:
        assert isinstance(attrs, o.ConstAttrs)
        return DType.from_numpy(attrs.value.dtype), tuple(attrs.value.shape)
    if op is Op.CAST:
        if dtype is None:
            raise InferError("CAST needs a declared dtype")
        return dtype, s0
    if op in (Op.ISNAN, Op.ISINF):
        return DType.BOOL, s0
    if op in (Op.HARDMAX, Op.CUMSUM, Op.CUMPROD):
        assert isinstance(attrs, (o.AxisAttrs, o.CumAttrs))
        ax = attrs.axis
        if not 0 <= ax < len(s0):
            raise InferError(f"axis {ax} out of range for rank {len(s0)}")
        return d0, s0  # type: ignore[return-value]
    if op is Op.LP_POOL:
        assert isinstance(attrs, o.LpPoolAttrs)
        return infer(Op.MAX_POOL, src, attrs.pool)
    if op is Op.LRN:
        if len(s0) < 3:
            raise InferError(f"LRN needs rank >= 3, got {list(s0)}")
        return d0, s0  # type: ignore[return-value]
    if op is Op.DET:
        if len(s0) < 2 or s0[-1] != s0[-2]:
            raise InferError(f"DET needs square matrices in the last two axes, got {list(s0)}")
        return d0, s0[:-2]  # type: ignore[return-value]
    if op is Op.REVERSE_SEQUENCE:
        assert isinstance(attrs, o.ReverseSequenceAttrs)
        ba, ta = attrs.batch_axis, attrs.time_axis
        if {ba, ta} != {0, 1} or len(s0) < 2 or src[1].shape != (s0[ba],):
            raise InferError(f"REVERSE_SEQUENCE axes {ba}, {ta} / lengths {list(src[1].shape)} "
                             f"invalid for {list(s0)}")
        return d0, s0  # type: ignore[return-value]
    if op is Op.EINSUM:
        assert isinstance(attrs, o.EinsumAttrs)
        try:
            # Shapes only: einsum over zero-strided views costs nothing.
            views = [np.broadcast_to(np.zeros((), s.dtype.np), s.shape) for s in src]
            out = np.einsum(attrs.equation, *views).shape
        except ValueError as e:
            raise InferError(f"EINSUM {attrs.equation!r} on {[list(s.shape) for s in src]}: "
                             f"{e}") from None
        if any(s.dtype is not d0 for s in src):
            raise InferError("EINSUM operands differ in dtype")
        return d0, tuple(int(d) for d in out)  # type: ignore[return-value]
    if op is Op.GRID_SAMPLE:
        assert isinstance(attrs, o.GridSampleAttrs)
        g = src[1].shape
        if len(g) != len(s0) or g[0] != s0[0] or g[-1] != len(s0) - 2 or (
                attrs.mode not in ("nearest", "linear", "cubic")
                or attrs.padding_mode not in ("zeros", "border", "reflection")):
            raise InferError(f"GRID_SAMPLE grid {list(g)} / {attrs} invalid for {list(s0)}")
        _float(op, d0)  # type: ignore[arg-type]
        return d0, (s0[0], s0[1], *g[1:-1])  # type: ignore[return-value]
    if op is Op.RESIZE:
        assert isinstance(attrs, o.ResizeAttrs)
        if shape is None or len(shape) != len(s0) or len(attrs.scales) != len(s0):
            raise InferError(f"RESIZE needs a declared shape and one scale per axis of "
                             f"{list(s0)}")
        if attrs.mode not in ("nearest", "linear", "cubic") or attrs.coordinate_mode not in (
                "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize") or attrs.nearest_mode not in (
                "round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
            raise InferError(f"RESIZE modes invalid: {attrs}")
        return d0, shape  # type: ignore[return-value]
    if op is Op.TOPK:
        assert isinstance(attrs, o.TopKAttrs)
        if not 0 <= attrs.axis < len(s0) or not 0 <= attrs.k <= s0[attrs.axis]:
            raise InferError(f"TOPK axis {attrs.axis} / k {attrs.k} invalid for {list(s0)}")
        return DType.INT64, (*s0[:attrs.axis], attrs.k, *s0[attrs.axis + 1:])
    if op in (Op.SCATTER_ELEMENTS, Op.SCATTER_ND):
        assert isinstance(attrs, o.ScatterAttrs)
        if src[2].dtype is not d0 or attrs.reduction not in ("none", "add", "mul", "max", "min"):
            raise InferError(f"{op.name} updates {src[2].dtype.value} / reduction "
                             f"{attrs.reduction!r} invalid")
        return d0, s0  # type: ignore[return-value]
    if op is Op.GATHER_ND:
        assert isinstance(attrs, o.GatherNdAttrs)
        ish, nb = src[1].shape, attrs.batch_dims
        if not ish or ish[-1] > len(s0) - nb or ish[:nb] != s0[:nb]:
            raise InferError(f"GATHER_ND indices {list(ish)} invalid for data {list(s0)}")
        return d0, (*ish[:-1], *s0[nb + ish[-1]:])  # type: ignore[return-value]
    if op is Op.TRILU:
        if len(s0) < 2:
            raise InferError(f"TRILU needs rank >= 2, got {list(s0)}")
        return d0, s0  # type: ignore[return-value]
    if op is Op.GATHER_ELEMENTS:
        assert isinstance(attrs, o.AxisAttrs)
        if len(src[1].shape) != len(s0) or not 0 <= attrs.axis < len(s0):
            raise InferError(f"GATHER_ELEMENTS indices {list(src[1].shape)} / axis "
                             f"{attrs.axis} invalid for data {list(s0)}")
        return d0, src[1].shape  # type: ignore[return-value]
    if op in UNARY or op in (Op.LEAKY_RELU, Op.ELU, Op.SELU, Op.CELU, Op.THRESHOLDED_RELU,
                             Op.HARD_SIGMOID, Op.GELU, Op.CLIP, Op.SOFTMAX, Op.LOG_SOFTMAX):
        if isinstance(attrs, o.AxisAttrs) and not 0 <= attrs.axis < len(s0):
            raise InferError(f"axis {attrs.axis} out of range for rank {len(s0)}")
        return d0, s0  # type: ignore[return-value]
    if op in COMPARE:
        return DType.BOOL, broadcast(*(s.shape for s in src))
    if op in BINARY or op in (Op.POW, Op.MOD):
        return d0, broadcast(*(s.shape for s in src))  # type: ignore[return-value]
    if op is Op.WHERE:
        if src[0].dtype is not DType.BOOL or src[1].dtype is not src[2].dtype:
            raise InferError("WHERE needs a bool condition and two operands of one dtype")
        return src[1].dtype, broadcast(*(s.shape for s in src))
    if op is Op.MATMUL:
        if src[1].dtype is not d0:
            raise InferError("MATMUL operands differ in dtype")
        out = matmul_shape(s0, src[1].shape)
        if len(src) == 3 and (not out or src[2].shape != out[-1:] or src[2].dtype is not d0):
            raise InferError(f"MATMUL bias {src[2].dtype.value}{list(src[2].shape)}, expected "
                             f"{d0.value}{list(out[-1:])}")  # type: ignore[union-attr]
        return d0, out  # type: ignore[return-value]
    if op is Op.GEMM:
        assert isinstance(attrs, o.GemmAttrs)
        a, b = s0, src[1].shape
        if len(a) != 2 or len(b) != 2:
            raise InferError(f"GEMM needs 2-D operands, got {list(a)} and {list(b)}")
        m, k = (a[1], a[0]) if attrs.trans_a else a
        k2, n = (b[1], b[0]) if attrs.trans_b else b
        if k != k2:
            raise InferError(f"GEMM inner dimensions differ: {k} and {k2}")
        if len(src) == 3:
            broadcast(src[2].shape, (m, n))
        return d0, (m, n)  # type: ignore[return-value]
    if op in (Op.CONV, Op.CONV_INTEGER, Op.QLINEAR_CONV):
        assert isinstance(attrs, o.ConvAttrs)
        w = src[3] if op is Op.QLINEAR_CONV else src[1]
        out = conv_shape(s0, w.shape, attrs)
        if op is Op.CONV:
            if len(src) == 3 and src[2].shape != (w.shape[0],):
                raise InferError(f"bias shape {list(src[2].shape)}, expected [{w.shape[0]}]")
            return d0, out  # type: ignore[return-value]
        return (DType.INT32 if op is Op.CONV_INTEGER else src[7].dtype), out
    if op is Op.CONV_TRANSPOSE:
        assert isinstance(attrs, o.ConvTransposeAttrs)
        ws, nsp = src[1].shape, len(s0) - 2
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
        if len(src) == 3 and src[2].shape != (ws[1] * attrs.group,):
            raise InferError(f"bias shape {list(src[2].shape)}, expected [{ws[1] * attrs.group}]")
        return d0, (s0[0], ws[1] * attrs.group, *out_sp)  # type: ignore[return-value]
    if op is Op.MAX_POOL_INDEX:
        return DType.INT64, infer(Op.MAX_POOL, src, attrs)[1]
    if op is Op.COL2IM:
        assert isinstance(attrs, o.ConvAttrs)
        if shape is None or len(s0) != 3 or len(shape) != 2 + len(attrs.kernel):
            raise InferError(f"COL2IM needs input [N, C * block, L] and a declared image shape, "
                             f"got {list(s0)} -> {shape}")
        cols = conv_shape(shape, (1, shape[1], *attrs.kernel), attrs)[2:]
        if s0 != (shape[0], shape[1] * math.prod(attrs.kernel), math.prod(cols)):
            raise InferError(f"COL2IM input {list(s0)} does not match image {list(shape)} and "
                             f"blocks {list(attrs.kernel)}")
        return d0, shape  # type: ignore[return-value]
    if op in (Op.MAX_POOL, Op.AVG_POOL):
        assert isinstance(attrs, o.PoolAttrs)
        nsp = len(s0) - 2
        if nsp < 1 or len(attrs.kernel) != nsp or len(attrs.pads) != 2 * nsp:
            raise InferError(f"pool attributes {attrs} do not match input {list(s0)}")
        _check_window(attrs)
        sp = [window_out(s0[2 + i], attrs.kernel[i], attrs.strides[i], attrs.pads[i],
                         attrs.pads[nsp + i], attrs.dilations[i], attrs.ceil_mode)
              for i in range(nsp)]
        return d0, (*s0[:2], *sp)  # type: ignore[return-value]
    if op in (Op.GLOBAL_AVG_POOL, Op.GLOBAL_MAX_POOL):
        if len(s0) < 3:
            raise InferError(f"{op.name} needs rank >= 3, got {list(s0)}")
        return d0, (*s0[:2], *([1] * (len(s0) - 2)))  # type: ignore[return-value]
    if op is Op.BATCH_NORM:
        if len(s0) < 2 or any(s.shape != (s0[1],) for s in src[1:]):
            raise InferError(f"BATCH_NORM parameters must have shape [{s0[1:2]}]")
        return d0, s0  # type: ignore[return-value]
    if op is Op.LAYER_NORM:
        assert isinstance(attrs, o.EpsilonAttrs)
        if not 0 <= attrs.axis < len(s0):
            raise InferError(f"axis {attrs.axis} out of range for rank {len(s0)}")
        for s in src[1:]:
            broadcast(s.shape, s0[attrs.axis:])
        return d0, s0  # type: ignore[return-value]
    if op is Op.RESHAPE:
        if shape is None or math.prod(shape) != math.prod(s0):
            raise InferError(f"cannot reshape {list(s0)} to {shape}")
        return d0, shape  # type: ignore[return-value]
    if op is Op.EXPAND:
        if shape is None or broadcast(s0, shape) != shape:
            raise InferError(f"cannot expand {list(s0)} to {shape}")
        return d0, shape  # type: ignore[return-value]
    if op is Op.TRANSPOSE:
        assert isinstance(attrs, o.TransposeAttrs)
        if sorted(attrs.perm) != list(range(len(s0))):
            raise InferError(f"perm {list(attrs.perm)} is not a permutation of rank {len(s0)}")
        return d0, tuple(s0[p] for p in attrs.perm)  # type: ignore[return-value]
    if op is Op.CONCAT:
        assert isinstance(attrs, o.AxisAttrs)
        ax = attrs.axis
        if not 0 <= ax < len(s0):
            raise InferError(f"axis {ax} out of range for rank {len(s0)}")
        for s in src:
            if len(s.shape) != len(s0) or s.shape[:ax] + s.shape[ax + 1:] != s0[:ax] + s0[ax + 1:]:
                raise InferError(f"CONCAT shapes differ off axis {ax}: "
                                 f"{[list(s.shape) for s in src]}")
        return d0, (*s0[:ax], sum(s.shape[ax] for s in src), *s0[ax + 1:])  # type: ignore
    if op is Op.PAD:
        assert isinstance(attrs, o.PadAttrs)
        r = len(s0)
        if len(attrs.pads) != 2 * r or attrs.mode not in ("constant", "reflect", "edge", "wrap"):
            raise InferError(f"PAD pads {list(attrs.pads)} / mode {attrs.mode!r} invalid for "
                             f"rank {r}")
        out = tuple(s0[i] + attrs.pads[i] + attrs.pads[r + i] for i in range(r))
        if min(out, default=0) < 0:
            raise InferError(f"PAD crops {list(s0)} below zero")
        return d0, out  # type: ignore[return-value]
    if op is Op.SLICE:
        assert isinstance(attrs, o.SliceAttrs)
        if not len(attrs.starts) == len(attrs.ends) == len(attrs.steps) == len(s0):
            raise InferError(f"SLICE needs one start/end/step per axis of {list(s0)}")
        if 0 in attrs.steps:
            raise InferError("SLICE step 0")
        return d0, tuple(len(range(b, e, st)) for b, e, st  # type: ignore[return-value]
                         in zip(attrs.starts, attrs.ends, attrs.steps))
    if op is Op.GATHER:
        assert isinstance(attrs, o.AxisAttrs)
        if not 0 <= attrs.axis < len(s0) or src[1].dtype not in (DType.INT32, DType.INT64):
            raise InferError(f"GATHER axis {attrs.axis} / indices {src[1].dtype.value} invalid")
        return d0, (*s0[:attrs.axis], *src[1].shape, *s0[attrs.axis + 1:])  # type: ignore
    if op is Op.TILE:
        assert isinstance(attrs, o.TileAttrs)
        if len(attrs.repeats) != len(s0) or min(attrs.repeats, default=0) < 0:
            raise InferError(f"TILE repeats {list(attrs.repeats)} invalid for {list(s0)}")
        return d0, tuple(a * b for a, b in zip(s0, attrs.repeats))  # type: ignore
    if op in REDUCE:
        assert isinstance(attrs, o.ReduceAttrs)
        axes = attrs.axes
        if not axes or list(axes) != sorted(set(axes)) or axes[0] < 0 or axes[-1] >= len(s0):
            raise InferError(f"reduction axes {list(axes)} invalid for rank {len(s0)}")
        out = tuple(1 if i in axes else d for i, d in enumerate(s0)
                    if attrs.keepdims or i not in axes)
        return d0, out  # type: ignore[return-value]
    if op in (Op.ARGMAX, Op.ARGMIN):
        assert isinstance(attrs, o.ArgAttrs)
        if not 0 <= attrs.axis < len(s0):
            raise InferError(f"axis {attrs.axis} out of range for rank {len(s0)}")
        out = tuple(1 if i == attrs.axis else d for i, d in enumerate(s0)
                    if attrs.keepdims or i != attrs.axis)
        return DType.INT64, out
    if op in (Op.QUANTIZE_LINEAR, Op.DEQUANTIZE_LINEAR):
        assert isinstance(attrs, o.AxisAttrs)
        scale, zp = src[1], src[2]
        if scale.shape != zp.shape or scale.rank > 1 or (
                scale.rank == 1 and (attrs.axis >= len(s0) or s0[attrs.axis] != scale.shape[0])):
            raise InferError(f"scale {list(scale.shape)} / zero point {list(zp.shape)} do not "
                             f"fit input {list(s0)} on axis {attrs.axis}")
        _float(op, scale.dtype)
        if op is Op.QUANTIZE_LINEAR:
            return zp.dtype, s0  # type: ignore[return-value]
        return scale.dtype, s0  # type: ignore[return-value]
    if op is Op.QLINEAR_MATMUL:
        return src[7].dtype, matmul_shape(s0, src[3].shape)
    if op is Op.MATMUL_INTEGER:
        return DType.INT32, matmul_shape(s0, src[1].shape)
    raise AssertionError(f"no type rule for {op}")


def _infer_epilogue(op: Op, src: Sequence[o.Node], attrs: o.Attrs, ep: o.Epilogue,
                    dtype: DType | None, shape: tuple[int, ...] | None
                    ) -> tuple[DType, tuple[int, ...]]:
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


def _infer_fused(src: Sequence[o.Node], attrs: o.FusedElementwiseAttrs
                 ) -> tuple[DType, tuple[int, ...]]:
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
