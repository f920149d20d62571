"""The fetch unit: instruction DMA in window groups and dispatch (docs/timing.md §3).

A group is the instructions that start inside one ``M*W``-byte aligned window, read as one
row (so its bursts never cross the window). The group's beats are kept in a buffer of
``max(M, 16/W)`` bus words; once the last beat has arrived (the transfer finishes at ``T``),
the instructions are dispatched one per cycle at ``T, T+1, ...`` into the load, compute or store
command queue, stalling while the target queue is full. The next group is requested the cycle
after the last dispatch. The first group is requested in cycle 0, the cycle after ``start``.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
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
            "w_data": Out(128), "idle": Out(1),
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
        window = M * W
        nb = max(M, isa.INSN_BYTES // W)  # bus words of the largest group
        slots = nb * W // isa.INSN_BYTES
        buf = Signal(nb * W * 8)

        IDLE, REQ, DISP = 0, 1, 2
        st = Signal(2)
        m.d.comb += self.idle.eq(st == IDLE)
        base = Signal(32)
        count = Signal(32)
        nxt = Signal(32)  # index of the first instruction of the current group
        g_n = Signal(range(max(2, window // 16 + 1)))
        g_off = Signal(range(max(2, W // 16)))  # 16-byte slot of the group's first instruction
        g_total = Signal(range(nb + 1))  # beats of the group
        q_active = Signal()
        q_cur = Signal(32)
        q_last = Signal(32)
        rcv = Signal(range(nb + 1))
        k = Signal(range(max(2, window // 16 + 1)))

        def begin_group(addr, remaining):
            """Register the group starting at byte ``addr`` (``remaining`` >= 1 instructions)."""
            if window >= isa.INSN_BYTES:
                room = (window - addr[:_log2(window)]) >> 4
            else:
                room = 1
            n = Mux(remaining < room, remaining, room)
            first = addr >> lw
            last = (addr + (n << 4) - 1) >> lw
            m.d.sync += [st.eq(REQ), g_n.eq(n), q_active.eq(1), q_cur.eq(first),
                         q_last.eq(last), g_total.eq(last - first + 1), rcv.eq(0), k.eq(0)]
            if W > isa.INSN_BYTES:
                m.d.sync += g_off.eq(addr[4:lw])
            else:
                m.d.sync += g_off.eq(0)

        # ---- request the group's bursts ------------------------------------------------------
        room_b = Signal(range(M + 1))
        m.d.comb += room_b.eq(M - q_cur[:lm]) if lm else room_b.eq(1)
        rest = Signal(33)
        m.d.comb += rest.eq(q_last - q_cur + 1)
        burst = Signal(range(M + 1))
        m.d.comb += burst.eq(Mux(rest < room_b, rest, room_b))
        m.d.comb += [self.req.eq((st == REQ) & q_active), self.addr.eq((q_cur << lw)[:32]),
                     self.beats.eq(burst)]
        with m.If(self.grant):
            m.d.sync += q_cur.eq(q_cur + burst)
            with m.If(q_cur + burst > q_last):
                m.d.sync += q_active.eq(0)

        # ---- receive ----------------------------------------------------------------------
        with m.If(self.rd_valid & (st == REQ)):
            m.d.sync += rcv.eq(rcv + 1)
            for j in range(nb):
                with m.If(rcv == j):
                    m.d.sync += buf[j * W * 8:(j + 1) * W * 8].eq(self.rd_data)
            with m.If(rcv == g_total - 1):
                m.d.sync += st.eq(DISP)

        # ---- dispatch -----------------------------------------------------------------------
        slot = Signal(range(max(2, slots)))
        m.d.comb += slot.eq(g_off + k)
        word = Signal(128)
        for j in range(slots):
            with m.If(slot == j):
                m.d.comb += word.eq(buf[j * 128:(j + 1) * 128])
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
        go = (st == DISP) & ~full
        for q in QUEUES:
            m.d.comb += getattr(self, f"{q}_w_en").eq(go & target[q])
        with m.If(go):
            m.d.sync += k.eq(k + 1)
            with m.If(k == g_n - 1):
                after = nxt + g_n
                m.d.sync += nxt.eq(after)
                with m.If(after == count):
                    m.d.sync += st.eq(IDLE)
                with m.Else():
                    begin_group((base + (after << 4))[:32], count - after)

        with m.If(self.start):
            m.d.sync += [base.eq(self.insn_addr), count.eq(self.insn_count), nxt.eq(0)]
            with m.If(self.insn_count == 0):
                m.d.sync += st.eq(IDLE)
            with m.Else():
                begin_group(self.insn_addr, self.insn_count)
        return m
