"""Graph → `Plan`: every backend lowers the nodes it takes into one shared `PlanBuilder`.

    lower_graph(g, target="cpu", options=None, threads=2) -> (Plan, [PlanSection])

The target backend (see `compiler.backend`) lowers first and takes the nodes it can run; the
``cpu`` backend lowers every node left and binds the graph's outputs. The builder holds what the
backends share: the host buffers (graph inputs, outputs, constants, the arena), where each
node's value lives, and the steps, each tagged with the position of its node so that the plan
runs in topological order whichever backend lowered first. `finish` orders the steps and places
the arena buffers by their live ranges over the steps (`passes.plan_memory.place`).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from vtakit.runtime.plan import Arg, Buffer, Plan, Step

from .backend import PlanSection, get_backend
from .ir.dtypes import DType
from .ir.graph import Graph
from .ir.ops import Node, Op
from .passes.plan_memory import place

FALLBACK = "cpu"


def nbytes(dt: DType, shape: Sequence[int]) -> int:
    return math.prod(shape) * dt.size_bytes


class PlanBuilder:
    """The plan under construction, shared by the backends lowering one graph.

    Attributes
    ----------
    g : Graph
    threads : int
    buffers : list of Buffer
    params : dict of str to ndarray
    loc : dict of int to (int, int)
        Where a node's value lives: ``id(node)`` → (buffer index, byte offset).
    taken : dict of int to str
        ``id(node)`` → the backend that lowered it.
    """

    def __init__(self, g: Graph, threads: int) -> None:
        self.g, self.threads = g, threads
        self.buffers: list[Buffer] = []
        self.params: dict[str, np.ndarray] = {}
        self.loc: dict[int, tuple[int, int]] = {}
        self.taken: dict[int, str] = {}
        self.position = {id(n): i for i, n in enumerate(g.nodes)}
        self._steps: list[tuple[int, int, Step]] = []  # (node position, sequence, step)
        self._at = len(g.nodes)
        for i, n in enumerate(g.inputs):
            self.loc[id(n)] = (self.buffer("input", n.dtype, n.shape, index=i, name=n.name), 0)

    @contextlib.contextmanager
    def lowering(self, n: Node, backend: str) -> Iterator[None]:
        """Steps added inside belong to node `n`, lowered by `backend`."""
        if id(n) in self.taken:
            raise RuntimeError(f"node {n.name!r} ({n.op.name}) is lowered twice: by "
                               f"{self.taken[id(n)]!r} and {backend!r}")
        self.taken[id(n)] = backend
        prev, self._at = self._at, self.position[id(n)]
        try:
            yield
        finally:
            self._at = prev

    def buffer(self, kind: str, dt: DType, shape: Sequence[int], **kw: Any) -> int:
        self.buffers.append(Buffer(kind, dt.np.str, tuple(shape), nbytes(dt, shape), **kw))
        return len(self.buffers) - 1

    def const(self, value: np.ndarray, name: str) -> int:
        value = np.ascontiguousarray(value)
        key = f"p{len(self.params)}_" + re.sub(r"[^A-Za-z0-9_]", "_", name)[:60]
        self.params[key] = value
        return self.buffer("const", DType.from_numpy(value.dtype), value.shape, name=key)

    def arena(self, dt: DType, shape: Sequence[int]) -> tuple[int, int]:
        return self.buffer("arena", dt, shape), 0

    def where(self, n: Node) -> tuple[int, int]:
        """(buffer, byte offset) of n's value. A constant gets its buffer on first use (weights
        only used packed are not stored twice); a value not lowered yet (another backend will
        produce it) gets an arena buffer that its producer then writes."""
        got = self.loc.get(id(n))
        if got is None:
            if n.op is Op.CONST:
                got = (self.const(n.value, n.name or "const"), 0)
            else:
                got = self.arena(n.dtype, n.shape)
            self.loc[id(n)] = got
        return got

    def ptr(self, n: Node) -> Arg:
        b, off = self.where(n)
        return ("b", b, off)

    def out(self, n: Node) -> Arg:
        """The place n's producer writes: a new arena buffer, or the one a consumer lowered
        earlier asked for."""
        if id(n) not in self.loc:
            self.loc[id(n)] = self.arena(n.dtype, n.shape)
        return self.ptr(n)

    def add_step(self, step: Step) -> None:
        self._steps.append((self._at, len(self._steps), step))

    @property
    def steps(self) -> list[Step]:
        """The steps so far, in plan order."""
        return [s for _, _, s in sorted(self._steps, key=lambda t: (t[0], t[1]))]

    def finish(self, sections: Sequence[PlanSection]) -> Plan:
        """The plan: steps in order, arena buffers placed by their live ranges."""
        steps = self.steps
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for si, s in enumerate(steps):
            for c in s.calls:
                for a in c.args:
                    if a[0] == "b" and self.buffers[a[1]].kind == "arena":
                        first.setdefault(a[1], si)
                        last[a[1]] = si
        placement = place([(b, self.buffers[b].nbytes, first[b], last[b]) for b in first])
        for b, off in placement.offsets.items():
            self.buffers[b].offset = off
        arena_bytes = placement.arena_bytes
        for b, buf in enumerate(self.buffers):  # made but used by no step: any offset will do
            if buf.kind == "arena" and b not in first:
                buf.offset = 0
                arena_bytes = max(arena_bytes, buf.nbytes)
        g = self.g
        return Plan(self.buffers, steps, self.params,
                    [(n.name, n.dtype.np.str, n.shape) for n in g.inputs],
                    [(nm, n.dtype.np.str, n.shape) for nm, n in
                     zip(g.output_names, g.outputs, strict=True)],
                    arena_bytes, self.threads,
                    {s.backend: s.section for s in sections})


def lower_graph(g: Graph, target: str = FALLBACK, options: Any = None, *, threads: int = 2,
                cpu_options: Any = None) -> tuple[Plan, list[PlanSection]]:
    """Lower an optimised graph for `target`; nodes it does not take go to the ``cpu``
    backend. `options` are the target's (its options class, a dict, or None for defaults)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads={threads!r}, expected an int >= 1")
    builder = PlanBuilder(g, threads)
    sections: list[PlanSection] = []
    if target == FALLBACK and options is not None and cpu_options is not None:
        raise TypeError("target 'cpu': give its options once (options or cpu_options)")
    order = [(target, options if target != FALLBACK or options is not None else cpu_options)]
    if target != FALLBACK:
        order.append((FALLBACK, cpu_options))
    for name, opts in order:
        spec = get_backend(name)
        section = spec.lower(g, spec.make_options(opts), builder)
        if section.backend != name:
            raise RuntimeError(f"backend {name!r} returned a section for {section.backend!r}")
        sections.append(section)
    used = {s.backend for s in builder.steps}
    sections = [s for s in sections if s.taken or s.backend in used]
    left = [n for n in g.nodes
            if n.op not in (Op.INPUT, Op.CONST) and id(n) not in builder.taken]
    if left:
        raise RuntimeError(f"no backend lowered {[n.name for n in left[:5]]} "
                           f"({len(left)} nodes)")
    return builder.finish(sections), sections
