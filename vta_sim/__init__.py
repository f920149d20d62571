"""vtakit.vta_sim: the cycle-accurate Python model of the accelerator in vta_hw.

``semantics`` says what an instruction does; ``timing`` says when (docs/timing.md). Use
:class:`Simulator`::

    sim = Simulator(cfg, dram)              # dram: the device's uint8 array
    stats = sim.run(insn_addr, insn_count)  # timing=True by default
    print(stats.summary())
"""

from .errors import (
           DEFAULT_CYCLE_LIMIT,
           CycleLimitError,
           DeadlockError,
           DeviceError,
           SimCycleLimit,
           SimDeadlock,
           SimError,
           SimTimeout,
)
from .image import RunImage
from .simulator import Simulator
from .state import ArchState
from .stats import SimStats, UnitStats

__all__ = ["Simulator", "SimStats", "UnitStats", "ArchState", "RunImage", "SimError",
           "SimDeadlock", "SimCycleLimit", "SimTimeout", "DeviceError", "DeadlockError",
           "CycleLimitError", "DEFAULT_CYCLE_LIMIT"]
