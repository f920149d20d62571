"""NaN and ±inf through the CPU backend, against onnxruntime and the reference interpreter.

Inputs are random with NaN, +inf and -inf sprinkled in (fixed seeds). "Same" means NaN in the
same places, infinities equal, finite values close. Where onnxruntime's own answer depends on
where the NaN sits (MaxPool without indices, ReduceMax / ReduceMin, GlobalMaxPool, Hardmax:
an order-dependent vector max), both sides are compared only on the cells whose window holds
no NaN, and NaN propagates here (numpy's ``maximum``, as Max / Relu / Clip do in onnxruntime).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from ort_reference import reference_session

from vtakit.compiler.backend.cpu.lower import lower
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.ir.interpreter import run
from vtakit.compiler.pipeline import optimize as optimize_graph
from vtakit.runtime.executor import GraphExecutor

ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime: pip install onnxruntime")

T = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64}


def sprinkled(seed: int, shape: tuple[int, ...], dtype: type = np.float32,
              nan: float = 0.1, inf: float = 0.1) -> np.ndarray:
    """Standard normal values, a fraction `nan` of them NaN and `inf` of them ±inf."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    u = rng.random(shape)
    x[u < nan] = np.nan
    x[(u >= nan) & (u < nan + inf / 2)] = np.inf
    x[(u >= nan + inf / 2) & (u < nan + inf)] = -np.inf
    return x


def graph_model(nodes: list, feeds: dict[str, np.ndarray], inits: dict[str, np.ndarray],
                outputs: tuple[str, ...] = ("y",)):
    import onnx

    vis = [helper.make_tensor_value_info(k, T[v.dtype.type], v.shape) for k, v in feeds.items()]
    init = [helper.make_tensor(k, T[v.dtype.type], v.shape, v.reshape(-1).tolist())
            for k, v in inits.items()]
    model = helper.make_model(helper.make_graph(nodes, "g", vis, [], init),
                              opset_imports=[helper.make_opsetid("", 20)])
    inferred = onnx.shape_inference.infer_shapes(model)
    by_name = {v.name: v for v in inferred.graph.value_info}
    model.graph.output.extend(by_name[o] for o in outputs)
    return model


def node_model(op: str, feeds: dict[str, np.ndarray], inits: dict[str, np.ndarray] | None = None,
               outputs: tuple[str, ...] = ("y",), **attrs):
    """One node whose inputs are `feeds` then `inits`, in that order."""
    inits = inits or {}
    node = helper.make_node(op, [*feeds, *inits], list(outputs), **attrs)
    return graph_model([node], feeds, inits, outputs)


def outputs(model, feeds: dict[str, np.ndarray], with_ort: bool = True) -> tuple[list, list, list]:
    """(CPU backend, interpreter, onnxruntime or None) outputs of `model`."""
    g = optimize_graph(import_onnx(model))
    ex = GraphExecutor(lower(g, threads=2))
    for k, v in feeds.items():
        ex.set_input(k, v)
    ex.run()
    cpu = [ex.get_output(i) for i in range(len(g.output_names))]
    want = run(import_onnx(model), feeds)
    ref = [want[n] for n in g.output_names]
    if not with_ort:
        return cpu, ref, [None] * len(cpu)
    sess = reference_session(model)
    return cpu, ref, sess.run(None, feeds)


def assert_same(got: np.ndarray, want: np.ndarray, what: str, mask: np.ndarray | None = None,
                rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """NaN where `want` has NaN, the same infinities, finite values close (on `mask` only)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if mask is not None:
        got, want = got[mask], want[mask]
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaN")
    np.testing.assert_array_equal(np.isinf(got) & (got > 0), np.isinf(want) & (want > 0),
                                  err_msg=f"{what}: +inf")
    np.testing.assert_array_equal(np.isinf(got) & (got < 0), np.isinf(want) & (want < 0),
                                  err_msg=f"{what}: -inf")
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=rtol, atol=atol, err_msg=what)


def check(model, feeds: dict[str, np.ndarray], ort_mask: np.ndarray | None = None,
          with_ort: bool = True, **tol: float) -> list[np.ndarray]:
    cpu, ref, want = outputs(model, feeds, with_ort)
    for i, (c, r, w) in enumerate(zip(cpu, ref, want, strict=True)):
        assert_same(c, r, f"output {i}: CPU vs interpreter", **tol)
        if with_ort:
            assert_same(c, w, f"output {i}: CPU vs onnxruntime", ort_mask, **tol)
    return cpu


# -- elementwise ----------------------------------------------------------------------------------

UNARY = [("Relu", {}), ("LeakyRelu", {"alpha": 0.1}), ("Elu", {}), ("Selu", {}), ("Celu", {}),
         ("ThresholdedRelu", {"alpha": 0.5}), ("HardSigmoid", {}), ("HardSwish", {}),
         ("Sign", {}), ("Softplus", {}), ("Sigmoid", {}), ("Softsign", {}), ("Abs", {}),
         ("Neg", {}), ("Tanh", {}), ("Exp", {}), ("Mish", {}), ("Gelu", {})]


ORT_FLOAT64 = {"Relu", "Sign", "Sigmoid", "Abs", "Neg", "Tanh", "Exp"}  # the others: float32


@pytest.mark.parametrize(("op", "attrs"), UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary(op: str, attrs: dict, dtype: type) -> None:
    x = sprinkled(1, (3, 5, 7), dtype)
    check(node_model(op, {"x": x}, **attrs), {"x": x},
          with_ort=dtype is np.float32 or op in ORT_FLOAT64)


@pytest.mark.parametrize("shape", [(7,), (4, 33)])  # scalar path and vectorised path
def test_clip(shape: tuple[int, ...]) -> None:
    x = sprinkled(2, shape)
    bounds = {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}
    check(node_model("Clip", {"x": x}, bounds), {"x": x})


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_min(op: str, dtype: type) -> None:
    a, b, c = sprinkled(3, (4, 9), dtype), sprinkled(4, (4, 9), dtype), sprinkled(5, (9,), dtype)
    check(node_model(op, {"a": a, "b": b}), {"a": a, "b": b})
    check(node_model(op, {"a": a, "b": b, "c": c}), {"a": a, "b": b, "c": c})


def test_prelu() -> None:
    x, s = sprinkled(6, (2, 3, 5)), sprinkled(7, (3, 1), nan=0.3, inf=0.0)
    check(node_model("PRelu", {"x": x, "s": s}), {"x": x, "s": s})


# -- fused activations of MatMul / Gemm / Conv ----------------------------------------------------

def test_matmul_nan_row_then_relu_is_nan() -> None:
    """The issue's example: a NaN in A's row makes the row NaN, and ReLU / Clip keep it."""
    a = np.array([[np.nan, 1, 2, 3]], np.float32)
    for act in ("Relu", "Clip"):
        extra = {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)} \
            if act == "Clip" else {}
        nodes = [helper.make_node("MatMul", ["a", "w"], ["t"]),
                 helper.make_node(act, ["t", *extra], ["y"])]
        model = graph_model(nodes, {"a": a}, {"w": np.ones((4, 3), np.float32), **extra})
        (y,) = check(model, {"a": a})
        assert np.isnan(y).all(), y


@pytest.mark.parametrize("act", ["Relu", "Clip", None])
@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
@pytest.mark.parametrize("m", [1, 5, 37])
def test_matmul_gemm_fused(op: str, act: str | None, m: int) -> None:
    a = sprinkled(10 + m, (m, 24), nan=0.03, inf=0.03)
    w = np.random.default_rng(m).standard_normal((24, 19)).astype(np.float32)
    inits = {"w": w}
    if op == "Gemm":
        inits["c"] = sprinkled(20 + m, (19,), nan=0.1, inf=0.1)
    nodes = [helper.make_node(op, ["a", *inits], ["t" if act else "y"])]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    elif act == "Clip":
        inits |= {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}
        nodes.append(helper.make_node("Clip", ["t", "lo", "hi"], ["y"]))
    check(graph_model(nodes, {"a": a}, inits), {"a": a}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", ["Relu", "Clip"])
@pytest.mark.parametrize("group", [1, 4])  # dense (im2col GEMM) and depthwise (window kernel)
def test_conv_fused(act: str, group: int) -> None:
    # NaN only: onnxruntime's convolution algorithms (Winograd, ...) turn an inf into NaN in
    # places that depend on the algorithm.
    x = sprinkled(30 + group, (1, 4, 9, 11), nan=0.03, inf=0.0)
    w = np.random.default_rng(group).standard_normal((4, 4 // group, 3, 3)).astype(np.float32)
    inits = {"w": w, "b": np.linspace(-1, 1, 4).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], pads=[1, 1, 1, 1], group=group)]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    else:
        inits |= {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
        nodes.append(helper.make_node("Clip", ["t", "lo", "hi"], ["y"]))
    check(graph_model(nodes, {"x": x}, inits), {"x": x}, rtol=1e-4, atol=1e-4)


def test_conv_inf_matches_interpreter() -> None:
    x = sprinkled(40, (1, 3, 8, 8), nan=0.02, inf=0.04)
    w = np.random.default_rng(40).standard_normal((5, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["t"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["t"], ["y"])]
    check(graph_model(nodes, {"x": x}, {"w": w}), {"x": x}, with_ort=False, rtol=1e-4,
          atol=1e-4)


# -- pooling and reductions -----------------------------------------------------------------------

def _nan_free_windows(x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int],
                      pads: int) -> np.ndarray:
    """Output cells of a 2-D pooling whose window holds no NaN (padding holds none)."""
    from numpy.lib.stride_tricks import sliding_window_view

    nan = np.pad(np.isnan(x), [(0, 0), (0, 0), (pads, pads), (pads, pads)])
    win = sliding_window_view(nan, kernel, axis=(2, 3))[:, :, ::strides[0], ::strides[1]]
    return ~win.any(axis=(-1, -2))


@pytest.mark.parametrize(("kernel", "strides", "pads", "dtype"), [
    ((2, 2), (2, 2), 0, np.float32), ((3, 3), (1, 1), 1, np.float32),
    ((3, 3), (2, 2), 1, np.float64), ((2, 3), (1, 2), 0, np.float32)])
def test_max_pool(kernel: tuple[int, int], strides: tuple[int, int], pads: int,
                  dtype: type) -> None:
    x = sprinkled(50, (2, 3, 9, 21), dtype, nan=0.05, inf=0.1)
    model = node_model("MaxPool", {"x": x}, kernel_shape=list(kernel), strides=list(strides),
                       pads=[pads] * 4)
    (y,) = check(model, {"x": x}, ort_mask=_nan_free_windows(x, kernel, strides, pads))
    nan_windows = ~_nan_free_windows(x, kernel, strides, pads)
    assert nan_windows.any() and np.isnan(y[nan_windows]).all()


def test_max_pool_indices() -> None:
    """The indices follow onnxruntime: the first cell of the window starts, a later one wins
    only if greater (NaN wins only when first); a window all -inf gives its first cell."""
    x = sprinkled(51, (1, 2, 7, 8), nan=0.25, inf=0.2)
    x[0, 1, :2, :2] = -np.inf
    x[0, 1, 4:6, 4:6] = np.nan
    model = node_model("MaxPool", {"x": x}, outputs=("v", "y"), kernel_shape=[2, 2],
                       strides=[2, 2])
    g = optimize_graph(import_onnx(model))
    ex = GraphExecutor(lower(g, threads=2))
    ex.set_input("x", x)
    ex.run()
    got = ex.get_output("y")
    sess = reference_session(model)
    np.testing.assert_array_equal(got, sess.run(["y"], {"x": x})[0])
    np.testing.assert_array_equal(got, run(import_onnx(model), {"x": x})["y"])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reduce_max_min(op: str, dtype: type) -> None:
    x = sprinkled(60, (5, 6, 7), dtype, nan=0.05, inf=0.1)
    x[1] = np.nan  # all-NaN rows: NaN in onnxruntime too
    x[2, :, 3] = -np.inf
    model = node_model(op, {"x": x}, {"ax": np.array([0, 2], np.int64)}, keepdims=0)
    (y,) = check(model, {"x": x}, ort_mask=~np.isnan(x).any(axis=(0, 2)))
    assert np.isnan(y[np.isnan(x).any(axis=(0, 2))]).all()


def test_global_max_pool() -> None:
    x = sprinkled(61, (2, 5, 4, 6), nan=0.03, inf=0.1)
    (y,) = check(node_model("GlobalMaxPool", {"x": x}), {"x": x},
                 ort_mask=~np.isnan(x).any(axis=(2, 3), keepdims=True))
    assert np.isnan(y[np.isnan(x).any(axis=(2, 3), keepdims=True)]).all()


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("axis", [0, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_arg_max_min(op: str, last: int, axis: int, dtype: type) -> None:
    x = np.round(sprinkled(70 + axis, (5, 4, 6), dtype, nan=0.2, inf=0.2))  # ties too
    x[0, 0] = np.nan
    check(node_model(op, {"x": x}, axis=axis, keepdims=1, select_last_index=last), {"x": x})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(op: str, axis: int) -> None:
    x = sprinkled(80, (3, 6, 10), nan=0.02, inf=0.03)
    x[0, 0] = 1.0
    x[0, 0, 3] = -np.inf  # a -inf among finite values: exp gives 0, log gives -inf
    x[1, 2] = -np.inf  # a row all -inf: NaN
    check(node_model(op, {"x": x}, axis=axis), {"x": x})


def test_topk() -> None:
    """NaN ranks above every number: the first of the largest, never among the smallest."""
    x = np.round(sprinkled(90, (4, 9, 3), nan=0.2, inf=0.2))
    x[0, :, 0] = np.nan
    k = {"k": np.array([4], np.int64)}
    for largest in (1, 0):
        model = node_model("TopK", {"x": x}, k, outputs=("v", "i"), axis=1, largest=largest)
        check(model, {"x": x})


def test_hardmax_follows_argmax() -> None:
    """onnxruntime's Hardmax takes an order-dependent max; here it is one at ArgMax's index."""
    x = np.round(sprinkled(91, (4, 7), nan=0.3, inf=0.2))
    x[0] = np.nan
    (h,) = check(node_model("Hardmax", {"x": x}, axis=1), {"x": x}, with_ort=False)
    (i,) = check(node_model("ArgMax", {"x": x}, axis=1, keepdims=0), {"x": x})
    np.testing.assert_array_equal(np.argmax(h, axis=1), i)


# -- a whole model --------------------------------------------------------------------------------

def test_lenet_all_nan_input_gives_nan_scores() -> None:
    from vtakit import models

    model = models.lenet()
    name = model.graph.input[0].name
    digit = np.zeros((1, 1, 28, 28), np.float32)
    digit[0, 0, 5:20, 5:20] = np.random.default_rng(0).random((15, 15))
    one_nan = digit.copy()
    one_nan[0, 0, 10, 10] = np.nan  # one NaN pixel: every score NaN too
    for x in (np.full((1, 1, 28, 28), np.nan, np.float32), one_nan):
        cpu, ref, want = outputs(model, {name: x})
        assert np.isnan(want[0]).all()
        for got in (cpu[0], ref[0]):
            assert_same(got, want[0], "lenet scores")
    cpu, ref, want = outputs(model, {name: digit})
    assert np.isfinite(want[0]).all()
    assert_same(cpu[0], want[0], "lenet scores", rtol=1e-4, atol=1e-5)
