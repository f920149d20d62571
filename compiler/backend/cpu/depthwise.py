"""Sliding-window kernels vectorised along output rows, float32 NCHW: depthwise 2-d convolution
(one 2-d filter per channel) and 2-d max pooling.

``depthwise(x, w, bias, y, c0, c1, lo, hi)`` computes channels [c0, c1) of one image. Each
output row is cut into chunks of `VW` columns; a chunk's accumulator is one vector, and each tap
(i, j) adds ``w[i, j] * x[ih, c*sw + j*dw - pw]`` for the chunk's columns c. The inputs of a tap
come from one masked load of ``VW * sw`` consecutive floats of the input row, of which every
``sw``-th is kept (a shuffle). Lanes left of column 0 or right of the last column are masked
off and read as zero, which is the padding (an interior chunk's mask is all ones: a plain load),
so the border needs no scalar code, and a stride of 2 costs a shuffle instead of a gather. A tap
whose input row is outside the image reads a clamped row with a zero weight. Rows of fewer than
`VW` columns (14x14 and 7x7 maps) use a partial mask. The bias starts the accumulator; ReLU or
clip (lo, hi) runs before the one store per chunk.

Max pooling is the same walk with ``max`` for the multiply-add: masked-off lanes and rows outside
the image read as -inf, the accumulator starts at -inf.

The chunks of a row are unrolled (their masks are then constants) up to `UNROLL_CHUNKS`, beyond
which a loop computes them.
"""

from __future__ import annotations

import llvmlite.ir as ir

from . import irutil as U

VW = 16
UNROLL_CHUNKS = 16


def _masked_load(b: ir.IRBuilder, ptr: ir.Value, mask: ir.Value, n: int,
                 fill: float = 0.0) -> ir.Value:
    """`n` floats from `ptr`; masked-off lanes are not read and hold `fill`."""
    vt = U.vec(U.F32, n)
    fn = U.intrinsic(b.module, f"llvm.masked.load.v{n}f32.p0", vt,
                     [U.PTR, U.I32, U.vec(U.I1, n), vt])
    return b.call(fn, [ptr, ir.Constant(U.I32, 4), mask, ir.Constant(vt, [fill] * n)])


def _masked_store(b: ir.IRBuilder, v: ir.Value, ptr: ir.Value, mask: ir.Value) -> None:
    n = v.type.count
    fn = U.intrinsic(b.module, f"llvm.masked.store.v{n}f32.p0", U.VOID,
                     [v.type, U.PTR, U.I32, U.vec(U.I1, n)])
    b.call(fn, [v, ptr, ir.Constant(U.I32, 4), mask])


def _lanes(n: int, f) -> ir.Constant:  # type: ignore[no-untyped-def]
    return ir.Constant(U.vec(U.I64, n), [f(lane) for lane in range(n)])


def depthwise_module(g: object, act: str) -> ir.Module:
    """``depthwise(x, w, bias, y, c0, c1, lo, hi)`` for geometry `g` (a `conv.ConvGeom` of one
    channel's image) and activation `act` ('none', 'relu' or 'clip')."""
    return _window_module(g, "depthwise", act)


def max_pool_module(g: object) -> ir.Module:
    """``pool(x, y, p0, p1)``: 2-D max pooling of planes [p0, p1) for geometry `g` (a
    `pool.PoolGeom`); padding is ignored (read as -inf), as ONNX MaxPool specifies."""
    return _window_module(g, "max", "none")


def _window_module(g: object, kind: str, act: str) -> ir.Module:
    h, w, kh, kw = g.h, g.w, g.kh, g.kw  # type: ignore[attr-defined]
    sh, sw, ph, pw = g.sh, g.sw, g.ph, g.pw  # type: ignore[attr-defined]
    dh, dw = getattr(g, "dh", 1), getattr(g, "dw", 1)
    oh, ow = g.oh, g.ow  # type: ignore[attr-defined]
    n = VW * sw  # lanes loaded per tap
    chunks = -(-ow // VW)
    m = ir.Module(name=f"{kind}_{h}x{w}_k{kh}x{kw}_s{sh}x{sw}_p{ph}x{pw}_d{dh}x{dw}_{act}")
    vt = U.vec(U.F32, VW)
    if kind == "depthwise":
        fn, b = U.new_function(m, "depthwise", [
            ("x", U.PTR), ("w", U.PTR), ("bias", U.PTR), ("y", U.PTR), ("c0", U.I64),
            ("c1", U.I64), ("lo", U.F32), ("hi", U.F32)])
        x, wp, bias, y, c0, c1, lo, hi = fn.args
        fill = 0.0
    else:
        fn, b = U.new_function(m, "pool", [("x", U.PTR), ("y", U.PTR), ("c0", U.I64),
                                            ("c1", U.I64)])
        x, y, c0, c1 = fn.args
        fill = float("-inf")
    zero = ir.Constant(vt, [0.0] * VW)
    keep = ir.Constant(U.vec(U.I32, VW), [sw * lane for lane in range(VW)])
    lane_col = _lanes(n, lambda lane: lane)  # input column offset of each loaded lane
    lane_out = _lanes(n, lambda lane: lane // sw)  # output column offset it belongs to
    out_lane = _lanes(VW, lambda lane: lane)

    with U.loop(b, c0, c1, 1, "ch") as ch:
        if kind == "depthwise":
            start = U.splat(b, U.load(b, U.F32, bias, ch), VW)
            taps = [[U.load(b, U.F32, wp, b.add(b.mul(ch, U.i64(kh * kw)),
                                                 U.i64(i * kw + j)))
                     for j in range(kw)] for i in range(kh)]
        else:
            start = ir.Constant(vt, [fill] * VW)
        xc = b.mul(ch, U.i64(h * w))
        yc = b.mul(ch, U.i64(oh * ow))
        with U.loop(b, 0, U.i64(oh), 1, "oh") as o_h:
            rows, weights, row_ok = [], [], []
            for i in range(kh):
                ih = b.add(b.mul(o_h, U.i64(sh)), U.i64(i * dh - ph))
                ok = b.icmp_unsigned("<", ih, U.i64(h))
                ihc = U.imin(b, U.imax(b, ih, U.i64(0)), U.i64(h - 1))
                rows.append(b.add(xc, b.mul(ihc, U.i64(w))))
                if kind == "depthwise":  # a row outside: a clamped row with a zero weight
                    weights.append([U.splat(b, b.select(ok, taps[i][j], U.f32(0.0)), VW)
                                    for j in range(kw)])
                else:  # a row outside: no lane read
                    row_ok.append(U.splat(b, ok, n))
            yrow = b.add(yc, b.mul(o_h, U.i64(ow)))

            def chunk(q0: ir.Value) -> None:
                """Output columns [q0, q0 + VW) of this row (q0 a multiple of VW)."""
                acc = start
                out_ok = b.icmp_signed("<", b.add(U.splat(b, q0, n), lane_out),
                                       _lanes(n, lambda _: ow))
                for j in range(kw):
                    col0 = b.add(b.mul(q0, U.i64(sw)), U.i64(j * dw - pw))
                    col = b.add(U.splat(b, col0, n), lane_col)
                    mask = b.and_(out_ok, b.and_(
                        b.icmp_signed(">=", col, _lanes(n, lambda _: 0)),
                        b.icmp_signed("<", col, _lanes(n, lambda _: w))))
                    for i in range(kh):
                        ptr = b.gep(x, [b.add(rows[i], col0)], source_etype=U.F32)
                        lane_mask = mask if kind == "depthwise" else b.and_(mask, row_ok[i])
                        v = _masked_load(b, ptr, lane_mask, n, fill)
                        if sw > 1:
                            v = b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), keep)
                        acc = U.fma(b, weights[i][j], v, acc) if kind == "depthwise" \
                            else U.fmax(b, acc, v)
                if act == "relu":
                    acc = U.fmax(b, acc, zero)
                elif act == "clip":
                    acc = U.fmin(b, U.fmax(b, acc, U.splat(b, lo, VW)), U.splat(b, hi, VW))
                store_ok = b.icmp_signed("<", b.add(U.splat(b, q0, VW), out_lane),
                                         _lanes(VW, lambda _: ow))
                _masked_store(b, acc, b.gep(y, [b.add(yrow, q0)], source_etype=U.F32),
                              store_ok)

            if chunks <= UNROLL_CHUNKS:
                for q in range(chunks):
                    chunk(U.i64(q * VW))
            else:
                with U.loop(b, 0, U.i64(ow), VW, "q") as q0:
                    chunk(q0)
    b.ret_void()
    return m
