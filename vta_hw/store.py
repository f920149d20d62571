"""The store unit: STORE of OUT elements to DRAM (docs/timing.md §2, §4).

At the start cycle ``s`` the unit presents the SRAM index of the first beat's elements to the
OUT buffer (a block RAM with a registered read port); its write transfer is requested from
``s + 1`` (:data:`~vtakit.vta_hw.timing_facts.STORE_SETUP_CYCLES`). From then on the buffer
reads the beat after the current one and a register holds the current beat's row, so the data
of a beat is ready in whatever cycle the port sends it, also after a preemption. Elements
smaller than a bus word are placed in their byte lanes with byte strobes; a row occupies every
bus word it touches and the bytes outside it are not written.
The instruction finishes the cycle after its last beat was sent; ``x_size = 0`` or
``y_size = 0`` finishes at ``s + 1``.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.alu import compact_datapath
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.control import WAIT, command_member, unit_control
from vtakit.vta_hw.dma import (
    ADDR_BITS,
    IDX_BITS,
    ElemSizes,
    lanes_of,
    row_requests,
    staged_row_requests,
)
from vtakit.vta_hw.interfaces import MemClientSignature, TokenPopSignature, TokenPushSignature
from vtakit.vta_hw.isa import MemType
from vtakit.vta_hw.layouts import insn_layouts
from vtakit.vta_hw.timing_facts import NOP_CYCLES, STORE_SETUP_CYCLES, TOKEN_POPS, TOKEN_PUSHES

__all__ = ["Store"]

# The request path below asks for the first burst two cycles after the start (planned in the
# cycle after it); empty STOREs finish the cycle after the start.
assert STORE_SETUP_CYCLES == 2, "Store requests its first burst at s + 2"
assert NOP_CYCLES == 1, "Store finishes an empty STORE at s + 1"


def _log2(n: int) -> int:
    return n.bit_length() - 1


class Store(wiring.Component):
    """Executes the store queue.

    Parameters
    ----------
    cfg : HwConfig

    Attributes
    ----------
    cmd : In(CommandSignature)
        The store command queue (:func:`~vtakit.vta_hw.control.command_member`).
    g2s : Out(TokenPopSignature()), s2g : Out(TokenPushSignature())
        Token queues.
    mem : Out(MemClientSignature(cfg, write=True))
        The memory-port client (write): ``wr_beat`` is high when the port sends a beat of this
        unit, ``wr_data`` and ``wr_strb`` are that beat.
    out_r_addr, out_r_data : OUT buffer read lanes.
    idle, active : Out
        No instruction taken; the unit makes progress in this cycle
        (:class:`~vtakit.vta_hw.control.UnitControl`), for the core's deadlock detection.
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Store: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        r = lanes_of(cfg, MemType.OUT)
        eb = cfg.elem_bytes(MemType.OUT)
        super().__init__({
            "cmd": command_member(cfg),
            "g2s": Out(TokenPopSignature()), "s2g": Out(TokenPushSignature()),
            "mem": Out(MemClientSignature(cfg, write=True)),
            "out_r_addr": Out(IDX_BITS),
            "out_r_data": In(data.ArrayLayout(unsigned(8 * eb), r)),
            "idle": Out(1), "active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = insn_layouts(cfg).mem
        W = cfg.bus_bytes
        lw = _log2(W)
        eb = cfg.elem_bytes(MemType.OUT)
        le = _log2(eb)
        iw = cfg.log_depth(MemType.OUT)
        fin, fin_next = Signal(), Signal()
        tokens = {"g2s": self.g2s, "s2g": self.s2g}
        ctl = unit_control(m, "store", lay, self.cmd,
                           [(flag, tokens[q]) for flag, q in TOKEN_POPS["store"]],
                           [(flag, tokens[q]) for flag, q in TOKEN_PUSHES["store"]], fin,
                           fin_next)
        m.d.comb += [self.idle.eq(ctl.idle), self.active.eq(ctl.active)]
        # the instruction: in ctl's register from the start cycle to the cycle before the
        # finish (nothing below reads it in the finish cycle)
        cur = ctl.cand
        # a STORE that vta_sim accepts has y_size * x_size <= the OUT buffer's depth (or an
        # empty block), so sizes fit iw + 1 bits; the zero tests use the whole fields
        x_any, y_any = cur.x_size != 0, cur.y_size != 0
        x, y = cur.x_size[:iw + 1], cur.y_size[:iw + 1]
        sizes = ElemSizes.build(m, cfg, cur.memory_type, (MemType.OUT,), x, "store")
        c_sizes = sizes  # the candidate's, for what the start cycle loads
        # On the registered datapath's cores (the ECP5 clock) what runs after the start reads
        # the unit's register, not the candidate (its multiplexer follows the start decision),
        # x_size - 1 is registered at the start, and the request side is planned in the
        # cycle after it (staged_row_requests): no path runs from the unit's state through the
        # candidate, a row's length and the grant into the port. The compact datapath's cores
        # (iCE40 logic cells) keep the shorter logic.
        staged = not compact_datapath(cfg)
        run = data.View(lay, ctl.insn) if staged else cur
        if staged:
            xm1 = Signal(len(x), name="store_x_minus_1_reg")
            with m.If(ctl.start):
                m.d.sync += xm1.eq(x - 1)
            sizes = ElemSizes(cfg, sizes.sel, xm1)  # (sel: OUT's one element size)
        stride = Signal(ADDR_BITS)
        m.d.comb += stride.eq(sizes.to_bytes(run.x_stride))

        # ---- request side (from s + 2) -------------------------------------------------------
        # setup: the cycle after the start of a block with data
        setup = Signal(name="store_setup")
        m.d.sync += setup.eq(ctl.start & x_any & y_any)
        if staged:
            # planned in the setup cycle from the unit's register, every output a register
            req, addr, beats = staged_row_requests(
                m, "sq", cfg, setup=setup, active=1, a0=sizes.to_bytes(run.dram_base),
                rows=run.y_size[:iw + 1], stride=stride, rem1=sizes.rem1,
                grant=self.mem.grant)
        else:
            # loaded at the start, held back in the setup cycle
            req, addr, beats = row_requests(
                m, "sq", cfg, load=ctl.start, active=x_any & y_any,
                a0=c_sizes.to_bytes(cur.dram_base), rows=y, stride=stride, rem1=sizes.rem1,
                grant=self.mem.grant)
            req = req & ~setup
        m.d.comb += [self.mem.req.eq(req), self.mem.addr.eq(addr), self.mem.beats.eq(beats)]

        # ---- beat pointer: registers describe the beat sent next -----------------------------
        send = self.mem.wr_beat
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
        # The OUT buffer's read port is registered. It reads the beat after the current one
        # (n_widx, from registers only), and the current beat's row is held in a register: the
        # RAM's output is the current row in the cycle after a start or a send, the held one
        # otherwise. So the read index does not wait for the port's grant of this cycle (the
        # port arbitrates every unit's request in the cycle it grants: the ECP5 clock).
        XFER, FIN = 1, 2  # the phases (below)
        ph = Signal(2)
        a0_off = c_sizes.to_bytes(cur.dram_base, lw)
        first = Signal(iw)
        m.d.comb += first.eq(cur.sram_base - lane0(a0_off))
        if staged:
            # Selected by registers only, so the read index does not wait for the start
            # decision (the unit's state, the queue's head, the tokens: the ECP5 clock). Out of
            # the transfer phase the RAM reads the first row of the instruction a start would
            # take: the waiting one's (state WAIT) or else the queue head's (a start from IDLE
            # or at a finish takes it); a read no start follows is not used (``fresh``). In
            # the transfer phase no start comes (the unit is busy), so it reads ``n_widx``.
            # (with a one-entry queue the candidate is the unit's register)
            def first_of(insn):
                ins = data.View(lay, insn)
                return ins.sram_base - lane0(c_sizes.to_bytes(ins.dram_base, lw))

            first_pick = Signal(iw, name="store_first_row")
            if "w_en" in self.cmd.signature.members:
                m.d.comb += first_pick.eq(first_of(ctl.insn))
            else:
                m.d.comb += first_pick.eq(Mux(ctl.state == WAIT, first_of(ctl.insn),
                                              first_of(self.cmd.data)))
            m.d.comb += self.out_r_addr.eq(Mux(ph == XFER, n_widx, first_pick))
        else:
            m.d.comb += self.out_r_addr.eq(Mux(ctl.start, first, n_widx))
        fresh = Signal()  # the RAM's output is the current beat's row
        m.d.sync += fresh.eq(ctl.start | send)
        held = Signal.like(self.out_r_data)
        row = Signal.like(self.out_r_data)
        m.d.comb += row.eq(Mux(fresh, self.out_r_data, held))
        m.d.sync += held.eq(row)

        # the current beat's data and strobes
        if eb >= W:
            elem = row[0]
            m.d.comb += self.mem.wr_data.eq(elem.word_select(part, W * 8) if k > 1 else elem)
            m.d.comb += self.mem.wr_strb.eq(Const((1 << W) - 1, W))
        else:
            lanes = []
            strb = []
            for j in range(r):
                ok = (~d_first | (lane0(d_off) <= j)) & (~last | (last_off[le:] >= j))
                lanes.append(row[j])
                strb.append(ok.replicate(eb))
            m.d.comb += [self.mem.wr_data.eq(Cat(*lanes)), self.mem.wr_strb.eq(Cat(*strb))]

        # ---- phases ---------------------------------------------------------------------------
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
