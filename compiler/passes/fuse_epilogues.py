"""Epilogue fusion: bias, residual and activation into CONV, GEMM and MATMUL."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..ir import ops as o
from ..ir.graph import Graph
from ..ir.ops import Epilogue, Node, Op, const, epilogue_of
from ._rewrite import Uses, fixpoint, rewrite

PRODUCERS = (Op.CONV, Op.GEMM, Op.MATMUL)


def fuse_epilogues(g: Graph) -> Graph:
    """Fold what follows a CONV, GEMM or MATMUL (the producer) into its Epilogue and bias.

    Rewrites, each when the producer is float, has no other user and is not a graph output:
    - ADD of the producer and a CONST that broadcasts along the channel axis only (axis 1 for
      CONV, the last axis for GEMM and MATMUL) and does not grow the result: added into the
      producer's bias operand (created if absent; a GEMM's c becomes beta * c + const, beta 1).
      Only while the epilogue has no activation.
    - ADD of the producer and another tensor of the producer's shape and dtype: the residual
      (the producer's last operand; a zero bias is inserted first if it had none). Only while
      the epilogue has no activation and no residual.
    - RELU, CLIP, LEAKY_RELU, SIGMOID, TANH or GELU (erf form) of the producer: its activation,
      while it has none.
    Applied until nothing changes, so conv -> add bias -> add residual -> relu becomes one CONV.
    Before: g verifies (run fold_constants first, so biases are CONST). After: g verifies, and
    none of these patterns remains; the fused producer takes the name of the last node fused.
    """
    return fixpoint(g, lambda h: rewrite(h, _visit))


def _producer(x: Node, uses: Uses) -> bool:
    return (x.op in PRODUCERS and x.dtype.is_float and x.rank >= 1 and uses(x) == 1
            and not uses.is_output(x))


def _visit(n: Node, uses: Uses) -> Node | None:
    if n.op is Op.ADD:
        for p, other in ((n.src[0], n.src[1]), (n.src[1], n.src[0])):
            if (_producer(p, uses) and other.op is Op.CONST and p.shape == n.shape
                    and epilogue_of(p).activation is None and _has_const_bias(p)):
                vec = _channel_vector(p, other)
                if vec is not None:
                    return _add_bias(p, vec).replace(name=n.name)
        for p, other in ((n.src[0], n.src[1]), (n.src[1], n.src[0])):
            ep = epilogue_of(p)
            if (_producer(p, uses) and other.shape == p.shape and other.dtype is p.dtype
                    and other is not p and ep.activation is None and not ep.residual):
                return _add_residual(p, other).replace(name=n.name)
        return None
    if n.src and _producer(n.src[0], uses) and epilogue_of(n.src[0]).activation is None:
        act = _activation(n)
        if act is not None:
            p = n.src[0]
            ep = dataclasses.replace(act, residual=epilogue_of(p).residual)
            return _with(p, ep).replace(name=n.name)
    return None


def _activation(n: Node) -> Epilogue | None:
    """n as an epilogue activation (without residual), None if it is not one."""
    a = n.attrs
    if n.op is Op.CLIP:
        assert isinstance(a, o.ClipAttrs)
        return Epilogue("clip", clip_min=a.min, clip_max=a.max)
    if n.op is Op.LEAKY_RELU:
        assert isinstance(a, o.AlphaAttrs)
        return Epilogue("leaky_relu", alpha=a.alpha)
    if n.op in (Op.RELU, Op.SIGMOID, Op.TANH):
        return Epilogue(n.op.value)
    if n.op is Op.GELU and isinstance(a, o.GeluAttrs) and a.approximate == "none":
        return Epilogue("gelu")
    return None


def _with(p: Node, ep: Epilogue) -> Node:
    if p.op is Op.MATMUL:
        return p.replace(attrs=o.MatMulAttrs(ep))
    return p.replace(attrs=dataclasses.replace(p.attrs, epilogue=ep))  # type: ignore[call-arg]


def _channels(p: Node) -> int:
    return p.shape[1] if p.op is Op.CONV else p.shape[-1]


def _has_const_bias(p: Node) -> bool:
    return len(p.src) < 3 or p.src[2].op is Op.CONST


def _channel_vector(p: Node, c: Node) -> np.ndarray | None:
    """c as a vector over p's channels, if c varies along the channel axis only."""
    if c.rank > p.rank or c.dtype is not p.dtype:
        return None
    padded = (1,) * (p.rank - c.rank) + c.shape
    axis = 1 if p.op is Op.CONV else p.rank - 1
    if any(d != 1 for i, d in enumerate(padded) if i != axis) or padded[axis] not in (
            1, _channels(p)):
        return None
    return np.broadcast_to(c.value.reshape(-1), (_channels(p),))


def _add_bias(p: Node, vec: np.ndarray) -> Node:
    src = list(p.src)
    if p.op is Op.GEMM and len(src) >= 3:
        at = p.attrs
        assert isinstance(at, o.GemmAttrs)
        old = src[2].value * np.asarray(at.beta, p.dtype.np) if at.beta != 1 else src[2].value
        src[2] = const((old + vec).astype(p.dtype.np))
        return p.replace(src=tuple(src), attrs=dataclasses.replace(at, beta=1.0))
    if len(src) >= 3:
        src[2] = const((src[2].value + vec).astype(p.dtype.np))
        return p.replace(src=tuple(src))
    src.append(const(vec.astype(p.dtype.np)))
    if p.op is Op.GEMM:
        assert isinstance(p.attrs, o.GemmAttrs)
        return p.replace(src=tuple(src), attrs=dataclasses.replace(p.attrs, beta=1.0))
    if p.op is Op.MATMUL:
        return p.replace(src=tuple(src), attrs=o.MatMulAttrs(epilogue_of(p)))
    return p.replace(src=tuple(src))


def _add_residual(p: Node, r: Node) -> Node:
    if len(p.src) == 2:
        p = _add_bias(p, np.zeros(_channels(p), p.dtype.np))
    return _with(p.replace(src=(*p.src, r)), dataclasses.replace(epilogue_of(p), residual=True))
