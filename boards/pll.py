"""PLL settings for the boards' clocks: Lattice ECP5 ``EHXPLLL`` and iCE40 ``SB_PLL40_CORE``.

Pure Python (no Amaranth): :func:`ecp5_pll` and :func:`ice40_pll` search the dividers the way
Project Trellis' ``ecppll`` and IceStorm's ``icepll`` do, within the parts' documented ranges,
and return the fastest output clock that is not faster than the target (so that a design
constrained for the target also meets timing at the clock it gets). The SoC top
(:mod:`vtakit.boards.soc`) turns the settings into an ``Instance``.

Worked example: ULX3S, 25 MHz oscillator, 75 MHz target: ``ecp5_pll(25e6, 75e6)`` gives
``CLKI_DIV=1, CLKFB_DIV=3, CLKOP_DIV=8``: 25 / 1 * 3 = 75 MHz, VCO 75 * 8 = 600 MHz (what
``ecppll -i 25 -o 75`` prints).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Ecp5Pll", "Ice40Pll", "ecp5_pll", "ice40_pll", "PllError"]

#: how far below the target a PLL output may be before the target counts as unreachable
MAX_SHORTFALL = 0.05


class PllError(ValueError):
    """No PLL setting reaches the requested clock from the oscillator."""


@dataclass(frozen=True)
class Ecp5Pll:
    """``EHXPLLL`` dividers with CLKOP as the feedback path: ``f_out = f_in / clki_div *
    clkfb_div``, ``f_vco = f_out * clkop_div``."""

    f_in_hz: float
    clki_div: int
    clkfb_div: int
    clkop_div: int

    @property
    def f_out_hz(self) -> float:
        return self.f_in_hz / self.clki_div * self.clkfb_div

    @property
    def f_vco_hz(self) -> float:
        return self.f_out_hz * self.clkop_div


@dataclass(frozen=True)
class Ice40Pll:
    """``SB_PLL40_CORE`` settings with SIMPLE feedback: ``f_out = f_in / (divr + 1) * (divf + 1)
    / 2**divq``; ``filter_range`` follows the phase detector's frequency (``icepll``'s
    table)."""

    f_in_hz: float
    divr: int
    divf: int
    divq: int

    @property
    def f_pfd_hz(self) -> float:
        return self.f_in_hz / (self.divr + 1)

    @property
    def f_vco_hz(self) -> float:
        return self.f_pfd_hz * (self.divf + 1)

    @property
    def f_out_hz(self) -> float:
        return self.f_vco_hz / (1 << self.divq)

    @property
    def filter_range(self) -> int:
        mhz = self.f_pfd_hz / 1e6
        for bound, value in ((17, 1), (26, 2), (44, 3), (66, 4), (101, 5)):
            if mhz < bound:
                return value
        return 6


def _check(who: str, f_in_hz: float, f_out_hz: float) -> None:
    for name, v in (("f_in_hz", f_in_hz), ("f_out_hz", f_out_hz)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise PllError(f"{who}: {name}={v!r} must be a positive frequency in Hz")


def _pick(who: str, f_in_hz: float, f_out_hz: float, candidates, lo_hz: float, hi_hz: float):
    """The candidate with the highest output not above ``f_out_hz`` (ties: VCO nearest the
    middle of its range), or PllError when none is within MAX_SHORTFALL of it."""
    best, best_key = None, None
    mid = (lo_hz + hi_hz) / 2
    for pll in candidates:
        f = pll.f_out_hz
        if f > f_out_hz * (1 + 1e-9):
            continue
        key = (round(f, 3), -abs(pll.f_vco_hz - mid))
        if best_key is None or key > best_key:
            best, best_key = pll, key
    if best is None or best.f_out_hz < f_out_hz * (1 - MAX_SHORTFALL):
        near = f"; the nearest below is {best.f_out_hz / 1e6:.3f} MHz" if best else ""
        raise PllError(f"{who}: no PLL setting makes {f_out_hz / 1e6:g} MHz from "
                       f"{f_in_hz / 1e6:g} MHz (expected an output within "
                       f"{MAX_SHORTFALL:.0%} below the target{near})")
    return best


def ecp5_pll(f_in_hz: float, f_out_hz: float) -> Ecp5Pll:
    """Dividers of an ECP5 ``EHXPLLL`` making ``f_out_hz`` (or the fastest clock below it)
    from ``f_in_hz``: phase detector 3.125-400 MHz, VCO 400-800 MHz, dividers 1-128."""
    _check("ecp5_pll", f_in_hz, f_out_hz)

    def candidates():
        for clki in range(1, 129):
            if not 3.125e6 <= f_in_hz / clki <= 400e6:
                continue
            for clkfb in range(1, 129):
                f = f_in_hz / clki * clkfb
                if f > f_out_hz * (1 + 1e-9) or f < 3.125e6:
                    continue
                for clkop in range(1, 129):
                    if 400e6 <= f * clkop <= 800e6:
                        yield Ecp5Pll(f_in_hz, clki, clkfb, clkop)

    return _pick("ecp5_pll", f_in_hz, f_out_hz, candidates(), 400e6, 800e6)


def ice40_pll(f_in_hz: float, f_out_hz: float) -> Ice40Pll:
    """Settings of an iCE40 ``SB_PLL40_CORE`` making ``f_out_hz`` (or the fastest clock below
    it) from ``f_in_hz``: phase detector 10-133 MHz, VCO 533-1066 MHz, output divider 2-64."""
    _check("ice40_pll", f_in_hz, f_out_hz)

    def candidates():
        for divr in range(16):
            pfd = f_in_hz / (divr + 1)
            if not 10e6 <= pfd <= 133e6:
                continue
            for divf in range(128):
                if not 533e6 <= pfd * (divf + 1) <= 1066e6:
                    continue
                for divq in range(1, 7):
                    yield Ice40Pll(f_in_hz, divr, divf, divq)

    return _pick("ice40_pll", f_in_hz, f_out_hz, candidates(), 533e6, 1066e6)
