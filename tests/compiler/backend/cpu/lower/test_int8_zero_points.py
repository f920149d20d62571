"""Asymmetric int8 on the fast CPU kernels: CONV_INTEGER / MATMUL_INTEGER with a non-zero input
zero point (int8 or uint8 activations, per tensor) and weight zero points that fold into int8
weights, + REQUANTIZE with any zero point, run as the int8 GEMM (`gemm_s8`) or the depthwise
kernel (`depthwise_s8`), bit for bit the reference interpreter (32-bit wrap-around included);
weight zero points that do not fold, and per-row input zero points, take the generic loops,
equally exact. Also the 8-bit max pooling kernel and the integer elementwise chains (a QDQ
residual add as one step)."""

from __future__ import annotations

import numpy as np
import pytest

from vtakit.compiler.backend.cpu.kernels import gemm as G
from vtakit.compiler.ir import DType, Graph, Node, Op, const, infer, run
from vtakit.compiler.ir import ops as o
from vtakit.compiler.lowering import lower_graph
from vtakit.runtime import GraphExecutor

I8, U8, I32 = DType.INT8, DType.UINT8, DType.INT32
FAST = {"gemm_s8", "depthwise_s8"}


def mk(op: Op, *src: Node, attrs: o.Attrs = o.NO_ATTRS, dtype: DType | None = None,
       name: str = "") -> Node:
    d, s = infer(op, src, attrs, dtype)
    return Node(op, d, s, tuple(src), attrs, name)


def _run(g: Graph, feeds: dict[str, np.ndarray], threads: int = 2
         ) -> tuple[list[np.ndarray], list[str]]:
    """The CPU backend's outputs and the ops of its steps, in order."""
    plan = lower_graph(g, "cpu", threads=threads)[0]
    ex = GraphExecutor(plan)
    for k, v in feeds.items():
        ex.set_input(k, v)
    ex.run()
    return [ex.get_output(i) for i in range(len(g.outputs))], [s.op for s in plan.steps]


def _check(g: Graph, feeds: dict[str, np.ndarray], threads: int = 2) -> list[str]:
    want = run(g, feeds)
    got, ops = _run(g, feeds, threads)
    for k, name in enumerate(g.output_names):
        assert got[k].dtype == want[name].dtype and got[k].shape == want[name].shape
        np.testing.assert_array_equal(got[k], want[name], err_msg=f"output {name}, {ops}")
    return ops


def _values(rng: np.random.Generator, dt: DType, shape: tuple[int, ...]) -> np.ndarray:
    """Values of `dt` with its extremes over-represented."""
    info = np.iinfo(dt.np)
    v = rng.integers(info.min, int(info.max) + 1, shape)
    u = rng.random(shape)
    return np.where(u < 0.1, info.min, np.where(u > 0.9, info.max, v)).astype(dt.np)


def _zero_point(rng: np.random.Generator, dt: DType) -> int:
    info = np.iinfo(dt.np)
    return int(rng.choice([0, info.min, info.max, int(rng.integers(info.min, int(info.max) + 1))]))


def _weights(rng: np.random.Generator, shape: tuple[int, ...], axis: int, fold: bool
             ) -> tuple[np.ndarray, np.ndarray]:
    """Weights (int8 or uint8) and zero points (0-d, or per channel along `axis`) whose
    differences fit int8 (`fold`) or do not."""
    dt = I8 if rng.random() < 0.6 else U8
    ch = shape[axis]
    per_channel = rng.random() < 0.5
    info = np.iinfo(dt.np)
    if not fold:  # one difference outside int8: 127 - (-128) or 255 - 0
        z = np.full(ch if per_channel else (), info.min, dt.np)
        w = _values(rng, dt, shape)
        w.reshape(-1)[0] = info.max
        return w, z
    # zero points such that w - z covers int8 where the weights' type allows it
    lo, hi = (-128, 127) if dt is I8 else (0, 127)
    z = rng.integers(lo, hi + 1, ch if per_channel else ()).astype(np.int64)
    zb = z.reshape([-1 if d == axis else 1 for d in range(len(shape))]) if per_channel else z
    d = rng.integers(-128, 128, shape)
    w = np.clip(d + zb, np.maximum(info.min, -128 + zb), np.minimum(info.max, 127 + zb))
    if rng.random() < 0.3:  # the extreme difference -128 present
        w.reshape(-1)[0] = max(info.min, int(np.asarray(zb).reshape(-1)[0]) - 128)
    return w.astype(dt.np), z.astype(dt.np)


def _requant(rng: np.random.Generator, acc: Node, axis: int) -> Node:
    """A REQUANTIZE of `acc` to int8, uint8 or int32 with a random zero point, bias,
    multipliers, shift and (sometimes) clamp; "wrap": any int32 bias and multiplier."""
    ch = acc.shape[axis]
    out = rng.choice([I8, I8, U8, I32])
    info = np.iinfo(out.np)
    wrap = rng.random() < 0.25
    if wrap:
        bias = rng.integers(-(1 << 31), 1 << 31, ch)
        mult = tuple(int(v) for v in rng.integers(-(1 << 31), 1 << 31, ch))
        shift: tuple[int, ...] = tuple(int(v) for v in rng.integers(0, 32, ch))
    else:
        bias = rng.integers(-(1 << 17), 1 << 17, ch)
        mult = tuple(int(v) for v in rng.integers(1, 1 << 15, ch))
        shift = (int(rng.integers(8, 20)),)
    clamp = tuple(int(v) for v in rng.integers(1, 1 << 18, ch)) if rng.random() < 0.3 else (0,)
    if out is I32:
        zp, lo, hi = int(rng.integers(-1000, 1000)), int(info.min), int(info.max)
    else:
        zp = int(rng.integers(info.min, int(info.max) + 1))
        lo = int(rng.integers(info.min, int(info.min) + 20))
        hi = int(rng.integers(int(info.max) - 20, int(info.max) + 1))
    a = o.RequantAttrs(mult, shift, axis, lo, hi, zp, clamp)
    src = (acc,) if rng.random() < 0.2 else (acc, const(bias.astype(np.int32), "bias"))
    return mk(Op.REQUANTIZE, *src, attrs=a, dtype=out, name="y")


def _random_conv(seed: int) -> tuple[Graph, dict[str, np.ndarray], bool]:
    """A random CONV_INTEGER + REQUANTIZE: batch, channels, size, kernel, stride, padding,
    dilation, dense or depthwise, activation type and zero point, weight zero points that
    fold (most) or not. Returns the graph, its input and whether the fast kernels take it."""
    rng = np.random.default_rng(seed)
    depthwise = rng.random() < 0.3
    while True:
        c = int(rng.choice([1, 3, 4, 8, 12, 16, 17, 32])) if not depthwise else \
            int(rng.integers(1, 24))
        cout = c if depthwise else int(rng.integers(1, 40))
        k = (int(rng.integers(1, 6)), int(rng.integers(1, 6)))
        if rng.random() < 0.5:
            k = (k[0], k[0])
        s = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        d = (1, 1) if rng.random() < 0.8 else (2, 2)
        p = (int(rng.integers(0, 3)), int(rng.integers(0, 3)))
        h, w = int(rng.integers(1, 24)), int(rng.integers(1, 40))
        oh = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
        ow = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
        if oh >= 1 and ow >= 1:
            break
    n = int(rng.integers(1, 3))
    xdt = I8 if rng.random() < 0.6 else U8
    fold = rng.random() < 0.85
    wv, wz = _weights(rng, (cout, 1 if depthwise else c, *k), 0, fold)
    x = Node(Op.INPUT, xdt, (n, c, h, w), attrs=o.InputAttrs(0), name="x")
    at = o.ConvAttrs(k, s, (*p, *p), d, c if depthwise else 1)
    acc = mk(Op.CONV_INTEGER, x, const(wv, "w"), const(np.array(_zero_point(rng, xdt),
                                                                 xdt.np)),
             const(wz, "wz"), attrs=at, name="acc")
    return Graph((x,), (_requant(rng, acc, 1),), ("y",)), {"x": _values(rng, xdt, x.shape)}, fold


def _portable_every_third(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every third case on the portable int8 GEMM (no VNNI), as cross-compiled code has it."""
    if seed % 3 == 2:
        monkeypatch.setattr(G, "default_vnni", lambda: False)


@pytest.mark.parametrize("seed", range(48))
def test_random_convolutions_are_exact(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    _portable_every_third(seed, monkeypatch)
    g, feeds, fold = _random_conv(seed)
    ops = _check(g, feeds, threads=1 + seed % 2)
    assert bool(FAST & set(ops)) == fold, ops
    assert ("conv_integer" in ops) != fold, ops


def _random_matmul(seed: int) -> tuple[Graph, dict[str, np.ndarray], bool]:
    rng = np.random.default_rng(1000 + seed)
    batch = [(), (2,), (3, 2)][int(rng.integers(0, 3))]
    m, k, nn = int(rng.integers(1, 40)), int(rng.integers(1, 300)), int(rng.integers(1, 90))
    xdt = I8 if rng.random() < 0.6 else U8
    fold = rng.random() < 0.85
    wv, wz = _weights(rng, (k, nn), 1, fold)
    x = Node(Op.INPUT, xdt, (*batch, m, k), attrs=o.InputAttrs(0), name="x")
    acc = mk(Op.MATMUL_INTEGER, x, const(wv, "w"), const(np.array(_zero_point(rng, xdt),
                                                                   xdt.np)),
             const(wz, "wz"), name="acc")
    y = _requant(rng, acc, acc.rank - 1)
    return Graph((x,), (y,), ("y",)), {"x": _values(rng, xdt, x.shape)}, fold


@pytest.mark.parametrize("seed", range(24))
def test_random_matrix_products_are_exact(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    _portable_every_third(seed, monkeypatch)
    g, feeds, fold = _random_matmul(seed)
    ops = _check(g, feeds, threads=1 + seed % 2)
    assert ("gemm_s8" in ops) == fold and ("matmul_integer" in ops) != fold, ops


# Layers of the sizes of ResNet-18 and MobileNetV2 (224x224): the blockings the lowering picks
# there (pixels as rows with a transposed store on 7x7 and 14x14 maps, im2col straight into
# the packed panels where the channels come in fours, the packer on 1x1 inputs).
LAYERS = [
    (3, 224, 224, 64, 7, 2, 3),
    (64, 56, 56, 64, 3, 1, 1),
    (64, 56, 56, 128, 3, 2, 1),
    (64, 56, 56, 128, 1, 2, 0),
    (128, 28, 28, 128, 3, 1, 1),
    (256, 14, 14, 256, 3, 1, 1),
    (512, 7, 7, 512, 3, 1, 1),
    (160, 7, 7, 960, 1, 1, 0),
    (96, 14, 14, 576, 1, 1, 0),
    (20, 7, 7, 36, 3, 1, 1),
    (4, 3, 1500, 8, 3, 1, 1),  # rows of more than 16 chunks: im2col loops over the inner ones
    (3, 4, 2100, 8, 3, 2, 2),
]


@pytest.mark.parametrize(("c", "h", "w", "cout", "k", "s", "p"), LAYERS,
                         ids=[f"{c}x{h}x{w}-{co}-k{k}s{s}p{p}" for c, h, w, co, k, s, p in LAYERS])
def test_network_layers_are_exact(c: int, h: int, w: int, cout: int, k: int, s: int,
                                  p: int) -> None:
    """Random activation types and zero points, folding weight zero points, random
    REQUANTIZEs; and the zero points QDQ models have after shift_uint8 (int8, -128)."""
    rng = np.random.default_rng(c * h + cout)
    for case in range(2):
        xdt = I8 if case == 0 else [I8, U8][int(rng.integers(0, 2))]
        zx = -128 if case == 0 else _zero_point(rng, xdt)
        x = Node(Op.INPUT, xdt, (1, c, h, w), attrs=o.InputAttrs(0), name="x")
        wv, wz = (_values(rng, I8, (cout, c, k, k)), np.int8(0)) if case == 0 else \
            _weights(rng, (cout, c, k, k), 0, True)
        acc = mk(Op.CONV_INTEGER, x, const(wv, "w"), const(np.array(zx, xdt.np)),
                 const(wz, "wz"), attrs=o.ConvAttrs((k, k), (s, s), (p,) * 4, (1, 1)),
                 name="acc")
        if case == 0:
            a = o.RequantAttrs(tuple(int(v) for v in rng.integers(100, 3000, cout)), (21,), 1,
                               -128, 127, -128 + int(rng.integers(0, 60)))
            y = mk(Op.REQUANTIZE, acc, const(rng.integers(-9999, 9999, cout).astype(np.int32)),
                   attrs=a, dtype=I8, name="y")
        else:
            y = _requant(rng, acc, 1)
        ops = _check(Graph((x,), (y,), ("y",)), {"x": _values(rng, xdt, x.shape)})
        assert "gemm_s8" in ops and "conv_integer" not in ops, ops


@pytest.mark.parametrize("op", ["matmul", "conv"])
def test_the_accumulator_wraps_as_int32(op: str) -> None:
    """Sums past int32: x - z_x near 255 and w = -128 over about 70000 terms, with the zero
    point's correction and a bias near the int32 limit wrapping too; the int32 REQUANTIZE
    (multiplier 1, shift 0) shows the wrapped accumulator."""
    rng = np.random.default_rng(5)
    if op == "matmul":
        x = Node(Op.INPUT, I8, (3, 70000), attrs=o.InputAttrs(0), name="x")
        w = np.full((70000, 17), -128, np.int8)
        w[:, 1] = 127
        acc = mk(Op.MATMUL_INTEGER, x, const(w, "w"), const(np.int8(-128)), const(np.int8(0)))
        ch = 17
    else:  # the centre pixel of a 3x3 image sees every input
        x = Node(Op.INPUT, I8, (1, 7800, 3, 3), attrs=o.InputAttrs(0), name="x")
        w = np.full((5, 7800, 3, 3), -128, np.int8)
        acc = mk(Op.CONV_INTEGER, x, const(w, "w"), const(np.int8(-128)), const(np.int8(0)),
                 attrs=o.ConvAttrs((3, 3), (1, 1), (1,) * 4, (1, 1)))
        ch = 5
    bias = np.full(ch, (1 << 31) - 7, np.int32)
    a = o.RequantAttrs((1,), (0,), 1, -(1 << 31), (1 << 31) - 1)
    y = mk(Op.REQUANTIZE, acc, const(bias, "b"), attrs=a, dtype=I32, name="y")
    xv = np.full(x.shape, 127, np.int8)
    xv.reshape(-1)[::50] = rng.integers(-128, 128, xv.size)[::50]
    first = xv[0] if op == "matmul" else xv
    exact = int(((first.astype(np.int64) + 128) * -128).sum())
    assert exact < -(1 << 31)  # the sum does leave int32
    ops = _check(Graph((x,), (y,), ("y",)), {"x": xv})
    assert "gemm_s8" in ops, ops


def test_per_row_input_zero_points_take_the_generic_matmul() -> None:
    rng = np.random.default_rng(3)
    x = Node(Op.INPUT, U8, (5, 30), attrs=o.InputAttrs(0), name="x")
    acc = mk(Op.MATMUL_INTEGER, x, const(_values(rng, I8, (30, 8)), "w"),
             const(rng.integers(0, 256, 5).astype(np.uint8), "xz"), const(np.int8(3)))
    y = mk(Op.REQUANTIZE, acc, attrs=o.RequantAttrs((1000,), (12,), 1, 0, 255, 7), dtype=U8)
    ops = _check(Graph((x,), (y,), ("y",)), {"x": _values(rng, U8, x.shape)})
    assert "matmul_integer" in ops and "gemm_s8" not in ops, ops


@pytest.mark.parametrize("dt", [I8, U8])
@pytest.mark.parametrize(("shape", "k", "s", "p"), [
    ((2, 3, 112, 112), 3, 2, 1), ((1, 5, 9, 13), 3, 1, 1), ((1, 2, 70, 130), 2, 2, 0),
    ((1, 4, 7, 7), 3, 2, 1), ((1, 3, 20, 33), 5, 3, 2), ((1, 2, 30, 100), 3, (1, 2), 1),
])
def test_8bit_max_pooling(dt: DType, shape, k: int, s, p: int) -> None:
    st = (s, s) if isinstance(s, int) else s
    x = Node(Op.INPUT, dt, shape, attrs=o.InputAttrs(0), name="x")
    y = mk(Op.MAX_POOL, x, attrs=o.PoolAttrs((k, k), st, (p,) * 4, (1, 1)), name="y")
    g = Graph((x,), (y,), ("y",))
    xv = _values(np.random.default_rng(sum(shape)), dt, shape)
    _check(g, {"x": xv})
    (step,) = lower_graph(g, "cpu")[0].steps
    assert step.calls[0].fname == "pool"  # the window kernel, not the generic loops


def _residual(rng: np.random.Generator, shape: tuple[int, ...], extra_output: bool) -> Graph:
    """QDQ's residual add as imported: REQUANTIZE(ADD(REQUANTIZE(CAST(a)), REQUANTIZE(CAST(b))),
    bias) to int8 with a zero point; multipliers large enough that the int32 products wrap."""
    a = Node(Op.INPUT, I8, shape, attrs=o.InputAttrs(0), name="a")
    b = Node(Op.INPUT, U8, shape, attrs=o.InputAttrs(1), name="b")

    def scale(v: Node, m: int) -> Node:
        wide = mk(Op.CAST, v, dtype=I32)
        return mk(Op.REQUANTIZE, wide, attrs=o.RequantAttrs((m,), (0,), 0, -(1 << 31),
                                                             (1 << 31) - 1), dtype=I32)

    sa, sb = scale(a, 23000), scale(b, 1 << 24)
    total = mk(Op.ADD, sa, sb, name="sum")
    ch = shape[1]
    y = mk(Op.REQUANTIZE, total, const(rng.integers(-(1 << 20), 1 << 20, ch).astype(np.int32)),
           attrs=o.RequantAttrs(tuple(int(v) for v in rng.integers(1, 9, ch)), (14,), 1, -128,
                                127, -5), dtype=I8, name="y")
    outs = (y, sa) if extra_output else (y,)
    return Graph((a, b), outs, ("y", "sa")[:len(outs)])


@pytest.mark.parametrize("extra_output", [False, True], ids=["chain", "intermediate-output"])
def test_integer_residual_chain_is_one_step(extra_output: bool) -> None:
    rng = np.random.default_rng(11)
    shape = (1, 6, 9, 11)
    g = _residual(rng, shape, extra_output)
    feeds = {"a": _values(rng, I8, shape), "b": _values(rng, U8, shape)}
    ops = _check(g, feeds)
    # the intermediate that is also an output keeps its own step; the rest is one program
    assert ops == (["requantize", "requantize"] if extra_output else ["requantize"]), ops


def _ort_qdq(model, calib: list[np.ndarray], tmp_path, act: str):
    """`model` as onnxruntime's examples quantise it: quant_pre_process, then quantize_static
    (QDQ, `act` activations, QInt8 per-channel weights)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    name = model.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([{name: x} for x in calib])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.samples, None)

    src, pre, out = tmp_path / "f.onnx", tmp_path / "p.onnx", tmp_path / "q.onnx"
    onnx.save(model, src)
    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=getattr(QuantType, act), weight_type=QuantType.QInt8,
                    per_channel=True)
    return onnx.load(out)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "act"), [("digits", "QUInt8"), ("digits", "QInt8"),
                                            ("mobilenet_v2", "QUInt8")])
def test_onnxruntime_quantised_models_run_on_the_fast_kernels(model: str, act: str,
                                                              tmp_path) -> None:
    """Every convolution and matrix product of an onnxruntime-quantised model on the int8
    GEMM or the depthwise kernel, the residual adds one step each, the outputs the
    interpreter's bit for bit."""
    pytest.importorskip("onnxruntime.quantization", reason="pip install 'vtakit[dev]'")
    from vtakit import digits, models
    from vtakit.compiler.frontend.onnx import import_onnx
    from vtakit.compiler.pipeline import optimize

    if model == "digits":
        m, shape = digits.load_model(), (1, 1, 8, 8)
    else:
        m, shape = models.mobilenet_v2(), (1, 3, 224, 224)
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    g = optimize(import_onnx(_ort_qdq(m, samples[:2], tmp_path, act)))
    name = g.inputs[0].name
    plan = lower_graph(g, "cpu", threads=2)[0]
    ops = [s.op for s in plan.steps]
    # (a CAST left: the global average pool's, which a REDUCE_SUM reads)
    assert not {"conv_integer", "matmul_integer", "add"} & set(ops), ops
    assert FAST & set(ops)
    ex = GraphExecutor(plan)
    for x in samples[1:]:
        ex.set_input(name, x)
        ex.run()
        (want,) = run(g, {name: x}).values()
        np.testing.assert_array_equal(ex.get_output(0), want)
