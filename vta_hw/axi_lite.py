"""An AXI4-Lite slave in front of a simple register bus (:class:`~vtakit.vta_hw.csr.CsrBlock`'s:
``addr``, ``w_en`` + ``w_data``, ``r_en``, ``r_data`` the cycle after).

The five channels follow the AXI4-Lite rules: AW and W are accepted independently and in any
order (each into its own one-entry buffer; ``awready`` / ``wready`` are high while it is
empty), a write happens once both are there and the previous B was taken, a read once AR is
there and the previous R was taken; ``bvalid`` / ``rvalid`` are registers that stay high with
their response until ``bready`` / ``rready``. One register access per cycle: when a write and a
read are both ready they alternate.

Responses: OKAY, or SLVERR (the register is left alone, a read returns 0) for

* an address that names no register (``readable`` / ``writable``; the two low address bits
  are ignored, as on the register bus, so an unaligned address names its word);
* a write to a read-only register;
* a write whose ``wstrb`` is not ``0b1111`` (the registers have no byte enables; a partial
  write would change bytes the host did not send).

DECERR is left to the interconnect, which answers it for addresses outside this slave's window.

Worked example, START: AW ``0x00`` and W ``0x1`` (strobes ``0xF``) arrive in cycle 0 (or in
any two cycles), the register bus sees ``w_en`` with ``addr = 0x00`` in cycle 1 (CsrBlock pulses
``start`` in cycle 2), and ``bvalid`` rises in cycle 2 with OKAY.
"""

from __future__ import annotations

from collections.abc import Iterable

from amaranth.hdl import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["AxiLiteSlave", "RESP_OKAY", "RESP_SLVERR", "RESP_DECERR"]

RESP_OKAY = 0b00
RESP_SLVERR = 0b10
RESP_DECERR = 0b11

#: AXI4-Lite data width this slave speaks (the registers are 32-bit)
DATA_BITS = 32


class AxiLiteSlave(wiring.Component):
    """AXI4-Lite slave (``aw*``, ``w*``, ``b*``, ``ar*``, ``r*``, AXI's names) → register bus
    master (``reg_*``).

    Parameters
    ----------
    addr_bits : int
        Width of ``awaddr`` / ``araddr`` (the slave's window is ``2**addr_bits`` bytes).
    readable : Iterable[int]
        Byte addresses of the registers that may be read.
    writable : Iterable[int]
        Byte addresses of the registers that may be written (a subset of ``readable``).

    Attributes
    ----------
    awaddr, awprot, awvalid, wdata, wstrb, wvalid, bready, araddr, arprot, arvalid, rready : In
    awready, wready, bresp, bvalid, arready, rdata, rresp, rvalid : Out
        The AXI4-Lite channels (``*prot`` are accepted and ignored).
    reg_addr, reg_w_en, reg_w_data, reg_r_en : Out
        To the register bus (``reg_addr`` is the byte address).
    reg_r_data : In
        From the register bus: the word read, in the cycle after ``reg_r_en``.
    """

    def __init__(self, addr_bits: int, readable: Iterable[int], writable: Iterable[int]):
        if isinstance(addr_bits, bool) or not isinstance(addr_bits, int) or \
                not 2 < addr_bits <= 32:
            raise ValueError(f"AxiLiteSlave: addr_bits={addr_bits!r} must be an int in 3..32")
        self.addr_bits = addr_bits
        self.readable = tuple(sorted({int(a) for a in readable}))
        self.writable = tuple(sorted({int(a) for a in writable}))
        bad = [a for a in self.readable if a % 4 or not 0 <= a < 1 << addr_bits]
        if bad:
            raise ValueError(f"AxiLiteSlave: register addresses {[hex(a) for a in bad]} are not "
                             f"word-aligned addresses in the {1 << addr_bits}-byte window")
        extra = sorted(set(self.writable) - set(self.readable))
        if extra:
            raise ValueError(f"AxiLiteSlave: writable registers {[hex(a) for a in extra]} are "
                             f"not readable (expected writable to be a subset of readable)")
        super().__init__({
            "awaddr": In(addr_bits), "awprot": In(3), "awvalid": In(1), "awready": Out(1),
            "wdata": In(DATA_BITS), "wstrb": In(DATA_BITS // 8), "wvalid": In(1),
            "wready": Out(1),
            "bresp": Out(2), "bvalid": Out(1), "bready": In(1),
            "araddr": In(addr_bits), "arprot": In(3), "arvalid": In(1), "arready": Out(1),
            "rdata": Out(DATA_BITS), "rresp": Out(2), "rvalid": Out(1), "rready": In(1),
            "reg_addr": Out(addr_bits), "reg_w_en": Out(1), "reg_w_data": Out(DATA_BITS),
            "reg_r_en": Out(1), "reg_r_data": In(DATA_BITS),
        })

    @staticmethod
    def _hit(addr: Signal, regs: tuple[int, ...]):
        """``addr`` names one of ``regs`` (its two low bits ignored)."""
        out = Const(0, 1)
        for a in regs:
            out = out | (addr[2:] == a >> 2)
        return out

    def elaborate(self, platform):
        m = Module()
        ab = self.addr_bits
        # one-entry buffers: AW, W and AR each wait here until their access happens
        aw_full, aw_addr = Signal(), Signal(ab)
        w_full, w_data, w_strb = Signal(), Signal(DATA_BITS), Signal(DATA_BITS // 8)
        ar_full, ar_addr = Signal(), Signal(ab)
        m.d.comb += [self.awready.eq(~aw_full), self.wready.eq(~w_full),
                     self.arready.eq(~ar_full)]
        with m.If(self.awvalid & ~aw_full):
            m.d.sync += [aw_full.eq(1), aw_addr.eq(self.awaddr)]
        with m.If(self.wvalid & ~w_full):
            m.d.sync += [w_full.eq(1), w_data.eq(self.wdata), w_strb.eq(self.wstrb)]
        with m.If(self.arvalid & ~ar_full):
            m.d.sync += [ar_full.eq(1), ar_addr.eq(self.araddr)]

        # arbitration: one register access per cycle, alternating when both wait
        r_wait = Signal()        # a read was issued last cycle: reg_r_data holds its word now
        prefer_read = Signal()
        can_write = aw_full & w_full & ~self.bvalid
        can_read = ar_full & ~self.rvalid & ~r_wait
        write_go, read_go = Signal(), Signal()
        m.d.comb += [write_go.eq(can_write & ~(can_read & prefer_read)),
                     read_go.eq(can_read & ~write_go),
                     self.reg_addr.eq(Mux(write_go, aw_addr, ar_addr))]
        with m.If(write_go):
            m.d.sync += prefer_read.eq(1)
        with m.Elif(read_go):
            m.d.sync += prefer_read.eq(0)

        # write: B answers in the cycle after the register bus write
        w_ok = self._hit(aw_addr, self.writable) & (w_strb == (1 << DATA_BITS // 8) - 1)
        m.d.comb += [self.reg_w_en.eq(write_go & w_ok), self.reg_w_data.eq(w_data)]
        with m.If(self.bvalid & self.bready):
            m.d.sync += self.bvalid.eq(0)
        with m.If(write_go):
            m.d.sync += [aw_full.eq(0), w_full.eq(0), self.bvalid.eq(1),
                         self.bresp.eq(Mux(w_ok, RESP_OKAY, RESP_SLVERR))]

        # read: the register bus answers in the next cycle; R offers it the cycle after
        r_ok = self._hit(ar_addr, self.readable)
        r_err = Signal()
        m.d.comb += self.reg_r_en.eq(read_go & r_ok)
        m.d.sync += r_wait.eq(read_go)
        with m.If(read_go):
            m.d.sync += [ar_full.eq(0), r_err.eq(~r_ok)]
        with m.If(self.rvalid & self.rready):
            m.d.sync += self.rvalid.eq(0)
        with m.If(r_wait):
            m.d.sync += [self.rvalid.eq(1), self.rdata.eq(Mux(r_err, 0, self.reg_r_data)),
                         self.rresp.eq(Mux(r_err, RESP_SLVERR, RESP_OKAY))]
        return m

