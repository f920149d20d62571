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
from vtakit.vta_hw.interfaces import CommandWriteSignature, MemClientSignature
from vtakit.vta_hw.isa import Opcode
from vtakit.vta_hw.layouts import insn_layouts
from vtakit.vta_hw.timing_facts import LOAD_UNIT_MEMORY_TYPES

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
    mem : Out(MemClientSignature(cfg))
        The memory-port client (read).
    load_cmd, compute_cmd, store_cmd : Out(CommandWriteSignature(isa.INSN_WIDTH_BITS))
        The three command queues.
    idle : Out
        Every instruction has been dispatched.
    active : Out
        Fetch makes progress in this cycle: it requests or receives a group, or dispatches an
        instruction (it is not idle and not blocked on a full command queue).
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Fetch: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        super().__init__({
            "start": In(1), "insn_addr": In(32), "insn_count": In(32),
            "mem": Out(MemClientSignature(cfg)),
            "load_cmd": Out(CommandWriteSignature(isa.INSN_WIDTH_BITS)),
            "compute_cmd": Out(CommandWriteSignature(isa.INSN_WIDTH_BITS)),
            "store_cmd": Out(CommandWriteSignature(isa.INSN_WIDTH_BITS)),
            "idle": Out(1), "active": Out(1),
        })

    def queues(self) -> dict[str, wiring.PureInterface]:
        """The command-queue writers by queue name (:data:`QUEUES`)."""
        return {"load": self.load_cmd, "compute": self.compute_cmd, "store": self.store_cmd}

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
        client = self.mem
        m.d.comb += [client.req.eq((st == REQ) & q_active),
                     client.addr.eq(Cat(Const(0, lw), word_addr))]
        if window >= isa.INSN_BYTES:
            # a window is at most one burst: the group is one burst
            m.d.comb += [word_addr.eq(pos << (li - lw) if lw <= li else pos >> (lw - li)),
                         client.beats.eq(g_total)]
            with m.If(client.grant):
                m.d.sync += q_active.eq(0)
        else:
            bursts = isa.INSN_BYTES // window
            q_burst = Signal(range(bursts))
            m.d.comb += [word_addr.eq(Cat(Const(0, lm), q_burst, pos)), client.beats.eq(M)]
            with m.If(client.grant):
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
        widx = Signal(range(nb))  # the bus word of the buffer that a received beat fills
        m.d.comb += widx.eq(rcv if shift else first_w + rcv)
        with m.If(client.rd_valid & (st == REQ)):
            m.d.sync += rcv.eq(rcv + 1)
            for j in range(nb):
                with m.If(widx == j):
                    m.d.sync += buf[j * W * 8:(j + 1) * W * 8].eq(client.rd_data)
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
        queues = self.queues()
        for q in QUEUES:
            m.d.comb += queues[q].data.eq(word)
        lay = insn_layouts(cfg).mem
        if shift:
            mem = data.View(lay, word)
        else:
            # The fields that route the instruction (opcode, memory type: its low bits) are
            # kept in a register of their own, loaded from the beat that brings them and from
            # the buffer at each dispatch, so the dispatch decision (target, its queue's room,
            # `go`) does not wait on the buffer's multiplexer (the ECP5 clock)
            nf = max(lay[f].offset + lay[f].shape.width for f in ("opcode", "memory_type"))
            head = Signal(nf)
            mem = data.View(lay, Cat(head, Const(0, isa.INSN_WIDTH_BITS - nf)))
            ib, bw = isa.INSN_WIDTH_BITS, W * 8
            # slot j's low bits: bus word j * ib // bw of the buffer, at bit (j * ib) % bw
            with m.If(client.rd_valid & (st == REQ)):
                for j in range(slots):
                    with m.If((slot == j) & (widx == j * ib // bw)):
                        o = (j * ib) % bw
                        m.d.sync += head.eq(client.rd_data[o:o + nf])
            if slots > 1:
                with m.If(go & ~last_in_group):
                    for j in range(slots - 1):
                        with m.If(slot == j):
                            m.d.sync += head.eq(buf[(j + 1) * ib:(j + 1) * ib + nf])
        # routing (docs/timing.md §3): LOAD INP / WGT to load, STORE to store, the rest compute
        to_load_unit = mem.memory_type == LOAD_UNIT_MEMORY_TYPES[0]
        for t in LOAD_UNIT_MEMORY_TYPES[1:]:
            to_load_unit = to_load_unit | (mem.memory_type == t)
        is_load = (mem.opcode == Opcode.LOAD) & to_load_unit
        is_store = mem.opcode == Opcode.STORE
        target = {"load": is_load, "store": is_store, "compute": ~is_load & ~is_store}
        full = Signal()
        for q in QUEUES:
            with m.If(target[q]):
                m.d.comb += full.eq(queues[q].full)
        m.d.comb += go.eq((st == DISP) & ~full)
        m.d.comb += self.active.eq((st == REQ) | go)
        for q in QUEUES:
            m.d.comb += queues[q].en.eq(go & target[q])

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
