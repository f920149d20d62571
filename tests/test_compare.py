"""`vtakit.compare` (fp32 CPU vs int8 CPU vs the accelerator), `vtakit compare`, `vtakit demo`
and `vtakit run --device`, on the shipped digits CNN."""

import dataclasses
import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from vtakit import digits
from vtakit.cli import main
from vtakit.compare import CompareReport, compare, load_data

SAMPLES = 6
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("compare")


@pytest.fixture(scope="module")
def report(out_dir) -> CompareReport:
    return compare(digits.model_path(), samples=SAMPLES, out_dir=out_dir)


def _x_y(n: int = SAMPLES):
    x, y = digits.test_split()
    return x[:n], y[:n]


def _reference_int8_outputs(n: int) -> np.ndarray:
    """The CPU int8 plan's outputs, run here without compare."""
    from vtakit.compiler.compile import lower_model
    from vtakit.runtime.executor import GraphExecutor

    plan = lower_model(digits.load_model(), target="cpu", quantize=True,
                       calib=digits.calibration_set())
    ex = GraphExecutor(plan)
    ys = []
    for x in _x_y(n)[0]:
        ex.set_input(0, x[None])
        ex.run()
        ys.append(ex.get_output(0))
    ex.close()
    return np.concatenate(ys)


class TestDigits:
    def test_accelerator_equals_cpu_int8_bit_for_bit(self, report):
        a = report.accelerator
        assert report.ok and a.bit_identical and a.mismatched_samples == 0
        assert report.backend("vta").max_abs_diff_vs_int8 == 0
        assert report.backend("vta").max_abs_diff_vs_fp32 == \
            report.backend("cpu-int8").max_abs_diff_vs_fp32 > 0
        assert f"bit-identical on all {SAMPLES} samples" in report.table()

    def test_accuracy_fields(self, report):
        assert report.samples == SAMPLES and report.labelled
        assert report.data == "the digits test split"
        assert report.calib == "the digits calibration set"
        assert [b.name for b in report.backends] == ["cpu-fp32", "cpu-int8", "vta"]
        fp32, int8, vta = report.backends
        assert fp32.top1_vs_fp32 == 1 and fp32.max_abs_diff_vs_fp32 == 0
        assert fp32.max_abs_diff_vs_int8 is None
        for b in report.backends:  # a fraction of SAMPLES labels
            assert b.accuracy is not None and round(b.accuracy * SAMPLES, 9) % 1 == 0
        assert vta.accuracy == int8.accuracy and vta.top1_vs_fp32 == int8.top1_vs_fp32
        assert fp32.latency_ms > 0 and int8.latency_ms > 0 and vta.latency_ms is None

    def test_accuracy_is_that_of_the_outputs(self, report):
        y_int8 = _reference_int8_outputs(SAMPLES)
        labels = _x_y()[1]
        assert report.backend("cpu-int8").accuracy == np.mean(y_int8.argmax(1) == labels)

    def test_accelerator_figures(self, report):
        a = report.accelerator
        assert (a.device, a.config, a.config_hash, a.clock_mhz) == \
            ("sim", "default", "eb4589e8", 100)
        assert a.macs_per_cycle == 256 and a.regions == 1 and a.cpu_fallback == {}
        off = report.offload  # everything offloaded (tests/test_compare_offload.py: the rest)
        assert off.mac_share == 1 and off.accelerator_macs == off.macs == a.model_macs
        assert off.fallback == [] and off.no_pattern == []
        assert a.cycles > 0 and a.cycles_min == a.cycles == a.cycles_max
        assert a.time_us == pytest.approx(a.cycles / 100)
        # 3×3 convolutions 1→16, 16→32, 32→16 on 8×8, 4×4; dense 256→64, 64→10
        assert a.model_macs == 9 * 64 * (16 + 16 * 32) + 9 * 16 * 32 * 16 + 256 * 64 + 640
        assert a.gemm_macs is not None and a.gemm_macs >= a.model_macs
        assert a.mac_utilisation == pytest.approx(a.gemm_macs / (a.cycles * 256))
        assert a.useful_utilisation == pytest.approx(a.model_macs / (a.cycles * 256))
        assert {"INSN", "INP", "WGT", "UOP"} <= set(a.dram_read_bytes)
        assert a.dram_write_bytes is not None and a.dram_write_bytes > 0

    def test_layers(self, report):
        by = {r.name: r for r in report.layers}
        vta = [r for r in report.layers if r.backend == "vta"]
        assert [r.name for r in vta] == ["conv3x3_0", "conv3x3_2", "maxpool2x2_4", "conv3x3_5",
                                         "dense_8", "logits"]
        assert sum(r.macs for r in vta) == report.accelerator.model_macs
        assert all(r.cycles and r.time_us == pytest.approx(r.cycles / 100) for r in vta)
        assert by["conv3x3_2"].useful_utilisation == \
            pytest.approx(by["conv3x3_2"].macs / (by["conv3x3_2"].cycles * 256))
        assert by["maxpool2x2_4"].mac_utilisation is None  # no MACs: nothing to utilise
        cpu = [r for r in report.layers if r.backend == "cpu"]
        assert [r.op for r in cpu] == ["quantize_linear", "dequantize_linear"]
        assert all(r.cycles is None and r.time_us > 0 for r in cpu)
        assert all(r.cpu_int8_us is not None for r in report.layers)

    def test_files(self, report, out_dir):
        assert set(report.files) == {"report", "plot", "trace"}
        saved = json.loads((out_dir / "report.json").read_text())
        assert saved == json.loads(report.to_json())
        assert saved["format"] == "vtakit.compare"
        assert saved["accelerator"]["bit_identical"] is True
        assert (out_dir / "layers.png").read_bytes()[:8] == PNG_MAGIC
        trace = json.loads((out_dir / "trace.json").read_text())
        assert any(e.get("ph") == "X" for e in trace["traceEvents"])


def test_random_inputs_for_another_model():
    model = digits.load_model()
    model.producer_name = "someone"  # not recognised as the digits model: random data
    r = compare(model, samples=3, seed=5)
    assert r.samples == 3 and not r.labelled and r.files == {}
    assert r.data == "random standard-normal inputs, seed 5"
    assert r.calib == "16 random inputs, seed 6"
    assert all(b.accuracy is None for b in r.backends)
    assert r.ok and r.backend("vta").top1_vs_fp32 is not None


class TestBadInput:
    def test_missing_files(self, tmp_path):
        with pytest.raises(FileNotFoundError, match=r"model file .*nope.onnx not found; "
                                                    r"expected an ONNX model"):
            compare(tmp_path / "nope.onnx")
        with pytest.raises(FileNotFoundError, match=r"data file .*nope.npz not found; expected "
                                                    r"a .npz file with an array 'x'"):
            compare(digits.model_path(), data=tmp_path / "nope.npz")

    def test_wrong_arrays(self, tmp_path):
        np.savez(tmp_path / "d.npz", inputs=np.zeros((2, 1, 8, 8), np.float32))
        with pytest.raises(ValueError, match=r"d.npz has arrays \['inputs'\]; expected a .npz "
                                             r"file with an array 'x' \(inputs, N samples\)"):
            compare(digits.model_path(), data=tmp_path / "d.npz")
        np.save(tmp_path / "x.npy", np.zeros((2, 1, 8, 8), np.float32))
        with pytest.raises(ValueError, match=r"holds one array of shape \(2, 1, 8, 8\), not "
                                             r"named arrays"):
            load_data(tmp_path / "x.npy")

    @pytest.mark.parametrize("x, y, err, message", [
        (np.zeros((5, 8, 8)), None, ValueError,
         r"x has shape \(5, 8, 8\); the model's input 'input' takes \(1, 1, 8, 8\), so "
         r"expected \(N, 1, 8, 8\) with N >= 1"),
        (np.zeros((0, 1, 8, 8)), None, ValueError, r"x has shape \(0, 1, 8, 8\)"),
        (np.array([["a"] * 64]).reshape(1, 1, 8, 8), None, TypeError,
         r"x has dtype <U1; the model's input 'input' is float32"),
        (np.zeros((3, 1, 8, 8)), np.zeros(2, int), ValueError,
         r"y has shape \(2,\) for 3 samples of x; expected \(3,\)"),
        (np.zeros((3, 1, 8, 8)), np.zeros(3), TypeError,
         r"y has dtype float64; expected integer class labels"),
        (np.zeros((3, 1, 8, 8)), np.array([0, 4, 10]), ValueError,
         r"y holds labels 0..10; the model's first output scores 10 classes \(expected labels "
         r"0..9\)"),
    ])
    def test_data_that_does_not_fit(self, x, y, err, message):
        with pytest.raises(err, match=message):
            compare(digits.model_path(), data=(x, y))

    def test_arguments(self):
        with pytest.raises(ValueError, match=r"device='fpga'; expected 'sim', 'rtl', "
                                             r"'fpga:PORT\[@BAUD\]' or 'pynq\[:BITFILE\]'"):
            compare(digits.model_path(), device="fpga")
        with pytest.raises(ValueError, match=r"samples=0; expected an int >= 1"):
            compare(digits.model_path(), samples=0)
        with pytest.raises(TypeError, match=r"model must be a path or an onnx.ModelProto, got "
                                            r"int"):
            compare(3)  # type: ignore[arg-type]

    def test_cli_errors(self, tmp_path):
        r = cli("compare", digits.model_path(), "--data", tmp_path / "missing.npz")
        assert r.exit_code == 2 and "does not exist" in r.output
        np.savez(tmp_path / "d.npz", x=np.zeros((4, 64), np.float32))
        r = cli("compare", digits.model_path(), "--data", tmp_path / "d.npz", "--out", tmp_path)
        assert r.exit_code == 2  # bad input; 1 is a mismatch of the outputs
        assert "x has shape (4, 64); the model's input 'input' takes (1, 1, 8, 8)" in r.output
        r = cli("compare", digits.model_path(), "--config", "pynq")
        assert r.exit_code == 2 and "unknown hardware configuration 'pynq'" in r.output
        (tmp_path / "bad.onnx").write_bytes(b"garbage")
        r = cli("compare", tmp_path / "bad.onnx")
        assert r.exit_code == 2 and "not a valid ONNX model" in r.output


def test_cli_compare_with_data(tmp_path):
    x, y = _x_y(5)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    r = cli("compare", digits.model_path(), "--data", tmp_path / "d.npz", "--out",
            tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert f"5 samples ({tmp_path / 'd.npz'})" in r.output
    assert "bit-identical on all 5 samples" in r.output
    assert "conv3x3_2" in r.output and "MAC utilisation" in r.output
    assert "running" not in r.stdout  # progress goes to stderr
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["samples"] == 5 and saved["labelled"]
    assert (tmp_path / "out" / "layers.png").read_bytes()[:8] == PNG_MAGIC


def test_cli_flags_a_mismatch_loudly(monkeypatch, report, tmp_path):
    import vtakit.compare

    a = dataclasses.replace(report.accelerator, bit_identical=False, mismatched_samples=2)
    bad = dataclasses.replace(report, accelerator=a)
    monkeypatch.setattr(vtakit.compare, "compare", lambda *args, **kw: bad)
    r = cli("compare", digits.model_path(), "--out", tmp_path)
    assert r.exit_code == 1
    assert f"MISMATCH: int8-CPU vs accelerator differ on 2 of {SAMPLES} samples" in r.output


def test_cli_demo(tmp_path):
    r = cli("demo", "--samples", 4, "--out", tmp_path / "demo")
    assert r.exit_code == 0, r.output
    assert "accuracy on 4 images: fp32 " in r.output
    assert "bit-identical on all 4 samples" in r.output
    assert "cycles per image" in r.output and "MAC utilisation" in r.output
    for name in ("report.json", "layers.png", "trace.json"):
        assert str(tmp_path / "demo" / name) in r.output
        assert (tmp_path / "demo" / name).stat().st_size > 0


def test_run_device_sim(tmp_path):
    np.save(tmp_path / "x.npy", _x_y(1)[0])
    onnx.save(digits.load_model(), tmp_path / "d.onnx")
    np.savez(tmp_path / "calib.npz", digits.calibration_set())
    r = cli("compile", tmp_path / "d.onnx", "--target", "vta", "--quantize", "--calib",
            tmp_path / "calib.npz", "-o", tmp_path / "d.vtak")
    assert r.exit_code == 0, r.output
    r = cli("run", tmp_path / "d.vtak", "--input", tmp_path / "x.npy", "--device", "sim")
    assert r.exit_code == 0, r.output
    assert "logits: float32[1, 10]" in r.output and "vta (sim): " in r.output


def test_run_device_needs_an_accelerator_artifact(tmp_path):
    np.save(tmp_path / "x.npy", _x_y(1)[0])
    onnx.save(digits.load_model(), tmp_path / "d.onnx")
    r = cli("compile", tmp_path / "d.onnx", "-o", tmp_path / "cpu.vtak")
    assert r.exit_code == 0, r.output
    r = cli("run", tmp_path / "cpu.vtak", "--input", tmp_path / "x.npy", "--device", "sim")
    assert r.exit_code == 2
    assert "runs on ['cpu'] only; --device applies to an artifact compiled with --target vta" \
        in r.output


def test_tune_command_writes_a_log_that_compile_reuses(tmp_path):
    model, calib, log = tmp_path / "d.onnx", tmp_path / "c.npz", tmp_path / "t.jsonl"
    onnx.save(digits.load_model(), model)
    np.savez(calib, x=digits.calibration_set()[:8])
    r = CliRunner().invoke(main, ["tune", str(model), "--calib", str(calib), "--log", str(log),
                                  "--top-k", "2"])
    assert r.exit_code == 0, r.output
    assert "predicted" in r.output and "simulated" in r.output
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 6
    out = tmp_path / "m.vtak"
    r = CliRunner().invoke(main, ["compile", str(model), "--target", "vta", "--quantize",
                                  "--calib", str(calib), "--tuning-log", str(log), "-o",
                                  str(out)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["disasm", str(out)])
    assert r.exit_code == 0 and "; region 0:" in r.output and "LOAD.INP" in r.output
