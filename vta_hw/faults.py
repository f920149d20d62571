"""What the core reports when a run goes wrong: the bits of its ``fault`` port and the CSR
block's FAULT register (docs/hardware.md), and the deadlock detector's threshold.

Pure Python, so the RTL bench's host side and the driver read it without Amaranth.
"""

from __future__ import annotations

from enum import IntFlag

__all__ = ["Fault", "FAULT_BITS", "DEADLOCK_QUIET_CYCLES", "TOKEN_FAULTS", "describe_fault"]


class Fault(IntFlag):
    """The bits of the core's ``fault`` port (and the CSR block's FAULT register), cleared by
    ``start``.

    DEADLOCK: before FINISH, no unit could make progress for :data:`DEADLOCK_QUIET_CYCLES`
    cycles in a row (every unit waits for a command, a token or room in a token queue, and
    fetch has dispatched everything or waits for a full queue); ``done`` rises with it.
    UNFINISHED: when FINISH finished, the load or store unit still held an instruction (it was
    not ordered before FINISH by tokens). TOKENS_*: when FINISH finished, that token queue was
    not empty (a push without its pop; the queues are cleared by the next ``start``).
    UNFINISHED and TOKENS_* are set in the cycle after FINISH's finish cycle ``e`` (visible from
    ``e + 2``), from the state after every event of cycle ``e`` (docs/timing.md §4, "End of
    run").
    """

    DEADLOCK = 1 << 0
    UNFINISHED = 1 << 1
    TOKENS_L2G = 1 << 2
    TOKENS_G2L = 1 << 3
    TOKENS_G2S = 1 << 4
    TOKENS_S2G = 1 << 5


FAULT_BITS = 6

#: Consecutive cycles without progress after which the core declares a deadlock. One would do
#: (a cycle in which no unit is busy, takes, starts or pushes, and fetch neither reads nor
#: dispatches, leaves every register as it was, so the next cycle is the same), the margin
#: covers the command queues' refill; legal programs never have such a cycle before FINISH.
DEADLOCK_QUIET_CYCLES = 4

#: (token queue, its bit), in bit order.
TOKEN_FAULTS = (("l2g", Fault.TOKENS_L2G), ("g2l", Fault.TOKENS_G2L), ("g2s", Fault.TOKENS_G2S),
                ("s2g", Fault.TOKENS_S2G))


def describe_fault(fault: int, cycles: int) -> str:
    """What the core's ``fault`` port / FAULT register says, in one message: the words the
    ``rtl``, ``pynq`` and ``fpga`` devices raise (``cycles``: the core's cycle count when
    ``done`` rose). A register of 0 (a fault reported without a cause) and bits this host does
    not know (a core of another ISA version) are said in words too."""
    known = fault & ((1 << FAULT_BITS) - 1)
    unknown = fault & ~((1 << FAULT_BITS) - 1)
    f = Fault(known)
    parts = []
    if f & Fault.DEADLOCK:
        parts.append(f"deadlock detected at cycle {cycles}: no unit could make progress for "
                     f"{DEADLOCK_QUIET_CYCLES} cycles before FINISH (every unit waits for a "
                     f"token nobody will push; expected each pop to be matched by an earlier "
                     f"push)")
    if f & Fault.UNFINISHED:
        parts.append(f"FINISH completed at cycle {cycles} while the load or store unit still "
                     f"had an instruction to finish (expected the compute unit to pop a token "
                     f"from that unit before FINISH)")
    left = [q for q, bit in TOKEN_FAULTS if f & bit]
    if left:
        parts.append("run ended with tokens still in the dependency queues "
                     + ", ".join(left) + " (expected every push to be popped before FINISH)")
    names = ", ".join(b.name or "" for b in Fault)
    if unknown:
        parts.append(f"unknown fault bits {unknown:#x} (expected only bits 0..{FAULT_BITS - 1}: "
                     f"{names}; a core of another ISA version?)")
    if not fault:
        parts.append(f"fault register 0: the core reported a fault at cycle {cycles} without "
                     f"a cause (expected at least one of the bits {names})")
    return "; ".join(parts) + f" (core fault register {fault:#04x})"
