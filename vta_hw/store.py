"""The store unit: STORE of OUT elements to DRAM (docs/timing.md §2, §4).

At the start cycle ``s`` the unit presents the SRAM index of the first beat's elements to the
OUT buffer (a block RAM with a registered read port); its write transfer is requested from
``s + 1`` (``STORE_SETUP_CYCLES``). From then on the read index always points at the beat that
will be sent next, so the data of a beat is ready in whatever cycle the port sends it, also
after a preemption. Elements smaller than a bus word are placed in their byte lanes with byte
strobes; a row occupies every bus word it touches and the bytes outside it are not written.
The instruction finishes the cycle after its last beat was sent; ``x_size = 0`` or
``y_size = 0`` finishes at ``s + 1``.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.control import cmd_lookahead, cmd_members, unit_control
from vtakit.vta_hw.dma import (
    ADDR_BITS,
    IDX_BITS,
    ElemSizes,
    elem_bytes,
    lanes_of,
    log_depth,
    row_requests,
)
from vtakit.vta_hw.isa import MemType
from vtakit.vta_hw.layouts import insn_layouts

__all__ = ["Store"]


def _log2(n: int) -> int:
    return n.bit_length() - 1


class Store(wiring.Component):
    """Executes the store queue.

    Parameters
    ----------
    cfg : HwConfig

    Attributes
    ----------
    cmd_valid, cmd_data, cmd_take : the store command queue's head.
    cmd_w_en, cmd_w_data : with a one-entry queue, its write port (``cmd_members``).
    g2s_avail, g2s_pop, s2g_can_push, s2g_push : token queues.
    req, addr, beats, grant : memory-port client (write).
    wr_beat : In
        The port sends a beat of this unit in this cycle.
    wr_data, wr_strb : Out
        That beat.
    out_r_addr, out_r_data : OUT buffer read lanes.
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Store: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        r = lanes_of(cfg, MemType.OUT)
        eb = elem_bytes(cfg, MemType.OUT)
        super().__init__({
            **cmd_members(cfg),
            "g2s_avail": In(1), "g2s_pop": Out(1), "s2g_can_push": In(1), "s2g_push": Out(1),
            "req": Out(1), "addr": Out(ADDR_BITS),
            "beats": Out(range(1, cfg.mem_max_burst_beats + 1)),
            "grant": In(1), "wr_beat": In(1),
            "wr_data": Out(cfg.bus_width_bits), "wr_strb": Out(cfg.bus_bytes),
            "out_r_addr": Out(IDX_BITS),
            "out_r_data": In(data.ArrayLayout(unsigned(8 * eb), r)),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = insn_layouts(cfg).mem
        W = cfg.bus_bytes
        lw = _log2(W)
        eb = elem_bytes(cfg, MemType.OUT)
        le = _log2(eb)
        iw = log_depth(cfg, MemType.OUT)
        fin, fin_next = Signal(), Signal()
        ctl = unit_control(m, "store", lay, self.cmd_valid, self.cmd_data, self.cmd_take,
                           [("pop_prev", self.g2s_avail, self.g2s_pop)],
                           [("push_prev", self.s2g_can_push, self.s2g_push)], fin,
                           **cmd_lookahead(self, fin_next))
        m.d.comb += self.idle.eq(ctl.idle)
        # the instruction: in ctl's register from the start cycle to the cycle before the
        # finish (nothing below reads it in the finish cycle)
        cur = ctl.cand
        # a STORE that vta_sim accepts has y_size * x_size <= the OUT buffer's depth (or an
        # empty block), so sizes fit iw + 1 bits; the zero tests use the whole fields
        x_any, y_any = cur.x_size != 0, cur.y_size != 0
        x, y = cur.x_size[:iw + 1], cur.y_size[:iw + 1]
        sizes = ElemSizes.build(m, cfg, cur.memory_type, (MemType.OUT,), x, "store")
        stride = Signal(ADDR_BITS)
        m.d.comb += stride.eq(sizes.to_bytes(cur.x_stride))

        # ---- request side (from s + 1) -------------------------------------------------------
        req, addr, beats = row_requests(
            m, "sq", cfg, load=ctl.start, comb=False, active=x_any & y_any,
            a0=sizes.to_bytes(cur.dram_base), rows=y, stride=stride, rem1=sizes.rem1,
            grant=self.grant)
        m.d.comb += [self.req.eq(req), self.addr.eq(addr), self.beats.eq(beats)]

        # ---- beat pointer: registers describe the beat sent next -----------------------------
        send = self.wr_beat
        d_first = Signal()  # it is the first beat of a row
        d_off = Signal(lw)  # byte offset of the current row's first byte in its first word
        d_rows = Signal(len(y))  # rows left, the current one included
        rem_first, last_off = sizes.rem1(d_off)
        d_left = Signal(len(rem_first))  # beats of the row after the current one
        left_after = Signal.like(d_left)
        m.d.comb += left_after.eq(Mux(d_first, rem_first, d_left - 1))
        last = Signal()
        m.d.comb += last.eq(left_after == 0)
        k = max(1, eb // W)
        part = Signal(range(max(2, k)))  # beat within an element (E > W)
        done_elem = (part == k - 1) if k > 1 else Const(1)
        r = lanes_of(cfg, MemType.OUT)

        def lane0(off):
            return off[le:] if eb < W else Const(0, 1)

        # widx: the SRAM index of the element in lane 0 of the current beat (less than the
        # row's first element when the row starts in a later lane) or of its element. The rows
        # are consecutive in the OUT buffer: from a row's last beat it steps to the next row's
        # first element, less that row's first lane.
        widx = Signal(iw)
        n_off = Signal(lw)
        m.d.comb += n_off.eq(d_off + stride[:lw])
        if eb < W:
            step = Mux(last, last_off[le:] + 1 - lane0(n_off), Const(r))
        else:
            step = done_elem
        n_widx = Signal(iw)
        m.d.comb += n_widx.eq(widx + step)
        with m.If(send):
            m.d.sync += [d_first.eq(last), d_left.eq(left_after), widx.eq(n_widx)]
            if k > 1:
                m.d.sync += part.eq(Mux(done_elem, 0, part + 1))
            with m.If(last):
                m.d.sync += [d_off.eq(n_off), d_rows.eq(d_rows - 1)]
        # the OUT buffer's read port is registered: present the index of the beat that is
        # current in the next cycle
        a0_off = sizes.to_bytes(cur.dram_base, lw)
        first = Signal(iw)
        m.d.comb += first.eq(cur.sram_base - lane0(a0_off))
        m.d.comb += self.out_r_addr.eq(Mux(ctl.start, first, Mux(send, n_widx, widx)))

        # the current beat's data and strobes
        if eb >= W:
            elem = self.out_r_data[0]
            m.d.comb += self.wr_data.eq(elem.word_select(part, W * 8) if k > 1 else elem)
            m.d.comb += self.wr_strb.eq(Const((1 << W) - 1, W))
        else:
            lanes = []
            strb = []
            for j in range(r):
                ok = (~d_first | (lane0(d_off) <= j)) & (~last | (last_off[le:] >= j))
                lanes.append(self.out_r_data[j])
                strb.append(ok.replicate(eb))
            m.d.comb += [self.wr_data.eq(Cat(*lanes)), self.wr_strb.eq(Cat(*strb))]

        # ---- phases ---------------------------------------------------------------------------
        XFER, FIN = 1, 2
        ph = Signal(2)
        ph_next = Signal(2)  # assigned below, last assignment wins
        m.d.comb += [ph_next.eq(ph), fin.eq(ph == FIN), fin_next.eq(ph_next == FIN)]
        m.d.sync += ph.eq(ph_next)
        with m.If(ph == FIN):
            m.d.comb += ph_next.eq(0)
        with m.If(send & last & (d_rows == 1)):
            m.d.comb += ph_next.eq(FIN)
        with m.If(ctl.start):
            m.d.sync += [d_first.eq(1), d_rows.eq(y), d_off.eq(a0_off), widx.eq(first)]
            if k > 1:
                m.d.sync += part.eq(0)
            with m.If(~x_any | ~y_any):
                m.d.comb += ph_next.eq(FIN)
            with m.Else():
                m.d.comb += ph_next.eq(XFER)
        return m
