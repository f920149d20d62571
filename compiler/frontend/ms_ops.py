"""onnxruntime's quantised operators of the 'com.microsoft' domain → standard ONNX nodes.

``quantize_static(..., quant_format=QuantFormat.QOperator)`` writes QLinearConv and
QLinearMatMul (default domain, imported as they are) and, in 'com.microsoft', the operators
below. `expand` writes each as the QDQ form of the same float operator, DequantizeLinear of each
quantised input, the float operator, QuantizeLinear to the output's scale and zero point, which
the importer then imports node by node and `rewrite_qdq` turns into the integer ops it makes
for a QDQ model (so the accelerator's layer finder and `shift_uint8` see one form):

- QLinearAdd, QLinearMul: ``Q(Add | Mul(DQ(a), DQ(b)))``;
- QLinearAveragePool, QLinearGlobalAveragePool: ``Q(AveragePool | GlobalAveragePool(DQ(x)))``;
  with ``channels_last=1`` (NHWC), a Transpose of the integer tensor before the DQ and after
  the Q;
- QLinearConcat: ``Q(Concat(DQ(x1), DQ(x2), ...))``;
- QLinearLeakyRelu, QLinearSigmoid, QLinearSoftmax: ``Q(op(DQ(x)))`` (the float op stays, as in
  the QDQ form: it has no integer form); QLinearWhere: ``Q(Where(c, DQ(x), DQ(y)))``;
- QGemm: ``Q(Gemm(DQ(a), DQ(b), DQ(c)))``, ``b`` per tensor or per column; ``c`` is int32 with
  scale ``alpha * a_scale * b_scale`` (onnxruntime's kernel adds it to the accumulator before
  scaling); without ``y_scale`` the output is the float Gemm.

Zero points left out are 0 of the quantised type, as the contrib schemas say. What is not a
valid use of one of these operators (a missing required input or attribute, a quantised operand
that is not int8 or uint8) raises here, naming the node; any other 'com.microsoft' operator is
refused by the importer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidModelError, UnsupportedError
from ..ir.dtypes import DType
from ..ir.ops import Node, Op

DOMAIN = "com.microsoft"
_QUANTISED = (DType.INT8, DType.UINT8)


class _Expansion:
    """The standard nodes of one contrib node, named after its first output."""

    def __init__(self, proto: Any, attrs: dict[str, Any], where: str,
                 tensor: Callable[[str], Node]) -> None:
        self.proto, self.attrs, self.where, self.tensor = proto, attrs, where, tensor
        self.out = proto.output[0]
        self.nodes: list[Any] = []

    def has(self, k: int) -> bool:
        return k < len(self.proto.input) and self.proto.input[k] != ""

    def inp(self, k: int, what: str) -> str:
        if not self.has(k):
            raise InvalidModelError(f"{self.where}: required input {k} ({what}) is missing")
        return str(self.proto.input[k])

    def opt(self, k: int) -> str:
        return str(self.proto.input[k]) if self.has(k) else ""

    def quantised(self, k: int, what: str) -> str:
        """Input k, an int8 / uint8 tensor."""
        name = self.inp(k, what)
        d = self.tensor(name).dtype
        if d not in _QUANTISED:
            raise UnsupportedError(f"{self.where}: input {k} ({what}) '{name}' is "
                                   f"{d.name.lower()}; supported: int8, uint8")
        return name

    def node(self, op_type: str, inputs: list[str], suffix: str | None = None,
             **attrs: Any) -> str:
        """Append a node; its output is the contrib node's output when suffix is None."""
        from onnx import helper

        out = self.out if suffix is None else f"{self.out}/{suffix}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def const(self, value: np.ndarray, suffix: str) -> str:
        from onnx import numpy_helper

        return self.node("Constant", [], suffix, value=numpy_helper.from_array(value))

    def dq(self, k: int, what: str, scale: int, zero: int, suffix: str) -> str:
        """DequantizeLinear of input k with the scale and zero point of inputs scale, zero."""
        x = self.quantised(k, what)
        return self.node("DequantizeLinear", [x, self.inp(scale, f"{what}'s scale"),
                                              self.opt(zero)], suffix)

    def q(self, y: str, scale: int, zero: int, like: str, suffix: str | None = None) -> str:
        """QuantizeLinear of y to the output's scale and zero point (0 of like's type when
        left out)."""
        zp = self.opt(zero)
        if not zp:
            zp = self.const(np.zeros((), self.tensor(like).dtype.np), "zero_point")
        return self.node("QuantizeLinear", [y, self.inp(scale, "the output's scale"), zp],
                         suffix)

    def copied(self, *names: str) -> dict[str, Any]:
        return {k: v for k, v in self.attrs.items() if k in names}

    def channels_last(self, x: str, rank: int, inverse: bool, suffix: str | None) -> str:
        """x transposed NHWC → NCHW (or back, with inverse)."""
        perm = [0, *range(2, rank), 1] if inverse else [0, rank - 1, *range(1, rank - 1)]
        return self.node("Transpose", [x], suffix, perm=perm)


def _binary(e: _Expansion) -> None:
    op = e.proto.op_type.removeprefix("QLinear")
    a, b = e.dq(0, "A", 1, 2, "A"), e.dq(3, "B", 4, 5, "B")
    e.q(e.node(op, [a, b], op), 6, 7, e.proto.input[0])


def _unary(op: str, *attrs: str) -> Callable[[_Expansion], None]:
    def expand(e: _Expansion) -> None:
        x = e.dq(0, "X", 1, 2, "X")
        e.q(e.node(op, [x], op, **e.copied(*attrs)), 3, 4, e.proto.input[0])
    return expand


def _softmax(e: _Expansion) -> None:
    x = e.dq(0, "X", 1, 2, "X")
    shape = e.tensor(e.proto.input[0]).shape
    rank = len(shape)
    axis = int(e.attrs.get("axis", -1))
    if not -rank <= axis < rank:
        raise InvalidModelError(f"{e.where}: axis {axis} out of range for rank {rank}")
    axis %= rank
    if "opset" not in e.attrs:
        raise InvalidModelError(f"{e.where}: required attribute 'opset' is missing")
    if int(e.attrs["opset"]) < 13 and axis != rank - 1:
        # Before opset 13, Softmax normalises over the axes from `axis` on, flattened.
        flat = e.node("Flatten", [x], "Flatten", axis=axis)
        y = e.node("Softmax", [flat], "Softmax", axis=1)
        y = e.node("Reshape", [y, e.const(np.array(shape, np.int64), "shape")], "Reshape")
    else:
        y = e.node("Softmax", [x], "Softmax", axis=axis)
    e.q(y, 3, 4, e.proto.input[0])


def _pool(e: _Expansion) -> None:
    op = e.proto.op_type.removeprefix("QLinear")
    x = e.quantised(0, "X")
    rank = len(e.tensor(x).shape)
    nhwc = bool(e.attrs.get("channels_last", 0))
    if nhwc:
        if rank < 3:
            raise UnsupportedError(f"{e.where}: channels_last input of rank {rank}; "
                                   f"supported: N, *spatial, C (rank >= 3)")
        x = e.channels_last(x, rank, False, "NCHW")
    dx = e.node("DequantizeLinear", [x, e.inp(1, "X's scale"), e.opt(2)], "X")
    attrs = {k: v for k, v in e.attrs.items() if k != "channels_last"}
    y = e.node(op, [dx], op, **attrs)
    if not nhwc:
        e.q(y, 3, 4, e.proto.input[0])
        return
    e.channels_last(e.q(y, 3, 4, e.proto.input[0], "Q"), rank, True, None)


def _concat(e: _Expansion) -> None:
    n = len(e.proto.input)
    if n < 5 or (n - 2) % 3:
        raise InvalidModelError(f"{e.where}: {n} inputs; expected Y_scale, Y_zero_point, then "
                                f"(X, X_scale, X_zero_point) for each input")
    if "axis" not in e.attrs:
        raise InvalidModelError(f"{e.where}: required attribute 'axis' is missing")
    xs = [e.dq(k, f"input {(k - 2) // 3}", k + 1, k + 2, f"X{(k - 2) // 3}")
          for k in range(2, n, 3)]
    e.q(e.node("Concat", xs, "Concat", axis=int(e.attrs["axis"])), 0, 1, e.proto.input[2])


def _where(e: _Expansion) -> None:
    cond = e.inp(0, "condition")
    x, y = e.dq(1, "X", 2, 3, "X"), e.dq(4, "Y", 5, 6, "Y")
    e.q(e.node("Where", [cond, x, y], "Where"), 7, 8, e.proto.input[1])


def _gemm(e: _Expansion) -> None:
    alpha = float(e.attrs.get("alpha", 1.0))
    trans_b = int(e.attrs.get("transB", 0))
    a = e.dq(0, "A", 1, 2, "A")
    b_name, b_scale = e.quantised(3, "B"), e.inp(4, "B's scale")
    s = e.tensor(b_scale)
    per_column = s.size > 1
    axis = {"axis": 0 if trans_b else 1} if per_column else {}
    b = e.node("DequantizeLinear", [b_name, b_scale, e.opt(5)], "B", **axis)
    src = [a, b]
    if e.has(6):
        src.append(_gemm_bias(e, alpha, per_column, s.size))
    if e.has(7) != e.has(8):
        raise UnsupportedError(f"{e.where}: y_scale and y_zero_point must be given together "
                               f"(a quantised output) or both left out (a float output)")
    quantised = e.has(7)
    y = e.node("Gemm", src, "Gemm" if quantised else None, alpha=alpha, beta=1.0,
               transA=int(e.attrs.get("transA", 0)), transB=trans_b)
    if quantised:
        e.q(y, 7, 8, e.proto.input[0])


def _gemm_bias(e: _Expansion, alpha: float, per_column: bool, columns: int) -> str:
    """C (int32, zero point 0) dequantised in the accumulator's scale alpha * a_s * b_s."""
    c_name = e.inp(6, "C")
    c = e.tensor(c_name)
    if c.dtype is not DType.INT32:
        raise UnsupportedError(f"{e.where}: input 6 (C) '{c_name}' is {c.dtype.name.lower()}; "
                               f"supported: int32")
    a_s, b_s = e.tensor(e.proto.input[1]), e.tensor(e.proto.input[4])
    if a_s.op is Op.CONST and b_s.op is Op.CONST:
        real = alpha * a_s.value.astype(np.float64).reshape(()) * b_s.value.astype(np.float64)
        scale = e.const(real.reshape(-1 if per_column else ()).astype(np.float32), "C_scale")
    else:  # computed at run time: the Gemm stays float (rewrite_qdq wants constants)
        scale = e.node("Mul", [e.proto.input[1], e.proto.input[4]], "C_scale_ab")
        scale = e.node("Mul", [scale, e.const(np.array(alpha, np.float32), "alpha")],
                       "C_scale")
    if not per_column:
        return e.node("DequantizeLinear", [c_name, scale], "C")
    if c.size == 1:  # one value for every column: per-column DequantizeLinear needs N of them
        shape = (columns,) if c.rank <= 1 else (*c.shape[:-1], columns)
        if c.op is Op.CONST:
            c_name = e.const(np.broadcast_to(c.value.reshape(()), shape).astype(np.int32), "C")
        else:
            c_name = e.node("Expand", [c_name, e.const(np.array(shape, np.int64), "C_shape")],
                            "C_wide")
        rank = len(shape)
    else:
        rank = c.rank
    return e.node("DequantizeLinear", [c_name, scale], "C_real", axis=rank - 1)


_EXPANSIONS: dict[str, Callable[[_Expansion], None]] = {
    "QLinearAdd": _binary,
    "QLinearMul": _binary,
    "QLinearAveragePool": _pool,
    "QLinearGlobalAveragePool": _pool,
    "QLinearConcat": _concat,
    "QLinearLeakyRelu": _unary("LeakyRelu", "alpha"),
    "QLinearSigmoid": _unary("Sigmoid"),
    "QLinearSoftmax": _softmax,
    "QLinearWhere": _where,
    "QGemm": _gemm,
}
OPERATORS = frozenset(_EXPANSIONS)


def expand(proto: Any, attrs: dict[str, Any], where: str,
           tensor: Callable[[str], Node]) -> list[Any]:
    """The standard ONNX nodes (NodeProtos, default domain) that compute contrib node `proto`
    (op_type in OPERATORS) with attributes `attrs`; `tensor` gives the IR node of an input
    by name, `where` names the node in errors. The last node writes proto's output; the others
    write names "<output>/<part>"."""
    if len(proto.output) != 1 or not proto.output[0]:
        raise InvalidModelError(f"{where}: outputs {list(proto.output)}; expected one, named")
    e = _Expansion(proto, attrs, where, tensor)
    _EXPANSIONS[proto.op_type](e)
    return e.nodes
