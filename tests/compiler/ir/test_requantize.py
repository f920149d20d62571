"""REQUANTIZE: the integer requantisation every int8 backend must compute bit for bit.

The interpreter's step-by-step 32-bit arithmetic is checked against an exact rational reference
(Python integers: round half up of (x + b) * m / 2**s) wherever no step overflows int32, against
a wrapping emulation where one does, and the CPU backend against the interpreter."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vtakit.compiler.backend.cpu.lower import lower
from vtakit.compiler.ir import DType, Graph, Node, Op, const, run
from vtakit.compiler.ir.infer import InferError, infer
from vtakit.compiler.ir.ops import InputAttrs, RequantAttrs
from vtakit.runtime import GraphExecutor

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


def _input(name: str, shape: tuple[int, ...]) -> Node:
    return Node(Op.INPUT, DType.INT32, shape, attrs=InputAttrs(0), name=name)


def _requant(x: Node, a: RequantAttrs, out: DType, bias: np.ndarray | None = None) -> Node:
    src = (x,) if bias is None else (x, const(bias.astype(np.int32), "bias"))
    d, s = infer(Op.REQUANTIZE, src, a, out)
    return Node(Op.REQUANTIZE, d, s, src, a, name="rq")


def _exact(v: int, m: int, s: int, lo: int, hi: int) -> int:
    """round half up of v * m / 2**s, clamped: the real number the integers stand for."""
    q = Fraction(v * m, 1 << s)
    r = int(np.floor(q + Fraction(1, 2)))
    return min(max(r, lo), hi)


def _wrap(v: int) -> int:
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


def _emulated(v: int, b: int, m: int, s: int, lo: int, hi: int, clamp: int = 0) -> int:
    """The ALU sequence on Python ints with explicit 32-bit wrap: ADD, (MAX, MIN,) MUL, ADD,
    SHR, MAX, MIN."""
    t = _wrap(v + b)
    if clamp:
        t = min(max(t, -clamp), clamp)
    t = _wrap(t * m)
    if s:
        t = _wrap(t + (1 << (s - 1)))
    return min(max(t >> s, lo), hi)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 1 << 15), st.integers(0, 31), st.data())
def test_matches_the_exact_rational_reference_when_nothing_overflows(m: int, s: int, data) -> None:
    # |x + b| * m must stay in int32, and so must the rounding add (at most 2**30): the
    # product is kept below 2**31 - 2**30, strictly
    limit = max(1, ((1 << 31) - 1 - (1 << 30)) // m)
    xs = data.draw(st.lists(st.integers(-limit, limit), min_size=1, max_size=16))
    lo = data.draw(st.integers(-128, 0))
    hi = data.draw(st.integers(0, 127))
    a = RequantAttrs((m,), (s,), 0, lo, hi)
    x = np.array(xs, np.int32)
    node = _requant(_input("x", x.shape), a, DType.INT8)
    got = run(Graph((node.src[0],), (node,), ("y",)), {"x": x})["y"]
    assert got.dtype == np.int8
    assert got.tolist() == [_exact(v, m, s, lo, hi) for v in xs]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(I32_MIN, I32_MAX), min_size=1, max_size=12),
       st.integers(I32_MIN, I32_MAX), st.integers(-(1 << 15), 1 << 15), st.integers(0, 31),
       st.one_of(st.just(0), st.integers(1, I32_MAX)))
def test_overflow_wraps_like_the_32_bit_alu(xs, b, m, s, clamp) -> None:
    a = RequantAttrs((m,), (s,), 0, I32_MIN, I32_MAX, clamp=(clamp,))
    x = np.array(xs, np.int32)
    node = _requant(_input("x", x.shape), a, DType.INT32, np.full(len(xs), b))
    got = run(Graph((node.src[0],), (node,), ("y",)), {"x": x})["y"]
    assert got.tolist() == [_emulated(v, b, m, s, I32_MIN, I32_MAX, clamp) for v in xs]


def test_the_clamp_saturates_before_the_multiply() -> None:
    # the docstring's example: multiplier 12897, shift 20, clamp 10407 into [-128, 127]
    a = RequantAttrs((12897,), (20,), 0, -128, 127, clamp=(10407,))
    x = np.array([10407, -10407, 10**6, -10**6, 1000, 10406], np.int32)
    node = _requant(_input("x", x.shape), a, DType.INT8)
    g = Graph((node.src[0],), (node,), ("y",))
    assert run(g, {"x": x})["y"].tolist() == [127, -128, 127, -128, 12, 127]
    # without it, 10**6 * 12897 wraps int32
    plain = _requant(_input("x", x.shape), RequantAttrs((12897,), (20,), 0, -128, 127),
                     DType.INT8)
    assert run(Graph((plain.src[0],), (plain,), ("y",)), {"x": x})["y"].tolist()[2] != 127
    # per channel, 0: none on that channel
    a = RequantAttrs((1,), (0,), 0, I32_MIN, I32_MAX, clamp=(5, 0))
    x2 = np.array([[100, 100], [-100, -100]], np.int32).T
    node = _requant(_input("x", (2, 2)), a, DType.INT32)
    assert run(Graph((node.src[0],), (node,), ("y",)), {"x": x2})["y"].tolist() == [
        [5, -5], [100, -100]]


def test_worked_example_of_the_docstring() -> None:
    # scale 0.0123 with shift 20: multiplier 12897; x = 1000 -> 12
    a = RequantAttrs((round(0.0123 * (1 << 20)),), (20,), 0, -128, 127)
    assert a.multiplier == (12897,)
    node = _requant(_input("x", (1,)), a, DType.INT8)
    assert run(Graph((node.src[0],), (node,), ("y",)), {"x": np.array([1000], np.int32)})[
        "y"].tolist() == [12]


@pytest.mark.parametrize("out", [DType.INT8, DType.UINT8, DType.INT32])
@pytest.mark.parametrize("axis", [0, 1, 3])
def test_cpu_backend_equals_the_interpreter_bit_for_bit(out: DType, axis: int) -> None:
    rng = np.random.default_rng(axis)
    shape = (2, 5, 3, 4)
    ch = shape[axis]
    x = rng.integers(-(1 << 31), 1 << 31, shape, dtype=np.int64).astype(np.int32)
    x[0] = rng.integers(-40000, 40000, shape[1:])  # values that land inside the range too
    mult = tuple(int(v) for v in rng.integers(1, 1 << 15, ch))
    shift = tuple(int(v) for v in rng.integers(0, 32, ch))
    info = np.iinfo(out.np)
    lo, hi = (0, 100) if out is not DType.INT32 else (int(info.min), int(info.max))
    bias = rng.integers(-(1 << 20), 1 << 20, ch).astype(np.int32)
    zp = 3 if out is not DType.INT32 else 0
    clamp = tuple(int(v) for v in rng.integers(0, 1 << 20, ch))
    for a, b in [(RequantAttrs(mult, shift, axis, lo, hi, zp), bias),
                 (RequantAttrs(mult, shift, axis, lo, hi, zp, clamp), bias),
                 (RequantAttrs((77,), (9,), axis, lo, hi, clamp=(30000,)), None),
                 (RequantAttrs((77,), (9,), axis, lo, hi), None),
                 (RequantAttrs((1,), (0,), axis, lo, hi), None)]:
        node = _requant(_input("x", shape), a, out, b)
        g = Graph((node.src[0],), (node,), ("y",))
        want = run(g, {"x": x})["y"]
        ex = GraphExecutor(lower(g, threads=2))
        ex.set_input("x", x)
        ex.run()
        got = ex.get_output("y")
        assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize(("attrs", "src_dt", "out", "bias", "match"), [
    (RequantAttrs((1,), (0,), 0, -128, 127), DType.INT8, DType.INT8, None,
     "REQUANTIZE takes an int32 operand, got i8"),
    (RequantAttrs((1,), (0,), 0, -128, 127), DType.INT32, DType.FLOAT32, None,
     r"REQUANTIZE makes one of \['i8', 'u8', 'i32'\], got f32"),
    (RequantAttrs((1, 2), (0,), 0, -128, 127), DType.INT32, DType.INT8, None,
     r"multiplier has 2 values, expected 1 or 4 \(the size of axis 0\)"),
    (RequantAttrs((1,), (32,), 0, -128, 127), DType.INT32, DType.INT8, None,
     r"shifts must be in 0..31, got \[32\]"),
    (RequantAttrs((1,), (0,), 0, -128, 127, clamp=(-1,)), DType.INT32, DType.INT8, None,
     r"clamps must be in 0..2\*\*31-1 \(0: none\), got \[-1\]"),
    (RequantAttrs((1,), (0,), 0, -128, 127, clamp=(1, 2)), DType.INT32, DType.INT8, None,
     r"clamp has 2 values, expected 1 or 4 \(the size of axis 0\)"),
    (RequantAttrs((1,), (0,), 0, -129, 127), DType.INT32, DType.INT8, None,
     r"bounds \[-129, 127\] are not an interval within i8's \[-128, 127\]"),
    (RequantAttrs((1,), (0,), 0, 0, 255), DType.INT32, DType.INT8, None,
     r"bounds \[0, 255\]"),
    (RequantAttrs((1,), (0,), 0, -128, 127), DType.INT32, DType.INT8, np.zeros(3, np.int32),
     r"bias must be int32 of shape \(4,\) \(axis 0\), got i32\[3\]"),
    (RequantAttrs((1,), (0,), 2, -128, 127), DType.INT32, DType.INT8, None,
     "axis 2 out of range for rank 2"),
])
def test_bad_requantize_says_what_is_wrong(attrs, src_dt, out, bias, match) -> None:
    x = Node(Op.INPUT, src_dt, (4, 2), attrs=InputAttrs(0), name="x")
    src = (x,) if bias is None else (x, const(bias, "b"))
    with pytest.raises(InferError, match=match):
        infer(Op.REQUANTIZE, src, attrs, out)
