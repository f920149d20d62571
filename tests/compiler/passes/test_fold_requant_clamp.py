"""fold_requant_clamp: a ReLU / clip of an integer tensor joins its REQUANTIZE's bounds."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vtakit.compiler.ir import DType, Graph, Op, run, verify
from vtakit.compiler.ir import ops as o
from vtakit.compiler.passes import fold_requant_clamp

I8 = DType.INT8


def _rq(ir, x, lo=-128, hi=127):
    attrs = o.RequantAttrs((3,), (4,), 1, lo, hi)
    return ir.node(Op.REQUANTIZE, x, attrs=attrs, dtype=I8)


def _feeds(shape):
    # every accumulator that requantises into and beyond int8: -4096 .. 4095 (shift 4, x3)
    v = np.arange(-4096, 4096, dtype=np.int32)
    return {"x": np.resize(v, shape)}


def _same(before, after, shape):
    feeds = _feeds(shape)
    a, b = run(before, feeds), run(after, feeds)
    for k in a:
        assert np.array_equal(a[k], b[k])


def test_relu_joins_the_lower_bound(ir):
    x = ir.inp("x", (1, 4, 8, 256), dtype=DType.INT32)
    before = Graph((x,), (ir.node(Op.RELU, _rq(ir, x)),), ("y",))
    expected = Graph((x,), (_rq(ir, x, lo=0),), ("y",))
    after = verify(fold_requant_clamp(before))
    assert after.structurally_equal(expected), after
    assert after.outputs[0].name == before.outputs[0].name
    _same(before, after, x.shape)


@pytest.mark.parametrize("lo, hi, a, b", [
    (-128, 127, 0, 6), (-5, 100, -20, 20), (10, 127, -128, 5), (-128, -10, 0, 127),
    (0, 127, None, 50), (-128, 127, -3, None), (-7, 7, -7, 7)])
def test_clip_composes_with_the_bounds(ir, lo, hi, a, b):
    """Overlapping, nested and disjoint intervals (a constant result) all compose exactly."""
    x = ir.inp("x", (1, 4, 8, 256), dtype=DType.INT32)
    clip = ir.node(Op.CLIP, _rq(ir, x, lo, hi),
                   attrs=o.ClipAttrs(None if a is None else float(a),
                                     None if b is None else float(b)))
    before = Graph((x,), (clip,), ("y",))
    after = verify(fold_requant_clamp(before))
    (y,) = after.outputs
    assert y.op is Op.REQUANTIZE and len(after.nodes) == 2
    ca, cb = -128 if a is None else a, 127 if b is None else b
    assert (y.attrs.lo, y.attrs.hi) == (min(max(lo, ca), cb), min(max(hi, ca), cb))
    _same(before, after, x.shape)


def test_left_alone_when_the_requantised_value_is_used_elsewhere_or_bounds_are_fractional(ir):
    x = ir.inp("x", (1, 4, 4, 4), dtype=DType.INT32)
    r = _rq(ir, x)
    shared = Graph((x,), (ir.node(Op.RELU, r), r), ("y", "z"))
    assert fold_requant_clamp(shared).structurally_equal(shared)
    frac = Graph((x,), (ir.node(Op.CLIP, _rq(ir, x), attrs=o.ClipAttrs(0.5, 6.0)),), ("y",))
    assert fold_requant_clamp(frac).structurally_equal(frac)
    flt = ir.inp("f", (1, 4, 4, 4))
    relu_f = Graph((flt,), (ir.node(Op.RELU, flt),), ("y",))
    assert fold_requant_clamp(relu_f).structurally_equal(relu_f)


def test_exhaustive_small_intervals(ir):
    """Every pair of intervals over a small range: the folded graph computes the same."""
    x = ir.inp("x", (1, 4, 8, 256), dtype=DType.INT32)
    points = (-128, -3, 0, 2, 127)
    for (lo, hi), (a, b) in itertools.product(
            [(p, q) for p in points for q in points if p <= q], repeat=2):
        clip = ir.node(Op.CLIP, _rq(ir, x, lo, hi), attrs=o.ClipAttrs(float(a), float(b)))
        before = Graph((x,), (clip,), ("y",))
        _same(before, fold_requant_clamp(before), x.shape)
