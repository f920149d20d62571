"""The core as an AXI peripheral (Verilog module ``vta_axi``): what a Zynq design instantiates.

::

    aclk, aresetn (active low, synchronous)
    s_axi_control_* ─ AxiLiteSlave ─┬─ CsrBlock ─ Core (ResetInserter) ─ AxiMaster ─ m_axi_*
                                    └─ AXI_STATUS (AxiMaster's sticky error_cause)
    interrupt: high while CTRL.DONE is set (level; cleared by the next START or RESET)

* ``m_axi_*``: an AXI4 master (:class:`~vtakit.vta_hw.axi.AxiMaster`: ``INCR`` bursts of the
  configuration's bus width, one ID, ``m_axi_awid = m_axi_arid = 0``) for the processing
  system's high-performance port; the core's DRAM addresses are the PS's physical addresses.
* ``s_axi_control_*``: an AXI4-Lite slave (:class:`~vtakit.vta_hw.axi_lite.AxiLiteSlave`,
  32-bit data, a :data:`~vtakit.vta_hw.regmap.AXI_REG_BYTES` window) holding the core's
  registers (:class:`~vtakit.vta_hw.regmap.CsrAddr`, the map the UART bridge reaches) and
  ``AXI_STATUS`` (:class:`~vtakit.vta_hw.regmap.AxiAddr`). An address naming no register, a
  write to a read-only one and a partial write answer SLVERR.

The port names follow Xilinx's conventions (``m_axi_``, ``s_axi_control_``, ``aclk``,
``aresetn``, ``interrupt``) and carry ``X_INTERFACE_INFO`` attributes, so Vivado's module
reference infers the two AXI interfaces, the clock (associated with both), the reset and the
interrupt. The cycle counts are those of docs/timing.md whenever the memory answers within the
configuration's ``mem_read_latency_cycles`` (:mod:`vtakit.vta_hw.axi`); AXI_STATUS says when it
did not.
"""

from __future__ import annotations

from amaranth.hdl import ClockDomain, Module, ResetInserter, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.axi import AxiMaster
from vtakit.vta_hw.axi_lite import DATA_BITS, AxiLiteSlave
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.csr import CsrBlock
from vtakit.vta_hw.regmap import AXI_REG_BYTES, CSR_WRITABLE, AxiAddr, CsrAddr
from vtakit.vta_hw.top import Core

__all__ = ["AxiTop", "axi_top_verilog", "MODULE_NAME", "M_AXI", "S_AXI", "M_AXI_SIGNALS",
           "S_AXI_SIGNALS", "ADDR_BITS_CONTROL", "ID_BITS"]

#: the Verilog module
MODULE_NAME = "vta_axi"
#: the interfaces' port prefixes (Vivado names the block design's interface pins after them)
M_AXI, S_AXI = "m_axi", "s_axi_control"
#: the AXI4-Lite window's address width
ADDR_BITS_CONTROL = (AXI_REG_BYTES - 1).bit_length()
#: width of m_axi_awid / arid / bid / rid (one ID: every request is 0)
ID_BITS = 1

#: AXI4 master signals of :class:`~vtakit.vta_hw.axi.AxiMaster` that become ``m_axi_*`` ports
M_AXI_SIGNALS = ("araddr", "arlen", "arsize", "arburst", "arcache", "arprot", "arvalid",
                 "arready", "rdata", "rresp", "rlast", "rvalid", "rready",
                 "awaddr", "awlen", "awsize", "awburst", "awcache", "awprot", "awvalid",
                 "awready", "wdata", "wstrb", "wlast", "wvalid", "wready",
                 "bresp", "bvalid", "bready")
#: AXI4-Lite signals of :class:`~vtakit.vta_hw.axi_lite.AxiLiteSlave` that become
#: ``s_axi_control_*`` ports
S_AXI_SIGNALS = ("awaddr", "awprot", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready",
                 "bresp", "bvalid", "bready", "araddr", "arprot", "arvalid", "arready",
                 "rdata", "rresp", "rvalid", "rready")


class AxiTop(wiring.Component):
    """The core, its register block and the two AXI adapters, with Xilinx port names.

    Parameters
    ----------
    cfg : HwConfig
        The core's configuration; the bus width is ``m_axi``'s data width.
    queue_depth : int
        :class:`~vtakit.vta_hw.axi.AxiMaster`'s request queues.

    Attributes
    ----------
    aclk, aresetn : In
        The one clock and its active-low synchronous reset (resets everything; CTRL RESET
        resets the core only).
    m_axi_* : the AXI4 master (``M_AXI_SIGNALS`` plus ``m_axi_awid``, ``m_axi_arid`` out and
        ``m_axi_bid``, ``m_axi_rid`` in, :data:`ID_BITS` wide).
    s_axi_control_* : the AXI4-Lite slave (``S_AXI_SIGNALS``).
    interrupt : Out
        CTRL.DONE (level).
    """

    def __init__(self, cfg: HwConfig, *, queue_depth: int = 8):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"AxiTop: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg.validate()
        self.core = Core(self.cfg)
        self.csr = CsrBlock(self.cfg, addr_bits=ADDR_BITS_CONTROL)
        self.master = AxiMaster(self.cfg, queue_depth=queue_depth)
        self.slave = AxiLiteSlave(ADDR_BITS_CONTROL,
                                  readable=[*CsrAddr, *AxiAddr], writable=CSR_WRITABLE)
        members: dict[str, wiring.Member] = {"aclk": In(1), "aresetn": In(1),
                                             "interrupt": Out(1)}
        for name in M_AXI_SIGNALS:
            members[f"{M_AXI}_{name}"] = self.master.signature.members[name]
        members.update({f"{M_AXI}_awid": Out(ID_BITS), f"{M_AXI}_arid": Out(ID_BITS),
                        f"{M_AXI}_bid": In(ID_BITS), f"{M_AXI}_rid": In(ID_BITS)})
        for name in S_AXI_SIGNALS:
            members[f"{S_AXI}_{name}"] = self.slave.signature.members[name]
        super().__init__(members)
        # the ports by their flat names, from the signature (no attribute names built here)
        self._by_name = {path[0]: value for path, _, value in self.signature.flatten(self)}
        self._annotate()

    def _port(self, prefix: str, name: str) -> Signal:
        return self._by_name[f"{prefix}_{name}"]

    def _annotate(self) -> None:
        """Vivado's interface attributes (what its own IP puts on a module's ports)."""
        self.aclk.attrs.update({
            "X_INTERFACE_INFO": "xilinx.com:signal:clock:1.0 aclk CLK",
            "X_INTERFACE_PARAMETER": f"ASSOCIATED_BUSIF {M_AXI}:{S_AXI}, "
                                     f"ASSOCIATED_RESET aresetn"})
        self.aresetn.attrs.update({
            "X_INTERFACE_INFO": "xilinx.com:signal:reset:1.0 aresetn RST",
            "X_INTERFACE_PARAMETER": "POLARITY ACTIVE_LOW"})
        self.interrupt.attrs.update({
            "X_INTERFACE_INFO": "xilinx.com:signal:interrupt:1.0 interrupt INTERRUPT",
            "X_INTERFACE_PARAMETER": "SENSITIVITY LEVEL_HIGH"})
        for prefix, names, params in (
                (M_AXI, (*M_AXI_SIGNALS, "awid", "arid", "bid", "rid"),
                 f"PROTOCOL AXI4, DATA_WIDTH {self.cfg.bus_width_bits}, ADDR_WIDTH 32, "
                 f"ID_WIDTH {ID_BITS}, MAX_BURST_LENGTH {self.cfg.mem_max_burst_beats}"),
                (S_AXI, S_AXI_SIGNALS, f"PROTOCOL AXI4LITE, DATA_WIDTH {DATA_BITS}, "
                                       f"ADDR_WIDTH {ADDR_BITS_CONTROL}")):
            for i, name in enumerate(names):
                attrs = self._port(prefix, name).attrs
                attrs["X_INTERFACE_INFO"] = f"xilinx.com:interface:aximm:2.0 {prefix} " \
                                            f"{name.upper()}"
                if i == 0:
                    attrs["X_INTERFACE_PARAMETER"] = params

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = cd = ClockDomain("sync", local=True)
        m.d.comb += [cd.clk.eq(self.aclk), cd.rst.eq(~self.aresetn)]
        core, csr, master, slave = self.core, self.csr, self.master, self.slave
        m.submodules.core = ResetInserter({"sync": csr.core_reset})(core)
        m.submodules.csr = csr
        m.submodules.axi_master = master
        m.submodules.axi_lite = slave

        # register block <-> core
        m.d.comb += [core.start.eq(csr.core_start), core.insn_addr.eq(csr.core_insn_addr),
                     core.insn_count.eq(csr.core_insn_count), csr.core_done.eq(core.done),
                     csr.core_cycles.eq(core.cycles), csr.core_fault.eq(core.fault)]
        # core <-> AXI4 master (the core's burst port)
        m.d.comb += [master.mem_rd_valid.eq(core.mem_rd_valid),
                     master.mem_rd_addr.eq(core.mem_rd_addr),
                     master.mem_rd_beats.eq(core.mem_rd_beats),
                     core.mem_rd_data_valid.eq(master.mem_rd_data_valid),
                     core.mem_rd_data.eq(master.mem_rd_data),
                     master.mem_wr_valid.eq(core.mem_wr_valid),
                     master.mem_wr_addr.eq(core.mem_wr_addr),
                     master.mem_wr_beats.eq(core.mem_wr_beats),
                     master.mem_wr_data_valid.eq(core.mem_wr_data_valid),
                     master.mem_wr_data.eq(core.mem_wr_data),
                     master.mem_wr_strb.eq(core.mem_wr_strb),
                     # a new run (or a reset core) starts with a clean error record
                     master.clear.eq(csr.core_start | csr.core_reset),
                     master.abort.eq(csr.core_reset)]
        for name in M_AXI_SIGNALS:
            port, inner = self._port(M_AXI, name), getattr(master, name)
            flow = master.signature.members[name].flow
            m.d.comb += inner.eq(port) if flow == wiring.In else port.eq(inner)
        m.d.comb += [self.m_axi_awid.eq(0), self.m_axi_arid.eq(0)]

        # AXI4-Lite slave <-> register bus (CsrBlock's registers and AXI_STATUS)
        for name in S_AXI_SIGNALS:
            port, inner = self._port(S_AXI, name), getattr(slave, name)
            flow = slave.signature.members[name].flow
            m.d.comb += inner.eq(port) if flow == wiring.In else port.eq(inner)
        status = Signal(DATA_BITS)  # registered like CsrBlock's r_data: 0 after other reads
        m.d.sync += status.eq(0)
        with m.If(slave.reg_r_en & (slave.reg_addr[2:] == AxiAddr.AXI_STATUS >> 2)):
            m.d.sync += status.eq(master.error_cause)
        m.d.comb += [csr.addr.eq(slave.reg_addr), csr.w_en.eq(slave.reg_w_en),
                     csr.w_data.eq(slave.reg_w_data), csr.r_en.eq(slave.reg_r_en),
                     slave.reg_r_data.eq(csr.r_data | status)]

        # interrupt = CTRL.DONE: the core's done, two cycles late (FAULT complete), as CsrBlock
        # computes it; START and RESET drop the core's done, and so the interrupt
        done_1, done_2 = Signal(), Signal()
        m.d.sync += [done_1.eq(core.done), done_2.eq(done_1 & core.done)]
        m.d.comb += self.interrupt.eq(done_2 & core.done)
        return m


def axi_top_verilog(cfg: HwConfig, *, queue_depth: int = 8) -> str:
    """:class:`AxiTop` for ``cfg`` as Verilog text (top module :data:`MODULE_NAME`)."""
    from amaranth.back import verilog

    return verilog.convert(AxiTop(cfg, queue_depth=queue_depth), name=MODULE_NAME)
