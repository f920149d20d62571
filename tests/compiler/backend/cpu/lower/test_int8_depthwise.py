"""The int8 depthwise convolution with the requantisation fused (kernels/conv.py,
`depthwise_s8`): CONV_INTEGER (group = channels) + REQUANTIZE run as one kernel, bit for bit
the interpreter, across the geometries of MobileNet-like layers and the corners of the 32-bit
requantisation arithmetic; the cases it does not take go through the generic loops."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from vtakit.compiler.ir import DType, Graph, Node, Op, const, run
from vtakit.compiler.ir.infer import infer
from vtakit.compiler.ir.ops import ConvAttrs, InputAttrs, RequantAttrs
from vtakit.compiler.lowering import lower_graph
from vtakit.compiler.pipeline import optimize
from vtakit.runtime import GraphExecutor

I32 = np.iinfo(np.int32)


def _mk(op: Op, *src: Node, attrs, dtype: DType | None = None, name: str = "") -> Node:
    d, s = infer(op, src, attrs, dtype)
    return Node(op, d, s, tuple(src), attrs, name)


def _depthwise(x: Node, w: np.ndarray, k: int, stride: tuple[int, int], pad: int,
               dil: int, group: int | None = None) -> Node:
    at = ConvAttrs((k, k), stride, (pad,) * 4, (dil, dil), group or x.shape[1])
    return _mk(Op.CONV_INTEGER, x, const(w, "w"), const(np.int8(0)), const(np.int8(0)),
               attrs=at, name="acc")


def _run(g: Graph, x: np.ndarray, threads: int = 2) -> tuple[np.ndarray, set[str]]:
    """The CPU backend's output and the ops its steps ran."""
    ex = GraphExecutor(lower_graph(optimize(g), "cpu", threads=threads)[0])
    ex.set_input("x", x)
    ex.run()
    return ex.get_output(0), {op for _, op, _, _ in ex.profile()}


def _ints(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """int8 values with the extremes over-represented: a tenth -128, a tenth 127."""
    v = rng.integers(-128, 128, shape)
    u = rng.random(shape)
    return np.where(u < 0.1, -128, np.where(u > 0.9, 127, v)).astype(np.int8)


def _params(rng: np.random.Generator, c: int, kind: str, out: DType):
    """(bias, RequantAttrs): "wrap": any int32 bias and multiplier (the sum and the product
    wrap), shifts 0..31 with 0 and 31 present; "scaled": what a quantiser makes (outputs
    spread over the range, ReLU6-like bounds for int8), with per-channel clamps that bite (0,
    none, on some); "scalar": one multiplier and shift, no bias, one clamp."""
    info = np.iinfo(out.np)
    if kind == "wrap":
        bias = rng.integers(I32.min, I32.max, c, endpoint=True).astype(np.int32)
        mult = rng.integers(I32.min, I32.max, c, endpoint=True)
        shift = rng.integers(0, 32, c)
        shift[:2] = (0, 31)
        return bias, RequantAttrs(tuple(map(int, mult)), tuple(map(int, shift)), 1,
                                  int(info.min) if out is not DType.UINT8 else 0,
                                  int(info.max) if out is not DType.UINT8 else 127)
    if kind == "scaled":
        bias = rng.integers(-5000, 5000, c).astype(np.int32)
        mult = rng.integers(1, 1 << 15, c)
        shift = rng.integers(20, 24, c)
        lo, hi = (0, 100) if out is not DType.INT32 else (int(info.min), int(info.max))
        clamp = rng.integers(0, 1 << 17, c) * (rng.random(c) < 0.8)
        return bias, RequantAttrs(tuple(map(int, mult)), tuple(map(int, shift)), 1, lo, hi,
                                  clamp=tuple(map(int, clamp)))
    return None, RequantAttrs((12345,), (17,), 1, -128 if out is DType.INT8 else 0,
                              127 if out is not DType.INT32 else int(info.max), clamp=(5000,))


def _graph(x_shape: tuple[int, ...], w: np.ndarray, k: int, stride: tuple[int, int], pad: int,
           dil: int, bias: np.ndarray | None, a: RequantAttrs, out: DType,
           group: int | None = None) -> Graph:
    x = Node(Op.INPUT, DType.INT8, x_shape, attrs=InputAttrs(0), name="x")
    acc = _depthwise(x, w, k, stride, pad, dil, group)
    src = (acc,) if bias is None else (acc, const(bias, "bias"))
    y = _mk(Op.REQUANTIZE, *src, attrs=a, dtype=out, name="rq")
    return Graph((x,), (y,), ("y",))


# channels, height, width, kernel, stride (h, w), pad, dilation, batch: MobileNetV2's
# depthwise layers (3x3, pad 1, stride 1 and 2, widths 112..7) on a few rows, channel counts
# that are not multiples of 16, and the other geometries the window walk supports.
GEOMETRIES = [
    (20, 6, 112, 3, (1, 1), 1, 1, 1),
    (18, 7, 112, 3, (2, 2), 1, 1, 2),
    (24, 9, 56, 3, (1, 1), 1, 1, 1),
    (23, 8, 56, 3, (2, 2), 1, 1, 1),
    (36, 14, 14, 3, (1, 1), 1, 1, 2),
    (33, 14, 14, 3, (2, 2), 1, 1, 1),
    (17, 7, 7, 3, (1, 1), 1, 1, 2),
    (19, 14, 14, 3, (1, 1), 0, 1, 1),
    (5, 9, 56, 3, (2, 2), 0, 1, 1),
    (21, 14, 14, 5, (1, 1), 2, 1, 1),
    (7, 11, 56, 5, (2, 2), 2, 1, 2),
    (9, 7, 7, 5, (1, 1), 0, 1, 1),
    (11, 14, 14, 3, (1, 1), 2, 2, 1),
    (6, 9, 56, 3, (2, 2), 1, 2, 1),
    (3, 4, 300, 3, (1, 1), 1, 1, 1),   # past UNROLL_CHUNKS: the chunks in a loop
    (4, 8, 30, 3, (1, 2), 1, 1, 1),    # unequal strides
    (3, 5, 9, 1, (1, 1), 0, 1, 1),     # 1x1
]


def _case_id(geom) -> str:
    c, h, w, k, s, p, d, n = geom
    return f"c{c}_{h}x{w}_k{k}_s{s[0]}x{s[1]}_p{p}_d{d}_n{n}"


@pytest.mark.parametrize("geom", GEOMETRIES, ids=_case_id)
@pytest.mark.parametrize(("out", "kind"), [(DType.INT8, "scaled"), (DType.INT8, "wrap"),
                                           (DType.INT32, "wrap"), (DType.UINT8, "scalar")])
def test_fused_depthwise_equals_the_interpreter_bit_for_bit(geom, out: DType, kind: str) -> None:
    c, h, wd, k, stride, pad, dil, n = geom
    rng = np.random.default_rng(zlib.crc32(f"{geom} {out.value} {kind}".encode()))
    x = _ints(rng, (n, c, h, wd))
    x[0, 0] = -128  # a channel of extremes: every product -128 * w
    w = _ints(rng, (c, 1, k, k))
    w[0] = -128  # the largest products, 128 * 128
    if c > 1:
        x[-1, 1], w[1] = 127, 127
    bias, a = _params(rng, c, kind, out)
    g = _graph(x.shape, w, k, stride, pad, dil, bias, a, out)
    want = run(g, {"x": x})["y"]
    got, ops = _run(g, x)
    # (a uint8 output: the pipeline's shift_uint8 computes it as int8 and converts it back, a
    # CAST and a REQUANTIZE after the fused kernel)
    assert "depthwise_s8" in ops and "conv_integer" not in ops, ops
    assert out is DType.UINT8 or "requantize" not in ops, ops
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if kind == "scaled" and k > 1:  # the outputs spread over the range, not all clamped
        assert len(np.unique(want)) > 10


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_split_the_channels(threads: int) -> None:
    rng = np.random.default_rng(threads)
    x, w = _ints(rng, (2, 40, 28, 28)), _ints(rng, (40, 1, 3, 3))
    bias, a = _params(rng, 40, "scaled", DType.INT8)
    g = _graph(x.shape, w, 3, (1, 1), 1, 1, bias, a, DType.INT8)
    got, ops = _run(g, x, threads)
    assert "depthwise_s8" in ops
    np.testing.assert_array_equal(got, run(g, {"x": x})["y"])


def _unfused(rng: np.random.Generator, what: str) -> tuple[Graph, np.ndarray]:
    c = 6
    bias, a = _params(rng, c, "scaled", DType.INT8)
    x = _ints(rng, (1, c, 9, 9))
    if what == "groups":  # group 3 of 2 channels each: not depthwise
        g = _graph(x.shape, _ints(rng, (c, 2, 3, 3)), 3, (1, 1), 1, 1, bias, a, DType.INT8,
                   group=3)
    elif what == "channel multiplier":  # group = C, but two filters per channel
        xn = Node(Op.INPUT, DType.INT8, x.shape, attrs=InputAttrs(0), name="x")
        acc = _depthwise(xn, _ints(rng, (2 * c, 1, 3, 3)), 3, (1, 1), 1, 1, group=c)
        y = _mk(Op.REQUANTIZE, acc, attrs=RequantAttrs((77,), (9,), 1, -128, 127),
                dtype=DType.INT8)
        g = Graph((xn,), (y,), ("y",))
    elif what == "asymmetric pads":
        xn = Node(Op.INPUT, DType.INT8, x.shape, attrs=InputAttrs(0), name="x")
        at = ConvAttrs((3, 3), (2, 2), (0, 0, 1, 1), (1, 1), c)
        acc = _mk(Op.CONV_INTEGER, xn, const(_ints(rng, (c, 1, 3, 3)), "w"),
                  const(np.int8(0)), const(np.int8(0)), attrs=at)
        y = _mk(Op.REQUANTIZE, acc, const(bias, "b"), attrs=a, dtype=DType.INT8)
        g = Graph((xn,), (y,), ("y",))
    else:  # "two users": the accumulator is also a graph output
        xn = Node(Op.INPUT, DType.INT8, x.shape, attrs=InputAttrs(0), name="x")
        acc = _depthwise(xn, _ints(rng, (c, 1, 3, 3)), 3, (1, 1), 1, 1)
        y = _mk(Op.REQUANTIZE, acc, const(bias, "b"), attrs=a, dtype=DType.INT8)
        g = Graph((xn,), (y, acc), ("y", "acc"))
    return g, x


@pytest.mark.parametrize("what", ["groups", "channel multiplier", "asymmetric pads",
                                  "two users"])
def test_other_grouped_convolutions_take_the_generic_path(what: str) -> None:
    g, x = _unfused(np.random.default_rng(7), what)
    ex = GraphExecutor(lower_graph(optimize(g), "cpu", threads=2)[0])
    ex.set_input("x", x)
    ex.run()
    ops = {op for _, op, _, _ in ex.profile()}
    assert "depthwise_s8" not in ops and "conv_integer" in ops, ops
    want = run(g, {"x": x})
    for i, name in enumerate(g.output_names):
        np.testing.assert_array_equal(ex.get_output(i), want[name])
