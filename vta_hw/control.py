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

Where the instruction comes from: with a command queue of more than one entry, ``cand`` is the
queue's head in the cycle the unit takes it and the unit's own register afterwards (a
multiplexer). With one entry (the queue shows its writes, ``w_en`` and ``w_data``, on the
unit's :class:`~vtakit.vta_hw.interfaces.CommandSignature` port), the unit's register
*follows* the queue whenever the unit does not need its instruction in the next cycle: before
a take, and from the cycle before a finish (``finish_next``; a datapath reads no instruction
field in its finish cycle). Following means copying what is written into the queue, or the
queue's head if it was written while the register was busy. So the register already holds the
head when the unit takes it and ``cand`` is the register itself (no multiplexer in front of
the datapath, and the register packs with its input multiplexer on FPGAs); the running
instruction's push flags are kept apart for its finish.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.interfaces import CommandSignature
from vtakit.vta_hw.isa import INSN_WIDTH_BITS

__all__ = ["UnitControl", "unit_control", "command_member"]


def command_member(cfg: HwConfig) -> wiring.Member:
    """A unit's port to its command queue: ``In(CommandSignature)``, the head (``valid``,
    ``data``, ``take``) and, with a one-entry queue, the queue's writes (``w_en``, ``w_data``)
    that the unit snoops."""
    return In(CommandSignature(INSN_WIDTH_BITS, snoop=cfg.cmd_queue_depth == 1))


IDLE, WAIT, BUSY, PUSH = range(4)


@dataclass
class UnitControl:
    start: Signal      # the candidate instruction starts in this cycle
    cand: data.View    # (128-bit view) the instruction taken now, waiting, or running
    startable: data.View  # (128-bit view) the instruction a start in this cycle would begin:
    #                    equal to cand whenever start is high, but selected by the state
    #                    register alone (the waiting one, else the queue's head), not by the
    #                    take, so it hangs off no path through a finish and its pushes
    insn: Signal       # the unit's instruction register
    busy: Value        # an instruction has started and not finished
    idle: Value        # no instruction (taken, running or pushing)
    active: Value      # busy, or takes, starts or pushes in this cycle: the unit makes
    #                    progress (a unit that is not active waits for a command, a token or
    #                    room in a token queue, and stays so until another unit acts)
    state: Signal


def unit_control(m: Module, name: str, layout, cmd, pops: list[tuple[str, object]],
                 pushes: list[tuple[str, object]], finish: Value,
                 finish_next: Value) -> UnitControl:
    """Add a unit's control to ``m``.

    ``cmd`` is the unit's :func:`command_member`; with the queue's writes on it (a one-entry
    queue) the unit takes the register-only instruction path. ``pops``/``pushes`` are
    ``(flag name, token interface)`` for the token queues of this unit (its
    ``TokenPopSignature`` / ``TokenPushSignature`` members); ``finish`` is high in the finish
    cycle of a started instruction and ``finish_next`` in the cycle before.
    """
    cmd_valid, cmd_data, take = cmd.valid, cmd.data, cmd.take
    cmd_write = (cmd.w_en, cmd.w_data) if "w_en" in cmd.signature.members else None
    pops_ = [(flag, tok.avail, tok.pop) for flag, tok in pops]
    pushes_ = [(flag, tok.can_push, tok.push) for flag, tok in pushes]
    return _unit_control(m, name, layout, cmd_valid, cmd_data, take, pops_, pushes_, finish,
                         cmd_write, finish_next)


def _unit_control(m: Module, name: str, layout, cmd_valid: Value, cmd_data: Value, take: Signal,
                  pops: list[tuple[str, Value, Signal]], pushes: list[tuple[str, Value, Signal]],
                  finish: Value, cmd_write: tuple[Value, Value] | None,
                  finish_next: Value) -> UnitControl:
    state = Signal(range(4), name=f"{name}_state")
    insn = Signal(INSN_WIDTH_BITS, name=f"{name}_insn")
    fin = Signal(name=f"{name}_fin")
    m.d.comb += fin.eq(((state == BUSY) & finish) | (state == PUSH))
    # the push flags of the instruction that finishes
    if cmd_write is None:
        flags = data.View(layout, insn)
        push_flag = {flag: getattr(flags, flag) for flag, _, _ in pushes}
    else:
        saved = Signal(len(pushes), name=f"{name}_push_flags")
        push_flag = {flag: saved[k] for k, (flag, _, _) in enumerate(pushes)}
    ready = Signal(name=f"{name}_push_ready")
    m.d.comb += ready.eq(1)
    for flag, ok, _ in pushes:
        with m.If(push_flag[flag] & ~ok):
            m.d.comb += ready.eq(0)
    pushed = fin & ready
    for flag, _, strobe in pushes:
        m.d.comb += strobe.eq(pushed & push_flag[flag])
    free = (state == IDLE) | pushed
    m.d.comb += take.eq(free & cmd_valid)
    cand_bits = Signal(INSN_WIDTH_BITS, name=f"{name}_cand")
    if cmd_write is None:
        m.d.comb += cand_bits.eq(Mux(take, cmd_data, insn))
    else:
        m.d.comb += cand_bits.eq(insn)
    cand = data.View(layout, cand_bits)
    # In WAIT nothing is taken (free needs IDLE or a push, which needs BUSY or PUSH), so a
    # start begins the register's instruction; in any other state a start needs a take and
    # begins the queue's head.
    if cmd_write is None:
        startable = data.View(layout, Mux(state == WAIT, insn, cmd_data))
    else:
        startable = cand
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
    if cmd_write is None:
        with m.If(take):
            m.d.sync += insn.eq(cmd_data)
    else:
        # the instruction is needed in the next cycle: it waits, or it runs and does not
        # finish in the next cycle
        needed = (have & ~start) | ((start | ((state == BUSY) & ~fin)) & ~finish_next)
        # stale: the queue took an instruction while the register held the unit's own (the
        # queue is full until the unit takes it, so no write coincides with the reload)
        w_en, w_data = cmd_write
        stale = Signal(name=f"{name}_stale")
        with m.If(~needed):
            with m.If(stale):
                m.d.sync += [insn.eq(cmd_data), stale.eq(0)]
            with m.Elif(w_en):
                m.d.sync += insn.eq(w_data)
        with m.Elif(w_en):
            m.d.sync += stale.eq(1)
        with m.If(start):
            m.d.sync += saved.eq(Cat(*[getattr(cand, flag) for flag, _, _ in pushes]))
    with m.If(start):
        m.d.sync += state.eq(BUSY)
    with m.Elif(take):
        m.d.sync += state.eq(WAIT)
    with m.Elif(pushed):
        m.d.sync += state.eq(IDLE)
    with m.Elif(fin):
        m.d.sync += state.eq(PUSH)
    return UnitControl(start=start, cand=cand, startable=startable, insn=insn, busy=state == BUSY,
                       idle=state == IDLE, active=(state == BUSY) | take | start | pushed,
                       state=state)
