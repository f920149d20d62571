"""Pre-quantised ONNX models → the integer graph (see `compiler.quantize.rewrite`).

`rewrite_qdq` runs in `import_onnx`, after the ONNX nodes are imported and before any pass. It
recognises the quantised operators of QDQ models (QuantizeLinear / DequantizeLinear pairs around
float operators, as written by ``onnxruntime.quantization.quantize_static`` and PyTorch's
exporters) and the QLinearConv / QLinearMatMul operators, and replaces them by the integer ops
that every int8 backend computes bit for bit. Patterns, each ending in a QuantizeLinear
``Q(·, y_scale, y_zp)`` of int8 or uint8 (``DQ`` = DequantizeLinear):

- ``Q(Conv(DQ(x), DQ(w)[, DQ(b) | b]))``: CONV_INTEGER(x, w, x_zp, w_zp) → REQUANTIZE(bias,
  m, s, y_zp). Any group count (depthwise too); w per tensor or per output channel (axis 0);
  a float bias is quantised with x_scale * w_scale[c];
- ``Q(MatMul(DQ(a), DQ(w)))``, ``Q(Gemm(DQ(a), DQ(w)[, DQ(c) | c]))``: MATMUL_INTEGER →
  REQUANTIZE per output column (constant w per tensor or per column); ``Q(MatMul(DQ(a),
  DQ(b)))`` of two activations: MATMUL_INTEGER → REQUANTIZE per tensor;
- ``Q(Add(DQ(a), DQ(b)))``: each operand minus its zero point, times its integer multiplier in
  int32, ADD, REQUANTIZE (the common scale and the output zero point);
- ``Q(MaxPool(DQ(x)))``, ``Q(Reshape | Flatten | Squeeze | Unsqueeze | Transpose | Slice |
  Identity(DQ(x)))``: the same op on the integer tensor, then a REQUANTIZE only where the output
  scale or zero point differs from the input's; ``Q(Concat(DQ(x1), ...))``: each input brought
  to the output's scale, CONCAT; ``Q(DQ(x))``: a rescale;
- ``Q(GlobalAveragePool(DQ(x)))``: REDUCE_SUM in int32, REQUANTIZE (1 / window in the
  multiplier); ``Q(AveragePool(DQ(x)))`` without partial windows (no padding, or
  count_include_pad): a depthwise CONV_INTEGER with unit weights, REQUANTIZE;
- ``Q(Relu(DQ(x)))``, ``Q(Clip(DQ(x)))``: a clamp of the integer tensor (CLIP, or the bounds of
  a rescaling REQUANTIZE). A Relu / Clip between any of the operators above and its Q is folded
  into the bounds, which is also how ORT's "the clamp is implied" case (a Relu removed because
  y_zp is the lowest value) comes out: Q saturates to the output type.
- QLinearConv / QLinearMatMul with constant scales and zero points: CONV_INTEGER /
  MATMUL_INTEGER → REQUANTIZE, as above (with scales given at run time they stay QLINEAR_* with
  their float requantisation; ConvInteger / MatMulInteger stay as they are).
- onnxruntime's 'com.microsoft' operators (QLinearAdd, QGemm, ...) arrive as the QDQ form of
  their float operator (`ms_ops`), so they take the patterns above.

Multipliers and the shift come from `requant.choose` in fixed mode on the real multiplier
(``x_scale * w_scale[c] / y_scale``) and the worst-case accumulator ``max |acc + bias|`` over
every input the types allow, zero points included (``|x - x_zp| <= 255`` for int8 and uint8
alike; with constant weights the bound is exact, see `_Rewrite.acc_bound`), so no input
overflows int32. With ``exact=True`` and the accumulator's own bound (without the bias), so that
every output is within one step of the exact rational result for every input wherever the ALU
allows it: where the plain fixed point is not (multipliers with too few bits for the worst-case
accumulator, a tiny output scale whose multiplier passes the immediate, a tiny multiplier
against a bias at the int32 limits, as onnxruntime writes it after enlarging a weight scale),
REQUANTIZE saturates the accumulator first (its clamp: exact, it changes no result) or pre-shifts
it (its ``pre_shift``); where nothing keeps the value, the error below. Weights written in float
with their own QuantizeLinear (PyTorch) are quantised here. Everything else stays as imported:
the float op between its DQ and Q nodes, which is also what happens to a quantised op of a form
not listed (e.g. weights that are not DequantizeLinear outputs, an AveragePool with partial
windows).

**Where we differ from onnxruntime.** ORT requantises in float: ``nearbyint(acc * (x_scale *
w_scale / y_scale)) + y_zp`` with a float32 multiplier, rounding half to even. We use a
fixed-point multiplier ``m / 2**s`` and round half up (``+ 2**(s-1)`` then ``>> s``), the only
arithmetic the accelerator's ALU has. ``m`` has at most 15 significant bits (the ALU's
immediate), fewer in a channel whose multiplier is small against its layer's largest (one shift
per layer) and where ``|m| * clamp``, about ``(hi - lo) * 2**s``, reaches int32 (``s <= 23``
for uint8 outputs). The two agree except where ``acc * multiplier`` lies within the
multiplier's relative error of a rounding boundary (or exactly on one, for the tie rule): those
outputs differ by one step, and the difference propagates through later layers, mostly as
further one-step differences. Quantised Add, average pools and rescales differ the same way.

**Errors.** A quantised form that cannot be made integer raises `UnsupportedError` naming the
node and the operator: a scale or zero point that is not constant, an integer type other than
int8 / uint8 (int32 for biases), per-channel scales on activations or along an axis that is not
the output channel, a requantisation that cannot fit int32 or would lose the value
(`requant.RequantError`, with the multipliers, bounds and output range), a float bias past
int32 in the accumulator's scale. Blocked
quantisation and 2- / 4-bit types are rejected earlier by the importer. Single QuantizeLinear /
DequantizeLinear nodes (not around a recognised operator) import as they are, and so does
everything with ``import_onnx(..., integer=False)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError
from ..ir import ops as o
from ..ir.dtypes import DType
from ..ir.graph import Graph
from ..ir.infer import InferError, conv_shape, infer
from ..ir.interpreter import evaluate
from ..ir.ops import Node, Op, const
from ..quantize import requant as R

_ACT_TYPES = (DType.INT8, DType.UINT8)
_I32 = DType.INT32
# Ops that keep the integer values as they are (the output's scale is the input's in ORT).
_MOVE = (Op.MAX_POOL, Op.RESHAPE, Op.TRANSPOSE, Op.IDENTITY, Op.SLICE)
# Ops a following Relu / Clip (before the Q) is folded into.
_ACTIVATIONS = (Op.RELU, Op.CLIP)


def rewrite_qdq(g: Graph) -> Graph:
    """g with its QDQ patterns and QLinearConv / QLinearMatMul replaced by integer ops (see the
    module docstring). Before: g as imported (no pass has run). After: every recognised Q node
    is an integer op (REQUANTIZE, or an int8 / uint8 op) of the same dtype and shape, named like
    the Q node; DQ nodes that float ops still read remain; the graph's signature is unchanged."""
    rw = _Rewrite()
    for n in g.nodes:
        rw.visit(n)
    if not rw.changed:
        return g
    return Graph(tuple(rw.new[id(n)] for n in g.inputs), tuple(rw.new[id(n)] for n in g.outputs),
                 g.output_names, g.name)


@dataclass(frozen=True)
class _Q:
    """A quantised tensor: its integer node in the rewritten graph, and its scale and zero
    point (numpy, one value, or one per channel along `axis`)."""

    node: Node
    scale: np.ndarray  # float64
    zero: np.ndarray  # int64, the shape of scale
    zero_node: Node  # the zero point as a CONST of the node's dtype
    axis: int = 0

    @property
    def s(self) -> float:
        return float(self.scale.reshape(-1)[0])

    @property
    def z(self) -> int:
        return int(self.zero.reshape(-1)[0])

    @property
    def dtype(self) -> DType:
        return self.node.dtype

    @property
    def reach(self) -> int:
        """max |value - zero point| over the dtype's range (largest over channels)."""
        info = np.iinfo(self.dtype.np)
        return int(max(np.max(self.zero) - info.min, info.max - np.min(self.zero)))


def _mk(op: Op, *src: Node, attrs: o.Attrs = o.NO_ATTRS, dtype: DType | None = None,
        shape: tuple[int, ...] | None = None, name: str = "") -> Node:
    d, s = infer(op, src, attrs, dtype, shape)
    return Node(op, d, s, tuple(src), attrs, name)


def _type_range(d: DType) -> tuple[int, int]:
    info = np.iinfo(d.np)
    return int(info.min), int(info.max)


class _Rewrite:
    def __init__(self) -> None:
        self.new: dict[int, Node] = {}  # id(node of g) -> its node in the rewritten graph
        self.changed = False

    def visit(self, n: Node) -> None:
        src = tuple(self.new[id(s)] for s in n.src)
        out: Node | None = None
        if n.op is Op.QUANTIZE_LINEAR and all(s.op is Op.CONST for s in src):
            # Weights stored in float with their own Q -> DQ (PyTorch): the int8 weights.
            out = const(evaluate(n, [s.value for s in src]), n.name)
        elif n.op is Op.QUANTIZE_LINEAR:
            out = self.quantized(n)
        elif n.op is Op.QLINEAR_CONV:
            out = self.qlinear_conv(n, src)
        elif n.op is Op.QLINEAR_MATMUL:
            out = self.qlinear_matmul(n, src)
        if out is not None:
            self.changed = True
        elif all(a is b for a, b in zip(src, n.src)):
            out = n
        else:
            out = n.replace(src=src)
        self.new[id(n)] = out

    # -- reading the quantisation parameters -------------------------------------------------
    @staticmethod
    def fail(f: Node, what: str) -> UnsupportedError:
        return UnsupportedError(f"quantised {f.op.name} '{f.name}': {what}")

    def params(self, qdq: Node, f: Node, types: Sequence[DType],
               ) -> tuple[np.ndarray, np.ndarray, int]:
        """(scale, zero point, axis) of a QuantizeLinear / DequantizeLinear node around f."""
        what = "QuantizeLinear" if qdq.op is Op.QUANTIZE_LINEAR else "DequantizeLinear"
        scale, zp = qdq.src[1], qdq.src[2]
        if scale.op is not Op.CONST or zp.op is not Op.CONST:
            raise self.fail(f, f"{what} '{qdq.name}' has a scale or zero point computed at run "
                               f"time; supported: constants (initializers)")
        d = qdq.dtype if qdq.op is Op.QUANTIZE_LINEAR else qdq.src[0].dtype
        if d not in types:
            raise self.fail(f, f"{what} '{qdq.name}' is {d.name.lower()}; supported: "
                               f"{', '.join(t.name.lower() for t in types)}")
        s = scale.value.astype(np.float64)
        if not np.all(np.isfinite(s)) or np.any(s <= 0):
            raise self.fail(f, f"{what} '{qdq.name}' has scales {s.reshape(-1)[:4].tolist()}; "
                               f"expected finite scales > 0")
        a = qdq.attrs
        assert isinstance(a, o.AxisAttrs)
        return s, zp.value.astype(np.int64), a.axis

    def activation(self, dq: Node, f: Node) -> _Q:
        """The integer tensor behind DQ node dq (one scale and zero point) read by f."""
        s, z, _ = self.params(dq, f, _ACT_TYPES)
        if s.size != 1:
            raise self.fail(f, f"DequantizeLinear '{dq.name}' has {s.size} scales (per "
                               f"channel) on an activation; supported: one scale per tensor")
        return _Q(self.new[id(dq.src[0])], s.reshape(()), z.reshape(()), self.new[id(dq.src[2])])

    def output(self, q: Node, f: Node) -> _Q:
        s, z, _ = self.params(q, f, _ACT_TYPES)
        if s.size != 1:
            raise self.fail(f, f"QuantizeLinear '{q.name}' has {s.size} scales (per channel) "
                               f"on an activation; supported: one scale per tensor")
        return _Q(q, s.reshape(()), z.reshape(()), q.src[2])

    def weight(self, dq: Node, f: Node, axis: int) -> _Q:
        """Weights behind DQ node dq: one scale, or one per channel of `axis`."""
        s, z, ax = self.params(dq, f, _ACT_TYPES)
        if s.size != 1 and (s.ndim != 1 or ax != axis):
            raise self.fail(f, f"DequantizeLinear '{dq.name}' has per-channel scales along axis "
                               f"{ax}; supported: one scale, or one per output channel (axis "
                               f"{axis})")
        if s.size == 1:
            s, z = s.reshape(()), z.reshape(())
        return _Q(self.new[id(dq.src[0])], s, z, self.new[id(dq.src[2])], axis)

    def bias(self, b: Node, s_acc: np.ndarray, f: Node) -> np.ndarray | None:
        """Bias b (constant: DQ of int32, or float), one value or one per channel, in units of
        s_acc as int64; None when b is not constant (the op then stays float)."""

        def per_channel(v: np.ndarray) -> np.ndarray:
            v = v.reshape(-1)
            if v.size not in (1, s_acc.size):
                raise self.fail(f, f"bias of {v.size} values for {s_acc.size} channels")
            return np.broadcast_to(v, s_acc.shape)

        if b.op is Op.DEQUANTIZE_LINEAR and b.src[0].op is Op.CONST:
            s, z, _ = self.params(b, f, (DType.INT32,))
            q = per_channel(b.src[0].value.astype(np.int64) - z.reshape(-1))
            scale = per_channel(s)
            if np.allclose(scale, s_acc, rtol=1e-6, atol=0):
                return q.astype(np.int64)
            real = q * scale
        elif b.op is Op.CONST and b.dtype.is_float:
            real = per_channel(b.value.astype(np.float64))
        else:
            return None
        q = np.round(real / s_acc)
        if np.any(np.abs(q) >= 1 << 31):
            c = int(np.argmax(np.abs(q)))
            raise self.fail(f, f"the bias does not fit int32 in the accumulator's scale: "
                               f"channel {c}'s bias {float(real[c]):.6g} / accumulator scale "
                               f"{float(s_acc[c]):.6g} = {float(q[c]):.6g}, past 2**31 (a bias "
                               f"written as int32, as onnxruntime writes it, always fits)")
        return q.astype(np.int64)

    # -- emitting ------------------------------------------------------------------------------
    def bounds(self, y: _Q, acts: Sequence[Node], f: Node) -> tuple[int, int]:
        """The output's integer range after the clamps acts (innermost first): Q(clip(v, a, b))
        = clip(Q(v), Q(a), Q(b)) since Q is monotonic."""
        lo, hi = _type_range(y.dtype)
        tlo, thi = lo, hi
        for act in acts:
            a, b = -math.inf, math.inf
            if act.op is Op.RELU:
                a = 0.0
            else:
                at = act.attrs
                assert isinstance(at, o.ClipAttrs)
                a = -math.inf if at.min is None else at.min
                b = math.inf if at.max is None else at.max
            qa, qb = (int(min(max(self.q_value(v, y), tlo), thi)) for v in (a, b))
            lo, hi = min(max(lo, qa), qb), min(max(hi, qa), qb)
        return lo, hi

    @staticmethod
    def q_value(v: float, y: _Q) -> float:
        """QuantizeLinear of one real value in float32, as ORT computes it (unsaturated)."""
        if math.isinf(v):
            return v
        return float(np.rint(np.float32(v) / np.float32(y.s))) + y.z

    def requantize(self, acc: Node, bias: np.ndarray | None, real: np.ndarray,
                   bound: np.ndarray, axis: int, y: _Q, lo: int, hi: int, f: Node,
                   name: str, acc_bound: np.ndarray | None = None) -> Node:
        """REQUANTIZE(acc + bias) by `real`, `bound` >= |acc + bias| and `acc_bound` >= |acc|
        per channel (by default bound + |bias|): with it, `choose` may pre-shift (a bias near
        the int32 limits, a tiny multiplier against a large accumulator)."""
        if acc_bound is None:
            acc_bound = bound + (0 if bias is None else np.abs(bias))
        try:
            rq = R.choose(real, bound, "fixed", out_range=(lo, hi), zero_point=y.z,
                          acc_bound=acc_bound, exact=True)
        except R.RequantError as e:
            raise self.fail(f, f"cannot requantise within int32: {e}") from None
        src = [acc]
        if bias is not None and np.any(bias):
            src.append(const(bias.astype(np.int32), f"{f.name}:bias"))
        return _mk(Op.REQUANTIZE, *src, attrs=o.RequantAttrs(rq.multiplier, (rq.shift,), axis,
                                                             lo, hi, y.z, rq.clamp,
                                                             (rq.pre_shift,)),
                   dtype=y.dtype, name=name)

    def rescale(self, x: _Q, y: _Q, lo: int, hi: int, f: Node, name: str) -> Node | None:
        """x brought to y's scale, zero point and dtype, clamped to [lo, hi]."""
        if x.dtype is y.dtype and x.s == y.s and x.z == y.z:
            if (lo, hi) == _type_range(x.dtype):
                return x.node
            return _mk(Op.CLIP, x.node, attrs=o.ClipAttrs(float(lo), float(hi)), name=name)
        if x.node.rank == 0:
            return None
        wide = _mk(Op.CAST, x.node, dtype=_I32, name=f"{name}:widen")
        bias = np.full(wide.shape[0], -x.z, np.int64)
        return self.requantize(wide, bias, np.array([x.s / y.s]), np.array([x.reach]), 0, y,
                               lo, hi, f, name)

    # -- QuantizeLinear: the pattern that ends in it -------------------------------------------
    def quantized(self, q: Node) -> Node | None:
        core, acts = q.src[0], []
        while core.op in _ACTIVATIONS and core.src[0].op in _HANDLERS \
                and core.src[0].op is not Op.DEQUANTIZE_LINEAR:
            acts.append(core)
            core = core.src[0]
        handler = _HANDLERS.get(core.op)
        if handler is None or not core.dtype.is_float:
            return None
        dequantised = [s.op is Op.DEQUANTIZE_LINEAR for s in core.src]
        needed = {Op.CONV: 2, Op.GEMM: 2, Op.MATMUL: 2, Op.DEQUANTIZE_LINEAR: 0}.get(
            core.op, len(dequantised) if core.op in (Op.ADD, Op.CONCAT) else 1)
        if not all(dequantised[:needed]):
            return None  # not a quantised op: its data operands (and weights) are float
        acts.reverse()  # innermost first
        return handler(self, core, acts, self.output(q, core), q.name)

    def conv(self, f: Node, acts: list[Node], y: _Q, name: str) -> Node | None:
        a = f.attrs
        assert isinstance(a, o.ConvAttrs)
        if f.src[1].op is not Op.DEQUANTIZE_LINEAR or a.epilogue != o.NO_EPILOGUE:
            return None
        x = self.activation(f.src[0], f)
        w = self.weight(f.src[1], f, 0)
        bias = f.src[2] if len(f.src) > 2 else None
        return self.int_conv(x, w, bias, a, y, self.bounds(y, acts, f), f, name)

    def int_conv(self, x: _Q, w: _Q, b: Node | None, a: o.ConvAttrs, y: _Q,
                 lohi: tuple[int, int], f: Node, name: str,
                 bias_q: np.ndarray | None = None) -> Node | None:
        cout = w.node.shape[0]
        s_acc = x.s * np.broadcast_to(w.scale, (cout,))
        if b is not None:
            bias_q = self.bias(b, s_acc, f)
            if bias_q is None:
                return None
        acc = _mk(Op.CONV_INTEGER, x.node, w.node, x.zero_node, w.zero_node, attrs=a,
                  name=f"{f.name}:acc")
        bound = self.acc_bound(x, w, 0, bias_q)
        return self.requantize(acc, bias_q, s_acc / y.s, bound, 1, y, *lohi, f, name,
                               self.acc_bound(x, w, 0, None))

    @staticmethod
    def acc_bound(x: _Q, w: _Q, axis: int, bias_q: np.ndarray | None) -> np.ndarray:
        """Per output channel (`axis` of w): the largest |acc + bias| that any input can give,
        acc = sum (x - x_zp) * (w - w_zp). Exact for constant weights: with d = x - x_zp in
        [lo, hi], the extremes are sum(w+) * hi + sum(w-) * lo and sum(w+) * lo + sum(w-) * hi,
        so activations with a zero point at one end of their range (after a ReLU) get one bit
        more of multiplier than 255 * sum |w| would give."""
        shape = w.node.shape
        n = shape[axis]
        b = np.zeros(n, np.int64) if bias_q is None else bias_q.astype(np.int64)
        if w.node.op is not Op.CONST:
            return x.reach * w.reach * (math.prod(shape) // n) + np.abs(b)
        tmin, tmax = _type_range(x.dtype)
        lo, hi = tmin - x.z, tmax - x.z
        v = np.moveaxis(w.node.value.astype(np.int64), axis, 0).reshape(n, -1)
        v = v - np.broadcast_to(w.zero, (n,)).reshape(n, 1)
        pos, neg = np.maximum(v, 0).sum(1), np.minimum(v, 0).sum(1)
        top, bottom = pos * hi + neg * lo + b, pos * lo + neg * hi + b
        return np.maximum(np.abs(top), np.abs(bottom))

    def matmul(self, f: Node, acts: list[Node], y: _Q, name: str) -> Node | None:
        if o.epilogue_of(f) != o.NO_EPILOGUE or len(f.src) != 2 \
                or f.src[1].op is not Op.DEQUANTIZE_LINEAR or f.src[0].rank < 2:
            return None
        x = self.activation(f.src[0], f)
        lohi = self.bounds(y, acts, f)
        if f.src[1].src[0].op is not Op.CONST:
            b = self.activation(f.src[1], f)
            acc = _mk(Op.MATMUL_INTEGER, x.node, b.node, x.zero_node, b.zero_node,
                      name=f"{f.name}:acc")
            k = x.node.shape[-1]
            return self.requantize(acc, None, np.array([x.s * b.s / y.s]),
                                   np.array([x.reach * b.reach * k]), f.rank - 1, y, *lohi,
                                   f, name)
        if f.src[1].rank != 2:
            return None
        w = self.weight(f.src[1], f, 1)
        return self.int_matmul(x, w, None, 1.0, y, lohi, f, name)

    def int_matmul(self, x: _Q, w: _Q, bias_q: np.ndarray | None, alpha: float, y: _Q,
                   lohi: tuple[int, int], f: Node, name: str) -> Node:
        """x (…, K) @ w (K, N) with w per tensor or per column, then REQUANTIZE by column."""
        cols = w.node.shape[1]
        acc = _mk(Op.MATMUL_INTEGER, x.node, w.node, x.zero_node, w.zero_node,
                  name=f"{f.name}:acc")
        s_acc = x.s * np.broadcast_to(w.scale, (cols,))
        bound = self.acc_bound(x, w, 1, bias_q)
        return self.requantize(acc, bias_q, alpha * s_acc / y.s, bound, acc.rank - 1, y, *lohi,
                               f, name, self.acc_bound(x, w, 1, None))

    def gemm(self, f: Node, acts: list[Node], y: _Q, name: str) -> Node | None:
        a = f.attrs
        assert isinstance(a, o.GemmAttrs)
        if a.trans_a or a.epilogue != o.NO_EPILOGUE or a.alpha <= 0 \
                or f.src[1].op is not Op.DEQUANTIZE_LINEAR:
            return None
        x = self.activation(f.src[0], f)
        w = self.weight(f.src[1], f, 0 if a.trans_b else 1)
        if a.trans_b:  # MATMUL_INTEGER takes (K, N)
            wt = (const(w.node.value.T, f"{f.name}:w") if w.node.op is Op.CONST else
                  _mk(Op.TRANSPOSE, w.node, attrs=o.TransposeAttrs((1, 0)), name=f"{f.name}:w"))
            w = _Q(wt, w.scale, w.zero, w.zero_node, 1)
        cols = f.shape[1]
        bias_q = None
        if len(f.src) > 2:
            c = f.src[2]
            s_acc = a.alpha / a.beta * x.s * np.broadcast_to(w.scale, (cols,))
            if c.size not in (1, cols) or (c.rank == 2 and c.shape[0] != 1):
                return None  # not one bias per column
            bias_q = self.bias(c, s_acc, f)
            if bias_q is None:
                return None
        return self.int_matmul(x, w, bias_q, a.alpha, y, self.bounds(y, acts, f), f, name)

    def add(self, f: Node, acts: list[Node], y: _Q, name: str) -> Node | None:
        if f.rank == 0 or not all(s.op is Op.DEQUANTIZE_LINEAR for s in f.src):
            return None
        xa, xb = (self.activation(s, f) for s in f.src)
        # (a - za) * ma + (b - zb) * mb in int32, then >> s: ma / 2**s = sa / sy.
        try:
            rq = R.choose(np.array([xa.s / y.s, xb.s / y.s]), np.array([xa.reach, xb.reach]),
                          "fixed", max_shift=20)
        except R.RequantError as e:
            raise self.fail(f, f"cannot requantise within int32: the operands' scales / the "
                               f"output's: {xa.s / y.s:.4g}, {xb.s / y.s:.4g}: {e}") from None
        ma, mb = rq.multiplier * 2 if len(rq.multiplier) == 1 else rq.multiplier
        full = (-(1 << 31), (1 << 31) - 1)
        terms = []
        for xq, m in ((xa, ma), (xb, mb)):
            wide = _mk(Op.CAST, xq.node, dtype=_I32, name=f"{f.name}:widen")
            terms.append(_mk(Op.REQUANTIZE, wide, attrs=o.RequantAttrs((m,), (0,), 0, *full),
                             dtype=_I32, name=f"{f.name}:scale"))
        total = _mk(Op.ADD, *terms, name=f"{f.name}:sum")
        offset = -(xa.z * ma + xb.z * mb)
        src = [total] + ([const(np.full(f.shape[0], offset, np.int32), f"{f.name}:bias")]
                         if offset else [])
        lo, hi = self.bounds(y, acts, f)
        return _mk(Op.REQUANTIZE, *src, attrs=o.RequantAttrs((1,), (rq.shift,), 0, lo, hi, y.z),
                   dtype=y.dtype, name=name)

    def move(self, f: Node, acts: list[Node], y: _Q, name: str) -> Node | None:
        """Ops that move values: the same op on the integer tensor, then a rescale."""
        x = self.activation(f.src[0], f)
        moved = _mk(f.op, x.node, attrs=f.attrs, shape=f.shape, name=f"{f.name}:int")
        return self.rescale(_Q(moved, x.scale, x.zero, x.zero_node), y,
                            *self.bounds(y, acts, f), f, name)

    def clamp(self, f: Node, acts: list[Node], y: _Q, name: str) -> Node | None:
        """Relu / Clip of a dequantised tensor: the clamp in the output's integers."""
        x = self.activation(f.src[0], f)
        return self.rescale(x, y, *self.bounds(y, [f, *acts], f), f, name)

    def requantize_only(self, f: Node, acts: list[Node], y: _Q, name: str) -> Node | None:
        """Q(DQ(x)): x in the output's scale."""
        return self.rescale(self.activation(f, f), y, *self.bounds(y, acts, f), f, name)

    def concat(self, f: Node, acts: list[Node], y: _Q, name: str) -> Node | None:
        if not all(s.op is Op.DEQUANTIZE_LINEAR for s in f.src):
            return None
        lohi = self.bounds(y, acts, f)
        parts = []
        for k, s in enumerate(f.src):
            part = self.rescale(self.activation(s, f), y, *lohi, f, f"{f.name}:{k}")
            if part is None:
                return None
            parts.append(part)
        return _mk(Op.CONCAT, *parts, attrs=f.attrs, name=name)

    def global_avg_pool(self, f: Node, acts: list[Node], y: _Q, name: str) -> Node | None:
        x = self.activation(f.src[0], f)
        window = math.prod(x.node.shape[2:])
        wide = _mk(Op.CAST, x.node, dtype=_I32, name=f"{f.name}:widen")
        total = _mk(Op.REDUCE_SUM, wide, attrs=o.ReduceAttrs(tuple(range(2, f.rank)), True),
                    name=f"{f.name}:sum")
        bias = np.full(f.shape[1], -x.z * window, np.int64)
        return self.requantize(total, bias, np.array([x.s / (window * y.s)]),
                               np.array([x.reach * window]), 1, y, *self.bounds(y, acts, f),
                               f, name)

    def avg_pool(self, f: Node, acts: list[Node], y: _Q, name: str) -> Node | None:
        a = f.attrs
        assert isinstance(a, o.PoolAttrs)
        x = self.activation(f.src[0], f)
        c = x.node.shape[1]
        conv = o.ConvAttrs(a.kernel, a.strides, a.pads, a.dilations, group=c)
        ones = const(np.ones((c, 1, *a.kernel), np.int8), f"{f.name}:ones")
        try:
            same = conv_shape(x.node.shape, ones.shape, conv) == f.shape
        except InferError:
            same = False
        if not same or (any(a.pads) and not a.count_include_pad):
            return None  # partial windows: their divisor varies; the op stays float
        # Unit weights of scale 1 / window: the accumulator's scale is x_scale / window.
        w = _Q(ones, np.full((), 1.0 / math.prod(a.kernel)), np.zeros((), np.int64),
               const(np.int8(0)), 0)
        return self.int_conv(x, w, None, conv, y, self.bounds(y, acts, f), f, name)

    # -- QLinearConv / QLinearMatMul ------------------------------------------------------------
    def qlinear_params(self, n: Node, src: tuple[Node, ...], idx: Sequence[int]) -> bool:
        return all(src[k].op is Op.CONST for k in idx)

    def qlinear_conv(self, n: Node, src: tuple[Node, ...]) -> Node | None:
        if not self.qlinear_params(n, src, (1, 2, 4, 5, 6, 7)) or (
                len(src) == 9 and src[8].op is not Op.CONST):
            return None  # scales given at run time: the float requantisation stays
        x, xs, xz, w, ws, wz, ys, yz = src[:8]
        a = n.attrs
        assert isinstance(a, o.ConvAttrs)
        if xs.size != 1 or ys.size != 1:
            return None
        xq = _Q(x, xs.value.astype(np.float64).reshape(()), xz.value.astype(np.int64).reshape(()),
                xz)
        wscale = ws.value.astype(np.float64)
        wq = _Q(w, wscale.reshape(()) if wscale.size == 1 else wscale,
                wz.value.astype(np.int64).reshape(wscale.shape) if wz.size == wscale.size else
                wz.value.astype(np.int64), wz)
        yq = _Q(n, ys.value.astype(np.float64).reshape(()), yz.value.astype(np.int64).reshape(()),
                yz)
        bias = src[8].value.astype(np.int64) if len(src) == 9 else None
        return self.int_conv(xq, wq, None, a, yq, _type_range(n.dtype), n, n.name, bias)

    def qlinear_matmul(self, n: Node, src: tuple[Node, ...]) -> Node | None:
        if not self.qlinear_params(n, src, (1, 2, 4, 5, 6, 7)):
            return None
        x, xs, xz, w, ws, wz, ys, yz = src
        if xs.size != 1 or xz.size != 1 or ys.size != 1 or w.rank != 2 or x.rank < 2 \
                or ws.size not in (1, w.shape[1]) or wz.size not in (1, w.shape[1]):
            return None
        xq = _Q(x, xs.value.astype(np.float64).reshape(()), xz.value.astype(np.int64).reshape(()),
                xz)
        wscale = ws.value.astype(np.float64).reshape(-1)
        wq = _Q(w, wscale.reshape(()) if wscale.size == 1 else wscale,
                wz.value.astype(np.int64).reshape(-1)
                if wz.size > 1 else wz.value.astype(np.int64).reshape(()), wz, 1)
        yq = _Q(n, ys.value.astype(np.float64).reshape(()), yz.value.astype(np.int64).reshape(()),
                yz)
        return self.int_matmul(xq, wq, None, 1.0, yq, _type_range(n.dtype), n, n.name)


_Handler = Callable[[_Rewrite, Node, list[Node], _Q, str], "Node | None"]

_HANDLERS: dict[Op, _Handler] = {
    Op.CONV: _Rewrite.conv,
    Op.MATMUL: _Rewrite.matmul,
    Op.GEMM: _Rewrite.gemm,
    Op.ADD: _Rewrite.add,
    Op.RELU: _Rewrite.clamp,
    Op.CLIP: _Rewrite.clamp,
    Op.CONCAT: _Rewrite.concat,
    Op.GLOBAL_AVG_POOL: _Rewrite.global_avg_pool,
    Op.AVG_POOL: _Rewrite.avg_pool,
    Op.DEQUANTIZE_LINEAR: _Rewrite.requantize_only,
    **{op: _Rewrite.move for op in _MOVE},
}
