"""The control/status register block: a 32-bit register bus in front of :class:`Core`'s
control ports (docs/hardware.md, "Register map").

The bus is deliberately minimal so that any host bridge (AXI4-Lite on Zynq, a UART bridge or a
Wishbone SoC on the small boards) can drive it with a few lines of glue: ``addr`` is a byte
address (word-aligned; the two low bits are ignored), ``w_en`` writes ``w_data`` in that cycle,
``r_en`` reads, and ``r_data`` holds the word in the next cycle (registered, like a block RAM).
Unmapped addresses read 0 and ignore writes; writes to read-only registers are ignored.

===== ============ ==== ===============================================================
addr  name         mode meaning
===== ============ ==== ===============================================================
0x00  CTRL         RW   bit 0 START: write 1 to pulse ``start`` for one cycle (reads 0);
                        bit 1 DONE: read-only, the run ended (``done`` of the core,
                        two cycles late, when FAULT is complete);
                        bit 2 FAULT: read-only, FAULT is not 0;
                        bit 3 RESET: write 1 to pulse ``core_reset`` (reads 0)
0x04  CYCLES       RO   the core's cycle counter (the total cycle count once DONE is set)
0x08  INSN_COUNT   RW   instructions of the stream (the last is FINISH)
0x0C  INSN_ADDR    RW   byte address of the stream (16-aligned)
0x10  HW_VER       RO   ``(major << 16) | (minor << 8) | patch`` of ``isa.HW_VER``
0x14  HW_ID        RO   ``cfg.hash_u32``: the configuration hash
0x18  FAULT        RO   the core's ``fault`` (:class:`~vtakit.vta_hw.faults.Fault`): bit 0
                        DEADLOCK, bit 1 UNFINISHED, bits 2-5 tokens left in l2g, g2l,
                        g2s, s2g; cleared by START
===== ============ ==== ===============================================================

Worked example, one run: write INSN_ADDR = 0x1000, INSN_COUNT = 42, CTRL = 1; poll CTRL until
bit 1 is set (bit 2 tells whether it failed; FAULT says how); read CYCLES. The write to CTRL at
cycle ``w``
pulses ``start`` at ``w + 1``, so the core's cycle 0 is ``w + 2``. After a fault, write CTRL =
8 (RESET) before the next start: ``core_reset`` resets the core's registers (the SoC wraps the
core in ``ResetInserter``), not its buffers.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.faults import FAULT_BITS
from vtakit.vta_hw.regmap import CTRL_DONE, CTRL_FAULT, CTRL_RESET, CTRL_START, CsrAddr
from vtakit.vta_hw.top import hw_ver_word

__all__ = ["CsrBlock", "CsrAddr", "CTRL_START", "CTRL_DONE", "CTRL_FAULT", "CTRL_RESET"]

class CsrBlock(wiring.Component):
    """Memory-mapped control registers for one :class:`~vtakit.vta_hw.top.Core`.

    Connect the ``core_*`` ports to the core's ports of the same name without the prefix
    (``core_start`` → ``start``, ``core_done`` ← ``done``, ...).

    Parameters
    ----------
    cfg : HwConfig
        Gives ``HW_ID`` (``cfg.hash_u32``).
    addr_bits : int
        Width of the byte address (at least 5; higher bits must be 0 for a register hit).

    Attributes
    ----------
    addr, w_en, w_data, r_en : In
        The register bus (host side).
    r_data : Out
        The word read in the previous cycle (0 when that cycle had no read).
    core_start, core_insn_addr, core_insn_count : Out
        To the core.
    core_reset : Out
        A one-cycle pulse (CTRL bit 3): reset the core's ``sync`` domain (not its buffers).
    core_done, core_cycles, core_fault : In
        From the core.
    """

    def __init__(self, cfg: HwConfig, addr_bits: int = 8):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"CsrBlock: cfg must be an HwConfig, got {type(cfg).__name__}")
        if not isinstance(addr_bits, int) or isinstance(addr_bits, bool) or addr_bits < 5:
            raise ValueError(f"CsrBlock: addr_bits={addr_bits!r} must be an int >= 5 "
                             f"(registers go up to 0x{max(CsrAddr):02x})")
        self.cfg = cfg.validate()
        self.addr_bits = addr_bits
        super().__init__({
            "addr": In(addr_bits), "w_en": In(1), "w_data": In(32), "r_en": In(1),
            "r_data": Out(32),
            "core_start": Out(1), "core_insn_addr": Out(32), "core_insn_count": Out(32),
            "core_reset": Out(1),
            "core_done": In(1), "core_cycles": In(32), "core_fault": In(FAULT_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        insn_addr = Signal(32)
        insn_count = Signal(32)
        start = Signal()
        reset = Signal()
        m.d.comb += [self.core_start.eq(start), self.core_insn_addr.eq(insn_addr),
                     self.core_insn_count.eq(insn_count), self.core_reset.eq(reset)]
        word = self.addr[2:]
        hit = {a: (word == (a >> 2)) for a in CsrAddr}

        # DONE follows the core's done two cycles late: the core completes FAULT in the second
        # cycle after FINISH's finish cycle (Fault), so a host that sees DONE sees FAULT too
        done_1, done_2 = Signal(), Signal()
        m.d.sync += [done_1.eq(self.core_done), done_2.eq(done_1 & self.core_done)]
        done = done_2 & self.core_done
        m.d.sync += [start.eq(0), reset.eq(0)]
        with m.If(self.w_en):
            with m.If(hit[CsrAddr.CTRL]):
                m.d.sync += [start.eq(self.w_data[0]), reset.eq(self.w_data[3])]
            with m.If(hit[CsrAddr.INSN_COUNT]):
                m.d.sync += insn_count.eq(self.w_data)
            with m.If(hit[CsrAddr.INSN_ADDR]):
                m.d.sync += insn_addr.eq(self.w_data)

        values = {
            CsrAddr.CTRL: (done << 1) | ((self.core_fault != 0) << 2),
            CsrAddr.CYCLES: self.core_cycles,
            CsrAddr.INSN_COUNT: insn_count,
            CsrAddr.INSN_ADDR: insn_addr,
            CsrAddr.HW_VER: hw_ver_word(),
            CsrAddr.HW_ID: self.cfg.hash_u32,
            CsrAddr.FAULT: self.core_fault,
        }
        m.d.sync += self.r_data.eq(0)
        with m.If(self.r_en):
            for a, v in values.items():
                with m.If(hit[a]):
                    m.d.sync += self.r_data.eq(v)
        return m
