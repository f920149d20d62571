"""Errors the simulator raises: always with the instruction index and its decoded fields.

These are the simulator's own faults, as :class:`~vtakit.vta_hw.sim.RtlProtocolError` is the RTL
bench's. The device contract's errors (:class:`vtakit.driver.DeviceError`, ``DeadlockError``,
``CycleLimitError``) live in the driver, which sits above the simulator (``driver -> vta_sim``);
the ``sim`` device turns a :class:`SimError` into the driver's error of the same kind, keeping
its message, ``index`` and ``insn``.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SimError", "SimDeadlock", "SimCycleLimit", "SimTimeout", "ExecFault",
           "format_insn", "DeviceError", "DeadlockError", "CycleLimitError",
           "DEFAULT_CYCLE_LIMIT", "RAISE_CYCLE_LIMIT"]

#: The cycle limit of ``vtakit sim`` and the ``sim`` device unless they are given another: 2^32
#: cycles (about 43 s of a 100 MHz core). The largest legitimate runs are far below it (a
#: ResNet-18 region takes about 10^7 cycles, 400x less), while a corrupt instruction that would
#: take longer (a loop of 2^40 micro-ops) is refused at once instead of being simulated.
DEFAULT_CYCLE_LIMIT = 1 << 32

#: How to raise the limit, the end of every cycle-limit message.
RAISE_CYCLE_LIMIT = ("if the run is meant to take this long, raise the limit: cycle_limit= of "
                     "Simulator.run or SimDevice (None: no limit), or --cycle-limit of vtakit "
                     "sim (0: no limit)")


def format_insn(insn: Mapping[str, int] | None) -> str:
    """``GEMM(reset=0, uop_bgn=0, ...)``: the decoded fields of one instruction, on one line."""
    if insn is None:
        return "<none>"
    fields = dict(insn)
    kind = fields.pop("kind", "?")
    return f"{kind}(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"


class SimError(Exception):
    """The simulator could not execute a stream (a device error of the ``sim`` device).

    Attributes
    ----------
    index : int | None
        Index of the offending instruction in the stream (``None`` if no single one is to blame).
    insn : dict[str, int] | None
        Its decoded fields (``kind`` holds the instruction kind, e.g. ``"LOAD INP"``).
    """

    def __init__(self, message: str, index: int | None = None,
                 insn: Mapping[str, int] | None = None):
        self.index = index
        self.insn = dict(insn) if insn is not None else None
        where = (f"instruction #{index} {format_insn(insn)}: " if index is not None else "")
        super().__init__(where + message)


class SimDeadlock(SimError):
    """Every unit waits for a dependency token that nobody will push."""


class SimCycleLimit(SimError):
    """The run did not finish within the ``cycle_limit`` it was given (a functional run: one
    unit's instructions would take longer, by their closed-form durations)."""


class SimTimeout(SimError, TimeoutError):
    """The run took longer than the wall-clock ``timeout_s`` it was given (the stream may be
    fine; a device turns this into a plain ``TimeoutError``)."""


class ExecFault(Exception):
    """Raised by :mod:`.semantics` (which knows no instruction index); the caller wraps it in a
    :class:`SimError`."""


# The names these classes had before the device contract moved to the driver, kept for code
# written against them; the driver's errors derive from these, so catching them also catches
# what any device raises.
DeviceError = SimError
DeadlockError = SimDeadlock
CycleLimitError = SimCycleLimit
