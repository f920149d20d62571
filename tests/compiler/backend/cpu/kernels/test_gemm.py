"""float32 GEMM against numpy: edge sizes, epilogues, threads, pre-packed weights, bad input."""

import numpy as np
import pytest

from vtakit.compiler.backend.cpu.kernels import gemm as G

RNG = np.random.default_rng(0)
TOL = dict(rtol=1e-4, atol=1e-4)


def _mats(m, k, n):
    a = RNG.standard_normal((m, k), dtype=np.float32)
    b = RNG.standard_normal((k, n), dtype=np.float32)
    return a, b


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 17, 33), (17, 33, 7), (33, 7, 17),
                                   (1, 513, 1), (9, 385, 49), (64, 64, 64), (50, 3, 97)])
@pytest.mark.parametrize("cfg", [G.DEFAULT, G.GemmConfig(mr=6, nr=64, kc=16, mc=12, nc=128)])
def test_gemm_matches_numpy(m, k, n, cfg):
    a, b = _mats(m, k, n)
    out = G.gemm(a, G.pack_b(b, cfg))
    np.testing.assert_allclose(out, a @ b, **TOL)


@pytest.mark.parametrize("m", [1, 2, 5, 6, 7])
def test_few_rows_get_their_own_blocking(m):
    cfg = G.choose_config(1000, m)
    assert cfg.mr == (m if m < 6 else cfg.mr) and cfg.mc % cfg.mr == 0
    a, b = _mats(m, 1280, 1000)
    bias = RNG.standard_normal(1000, dtype=np.float32)
    out = np.empty((m, 1000), np.float32)
    G.gemm(a, G.pack_b(b, cfg), out, bias=bias, act="relu", threads=2)
    np.testing.assert_allclose(out, np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("act,clip", [(None, None), ("relu", None), ("clip", (-0.5, 1.0))])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_bias_and_activation(act, clip, threads):
    a, b = _mats(37, 70, 100)
    bias = RNG.standard_normal(100, dtype=np.float32)
    ref = a @ b + bias
    ref = {None: ref, "relu": np.maximum(ref, 0)}.get(act, np.clip(ref, -0.5, 1.0))
    out = np.empty((37, 100), np.float32)
    G.gemm(a, G.pack_b(b), out, bias=bias, act=act, clip=clip, threads=threads)
    np.testing.assert_allclose(out, ref, **TOL)


def test_packed_weights_are_reused():
    a, b = _mats(20, 30, 40)
    pb = G.pack_b(b)
    for _ in range(3):
        a = RNG.standard_normal((20, 30), dtype=np.float32)
        np.testing.assert_allclose(G.gemm(a, pb), a @ b, **TOL)


@pytest.mark.parametrize("threads", [1, 2])
def test_large_multi_block(threads):
    a, b = _mats(300, 800, 200)  # several KC, MC blocks; split over threads
    np.testing.assert_allclose(G.gemm(a, b, threads=threads), a @ b, rtol=1e-4, atol=1e-3)


def test_k_zero():
    out = G.gemm(np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32),
                 bias=np.ones(4, np.float32))
    np.testing.assert_array_equal(out, np.ones((3, 4), np.float32))


def test_errors():
    a, b = _mats(4, 5, 6)
    with pytest.raises(TypeError, match="gemm: a: expected dtype float32, got float64"):
        G.gemm(a.astype(np.float64), b)
    with pytest.raises(TypeError, match="gemm: a: expected a numpy.ndarray of float32, got list"):
        G.gemm([[1.0]], b)
    with pytest.raises(ValueError, match=r"gemm: a: expected a 2-D array, got shape \(20,\)"):
        G.gemm(a.reshape(-1), b)
    with pytest.raises(ValueError, match="gemm: a: expected a C-contiguous array"):
        G.gemm(np.asfortranarray(a), b)
    with pytest.raises(ValueError, match=r"a has shape \(4, 6\) \(K=6\) but b has K=5"):
        G.gemm(RNG.standard_normal((4, 6), dtype=np.float32), b)
    with pytest.raises(ValueError, match=r"gemm: bias has shape \(5,\), expected \(6,\)"):
        G.gemm(a, b, bias=np.zeros(5, np.float32))
    with pytest.raises(ValueError, match=r"gemm: out has shape \(4, 5\), expected \(4, 6\)"):
        G.gemm(a, b, out=np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="act='gelu' not supported"):
        G.gemm(a, b, act="gelu")
    with pytest.raises(ValueError, match=r"act='clip' needs clip=\(lo, hi\)"):
        G.gemm(a, b, act="clip")
    with pytest.raises(TypeError, match="gemm: b: expected PackedB or numpy.ndarray, got int"):
        G.gemm(a, 3)
    with pytest.raises(ValueError, match="GemmConfig.nr=20 must be a positive multiple of 16"):
        G.GemmConfig(nr=20)
