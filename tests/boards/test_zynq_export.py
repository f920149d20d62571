# amaranth: UnusedElaboratable=no
"""``vtakit hw export``: the files it writes and what they name (Vivado is not run: the Tcl is
checked by content), the AXI top's ports, and the command's errors."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from vtakit.boards.boards import board
from vtakit.boards.build import ExportOnlyError, build
from vtakit.boards.zynq import ExportError, export, vivado_tcl
from vtakit.cli import main
from vtakit.vta_hw.axi_lite import AxiLiteSlave
from vtakit.vta_hw.axi_top import M_AXI_SIGNALS, S_AXI_SIGNALS, AxiTop
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.regmap import AXI_REG_BYTES, AxiAddr, CsrAddr

CFG = preset("ice40")  # the smallest core: its Verilog is written in about 2 s


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    return export("pynq-z1", config=CFG, output=out)


def test_export_writes_the_files(exported):
    names = {p.name for p in exported.output.iterdir()}
    assert names == {"vta_axi.v", "vta_zynq.tcl", "vta_zynq.json", "README.md"}
    assert {k: p.name for k, p in exported.files.items()} == {
        "verilog": "vta_axi.v", "tcl": "vta_zynq.tcl", "manifest": "vta_zynq.json",
        "readme": "README.md"}


def test_the_verilog_is_the_axi_top_with_xilinx_port_names(exported):
    text = exported.files["verilog"].read_text()
    header = re.search(r"module vta_axi\((.*?)\);", text, re.S)
    assert header is not None
    ports = {p.strip() for p in header.group(1).split(",")}
    want = ({"aclk", "aresetn", "interrupt"} | {f"m_axi_{s}" for s in M_AXI_SIGNALS}
            | {f"m_axi_{s}" for s in ("awid", "arid", "bid", "rid")}
            | {f"s_axi_control_{s}" for s in S_AXI_SIGNALS})
    assert ports == want
    assert re.search(r"input \[31:0\] m_axi_rdata;", text)  # the ice40 bus: 32 bits
    assert re.search(r"input \[11:0\] s_axi_control_awaddr;", text)  # a 4 KiB window
    assert '(* X_INTERFACE_INFO = "xilinx.com:interface:aximm:2.0 m_axi ARADDR" *)' in text
    assert ('(* X_INTERFACE_PARAMETER = "ASSOCIATED_BUSIF m_axi:s_axi_control, '
            'ASSOCIATED_RESET aresetn" *)') in text
    assert '(* X_INTERFACE_PARAMETER = "SENSITIVITY LEVEL_HIGH" *)' in text
    assert "PROTOCOL AXI4LITE, DATA_WIDTH 32, ADDR_WIDTH 12" in text


def test_the_tcl_names_the_part_files_clock_ports_and_addresses(exported):
    tcl = exported.files["tcl"].read_text()
    for needle in (
            "set part xc7z020clg400-1", "create_project -force vta_zynq $proj_dir -part $part",
            "add_files -norecurse [file join $here vta_axi.v]",
            "create_bd_cell -type module -reference vta_axi vta",
            "xilinx.com:ip:processing_system7:5.5", "xilinx.com:ip:smartconnect:1.0",
            "xilinx.com:ip:proc_sys_reset:5.0",
            f"CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ {{{CFG.clock_mhz:g}}}",
            "CONFIG.PCW_USE_M_AXI_GP0 {1}", "CONFIG.PCW_USE_S_AXI_HP0 {1}",
            "CONFIG.PCW_S_AXI_HP0_DATA_WIDTH {32}", "CONFIG.PCW_IRQ_F2P_INTR {1}",
            "connect_bd_net [get_bd_pins vta/interrupt] [get_bd_pins ps7/IRQ_F2P]",
            "[get_bd_intf_pins ps7/M_AXI_GP0] [get_bd_intf_pins ctrl_interconnect/S00_AXI]",
            "[get_bd_intf_pins mem_interconnect/M00_AXI] [get_bd_intf_pins ps7/S_AXI_HP0]",
            "assign_bd_address -offset 0x43C00000 -range 0x00001000",
            "assign_bd_address -offset 0x00000000 -range 0x20000000",
            "[get_bd_addr_segs ps7/S_AXI_HP0/HP0_DDR_LOWOCM]",
            "launch_runs impl_1 -to_step write_bitstream",
            "[file join $here vta_zynq.bit]", "[file join $here vta_zynq.hwh]",
            "write_hw_platform -fixed -include_bit", "write_hwdef",
            "foreach pattern {*pynq-z1* *arty-z7-20*}", f"hash {CFG.hash}"):
        assert needle in tcl, needle
    assert not re.search(r"@[A-Z_]+@", tcl)


def test_the_board_preset_gives_the_hp_port_its_64_bits():
    b = board("arty-z7-20")
    tcl = vivado_tcl(b, preset("default"), "default")
    assert "CONFIG.PCW_S_AXI_HP0_DATA_WIDTH {64}" in tcl
    assert "CONFIG.PCW_FPGA0_PERIPHERAL_FREQMHZ {100}" in tcl


def test_the_manifest_names_the_config_and_the_registers(exported):
    man = json.loads(exported.files["manifest"].read_text())
    assert man == exported.manifest
    assert man["config"]["hash"] == CFG.hash and man["config"]["name"] == "ice40"
    assert man["part"] == "xc7z020clg400-1" and man["module"] == "vta_axi"
    assert man["registers"]["base"] == 0x43C0_0000 and man["registers"]["base_hex"] == \
        "0x43C00000"
    assert man["registers"]["range_bytes"] == AXI_REG_BYTES
    assert man["registers"]["map"] == {a.name: int(a) for a in (*CsrAddr, *AxiAddr)}
    assert man["memory"]["bus_width_bits"] == 32 and man["memory"]["size_bytes"] == 512 << 20
    readme = exported.files["readme"].read_text()
    assert "vivado -mode batch -source vta_zynq.tcl" in readme and CFG.hash in readme
    assert "| `0x1C` | AXI_STATUS |" in readme


@pytest.mark.parametrize("args, message", [
    (["--board", "icebreaker"], "Error: board icebreaker (1BitSquared iCEBreaker (iCE40 "
     "UP5K-SG48)) is built with `vtakit hw build --board icebreaker`; hw export is for Zynq "
     "boards (expected one of: arty-z7-20)"),
    (["--board", "de10"], "Error: unknown board 'de10' (expected one of: icebreaker"),
    (["--board", "pynq-z1", "--config", "large"], "Error: configuration "
     "1x32x32_i8w8a32_15_16_20_18 has a 128-bit bus; the Zynq's S_AXI_HP0 port is 32 or 64 "
     "bits wide (expected log_bus_width 5 or 6)"),
])
def test_cli_errors_exit_2_with_one_line(tmp_path, args, message):
    r = CliRunner().invoke(main, ["hw", "export", *args, "--output", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1].startswith(message)
    assert not list(tmp_path.iterdir())


def test_cli_bad_config_and_fast_clock(tmp_path):
    r = CliRunner().invoke(main, ["hw", "export", "--board", "pynq-z1", "--config", "nope"])
    assert r.exit_code == 2 and "unknown hardware configuration 'nope'" in r.output
    with pytest.raises(ExportError, match=r"runs at 300 MHz; FCLK_CLK0 goes up to 250 MHz"):
        export("pynq-z1", config=CFG.replace(clock_mhz=300), output=tmp_path)


def test_cli_export_writes_and_says_how_to_build(tmp_path):
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(CFG.to_json())
    r = CliRunner().invoke(main, ["hw", "export", "--board", "arty-z7-20", "--config",
                                  str(cfg_file), "--output", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert f"wrote {tmp_path / 'out' / 'vta_axi.v'}" in r.output
    assert (f"arty-z7-20: config ice40 ({CFG.bitstream_name}, hash {CFG.hash}), 12 MHz, "
            f"registers at 0x43C00000; build with: cd {tmp_path / 'out'} && vivado -mode batch "
            f"-source vta_zynq.tcl") in r.output


def test_hw_build_points_to_hw_export(tmp_path):
    with pytest.raises(ExportOnlyError, match=re.escape(
            "board arty-z7-20 (Digilent Arty Z7-20 / TUL Pynq-Z1 (Zynq-7020)) is built with "
            "Vivado, not the open toolchain; its export is `vtakit hw export --board "
            "arty-z7-20`")):
        build("pynq-z1", output=tmp_path)
    r = CliRunner().invoke(main, ["hw", "build", "--board", "pynq-z1"])
    assert r.exit_code == 2 and "its export is `vtakit hw export --board arty-z7-20`" in r.output


def test_components_check_their_parameters():
    with pytest.raises(TypeError, match="AxiTop: cfg must be an HwConfig, got str"):
        AxiTop("ice40")
    with pytest.raises(ValueError, match=r"AxiLiteSlave: addr_bits=2 must be an int in 3..32"):
        AxiLiteSlave(2, [0], [0])
    with pytest.raises(ValueError, match=r"register addresses \['0x6'\] are not word-aligned"):
        AxiLiteSlave(8, [0, 6], [0])
    with pytest.raises(ValueError, match=r"writable registers \['0x8'\] are not readable"):
        AxiLiteSlave(8, [0, 4], [8])
