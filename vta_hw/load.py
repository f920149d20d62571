"""The load unit: LOAD of INP and WGT tiles, 2-D strided with zero padding (docs/timing.md §4).

The unit takes its command, pops ``g2l`` when ``pop_next`` is set, runs the instruction on a
:class:`~vtakit.vta_hw.dma.ReadDMA` (transfer, then one padding element per cycle) and pushes
``l2g`` for ``push_next`` at the finish cycle. ``x_size = 0`` is a one-cycle NOP.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import Out

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.control import command_member, unit_control
from vtakit.vta_hw.dma import IDX_BITS, ReadDMA, lanes_of
from vtakit.vta_hw.interfaces import MemClientSignature, TokenPopSignature, TokenPushSignature
from vtakit.vta_hw.isa import MemType
from vtakit.vta_hw.layouts import insn_layouts
from vtakit.vta_hw.timing_facts import LOAD_UNIT_MEMORY_TYPES, TOKEN_POPS, TOKEN_PUSHES

__all__ = ["Load", "LOAD_TARGETS"]

#: What fetch routes to this unit (docs/timing.md §3).
LOAD_TARGETS = LOAD_UNIT_MEMORY_TYPES


class Load(wiring.Component):
    """Executes the load queue.

    Parameters
    ----------
    cfg : HwConfig

    Attributes
    ----------
    cmd : In(CommandSignature)
        The load command queue (:func:`~vtakit.vta_hw.control.command_member`).
    g2l : Out(TokenPopSignature()), l2g : Out(TokenPushSignature())
        Token queues.
    mem : Out(MemClientSignature(cfg))
        The memory-port client (read).
    inp_w_*, wgt_w_* : write lanes of the INP and WGT buffers.
    idle, active : Out
        No instruction taken; the unit makes progress in this cycle
        (:class:`~vtakit.vta_hw.control.UnitControl`), for the core's deadlock detection.
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Load: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        arr = data.ArrayLayout
        ri, rw = lanes_of(cfg, MemType.INP), lanes_of(cfg, MemType.WGT)
        super().__init__({
            "cmd": command_member(cfg),
            "g2l": Out(TokenPopSignature()), "l2g": Out(TokenPushSignature()),
            "mem": Out(MemClientSignature(cfg)),
            "inp_w_en": Out(arr(1, ri)), "inp_w_addr": Out(IDX_BITS),
            "inp_w_data": Out(arr(cfg.inp_elem_bits, ri)),
            "wgt_w_en": Out(arr(1, rw)), "wgt_w_addr": Out(IDX_BITS),
            "wgt_w_data": Out(arr(cfg.wgt_elem_bits, rw)),
            "idle": Out(1), "active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        dma = m.submodules.dma = ReadDMA(cfg, LOAD_TARGETS)
        wiring.connect(m, wiring.flipped(self.mem), dma.mem)
        tokens = {"g2l": self.g2l, "l2g": self.l2g}
        fin = Signal()
        ctl = unit_control(m, "load", insn_layouts(cfg).mem, self.cmd,
                           [(flag, tokens[q]) for flag, q in TOKEN_POPS["load"]],
                           [(flag, tokens[q]) for flag, q in TOKEN_PUSHES["load"]], fin,
                           dma.finish_next)
        inp, wgt = dma.writes[MemType.INP], dma.writes[MemType.WGT]
        m.d.comb += [
            self.idle.eq(ctl.idle), self.active.eq(ctl.active), fin.eq(dma.finish),
            dma.start.eq(ctl.start), dma.insn.eq(ctl.cand.as_value()), dma.insn_reg.eq(ctl.insn),
            self.inp_w_en.eq(inp.en), self.inp_w_addr.eq(inp.addr), self.inp_w_data.eq(inp.data),
            self.wgt_w_en.eq(wgt.en), self.wgt_w_addr.eq(wgt.addr), self.wgt_w_data.eq(wgt.data),
        ]
        return m
