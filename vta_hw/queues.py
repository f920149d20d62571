"""Command queues and dependency-token counters (docs/timing.md §1, §3, §4).

* :class:`CmdQueue`: a FIFO of 128-bit instructions, ``depth`` entries. An entry written at
  cycle ``d`` is visible (``r.valid``) from ``d + 1``; an entry taken at ``p`` frees its slot
  for the writer from ``p + 1`` (``w.full`` is a function of registers only). The head and the
  entry after it sit in registers, the rest in a block RAM read ahead into them, so the head
  is a register and a unit can take back-to-back entries.
* :class:`TokenCounter`: one of the four token queues (l2g, g2l, g2s, s2g), a counter of
  capacity ``depth``. A pushed token is visible to the consumer in the same cycle
  (``consumer.avail`` includes ``producer.push``); a popped slot is usable by the producer one
  cycle later (``producer.can_push`` is registered). ``clear`` empties it (the core clears its
  four counters with ``start``, so a token a faulty run left behind never reaches the next).

Both sides of each queue are the typed interfaces of :mod:`vtakit.vta_hw.interfaces`.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.interfaces import (
    CommandSignature,
    CommandWriteSignature,
    TokenPopSignature,
    TokenPushSignature,
)
from vtakit.vta_hw.isa import INSN_WIDTH_BITS

__all__ = ["CmdQueue", "TokenCounter"]


def _check_depth(cls: str, depth: int) -> None:
    if not isinstance(depth, int) or isinstance(depth, bool):
        raise TypeError(f"{cls}: depth must be an int, got {depth!r}")
    if depth < 1 or depth & (depth - 1):
        raise ValueError(f"{cls}: depth={depth} must be a power of two >= 1")


class CmdQueue(wiring.Component):
    """A first-in first-out queue of ``width_bits``-bit commands.

    Parameters
    ----------
    depth : int
        Entries (``cfg.cmd_queue_depth``).
    width_bits : int
        Bits of one command (128 for instructions).

    Attributes
    ----------
    w : In(CommandWriteSignature(width_bits))
        The writer: ``en`` with ``data`` (the writer checks ``full`` first: ``depth`` entries
        held as of the start of this cycle).
    r : Out(CommandSignature(width_bits, snoop=depth == 1))
        The head entry (``valid``, ``data``), taken with ``take`` (only when ``valid``); a
        one-entry queue also shows its writes (``w_en``, ``w_data``).
    level : Out
        Entries held.
    """

    def __init__(self, depth: int, width_bits: int = INSN_WIDTH_BITS):
        _check_depth("CmdQueue", depth)
        if not isinstance(width_bits, int) or width_bits < 1:
            raise ValueError(f"CmdQueue: width_bits={width_bits!r} must be a positive int")
        self.depth, self.width_bits = depth, width_bits
        super().__init__({
            "w": In(CommandWriteSignature(width_bits)),
            "r": Out(CommandSignature(width_bits, snoop=depth == 1)),
            "level": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        q = self.depth
        w, r = self.w, self.r
        head = Signal(self.width_bits)
        hv = Signal()
        take = r.take & hv
        m.d.comb += r.valid.eq(hv)
        if q == 1:
            m.d.comb += [w.full.eq(hv), r.data.eq(head), self.level.eq(hv),
                         r.w_en.eq(w.en), r.w_data.eq(w.data)]
            with m.If(w.en):
                m.d.sync += [head.eq(w.data), hv.eq(1)]
            with m.Elif(take):
                m.d.sync += hv.eq(0)
            return m
        # Deeper queues: the head and the entry after it in registers (s0, s1), the rest in a
        # block RAM behind them, read ahead so that s1 is filled before it is needed; the head
        # is always a register (no path from the RAM's output to the units) and a unit can take
        # back-to-back entries. A write goes straight to s0 or s1 while the RAM holds nothing
        # and no read of it is on its way, else to the RAM (entries stay in order).
        mem = memory.Memory(shape=self.width_bits, depth=q, init=[])
        m.submodules.mem = mem
        wp, rp = mem.write_port(), mem.read_port()
        s1 = Signal(self.width_bits)
        v1 = Signal()
        mcount = Signal(range(q + 1))  # entries in the RAM, a read on its way included
        rd_ptr = Signal(range(q))
        wr_ptr = Signal(range(q))
        arriving = Signal()  # the RAM's read port shows the entry read in the previous cycle
        m.d.comb += [r.data.eq(head), self.level.eq(hv + v1 + mcount)]
        # full in a register of its own, kept equal to level == depth: the writer's decision
        # (fetch's dispatch) waits on no adder and comparator (the ECP5 clock)
        full = Signal()
        m.d.comb += w.full.eq(full)
        with m.If(w.en & ~take):
            m.d.sync += full.eq(self.level == q - 1)
        with m.Elif(take & ~w.en):
            m.d.sync += full.eq(0)
        # the registers after this cycle's take: how many entries they keep
        keep0 = Signal()  # s0 keeps an entry (its own, or s1's moving down)
        m.d.comb += keep0.eq(Mux(take, v1, hv))
        keep1 = Signal()
        m.d.comb += keep1.eq(v1 & ~take)
        # read the RAM when the registers will have room for the entry when it arrives
        pending = mcount - arriving  # entries in the RAM not yet read
        read = Signal()
        m.d.comb += read.eq((pending != 0) & ~(keep0 & keep1) & ~(arriving & (keep0 | keep1)))
        m.d.comb += rp.addr.eq(rd_ptr)
        with m.If(read):
            m.d.sync += rd_ptr.eq(rd_ptr + 1)
        m.d.sync += arriving.eq(read)
        # what enters the registers in this cycle, oldest first: s1 moving down (a take), the
        # RAM's entry, the write (straight in when every RAM entry has been read, and there is
        # room); each fills the first free register
        free2 = ~keep0  # both registers free after the take
        direct = Signal()
        m.d.comb += direct.eq(w.en & (pending == 0) & ~keep1 & (free2 | ~arriving))
        to_ram = w.en & ~direct
        with m.If(take):
            m.d.sync += [head.eq(s1), hv.eq(v1), v1.eq(0)]
        first = Mux(arriving, rp.data, w.data)
        with m.If(arriving | direct):
            with m.If(free2):
                m.d.sync += [head.eq(first), hv.eq(1)]
                with m.If(arriving & direct):
                    m.d.sync += [s1.eq(w.data), v1.eq(1)]
            with m.Else():
                m.d.sync += [s1.eq(first), v1.eq(1)]
        m.d.comb += [wp.en.eq(to_ram), wp.addr.eq(wr_ptr), wp.data.eq(w.data)]
        with m.If(to_ram):
            m.d.sync += wr_ptr.eq(wr_ptr + 1)
        m.d.sync += mcount.eq(mcount + to_ram - arriving)
        return m


class TokenCounter(wiring.Component):
    """A dependency-token queue of capacity ``depth`` (``cfg.dep_queue_depth``).

    Attributes
    ----------
    producer : In(TokenPushSignature())
        ``push`` (only when ``can_push``: fewer than ``depth`` tokens held at the start of the
        cycle).
    consumer : In(TokenPopSignature())
        ``pop`` (only when ``avail``: a token is held, or is being pushed in this cycle).
    clear : In
        Empty the queue at the end of this cycle (overrides a push and a pop).
    count : Out
    """

    def __init__(self, depth: int):
        _check_depth("TokenCounter", depth)
        self.depth = depth
        super().__init__({"producer": In(TokenPushSignature()),
                          "consumer": In(TokenPopSignature()),
                          "clear": In(1), "count": Out(range(depth + 1))})

    def elaborate(self, platform):
        m = Module()
        cnt = Signal(range(self.depth + 1))
        push, pop = self.producer.push, self.consumer.pop
        m.d.comb += [self.count.eq(cnt), self.producer.can_push.eq(cnt < self.depth),
                     self.consumer.avail.eq((cnt != 0) | push)]
        # one adder: a push and a pop in the same cycle cancel
        m.d.sync += cnt.eq(cnt + Mux(push, Mux(pop, 0, 1), Mux(pop, -1, 0)))
        with m.If(self.clear):
            m.d.sync += cnt.eq(0)
        return m
