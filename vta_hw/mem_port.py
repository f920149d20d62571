"""The shared memory port: one burst at a time, fixed priority (docs/timing.md §2).

Clients, highest priority first: fetch, compute, load (reads) and store (writes). A client
holds ``req`` high with the address and length of its next burst whenever it has one; at every
cycle where the port is free the port grants the highest-priority request (``grant`` high for
that client in that cycle, and the request appears on the memory side in the same cycle). A
burst of ``k`` beats holds the port for ``k`` cycles. Since every client re-requests after each
burst, a higher-priority client takes over at the next burst boundary: the preemption rule of
timing.md falls out of per-burst arbitration.

Read data beats come back ``L`` cycles after the port cycle that requested them; a delay line
of ``L`` owner tags (which client held the port for a read in that cycle) routes each returning
beat to its client. Write beats are sent in the cycles the port is held by the store client
(``store_wr_beat``), data supplied by the store unit in the same cycle.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig

__all__ = ["MemPort", "READ_CLIENTS", "CLIENTS", "ADDR_BITS"]

ADDR_BITS = 32  # DRAM byte addresses

READ_CLIENTS = ("fetch", "compute", "load")
CLIENTS = READ_CLIENTS + ("store",)


def client_members(cfg: HwConfig) -> dict:
    m = cfg.mem_max_burst_beats
    return {"req": Out(1), "addr": Out(ADDR_BITS), "beats": Out(range(1, m + 1)),
            "grant": In(1)}


class MemPort(wiring.Component):
    """Arbiter between the four clients and the burst memory interface of :class:`Core`.

    Parameters
    ----------
    cfg : HwConfig
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"MemPort: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        mb, bus = cfg.mem_max_burst_beats, cfg.bus_width_bits
        members = {}
        for c in CLIENTS:
            members[f"{c}_req"] = In(1)
            members[f"{c}_addr"] = In(ADDR_BITS)
            members[f"{c}_beats"] = In(range(1, mb + 1))
            members[f"{c}_grant"] = Out(1)
        for c in READ_CLIENTS:
            members[f"{c}_rd_valid"] = Out(1)
        members.update({
            "rd_data": Out(bus),
            "store_wr_beat": Out(1), "store_wr_data": In(bus), "store_wr_strb": In(bus // 8),
            "mem_rd_valid": Out(1), "mem_rd_addr": Out(ADDR_BITS),
            "mem_rd_beats": Out(range(1, mb + 1)),
            "mem_rd_data_valid": In(1), "mem_rd_data": In(bus),
            "mem_wr_valid": Out(1), "mem_wr_addr": Out(ADDR_BITS),
            "mem_wr_beats": Out(range(1, mb + 1)),
            "mem_wr_data_valid": Out(1), "mem_wr_data": Out(bus), "mem_wr_strb": Out(bus // 8),
            "busy": Out(1),
        })
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        left = Signal(range(cfg.mem_max_burst_beats))  # port cycles still held after this one
        owner = Signal(range(len(CLIENTS) + 1))  # 1 + client index of the burst in progress
        free = left == 0
        m.d.comb += self.busy.eq(~free)
        # the read request of the highest-priority reader (the last assignment wins); the
        # write address and length come straight from the store unit
        rd_any = Signal()
        rd_idx = Signal(range(len(CLIENTS) + 1))
        rd_beats = Signal(range(1, cfg.mem_max_burst_beats + 1))
        rd_addr = Signal(ADDR_BITS)
        for i, c in reversed(list(enumerate(READ_CLIENTS))):
            with m.If(getattr(self, f"{c}_req")):
                m.d.comb += [rd_any.eq(1), rd_idx.eq(i + 1),
                             rd_beats.eq(getattr(self, f"{c}_beats")),
                             rd_addr.eq(getattr(self, f"{c}_addr"))]
        store = len(CLIENTS)
        g_idx = Signal(range(len(CLIENTS) + 1))  # 1 + the client granted now, 0: none
        with m.If(free):
            m.d.comb += g_idx.eq(Mux(rd_any, rd_idx, Mux(self.store_req, store, 0)))
        for i, c in enumerate(CLIENTS):
            m.d.comb += getattr(self, f"{c}_grant").eq(g_idx == i + 1)
        m.d.comb += [
            self.mem_rd_valid.eq(free & rd_any),
            self.mem_rd_addr.eq(rd_addr), self.mem_rd_beats.eq(rd_beats),
            self.mem_wr_valid.eq(g_idx == store),
            self.mem_wr_addr.eq(self.store_addr), self.mem_wr_beats.eq(self.store_beats),
        ]
        with m.If(g_idx != 0):
            m.d.sync += [left.eq(Mux(rd_any, rd_beats, self.store_beats) - 1), owner.eq(g_idx)]
        with m.Elif(~free):
            m.d.sync += left.eq(left - 1)
        # who holds the port in this cycle (0: nobody)
        holder = Signal.like(owner)
        m.d.comb += holder.eq(Mux(free, g_idx, owner))
        writing = holder == store
        m.d.comb += [self.store_wr_beat.eq(writing), self.mem_wr_data_valid.eq(writing),
                     self.mem_wr_data.eq(self.store_wr_data),
                     self.mem_wr_strb.eq(self.store_wr_strb)]
        # read-data routing: the tag of port cycle c (1 + the reader holding the port, 0 for
        # none or the store) comes out at c + L
        taps = [Signal(range(len(READ_CLIENTS) + 1), name=f"tag{k}")
                for k in range(cfg.mem_read_latency_cycles)]
        m.d.sync += taps[0].eq(Mux(writing, 0, holder))
        for a, b in zip(taps, taps[1:]):
            m.d.sync += b.eq(a)
        m.d.comb += self.rd_data.eq(self.mem_rd_data)
        for i, c in enumerate(READ_CLIENTS):
            m.d.comb += getattr(self, f"{c}_rd_valid").eq(self.mem_rd_data_valid
                                                          & (taps[-1] == i + 1))
        return m
