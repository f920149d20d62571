"""Float graph + calibrated ranges → the integer graph.

Runs on a graph whose batch norms are folded and whose epilogues are not yet fused (the
pipeline's ``PRE_QUANTIZE`` passes), so that every value the quantiser scales was observed.

Every quantised value is int8 with a symmetric per-tensor scale (zero point 0: the accelerator
has no zero-point arithmetic); weights are int8 per output channel (``fixed`` mode) or per tensor
with power-of-two scales (``shift`` mode); biases are int32 in the accumulator's scale. The
integer ops, and what they become:

- CONV (constant weights): CONV_INTEGER (int8 × int8 → int32), then REQUANTIZE (bias,
  multiplier, shift; a ReLU/Clip that follows is folded into its bounds);
- GEMM, MATMUL with constant weights: MATMUL_INTEGER, then REQUANTIZE per output column;
- MATMUL of two activations: MATMUL_INTEGER, then REQUANTIZE per tensor;
- ADD of two activations (a residual): each operand REQUANTIZE'd (shift 0) into a common scale,
  ADD in int32, REQUANTIZE (a following ReLU folded);
- RELU, CLIP: the same op on int8 (CLIP's bounds in the input's scale);
- MAX_POOL, RESHAPE, TRANSPOSE: the same op on int8, the input's scale;
- GLOBAL_AVG_POOL: REDUCE_SUM in int32, then REQUANTIZE (1 / window in the multiplier);
- anything else, and nodes kept in float: DEQUANTIZE_LINEAR, the float op, and QUANTIZE_LINEAR
  where an integer op reads its result.

Graph inputs enter through QUANTIZE_LINEAR and outputs leave through DEQUANTIZE_LINEAR, so the
integer graph has the float graph's signature.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..ir import ops as o
from ..ir.dtypes import DType
from ..ir.graph import Graph
from ..ir.infer import infer
from ..ir.ops import Node, Op, const
from . import requant as R

QMAX = 127  # symmetric int8: [-127, 127] for weights; activations use [-128, 127] bounds


def mk(op: Op, *src: Node, attrs: o.Attrs = o.NO_ATTRS, dtype: DType | None = None,
       shape: tuple[int, ...] | None = None, name: str = "") -> Node:
    d, s = infer(op, src, attrs, dtype, shape)
    return Node(op, d, s, tuple(src), attrs, name)


@dataclass
class LayerReport:
    """What the quantiser did with one float node."""

    name: str
    op: str
    kind: str  # "int8" / "float (asked)" / "float (unsupported)" / "float (loss)"
    mode: str = ""
    shift: int | None = None
    multipliers: int = 0
    rel_error: float = 0.0
    worst_case: int = 0  # max |m| * min(bound, clamp) + rounding: the proven int32 headroom used


@dataclass
class Rewriter:
    g: Graph
    thresholds: Mapping[int, float]
    mode: str = "fixed"
    keep_float: frozenset[str] = frozenset()
    clamp: bool = False  # saturate before the multiply (see requant.choose)
    layers: list[LayerReport] = field(default_factory=list)
    # id(float node) -> (int8 node, scale) and -> float node in the new graph
    q: dict[int, tuple[Node, float]] = field(default_factory=dict)
    f: dict[int, Node] = field(default_factory=dict)
    # integer node standing for a float node: for the per-layer SQNR report
    # (float node, its int8 stand-in, scale, the layer's name) for the per-layer SQNR report
    mapping: dict[int, tuple[Node, Node, float, str]] = field(default_factory=dict)
    # what the report warns about: tensors whose range was 0 on every calibration sample
    warnings: list[str] = field(default_factory=list)

    # -- scales -----------------------------------------------------------------------------
    def scale(self, n: Node) -> float:
        """The int8 scale of float node n: its observed range / 127. A range of 0 (n was 0 on
        every calibration sample: a dead activation) leaves nothing to take a scale from; it
        gets 1/127, which does not matter as long as n stays 0 (every value quantises to 0),
        and a warning in the report, since it does matter if n is not 0 on real inputs."""
        t = self.thresholds.get(id(n), 0.0)
        if t > 0:
            s = t / QMAX
        else:
            s = 1.0 / QMAX
            w = (f"{n.name!r} ({n.op.name}) is 0 on every calibration sample (a dead "
                 f"activation?): its int8 scale is arbitrary (1/127) and every value it takes "
                 f"on other inputs is quantised with it; calibrate on data where it is not 0 "
                 f"if it matters")
            if w not in self.warnings:
                self.warnings.append(w)
        return R.pow2_ceil(s) if self.mode == "shift" else s

    # -- crossing between float and int8 -----------------------------------------------------
    def as_int8(self, n: Node) -> tuple[Node, float]:
        got = self.q.get(id(n))
        if got is None:
            s = self.scale(n)
            x = self.as_float(n)
            qn = mk(Op.QUANTIZE_LINEAR, x, const(np.float32(s)), const(np.int8(0)),
                    attrs=o.AxisAttrs(0), name=f"{n.name}:quantize")
            got = self.q[id(n)] = (qn, s)
        return got

    def as_float(self, n: Node) -> Node:
        got = self.f.get(id(n))
        if got is None:
            qn, s = self.q[id(n)]
            got = self.f[id(n)] = mk(Op.DEQUANTIZE_LINEAR, qn, const(np.float32(s)),
                                     const(np.int8(0)), attrs=o.AxisAttrs(0),
                                     name=f"{n.name}:dequantize")
        return got

    # -- the walk -----------------------------------------------------------------------------
    def run(self) -> Graph:
        users = self.g.users()
        out_ids = {id(n) for n in self.g.outputs}
        self.absorbed: set[int] = set()
        for n in self.g.nodes:
            if n.op in (Op.INPUT, Op.CONST):
                self.f[id(n)] = n
                continue
            if id(n) in self.absorbed:
                continue
            handler = HANDLERS.get(n.op)
            if n.name in self.keep_float:
                self.float_node(n, "float (asked)")
                continue
            if handler is None or not n.dtype.is_float:
                self.float_node(n, "float (unsupported)" if handler is None else "float")
                continue
            act = self.following_activation(n, users, out_ids)
            if not handler(self, n, act):
                self.float_node(n, "float (unsupported)")
        outs = tuple(self.as_float(n) for n in self.g.outputs)
        return Graph(self.g.inputs, outs, self.g.output_names, self.g.name)

    def following_activation(self, n: Node, users: Mapping[Node, list[Node]],
                             out_ids: set[int]) -> Node | None:
        """A RELU / CLIP that is n's only user (and n not an output): folded into n's bounds."""
        us = users.get(n, [])
        if len(us) == 1 and id(n) not in out_ids and us[0].op in (Op.RELU, Op.CLIP) \
                and us[0].name not in self.keep_float:
            return us[0]
        return None

    def float_node(self, n: Node, kind: str) -> None:
        src = tuple(self.as_float(s) for s in n.src)
        self.f[id(n)] = n.replace(src=src)
        self.layers.append(LayerReport(n.name, n.op.name, kind))

    def bounds(self, act: Node | None, s_out: float) -> tuple[int, int]:
        """int8 bounds of an output of scale s_out, after act (None, RELU or CLIP)."""
        lo, hi = -128, 127
        if act is not None:
            if act.op is Op.RELU:
                lo = 0
            else:
                a = act.attrs
                assert isinstance(a, o.ClipAttrs)
                if a.min is not None:
                    lo = max(lo, min(hi, math.ceil(a.min / s_out - 0.5)))
                if a.max is not None:
                    hi = min(hi, max(lo, math.floor(a.max / s_out + 0.5)))
        return lo, hi

    def emit(self, n: Node, act: Node | None, value: Node, s_out: float,
             report: LayerReport) -> None:
        """`value` (int8, scale s_out) stands for n, or for act when one was folded."""
        target = act if act is not None else n
        self.q[id(target)] = (value, s_out)
        self.mapping[id(target)] = (target, value, s_out, n.name)
        if act is not None:
            self.absorbed.add(id(act))
        self.layers.append(report)

    # -- handlers ----------------------------------------------------------------------------
    def requantize(self, acc: Node, bias_q: np.ndarray | None, real: np.ndarray,
                   bound: np.ndarray, axis: int, lo: int, hi: int, name: str,
                   report: LayerReport) -> Node:
        rq = R.choose(real, bound, self.mode, out_range=(lo, hi), clamp=self.clamp)
        shift = (rq.shift,)
        src = (acc,) if bias_q is None else (acc, const(bias_q.astype(np.int32), f"{name}:bias"))
        report.mode, report.shift, report.multipliers = self.mode, rq.shift, len(rq.multiplier)
        report.rel_error, report.worst_case = rq.rel_error, rq.worst_case
        return mk(Op.REQUANTIZE, *src, attrs=o.RequantAttrs(rq.multiplier, shift, axis, lo, hi,
                                                            clamp=rq.clamp),
                  dtype=DType.INT8, name=name)

    def weights(self, w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """int8 weights and their scales: per channel along `axis` (fixed mode) or one
        power-of-two scale (shift mode)."""
        w = w.astype(np.float64)
        red = tuple(i for i in range(w.ndim) if i != axis)
        if self.mode == "shift":
            s = np.full(w.shape[axis], R.pow2_ceil(float(np.abs(w).max()) / QMAX or 1.0))
        else:
            amax = np.abs(w).max(axis=red)
            s = np.where(amax > 0, amax / QMAX, 1.0)
        shape = [1] * w.ndim
        shape[axis] = -1
        wq = np.clip(np.round(w / s.reshape(shape)), -QMAX, QMAX).astype(np.int8)
        return wq, s

    def conv(self, n: Node, act: Node | None) -> bool:
        a = n.attrs
        assert isinstance(a, o.ConvAttrs)
        w = n.src[1]
        if w.op is not Op.CONST or (len(n.src) > 2 and n.src[2].op is not Op.CONST) \
                or a.epilogue != o.NO_EPILOGUE:
            return False
        xq, sx = self.as_int8(n.src[0])
        wq, sw = self.weights(w.value, 0)
        target = act if act is not None else n
        s_out = self.scale(target)
        acc = mk(Op.CONV_INTEGER, xq, const(wq, f"{n.name}:w"), const(np.int8(0)),
                 const(np.int8(0)), attrs=a, name=f"{n.name}:acc")
        s_acc = sx * sw
        bias_q = (np.round(n.src[2].value.astype(np.float64) / s_acc).astype(np.int64)
                  if len(n.src) > 2 else np.zeros(len(sw), np.int64))
        bound = 128 * np.abs(wq.astype(np.int64)).reshape(len(sw), -1).sum(1) + np.abs(bias_q)
        report = LayerReport(n.name, n.op.name, "int8")
        lo, hi = self.bounds(act, s_out)
        y = self.requantize(acc, bias_q, s_acc / s_out, bound, 1, lo, hi, n.name, report)
        self.emit(n, act, y, s_out, report)
        return True

    def matmul_like(self, n: Node, act: Node | None) -> bool:
        """GEMM / MATMUL: constant right operand (per output column), or two activations."""
        if n.op is Op.GEMM:
            a = n.attrs
            assert isinstance(a, o.GemmAttrs)
            if a.trans_a or a.epilogue != o.NO_EPILOGUE or n.src[1].op is not Op.CONST:
                return False
            wf = n.src[1].value.astype(np.float64)
            wf = (wf.T if a.trans_b else wf) * a.alpha
            bias = None
            if len(n.src) > 2:
                if n.src[2].op is not Op.CONST:
                    return False
                c = np.broadcast_to(n.src[2].value.astype(np.float64) * a.beta, n.shape)
                if np.any(c != c[:1]):
                    return False  # a bias that differs per row is not a per-column bias
                bias = c[0]
        else:
            if getattr(n.attrs, "epilogue", o.NO_EPILOGUE) != o.NO_EPILOGUE or len(n.src) != 2:
                return False
            if n.src[1].op is not Op.CONST:
                return self.matmul2(n, act)
            wf = n.src[1].value.astype(np.float64)
            if wf.ndim != 2:
                return False
            bias = None
        xq, sx = self.as_int8(n.src[0])
        wq, sw = self.weights(wf, 1)
        target = act if act is not None else n
        s_out = self.scale(target)
        acc = mk(Op.MATMUL_INTEGER, xq, const(wq, f"{n.name}:w"), const(np.int8(0)),
                 const(np.int8(0)), name=f"{n.name}:acc")
        s_acc = sx * sw
        bias_q = np.round(bias / s_acc).astype(np.int64) if bias is not None else None
        bound = 128 * np.abs(wq.astype(np.int64)).sum(0) + (
            np.abs(bias_q) if bias_q is not None else 0)
        report = LayerReport(n.name, n.op.name, "int8")
        lo, hi = self.bounds(act, s_out)
        y = self.requantize(acc, bias_q, s_acc / s_out, bound, n.rank - 1, lo, hi, n.name,
                            report)
        self.emit(n, act, y, s_out, report)
        return True

    def matmul2(self, n: Node, act: Node | None) -> bool:
        aq, sa = self.as_int8(n.src[0])
        bq, sb = self.as_int8(n.src[1])
        target = act if act is not None else n
        s_out = self.scale(target)
        acc = mk(Op.MATMUL_INTEGER, aq, bq, const(np.int8(0)), const(np.int8(0)),
                 name=f"{n.name}:acc")
        k = n.src[0].shape[-1]
        report = LayerReport(n.name, n.op.name, "int8")
        lo, hi = self.bounds(act, s_out)
        y = self.requantize(acc, None, np.array([sa * sb / s_out]), np.array([128 * 128 * k]),
                            n.rank - 1, lo, hi, n.name, report)
        self.emit(n, act, y, s_out, report)
        return True

    def add(self, n: Node, act: Node | None) -> bool:
        a, b = n.src
        if a.op is Op.CONST or b.op is Op.CONST or a.shape != n.shape or b.shape != n.shape:
            return False
        aq, sa = self.as_int8(a)
        bq, sb = self.as_int8(b)
        target = act if act is not None else n
        s_out = self.scale(target)
        # Common scale: y = (a * ma + b * mb + round) >> s, with ma/2**s = sa/s_out.
        real = np.array([sa / s_out, sb / s_out])
        # Always integer multipliers here: in shift mode the ratios are powers of two, exact.
        rq = R.choose(real, np.array([256, 256]), "fixed", max_shift=20)
        ma, mb = (rq.multiplier * 2)[:2] if len(rq.multiplier) == 1 else rq.multiplier
        full = o.RequantAttrs
        i32 = DType.INT32
        terms = []
        for xq, m in ((aq, ma), (bq, mb)):
            wide = mk(Op.CAST, xq, dtype=i32, name=f"{n.name}:widen")
            terms.append(mk(Op.REQUANTIZE, wide, attrs=full((m,), (0,), 0, -(1 << 31),
                                                             (1 << 31) - 1),
                            dtype=i32, name=f"{n.name}:scale"))
        total = mk(Op.ADD, *terms, name=f"{n.name}:sum")
        lo, hi = self.bounds(act, s_out)
        y = mk(Op.REQUANTIZE, total, attrs=full((1,), (rq.shift,), 0, lo, hi), dtype=DType.INT8,
               name=n.name)
        self.emit(n, act, y, s_out, LayerReport(n.name, n.op.name, "int8", self.mode, rq.shift,
                                                2, rq.rel_error, rq.worst_case))
        return True

    def activation(self, n: Node, act: Node | None) -> bool:
        xq, sx = self.as_int8(n.src[0])
        if n.op is Op.RELU:
            y = mk(Op.RELU, xq, name=n.name)
        else:
            lo, hi = self.bounds(n, sx)
            y = mk(Op.CLIP, xq, attrs=o.ClipAttrs(float(lo), float(hi)), name=n.name)
        self.emit(n, None, y, sx, LayerReport(n.name, n.op.name, "int8"))
        return True

    def same_scale(self, n: Node, act: Node | None) -> bool:
        """Ops that move int8 values without arithmetic: the input's scale carries over."""
        xq, sx = self.as_int8(n.src[0])
        y = mk(n.op, xq, attrs=n.attrs, shape=n.shape, name=n.name)
        self.emit(n, None, y, sx, LayerReport(n.name, n.op.name, "int8"))
        return True

    def global_avg_pool(self, n: Node, act: Node | None) -> bool:
        xq, sx = self.as_int8(n.src[0])
        window = math.prod(n.src[0].shape[2:])
        s_out = self.scale(n)
        wide = mk(Op.CAST, xq, dtype=DType.INT32, name=f"{n.name}:widen")
        axes = tuple(range(2, n.rank))
        total = mk(Op.REDUCE_SUM, wide, attrs=o.ReduceAttrs(axes, True), name=f"{n.name}:sum")
        report = LayerReport(n.name, n.op.name, "int8")
        real = np.array([sx / (window * s_out)])
        if self.mode == "shift" and not math.log2(window).is_integer():
            return False
        y = self.requantize(total, None, real, np.array([128 * window]), 1, -128, 127, n.name,
                            report)
        self.emit(n, None, y, s_out, report)
        return True


HANDLERS: dict[Op, Callable[[Rewriter, Node, Node | None], bool]] = {
    Op.CONV: Rewriter.conv,
    Op.GEMM: Rewriter.matmul_like,
    Op.MATMUL: Rewriter.matmul_like,
    Op.ADD: Rewriter.add,
    Op.RELU: Rewriter.activation,
    Op.CLIP: Rewriter.activation,
    Op.MAX_POOL: Rewriter.same_scale,
    Op.RESHAPE: Rewriter.same_scale,
    Op.TRANSPOSE: Rewriter.same_scale,
    Op.GLOBAL_AVG_POOL: Rewriter.global_avg_pool,
}

