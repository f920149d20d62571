"""`vtakit compile` and `vtakit run` end to end on a small model."""

from __future__ import annotations

import numpy as np
import onnx
from click.testing import CliRunner

from vtakit.cli import main
from vtakit.compiler import models


def test_compile_then_run(tmp_path) -> None:
    onnx.save(models.mlp(), tmp_path / "mlp.onnx")
    np.save(tmp_path / "x.npy", np.ones((1, 784), np.float32))
    r = CliRunner().invoke(main, ["compile", str(tmp_path / "mlp.onnx"), "--target", "cpu",
                                  "-o", str(tmp_path / "mlp.vtak")])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "['host']" in r.output
    r = CliRunner().invoke(main, ["run", str(tmp_path / "mlp.vtak"), "--input",
                                  str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npz"),
                                  "--profile"])
    assert r.exit_code == 0, r.output
    assert "float32[1, 10]" in r.output and " ms " in r.output
    assert np.load(tmp_path / "y.npz")[models.mlp().graph.output[0].name].shape == (1, 10)


def test_run_rejects_a_foreign_file(tmp_path) -> None:
    (tmp_path / "bad.vtak").write_bytes(b"not a zip")
    np.save(tmp_path / "x.npy", np.ones((1, 784), np.float32))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "bad.vtak"), "--input",
                                  str(tmp_path / "x.npy")])
    assert r.exit_code != 0 and "not a vtakit artifact" in r.output


def test_run_names_a_bad_input_shape(tmp_path) -> None:
    onnx.save(models.mlp(), tmp_path / "mlp.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 784), np.float32))
    CliRunner().invoke(main, ["compile", str(tmp_path / "mlp.onnx"), "-o",
                              str(tmp_path / "m.vtak")])
    r = CliRunner().invoke(main, ["run", str(tmp_path / "m.vtak"), "--input",
                                  str(tmp_path / "x.npy")])
    assert r.exit_code != 0 and "got shape (2, 784), expected (1, 784)" in r.output
