"""A simulator device that records which bytes of device memory each run of a stream changed
(the confinement tests: no stream may write outside the slots it may write)."""

from __future__ import annotations

import numpy as np

from vtakit.driver.devices.sim import SimDevice


class WatchedSim(SimDevice):
    """`SimDevice`; after each run, ``changed`` holds the byte addresses the stream changed
    (also when the run failed)."""

    def run(self, insn_addr, insn_count):
        self.before = self.read(0, self.dram.size).copy()
        super().run(insn_addr, insn_count)

    def wait(self, timeout_s):
        try:
            return super().wait(timeout_s)
        finally:
            self.changed = np.flatnonzero(self.read(0, self.dram.size) != self.before)
