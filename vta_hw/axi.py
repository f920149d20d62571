"""An AXI4 master adapter for :class:`~vtakit.vta_hw.top.Core`'s burst memory port (Zynq-class
systems: connect the AXI side to an HP/ACP slave port).

The core's port (docs/hardware.md) has no back-pressure: a read burst of ``k`` beats granted at
cycle ``g`` expects its data at ``g + L .. g + L + k - 1`` (``L = cfg.mem_read_latency_cycles``),
and a write burst sends its beats at ``g .. g + k - 1`` (posted). An AXI slave has no fixed
latency, so the adapter

* queues read requests for the AR channel (one AXI burst per core burst: ``INCR``, full bus
  width, ``arlen = k - 1``; core bursts never cross an ``M*W``-byte window, so they never cross
  a 4 KiB boundary) and buffers R beats in a FIFO of ``L + M`` beats, releasing each one in the
  cycle the core expects it (a delay line of the port's read cycles, like the core's own
  routing tags): data that arrives early waits, so **any slave whose read latency, including
  back-pressure on AR, stays within ``L`` cycles gives exactly the cycle counts of
  docs/timing.md**;
* queues write requests (``queue_depth``) and data (``4 * M`` beats) for AW and W
  (``wlast`` on each burst's last beat), and counts B responses and last R beats. AXI does not
  order reads against writes, so when ``ordered`` is set (the default) the adapter keeps the
  core's order: a read's AR waits until every write the core issued before it has its B
  response, and a write's AW waits until every earlier read has its last R beat. The wait
  counts against the read-latency budget ``L``.

It cannot stall the core (the core has no stall input), so it checks the fixed-latency
assumption at run time instead: ``error`` goes high and stays high (until ``clear``) when a read
beat is due and has not arrived (``error_cause`` bit 0, ``LATE``), when a request or write-data
queue overflows (bit 1, ``OVERFLOW``), or when a slave answers SLVERR/DECERR (bit 2, ``RESP``).
After an error the run's data and cycle count are not to be trusted; on a working system the
cycle counts differ from vta_sim's only if the memory is slower than the model. Use a larger
``mem_read_latency_cycles`` in the configuration for a slower memory.

When the core is reset in the middle of a run (``abort``, a one-cycle pulse in the cycle of the
core's reset), the AXI side must still finish what the core started: the adapter drops every
read beat the core requested and has not received (including beats of requests still waiting
for AR, and beats that arrived too late after a LATE error, which would otherwise reach the
next run), and completes a write burst the reset cut short with beats of ``wstrb = 0`` (they
write nothing). A beat due to the next run while the dropped ones have not all arrived yet is
LATE.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig

__all__ = ["AxiMaster", "AXI_ERR_LATE", "AXI_ERR_OVERFLOW", "AXI_ERR_RESP"]

AXI_ERR_LATE = 1 << 0
AXI_ERR_OVERFLOW = 1 << 1
AXI_ERR_RESP = 1 << 2

_BURST_INCR = 0b01
_CACHE = 0b0011  # normal, non-cacheable, bufferable (what Zynq HP ports expect)


def _log2(n: int) -> int:
    return n.bit_length() - 1


class AxiMaster(wiring.Component):
    """Core burst port (``mem_*``, the core's names) → AXI4 master (``ar*``, ``r*``, ``aw*``,
    ``w*``, ``b*``, AXI's names; one ID, ``*id`` not used).

    Parameters
    ----------
    cfg : HwConfig
        Bus width, ``L`` and ``M``.
    queue_depth : int
        Read and write requests that may wait for ``arready`` / ``awready``.
    ordered : bool
        Keep the core's order between reads and writes (see the module docstring).

    Attributes
    ----------
    mem_rd_valid, mem_rd_addr, mem_rd_beats, mem_wr_valid, mem_wr_addr, mem_wr_beats,
    mem_wr_data_valid, mem_wr_data, mem_wr_strb : In
        From the core's ports of the same name.
    mem_rd_data_valid, mem_rd_data : Out
        To the core.
    error : Out
        Sticky: the fixed-latency contract was broken or the slave reported an error.
    error_cause : Out(3)
        Sticky ``AXI_ERR_LATE | AXI_ERR_OVERFLOW | AXI_ERR_RESP`` bits.
    clear : In
        Clears ``error`` and ``error_cause``.
    abort : In
        The core is being reset in this cycle: drop its outstanding read beats and finish its
        write burst with empty beats (see the module docstring).
    """

    def __init__(self, cfg: HwConfig, queue_depth: int = 8, ordered: bool = True):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"AxiMaster: cfg must be an HwConfig, got {type(cfg).__name__}")
        if not isinstance(queue_depth, int) or isinstance(queue_depth, bool) or queue_depth < 1:
            raise ValueError(f"AxiMaster: queue_depth={queue_depth!r} must be an int >= 1")
        cfg.validate()
        mb, bus = cfg.mem_max_burst_beats, cfg.bus_width_bits
        if mb * cfg.bus_bytes > 4096:
            raise ValueError(f"AxiMaster: bursts of mem_max_burst_beats={mb} beats of "
                             f"{cfg.bus_bytes} bytes may cross a 4 KiB boundary (AXI4 forbids "
                             f"it); expected mem_max_burst_beats * bus_bytes <= 4096")
        if bus > 1024:
            raise ValueError(f"AxiMaster: a {bus}-bit bus is wider than AXI4 allows "
                             f"(expected at most 1024 bits)")
        self.cfg, self.queue_depth = cfg, queue_depth
        self.ordered = bool(ordered)
        beats = range(1, mb + 1)
        super().__init__({
            "mem_rd_valid": In(1), "mem_rd_addr": In(32), "mem_rd_beats": In(beats),
            "mem_rd_data_valid": Out(1), "mem_rd_data": Out(bus),
            "mem_wr_valid": In(1), "mem_wr_addr": In(32), "mem_wr_beats": In(beats),
            "mem_wr_data_valid": In(1), "mem_wr_data": In(bus), "mem_wr_strb": In(bus // 8),
            "araddr": Out(32), "arlen": Out(8), "arsize": Out(3), "arburst": Out(2),
            "arcache": Out(4), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
            "rdata": In(bus), "rresp": In(2), "rlast": In(1), "rvalid": In(1), "rready": Out(1),
            "awaddr": Out(32), "awlen": Out(8), "awsize": Out(3), "awburst": Out(2),
            "awcache": Out(4), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(bus), "wstrb": Out(bus // 8), "wlast": Out(1), "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "error": Out(1), "error_cause": Out(3), "clear": In(1),
            "abort": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        L, M, bus = cfg.mem_read_latency_cycles, cfg.mem_max_burst_beats, cfg.bus_width_bits
        # snap: the other direction's requests issued before this one (16-bit wrap-around count)
        req = data.StructLayout({"addr": 32, "len": 8, "snap": 16})
        size = _log2(cfg.bus_bytes)
        m.d.comb += [self.arsize.eq(size), self.arburst.eq(_BURST_INCR),
                     self.arcache.eq(_CACHE), self.arprot.eq(0),
                     self.awsize.eq(size), self.awburst.eq(_BURST_INCR),
                     self.awcache.eq(_CACHE), self.awprot.eq(0)]
        late, overflow, resp = Signal(), Signal(), Signal()
        rd_issued, wr_issued, r_done, b_done = (Signal(16, name=n) for n in
                                                ("rd_issued", "wr_issued", "r_done", "b_done"))
        m.d.sync += [rd_issued.eq(rd_issued + self.mem_rd_valid),
                     wr_issued.eq(wr_issued + self.mem_wr_valid),
                     r_done.eq(r_done + (self.rvalid & self.rready & self.rlast)),
                     b_done.eq(b_done + (self.bvalid & self.bready))]

        def older_done(done, snap):
            """Every request counted in ``snap`` is done (``done - snap`` is not negative)."""
            return ~(done - snap)[15] if self.ordered else 1

        # ---- reads ---------------------------------------------------------------------------
        arq = m.submodules.arq = fifo.SyncFIFOBuffered(width=req.size, depth=self.queue_depth)
        rq = m.submodules.rq = fifo.SyncFIFOBuffered(width=bus, depth=L + M)
        rd_len, wr_len = Signal(8), Signal(8)  # AXI burst lengths (beats - 1)
        m.d.comb += [rd_len.eq(self.mem_rd_beats - 1), wr_len.eq(self.mem_wr_beats - 1)]
        m.d.comb += [arq.w_en.eq(self.mem_rd_valid),
                     arq.w_data.eq(Cat(self.mem_rd_addr, rd_len, wr_issued))]
        with m.If(self.mem_rd_valid & ~arq.w_rdy):
            m.d.comb += overflow.eq(1)
        ar = data.View(req, arq.r_data)
        ar_ok = older_done(b_done, ar.snap)
        m.d.comb += [self.araddr.eq(ar.addr), self.arlen.eq(ar.len),
                     self.arvalid.eq(arq.r_rdy & ar_ok),
                     arq.r_en.eq(self.arready & ar_ok)]
        m.d.comb += [rq.w_en.eq(self.rvalid), rq.w_data.eq(self.rdata),
                     self.rready.eq(rq.w_rdy)]
        with m.If(self.rvalid & rq.w_rdy & (self.rresp[1])):
            m.d.comb += resp.eq(1)
        # port cycles holding a read, delayed by L: the core expects a beat then
        rd_left = Signal(range(M))
        holding = Signal()
        m.d.comb += holding.eq(self.mem_rd_valid | (rd_left != 0))
        with m.If(self.mem_rd_valid):
            m.d.sync += rd_left.eq(self.mem_rd_beats - 1)
        with m.Elif(rd_left != 0):
            m.d.sync += rd_left.eq(rd_left - 1)
        taps = Signal(L)
        m.d.sync += taps.eq(Cat(holding, taps[:-1]))
        due = taps[-1]
        # beats the core requested and has not been given (requested - popped), and those an
        # abort left to drop: the next beats out of rq, before any of the next run's
        owed, drop = Signal(16), Signal(16)
        popped, owed_next = Signal(), Signal(16)
        m.d.comb += [popped.eq(rq.r_en & rq.r_rdy),
                     owed_next.eq(owed + Mux(self.mem_rd_valid, self.mem_rd_beats, 0)
                                  - popped)]
        m.d.sync += owed.eq(owed_next)
        dropping = drop != 0
        m.d.comb += [self.mem_rd_data.eq(rq.r_data),
                     self.mem_rd_data_valid.eq(due & rq.r_rdy & ~dropping),
                     rq.r_en.eq(due | dropping)]
        with m.If(self.abort):
            m.d.sync += [drop.eq(owed_next), taps.eq(0), rd_left.eq(0)]
        with m.Elif(dropping & popped):
            m.d.sync += drop.eq(drop - 1)
        with m.If(due & (~rq.r_rdy | dropping)):
            m.d.comb += late.eq(1)

        # ---- writes --------------------------------------------------------------------------
        awq = m.submodules.awq = fifo.SyncFIFOBuffered(width=req.size, depth=self.queue_depth)
        wq = m.submodules.wq = fifo.SyncFIFOBuffered(width=bus + bus // 8 + 1, depth=4 * M)
        m.d.comb += [awq.w_en.eq(self.mem_wr_valid),
                     awq.w_data.eq(Cat(self.mem_wr_addr, wr_len, rd_issued))]
        aw = data.View(req, awq.r_data)
        aw_ok = older_done(r_done, aw.snap)
        m.d.comb += [self.awaddr.eq(aw.addr), self.awlen.eq(aw.len),
                     self.awvalid.eq(awq.r_rdy & aw_ok), awq.r_en.eq(self.awready & aw_ok)]
        w_left = Signal(range(M + 1))  # beats of the current write burst still to come
        w_left_next = Signal(range(M + 1))
        pad = Signal(range(M + 1))     # empty beats that finish a burst an abort cut short
        last = Signal()
        m.d.comb += w_left_next.eq(w_left)
        with m.If(self.mem_wr_valid):
            m.d.comb += [last.eq(self.mem_wr_beats == 1),
                         w_left_next.eq(self.mem_wr_beats - 1)]
        with m.Elif(self.mem_wr_data_valid):
            m.d.comb += [last.eq(w_left == 1), w_left_next.eq(w_left - 1)]
        m.d.sync += w_left.eq(w_left_next)
        with m.If(self.abort):
            m.d.sync += [pad.eq(w_left_next), w_left.eq(0)]
        with m.Elif(pad != 0):
            m.d.sync += pad.eq(pad - 1)
        with m.If(pad != 0):
            m.d.comb += [wq.w_en.eq(1), wq.w_data.eq(Cat(Const(0, bus + bus // 8), pad == 1))]
        with m.Else():
            m.d.comb += [wq.w_en.eq(self.mem_wr_data_valid),
                         wq.w_data.eq(Cat(self.mem_wr_data, self.mem_wr_strb, last))]
        m.d.comb += [self.wdata.eq(wq.r_data[:bus]), self.wstrb.eq(wq.r_data[bus:-1]),
                     self.wlast.eq(wq.r_data[-1]), self.wvalid.eq(wq.r_rdy),
                     wq.r_en.eq(self.wready)]
        with m.If((self.mem_wr_valid & ~awq.w_rdy) | (wq.w_en & ~wq.w_rdy)
                  | ((pad != 0) & self.mem_wr_data_valid)):
            m.d.comb += overflow.eq(1)
        m.d.comb += self.bready.eq(1)
        with m.If(self.bvalid & self.bresp[1]):
            m.d.comb += resp.eq(1)

        # ---- sticky error flags ------------------------------------------------------------
        cause = Signal(3)
        m.d.comb += [self.error_cause.eq(cause), self.error.eq(cause != 0)]
        with m.If(self.clear):
            m.d.sync += cause.eq(0)
        with m.Else():
            m.d.sync += cause.eq(cause | Cat(late, overflow, resp))
        return m
