"""Run the emitted Verilog of the core under Verilator (or Icarus) driven by cocotb.

:func:`build` compiles the core (its Verilog cached by :mod:`.verilog_cache`) plus a DRAM-model
bench (:mod:`.tb`) into a cached simulator;
:class:`RtlSimulation` starts it once and serves many runs; ``vtakit.driver.devices.rtl``
wraps it as the driver's ``rtl`` device and ``vtakit.driver.devices.crosscheck`` compares it
with ``vta_sim``.
"""

from .build import RtlBuild, build, cache_root, missing_tools
from .process import RtlCycleLimit, RtlFault, RtlProtocolError, RtlRun, RtlSimulation, RtlTimeout
from .verilog_cache import cached_core_verilog, core_verilog

__all__ = ["RtlBuild", "build", "cache_root", "core_verilog", "cached_core_verilog",
           "missing_tools", "RtlSimulation", "RtlRun", "RtlProtocolError", "RtlCycleLimit",
           "RtlFault", "RtlTimeout"]
