"""Host-side layouts shared by the compiler and the runtime (driver/packing.py)."""

import numpy as np
import pytest

from vtakit.driver.packing import (
    im2col,
    pack_act,
    pack_conv_weights,
    pack_mat,
    unpack_act,
    unpack_mat,
)
from vtakit.vta_hw.config import preset


@pytest.mark.parametrize("name", ["default", "ecp5", "ice40"])
def test_pack_unpack_round_trip_with_padding(name):
    cfg = preset(name)
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (cfg.batch * 2, 5, 3, 4), dtype=np.int8)
    p = pack_act(x, cfg)
    assert p.shape[1] * cfg.block_in >= 5 and p.shape[-1] == cfg.block_in
    np.testing.assert_array_equal(unpack_act(p, 5), x)
    m = rng.integers(-128, 128, (cfg.batch * 3, 7), dtype=np.int8)
    np.testing.assert_array_equal(unpack_mat(pack_mat(m, cfg), 7), m)


@pytest.mark.parametrize("k, s, pads", [(3, 1, (1, 1, 1, 1)), (7, 2, (3, 3, 3, 3)),
                                         (2, 2, (0, 0, 0, 0)), (3, 2, (0, 1, 1, 0))])
def test_im2col_turns_a_convolution_into_a_1x1_one(k, s, pads):
    rng = np.random.default_rng(1)
    x = rng.integers(-20, 20, (1, 3, 9, 11), dtype=np.int64)
    w = rng.integers(-20, 20, (4, 3, k, k), dtype=np.int64)
    cols = im2col(x, k, k, s, s, *pads)
    got = np.einsum("nkhw,ok->nohw", cols, w.reshape(4, -1))
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh, ow = cols.shape[2:]
    want = np.zeros_like(got)
    for ky in range(k):
        for kx in range(k):
            patch = xp[:, :, ky:ky + s * (oh - 1) + 1:s, kx:kx + s * (ow - 1) + 1:s]
            want += np.einsum("nchw,oc->nohw", patch, w[:, :, ky, kx])
    np.testing.assert_array_equal(got, want)


def test_conv_weights_pad_both_channel_axes():
    cfg = preset("default")
    w = np.arange(3 * 5 * 2 * 2, dtype=np.int8).reshape(3, 5, 2, 2)
    p = pack_conv_weights(w, cfg)
    assert p.shape == (1, 1, 2, 2, 16, 16)
    np.testing.assert_array_equal(p[0, 0, :, :, :3, :5].transpose(2, 3, 0, 1), w)
    assert not p[0, 0, :, :, 3:].any() and not p[0, 0, :, :, :, 5:].any()
