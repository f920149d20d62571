"""A clamp of an integer tensor folded into the REQUANTIZE that makes it."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..ir import ops as o
from ..ir.graph import Graph
from ..ir.ops import Node, Op
from ._rewrite import Uses, rewrite


def fold_requant_clamp(g: Graph) -> Graph:
    """Fold ``CLIP(REQUANTIZE(x))`` and ``RELU(REQUANTIZE(x))`` of an integer tensor into one
    REQUANTIZE whose output bounds are the composition: REQUANTIZE ends with
    ``min(max(t, lo), hi)``, and clamping that to ``[a, b]`` is clamping ``t`` to
    ``[clamp(lo, a, b), clamp(hi, a, b)]`` (clamp to ``[a, b]`` is monotone and ``a <= clamp(lo)
    <= clamp(hi) <= b``). Imported QDQ models whose ReLU has its own quantise/dequantise pair
    come out of the importer in this form; folded, the requantisation and the ReLU are one
    operation on every backend (one ALU MAX/MIN pair on the accelerator, no separate step).

    Before: the REQUANTIZE has no other user and is not a graph output; the clamp's bounds
    are integers within its dtype (other bounds are left alone). After: no such pair remains;
    the result keeps the clamp's name. Exact: both compute the same integers.
    """

    def visit(n: Node, uses: Uses) -> Node | None:
        if n.op not in (Op.CLIP, Op.RELU) or n.dtype.np.kind not in "iu":
            return None
        r = n.src[0]
        if r.op is not Op.REQUANTIZE or r.dtype is not n.dtype or uses(r) != 1 \
                or uses.is_output(r):
            return None
        info = np.iinfo(n.dtype.np)
        a, b = info.min, info.max
        if n.op is Op.RELU:
            a = 0
        else:
            assert isinstance(n.attrs, o.ClipAttrs)
            for v in (n.attrs.min, n.attrs.max):
                if v is not None and (float(v) != int(v) or not info.min <= v <= info.max):
                    return None
            a = info.min if n.attrs.min is None else int(n.attrs.min)
            b = info.max if n.attrs.max is None else int(n.attrs.max)
            if a > b:
                return None
        ra = r.attrs
        assert isinstance(ra, o.RequantAttrs)
        lo, hi = min(max(ra.lo, a), b), min(max(ra.hi, a), b)
        return r.replace(attrs=dataclasses.replace(ra, lo=lo, hi=hi), name=n.name)

    return rewrite(g, visit)
