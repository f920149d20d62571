"""Host-side layout transforms between numpy tensors and the accelerator's packed layouts, with
the channel and batch padding that the compiler's accelerator backend and the runtime share.

Packed activations (VTA's NCHW{b}n{c}c): ``(N/B, Cp/BI, H, W, B, BI)`` int8, where ``Cp`` is
``C`` rounded up to the block (padding channels are zero) and ``N`` a multiple of the batch
``B``. A matrix ``(M, K)`` is the activation of a 1x1 convolution over an ``(M/B) x 1`` image:
row ``r`` is image row ``r // B``, batch lane ``r % B``. Packed weights (OIHW{o}o{i}i):
``(Op/BO, Ip/BI, KH, KW, BO, BI)``.
"""

from __future__ import annotations

import numpy as np

from vtakit.vta_hw.config import HwConfig

__all__ = ["round_up", "pack_act", "unpack_act", "pack_mat", "unpack_mat", "pack_conv_weights",
           "act_shape", "im2col", "frame_act", "unframe_act"]


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def act_shape(cfg: HwConfig, n: int, c: int, h: int, w: int) -> tuple[int, ...]:
    """The packed shape of an (n, c, h, w) activation (n a multiple of the batch)."""
    return (n // cfg.batch, round_up(c, cfg.block_in) // cfg.block_in, h, w, cfg.batch,
            cfg.block_in)


def pack_act(x: np.ndarray, cfg: HwConfig, out: np.ndarray | None = None) -> np.ndarray:
    """(N, C, H, W) -> (N/B, Cp/BI, H, W, B, BI), zero channels appended."""
    n, c, h, w = x.shape
    b, bi = cfg.batch, cfg.block_in
    if n % b:
        raise ValueError(f"pack_act: batch {n} is not a multiple of the core's batch {b}")
    cp = round_up(c, bi)
    if cp != c:
        x = np.concatenate([x, np.zeros((n, cp - c, h, w), x.dtype)], axis=1)
    packed = x.reshape(n // b, b, cp // bi, bi, h, w).transpose(0, 2, 4, 5, 1, 3)
    if out is None:
        return np.ascontiguousarray(packed)
    out[...] = packed
    return out


def unpack_act(y: np.ndarray, c: int, out: np.ndarray | None = None) -> np.ndarray:
    """(N/B, Cp/BI, H, W, B, BI) -> (N, c, H, W): the first ``c`` channels."""
    nb, cb, h, w, b, bi = y.shape
    full = y.transpose(0, 4, 1, 5, 2, 3).reshape(nb * b, cb * bi, h, w)[:, :c]
    if out is None:
        return np.ascontiguousarray(full)
    out[...] = full
    return out


def frame_act(packed: np.ndarray, frame: int, fill: int) -> np.ndarray:
    """A packed activation (N/B, C/BI, H, W, B, BI) inside a border of ``frame`` elements
    holding ``fill``: (N/B, C/BI, H + 2 frame, W + 2 frame, B, BI)."""
    if not frame:
        return packed
    f = frame
    nb, cb, h, w, b, bi = packed.shape
    out = np.full((nb, cb, h + 2 * f, w + 2 * f, b, bi), fill, packed.dtype)
    out[:, :, f:f + h, f:f + w] = packed
    return out


def unframe_act(framed: np.ndarray, frame: int) -> np.ndarray:
    """The packed activation inside a frame of ``frame`` elements (a view)."""
    if not frame:
        return framed
    return framed[:, :, frame:framed.shape[2] - frame, frame:framed.shape[3] - frame]


def pack_mat(a: np.ndarray, cfg: HwConfig, out: np.ndarray | None = None) -> np.ndarray:
    """(M, K) -> the packed activation of an (M/B) x 1 image with K channels."""
    m, k = a.shape
    b = cfg.batch
    if m % b:
        raise ValueError(f"pack_mat: {m} rows are not a multiple of the core's batch {b}")
    return pack_act(a.reshape(m // b, b, k).transpose(1, 2, 0)[:, :, :, None], cfg, out)


def unpack_mat(y: np.ndarray, k: int, out: np.ndarray | None = None) -> np.ndarray:
    """The packed activation of an (M/B) x 1 image -> (M, k)."""
    nchw = unpack_act(y, k)  # (B, k, M/B, 1)
    b, _, mb, _ = nchw.shape
    full = nchw[:, :, :, 0].transpose(2, 0, 1).reshape(mb * b, k)
    if out is None:
        return np.ascontiguousarray(full)
    out[...] = full
    return out


def pack_conv_weights(wt: np.ndarray, cfg: HwConfig) -> np.ndarray:
    """(O, I, KH, KW) -> (Op/BO, Ip/BI, KH, KW, BO, BI), zero rows and columns appended."""
    o, i, kh, kw = wt.shape
    bo, bi = cfg.block_out, cfg.block_in
    op, ip = round_up(o, bo), round_up(i, bi)
    full = np.zeros((op, ip, kh, kw), wt.dtype)
    full[:o, :i] = wt
    return np.ascontiguousarray(
        full.reshape(op // bo, bo, ip // bi, bi, kh, kw).transpose(0, 2, 4, 5, 1, 3))


def im2col(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int, pl: int, pb: int,
           pr: int, fill: int = 0) -> np.ndarray:
    """(N, C, H, W) -> (N, C*KH*KW, OH, OW): channel ``(c*KH + ky)*KW + kx`` of output pixel
    (oy, ox) is input (c, oy*sh + ky - pt, ox*sw + kx - pl), zero outside: a KHxKW convolution
    of `x` is a 1x1 convolution of the result with the weights reshaped to (O, C*KH*KW)."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    cols = np.empty((n, c, kh, kw, oh, ow), x.dtype)
    for ky in range(kh):
        for kx in range(kw):
            rows = slice(ky, ky + sh * (oh - 1) + 1, sh)
            cols[:, :, ky, kx] = xp[:, :, rows, kx:kx + sw * (ow - 1) + 1:sw]
    return cols.reshape(n, c * kh * kw, oh, ow)
