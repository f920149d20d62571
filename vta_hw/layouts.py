"""Amaranth views of the instruction formats, derived from :func:`vtakit.vta_hw.isa.layouts`.

``isa.py`` stays free of Amaranth; this module turns each of its ``Layout`` tables into a
``data.FlexibleLayout`` with every field at the bit position ``isa.py`` gives it, so the hardware
never copies a width or an offset by hand. Example::

    lay = insn_layouts(cfg)
    insn = Signal(isa.INSN_WIDTH_BITS)
    mem = data.View(lay.mem, insn)     # mem.x_size, mem.dram_base, ...
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from amaranth.hdl import signed, unsigned
from amaranth.lib import data

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig

__all__ = ["HwLayouts", "insn_layouts", "to_layout"]


def to_layout(lay: isa.Layout) -> data.FlexibleLayout:
    """A ``FlexibleLayout`` of ``lay.width_bits`` bits with the fields of ``lay``."""
    return data.FlexibleLayout(lay.width_bits, {
        f.name: data.Field(signed(f.width) if f.signed else unsigned(f.width), f.lsb)
        for f in lay.fields})


@dataclass(frozen=True)
class HwLayouts:
    """The Amaranth layouts of one configuration (``mem``, ``gemm``, ``alu``, ``finish``,
    ``uop``) plus the :class:`isa.IsaLayouts` they come from (``isa``)."""

    isa: isa.IsaLayouts
    mem: data.FlexibleLayout
    gemm: data.FlexibleLayout
    alu: data.FlexibleLayout
    finish: data.FlexibleLayout
    uop: data.FlexibleLayout


@functools.lru_cache(maxsize=32)
def insn_layouts(cfg: HwConfig) -> HwLayouts:
    if not isinstance(cfg, HwConfig):
        raise TypeError(f"insn_layouts: cfg must be an HwConfig, got {type(cfg).__name__}")
    il = isa.layouts(cfg)
    return HwLayouts(isa=il, mem=to_layout(il.mem), gemm=to_layout(il.gemm),
                     alu=to_layout(il.alu), finish=to_layout(il.finish), uop=to_layout(il.uop))
