"""The accelerator's part of an artifact, run by the runtime on a device: saved and loaded,
refused on a device of another configuration, the same on `sim` and `rtl`."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest
from rtl_helpers import require_rtl

from vtakit import digits
from vtakit.compiler.compile import compile_model, lower_model
from vtakit.driver.devices.sim import SimDevice
from vtakit.runtime import Artifact, ArtifactError
from vtakit.runtime.executor import GraphExecutor
from vtakit.vta_hw.config import preset


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    art = compile_model(digits.load_model(), target="vta", quantize=True,
                        calib=digits.calibration_set())
    path = tmp_path_factory.mktemp("vta") / "digits.vtak"
    art.save(path)
    return path


def _run(ex, x):
    ex.set_input(0, x)
    ex.run()
    return ex.get_output(0).copy()


def test_saved_artifact_runs_like_the_plan_it_came_from(artifact):
    names = set(zipfile.ZipFile(artifact).namelist())
    assert {"vta/region0.npz", "vta/params.npz", "vta/region0_layer0.npz",
            "cpu/host.o"} <= names
    loaded = Artifact.load(artifact)
    assert loaded.manifest["hw_config_hash"] == preset("default").hash
    assert loaded.manifest["backends"][0] == "vta"
    plan = lower_model(digits.load_model(), target="vta", quantize=True,
                       calib=digits.calibration_set())
    x, _ = digits.test_split()
    a, b = GraphExecutor(loaded), GraphExecutor(plan)
    for i in range(3):
        assert np.array_equal(_run(a, x[i:i + 1]), _run(b, x[i:i + 1]))
    assert a.runners["vta"].last_runs[0].cycles == b.runners["vta"].last_runs[0].cycles


def test_a_device_of_another_configuration_is_refused(artifact):
    loaded = Artifact.load(artifact)
    other = SimDevice(preset("ecp5"))
    with pytest.raises(ValueError, match=r"compiled for hardware configuration "
                                         rf"{preset('default').hash}.*the device given is "
                                         rf"{preset('ecp5').hash}"):
        GraphExecutor(loaded, runner_options={"vta": {"device": other}})


def test_runner_options_are_checked(artifact):
    loaded = Artifact.load(artifact)
    with pytest.raises(ValueError, match=r"device='fpga0'; expected 'sim', 'rtl'"):
        GraphExecutor(loaded, runner_options={"vta": {"device": "fpga0"}})
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['clock'\]"):
        GraphExecutor(loaded, runner_options={"vta": {"clock": 3}})
    with pytest.raises(ValueError, match=r"runner_options for \['gpu'\], which the plan does "
                                         r"not use"):
        GraphExecutor(loaded, runner_options={"gpu": {}})


def test_a_device_given_is_shared_and_left_open(artifact):
    dev = SimDevice(preset("default"))
    start = dev.allocator.free_bytes
    ex = GraphExecutor(Artifact.load(artifact), runner_options={"vta": {"device": dev}})
    x, _ = digits.test_split()
    _run(ex, x[:1])
    assert dev.allocator.free_bytes < start
    ex.close()
    assert dev.allocator.free_bytes == start  # the session's buffers are released


def test_an_artifact_missing_its_streams_is_refused(artifact, tmp_path):
    broken = tmp_path / "broken.vtak"
    with zipfile.ZipFile(artifact) as src, zipfile.ZipFile(broken, "w") as dst:
        for item in src.infolist():
            if item.filename != "vta/region0.npz":
                dst.writestr(item, src.read(item))
    with pytest.raises(ArtifactError, match=r"region0\.npz"):
        Artifact.load(broken)


@pytest.mark.rtl
def test_digits_on_rtl_equals_sim_in_outputs_and_cycles(artifact):
    require_rtl()
    loaded = Artifact.load(artifact)
    x, _ = digits.test_split()
    sim = GraphExecutor(loaded, runner_options={"vta": {"device": "sim"}})
    rtl = GraphExecutor(loaded, runner_options={"vta": {"device": "rtl"}})
    try:
        for i in range(2):
            assert np.array_equal(_run(sim, x[i:i + 1]), _run(rtl, x[i:i + 1]))
            assert sim.runners["vta"].last_runs[0].cycles == \
                rtl.runners["vta"].last_runs[0].cycles
    finally:
        rtl.close()


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["regions"][0]["slots"].update({"r0.a0": {"shape": [0], "dtype": "int8",
                                                          "param": False}}),
     r"regions\[0\]\.slots\['r0\.a0'\]\.shape: expected positive ints"),
    (lambda m: m["regions"][0]["inputs"][0].update(slot="nowhere"),
     r"regions\[0\]\.inputs\[0\]: expected slot \(one of the region's\)"),
    (lambda m: next(v for v in m["regions"][0]["slots"].values() if v["param"]).update(
        shape=[1, 2, 3]), r"params\.npz: array .* the slot expects int(8|32)\[1, 2, 3\]"),
    (lambda m: m["regions"][0]["layers"][0].update(program="gone.npz"),
     r"lacks member\(s\) \['gone\.npz'\]"),
])
def test_a_corrupt_vta_section_is_refused_at_load(artifact, edit, message):
    """Metadata that does not describe its streams and arrays: an ArtifactError naming the
    field, before anything reaches a device."""
    import copy

    from vtakit.runtime.vta import VtaRunner

    section = Artifact.load(artifact).plan.sections["vta"]
    bad = copy.deepcopy(section)
    edit(bad.meta)
    with pytest.raises(ValueError, match=message):
        VtaRunner.check_section(bad)
