"""On-chip buffers: element-addressed SRAMs built from block RAMs with registered read ports.

A buffer written or read several elements per cycle (a bus beat holding more than one element,
docs/timing.md §2) is split into ``banks`` interleaved block RAMs: element ``i`` lives in bank
``i % banks`` at row ``i // banks``. Each *lane* of a write or read port carries one element
with its own index; the lanes of one port must fall into distinct banks in every cycle (they
do: a beat's elements are consecutive indices). Read data appears the cycle after the index.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["BankedMemory"]


def _log2(n: int) -> int:
    return n.bit_length() - 1


class BankedMemory(wiring.Component):
    """``depth`` elements of ``width_bits``, in ``banks`` block RAMs.

    Parameters
    ----------
    width_bits : int
        Bits of one element.
    depth : int
        Elements (a power of two, at least ``banks``).
    banks : int
        Interleaved block RAMs (a power of two).
    w_lanes, r_lanes : int
        Elements written / read per cycle (at most ``banks``).

    Attributes
    ----------
    w_en, w_addr, w_data : In
        One entry per write lane.
    r_addr : In
        One element index per read lane (read every cycle).
    r_data : Out
        The elements indexed in the previous cycle.
    """

    def __init__(self, width_bits: int, depth: int, banks: int = 1, w_lanes: int = 1,
                 r_lanes: int = 1):
        for name, v in (("width_bits", width_bits), ("depth", depth), ("banks", banks),
                        ("w_lanes", w_lanes), ("r_lanes", r_lanes)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"BankedMemory: {name} must be an int, got {v!r}")
            if v < 1:
                raise ValueError(f"BankedMemory: {name}={v} must be at least 1")
        for name, v in (("depth", depth), ("banks", banks)):
            if v & (v - 1):
                raise ValueError(f"BankedMemory: {name}={v} must be a power of two")
        if depth < banks:
            raise ValueError(f"BankedMemory: depth={depth} must be at least banks={banks}")
        if w_lanes > banks or r_lanes > banks:
            raise ValueError(f"BankedMemory: w_lanes={w_lanes} and r_lanes={r_lanes} must not "
                             f"exceed banks={banks}")
        self.width_bits, self.depth, self.banks = width_bits, depth, banks
        self.w_lanes, self.r_lanes = w_lanes, r_lanes
        aw = max(1, _log2(depth))
        self.addr_bits = aw
        super().__init__({
            "w_en": In(data.ArrayLayout(1, w_lanes)),
            "w_addr": In(data.ArrayLayout(unsigned(aw), w_lanes)),
            "w_data": In(data.ArrayLayout(unsigned(width_bits), w_lanes)),
            "r_addr": In(data.ArrayLayout(unsigned(aw), r_lanes)),
            "r_data": Out(data.ArrayLayout(unsigned(width_bits), r_lanes)),
        })

    def elaborate(self, platform):
        m = Module()
        nb, lb = self.banks, _log2(self.banks)
        bank_depth = self.depth // nb
        rd_ports = []
        for b in range(nb):
            mem = memory.Memory(shape=unsigned(self.width_bits), depth=bank_depth, init=[])
            m.submodules[f"bank{b}"] = mem
            wp = mem.write_port()
            rp = mem.read_port()
            rd_ports.append(rp)
            # the write lane (if any) whose element falls into this bank
            for lane in range(self.w_lanes):
                hit = self.w_en[lane] if nb == 1 else \
                    self.w_en[lane] & (self.w_addr[lane][:lb] == b)
                with m.If(hit):
                    m.d.comb += [wp.en.eq(1), wp.addr.eq(self.w_addr[lane][lb:]),
                                 wp.data.eq(self.w_data[lane])]
            for lane in range(self.r_lanes):
                if nb == 1:
                    m.d.comb += rp.addr.eq(self.r_addr[lane][lb:])
                else:
                    with m.If(self.r_addr[lane][:lb] == b):
                        m.d.comb += rp.addr.eq(self.r_addr[lane][lb:])
        for lane in range(self.r_lanes):
            if nb == 1:
                m.d.comb += self.r_data[lane].eq(rd_ports[0].data)
            else:
                sel = Signal(lb, name=f"r_bank{lane}")
                m.d.sync += sel.eq(self.r_addr[lane][:lb])
                out = rd_ports[0].data
                for b in range(1, nb):
                    out = Mux(sel == b, rd_ports[b].data, out)
                m.d.comb += self.r_data[lane].eq(out)
        return m
