"""Post-training quantisation: the integer graph, its exactness on the CPU backend, the
no-overflow proof, calibration data and options, and the digits model's accuracy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vtakit import digits, models
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.ir import Op, run
from vtakit.compiler.lowering import lower_graph
from vtakit.compiler.pipeline import optimize
from vtakit.compiler.quantize import QuantOptions, load_calibration, quantize_graph
from vtakit.compiler.quantize import requant as R
from vtakit.compiler.quantize.calibrate import MinMax, Mse, Percentile
from vtakit.runtime import GraphExecutor

MODELS = [("mlp", (1, 784)), ("lenet", (1, 1, 28, 28)), ("transformer_block", (1, 16, 64)),
          ("digits_cnn", (1, 1, 8, 8)),
          pytest.param("mobilenet_v2", (1, 3, 224, 224), marks=pytest.mark.slow),
          pytest.param("resnet18", (1, 3, 224, 224), marks=pytest.mark.slow)]


def _cpu(g, feeds: dict, threads: int = 2) -> dict:
    ex = GraphExecutor(lower_graph(optimize(g), "cpu", threads=threads)[0])
    for k, v in feeds.items():
        ex.set_input(k, v)
    ex.run()
    return {n: ex.get_output(n) for n in ex.output_names}


@pytest.mark.parametrize(("name", "shape"), MODELS)
@pytest.mark.parametrize("mode", ["fixed", "shift"])
def test_integer_graph_is_bit_identical_on_the_cpu_backend(name: str, shape, mode: str) -> None:
    g = import_onnx(getattr(models, name)())
    rng = np.random.default_rng(0)
    calib = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    qg, report = quantize_graph(g, calib, QuantOptions(mode=mode, observer="minmax",
                                                        report_samples=1))
    ops = {n.op for n in qg.nodes}
    assert Op.REQUANTIZE in ops and (Op.CONV_INTEGER in ops or Op.MATMUL_INTEGER in ops)
    assert not any(n.op in (Op.CONV, Op.GEMM) for n in qg.nodes)  # every conv/gemm is int8
    feeds = {g.inputs[0].name: rng.standard_normal(shape).astype(np.float32)}
    want = run(qg, feeds)
    got = _cpu(qg, feeds)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
    if mode == "shift":
        rq = [n for n in qg.nodes if n.op is Op.REQUANTIZE and n.src[0].op in (
            Op.CONV_INTEGER, Op.MATMUL_INTEGER)]
        assert all(n.attrs.multiplier == (1,) for n in rq)  # powers of two: shifts only
    assert report.output_sqnr_db > 15


def test_requantize_parameters_cannot_overflow_for_any_input() -> None:
    # The worst accumulator of each channel (every input at +-128, signs matching the weights)
    # plus the bias, saturated to the clamp where there is one, times the multiplier, plus the
    # rounding term, stays inside int32.
    g = import_onnx(models.lenet())
    rng = np.random.default_rng(1)
    qg, _ = quantize_graph(g, [rng.standard_normal((1, 1, 28, 28)).astype(np.float32)],
                           QuantOptions(report_samples=1))
    checked = 0
    for n in qg.nodes:
        if n.op is not Op.REQUANTIZE or n.src[0].op not in (Op.CONV_INTEGER, Op.MATMUL_INTEGER):
            continue
        w = n.src[0].src[1].value.astype(np.int64)
        per_channel = (np.abs(w).reshape(len(w), -1).sum(1) if n.src[0].op is Op.CONV_INTEGER
                       else np.abs(w).sum(0))
        bias = np.abs(n.src[1].value.astype(np.int64)) if len(n.src) > 1 else 0
        m = np.broadcast_to(np.asarray(n.attrs.multiplier, np.int64), per_channel.shape)
        s = n.attrs.shift[0]
        acc = 128 * per_channel + bias
        clamp = np.broadcast_to(np.asarray(n.attrs.clamp, np.int64), per_channel.shape)
        acc = np.where(clamp > 0, np.minimum(acc, clamp), acc)
        assert np.all(np.abs(m) * acc + (1 << s >> 1) < (1 << 31))
        assert np.all(np.abs(m) <= R.IMM_MAX)
        checked += 1
    assert checked == 5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-6, 10.0), min_size=1, max_size=8), st.integers(1, 1 << 22))
def test_choose_proves_the_bound(real: list[float], bound: int) -> None:
    try:
        rq = R.choose(real, [bound] * len(real))
    except R.RequantError:
        return  # no shift fits: nothing is emitted
    m = np.broadcast_to(np.asarray(rq.multiplier), (len(real),))
    assert rq.worst_case < (1 << 31) and int(np.abs(m).max()) <= R.IMM_MAX
    assert int(np.abs(m).max()) * bound + (1 << rq.shift >> 1) == rq.worst_case
    # the multiplier is as precise as the bound allows: one more shift would break a limit
    if rq.shift < 31:
        m2 = np.round(np.asarray(real) * (1 << (rq.shift + 1)))
        assert m2.max() > R.IMM_MAX or m2.max() * bound + (1 << rq.shift) >= (1 << 31)


def _unclamped(t: int, m: int, s: int, lo: int, hi: int, zp: int) -> int:
    """REQUANTIZE without the clamp in arbitrary precision (Python ints: nothing wraps)."""
    return min(max(((t * m + (1 << s >> 1)) >> s) + zp, lo), hi)


@st.composite
def _out_range(draw) -> tuple[int, int, int]:
    """(lo, hi, zero point) of an int8 or uint8 output, ReLU-like bounds included."""
    tlo, thi = draw(st.sampled_from([(-128, 127), (0, 255)]))
    lo = draw(st.integers(tlo, thi))
    return lo, draw(st.integers(lo, thi)), draw(st.integers(tlo, thi))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.floats(1e-6, 2.0), min_size=1, max_size=6),
       st.lists(st.integers(1, (1 << 31) - 1), min_size=6, max_size=6), _out_range(),
       st.integers(0, 1 << 30))
def test_the_clamp_changes_no_result(real, bounds, out, seed) -> None:
    # The int32 REQUANTIZE with the chosen clamp equals the unclamped arithmetic in arbitrary
    # precision for every |acc + bias| <= bound, tested at the clamp, next to it, at the bound
    # and at random; and the product never leaves int32.
    from vtakit.compiler.ir import ops as o
    from vtakit.compiler.ir.interpreter import requantize

    lo, hi, zp = out
    bound = np.array(bounds[:len(real)], np.int64)
    try:
        rq = R.choose(real, bound, out_range=(lo, hi), zero_point=zp, clamp=True)
    except R.RequantError:
        return  # no shift fits: nothing is emitted
    n = len(real)
    m = np.broadcast_to(np.asarray(rq.multiplier, np.int64), (n,))
    clamp = np.broadcast_to(np.asarray(rq.clamp, np.int64), (n,))
    eff = np.where(clamp > 0, np.minimum(clamp, bound), bound)
    assert rq.worst_case == int((m * eff).max()) + (1 << rq.shift >> 1) < (1 << 31)
    assert int(m.max()) <= R.IMM_MAX
    if rq.shift < 31:  # as precise as the limits allow: one more shift would break one
        s2 = rq.shift + 1
        m2 = np.round(np.asarray(real) * (1 << s2)).astype(np.int64)
        a2 = R.clamps(m2, bound, s2, max(hi - zp, zp - lo))
        assert m2.max() > R.IMM_MAX or int((m2 * a2).max()) + (1 << rq.shift) >= (1 << 31) \
            or (int((m2 * a2).max()) + (1 << rq.shift)) >> s2 >= (1 << 31) - 1 - abs(zp)
    rng = np.random.default_rng(seed)
    cols = []
    for c in range(n):
        a = int(clamp[c]) or int(bound[c])
        pts = {0, 1, -1, a, a - 1, a + 1, 2 * a, int(bound[c])}
        pts |= set(rng.integers(-bound[c], bound[c], 24, endpoint=True).tolist())
        pts = sorted({v for p in pts for v in (p, -p) if abs(v) <= bound[c]})
        cols.append(np.resize(np.array(pts, np.int64), 64))
    t = np.stack(cols, 1)
    a = o.RequantAttrs(rq.multiplier, (rq.shift,), 1, lo, hi, zp, rq.clamp)
    got = requantize(t.astype(np.int32), None, a, np.dtype(np.int32))
    want = np.vectorize(lambda v, c: _unclamped(int(v), int(m[c]), rq.shift, lo, hi, zp))(
        t, np.arange(n)[None, :])
    np.testing.assert_array_equal(got, want)


def test_the_clamp_keeps_the_multiplier_bits() -> None:
    # A 1x1 convolution over 960 channels: accumulators up to 2**22. Unclamped, the proof
    # leaves 8- and 9-bit multipliers (shift 17); with uint8 outputs [0, 255] and the clamp,
    # shift 23 and 14- and 15-bit ones (the product is then at most about 255 * 2**23).
    real, bound = [1e-3, 2e-3], [1 << 22, 1 << 22]
    plain = R.choose(real, bound)
    rq = R.choose(real, bound, out_range=(0, 255), clamp=True)
    assert (plain.shift, plain.clamp, plain.multiplier) == (17, (0,), (131, 262))
    assert (rq.shift, rq.multiplier) == (23, (8389, 16777))
    assert rq.clamp == (254989, 127502)  # ceil(255 * 2**23 / m)
    assert rq.rel_error < plain.rel_error / 10
    # A clamp only where it buys bits: a narrow layer, or an int32 output, has none.
    assert R.choose(real, [1000, 1000], out_range=(-128, 127), clamp=True).clamp == (0,)
    assert R.choose(real, bound, out_range=(-(1 << 31), (1 << 31) - 1), clamp=True).clamp == (0,)


def test_choose_errors() -> None:
    with pytest.raises(ValueError, match="requantisation mode 'exp'; expected one of"):
        R.choose([0.5], [1], "exp")
    with pytest.raises(R.RequantError, match="one power-of-two multiplier per layer"):
        R.choose([0.5, 0.3], [1, 1], "shift")
    with pytest.raises(R.RequantError, match="no shift in 0..31 keeps multipliers"):
        R.choose([1e6], [1 << 20])


def test_digits_int8_accuracy_is_within_a_point_of_fp32() -> None:
    model = digits.load_model()
    x, y = digits.test_split()
    g = import_onnx(model)
    qg, report = quantize_graph(g, digits.calibration_set(), QuantOptions())
    name = g.inputs[0].name
    fp = GraphExecutor(lower_graph(optimize(g), "cpu", threads=1)[0])
    iq = GraphExecutor(lower_graph(optimize(qg), "cpu", threads=1)[0])
    hits = {"fp32": 0, "int8": 0}
    for i in range(len(x)):
        for key, ex in (("fp32", fp), ("int8", iq)):
            ex.set_input(name, x[i:i + 1])
            ex.run()
            hits[key] += int(np.argmax(ex.get_output(0)) == y[i])
    acc = {k: v / len(x) for k, v in hits.items()}
    assert acc["fp32"] >= 0.97 and acc["int8"] >= acc["fp32"] - 0.01, acc
    assert all(r.kind == "int8" for r in report.layers), report.table()


def test_keep_float_and_its_errors() -> None:
    g = import_onnx(models.lenet())
    calib = [np.zeros((1, 1, 28, 28), np.float32) + 0.5]
    first_conv = next(n.name for n in g.nodes if n.op is Op.CONV)
    qg, report = quantize_graph(g, calib, QuantOptions(keep_float=(first_conv,),
                                                        report_samples=1))
    kept = [r for r in report.layers if r.name == first_conv]
    assert kept and kept[0].kind == "float (asked)"
    assert sum(n.op is Op.CONV for n in qg.nodes) == 1
    assert "float (asked)" in report.table()
    with pytest.raises(ValueError, match=r"keep_float names \['nope'\], which are not nodes"):
        quantize_graph(g, calib, QuantOptions(keep_float=("nope",)))
    with pytest.raises(ValueError, match="quantisation mode 'int4'; expected one of"):
        QuantOptions(mode="int4")
    with pytest.raises(ValueError, match="observer 'kl'; expected one of"):
        QuantOptions(observer="kl")


def test_calibration_data_forms(tmp_path) -> None:
    g = import_onnx(models.mlp())
    name = g.inputs[0].name
    x = np.random.default_rng(2).standard_normal((5, 784)).astype(np.float32)
    np.savez(tmp_path / "named.npz", **{name: x})
    np.savez(tmp_path / "one.npz", x)
    (tmp_path / "dir").mkdir()
    for i in range(3):
        np.save(tmp_path / "dir" / f"{i}.npy", x[i])
    assert len(load_calibration(tmp_path / "named.npz", g)) == 5
    assert len(load_calibration(str(tmp_path / "one.npz"), g)) == 5
    assert len(load_calibration(tmp_path / "dir", g)) == 3
    assert len(load_calibration([x[0], x[1:3]], g)) == 3
    assert len(load_calibration(iter([{name: x[0]}]), g)) == 1
    got = load_calibration(x, g)
    assert len(got) == 5 and got[0][name].shape == (1, 784)
    with pytest.raises(ValueError, match=r"calibration input 'input': got shape \[1, 5\], "
                                         r"expected \[1, 784\]"):
        load_calibration([np.zeros((1, 5), np.float32)], g)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .npy files"):
        load_calibration(tmp_path / "empty", g)
    with pytest.raises(ValueError, match="expected a .npz file, a .npy file or a directory"):
        load_calibration(tmp_path / "x.csv", g)
    with pytest.raises(TypeError, match="must be a path or an iterable of arrays, got int"):
        load_calibration(3, g)


def test_observers_on_outliers() -> None:
    rng = np.random.default_rng(3)
    v = np.concatenate([rng.laplace(size=60000), [80.0]])
    thresholds = {}
    for cls in (MinMax, Percentile, Mse):
        o = cls()
        o.observe(v)
        thresholds[cls.kind] = o.threshold()
    assert thresholds["minmax"] == 80.0
    assert thresholds["percentile"] < 15  # the outlier saturates

    def mse(t: float) -> float:
        s = t / 127
        return float(np.mean((np.clip(np.round(v / s), -127, 127) * s - v) ** 2))

    # MSE's threshold quantises these values no worse than covering the outlier, or the 99.99th
    # percentile
    assert mse(thresholds["mse"]) <= min(mse(80.0), mse(thresholds["percentile"])) * 1.0001


def test_int8_model_cross_compiles_for_aarch64() -> None:
    from vtakit.compiler.compile import compile_model

    art = compile_model(digits.load_model(), quantize=True, calib=digits.calibration_set(),
                        options={"triple": "aarch64"})
    obj = art.plan.sections["cpu"].members["aarch64.o"]
    assert obj[:4] == b"\x7fELF" and int.from_bytes(obj[18:20], "little") == 183  # EM_AARCH64
    assert "gemm_s8" in {s.op for s in art.plan.steps}
