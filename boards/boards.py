"""The boards vtakit builds for: data only, on top of ``amaranth_boards`` platforms.

A :class:`Board` names the ``amaranth_boards`` platform class (pins, I/O standards and the
programming cable stay there; nothing is copied), the hardware preset it is sized for, the clock
the core runs at, the oscillator it is made from, the UART the host bridge talks through, the
LEDs that show the core's state, and the on-chip memory that serves as the core's DRAM.
:func:`board` finds one by name.

================= ================= ====== ======== ============ ==========================
name              part              preset clock    oscillator   core's DRAM
================= ================= ====== ======== ============ ==========================
``icebreaker``    iCE40 UP5K-SG48   ice40  12 MHz   12 MHz       4 SPRAMs, 128 KiB
``ulx3s-85f``     ECP5 LFE5U-85F    ecp5   (preset) 25 MHz, PLL  96 DP16KD, 192 KiB
``orangecrab-85f`` ECP5 LFE5U-85F   ecp5   48 MHz   48 MHz       96 DP16KD, 192 KiB
``arty-z7-20``    Zynq-7020         default (preset) PS FCLK     PS DDR3 over AXI (export only)
================= ================= ====== ======== ============ ==========================

Memory sizes: the ECP5-85F has 208 DP16KD (18 kbit, 2 KiB of a 64-bit bus each); the ``ecp5``
core's buffers take 94 and the SoC's read-data delay line 2, so 96 blocks (192 KiB) serve as
DRAM and 16 stay free (the opt-in ``ecp5-16x16`` core's buffers take 104: 6 stay free). The
UP5K's 30 EBRs go to the core (24) and the bridge (2); its four 128-kbit SPRAMs
(single-ported, which the one-beat-per-cycle memory model allows) are the DRAM, read with the
``ice40`` preset's one-cycle latency (no delay line).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = ["Board", "BoardMemory", "BOARDS", "board", "board_names", "STATUS_LEDS",
           "NEEDS_BOARDS", "NEXTPNR_PLACERS"]

#: the core's states a board can show on an LED, in the order a board lists them
STATUS_LEDS = ("running", "done", "fault", "frame_error")

#: The nextpnr placers a board build may use (``hw build --placer``; here, with the boards'
#: data, so the command line reads them without loading the build): ``heap`` (nextpnr's
#: default, analytic placement then simulated annealing) and ``static`` (electrostatic
#: placement, then the same annealing); annealing alone (``sa``) is left out, unmeasured. On
#: the ULX3S-85F's ``ecp5`` core (docs/boards.md; the netlist before MUL's operand register)
#: a whole build with ``static`` took 7.4 minutes alone on 2 cores against ``heap``'s 8.9
#: (its router about 30 % faster), and reached 71.1-74.6 MHz on seeds 1-4 against 74.0-76.2:
#: ``heap`` stays the default.
NEXTPNR_PLACERS = ("heap", "static")

#: what to install when ``amaranth_boards`` is missing
NEEDS_BOARDS = "needs amaranth-boards: pip install 'vtakit[fpga]'"

MEMORY_KINDS = ("bram", "spram", "axi")


@dataclass(frozen=True)
class BoardMemory:
    """The memory that serves as the core's DRAM.

    Parameters
    ----------
    kind : str
        ``"bram"`` (block RAM, inferred), ``"spram"`` (iCE40 ``SB_SPRAM256KA`` single-port
        RAMs, instantiated) or ``"axi"`` (the processing system's DRAM through an AXI port;
        Zynq boards, export only).
    size_bytes : int
        Bytes the core and the host bridge can address, from 0.
    blocks : int
        RAM primitives it takes (DP16KD, SB_SPRAM256KA; 0 for ``axi``).
    """

    kind: str
    size_bytes: int
    blocks: int = 0

    def __post_init__(self) -> None:
        if self.kind not in MEMORY_KINDS:
            raise ValueError(f"BoardMemory: kind={self.kind!r} (expected one of "
                             f"{', '.join(MEMORY_KINDS)})")
        if not isinstance(self.size_bytes, int) or self.size_bytes <= 0 or self.size_bytes % 64:
            raise ValueError(f"BoardMemory: size_bytes={self.size_bytes!r} must be a positive "
                             f"multiple of 64")


@dataclass(frozen=True)
class Board:
    """One FPGA board.

    Parameters
    ----------
    name : str
        What ``vtakit hw build --board`` takes (lower case).
    title : str
        The board in words.
    platform : str
        ``"module:Class"`` of its ``amaranth_boards`` platform.
    family : str
        ``"ice40"``, ``"ecp5"`` or ``"zynq"``.
    preset : str
        The :data:`~vtakit.vta_hw.config.PRESETS` entry sized for the part.
    oscillator : tuple[str, float]
        The platform's clock resource and its frequency in Hz.
    clock_mhz : float or None
        The core's clock; None: the preset's ``clock_mhz``. A PLL makes it from the oscillator
        when the two differ.
    uart : tuple[str, int] or None
        The platform resource the host bridge uses (``rx`` in, ``tx`` out).
    leds : Mapping[str, tuple]
        :data:`STATUS_LEDS` entry -> ``(resource, number)`` of a one-pin LED, or ``(resource,
        number, subsignal)`` of one colour of an RGB LED; states without an LED are left
        out.
    memory : BoardMemory
        The core's DRAM.
    extra_resources : tuple[str, ...]
        Attributes of the platform class holding resources to add (e.g. the iCEBreaker's
        break-off PMOD LEDs).
    uart_pins : tuple[str, str, str] or None
        ``(connector, rx pin, tx pin)``: a UART the platform does not declare, on connector
        pins (the OrangeCrab has no USB-serial chip: an adapter on its Feather header).
    baud : int
        The UART's rate (the driver's ``fpga`` device opens the port at it).
    programmer : str or None
        ``openFPGALoader -b`` board name.
    bitstream_suffix : str
        The file ``hw program`` loads (``.bin`` for iCE40, ``.bit`` for ECP5).
    export_only : bool
        No open-toolchain bitstream (Zynq): ``vtakit hw export`` writes the Verilog of an AXI
        top and a Vivado script that builds the bitstream (:mod:`vtakit.boards.zynq`).
    optional_tools : tuple[str, ...]
        Build steps of the platform that are skipped, with a note, when the tool is missing.
    aliases : tuple[str, ...]
        Other names :func:`board` accepts.
    vivado_part : str | None
        The part Vivado builds for (Zynq boards).
    vivado_boards : tuple[str, ...]
        Patterns of Vivado board parts (``get_board_parts``) whose presets fit the board; the
        export's script uses the first one installed, else its own PS settings.
    csr_base : int | None
        Where the processing system sees the core's registers (Zynq: in the M_AXI_GP0 range).
    notes : str
        One line for ``report.txt`` and the docs.
    dsp_blocks : int
        The part's multiplier blocks (MULT18X18D, SB_MAC16; 0: not counted). A core whose GEMM
        has more products than the blocks left beside its ALU builds the rest as multipliers
        in logic (:meth:`gemm_dsp_products`).
    ram_bytes : int
        The part's block RAM (data bytes; 0: not checked): a configuration whose buffers and
        DRAM need more is refused before synthesis (:meth:`check_config`).
    alu_dsp_sites : tuple[str, ...]
        A floorplan for the ALU's multipliers (ECP5): nextpnr sites (``X../Y../MULT18_n``)
        that ``hw build`` gives the ALU lanes' MULT18X18D blocks, three per lane in lane order,
        so each lane's blocks sit side by side near the ACC block RAMs
        (:func:`vtakit.boards.build.pin_alu_dsps`); empty: the placer chooses.
    """

    name: str
    title: str
    platform: str
    family: str
    preset: str
    oscillator: tuple[str, float]
    clock_mhz: float | None
    uart: tuple[str, int] | None
    leds: Mapping[str, tuple]
    memory: BoardMemory
    extra_resources: tuple[str, ...] = ()
    uart_pins: tuple[str, str, str] | None = None
    baud: int = 1_000_000
    programmer: str | None = None
    bitstream_suffix: str = ".bit"
    export_only: bool = False
    optional_tools: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    vivado_part: str | None = None
    vivado_boards: tuple[str, ...] = ()
    csr_base: int | None = None
    notes: str = ""
    dsp_blocks: int = 0
    ram_bytes: int = 0
    alu_dsp_sites: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.leds) - set(STATUS_LEDS)
        if unknown:
            raise ValueError(f"Board {self.name}: unknown LED states {sorted(unknown)} "
                             f"(expected some of {', '.join(STATUS_LEDS)})")
        for state, where in self.leds.items():
            if not (isinstance(where, tuple) and len(where) in (2, 3)):
                raise ValueError(f"Board {self.name}: LED of {state!r} is {where!r} (expected "
                                 f"(resource, number) or (resource, number, subsignal))")
        object.__setattr__(self, "leds", MappingProxyType(dict(self.leds)))

    def gemm_dsp_products(self, cfg) -> int | None:
        """How many of ``cfg``'s GEMM products go to DSP blocks on this board's part
        (:func:`vtakit.vta_hw.gemm.dsp_split`; :class:`~vtakit.vta_hw.top.Core`'s
        ``dsp_products``), or None for all of them (also where the part's blocks are not
        counted)."""
        if not self.dsp_blocks:
            return None
        from vtakit.vta_hw.gemm import dsp_split

        return dsp_split(cfg, self.dsp_blocks)

    def _ram_need(self, cfg) -> tuple[dict[str, int], int]:
        bufs = {"UOP": cfg.uop_buff_bytes, "INP": cfg.inp_buff_bytes, "WGT": cfg.wgt_buff_bytes,
                "ACC": cfg.acc_buff_bytes, "OUT": cfg.out_buff_bytes}
        dram = self.memory.size_bytes if self.memory.kind == "bram" else 0
        return bufs, dram

    def check_config(self, cfg, name: str = "custom") -> None:
        """``ValueError`` when ``cfg``'s buffers and the board's DRAM cannot fit the part's
        block RAM (a lower bound: block widths round the buffers up), naming the presets that
        fit."""
        if not self.ram_bytes:
            return
        bufs, dram = self._ram_need(cfg)
        need = sum(bufs.values()) + dram
        if need <= self.ram_bytes:
            return
        from vtakit.vta_hw.config import PRESETS

        fits = [n for n, c in PRESETS.items() if sum(self._ram_need(c)[0].values()) + dram
                <= self.ram_bytes]
        same = [n for n in fits if (PRESETS[n].batch, PRESETS[n].block_in, PRESETS[n].block_out,
                                    PRESETS[n].inp_width_bits, PRESETS[n].wgt_width_bits,
                                    PRESETS[n].acc_width_bits)
                == (cfg.batch, cfg.block_in, cfg.block_out, cfg.inp_width_bits,
                    cfg.wgt_width_bits, cfg.acc_width_bits)]
        parts = ", ".join(f"{k} {v // 1024} KiB" for k, v in bufs.items())
        raise ValueError(
            f"config {name} ({cfg.bitstream_name}) does not fit board {self.name}: its buffers "
            f"take {sum(bufs.values()) // 1024} KiB of block RAM ({parts})"
            + (f" and the board's DRAM {dram // 1024} KiB" if dram else "")
            + f", {need // 1024} KiB in all; the part has {self.ram_bytes // 1024} KiB "
            f"(presets that fit: {', '.join(fits) or 'none'})"
            + (f"; the same {cfg.batch}x{cfg.block_in}x{cfg.block_out} core with buffers that "
               f"fit: {', '.join(same)}" if same else ""))

    def target_mhz(self, cfg_clock_mhz: float) -> float:
        """The core's clock on this board for a configuration whose ``clock_mhz`` is given."""
        return float(self.clock_mhz if self.clock_mhz is not None else cfg_clock_mhz)

    def platform_class(self) -> type:
        """The ``amaranth_boards`` platform class (``ImportError`` saying what to install)."""
        module, _, cls = self.platform.partition(":")
        try:
            mod = importlib.import_module(module)
        except ImportError as err:
            raise ImportError(f"board {self.name!r} {NEEDS_BOARDS} ({err})") from None
        return getattr(mod, cls)

    def make_platform(self) -> Any:
        """A fresh platform object with this board's extra resources added."""
        plat = self.platform_class()()
        for attr in self.extra_resources:
            plat.add_resources(getattr(plat, attr))
        if self.uart_pins is not None:
            from amaranth.build import Attrs, Pins, Resource, Subsignal

            conn, rx, tx = self.uart_pins
            attrs = Attrs(IO_TYPE="LVCMOS33") if self.family == "ecp5" else Attrs()
            name, number = self.uart or ("uart", 0)
            plat.add_resources([Resource(
                name, number,
                Subsignal("rx", Pins(rx, dir="i", conn=(conn, 0))),
                Subsignal("tx", Pins(tx, dir="o", conn=(conn, 0))), attrs)])
        return plat


_ECP5_85F_DRAM = BoardMemory("bram", 192 * 1024, blocks=96)
_ECP5_85F_EBR_BYTES = 208 * 2048  # 208 DP16KD, 2 KiB of data each at the widths used
#: 24 MULT18X18D sites of the LFE5U-85F's DSP row at y = 58, x = 40..92 (six DSP tiles of
#: four multipliers: MULT18_0/1/4/5 at the tile's x, x+1, x+4, x+5; nextpnr's names, read
#: from a placed netlist). Left to itself the placer scattered the ALU's blocks over rows 34
#: and 58 across the die (one lane's three at x = 8 and x = 5, 24 rows apart), 40-50 columns
#: from the ALU's registers: its one-cycle loop was the critical path on every seed.
_ECP5_85F_ALU_DSP_SITES = tuple(f"X{x + dx}/Y58/MULT18_{n}" for x in (40, 49, 58, 69, 78, 87)
                                for dx, n in ((0, 0), (1, 1), (4, 4), (5, 5)))

BOARDS: dict[str, Board] = {b.name: b for b in (
    Board(
        name="icebreaker", title="1BitSquared iCEBreaker (iCE40 UP5K-SG48)",
        platform="amaranth_boards.icebreaker:ICEBreakerPlatform", family="ice40",
        preset="ice40", oscillator=("clk12", 12e6), clock_mhz=None, uart=("uart", 0),
        # the two LEDs on the board; done and frame error on the break-off PMOD's LEDs
        leds={"running": ("led_g", 0), "fault": ("led_r", 0), "done": ("led_g", 1),
              "frame_error": ("led_r", 1)},
        extra_resources=("break_off_pmod",),
        memory=BoardMemory("spram", 128 * 1024, blocks=4), dsp_blocks=8, ram_bytes=30 * 512,
        programmer="ice40_generic", bitstream_suffix=".bin",
        notes="UART through the FT2232H's second channel (the board's USB port)"),
    Board(
        name="ulx3s-85f", title="Radiona ULX3S with an LFE5U-85F",
        platform="amaranth_boards.ulx3s:ULX3S_85F_Platform", family="ecp5",
        preset="ecp5", oscillator=("clk25", 25e6), clock_mhz=None, uart=("uart", 0),
        leds={"running": ("led", 0), "done": ("led", 1), "fault": ("led", 2),
              "frame_error": ("led", 3)},
        memory=_ECP5_85F_DRAM, dsp_blocks=156, ram_bytes=_ECP5_85F_EBR_BYTES,
        alu_dsp_sites=_ECP5_85F_ALU_DSP_SITES, programmer="ulx3s", bitstream_suffix=".bit",
        notes="UART through the FT231X (the US1 USB port)"),
    Board(
        name="orangecrab-85f", title="Good Stuff Department OrangeCrab r0.2 with an LFE5U-85F",
        platform="amaranth_boards.orangecrab_r0_2:OrangeCrabR0_2_85FPlatform", family="ecp5",
        preset="ecp5", oscillator=("clk", 48e6), clock_mhz=48, uart=("uart", 0),
        uart_pins=("io", "0", "1"),
        leds={"running": ("rgb_led", 0, "g"), "done": ("rgb_led", 0, "b"),
              "fault": ("rgb_led", 0, "r")},
        memory=_ECP5_85F_DRAM, dsp_blocks=156, ram_bytes=_ECP5_85F_EBR_BYTES,
        alu_dsp_sites=_ECP5_85F_ALU_DSP_SITES, programmer="orangeCrab", bitstream_suffix=".bit",
        optional_tools=("dfu-suffix",),
        notes="no USB-serial chip: a 3.3 V USB-serial adapter on the Feather header (RX on "
              "pin 0, TX on pin 1); the core runs at the 48 MHz oscillator's clock"),
    Board(
        name="arty-z7-20", title="Digilent Arty Z7-20 / TUL Pynq-Z1 (Zynq-7020)",
        platform="amaranth_boards.arty_z7:ArtyZ720Platform", family="zynq",
        preset="default", oscillator=("clk125", 125e6), clock_mhz=None, uart=None,
        leds={"running": ("led", 0), "done": ("led", 1), "fault": ("led", 2)},
        memory=BoardMemory("axi", 512 * 1024 * 1024), programmer="arty_z7_20",
        bitstream_suffix=".bit", export_only=True, aliases=("pynq-z1",),
        vivado_part="xc7z020clg400-1", vivado_boards=("*pynq-z1*", "*arty-z7-20*"),
        csr_base=0x43C0_0000,
        notes="the core reaches the PS DDR through the S_AXI_HP0 port (vta_hw.axi.AxiMaster) "
              "and the host through AXI-Lite MMIO on M_AXI_GP0; vtakit hw export writes the "
              "Verilog and the Vivado script"),
)}


def board_names() -> list[str]:
    """The boards' names (without aliases), in catalogue order."""
    return list(BOARDS)


def board(name: str) -> Board:
    """The board called ``name`` (case-insensitive; aliases accepted).

    >>> board("ULX3S-85F").preset
    'ecp5'
    """
    if not isinstance(name, str):
        raise TypeError(f"board name must be a str, got {type(name).__name__} {name!r}")
    key = name.strip().lower()
    for b in BOARDS.values():
        if key == b.name or key in b.aliases:
            return b
    known = ", ".join(f"{b.name} (also {', '.join(b.aliases)})" if b.aliases else b.name
                      for b in BOARDS.values())
    raise ValueError(f"unknown board {name!r} (expected one of: {known})")
