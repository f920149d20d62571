"""The event kernel: processes, command queues, dependency-token queues, and time.

A process is a generator that yields what it waits for: ``("delay", n)``, ``("take", queue)``
(returns an instruction index), ``("dispatch", queue, index, name)``, ``("pop", [token queues])``,
``("push", [token queues])``, ``("xfer", transfer)``. The kernel advances from event to event.
Within one cycle, process steps run first (in the order they were scheduled), then the
end-of-cycle callbacks (memory-port arbitration); a freed queue slot is usable the next cycle.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, Protocol

__all__ = ["Kernel", "Proc", "CmdQueue", "TokenQueue", "Port"]


class Proc:
    """One process: a unit's generator plus what it is doing, for error messages."""

    __slots__ = ("name", "gen", "version", "retry", "index", "waiting", "clock")

    def __init__(self, name: str):
        self.name = name
        self.gen: Generator[tuple, Any, None] | None = None
        self.version = 0  # a scheduled wake-up counts only if it carries the current version
        self.retry: tuple | None = None  # the blocked command, handled again on wake-up
        self.index: int | None = None  # instruction being executed or dispatched
        self.waiting = ""  # what it is blocked on
        # vector clock: instructions of each unit (load, compute, store) that happen before
        # this process's current point, through its own order and the tokens it popped
        self.clock = [0, 0, 0]


class CmdQueue:
    """A command queue of ``depth`` instructions between fetch and one unit."""

    def __init__(self, name: str, depth: int):
        self.name = name
        self.depth = depth
        self.entries: deque[tuple[int, int]] = deque()  # (cycle visible, instruction index)
        self.unit_waiter: Proc | None = None
        self.fetch_waiter: Proc | None = None
        self.take_cycle = -1
        self.takes = 0  # taken during take_cycle; their slots are usable the cycle after


class TokenQueue:
    """A dependency-token queue (tokens carry no data: a counter) of capacity ``depth``."""

    def __init__(self, name: str, depth: int):
        self.name = name
        self.depth = depth
        self.count = 0
        self.clocks: deque[tuple[int, ...]] = deque()  # the pusher's clock, one per token
        self.pop_waiter: Proc | None = None
        self.push_waiter: Proc | None = None
        self.pop_cycle = -1
        self.pops = 0  # popped during pop_cycle; their slots are usable the cycle after


class Port(Protocol):
    def request(self, transfer: Any) -> None: ...


RETRY = object()  # wake-up value: handle the blocked command again
_BLOCKED = object()  # the command could not complete; RETRY it when woken
_SUSPENDED = object()  # the command completes when the process is woken (delay, transfer)


class Kernel:
    """Event queue and command handling. ``flags`` names the pop flag of each (unit, token
    queue), for messages."""

    def __init__(self, flags: dict[tuple[str, str], str]):
        self.heap: list[tuple] = []
        self.seq = 0
        self.now = 0
        self.port: Port | None = None
        self.flags = flags

    def schedule(self, t: int, proc: Proc, value: Any = None) -> None:
        """Resume ``proc`` at cycle ``t`` with ``value`` (``RETRY``: handle its command again)."""
        self.seq += 1
        heapq.heappush(self.heap, (t, 0, self.seq, proc, proc.version, value))

    def at_end_of_cycle(self, t: int, fn: Callable[[], None]) -> None:
        """Call ``fn`` at cycle ``t`` after every process step of that cycle."""
        self.seq += 1
        heapq.heappush(self.heap, (t, 1, self.seq, fn, 0, None))

    def run(self, done: Callable[[], int | None], limit: int | None,
            on_limit: Callable[[int], None], poll: Callable[[], None] | None = None) -> None:
        """Process events until none is left or ``done()`` returns a cycle and that cycle's
        events have all run; ``on_limit(limit)`` (which raises) past ``limit``; ``poll()``
        (which may raise) every few thousand events."""
        heap = self.heap
        events = 0
        while heap:
            events += 1
            if poll is not None and not events & 0xFFF:
                poll()
            end = done()
            if end is not None and heap[0][0] > end:
                return
            t, phase, _, target, version, value = heapq.heappop(heap)
            if limit is not None and t > limit:
                on_limit(limit)
            self.now = t
            if phase == 1:
                target()
            elif version == target.version:
                target.version += 1  # any other wake-up already scheduled for it is stale
                self._advance(target, value)

    def _advance(self, proc: Proc, value: Any) -> None:
        gen = proc.gen
        assert gen is not None
        while True:
            if value is RETRY:
                cmd = proc.retry
                assert cmd is not None
            else:
                try:
                    cmd = gen.send(value)
                except StopIteration:
                    return
            value = self._handle(proc, cmd)
            if value is _BLOCKED:
                proc.retry = cmd
                return
            if value is _SUSPENDED:
                return

    def _handle(self, proc: Proc, cmd: tuple) -> Any:
        what = cmd[0]
        if what == "delay":
            proc.waiting = "the current step to end"
            self.schedule(self.now + cmd[1], proc)
            return _SUSPENDED
        if what == "take":
            return self._take(proc, cmd[1])
        if what == "dispatch":
            return self._dispatch(proc, cmd[1], cmd[2])
        if what == "pop":
            return self._pop(proc, cmd[1])
        if what == "push":
            return self._push(proc, cmd[1])
        if what == "xfer":
            assert self.port is not None
            proc.waiting = "its memory transfer"
            self.port.request(cmd[1])
            return _SUSPENDED
        raise AssertionError(f"unknown kernel command {cmd!r}")

    def _take(self, proc: Proc, q: CmdQueue) -> Any:
        now = self.now
        if q.entries:
            avail, k = q.entries[0]
            if avail > now:
                self.schedule(avail, proc, RETRY)
                return _BLOCKED
            q.entries.popleft()
            if q.take_cycle != now:
                q.take_cycle, q.takes = now, 0
            q.takes += 1
            if q.fetch_waiter is not None:
                self.schedule(now + 1, q.fetch_waiter, RETRY)
                q.fetch_waiter = None
            return k
        q.unit_waiter = proc
        proc.waiting = "a command"
        return _BLOCKED

    def _dispatch(self, proc: Proc, q: CmdQueue, k: int) -> Any:
        now = self.now
        used = len(q.entries) + (q.takes if q.take_cycle == now else 0)
        if used >= q.depth:
            proc.waiting = f"space in the {q.name} command queue"
            if len(q.entries) < q.depth:  # a slot freed this cycle: usable next cycle
                self.schedule(now + 1, proc, RETRY)
            else:
                q.fetch_waiter = proc
            return _BLOCKED
        q.entries.append((now + 1, k))
        if q.unit_waiter is not None:
            self.schedule(now + 1, q.unit_waiter, RETRY)
            q.unit_waiter = None
        self.schedule(now + 1, proc)  # one dispatch per cycle
        return _SUSPENDED

    def _pop(self, proc: Proc, tqs: list[TokenQueue]) -> Any:
        now = self.now
        missing = [tq for tq in tqs if tq.count == 0]
        if missing:
            for tq in missing:
                tq.pop_waiter = proc
            proc.waiting = "token " + " and ".join(
                f"{tq.name} ({self.flags[proc.name, tq.name]})" for tq in missing)
            return _BLOCKED
        for tq in tqs:
            tq.count -= 1
            proc.clock = [max(a, b) for a, b in zip(proc.clock, tq.clocks.popleft())]
            if tq.pop_cycle != now:
                tq.pop_cycle, tq.pops = now, 0
            tq.pops += 1
            if tq.push_waiter is not None:
                self.schedule(now + 1, tq.push_waiter, RETRY)
                tq.push_waiter = None
        return None

    def _push(self, proc: Proc, tqs: list[TokenQueue]) -> Any:
        now = self.now
        full = [tq for tq in tqs
                if tq.count + (tq.pops if tq.pop_cycle == now else 0) >= tq.depth]
        if full:
            proc.waiting = "space in token queue " + " and ".join(tq.name for tq in full)
            if all(tq.count < tq.depth for tq in full):  # freed this cycle: usable next
                self.schedule(now + 1, proc, RETRY)
            else:
                for tq in full:
                    if tq.count >= tq.depth:
                        tq.push_waiter = proc
            return _BLOCKED
        for tq in tqs:
            tq.count += 1
            tq.clocks.append(tuple(proc.clock))
            if tq.pop_waiter is not None:
                self.schedule(now, tq.pop_waiter, RETRY)
                tq.pop_waiter = None
        return None
