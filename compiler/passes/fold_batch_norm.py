"""Batch normalisation folding."""

from __future__ import annotations

import numpy as np

from ..ir import ops as o
from ..ir.graph import Graph
from ..ir.ops import Node, Op, const, epilogue_of
from ._rewrite import Uses, rewrite


def fold_batch_norm(g: Graph) -> Graph:
    """Fold inference BATCH_NORM y = (x - mean) * scale / sqrt(var + eps) + bias, i.e.
    y = x * s + t, into what computes x.

    - After a CONV with constant weights (and bias, if any), no epilogue and no other user:
      one CONV with weights w * s (per output channel) and bias b * s + t.
    - After a GEMM or a MATMUL with a 2-D result (channels are its last axis) whose second
      operand is a constant 2-D matrix, likewise (the GEMM gets c = beta * c * s + t, beta 1;
      the MATMUL gets a bias operand, MatMulAttrs).
    - Otherwise: MUL(x, s) then ADD(t), s and t shaped [C, 1, ...] to broadcast along axis 1.
    Before: the BATCH_NORM's scale, bias, mean and var are CONST (run fold_constants first);
    BATCH_NORMs with non-constant parameters are left alone. After: no such BATCH_NORM
    remains. Folding is done in float64 and rounded once to the node's dtype.
    """

    def visit(n: Node, uses: Uses) -> Node | None:
        if n.op is not Op.BATCH_NORM or not all(p.op is Op.CONST for p in n.src[1:]):
            return None
        assert isinstance(n.attrs, o.EpsilonAttrs)
        scale, bias, mean, var = (p.value.astype(np.float64) for p in n.src[1:])
        s = scale / np.sqrt(var + n.attrs.epsilon)
        t = bias - mean * s
        x = n.src[0]
        foldable = (x.op in (Op.CONV, Op.GEMM, Op.MATMUL) and uses(x) == 1
                    and not uses.is_output(x) and epilogue_of(x) == o.NO_EPILOGUE
                    and all(p.op is Op.CONST for p in x.src[1:]))
        if foldable and x.op is Op.CONV:
            return _fold_conv(n, x, s, t)
        if foldable and x.op is Op.GEMM:
            return _fold_gemm(n, x, s, t)
        if foldable and x.op is Op.MATMUL and x.rank == 2 and x.src[1].rank == 2:
            return _fold_matmul(n, x, s, t)
        per_channel = (-1, *([1] * (n.rank - 2)))
        mul = Node(Op.MUL, n.dtype, n.shape, (x, _const(s.reshape(per_channel), n)))
        return Node(Op.ADD, n.dtype, n.shape, (mul, _const(t.reshape(per_channel), n)),
                    name=n.name)

    return rewrite(g, visit)


def _const(v: np.ndarray, like: Node) -> Node:
    return const(v.astype(like.dtype.np))


def _fold_conv(n: Node, conv: Node, s: np.ndarray, t: np.ndarray) -> Node:
    x, w = conv.src[:2]
    wv = w.value.astype(np.float64) * s.reshape(-1, *([1] * (w.rank - 1)))
    b = conv.src[2].value.astype(np.float64) if len(conv.src) == 3 else 0.0
    return conv.replace(src=(x, _const(wv, w), _const(b * s + t, n)), name=n.name)


def _fold_gemm(n: Node, gemm: Node, s: np.ndarray, t: np.ndarray) -> Node:
    a, b = gemm.src[:2]
    at = gemm.attrs
    assert isinstance(at, o.GemmAttrs)
    bv = b.value.astype(np.float64) * (s[:, None] if at.trans_b else s[None, :])
    c = gemm.src[2].value.astype(np.float64) * at.beta if len(gemm.src) == 3 else 0.0
    return gemm.replace(src=(a, _const(bv, b), _const(c * s + t, n)),
                        attrs=o.GemmAttrs(at.alpha, 1.0, at.trans_a, at.trans_b), name=n.name)


def _fold_matmul(n: Node, mm: Node, s: np.ndarray, t: np.ndarray) -> Node:
    a, b = mm.src[:2]
    bv = b.value.astype(np.float64) * s[None, :]
    bias = mm.src[2].value.astype(np.float64) if len(mm.src) == 3 else 0.0
    return mm.replace(src=(a, _const(bv, b), _const(bias * s + t, n)), attrs=o.MatMulAttrs(),
                      name=n.name)
