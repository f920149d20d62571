"""The wall-clock limit of one run: the simulator gives up after ``timeout_s`` seconds."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .errors import SimTimeout

__all__ = ["Deadline"]


class Deadline:
    """``check(index)`` raises :class:`SimTimeout` naming instruction ``index`` once
    ``timeout_s`` seconds have passed since the deadline was made (``None``: never)."""

    def __init__(self, timeout_s: float | None, insns: Sequence[dict[str, int]]):
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s}: expected a positive number of seconds "
                             f"or None")
        self.timeout_s = timeout_s
        self.end = None if timeout_s is None else time.monotonic() + timeout_s
        self.insns = insns

    def check(self, index: int | None, cycle: int | None = None) -> None:
        if self.end is None or time.monotonic() <= self.end:
            return
        at = f" at cycle {cycle}" if cycle is not None else ""
        raise SimTimeout(f"wall-clock timeout: the run took more than {self.timeout_s} s{at} "
                         f"and was abandoned (expected it to finish sooner; raise timeout_s "
                         f"for a long run)", index,
                         self.insns[index] if index is not None else None)
