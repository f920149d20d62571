"""The ``crosscheck`` device and command: the RTL against ``vta_sim``, same DRAM contents and
same total cycle count (docs/timing.md).

:class:`CrossCheckDevice` is a device like the others (:mod:`vtakit.driver.devices`): it runs every
stream on the ``sim`` and the ``rtl`` device and raises :class:`Mismatch` when they disagree, so
any driver workload doubles as a cross-check; an illegal stream must fail on both with the same
error class. It lives in the driver because it needs both the
simulator and the RTL device, and only the driver sits above both (``driver -> vta_sim,
vta_hw``).

``python -m vtakit.driver.devices.crosscheck --count 1000 --config default`` (also reachable as
``python -m vtakit.vta_hw.sim.crosscheck``) runs that many random legal programs
(:func:`vtakit.vta_sim.testing.random_program`) through both, in one simulator process, and
prints every mismatch with the program disassembled and the first diverging byte (and the
STORE that wrote it) or the two cycle counts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vtakit.driver.device import Device, DeviceInfo, RunResult
from vtakit.driver.devices.rtl import RtlDevice
from vtakit.driver.devices.sim import SimDevice
from vtakit.driver.errors import DeviceError
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import MemType

if TYPE_CHECKING:
    from vtakit.vta_sim.image import RunImage

__all__ = ["Mismatch", "CrossCheckDevice", "compare_run", "check_images", "runaway_bound", "main"]


class Mismatch(AssertionError):
    """``sim`` and ``rtl`` disagree on a stream."""


def _stores_covering(dram_stream: np.ndarray, cfg: HwConfig, byte: int) -> list[int]:
    """Indices of the STOREs of a stream whose DRAM footprint covers ``byte``."""
    out = []
    for i, insn in enumerate(isa.decode(bytes(dram_stream[k:k + isa.INSN_BYTES]), cfg)
                             for k in range(0, dram_stream.size, isa.INSN_BYTES)):
        if isinstance(insn, isa.MemInsn) and insn.opcode == isa.Opcode.STORE and insn.x_size:
            e = cfg.elem_bytes(MemType.OUT)
            for y in range(insn.y_size):
                lo = (insn.dram_base + y * insn.x_stride) * e
                if lo <= byte < lo + insn.x_size * e:
                    out.append(i)
                    break
    return out


def compare_run(cfg: HwConfig, stream: np.ndarray, sim_dram: np.ndarray, rtl_dram: np.ndarray,
                sim_cycles: int, rtl_cycles: int, what: str = "stream",
                rtl_tb_cycles: int | None = None) -> None:
    """Raise :class:`Mismatch` (with the disassembly) if the two runs differ."""
    from vtakit.vta_hw.disasm import disassemble

    problems = []
    if sim_cycles != rtl_cycles:
        problems.append(f"cycles: sim {sim_cycles}, rtl {rtl_cycles}"
                        + (f" (bench counted {rtl_tb_cycles})" if rtl_tb_cycles is not None
                           else ""))
    elif rtl_tb_cycles is not None and rtl_tb_cycles != rtl_cycles:
        problems.append(f"the core's cycles register says {rtl_cycles} but done rose at cycle "
                        f"{rtl_tb_cycles}")
    n = min(sim_dram.size, rtl_dram.size)
    diff = np.flatnonzero(sim_dram[:n] != rtl_dram[:n])
    if diff.size:
        b = int(diff[0])
        stores = _stores_covering(stream, cfg, b)
        problems.append(f"DRAM: {diff.size} bytes differ, the first at {b:#x}: sim "
                        f"{sim_dram[b]:#04x}, rtl {rtl_dram[b]:#04x}; written by STORE "
                        f"#{stores[0] if stores else '?'} (stores covering it: {stores})")
    if problems:
        listing = "\n".join(disassemble(bytes(stream), cfg))
        raise Mismatch(f"rtl and sim disagree on {what}:\n  " + "\n  ".join(problems)
                       + f"\nprogram:\n{listing}")


@dataclass
class _Pending:
    insn_addr: int
    insn_count: int
    refused: DeviceError | None = None  # the rtl device's refusal in run(), before running


class CrossCheckDevice(Device):
    """A device that runs every stream on ``sim`` and on ``rtl`` and compares them.

    Parameters
    ----------
    cfg : HwConfig
    dram_bytes : int
    rtl : RtlDevice | None
        The RTL device to use (one is created otherwise); ``close()`` closes it.
    **rtl_args
        Passed to :class:`RtlDevice` when one is created (``simulator``, ``waves``, ...).

    Reads and ``wait()`` results come from the RTL (with the simulator's statistics); after
    every run the two DRAMs and cycle counts must agree, else :class:`Mismatch`. A stream
    that fails must fail on both with the same error class (``DeadlockError``,
    ``CycleLimitError``, ``DeviceError``), which ``wait()`` raises (the simulator's, naming the
    instruction), else :class:`Mismatch`. The rtl device refuses a stream whose SRAM indices
    leave their buffer in ``run()``, before it runs (:mod:`vtakit.driver.stream_check`); the
    refusal is held and compared in ``wait()`` like a failure of the run. The simulator ran such
    a stream up to the fault, so afterwards its DRAM is made the RTL's again (which ``read``
    returns and the stream did not touch), and the next run starts both from the same memory.

    Attributes
    ----------
    sim : SimDevice
    rtl : RtlDevice
    keeps_sram : bool
        ``True``: both devices keep their on-chip buffers between runs.
    """

    keeps_sram = True

    def __init__(self, cfg: HwConfig, *, dram_bytes: int = 16 << 20,
                 rtl: RtlDevice | None = None, **rtl_args: Any):
        super().__init__(cfg)
        self.sim = SimDevice(self.cfg, dram_bytes=dram_bytes)
        self.rtl = rtl or RtlDevice(self.cfg, dram_bytes=dram_bytes, **rtl_args)
        self._pending: _Pending | None = None

    def allocate(self, nbytes: int, align: int) -> int:
        a = self.sim.allocate(nbytes, align)
        b = self.rtl.allocate(nbytes, align)
        assert a == b, (a, b)
        return a

    def free(self, addr: int) -> None:
        self.sim.free(addr)
        self.rtl.free(addr)

    def reserve(self, addr: int, nbytes: int) -> int:
        self.sim.reserve(addr, nbytes)
        return self.rtl.reserve(addr, nbytes)

    def write(self, addr: int, data: bytes | np.ndarray) -> None:
        self.sim.write(addr, data)
        self.rtl.write(addr, data)

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        return self.rtl.read(addr, nbytes)

    def run(self, insn_addr: int, insn_count: int) -> None:
        # the rtl device first: its checks of the arguments include the sim device's, so an
        # argument error leaves neither device with a pending run
        try:
            self.rtl.run(insn_addr, insn_count)
            refused = None
        except DeviceError as err:
            refused = err
        self.sim.run(insn_addr, insn_count)
        self._pending = _Pending(insn_addr, insn_count, refused)

    def wait(self, timeout_s: float) -> RunResult:
        p = self._pending
        if p is None:
            raise RuntimeError("wait() without a run(): nothing is running on the crosscheck "
                               "device")
        self._pending = None
        stream = self.sim.dram[p.insn_addr:p.insn_addr + isa.INSN_BYTES * p.insn_count].copy()
        s, s_err = _outcome(self.sim.wait, timeout_s)
        if p.refused is None:
            # a core that runs past runaway_bound(the simulator's count) is a mismatch now,
            # not a wall-clock timeout later
            with _bounded(self.rtl, None if s is None else s.cycles):
                r, r_err = _outcome(self.rtl.wait, timeout_s)
        else:
            r, r_err = None, p.refused
            n = min(self.sim.dram.size, self.rtl.dram.size)
            np.copyto(self.sim.dram[:n], self.rtl.dram[:n])
        if s_err is not None or r_err is not None:
            _same_failure(self.cfg, stream, s_err, r_err)
        assert s is not None and r is not None
        compare_run(self.cfg, stream, self.sim.dram, self.rtl.dram, s.cycles, r.cycles,
                    rtl_tb_cycles=r.stats["tb_cycles"])
        return RunResult(cycles=r.cycles, stats=s.stats)

    def identify(self) -> DeviceInfo:
        return self.rtl.identify()

    def close(self) -> None:
        self.rtl.close()


def _outcome(wait: Callable[[float], RunResult], timeout_s: float
             ) -> tuple[RunResult | None, Exception | None]:
    try:
        return wait(timeout_s), None
    except (DeviceError, TimeoutError) as err:
        return None, err


def _same_failure(cfg: HwConfig, stream: np.ndarray, sim_err: Exception | None,
                  rtl_err: Exception | None) -> None:
    """Both devices failed with the same class: raise it (the simulator's, which names the
    instruction). A timeout on either side is raised as it is (wall-clock time is no fault of
    the stream). Otherwise :class:`Mismatch`."""
    from vtakit.vta_hw.disasm import disassemble

    for err in (sim_err, rtl_err):
        if isinstance(err, TimeoutError) and not isinstance(err, DeviceError):
            raise err
    if sim_err is not None and rtl_err is not None and type(sim_err) is type(rtl_err):
        assert isinstance(sim_err, DeviceError)
        raise type(sim_err)(f"{sim_err} [rtl agrees: {rtl_err}]", sim_err.index,
                            sim_err.insn) from None

    def what(err: Exception | None) -> str:
        return "ran to the end" if err is None else f"raised {type(err).__name__}: {err}"

    listing = "\n".join(disassemble(bytes(stream), cfg))
    raise Mismatch(f"rtl and sim disagree on how the stream fails:\n  sim {what(sim_err)}\n"
                   f"  rtl {what(rtl_err)}\nprogram:\n{listing}")


def runaway_bound(sim_cycles: int) -> int:
    """The cycle limit :func:`check_images` gives a device for an image the simulator ran in
    ``sim_cycles``: twice that and 1,000 more (a correct device takes exactly ``sim_cycles``)."""
    return 2 * sim_cycles + 1000


@contextlib.contextmanager
def _bounded(dev, sim_cycles: int | None):
    """``dev``'s ``cycle_limit`` lowered to :func:`runaway_bound` of ``sim_cycles`` for the
    block, and put back after it (nothing for a device without one, or without a count);
    yields the limit in force."""
    own = getattr(dev, "cycle_limit", None)
    if sim_cycles is not None and hasattr(dev, "cycle_limit"):
        bound = runaway_bound(sim_cycles)
        dev.cycle_limit = bound if own is None else min(own, bound)
    try:
        yield getattr(dev, "cycle_limit", None)
    finally:
        if hasattr(dev, "cycle_limit"):
            dev.cycle_limit = own


def check_images(images: Iterable[RunImage], rtl: Device, *, stop_on_first: bool = False,
                 log: Callable[[str], object] | None = None) -> list[str]:
    """Run each :class:`~vtakit.vta_sim.image.RunImage` on ``sim`` (fresh) and on the RTL device
    ``rtl`` (one process for all), both at the image's own addresses
    (:func:`~vtakit.driver.session.run_image`); return the mismatch reports.

    A device with a ``cycle_limit`` (the ``rtl`` and ``sim`` devices) runs each image with
    the limit :func:`runaway_bound` of the simulator's count, so a core that runs away (a
    counter that never reaches its end) is a mismatch within seconds, not a wall-clock
    timeout ten minutes later."""
    from vtakit.driver.errors import CycleLimitError
    from vtakit.driver.session import run_image
    from vtakit.vta_hw.disasm import disassemble

    failures = []
    for img in images:
        stats, sim = img.run()
        stream = img.dram[img.insn_addr:img.insn_addr + isa.INSN_BYTES * img.insn_count]
        limit = None
        try:
            with _bounded(rtl, stats.cycles) as limit:
                ran = run_image(rtl, img)
        except CycleLimitError as e:
            listing = "\n".join(disassemble(bytes(stream), img.cfg))
            failures.append(f"rtl and sim disagree on {img.description}: sim finished in "
                            f"{stats.cycles} cycles, rtl did not finish within "
                            f"{limit} ({e})\nprogram:\n{listing}")
            if log:
                log(failures[-1])
            if stop_on_first:
                break
            continue
        r, got = ran.result, ran.dram
        try:
            compare_run(img.cfg, stream, sim.dram, got, stats.cycles, r.cycles,
                        img.description,
                        r.stats.get("tb_cycles") if isinstance(r.stats, dict) else None)
        except Mismatch as e:
            failures.append(str(e))
            if log:
                log(str(e))
            if stop_on_first:
                break
    return failures


def main(argv: list[str] | None = None) -> int:
    """The command line: random programs through ``vta_sim`` and the RTL; 1 on a mismatch."""
    from vtakit.vta_hw.config import preset
    from vtakit.vta_sim.testing import IMAGE_BYTES, random_program

    ap = argparse.ArgumentParser(prog="python -m vtakit.driver.devices.crosscheck",
                                 description="random programs through vta_sim and the RTL")
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--config", default="default", help="preset name or JSON file")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--waves", help="write an FST waveform of the whole session here")
    ap.add_argument("--stop", action="store_true", help="stop at the first mismatch")
    args = ap.parse_args(argv)
    cfg = (HwConfig.from_json(open(args.config).read()) if os.path.exists(args.config)
           else preset(args.config))
    t0 = time.perf_counter()
    rtl = RtlDevice(cfg, dram_bytes=IMAGE_BYTES, waves=args.waves)
    print(f"built in {time.perf_counter() - t0:.1f} s; running {args.count} programs "
          f"(config {args.config} {cfg.hash})", flush=True)
    t0 = time.perf_counter()
    failures: list[str] = []
    cycles = 0
    try:
        for k in range(args.count):
            img = random_program(cfg, args.seed + k)
            failures += check_images([img], rtl, log=lambda s: print(s, flush=True))
            cycles += rtl.last_stats.cycles if rtl.last_stats else 0
            if failures and args.stop:
                break
            if (k + 1) % 50 == 0:
                print(f"{k + 1} programs, {len(failures)} mismatches", flush=True)
    finally:
        rtl.close()
    dt = time.perf_counter() - t0
    print(f"{args.count} programs, {len(failures)} mismatches; {cycles} RTL cycles in "
          f"{dt:.1f} s ({cycles / dt:,.0f} cycles/s including the simulator)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
