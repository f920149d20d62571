"""The load unit: LOAD of INP and WGT tiles, 2-D strided with zero padding (docs/timing.md §4).

The unit takes its command, pops ``g2l`` when ``pop_next`` is set, runs the instruction on a
:class:`~vtakit.vta_hw.dma.ReadDMA` (transfer, then one padding element per cycle) and pushes
``l2g`` for ``push_next`` at the finish cycle. ``x_size = 0`` is a one-cycle NOP.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.control import cmd_lookahead, cmd_members, unit_control
from vtakit.vta_hw.dma import ADDR_BITS, IDX_BITS, ReadDMA, lanes_of
from vtakit.vta_hw.isa import MemType
from vtakit.vta_hw.layouts import insn_layouts

__all__ = ["Load", "LOAD_TARGETS"]

LOAD_TARGETS = (MemType.INP, MemType.WGT)


class Load(wiring.Component):
    """Executes the load queue.

    Parameters
    ----------
    cfg : HwConfig

    Attributes
    ----------
    cmd_valid, cmd_data, cmd_take : the load command queue's head.
    cmd_w_en, cmd_w_data : with a one-entry queue, its write port (``cmd_members``).
    g2l_avail, g2l_pop, l2g_can_push, l2g_push : token queues.
    req, addr, beats, grant, rd_valid, rd_data : memory-port client (read).
    inp_w_*, wgt_w_* : write lanes of the INP and WGT buffers.
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Load: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        arr = data.ArrayLayout
        ri, rw = lanes_of(cfg, MemType.INP), lanes_of(cfg, MemType.WGT)
        super().__init__({
            **cmd_members(cfg),
            "g2l_avail": In(1), "g2l_pop": Out(1), "l2g_can_push": In(1), "l2g_push": Out(1),
            "req": Out(1), "addr": Out(ADDR_BITS),
            "beats": Out(range(1, cfg.mem_max_burst_beats + 1)),
            "grant": In(1), "rd_valid": In(1), "rd_data": In(cfg.bus_width_bits),
            "inp_w_en": Out(arr(1, ri)), "inp_w_addr": Out(IDX_BITS),
            "inp_w_data": Out(arr(cfg.inp_elem_bits, ri)),
            "wgt_w_en": Out(arr(1, rw)), "wgt_w_addr": Out(IDX_BITS),
            "wgt_w_data": Out(arr(cfg.wgt_elem_bits, rw)),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        dma = m.submodules.dma = ReadDMA(cfg, LOAD_TARGETS)
        fin = Signal()
        ctl = unit_control(m, "load", insn_layouts(cfg).mem, self.cmd_valid, self.cmd_data,
                           self.cmd_take, [("pop_next", self.g2l_avail, self.g2l_pop)],
                           [("push_next", self.l2g_can_push, self.l2g_push)], fin,
                           **cmd_lookahead(self, dma.finish_next))
        m.d.comb += [
            self.idle.eq(ctl.idle), fin.eq(dma.finish),
            dma.start.eq(ctl.start), dma.insn.eq(ctl.cand.as_value()),
            self.req.eq(dma.req), self.addr.eq(dma.addr), self.beats.eq(dma.beats),
            dma.grant.eq(self.grant), dma.rd_valid.eq(self.rd_valid),
            dma.rd_data.eq(self.rd_data),
            self.inp_w_en.eq(dma.w0_en), self.inp_w_addr.eq(dma.w0_addr),
            self.inp_w_data.eq(dma.w0_data),
            self.wgt_w_en.eq(dma.w1_en), self.wgt_w_addr.eq(dma.w1_addr),
            self.wgt_w_data.eq(dma.w1_data),
        ]
        return m
