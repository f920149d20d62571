"""`vtakit compile` and `vtakit run` end to end on a small model."""

from __future__ import annotations

import numpy as np
import onnx
from click.testing import CliRunner
from ort_reference import reference_session

from vtakit import models
from vtakit.cli import main


def test_compile_then_run(tmp_path) -> None:
    onnx.save(models.mlp(), tmp_path / "mlp.onnx")
    np.save(tmp_path / "x.npy", np.ones((1, 784), np.float32))
    r = CliRunner().invoke(main, ["compile", str(tmp_path / "mlp.onnx"), "--target", "cpu",
                                  "-o", str(tmp_path / "mlp.vtak")])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "target cpu" in r.output and "(cpu 6)" in r.output
    r = CliRunner().invoke(main, ["run", str(tmp_path / "mlp.vtak"), "--input",
                                  str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npz"),
                                  "--profile"])
    assert r.exit_code == 0, r.output
    assert "float32[1, 10]" in r.output and " ms  cpu   gemm" in r.output
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


def test_unknown_target_lists_the_registry(tmp_path) -> None:
    onnx.save(models.mlp(), tmp_path / "mlp.onnx")
    r = CliRunner().invoke(main, ["compile", str(tmp_path / "mlp.onnx"), "--target", "tpu",
                                  "-o", str(tmp_path / "m.vtak")])
    assert r.exit_code == 2
    assert "unknown target 'tpu'; the registered backends are ['cpu'" in r.output
    r = CliRunner().invoke(main, ["compile", "--help"])
    assert "--target [cpu" in r.output


def test_compile_cross_and_backend_options(tmp_path) -> None:
    onnx.save(models.mlp(), tmp_path / "mlp.onnx")
    r = CliRunner().invoke(main, ["compile", str(tmp_path / "mlp.onnx"), "--triple", "aarch64",
                                  "-o", str(tmp_path / "a.vtak")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["compile", str(tmp_path / "mlp.onnx"), "--option", "fast=1",
                                  "-o", str(tmp_path / "b.vtak")])
    assert r.exit_code != 0 and "unknown option(s) ['fast']" in r.output


def test_compile_quantized_digits(tmp_path) -> None:
    from vtakit import digits

    onnx.save(digits.load_model(), tmp_path / "d.onnx")
    np.savez(tmp_path / "calib.npz", digits.calibration_set())
    x, _ = digits.test_split()
    np.save(tmp_path / "x.npy", x[:1])
    r = CliRunner().invoke(main, ["compile", str(tmp_path / "d.onnx"), "--quantize", "-o",
                                  str(tmp_path / "d.vtak")])
    assert r.exit_code == 2 and "--quantize needs calibration data" in r.output
    r = CliRunner().invoke(main, ["compile", str(tmp_path / "d.onnx"), "--quantize", "--calib",
                                  str(tmp_path / "calib.npz"), "--quant-mode", "shift", "-o",
                                  str(tmp_path / "d.vtak")])
    assert r.exit_code == 0, r.output
    assert "mode shift; outputs: SQNR" in r.output and "conv3x3_0" in r.output
    r = CliRunner().invoke(main, ["run", str(tmp_path / "d.vtak"), "--input",
                                  str(tmp_path / "x.npy"), "--profile"])
    assert r.exit_code == 0, r.output
    assert "gemm_s8" in r.output and "im2col" in r.output  # the int8 GEMM path


def test_quantize_writes_a_qdq_model_onnxruntime_runs(tmp_path) -> None:
    __import__("pytest").importorskip("onnxruntime")
    from vtakit import digits

    onnx.save(digits.load_model(), tmp_path / "d.onnx")
    np.savez(tmp_path / "calib.npz", digits.calibration_set())
    r = CliRunner().invoke(main, ["quantize", str(tmp_path / "d.onnx"), "--calib",
                                  str(tmp_path / "calib.npz"), "-o", str(tmp_path / "q.onnx")])
    assert r.exit_code == 0, r.output
    assert "SQNR" in r.output and "QDQ" in r.output
    q = onnx.load(tmp_path / "q.onnx")
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in q.graph.node}
    x, y = digits.test_split()
    sess = reference_session(q)
    name = sess.get_inputs()[0].name
    pred = np.array([sess.run(None, {name: x[i:i + 1]})[0].argmax() for i in range(len(x))])
    assert (pred == y).mean() >= 0.96
    r = CliRunner().invoke(main, ["quantize", str(tmp_path / "d.onnx"), "--calib",
                                  str(tmp_path / "calib.npz"), "--keep-float", "nope", "-o",
                                  str(tmp_path / "q2.onnx")])
    assert r.exit_code == 2 and "keep_float names ['nope']" in r.output
