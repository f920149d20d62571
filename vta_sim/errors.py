"""Errors the simulator raises: always with the instruction index and its decoded fields."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DeviceError", "DeadlockError", "CycleLimitError", "ExecFault", "format_insn"]


def format_insn(insn: Mapping[str, int] | None) -> str:
    """``GEMM(reset=0, uop_bgn=0, ...)``: the decoded fields of one instruction, on one line."""
    if insn is None:
        return "<none>"
    fields = dict(insn)
    kind = fields.pop("kind", "?")
    return f"{kind}(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"


class DeviceError(Exception):
    """The accelerator could not execute a stream.

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


class DeadlockError(DeviceError):
    """Every unit waits for a dependency token that nobody will push."""


class CycleLimitError(DeviceError):
    """The run did not finish within the ``cycle_limit`` it was given."""


class ExecFault(Exception):
    """Raised by :mod:`.semantics` (which knows no instruction index); the caller wraps it in a
    :class:`DeviceError`."""
