"""Packed int8 GEMM (`gemm_s8`): exactly the accelerator's integers.

The reference multiplies in int64 and emulates the epilogue on int32 with wrap-around
(``astype(np.int32)`` of int64 values keeps them modulo 2^32).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vtakit.compiler.backend.cpu.kernels import gemm as G
from vtakit.runtime.cpu import llvm

RNG = np.random.default_rng(0)
I32 = np.iinfo(np.int32)


def wrap(x):
    return np.asarray(x, np.int64).astype(np.int32).astype(np.int64)


def reference(a, w, bias=None, mult=None, shift=None, lo=-128, hi=127, requant=True,
              clamp=None):
    """acc[M, N] = a[M, K] @ w[K, N], then the epilogue per column n."""
    n = w.shape[1]
    acc = wrap(a.astype(np.int64) @ w.astype(np.int64))
    t = wrap(acc + (0 if bias is None else np.asarray(bias, np.int64)))
    if not requant:
        return t.astype(np.int32)
    m = np.broadcast_to(np.asarray(1 if mult is None else mult, np.int64), (n,))
    s = np.broadcast_to(np.asarray(0 if shift is None else shift, np.int64), (n,))
    c = np.broadcast_to(np.asarray(0 if clamp is None else clamp, np.int64), (n,))
    t = np.where(c > 0, np.clip(t, -c, c), t)
    t = wrap(t * m)
    t = wrap(t + np.where(s > 0, np.left_shift(1, np.maximum(s - 1, 0)), 0))
    return np.clip(t >> s, lo, hi)


def run(a, w, weights, vnni, **kw):
    """gemm_s8 of ``a [M, K] @ w [K, N]`` with the weights on side `weights` ("a": computes
    the transposed product, channels as rows, and transposes back)."""
    if weights == "b":
        packed = G.pack_s8_weights(w, G.S8Config(weights="b"))
        return G.gemm_s8(a, packed, vnni=vnni, **kw)
    packed = G.pack_s8_weights(np.ascontiguousarray(w.T), G.S8Config(weights="a"), "nk")
    return G.gemm_s8(np.ascontiguousarray(a.T), packed, vnni=vnni, **kw).T


@pytest.fixture(params=[True, False], ids=["vnni", "portable"])
def vnni(request):
    if request.param and not G.default_vnni():
        pytest.skip("needs AVX-512 VNNI (host_has('avx512vnni') is False on this CPU)")
    return request.param


def ints(shape, lo=-128, hi=127):
    return RNG.integers(lo, hi + 1, shape, dtype=np.int8)


SHAPES = [(1, 1, 1), (1, 3, 1), (7, 3, 33), (17, 1, 5), (1, 70, 100), (33, 17, 70),
          (9, 4608, 33), (64, 64, 64), (50, 5, 97)]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("weights", ["b", "a"])
def test_requant_int8(m, k, n, weights, vnni):
    a, w = ints((m, k)), ints((k, n))
    bias = RNG.integers(I32.min, I32.max, n, endpoint=True)
    mult = RNG.integers(-(1 << 20), 1 << 20, n)
    shift = RNG.integers(0, 32, n)
    got = run(a, w, weights, vnni, bias=bias, multiplier=mult, shift=shift, lo=-100, hi=90)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, reference(a, w, bias, mult, shift, -100, 90))
    # with a clamp on most channels (0: none on a few), small enough to bite
    clamp = RNG.integers(0, 1 << 18, n) * (RNG.random(n) < 0.8)
    got = run(a, w, weights, vnni, bias=bias % 1000, multiplier=mult, shift=shift, clamp=clamp,
              lo=-100, hi=90)
    np.testing.assert_array_equal(got, reference(a, w, bias % 1000, mult, shift, -100, 90,
                                                 clamp=clamp))


@pytest.mark.parametrize("m,k,n", SHAPES[:6])
@pytest.mark.parametrize("weights", ["b", "a"])
def test_int32_outputs(m, k, n, weights, vnni):
    a, w = ints((m, k)), ints((k, n))
    plain = run(a, w, weights, vnni, out_dtype=np.int32)
    assert plain.dtype == np.int32
    np.testing.assert_array_equal(plain, a.astype(np.int32) @ w.astype(np.int32))
    bias = RNG.integers(I32.min, I32.max, n, endpoint=True)
    np.testing.assert_array_equal(run(a, w, weights, vnni, bias=bias, out_dtype=np.int32),
                                  reference(a, w, bias, requant=False))
    mult, shift = RNG.integers(I32.min, I32.max, n), RNG.integers(0, 32, n)
    got = run(a, w, weights, vnni, bias=bias, multiplier=mult, shift=shift,
              lo=-(1 << 20), hi=I32.max, out_dtype=np.int32)
    np.testing.assert_array_equal(got, reference(a, w, bias, mult, shift, -(1 << 20), I32.max))


@pytest.mark.parametrize("weights", ["b", "a"])
def test_extremes(weights, vnni):
    """-128 × -128 over K = 4608, multipliers that wrap, shifts 0 and 31, both clamps, the
    saturating clamps at 1 and the int32 limit."""
    k, n = 4608, 35
    a, w = np.full((3, k), -128, np.int8), np.full((k, n), -128, np.int8)
    a[1] = 127
    w[:, 1::3] = 127
    np.testing.assert_array_equal(run(a, w, weights, vnni, out_dtype=np.int32),
                                  a.astype(np.int32) @ w.astype(np.int32))
    mult = np.resize(np.array([I32.max, I32.min, -1, 1 << 16, 3], np.int64), n)
    shift = np.resize(np.array([0, 31, 1, 16, 30, 7], np.int64), n)
    bias = np.resize(np.array([I32.max, I32.min, 0, -5], np.int64), n)
    clamp = np.resize(np.array([0, 1, I32.max, 1 << 20, 12345, 0, 7], np.int64), n)
    for lo, hi in [(-128, 127), (-3, 5), (0, 0)]:
        got = run(a, w, weights, vnni, bias=bias, multiplier=mult, shift=shift, lo=lo, hi=hi)
        np.testing.assert_array_equal(got, reference(a, w, bias, mult, shift, lo, hi))
        got = run(a, w, weights, vnni, bias=bias, multiplier=mult, shift=shift, lo=lo, hi=hi,
                  clamp=clamp)
        np.testing.assert_array_equal(got, reference(a, w, bias, mult, shift, lo, hi,
                                                     clamp=clamp))


def test_accumulator_wraps_like_int32(vnni):
    """K = 131076 products of -128 × -128 exceed 2^31: the sum wraps like the int32 ALU."""
    k = 131076
    a, w = np.full((2, k), -128, np.int8), np.full((k, 3), -128, np.int8)
    a[1, ::2] = 127
    got = run(a, w, "b", vnni, out_dtype=np.int32)
    np.testing.assert_array_equal(got, wrap(a.astype(np.int64) @ w.astype(np.int64)))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("weights", ["b", "a"])
@pytest.mark.parametrize("m,k,n", [(70, 300, 200), (300, 64, 30), (5, 33, 400)])
def test_threads(threads, weights, m, k, n, vnni):
    a, w = ints((m, k)), ints((k, n))
    bias, mult = RNG.integers(-1000, 1000, n), RNG.integers(1, 1 << 12, n)
    got = run(a, w, weights, vnni, bias=bias, multiplier=mult, shift=14, threads=threads)
    np.testing.assert_array_equal(got, reference(a, w, bias, mult, 14))


@pytest.mark.parametrize("cfg", [G.S8Config(mr=4, nr=64, mc=8, unroll=3),
                                 G.S8Config(mr=16, nr=16, weights="a"),
                                 G.S8Config(mr=3, nr=48, mc=9, unroll=1, weights="a")])
def test_other_blockings(cfg, vnni):
    a, w = ints((37, 70)), ints((70, 101))
    if cfg.weights == "b":
        got = G.gemm_s8(a, G.pack_s8_weights(w, cfg), shift=3, vnni=vnni, threads=2)
    else:
        got = G.gemm_s8(np.ascontiguousarray(a.T), G.pack_s8_weights(
            np.ascontiguousarray(w.T), cfg, "nk"), shift=3, vnni=vnni, threads=2).T
    np.testing.assert_array_equal(got, reference(a, w, shift=3))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_epilogue_property(data):
    """Any int32 bias / multiplier, any shift and bounds: kernel == reference (both variants)."""
    n = data.draw(st.integers(1, 40), label="n")
    k = data.draw(st.integers(1, 9), label="k")
    bias = data.draw(hnp.arrays(np.int64, n, elements=st.integers(I32.min, I32.max)))
    mult = data.draw(hnp.arrays(np.int64, n, elements=st.integers(I32.min, I32.max)))
    shift = data.draw(hnp.arrays(np.int64, n, elements=st.integers(0, 31)))
    lo = data.draw(st.integers(-128, 127), label="lo")
    hi = data.draw(st.integers(lo, 127), label="hi")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (3, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    want = reference(a, w, bias, mult, shift, lo, hi)
    for vnni in [False] + ([True] if G.default_vnni() else []):
        for weights in "ba":
            got = run(a, w, weights, vnni, bias=bias, multiplier=mult, shift=shift, lo=lo,
                      hi=hi)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("weights", ["b", "a"])
def test_packing(layout, weights):
    """The run-time packers (xor 0) lay data out as `pack_s8_weights`; xor 0x80 flips every
    byte (the padding of activations is multiplied by zero weights, so any value works)."""
    k, n = 11, 37
    w = ints((k, n))
    cfg = G.S8Config(weights=weights)
    src = w if layout == "kn" else np.ascontiguousarray(w.T)
    packed = G.pack_s8_weights(src, cfg, layout)
    np.testing.assert_array_equal(packed.wsum[:n], w.astype(np.int64).sum(axis=0))
    assert packed.data.ctypes.data % 64 == 0
    name = "pack_b_s8" if weights == "b" else "pack_a_s8"
    fn = G.s8_kernels(cfg).cfunc(name, None, *G.S8_PACK_ARGS)
    s_row, s_k = (1, n) if layout == "kn" else (k, 1)  # channel stride, k stride
    for xor in (0, 0x80):
        out = np.full_like(packed.data, 99)
        fn(src.ctypes.data, out.ctypes.data, n, k, s_row, s_k, 0, out.shape[0], xor)
        np.testing.assert_array_equal(out, packed.data ^ np.int8(-128 if xor else 0))


@pytest.mark.parametrize("weights", ["b", "a"])
def test_packing_strided_source(weights):
    """Neither stride 1 (every other column of a wider array): the byte-by-byte path."""
    k, n = 13, 21
    big = ints((n, 2 * k))
    cfg = G.S8Config(weights=weights)
    packed = G.pack_s8_weights(np.ascontiguousarray(big[:, ::2]), cfg, "nk")
    out = np.full_like(packed.data, 99)
    fn = G.s8_kernels(cfg).cfunc("pack_b_s8" if weights == "b" else "pack_a_s8", None,
                                 *G.S8_PACK_ARGS)
    fn(big.ctypes.data, out.ctypes.data, n, k, 2 * k, 2, 0, out.shape[0], 0x80)
    np.testing.assert_array_equal(out, packed.data ^ np.int8(-128))


@pytest.mark.parametrize("weights", ["b", "a"])
def test_module_function_on_tile_ranges(weights, vnni):
    """What the lowering calls: the module's ``gemm_s8`` on [lo, hi) ranges of column panels,
    into an output with a row stride larger than N."""
    m, k, n = 21, 45, 70
    a, w = ints((m, k)), ints((k, n))
    cfg = G.S8Config(mr=4, nr=16, mc=8, weights=weights)
    if weights == "b":
        packed, x, (mm, nn) = G.pack_s8_weights(w, cfg), a, (m, n)
    else:
        packed = G.pack_s8_weights(np.ascontiguousarray(w.T), cfg, "nk")
        x, (mm, nn) = np.ascontiguousarray(a.T), (n, m)
    act = G.pack_s8_activations(x, cfg)
    params = G.s8_channel_params(packed, 7, 3, 2, 500)
    ap, bp = (act, packed.data) if weights == "b" else (packed.data, act)
    assert params.clamped
    fn = G.s8_kernels(cfg, "requant", 8, vnni, clamp=True).cfunc("gemm_s8", None,
                                                                 *G.S8_MACRO_ARGS)
    big = np.full((mm, nn + 5), 99, np.int8)
    nt = -(-nn // cfg.nr)
    for lo, hi in [(0, 1), (1, nt)]:
        fn(ap.ctypes.data, bp.ctypes.data, big.ctypes.data, *(p.ctypes.data for p in params),
           mm, nn, k, nn + 5, 0, -(-mm // cfg.mr), lo, hi, -128, 127, 0)
    want = reference(a, w, 7, 3, 2, clamp=500)
    np.testing.assert_array_equal(big[:, :nn], want if weights == "b" else want.T)
    assert (big[:, nn:] == 99).all()
    assert G.S8_MACRO_SIG == "pppppppp" + "l" * 11 and len(G.S8_MACRO_ARGS) == 19


def test_variant_is_a_builder_parameter():
    cfg = G.S8Config()
    assert "vpdpbusd" in str(G.build_s8_module(cfg, "requant", 8, vnni=True))
    assert "llvm.x86" not in str(G.build_s8_module(cfg, "requant", 8, vnni=False))


@pytest.mark.parametrize("weights", ["b", "a"])
@pytest.mark.parametrize("epilogue,out_bits,clamp", [("bias", 32, False), ("requant", 8, False),
                                                     ("requant", 32, False), ("requant", 8, True)])
def test_portable_emits_aarch64(weights, epilogue, out_bits, clamp):
    module = G.build_s8_module(G.S8Config(weights=weights), epilogue, out_bits, vnni=False,
                               clamp=clamp)
    obj = llvm.emit_object(module, llvm.AARCH64_TRIPLE)
    assert obj[:4] == b"\x7fELF" and int.from_bytes(obj[18:20], "little") == 183  # EM_AARCH64


def test_choose_config():
    assert G.choose_s8_config(64, 3136, "a") == G.S8Config(weights="a")
    assert G.choose_s8_config(1000, 1).mr == 4  # one row: the 4-row blocking pads least
    cfg = G.choose_s8_config(49, 512, "b")
    assert cfg.weights == "b" and cfg.mc % cfg.mr == 0


def test_empty_and_k_zero():
    w = np.zeros((0, 5), np.int8)
    got = G.gemm_s8(np.zeros((3, 0), np.int8), G.pack_s8_weights(w), bias=np.arange(5) * 70,
                    multiplier=2, shift=1)
    np.testing.assert_array_equal(got, np.clip(np.arange(5) * 70, -128, 127)[None].repeat(3, 0))
    assert G.gemm_s8(np.zeros((0, 4), np.int8), G.pack_s8_weights(ints((4, 5)))).shape == (0, 5)


def test_errors():
    packed = G.pack_s8_weights(ints((4, 6)))
    a = ints((3, 4))
    with pytest.raises(TypeError, match="gemm_s8: a: expected dtype int8, got int16"):
        G.gemm_s8(a.astype(np.int16), packed)
    with pytest.raises(ValueError, match=r"a has shape \(3, 5\) but the packed weights have "
                                         r"K=4; expected a of shape \(3, 4\)"):
        G.gemm_s8(ints((3, 5)), packed)
    with pytest.raises(TypeError, match="packed: expected PackedS8"):
        G.gemm_s8(a, ints((4, 6)))
    with pytest.raises(ValueError, match=r"shift has values in \[0, 32\], expected \[0, 31\]"):
        G.gemm_s8(a, packed, shift=np.array([0, 1, 2, 3, 4, 32]))
    with pytest.raises(ValueError, match=r"clamp has values in \[-1, -1\], expected "
                                         r"\[0, 2147483647\]"):
        G.gemm_s8(a, packed, clamp=-1)
    with pytest.raises(ValueError, match=r"bias has shape \(5,\), expected \(6,\)"):
        G.gemm_s8(a, packed, bias=np.zeros(5, np.int32))
    with pytest.raises(TypeError, match="multiplier: expected an int or an integer"):
        G.gemm_s8(a, packed, multiplier=np.ones(6))
    with pytest.raises(ValueError, match="lo=-200, hi=127, expected -128 <= lo <= hi <= 127"):
        G.gemm_s8(a, packed, lo=-200)
    with pytest.raises(TypeError, match="out_dtype=int16, expected int8, uint8 or int32"):
        G.gemm_s8(a, packed, out_dtype=np.int16)
    with pytest.raises(ValueError, match=r"out has shape \(2, 6\), expected \(3, 6\)"):
        G.gemm_s8(a, packed, out=np.zeros((2, 6), np.int8))
    with pytest.raises(ValueError, match="layout='kk', expected 'kn' or 'nk'"):
        G.pack_s8_weights(ints((4, 6)), layout="kk")
    with pytest.raises(ValueError, match="S8Config: nr=20 must be a positive multiple of 16"):
        G.S8Config(nr=20)
    with pytest.raises(ValueError, match="clamp=True needs epilogue='requant'"):
        G.build_s8_module(G.S8Config(), "bias", 32, clamp=True)
    with pytest.raises(ValueError, match="int8 output needs epilogue='requant'"):
        G.build_s8_module(G.S8Config(), "bias", 8)


# -- zero points: activations int8 or uint8 with a zero point, the output's zero point --------

def _asym_reference(a, a_zero, w, bias, mult, shift, zero_point, lo, hi):
    """reference() of ``a - a_zero`` (per tensor), the output's zero point added after the
    shift (int32 wrap-around)."""
    n = w.shape[1]
    acc = wrap((a.astype(np.int64) - a_zero) @ w.astype(np.int64))
    t = wrap(wrap(acc + np.asarray(bias, np.int64)) * mult)
    s = np.broadcast_to(np.asarray(shift, np.int64), (n,))
    t = wrap(t + np.where(s > 0, np.left_shift(1, np.maximum(s - 1, 0)), 0)) >> s
    return np.clip(wrap(t + zero_point), lo, hi)


@pytest.mark.parametrize("m,k,n", [(7, 3, 33), (33, 17, 70), (9, 4608, 33), (49, 300, 40)])
@pytest.mark.parametrize("weights", ["b", "a", "bt"])
@pytest.mark.parametrize("a_dt", [np.int8, np.uint8])
def test_zero_points(m, k, n, weights, a_dt, vnni):
    """``(a - z_a) @ w`` through the packed unsigned bytes (the correction ``- z_u * wsum`` in
    the bias), with the output's zero point; "bt": pixels as rows, stored transposed."""
    info = np.iinfo(a_dt)
    a = RNG.integers(info.min, int(info.max) + 1, (m, k)).astype(a_dt)
    w = ints((k, n))
    bias = RNG.integers(I32.min, I32.max, n, endpoint=True)
    mult = RNG.integers(-(1 << 20), 1 << 20, n)
    shift = RNG.integers(0, 32, n)
    for a_zero in (int(info.min), int(info.max), 3):
        out_dt = np.uint8 if a_zero == 3 else np.int8
        oi = np.iinfo(out_dt)
        kw = dict(bias=bias, multiplier=mult, shift=shift, zero_point=-77 if out_dt == np.int8
                  else 130, lo=int(oi.min), hi=int(oi.max), out_dtype=out_dt,
                  a_zero_point=a_zero, vnni=vnni)
        want = _asym_reference(a, a_zero, w, bias, mult, shift, kw["zero_point"], oi.min, oi.max)
        if weights == "bt":
            cfg = G.S8Config(mr=7, nr=32, mc=63, weights="b", store_t=True)
            got = G.gemm_s8(a, G.pack_s8_weights(w, cfg), **kw).T
        elif weights == "b":
            got = G.gemm_s8(a, G.pack_s8_weights(w, G.S8Config()), **kw)
        else:
            packed = G.pack_s8_weights(np.ascontiguousarray(w.T), G.S8Config(weights="a"), "nk")
            got = G.gemm_s8(np.ascontiguousarray(a.T), packed, **kw).T
        assert got.dtype == out_dt
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("width", [3, 5, 6, 7, 12, 14])
def test_packing_widths_that_are_not_powers_of_two(width):
    """The [K, rows] packer (s_row = 1) for panels of 7 or 14 rows (a 7x7 or 14x14 map's
    pixels as rows): the next power of two's lanes, those past the width untouched."""
    k, rows = 4 * 9 + 3, 5 * width + 2
    x = ints((k, rows))
    cfg = G.S8Config(mr=width, nr=16, mc=width, weights="b")
    want = G.pack_s8_activations(np.ascontiguousarray(x.T), cfg)  # the [M, K] path
    got = np.full_like(want, 99)
    fn = G.s8_kernels(cfg).cfunc("pack_a_s8", None, *G.S8_PACK_ARGS)
    fn(x.ctypes.data, got.ctypes.data, rows, k, 1, rows, 0, got.shape[0], 0x80)
    valid = np.ones(want.shape, bool)
    valid[-1, :, rows % width:] = False  # rows past the end: any value
    np.testing.assert_array_equal(got[valid], want[valid])


def test_choose_conv_config():
    """Pixels as rows (stored transposed) where the pixel panels would be mostly padding and K
    is long; channels as rows elsewhere."""
    assert G.choose_s8_conv_config(512, 49, 4608) == G.S8Config(7, 32, 63, 2, "b", True)
    assert G.choose_s8_conv_config(256, 196, 2304).mr == 14
    assert G.choose_s8_conv_config(64, 3136, 576).weights == "a"
    assert G.choose_s8_conv_config(576, 196, 96).weights == "a"  # short K: the store costs
