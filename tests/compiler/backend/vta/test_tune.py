"""Schedule search with the simulator (issue 11, point 2): the tuning log, `compile` taking the
logged schedules, tuned never slower than the analytic pick, still bit-exact, and the analytic
model against the simulator's timing layer."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from vtakit import digits, models
from vtakit.compiler.backend.vta import VtaOptions, requant_programs, resolve_config
from vtakit.compiler.backend.vta import schedule as S
from vtakit.compiler.backend.vta.layers import find_layers
from vtakit.compiler.backend.vta.tune import (
    TuneRecord,
    TuningLog,
    layer_key,
    simulate,
    spearman,
    tune_model,
)
from vtakit.compiler.compile import lower_model
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.pipeline import optimize
from vtakit.compiler.quantize import QuantOptions, quantize_graph
from vtakit.runtime.executor import GraphExecutor

CFG = resolve_config("default")


@pytest.fixture(scope="module")
def calib():
    return digits.calibration_set()


@pytest.fixture(scope="module")
def layers(calib):
    """The digits CNN's accelerator layers with their requantisation programs."""
    g = optimize(quantize_graph(import_onnx(digits.load_model()), calib, QuantOptions())[0])
    found, why = find_layers(g, CFG)
    assert not why
    return [(L, requant_programs(L, CFG)) for L in found]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, calib):
    path = tmp_path_factory.mktemp("tune") / "digits.jsonl"
    seen = []
    report = tune_model(digits.load_model(), calib=calib, log=str(path), top_k=4,
                        progress=lambda i, n, r: seen.append((i, n, r.layer)))
    assert [s[:2] for s in seen] == [(i, 6) for i in range(1, 7)]
    return path, report


def _vta(calib, **options):
    return lower_model(digits.load_model(), target="vta", quantize=True, calib=calib,
                       options=options or None)


def _schedules(plan):
    return {lm["name"]: lm["schedule"]
            for r in plan.sections["vta"].meta["regions"] for lm in r["layers"]}


def test_log_round_trip(tuned, layers):
    path, report = tuned
    assert report.log == str(path)
    log = TuningLog.load(path)
    assert [r.to_json() for r in log.records] == [r.to_json() for r in report.records]
    assert [r.line for r in log.records] == list(range(1, 7))
    for (L, rqs), r in zip(layers, log.records, strict=True):
        assert r.layer == L.name and r.config_hash == CFG.hash
        assert log.get(layer_key(L, rqs), CFG.hash) is r
        assert log.schedule(L, rqs, CFG) == S.schedule_from_json(L, r.schedule)
        assert 1 <= len(r.candidates) <= 4 and r.searched >= len(r.candidates)
    assert log.get(layer_key(*layers[0]), "another-config") is None


def test_tuning_again_merges_into_the_log(tmp_path, tuned, calib):
    path = tmp_path / "merged.jsonl"
    other = TuneRecord({"kind": "conv2d", "inputs": [[1, 1, 2, 2]], "output": [1, 1, 2, 2],
                        "kernel": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0]}, "0badf00d",
                       "x", {"toh": 1, "tow": 1, "tob": 1, "tib": 1, "threads": 1}, 10, 12)
    first = TuningLog.load(tuned[0])
    TuningLog(str(path), [other] + first.records).save()
    tune_model(digits.load_model(), calib=calib, log=path, top_k=1)
    merged = TuningLog.load(path)
    assert len(merged.records) == 7  # the other configuration's record kept, none doubled
    assert merged.records[0].config_hash == "0badf00d"
    assert all(len(r.candidates) == 1 for r in merged.records[1:])


def test_compile_takes_the_logged_schedules(tmp_path, tuned, calib, layers):
    path, report = tuned
    assert _schedules(_vta(calib, tuning_log=str(path))) == {
        r.layer: r.schedule for r in report.records}
    # a log naming another (fitting) tiling for one layer: compile follows the log
    L, rqs = layers[1]
    other = next(s for s, _ in S.candidates(L, rqs, CFG) if s != S.choose(L, rqs, CFG))
    log = TuningLog.load(path)
    rec = log.get(layer_key(L, rqs), CFG.hash)
    rec.schedule = other.to_json()
    edited = tmp_path / "edited.jsonl"
    log.save(edited)
    got = _schedules(_vta(calib, tuning_log=str(edited)))
    assert got[L.name] == other.to_json()
    analytic = _schedules(_vta(calib))
    assert analytic[L.name] == S.choose(L, rqs, CFG).to_json() != other.to_json()
    # an explicit per-layer schedule wins over the log
    forced = {"toh": 2, "tow": 8, "tob": 1, "tib": 1, "threads": 2}
    got = _schedules(_vta(calib, tuning_log=str(edited), schedules={L.name: forced}))
    assert got[L.name] == dict(forced, order=1)  # the default loop order, made explicit


def test_tuned_schedule_is_never_slower_than_the_analytic_pick(tuned, layers):
    _, report = tuned
    for (L, rqs), r in zip(layers, report.records, strict=True):
        assert r.simulated_cycles <= r.analytic_cycles
        assert r.simulated_cycles == min(c[2] for c in r.candidates)
        # measured again, independently of the search
        tuned_cycles, tuned_out = simulate(L, S.schedule_from_json(L, r.schedule), rqs, CFG)
        pick_cycles, pick_out = simulate(L, S.choose(L, rqs, CFG), rqs, CFG)
        assert tuned_cycles == r.simulated_cycles and tuned_cycles <= pick_cycles
        assert np.array_equal(tuned_out, pick_out)
    assert report.simulated_cycles <= report.analytic_cycles


def test_tuned_digits_is_bit_exact_with_cpu_int8(tmp_path, tuned, calib):
    """With the tuned log, and with a log forcing each layer's slowest simulated tiling (other
    code paths: one thread, smaller tiles, input-channel chunks)."""
    path, report = tuned
    slow = TuningLog.load(path)
    for r in slow.records:
        r.schedule = max(r.candidates, key=lambda c: c[2])[0]
    slow_path = tmp_path / "slowest.jsonl"
    slow.save(slow_path)
    cpu = GraphExecutor(lower_model(digits.load_model(), target="cpu", quantize=True,
                                    calib=calib))
    x, _ = digits.test_split()
    for log in (path, slow_path):
        plan = _vta(calib, tuning_log=str(log))
        assert _schedules(plan) == {r.layer: r.schedule for r in TuningLog.load(log).records}
        vta = GraphExecutor(plan)
        for i in range(4):
            cpu.set_input(0, x[i:i + 1])
            cpu.run()
            vta.set_input(0, x[i:i + 1])
            vta.run()
            assert np.array_equal(cpu.get_output(0), vta.get_output(0))


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


@pytest.mark.parametrize("lines, match", [
    (["GOOD", "{not json"], r", line 2: not JSON \(Expecting property name"),
    (["[1, 2]"], r", line 1: a JSON list, not an object"),
    (["DROP:schedule"], r", line 1: no 'schedule' \(expected a tuning record"),
    (["SET:version=7"], r", line 1: tuning-log version 7; expected version 1, the one"),
    (["SET:schedule={'toh': 0, 'tow': 8, 'tob': 1, 'tib': 1}"],
     r", line 1: schedule\.toh is 0; expected an integer from 1 to 2\*\*63-1$"),
    (["", "SET:schedule={'toh': 64, 'tow': 64}"],
     r", line 2: schedule \(a ConvSchedule\) has no 'tob', 'tib' \(expected an object with "
     r"toh, tow, tob, tib and optionally threads, order\)$"),
    (["SET:version=True"], r", line 1: version is true \(a boolean\); expected the integer 1$"),
    (["SET:schedule={'toh': 8, 'tow': 8, 'tob': 1, 'tib': 1, 'threads': 3}"],
     r", line 1: schedule .* of layer 'conv3x3_0' does not fit the buffers"),
])
def test_a_corrupted_log_is_an_error_naming_file_and_line(tmp_path, tuned, calib, lines, match):
    good = tuned[0].read_text().splitlines()[0]
    out = []
    for line in lines:
        if line == "GOOD":
            line = good
        elif line.startswith(("DROP:", "SET:")):
            d = json.loads(good)
            if line.startswith("DROP:"):
                del d[line[5:]]
            else:
                k, v = line[4:].split("=", 1)
                d[k] = eval(v)
            line = json.dumps(d)
        out.append(line)
    path = _write(tmp_path / "bad.jsonl", out)
    with pytest.raises(ValueError, match=r"tuning log .*bad\.jsonl" + match):
        _vta(calib, tuning_log=path)


def test_missing_log_and_bad_options(tmp_path, calib):
    missing = str(tmp_path / "nowhere.jsonl")
    with pytest.raises(FileNotFoundError, match=r"tuning log .*nowhere\.jsonl: no such file"):
        _vta(calib, tuning_log=missing)
    with pytest.raises(TypeError, match="tuning_log must be a path or None, got int"):
        VtaOptions(tuning_log=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"schedules\['conv3x3_0'\] = .* does not fit"):
        _vta(calib, schedules={"conv3x3_0": {"toh": 8, "tow": 8, "tob": 1, "tib": 1,
                                             "threads": 5}})
    with pytest.raises(ValueError, match=r"schedules name \['conv9'\], which are not "
                                         r"accelerator layers of this model \(its layers: "
                                         r"\['conv3x3_0'"):
        _vta(calib, schedules={"conv9": {"toh": 1, "tow": 1, "tob": 1, "tib": 1}})
    bad = _write(tmp_path / "bad.jsonl", ["{}"])
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 1: no 'version'"):
        tune_model(digits.load_model(), calib=calib, log=bad)  # fails before any work


def test_report_table(tuned):
    _, report = tuned
    text = report.table()
    for r in report.records:
        assert r.layer in text
    assert "predicted" in text and "simulated" in text and "analytic" in text
    assert "rank correlation" in text and "mean |error|" in text
    assert 0 <= report.mean_abs_error < 0.1


def test_the_analytic_model_tracks_the_simulator(layers):
    """Every tiling of one convolution: the model ranks them as the simulator does and is
    within a few per cent (it leaves out only the shared memory port's contention)."""
    L, rqs = layers[3]  # conv3x3_5: 32 -> 16 channels, 4x4
    ranked = S.candidates(L, rqs, CFG)
    predicted = [p for _, p in ranked]
    simulated = [simulate(L, s, rqs, CFG)[0] for s, _ in ranked]
    assert spearman(predicted, simulated) > 0.98
    errors = [abs(p - c) / c for p, c in zip(predicted, simulated, strict=True)]
    assert max(errors) < 0.15 and np.mean(errors) < 0.08
    assert all(p <= c for p, c in zip(predicted, simulated, strict=True))


def test_pruned_search_equals_the_full_ranking(layers):
    for L, rqs in layers:
        full = S.candidates(L, rqs, CFG)
        for keep in (1, 3):
            assert S.candidates(L, rqs, CFG, keep=keep) == full[:keep]
        assert all(S.lower_bound(L, s, rqs, CFG) <= p for s, p in full)


def test_a_repeated_layer_shape_is_tuned_once(calib):
    m = models.mlp(sizes=(64, 64, 64, 10))  # two 64 -> 64 dense layers: one key
    rng = np.random.default_rng(0)
    report = tune_model(m, calib=[rng.standard_normal((1, 64)).astype(np.float32)
                                  for _ in range(2)], top_k=2)
    assert report.reused == [False, True, False]
    a, b = report.records[:2]
    assert (a.layer, b.layer) == ("fc_3", "fc_7") and a.key == b.key
    assert a.schedule == b.schedule and "same" in report.table()
    with pytest.raises(ValueError, match=r"top_k=0; expected an int >= 1 or None"):
        tune_model(m, calib=[np.ones((1, 64), np.float32)], top_k=0)
    with pytest.raises(TypeError, match=r"top_k=2\.0 \(a float\); expected an int >= 1"):
        tune_model(m, calib=[np.ones((1, 64), np.float32)], top_k=2.0)  # type: ignore[arg-type]
    assert math.isnan(spearman([1, 2], [2, 1]))


def test_no_tiling_beats_the_instruction_set_floor(layers):
    """`compute_floor` is a floor: every candidate tiling of every digits layer, simulated,
    takes at least that many cycles."""
    for L, rqs in layers:
        floor = S.compute_floor(L, rqs, CFG)
        cands = S.candidates(L, rqs, CFG)
        sims = [simulate(L, s, rqs, CFG)[0] for s, _ in cands[:6]]
        assert floor > 0 and min(sims) >= floor, (L.name, floor, sims)


def test_chosen_tiling_of_a_resnet_sized_layer_is_within_3_percent_of_the_floor():
    """Where tiles are large (a 3x3 convolution 64 -> 64 at 28x28), the chosen tiling hides
    loads, stores and pipeline fills behind compute: the simulated cycles are at most 3 % above
    the floor."""
    b = models._Builder(0)
    x = b.op("Relu", [b.conv("input", 64, 64, 3, bias=True)])
    m = b.model("conv", ["N", 64, 28, 28], x, ["N", 64, 28, 28], 13)
    rng = np.random.default_rng(0)
    calib = [rng.standard_normal((1, 64, 28, 28)).astype(np.float32)]
    g = optimize(quantize_graph(import_onnx(m), calib, QuantOptions())[0])
    (L,), _ = find_layers(g, CFG)
    rqs = requant_programs(L, CFG)
    floor = S.compute_floor(L, rqs, CFG)
    cycles, _ = simulate(L, S.choose(L, rqs, CFG), rqs, CFG)
    assert floor <= cycles <= 1.03 * floor, (floor, cycles)


def test_floor_worked_example():
    """The docstring's example: a 3x3 convolution 64 -> 64 channels at 56x56 with a per-channel
    multiplier costs 36 GEMM + 1 reset + 7 ALU cycles per output row."""
    from vtakit.compiler.backend.vta.layers import ConvLayer, Operand
    from vtakit.compiler.backend.vta.requant import requant_program
    from vtakit.compiler.ir.ops import RequantAttrs

    x, y = Operand(None, 1, 64, 56, 56), Operand(None, 1, 64, 56, 56)
    rq = RequantAttrs(tuple(range(100, 164)), (20,), 1, 0, 127)
    L = ConvLayer("c", "conv2d", [], [x], y, weight=np.ones((64, 64, 3, 3), np.int8),
                  kernel=(3, 3), pads=(1, 1, 1, 1), requant=rq,
                  bias=np.arange(64, dtype=np.int32))
    prog = requant_program(rq, L.bias, 64, CFG)
    assert [(st.op.name, st.imm is not None) for st in prog.steps] == [
        ("MUL", False), ("ADD", False), ("SHR", True), ("MAX", True), ("MIN", True)]
    assert S.compute_floor(L, (prog,), CFG) == 56 * 56 * 4 * (36 + 1 + 7) == 551_936
