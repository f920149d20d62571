"""Constant folding."""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from ..ir.interpreter import evaluate
from ..ir.ops import Node, Op, const
from ._rewrite import Uses, rewrite

MAX_FOLDED_BYTES = 16 << 20


def fold_constants(g: Graph) -> Graph:
    """Replace every node whose operands are all CONST by a CONST holding its value, computed by
    the reference interpreter's per-op evaluation (so folding changes no result).

    Before: g verifies. After: no node except INPUT and CONST has only CONST operands, except
    nodes whose value would exceed MAX_FOLDED_BYTES (16 MiB): those are kept, since folding
    them would grow the model's parameters (an EXPAND or TILE of a small constant, say), and
    nodes whose evaluation raises (left to fail at run time). The folded constant keeps the
    node's name.
    """

    def visit(n: Node, uses: Uses) -> Node | None:
        if n.op in (Op.INPUT, Op.CONST) or not all(s.op is Op.CONST for s in n.src):
            return None
        if n.size * n.dtype.np.itemsize > MAX_FOLDED_BYTES:
            return None
        try:
            with np.errstate(all="ignore"):  # 1 / 0 folds to inf as it would run: no warning
                value = evaluate(n, [s.value for s in n.src])
        except (ArithmeticError, ValueError):
            return None  # leave the failure to run time, where it names its inputs
        return const(value, name=n.name, dtype=n.dtype)

    return rewrite(g, visit)
