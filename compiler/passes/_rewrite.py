"""The rewriting loop the passes share: one walk in topological order, operands first."""

from __future__ import annotations

from collections.abc import Callable

from ..ir.graph import Graph
from ..ir.ops import Node, Op


class Uses:
    """uses(m): how many times the rewritten node m is used in the original graph (operand
    uses plus graph outputs), so a pass can tell whether fusing m away is safe;
    uses.is_output(m): whether m stands for a graph output."""

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.outputs: set[int] = set()

    def __call__(self, m: Node) -> int:
        return self.count.get(id(m), 0)

    def is_output(self, m: Node) -> bool:
        return id(m) in self.outputs


# visit(node, uses) -> a replacement for node, or None to keep it; node's operands are already
# the rewritten ones.
Visitor = Callable[[Node, Uses], "Node | None"]


def rewrite(g: Graph, visit: Visitor) -> Graph:
    """Apply visit to every non-input node of g once and rebuild the graph from its outputs
    (nodes no output needs any more disappear). Inputs are never replaced."""
    count: dict[int, int] = {id(n): 0 for n in g.nodes}
    for n in g.nodes:
        for s in n.src:
            count[id(s)] += 1
    for n in g.outputs:
        count[id(n)] += 1
    out_ids = {id(n) for n in g.outputs}
    new: dict[int, Node] = {}
    uses = Uses()

    for n in g.nodes:
        src = tuple(new[id(s)] for s in n.src)
        m = n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
        if id(n) in out_ids:
            uses.outputs.add(id(m))  # visit may ask about the node itself
        if n.op is not Op.INPUT:
            r = visit(m, uses)
            if r is not None:
                m = r
        # A replacement that is an existing node (an operand, say) gains n's uses; counting its
        # old uses too over-approximates, which only makes fusion more cautious.
        uses.count[id(m)] = uses.count.get(id(m), 0) + count[id(n)]
        if id(n) in out_ids:
            uses.outputs.add(id(m))
        new[id(n)] = m
    return g.replace(inputs=tuple(new[id(n)] for n in g.inputs),
                     outputs=tuple(new[id(n)] for n in g.outputs))


def fixpoint(g: Graph, step: Callable[[Graph], Graph], limit: int = 32) -> Graph:
    """Apply step until the graph stops changing (at most limit times)."""
    for _ in range(limit):
        h = step(g)
        if len(h.nodes) == len(g.nodes) and all(a is b for a, b in zip(h.nodes, g.nodes)):
            return h
        g = h
    return g
