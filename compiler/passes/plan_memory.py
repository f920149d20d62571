"""Memory planning: one arena for the intermediate tensors, reused by liveness."""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import Graph
from ..ir.ops import Node, Op

ALIGNMENT = 64


@dataclass(frozen=True, slots=True, eq=False)
class Buffer:
    """One intermediate tensor's place in the arena: bytes [offset, offset + size), live from
    the step that produces it to the last step that reads it (indices into graph.nodes)."""

    node: Node
    offset: int
    size: int
    first: int
    last: int

    def overlaps_in_time(self, other: Buffer) -> bool:
        return self.first <= other.last and other.first <= self.last

    def overlaps_in_space(self, other: Buffer) -> bool:
        return self.offset < other.offset + other.size and other.offset < self.offset + self.size


@dataclass(frozen=True, slots=True, eq=False)
class MemoryPlan:
    """Where every intermediate tensor of a graph lives in one arena.

    buffers: one per intermediate (every node but INPUT, CONST and graph outputs), in
    topological order; offsets: the same by node; arena_bytes: the arena's size; peak_bytes:
    the most bytes live at any step (a lower bound for any arena; sizes rounded up to
    ALIGNMENT); naive_bytes: the sum of all intermediates' sizes (no reuse).
    """

    buffers: tuple[Buffer, ...]
    offsets: dict[Node, int]
    arena_bytes: int
    peak_bytes: int
    naive_bytes: int


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def plan_memory(g: Graph) -> MemoryPlan:
    """Assign every intermediate tensor of g an ALIGNMENT-aligned offset in one arena so that
    no two tensors live at the same step overlap (an analysis; g is not changed).

    A tensor is live from the step that produces it through the last step that reads it (a
    node's result never shares memory with its operands: no in-place reuse). Greedy best-fit
    by size: tensors are placed largest first (ties in topological order), each in the
    smallest gap between the already placed tensors whose live intervals intersect its own,
    or above them all. Graph inputs, outputs and constants live outside the arena. Before: g
    verifies. After: g is unchanged; see MemoryPlan.
    """
    step = {id(n): i for i, n in enumerate(g.nodes)}
    outputs = {id(n) for n in g.outputs}
    last = {id(n): step[id(n)] for n in g.nodes}
    for n in g.nodes:
        for s in n.src:
            last[id(s)] = max(last[id(s)], step[id(n)])
    items = [(n, _align(n.size * n.dtype.np.itemsize), step[id(n)], last[id(n)])
             for n in g.nodes
             if n.op not in (Op.INPUT, Op.CONST) and id(n) not in outputs]
    placed: list[Buffer] = []
    for n, size, first, end in sorted(items, key=lambda t: (-t[1], t[2])):
        live = sorted((b for b in placed if b.first <= end and first <= b.last),
                      key=lambda b: b.offset)
        best, best_gap, top = None, None, 0
        for b in live:
            gap = b.offset - top
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = top, gap
            top = max(top, b.offset + b.size)
        placed.append(Buffer(n, top if best is None else best, size, first, end))
    buffers = tuple(sorted(placed, key=lambda b: b.first))
    live_bytes = [0] * (len(g.nodes) + 1)
    for b in buffers:
        live_bytes[b.first] += b.size
        live_bytes[b.last + 1] -= b.size
    peak = running = 0
    for d in live_bytes:
        running += d
        peak = max(peak, running)
    return MemoryPlan(buffers, {b.node: b.offset for b in buffers},
                      max((b.offset + b.size for b in buffers), default=0), peak,
                      sum(b.size for b in buffers))
