"""Lower an (optimised) graph to a `CpuProgram`: kernels, buffers and an ordered list of calls.

    lower(g, threads=2) -> CpuProgram

Every node becomes one `Step`: one or more calls of LLVM-generated functions, with buffer
pointers and integer/float constants as arguments. Nothing is computed with numpy at run time:
the executor only allocates the buffers once and then calls the functions in order. A step
whose work can be split (its outermost loop, or the GEMM's tiles) is called on [lo, hi) ranges
from several threads.

Kernels: the fast float32 kernels of this package (packed GEMM with fused bias and ReLU/clip,
im2col convolution, depthwise convolution, 2-D pooling) for the common cases, and the generic
loop-nest generator (``codegen_loops.py``) for everything else: elementwise programs over all
dtypes with broadcasting, reductions, data movement, softmax, layer norm, naive matmul and
convolution (N-d, integer, quantised), pooling; GridSample (``codegen_sample.py``) and Det
(``codegen_linalg.py``).

Buffers: graph inputs and outputs, constants (parameters, with the GEMM/convolution weights
pre-packed), and one arena for every intermediate and scratch buffer, each at a byte offset
chosen from the live ranges (first-fit, largest first). RESHAPE and IDENTITY alias their
operand's storage.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import UnsupportedError
from ...ir import ops as o
from ...ir.dtypes import DType
from ...ir.graph import Graph
from ...ir.ops import Node, Op
from . import codegen_linalg as LA
from . import codegen_loops as L
from . import codegen_sample as SA
from . import conv as C
from . import depthwise as D
from . import gemm as G
from . import pool as P
from .codegen_scalar import Unsupported

ALIGN = 64
MACRO_SIG = "pppp" + "l" * 8 + "ff"  # gemm.gemm_packed
# The executor runs the whole graph in one compiled function on every thread (graphfn), so a
# split step costs a barrier of a few microseconds; a step is split when it is a few tens of
# microseconds of work. The parts are claimed dynamically, so a helper descheduled mid-step
# holds it up by one part at most.
PARALLEL_MIN_ELEMENTS = 1 << 15  # below this an elementwise step runs on one thread
PARALLEL_MIN_MACS = 1 << 19

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


_ELEMENTWISE = {
    Op.IDENTITY, Op.CAST, Op.RELU, Op.SIGMOID, Op.TANH, Op.EXP, Op.LOG, Op.SQRT, Op.ERF, Op.NEG,
    Op.ABS, Op.RECIPROCAL, Op.FLOOR, Op.CEIL, Op.ROUND, Op.SIN, Op.COS, Op.TAN, Op.ASIN,
    Op.ACOS, Op.ATAN, Op.SINH, Op.COSH, Op.ASINH, Op.ACOSH, Op.ATANH, Op.SIGN, Op.NOT,
    Op.SOFTPLUS, Op.SOFTSIGN, Op.HARD_SWISH, Op.ISNAN, Op.MISH, Op.LEAKY_RELU, Op.ELU, Op.SELU,
    Op.CELU, Op.THRESHOLDED_RELU, Op.HARD_SIGMOID, Op.GELU, Op.CLIP, Op.ADD, Op.SUB, Op.MUL,
    Op.DIV, Op.POW, Op.MOD, Op.MAX, Op.MIN, Op.PRELU, Op.EQUAL, Op.LESS, Op.GREATER,
    Op.LESS_EQUAL, Op.GREATER_EQUAL, Op.AND, Op.OR, Op.XOR, Op.WHERE, Op.SHL, Op.SHR,
    Op.BITWISE_AND, Op.BITWISE_OR, Op.BITWISE_XOR, Op.BITWISE_NOT, Op.ISINF,
}

_REDUCE = {Op.REDUCE_SUM: "sum", Op.REDUCE_MEAN: "mean", Op.REDUCE_MAX: "max",
           Op.REDUCE_MIN: "min", Op.REDUCE_PROD: "prod", Op.REDUCE_L1: "l1",
           Op.REDUCE_L2: "l2", Op.REDUCE_SUM_SQUARE: "sum_square",
           Op.REDUCE_LOG_SUM: "log_sum", Op.REDUCE_LOG_SUM_EXP: "log_sum_exp"}


def _params(n: Node) -> tuple:
    a = _at(n)
    if isinstance(a, o.AlphaAttrs):
        return (a.alpha,)
    if isinstance(a, o.SeluAttrs):
        return (a.alpha, a.gamma)
    if isinstance(a, o.HardSigmoidAttrs):
        return (a.alpha, a.beta)
    if isinstance(a, o.GeluAttrs):
        return (a.approximate,)
    if isinstance(a, o.ClipAttrs):
        return (a.min, a.max)
    if isinstance(a, o.IsInfAttrs):
        return (a.detect_positive, a.detect_negative)
    return ()


def elementwise_instr(n: Node) -> L.Instr:
    op = n.op.value
    if n.op is Op.MOD:
        assert isinstance(_at(n), o.ModAttrs)
        op = "fmod" if _at(n).fmod else "mod"
    return (op, tuple(range(len(n.src))), _params(n), n.dtype)


# The activations an Epilogue (compiler.passes) may name, as elementwise instructions.
def _epilogue_instrs(ep: Any, dt: DType, first: int) -> list[L.Instr]:
    if ep is None or ep.activation is None:
        return []
    act = ep.activation
    if act == "clip":
        return [("clip", (first,), (ep.clip_min, ep.clip_max), dt)]
    if act in ("leaky_relu", "elu", "celu", "thresholded_relu"):
        return [(act, (first,), (ep.alpha,), dt)]
    return [(act, (first,), (), dt)]


class _Lowerer:
    def __init__(self, g: Graph, threads: int) -> None:
        self.g = g
        self.threads = threads
        self.kernels: list[KernelRef] = []
        self._kidx: dict[tuple, int] = {}
        self.buffers: list[Buffer] = []
        self.steps: list[Step] = []
        self.params: dict[str, np.ndarray] = {}
        self.loc: dict[int, tuple[int, int]] = {}  # node id -> (buffer, byte offset)

    # -- helpers --------------------------------------------------------------------------------
    def kernel(self, key: tuple, build: Any) -> int:
        k = self._kidx.get(key)
        if k is None:
            k = self._kidx[key] = len(self.kernels)
            self.kernels.append(KernelRef(key, build))
        return k

    def buffer(self, kind: str, dt: DType, shape: Sequence[int], **kw: Any) -> int:
        self.buffers.append(Buffer(kind, dt.np.str, tuple(shape), _nbytes(dt, shape), **kw))
        return len(self.buffers) - 1

    def const(self, value: np.ndarray, name: str) -> int:
        value = np.ascontiguousarray(value)
        key = f"p{len(self.params)}_" + re.sub(r"[^A-Za-z0-9_]", "_", name)[:60]
        self.params[key] = value
        return self.buffer("const", DType.from_numpy(value.dtype), value.shape, name=key)

    def arena(self, dt: DType, shape: Sequence[int]) -> tuple[int, int]:
        return self.buffer("arena", dt, shape), 0

    def where(self, n: Node) -> tuple[int, int]:
        """(buffer, byte offset) of n's value; a constant gets its buffer on first use, so
        weights that are only used packed are not stored twice."""
        got = self.loc.get(id(n))
        if got is None:
            if n.op is not Op.CONST:
                raise KeyError(f"{n!r} has no buffer yet")
            got = self.loc[id(n)] = (self.const(n.value, n.name or "const"), 0)
        return got

    def ptr(self, n: Node) -> Arg:
        b, off = self.where(n)
        return ("b", b, off)

    def call_generic(self, k: L.Kernel, ptrs: Sequence[Arg], name: str, op: str,
                     work: int) -> None:
        ki = self.kernel(k.key, k.build)
        call = Call(ki, k.fname, k.sig, (*ptrs, ("lo",), ("hi",)))
        self.steps.append(Step(name, op, [call], k.extent,
                               work >= PARALLEL_MIN_ELEMENTS and k.extent > 1))

    def out(self, n: Node) -> Arg:
        self.loc[id(n)] = self.arena(n.dtype, n.shape)
        return self.ptr(n)

    # -- the walk -------------------------------------------------------------------------------
    def run(self) -> CpuProgram:
        g = self.g
        for i, n in enumerate(g.inputs):
            self.loc[id(n)] = (self.buffer("input", n.dtype, n.shape, index=i, name=n.name), 0)
        for n in g.nodes:
            if id(n) in self.loc or n.op is Op.INPUT:
                continue
            try:
                self.node(n)
            except Unsupported as e:
                raise UnsupportedError(f"{n.op.name} node {n.name!r}: no CPU code for "
                                       f"{e} (operands {[s.dtype.value for s in n.src]})"
                                       ) from None
        self.bind_outputs()
        arena = self.plan_arena()
        return CpuProgram(self.kernels, self.buffers, self.steps, self.params,
                          [(n.name, n.dtype.np.str, n.shape) for n in g.inputs],
                          [(nm, n.dtype.np.str, n.shape) for nm, n in
                           zip(g.output_names, g.outputs, strict=True)], arena, self.threads)

    def bind_outputs(self) -> None:
        claimed: set[int] = set()
        for i, (n, name) in enumerate(zip(self.g.outputs, self.g.output_names, strict=True)):
            b, off = self.where(n)
            buf = self.buffers[b]
            if (buf.kind == "arena" and off == 0 and b not in claimed
                    and buf.nbytes == _nbytes(n.dtype, n.shape)):
                buf.kind, buf.index, buf.name = "output", i, name
                buf.shape = n.shape
                claimed.add(b)
                continue
            ob = self.buffer("output", n.dtype, n.shape, index=i, name=name)
            claimed.add(ob)
            self.copy_step(n, ("b", b, off), ("b", ob, 0), f"{name}:copy")

    def copy_step(self, n: Node, src: Arg, dst: Arg, name: str) -> None:
        shape = n.shape or (1,)
        k = L.copy(n.dtype, (math.prod(shape),), (("affine", 0, 1, math.prod(shape), 1),), (1,))
        self.call_generic(k, [dst, src], name, "copy", n.size)

    def plan_arena(self) -> int:
        """First-fit offsets for arena buffers from their live ranges over the steps."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for si, s in enumerate(self.steps):
            for c in s.calls:
                for a in c.args:
                    if a[0] == "b" and self.buffers[a[1]].kind == "arena":
                        first.setdefault(a[1], si)
                        last[a[1]] = si
        placed: list[tuple[int, int, int, int]] = []  # start, end, lo, hi (bytes)
        total = 0
        order = sorted(first, key=lambda b: -self.buffers[b].nbytes)
        for b in order:
            size = -(-max(self.buffers[b].nbytes, 1) // ALIGN) * ALIGN
            s0, s1 = first[b], last[b]
            busy = sorted((lo, hi) for (a0, a1, lo, hi) in placed if a0 <= s1 and s0 <= a1)
            off = 0
            for lo, hi in busy:
                if off + size <= lo:
                    break
                off = max(off, hi)
            self.buffers[b].offset = off
            placed.append((s0, s1, off, off + size))
            total = max(total, off + size)
        return total

    # -- nodes ----------------------------------------------------------------------------------
    def node(self, n: Node) -> None:
        op = n.op
        if op is Op.CONST:
            return  # a buffer on first use (where())
        if op in (Op.RESHAPE, Op.IDENTITY):
            self.loc[id(n)] = self.where(n.src[0])
            return
        if n.size == 0:
            self.out(n)
            return
        name = n.name or op.value
        if op in _ELEMENTWISE:
            return self.elementwise(n, [elementwise_instr(n)], list(n.src), name)
        if op.value == "fused_elementwise":
            prog = [(str(nm), tuple(idx), tuple(c), n.dtype) for nm, idx, c in _at(n).program]
            return self.elementwise(n, prog, list(n.src), name)
        handler = getattr(self, "op_" + op.value, None)
        if handler is None:
            raise UnsupportedError(f"{op.name} node {n.name!r}: the CPU backend does not lower "
                                   f"{op.name} yet")
        handler(n, name)

    def elementwise(self, n: Node, prog: Sequence[L.Instr], src: Sequence[Node], name: str,
                    strides: Sequence[tuple[int, ...]] | None = None) -> None:
        if strides is None:
            strides = [L.broadcast_strides(s.shape, n.shape) for s in src]
        operands = [(s.dtype, st) for s, st in zip(src, strides, strict=True)]
        k = L.eltwise(n.dtype, n.shape, operands, prog)
        dst = self.out(n)
        self.call_generic(k, [dst] + [self.ptr(s) for s in src], name, n.op.value, n.size)

    def op_batch_norm(self, n: Node, name: str) -> None:
        at = _at(n)
        x = n.src[0]
        st = [L.broadcast_strides(x.shape, n.shape)] + [
            _axis_strides(s.shape, 1, n.rank) for s in n.src[1:]]
        dt = n.dtype
        # (x - mean) * (scale / sqrt(var + eps)) + bias, as the reference computes it
        prog: list[L.Instr] = [
            ("sub", (0, 3), (), dt), ("add", (4,), (at.epsilon,), dt), ("sqrt", (6,), (), dt),
            ("div", (1, 7), (), dt), ("mul", (5, 8), (), dt), ("add", (9, 2), (), dt)]
        self.elementwise(n, prog, list(n.src), name, st)

    def op_quantize_linear(self, n: Node, name: str) -> None:
        ax = _at(n).axis
        st = [L.broadcast_strides(n.src[0].shape, n.shape)] + [
            _axis_strides(s.shape, ax, n.rank) for s in n.src[1:]]
        self.elementwise(n, [("quantize", (0, 1, 2), (), n.dtype)], list(n.src), name, st)

    def op_dequantize_linear(self, n: Node, name: str) -> None:
        ax = _at(n).axis
        st = [L.broadcast_strides(n.src[0].shape, n.shape)] + [
            _axis_strides(s.shape, ax, n.rank) for s in n.src[1:]]
        self.elementwise(n, [("dequantize", (0, 1, 2), (), n.dtype)], list(n.src), name, st)

    # -- data movement --------------------------------------------------------------------------
    def _copy(self, n: Node, region: Sequence[int], maps: Sequence[L.AxisMap], name: str,
              in_offset: int = 0, pad: float = 0.0) -> None:
        k = L.copy(n.dtype, region, maps, _strides(region), 0, in_offset, pad)
        self.call_generic(k, [self.out(n), self.ptr(n.src[0])], name, n.op.value, n.size)

    def op_transpose(self, n: Node, name: str) -> None:
        x = n.src[0]
        st = _strides(x.shape)
        perm = _at(n).perm
        maps = [("affine", 0, 1, x.shape[p], st[p]) for p in perm]
        self._copy(n, n.shape, maps, name)

    def op_slice(self, n: Node, name: str) -> None:
        x = n.src[0]
        st = _strides(x.shape)
        a = _at(n)
        maps = [("affine", a.starts[d], a.steps[d], x.shape[d], st[d]) for d in range(x.rank)]
        self._copy(n, n.shape, maps, name)

    def op_expand(self, n: Node, name: str) -> None:
        st = L.broadcast_strides(n.src[0].shape, n.shape)
        self._copy(n, n.shape, [("affine", 0, 1, d, s) for d, s in zip(n.shape, st)], name)

    def op_tile(self, n: Node, name: str) -> None:
        x = n.src[0]
        st = _strides(x.shape)
        region, maps = [], []
        for d, r in enumerate(_at(n).repeats):
            region += [r, x.shape[d]]
            maps += [("affine", 0, 1, r, 0), ("affine", 0, 1, x.shape[d], st[d])]
        self._copy(n, region, maps, name)

    def op_pad(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        r = x.rank
        st = _strides(x.shape)
        kind = {"constant": "const", "edge": "edge", "reflect": "reflect", "wrap": "wrap"}[a.mode]
        maps, in_off = [], 0
        for d in range(r):
            pb, pe = a.pads[d], a.pads[r + d]
            cb, ce = max(0, -pb), max(0, -pe)
            in_off += cb * st[d]
            maps.append((kind, max(0, pb), 1, x.shape[d] - cb - ce, st[d]))
        self._copy(n, n.shape, maps, name, in_off, a.value)

    def op_concat(self, n: Node, name: str) -> None:
        ax = _at(n).axis
        ost = _strides(n.shape)
        dst = self.out(n)
        at = 0
        for s in n.src:
            if s.size:
                st = _strides(s.shape)
                k = L.copy(n.dtype, s.shape, [("affine", 0, 1, d, t) for d, t in
                                              zip(s.shape, st)], ost, at * ost[ax])
                self.call_generic(k, [dst, self.ptr(s)], name, "concat", s.size)
            at += s.shape[ax]

    def op_gather(self, n: Node, name: str) -> None:
        x, idx = n.src
        ax = _at(n).axis
        outer = math.prod(x.shape[:ax])
        inner = math.prod(x.shape[ax + 1:])
        k = L.gather(n.dtype, idx.dtype, outer, x.shape[ax], max(idx.size, 1), inner)
        self.call_generic(k, [self.out(n), self.ptr(x), self.ptr(idx)], name, "gather",
                          n.size)

    def op_scatter_elements(self, n: Node, name: str) -> None:
        x, idx, upd = n.src
        dst = self.out(n)
        self.copy_step(n, self.ptr(x), dst, name + ":copy")
        if idx.size:
            k = L.scatter_elements(n.dtype, idx.dtype, x.shape, idx.shape, _at(n).axis,
                                   _at(n).reduction)
            ki = self.kernel(k.key, k.build)
            self.steps.append(Step(name, "scatter_elements", [Call(ki, k.fname, k.sig, (
                dst, self.ptr(idx), self.ptr(upd), ("i", 0), ("i", k.extent)))]))

    def op_scatter_nd(self, n: Node, name: str) -> None:
        x, idx, upd = n.src
        dst = self.out(n)
        self.copy_step(n, self.ptr(x), dst, name + ":copy")
        kk = idx.shape[-1]
        rows = math.prod(idx.shape[:-1])
        if rows:
            k = L.index_rows(n.dtype, idx.dtype, x.shape, 0, rows, kk, True, _at(n).reduction)
            ki = self.kernel(k.key, k.build)
            self.steps.append(Step(name, "scatter_nd", [Call(ki, k.fname, k.sig, (
                dst, self.ptr(upd), self.ptr(idx), ("i", 0), ("i", 1)))]))

    def op_gather_nd(self, n: Node, name: str) -> None:
        x, idx = n.src
        bd = _at(n).batch_dims
        kk = idx.shape[-1]
        rows = math.prod(idx.shape[bd:-1])
        k = L.index_rows(n.dtype, idx.dtype, x.shape, bd, rows, kk, False)
        self.call_generic(k, [self.out(n), self.ptr(x), self.ptr(idx)], name, "gather_nd",
                          n.size)

    def op_gather_elements(self, n: Node, name: str) -> None:
        x, idx = n.src
        if idx.rank == 0:
            raise Unsupported("gather_elements with a scalar index")
        k = L.gather_elements(n.dtype, idx.dtype, x.shape, idx.shape, _at(n).axis)
        self.call_generic(k, [self.out(n), self.ptr(x), self.ptr(idx)], name, n.op.value,
                          n.size)

    def op_cumsum(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        if x.rank == 0:
            raise Unsupported("a cumulative op on a scalar")
        k = L.scan("add" if n.op is Op.CUMSUM else "mul", n.dtype,
                   math.prod(x.shape[:a.axis]), x.shape[a.axis],
                   math.prod(x.shape[a.axis + 1:]), a.exclusive, a.reverse)
        self.call_generic(k, [self.out(n), self.ptr(x)], name, n.op.value, n.size)

    op_cumprod = op_cumsum

    def op_topk(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        k = L.topk(x.dtype, math.prod(x.shape[:a.axis]), x.shape[a.axis],
                   math.prod(x.shape[a.axis + 1:]), a.k, a.largest)
        self.call_generic(k, [self.out(n), self.ptr(x)], name, "topk", x.size * a.k)

    def op_reverse_sequence(self, n: Node, name: str) -> None:
        x, lens = n.src
        a = _at(n)
        k = L.reverse_sequence(n.dtype, lens.dtype, x.shape, a.batch_axis, a.time_axis)
        self.call_generic(k, [self.out(n), self.ptr(x), self.ptr(lens)], name,
                          "reverse_sequence", n.size)

    def op_col2im(self, n: Node, name: str) -> None:
        from ...ir.infer import conv_shape

        x = n.src[0]
        a = _at(n)
        if not n.dtype.is_float:
            raise Unsupported(f"col2im of {n.dtype.value}")
        blocks = conv_shape(n.shape, (1, n.shape[1], *a.kernel), a)[2:]
        k = L.col2im(n.dtype, n.shape, a.kernel, blocks, a.strides, a.pads, a.dilations)
        self.call_generic(k, [self.out(n), self.ptr(x)], name, "col2im",
                          n.size * math.prod(a.kernel))

    def op_einsum(self, n: Node, name: str) -> None:
        eq = _at(n).equation.replace(" ", "")
        lhs, _, output = eq.partition("->")
        subs = lhs.split(",")
        # "..." becomes capital letters, right-aligned as numpy broadcasts them
        mell = max([s.rank - (len(sub) - 3) for sub, s in zip(subs, n.src) if "..." in sub]
                   or [0])
        ell = "ABCDEFGHIJ"[:mell]
        subs = [sub.replace("...", ell[mell - (s.rank - (len(sub) - 3)):]) for sub, s in
                zip(subs, n.src)]
        if "->" not in eq:  # implicit: the letters used once, sorted, after the ellipsis
            counts = "".join(subs)
            output = ell + "".join(sorted(c for c in set(counts) if counts.count(c) == 1
                                          and c not in ell))
        output = output.replace("...", ell)
        sizes: dict[str, int] = {}
        for sub, s in zip(subs, n.src, strict=True):
            for c, d in zip(sub, s.shape, strict=True):
                sizes[c] = max(sizes.get(c, 1), d)
        k = L.einsum(n.dtype, [(sub, s.shape) for sub, s in zip(subs, n.src)], output, sizes)
        self.call_generic(k, [self.out(n)] + [self.ptr(s) for s in n.src], name, "einsum",
                          math.prod(sizes.values()))

    def op_trilu(self, n: Node, name: str) -> None:
        x = n.src[0]
        rows, cols = x.shape[-2:]
        k = L.trilu(n.dtype, math.prod(x.shape[:-2]), rows, cols, _at(n).upper, _at(n).k)
        self.call_generic(k, [self.out(n), self.ptr(x)], name, "trilu", n.size)

    def op_hardmax(self, n: Node, name: str) -> None:
        x = n.src[0]
        ax = _at(n).axis
        k = L.hardmax(n.dtype, math.prod(x.shape[:ax]), x.shape[ax],
                      math.prod(x.shape[ax + 1:]))
        self.call_generic(k, [self.out(n), self.ptr(x)], name, "hardmax", n.size)

    def op_resize(self, n: Node, name: str) -> None:
        """One pass per resized axis (last first), as the reference does, in float64; the
        sampling tables (input indices and weights per output index) are computed now."""
        from ...ir.interpreter import _resize_taps, resize_coordinates

        at = _at(n)
        x = n.src[0]
        shape = list(x.shape)
        axes = [a for a in reversed(range(x.rank))
                if not (x.shape[a] == n.shape[a] and at.scales[a] == 1
                        and at.coordinate_mode != "tf_crop_and_resize")]
        if not axes:
            return self.copy_step(n, self.ptr(x), self.out(n), name)
        cur, cur_dt = self.ptr(x), x.dtype
        dst = self.out(n)
        for k, a in enumerate(axes):
            n_in, n_out = shape[a], n.shape[a]
            coord = resize_coordinates(at, a, n_in, n_out)
            idx, w = _resize_taps(at, coord, n_in)
            idx = np.clip(idx, 0, n_in - 1).astype(np.int64)
            w = np.asarray(w, np.float64)
            bias = np.zeros(n_out, np.float64)
            if at.coordinate_mode == "tf_crop_and_resize":
                outside = (coord < 0) | (coord > n_in - 1)
                w[outside] = 0.0
                bias[outside] = at.extrapolation_value
            last = k == len(axes) - 1
            shape[a] = n_out
            out_dt = n.dtype if last else DType.FLOAT64
            target = dst if last else ("b", self.buffer("arena", DType.FLOAT64, shape), 0)
            kern = L.taps(cur_dt, out_dt, math.prod(shape[:a]), n_in, n_out,
                          math.prod(shape[a + 1:]), idx.shape[1], last)
            self.call_generic(kern, [target, cur, ("b", self.const(idx, "resize_idx"), 0),
                                     ("b", self.const(w, "resize_w"), 0),
                                     ("b", self.const(bias, "resize_bias"), 0)], name,
                              "resize", math.prod(shape) * idx.shape[1])
            cur, cur_dt = target, out_dt

    def op_grid_sample(self, n: Node, name: str) -> None:
        x, grid = n.src
        a = _at(n)
        if 0 in x.shape[2:]:
            raise Unsupported("grid_sample of an empty image")
        npoints = math.prod(grid.shape[1:-1])
        k = SA.grid_sample(x.dtype, grid.dtype, x.shape, npoints, a.mode, a.padding_mode,
                           a.align_corners)
        taps = len(SA.TAPS[a.mode]) ** (x.rank - 2)
        self.call_generic(k, [self.out(n), self.ptr(x), self.ptr(grid)], name, "grid_sample",
                          n.size * taps)

    def op_det(self, n: Node, name: str) -> None:
        x = n.src[0]
        size = x.shape[-1]
        batch = math.prod(x.shape[:-2])
        scratch = ("b", self.buffer("arena", DType.FLOAT64, x.shape), 0)
        self.call_generic(LA.det(x.dtype, batch, size), [self.out(n), self.ptr(x), scratch],
                          name, "det", batch * size ** 3)

    # -- reductions and normalisation -----------------------------------------------------------
    def _reduce(self, n: Node, kind: str, axes: Sequence[int], name: str) -> None:
        x = n.src[0]
        k = L.reduce(kind, x.dtype, n.dtype, x.shape, tuple(axes))
        self.call_generic(k, [self.out(n), self.ptr(x)], name, n.op.value, x.size)

    def op_reduce(self, n: Node, name: str) -> None:
        self._reduce(n, _REDUCE[n.op], _at(n).axes, name)

    op_reduce_sum = op_reduce_mean = op_reduce_max = op_reduce_min = op_reduce_prod = op_reduce
    op_reduce_l1 = op_reduce_l2 = op_reduce_sum_square = op_reduce_log_sum = op_reduce
    op_reduce_log_sum_exp = op_reduce

    def op_argmax(self, n: Node, name: str) -> None:
        a = _at(n)
        kind = n.op.value + ("_last" if a.select_last_index else "")
        self._reduce(n, kind, (a.axis,), name)

    op_argmin = op_argmax

    def op_global_avg_pool(self, n: Node, name: str) -> None:
        self._reduce(n, "mean" if n.op is Op.GLOBAL_AVG_POOL else "max",
                     tuple(range(2, n.rank)), name)

    op_global_max_pool = op_global_avg_pool

    def op_softmax(self, n: Node, name: str) -> None:
        x = n.src[0]
        if not x.dtype.is_float:
            raise Unsupported(f"softmax of {x.dtype.value}")
        ax = _at(n).axis
        k = L.softmax(x.dtype, math.prod(x.shape[:ax]), x.shape[ax],
                      math.prod(x.shape[ax + 1:]), n.op is Op.LOG_SOFTMAX)
        self.call_generic(k, [self.out(n), self.ptr(x)], name, n.op.value, x.size)

    op_log_softmax = op_softmax

    def op_layer_norm(self, n: Node, name: str) -> None:
        x = n.src[0]
        ax = _at(n).axis
        rows, cols = math.prod(x.shape[:ax]), math.prod(x.shape[ax:])
        k = L.layer_norm(x.dtype, rows, cols, _at(n).epsilon)
        tmp = o.Node(Op.IDENTITY, x.dtype, x.shape, name=name + ":normed")
        self.call_generic(k, [self.out(tmp), self.ptr(x)], name, "layer_norm", x.size)
        prog = [("mul", (0, 1), (), n.dtype)]
        if len(n.src) == 3:
            prog.append(("add", (3, 2), (), n.dtype))
        self.elementwise(n, prog, [tmp, *n.src[1:]], name + ":affine")

    # -- linear algebra -------------------------------------------------------------------------
    def op_matmul(self, n: Node, name: str) -> None:
        a, b = n.src[:2]
        ep = getattr(_at(n), "epilogue", None)
        nres = 1 if ep is not None and ep.residual else 0
        bias = n.src[2] if len(n.src) - nres == 3 else None
        residual = n.src[-1] if nres else None
        if (n.dtype is DType.FLOAT32 and b.op is Op.CONST and b.rank == 2 and a.rank >= 2
                and a.dtype is DType.FLOAT32 and (bias is None or bias.op is Op.CONST)):
            m = math.prod(a.shape[:-1])
            return self.packed_gemm(n, a, m, b.value, None if bias is None else
                                    bias.value.astype(np.float32), ep, residual, name)
        self.generic_matmul(n, a, b, name)
        self.epilogue_step(n, ep, residual, name, bias)

    def generic_matmul(self, n: Node, a: Node, b: Node, name: str, **extra: Any) -> None:
        ash = a.shape if a.rank >= 2 else (1,) + a.shape
        bsh = b.shape if b.rank >= 2 else b.shape + (1,)
        batch = tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
        m, k = ash[-2], ash[-1]
        nn = bsh[-1]
        sa, sb = _strides(ash), _strides(bsh)
        ast = [s * m * k if s else 0 for s in L.broadcast_strides(ash[:-2], batch)]
        bst = [s * k * nn if s else 0 for s in L.broadcast_strides(bsh[:-2], batch)]
        spec = L.MatmulSpec(a.dtype, b.dtype, n.dtype, batch, m, nn, k,
                            (*ast, sa[-2], sa[-1]), (*bst, sb[-2], sb[-1]), **extra)
        return self._matmul_call(n, spec, [a, b], name)

    def _matmul_call(self, n: Node, spec: L.MatmulSpec, src: Sequence[Node], name: str,
                     extra_ptrs: Sequence[Arg] = ()) -> None:
        k = L.matmul(spec)
        self.call_generic(k, [self.out(n)] + [self.ptr(s) for s in src] + list(extra_ptrs),
                          name, n.op.value, spec.m * spec.n * spec.k * max(1, math.prod(
                              spec.batch)) // 8)

    def op_gemm(self, n: Node, name: str) -> None:
        a, b = n.src[:2]
        at = _at(n)
        ep = getattr(at, "epilogue", None)
        nres = 1 if ep is not None and ep.residual else 0
        c = n.src[2] if len(n.src) - nres == 3 else None
        nn = n.shape[1]
        simple_c = c is None or (c.op is Op.CONST and c.size == nn and c.shape[-1] == nn)
        if (n.dtype is DType.FLOAT32 and b.op is Op.CONST and not at.trans_a and simple_c
                and a.dtype is DType.FLOAT32):
            w = b.value.T if at.trans_b else b.value
            w = (w * np.float32(at.alpha)).astype(np.float32)
            bias = None if c is None else (c.value.reshape(-1) * np.float32(at.beta)).astype(
                np.float32)
            return self.packed_gemm(n, a, a.shape[0], w, bias, ep,
                                    n.src[-1] if nres else None, name)
        m, kk = (a.shape[1], a.shape[0]) if at.trans_a else a.shape
        sa = (1, m) if at.trans_a else (kk, 1)
        sb = (1, b.shape[1]) if at.trans_b else (nn, 1)
        cspec = None
        src = [a, b]
        if c is not None:
            cspec = (c.dtype, L.broadcast_strides(c.shape, n.shape))
            src.append(c)
        spec = L.MatmulSpec(a.dtype, b.dtype, n.dtype, (), m, nn, kk, sa, sb, at.alpha,
                            at.beta, cspec)
        self._matmul_call(n, spec, src, name)
        self.epilogue_step(n, ep, n.src[-1] if nres else None, name)

    def packed_gemm(self, n: Node, a: Node, m: int, w: np.ndarray, bias: np.ndarray | None,
                    ep: Any, residual: Node | None, name: str) -> None:
        """out[M, N] = act(a[M, K] @ w[K, N] + bias (+ residual)) with the weights packed now;
        ReLU / clip run in the GEMM's epilogue, a residual or another activation after it."""
        fast = _fast_act(ep)
        post = residual is not None or fast is None
        act, lo, hi = _as_clip(("none", 0.0, 0.0) if post or fast is None else fast)
        kdim, nn = w.shape
        cfg = G.choose_config(nn, m)
        pb = G.pack_b(np.ascontiguousarray(w, np.float32), cfg)
        wb = self.const(pb.data, "packed_b")
        mode: G.BiasMode = "col" if bias is not None else "none"
        gact: G.Act = "clip"  # _as_clip: every activation is a clip with run-time bounds
        assert act == gact
        gk = self.kernel(("gemm", cfg, mode, gact), lambda: G.build_module(cfg, mode, gact))
        bias_arg: Arg = ("b", self.const(np.concatenate([bias, np.zeros(
            pb.panels * cfg.nr - nn, np.float32)]), "bias"), 0) if bias is not None else ("i", 0)
        mt = -(-m // cfg.mr)
        apack = self.buffer("arena", DType.FLOAT32, (mt, kdim, cfg.mr))
        dst = self.out(n)
        pack = Call(gk, "pack_a", "ppllll" + "l", (self.ptr(a), ("b", apack, 0), ("i", m),
                                                   ("i", kdim), ("i", kdim), ("lo",), ("hi",)))
        self.steps.append(Step(name + ":pack", "pack_a", [pack], mt,
                               m * kdim >= PARALLEL_MIN_ELEMENTS and mt > 1))
        nt = pb.panels
        if mt >= nt * 2 or nt < self.threads:
            ranges: tuple[Arg, ...] = (("lo",), ("hi",), ("i", 0), ("i", nt))
            extent = mt
        else:
            ranges = (("i", 0), ("i", mt), ("lo",), ("hi",))
            extent = nt
        call = Call(gk, "gemm_packed", MACRO_SIG,
                    (("b", apack, 0), ("b", wb, 0), dst, bias_arg, ("i", m), ("i", nn),
                     ("i", kdim), ("i", nn), *ranges, ("f", lo), ("f", hi)))
        self.steps.append(Step(name, "gemm", [call], extent,
                               m * nn * kdim >= PARALLEL_MIN_MACS and extent > 1))
        if post:
            self.epilogue_step(n, ep, residual, name)

    def op_conv(self, n: Node, name: str) -> None:
        x, w = n.src[:2]
        at = _at(n)
        ep = getattr(at, "epilogue", None)
        nres = 1 if ep is not None and ep.residual else 0
        has_bias = len(n.src) - nres == 3
        bias = n.src[2] if has_bias else None
        residual = n.src[-1] if ep is not None and ep.residual else None
        nsp = len(at.kernel)
        if (n.dtype is DType.FLOAT32 and nsp == 2 and w.op is Op.CONST
                and at.pads[:2] == at.pads[2:] and x.dtype is DType.FLOAT32
                and (bias is None or bias.op is Op.CONST)):
            return self.fast_conv(n, x, w.value, None if bias is None else bias.value, at,
                                  ep, residual, name)
        spec = L.ConvSpec(x.dtype, w.dtype, n.dtype, x.shape, w.shape, n.shape, at.strides,
                          at.pads, at.dilations, at.group,
                          bias.dtype if bias is not None else None)
        k = L.conv(spec)
        src = [x, w] + ([bias] if bias is not None else [])
        self.call_generic(k, [self.out(n)] + [self.ptr(s) for s in src], name, "conv",
                          n.size * math.prod(w.shape[1:]) // 8)
        self.epilogue_step(n, ep, residual, name)

    def op_conv_transpose(self, n: Node, name: str) -> None:
        x, w = n.src[:2]
        at = _at(n)
        bias = n.src[2] if len(n.src) == 3 else None
        spec = L.ConvSpec(x.dtype, w.dtype, n.dtype, x.shape, w.shape, n.shape, at.strides,
                          at.pads, at.dilations, at.group,
                          bias.dtype if bias is not None else None, transposed=True)
        src = [x, w] + ([bias] if bias is not None else [])
        self.call_generic(L.conv(spec), [self.out(n)] + [self.ptr(s) for s in src], name,
                          "conv_transpose", n.size * math.prod(w.shape[1:]))

    @staticmethod
    def epilogue_program(ep: Any, residual: Node | None, dt: DType) -> list[L.Instr]:
        """act(y [+ residual]) over values 0 = y, 1 = residual."""
        prog: list[L.Instr] = [("add", (0, 1), (), dt)] if residual is not None else []
        return prog + _epilogue_instrs(ep, dt, 2 if prog else 0)

    def epilogue_step(self, n: Node, ep: Any, residual: Node | None, name: str,
                      bias: Node | None = None) -> None:
        """y = act(y [+ bias] [+ residual]) in place, for what a kernel did not fuse."""
        src = [n] + [s for s in (bias, residual) if s is not None]
        prog: list[L.Instr] = []
        for k in range(1, len(src)):
            prog.append(("add", (0 if k == 1 else len(src) + k - 2, k), (), n.dtype))
        prog += _epilogue_instrs(ep, n.dtype, len(src) + len(prog) - 1 if prog else 0)
        if not prog:
            return
        st = [_strides(n.shape)] + [L.broadcast_strides(r.shape, n.shape) for r in src[1:]]
        kern = L.eltwise(n.dtype, n.shape, list(zip([s.dtype for s in src], st)), prog)
        self.call_generic(kern, [self.ptr(n)] + [self.ptr(s) for s in src], name + ":epilogue",
                          "epilogue", n.size)

    def fast_conv(self, n: Node, x: Node, w: np.ndarray, bias: np.ndarray | None,
                  at: Any, ep: Any, residual: Node | None, name: str) -> None:
        fast = _fast_act(ep)
        post = residual is not None or fast is None
        act, lo, hi = _as_clip(("none", 0.0, 0.0) if post or fast is None else fast)
        conv = C.Conv2d(np.ascontiguousarray(w, np.float32),
                        None if bias is None else np.ascontiguousarray(bias, np.float32),
                        at.strides, at.pads[:2], at.dilations, at.group,
                        None if act == "none" else act, (lo, hi) if act == "clip" else None)
        nb, cin, h, wd = x.shape
        g = conv.geom(h, wd)
        dst = self.out(n)
        _, dbuf, doff = dst
        xb, xoff = self.where(x)
        fused: tuple[L.Instr, ...] = ()  # epilogue fused into the copy-out of padded GEMMs
        if conv.depthwise:
            geom = C.ConvGeom(1, *C.dataclass_fields(g)[1:])
            dki = self.kernel(("depthwise", geom, act),
                              lambda: D.depthwise_module(geom, act))
            wb = self.const(conv.weight, "dw_weight")
            bb = self.const(conv.bias, "dw_bias")
            for i in range(nb):
                call = Call(dki, "depthwise", "ppppllff", (
                    ("b", xb, xoff + 4 * i * cin * h * wd), ("b", wb, 0), ("b", bb, 0),
                    ("b", dbuf, doff + 4 * i * conv.cout * g.oh * g.ow), ("lo",), ("hi",),
                    ("f", lo), ("f", hi)))
                work = conv.cout * g.oh * g.ow * g.kh * g.kw
                self.steps.append(Step(name, "conv_dw", [call], conv.cout,
                                       work >= PARALLEL_MIN_MACS and self.threads > 1))
        else:
            npix = g.oh * g.ow
            cfg = conv.cfg or G.choose_config(npix)
            packed, pbias = conv._prepared(cfg)
            panels = -(-npix // cfg.nr)
            kdim = g.c * g.kh * g.kw
            ik = self.kernel(("im2col", g, cfg.nr), lambda: C._im2col_module(g, cfg.nr))
            gact: G.Act = "clip"
            assert act == gact
            gk = self.kernel(("gemm", cfg, "row", gact),
                             lambda: G.build_module(cfg, "row", gact))
            cg = conv.cout // conv.groups
            mpad, npad = packed[0].panels * cfg.mr, panels * cfg.nr
            padded = (mpad, npad) != (cg, npix)
            col = self.buffer("arena", DType.FLOAT32, (panels, kdim, cfg.nr))
            ybuf = self.buffer("arena", DType.FLOAT32, (mpad, npad)) if padded else None
            if padded and post and conv.groups == 1:
                fused = tuple(self.epilogue_program(ep, residual, n.dtype))
            pas = [self.const(pa.data, "packed_w") for pa in packed]
            bbs = [self.const(np.ascontiguousarray(pbias[i]), "bias") for i in
                   range(conv.groups)]
            big = cg * npix * kdim >= PARALLEL_MIN_MACS and self.threads > 1
            # Few pixel panels (the late, small feature maps): split the GEMM over its output
            # channels instead, after an im2col split over the panels.
            msplit = big and panels < 4 * self.threads and packed[0].panels > panels
            for i in range(nb):
                for grp in range(conv.groups):
                    xa = ("b", xb, xoff + 4 * (i * conv.cin + grp * g.c) * h * wd)
                    ya = doff + 4 * (i * conv.cout + grp * cg) * npix
                    im2col = Call(ik, "im2col_pack", "ppll", (xa, ("b", col, 0), ("lo",),
                                                              ("hi",)))
                    pa = packed[grp]
                    mr_ = (("lo",), ("hi",), ("i", 0), ("i", panels)) if msplit else \
                        (("i", 0), ("i", pa.panels), ("lo",), ("hi",))
                    if ybuf is None:
                        gemm = Call(gk, "gemm_packed", MACRO_SIG, (
                            ("b", pas[grp], 0), ("b", col, 0), ("b", dbuf, ya),
                            ("b", bbs[grp], 0), ("i", cg), ("i", npix), ("i", kdim),
                            ("i", npix), *mr_, ("f", lo), ("f", hi)))
                        copy = None
                    else:
                        gemm = Call(gk, "gemm_packed", MACRO_SIG, (
                            ("b", pas[grp], 0), ("b", col, 0), ("b", ybuf, 0),
                            ("b", bbs[grp], 0), ("i", mpad), ("i", npad), ("i", kdim),
                            ("i", npad), *mr_, ("f", lo), ("f", hi)))
                        # the epilogue the GEMM did not fuse runs in the copy-out
                        prog = fused if conv.groups == 1 else ()
                        pk = L.panel_copy(cg, npad, npix, cfg.nr, prog)
                        res = [self.ptr(residual)] if prog and residual is not None else []
                        if res:
                            r = res[0]
                            res = [("b", r[1], r[2] + 4 * i * conv.cout * npix)]
                        copy = Call(self.kernel(pk.key, pk.build), pk.fname, pk.sig, (
                            ("b", dbuf, ya), ("b", ybuf, 0), *res, ("lo",), ("hi",)))
                    if msplit:
                        self.steps.append(Step(name + ":im2col", "im2col", [im2col], panels,
                                               kdim * npix >= PARALLEL_MIN_ELEMENTS
                                               and panels > 1))
                        self.steps.append(Step(name, "conv", [gemm], pa.panels, True))
                        if copy is not None:
                            self.steps.append(Step(name + ":copy", "copy", [copy], panels,
                                                   cg * npix >= PARALLEL_MIN_ELEMENTS
                                                   and panels > 1))
                    else:
                        calls = [im2col, gemm] + ([copy] if copy is not None else [])
                        self.steps.append(Step(name, "conv", calls, panels,
                                               big and panels > 1))
        if post and not fused:
            self.epilogue_step(n, ep, residual, name)

    def op_max_pool(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        kind: P.PoolKind = "max" if n.op is Op.MAX_POOL else "avg"
        nsp = len(a.kernel)
        if (x.dtype is DType.FLOAT32 and nsp == 2 and a.pads[:2] == a.pads[2:]
                and a.dilations == (1, 1)):
            geom = P.PoolGeom(x.shape[2], x.shape[3], a.kernel[0], a.kernel[1], a.strides[0],
                              a.strides[1], a.pads[0], a.pads[1], a.count_include_pad)
            # (larger pads crash LLVM's optimiser on pool.py's module: generic path for them)
            if (geom.oh, geom.ow) == n.shape[2:] and 2 * a.pads[0] < a.kernel[0] \
                    and 2 * a.pads[1] < a.kernel[1]:
                kk = self.kernel(("pool", kind, geom), lambda: P._pool_module(kind, geom))
                planes = x.shape[0] * x.shape[1]
                call = Call(kk, "pool", "ppll", (self.ptr(x), self.out(n), ("lo",), ("hi",)))
                self.steps.append(Step(name, n.op.value, [call], planes,
                                       n.size >= PARALLEL_MIN_ELEMENTS // 4 and planes > 1))
                return
        spec = L.PoolSpec(kind, x.dtype, x.shape, n.shape, a.kernel, a.strides, a.pads,
                          a.dilations, a.count_include_pad)
        self.call_generic(L.pool(spec), [self.out(n), self.ptr(x)], name, n.op.value,
                          n.size * math.prod(a.kernel))

    op_avg_pool = op_max_pool

    def op_lp_pool(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        pa = a.pool
        if not x.dtype.is_float:
            raise Unsupported(f"lp_pool of {x.dtype.value}")
        spec = L.PoolSpec("lp", x.dtype, x.shape, n.shape, pa.kernel, pa.strides, pa.pads,
                          pa.dilations, False, False, a.p)
        self.call_generic(L.pool(spec), [self.out(n), self.ptr(x)], name, "lp_pool",
                          n.size * math.prod(pa.kernel))

    def op_lrn(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        k = L.lrn(n.dtype, x.shape[0], x.shape[1], math.prod(x.shape[2:]), a.size, a.alpha,
                  a.beta, a.bias)
        self.call_generic(k, [self.out(n), self.ptr(x)], name, "lrn", n.size * a.size)

    def op_max_pool_index(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        spec = L.PoolSpec("index", x.dtype, x.shape, n.shape, a.kernel, a.strides, a.pads,
                          a.dilations, False, a.column_major)
        self.call_generic(L.pool(spec), [self.out(n), self.ptr(x)], name, "max_pool_index",
                          n.size * math.prod(a.kernel))

    # -- integer and quantised ------------------------------------------------------------------
    def op_matmul_integer(self, n: Node, name: str) -> None:
        a, b, az, bz = n.src
        self._int_matmul(n, a, b, az, bz, None, name)

    def op_qlinear_matmul(self, n: Node, name: str) -> None:
        x, xs, xz, w, ws, wz, ys, yz = n.src
        self._int_matmul(n, x, w, xz, wz, (xs, ws, ys, yz), name)

    def _int_matmul(self, n: Node, a: Node, b: Node, az: Node, bz: Node,
                    q: tuple[Node, ...] | None, name: str) -> None:
        extra: dict[str, Any] = dict(zero_points=True, azp_str=1 if az.size > 1 else 0,
                                     bzp_str=1 if bz.size > 1 else 0, zp_dt=(az.dtype, bz.dtype))
        if q is not None:
            extra.update(requant=True, xs_str=1 if q[0].size > 1 else 0,
                         ws_str=1 if q[1].size > 1 else 0, scale_dt=q[0].dtype)
        ar, br = a.rank, b.rank
        if ar < 2 or br < 2:
            raise Unsupported("integer matmul of vectors")
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        m, k = a.shape[-2:]
        nn = b.shape[-1]
        sa, sb = _strides(a.shape), _strides(b.shape)
        ast = [s * m * k if s else 0 for s in L.broadcast_strides(a.shape[:-2], batch)]
        bst = [s * k * nn if s else 0 for s in L.broadcast_strides(b.shape[:-2], batch)]
        spec = L.MatmulSpec(a.dtype, b.dtype, n.dtype, batch, m, nn, k,
                            (*ast, sa[-2], sa[-1]), (*bst, sb[-2], sb[-1]), **extra)
        ptrs = [self.ptr(az), self.ptr(bz)] + ([self.ptr(v) for v in q] if q else [])
        self._matmul_call(n, spec, [a, b], name, ptrs)

    def op_conv_integer(self, n: Node, name: str) -> None:
        x, w, xz, wz = n.src
        self._int_conv(n, x, w, xz, wz, None, None, name)

    def op_qlinear_conv(self, n: Node, name: str) -> None:
        x, xs, xz, w, ws, wz, ys, yz = n.src[:8]
        bias = n.src[8] if len(n.src) == 9 else None
        self._int_conv(n, x, w, xz, wz, (xs, ws, ys, yz), bias, name)

    def _int_conv(self, n: Node, x: Node, w: Node, xz: Node, wz: Node,
                  q: tuple[Node, ...] | None, bias: Node | None, name: str) -> None:
        at = _at(n)
        spec = L.ConvSpec(x.dtype, w.dtype, n.dtype, x.shape, w.shape, n.shape, at.strides,
                          at.pads, at.dilations, at.group,
                          bias.dtype if bias is not None else None,
                          (xz.dtype, wz.dtype, 1 if wz.size > 1 else 0),
                          (0, 1 if q[1].size > 1 else 0) if q else None)
        src = [x, w] + ([bias] if bias is not None else []) + [xz, wz] + (list(q) if q else [])
        self.call_generic(L.conv(spec), [self.out(n)] + [self.ptr(s) for s in src], name,
                          n.op.value, n.size * math.prod(w.shape[1:]) // 8)


def _fast_act(ep: Any) -> tuple[str, float, float] | None:
    """The packed kernels' epilogue for an Epilogue: ("none" | "relu" | "clip", lo, hi), or
    None when its activation needs the generic path."""
    if ep is None or ep.activation is None:
        return ("none", 0.0, 0.0)
    if ep.activation == "relu":
        return ("relu", 0.0, 0.0)
    if ep.activation == "clip":
        lo = -math.inf if ep.clip_min is None else float(ep.clip_min)
        hi = math.inf if ep.clip_max is None else float(ep.clip_max)
        return ("clip", lo, hi)
    return None


def _as_clip(act: tuple[str, float, float]) -> tuple[str, float, float]:
    """none / relu as a clip with run-time bounds: one compiled GEMM per blocking and bias
    mode serves every activation (each GEMM module takes ~0.7 s to optimise)."""
    kind, lo, hi = act
    if kind == "none":
        return ("clip", -math.inf, math.inf)
    if kind == "relu":
        return ("clip", 0.0, math.inf)
    return act


def lower(g: Graph, *, threads: int = 1, target: str = "host") -> CpuProgram:
    """Lower `g` (ideally after `compiler.pipeline.optimize`) for `threads` threads.

    `target` only names where the object code will run ("host" or "aarch64"); the program
    itself is target independent. Raises `UnsupportedError` naming the first node without
    CPU code."""
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"lower: threads={threads!r}, expected an int >= 1")
    del target
    return _Lowerer(g, threads).run()


__all__ = ["Buffer", "Call", "CpuProgram", "KernelRef", "Step", "lower"]
