"""The control/status registers' addresses and CTRL bits (the map is documented in
:mod:`vtakit.vta_hw.csr`, which implements it).

Pure Python, so host code (the ``fpga`` device, the boards' bridge tests) reads the map without
Amaranth.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["CsrAddr", "CTRL_START", "CTRL_DONE", "CTRL_FAULT", "CTRL_RESET", "CSR_WRITABLE",
           "AxiAddr", "AXI_REG_BYTES"]

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


#: The registers a host may write (the others are read-only).
CSR_WRITABLE = frozenset({CsrAddr.CTRL, CsrAddr.INSN_COUNT, CsrAddr.INSN_ADDR})


class AxiAddr(IntEnum):
    """Byte addresses of the registers the AXI top (:mod:`vtakit.vta_hw.axi_top`) adds after
    the core's, in the same AXI4-Lite window.

    ``AXI_STATUS`` (read-only): :class:`~vtakit.vta_hw.axi.AxiMaster`'s sticky ``error_cause``
    (bit 0 LATE: a read beat was due and had not arrived, bit 1 OVERFLOW, bit 2 RESP: the memory
    answered SLVERR/DECERR), cleared by START and RESET. Not 0 after a run: its data and cycle
    count are not to be trusted.
    """

    AXI_STATUS = 0x1C


#: Bytes of the AXI4-Lite register window (the smallest block Vivado's address editor gives).
AXI_REG_BYTES = 4096
