"""The type rules: RULES covers every op, per-family results, and the errors' messages."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest

from vtakit.compiler.ir import DType, Node, Op, const, infer
from vtakit.compiler.ir import ops as o
from vtakit.compiler.ir.infer import RULES, SIGNATURES, InferError

F16, F32, I8, I32, I64, U8, BOOL = (DType.FLOAT16, DType.FLOAT32, DType.INT8, DType.INT32,
                                    DType.INT64, DType.UINT8, DType.BOOL)


def _t(dtype: DType, *shape: int) -> Node:
    """An operand of the given dtype and shape."""
    return Node(Op.INPUT, dtype, shape, attrs=o.InputAttrs(0))


def _conv(k: int = 3, s: int = 1, p: int = 0, group: int = 1,
          epilogue: o.Epilogue = o.NO_EPILOGUE) -> o.ConvAttrs:
    return o.ConvAttrs((k, k), (s, s), (p,) * 4, (1, 1), group, epilogue)


def _pool(k: int, s: int, ceil_mode: bool = False) -> o.PoolAttrs:
    return o.PoolAttrs((k, k), (s, s), (0,) * 4, (1, 1), ceil_mode)


def test_rules_and_signatures_cover_every_op():
    assert set(RULES) == set(Op)
    assert set(RULES) == set(SIGNATURES)
    assert all(callable(rule) for rule in RULES.values())


def test_ops_of_one_family_share_a_rule():
    assert RULES[Op.ADD] is RULES[Op.MUL] is RULES[Op.BITWISE_XOR]
    assert RULES[Op.RELU] is RULES[Op.SIGMOID] is RULES[Op.CLIP]
    assert RULES[Op.REDUCE_SUM] is RULES[Op.REDUCE_LOG_SUM_EXP]
    assert RULES[Op.CONV] is not RULES[Op.CONV_TRANSPOSE]


@dataclass(frozen=True)
class Case:
    op: Op
    src: tuple[Node, ...]
    want: tuple[DType, tuple[int, ...]]
    attrs: o.Attrs = o.NO_ATTRS
    dtype: DType | None = None  # declared
    shape: tuple[int, ...] | None = None  # declared


CASES = [
    # Sources and casts.
    Case(Op.INPUT, (), (I8, (2, 3)), o.InputAttrs(0), I8, (2, 3)),
    Case(Op.CONST, (), (I64, (3,)), o.ConstAttrs(np.arange(3, dtype=np.int64))),
    Case(Op.CAST, (_t(F32, 2, 3),), (I32, (2, 3)), dtype=I32),
    # Elementwise.
    Case(Op.RELU, (_t(F32, 2, 3),), (F32, (2, 3))),
    Case(Op.NEG, (_t(I8, 4),), (I8, (4,))),
    Case(Op.LEAKY_RELU, (_t(F16, 5),), (F16, (5,)), o.AlphaAttrs(0.1)),
    Case(Op.ISNAN, (_t(F32, 2, 2),), (BOOL, (2, 2))),
    Case(Op.ISINF, (_t(F32, 3),), (BOOL, (3,)), o.IsInfAttrs()),
    Case(Op.ADD, (_t(F32, 2, 1, 3), _t(F32, 4, 3)), (F32, (2, 4, 3))),
    Case(Op.MOD, (_t(I32, 3), _t(I32, 2, 1)), (I32, (2, 3)), o.ModAttrs(fmod=False)),
    Case(Op.SHL, (_t(U8, 3), _t(U8, 1)), (U8, (3,))),
    Case(Op.LESS, (_t(F32, 3, 1), _t(F32, 4)), (BOOL, (3, 4))),
    Case(Op.WHERE, (_t(BOOL, 3, 1), _t(I64, 4), _t(I64, 1)), (I64, (3, 4))),
    # Linear algebra.
    Case(Op.MATMUL, (_t(F32, 2, 3, 4), _t(F32, 4, 5)), (F32, (2, 3, 5))),
    Case(Op.MATMUL, (_t(F32, 4), _t(F32, 4, 5)), (F32, (5,))),
    Case(Op.MATMUL, (_t(F32, 3, 4), _t(F32, 4, 5), _t(F32, 5)), (F32, (3, 5)), o.MatMulAttrs()),
    Case(Op.GEMM, (_t(F32, 2, 3), _t(F32, 4, 3), _t(F32, 4)), (F32, (2, 4)),
         o.GemmAttrs(trans_b=True)),
    Case(Op.MATMUL_INTEGER, (_t(U8, 2, 3), _t(U8, 3, 4), _t(U8), _t(U8)), (I32, (2, 4))),
    Case(Op.QLINEAR_MATMUL, (_t(U8, 2, 3), _t(F32), _t(U8), _t(I8, 3, 4), _t(F32), _t(I8),
                             _t(F32), _t(I8)), (I8, (2, 4))),
    # Convolution and pooling.
    Case(Op.CONV, (_t(F32, 1, 4, 8, 8), _t(F32, 6, 2, 3, 3), _t(F32, 6)), (F32, (1, 6, 4, 4)),
         _conv(s=2, p=1, group=2)),
    Case(Op.CONV_INTEGER, (_t(U8, 1, 3, 5, 5), _t(U8, 2, 3, 3, 3), _t(U8), _t(U8)),
         (I32, (1, 2, 3, 3)), _conv()),
    Case(Op.CONV_TRANSPOSE, (_t(F32, 1, 2, 3, 3), _t(F32, 2, 4, 3, 3)), (F32, (1, 4, 6, 6)),
         o.ConvTransposeAttrs((3, 3), (2, 2), (1,) * 4, (1, 1), (1, 1))),
    Case(Op.MAX_POOL, (_t(F32, 1, 1, 5, 5),), (F32, (1, 1, 3, 3)), _pool(2, 2, ceil_mode=True)),
    Case(Op.MAX_POOL_INDEX, (_t(F32, 1, 1, 5, 5),), (I64, (1, 1, 2, 2)), _pool(2, 2)),
    Case(Op.LP_POOL, (_t(F32, 1, 2, 4, 4),), (F32, (1, 2, 3, 3)), o.LpPoolAttrs(_pool(2, 1))),
    Case(Op.GLOBAL_AVG_POOL, (_t(F32, 2, 3, 4, 5),), (F32, (2, 3, 1, 1))),
    Case(Op.COL2IM, (_t(F32, 1, 8, 9),), (F32, (1, 2, 4, 4)), _conv(k=2), shape=(1, 2, 4, 4)),
    # Normalisation.
    Case(Op.SOFTMAX, (_t(F32, 2, 5),), (F32, (2, 5)), o.AxisAttrs(1)),
    Case(Op.CUMSUM, (_t(I64, 2, 5),), (I64, (2, 5)), o.CumAttrs(0)),
    Case(Op.BATCH_NORM, (_t(F32, 2, 3, 4),) + (_t(F32, 3),) * 4, (F32, (2, 3, 4)),
         o.EpsilonAttrs(1e-5)),
    Case(Op.LAYER_NORM, (_t(F32, 2, 3, 4), _t(F32, 3, 4), _t(F32, 4)), (F32, (2, 3, 4)),
         o.EpsilonAttrs(1e-5, axis=1)),
    # Data movement.
    Case(Op.RESHAPE, (_t(F32, 2, 3, 4),), (F32, (6, 4)), shape=(6, 4)),
    Case(Op.EXPAND, (_t(I32, 3, 1),), (I32, (2, 3, 5)), shape=(2, 3, 5)),
    Case(Op.TRANSPOSE, (_t(F32, 2, 3, 4),), (F32, (4, 2, 3)), o.TransposeAttrs((2, 0, 1))),
    Case(Op.CONCAT, (_t(F32, 2, 3), _t(F32, 2, 1), _t(F32, 2, 4)), (F32, (2, 8)),
         o.AxisAttrs(1)),
    Case(Op.PAD, (_t(F32, 2, 3),), (F32, (3, 1)), o.PadAttrs((1, -1, 0, -1))),
    Case(Op.SLICE, (_t(F32, 4, 6),), (F32, (2, 3)), o.SliceAttrs((1, 0), (3, 6), (1, 2))),
    Case(Op.SLICE, (_t(F32, 5),), (F32, (3,)), o.SliceAttrs((4,), (-1,), (-2,))),
    Case(Op.TILE, (_t(F32, 2, 3),), (F32, (4, 0)), o.TileAttrs((2, 0))),
    Case(Op.GATHER, (_t(F32, 5, 4), _t(I64, 2, 3)), (F32, (2, 3, 4)), o.AxisAttrs(0)),
    Case(Op.GATHER_ELEMENTS, (_t(F32, 5, 4), _t(I64, 2, 4)), (F32, (2, 4)), o.AxisAttrs(0)),
    Case(Op.GATHER_ND, (_t(F32, 2, 3, 4), _t(I64, 2, 1)), (F32, (2, 4)),
         o.GatherNdAttrs(batch_dims=1)),
    Case(Op.SCATTER_ND, (_t(F32, 4, 3), _t(I64, 2, 1), _t(F32, 2, 3)), (F32, (4, 3)),
         o.ScatterAttrs(reduction="add")),
    Case(Op.RESIZE, (_t(F32, 1, 1, 2, 2),), (F32, (1, 1, 4, 4)),
         o.ResizeAttrs((1.0, 1.0, 2.0, 2.0)), shape=(1, 1, 4, 4)),
    Case(Op.GRID_SAMPLE, (_t(F32, 1, 3, 4, 4), _t(F32, 1, 5, 6, 2)), (F32, (1, 3, 5, 6)),
         o.GridSampleAttrs()),
    # Reductions.
    Case(Op.REDUCE_SUM, (_t(F32, 2, 3, 4),), (F32, (2, 1, 1)), o.ReduceAttrs((1, 2))),
    Case(Op.REDUCE_MAX, (_t(I32, 2, 3, 4),), (I32, (3,)), o.ReduceAttrs((0, 2), keepdims=False)),
    Case(Op.ARGMAX, (_t(F32, 2, 3, 4),), (I64, (2, 4)), o.ArgAttrs(1, keepdims=False)),
    Case(Op.TOPK, (_t(F32, 2, 5),), (I64, (2, 3)), o.TopKAttrs(1, 3)),
    # Quantisation.
    Case(Op.QUANTIZE_LINEAR, (_t(F32, 2, 3), _t(F32, 3), _t(I8, 3)), (I8, (2, 3)),
         o.AxisAttrs(1)),
    Case(Op.DEQUANTIZE_LINEAR, (_t(U8, 2, 3), _t(F16), _t(U8)), (F16, (2, 3)), o.AxisAttrs(1)),
    # Less common tensor operators.
    Case(Op.TRILU, (_t(F32, 3, 3),), (F32, (3, 3)), o.TriluAttrs(upper=True)),
    Case(Op.DET, (_t(F32, 2, 3, 3),), (F32, (2,))),
    Case(Op.REVERSE_SEQUENCE, (_t(F32, 4, 2, 3), _t(I64, 2)), (F32, (4, 2, 3)),
         o.ReverseSequenceAttrs()),
    Case(Op.EINSUM, (_t(F32, 2, 3), _t(F32, 3, 4)), (F32, (2, 4)), o.EinsumAttrs("ij,jk->ik")),
    Case(Op.FUSED_ELEMENTWISE, (_t(F32, 2, 3), _t(F32, 3)), (F32, (2, 3)),
         o.FusedElementwiseAttrs((("mul", (0,), (2.0,)), ("add", (2, 1), ()),
                                  ("relu", (3,), ())))),
    # Epilogues: typed as the plain op, with the residual as the 4th operand.
    Case(Op.CONV, (_t(F32, 1, 2, 4, 4), _t(F32, 3, 2, 3, 3), _t(F32, 3), _t(F32, 1, 3, 2, 2)),
         (F32, (1, 3, 2, 2)), _conv(epilogue=o.Epilogue("relu", residual=True))),
    Case(Op.GEMM, (_t(F32, 2, 3), _t(F32, 3, 4)), (F32, (2, 4)),
         o.GemmAttrs(epilogue=o.Epilogue("clip", clip_min=0.0, clip_max=6.0))),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.op.name)
def test_rule(case: Case):
    assert infer(case.op, case.src, case.attrs, case.dtype, case.shape) == case.want


def test_cases_cover_fifteen_families():
    assert len({RULES[c.op] for c in CASES}) >= 15


def test_const_rule_reads_the_value():
    c = const(np.zeros((2, 1), np.float16))
    assert infer(Op.CONST, (), c.attrs) == (F16, (2, 1))


ERRORS = [
    # Checks every op shares: signature, attribute class, epilogue, dtype sets.
    (Op.RELU, (_t(F32, 2), _t(F32, 2)), o.NO_ATTRS, None, "RELU takes 1..1 operands, got 2"),
    (Op.SOFTMAX, (_t(F32, 2),), o.NO_ATTRS, None, "SOFTMAX takes AxisAttrs, got NoAttrs"),
    (Op.MATMUL, (_t(F32, 2, 2), _t(F32, 2, 2)), o.GemmAttrs(), None,
     "MATMUL takes NoAttrs or MatMulAttrs, got GemmAttrs"),
    (Op.COL2IM, (_t(F32, 1, 4, 4),), _conv(k=2, epilogue=o.Epilogue("relu")), (1, 1, 3, 3),
     "COL2IM takes no epilogue, got relu"),
    (Op.CONV, (_t(F32, 1, 1, 3, 3), _t(F32, 1, 1, 3, 3), _t(F32, 1), _t(F32, 1, 1, 1, 1)),
     _conv(), None, "CONV takes a 4th operand only as the residual of an epilogue"),
    (Op.GEMM, (_t(I32, 2, 3), _t(I32, 3, 4)), o.GemmAttrs(epilogue=o.Epilogue("relu")), None,
     "GEMM epilogues need a float result, got i32"),
    (Op.EXP, (_t(I32, 2),), o.NO_ATTRS, None, "EXP needs a float operand, got i32"),
    (Op.SHL, (_t(F32, 2), _t(F32, 2)), o.NO_ATTRS, None, "SHL needs integer operands"),
    (Op.AND, (_t(BOOL, 2), _t(I8, 2)), o.NO_ATTRS, None, "AND needs bool operands"),
    (Op.ADD, (_t(F32, 2), _t(F16, 2)), o.NO_ATTRS, None,
     "ADD operands differ in dtype: ['f32', 'f16']"),
    # The per-op rules.
    (Op.INPUT, (), o.InputAttrs(0), None, "INPUT needs a declared dtype and shape"),
    (Op.MUL, (_t(F32, 2, 3), _t(F32, 4)), o.NO_ATTRS, None,
     "shapes [[2, 3], [4]] do not broadcast"),
    (Op.MATMUL, (_t(F32, 2, 3), _t(F32, 4, 5)), o.NO_ATTRS, None,
     "matmul inner dimensions differ: [2, 3] @ [4, 5]"),
    (Op.MATMUL, (_t(F32, 2, 3), _t(F32, 3, 4), _t(F32, 4)), o.NO_ATTRS, None,
     "MATMUL with a bias operand needs MatMulAttrs"),
    (Op.CONV, (_t(F32, 1, 3, 5, 5), _t(F32, 4, 2, 3, 3)), _conv(), None,
     "channels: input 3, weights [4, 2], group 1"),
    (Op.MAX_POOL, (_t(F32, 1, 1, 2, 2),), _pool(3, 1), None,
     "window 3 is larger than the padded input 2"),
    (Op.SOFTMAX, (_t(F32, 2, 3),), o.AxisAttrs(2), None, "axis 2 out of range for rank 2"),
    (Op.RESHAPE, (_t(F32, 2, 3),), o.NO_ATTRS, (4, 2), "cannot reshape [2, 3] to (4, 2)"),
    (Op.TRANSPOSE, (_t(F32, 2, 3),), o.TransposeAttrs((0, 0)), None,
     "perm [0, 0] is not a permutation of rank 2"),
    (Op.CONCAT, (_t(F32, 2, 3), _t(F32, 3, 3)), o.AxisAttrs(1), None,
     "CONCAT shapes differ off axis 1: [[2, 3], [3, 3]]"),
    (Op.SLICE, (_t(F32, 4),), o.SliceAttrs((0,), (4,), (0,)), None, "SLICE step 0"),
    (Op.REDUCE_MEAN, (_t(F32, 2, 3),), o.ReduceAttrs((1, 0)), None,
     "reduction axes [1, 0] invalid for rank 2"),
    (Op.GATHER, (_t(F32, 4), _t(F32, 2)), o.AxisAttrs(0), None,
     "GATHER axis 0 / indices f32 invalid"),
    (Op.GLOBAL_MAX_POOL, (_t(F32, 2, 3),), o.NO_ATTRS, None,
     "GLOBAL_MAX_POOL needs rank >= 3, got [2, 3]"),
    (Op.SCATTER_ELEMENTS, (_t(F32, 3), _t(I64, 1), _t(F32, 1)), o.ScatterAttrs(reduction="or"),
     None, "SCATTER_ELEMENTS updates f32 / reduction 'or' invalid"),
    (Op.DET, (_t(F32, 2, 3),), o.NO_ATTRS, None,
     "DET needs square matrices in the last two axes, got [2, 3]"),
    (Op.QUANTIZE_LINEAR, (_t(F32, 2), _t(I8), _t(I8)), o.AxisAttrs(0), None,
     "QUANTIZE_LINEAR needs a float operand, got i8"),
    (Op.FUSED_ELEMENTWISE, (_t(F32, 2),), o.FusedElementwiseAttrs(()), None,
     "FUSED_ELEMENTWISE program is empty"),
    (Op.FUSED_ELEMENTWISE, (_t(F32, 2),), o.FusedElementwiseAttrs((("relu", (1,), ()),)), None,
     "step 0: indices [1] must name operands or earlier steps (< 1)"),
]


@pytest.mark.parametrize("op, src, attrs, shape, message", ERRORS,
                         ids=[f"{e[0].name}-{i}" for i, e in enumerate(ERRORS)])
def test_error(op: Op, src: tuple[Node, ...], attrs: o.Attrs, shape: tuple[int, ...] | None,
               message: str):
    with pytest.raises(InferError, match=f"^{re.escape(message)}$"):
        infer(op, src, attrs, shape=shape)


def test_lp_pool_checks_its_nested_pool_attrs_like_max_pool():
    with pytest.raises(InferError, match="^MAX_POOL takes PoolAttrs, got AxisAttrs$"):
        infer(Op.LP_POOL, (_t(F32, 1, 1, 4, 4),), o.LpPoolAttrs(o.AxisAttrs(0)))  # type: ignore[arg-type]
