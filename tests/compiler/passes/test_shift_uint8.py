"""shift_uint8: uint8 activations become int8 with their zero points - 128, bit for bit the same
results; each case a small graph against the hand-written graph it must become."""

from __future__ import annotations

import numpy as np
import pytest

from vtakit.compiler.ir import DType, Graph, Node, Op, run, verify
from vtakit.compiler.ir import ops as o
from vtakit.compiler.ir.ops import const
from vtakit.compiler.passes import shift_uint8

U8, I8, I32, F32 = DType.UINT8, DType.INT8, DType.INT32, DType.FLOAT32
FULL = (-(1 << 31), (1 << 31) - 1)
CONV = o.ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))


def _rq(ir, x, *bias, m=(77,), s=(9,), lo=-128, hi=127, zp=0, dtype=I8, axis=1):
    return ir.node(Op.REQUANTIZE, x, *bias, attrs=o.RequantAttrs(m, s, axis, lo, hi, zp),
                   dtype=dtype)


def _q(ir, x, z, dtype):
    return ir.node(Op.QUANTIZE_LINEAR, x, const(np.float32(0.05)), const(z, dtype=dtype),
                   attrs=o.AxisAttrs(1))


def _to(ir, x, dtype):
    """The pass's exact conversion between uint8 and int8 (x -/+ 128)."""
    wide = ir.node(Op.CAST, x, dtype=I32)
    if dtype is I8:
        return _rq(ir, wide, m=(1,), s=(0,), lo=-128, hi=127, zp=-128, axis=0)
    return _rq(ir, wide, m=(1,), s=(0,), lo=0, hi=255, zp=128, dtype=U8, axis=0)


def _feeds(g: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs over their whole range: every byte value, accumulators past every clamp, floats
    that saturate."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in g.inputs:
        if n.dtype.is_float:
            out[n.name] = (rng.standard_normal(n.shape) * 8).astype(n.dtype.np)
        else:
            info = np.iinfo(n.dtype.np)
            lo, hi = max(info.min, -(1 << 20)), min(info.max, 1 << 20)
            out[n.name] = rng.integers(lo, hi, n.shape, endpoint=True).astype(n.dtype.np)
    return out


def _check(before: Graph, expected: Graph) -> Graph:
    verify(before)
    verify(expected)
    after = verify(shift_uint8(before))
    assert after.structurally_equal(expected), f"got:\n{after}\nexpected:\n{expected}"
    for seed in range(3):
        feeds = _feeds(before, seed)
        want, got = run(before, feeds), run(after, feeds)
        for k in want:
            assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
    return after


def _w(seed: int = 0, shape=(6, 4, 3, 3)) -> Node:
    return const(np.random.default_rng(seed).integers(-127, 128, shape).astype(np.int8))


def test_quantize_into_a_convolution(ir):
    """Q(x) uint8 with z = 3 -> CONV_INTEGER(x, w, 3, 0): int8 with z = -125 on both."""
    x = ir.inp("x", (1, 4, 6, 6))
    w, zw = _w(), const(np.int8(0))
    acc = ir.node(Op.CONV_INTEGER, _q(ir, x, 3, U8), w, const(np.uint8(3)), zw, attrs=CONV)
    before = Graph((x,), (acc,), ("y",))
    acc2 = ir.node(Op.CONV_INTEGER, _q(ir, x, -125, I8), w, const(np.int8(-125)), zw,
                   attrs=CONV)
    _check(before, Graph((x,), (acc2,), ("y",)))


def test_requantize_max_pool_dequantize(ir):
    """REQUANTIZE to uint8 (z 10, [10, 200]) -> MAX_POOL -> DQ: int8, z -118, [-118, 72]."""
    acc = ir.inp("acc", (1, 4, 6, 6), dtype=I32)
    pool = o.PoolAttrs((2, 2), (2, 2), (1, 1, 1, 1), (1, 1))
    scale = const(np.float32(0.1))

    def chain(dtype, z, lo, hi):
        r = _rq(ir, acc, lo=lo, hi=hi, zp=z, dtype=dtype)
        p = ir.node(Op.MAX_POOL, r, attrs=pool)
        return ir.node(Op.DEQUANTIZE_LINEAR, p, scale, const(z, dtype=dtype),
                       attrs=o.AxisAttrs(1))

    before = Graph((acc,), (chain(U8, 10, 10, 200),), ("y",))
    _check(before, Graph((acc,), (chain(I8, -118, -118, 72),), ("y",)))


def test_quantised_add_carries_the_shift_into_the_sum_bias(ir):
    """QDQ's Add: each operand widened and multiplied (shift 0, int32), ADD, REQUANTIZE with
    bias -(za ma + zb mb): the +128 of each CAST reaches that bias as 128 (ma + mb)."""
    a, b = ir.inp("a", (1, 3, 4, 4)), ir.inp("b", (1, 3, 4, 4), 1)
    ma, mb, za, zb = 300, 500, 100, 140

    def add(dtype, za, zb, bias):
        terms = [_rq(ir, ir.node(Op.CAST, _q(ir, x, z, dtype), dtype=I32), m=(m,), s=(0,),
                     lo=FULL[0], hi=FULL[1], dtype=I32)
                 for x, z, m in ((a, za, ma), (b, zb, mb))]
        total = ir.node(Op.ADD, *terms)
        return _rq(ir, total, const(np.full(3, bias, np.int32)), m=(1,), s=(10,),
                   lo=-128, hi=127, zp=-128, dtype=I8)

    before = Graph((a, b), (add(U8, za, zb, -(za * ma + zb * mb)),), ("y",))
    expected = add(I8, za - 128, zb - 128, -((za - 128) * ma + (zb - 128) * mb))
    _check(before, Graph((a, b), (expected,), ("y",)))


def test_global_average_pool_and_a_rescale_whose_bias_vanishes(ir):
    """From one Q of zero point 128: REDUCE_SUM(CAST(x)) over 16 cells with bias -z * 16, and a
    rescale REQUANTIZE(CAST(x)) with bias -z: both biases become 0 and are dropped."""
    x = ir.inp("x", (1, 3, 4, 4))
    total = o.ReduceAttrs((2, 3), True)

    def graph(dtype, z):
        q = _q(ir, x, z, dtype)
        s = ir.node(Op.REDUCE_SUM, ir.node(Op.CAST, q, dtype=I32), attrs=total)
        bias = [const(np.full(3, -z * 16, np.int32))] if z else []
        pooled = _rq(ir, s, *bias, m=(5,), s=(7,))
        bias = [const(np.full(3, -z, np.int32))] if z else []
        rescaled = _rq(ir, ir.node(Op.CAST, q, dtype=I32), *bias, m=(3,), s=(2,))
        return pooled, rescaled

    _check(Graph((x,), graph(U8, 128), ("p", "r")), Graph((x,), graph(I8, 0), ("p", "r")))


def test_global_average_pool_bias_gets_128_times_the_window(ir):
    """Zero point 100 over a 4x4 window: bias -1600 becomes -(100 - 128) * 16 = 448; a
    REQUANTIZE without a bias gets one of 128."""
    x = ir.inp("x", (1, 3, 4, 4))
    total = o.ReduceAttrs((2, 3), True)

    def graph(dtype, z, bias, plain_bias):
        q = _q(ir, x, z, dtype)
        s = ir.node(Op.REDUCE_SUM, ir.node(Op.CAST, q, dtype=I32), attrs=total)
        pooled = _rq(ir, s, const(np.full(3, bias, np.int32)), m=(5,), s=(7,))
        rescaled = _rq(ir, ir.node(Op.CAST, q, dtype=I32), *plain_bias, m=(3,), s=(2,))
        return pooled, rescaled

    before = Graph((x,), graph(U8, 100, -1600, []), ("p", "r"))
    expected = graph(I8, -28, 448, [const(np.full(3, 128, np.int32))])
    _check(before, Graph((x,), expected, ("p", "r")))


def test_uint8_graph_input_and_output_keep_their_type(ir):
    """A uint8 input reaches CONV_INTEGER through REQUANTIZE(CAST(x), 1, 0, zp -128); a uint8
    output is made back from int8 with zero point +128."""
    x = ir.inp("x", (1, 4, 6, 6), dtype=U8)
    w, zw = _w(1), const(np.int8(0))
    acc = ir.node(Op.CONV_INTEGER, x, w, const(np.uint8(120)), zw, attrs=CONV)
    before = Graph((x,), (_rq(ir, acc, lo=0, hi=255, zp=7, dtype=U8),), ("y",))
    acc2 = ir.node(Op.CONV_INTEGER, _to(ir, x, I8), w, const(np.int8(-8)), zw, attrs=CONV)
    y = _to(ir, _rq(ir, acc2, lo=-128, hi=127, zp=-121), U8)
    _check(before, Graph((x,), (y,), ("y",)))


def test_uint8_weights_and_activation_times_activation(ir):
    """MATMUL_INTEGER: uint8 CONST weights (zw 130) become w - 128, zw 2; a uint8 activation
    as the right operand is its int8 form with its zero point - 128."""
    a, b = ir.inp("a", (2, 8)), ir.inp("b", (8, 5), 1)
    wv = np.random.default_rng(2).integers(0, 256, (8, 5)).astype(np.uint8)

    def graph(dtype, k, w, zw):
        qa, za = _q(ir, a, 9 - k, dtype), const(9 - k, dtype=dtype)
        return (ir.node(Op.MATMUL_INTEGER, qa, w, za, const(zw, dtype=dtype)),
                ir.node(Op.MATMUL_INTEGER, qa, _q(ir, b, 200 - k, dtype), za,
                        const(200 - k, dtype=dtype)))

    before = Graph((a, b), graph(U8, 0, const(wv), 130), ("y", "z"))
    expected = graph(I8, 128, const((wv.astype(np.int16) - 128).astype(np.int8)), 2)
    _check(before, Graph((a, b), expected, ("y", "z")))


def test_movement_clip_relu_pad_concat(ir):
    """PAD's constant and CLIP's bounds shift; RELU (the identity on uint8) becomes IDENTITY;
    CONCAT of a rewritten value and a uint8 input converts the input."""
    x, u = ir.inp("x", (1, 2, 4, 4)), ir.inp("u", (1, 2, 4, 4), 1, dtype=U8)

    def graph(dtype, k):
        q = _q(ir, x, 128 - k, dtype)
        p = ir.node(Op.PAD, q, attrs=o.PadAttrs((0, 0, 1, 1, 0, 0, 1, 1), value=float(17 - k)))
        c = ir.node(Op.CLIP, p, attrs=o.ClipAttrs(float(20 - k), float(240 - k)))
        r = ir.node(Op.IDENTITY if k else Op.RELU, c)
        s = ir.node(Op.SLICE, r, attrs=o.SliceAttrs((0, 0, 1, 1), (1, 2, 5, 5), (1, 1, 1, 1)))
        cat = ir.node(Op.CONCAT, s, _to(ir, u, I8) if k else u, attrs=o.AxisAttrs(1))
        zp = const(128 - k, dtype=dtype)
        return ir.node(Op.DEQUANTIZE_LINEAR, cat, const(np.float32(0.5)), zp,
                       attrs=o.AxisAttrs(1))

    _check(Graph((x, u), (graph(U8, 0),), ("y",)), Graph((x, u), (graph(I8, 128),), ("y",)))


def test_the_shift_on_an_int32_value_nothing_absorbs_is_added_explicitly(ir):
    """CAST(x) to int32, times 3 (carried: + 384), read by a SHL and an output: ADD(MUL(
    CAST(x'), 3), 384) before them."""
    x = ir.inp("x", (1, 3, 4, 4))
    three, one = const(np.int32(3)), const(np.int32(1))

    def graph(dtype, z, k):
        y = ir.node(Op.MUL, ir.node(Op.CAST, _q(ir, x, z, dtype), dtype=I32), three)
        y = ir.node(Op.ADD, y, const(np.int32(k))) if k else y
        return Graph((x,), (ir.node(Op.SHL, y, one), y), ("y", "z"))

    _check(graph(U8, 5, 0), graph(I8, -123, 384))


def test_foreign_readers_get_the_uint8_value_back(ir):
    """A float CAST of a requantised uint8 value reads it converted back (the REQUANTIZE is
    int8 whatever reads it: that is what the accelerator writes); a QUANTIZE_LINEAR that only
    such an op reads stays uint8."""
    acc, x = ir.inp("acc", (1, 3, 4, 4), dtype=I32), ir.inp("x", (1, 3, 4, 4), 1)
    q = ir.node(Op.CAST, _q(ir, x, 5, U8), dtype=F32)
    before = Graph((acc, x), (ir.node(Op.CAST, _rq(ir, acc, lo=0, hi=255, zp=5, dtype=U8),
                                      dtype=F32), q), ("y", "z"))
    r = _rq(ir, acc, lo=-128, hi=127, zp=-123)
    expected = Graph((acc, x), (ir.node(Op.CAST, _to(ir, r, U8), dtype=F32), q), ("y", "z"))
    _check(before, expected)


@pytest.mark.skipif("pre_shift" not in o.RequantAttrs.__dataclass_fields__,
                    reason="RequantAttrs has no pre_shift in this tree")
def test_a_pre_shifted_requantize_takes_the_128_only_where_exact(ir):
    """A pre-shift divides acc + bias exactly (not modulo 2**32): the bias takes the +128 of a
    widened byte (+128 * 16 of a sum of 16) where the sum fits int32; otherwise (a bias at the
    limit) an explicit ADD comes first."""
    x = ir.inp("x", (1, 3, 4, 4))

    def rq(src, bias):
        attrs = o.RequantAttrs((3,), (2,), 1, -128, 127, pre_shift=(8,))
        return ir.node(Op.REQUANTIZE, src, const(np.full(3, bias, np.int32)), attrs=attrs,
                       dtype=I8)

    def graph(dtype, z):
        wide = ir.node(Op.CAST, _q(ir, x, z, dtype), dtype=I32)
        plus = ir.node(Op.ADD, wide, const(np.int32(128))) if dtype is I8 else wide
        total = ir.node(Op.REDUCE_SUM, wide, attrs=o.ReduceAttrs((2, 3), True))
        k = 128 if dtype is I8 else 0
        return (rq(wide, 1000 + k), rq(plus, 2 ** 31 - 100), rq(total, -5000 + 16 * k))

    names = ("a", "b", "c")
    _check(Graph((x,), graph(U8, 30), names), Graph((x,), graph(I8, -98), names))


def test_a_scalar_is_converted_as_one_element(ir):
    """A scalar uint8 output of a rewritten Q: RESHAPE to (1,), the conversion, RESHAPE back."""
    x = ir.inp("x", ())

    def dq(q, dtype, z):
        return ir.node(Op.DEQUANTIZE_LINEAR, q, const(np.float32(0.05)), const(z, dtype=dtype),
                       attrs=o.AxisAttrs(0))

    q = ir.node(Op.QUANTIZE_LINEAR, x, const(np.float32(0.05)), const(np.uint8(30)),
                attrs=o.AxisAttrs(0))
    before = Graph((x,), (dq(q, U8, 30), q), ("y", "q"))
    q2 = ir.node(Op.QUANTIZE_LINEAR, x, const(np.float32(0.05)), const(np.int8(-98)),
                 attrs=o.AxisAttrs(0))
    back = ir.node(Op.RESHAPE, _to(ir, ir.node(Op.RESHAPE, q2, shape=(1,)), U8), shape=())
    _check(before, Graph((x,), (dq(q2, I8, -98), back), ("y", "q")))


def test_left_alone_where_it_would_not_be_exact(ir):
    """A REQUANTIZE with shift 0 on an unbounded accumulator (t + z could wrap differently),
    a CLIP with a fractional bound and a graph without uint8 keep their form."""
    acc = ir.inp("acc", (1, 4, 2, 2), dtype=I32)
    r = _rq(ir, acc, m=(3,), s=(0,), lo=0, hi=255, zp=9, dtype=U8)
    wrap = Graph((acc,), (r,), ("y",))
    assert shift_uint8(wrap).structurally_equal(wrap)
    x = ir.inp("x", (1, 4, 2, 2))
    clip = ir.node(Op.CLIP, _q(ir, x, 9, U8), attrs=o.ClipAttrs(0.5, 200.0))
    frac = Graph((x,), (ir.node(Op.RESHAPE, clip, shape=(16,)),), ("y",))
    assert shift_uint8(frac).structurally_equal(frac)
    plain = Graph((acc,), (_rq(ir, acc),), ("y",))
    assert shift_uint8(plain) is plain


@pytest.mark.parametrize("shift, clamp, widened", [
    (0, 0, True), (0, 1000, False), (1, 0, False), (9, 0, False), (20, 5000, False)])
def test_requantize_to_uint8_exhaustively(ir, shift, clamp, widened):
    """Every accumulator around the clamps, the bounds and the int32 wrap: the int8 form + 128
    equals the uint8 result (with shift 0 only where the accumulator is bounded: a widened
    byte, or a clamp)."""
    x = ir.inp("x", (1, 4, 256, 64), dtype=U8 if widened else I32)
    src = ir.node(Op.CAST, x, dtype=I32) if widened else x
    big = 300 if widened else 2 ** 31 - 200  # a bias that wraps the sum
    bias = const(np.array([-100, 0, 7, big], np.int32))
    attrs = o.RequantAttrs((7, -3, 12897, 1), (shift,), 1, 3, 250, 121, (clamp,))
    r = ir.node(Op.REQUANTIZE, src, bias, attrs=attrs, dtype=U8)
    before = Graph((x,), (ir.node(Op.MAX_POOL, r, attrs=o.PoolAttrs((1, 1), (1, 1), (0,) * 4,
                                                                    (1, 1))),), ("y",))
    after = verify(shift_uint8(before))
    out = after.outputs[0]  # converted back at the output only
    assert out.dtype is U8 and out.src[0].src[0].dtype is I8, after
    assert sum(n.dtype is U8 and n.op is not Op.INPUT for n in after.nodes) == 1
    edge = np.array([-(1 << 31), (1 << 31) - 1, -(1 << 30), 1 << 30], np.int64)
    vals = np.concatenate([np.arange(-8192, 8192), edge, edge - 300, edge + 300])
    vals = np.concatenate([vals, np.random.default_rng(0).integers(-(1 << 31), 1 << 31,
                                                                   x.size - vals.size)])
    feed = np.resize(np.arange(256), vals.size) if widened else (
        (vals + (1 << 31)) % (1 << 32) - (1 << 31))
    feeds = {"x": feed.astype(x.dtype.np).reshape(x.shape)}
    assert np.array_equal(run(after, feeds)["y"], run(before, feeds)["y"])
