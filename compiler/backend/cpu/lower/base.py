"""The lowering's state and helpers: kernels, buffers, constants, node locations, steps.

`LowererBase` is what every group of op handlers builds on (`nn.NnLowering`, then
`walk._Lowerer`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from vtakit.runtime.cpu.llvm import KernelRef
from vtakit.runtime.plan import Arg, Call, Step

from ....ir.dtypes import DType
from ....ir.graph import Graph
from ....ir.ops import Node
from ....lowering import PlanBuilder
from ..kernels import elementwise as E
from ..kernels import loops as L

ALIGN = 64
MACRO_SIG = "pppp" + "l" * 8 + "ff"  # kernels.gemm.gemm_packed
# The executor runs the whole graph in one compiled function on every thread (graphfn), so a
# split step costs a barrier of a few microseconds; a step is split when it is a few tens of
# microseconds of work. The parts are claimed dynamically, so a helper descheduled mid-step
# holds it up by one part at most.
PARALLEL_MIN_ELEMENTS = 1 << 15  # below this an elementwise step runs on one thread
PARALLEL_MIN_MACS = 1 << 19


def _at(n: Node) -> Any:
    """The node's attributes, typed by its op (checked by the verifier, not by mypy here)."""
    return n.attrs


def _nbytes(dt: DType, shape: Sequence[int]) -> int:
    return math.prod(shape) * dt.size_bytes


def _strides(shape: Sequence[int]) -> tuple[int, ...]:
    return L.contiguous_strides(shape)


def _axis_strides(shape: Sequence[int], axis: int, rank: int) -> tuple[int, ...]:
    """Strides of a scalar or 1-D parameter laid along `axis` of a rank-`rank` output."""
    if len(shape) == 0 or math.prod(shape) == 1:
        return (0,) * rank
    return tuple(1 if i == axis else 0 for i in range(rank))


# The activations an Epilogue (compiler.passes) may name, as elementwise instructions.
def _epilogue_instrs(ep: Any, dt: DType, first: int) -> list[E.Instr]:
    if ep is None or ep.activation is None:
        return []
    act = ep.activation
    if act == "clip":
        return [("clip", (first,), (ep.clip_min, ep.clip_max), dt)]
    if act in ("leaky_relu", "elu", "celu", "thresholded_relu"):
        return [(act, (first,), (ep.alpha,), dt)]
    return [(act, (first,), (), dt)]


class LowererBase:
    """The CPU lowering's state: its kernels (the CPU section), on top of the shared
    `PlanBuilder` (buffers, constants, node locations, steps)."""

    def __init__(self, g: Graph, plan: PlanBuilder) -> None:
        self.g = g
        self.plan = plan
        self.threads = plan.threads
        self.kernels: list[KernelRef] = []
        self._kidx: dict[tuple, int] = {}
        self.buffers = plan.buffers
        self.loc = plan.loc
        self._users = g.users()
        self.vnni: bool | None = None  # int8 kernels with VNNI (None: if this host has it)
        self._fused: dict[int, Node | None] = {}  # CONV/MATMUL_INTEGER -> its fused REQUANTIZE
        self._chained: dict[int, bool] = {}  # integer chain ops computed by their user

    # -- helpers --------------------------------------------------------------------------------
    def kernel(self, key: tuple, build: Any) -> int:
        k = self._kidx.get(key)
        if k is None:
            k = self._kidx[key] = len(self.kernels)
            self.kernels.append(KernelRef(key, build))
        return k

    def buffer(self, kind: str, dt: DType, shape: Sequence[int], **kw: Any) -> int:
        return self.plan.buffer(kind, dt, shape, **kw)

    def const(self, value: np.ndarray, name: str) -> int:
        return self.plan.const(value, name)

    def arena(self, dt: DType, shape: Sequence[int]) -> tuple[int, int]:
        return self.plan.arena(dt, shape)

    def where(self, n: Node) -> tuple[int, int]:
        return self.plan.where(n)

    def ptr(self, n: Node) -> Arg:
        return self.plan.ptr(n)

    def add_step(self, step: Step) -> None:
        self.plan.add_step(step)

    def call_generic(self, k: L.Kernel, ptrs: Sequence[Arg], name: str, op: str,
                     work: int) -> None:
        ki = self.kernel(k.key, k.build)
        call = Call(ki, k.fname, k.sig, (*ptrs, ("lo",), ("hi",)))
        self.add_step(Step(name, op, [call], k.extent,
                               work >= PARALLEL_MIN_ELEMENTS and k.extent > 1))

    def out(self, n: Node) -> Arg:
        return self.plan.out(n)

    @staticmethod
    def epilogue_program(ep: Any, residual: Node | None, dt: DType) -> list[E.Instr]:
        """act(y [+ residual]) over values 0 = y, 1 = residual."""
        prog: list[E.Instr] = [("add", (0, 1), (), dt)] if residual is not None else []
        return prog + _epilogue_instrs(ep, dt, 2 if prog else 0)

    def epilogue_step(self, n: Node, ep: Any, residual: Node | None, name: str,
                      bias: Node | None = None) -> None:
        """y = act(y [+ bias] [+ residual]) in place, for what a kernel did not fuse."""
        src = [n] + [s for s in (bias, residual) if s is not None]
        prog: list[E.Instr] = []
        for k in range(1, len(src)):
            prog.append(("add", (0 if k == 1 else len(src) + k - 2, k), (), n.dtype))
        prog += _epilogue_instrs(ep, n.dtype, len(src) + len(prog) - 1 if prog else 0)
        if not prog:
            return
        st = [_strides(n.shape)] + [L.broadcast_strides(r.shape, n.shape) for r in src[1:]]
        kern = E.eltwise(n.dtype, n.shape, list(zip([s.dtype for s in src], st)), prog)
        self.call_generic(kern, [self.ptr(n)] + [self.ptr(s) for s in src], name + ":epilogue",
                          "epilogue", n.size)
