"""Our quantisation as a standard QDQ ONNX model.

    qg, report = quantize_graph(g, calib)
    model = to_qdq(report)                  # onnx.ModelProto; onnxruntime runs it

The model is the quantiser's prepared float graph (batch norms folded, nothing fused) with the
scales it chose, written the way ``onnxruntime.quantization`` writes QDQ models:

- int8 weights as initializers (the quantiser's), per output channel (DequantizeLinear with
  ``axis``), zero point 0. Each channel's scale is the one that makes ``x_scale * w_scale[c] /
  y_scale`` the integer graph's fixed-point multiplier ``m[c] / 2**s``: the quantiser rounded
  the real multiplier to it, and the scale takes that rounding (at most `requant.choose`'s
  rel_error), so that onnxruntime's float multiplier is ours;
- int32 biases (the quantiser's) with a DequantizeLinear of scale ``x_scale * w_scale[c]``;
- a QuantizeLinear / DequantizeLinear pair on every activation the integer graph holds in int8,
  with our scale and zero point 0 (int8); a ReLU / Clip folded into its producer's requantisation
  is written after the producer, before the QuantizeLinear;
- Gemm and MatMul weights as (K, N) matrices quantised per column (axis 1; Gemm's alpha and
  transB folded into them), as the integer graph's MATMUL_INTEGER has them;
- the nodes the integer graph computes in float as float nodes between DequantizeLinear and
  QuantizeLinear.

onnxruntime computes what the integer graph computes except where the two round differently:
a tie (onnxruntime rounds half to even, we round half up; frequent in ``shift`` mode, where
multipliers are powers of two), and the requantisations whose multiplier is not carried by a
weight scale (Add, GlobalAveragePool, MatMul of two activations), which onnxruntime computes
with the float scale ratio and we with `requant.choose`'s fixed-point one; see `frontend.qdq`.
Imported again by `frontend.import_onnx`, it gives the same integers as the integer graph: the
importer finds the same multipliers (or ``m * 2**k`` with shift ``s + k``, which computes the
same; the REQUANTIZE clamps, its own or ours, change no result, so they need nothing here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import UnsupportedError
from ..ir import ops as o
from ..ir.ops import Node, Op

if TYPE_CHECKING:
    import onnx

    from . import QuantReport
    from .rewrite import Rewriter

OPSET = 17  # per-axis QDQ (13), LayerNormalization (17); 20 when a Gelu needs it


def to_qdq(report: QuantReport, *, name: str | None = None) -> onnx.ModelProto:
    """The QDQ ONNX model (`onnx.ModelProto`) of a quantisation (`quantize_graph`'s report).
    Raises UnsupportedError naming the node and the op for a float op it cannot write."""
    if report.rewriter is None:
        raise ValueError("the report has no quantiser state: make it with quantize_graph")
    return _Writer(report.rewriter).run(name)


# IR op -> ONNX op type, for the ops written with no attributes beyond their operands.
_PLAIN = {
    Op.RELU: "Relu", Op.SIGMOID: "Sigmoid", Op.TANH: "Tanh", Op.EXP: "Exp", Op.LOG: "Log",
    Op.SQRT: "Sqrt", Op.ERF: "Erf", Op.NEG: "Neg", Op.ABS: "Abs", Op.RECIPROCAL: "Reciprocal",
    Op.FLOOR: "Floor", Op.CEIL: "Ceil", Op.SOFTPLUS: "Softplus", Op.SOFTSIGN: "Softsign",
    Op.HARD_SWISH: "HardSwish", Op.IDENTITY: "Identity",
    Op.ADD: "Add", Op.SUB: "Sub", Op.MUL: "Mul", Op.DIV: "Div", Op.POW: "Pow", Op.MAX: "Max",
    Op.MIN: "Min", Op.PRELU: "PRelu", Op.WHERE: "Where", Op.EQUAL: "Equal", Op.LESS: "Less",
    Op.GREATER: "Greater", Op.GLOBAL_AVG_POOL: "GlobalAveragePool",
    Op.GLOBAL_MAX_POOL: "GlobalMaxPool",
}


class _Writer:
    def __init__(self, rw: Rewriter) -> None:
        self.rw, self.g = rw, rw.g
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.names: set[str] = set()
        self.float_of: dict[int, str] = {}  # id(node) -> its float tensor
        # id(node) -> its int8 tensor, and the scale and zero point it was quantised with
        self.int8_of: dict[int, tuple[str, str, str]] = {}
        self.dq_of: dict[int, str] = {}  # id(node) -> DequantizeLinear of its int8 tensor
        self.opset = OPSET
        self.out_name: dict[int, str] = {}  # id(output node) -> the graph output it makes
        # Nodes the integer graph computes in int8 (with a folded activation: the activation).
        self.computed = {k for k in rw.mapping}
        self.folded = {id(a.src[0]): a for a in self.g.nodes if id(a) in rw.absorbed}

    # -- names and initializers ---------------------------------------------------------------
    def fresh(self, base: str) -> str:
        base = base or "t"
        name, k = base, 0
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        return name

    def init(self, base: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op_type: str, inputs: list[str], base: str, *, exact: str | None = None,
             **attrs: Any) -> str:
        """A node with one output, named `exact` (a reserved graph output name) or after base."""
        from onnx import helper

        out = exact if exact is not None else self.fresh(base)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    # -- values --------------------------------------------------------------------------------
    def scale(self, n: Node) -> float:
        return self.rw.q[id(n)][1]

    def int8(self, n: Node) -> str:
        """The int8 tensor standing for n (a QuantizeLinear of its float value if the integer
        graph computes n in float)."""
        if id(n) not in self.int8_of:
            self.quantize(n, self.float(n))
        return self.int8_of[id(n)][0]

    def quantize(self, n: Node, value: str) -> None:
        """QuantizeLinear of the float tensor `value` with n's scale: n's int8 tensor."""
        s = self.init(f"{n.name}_scale", np.float32(self.scale(n)))
        z = self.init(f"{n.name}_zero_point", np.int8(0))
        q = self.node("QuantizeLinear", [value, s, z], f"{n.name}_QuantizeLinear_Output")
        self.int8_of[id(n)] = (q, s, z)

    def dq(self, n: Node) -> str:
        """n's int8 tensor, dequantised: what the float ops reading it see."""
        got = self.dq_of.get(id(n))
        if got is None:
            self.int8(n)
            got = self.dq_of[id(n)] = self.node("DequantizeLinear", list(self.int8_of[id(n)]),
                                                f"{n.name}_DequantizeLinear_Output",
                                                exact=self.out_name.pop(id(n), None))
        return got

    def float(self, n: Node) -> str:
        """n's value as a float op reads it."""
        if id(n) in self.computed:
            return self.dq(n)
        got = self.float_of.get(id(n))
        if got is None:
            assert n.op is Op.CONST, n
            got = self.float_of[id(n)] = self.init(n.name or "const", n.value)
        return got

    def weights(self, x: Node, target: Node, w: np.ndarray, axis: int, bias: np.ndarray | None,
                base: str) -> list[str]:
        """DequantizeLinear of the weights w, quantised as the quantiser quantises them, and of
        the bias (int32 in the accumulator's scale), with the effective weight scales:
        x_scale * w_scale[c] / y_scale = m[c] / 2**s, the fixed-point multiplier of the
        integer graph's REQUANTIZE (its scale was rounded to m / 2**s there; here the weight
        scale takes that rounding, so that onnxruntime's float multiplier is ours)."""
        wq, sw = self.rw.weights(w, axis)
        bq = (None if bias is None else
              np.round(bias.astype(np.float64) / (self.scale(x) * sw)).astype(np.int32))
        rq = self.rw.q[id(target)][0].attrs
        assert isinstance(rq, o.RequantAttrs) and len(rq.shift) == 1
        fixed = np.broadcast_to(np.asarray(rq.multiplier, np.float64) / 2.0 ** rq.shift[0],
                                sw.shape)
        sx, sy = np.float32(self.scale(x)), np.float32(self.scale(target))
        sw = np.where(fixed > 0, fixed * np.float64(sy) / np.float64(sx), sw).astype(np.float32)
        q = self.init(f"{base}_quantized", wq)
        s = self.init(f"{base}_scale", sw)
        z = self.init(f"{base}_zero_point", np.zeros(len(sw), np.int8))
        out = [self.node("DequantizeLinear", [q, s, z], f"{base}_DequantizeLinear_Output",
                         axis=axis)]
        if bq is not None:
            q = self.init(f"{base}_bias_quantized", bq)
            s = self.init(f"{base}_bias_scale", (np.float64(sx) * sw).astype(np.float32))
            z = self.init(f"{base}_bias_zero_point", np.zeros(len(bq), np.int32))
            out.append(self.node("DequantizeLinear", [q, s, z], f"{base}_bias", axis=0))
        return out

    # -- the walk -----------------------------------------------------------------------------
    def run(self, name: str | None) -> Any:
        import onnx
        from onnx import helper

        g = self.g
        for n in g.inputs:
            self.names.add(n.name)
            self.float_of[id(n)] = n.name
        self.names.update(g.output_names)
        for n, out in zip(g.outputs, g.output_names):
            if n.op not in (Op.INPUT, Op.CONST):
                self.out_name.setdefault(id(n), out)
        for n in g.nodes:
            if n.op in (Op.INPUT, Op.CONST) or id(n) in self.rw.absorbed:
                continue
            act = self.folded.get(id(n))
            if id(n) in self.computed or act is not None:
                self.quantised(n, act)
            else:
                self.float_of[id(n)] = self.write(n, [self.float(s) for s in n.src], n.name,
                                                  self.out_name.pop(id(n), None))
        outputs = []
        for n, out in zip(g.outputs, g.output_names):
            t = self.float(n)
            if t != out:
                self.nodes.append(helper.make_node("Identity", [t], [out], name=out))
            outputs.append(helper.make_tensor_value_info(out, n.dtype.onnx, list(n.shape)))
        inputs = [helper.make_tensor_value_info(n.name, n.dtype.onnx, list(n.shape))
                  for n in g.inputs]
        graph = helper.make_graph(self.nodes, name or f"{g.name}_qdq", inputs, outputs,
                                  self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="vtakit.compiler.quantize.qdq")
        model.ir_version = 8 if self.opset <= 17 else 9
        onnx.checker.check_model(model)
        return model

    def quantised(self, n: Node, act: Node | None) -> None:
        """n as the integer graph computes it: its float op on dequantised int8 operands
        (weights and bias quantised), the folded activation, QuantizeLinear to the scale of
        the integer value."""
        target = act if act is not None else n
        y = self.compute(n, target)
        if act is not None:
            y = self.write(act, [y] + [self.float(s) for s in act.src[1:]], act.name)
        self.quantize(target, y)

    def compute(self, n: Node, target: Node) -> str:
        """The float op of a node the integer graph computes in int8 (its value standing for
        target: n, or the activation folded into n), on QDQ operands."""
        if n.op is Op.CONV:
            x, w = n.src[0], n.src[1]
            bias = n.src[2].value if len(n.src) > 2 else None
            ins = [self.dq(x), *self.weights(x, target, w.value, 0, bias, w.name or n.name)]
            return self.write(n, ins, n.name)
        if n.op in (Op.GEMM, Op.MATMUL) and n.src[1].op is Op.CONST:
            x, w = n.src[0], n.src[1]
            wf = w.value.astype(np.float64)
            bias = None
            if n.op is Op.GEMM:
                a = n.attrs
                assert isinstance(a, o.GemmAttrs)
                wf = (wf.T if a.trans_b else wf) * a.alpha
                if len(n.src) > 2:
                    bias = np.broadcast_to(n.src[2].value.astype(np.float64) * a.beta,
                                           n.shape)[0]
            ins = [self.dq(x), *self.weights(x, target, wf, 1, bias, w.name or n.name)]
            return self.node("MatMul" if bias is None else "Gemm", ins, n.name)
        if n.op in (Op.MATMUL, Op.ADD, Op.RELU, Op.CLIP, Op.MAX_POOL, Op.RESHAPE, Op.TRANSPOSE,
                    Op.GLOBAL_AVG_POOL):
            ins = [self.dq(s) for s in n.src[:2 if n.op in (Op.MATMUL, Op.ADD) else 1]]
            return self.write(n, ins + [self.float(s) for s in n.src[len(ins):]], n.name)
        raise AssertionError(f"{n.op.name} '{n.name}': not an op the quantiser makes int8")

    # -- float ops ----------------------------------------------------------------------------
    def write(self, n: Node, ins: list[str], base: str, exact: str | None = None) -> str:
        """One float IR node as ONNX, on the tensors ins; its output tensor (named exact, if
        given)."""
        if n.op in _PLAIN:
            if n.op is Op.HARD_SWISH:
                self.opset = max(self.opset, 14)
            return self.node(_PLAIN[n.op], ins, base, exact=exact)
        from onnx import helper

        writer = _WRITERS.get(n.op)
        if writer is None or o.epilogue_of(n) != o.NO_EPILOGUE:
            raise UnsupportedError(f"QDQ export: node '{n.name}' ({n.op.name}) cannot be "
                                   f"written as ONNX; supported: "
                                   f"{sorted(k.name for k in [*_PLAIN, *_WRITERS])}")
        out = writer(self, n, ins, base)
        if exact is None:
            return out
        self.nodes.append(helper.make_node("Identity", [out], [exact], name=exact))
        return exact

    def conv(self, n: Node, ins: list[str], base: str) -> str:
        a = n.attrs
        assert isinstance(a, o.ConvAttrs)
        return self.node("Conv", ins, base, kernel_shape=list(a.kernel), strides=list(a.strides),
                         pads=list(a.pads), dilations=list(a.dilations), group=a.group)

    def gemm(self, n: Node, ins: list[str], base: str) -> str:
        a = n.attrs
        assert isinstance(a, o.GemmAttrs)
        return self.node("Gemm", ins, base, alpha=a.alpha, beta=a.beta, transA=int(a.trans_a),
                         transB=int(a.trans_b))

    def matmul(self, n: Node, ins: list[str], base: str) -> str:
        if len(ins) == 2:
            return self.node("MatMul", ins, base)
        return self.node("Add", [self.node("MatMul", ins[:2], f"{base}_matmul"), ins[2]], base)

    def clip(self, n: Node, ins: list[str], base: str) -> str:
        a = n.attrs
        assert isinstance(a, o.ClipAttrs)
        lo = self.init(f"{base}_min", np.float32(a.min)) if a.min is not None else ""
        hi = self.init(f"{base}_max", np.float32(a.max)) if a.max is not None else ""
        return self.node("Clip", [ins[0], lo, hi], base)

    def pool(self, n: Node, ins: list[str], base: str) -> str:
        a = n.attrs
        assert isinstance(a, o.PoolAttrs)
        common: dict[str, Any] = dict(kernel_shape=list(a.kernel), strides=list(a.strides),
                                      pads=list(a.pads), ceil_mode=int(a.ceil_mode))
        if n.op is Op.MAX_POOL:
            return self.node("MaxPool", ins, base, dilations=list(a.dilations), **common)
        if any(d != 1 for d in a.dilations):
            self.opset = max(self.opset, 19)
            common["dilations"] = list(a.dilations)
        return self.node("AveragePool", ins, base, count_include_pad=int(a.count_include_pad),
                         **common)

    def reshape(self, n: Node, ins: list[str], base: str) -> str:
        shape = self.init(f"{base}_shape", np.array(n.shape, np.int64))
        return self.node("Reshape", [ins[0], shape], base)

    def transpose(self, n: Node, ins: list[str], base: str) -> str:
        a = n.attrs
        assert isinstance(a, o.TransposeAttrs)
        return self.node("Transpose", ins, base, perm=list(a.perm))

    def axis_op(self, n: Node, ins: list[str], base: str) -> str:
        a = n.attrs
        assert isinstance(a, o.AxisAttrs)
        op_type = {Op.SOFTMAX: "Softmax", Op.LOG_SOFTMAX: "LogSoftmax", Op.CONCAT: "Concat"}
        return self.node(op_type[n.op], ins, base, axis=a.axis)

    def alpha_op(self, n: Node, ins: list[str], base: str) -> str:
        a = n.attrs
        assert isinstance(a, o.AlphaAttrs)
        return self.node({Op.LEAKY_RELU: "LeakyRelu", Op.ELU: "Elu"}[n.op], ins, base,
                         alpha=a.alpha)

    def layer_norm(self, n: Node, ins: list[str], base: str) -> str:
        a = n.attrs
        assert isinstance(a, o.EpsilonAttrs)
        return self.node("LayerNormalization", ins, base, axis=a.axis, epsilon=a.epsilon)

    def gelu(self, n: Node, ins: list[str], base: str) -> str:
        a = n.attrs
        assert isinstance(a, o.GeluAttrs)
        self.opset = max(self.opset, 20)
        return self.node("Gelu", ins, base, approximate=a.approximate)

    def reduce(self, n: Node, ins: list[str], base: str) -> str:
        a = n.attrs
        assert isinstance(a, o.ReduceAttrs)
        op_type = {Op.REDUCE_MEAN: "ReduceMean", Op.REDUCE_SUM: "ReduceSum",
                   Op.REDUCE_MAX: "ReduceMax"}[n.op]
        if n.op is Op.REDUCE_SUM:
            axes = self.init(f"{base}_axes", np.array(a.axes, np.int64))
            return self.node(op_type, [ins[0], axes], base, keepdims=int(a.keepdims))
        return self.node(op_type, ins, base, axes=list(a.axes), keepdims=int(a.keepdims))

    def cast(self, n: Node, ins: list[str], base: str) -> str:
        return self.node("Cast", ins, base, to=n.dtype.onnx)


_WRITERS: dict[Op, Callable[[_Writer, Node, list[str], str], str]] = {
    Op.CONV: _Writer.conv, Op.GEMM: _Writer.gemm, Op.MATMUL: _Writer.matmul,
    Op.CLIP: _Writer.clip, Op.MAX_POOL: _Writer.pool, Op.AVG_POOL: _Writer.pool,
    Op.RESHAPE: _Writer.reshape, Op.TRANSPOSE: _Writer.transpose,
    Op.SOFTMAX: _Writer.axis_op, Op.LOG_SOFTMAX: _Writer.axis_op, Op.CONCAT: _Writer.axis_op,
    Op.LEAKY_RELU: _Writer.alpha_op, Op.ELU: _Writer.alpha_op,
    Op.LAYER_NORM: _Writer.layer_norm, Op.GELU: _Writer.gelu,
    Op.REDUCE_MEAN: _Writer.reduce, Op.REDUCE_SUM: _Writer.reduce, Op.REDUCE_MAX: _Writer.reduce,
    Op.CAST: _Writer.cast,
}
