"""The reference interpreter against direct (loop) definitions of the windowed ops."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vtakit.compiler.ir import DType, Graph, Node, Op, const, infer, run
from vtakit.compiler.ir import ops as o
from vtakit.compiler.ir.interpreter import evaluate


def _apply(op: Op, args: list[np.ndarray], attrs: o.Attrs = o.NO_ATTRS, **kw: object
           ) -> np.ndarray:
    src = [const(a) for a in args]
    dtype, shape = infer(op, src, attrs, **kw)  # type: ignore[arg-type]
    return evaluate(Node(op, dtype, shape, tuple(src), attrs), list(args))


def naive_conv(x: np.ndarray, w: np.ndarray, a: o.ConvAttrs) -> np.ndarray:
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, [(0, 0), (0, 0), (a.pads[0], a.pads[2]), (a.pads[1], a.pads[3])])
    oh = (h + a.pads[0] + a.pads[2] - (kh - 1) * a.dilations[0] - 1) // a.strides[0] + 1
    ow = (wd + a.pads[1] + a.pads[3] - (kw - 1) * a.dilations[1] - 1) // a.strides[1] + 1
    y = np.zeros((n, m, oh, ow), np.float64)
    for b, oc, i, j in itertools.product(range(n), range(m), range(oh), range(ow)):
        g = oc // (m // a.group)
        for ic, p, q in itertools.product(range(cg), range(kh), range(kw)):
            y[b, oc, i, j] += (xp[b, g * cg + ic, i * a.strides[0] + p * a.dilations[0],
                                  j * a.strides[1] + q * a.dilations[1]] * w[oc, ic, p, q])
    return y


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 2), st.integers(1, 2), st.integers(0, 2), st.integers(0, 10**6))
def test_conv_matches_the_definition(n, groups, cg, mg, stride, dil, pad, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, groups * cg, 7, 6))
    w = rng.standard_normal((groups * mg, cg, 3, 2))
    a = o.ConvAttrs((3, 2), (stride, stride), (pad, pad, pad, 0), (dil, 1), groups)
    np.testing.assert_allclose(_apply(Op.CONV, [x, w], a), naive_conv(x, w, a), rtol=1e-10,
                               atol=1e-10)


def test_max_pool_ceil_mode_and_padding():
    x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    a = o.PoolAttrs((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), ceil_mode=True)
    y = _apply(Op.MAX_POOL, [x], a)
    np.testing.assert_array_equal(y[0, 0], [[6, 8, 9], [16, 18, 19], [21, 23, 24]])


@pytest.mark.parametrize("include_pad, corner", [(False, (0 + 1 + 5 + 6) / 4), (True, 12 / 9)])
def test_avg_pool_counts_padding_only_when_asked(include_pad, corner):
    x = np.arange(25, dtype=np.float64).reshape(1, 1, 5, 5)
    a = o.PoolAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), count_include_pad=include_pad)
    y = _apply(Op.AVG_POOL, [x], a)
    assert y.shape == (1, 1, 5, 5)
    assert y[0, 0, 0, 0] == pytest.approx(corner)
    assert y[0, 0, 2, 2] == pytest.approx(12.0)


def test_slice_with_negative_step_runs_to_the_front():
    x = np.arange(5)
    y = _apply(Op.SLICE, [x], o.SliceAttrs((4,), (-1,), (-2,)))
    np.testing.assert_array_equal(y, [4, 2, 0])


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, 1000, -1000], np.float32)
    y = _apply(Op.QUANTIZE_LINEAR, [x, np.float32(1), np.int8(0)], o.AxisAttrs(0))
    np.testing.assert_array_equal(y, [0, 2, 2, 0, 127, -128])
    assert y.dtype == np.int8


def test_integer_division_truncates_toward_zero():
    y = _apply(Op.DIV, [np.array([7, -7, 7, -7], np.int32), np.array([2, 2, -2, -2], np.int32)])
    np.testing.assert_array_equal(y, [3, -3, -3, 3])


def test_run_checks_its_inputs():
    x = Node(Op.INPUT, DType.FLOAT32, (2,), attrs=o.InputAttrs(0), name="x")
    g = Graph((x,), (Node(Op.RELU, DType.FLOAT32, (2,), (x,)),), ("y",))
    np.testing.assert_array_equal(run(g, {"x": np.array([-1, 2], np.float32)})["y"], [0, 2])
    with pytest.raises(ValueError, match=r"missing inputs \['x'\], unknown inputs \['z'\]"):
        run(g, {"z": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match=r"input 'x': got float64\[2\], expected float32\[2\]"):
        run(g, {"x": np.zeros(2)})


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(1, 3), st.integers(1, 2),
       st.integers(0, 1), st.integers(0, 10**6))
def test_conv_transpose_is_the_adjoint_of_conv(groups, cg, stride, dil, pad, seed):
    # <conv(x, w), y> == <x, conv_transpose(y, w)> for the same attributes and weights.
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, groups * cg, 7, 5))
    w = rng.standard_normal((groups * 2, cg, 3, 2))
    a = o.ConvAttrs((3, 2), (stride, stride), (pad, 0, pad, 1), (dil, 1), groups)
    y = rng.standard_normal(_apply(Op.CONV, [x, w], a).shape)
    full = [stride * (y.shape[2 + i] - 1) + (a.kernel[i] - 1) * a.dilations[i] + 1
            - a.pads[i] - a.pads[2 + i] for i in range(2)]
    t = o.ConvTransposeAttrs(a.kernel, a.strides, a.pads, a.dilations,
                             (x.shape[2] - full[0], x.shape[3] - full[1]), groups)
    xt = _apply(Op.CONV_TRANSPOSE, [y, w], t)
    assert xt.shape == x.shape
    assert np.vdot(_apply(Op.CONV, [x, w], a), y) == pytest.approx(np.vdot(x, xt), rel=1e-9)


def test_avg_pool_never_counts_ceil_mode_cells():
    x = np.ones((1, 1, 5), np.float32)
    a = o.PoolAttrs((2,), (2,), (1, 0), (1,), ceil_mode=True, count_include_pad=True)
    # Windows [pad, 0], [1, 2], [3, 4]; no window starts in the ceil-mode region past the end.
    np.testing.assert_allclose(_apply(Op.AVG_POOL, [x], a)[0, 0], [0.5, 1, 1])
    a = o.PoolAttrs((2,), (2,), (0, 0), (1,), ceil_mode=True, count_include_pad=True)
    np.testing.assert_allclose(_apply(Op.AVG_POOL, [x], a)[0, 0], [1, 1, 1])  # last is [4, -]
