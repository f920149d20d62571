"""plan_memory: liveness-based reuse of one arena."""

from __future__ import annotations

from vtakit.compiler.ir import Graph, Op
from vtakit.compiler.passes import plan_memory
from vtakit.compiler.passes.plan_memory import ALIGNMENT, MemoryPlan


def assert_valid(plan: MemoryPlan) -> None:
    """Aligned offsets, inside the arena, and no two tensors live at once share a byte."""
    for b in plan.buffers:
        assert b.offset % ALIGNMENT == 0 and b.offset + b.size <= plan.arena_bytes
    bs = plan.buffers
    for i, a in enumerate(bs):
        for b in bs[i + 1:]:
            assert not (a.overlaps_in_time(b) and a.overlaps_in_space(b)), (a, b)
    assert plan.peak_bytes <= plan.arena_bytes <= plan.naive_bytes


def test_a_chain_reuses_two_buffers(ir):
    # x -> a -> b -> c -> d (output): a and c can share, b stands alone beside them.
    x = ir.inp("x", (1000,))
    a = ir.node(Op.EXP, x)
    b = ir.node(Op.NEG, a)
    c = ir.node(Op.ABS, b)
    d = ir.node(Op.RELU, c)
    plan = plan_memory(Graph((x,), (d,), ("d",)))
    size = 4032  # 4000 bytes rounded up to 64
    assert [buf.node for buf in plan.buffers] == [a, b, c]
    assert plan.naive_bytes == 3 * size and plan.peak_bytes == 2 * size
    assert plan.arena_bytes == 2 * size and plan.offsets[a] == plan.offsets[c]
    assert_valid(plan)


def test_a_long_lived_value_is_not_overwritten(ir):
    # a is read at the very end, so nothing in between may take its bytes.
    x = ir.inp("x", (16,))
    a = ir.node(Op.EXP, x)
    b = ir.node(Op.NEG, a)
    c = ir.node(Op.ABS, b)
    e = ir.node(Op.SIN, c)
    out = ir.node(Op.ADD, e, a)
    plan = plan_memory(Graph((x,), (out,), ("y",)))
    assert_valid(plan)
    others = {plan.offsets[n] for n in (b, c, e)}
    assert plan.offsets[a] not in others
    assert x not in plan.offsets and out not in plan.offsets
