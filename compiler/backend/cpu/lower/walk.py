"""The walk: `_Lowerer` (every node in order; output binding) with the handlers of the ops
that are not nn (`nn.py`): elementwise, data movement, reductions and normalisation, the rest;
and the entry points `lower_nodes` and `lower`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vtakit.runtime.plan import Arg, Call, Plan, Section, Step

from ....errors import UnsupportedError
from ....ir import ops as o
from ....ir.dtypes import DType
from ....ir.graph import Graph
from ....ir.ops import Node, Op
from ....lowering import PlanBuilder
from ... import PlanSection
from ..kernels import elementwise as E
from ..kernels import linalg as LA
from ..kernels import loops as L
from ..kernels import sample as SA
from ..kernels.scalar import Unsupported
from .base import _at, _axis_strides, _nbytes, _strides
from .nn import NnLowering

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


def elementwise_instr(n: Node) -> E.Instr:
    op = n.op.value
    if n.op is Op.MOD:
        assert isinstance(_at(n), o.ModAttrs)
        op = "fmod" if _at(n).fmod else "mod"
    return (op, tuple(range(len(n.src))), _params(n), n.dtype)


class _Lowerer(NnLowering):
    # -- the walk -------------------------------------------------------------------------------
    def run(self) -> frozenset[int]:
        """Lower every node no other backend took and bind the graph's outputs; the positions
        of the nodes lowered here."""
        g, plan = self.g, self.plan
        done = []
        for i, n in enumerate(g.nodes):
            if n.op in (Op.INPUT, Op.CONST) or id(n) in plan.taken:
                continue  # constants get a buffer on first use (where())
            with plan.lowering(n, "cpu"):
                try:
                    self.node(n)
                except Unsupported as e:
                    raise UnsupportedError(f"{n.op.name} node {n.name!r}: no CPU code for "
                                           f"{e} (operands {[s.dtype.value for s in n.src]})"
                                           ) from None
            done.append(i)
        self.bind_outputs()
        return frozenset(done)

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

    # -- nodes ----------------------------------------------------------------------------------
    def node(self, n: Node) -> None:
        op = n.op
        if op is Op.CONST:
            return  # a buffer on first use (where())
        if op in (Op.RESHAPE, Op.IDENTITY):
            if id(n) not in self.loc:  # an alias of the operand's storage
                self.loc[id(n)] = self.where(n.src[0])
            else:  # a backend lowered before asked for this value in a buffer of its own
                self.copy_step(n, self.ptr(n.src[0]), self.ptr(n),
                               n.name or op.value)
            return
        if n.size == 0:
            self.out(n)
            return
        name = n.name or op.value
        if op in self._CHAIN and self._chain_op(n):
            if self.int_chain(n):
                return  # computed by the program of the chain op that reads it
            if op is not Op.REQUANTIZE and any(self.int_chain(s) for s in n.src):
                return self.int_chain_step(n, name)
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

    def elementwise(self, n: Node, prog: Sequence[E.Instr], src: Sequence[Node], name: str,
                    strides: Sequence[tuple[int, ...]] | None = None) -> None:
        if strides is None:
            strides = [L.broadcast_strides(s.shape, n.shape) for s in src]
        operands = [(s.dtype, st) for s, st in zip(src, strides, strict=True)]
        k = E.eltwise(n.dtype, n.shape, operands, prog)
        dst = self.out(n)
        self.call_generic(k, [dst] + [self.ptr(s) for s in src], name, n.op.value, n.size)

    def op_batch_norm(self, n: Node, name: str) -> None:
        at = _at(n)
        x = n.src[0]
        st = [L.broadcast_strides(x.shape, n.shape)] + [
            _axis_strides(s.shape, 1, n.rank) for s in n.src[1:]]
        dt = n.dtype
        # (x - mean) * (scale / sqrt(var + eps)) + bias, as the reference computes it
        prog: list[E.Instr] = [
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
            self.add_step(Step(name, "scatter_elements", [Call(ki, k.fname, k.sig, (
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
            self.add_step(Step(name, "scatter_nd", [Call(ki, k.fname, k.sig, (
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
        from ....ir.infer import conv_shape

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
        from ....ir.interpreter import _resize_taps, resize_coordinates

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
        k = E.softmax_axis(x.dtype, math.prod(x.shape[:ax]), x.shape[ax],
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


def lower_nodes(g: Graph, plan: PlanBuilder, *, vnni: bool | None = None) -> PlanSection:
    """The CPU backend's lowering entry (registered in ``backend/cpu/__init__.py``): lower
    every node of `g` that no backend lowered before into `plan`, and bind the outputs.
    `vnni`: whether the int8 kernels may use AVX-512 VNNI (None: this host's answer; False for
    code built for another machine)."""
    lowerer = _Lowerer(g, plan)
    lowerer.vnni = vnni
    taken = lowerer.run()
    return PlanSection("cpu", taken, Section({"kernels": len(lowerer.kernels)}, {},
                                             lowerer.kernels))


def lower(g: Graph, *, threads: int = 1) -> Plan:
    """`g` (ideally after `compiler.pipeline.optimize`) as a plan that runs on the CPU alone, for
    `threads` threads, in this process. Raises `UnsupportedError` naming the first node without
    CPU code."""
    from ....lowering import lower_graph

    return lower_graph(g, "cpu", threads=threads)[0]


__all__ = ["lower", "lower_nodes"]
