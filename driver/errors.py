"""What a device raises when it cannot execute a stream: part of the device contract.

Every device (``sim``, ``rtl``, a board) raises these from :meth:`Device.wait
<vtakit.driver.device.Device.wait>`, whatever went wrong underneath, so callers handle one set of
errors::

    try:
        session.synchronize()
    except DeviceError as err:
        print(err.index, err.insn)   # the offending instruction, when one is to blame

The backends keep their own faults and the devices translate them: the simulator raises
:class:`vtakit.vta_sim.errors.SimError` (``vta_sim`` sits below the driver and never imports it),
the RTL bench :class:`vtakit.vta_hw.sim.RtlProtocolError`.

These classes also derive from the simulator's (``DeviceError`` from ``SimError``, and so on), so
code that catches the simulator's classes by their earlier names (``vtakit.vta_sim.DeviceError``,
from before the device contract moved here) still catches every device's errors.
"""

from __future__ import annotations

from collections.abc import Mapping

from vtakit.vta_sim.errors import SimCycleLimit, SimDeadlock, SimError

__all__ = ["DeviceError", "DeadlockError", "CycleLimitError"]


class DeviceError(SimError):
    """The accelerator could not execute a stream.

    Parameters
    ----------
    message : str
        The whole message (a device names the instruction in it when it knows it).
    index : int | None
    insn : Mapping[str, int] | None

    Attributes
    ----------
    index : int | None
        Index of the offending instruction in the stream (``None`` if no single one is to blame
        or the device cannot tell).
    insn : dict[str, int] | None
        Its decoded fields (``kind`` holds the instruction kind, e.g. ``"LOAD INP"``).
    """

    def __init__(self, message: str, index: int | None = None,
                 insn: Mapping[str, int] | None = None):
        Exception.__init__(self, message)  # the message is whole; SimError's would prefix it
        self.index = index
        self.insn = dict(insn) if insn is not None else None


class DeadlockError(DeviceError, SimDeadlock):
    """Every unit waits for a dependency token that nobody will push."""


class CycleLimitError(DeviceError, SimCycleLimit):
    """The run did not finish within the cycle limit the device was given."""
