"""``vtakit hw export``: a Zynq board's design for Vivado.

The open toolchain cannot build for a Zynq-7000's processing system, so for a Zynq board
(``arty-z7-20`` / ``pynq-z1``) vtakit writes what Vivado needs and leaves the build to it.
:func:`export` writes into the output folder (default ``build/<board>``):

* ``vta_axi.v``: the core as an AXI peripheral (:class:`vtakit.vta_hw.axi_top.AxiTop`: an AXI4
  master ``m_axi_*`` of the configuration's bus width for S_AXI_HP0, an AXI4-Lite slave
  ``s_axi_control_*`` holding the registers, ``interrupt``, ``aclk``, ``aresetn``);
* ``vta_zynq.tcl``: a Vivado batch script (``vivado -mode batch -source vta_zynq.tcl``) that
  creates the project for the board's part, adds the Verilog, builds the block design
  (processing_system7 with FCLK_CLK0 at the core's clock, M_AXI_GP0, S_AXI_HP0 at the bus
  width and IRQ_F2P; the top as a module reference; a SmartConnect on each side; a
  proc_sys_reset), assigns the addresses (the registers at the board's ``csr_base`` in the
  GP0 range, HP0 reaching all of the DDR), runs synthesis, implementation and
  write_bitstream, and copies ``vta_zynq.bit`` and ``vta_zynq.hwh`` next to itself (what
  ``pynq.Overlay("vta_zynq.bit")`` loads) with ``vta_zynq.xsa``;
* ``vta_zynq.json``: the manifest (board, part, configuration with its hash, clock, register
  base and map, memory, files) that the ``pynq`` device can check;
* ``README.md``: the same in words, with the commands.

Nothing here runs Vivado.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vtakit.boards.boards import Board, board
from vtakit.boards.build import BuildError, _config_for, _preset_names, default_output
from vtakit.vta_hw.config import HwConfig, preset

__all__ = ["export", "ExportResult", "ExportError", "vivado_tcl", "manifest", "DESIGN",
           "BD_NAME", "VTA_CELL", "HP_BUS_WIDTHS", "FILES"]

#: the base name of the bitstream, its hardware handoff and the script
DESIGN = "vta_zynq"
#: the block design
BD_NAME = "vta_bd"
#: the top's cell in the block design (pynq's ``Overlay.ip_dict`` key)
VTA_CELL = "vta"
#: data widths of the Zynq-7000 high-performance ports (PCW_S_AXI_HP0_DATA_WIDTH)
HP_BUS_WIDTHS = (32, 64)
#: the most FCLK_CLK0 may be (Zynq-7000 PL clocks)
FCLK_MAX_MHZ = 250.0
#: what the export writes, and what the script writes next to it
FILES = {"verilog": "vta_axi.v", "tcl": f"{DESIGN}.tcl", "manifest": f"{DESIGN}.json",
         "readme": "README.md", "bitstream": f"{DESIGN}.bit", "hwh": f"{DESIGN}.hwh",
         "xsa": f"{DESIGN}.xsa"}


class ExportError(BuildError):
    """The board or configuration cannot be exported (exit status 2 on the command line)."""


@dataclass
class ExportResult:
    """What :func:`export` wrote: the folder, the files and the manifest."""

    output: Path
    files: dict[str, Path]
    manifest: dict


def _size_tcl(nbytes: int) -> str:
    return f"0x{nbytes:08X}"


def manifest(b: Board, cfg: HwConfig, cfg_name: str) -> dict:
    """``vta_zynq.json``: what the bitstream is, for the host (JSON-able)."""
    from vtakit.vta_hw import axi_top, isa
    from vtakit.vta_hw.regmap import (
        AXI_REG_BYTES,
        CTRL_DONE,
        CTRL_FAULT,
        CTRL_RESET,
        CTRL_START,
        AxiAddr,
        CsrAddr,
    )

    assert b.csr_base is not None and b.vivado_part is not None
    return {
        "board": b.name, "title": b.title, "part": b.vivado_part,
        "config": {"name": cfg_name, "bitstream_name": cfg.bitstream_name, "hash": cfg.hash,
                   "fields": cfg.to_dict()},
        "hw_ver": ".".join(map(str, isa.HW_VER)),
        "clock_mhz": b.target_mhz(cfg.clock_mhz),
        "module": axi_top.MODULE_NAME, "cell": VTA_CELL, "block_design": BD_NAME,
        "registers": {"base": b.csr_base, "base_hex": f"0x{b.csr_base:08X}",
                      "range_bytes": AXI_REG_BYTES, "port": "M_AXI_GP0",
                      "map": {a.name: int(a) for a in (*CsrAddr, *AxiAddr)},
                      "ctrl_bits": {"START": CTRL_START, "DONE": CTRL_DONE,
                                    "FAULT": CTRL_FAULT, "RESET": CTRL_RESET}},
        "memory": {"port": "S_AXI_HP0", "bus_width_bits": cfg.bus_width_bits,
                   "base": 0, "size_bytes": b.memory.size_bytes,
                   "read_latency_cycles": cfg.mem_read_latency_cycles,
                   "max_burst_beats": cfg.mem_max_burst_beats},
        "interrupt": "IRQ_F2P[0], level high while CTRL.DONE",
        "files": {k: v for k, v in FILES.items()},
    }


_TCL = r"""# Vivado batch script written by `vtakit hw export` for @TITLE@.
#   vivado -mode batch -source @TCL@
# builds the block design around @MODULE@ (@VERILOG@), the bitstream, and copies
# @BIT@ + @HWH@ (pynq.Overlay) and @XSA@ next to this script.
# Core: config @CFG_NAME@ (@BITSTREAM_NAME@, hash @HASH@), @CLOCK_MHZ@ MHz, @BUS@-bit bus.
set here [file dirname [file normalize [info script]]]
set proj_dir [file join $here vivado]
set part @PART@
set jobs [expr {[info exists ::env(VTAKIT_VIVADO_JOBS)] ? $::env(VTAKIT_VIVADO_JOBS) : 4}]

create_project -force @DESIGN@ $proj_dir -part $part
# the board's preset for the processing system where Vivado has its board files
set board_part ""
foreach pattern {@BOARD_PATTERNS@} {
    set found [get_board_parts -quiet -latest_file_version $pattern]
    if {[llength $found]} { set board_part [lindex $found 0]; break }
}
if {$board_part ne ""} {
    puts "vtakit: board part $board_part"
    set_property board_part $board_part [current_project]
}
add_files -norecurse [file join $here @VERILOG@]
update_compile_order -fileset sources_1

create_bd_design @BD_NAME@
set ps [create_bd_cell -type ip -vlnv xilinx.com:ip:processing_system7:5.5 ps7]
if {$board_part ne ""} {
    apply_bd_automation -rule xilinx.com:bd_rule:processing_system7 \
        -config {make_external "FIXED_IO, DDR" apply_board_preset "1" \
                 Master "Disable" Slave "Disable"} $ps
} else {
    # no board files: the board's DDR3 (MT41K256M16 RE-125, 16 bits, 512 MiB) and clock input
    apply_bd_automation -rule xilinx.com:bd_rule:processing_system7 \
        -config {make_external "FIXED_IO, DDR" apply_board_preset "0" \
                 Master "Disable" Slave "Disable"} $ps
    set_property -dict [list \
        CONFIG.PCW_CRYSTAL_PERIPHERAL_FREQMHZ {50} \
        CONFIG.PCW_PRESET_BANK1_VOLTAGE {LVCMOS 1.8V} \
        CONFIG.PCW_UIPARAM_DDR_PARTNO {MT41K256M16 RE-125} \
        CONFIG.PCW_UIPARAM_DDR_BUS_WIDTH {16 Bit} \
        CONFIG.PCW_UART0_PERIPHERAL_ENABLE {1} \
        CONFIG.PCW_UART0_UART0_IO {MIO 14 .. 15} \
    ] $ps
}
# the core's clock, the register port (GP0), the memory port (HP0), the interrupt
set_property -dict [list \
    CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ {@CLOCK_MHZ@} \
    CONFIG.PCW_EN_CLK0_PORT {1} \
    CONFIG.PCW_EN_RST0_PORT {1} \
    CONFIG.PCW_USE_M_AXI_GP0 {1} \
    CONFIG.PCW_USE_S_AXI_HP0 {1} \
    CONFIG.PCW_S_AXI_HP0_DATA_WIDTH {@BUS@} \
    CONFIG.PCW_USE_FABRIC_INTERRUPT {1} \
    CONFIG.PCW_IRQ_F2P_INTR {1} \
] $ps

# the core: a module reference to @MODULE@ (its ports carry X_INTERFACE_INFO: m_axi,
# s_axi_control, aclk, aresetn, interrupt)
set vta [create_bd_cell -type module -reference @MODULE@ @CELL@]
set rst [create_bd_cell -type ip -vlnv xilinx.com:ip:proc_sys_reset:5.0 rst_fclk0]
set ctrl_ic [create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:1.0 ctrl_interconnect]
set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] $ctrl_ic
set mem_ic [create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:1.0 mem_interconnect]
set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] $mem_ic

set clk [get_bd_pins ps7/FCLK_CLK0]
connect_bd_net $clk [get_bd_pins ps7/M_AXI_GP0_ACLK] [get_bd_pins ps7/S_AXI_HP0_ACLK] \
    [get_bd_pins @CELL@/aclk] [get_bd_pins rst_fclk0/slowest_sync_clk] \
    [get_bd_pins ctrl_interconnect/aclk] [get_bd_pins mem_interconnect/aclk]
connect_bd_net [get_bd_pins ps7/FCLK_RESET0_N] [get_bd_pins rst_fclk0/ext_reset_in]
connect_bd_net [get_bd_pins rst_fclk0/peripheral_aresetn] [get_bd_pins @CELL@/aresetn]
connect_bd_net [get_bd_pins rst_fclk0/interconnect_aresetn] \
    [get_bd_pins ctrl_interconnect/aresetn] [get_bd_pins mem_interconnect/aresetn]
connect_bd_intf_net [get_bd_intf_pins ps7/M_AXI_GP0] [get_bd_intf_pins ctrl_interconnect/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins ctrl_interconnect/M00_AXI] \
    [get_bd_intf_pins @CELL@/s_axi_control]
connect_bd_intf_net [get_bd_intf_pins @CELL@/m_axi] [get_bd_intf_pins mem_interconnect/S00_AXI]
connect_bd_intf_net [get_bd_intf_pins mem_interconnect/M00_AXI] [get_bd_intf_pins ps7/S_AXI_HP0]
connect_bd_net [get_bd_pins @CELL@/interrupt] [get_bd_pins ps7/IRQ_F2P]

# addresses: the registers at @CSR_BASE@ (@CSR_RANGE@ bytes) in the GP0 range; HP0 reaches
# all of the DDR from 0 (the core's DRAM addresses are the PS's physical addresses)
assign_bd_address -offset @CSR_BASE@ -range @CSR_RANGE@ \
    -target_address_space [get_bd_addr_spaces ps7/Data] \
    [get_bd_addr_segs -of_objects [get_bd_intf_pins @CELL@/s_axi_control]] -force
assign_bd_address -offset 0x00000000 -range @DDR_RANGE@ \
    -target_address_space [get_bd_addr_spaces @CELL@/m_axi] \
    [get_bd_addr_segs ps7/S_AXI_HP0/HP0_DDR_LOWOCM] -force
validate_bd_design
save_bd_design

set bd_file [get_files @BD_NAME@.bd]
generate_target all $bd_file
set wrapper [make_wrapper -files $bd_file -top]
add_files -norecurse $wrapper
set_property top @BD_NAME@_wrapper [current_fileset]
update_compile_order -fileset sources_1

launch_runs synth_1 -jobs $jobs
wait_on_run synth_1
if {[get_property PROGRESS [get_runs synth_1]] ne "100%"} {
    error "vtakit: synthesis failed; see [get_property DIRECTORY [get_runs synth_1]]/runme.log"
}
launch_runs impl_1 -to_step write_bitstream -jobs $jobs
wait_on_run impl_1
if {[get_property PROGRESS [get_runs impl_1]] ne "100%"} {
    error "vtakit: implementation failed; see [get_property DIRECTORY [get_runs impl_1]]/runme.log"
}
set wns [get_property STATS.WNS [get_runs impl_1]]
if {$wns < 0} {
    puts "vtakit: WARNING: timing not met at @CLOCK_MHZ@ MHz (WNS $wns ns)"
}

# what pynq.Overlay loads: the bitstream and the hardware handoff, with one base name
set impl_dir [get_property DIRECTORY [get_runs impl_1]]
file copy -force [file join $impl_dir @BD_NAME@_wrapper.bit] [file join $here @BIT@]
set hwh [glob -nocomplain \
    [file join $proj_dir @DESIGN@.gen sources_1 bd @BD_NAME@ hw_handoff @BD_NAME@.hwh] \
    [file join $proj_dir @DESIGN@.srcs sources_1 bd @BD_NAME@ hw_handoff @BD_NAME@.hwh]]
if {![llength $hwh]} { error "vtakit: no hardware handoff (@BD_NAME@.hwh) under $proj_dir" }
file copy -force [lindex $hwh 0] [file join $here @HWH@]
if {[llength [info commands write_hw_platform]]} {
    write_hw_platform -fixed -include_bit -force [file join $here @XSA@]
} else {
    write_hwdef -force [file join $here @DESIGN@.hdf]
}
puts "vtakit: wrote [file join $here @BIT@] and [file join $here @HWH@] (WNS $wns ns)"
"""


def vivado_tcl(b: Board, cfg: HwConfig, cfg_name: str) -> str:
    """The Vivado batch script that builds ``b``'s bitstream around ``vta_axi.v``."""
    from vtakit.vta_hw.axi_top import MODULE_NAME
    from vtakit.vta_hw.regmap import AXI_REG_BYTES

    assert b.csr_base is not None and b.vivado_part is not None
    values = {
        "TITLE": b.title, "TCL": FILES["tcl"], "MODULE": MODULE_NAME,
        "VERILOG": FILES["verilog"], "BIT": FILES["bitstream"], "HWH": FILES["hwh"],
        "XSA": FILES["xsa"], "CFG_NAME": cfg_name, "BITSTREAM_NAME": cfg.bitstream_name,
        "HASH": cfg.hash, "CLOCK_MHZ": f"{b.target_mhz(cfg.clock_mhz):g}",
        "BUS": str(cfg.bus_width_bits), "PART": b.vivado_part, "DESIGN": DESIGN,
        "BOARD_PATTERNS": " ".join(b.vivado_boards), "BD_NAME": BD_NAME, "CELL": VTA_CELL,
        "CSR_BASE": f"0x{b.csr_base:08X}", "CSR_RANGE": _size_tcl(AXI_REG_BYTES),
        "DDR_RANGE": _size_tcl(b.memory.size_bytes),
    }
    text = _TCL
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    assert re.search(r"@[A-Z_]+@", text) is None, "a placeholder was left in the Tcl"
    return text


def _readme(man: dict) -> str:
    reg = man["registers"]
    regs = "\n".join(f"| `0x{off:02X}` | {name} |" for name, off in reg["map"].items())
    return f"""# {man['title']}: vtakit's Zynq design

Written by `vtakit hw export --board {man['board']}`: the core for configuration
`{man['config']['name']}` ({man['config']['bitstream_name']}, hash `{man['config']['hash']}`,
ISA {man['hw_ver']}) as an AXI peripheral, at {man['clock_mhz']:g} MHz on {man['part']}.

* `{FILES['verilog']}`: module `{man['module']}` (an AXI4 master `m_axi` of
  {man['memory']['bus_width_bits']} bits, an AXI4-Lite slave `s_axi_control`, `interrupt`);
* `{FILES['tcl']}`: the Vivado project, block design and bitstream;
* `{FILES['manifest']}`: this design as data.

Build (the script is written for Vivado 2020.2 and newer; it has not been run by vtakit's tests):

    vivado -mode batch -source {FILES['tcl']}

It writes `{FILES['bitstream']}`, `{FILES['hwh']}` and `{FILES['xsa']}` here (the project
is in `vivado/`). Copy the `.bit` and the `.hwh` to the board and use them from Python there:

    from vtakit.driver.devices.pynq import PynqDevice
    from vtakit.vta_hw.config import preset
    dev = PynqDevice(preset("{man['config']['name']}"), "{FILES['bitstream']}")

or `device="pynq:{FILES['bitstream']}"` in the runtime.

Registers: AXI4-Lite at `{reg['base_hex']}` ({reg['range_bytes']} bytes, {reg['port']});
DRAM: the PS DDR through {man['memory']['port']} (physical addresses from 0, buffers from
`pynq.allocate`); interrupt: {man['interrupt']}.

| offset | register |
|---|---|
{regs}
"""


def export(board_name: str, *, config: HwConfig | str | None = None,
           output: Path | str | None = None,
           progress: Callable[[str], None] | None = None) -> ExportResult:
    """Write ``board_name``'s Vivado design (see the module docstring) with ``config``
    (default: the board's preset) into ``output`` (default ``build/<board>``); ``progress``
    gets a line before the Verilog is written (seconds for a small core, a minute for
    ``default``).

    Raises :class:`ExportError` for a board that is not a Zynq board, a bus width the HP
    port does not have, or a clock past FCLK's; ``ValueError`` for an unknown board or
    preset.
    """
    b = board(board_name)
    if not b.export_only or b.vivado_part is None or b.csr_base is None:
        zynq = ", ".join(n for n, x in _boards().items() if x.export_only)
        raise ExportError(f"board {b.name} ({b.title}) is built with `vtakit hw build --board "
                          f"{b.name}`; hw export is for Zynq boards (expected one of: {zynq})")
    cfg = _config_for(b, config)
    if cfg.bus_width_bits not in HP_BUS_WIDTHS:
        raise ExportError(f"configuration {cfg.bitstream_name} has a {cfg.bus_width_bits}-bit "
                          f"bus; the Zynq's S_AXI_HP0 port is "
                          f"{' or '.join(map(str, HP_BUS_WIDTHS))} bits wide (expected "
                          f"log_bus_width 5 or 6)")
    mhz = b.target_mhz(cfg.clock_mhz)
    if not 0 < mhz <= FCLK_MAX_MHZ:
        raise ExportError(f"configuration {cfg.bitstream_name} runs at {mhz:g} MHz; FCLK_CLK0 "
                          f"goes up to {FCLK_MAX_MHZ:g} MHz (expected clock_mhz in 0.."
                          f"{FCLK_MAX_MHZ:g})")
    cfg_name = next((n for n in _preset_names() if preset(n) == cfg), "custom")
    out = Path(output) if output is not None else default_output(b)
    out.mkdir(parents=True, exist_ok=True)
    from vtakit.vta_hw.axi_top import axi_top_verilog

    if progress is not None:
        progress(f"{b.name}: config {cfg_name} ({cfg.bitstream_name}, hash {cfg.hash}): "
                 f"writing {out / FILES['verilog']} (Amaranth) ...")
    man = manifest(b, cfg, cfg_name)
    paths = {key: out / FILES[key] for key in ("verilog", "tcl", "manifest", "readme")}
    paths["verilog"].write_text(axi_top_verilog(cfg))
    paths["tcl"].write_text(vivado_tcl(b, cfg, cfg_name))
    paths["manifest"].write_text(json.dumps(man, indent=2) + "\n")
    paths["readme"].write_text(_readme(man))
    return ExportResult(output=out, files=paths, manifest=man)


def _boards() -> dict[str, Board]:
    from vtakit.boards.boards import BOARDS

    return BOARDS
