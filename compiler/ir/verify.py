"""The verifier: every node's operands, attributes, dtype and shape are legal for its op."""

from __future__ import annotations

from ..errors import VerifyError
from .graph import Graph
from .infer import InferError, infer
from .ops import ConstAttrs, InputAttrs, Node, Op


def _where(i: int, n: Node) -> str:
    return f"node {i} {n.op.name}" + (f" '{n.name}'" if n.name else "")


def verify(g: Graph) -> Graph:
    """Check g and return it unchanged; raise VerifyError naming the first bad node.

    Checks: inputs are INPUT nodes with distinct names and indices 0..n-1; every operand is a
    node of the graph listed before its user; CONST values match the node's dtype and shape;
    each node's dtype and shape equal what `infer` derives from its operands and attributes.
    """
    position = {id(n): i for i, n in enumerate(g.nodes)}
    names = [n.name for n in g.inputs]
    if len(set(names)) != len(names):
        raise VerifyError(f"graph {g.name!r}: duplicate input names {names}")
    for k, n in enumerate(g.inputs):
        if n.op is not Op.INPUT or n.attrs != InputAttrs(k):
            raise VerifyError(f"graph {g.name!r}: input {k} is {n!r}, expected INPUT index {k}")
    for i, n in enumerate(g.nodes):
        if n.op is Op.INPUT and not any(n is x for x in g.inputs):
            raise VerifyError(f"{_where(i, n)}: dangling INPUT, not among the graph's inputs")
        for s in n.src:
            if not isinstance(s, Node) or position.get(id(s), i) >= i:
                raise VerifyError(f"{_where(i, n)}: operand {s!r} is not defined before it")
        if not isinstance(n.shape, tuple) or any(not isinstance(d, int) or d < 0
                                                 for d in n.shape):
            raise VerifyError(f"{_where(i, n)}: shape {n.shape!r} is not a tuple of ints >= 0")
        if isinstance(n.attrs, ConstAttrs) and (n.value.dtype != n.dtype.np
                                                or n.value.shape != n.shape):
            raise VerifyError(f"{_where(i, n)}: value {n.value.dtype}{list(n.value.shape)} "
                              f"differs from the node's {n.dtype.value}{list(n.shape)}")
        try:
            dtype, shape = infer(n.op, n.src, n.attrs, n.dtype, n.shape)
        except InferError as e:
            raise VerifyError(f"{_where(i, n)}: {e}") from None
        if (dtype, shape) != (n.dtype, n.shape):
            raise VerifyError(f"{_where(i, n)}: declared {n.dtype.value}{list(n.shape)}, "
                              f"expected {dtype.value}{list(shape)} from its operands")
    return g
