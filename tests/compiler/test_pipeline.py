"""optimize(): every model of compiler.models computes the same after optimisation, with the
expected fusions, and ResNet-18's memory plan is valid and reuses memory."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from vtakit import models
from vtakit.compiler.errors import VerifyError
from vtakit.compiler.frontend import import_onnx
from vtakit.compiler.ir import DType, Graph, Node, Op, run
from vtakit.compiler.ir import ops as o
from vtakit.compiler.passes import plan_memory
from vtakit.compiler.pipeline import PASSES, optimize

RTOL = ATOL = 1e-4

BUILDERS = {
    "mlp": (models.mlp, (784,)), "lenet": (models.lenet, (1, 28, 28)),
    "resnet18": (models.resnet18, (3, 224, 224)),
    "mobilenet_v2": (models.mobilenet_v2, (3, 224, 224)),
    "transformer_block": (models.transformer_block, (16, 64)),
}


@pytest.fixture(scope="module")
def graphs() -> dict[str, tuple[Graph, Graph]]:
    out = {}
    for name, (build, _) in BUILDERS.items():
        g = import_onnx(build())
        out[name] = (g, optimize(g, debug=1))
    return out


def _count(g: Graph) -> collections.Counter:
    return collections.Counter(n.op for n in g.nodes)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_optimized_model_computes_the_same(graphs, name):
    before, after = graphs[name]
    x = np.random.default_rng(7).standard_normal((1, *BUILDERS[name][1])).astype(np.float32)
    want, got = run(before, {"input": x}), run(after, {"input": x})
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL)
    assert len(after.nodes) < len(before.nodes)


def _epilogues(g: Graph, op: Op) -> list[o.Epilogue]:
    return [o.epilogue_of(n) for n in g.nodes if n.op is op]


def test_resnet18_is_convs_with_epilogues(graphs):
    before, after = graphs["resnet18"]
    ops = _count(after)
    assert ops[Op.BATCH_NORM] == ops[Op.RELU] == ops[Op.ADD] == 0
    assert ops[Op.CONV] == _count(before)[Op.CONV] == 20
    eps = _epilogues(after, Op.CONV)
    # 1 stem + 8 first convs of the blocks: relu; 8 second convs: residual then relu;
    # 3 downsampling 1x1 convs: nothing (the block's add takes them as its residual).
    assert collections.Counter(str(e) for e in eps) == {"relu": 9, "+residual relu": 8,
                                                        "none": 3}
    assert all(n.src[2].op is Op.CONST for n in after.nodes if n.op is Op.CONV)
    assert set(ops) == {Op.INPUT, Op.CONST, Op.CONV, Op.MAX_POOL, Op.GLOBAL_AVG_POOL,
                        Op.RESHAPE, Op.GEMM}


def test_mobilenet_v2_is_convs_with_relu6_and_residuals(graphs):
    _, after = graphs["mobilenet_v2"]
    ops = _count(after)
    assert ops[Op.BATCH_NORM] == ops[Op.CLIP] == ops[Op.ADD] == 0
    eps = collections.Counter(str(e) for e in _epilogues(after, Op.CONV))
    # 35 relu6 convs; 17 projections, of which 10 end a block with a residual add.
    assert eps == {"clip(0.0, 6.0)": 35, "+residual": 10, "none": 7}


def test_mlp_lenet_and_transformer_fuse_bias_and_activations(graphs):
    assert _count(graphs["mlp"][1])[Op.RELU] == 0
    assert [str(e) for e in _epilogues(graphs["mlp"][1], Op.GEMM)] == ["relu", "relu", "none"]
    assert _count(graphs["lenet"][1])[Op.RELU] == 0
    t = graphs["transformer_block"][1]
    ops = _count(t)
    assert ops[Op.ADD] == ops[Op.GELU] == 0 and ops[Op.MATMUL] == 8
    assert sorted(str(e) for e in _epilogues(t, Op.MATMUL)) == (
        ["+residual"] * 2 + ["gelu"] + ["none"] * 5)


def test_resnet18_memory_plan_reuses_memory_without_overlap(graphs):
    _, g = graphs["resnet18"]
    plan = plan_memory(g)
    assert plan.peak_bytes <= plan.arena_bytes < plan.naive_bytes
    assert all(b.offset % 64 == 0 for b in plan.buffers)
    outputs = {id(n) for n in g.outputs}
    assert {id(b.node) for b in plan.buffers} == {
        id(n) for n in g.nodes if n.op not in (Op.INPUT, Op.CONST) and id(n) not in outputs}
    # No two tensors live at the same step share a byte: sweep the steps.
    by_step = collections.defaultdict(list)
    for b in plan.buffers:
        for step in range(b.first, b.last + 1):
            by_step[step].append((b.offset, b.offset + b.size))
    for spans in by_step.values():
        spans.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))


def test_passes_are_listed_by_name():
    assert [p.__name__ for p in PASSES] == [
        "fold_constants", "eliminate_dead_code", "fold_batch_norm", "shift_uint8",
        "fold_requant_clamp",
        "fuse_epilogues",
        "fuse_elementwise", "eliminate_dead_code"]


def _broken_pass(g: Graph) -> Graph:
    # Declares the wrong shape: the verifier run after the pass must catch it.
    y = g.outputs[0]
    return g.replace(outputs=(Node(Op.NEG, DType.FLOAT32, (7,), (y,)),))


def test_debug_verifies_after_every_pass(monkeypatch):
    x = Node(Op.INPUT, DType.FLOAT32, (3,), attrs=o.InputAttrs(0), name="x")
    g = Graph((x,), (Node(Op.EXP, DType.FLOAT32, (3,), (x,)),), ("y",))
    monkeypatch.setattr("vtakit.compiler.pipeline.PASSES", (_broken_pass,))
    optimize(g, debug=0)  # not checked
    with pytest.raises(VerifyError, match="after pass _broken_pass"):
        optimize(g, debug=1)
    monkeypatch.setenv("VTAKIT_DEBUG", "1")
    with pytest.raises(VerifyError, match="after pass _broken_pass"):
        optimize(g)
    monkeypatch.setenv("VTAKIT_DEBUG", "0")
    optimize(g)


def test_optimize_is_idempotent(graphs):
    for name in ("resnet18", "transformer_block"):
        once = graphs[name][1]
        assert optimize(once, debug=1).structurally_equal(once)


def test_standalone_batch_norm_and_relu_become_one_fused_elementwise():
    # BN after a max-pool cannot go into weights: it becomes x * s + t, fused with the relu.
    x = Node(Op.INPUT, DType.FLOAT32, (1, 2, 4, 4), attrs=o.InputAttrs(0), name="x")
    pool = Node(Op.MAX_POOL, DType.FLOAT32, (1, 2, 2, 2), (x,),
                o.PoolAttrs((2, 2), (2, 2), (0, 0, 0, 0), (1, 1)))
    rng = np.random.default_rng(2)
    params = [o.const(rng.uniform(0.5, 1.5, 2).astype(np.float32)) for _ in range(4)]
    bn = Node(Op.BATCH_NORM, DType.FLOAT32, pool.shape, (pool, *params), o.EpsilonAttrs(1e-5))
    g = Graph((x,), (Node(Op.RELU, DType.FLOAT32, bn.shape, (bn,)),), ("y",))
    h = optimize(g, debug=1)
    assert [n.op for n in h.nodes if n.op is not Op.CONST] == [
        Op.INPUT, Op.MAX_POOL, Op.FUSED_ELEMENTWISE]
    fused = h.outputs[0]
    assert isinstance(fused.attrs, o.FusedElementwiseAttrs)
    assert [step[0] for step in fused.attrs.program] == ["mul", "add", "relu"]
    feeds = {"x": rng.standard_normal((1, 2, 4, 4)).astype(np.float32)}
    np.testing.assert_allclose(run(h, feeds)["y"], run(g, feeds)["y"], rtol=1e-5, atol=1e-6)
