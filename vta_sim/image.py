"""A saved run: configuration, DRAM contents and where the stream is, in one ``.npz``."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from vtakit.vta_hw.config import HwConfig

from .simulator import Simulator
from .stats import SimStats

__all__ = ["RunImage"]


@dataclass
class RunImage:
    """Everything needed to replay one run of the accelerator.

    Parameters
    ----------
    cfg : HwConfig
    dram : np.ndarray
        The DRAM contents (uint8) before the run.
    insn_addr : int
        Byte address of the first instruction.
    insn_count : int
    description : str
        Free text (what the stream computes).
    """

    cfg: HwConfig
    dram: np.ndarray
    insn_addr: int
    insn_count: int
    description: str = ""

    def save(self, path: str | os.PathLike) -> None:
        """Write the image as one ``.npz`` file."""
        np.savez_compressed(path, config=np.array(self.cfg.to_json()),
                            dram=np.asarray(self.dram, np.uint8),
                            insn_addr=np.int64(self.insn_addr),
                            insn_count=np.int64(self.insn_count),
                            description=np.array(self.description))

    @classmethod
    def load(cls, path: str | os.PathLike) -> RunImage:
        """Read an image written by :meth:`save`; ``ValueError`` if a part is missing."""
        with np.load(path, allow_pickle=False) as z:
            missing = {"config", "dram", "insn_addr", "insn_count"} - set(z.files)
            if missing:
                raise ValueError(f"{os.fspath(path)}: not a run image, missing "
                                 f"{', '.join(sorted(missing))} (expected config, dram, "
                                 f"insn_addr, insn_count)")
            return cls(cfg=HwConfig.from_json(str(z["config"])),
                       dram=np.array(z["dram"], np.uint8),
                       insn_addr=int(z["insn_addr"]), insn_count=int(z["insn_count"]),
                       description=str(z["description"]) if "description" in z.files else "")

    def run(self, *, timing: bool = True, cycle_limit: int | None = None,
            trace: str | os.PathLike | None = None) -> tuple[SimStats, Simulator]:
        """Run on a fresh simulator over a copy of the DRAM; returns the statistics and the
        simulator (its ``dram`` and ``state`` hold the results)."""
        sim = Simulator(self.cfg, self.dram.copy())
        stats = sim.run(self.insn_addr, self.insn_count, timing=timing,
                        cycle_limit=cycle_limit, trace=trace)
        return stats, sim
