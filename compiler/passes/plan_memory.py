"""Memory planning: one arena for the intermediate tensors, reused by liveness.

`place` is the one planner (the lowering places a plan's arena buffers with it); `plan_memory`
applies it to a graph's nodes, as an analysis that reports peak and naive sizes."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
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


@dataclass(frozen=True, slots=True)
class Placement:
    """Where `place` put a set of live intervals: offsets by key, the arena's size, the most
    bytes live at any step, and the sum of all sizes (no reuse)."""

    offsets: dict
    arena_bytes: int
    peak_bytes: int
    naive_bytes: int


def place(items: Sequence[tuple[Hashable, int, int, int]]) -> Placement:
    """The one memory planner: give every item ``(key, size_bytes, first, last)`` (live from step
    `first` through step `last`) an ALIGNMENT-aligned offset in one arena so that no two items
    live at the same step overlap.

    Greedy best-fit by size: items are placed largest first (ties by first step), each in the
    smallest gap between the already placed items whose live intervals intersect its own, or
    above them all. Used on graph nodes by `plan_memory` and on a plan's arena buffers by the
    lowering (`compiler.lowering.PlanBuilder`).
    """
    placed: list[tuple[int, int, int, int]] = []  # offset, size, first, last
    offsets: dict = {}
    steps = 0
    for key, nbytes, first, end in sorted(items, key=lambda t: (-_align(t[1]), t[2])):
        size = _align(max(nbytes, 1))
        live = sorted((b for b in placed if b[2] <= end and first <= b[3]), key=lambda b: b[0])
        best, best_gap, top = None, None, 0
        for off, sz, _, _ in live:
            gap = off - top
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = top, gap
            top = max(top, off + sz)
        offsets[key] = top if best is None else best
        placed.append((offsets[key], size, first, end))
        steps = max(steps, end + 1)
    live_bytes = [0] * (steps + 1)
    for _, size, first, end in placed:
        live_bytes[first] += size
        live_bytes[end + 1] -= size
    peak = running = 0
    for d in live_bytes:
        running += d
        peak = max(peak, running)
    return Placement(offsets, max((o + sz for o, sz, _, _ in placed), default=0), peak,
                     sum(sz for _, sz, _, _ in placed))


def plan_memory(g: Graph) -> MemoryPlan:
    """Assign every intermediate tensor of g an ALIGNMENT-aligned offset in one arena so that
    no two tensors live at the same step overlap (an analysis; g is not changed), with `place`.

    A tensor is live from the step that produces it through the last step that reads it (a
    node's result never shares memory with its operands: no in-place reuse). Graph inputs,
    outputs and constants live outside the arena. Before: g verifies. After: g is unchanged;
    see MemoryPlan.
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
    p = place(items)
    buffers = tuple(sorted((Buffer(n, p.offsets[n], size, first, end)
                            for n, size, first, end in items), key=lambda b: b.first))
    return MemoryPlan(buffers, {b.node: b.offset for b in buffers}, p.arena_bytes,
                      p.peak_bytes, p.naive_bytes)
