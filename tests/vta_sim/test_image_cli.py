"""RunImage round trip and the ``vtakit sim`` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from sim_helpers import Image, load

from vtakit.vta_hw.config import preset
from vtakit.vta_hw.isa import FinishInsn, MemType
from vtakit.vta_sim import RunImage
from vtakit.vta_sim.cli import sim_command


def make_image(tmp_path, prog=None):
    cfg = preset("default")
    img = Image(cfg, size=64 << 10)
    prog = prog or [load(MemType.INP, 0, 4096 // 16, 1, 4, pads=(1, 1, 1, 1), push_next=1),
                    FinishInsn(pop_prev=1)]
    addr, n = img.put_insns(prog)
    path = tmp_path / "run.npz"
    RunImage(cfg, img.dram, addr, n, "a padded load").save(path)
    return path


def test_round_trip_and_run(tmp_path):
    path = make_image(tmp_path)
    image = RunImage.load(path)
    assert image.description == "a padded load" and image.insn_count == 2
    stats, sim = image.run()
    assert stats.cycles == 94
    assert sim.dram.size == 64 << 10
    stats, _ = image.run(timing=False)
    assert stats.cycles == 0


def test_not_an_image(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, dram=np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match="not a run image, missing config, insn_addr, "
                                         "insn_count"):
        RunImage.load(path)


def test_cli_prints_stats_and_trace(tmp_path):
    path = make_image(tmp_path)
    trace = tmp_path / "t.json"
    res = CliRunner().invoke(sim_command, [str(path), "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    assert "a padded load" in res.output and "cycles" in res.output and "94" in res.output
    assert json.loads(trace.read_text())["traceEvents"]
    res = CliRunner().invoke(sim_command, [str(path), "--no-timing"])
    assert res.exit_code == 0 and "timing off" in res.output


def test_cli_reports_device_errors(tmp_path):
    path = make_image(tmp_path, [FinishInsn(pop_prev=1)])
    res = CliRunner().invoke(sim_command, [str(path)])
    assert res.exit_code != 0 and "deadlock" in res.output
    path = make_image(tmp_path)
    res = CliRunner().invoke(sim_command, [str(path), "--cycle-limit", "50"])
    assert res.exit_code != 0 and "cycle limit 50" in res.output
