"""The fetch unit: instruction DMA in window groups and dispatch (docs/timing.md §3).

A group is the instructions that start inside one ``M*W``-byte aligned window, read as one
row (so its bursts never cross the window). The group's beats are kept in a buffer of
``max(M, 16/W)`` bus words; once the last beat has arrived (the transfer finishes at ``T``),
the instructions are dispatched one per cycle at ``T, T+1, ...`` into the load, compute or store
command queue, stalling while the target queue is full. The next group is requested the cycle
after the last dispatch. The first group is requested in cycle 0, the cycle after ``start``.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import MemType, Opcode
from vtakit.vta_hw.layouts import insn_layouts

__all__ = ["Fetch", "QUEUES"]

QUEUES = ("load", "compute", "store")


def _log2(n: int) -> int:
    return n.bit_length() - 1


class Fetch(wiring.Component):
    """Reads ``insn_count`` instructions from byte ``insn_addr`` and routes them.

    Parameters
    ----------
    cfg : HwConfig

    Attributes
    ----------
    start, insn_addr, insn_count : In
        Begin a run (``insn_addr`` 16-aligned); cycle 0 is the next cycle.
    req, addr, beats, grant, rd_valid, rd_data : memory-port client (read).
    load_w_en, compute_w_en, store_w_en : Out
        Write ``w_data`` into that command queue.
    load_full, compute_full, store_full : In
    idle : Out
        Every instruction has been dispatched.
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Fetch: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        members = {
            "start": In(1), "insn_addr": In(32), "insn_count": In(32),
            "req": Out(1), "addr": Out(32), "beats": Out(range(1, cfg.mem_max_burst_beats + 1)),
            "grant": In(1), "rd_valid": In(1), "rd_data": In(cfg.bus_width_bits),
            "w_data": Out(isa.INSN_WIDTH_BITS), "idle": Out(1),
        }
        for q in QUEUES:
            members[f"{q}_w_en"] = Out(1)
            members[f"{q}_full"] = In(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        W, M = cfg.bus_bytes, cfg.mem_max_burst_beats
        lw, lm = _log2(W), _log2(M)
        li = _log2(isa.INSN_BYTES)
        window = M * W
        nb = max(M, isa.INSN_BYTES // W)  # bus words of the largest group
        slots = nb * W // isa.INSN_BYTES
        buf = Signal(nb * W * 8)

        IDLE, REQ, DISP = 0, 1, 2
        st = Signal(2)
        m.d.comb += self.idle.eq(st == IDLE)
        # The next instruction to dispatch (its byte address / 16) and how many are left;
        # both step with every dispatch, so after a group they describe the next one.
        pos = Signal(32 - li)
        left = Signal(32)
        go = Signal()
        m.d.sync += [pos.eq(pos + go), left.eq(left - go)]
        with m.If(self.start):
            m.d.sync += [pos.eq(self.insn_addr[li:]), left.eq(self.insn_count)]

        # ---- the group starting at pos: n instructions, g_total bus words, one row ----------
        if window >= isa.INSN_BYTES:
            per = window // isa.INSN_BYTES  # instructions per window
            lp = _log2(per)
            p0 = pos[:lp]  # position of the group's first instruction in its window
            room = Signal(range(1, per + 1))
            m.d.comb += room.eq(per - p0)
            n = Signal(range(1, per + 1))
            m.d.comb += n.eq(Mux((left[lp + 1:] == 0) & (left[:lp + 1] < room), left, room))
            if lw <= li:
                g_total = n << (li - lw)
                first_w = p0 << (li - lw)
            else:
                g_total = ((p0 + n - 1) >> (lw - li)) - (p0 >> (lw - li)) + 1
                first_w = p0 >> (lw - li)
            last_in_group = (left == 1) | p0.all()
        else:  # a group is one instruction, IB / W words in bursts of M
            g_total = Const(isa.INSN_BYTES // W)
            first_w = Const(0, 1)
            last_in_group = Const(1)

        # ---- request the group's bursts ------------------------------------------------------
        q_active = Signal()
        word_addr = Signal(32 - lw)
        m.d.comb += [self.req.eq((st == REQ) & q_active),
                     self.addr.eq(Cat(Const(0, lw), word_addr))]
        if window >= isa.INSN_BYTES:
            # a window is at most one burst: the group is one burst
            m.d.comb += [word_addr.eq(pos << (li - lw) if lw <= li else pos >> (lw - li)),
                         self.beats.eq(g_total)]
            with m.If(self.grant):
                m.d.sync += q_active.eq(0)
        else:
            bursts = isa.INSN_BYTES // window
            q_burst = Signal(range(bursts))
            m.d.comb += [word_addr.eq(Cat(Const(0, lm), q_burst, pos)), self.beats.eq(M)]
            with m.If(self.grant):
                m.d.sync += q_burst.eq(q_burst + 1)
                with m.If(q_burst == bursts - 1):
                    m.d.sync += q_active.eq(0)

        # ---- receive ----------------------------------------------------------------------
        # Two instruction slots (the iCE40 preset): the group's first instruction goes to slot
        # 0 and slot 1 moves down after each dispatch, so no read multiplexer sits between
        # the buffer and the queues (and each slot-0 register packs with its input
        # multiplexer). More slots: the buffer holds the window and dispatch indexes it.
        shift = lw <= li and slots == 2
        rcv = Signal(range(nb + 1))
        with m.If(self.rd_valid & (st == REQ)):
            m.d.sync += rcv.eq(rcv + 1)
            widx = Signal(range(nb))
            m.d.comb += widx.eq(rcv if shift else first_w + rcv)
            for j in range(nb):
                with m.If(widx == j):
                    m.d.sync += buf[j * W * 8:(j + 1) * W * 8].eq(self.rd_data)
            with m.If(rcv == g_total - 1):
                m.d.sync += st.eq(DISP)

        # ---- dispatch -----------------------------------------------------------------------
        word = Signal(isa.INSN_WIDTH_BITS)
        if shift:
            m.d.comb += word.eq(buf[:isa.INSN_WIDTH_BITS])
            with m.If(go):
                m.d.sync += buf[:isa.INSN_WIDTH_BITS].eq(buf[isa.INSN_WIDTH_BITS:])
        else:
            # instruction p0 + k of the window is in slot p0 + k
            slot = p0 if window >= isa.INSN_BYTES else Const(0, 1)
            for j in range(slots):
                with m.If(slot == j):
                    m.d.comb += word.eq(buf[j * isa.INSN_WIDTH_BITS:(j + 1) * isa.INSN_WIDTH_BITS])
        m.d.comb += self.w_data.eq(word)
        mem = data.View(insn_layouts(cfg).mem, word)
        is_load = (mem.opcode == Opcode.LOAD) & ((mem.memory_type == MemType.INP)
                                                 | (mem.memory_type == MemType.WGT))
        is_store = mem.opcode == Opcode.STORE
        target = {"load": is_load, "store": is_store, "compute": ~is_load & ~is_store}
        full = Signal()
        for q in QUEUES:
            with m.If(target[q]):
                m.d.comb += full.eq(getattr(self, f"{q}_full"))
        m.d.comb += go.eq((st == DISP) & ~full)
        for q in QUEUES:
            m.d.comb += getattr(self, f"{q}_w_en").eq(go & target[q])

        def begin_group():
            m.d.sync += [st.eq(REQ), q_active.eq(1), rcv.eq(0)]
            if window < isa.INSN_BYTES:
                m.d.sync += q_burst.eq(0)

        with m.If(go & last_in_group):
            with m.If(left == 1):
                m.d.sync += st.eq(IDLE)
            with m.Else():
                begin_group()
        with m.If(self.start):
            with m.If(self.insn_count == 0):
                m.d.sync += st.eq(IDLE)
            with m.Else():
                begin_group()
        return m
