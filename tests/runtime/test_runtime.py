"""Artifact format, GraphExecutor, InferenceSession: round trips, bad files, bad inputs."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from vtakit import models
from vtakit.compiler.compile import compile_model
from vtakit.runtime.artifact import Artifact, ArtifactError
from vtakit.runtime.executor import GraphExecutor
from vtakit.runtime.session import InferenceSession


@pytest.fixture(scope="module")
def mlp_artifact() -> Artifact:
    return compile_model(models.mlp(), threads=2)


def test_manifest_and_round_trip(mlp_artifact: Artifact) -> None:
    data = mlp_artifact.to_bytes()
    art = Artifact.load(data)
    m = art.manifest
    assert m["format_version"] == 3 and m["backends"] == ["cpu"] and m["target"] == "cpu"
    assert m["inputs"][0]["shape"] == [1, 784]
    assert art.plan.sections["cpu"].meta["objects"]["host.o"]["cpu"]
    assert {s.backend for s in art.plan.steps} == {"cpu"}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert {"manifest.json", "plan.json", "params.npz", "cpu/module.ll",
                "cpu/host.o"} <= set(z.namelist())


def test_object_and_ir_paths_agree(mlp_artifact: Artifact) -> None:
    x = np.random.default_rng(1).standard_normal((1, 784)).astype(np.float32)
    ex = GraphExecutor(mlp_artifact)
    ex.set_input(0, x)
    ex.run()
    assert ex.runners["cpu"].code_source == "object"
    # An object built for another CPU is not loaded: the IR is compiled here instead.
    ir_only = Artifact.load(mlp_artifact.to_bytes())
    ir_only.plan.sections["cpu"].meta["objects"]["host.o"]["cpu"] = "some-other-cpu"
    ex2 = GraphExecutor(ir_only, threads=1)
    assert ex2.runners["cpu"].code_source == "ir"
    ex2.set_input("x", x) if "x" in ex2.input_names else ex2.set_input(0, x)
    ex2.run()
    np.testing.assert_allclose(ex.get_output(0), ex2.get_output(0), rtol=1e-6)
    prof = ex.profile()
    assert prof and all(isinstance(ms, float) and backend == "cpu"
                        for _, _, backend, ms in prof)


def test_session_errors(mlp_artifact: Artifact) -> None:
    sess = InferenceSession(mlp_artifact)
    name = sess.get_inputs()[0].name
    assert sess.get_inputs()[0].type == "tensor(float)"
    with pytest.raises(ValueError, match=r"missing \['" + name + r"'\], unknown \['y'\]"):
        sess.run(None, {"y": np.zeros((1, 784), np.float32)})
    with pytest.raises(ValueError, match=r"got shape \(2, 784\), expected \(1, 784\)"):
        sess.run(None, {name: np.zeros((2, 784), np.float32)})
    with pytest.raises(TypeError, match="got dtype float64, expected float32"):
        sess.run(None, {name: np.zeros((1, 784))})
    with pytest.raises(ValueError, match="unknown output name 'nope'"):
        sess.run(["nope"], {name: np.zeros((1, 784), np.float32)})


def test_bad_files(mlp_artifact: Artifact, tmp_path) -> None:
    with pytest.raises(ArtifactError, match="not a zip file"):
        Artifact.load(b"hello")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("other.txt", "x")
    with pytest.raises(ArtifactError, match="no manifest.json"):
        Artifact.load(buf.getvalue())
    data = mlp_artifact.to_bytes()
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for n in src.namelist():
            body = src.read(n)
            if n == "manifest.json":
                body = json.dumps(dict(json.loads(body), format_version=99)).encode()
            z.writestr(n, body)
    with pytest.raises(ArtifactError, match="format version 99 is not supported"):
        Artifact.load(out.getvalue())


def test_aarch64_cross_compile(tmp_path) -> None:
    art = compile_model(models.mlp(), options={"triple": "aarch64"})
    path = tmp_path / "m.vtak"
    art.save(path)
    section = Artifact.load(path).plan.sections["cpu"]
    assert section.meta["objects"] == {"aarch64.o": {
        "triple": "aarch64-unknown-linux-gnu", "cpu": "", "features": ""}}
    obj = section.members["aarch64.o"]
    assert obj[:4] == b"\x7fELF" and int.from_bytes(obj[18:20], "little") == 183  # EM_AARCH64
