"""Elementwise fusion into FUSED_ELEMENTWISE."""

from __future__ import annotations

import math

from ..ir import ops as o
from ..ir.dtypes import DType
from ..ir.graph import Graph
from ..ir.infer import broadcast
from ..ir.ops import FusedElementwiseAttrs, Node, Op
from ._rewrite import Uses, rewrite

UNARY_STEPS = {
    Op.RELU: "relu", Op.SIGMOID: "sigmoid", Op.TANH: "tanh", Op.EXP: "exp", Op.LOG: "log",
    Op.SQRT: "sqrt", Op.ERF: "erf", Op.NEG: "neg", Op.ABS: "abs", Op.RECIPROCAL: "reciprocal",
    Op.FLOOR: "floor", Op.CEIL: "ceil", Op.ROUND: "round", Op.SIN: "sin", Op.COS: "cos",
    Op.SOFTPLUS: "softplus", Op.SOFTSIGN: "softsign", Op.HARD_SWISH: "hard_swish",
    Op.IDENTITY: "identity",
}
BINARY_STEPS = {Op.ADD: "add", Op.SUB: "sub", Op.MUL: "mul", Op.DIV: "div", Op.MAX: "max",
                Op.MIN: "min", Op.POW: "pow"}
COMMUTATIVE = frozenset({Op.ADD, Op.MUL, Op.MAX, Op.MIN})

Step = tuple[str, tuple[int, ...], tuple[float, ...]]
Value = tuple[str, int]  # ("in", operand index) or ("step", step index), numbered at the end


def fuse_elementwise(g: Graph) -> Graph:
    """Merge chains of float32 elementwise operations into FUSED_ELEMENTWISE nodes.

    An elementwise node (UNARY_STEPS, BINARY_STEPS, CLIP, LEAKY_RELU, ELU, HARD_SIGMOID,
    GELU in erf form, or a FUSED_ELEMENTWISE) whose operands and result are float32 absorbs
    each operand that is itself such a node with no other user and not a graph output; a scalar
    CONST operand (one element, rank no larger than the other operand's) becomes a float
    constant of the step. A node absorbing nothing is left as it is, so every
    FUSED_ELEMENTWISE has at least two steps. Operands used twice appear once.
    Before: g verifies. After: g verifies; no fusible chain of two or more such nodes remains;
    the fused node takes the name of the chain's last node. Results are bit-identical: each step
    computes what the unfused op computes.
    """
    return rewrite(g, _visit)


def _step(n: Node) -> tuple[str, tuple[float, ...]] | None:
    """(step name, constants) of an elementwise node, None for any other node."""
    if n.dtype is not DType.FLOAT32 or any(s.dtype is not DType.FLOAT32 for s in n.src):
        return None
    a = n.attrs
    if n.op in UNARY_STEPS:
        return UNARY_STEPS[n.op], ()
    if n.op in BINARY_STEPS:
        return BINARY_STEPS[n.op], ()
    if n.op is Op.CLIP:
        assert isinstance(a, o.ClipAttrs)
        return "clip", (-math.inf if a.min is None else a.min,
                        math.inf if a.max is None else a.max)
    if n.op in (Op.LEAKY_RELU, Op.ELU):
        assert isinstance(a, o.AlphaAttrs)
        return n.op.value, (a.alpha,)
    if n.op is Op.HARD_SIGMOID:
        assert isinstance(a, o.HardSigmoidAttrs)
        return "hard_sigmoid", (a.alpha, a.beta)
    if n.op is Op.GELU and isinstance(a, o.GeluAttrs) and a.approximate == "none":
        return "gelu", ()
    return None


def _fusible(n: Node) -> bool:
    return n.op is Op.FUSED_ELEMENTWISE or _step(n) is not None


class _Program:
    def __init__(self) -> None:
        self.operands: list[Node] = []
        self.steps: list[tuple[str, list[Value], tuple[float, ...]]] = []

    def leaf(self, x: Node) -> Value:
        for i, y in enumerate(self.operands):
            if y is x:
                return ("in", i)
        self.operands.append(x)
        return ("in", len(self.operands) - 1)

    def emit(self, name: str, args: list[Value], consts: tuple[float, ...]) -> Value:
        self.steps.append((name, args, consts))
        return ("step", len(self.steps) - 1)

    def node_step(self, n: Node, args: list[Value | None]) -> Value:
        """n's own step over already-emitted argument values args (n is elementwise)."""
        step = _step(n)
        assert step is not None
        name, consts = step
        c = _inlined_const(n)
        if c is not None:
            x = args[1 - c]
            assert x is not None
            return self.emit(name, [x], (float(n.src[c].value.reshape(())),))
        assert None not in args
        return self.emit(name, args, consts)  # type: ignore[arg-type]

    def finish(self) -> tuple[tuple[Node, ...], tuple[Step, ...]]:
        k = len(self.operands)

        def index(v: Value) -> int:
            return v[1] if v[0] == "in" else k + v[1]

        prog = tuple((name, tuple(index(a) for a in args), consts)
                     for name, args, consts in self.steps)
        return tuple(self.operands), prog


def _inlined_const(n: Node) -> int | None:
    """Which operand of binary n becomes a step constant: a one-element CONST (second operand,
    or either for commutative ops) whose rank does not exceed the other operand's."""
    if n.op not in BINARY_STEPS:
        return None
    for c in (1, 0) if n.op in COMMUTATIVE else (1,):
        x, other = n.src[c], n.src[1 - c]
        if x.op is Op.CONST and x.size == 1 and x.rank <= other.rank and other.op is not Op.CONST:
            return c
    return None


def _inline(p: _Program, s: Node) -> Value:
    """Emit the absorbed node s (its operands are leaves)."""
    if s.op is Op.FUSED_ELEMENTWISE:
        assert isinstance(s.attrs, FusedElementwiseAttrs)
        vals = [p.leaf(x) for x in s.src]
        for name, idx, consts in s.attrs.program:
            vals.append(p.emit(name, [vals[i] for i in idx], consts))
        return vals[-1]
    return p.node_step(s, [_arg(p, s, i) for i in range(len(s.src))])


def _arg(p: _Program, n: Node, i: int) -> Value | None:
    if _inlined_const(n) == i:
        return None  # node_step makes it a constant of the step
    return p.leaf(n.src[i])


def _visit(n: Node, uses: Uses) -> Node | None:
    if not _fusible(n):
        return None
    absorb = [s.op is not Op.CONST and _fusible(s) and uses(s) == 1 and not uses.is_output(s)
              for s in n.src]
    if not any(absorb):
        return None
    p = _Program()
    args = [_inline(p, s) if a else _arg(p, n, i)
            for i, (s, a) in enumerate(zip(n.src, absorb))]
    if n.op is Op.FUSED_ELEMENTWISE:
        assert isinstance(n.attrs, FusedElementwiseAttrs)
        vals: list[Value] = [a for a in args if a is not None]
        for name, idx, consts in n.attrs.program:
            vals.append(p.emit(name, [vals[i] for i in idx], consts))
    else:
        p.node_step(n, args)
    operands, program = p.finish()
    if broadcast(*(x.shape for x in operands)) != n.shape:
        return None
    return Node(Op.FUSED_ELEMENTWISE, DType.FLOAT32, n.shape, operands,
                FusedElementwiseAttrs(program), name=n.name)

