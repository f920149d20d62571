"""The command line never answers a user's mistake with a traceback: one line "Error: ...",
exit status 2; `--debug` or VTAKIT_DEBUG=1 shows the traceback instead."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from vtakit import models
from vtakit.cli import main


def _cli(*args, env=None):
    return CliRunner(env=env).invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The bad inputs of the table, and one good artifact to run with bad inputs."""
    d = tmp_path_factory.mktemp("bad")
    mlp = models.mlp()
    onnx.save(mlp, d / "mlp.onnx")
    (d / "garbage.onnx").write_bytes(b"\x08\x07garbage, not a protobuf")
    (d / "truncated.onnx").write_bytes(mlp.SerializeToString()[:3000])
    node = helper.make_node("NonZero", ["x"], ["y"], name="nz")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, [2, "n"])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              d / "nonzero.onnx")
    big = [1 << 20, 1 << 20]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu0")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, big)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, big)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              d / "huge.onnx")
    (d / "empty.npz").write_bytes(b"")
    np.savez(d / "noarrays.npz")
    (d / "latin1.json").write_bytes(b'{"name": "caf\xe9"}')
    (d / "nested.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "short.bin").write_bytes(b"\0" * 17)
    np.save(d / "x.npy", np.ones((1, 784), np.float32))
    np.save(d / "wide.npy", np.ones((2, 784), np.float32))
    r = _cli("compile", d / "mlp.onnx", "-o", d / "mlp.vtak")
    assert r.exit_code == 0, r.output
    return d


# (command line with {d} for the folder, what the error line must say)
BAD = [
    ("compile {d}/garbage.onnx -o {d}/o.vtak", "garbage.onnx: not a valid ONNX model: cannot "
                                               "parse protobuf"),
    ("compile {d}/truncated.onnx -o {d}/o.vtak", "truncated.onnx: not a valid ONNX model"),
    ("compile {d}/nonzero.onnx -o {d}/o.vtak", "node 'nz' (NonZero): operator 'NonZero' is not "
                                               "supported"),
    ("compile {d}/huge.onnx -o {d}/o.vtak", "graph input 'x': float32[1048576, 1048576] would "
                                            "take 4.0 TiB"),
    ("quantize {d}/garbage.onnx --calib {d}/x.npy -o {d}/q.onnx", "not a valid ONNX model"),
    ("compare {d}/garbage.onnx --out {d}/cmp", "not a valid ONNX model"),
    ("run {d}/mlp.vtak --input {d}/missing.npy", "--input {d}/missing.npy: cannot load it as a "
                                                 ".npy array: {d}/missing.npy: No such file"),
    ("run {d}/mlp.vtak --input {d}/wide.npy", "got shape (2, 784), expected (1, 784)"),
    ("run {d}/mlp.onnx --input {d}/x.npy", "not a vtakit artifact"),
    ("sim {d}/empty.npz", "No data left in file"),
    ("sim {d}/noarrays.npz", "noarrays.npz: not a run image, missing config, dram"),
    ("config show {d}/latin1.json", "latin1.json: not UTF-8 text (byte 13: invalid "
                                    "continuation byte); expected a JSON file"),
    ("config show {d}/nested.json", "nested.json: JSON nested too deeply to read"),
    ("disasm {d}/short.bin", "short.bin: an instruction stream is a whole number of 16-byte "
                             "instructions, got 17 bytes"),
    ("hw verilog -o {d}/no/such/folder/core.v", "{d}/no/such/folder/core.v: No such file or "
                                                "directory"),
]


@pytest.mark.parametrize("line, message", BAD, ids=[b[0].split(" {d}/")[0] + " "
                                                    + b[0].split("/")[1].split()[0]
                                                    for b in BAD])
def test_a_users_mistake_is_one_error_line_and_exit_2(files, line, message):
    r = _cli(*line.format(d=files).split())
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception,
                                                                             SystemExit)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1, r.output
    assert message.format(d=files) in errors[0], r.output
    if not line.startswith("config"):  # click's usage errors add "Usage:" and "Try" lines
        assert r.stderr.splitlines()[-1] == errors[0] and r.stdout == "", r.output


@pytest.mark.parametrize("how", ["--debug", "VTAKIT_DEBUG=1"])
@pytest.mark.parametrize("line, error", [
    ("compile {d}/garbage.onnx -o {d}/o.vtak",  # the command names the file itself
     "InvalidModelError: not a valid ONNX model: cannot parse protobuf"),
    ("sim {d}/empty.npz", "EOFError: No data left in file"),  # the group's handler
])
def test_debug_shows_the_traceback_before_the_line(files, how, line, error):
    args = line.format(d=files).split()
    r = _cli("--debug", *args) if how == "--debug" else _cli(*args, env={"VTAKIT_DEBUG": "1"})
    assert r.exit_code == 2
    assert r.stderr.startswith("Traceback (most recent call last):\n"), r.output
    assert error in r.stderr
    assert r.stderr.splitlines()[-1].startswith("Error: ")


def test_debug_in_a_real_process(files):
    """What a user sees: one line without --debug, the traceback and that line with it."""
    env = {**os.environ, "VTAKIT_DEBUG": "0"}
    args = [sys.executable, "-m", "vtakit", "compile", str(files / "garbage.onnx"), "-o",
            str(files / "o.vtak")]
    plain = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == 2, plain.stderr
    assert plain.stderr.startswith("Error: ") and plain.stderr.count("\n") == 1
    debug = subprocess.run([*args[:3], "--debug", *args[3:]], capture_output=True, text=True,
                           env=env, timeout=120)
    assert debug.returncode == 2
    assert "Traceback (most recent call last)" in debug.stderr
    assert "InvalidModelError: not a valid ONNX model" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.strip()


def test_a_bug_keeps_its_traceback(monkeypatch, files):
    """Only bad input is turned into a line: an internal error is not hidden."""
    import vtakit.compiler.compile

    def broken(*args, **kwargs):
        raise AssertionError("internal invariant")

    monkeypatch.setattr(vtakit.compiler.compile, "compile_model", broken)
    r = _cli("compile", files / "mlp.onnx", "-o", files / "o.vtak")
    assert isinstance(r.exception, AssertionError) and r.exit_code == 1


def test_device_option_names_the_forms_it_takes(tmp_path):
    from click.testing import CliRunner

    from vtakit.cli import main

    r = CliRunner().invoke(main, ["compare", __file__, "--device", "board"])
    assert r.exit_code == 2
    assert "'board'; expected 'sim', 'rtl', 'fpga:PORT[@BAUD]' or 'pynq[:BITFILE]'" in r.output
