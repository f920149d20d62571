"""Command queues and dependency-token counters (docs/timing.md §1, §3, §4).

* :class:`CmdQueue`: a FIFO of 128-bit instructions, ``depth`` entries. An entry written at
  cycle ``d`` is visible (``r_valid``) from ``d + 1``; an entry taken at ``p`` frees its slot
  for the writer from ``p + 1`` (``full`` is a function of registers only). The head sits in a
  register, the rest in a block RAM whose registered read refills the head the cycle after a
  take, so a unit can take back-to-back entries.
* :class:`TokenCounter`: one of the four token queues (l2g, g2l, g2s, s2g), a counter of
  capacity ``depth``. A pushed token is visible to the consumer in the same cycle (``avail``
  includes ``push``); a popped slot is usable by the producer one cycle later (``can_push``
  is registered).
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

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
    w_en, w_data : In
        Write (the writer checks ``full`` first).
    full : Out
        ``depth`` entries are held (as of the start of this cycle).
    r_valid, r_data : Out
        The head entry.
    r_en : In
        Take the head (only when ``r_valid``).
    level : Out
        Entries held.
    """

    def __init__(self, depth: int, width_bits: int = INSN_WIDTH_BITS):
        _check_depth("CmdQueue", depth)
        if not isinstance(width_bits, int) or width_bits < 1:
            raise ValueError(f"CmdQueue: width_bits={width_bits!r} must be a positive int")
        self.depth, self.width_bits = depth, width_bits
        super().__init__({
            "w_en": In(1), "w_data": In(width_bits), "full": Out(1),
            "r_valid": Out(1), "r_data": Out(width_bits), "r_en": In(1),
            "level": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        q = self.depth
        head = Signal(self.width_bits)
        hv = Signal()
        take = self.r_en & hv
        m.d.comb += [self.r_valid.eq(hv), self.full.eq(self.level == q)]
        if q == 1:
            m.d.comb += [self.r_data.eq(head), self.level.eq(hv)]
            with m.If(self.w_en):
                m.d.sync += [head.eq(self.w_data), hv.eq(1)]
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
        m.d.comb += [self.r_data.eq(cur), self.level.eq(hv + mcount)]
        m.d.sync += [head.eq(cur), refill.eq(0)]
        to_ram = Signal()
        from_ram = take & (mcount != 0)
        with m.If(self.w_en):
            with m.If(~hv | (take & (mcount == 0))):
                m.d.sync += [head.eq(self.w_data), hv.eq(1)]
            with m.Else():
                m.d.comb += to_ram.eq(1)
        with m.Elif(take & (mcount == 0)):
            m.d.sync += hv.eq(0)
        m.d.comb += [wp.en.eq(to_ram), wp.addr.eq(wr_ptr), wp.data.eq(self.w_data)]
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
    push, pop : In
        Producer and consumer strobes (``push`` only when ``can_push``; ``pop`` only when
        ``avail``).
    can_push : Out
        Fewer than ``depth`` tokens held at the start of the cycle.
    avail : Out
        A token is held, or is being pushed in this cycle.
    count : Out
    """

    def __init__(self, depth: int):
        _check_depth("TokenCounter", depth)
        self.depth = depth
        super().__init__({"push": In(1), "pop": In(1), "can_push": Out(1), "avail": Out(1),
                          "count": Out(range(depth + 1))})

    def elaborate(self, platform):
        m = Module()
        cnt = Signal(range(self.depth + 1))
        m.d.comb += [self.count.eq(cnt), self.can_push.eq(cnt < self.depth),
                     self.avail.eq((cnt != 0) | self.push)]
        m.d.sync += cnt.eq(cnt + self.push - self.pop)
        return m
