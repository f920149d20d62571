"""Models of opsets 7 to 12, shaped like those of the ONNX model zoo: ONNX → reference
interpreter and ONNX → compiled CPU code, against onnxruntime on the original (old-opset) model.
Tolerance: rtol=1e-4, atol=1e-4 times the output's largest magnitude.

Two sources, neither downloaded:
- the zoo's own opset-9 graphs that the onnx package ships for its backend tests
  (onnx/backend/test/data/light: SqueezeNet 1.0, ShuffleNet, Inception v1, DenseNet-121...,
  with every weight replaced by a ConstantOfShape); the weights are filled here with seeded
  random values, and the input made smaller where the graph allows it;
- builders below that reproduce the structure of other zoo models at their opset with
  onnx.helper (MNIST-8, tiny-YOLOv2-8, ResNet v1, SqueezeNet 1.1) and one model per opset with
  the forms that changed up to opset 13 (Clip, Pad, Slice, Upsample/Resize, Squeeze...).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_reference import reference_session

from vtakit.compiler.compile import compile_model
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.ir import run, verify
from vtakit.runtime.session import InferenceSession

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
N = helper.make_node


class Builder:
    """Nodes and seeded random initializers of one model at one opset."""

    def __init__(self, opset: int, seed: int = 0) -> None:
        self.opset, self.rng = opset, np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, base: str) -> str:
        self._count += 1
        return f"{base}{self._count}"

    def init(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> str:
        name = self.name(op.lower())
        outs = [f"{name}_out{k}" if k else f"{name}_out" for k in range(n_out)]
        self.nodes.append(N(op, inputs, outs, name=name, **attrs))
        return outs[0]

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int = 1, pad: int = 0,
             bias: bool = True, **attrs) -> str:
        w = self.rng.standard_normal((c_out, c_in, k, k)) * np.sqrt(2 / (c_in * k * k))
        ins = [x, self.init("W", w.astype(np.float32))]
        if bias:
            ins.append(self.init("B", self.rng.uniform(-0.1, 0.1, c_out).astype(np.float32)))
        return self.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad] * 4, **attrs)

    def batch_norm(self, x: str, c: int) -> str:
        r = self.rng
        params = [r.uniform(0.5, 1.5, c), r.uniform(-0.2, 0.2, c), r.uniform(-0.2, 0.2, c),
                  r.uniform(0.5, 1.5, c)]
        attrs = {"epsilon": 1e-5}
        if self.opset < 9:
            attrs["spatial"] = 1  # BatchNormalization-7: per channel (removed in opset 9)
        else:
            attrs["momentum"] = 0.9
        return self.node("BatchNormalization",
                         [x] + [self.init("bn", p.astype(np.float32)) for p in params], **attrs)

    def model(self, inputs: dict[str, list[int]], outputs: list[str],
              shapes: dict[str, list[int]] | None = None) -> onnx.ModelProto:
        """The model with the IR version of its opset's time: below IR 4, initializers are
        graph inputs too, as the exporters of that time wrote them. Output shapes come from
        ONNX's shape inference, or shapes where it cannot infer them."""
        opsets = [helper.make_opsetid("", self.opset)]
        ir = helper.find_min_ir_version_for(opsets)
        ins = [helper.make_tensor_value_info(k, F, s) for k, s in inputs.items()]
        if ir < 4:
            ins += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                    for t in self.inits]
        outs = [helper.make_tensor_value_info(o, F, (shapes or {}).get(o)) for o in outputs]
        graph = helper.make_graph(self.nodes, f"opset{self.opset}", ins, outs, self.inits)
        m = helper.make_model(graph, opset_imports=opsets, ir_version=ir)
        m = onnx.shape_inference.infer_shapes(m)  # the outputs' shapes
        onnx.checker.check_model(m)
        return m


def mnist_8() -> onnx.ModelProto:
    """The zoo's MNIST (opset 8, CNTK export): Conv (SAME_UPPER) → Add of a [C, 1, 1]
    parameter (Plus30) → Relu → MaxPool, twice; then Reshape by shape inputs, the weight
    reshaped from [16, 4, 4, 10] (Times212_reshape1), MatMul and Add (Plus214)."""
    b = Builder(8)
    x = "Input3"
    for c_in, c_out, pool in ((1, 8, 2), (8, 16, 3)):
        w = b.rng.standard_normal((c_out, c_in, 5, 5)) * np.sqrt(2 / (c_in * 25))
        y = b.node("Conv", [x, b.init("Parameter", w.astype(np.float32))], kernel_shape=[5, 5],
                   strides=[1, 1], auto_pad="SAME_UPPER", group=1, dilations=[1, 1])
        y = b.node("Add", [y, b.init("Parameter", b.rng.uniform(-0.1, 0.1, (c_out, 1, 1))
                                     .astype(np.float32))])
        y = b.node("Relu", [y])
        x = b.node("MaxPool", [y], kernel_shape=[pool, pool], strides=[pool, pool],
                   pads=[0, 0, 0, 0], auto_pad="NOTSET")
    flat = b.node("Reshape", [x, b.init("Pooling160_Output_0_reshape0_shape",
                                        np.array([1, 256], np.int64))])
    w = b.rng.standard_normal((16, 4, 4, 10)).astype(np.float32) / 16
    w = b.node("Reshape", [b.init("Parameter193", w),
                           b.init("Parameter193_reshape1_shape", np.array([256, 10], np.int64))])
    y = b.node("MatMul", [flat, w])
    y = b.node("Add", [y, b.init("Parameter194", b.rng.uniform(-0.1, 0.1, (1, 10))
                                 .astype(np.float32))])
    return b.model({"Input3": [1, 1, 28, 28]}, [y])


def tiny_yolov2_8() -> onnx.ModelProto:
    """The zoo's tiny-YOLOv2 (opset 8), narrowed: ImageScaler, then Conv (no bias) →
    BatchNormalization (spatial=1) → LeakyRelu(0.1) → MaxPool blocks, the last pool of
    stride 1 padded at the end, and a 1x1 Conv head."""
    b = Builder(8)
    x = b.node("ImageScaler", ["image"], scale=1 / 255, bias=[0.0, 0.0, 0.0])
    c_in = 3
    for c_out, stride in ((8, 2), (16, 2), (32, 1)):
        x = b.batch_norm(b.conv(x, c_in, c_out, 3, pad=1, bias=False), c_out)
        x = b.node("LeakyRelu", [x], alpha=0.1)
        pads = [0, 0, 1, 1] if stride == 1 else [0, 0, 0, 0]
        x = b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[stride, stride], pads=pads)
        c_in = c_out
    y = b.conv(x, c_in, 25, 1)
    # ONNX infers no shapes through the experimental ImageScaler.
    return b.model({"image": [1, 3, 64, 64]}, [y], {y: [1, 25, 16, 16]})


def _fire(b: Builder, x: str, c_in: int, squeeze: int, expand: int) -> str:
    s = b.node("Relu", [b.conv(x, c_in, squeeze, 1)])
    e1 = b.node("Relu", [b.conv(s, squeeze, expand, 1)])
    e3 = b.node("Relu", [b.conv(s, squeeze, expand, 3, pad=1)])
    return b.node("Concat", [e1, e3], axis=1)


def squeezenet11_9() -> onnx.ModelProto:
    """SqueezeNet 1.1 (opset 9), narrowed: 3x3/2 Conv, MaxPool 3x3/2, fire modules (squeeze
    1x1, expand 1x1 and 3x3, Concat), Dropout, 1x1 Conv classifier, GlobalAveragePool,
    Flatten, Softmax."""
    b = Builder(9)
    x = b.node("Relu", [b.conv("data", 3, 16, 3, stride=2)])
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])
    x = _fire(b, x, 16, 8, 16)
    x = _fire(b, x, 32, 8, 16)
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])
    x = _fire(b, x, 32, 16, 32)
    x = b.node("Dropout", [x], ratio=0.5)
    x = b.node("Relu", [b.conv(x, 64, 10, 1)])
    logits = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    return b.model({"data": [1, 3, 64, 64]}, [b.node("Softmax", [logits]), logits])


def resnet_v1(opset: int) -> onnx.ModelProto:
    """ResNet v1 (the zoo's resnet18-v1-7 / resnet50-v1-7 style), narrowed: 7x7/2 Conv → BN →
    Relu → MaxPool 3x3/2, a basic block and a strided block with a 1x1 projection, Add of the
    shortcut, GlobalAveragePool, Flatten, Gemm. BatchNormalization carries spatial=1 below
    opset 9."""
    b = Builder(opset)
    x = b.node("Relu", [b.batch_norm(b.conv("data", 3, 8, 7, stride=2, pad=3, bias=False), 8)])
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for c_in, c_out, stride in ((8, 8, 1), (8, 16, 2)):
        y = b.node("Relu", [b.batch_norm(b.conv(x, c_in, c_out, 3, stride, 1, False), c_out)])
        y = b.batch_norm(b.conv(y, c_out, c_out, 3, 1, 1, False), c_out)
        short = x if stride == 1 else b.batch_norm(b.conv(x, c_in, c_out, 1, stride, 0, False),
                                                   c_out)
        x = b.node("Relu", [b.node("Add", [y, short])])
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])])
    w = b.init("fc_w", (b.rng.standard_normal((10, 16)) / 4).astype(np.float32))
    y = b.node("Gemm", [x, w, b.init("fc_b", np.zeros(10, np.float32))], alpha=1.0, beta=1.0,
               transB=1)
    return b.model({"data": [1, 3, 64, 64]}, [y])


def upsample_net(opset: int) -> onnx.ModelProto:
    """An FCN-style decoder (opset 7: scales attribute; opset 9: scales input, one computed
    from the input's shape as PyTorch exports it): Conv → Upsample nearest x2 → Conv →
    Upsample linear x2 → Conv, with a channel slice (Slice-1 attributes) on the way."""
    b = Builder(opset)
    x = b.node("Relu", [b.conv("data", 3, 8, 3, stride=2, pad=1)])
    if opset < 9:
        x = b.node("Upsample", [x], scales=[1.0, 1.0, 2.0, 2.0], mode="nearest")
    else:
        shape = b.node("Cast", [b.node("Shape", [x])], to=F)
        target = b.node("Mul", [shape, b.init("double", np.array([1, 1, 2, 2], np.float32))])
        x = b.node("Upsample", [x, b.node("Div", [target, shape])], mode="nearest")
    x = b.node("Relu", [b.conv(x, 8, 8, 3, pad=1)])
    x = b.node("Slice", [x], starts=[2], ends=[8], axes=[1])
    if opset < 9:
        x = b.node("Upsample", [x], scales=[1.0, 1.0, 2.0, 2.0], mode="linear")
    else:
        x = b.node("Upsample", [x, b.init("sc", np.array([1, 1, 2, 2], np.float32))],
                   mode="linear")
    return b.model({"data": [1, 3, 32, 32]}, [b.conv(x, 6, 2, 3, pad=1)])


def mobilenet_style(opset: int) -> onnx.ModelProto:
    """A MobileNet-style net at opset 7 to 11: depthwise Conv → BN → Clip(0, 6) (attributes
    before 11, inputs from 11), Pad (attributes before 11, input from 11) before a strided
    Conv, Sum of three branches, GlobalAveragePool, Gemm with a C operand."""
    b = Builder(opset)

    def relu6(x: str) -> str:
        if opset < 11:
            return b.node("Clip", [x], min=0.0, max=6.0)
        return b.node("Clip", [x, b.init("lo", np.array(0, np.float32)),
                               b.init("hi", np.array(6, np.float32))])

    x = relu6(b.batch_norm(b.conv("data", 3, 8, 3, pad=1, bias=False), 8))
    d = relu6(b.batch_norm(b.conv(x, 1, 8, 3, pad=1, bias=False, group=8), 8))
    x = b.node("Sum", [x, d, b.conv(d, 8, 8, 1)])
    pads = [0, 0, 0, 0, 0, 0, 1, 1]
    if opset < 11:
        x = b.node("Pad", [x], pads=pads, mode="constant", value=0.0)
    else:
        x = b.node("Pad", [x, b.init("pads", np.array(pads, np.int64))], mode="constant")
    x = relu6(b.conv(x, 8, 16, 3, stride=2))
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])])
    w = b.init("fc_w", (b.rng.standard_normal((16, 5)) / 4).astype(np.float32))
    y = b.node("Gemm", [x, w, b.init("fc_b", b.rng.uniform(-1, 1, 5).astype(np.float32))],
               beta=0.5)
    return b.model({"data": [1, 3, 32, 32]}, [y])


def detector_10() -> onnx.ModelProto:
    """Opset-10 forms: Slice with starts/ends/axes/steps inputs, Resize-10 (nearest, scales
    input), MaxPool ceil_mode, TopK with a k input, Dropout."""
    b = Builder(10)
    x = b.node("Relu", [b.conv("data", 3, 8, 3, pad=1)])
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    x = b.node("Resize", [x, b.init("sc", np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    x = b.node("Slice", [x, b.init("st", np.array([1, 0], np.int64)),
                         b.init("en", np.array([100, -1], np.int64)),
                         b.init("ax", np.array([2, 3], np.int64)),
                         b.init("sp", np.array([2, 1], np.int64))])
    x = b.node("Dropout", [x], ratio=0.1)
    scores = b.node("Flatten", [b.node("ReduceMean", [x], axes=[2, 3])])
    top = b.node("TopK", [scores, b.init("k", np.array([3], np.int64))], n_out=2, axis=1)
    return b.model({"data": [1, 3, 33, 33]}, [x, top])


def segmenter_11() -> onnx.ModelProto:
    """Opset-11 forms: Resize-11 with roi and sizes, ReduceMean with axes attribute,
    Unsqueeze/Squeeze with axes attributes, Split with a split attribute, Softmax with
    axis=1 on a 4-D tensor (which opset 13 changed: flattened to 2-D first)."""
    b = Builder(11)
    x = b.node("Relu", [b.conv("data", 3, 6, 3, stride=2, pad=1)])
    pooled = b.node("ReduceMean", [x], axes=[2, 3], keepdims=0)
    gate = b.node("Sigmoid", [b.node("Unsqueeze", [pooled], axes=[2, 3])])
    x = b.node("Mul", [x, gate])
    a = f"{b.name('split')}_a"
    b.nodes.append(N("Split", [x], [a, f"{a}_b"], name=b.name("Split"), axis=1, split=[2, 4]))
    x = b.node("Resize", [a, b.init("roi", np.array([], np.float32)),
                          b.init("sc", np.array([], np.float32)),
                          b.init("sz", np.array([1, 2, 24, 20], np.int64))],
               mode="linear", coordinate_transformation_mode="pytorch_half_pixel")
    probs = b.node("Softmax", [x], axis=1)
    first = b.node("Squeeze", [b.node("Slice", [probs, b.init("s", np.array([0])),
                                                b.init("e", np.array([1])),
                                                b.init("a", np.array([1]))])], axes=[1])
    return b.model({"data": [1, 3, 32, 32]}, [probs, first])


def encoder_12() -> onnx.ModelProto:
    """Opset-12 forms in a tiny transformer block: LayerNorm as ReduceMean (axes attribute) /
    Sub / Pow / Sqrt / Div, MatMul attention with Softmax(axis=-1), Dropout with a ratio
    input, Split with a split attribute, Squeeze with axes, Celu, ReduceSum with axes."""
    b = Builder(12)
    d = 16

    def weight(*shape: int) -> str:
        return b.init("w", (b.rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    mean = b.node("ReduceMean", ["tokens"], axes=[-1])
    c = b.node("Sub", ["tokens", mean])
    var = b.node("ReduceMean", [b.node("Pow", [c, b.init("two", np.array(2, np.float32))])],
                 axes=[-1])
    eps = b.init("eps", np.array(1e-5, np.float32))
    x = b.node("Div", [c, b.node("Sqrt", [b.node("Add", [var, eps])])])
    qkv = b.node("MatMul", [x, weight(d, 3 * d)])
    q, k, v = (f"{b.name('qkv')}_{s}" for s in "qkv")
    b.nodes.append(N("Split", [qkv], [q, k, v], name=b.name("Split"), axis=-1, split=[d] * 3))
    scores = b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 2, 1])])
    scores = b.node("Div", [scores, b.init("scale", np.array(4, np.float32))])
    attn = b.node("Softmax", [scores], axis=-1)
    attn = b.node("Dropout", [attn, b.init("ratio", np.array(0.1, np.float32))])
    y = b.node("Add", ["tokens", b.node("MatMul", [attn, v])])
    y = b.node("Celu", [b.node("MatMul", [y, weight(d, d)])], alpha=1.5)
    pooled = b.node("Squeeze", [b.node("ReduceSum", [y], axes=[1])], axes=[0])
    return b.model({"tokens": [1, 8, d]}, [y, pooled])


BUILT = {
    "mnist_8": mnist_8, "tiny_yolov2_8": tiny_yolov2_8, "squeezenet11_9": squeezenet11_9,
    "resnet_v1_7": lambda: resnet_v1(7), "resnet_v1_9": lambda: resnet_v1(9),
    "upsample_7": lambda: upsample_net(7), "upsample_9": lambda: upsample_net(9),
    "mobilenet_7": lambda: mobilenet_style(7), "mobilenet_10": lambda: mobilenet_style(10),
    "mobilenet_11": lambda: mobilenet_style(11), "detector_10": detector_10,
    "segmenter_11": segmenter_11, "encoder_12": encoder_12,
}

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
# zoo graph -> input height and width: None keeps the zoo's 224; smaller where the graph ends
# in a GlobalAveragePool, which makes it size-independent.
ZOO = {"squeezenet": 64, "shufflenet": None, "inception_v1": None, "densenet121": 32}
# Also compiled (a few seconds each): the models whose converted forms reach the CPU backend
# in ways the others do not (asymmetric Resize, strided Slice, TopK, ImageScaler's Mul/Add).
COMPILED = ["mnist_8", "tiny_yolov2_8", "upsample_9", "mobilenet_11", "detector_10",
            "segmenter_11", "encoder_12", "zoo_squeezenet"]


def zoo_model(name: str, size: int | None) -> onnx.ModelProto:
    """A zoo graph of onnx's backend test data with its ConstantOfShape weights replaced by
    seeded random initializers (He-scaled for weights, in [0.5, 1.5] for vectors, so that
    BatchNormalization variances are positive), and the input of the final Softmax (the
    logits) as a second output."""
    path = LIGHT / f"light_{name}.onnx"
    if not path.is_file():
        pytest.skip(f"{path} not shipped by this onnx version ({onnx.__version__})")
    m = onnx.load(path)
    rng = np.random.default_rng(0)
    g = m.graph
    shapes = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    nodes, weights = [], []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in shapes:
            shape = [int(d) for d in shapes[n.input[0]]]
            fan_in = int(np.prod(shape[1:]))
            v = (rng.standard_normal(shape) * np.sqrt(2 / fan_in) if len(shape) > 1
                 else rng.uniform(0.5, 1.5, shape))
            weights.append(numpy_helper.from_array(v.astype(np.float32), n.output[0]))
        else:
            nodes.append(n)
    used = {i for n in nodes for i in n.input}
    inits = [t for t in g.initializer if t.name in used] + weights
    inputs = [vi for vi in g.input if vi.name not in shapes and vi.name in used]
    if size is not None:
        for d in inputs[0].type.tensor_type.shape.dim[2:]:
            d.dim_value = size
    outputs = [helper.make_tensor_value_info(o.name, F, None) for o in g.output]
    outputs += [helper.make_tensor_value_info(n.input[0], F, None) for n in nodes
                if n.op_type == "Softmax"]
    new = helper.make_model(helper.make_graph(nodes, g.name, inputs, outputs, inits),
                            opset_imports=m.opset_import, ir_version=4)
    assert [o.version for o in new.opset_import] == [9]
    return onnx.shape_inference.infer_shapes(new)  # the outputs' shapes


def build(name: str) -> onnx.ModelProto:
    if name.startswith("zoo_"):
        return zoo_model(name[4:], ZOO[name[4:]])
    return BUILT[name]()


def check(model: onnx.ModelProto, compiled: bool) -> None:
    rng = np.random.default_rng(1)
    init = {t.name for t in model.graph.initializer}
    feeds = {vi.name: rng.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim])
             .astype(np.float32) for vi in model.graph.input if vi.name not in init}
    names = [o.name for o in model.graph.output]
    sess = reference_session(model)
    want = dict(zip(names, sess.run(None, feeds), strict=True))
    if compiled:
        values = InferenceSession(compile_model(model, threads=1)).run(None, feeds)
        got = dict(zip(names, values, strict=True))
    else:
        got = run(verify(import_onnx(model)), feeds)
    for name, w in want.items():
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()),
                                   err_msg=name)


@pytest.mark.parametrize("name", [*BUILT, *(f"zoo_{z}" for z in ZOO)])
def test_interpreter_matches_onnxruntime(name: str) -> None:
    check(build(name), compiled=False)


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_matches_onnxruntime(name: str) -> None:
    check(build(name), compiled=True)
