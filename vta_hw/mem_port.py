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
(``store.wr_beat``), data supplied by the store unit in the same cycle.

The clients' order is :data:`vtakit.vta_hw.timing_facts.PORT_PRIORITY`, the order the simulator
arbitrates by; every client is a :class:`~vtakit.vta_hw.interfaces.MemClientSignature`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.interfaces import ADDR_BITS, MemBusSignature, MemClientSignature
from vtakit.vta_hw.timing_facts import PORT_PRIORITY, READ_CLIENTS, WRITE_CLIENT

__all__ = ["MemPort", "READ_CLIENTS", "CLIENTS", "ADDR_BITS"]

#: The clients, highest priority first (:data:`vtakit.vta_hw.timing_facts.PORT_PRIORITY`).
CLIENTS = PORT_PRIORITY


class MemPort(wiring.Component):
    """Arbiter between the four clients and the burst memory interface of :class:`Core`.

    Parameters
    ----------
    cfg : HwConfig

    Attributes
    ----------
    fetch, compute, load : In(MemClientSignature(cfg))
        The reading clients.
    store : In(MemClientSignature(cfg, write=True))
        The writing client.
    bus : Out(MemBusSignature(cfg))
        The memory side.
    busy : Out(1)
        A burst holds the port beyond this cycle.
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"MemPort: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        super().__init__({
            "fetch": In(MemClientSignature(cfg)), "compute": In(MemClientSignature(cfg)),
            "load": In(MemClientSignature(cfg)), "store": In(MemClientSignature(cfg, write=True)),
            "bus": Out(MemBusSignature(cfg)), "busy": Out(1),
        })

    def clients(self) -> dict[str, wiring.PureInterface]:
        """The client interfaces by name, highest priority first."""
        named = {"fetch": self.fetch, "compute": self.compute, "load": self.load,
                 "store": self.store}
        return {c: named[c] for c in CLIENTS}

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        bus = self.bus
        clients = self.clients()
        # the structure below: the readers by priority, then the one writer, the store unit
        assert WRITE_CLIENT == "store" and CLIENTS[-1] == WRITE_CLIENT
        readers = [clients[c] for c in READ_CLIENTS]
        writer = clients[WRITE_CLIENT]
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
        for i, c in reversed(list(enumerate(readers))):
            with m.If(c.req):
                m.d.comb += [rd_any.eq(1), rd_idx.eq(i + 1), rd_beats.eq(c.beats),
                             rd_addr.eq(c.addr)]
        store = len(CLIENTS)
        g_idx = Signal(range(len(CLIENTS) + 1))  # 1 + the client granted now, 0: none
        with m.If(free):
            m.d.comb += g_idx.eq(Mux(rd_any, rd_idx, Mux(writer.req, store, 0)))
        for i, c in enumerate(clients.values()):
            m.d.comb += c.grant.eq(g_idx == i + 1)
        m.d.comb += [
            bus.rd_valid.eq(free & rd_any),
            bus.rd_addr.eq(rd_addr), bus.rd_beats.eq(rd_beats),
            bus.wr_valid.eq(g_idx == store),
            bus.wr_addr.eq(writer.addr), bus.wr_beats.eq(writer.beats),
        ]
        with m.If(g_idx != 0):
            m.d.sync += [left.eq(Mux(rd_any, rd_beats, writer.beats) - 1), owner.eq(g_idx)]
        with m.Elif(~free):
            m.d.sync += left.eq(left - 1)
        # who holds the port in this cycle (0: nobody)
        holder = Signal.like(owner)
        m.d.comb += holder.eq(Mux(free, g_idx, owner))
        writing = holder == store
        m.d.comb += [writer.wr_beat.eq(writing), bus.wr_data_valid.eq(writing),
                     bus.wr_data.eq(writer.wr_data), bus.wr_strb.eq(writer.wr_strb)]
        # read-data routing: the tag of port cycle c (1 + the reader holding the port, 0 for
        # none or the store) comes out at c + L
        taps = [Signal(range(len(READ_CLIENTS) + 1), name=f"tag{k}")
                for k in range(cfg.mem_read_latency_cycles)]
        m.d.sync += taps[0].eq(Mux(writing, 0, holder))
        for a, b in zip(taps, taps[1:]):
            m.d.sync += b.eq(a)
        for i, c in enumerate(readers):
            m.d.comb += [c.rd_data.eq(bus.rd_data),
                         c.rd_valid.eq(bus.rd_data_valid & (taps[-1] == i + 1))]
        return m
