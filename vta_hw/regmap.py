"""The control/status registers' addresses and CTRL bits (the map is documented in
:mod:`vtakit.vta_hw.csr`, which implements it).

Pure Python, so host code (the ``fpga`` device, the boards' bridge tests) reads the map without
Amaranth.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["CsrAddr", "CTRL_START", "CTRL_DONE", "CTRL_FAULT", "CTRL_RESET"]

CTRL_START = 1 << 0
CTRL_DONE = 1 << 1
CTRL_FAULT = 1 << 2
CTRL_RESET = 1 << 3


class CsrAddr(IntEnum):
    """Byte addresses of the registers."""

    CTRL = 0x00
    CYCLES = 0x04
    INSN_COUNT = 0x08
    INSN_ADDR = 0x0C
    HW_VER = 0x10
    HW_ID = 0x14
    FAULT = 0x18
