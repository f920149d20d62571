import numpy as np
import pytest

from vtakit.driver import Session, SimDevice
from vtakit.driver import kernels as K
from vtakit.vta_hw.config import preset

CASES = [
    ("default", K.Conv2dShape(n=1, c=32, h=10, w=9, o=32, kh=3, kw=3, stride=1, pad=1)),
    ("default", K.Conv2dShape(n=1, c=16, h=11, w=11, o=48, kh=3, kw=3, stride=2, pad=1)),
    ("default", K.Conv2dShape(n=1, c=64, h=8, w=8, o=16, kh=1, kw=1, stride=2, pad=0)),
    ("ecp5", K.Conv2dShape(n=1, c=16, h=7, w=7, o=24, kh=3, kw=3, stride=1, pad=1)),
    ("ice40", K.Conv2dShape(n=1, c=4, h=5, w=6, o=6, kh=3, kw=3, stride=1, pad=1)),
]


@pytest.mark.parametrize("name, shape", CASES)
def test_conv2d_matches_numpy(name, shape):
    cfg = preset(name)
    rng = np.random.default_rng(7)
    x = rng.integers(-128, 128, (shape.n, shape.c, shape.h, shape.w), dtype=np.int8)
    w = rng.integers(-128, 128, (shape.o, shape.c, shape.kh, shape.kw), dtype=np.int8)
    s = Session(SimDevice(cfg, dram_bytes=8 << 20))
    xd = s.array(K.pack_activations(x, cfg))
    wd = s.array(K.pack_weights(w, cfg))
    yd = s.alloc((shape.n // cfg.batch, shape.o // cfg.block_out, shape.oh, shape.ow,
                  cfg.batch, cfg.block_out), np.int8)
    K.conv2d(s, xd, wd, yd, shape, shift=8)
    result = s.synchronize()
    np.testing.assert_array_equal(K.unpack_outputs(yd.numpy()),
                                  K.conv2d_reference(x, w, shape, 8))
    assert result.stats.gemm_macs == shape.macs


def test_small_tiles_force_many_chunks():
    cfg = preset("default")
    shape = K.Conv2dShape(n=1, c=64, h=6, w=6, o=32, kh=3, kw=3, stride=1, pad=1)
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, 64, 6, 6), dtype=np.int8)
    w = rng.integers(-128, 128, (32, 64, 3, 3), dtype=np.int8)
    s = Session(SimDevice(cfg, dram_bytes=8 << 20))
    xd, wd = s.array(K.pack_activations(x, cfg)), s.array(K.pack_weights(w, cfg))
    yd = s.alloc((1, 2, 6, 6, 1, 16), np.int8)
    K.conv2d(s, xd, wd, yd, shape, shift=9, tiling=K.Conv2dTiling(toh=2, tob=1, tib=1))
    s.synchronize()
    np.testing.assert_array_equal(K.unpack_outputs(yd.numpy()),
                                  K.conv2d_reference(x, w, shape, 9))


def test_matmul_matches_numpy():
    cfg = preset("default")
    m, k, n = 96, 64, 48
    rng = np.random.default_rng(1)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    s = Session(SimDevice(cfg, dram_bytes=8 << 20))
    ad = s.array(K.pack_matrix(a, cfg))
    wd = s.array(K.pack_weights(w[:, :, None, None], cfg))
    yd = s.alloc((1, n // 16, m, 1, 1, 16), np.int8)
    K.matmul(s, ad, wd, yd, m, k, n, shift=7)
    s.synchronize()
    want = np.clip((a.astype(np.int32) @ w.astype(np.int32).T) >> 7, -128, 127)
    np.testing.assert_array_equal(K.unpack_matrix(yd.numpy()), want)


def test_conv2d_refuses_shapes_the_core_cannot_take():
    cfg = preset("default")
    with pytest.raises(ValueError, match=r"conv2d: c=20 is not a multiple of the core's 16"):
        K.choose_tiling(K.Conv2dShape(n=1, c=20, h=4, w=4, o=16), cfg)
    with pytest.raises(ValueError, match=r"pad=16 exceeds the 4-bit padding fields"):
        K.choose_tiling(K.Conv2dShape(n=1, c=16, h=4, w=4, o=16, pad=16), cfg)
