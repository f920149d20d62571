"""Standard networks built as ONNX models with seeded random weights (no downloads).

Each builder returns a checked `onnx.ModelProto` whose input has a symbolic batch dimension
"N"; the weights depend only on `seed`. They are the test models of the compiler and its
backends: import them with `frontend.import_onnx(model, batch_size=...)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Builder:
    """Accumulates nodes and initializers; names are generated as '<prefix>_<n>'."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def init(self, prefix: str, value: np.ndarray) -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, prefix: str, shape: Sequence[int], fan_in: int) -> str:
        w = self.rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2 / fan_in))
        return self.init(prefix, w)

    def bias(self, prefix: str, n: int) -> str:
        return self.init(prefix, (self.rng.standard_normal(n) * 0.1).astype(np.float32))

    def op(self, op_type: str, inputs: Sequence[str], prefix: str | None = None,
           **attrs: Any) -> str:
        out = self.name(prefix or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int = 1, group: int = 1,
             bias: bool = False) -> str:
        w = self.weight("conv_w", (c_out, c_in // group, k, k), c_in // group * k * k)
        ins = [x, w] + ([self.bias("conv_b", c_out)] if bias else [])
        return self.op("Conv", ins, "conv", kernel_shape=[k, k], strides=[stride, stride],
                       pads=[k // 2] * 4, group=group)

    def batch_norm(self, x: str, c: int) -> str:
        r = self.rng
        params = [(r.uniform(0.5, 1.0, c)), r.standard_normal(c) * 0.1,
                  r.standard_normal(c) * 0.1, r.uniform(0.5, 1.5, c)]
        names = [self.init(p, v.astype(np.float32))
                 for p, v in zip(("bn_scale", "bn_bias", "bn_mean", "bn_var"), params,
                                 strict=True)]
        return self.op("BatchNormalization", [x, *names], "bn", epsilon=1e-5)

    def dense(self, x: str, n_in: int, n_out: int) -> str:
        w = self.weight("fc_w", (n_out, n_in), n_in)
        return self.op("Gemm", [x, w, self.bias("fc_b", n_out)], "fc", transB=1)

    def model(self, name: str, x_shape: Sequence[int | str], y: str, y_shape: Sequence[int | str],
              opset: int) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(x_shape))],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, list(y_shape))], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="vtakit.compiler.models")
        m.ir_version = 10  # readable by onnxruntime releases of the last two years
        onnx.checker.check_model(m, full_check=True)
        return m


def mlp(*, seed: int = 0, sizes: Sequence[int] = (784, 128, 64, 10)) -> onnx.ModelProto:
    """Fully connected layers with ReLU between them: input N×sizes[0] → N×sizes[-1]."""
    b = _Builder(seed)
    x = "input"
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        x = b.dense(x, n_in, n_out)
        if i < len(sizes) - 2:
            x = b.op("Relu", [x])
    return b.model("mlp", ["N", sizes[0]], x, ["N", sizes[-1]], 13)


def lenet(*, seed: int = 0) -> onnx.ModelProto:
    """LeNet-5 for N×1×28×28 digits: two conv/ReLU/max-pool stages and three dense layers."""
    b = _Builder(seed)
    x = b.op("Relu", [b.conv("input", 1, 6, 5, bias=True)])
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    w = b.weight("conv_w", (16, 6, 5, 5), 150)
    x = b.op("Relu", [b.op("Conv", [x, w, b.bias("conv_b", 16)], kernel_shape=[5, 5])])
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = b.op("Flatten", [x], axis=1)
    x = b.op("Relu", [b.dense(x, 16 * 5 * 5, 120)])
    x = b.op("Relu", [b.dense(x, 120, 84)])
    return b.model("lenet", ["N", 1, 28, 28], b.dense(x, 84, 10), ["N", 10], 13)


def resnet18(*, seed: int = 0, num_classes: int = 1000) -> onnx.ModelProto:
    """ResNet-18 (ImageNet layout, N×3×224×224): conv/BN/ReLU stem, max-pool, four stages of
    two basic blocks with residual adds, global average pool, a dense layer."""
    b = _Builder(seed)
    x = b.op("Relu", [b.batch_norm(b.conv("input", 3, 64, 7, stride=2), 64)])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for stage, c in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = b.op("Relu", [b.batch_norm(b.conv(x, c_in, c, 3, stride), c)])
            y = b.batch_norm(b.conv(y, c, c, 3), c)
            if stride != 1 or c_in != c:
                x = b.batch_norm(b.conv(x, c_in, c, 1, stride), c)
            x = b.op("Relu", [b.op("Add", [y, x])])
            c_in = c
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    y = b.dense(x, 512, num_classes)
    return b.model("resnet18", ["N", 3, 224, 224], y, ["N", num_classes], 13)


def mobilenet_v2(*, seed: int = 0, num_classes: int = 1000) -> onnx.ModelProto:
    """MobileNetV2 (N×3×224×224): inverted residual blocks with depthwise convolutions
    (Conv group=channels) and ReLU6 as Clip(0, 6)."""
    b = _Builder(seed)
    lo, hi = b.init("relu6_min", np.float32(0)), b.init("relu6_max", np.float32(6))

    def conv_bn(x: str, c_in: int, c_out: int, k: int, stride: int = 1, group: int = 1,
                relu6: bool = True) -> str:
        y = b.batch_norm(b.conv(x, c_in, c_out, k, stride, group), c_out)
        return b.op("Clip", [y, lo, hi], "relu6") if relu6 else y

    x = conv_bn("input", 3, 32, 3, 2)
    c_in = 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            y = conv_bn(x, c_in, hidden, 1) if t != 1 else x
            y = conv_bn(y, hidden, hidden, 3, stride, group=hidden)
            y = conv_bn(y, hidden, c, 1, relu6=False)
            x = b.op("Add", [x, y]) if stride == 1 and c_in == c else y
            c_in = c
    x = conv_bn(x, c_in, 1280, 1)
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    y = b.dense(x, 1280, num_classes)
    return b.model("mobilenet_v2", ["N", 3, 224, 224], y, ["N", num_classes], 13)


def transformer_block(*, seed: int = 0, seq_len: int = 16, d_model: int = 64, heads: int = 4,
                      d_ff: int = 256) -> onnx.ModelProto:
    """A pre-norm encoder block on N×seq_len×d_model: LayerNormalization, multi-head
    self-attention (MatMul, Softmax), residual add, LayerNormalization, MatMul/Gelu/MatMul
    feed-forward, residual add. Opset 20 (Gelu). The head split reshapes to a shape computed
    from Shape(input), as exported models do."""
    b = _Builder(seed)
    d_head = d_model // heads

    def layer_norm(x: str) -> str:
        scale = b.init("ln_scale", b.rng.uniform(0.5, 1.5, d_model).astype(np.float32))
        return b.op("LayerNormalization", [x, scale, b.bias("ln_bias", d_model)], "ln",
                    axis=-1, epsilon=1e-5)

    def linear(x: str, n_in: int, n_out: int) -> str:
        w = b.weight("w", (n_in, n_out), n_in)
        return b.op("Add", [b.op("MatMul", [x, w]), b.bias("b", n_out)])

    # [N, seq_len] from the input's shape, then [N, seq_len, heads, d_head].
    batch_seq = b.op("Slice", ["input_shape",
                               b.init("starts", np.array([0], np.int64)),
                               b.init("ends", np.array([2], np.int64))])
    b.nodes.insert(0, helper.make_node("Shape", ["input"], ["input_shape"], name="input_shape"))
    split_shape = b.op("Concat", [batch_seq, b.init("heads", np.array([heads, d_head], np.int64))],
                       axis=0)
    merged_shape = b.init("merged", np.array([0, 0, d_model], np.int64))

    h = layer_norm("input")
    q, k, v = (b.op("Transpose", [b.op("Reshape", [linear(h, d_model, d_model), split_shape])],
                    perm=[0, 2, 1, 3]) for _ in range(3))
    k_t = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = b.op("Div", [b.op("MatMul", [q, k_t]),
                          b.init("sqrt_d", np.float32(np.sqrt(d_head)))])
    attn = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    attn = b.op("Reshape", [b.op("Transpose", [attn], perm=[0, 2, 1, 3]), merged_shape])
    x = b.op("Add", ["input", linear(attn, d_model, d_model)])
    h = b.op("Gelu", [linear(layer_norm(x), d_model, d_ff)])
    y = b.op("Add", [x, linear(h, d_ff, d_model)])
    shape: list[int | str] = ["N", seq_len, d_model]
    return b.model("transformer_block", shape, y, shape, 20)


def digits_cnn(*, seed: int = 0) -> onnx.ModelProto:
    """The 8×8 digits CNN of `vtakit.digits` (N×1×8×8 → N×10), untrained: three 3×3 convs
    (16, 32, 16 channels) with a 2×2 max-pool, two dense layers. The trained one is
    `vtakit.digits.load_model()`."""
    from vtakit import digits

    return digits.to_onnx(digits.build(seed=seed))
