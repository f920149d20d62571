"""Elementwise, softmax and pooling kernels against numpy."""

import numpy as np
import pytest

from vtakit.compiler.backend.cpu.kernels import elementwise as E
from vtakit.compiler.backend.cpu.kernels import pool as P

RNG = np.random.default_rng(0)
TOL = dict(rtol=1e-4, atol=1e-4)


def rand(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 5, 7), (7,)), ((2, 3, 5, 7), (5, 7)),
                                             ((2, 3, 5, 7), (3, 1, 1)), ((17,), (1,)),
                                             ((2, 3, 5, 7), (1, 3, 1, 1)), ((33, 17), (33, 17))])
@pytest.mark.parametrize("threads", [1, 2])
def test_binary_broadcast(a_shape, b_shape, threads):
    a, b = rand(*a_shape), rand(*b_shape)
    np.testing.assert_allclose(E.add(a, b, threads=threads), a + b, **TOL)
    np.testing.assert_allclose(E.mul(a, b, threads=threads), a * b, **TOL)


@pytest.mark.parametrize("n", [1, 7, 17, 1000])
def test_relu_clip(n):
    x = rand(n)
    np.testing.assert_array_equal(E.relu(x, threads=2), np.maximum(x, 0))
    np.testing.assert_array_equal(E.clip(x, -0.3, 0.7), np.clip(x, -0.3, 0.7))


@pytest.mark.parametrize("shape", [(1,), (3, 7), (2, 4, 33), (5, 1000)])
def test_softmax(shape):
    x = rand(*shape) * 10
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(E.softmax(x, threads=2), e / e.sum(-1, keepdims=True), **TOL)


def pool_ref(kind, x, k, s, p, include_pad=False):
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y = np.empty((n, c, oh, ow), np.float32)
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s - p, j * s - p
            win = x[:, :, max(h0, 0):min(h0 + k, h), max(w0, 0):min(w0 + k, w)]
            if kind == "max":
                y[:, :, i, j] = win.max((2, 3))
            else:
                cnt = ((min(h0 + k, h + p) - h0) * (min(w0 + k, w + p) - w0) if include_pad
                       else win.shape[2] * win.shape[3])
                y[:, :, i, j] = win.sum((2, 3)) / cnt
    return y


@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 2, 1), (3, 1, 1), (1, 1, 0), (3, 3, 0)])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool2d(kind, k, s, p):
    x = rand(2, 3, 17, 12)
    np.testing.assert_allclose(P.pool2d(kind, x, k, s, p, threads=2), pool_ref(kind, x, k, s, p),
                               **TOL)


@pytest.mark.parametrize("h,w", [(7, 7), (9, 33), (112, 112), (4, 300)])
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (3, 1, 1), (2, 2, 0), (5, 3, 2)])
def test_max_pool_rows_of_any_width_and_negative_values(h, w, k, s, p):
    # widths: one partial chunk, chunks + a partial one, 7 chunks, the row loop; all values
    # negative so that a padding lane read as 0 instead of -inf would win
    x = rand(1, 2, h, w) - 10.0
    np.testing.assert_allclose(P.max_pool2d(x, k, s, p), pool_ref("max", x, k, s, p), **TOL)


def test_avg_pool_count_include_pad():
    x = rand(1, 2, 7, 7)
    np.testing.assert_allclose(P.avg_pool2d(x, 3, 2, 1, count_include_pad=True),
                               pool_ref("avg", x, 3, 2, 1, True), **TOL)


@pytest.mark.parametrize("hw", [1, 7, 49])
def test_global_avg_pool(hw):
    x = rand(2, 5, hw, 1)
    np.testing.assert_allclose(P.global_avg_pool(x, threads=2), x.mean((2, 3), keepdims=True),
                               **TOL)


def test_errors():
    x = rand(2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"add: cannot broadcast b of shape \(4,\) to a of shape "
                                         r"\(2, 3, 4, 5\)"):
        E.add(x, rand(4))
    with pytest.raises(TypeError, match="relu: x: expected dtype float32, got int64"):
        E.relu(np.arange(3))
    with pytest.raises(ValueError, match="clip: lo=1.0 must be <= hi=0.0"):
        E.clip(x, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"max_pool2d: x: expected a 4-D array, got shape "
                                         r"\(4, 5\)"):
        P.max_pool2d(rand(4, 5), 2)
    with pytest.raises(ValueError, match=r"0 <= padding=\(2, 2\) < kernel"):
        P.max_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match="pool2d: kind='min' not supported"):
        P.pool2d("min", x, 2)
