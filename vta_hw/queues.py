"""Command queues and dependency-token counters (docs/timing.md §1, §3, §4).

* :class:`CmdQueue`: a FIFO of 128-bit instructions, ``depth`` entries. An entry written at
  cycle ``d`` is visible (``r.valid``) from ``d + 1``; an entry taken at ``p`` frees its slot
  for the writer from ``p + 1`` (``w.full`` is a function of registers only). The head sits in
  a register, the rest in a block RAM whose registered read refills the head the cycle after a
  take, so a unit can take back-to-back entries.
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
        m.d.comb += [r.valid.eq(hv), w.full.eq(self.level == q)]
        if q == 1:
            m.d.comb += [r.data.eq(head), self.level.eq(hv),
                         r.w_en.eq(w.en), r.w_data.eq(w.data)]
            with m.If(w.en):
                m.d.sync += [head.eq(w.data), hv.eq(1)]
            with m.Elif(take):
                m.d.sync += hv.eq(0)
            return m
        mem = memory.Memory(shape=self.width_bits, depth=q, init=[])
        m.submodules.mem = mem
        wp, rp = mem.write_port(), mem.read_port()
        mcount = Signal(range(q + 1))
        rd_ptr = Signal(range(q))
        wr_ptr = Signal(range(q))
        refill = Signal()  # the head register is being refilled from the RAM's read port
        cur = Signal(self.width_bits)
        m.d.comb += [rp.addr.eq(rd_ptr), cur.eq(head)]
        with m.If(refill):
            m.d.comb += cur.eq(rp.data)
        m.d.comb += [r.data.eq(cur), self.level.eq(hv + mcount)]
        m.d.sync += [head.eq(cur), refill.eq(0)]
        to_ram = Signal()
        from_ram = take & (mcount != 0)
        with m.If(w.en):
            with m.If(~hv | (take & (mcount == 0))):
                m.d.sync += [head.eq(w.data), hv.eq(1)]
            with m.Else():
                m.d.comb += to_ram.eq(1)
        with m.Elif(take & (mcount == 0)):
            m.d.sync += hv.eq(0)
        m.d.comb += [wp.en.eq(to_ram), wp.addr.eq(wr_ptr), wp.data.eq(w.data)]
        with m.If(to_ram):
            m.d.sync += wr_ptr.eq(wr_ptr + 1)
        with m.If(from_ram):
            m.d.sync += [rd_ptr.eq(rd_ptr + 1), refill.eq(1)]
        m.d.sync += mcount.eq(mcount + to_ram - from_ram)
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
