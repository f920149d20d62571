"""Tilings of the accelerator's layers: what fits the on-chip buffers and the instruction
fields, and an analytic estimate of the cycles of each (the search scores candidates with it, and
`tune` with the simulator's timing layer).

A convolution tile is ``tob`` output-channel blocks x ``toh`` output rows x ``tow`` output
columns of one batch block; its input channels arrive in chunks of ``tib`` blocks. With
``threads = 2`` each SRAM is split in two halves and chunk/tile ``k`` uses half ``k % 2``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig

from .layers import ConvLayer, Layer, PoolLayer

__all__ = ["ConvSchedule", "RowSchedule", "ConvGeometry", "conv_geometry", "conv_fits",
           "conv_candidates", "estimate_conv", "choose_conv", "choose_rows", "NoSchedule"]


class NoSchedule(ValueError):
    """No tiling of a layer fits the configuration's buffers."""


@dataclass(frozen=True)
class ConvSchedule:
    toh: int
    tow: int
    tob: int
    tib: int
    threads: int = 2

    def to_json(self) -> dict[str, int]:
        return {"toh": self.toh, "tow": self.tow, "tob": self.tob, "tib": self.tib,
                "threads": self.threads}


@dataclass(frozen=True)
class RowSchedule:
    """Pooling and adds: ``toh x tow`` output elements of one channel block per tile."""

    toh: int
    tow: int
    threads: int = 2

    def to_json(self) -> dict[str, int]:
        return {"toh": self.toh, "tow": self.tow, "threads": self.threads}


@dataclass(frozen=True)
class ConvGeometry:
    nb: int  # batch blocks
    ib: int  # input-channel blocks
    ob: int  # output-channel blocks
    h: int
    w: int
    oh: int
    ow: int


def conv_geometry(L: ConvLayer, cfg: HwConfig) -> ConvGeometry:
    x, o = L.inputs[0], L.out
    return ConvGeometry(x.n // cfg.batch, -(-x.c // cfg.block_in), -(-o.c // cfg.block_out),
                        x.h, x.w, o.h, o.w)


def _limits(cfg: HwConfig) -> tuple[int, int]:
    lay = isa.layouts(cfg)
    return lay.gemm["iter_in"].max, lay.gemm["src_factor_out"].max


def conv_fits(L: ConvLayer, s: ConvSchedule, table_rows: int, cfg: HwConfig) -> bool:
    """Whether tiling `s` fits the buffers (one half each with two threads), the micro-op
    buffer and the instruction fields."""
    kh, kw = L.kernel
    sh, sw = L.strides
    in_rows, in_cols = (s.toh - 1) * sh + kh, (s.tow - 1) * sw + kw
    t = s.threads
    iter_max, factor_max = _limits(cfg)
    g = conv_geometry(L, cfg)
    return (s.tib * in_rows * in_cols <= cfg.inp_depth // t
            and s.tob * s.tib * kh * kw <= cfg.wgt_depth // t
            and s.tob * (s.toh * s.tow + table_rows) <= cfg.acc_depth // t
            and s.tob * s.tib * kh * kw <= cfg.uop_depth // 4
            and s.tob * s.toh <= iter_max and s.tow <= iter_max
            and sh * in_cols <= factor_max and s.tow <= factor_max
            and g.w <= 0xFFFF and g.ow <= 0xFFFF and g.ib * kh * kw <= 0xFFFF
            and t <= cfg.dep_queue_depth)


def _sizes(n: int) -> list[int]:
    """Tile sizes worth trying for an extent n: its divisors and the powers of two below it."""
    out = {d for d in range(1, n + 1) if n % d == 0}
    out |= {1 << k for k in range(n.bit_length()) if 1 << k <= n}
    return sorted(out)


def conv_candidates(L: ConvLayer, table_rows: int, cfg: HwConfig) -> list[ConvSchedule]:
    """Every tiling of the search space that fits (see `conv_fits`)."""
    g = conv_geometry(L, cfg)
    out = []
    for t, tob, tib, toh, tow in itertools.product((2, 1), _sizes(g.ob), _sizes(g.ib),
                                                   _sizes(g.oh), _sizes(g.ow)):
        s = ConvSchedule(toh, tow, tob, tib, t)
        if conv_fits(L, s, table_rows, cfg):
            out.append(s)
    return out


def estimate_conv(L: ConvLayer, s: ConvSchedule, steps: int, table_rows: int,
                  cfg: HwConfig) -> float:
    """Cycles, analytically: per chunk the GEMM's micro-op iterations and the load's bus beats
    (overlapped with two threads, added with one), per tile the requantisation, the store and a
    fixed cost per instruction."""
    g = conv_geometry(L, cfg)
    kh, kw = L.kernel
    sh, sw = L.strides
    latency = cfg.mem_read_latency_cycles
    total = 0.0
    for tb, th, tw in itertools.product(_parts(g.ob, s.tob), _parts(g.oh, s.toh),
                                        _parts(g.ow, s.tow)):
        in_rows, in_cols = (th - 1) * sh + kh, (tw - 1) * sw + kw
        tile = 0.0
        for ti in _parts(g.ib, s.tib):
            gemm = tb * ti * kh * kw * th * tw + 5
            beats = (ti * in_rows * in_cols * cfg.inp_elem_bytes
                     + tb * ti * kh * kw * cfg.wgt_elem_bytes) / cfg.bus_bytes
            load = beats + (ti + 1) * (latency + 4)
            tile += max(gemm, load) if s.threads == 2 else gemm + load
        n = tb * th * tw
        tile += steps * (2 * n + 5) + table_rows * tb * cfg.acc_elem_bytes / cfg.bus_bytes
        tile += n * cfg.out_elem_bytes / cfg.bus_bytes + th * tb * 2 + latency
        total += tile
    return total * g.nb


def _parts(n: int, t: int) -> list[int]:
    return [min(t, n - k) for k in range(0, n, t)]


def choose_conv(L: ConvLayer, steps: int, table_rows: int, cfg: HwConfig) -> ConvSchedule:
    """The candidate with the lowest analytic estimate; `NoSchedule` if none fits."""
    cands = conv_candidates(L, table_rows, cfg)
    if not cands:
        raise NoSchedule(f"layer {L.name!r}: no tiling of its {L.kernel[0]}x{L.kernel[1]} "
                         f"convolution fits the buffers of {cfg.bitstream_name}")
    return min(cands, key=lambda s: (estimate_conv(L, s, steps, table_rows, cfg), -s.threads))


def choose_rows(L: Layer, table_rows: int, cfg: HwConfig) -> RowSchedule:
    """Pooling / add tiles: the most output rows (then columns) whose ACC use fits a half."""
    o = L.out
    iter_max, factor_max = _limits(cfg)
    for threads in (2, 1):
        half = cfg.acc_depth // threads
        for tow in sorted(_sizes(o.w), reverse=True):
            for toh in sorted(_sizes(o.h), reverse=True):
                if isinstance(L, PoolLayer):
                    (kh, kw), (sh, sw) = L.kernel, L.strides
                    in_rows, in_cols = (toh - 1) * sh + kh, (tow - 1) * sw + kw
                    use = toh * tow + in_rows * in_cols
                    ok = sh * in_cols <= factor_max
                else:
                    use, ok = 2 * toh * tow + table_rows, True
                if ok and use <= half and toh <= iter_max and tow <= min(iter_max, factor_max):
                    return RowSchedule(toh, tow, threads)
    raise NoSchedule(f"layer {L.name!r}: not even one output row fits ACC of "
                     f"{cfg.bitstream_name}")
