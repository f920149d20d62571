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
from vtakit.vta_hw.control import unit_control
from vtakit.vta_hw.dma import IDX_BITS, elem_bytes, lanes_of
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
            "cmd_valid": In(1), "cmd_data": In(128), "cmd_take": Out(1),
            "g2s_avail": In(1), "g2s_pop": Out(1), "s2g_can_push": In(1), "s2g_push": Out(1),
            "req": Out(1), "addr": Out(32), "beats": Out(range(1, cfg.mem_max_burst_beats + 1)),
            "grant": In(1), "wr_beat": In(1),
            "wr_data": Out(cfg.bus_width_bits), "wr_strb": Out(cfg.bus_bytes),
            "out_r_addr": Out(data.ArrayLayout(unsigned(IDX_BITS), r)),
            "out_r_data": In(data.ArrayLayout(unsigned(8 * eb), r)),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = insn_layouts(cfg).mem
        W, M = cfg.bus_bytes, cfg.mem_max_burst_beats
        lw, lm = _log2(W), _log2(M)
        eb = elem_bytes(cfg, MemType.OUT)
        le = _log2(eb)
        fin = Signal()
        ctl = unit_control(m, "store", lay, self.cmd_valid, self.cmd_data, self.cmd_take,
                           [("pop_prev", self.g2s_avail, self.g2s_pop)],
                           [("push_prev", self.s2g_can_push, self.s2g_push)], fin)
        m.d.comb += self.idle.eq(ctl.idle)
        reg = Signal(128)
        with m.If(ctl.start):
            m.d.sync += reg.eq(ctl.cand.as_value())
        cur = data.View(lay, Signal(128))
        m.d.comb += cur.as_value().eq(Mux(ctl.start, ctl.cand.as_value(), reg))
        x = cur.x_size

        def span(row_elem):
            a = (row_elem << le)[:40]
            return (a >> lw)[:32], ((a + (x << le) - 1) >> lw)[:32]

        # ---- request side (from s + 1) -------------------------------------------------------
        q_active, q_row, q_rows = Signal(), Signal(32), Signal(16)
        q_cur, q_last = Signal(32), Signal(32)
        room = Signal(range(M + 1))
        m.d.comb += room.eq(M - q_cur[:lm]) if lm else room.eq(1)
        rest = Signal(33)
        m.d.comb += rest.eq(q_last - q_cur + 1)
        burst = Signal(range(M + 1))
        m.d.comb += burst.eq(Mux(rest < room, rest, room))
        m.d.comb += [self.req.eq(q_active), self.addr.eq((q_cur << lw)[:32]),
                     self.beats.eq(burst)]
        nrow = Signal(32)
        m.d.comb += nrow.eq(q_row + cur.x_stride)
        nf, nl = span(nrow)
        with m.If(self.grant):
            with m.If(q_cur + burst > q_last):
                m.d.sync += [q_row.eq(nrow), q_rows.eq(q_rows - 1), q_active.eq(q_rows != 1),
                             q_cur.eq(nf), q_last.eq(nl)]
            with m.Else():
                m.d.sync += q_cur.eq(q_cur + burst)

        # ---- beat pointer: registers hold the beat sent next ---------------------------------
        d_row, d_rows, d_left, d_ptr = Signal(32), Signal(16), Signal(32), Signal(IDX_BITS)
        sub = Signal(IDX_BITS)  # E >= W: element of the row; E < W: SRAM index of lane 0
        part = Signal(range(max(2, eb // W)))
        first = d_left == 0
        rf, rl = span(d_row)
        left_after = Signal(32)
        m.d.comb += left_after.eq(Mux(first, rl - rf, d_left - 1))
        last = left_after == 0
        r = lanes_of(cfg, MemType.OUT)
        lr = _log2(r)
        lane0 = d_row[:lr] if r > 1 else Const(0, 1)
        lane_last = (d_row + x - 1)[:lr] if r > 1 else Const(0, 1)
        # next pointer state after sending the current beat
        n_row, n_rows, n_left, n_ptr = Signal(32), Signal(16), Signal(32), Signal(IDX_BITS)
        n_sub, n_part = Signal(IDX_BITS), Signal.like(part)
        if eb >= W:
            k = eb // W
            xc = Mux(first, 0, sub)
            done_elem = (part == k - 1) if k > 1 else Const(1)
            cur_idx = [d_ptr + xc]
            m.d.comb += n_sub.eq(xc + done_elem)
            m.d.comb += n_part.eq(part + 1 if k > 1 else 0)
        else:
            lbase = Mux(first, d_ptr - lane0, sub)
            cur_idx = [lbase + j for j in range(r)]
            m.d.comb += [n_sub.eq(lbase + r), n_part.eq(0)]
        m.d.comb += [n_left.eq(left_after), n_row.eq(d_row), n_rows.eq(d_rows),
                     n_ptr.eq(d_ptr)]
        with m.If(last):
            m.d.comb += [n_row.eq(d_row + cur.x_stride), n_rows.eq(d_rows - 1),
                         n_ptr.eq(d_ptr + x)]
        send = self.wr_beat
        s_row, s_rows, s_left, s_ptr = Signal(32), Signal(16), Signal(32), Signal(IDX_BITS)
        s_sub, s_part = Signal(IDX_BITS), Signal.like(part)
        with m.If(ctl.start):
            m.d.comb += [s_row.eq(cur.dram_base), s_rows.eq(cur.y_size), s_left.eq(0),
                         s_ptr.eq(cur.sram_base), s_sub.eq(0), s_part.eq(0)]
        with m.Elif(send):
            m.d.comb += [s_row.eq(n_row), s_rows.eq(n_rows), s_left.eq(n_left),
                         s_ptr.eq(n_ptr), s_sub.eq(n_sub), s_part.eq(n_part)]
        with m.Else():
            m.d.comb += [s_row.eq(d_row), s_rows.eq(d_rows), s_left.eq(d_left),
                         s_ptr.eq(d_ptr), s_sub.eq(sub), s_part.eq(part)]
        m.d.sync += [d_row.eq(s_row), d_rows.eq(s_rows), d_left.eq(s_left), d_ptr.eq(s_ptr),
                     sub.eq(s_sub), part.eq(s_part)]
        # SRAM read index of the beat that is current in the next cycle
        s_first = s_left == 0
        if eb >= W:
            nxt_idx = [s_ptr + Mux(s_first, 0, s_sub)]
        else:
            s_lane0 = s_row[:lr]
            nbase = Mux(s_first, s_ptr - s_lane0, s_sub)
            nxt_idx = [nbase + j for j in range(r)]
        for j in range(r):
            m.d.comb += self.out_r_addr[j].eq(nxt_idx[j])
        del cur_idx
        # the current beat's data and strobes
        if eb >= W:
            elem = self.out_r_data[0]
            k = eb // W
            if k > 1:
                m.d.comb += self.wr_data.eq(elem.word_select(part, W * 8))
            else:
                m.d.comb += self.wr_data.eq(elem)
            m.d.comb += self.wr_strb.eq(Const((1 << W) - 1, W))
        else:
            lanes = []
            strb = []
            for j in range(r):
                ok = (~first | (lane0 <= j)) & (~last | (lane_last >= j))
                lanes.append(self.out_r_data[j])
                strb.append(Mux(ok, Const((1 << eb) - 1, eb), Const(0, eb)))
            m.d.comb += [self.wr_data.eq(Cat(*lanes)), self.wr_strb.eq(Cat(*strb))]

        # ---- phases ---------------------------------------------------------------------------
        XFER, FIN = 1, 2
        ph = Signal(2)
        m.d.comb += fin.eq(ph == FIN)
        with m.If(ph == FIN):
            m.d.sync += ph.eq(0)
        with m.If(send & last & (d_rows == 1)):
            m.d.sync += ph.eq(FIN)
        with m.If(ctl.start):
            f0, l0 = span(cur.dram_base)
            with m.If((x == 0) | (cur.y_size == 0)):
                m.d.sync += ph.eq(FIN)
            with m.Else():
                m.d.sync += [ph.eq(XFER), q_active.eq(1), q_row.eq(cur.dram_base),
                             q_rows.eq(cur.y_size), q_cur.eq(f0), q_last.eq(l0)]
        return m
