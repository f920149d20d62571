# amaranth: UnusedElaboratable=no
"""The board catalogue: lookup, each board's data against its amaranth-boards platform and the
presets, and the PLL settings."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vtakit.boards.boards import BOARDS, STATUS_LEDS, Board, BoardMemory, board, board_names
from vtakit.boards.pll import PllError, ecp5_pll, ice40_pll
from vtakit.vta_hw.config import PRESETS, preset

BUILDABLE = [b.name for b in BOARDS.values() if not b.export_only]


def test_lookup_by_name_alias_and_case():
    assert board_names() == ["icebreaker", "ulx3s-85f", "orangecrab-85f", "arty-z7-20"]
    assert board("ULX3S-85F") is BOARDS["ulx3s-85f"]
    assert board(" icebreaker ") is BOARDS["icebreaker"]
    assert board("pynq-z1") is BOARDS["arty-z7-20"]


def test_unknown_board_lists_the_known_names():
    with pytest.raises(ValueError, match=re.escape(
            "unknown board 'ulx3s' (expected one of: icebreaker, ulx3s-85f, orangecrab-85f, "
            "arty-z7-20 (also pynq-z1))")):
        board("ulx3s")
    with pytest.raises(TypeError, match="board name must be a str, got int 3"):
        board(3)


@pytest.mark.parametrize("name", board_names())
def test_board_data_is_consistent(name):
    b = board(name)
    cfg = preset(b.preset)
    assert b.preset in PRESETS
    assert set(b.leds) <= set(STATUS_LEDS)
    assert b.memory.size_bytes % cfg.bus_bytes == 0
    if b.memory.kind == "bram":      # 18-kbit blocks, 16 kbit used by a 64-bit bus word
        assert b.memory.blocks * 2048 == b.memory.size_bytes
    if b.memory.kind == "spram":
        assert b.memory.blocks * 32 * 1024 == b.memory.size_bytes
    assert b.target_mhz(cfg.clock_mhz) > 0
    assert (b.family == "zynq") == b.export_only


@pytest.mark.parametrize("name", board_names())
def test_board_matches_its_platform(name):
    """The oscillator, UART and LEDs a board names exist in its amaranth-boards platform
    (with the board's extra resources), with the frequency the board says."""
    pytest.importorskip("amaranth_boards", reason="needs amaranth-boards: pip install "
                                                  "'vtakit[fpga]'")
    b = board(name)
    plat = b.make_platform()
    osc = plat.lookup(*b.oscillator[:1], 0)
    assert osc.clock.frequency == b.oscillator[1]
    if b.uart is not None:
        uart = plat.lookup(*b.uart)
        assert {s.name for s in uart.ios} >= {"rx", "tx"}
    for state, where in b.leds.items():
        res = plat.lookup(where[0], where[1])
        if len(where) == 3:
            assert where[2] in {s.name for s in res.ios}, (state, where)


@pytest.mark.parametrize("name", BUILDABLE)
def test_core_clock_is_reachable(name):
    """The PLL (or the oscillator) gives the board's target clock exactly."""
    pytest.importorskip("amaranth_boards")
    from vtakit.boards.soc import BoardTop

    b = board(name)
    cfg = preset(b.preset)
    top = BoardTop(b, cfg)
    assert top.clk_hz == pytest.approx(b.target_mhz(cfg.clock_mhz) * 1e6)
    assert (top.pll is None) == (b.target_mhz(cfg.clock_mhz) * 1e6 == b.oscillator[1])


def test_board_checks_its_data():
    with pytest.raises(ValueError, match=r"unknown LED states \['blink'\] \(expected some of "
                                         r"running, done, fault, frame_error\)"):
        Board(name="x", title="x", platform="m:C", family="ecp5", preset="ecp5",
              oscillator=("clk", 1e6), clock_mhz=None, uart=None, leds={"blink": ("led", 0)},
              memory=BoardMemory("bram", 1024))
    with pytest.raises(ValueError, match=r"kind='dram' \(expected one of bram, spram, axi\)"):
        BoardMemory("dram", 1024)
    with pytest.raises(ValueError, match="size_bytes=1000 must be a positive multiple of 64"):
        BoardMemory("bram", 1000)


def test_missing_platform_module_says_what_to_install():
    b = Board(name="nowhere", title="x", platform="amaranth_boards_not_there:P",
              family="ecp5", preset="ecp5", oscillator=("clk", 1e6), clock_mhz=None,
              uart=None, leds={}, memory=BoardMemory("bram", 1024))
    with pytest.raises(ImportError, match=r"board 'nowhere' needs amaranth-boards: pip install "
                                          r"'vtakit\[fpga\]'"):
        b.make_platform()


# (f_in, f_out) -> expected dividers, as ecppll / icepll print them
ECP5_CASES = {(25e6, 75e6): (1, 3, 8), (25e6, 50e6): (1, 2, 12), (48e6, 72e6): (2, 3, 8)}
ICE40_CASES = {(12e6, 24e6): (0, 63, 5, 1), (12e6, 30e6): (0, 79, 5, 1)}


@pytest.mark.parametrize("f", list(ECP5_CASES))
def test_ecp5_pll(f):
    p = ecp5_pll(*f)
    assert (p.clki_div, p.clkfb_div, p.clkop_div) == ECP5_CASES[f]
    assert p.f_out_hz == f[1] and 400e6 <= p.f_vco_hz <= 800e6


@pytest.mark.parametrize("f", list(ICE40_CASES))
def test_ice40_pll(f):
    p = ice40_pll(*f)
    assert (p.divr, p.divf, p.divq, p.filter_range) == ICE40_CASES[f]
    assert p.f_out_hz == f[1]


def test_pll_never_overclocks_and_says_when_it_cannot():
    p = ecp5_pll(48e6, 50e6)       # 50 is not reachable from 48 within the PFD limits
    assert p.f_out_hz <= 50e6 and p.f_out_hz >= 47.5e6
    with pytest.raises(PllError, match=r"ecp5_pll: no PLL setting makes 1 MHz from 25 MHz "
                                       r"\(expected an output within 5% below the target\)"):
        ecp5_pll(25e6, 1e6)
    with pytest.raises(PllError, match="ice40_pll: f_out_hz=-5 must be a positive frequency"):
        ice40_pll(12e6, -5)


def _tool(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"needs {name}: pip install 'vtakit[fpga]'")
    return found


@pytest.mark.fpga
@pytest.mark.parametrize("f", list(ICE40_CASES))
def test_ice40_pll_agrees_with_icepll(f):
    out = subprocess.run([_tool("yowasp-icepll"), "-i", f"{f[0] / 1e6:g}", "-o",
                          f"{f[1] / 1e6:g}"], capture_output=True, text=True, check=True).stdout
    got = {k: int(v) for k, v in re.findall(r"^(DIVR|DIVF|DIVQ|FILTER_RANGE):\s*(\d+)", out,
                                            re.M)}
    p = ice40_pll(*f)
    assert got == {"DIVR": p.divr, "DIVF": p.divf, "DIVQ": p.divq,
                   "FILTER_RANGE": p.filter_range}


@pytest.mark.fpga
@pytest.mark.parametrize("f", list(ECP5_CASES))
def test_ecp5_pll_agrees_with_ecppll(f):
    out = subprocess.run([_tool("yowasp-ecppll"), "-i", f"{f[0] / 1e6:g}", "-o",
                          f"{f[1] / 1e6:g}"], capture_output=True, text=True, check=True).stdout
    got = [int(v) for v in re.findall(r"(?:Refclk|Feedback|clkout0) divisor: (\d+)", out)]
    p = ecp5_pll(*f)
    assert got == [p.clki_div, p.clkfb_div, p.clkop_div]


def test_gemm_products_beyond_the_parts_multipliers_go_to_logic():
    ulx3s, ice = board("ulx3s-85f"), board("icebreaker")
    assert ulx3s.gemm_dsp_products(preset("ecp5")) is None  # 64 + 24 fit 156 blocks
    assert ice.gemm_dsp_products(preset("ice40")) is None    # 1 + 3 fit 8
    # 256 products, 16 ALU lanes: 156 - 48 - 4 leaves 104, six whole lanes of 16
    assert ulx3s.gemm_dsp_products(preset("ecp5-16x16")) == 96
    assert board("arty-z7-20").gemm_dsp_products(preset("default")) is None  # not counted


@pytest.mark.slow
def test_the_16x16_core_needs_no_more_multipliers_than_the_ecp5_85f_has():
    from amaranth.back import rtlil

    from vtakit.vta_hw.top import Core

    b, cfg = board("ulx3s-85f"), preset("ecp5-16x16")
    text = rtlil.convert(Core(cfg, dsp_products=b.gemm_dsp_products(cfg)), name="vta_core")
    muls = text.count("cell $mul ")
    assert 96 + 48 <= muls <= b.dsp_blocks


def test_a_config_too_big_for_the_boards_block_ram_is_refused_naming_what_fits():
    with pytest.raises(ValueError, match=re.escape(
            "config default (1x16x16_i8w8a32_15_15_18_17) does not fit board ulx3s-85f: its "
            "buffers take 480 KiB of block RAM (UOP 32 KiB, INP 32 KiB, WGT 256 KiB, ACC 128 "
            "KiB, OUT 32 KiB) and the board's DRAM 192 KiB, 672 KiB in all; the part has 416 "
            "KiB (presets that fit: ecp5, ecp5-16x16, ice40); the same 1x16x16 core with "
            "buffers that fit: ecp5-16x16")):
        board("ulx3s-85f").check_config(preset("default"), "default")
    with pytest.raises(ValueError, match=r"config ecp5 .* does not fit board icebreaker: .*"
                                         r"the part has 15 KiB \(presets that fit: ice40\)$"):
        board("icebreaker").check_config(preset("ecp5"), "ecp5")
    for name in BUILDABLE:  # every board takes its own preset
        board(name).check_config(preset(board(name).preset))
    board("ulx3s-85f").check_config(preset("ecp5-16x16"))


def test_the_board_top_gives_the_core_its_dsp_split():
    pytest.importorskip("amaranth_boards", reason="needs amaranth-boards: pip install "
                                                  "'vtakit[fpga]'")
    from vtakit.boards.soc import BoardTop

    b = board("ulx3s-85f")
    for name, want in (("ecp5-16x16", 96), ("ecp5", None)):
        top = BoardTop(b, preset(name))
        top.elaborate(b.make_platform())
        assert top.soc.core.dsp_products == want, name
