"""The take / pop / start / finish / push sequence shared by the load, compute and store units
(docs/timing.md §4), as a helper that adds its logic to a unit's module.

In one cycle ``c``, in this order (all combinational, so the chain below happens within ``c``):

1. an instruction that finishes at ``c`` (``finish`` from the datapath, or a push still
   pending from an earlier cycle) pushes its tokens if every target token queue has room;
2. a unit that is idle (or just pushed) takes the head of its command queue;
3. the taken (or waiting) instruction starts if every token it pops is available, popping them;
   ``start`` is high and ``cand`` holds the instruction for the datapath to begin with.

The pushes and finishes depend on registers only, the pops on other units' pushes; there is no
combinational loop between units.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Module, Mux, Signal, Value
from amaranth.lib import data

__all__ = ["UnitControl", "unit_control"]

IDLE, WAIT, BUSY, PUSH = range(4)


@dataclass
class UnitControl:
    start: Signal      # the candidate instruction starts in this cycle
    cand: data.View    # (128-bit view) the instruction taken now or waiting for tokens
    insn: Signal       # the instruction in progress (registered at take)
    busy: Value        # an instruction has started and not finished
    idle: Value        # no instruction (taken, running or pushing)
    state: Signal


def unit_control(m: Module, name: str, layout, cmd_valid: Value, cmd_data: Value, take: Signal,
                 pops: list[tuple[str, Value, Signal]], pushes: list[tuple[str, Value, Signal]],
                 finish: Value) -> UnitControl:
    """Add a unit's control to ``m``.

    ``pops``/``pushes`` are ``(flag name, available / can_push, pop / push strobe)`` for the
    token queues of this unit; ``finish`` is high in the finish cycle of a started instruction.
    """
    state = Signal(range(4), name=f"{name}_state")
    insn = Signal(128, name=f"{name}_insn")
    iv = data.View(layout, insn)
    fin = Signal(name=f"{name}_fin")
    m.d.comb += fin.eq(((state == BUSY) & finish) | (state == PUSH))
    ready = Signal(name=f"{name}_push_ready")
    m.d.comb += ready.eq(1)
    for flag, ok, _ in pushes:
        with m.If(getattr(iv, flag) & ~ok):
            m.d.comb += ready.eq(0)
    pushed = fin & ready
    for flag, _, strobe in pushes:
        m.d.comb += strobe.eq(pushed & getattr(iv, flag))
    free = (state == IDLE) | pushed
    m.d.comb += take.eq(free & cmd_valid)
    cand_bits = Signal(128, name=f"{name}_cand")
    m.d.comb += cand_bits.eq(Mux(take, cmd_data, insn))
    cand = data.View(layout, cand_bits)
    have = take | (state == WAIT)
    tok = Signal(name=f"{name}_tokens_ready")
    m.d.comb += tok.eq(1)
    for flag, avail, _ in pops:
        with m.If(getattr(cand, flag) & ~avail):
            m.d.comb += tok.eq(0)
    start = Signal(name=f"{name}_start")
    m.d.comb += start.eq(have & tok)
    for flag, _, strobe in pops:
        m.d.comb += strobe.eq(start & getattr(cand, flag))
    with m.If(take):
        m.d.sync += insn.eq(cmd_data)
    with m.If(start):
        m.d.sync += state.eq(BUSY)
    with m.Elif(take):
        m.d.sync += state.eq(WAIT)
    with m.Elif(pushed):
        m.d.sync += state.eq(IDLE)
    with m.Elif(fin):
        m.d.sync += state.eq(PUSH)
    return UnitControl(start=start, cand=cand, insn=insn, busy=state == BUSY,
                       idle=state == IDLE, state=state)
