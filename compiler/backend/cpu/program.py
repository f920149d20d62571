"""What the CPU backend's lowering produces and the executor runs: a `CpuProgram` of kernels,
buffers and steps (calls of compiled functions with their arguments), and its JSON plan."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

# Argument of a call: ("b", buffer, byte offset) | ("i", int) | ("f", float) | ("lo",) | ("hi",)
Arg = tuple


@dataclass
class Buffer:
    """kind: "input" / "output" (index into the graph's), "const" (name in params) or
    "arena" (byte offset in the arena)."""

    kind: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    index: int = 0
    name: str = ""
    offset: int = 0


@dataclass
class Call:
    kernel: int
    fname: str
    sig: str
    args: tuple[Arg, ...]


@dataclass
class Step:
    """One node: `calls` run in order for each [lo, hi) part of range(extent) (extent 0: the
    calls take no range and run once); `parallel` says whether threads may split it."""

    name: str
    op: str
    calls: list[Call]
    extent: int = 0
    parallel: bool = False


@dataclass
class KernelRef:
    key: tuple
    build: Any  # Callable[[], llvmlite.ir.Module]; None once loaded from an artifact


@dataclass
class CpuProgram:
    """What the executor runs: kernels (modules), buffers, steps, constants, graph signature."""

    kernels: list[KernelRef]
    buffers: list[Buffer]
    steps: list[Step]
    params: dict[str, np.ndarray]
    inputs: list[tuple[str, str, tuple[int, ...]]]  # name, numpy dtype, shape
    outputs: list[tuple[str, str, tuple[int, ...]]]
    arena_bytes: int
    threads: int

    def plan_json(self) -> dict:
        """Everything but the kernel builders and the parameter values, as JSON data."""
        return {
            "buffers": [dataclasses.asdict(b) for b in self.buffers],
            "steps": [{"name": s.name, "op": s.op, "extent": s.extent, "parallel": s.parallel,
                       "calls": [{"kernel": c.kernel, "fname": c.fname, "sig": c.sig,
                                  "args": [list(a) for a in c.args]} for c in s.calls]}
                      for s in self.steps],
            "inputs": [list(i) for i in self.inputs],
            "outputs": [list(i) for i in self.outputs],
            "arena_bytes": self.arena_bytes,
            "threads": self.threads,
            "kernels": len(self.kernels),
        }

    @classmethod
    def from_plan_json(cls, plan: dict, params: dict[str, np.ndarray]) -> CpuProgram:
        bufs = [Buffer(**{**b, "shape": tuple(b["shape"])}) for b in plan["buffers"]]
        steps = [Step(s["name"], s["op"], [Call(c["kernel"], c["fname"], c["sig"],
                                               tuple(tuple(a) for a in c["args"]))
                                          for c in s["calls"]], s["extent"], s["parallel"])
                 for s in plan["steps"]]
        io = [[(n, d, tuple(sh)) for n, d, sh in plan[k]] for k in ("inputs", "outputs")]
        return cls([KernelRef((i,), None) for i in range(plan["kernels"])], bufs, steps, params,
                   io[0], io[1], plan["arena_bytes"], plan["threads"])
