"""A computation graph: named inputs, named outputs, and the nodes between them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .ops import Node, Op


@dataclass(frozen=True, slots=True, eq=False)
class Graph:
    """An immutable graph. `nodes` lists every node reachable from the outputs (and every input)
    in topological order: each node after all of its operands.

    inputs are INPUT nodes, named by their `name`; outputs may be any node (an input or a
    constant too) and are named by output_names, one per output.
    """

    inputs: tuple[Node, ...]
    outputs: tuple[Node, ...]
    output_names: tuple[str, ...]
    name: str = "graph"
    nodes: tuple[Node, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.outputs) != len(self.output_names):
            raise ValueError(f"graph {self.name!r}: {len(self.outputs)} outputs but "
                             f"{len(self.output_names)} output names")
        object.__setattr__(self, "nodes", topological_order(self.inputs + self.outputs))

    def replace(self, **changes: Any) -> Graph:
        return dataclasses.replace(self, **changes)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.inputs)

    @property
    def constants(self) -> dict[str, np.ndarray]:
        """Values of the CONST nodes, by node name (unnamed ones as '%<index>')."""
        return {n.name or f"%{i}": n.value for i, n in enumerate(self.nodes) if n.op is Op.CONST}

    def users(self) -> dict[Node, list[Node]]:
        """For every node, the nodes that use it as an operand (once per use)."""
        out: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for s in n.src:
                out[s].append(n)
        return out

    def structurally_equal(self, other: Graph) -> bool:
        """Same inputs, outputs and nodes up to node identity: ops, dtypes, shapes, attributes,
        constant values and operand wiring match, in topological order. Node names other than
        the inputs' are ignored (passes need not preserve them); the graph's name too."""
        if (len(self.nodes) != len(other.nodes) or self.input_names != other.input_names
                or self.output_names != other.output_names):
            return False
        index = {id(n): i for i, n in enumerate(self.nodes)}
        other_index = {id(n): i for i, n in enumerate(other.nodes)}
        for a, b in zip(self.nodes, other.nodes, strict=True):
            if (a.op, a.dtype, a.shape) != (b.op, b.dtype, b.shape):
                return False
            if [index[id(s)] for s in a.src] != [other_index[id(s)] for s in b.src]:
                return False
            if a.op is Op.CONST:
                if not np.array_equal(a.value, b.value, equal_nan=a.dtype.is_float):
                    return False
            elif a.attrs != b.attrs:
                return False
        return ([index[id(n)] for n in self.outputs] == [other_index[id(n)] for n in other.outputs]
                and [index[id(n)] for n in self.inputs] == [other_index[id(n)] for n in
                                                             other.inputs])

    def __str__(self) -> str:
        from .printer import format_graph

        return format_graph(self)


def topological_order(roots: tuple[Node, ...]) -> tuple[Node, ...]:
    """All nodes reachable from roots, operands first (iterative, so deep graphs are fine)."""
    order: list[Node] = []
    done: set[int] = set()
    for root in roots:
        stack: list[tuple[Node, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if id(node) in done:
                continue
            if i < len(node.src):
                stack.append((node, i + 1))
                if id(node.src[i]) not in done:
                    stack.append((node.src[i], 0))
            else:
                done.add(id(node))
                order.append(node)
    return tuple(order)
