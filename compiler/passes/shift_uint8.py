"""uint8 activations of the integer graph made int8: the same real values, zero points - 128."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from ..ir import ops as o
from ..ir.dtypes import DType
from ..ir.graph import Graph
from ..ir.infer import infer
from ..ir.ops import Node, Op, const

U8, I8, I32 = DType.UINT8, DType.INT8, DType.INT32
SHIFT = 128
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

# Ops whose result is elements of their data operands, moved (the first operand only; GATHER's
# indices are not data). A uint8 tensor moves as its int8 form; an int32 tensor that stands for
# `node + k` moves with its k.
_MOVE_FIRST = frozenset({Op.RESHAPE, Op.TRANSPOSE, Op.IDENTITY, Op.SLICE, Op.EXPAND, Op.TILE,
                         Op.GATHER, Op.GATHER_ELEMENTS, Op.GATHER_ND})
# Order-preserving on 8-bit values (x - 128 keeps the order; padding is the type's lowest
# value, 0 for uint8 and -128 for int8): the int8 form in, the int8 form out.
_ORDER_SAME = frozenset({Op.MAX_POOL, Op.GLOBAL_MAX_POOL, Op.REDUCE_MAX, Op.REDUCE_MIN})
_ORDER_ALL = frozenset({Op.MAX, Op.MIN})  # every operand data
# Results that depend on the order of their operand only (indices): the int8 form in.
_ORDER_INDEX = frozenset({Op.ARGMAX, Op.ARGMIN, Op.TOPK, Op.MAX_POOL_INDEX})


def shift_uint8(g: Graph) -> Graph:
    """Every uint8 activation of the integer graph as int8 with its zero point shifted by -128
    (``x' = x - 128``: the same real values ``(x - z) * s = (x' - (z - 128)) * s``), so the
    accelerator, whose GEMM multiplies int8 by int8, sees int8 everywhere. Exact: every result
    of the graph is the same, bit for bit.

    Rewrites (z, zx, zw: CONST zero points; x' = x - 128 the int8 form of uint8 x):

    - QUANTIZE_LINEAR(x, s, z) to uint8: to int8 with z - 128 (saturating to [0, 255] then
      subtracting 128 is saturating to [-128, 127]);
    - REQUANTIZE to uint8 (zero point z, bounds [lo, hi]): to int8 with z - 128 and
      [lo - 128, hi - 128], where its last steps cannot wrap int32 (a shift >= 1, or a bounded
      accumulator); otherwise it stays uint8;
    - CONV_INTEGER / MATMUL_INTEGER(x, w, zx, zw): x' and zx - 128 (x - zx unchanged); uint8
      weights likewise (w' and zw - 128);
    - DEQUANTIZE_LINEAR(x, s, z): x' and z - 128;
    - movement (RESHAPE, TRANSPOSE, SLICE, EXPAND, TILE, GATHER*, CONCAT) and order-preserving
      ops (MAX_POOL, GLOBAL_MAX_POOL, REDUCE_MAX / MIN, MAX, MIN, the index ops ARGMAX, ARGMIN,
      TOPK, MAX_POOL_INDEX) on x': the same op; PAD with a constant value v in [0, 255]: v - 128;
      CLIP with integer bounds in [0, 255]: the bounds - 128; RELU (the identity on uint8):
      dropped;
    - CAST(x) to int32 is CAST(x') + 128: the +128 is carried, not computed, through what is
      linear in int32 arithmetic modulo 2**32 (ADD, SUB, MUL by a one-value constant,
      REDUCE_SUM: times the count summed, movement, a REQUANTIZE with shift 0, no clamp and the
      int32 range: times its multiplier)
      into the bias of the REQUANTIZE that consumes it (a bias is added where there was none;
      one that becomes all zero is dropped). So QDQ's rescale ``REQUANTIZE(CAST(x), -z)``
      becomes ``REQUANTIZE(CAST(x'), -(z - 128))``, its GlobalAveragePool ``REQUANTIZE(
      REDUCE_SUM(CAST(x)), -z * n)`` gets ``-(z - 128) * n``, and its Add ``REQUANTIZE(ADD(
      REQUANTIZE(CAST(a), m_a), REQUANTIZE(CAST(b), m_b)), -(z_a m_a + z_b m_b))`` gets the
      shifted zero points in the sum's bias. Anything else that reads such a value gets it
      with an explicit ADD of the constant (always exact), and so does a REQUANTIZE with a
      pre-shift (its bias does not wrap modulo 2**32) unless its input is a widened byte or
      a REDUCE_SUM of them and the bias + k fits int32.

    At the graph's edges the signature does not change: a uint8 input is made int8 for the
    CONV_INTEGER / MATMUL_INTEGER that read it by ``REQUANTIZE(CAST(x), 1, shift 0, zero point
    -128)``; a uint8 output, and any op not listed above that reads a rewritten uint8 value
    (a float CAST, QLINEAR_CONV with scales given at run time...), gets it back by
    ``REQUANTIZE(CAST(x'), 1, shift 0, zero point 128)``. A uint8 value whose producer is not
    listed stays uint8 (it is converted only for a CONV_INTEGER / MATMUL_INTEGER), and so does
    a QUANTIZE_LINEAR that no user reads as int8 (directly or through the ops above that move
    it): it is not rewritten only to be converted back. A REQUANTIZE to uint8 is rewritten
    whatever reads it (its int8 form is what the accelerator writes); the ops that move a
    value follow their operand's form, so a conversion back comes as late as it can.

    Before: g verifies; the integer ops are as `frontend.qdq` or `compiler.quantize` make them
    (zero points that are not CONST leave their op as it is). After: the only uint8 values are
    graph inputs and outputs and their conversions, values of ops not listed, and the values
    those ops read; the rewritten nodes keep their names (conversions are named
    ``<name>:int8`` / ``<name>:uint8``). A graph without uint8 values is returned as it is.
    Not covered: QUANTIZE_LINEAR of NaN, which ONNX leaves undefined (numpy gives 0 in both
    types: 0 for uint8, 128 after the shift).
    """
    if not any(n.dtype is U8 for n in g.nodes):
        return g
    return _Shift(g).run()


@dataclasses.dataclass(frozen=True, slots=True)
class _Val:
    """An original node's value in the new graph: ``original = node + k``. k is 0 (the same
    value and dtype), 128 (node is the int8 form of a uint8 value), or, for int32 values, any
    int32 constant still to be added (modulo 2**32)."""

    node: Node
    k: int = 0


def _wrap(v: int) -> int:
    return (v - _I32_MIN) % (1 << 32) + _I32_MIN


def _mk(op: Op, *src: Node, attrs: o.Attrs = o.NO_ATTRS, dtype: DType | None = None,
        shape: tuple[int, ...] | None = None, name: str = "") -> Node:
    d, s = infer(op, src, attrs, dtype, shape)
    return Node(op, d, s, tuple(src), attrs, name)


def _convert(x: Node, to: DType, name: str) -> Node:
    """x (uint8 or int8) as the other 8-bit type, x -/+ 128: REQUANTIZE(CAST(x)) with
    multiplier 1, shift 0 and zero point -+128 (exact: no step leaves [-128, 255]); a scalar
    as one element (REQUANTIZE needs an axis)."""
    if x.rank == 0:
        one = _convert(_mk(Op.RESHAPE, x, shape=(1,), name=f"{name}:1"), to, name)
        return _mk(Op.RESHAPE, one, shape=(), name=f"{name}:0")
    zp = -SHIFT if to is I8 else SHIFT
    lo, hi = (-128, 127) if to is I8 else (0, 255)
    wide = _mk(Op.CAST, x, dtype=I32, name=f"{name}:widen")
    return _mk(Op.REQUANTIZE, wide, attrs=o.RequantAttrs((1,), (0,), 0, lo, hi, zp),
               dtype=to, name=name)


def _shifted_const(c: Node) -> Node:
    return const((c.value.astype(np.int16) - SHIFT).astype(np.int8), c.name)


def _pre_shift(a: o.RequantAttrs) -> tuple[int, ...]:
    """REQUANTIZE's pre-shift (a field newer than some graphs' attributes: none is 0)."""
    return tuple(getattr(a, "pre_shift", (0,)))


def _byte(v: float) -> bool:
    """v is an integer in uint8's range."""
    return math.isfinite(v) and v == int(v) and 0 <= v <= 255


def _takes_int8(u: Node, n: Node, want: set[int]) -> bool:
    """Whether user u reads its uint8 operand n as the int8 form as cheaply (want: the uint8
    results that are themselves wanted as int8)."""
    first = u.src[0] is n
    if u.op in (Op.CONV_INTEGER, Op.MATMUL_INTEGER):
        return any(u.src[d] is n and u.src[z].op is Op.CONST for d, z in ((0, 2), (1, 3)))
    if u.op is Op.DEQUANTIZE_LINEAR:
        return first and u.src[2].op is Op.CONST
    if u.op is Op.CAST:
        return u.dtype is I32
    if u.op in _ORDER_INDEX:
        return first
    if u.dtype is not U8 or id(u) not in want:
        return False
    a = u.attrs
    if u.op in _MOVE_FIRST | _ORDER_SAME:
        return first
    if u.op is Op.PAD:
        return isinstance(a, o.PadAttrs) and (a.mode != "constant" or _byte(a.value))
    if u.op is Op.CLIP:
        return isinstance(a, o.ClipAttrs) and all(v is None or _byte(v) for v in (a.min, a.max))
    return u.op in _ORDER_ALL or u.op in (Op.CONCAT, Op.RELU)


def _bound(n: Node) -> int | None:
    """max |n| over every input, for an int32 n that is an 8-bit value widened or a REDUCE_SUM
    of one (else None)."""
    if n.op is Op.CAST and n.src[0].dtype in (U8, I8):
        return 255 if n.src[0].dtype is U8 else 128
    if n.op is Op.REDUCE_SUM and isinstance(n.attrs, o.ReduceAttrs):
        b = _bound(n.src[0])
        return None if b is None else b * math.prod(n.src[0].shape[i] for i in n.attrs.axes)
    return None


class _Shift:
    def __init__(self, g: Graph) -> None:
        self.g = g
        self.val: dict[int, _Val] = {}
        self.memo: dict[tuple[int, str], Node] = {}  # conversions and shifted constants
        self.want = self.wanted(g)

    def run(self) -> Graph:
        for n in self.g.nodes:
            self.val[id(n)] = _Val(n) if n.op in (Op.INPUT, Op.CONST) else self.visit(n)
        outputs = tuple(self.plain(n) for n in self.g.outputs)
        return self.g.replace(outputs=outputs)

    @staticmethod
    def wanted(g: Graph) -> set[int]:
        """The uint8 nodes (ids) that some user reads as their int8 form without a conversion,
        directly or through ops that move them. Only those QUANTIZE_LINEARs are rewritten: a
        value that nothing reads as int8 is not made int8 to be converted back. (A REQUANTIZE
        always is, where exact: its int8 form is what the accelerator writes; the ops that
        move a value follow their operand's form, so a conversion back, if any, comes last.)"""
        want: set[int] = set()
        users = g.users()
        for n in reversed(g.nodes):
            if n.dtype is U8 and any(_takes_int8(u, n, want) for u in users[n]):
                want.add(id(n))
        return want

    # -- reading an operand in the form a consumer takes ---------------------------------------
    def plain(self, n: Node) -> Node:
        """n's value exactly as in the original graph (dtype included)."""
        v = self.val[id(n)]
        if v.k == 0:
            return v.node
        if n.dtype is U8:
            return self._once(v.node, "uint8", lambda: _convert(v.node, U8, f"{n.name}:uint8"))
        k = const(np.int32(v.k), f"{n.name}:offset")
        return self._once(v.node, "offset", lambda: _mk(Op.ADD, v.node, k, name=f"{n.name}:+k"))

    def shifted(self, n: Node, convert: bool) -> Node | None:
        """The int8 form x - 128 of uint8 n: as computed, a CONST's, or (convert) a conversion
        of the uint8 value; None where there is none (convert False)."""
        v = self.val[id(n)]
        if v.k == SHIFT:
            return v.node
        if n.op is Op.CONST:
            return self._once(n, "shifted", lambda: _shifted_const(n))
        if convert:
            return self._once(v.node, "int8", lambda: _convert(v.node, I8, f"{n.name}:int8"))
        return None

    def _once(self, n: Node, what: str, make: Callable[[], Node]) -> Node:
        key = (id(n), what)
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def same(self, n: Node) -> _Val:
        """n with its operands read plain (the node itself when none changed)."""
        src = tuple(self.plain(s) for s in n.src)
        if all(a is b for a, b in zip(src, n.src)):
            return _Val(n)
        return _Val(n.replace(src=src))

    # -- one node --------------------------------------------------------------------------------
    def visit(self, n: Node) -> _Val:
        handler = _HANDLERS.get(n.op)
        out = handler(self, n) if handler is not None else None
        return self.same(n) if out is None else out

    def quantize(self, n: Node) -> _Val | None:
        x, scale, z = n.src
        if n.dtype is not U8 or z.op is not Op.CONST or id(n) not in self.want:
            return None
        zs = self.shifted(z, False)
        assert zs is not None
        return _Val(n.replace(src=(self.plain(x), self.plain(scale), zs), dtype=I8), SHIFT)

    def dequantize(self, n: Node) -> _Val | None:
        x, scale, z = n.src
        xs = self.shifted(x, False) if x.dtype is U8 and z.op is Op.CONST else None
        if xs is None:
            return None
        zs = self.shifted(z, False)
        assert zs is not None
        return _Val(n.replace(src=(xs, self.plain(scale), zs)))

    def integer_product(self, n: Node) -> _Val | None:
        """CONV_INTEGER / MATMUL_INTEGER: each uint8 operand with a CONST zero point as int8."""
        src: list[Node | None] = [None] * 4
        for data, zero in ((0, 2), (1, 3)):
            d, z = n.src[data], n.src[zero]
            if d.dtype is U8 and z.op is Op.CONST:
                src[data], src[zero] = self.shifted(d, True), self.shifted(z, False)
            if src[data] is None:
                src[data], src[zero] = self.plain(d), self.plain(z)
        if all(a is b for a, b in zip(src, n.src)):
            return None
        return _Val(n.replace(src=tuple(src)))

    def cast(self, n: Node) -> _Val | None:
        x = n.src[0]
        if n.dtype is not I32 or x.dtype is not U8 or self.val[id(x)].k != SHIFT:
            return None
        return _Val(n.replace(src=(self.val[id(x)].node,)), SHIFT)

    def requantize(self, n: Node) -> _Val | None:
        a = n.attrs
        assert isinstance(a, o.RequantAttrs)
        x = self.val[id(n.src[0])]
        bias = n.src[1] if len(n.src) > 1 else None
        src: list[Node] = [x.node]
        out_k = 0
        pre = any(_pre_shift(a))
        linear = (n.dtype is I32 and not any(a.shift) and not any(a.clamp) and not pre
                  and (a.lo, a.hi) == (_I32_MIN, _I32_MAX) and len(a.multiplier) == 1)
        if x.k and linear:  # (x + k) * m: carry k * m to the consumer
            out_k = _wrap(x.k * a.multiplier[0])
            src += [self.plain(bias)] if bias is not None else []
        elif x.k and pre and not self.pre_shift_absorbs(n, x.k):
            src = [self.plain(n.src[0])] + ([] if bias is None else [self.plain(bias)])
        else:
            src += self.bias_plus(n, bias, x.k)
        attrs, dtype = a, n.dtype
        if n.dtype is U8 and self.no_wrap(n):
            attrs = dataclasses.replace(a, zero_point=a.zero_point - SHIFT, lo=a.lo - SHIFT,
                                        hi=a.hi - SHIFT)
            dtype, out_k = I8, SHIFT
        if out_k == 0 and dtype is n.dtype and all(p is q for p, q in zip(src, n.src)) \
                and len(src) == len(n.src):
            return None
        return _Val(n.replace(src=tuple(src), attrs=attrs, dtype=dtype), out_k)

    def bias_plus(self, n: Node, bias: Node | None, k: int) -> list[Node]:
        """REQUANTIZE n's bias operand (as a list: none or one) with k added."""
        if k == 0:
            return [] if bias is None else [self.plain(bias)]
        a = n.attrs
        assert isinstance(a, o.RequantAttrs)
        channels = n.shape[a.axis]
        if bias is None or bias.op is Op.CONST:
            old = np.zeros(channels, np.int64) if bias is None else bias.value.astype(np.int64)
            new = (old + k - _I32_MIN) % (1 << 32) + _I32_MIN
            if not np.any(new):
                return []
            return [const(new.astype(np.int32), f"{n.name}:bias")]
        kc = const(np.full(channels, k, np.int32), f"{n.name}:offset")
        return [_mk(Op.ADD, self.plain(bias), kc, name=f"{n.name}:bias")]

    @staticmethod
    def pre_shift_absorbs(n: Node, k: int) -> bool:
        """Whether REQUANTIZE n with a pre-shift computes the same with bias + k on x - k. Its
        first steps, ``(x + low bits of the bias + rounding) >> p`` plus the bias's high bits,
        are floor((x + bias + 2**(p-1)) / 2**p) exactly, not modulo 2**32: the same for
        both where the bias + k fits int32 and |x| < 2**29 (a widened byte, or a sum of
        fewer than 2**21: x + the low bits, below 1.5 * 2**30, cannot wrap)."""
        bias, bound = (n.src[1] if len(n.src) > 1 else None), _bound(n.src[0])
        if bound is None or bound >= 1 << 29 or (bias is not None and bias.op is not Op.CONST):
            return False
        b = np.zeros(1, np.int64) if bias is None else bias.value.astype(np.int64)
        return bool(np.all((b + k >= _I32_MIN) & (b + k <= _I32_MAX)))

    @staticmethod
    def no_wrap(n: Node) -> bool:
        """Whether REQUANTIZE n's ``t + zero_point`` stays in int32 both with its zero point and
        with zero point - 128: |t| <= 2**31 - 256 for every input. True with shift >= 1 (|t| <=
        2**30); with shift 0 where |acc + bias| * |m| is bounded so (a clamp, or an accumulator
        that is an 8-bit value widened, or a sum of them)."""
        a = n.attrs
        assert isinstance(a, o.RequantAttrs)
        ch = n.shape[a.axis]

        def per(v: tuple[int, ...]) -> np.ndarray:
            return np.broadcast_to(np.abs(np.asarray(v, np.int64)), (ch,))

        shift, mult, clamp = per(a.shift), per(a.multiplier), per(a.clamp)
        bound = _bound(n.src[0])
        bias = (np.abs(n.src[1].value.astype(np.int64)) if len(n.src) > 1
                and n.src[1].op is Op.CONST else None)
        acc = np.full(ch, -1, np.int64) if bound is None or (len(n.src) > 1 and bias is None) \
            else bound + (0 if bias is None else bias)
        if any(_pre_shift(a)):  # floor((acc + 2**(p-1)) / 2**p) <= |acc| + 1
            acc = np.where(acc >= 0, acc + 1, acc)
        acc = np.where(clamp > 0, clamp, acc)
        ok = (shift >= 1) | ((acc >= 0) & (acc * mult <= (1 << 31) - 256))
        return bool(np.all(ok))

    def carry(self, n: Node) -> _Val | None:
        """ADD / SUB of int32 values standing for node + k, or MUL of one by a constant of
        one value: the k carried."""
        if n.dtype is not I32:
            return None
        a, b = (self.val[id(s)] for s in n.src)
        if a.k == 0 and b.k == 0:
            return None
        if n.op is Op.MUL:  # (x + k) * c for a constant c of one value: k * c
            c = [v.node for v in (a, b) if v.k == 0 and v.node.op is Op.CONST and v.node.size == 1]
            if not c or (a.k and b.k):
                return None
            k = (a.k or b.k) * int(c[0].value.reshape(-1)[0])
        else:
            k = a.k + b.k if n.op is Op.ADD else a.k - b.k
        return _Val(n.replace(src=(a.node, b.node)), _wrap(k))

    def reduce_sum(self, n: Node) -> _Val | None:
        x = self.val[id(n.src[0])]
        at = n.attrs
        assert isinstance(at, o.ReduceAttrs)
        if n.dtype is not I32 or x.k == 0:
            return None
        count = math.prod(n.src[0].shape[i] for i in at.axes)
        return _Val(n.replace(src=(x.node,)), _wrap(x.k * count))

    def move(self, n: Node, data: int) -> _Val | None:
        """An op moving (or selecting by order) the values of its first `data` operands (all
        when data is -1): the same op on their common form."""
        count = len(n.src) if data < 0 else data
        ks = {self.val[id(s)].k for s in n.src[:count]}
        rest = [self.plain(s) for s in n.src[count:]]
        if n.dtype is U8 or (n.src[0].dtype is U8 and n.op in _ORDER_INDEX):
            if SHIFT not in ks:
                return None
            shifted = [self.shifted(s, True) for s in n.src[:count]]
            if any(s is None for s in shifted):
                return None
            k = SHIFT if n.dtype is U8 else 0
            return _Val(n.replace(src=(*shifted, *rest), dtype=I8 if k else n.dtype), k)
        if n.dtype is I32 and len(ks) == 1 and n.op in _MOVE_FIRST | {Op.CONCAT}:
            (k,) = ks
            if k:
                return _Val(n.replace(src=(*(self.val[id(s)].node for s in n.src[:count]),
                                           *rest)), k)
        return None

    def pad(self, n: Node) -> _Val | None:
        a = n.attrs
        assert isinstance(a, o.PadAttrs)
        if n.dtype is not U8 or self.val[id(n.src[0])].k != SHIFT:
            return None
        if a.mode == "constant":
            if not _byte(a.value):
                return None
            a = dataclasses.replace(a, value=float(a.value - SHIFT))
        return _Val(n.replace(src=(self.val[id(n.src[0])].node,), attrs=a, dtype=I8), SHIFT)

    def clip(self, n: Node) -> _Val | None:
        x = self.val[id(n.src[0])]
        if n.dtype is not U8 or x.k != SHIFT:
            return None
        if n.op is Op.RELU:  # max(x, 0) of uint8 is x (eliminate_dead_code drops the copy)
            return _Val(n.replace(op=Op.IDENTITY, src=(x.node,), dtype=I8), SHIFT)
        a = n.attrs
        assert isinstance(a, o.ClipAttrs)
        bounds = []
        for v in (a.min, a.max):
            if v is not None and not _byte(v):
                return None
            bounds.append(None if v is None else float(v - SHIFT))
        return _Val(n.replace(src=(x.node,), attrs=o.ClipAttrs(*bounds), dtype=I8), SHIFT)


_HANDLERS: dict[Op, Callable[[_Shift, Node], _Val | None]] = {
    Op.QUANTIZE_LINEAR: _Shift.quantize,
    Op.DEQUANTIZE_LINEAR: _Shift.dequantize,
    Op.CONV_INTEGER: _Shift.integer_product,
    Op.MATMUL_INTEGER: _Shift.integer_product,
    Op.CAST: _Shift.cast,
    Op.REQUANTIZE: _Shift.requantize,
    Op.ADD: _Shift.carry,
    Op.SUB: _Shift.carry,
    Op.MUL: _Shift.carry,
    Op.REDUCE_SUM: _Shift.reduce_sum,
    Op.PAD: _Shift.pad,
    Op.CLIP: _Shift.clip,
    Op.RELU: _Shift.clip,
    Op.CONCAT: lambda s, n: s.move(n, -1),
    **{op: (lambda s, n: s.move(n, 1)) for op in _MOVE_FIRST | _ORDER_SAME | _ORDER_INDEX},
    **{op: (lambda s, n: s.move(n, -1)) for op in _ORDER_ALL},
}
