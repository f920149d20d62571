"""Architectural state: the five on-chip buffers, nothing about time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vtakit.vta_hw.config import HwConfig

__all__ = ["ArchState"]


@dataclass
class ArchState:
    """The on-chip SRAMs of one accelerator; they persist across runs (the driver keeps
    micro-op kernels resident in UOP).

    Attributes
    ----------
    cfg : HwConfig
    inp : np.ndarray
        int8, shape (inp_depth, batch, block_in).
    wgt : np.ndarray
        int8, shape (wgt_depth, block_out, block_in).
    acc : np.ndarray
        int32, shape (acc_depth, batch, block_out).
    out : np.ndarray
        int8, shape (out_depth, batch, block_out); GEMM and ALU write the low 8 bits of ACC.
    uop : np.ndarray
        uint32, shape (uop_depth,): micro-op words as :func:`vtakit.vta_hw.isa.encode_uops`
        writes them.
    """

    cfg: HwConfig
    inp: np.ndarray
    wgt: np.ndarray
    acc: np.ndarray
    out: np.ndarray
    uop: np.ndarray

    @classmethod
    def zeros(cls, cfg: HwConfig) -> ArchState:
        """A state with every buffer cleared (the hardware after reset)."""
        return cls(
            cfg=cfg,
            inp=np.zeros((cfg.inp_depth, cfg.batch, cfg.block_in), np.int8),
            wgt=np.zeros((cfg.wgt_depth, cfg.block_out, cfg.block_in), np.int8),
            acc=np.zeros((cfg.acc_depth, cfg.batch, cfg.block_out), np.int32),
            out=np.zeros((cfg.out_depth, cfg.batch, cfg.block_out), np.int8),
            uop=np.zeros((cfg.uop_depth,), np.uint32),
        )

    def copy(self) -> ArchState:
        return ArchState(self.cfg, self.inp.copy(), self.wgt.copy(), self.acc.copy(),
                         self.out.copy(), self.uop.copy())
