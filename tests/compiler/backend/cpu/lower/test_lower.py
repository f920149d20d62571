"""Lowering to LLVM kernels: small graphs through lower() + GraphExecutor against the reference
interpreter, the arena plan, and the epilogues / fused programs that the passes produce."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from vtakit.compiler.backend.cpu.lower import _Lowerer, lower
from vtakit.compiler.errors import UnsupportedError
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.ir.interpreter import run
from vtakit.compiler.pipeline import optimize as optimize_graph
from vtakit.runtime.executor import GraphExecutor
from vtakit.runtime.plan import Plan

T = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
     np.float16: TensorProto.FLOAT16, np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8,
     np.int32: TensorProto.INT32, np.int64: TensorProto.INT64, np.bool_: TensorProto.BOOL}


def _model(op: str, inputs: list[np.ndarray], const: frozenset[int] = frozenset(), **attrs):
    """A one-node model; the inputs numbered in `const` are initializers."""
    import onnx

    names = [f"x{i}" for i in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    vis = [helper.make_tensor_value_info(n, T[a.dtype.type], a.shape)
           for i, (n, a) in enumerate(zip(names, inputs)) if i not in const]
    inits = [helper.make_tensor(names[i], T[inputs[i].dtype.type], inputs[i].shape,
                                inputs[i].reshape(-1).tolist()) for i in sorted(const)]
    model = helper.make_model(helper.make_graph([node], "g", vis, [], inits),
                              opset_imports=[helper.make_opsetid("", 20)])
    inferred = onnx.shape_inference.infer_shapes(model)
    model.graph.output.extend(v for v in inferred.graph.value_info if v.name == "y")
    return model


def _check(model, feeds: dict[str, np.ndarray], threads: int = 2, optimize: bool = True):
    g = import_onnx(model)
    g = optimize_graph(g) if optimize else g
    ex = GraphExecutor(lower(g, threads=threads))
    for k, v in feeds.items():
        ex.set_input(k, v)
    ex.run()
    want = run(g, feeds)
    for i, name in enumerate(g.output_names):
        got = ex.get_output(i)
        assert got.dtype == want[name].dtype and got.shape == want[name].shape
        np.testing.assert_allclose(got, want[name], rtol=1e-5, atol=1e-6)


rng = np.random.default_rng(0)
F = rng.standard_normal((2, 3, 4)).astype(np.float32)

CASES = [
    ("Add", [F, F[0, 0]], {}),
    ("Add", [F.astype(np.float64), F[:, :1].astype(np.float64)], {}),
    ("Mul", [F.astype(np.float16), F.astype(np.float16)], {}),
    ("Sub", [(F * 50).astype(np.int8), (F[0] * 50).astype(np.int8)], {}),
    ("Div", [(F * 50).astype(np.int32), np.full((4,), 7, np.int32)], {}),
    ("Where", [F > 0, F, -F], {}),
    ("Greater", [F, F[:, :, :1]], {}),
    ("Sigmoid", [F], {}), ("Tanh", [F], {}), ("Erf", [F], {}), ("Exp", [F], {}),
    ("LeakyRelu", [F], {"alpha": 0.3}), ("Gelu", [F], {}),
    ("Transpose", [F], {"perm": [2, 0, 1]}),
    ("Softmax", [F], {"axis": 1}),
    ("ReduceMean", [F, np.array([1], np.int64)], {"keepdims": 0}),
    ("ReduceMax", [(F * 10).astype(np.int32), np.array([0, 2], np.int64)], {}),
    ("ArgMax", [F], {"axis": 2}),
    ("Concat", [F, F * 2], {"axis": 1}),
    ("CumSum", [F, np.array(1, np.int64)], {}),
]


@pytest.mark.parametrize(("op", "inputs", "attrs"), CASES,
                         ids=[f"{c[0]}-{c[1][0].dtype}" for c in CASES])
def test_op_matches_interpreter(op: str, inputs: list[np.ndarray], attrs: dict) -> None:
    # inputs that decide shapes (reduction axes, CumSum's axis) are initializers
    const = frozenset({1} if op in ("ReduceMean", "ReduceMax", "CumSum") else ())
    model = _model(op, inputs, const, **attrs)
    feeds = {f"x{i}": a for i, a in enumerate(inputs) if i not in const}
    _check(model, feeds)


def test_conv_bn_relu_residual_fused() -> None:
    """Conv → BatchNorm → Add(residual) → Relu: after the passes, one CONV with a residual
    epilogue (fast im2col path) must equal the interpreter on the unoptimised graph."""
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    w = helper.make_tensor("w", TensorProto.FLOAT, (4, 4, 3, 3),
                           rng.standard_normal(144).astype(np.float32).tolist())
    bn = [helper.make_tensor(n, TensorProto.FLOAT, (4,), v.tolist()) for n, v in
          zip(["s", "b", "m", "v"], [rng.random(4) + 0.5, rng.random(4), rng.random(4),
                                     rng.random(4) + 0.5])]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Add", ["n", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, x.shape)],
                          [helper.make_tensor_value_info("y", 1, x.shape)], [w, *bn])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    ref = run(import_onnx(model), {"x": x})["y"]
    ex = GraphExecutor(lower(optimize_graph(import_onnx(model)), threads=2))
    ex.set_input("x", x)
    ex.run()
    np.testing.assert_allclose(ex.get_output(0), ref, rtol=1e-4, atol=1e-5)


def test_arena_reuses_memory_and_plan_round_trips() -> None:
    from vtakit import models

    p = lower(optimize_graph(import_onnx(models.lenet())), threads=2)
    arena = [b for b in p.buffers if b.kind == "arena"]
    assert p.arena_bytes < sum(b.nbytes for b in arena)  # buffers share the arena
    q = Plan.from_json(json.loads(json.dumps(p.to_json())), p.params)
    assert [s.calls[0].args for s in q.steps] == [s.calls[0].args for s in p.steps]


def test_every_op_is_lowered() -> None:
    from vtakit.compiler.backend.cpu.lower.walk import _ELEMENTWISE
    from vtakit.compiler.ir.ops import Op

    special = {Op.INPUT, Op.CONST, Op.RESHAPE, Op.IDENTITY, Op.FUSED_ELEMENTWISE}
    assert [op for op in Op if op not in special | _ELEMENTWISE
            and not hasattr(_Lowerer, "op_" + op.value)] == []


def test_unsupported_op_names_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every IR op has a handler: take DET's away to see what an op without one gives.
    monkeypatch.delattr(_Lowerer, "op_det")
    x = rng.standard_normal((2, 2)).astype(np.float32)
    g = import_onnx(_model("Det", [x]))
    with pytest.raises(UnsupportedError, match="DET node .*does not lower DET"):
        lower(g, threads=1)


def test_bad_threads() -> None:
    g = import_onnx(_model("Relu", [F]))
    with pytest.raises(ValueError, match="threads=0, expected an int >= 1"):
        lower(g, threads=0)
