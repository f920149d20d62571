"""Dead-code and no-op elimination."""

from __future__ import annotations

from ..ir.graph import Graph
from ..ir.ops import Node, Op
from ._rewrite import Uses, rewrite


def eliminate_dead_code(g: Graph) -> Graph:
    """Drop nodes that no output needs, and operations that do nothing.

    Rewrites: IDENTITY; CAST to its operand's dtype; RESHAPE and EXPAND to their operand's
    shape; TRANSPOSE by the identity permutation: all replaced by their operand. A RESHAPE of a
    RESHAPE becomes one RESHAPE of the inner operand.
    Before: g verifies. After: every node is needed by an output; no such no-op remains, except
    where its operand is an INPUT or CONST or itself an output and the no-op is an output (so
    every graph output stays a tensor of its own, which the backends write to a caller's
    buffer). Unused graph inputs are kept (the signature does not change).
    """
    def visit(n: Node, uses: Uses) -> Node | None:
        is_output = uses.is_output(n)
        if n.op is Op.RESHAPE and n.src[0].op is Op.RESHAPE:
            n = n.replace(src=n.src[0].src)
        if not _is_noop(n):
            return n
        x = n.src[0]
        if is_output and (x.op in (Op.INPUT, Op.CONST) or uses.is_output(x)):
            return n
        return x

    return rewrite(g, visit)


def _is_noop(n: Node) -> bool:
    if n.op is Op.IDENTITY:
        return True
    if n.op is Op.CAST:
        return n.dtype is n.src[0].dtype
    if n.op in (Op.RESHAPE, Op.EXPAND):
        return n.shape == n.src[0].shape
    if n.op is Op.TRANSPOSE:
        return tuple(n.attrs.perm) == tuple(range(n.rank))  # type: ignore[attr-defined]
    return False
