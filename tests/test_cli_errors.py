"""The command line never answers a user's mistake with a traceback: one line "Error: ...",
exit status 2 (1 for a device that failed); `--debug` or VTAKIT_DEBUG=1 shows the traceback
too. A bug keeps its traceback."""

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


# A device that failed, a package that is missing, a number too large, a file error that names
# no file, a report that must stay strict JSON.

@pytest.fixture(scope="module")
def vta(files):
    """The digits CNN compiled for the accelerator, its shipped calibration file as it is."""
    from vtakit import digits

    art = files / "digits.vtak"
    r = _cli("compile", digits.model_path(), "--target", "vta", "--quantize", "--calib",
             digits.DATA_DIR / "digits_calib.npz", "-o", art)
    assert r.exit_code == 0, r.output
    np.save(files / "digit.npy", digits.calibration_set()[:1])
    return art


def _one_error_line(r, exit_code: int, message: str) -> None:
    assert r.exit_code == exit_code, r.output
    assert "Traceback" not in r.output, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.stderr == f"Error: {message}\n", r.output


def test_the_pynq_device_without_pynq_says_what_to_install(monkeypatch, files, vta):
    monkeypatch.setitem(sys.modules, "pynq", None)  # `import pynq` fails, installed or not
    r = _cli("run", vta, "--input", files / "digit.npy", "--device", "pynq")
    _one_error_line(r, 2, "the pynq device runs on a Zynq board's Linux and needs the pynq "
                          "package there (pip install pynq, or a PYNQ image)")


def _protocol_errors():
    from vtakit.vta_hw import bridge_protocol as bp

    def make(cls):
        msg = f"board on /dev/ttyUSB1: {cls.__name__} in the answer to READ_MEM (seq 7)"
        return (cls(msg, 3) if cls is bp.StatusError else cls(msg)), msg

    classes = [bp.ProtocolError, bp.FrameError, bp.SyncError, bp.LengthError, bp.CrcError,
               bp.TruncatedError, bp.CommandError, bp.StatusError, bp.SequenceError,
               bp.NoResponse]
    return [pytest.param(cls, make, id=cls.__name__) for cls in classes]


@pytest.mark.parametrize("cls, make", _protocol_errors())
def test_every_bridge_protocol_error_is_one_line_and_exit_1(monkeypatch, files, cls, make):
    """A board that broke the protocol is a failed device (exit 1, as the simulator's device
    errors), whatever the subclass (NoResponse is also a TimeoutError, an OSError)."""
    from vtakit.runtime.executor import GraphExecutor

    err, msg = make(cls)

    def run(self):
        raise err

    monkeypatch.setattr(GraphExecutor, "run", run)
    r = _cli("run", files / "mlp.vtak", "--input", files / "x.npy")
    _one_error_line(r, 1, msg)


def test_a_protocol_error_shows_its_traceback_when_debugging(monkeypatch, files):
    from vtakit.runtime.executor import GraphExecutor
    from vtakit.vta_hw.bridge_protocol import CrcError

    def run(self):
        raise CrcError("board on /dev/ttyUSB1: response CRC 0x1234, computed 0x4321")

    monkeypatch.setattr(GraphExecutor, "run", run)
    r = _cli("--debug", "run", files / "mlp.vtak", "--input", files / "x.npy")
    assert r.exit_code == 1
    assert r.stderr.startswith("Traceback (most recent call last):\n"), r.output
    assert "CrcError: board on /dev/ttyUSB1" in r.stderr
    assert r.stderr.splitlines()[-1] == ("Error: board on /dev/ttyUSB1: response CRC 0x1234, "
                                         "computed 0x4321")


def test_pynq_missing_in_a_real_process(files, vta):
    """What a user without pynq sees: one line on stderr, exit 2."""
    import importlib.util

    if importlib.util.find_spec("pynq") is not None:
        pytest.skip("pynq is installed here")
    env = {**os.environ, "VTAKIT_DEBUG": "0"}
    p = subprocess.run([sys.executable, "-m", "vtakit", "run", str(vta), "--input",
                        str(files / "digit.npy"), "--device", "pynq"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("Error: the pynq device") and p.stderr.count("\n") == 1
    assert "pip install pynq" in p.stderr and p.stdout == ""


def test_a_device_error_is_one_line_and_exit_1(monkeypatch, files):
    from vtakit.driver.errors import DeadlockError
    from vtakit.runtime.executor import GraphExecutor

    def run(self):
        raise DeadlockError("sim device: instruction #4 (GEMM) waits for a token nobody pushes")

    monkeypatch.setattr(GraphExecutor, "run", run)
    r = _cli("run", files / "mlp.vtak", "--input", files / "x.npy")
    _one_error_line(r, 1, "sim device: instruction #4 (GEMM) waits for a token nobody pushes")


def test_a_board_that_does_not_answer_is_one_line_and_exit_1(files, vta):
    """pyserial's loop:// echoes the request: no response frame ever comes (NoResponse)."""
    pytest.importorskip("serial", reason="pip install 'vtakit[fpga]'")
    r = _cli("run", vta, "--input", files / "digit.npy", "--device", "fpga:loop://")
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "loop://" in lines[0], r.output


@pytest.fixture(scope="module")
def tuning_log(files):
    """A real tuning log of the digits CNN (one candidate per layer)."""
    from vtakit import digits

    log = files / "digits.jsonl"
    r = _cli("tune", digits.model_path(), "--calib", digits.DATA_DIR / "digits_calib.npz",
             "--log", log, "--top-k", 1)
    assert r.exit_code == 0, r.output
    return log


@pytest.mark.parametrize("field", ["predicted_cycles", "searched"])
@pytest.mark.parametrize("command", ["compile", "tune"])
def test_an_overflow_in_a_tuning_log_is_one_line_naming_file_and_line(files, tuning_log,
                                                                      command, field):
    """1e999 reads as inf, which int() refuses with an OverflowError: one line naming the log
    and the line (the log's reader names the field)."""
    import re

    from vtakit import digits

    log = files / f"inf-{field}.jsonl"
    first, *rest = tuning_log.read_text().splitlines(keepends=True)
    log.write_text(re.sub(rf'"{field}":\d+', f'"{field}":1e999', first, count=1) + "".join(rest))
    calib = digits.DATA_DIR / "digits_calib.npz"
    args = (["compile", digits.model_path(), "--target", "vta", "--quantize", "--calib", calib,
             "--tuning-log", log, "-o", files / "o.vtak"] if command == "compile" else
            ["tune", digits.model_path(), "--calib", calib, "--log", log])
    r = _cli(*args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "OverflowError" not in r.output, r.output
    assert r.stderr.startswith(f"Error: tuning log {log}, line 1: "), r.output
    assert field in r.stderr and r.stderr.count("\n") == 1, r.output


def test_an_overflow_error_is_one_line(monkeypatch, files):
    import vtakit.compiler.compile

    def broken(*args, **kwargs):
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(vtakit.compiler.compile, "compile_model", broken)
    r = _cli("compile", files / "mlp.onnx", "-o", files / "o.vtak")
    _one_error_line(r, 2, "a number too large (Python int too large to convert to C long)")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("line", ["compile {d}/mlp.onnx -o /dev/full",
                                  "hw verilog --config ice40 -o /dev/full"])
def test_a_write_that_fails_names_its_file(files, line):
    """A full disk's write raises an OSError without a filename: the line still names it."""
    r = _cli(*line.format(d=files).split())
    _one_error_line(r, 2, "/dev/full: No space left on device")


def test_an_os_error_without_a_file_names_the_commands_files(monkeypatch, files):
    import errno

    import vtakit.compiler.compile

    def broken(*args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(vtakit.compiler.compile, "compile_model", broken)
    r = _cli("compile", files / "mlp.onnx", "-o", files / "o.vtak")
    _one_error_line(r, 2, f"one of {files / 'mlp.onnx'}, {files / 'o.vtak'}: "
                          f"{os.strerror(errno.EIO)}")


def test_a_bad_config_file_is_named_by_compile(files):
    (files / "big.json").write_text('{"log_batch": 100000000000000000000000000}')
    r = _cli("compile", files / "mlp.onnx", "--target", "vta", "--config", files / "big.json",
             "-o", files / "o.vtak")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"Error: Invalid value for '--config': {files / 'big.json'}: HwConfig.log_batch=" \
           in r.stderr, r.output


@pytest.mark.parametrize("err", [
    ModuleNotFoundError("No module named 'vtakit.nonexistent'", name="vtakit.nonexistent"),
    ImportError("cannot import name 'gone' from 'vtakit.compiler'", name="vtakit.compiler"),
    ImportError("a bug that happens to raise ImportError"),
], ids=["module-not-found", "cannot-import-name", "plain"])
def test_an_import_error_that_is_not_a_missing_package_keeps_its_traceback(monkeypatch, files,
                                                                           err):
    import vtakit.compiler.compile

    def broken(*args, **kwargs):
        raise err

    monkeypatch.setattr(vtakit.compiler.compile, "compile_model", broken)
    r = _cli("compile", files / "mlp.onnx", "-o", files / "o.vtak")
    assert r.exception is err and r.exit_code == 1


def test_report_json_is_strict_json_with_null_for_nan_and_inf(monkeypatch, tmp_path):
    """A difference that is NaN or infinite (outputs that overflowed) is null in report.json,
    never a NaN / Infinity literal (docs/compare.md)."""
    import json

    import vtakit.compare
    from vtakit import digits

    diffs = iter([float("nan"), float("inf"), float("-inf")])
    monkeypatch.setattr(vtakit.compare, "_max_diff", lambda a, b: next(diffs))
    r = _cli("compare", digits.model_path(), "--samples", 1, "--out", tmp_path)
    assert r.exit_code == 0, r.output

    def refuse(name):
        raise AssertionError(f"report.json holds the non-JSON literal {name}")

    report = json.loads((tmp_path / "report.json").read_text(), parse_constant=refuse)
    int8, vta = report["backends"][1], report["backends"][2]
    assert int8["max_abs_diff_vs_fp32"] is None
    assert vta["max_abs_diff_vs_fp32"] is None and vta["max_abs_diff_vs_int8"] is None
    assert report["backends"][0]["max_abs_diff_vs_fp32"] == 0.0  # finite numbers stay


# Every command given bad input: one line, no traceback, never an exception escaping.
WALK = [
    ("compile {d}/garbage.onnx -o {d}/o.vtak", 2),
    ("compile {d}/mlp.onnx -o {d}/no/such/dir/o.vtak", 2),
    ("compile {d}/mlp.onnx --quantize --calib {d}/empty.npz -o {d}/o.vtak", 2),
    ("compile {d}/mlp.onnx --quantize --calib {d}/nan.npz -o {d}/o.vtak", 2),
    ("compile {d}/mlp.onnx --quantize --calib {d}/zero.npz -o {d}/o.vtak", 2),
    ("compile {d}/mlp.onnx --target vta --quantize --calib {d}/x.npy --tuning-log "
     "{d}/garbage.onnx -o {d}/o.vtak", 2),
    ("quantize {d}/mlp.onnx --calib {d}/nan.npz -o {d}/q.onnx", 2),
    ("quantize {d}/mlp.onnx --calib {d}/short.bin -o {d}/q.onnx", 2),
    ("tune {d}/mlp.onnx --calib {d}/zero.npz --log {d}/t.jsonl", 2),
    ("tune {d}/mlp.onnx --calib {d}/x.npy --log {d}/latin1.json", 2),
    ("run {d}/mlp.vtak --input {d}/empty.npz", 2),
    ("run {d}/digits.vtak --input {d}/digit.npy --device pynq", 2),
    ("run {d}/digits.vtak --input {d}/digit.npy --device fpga:{d}/no-such-port", 2),
    ("run {d}/garbage.onnx --input {d}/x.npy", 2),
    ("compare {d}/mlp.onnx --data {d}/noarrays.npz --out {d}/cmp", 2),
    ("compare {d}/mlp.onnx --calib {d}/nan.npz --samples 1 --out {d}/cmp", 2),
    ("sim {d}/noarrays.npz", 2),
    ("disasm {d}/short.bin", 2),
    ("config show {d}/nested.json", 2),
    ("hw verilog --config {d}/latin1.json -o {d}/v.v", 2),
]


@pytest.mark.parametrize("line, status", WALK, ids=[w[0] for w in WALK])
def test_no_command_answers_bad_input_with_a_traceback(monkeypatch, files, vta, line, status):
    monkeypatch.setitem(sys.modules, "pynq", None)
    x = np.ones((1, 784), np.float32)
    np.savez(files / "nan.npz", input=np.where(np.arange(784) == 5, np.nan, x))
    np.savez(files / "zero.npz", input=np.zeros_like(x))
    r = _cli(*line.format(d=files).split())
    assert r.exit_code == status, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output and "Error" in r.stderr, r.output
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error: ")]
    assert len(errors) == 1, r.output
