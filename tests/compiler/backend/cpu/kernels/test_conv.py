"""Conv2d (NCHW, float32) against a float64 numpy reference: strides, padding, dilation, groups,
depthwise, fused bias + activation, threads, bad input."""

import numpy as np
import pytest

from vtakit.compiler.backend.cpu.kernels import gemm as G
from vtakit.compiler.backend.cpu.kernels.conv import Conv2d, conv2d

RNG = np.random.default_rng(0)


def conv_ref(x, w, b, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    co, cig, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dil
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))).astype(np.float64)
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, co, oh, ow))
    cog = co // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cig:(g + 1) * cig, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                           j * dw:j * dw + sw * (ow - 1) + 1:sw]
                y[:, g * cog:(g + 1) * cog] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * cog:(g + 1) * cog, :, i, j])
    if b is not None:
        y += b[None, :, None, None]
    return y.astype(np.float32)


CASES = [  # n, cin, h, w, cout, kh, kw, stride, pad, dilation, groups
    (1, 3, 17, 17, 8, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (2, 5, 9, 11, 7, 3, 3, (2, 2), (1, 1), (1, 1), 1),
    (1, 4, 7, 7, 6, 1, 1, (1, 1), (0, 0), (1, 1), 1),
    (1, 8, 20, 20, 16, 3, 3, (1, 1), (2, 2), (2, 2), 1),
    (1, 3, 33, 33, 17, 7, 7, (2, 2), (3, 3), (1, 1), 1),
    (1, 4, 5, 6, 3, 5, 2, (1, 2), (0, 1), (1, 1), 1),
    (1, 16, 14, 14, 33, 1, 1, (2, 2), (0, 0), (1, 1), 1),
    (1, 6, 15, 15, 6, 3, 3, (1, 1), (1, 1), (1, 1), 6),
    (2, 6, 15, 16, 6, 3, 3, (2, 2), (1, 1), (1, 1), 6),
    (1, 5, 9, 9, 5, 5, 5, (1, 1), (2, 2), (2, 2), 5),
    (1, 8, 12, 12, 4, 3, 3, (1, 1), (1, 1), (1, 1), 2),
    (1, 1, 1, 1, 1, 1, 1, (1, 1), (0, 0), (1, 1), 1),
    # depthwise: rows of one partial chunk, exactly one chunk, chunks + a partial one, a row
    # loop (more than conv.UNROLL_CHUNKS chunks), strides 1-3 either way, dilation,
    # a filter wider than the image (most taps out of range)
    (1, 4, 7, 7, 4, 3, 3, (1, 1), (1, 1), (1, 1), 4),
    (1, 3, 14, 14, 3, 3, 3, (2, 2), (1, 1), (1, 1), 3),
    (1, 2, 16, 16, 2, 3, 3, (1, 1), (1, 1), (1, 1), 2),
    (1, 2, 9, 34, 2, 3, 3, (2, 2), (1, 1), (1, 1), 2),
    (1, 2, 5, 300, 2, 3, 3, (1, 1), (1, 1), (1, 1), 2),
    (1, 3, 11, 40, 3, 3, 5, (1, 3), (1, 2), (1, 1), 3),
    (1, 3, 12, 21, 3, 3, 3, (2, 1), (0, 1), (1, 2), 3),
    (1, 2, 3, 4, 2, 5, 5, (1, 1), (2, 2), (1, 1), 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:7])) + f"g{c[-1]}")
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_matches_reference(case, threads):
    n, cin, h, w, cout, kh, kw, s, p, d, g = case
    x = RNG.standard_normal((n, cin, h, w), dtype=np.float32)
    wt = RNG.standard_normal((cout, cin // g, kh, kw), dtype=np.float32)
    b = RNG.standard_normal(cout, dtype=np.float32)
    y = Conv2d(wt, b, s, p, d, g, act="relu")(x, threads=threads)
    ref = np.maximum(conv_ref(x, wt, b, s, p, d, g), 0)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", [None, G.GemmConfig(mr=8, nr=48), G.GemmConfig(mr=12, nr=32)])
def test_resnet_like_layer_and_blockings(cfg):
    x = RNG.standard_normal((1, 64, 28, 28), dtype=np.float32)
    wt = RNG.standard_normal((40, 64, 3, 3), dtype=np.float32) / 24
    y = Conv2d(wt, None, 1, 1, cfg=cfg)(x, threads=2)
    np.testing.assert_allclose(y, conv_ref(x, wt, None, (1, 1), (1, 1), (1, 1), 1),
                               rtol=1e-4, atol=1e-4)


def test_clip_and_one_shot_api():
    x = RNG.standard_normal((1, 3, 8, 8), dtype=np.float32)
    wt = RNG.standard_normal((4, 3, 3, 3), dtype=np.float32)
    y = conv2d(x, wt, padding=1, act="clip", clip=(0.0, 6.0))
    ref = np.clip(conv_ref(x, wt, None, (1, 1), (1, 1), (1, 1), 1), 0, 6)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    dw = RNG.standard_normal((3, 1, 3, 3), dtype=np.float32)
    y = conv2d(x, dw, groups=3, padding=1, act="clip", clip=(0.0, 6.0))
    ref = np.clip(conv_ref(x, dw, None, (1, 1), (1, 1), (1, 1), 3), 0, 6)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_errors():
    wt = np.zeros((4, 3, 3, 3), np.float32)
    conv = Conv2d(wt, padding=1)
    with pytest.raises(TypeError, match="Conv2d: x: expected dtype float32, got float64"):
        conv(np.zeros((1, 3, 8, 8)))
    with pytest.raises(ValueError, match=r"Conv2d: x has 2 channels \(shape \(1, 2, 8, 8\)\), "
                                         r"expected 3"):
        conv(np.zeros((1, 2, 8, 8), np.float32))
    with pytest.raises(ValueError, match=r"Conv2d: x: expected a 4-D array, got shape \(3, 8, 8\)"):
        conv(np.zeros((3, 8, 8), np.float32))
    with pytest.raises(ValueError, match="Conv2d: x: expected a C-contiguous array"):
        conv(np.zeros((1, 3, 8, 16), np.float32)[..., ::2])
    with pytest.raises(ValueError, match=r"Conv2d: out has shape \(1, 4, 7, 7\), expected "
                                         r"\(1, 4, 8, 8\)"):
        conv(np.zeros((1, 3, 8, 8), np.float32), out=np.zeros((1, 4, 7, 7), np.float32))
    with pytest.raises(ValueError, match="Conv2d: groups=3 must be a positive divisor of Cout=4"):
        Conv2d(np.zeros((4, 1, 3, 3), np.float32), groups=3)
    with pytest.raises(ValueError, match=r"Conv2d: bias has shape \(3,\), expected \(4,\)"):
        Conv2d(wt, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match=r"Conv2d: stride must be an int or a pair of ints, got "
                                        r"\(1, 2, 3\)"):
        Conv2d(wt, stride=(1, 2, 3))
    with pytest.raises(ValueError, match="smaller than the dilated kernel 3x3"):
        Conv2d(wt)(np.zeros((1, 3, 2, 2), np.float32))
