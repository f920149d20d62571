"""A saved run: configuration, DRAM contents and where the stream is, in one ``.npz``."""

from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from vtakit.vta_hw.config import HwConfig, check_saved_config

from .errors import DEFAULT_CYCLE_LIMIT
from .simulator import Simulator
from .stats import SimStats

__all__ = ["RunImage"]


class _NotAnImage(Exception):
    """An npz without the parts of a run image (raised inside `RunImage.load`'s reading)."""


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
        """Write the image as one ``.npz`` file, with its configuration's hash (`load` checks
        it)."""
        np.savez_compressed(path, config=np.array(self.cfg.to_json()),
                            config_hash=np.array(self.cfg.hash),
                            dram=np.asarray(self.dram, np.uint8),
                            insn_addr=np.int64(self.insn_addr),
                            insn_count=np.int64(self.insn_count),
                            description=np.array(self.description))

    @classmethod
    def load(cls, path: str | os.PathLike, cfg: HwConfig | None = None) -> RunImage:
        """Read an image written by :meth:`save`. ``ValueError`` if a part is missing or
        corrupt, if the stored configuration does not hash to the stored hash, or if `cfg` is
        given and the image is for another configuration."""
        where = os.fspath(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                files = set(z.files)
                missing = {"config", "dram", "insn_addr", "insn_count"} - files
                if missing:
                    raise _NotAnImage(f"{where}: not a run image, missing "
                                      f"{', '.join(sorted(missing))} (expected config, dram, "
                                      f"insn_addr, insn_count)")
                text = str(z["config"])
                want = str(z["config_hash"]) if "config_hash" in files else None
                dram = np.array(z["dram"], np.uint8)
                insn_addr, insn_count = int(z["insn_addr"]), int(z["insn_count"])
                description = str(z["description"]) if "description" in files else ""
        except _NotAnImage as e:
            raise ValueError(str(e)) from None
        except (OSError, EOFError, KeyError, TypeError, ValueError, AttributeError,
                zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError) as e:
            raise ValueError(f"{where}: not a readable run image ({type(e).__name__}: {e})") \
                from None
        try:
            stored = HwConfig.from_json(text)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: config: {e}") from None
        check_saved_config(stored, want, cfg, where)
        if not (0 <= insn_addr and 0 <= insn_count and insn_addr + 16 * insn_count
                <= dram.size):
            raise ValueError(f"{where}: {insn_count} instructions at byte {insn_addr} run past "
                             f"the image's {dram.size} bytes of DRAM")
        return cls(cfg=stored, dram=dram, insn_addr=insn_addr, insn_count=insn_count,
                   description=description)

    def run(self, *, timing: bool = True, cycle_limit: int | None = DEFAULT_CYCLE_LIMIT,
            trace: str | os.PathLike | None = None) -> tuple[SimStats, Simulator]:
        """Run on a fresh simulator over a copy of the DRAM; returns the statistics and the
        simulator (its ``dram`` and ``state`` hold the results)."""
        sim = Simulator(self.cfg, self.dram.copy())
        stats = sim.run(self.insn_addr, self.insn_count, timing=timing,
                        cycle_limit=cycle_limit, trace=trace)
        return stats, sim
