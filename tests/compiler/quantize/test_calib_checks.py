"""Calibration data that no int8 scale can be taken from is refused, naming the file, the input
and the sample; a model that overflows on its data is refused, naming the node and the sample;
a tensor that is 0 on every sample is quantised with a warning in the report, never a silent
default scale. Fuzzed with fixed seeds over graphs of one to three inputs, the forms the data
comes in and where the bad values sit."""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from vtakit import digits
from vtakit.cli import main
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.quantize import (
    QuantizationWarning,
    QuantOptions,
    load_calibration,
    quantize_graph,
)
from vtakit.compiler.quantize.calibrate import INPUT_MAGNITUDE_MAX, INPUT_RANGE_MIN

SHAPE = [1, 2, 4, 4]
SEEDS = range(24)


def _model(n_inputs: int, *, dead: bool = False, w_scale: float = 0.5, seed: int = 0,
           ) -> onnx.ModelProto:
    """in_0 + in_1 + ... (residual adds of activations), Relu, a 1x1 Conv, Flatten, Gemm.
    `dead`: the Conv's bias is so negative that the Relu after it (conv_relu) is 0 on any input
    in [-1, 1].
    `w_scale`: the Conv's weights (3e38: it overflows float32)."""
    rng = np.random.default_rng(seed)
    names = [f"in_{k}" for k in range(n_inputs)]
    nodes, x = [], names[0]
    for k, other in enumerate(names[1:]):
        nodes.append(helper.make_node("Add", [x, other], [f"sum_{k}"], name=f"sum_{k}"))
        x = f"sum_{k}"
    w = (rng.uniform(0.5, 1.0, (4, 2, 1, 1)) * w_scale).astype(np.float32)
    b = np.full(4, -1000.0 if dead else 0.1, np.float32)
    wd = rng.standard_normal((3, 64)).astype(np.float32)
    bd = np.array([0.5, -0.25, 1.0], np.float32)  # y is not 0 where conv_relu is
    nodes += [helper.make_node("Relu", [x], ["act"], name="act"),
              helper.make_node("Conv", ["act", "w", "b"], ["conv"], name="conv"),
              helper.make_node("Relu", ["conv"], ["conv_relu"], name="conv_relu"),
              helper.make_node("Flatten", ["conv_relu"], ["flat"], name="flat"),
              helper.make_node("Gemm", ["flat", "wd", "bd"], ["y"], name="dense", transB=1)]
    g = helper.make_graph(
        nodes, "calib_checks",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(wd, "wd"), numpy_helper.from_array(bd, "bd")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _good(rng: np.random.Generator, names: list[str], n: int) -> dict[str, np.ndarray]:
    return {k: rng.uniform(-1, 1, (n, *SHAPE[1:])).astype(np.float32) for k in names}


def _save(data: dict[str, np.ndarray], form: str, tmp_path, seed: int):
    """The data in one of the forms calibration takes, and the name its errors give it."""
    if form == "npz":
        path = tmp_path / f"calib_{seed}.npz"
        np.savez(path, **data)
        return path, f"calibration file {path}"
    if form == "dir":
        (x,) = data.values()
        folder = tmp_path / f"calib_{seed}"
        folder.mkdir()
        for i, sample in enumerate(x):
            np.save(folder / f"{i:03d}.npy", sample)
        return folder, f"calibration directory {folder}"
    names = list(data)
    n = len(data[names[0]])
    return [{k: data[k][i] for k in names} for i in range(n)], "calibration data"


def _case(seed: int, tmp_path):
    rng = np.random.default_rng(seed)
    n_inputs = int(rng.integers(1, 4))
    names = [f"in_{k}" for k in range(n_inputs)]
    n = int(rng.integers(1, 9))
    forms = ["npz", "memory"] + (["dir"] if n_inputs == 1 else [])
    form = forms[int(rng.integers(len(forms)))]
    return rng, names, n, form, import_onnx(_model(n_inputs))


def _sample_file(form: str, path, where: str, i: int) -> str:
    """What names the file of sample i: a directory's errors name the sample's own file."""
    return f"calibration file {path / f'{i:03d}.npy'}" if form == "dir" else where


@pytest.mark.parametrize("seed", SEEDS)
def test_nan_or_inf_names_the_file_the_input_and_the_sample(seed, tmp_path) -> None:
    rng, names, n, form, g = _case(seed, tmp_path)
    data = _good(rng, names, n)
    bad_input, sample = names[int(rng.integers(len(names)))], int(rng.integers(n))
    kind = ["NaN", "+inf", "-inf"][seed % 3]
    value = {"NaN": np.nan, "+inf": np.inf, "-inf": -np.inf}[kind]
    at = [int(rng.integers(d)) for d in SHAPE[1:]]
    data[bad_input][(sample, *at)] = value
    if seed % 4 == 0 and sample + 1 < n:  # more bad values later: the first one is named
        data[bad_input][sample + 1] = value
    calib, where = _save(data, form, tmp_path, seed)
    msg = (f"{_sample_file(form, calib, where, sample)}, sample {sample}: input "
           f"'{bad_input}' holds {kind} at index {at}")
    with pytest.raises(ValueError, match=re.escape(msg)):
        quantize_graph(g, calib)


@pytest.mark.parametrize("seed", SEEDS)
def test_values_beyond_float_range_name_the_sample(seed, tmp_path) -> None:
    rng, names, n, form, g = _case(seed, tmp_path)
    data = _good(rng, names, n)
    bad_input, sample = names[int(rng.integers(len(names)))], int(rng.integers(n))
    big = [1e30, -3e20, 2.0 ** 64, 1e300][seed % 4]  # 1e300: float64 data beyond float32
    if big > float(np.finfo(np.float32).max):
        data[bad_input] = data[bad_input].astype(np.float64)
    at = [int(rng.integers(d)) for d in SHAPE[1:]]
    data[bad_input][(sample, *at)] = big
    calib, where = _save(data, form, tmp_path, seed)
    msg = (f"{_sample_file(form, calib, where, sample)}, sample {sample}: input "
           f"'{bad_input}' holds {float(np.float64(big)):.6g} at index {at}, beyond what a "
           f"model's float32 input can take")
    with pytest.raises(ValueError, match=re.escape(msg)):
        quantize_graph(g, calib)


@pytest.mark.parametrize("seed", SEEDS)
def test_an_input_with_no_range_names_the_file_the_input_and_the_samples(seed, tmp_path):
    rng, names, n, form, g = _case(seed, tmp_path)
    data = _good(rng, names, n)
    bad_input = names[int(rng.integers(len(names)))]
    samples = "its only sample (0)" if n == 1 else f"all {n} samples (0 to {n - 1})"
    if seed % 2:
        data[bad_input][:] = 0.0
        msg = f"{{where}}: input '{bad_input}' is 0 in {samples}: there is no range"
    else:  # denormal (float32) or just below 2**-63; the largest magnitude's sample is named
        tiny = [1e-40, 1e-44, INPUT_RANGE_MIN / 2][seed // 2 % 3]
        data[bad_input] = (rng.uniform(-1, 1, data[bad_input].shape) * tiny / 2).astype(
            np.float32)
        sample = int(rng.integers(n))
        at = [int(rng.integers(d)) for d in SHAPE[1:]]
        data[bad_input][(sample, *at)] = np.float32(tiny)
        largest = float(np.float32(tiny))
        denormal = " (denormal in float32)" if largest < np.finfo(np.float32).tiny else ""
        msg = (f"{{where}}: input '{bad_input}': its largest magnitude over {samples} is "
               f"{largest:.3g}{denormal}, at {{sample}}, index {at}; below 2**-63")
    calib, where = _save(data, form, tmp_path, seed)
    if seed % 2 == 0:
        own = _sample_file(form, calib, where, sample)
        msg = msg.replace("{sample}", f"{own + ', ' if own != where else ''}sample {sample}")
    with pytest.raises(ValueError, match=re.escape(msg.replace("{where}", where))):
        quantize_graph(g, calib)


def test_good_data_passes_and_is_kept_as_given(tmp_path) -> None:
    for seed in SEEDS:
        rng, names, n, form, g = _case(seed, tmp_path)
        data = _good(rng, names, n)
        calib, _ = _save(data, form, tmp_path, seed)
        got = load_calibration(calib, g)
        assert len(got) == n and len(got.origins) == n
        for i, feed in enumerate(got):
            for k in names:
                np.testing.assert_array_equal(feed[k][0], data[k][i])
    # the limits themselves pass: magnitudes just below 2**64, a range of exactly 2**-63
    g = import_onnx(_model(1))
    x = np.full((1, *SHAPE[1:]), INPUT_RANGE_MIN, np.float32)
    assert len(load_calibration([x], g)) == 1
    x[0, 0, 0, 0] = np.nextafter(np.float32(INPUT_MAGNITUDE_MAX), np.float32(0))
    assert len(load_calibration([x], g)) == 1


def test_a_model_that_overflows_names_the_node_and_the_sample(tmp_path) -> None:
    g = import_onnx(_model(2, w_scale=3e38))  # conv = 3e38 * (in_0 + in_1): inf from 2 on
    rng = np.random.default_rng(5)
    data = {k: rng.uniform(1e-9, 2e-9, (6, *SHAPE[1:])).astype(np.float32)
            for k in ("in_0", "in_1")}
    data["in_1"][3:] = 2.0  # samples 0-2 stay finite: sample 3 is the first that overflows
    path = tmp_path / "c.npz"
    np.savez(path, **data)
    with pytest.raises(ValueError, match=re.escape(
            f"calibration file {path}, sample 3: node 'conv' (CONV) computes +inf at index")
            + r".*: the float model overflows on this calibration sample"):
        quantize_graph(g, path)


def test_a_tensor_whose_range_underflows_is_refused() -> None:
    """An intermediate range above 0 whose scale (range / 127) is not a normal float32."""
    nodes = [helper.make_node("Mul", ["in_0", "k"], ["tiny"], name="tiny"),
             helper.make_node("Relu", ["tiny"], ["y"], name="relu")]
    model = helper.make_model(helper.make_graph(
        nodes, "underflow", [helper.make_tensor_value_info("in_0", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        [numpy_helper.from_array(np.array(1e-40, np.float32), "k")]),
        opset_imports=[helper.make_opsetid("", 13)])
    x = np.random.default_rng(0).uniform(0.5, 1, (2, *SHAPE[1:])).astype(np.float32)
    with pytest.raises(ValueError, match=r"calibration data: node '(tiny|relu)' \(\w+\): its "
                                         r"observed range over 2 sample\(s\) is \S+e-4\d, so "
                                         r"small that its int8 scale"):
        quantize_graph(import_onnx(model), [x])


def test_a_dead_activation_is_a_warning_in_the_report() -> None:
    g = import_onnx(_model(1, dead=True))
    x = np.random.default_rng(1).uniform(-1, 1, (4, *SHAPE[1:])).astype(np.float32)
    with pytest.warns(QuantizationWarning, match=r"'conv_relu' \(RELU\) is 0 on every "
                                                 r"calibration sample \(a dead activation\?\): "
                                                 r"its int8 scale is arbitrary \(1/127\)"):
        _, report = quantize_graph(g, [x])
    assert len(report.warnings) == 1 and "'conv_relu' (RELU)" in report.warnings[0]
    assert report.table().splitlines()[-1] == f"warning: {report.warnings[0]}"


def test_the_digits_model_quantises_without_a_warning() -> None:
    g = import_onnx(digits.load_model())
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantizationWarning)
        _, report = quantize_graph(g, digits.calibration_set(), QuantOptions(report_samples=1))
    assert report.warnings == [] and "warning" not in report.table()


# The command line: the shipped calibration file works as it is; bad data is one line.

MODEL = digits.model_path()
CALIB = digits.DATA_DIR / "digits_calib.npz"


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("command", ["compile", "quantize", "tune"])
def test_the_shipped_calibration_file_works_from_the_command_line(command, tmp_path) -> None:
    out = {"compile": ["-o", tmp_path / "m.vtak", "--quantize"],
           "quantize": ["-o", tmp_path / "m.int8.onnx"],
           "tune": ["--log", tmp_path / "t.jsonl", "--top-k", "1"]}[command]
    r = _cli(command, MODEL, "--calib", CALIB, *out)
    assert r.exit_code == 0, r.output
    assert "Error" not in r.output and "arning" not in r.output, r.output
    if command != "tune":
        assert "top-1 agreement 100.0%" in r.stdout, r.output


@pytest.fixture(scope="module")
def bad_calib(tmp_path_factory):
    d = tmp_path_factory.mktemp("badcalib")
    x = digits.calibration_set().copy()
    cases = {}
    for name, data, message in [
            ("nan", np.where(np.arange(x.size).reshape(x.shape) == 200, np.nan, x),
             "sample 3: input 'input' holds NaN at index [0, 1, 0]"),
            ("allnan", np.full_like(x, np.nan), "sample 0: input 'input' holds NaN at index "
                                                "[0, 0, 0] (and 63 more non-finite values)"),
            ("zero", np.zeros_like(x), "input 'input' is 0 in all 64 samples (0 to 63)"),
            ("big", x * 1e30, "sample 0: input 'input' holds 2.5e+29 at index [0, 0, 2]"),
            ("tiny", (x * 1e-40).astype(np.float32), "input 'input': its largest magnitude "
                                                     "over all 64 samples (0 to 63) is 1e-40 "
                                                     "(denormal in float32), at sample 0")]:
        path = d / f"{name}.npz"
        np.savez(path, input=data)
        sep = ", " if message.startswith("sample") else ": "
        cases[name] = (path, f"calibration file {path}{sep}{message}")
    return cases


@pytest.mark.parametrize("command", ["compile", "quantize", "tune"])
@pytest.mark.parametrize("case", ["nan", "allnan", "zero", "big", "tiny"])
def test_bad_calibration_data_is_one_error_line_and_exit_2(command, case, bad_calib,
                                                           tmp_path) -> None:
    path, message = bad_calib[case]
    out = {"compile": ["-o", tmp_path / "m.vtak", "--quantize"],
           "quantize": ["-o", tmp_path / "m.int8.onnx"],
           "tune": ["--log", tmp_path / "t.jsonl"]}[command]
    r = _cli(command, MODEL, "--calib", path, *out)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stdout == "", r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"Error: {message}"), r.output


def test_the_command_line_prints_a_dead_activation_warning(tmp_path) -> None:
    onnx.save(_model(1, dead=True), tmp_path / "dead.onnx")
    x = np.random.default_rng(1).uniform(-1, 1, (4, *SHAPE[1:])).astype(np.float32)
    np.savez(tmp_path / "c.npz", in_0=x)
    r = _cli("compile", tmp_path / "dead.onnx", "--quantize", "--calib", tmp_path / "c.npz",
             "-o", tmp_path / "m.vtak")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "is 0 on every calibration sample" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: 'conv_relu' (RELU)"), r.output
    r = _cli("tune", tmp_path / "dead.onnx", "--calib", tmp_path / "c.npz", "--log",
             tmp_path / "t.jsonl", "--top-k", "1")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if "is 0 on every calibration sample" in ln]
    assert len(lines) == 1 and lines[0].startswith("Warning: 'conv_relu' (RELU)"), r.output
