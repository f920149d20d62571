"""`requant.choose` at every scale: real multipliers from 1e-12 to 1e12 (a huge or a tiny output
scale), biases from 0 to the int32 limits, int8 / uint8 / int32 outputs. Either the chosen
integers, run by the interpreter's 32-bit REQUANTIZE, give the exact rational result
``clip(floor((acc + bias) * M + 1/2) + zero point)`` within one step for every accumulator up
to the bound (`Requant.max_error` < 1; where it cannot be, at most ``floor(max_error) + 1``
steps), or `RequantError` names the numbers. Never the silent zero: multipliers rounded to 0
while the outputs are not."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from vtakit.compiler.ir.interpreter import requantize
from vtakit.compiler.ir.ops import RequantAttrs
from vtakit.compiler.quantize import requant as R

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
# lo, hi and the zero point (-1: drawn at random) of the output; None: int32
OUTS: dict[str, tuple[int, int, int] | None] = {
    "i8": (-128, 127, 0), "relu": (0, 127, 0), "u8": (0, 255, -1), "i32": None}


def _exact(t: int, M: Fraction, lo: int, hi: int, zp: int) -> int:
    v = t * M.numerator
    return min(max((2 * v + M.denominator) // (2 * M.denominator) + zp, lo), hi)


def _points(rng: np.random.Generator, bias: int, acc: int, M: float, span: int) -> list[int]:
    """Accumulators of one channel (|acc| <= `acc`): the ends, around 0 and -bias, around the
    saturation thresholds, at random."""
    pts = {0, 1, -1, acc, -acc, acc - 1, 1 - acc, -bias, -bias + 1, -bias - 1}
    if M > 0:
        for edge in (span + 0.5, -span - 0.5, span - 0.5, 0.5, -0.5):
            c = edge / M - bias
            if abs(c) < 4 * (1 << 31):
                pts |= {int(np.floor(c)) + d for d in (-2, -1, 0, 1, 2)}
    pts |= set(rng.integers(-acc, acc, 40, endpoint=True).tolist())
    return sorted(v for v in pts if abs(v) <= acc)


def _case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5))
    spread = [0.0, 0.0, 3.0, 6.0][int(rng.integers(0, 4))]
    real = 10.0 ** rng.uniform(-12, 12) * 2.0 ** -rng.uniform(0, spread, n)
    real[rng.random(n) < 0.1] = 0.0
    acc = np.round(2.0 ** rng.uniform(0, 28, n)).astype(np.int64)
    kind = rng.choice(["none", "tiny", "moderate", "huge"])
    bias = {"none": np.zeros(n, np.int64),
            "tiny": rng.integers(-9, 10, n),
            "moderate": rng.integers(-(1 << 20), 1 << 20, n),
            "huge": rng.choice([-1, 1], n) * rng.integers(1 << 30, 1 << 31, n)}[kind]
    bias = np.clip(bias, I32_MIN, I32_MAX).astype(np.int64)
    out = rng.choice(list(OUTS))
    return dict(real=real, acc=acc, bias=bias, out=str(out), rng=rng, bias_kind=str(kind),
                spread=spread)


def _check(real, acc, bias, out, rng, exact=True, **_) -> R.Requant | str:
    """choose on one layer and its integers against the exact result; the error text when
    choose refuses."""
    n = len(real)
    bound = acc + np.abs(bias)
    spec = OUTS[out]
    lo, hi, zp = (I32_MIN, I32_MAX, 0) if spec is None else spec
    out_range = None if spec is None else (lo, hi)
    if zp < 0:
        zp = int(rng.integers(lo, hi + 1))
    try:
        rq = R.choose(real, bound, out_range=out_range, zero_point=zp, acc_bound=acc,
                      exact=exact)
    except R.RequantError as e:
        assert "multipliers" in str(e) and "|acc + bias| up to" in str(e), str(e)
        return str(e)
    span = max(hi - zp, zp - lo)
    a = RequantAttrs(rq.multiplier, (rq.shift,), 1, lo, hi, zp, rq.clamp, (rq.pre_shift,))
    cols = [_points(rng, int(bias[c]), int(acc[c]), float(real[c]), span) for c in range(n)]
    k = max(len(c) for c in cols)
    x = np.stack([np.resize(np.array(c, np.int64), k) for c in cols], 1)
    got = requantize(x.astype(np.int32), bias.astype(np.int32), a, np.dtype(np.int64))
    worst = 0
    for c in range(n):
        M = Fraction(float(real[c]))
        want = np.array([_exact(int(t) + int(bias[c]), M, lo, hi, zp) for t in x[:, c]])
        worst = max(worst, int(np.abs(got[:, c] - want).max()))
    assert worst <= int(rq.max_error) + 1, (worst, rq)  # the proven bound holds
    if rq.max_error < 1:
        assert worst <= 1, rq
    return rq


@pytest.mark.parametrize("block", range(8))
def test_within_one_step_of_the_exact_result_or_a_named_error(block: int) -> None:
    results = {"faithful": 0, "error": 0, "int32 or far apart": 0}
    for seed in range(block * 60, (block + 1) * 60):
        case = _case(seed)
        r = _check(**case)
        if isinstance(r, str):
            results["error"] += 1
            # refused only where no REQUANTIZE can hold it: a bias past 2**30 with a
            # saturating multiplier, an int32 output, or multipliers too far apart
            assert case["bias_kind"] == "huge" or case["out"] == "i32" or case["spread"] \
                or max(case["real"]) > R.IMM_MAX, (seed, r)
        elif r.max_error < R.FAITHFUL:
            results["faithful"] += 1
        else:
            results["int32 or far apart"] += 1
            assert case["out"] == "i32" or case["spread"] > 0, (seed, r)
    assert results["faithful"] >= 40, results


@pytest.mark.parametrize(("real", "out"), [
    (1e12, "i8"), (1e6, "u8"), (4e4, "relu"), (300.0, "i8"),  # a tiny output scale
    (1e-12, "i8"), (1e-9, "u8"), (3e-8, "i8"),  # a huge output scale
])
@pytest.mark.parametrize("bias_kind", ["none", "tiny", "huge"])
def test_extreme_ratios_with_any_bias(real: float, out: str, bias_kind: str) -> None:
    rng = np.random.default_rng(7)
    n = 3
    acc = np.array([1, 1 << 12, 1 << 24])
    bias = {"none": np.zeros(n, np.int64), "tiny": np.array([1, -1, 3]),
            "huge": np.array([I32_MAX, I32_MIN + 1, (1 << 31) - 5000])}[bias_kind]
    r = _check(np.full(n, real), acc, bias, out, rng)
    if bias_kind == "huge" and real > 1:
        # sign(acc + bias) with acc + bias past int32 and no pre-shift that keeps it exact
        assert isinstance(r, str) and "keeps the value" in r, r
    else:
        assert isinstance(r, R.Requant) and r.max_error < 1, r


def test_the_silent_zero_is_gone() -> None:
    # onnxruntime's Gemm after a GlobalAveragePool of scale 3.5e-10: weight scales enlarged
    # so the bias fits int32, which puts it at 2**31 / 1.0001; real multipliers 1.5e-10 to
    # 6.3e-8, outputs up to 134 steps. The plain search left every multiplier 0 (a model
    # whose outputs were all zero, without an error); now a pre-shift keeps 15 bits.
    real = np.array([6.26e-8, 1.48e-10, 2.1e-9])
    bias = np.array([2147269136, -2147269124, 2147000000])
    acc = np.array([3_000_000, 5_755_605, 200_000])
    rq = _check(real, acc, bias, "u8", np.random.default_rng(0))
    assert isinstance(rq, R.Requant) and rq.pre_shift > 0 and rq.max_error < 0.05, rq
    assert max(rq.multiplier) > 1 << 13
    # without the pre-shift (no |acc| bound given) it cannot be done: an error, not zeros
    with pytest.raises(R.RequantError, match=r"multipliers 1\.48e-10\.\.6\.26e-08 \(3 "
                       r"channels\), \|acc \+ bias\| up to 2153024729, output range \[0, 255\]"
                       r".*keeps the value"):
        R.choose(real, acc + np.abs(bias), out_range=(0, 255), zero_point=7)


def test_plain_results_are_unchanged_where_they_are_faithful_or_not_exact() -> None:
    # The search as before where the result is within a step (or `exact` is off and the
    # value is kept): the documented examples of test_quantize
    assert R.choose([1e-3, 2e-3], [1 << 22] * 2).multiplier == (131, 262)
    assert R.choose([1e-3, 2e-3], [1 << 22] * 2, out_range=(0, 255)).max_error < 0.15
    # A 3x3 convolution over 512 channels (accumulators to 2**24): 7-bit multipliers, off by
    # up to 2 steps near full scale; kept as they were without `exact` ...
    rq = R.choose([1e-4, 2e-4], [1 << 24] * 2, out_range=(0, 255))
    assert (rq.multiplier, rq.shift, rq.clamp) == ((52, 105), 19, (0,))
    assert 2 < rq.max_error < 2.1
    # ... with it (the ONNX importer's choice), the clamp gives 11 bits and a step
    rq = R.choose([1e-4, 2e-4], [1 << 24] * 2, out_range=(0, 255), exact=True)
    assert (rq.multiplier, rq.shift, rq.clamp) == ((839, 1678), 23, (2549577, 1274789))
    assert rq.max_error < 0.05
    # An int32 output, which no 32-bit product keeps within a step: the plain one
    rq = R.choose([1e-3, 2e-3], [1 << 22] * 2, exact=True)
    assert rq.multiplier == (131, 262) and rq.max_error > 1


def test_errors_name_the_numbers() -> None:
    with pytest.raises(R.RequantError, match=r"no shift in 0\.\.31 keeps multipliers "
                       r"\[1000000\.0\].*\(multipliers 1e\+06\.\.1e\+06 \(1 channel\), \|acc \+ "
                       r"bias\| up to 1048576, int32 output\)"):
        R.choose([1e6], [1 << 20])
