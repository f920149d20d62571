"""Convolution as LLVM IR: the float32 2-D kernels (im2col + packed GEMM, the depthwise window
kernel) and the generic N-d / integer / quantised convolution.

``groups == 1``: the output of one image is ``Y[Cout, OH*OW] = W[Cout, Cin*KH*KW] @ col``, with the
weights pre-packed once as the GEMM's ``A`` (``MR``-row panels) and ``col`` built at run time by
an IR kernel that writes the ``NR``-pixel panels of ``B`` directly (no separate im2col matrix).
Bias is per output channel (a row of ``Y``), fused with ReLU / clip in the GEMM epilogue.
Threads split the pixel panels: each thread packs its panels and multiplies them, no barrier.
When the pixels or channels are not whole panels, the GEMM writes a padded buffer and a copy-out
(`panel_copy` in the lowering) keeps the valid part, with the epilogue the GEMM did not fuse.

``groups == Cin == Cout`` (depthwise): the row-vectorised window kernel (`window_module`, which
``pool.py`` reuses for 2-D max pooling). Other group counts run one GEMM per group. The int8
depthwise convolution with the requantisation fused (`depthwise_s8_module`) walks the same way.

The int8 convolution's im2col (`im2col_8bit_module`) writes the int8 GEMM's [K, pixels] operand
with vector loads and stores, its padding the activations' zero point.

Every loop-nest parameter of a layer (shape, stride, padding, dilation) is a compile-time constant
of its im2col / depthwise kernel, compiled once per distinct layer shape.

The generic convolution (`ConvSpec`, `conv`): a direct loop nest (a `loops.Kernel`) for every
other Conv / ConvTranspose of the lowering: N-d, any float dtype, any groups, and the integer and
quantised forms (ConvInteger, QLinearConv) with zero points and requantisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from vtakit.runtime.cpu.llvm import CACHE
from vtakit.runtime.cpu.parallel import run_parallel, split_range

from ....ir.dtypes import DType
from . import gemm as G
from . import irutil as U
from . import scalar as S
from .elementwise import Instr
from .loops import Kernel, contiguous_strides, entry_alloca, kernel_function, nest, offset


@dataclass(frozen=True)
class ConvGeom:
    """Shape of one convolution on one image (channels of one group)."""

    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1


def _im2col_module(g: ConvGeom, nr: int, elem: ir.Type = U.F32) -> ir.Module:
    """im2col_pack(x, dst, jp0, jp1): dst[jp, k, c] = x[ci, ih, iw] for pixel jp*nr + c and
    k = (ci, kh, kw), elements of type `elem` (float32, or int8 for the int8 convolution, which
    takes nr = all pixels: one [K, pixels] matrix for the int8 GEMM's packer).

    A panel's pixels split into segments that lie in one output row; for each segment and tap
    (kh, kw) the in-bounds columns are a strided copy along the input row, the rest zero. The
    bounds are computed once per (segment, tap) and reused over all input channels.
    """
    m = ir.Module(name=f"im2col_{g.c}x{g.h}x{g.w}_k{g.kh}x{g.kw}_s{g.sh}x{g.sw}_p{g.ph}x{g.pw}"
                       f"_d{g.dh}x{g.dw}_nr{nr}_{elem}")
    _, b = U.new_function(m, "im2col_pack", [("x", U.PTR), ("dst", U.PTR), ("jp0", U.I64),
                                              ("jp1", U.I64)])
    x, dst, jp0, jp1 = b.function.args
    ow, npix = g.ow, g.oh * g.ow
    ktot, khw, hw = g.c * g.kh * g.kw, g.kh * g.kw, g.h * g.w
    zero = ir.Constant(elem, 0.0 if elem == U.F32 else 0)
    with U.loop(b, jp0, jp1, 1, "jp") as jp:
        p0 = b.mul(jp, U.i64(nr))
        base = b.mul(jp, U.i64(ktot * nr))
        valid = U.imin(b, U.i64(nr), b.sub(U.i64(npix), p0))  # pixels in this panel
        # columns past the last pixel: zero in every row
        with U.loop(b, 0, U.i64(ktot), 1, "zk") as k:
            with U.loop(b, valid, U.i64(nr), 1, "zc") as c:
                U.store(b, elem, zero, dst, b.add(base, b.add(b.mul(k, U.i64(nr)), c)))
        # segments: c0 = first panel column, oh, ow0, seg_len; loop while c0 < valid
        pre = b.block
        fn = pre.function
        head, body, done = (fn.append_basic_block(n) for n in ("seg.head", "seg.body", "seg.end"))
        b.branch(head)
        b.position_at_end(head)
        c0 = b.phi(U.I64, "c0")
        c0.add_incoming(U.i64(0), pre)
        b.cbranch(b.icmp_signed("<", c0, valid), body, done)
        b.position_at_end(body)
        p = b.add(p0, c0)
        o_h = b.sdiv(p, U.i64(ow))
        ow0 = b.srem(p, U.i64(ow))
        seg_len = U.imin(b, b.sub(U.i64(ow), ow0), b.sub(valid, c0))
        ow1 = b.add(ow0, seg_len)
        def taps(khv: ir.Value, label: str) -> None:
            ih = b.add(b.mul(o_h, U.i64(g.sh)), b.sub(b.mul(khv, U.i64(g.dh)), U.i64(g.ph)))
            row_ok = b.icmp_unsigned("<", ih, U.i64(g.h))
            for kw in range(g.kw):
                off = kw * g.dw - g.pw  # iw = ow*sw + off
                lo_c = 0 if off >= 0 else (-off + g.sw - 1) // g.sw
                hi_c = max(0, min(ow, (g.w - 1 - off) // g.sw + 1)) if g.w - 1 - off >= 0 else 0
                lo_c = min(lo_c, hi_c)
                # copy ow in [lo, hi), zero [ow0, lo) and [hi, ow1); all of it when row is out
                lo = U.imin(b, U.imax(b, ow0, U.i64(lo_c)), ow1)
                hi = U.imax(b, U.imin(b, ow1, U.i64(hi_c)), lo)
                lo = b.select(row_ok, lo, ow1)
                hi = b.select(row_ok, hi, ow1)
                src0 = b.add(b.mul(ih, U.i64(g.w)), U.i64(off))
                # dst column of pixel ow: c0 + (ow - ow0)
                dshift = b.sub(c0, ow0)
                with U.loop(b, 0, U.i64(g.c), 1, f"ci{label}_{kw}") as ci:
                    tap = b.add(b.mul(khv, U.i64(g.kw)), U.i64(kw))
                    drow = b.add(base, b.mul(b.add(b.mul(ci, U.i64(khw)), tap), U.i64(nr)))
                    drow = b.add(drow, dshift)
                    srow = b.add(b.mul(ci, U.i64(hw)), src0)
                    with U.loop(b, ow0, lo, 1, "zl") as o:
                        U.store(b, elem, zero, dst, b.add(drow, o))
                    with U.loop(b, lo, hi, 1, "cp") as o:
                        v = U.load(b, elem, x, b.add(srow, b.mul(o, U.i64(g.sw))))
                        U.store(b, elem, v, dst, b.add(drow, o))
                    with U.loop(b, hi, ow1, 1, "zr") as o:
                        U.store(b, elem, zero, dst, b.add(drow, o))

        # Large kernels (a 7x7 stem) loop over kh at run time: unrolling all kh*kw taps makes
        # the optimiser take tens of seconds on that one module.
        if g.kh * g.kw > 9:
            with U.loop(b, 0, U.i64(g.kh), 1, "kh") as kh_iv:
                taps(kh_iv, "r")
        else:
            for kh in range(g.kh):
                taps(U.i64(kh), str(kh))
        c0.add_incoming(b.add(c0, seg_len), b.block)
        b.branch(head)
        b.position_at_end(done)
    b.ret_void()
    return m


def im2col_8bit_module(g: ConvGeom) -> ir.Module:
    """``im2col_8bit(x, dst, r0, r1, fill)``: output rows [r0, r1) of the im2col matrix of an
    8-bit convolution of one image (the int8 GEMM's [K, pixels] operand, which its packer
    then packs): ``dst[k, oh * OW + ow] = x[ci, ih, iw]`` for k = (ci, kh, kw), and the byte
    ``fill`` where (ih, iw) is padding: the activations' zero point, so that the padding of
    ``x - z_x`` is zero, as the integer graph has it.

    Vectorised as the depthwise walk: a row of ``dst`` in chunks of ``V`` pixels (16, 32 or
    64, the least that holds an output row), one masked load of ``V * sw`` bytes of the input
    row per chunk (masked-off lanes, and rows outside the image, hold ``fill``), every
    ``sw``-th byte kept by a shuffle, one store. The channels are the innermost loop, so
    every mask is computed once per tap. Past `UNROLL_CHUNKS` chunks a row, the chunks whose
    lanes all lie inside the image run in a loop.
    """
    h, w, kh, kw, sh, sw, ph, pw, dh, dw = (g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh,
                                            g.dw)
    oh, ow = g.oh, g.ow
    npix, khw, hw = oh * ow, kh * kw, h * w
    vw = 16 if ow <= 16 else 32 if ow <= 32 else 64
    n = vw * sw  # bytes loaded per chunk
    chunks = -(-ow // vw)
    m = ir.Module(name=f"im2col_8bit_{g.c}x{h}x{w}_k{kh}x{kw}_s{sh}x{sw}_p{ph}x{pw}"
                       f"_d{dh}x{dw}")
    fn, b = U.new_function(m, "im2col_8bit", [("x", U.PTR), ("dst", U.PTR), ("r0", U.I64),
                                               ("r1", U.I64), ("fill", U.I64)])
    x, dst, r0, r1, fill = fn.args
    fill_v = U.splat(b, b.trunc(fill, U.I8), n)
    keep = ir.Constant(U.vec(U.I32, vw), [sw * lane for lane in range(vw)])

    def lanes_ok(q: int, j: int) -> list[bool]:
        """Which loaded lanes of chunk q, tap column j, are inside the image and feed an
        output pixel of the row."""
        return [(q * vw + lane // sw) < ow and 0 <= (q * vw * sw + j * dw - pw + lane) < w
                for lane in range(n)]

    # chunks [qa, qb) have every lane inside the image for every tap column: looped when
    # there are many (their mask is the row's), the others unrolled with constant masks
    inner = [q for q in range(chunks) if all(all(lanes_ok(q, j)) for j in range(kw))]
    qa, qb = (inner[0], inner[-1] + 1) if chunks > UNROLL_CHUNKS and inner else (0, 0)
    unrolled = [q for q in range(chunks) if not qa <= q < qb]

    def chunk(srow: ir.Value, drow: ir.Value, q: ir.Value, j: int, mask: ir.Value,
              whole: bool) -> None:
        col0 = b.add(b.mul(q, U.i64(vw * sw)), U.i64(j * dw - pw))
        v = G._masked_load_i8(b, U.gep(b, U.I8, x, b.add(srow, col0)), mask, fill_v)
        if sw > 1:
            v = b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), keep)
        ptr = U.gep(b, U.I8, dst, b.add(drow, b.mul(q, U.i64(vw))))
        if whole:
            U.vstore(b, v, ptr, 0, U.I8, align=1)
        else:
            G._masked_store(b, v, ptr, ir.Constant(U.vec(U.I1, vw), [
                lane < ow % vw for lane in range(vw)]))

    def taps(o_h: ir.Value, i: ir.Value, label: str) -> None:
        ih = b.add(b.mul(o_h, U.i64(sh)), b.sub(b.mul(i, U.i64(dh)), U.i64(ph)))
        row_ok = U.splat(b, b.icmp_unsigned("<", ih, U.i64(h)), n)
        ihc = U.imin(b, U.imax(b, ih, U.i64(0)), U.i64(h - 1))
        for j in range(kw):
            masks = {q: b.and_(ir.Constant(U.vec(U.I1, n), lanes_ok(q, j)), row_ok)
                     for q in unrolled}
            with U.loop(b, 0, U.i64(g.c), 1, f"ci{label}_{j}") as ci:
                k = b.add(b.mul(ci, U.i64(khw)), b.add(b.mul(i, U.i64(kw)), U.i64(j)))
                drow = b.add(b.mul(k, U.i64(npix)), b.mul(o_h, U.i64(ow)))
                srow = b.add(b.mul(ci, U.i64(hw)), b.mul(ihc, U.i64(w)))
                for q in unrolled:
                    chunk(srow, drow, U.i64(q), j, masks[q], (q + 1) * vw <= ow)
                if qb > qa:
                    with U.loop(b, qa, qb, 1, f"q{label}_{j}") as q:
                        chunk(srow, drow, q, j, row_ok, True)

    with U.loop(b, r0, r1, 1, "oh") as o_h:
        # Large kernels (a 7x7 stem) loop over kh at run time, as `_im2col_module`.
        if khw > 9:
            with U.loop(b, 0, U.i64(kh), 1, "kh") as i:
                taps(o_h, i, "r")
        else:
            for i in range(kh):
                taps(o_h, U.i64(i), str(i))
    b.ret_void()
    return m


def im2col_pack_8bit_module(g: ConvGeom, width: int) -> ir.Module:
    """``im2col_pack_8bit(x, dst, p0, p1, fill, xor)``: panels [p0, p1) of the im2col matrix
    of an 8-bit convolution of one image written straight into the int8 GEMM's packed
    activation panels (`gemm._s8_pack_ir`'s layout: panels of `width` pixels in 4-deep k
    groups, ``dst[p, kg, c, j]`` the byte of pixel ``p * width + c``, k = 4 kg + j, xor
    ``xor``), with k ordered tap-major, ``k = (kh * KW + kw) * C + ci`` (the weights are
    packed in the same order: `tap_major`), so that the 4 k of a group are 4 channels of one
    tap. The padding holds ``fill`` (the activations' zero point) as `im2col_8bit_module`.
    Needs C a multiple of 4; every chunk of a row is unrolled (the lowering takes rows of up
    to `UNROLL_CHUNKS` chunks). Pixels of the last panel past the image are not written (the
    GEMM stores none of their outputs).

    Per output row and tap: chunks of ``V`` pixels (16, 32 or 64) of 4 channels, 4 masked
    loads (shuffled for a stride), interleaved into ``V`` words, stored as the pieces that fall
    into each panel (masked stores at an offset known per row). Threads take whole panels
    (one panel's words, every k, are one thread's: no cache line written by two), so the
    output rows at either end of a range are read by both neighbours.
    """
    if g.c % 4:
        raise ValueError(f"im2col_pack_8bit_module: {g.c} channels, expected a multiple of 4")
    h, w, kh, kw, sh, sw, ph, pw, dh, dw = (g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh,
                                            g.dw)
    oh, ow = g.oh, g.ow
    c4, hw = g.c // 4, h * w
    k4 = c4 * kh * kw
    vw = 16 if ow <= 16 else 32 if ow <= 32 else 64
    n = vw * sw
    chunks = -(-ow // vw)
    m = ir.Module(name=f"im2col_pack_8bit_{g.c}x{h}x{w}_k{kh}x{kw}_s{sh}x{sw}_p{ph}x{pw}"
                       f"_d{dh}x{dw}_w{width}")
    fn, b = U.new_function(m, "im2col_pack_8bit", [
        ("x", U.PTR), ("dst", U.PTR), ("p0", U.I64), ("p1", U.I64), ("fill", U.I64),
        ("xor", U.I64)])
    x, dst, pn0, pn1, fill, xor = fn.args
    pix_lo = b.mul(pn0, U.i64(width))
    pix_hi = U.imin(b, b.mul(pn1, U.i64(width)), U.i64(oh * ow))
    r0 = b.udiv(pix_lo, U.i64(ow))
    r1 = b.udiv(b.add(pix_hi, U.i64(ow - 1)), U.i64(ow))
    fill_v = U.splat(b, b.trunc(fill, U.I8), n)
    x8 = b.trunc(xor, U.I8)
    x32 = U.splat(b, b.mul(b.zext(x8, U.I32), ir.Constant(U.I32, 0x01010101)), vw)
    keep = ir.Constant(U.vec(U.I32, vw), [sw * lane for lane in range(vw)])
    vlanes = ir.Constant(U.vec(U.I64, vw), list(range(vw)))

    def zip2(x_: ir.Value, y_: ir.Value) -> ir.Value:
        k = x_.type.count
        return b.shuffle_vector(x_, y_, ir.Constant(U.vec(U.I32, 2 * k), [
            i // 2 + (k if i % 2 else 0) for i in range(2 * k)]))

    def lanes_ok(q: int, j: int) -> list[bool]:
        return [(q * vw + lane // sw) < ow and 0 <= (q * vw * sw + j * dw - pw + lane) < w
                for lane in range(n)]

    with U.loop(b, r0, r1, 1, "oh") as o_h:
        # per chunk: the pieces of its pixels in each panel, (word pointer less the group's
        # offset, lane mask); a chunk of `valid` pixels from `start` in its first panel
        pieces: list[list[tuple[ir.Value, ir.Value]]] = []
        for q in range(chunks):
            valid = min(vw, ow - q * vw)
            p0 = b.add(b.mul(o_h, U.i64(ow)), U.i64(q * vw))
            panel, start = b.udiv(p0, U.i64(width)), b.urem(p0, U.i64(width))
            pix = b.add(U.splat(b, p0, vw), vlanes)
            in_range = b.and_(b.icmp_signed(">=", pix, U.splat(b, pix_lo, vw)),
                              b.icmp_signed("<", pix, U.splat(b, pix_hi, vw)))
            row = []
            for t in range(-(-(width - 1 + valid) // width)):
                lo = b.sub(U.i64(t * width), start)
                mask = b.and_(b.icmp_signed(">=", vlanes, U.splat(b, lo, vw)), b.and_(
                    b.icmp_signed("<", vlanes, U.splat(b, b.add(lo, U.i64(width)), vw)),
                    b.and_(in_range, ir.Constant(U.vec(U.I1, vw), [
                        lane < valid for lane in range(vw)]))))
                words = b.sub(b.mul(b.add(panel, U.i64(t)), U.i64(k4 * width)), lo)
                row.append((words, mask))
            pieces.append(row)

        def taps(i: ir.Value, label: str) -> None:
            ih = b.add(b.mul(o_h, U.i64(sh)), b.sub(b.mul(i, U.i64(dh)), U.i64(ph)))
            row_ok = U.splat(b, b.icmp_unsigned("<", ih, U.i64(h)), n)
            ihc = U.imin(b, U.imax(b, ih, U.i64(0)), U.i64(h - 1))
            for j in range(kw):
                masks = [b.and_(ir.Constant(U.vec(U.I1, n), lanes_ok(q, j)), row_ok)
                         for q in range(chunks)]
                tap = b.add(b.mul(i, U.i64(kw)), U.i64(j))
                with U.loop(b, 0, U.i64(c4), 1, f"cg{label}_{j}") as cg:
                    kg = b.add(b.mul(tap, U.i64(c4)), cg)
                    srow = b.add(b.mul(cg, U.i64(4 * hw)), b.mul(ihc, U.i64(w)))
                    for q in range(chunks):
                        col0 = q * vw * sw + j * dw - pw
                        vs = []
                        for jj in range(4):
                            v = G._masked_load_i8(b, U.gep(b, U.I8, x, b.add(
                                srow, U.i64(jj * hw + col0))), masks[q], fill_v)
                            if sw > 1:
                                v = b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), keep)
                            vs.append(v)
                        h16 = U.vec(U.I16, vw)
                        word = zip2(b.bitcast(zip2(vs[0], vs[1]), h16),
                                    b.bitcast(zip2(vs[2], vs[3]), h16))
                        word = b.xor(b.bitcast(word, U.vec(U.I32, vw)), x32)
                        for words, mask in pieces[q]:
                            at = b.add(words, b.mul(kg, U.i64(width)))
                            G._masked_store(b, word, U.gep(b, U.I32, dst, at), mask)

        if kh * kw > 9:
            with U.loop(b, 0, U.i64(kh), 1, "kh") as i:
                taps(i, "r")
        else:
            for i in range(kh):
                taps(U.i64(i), str(i))
    b.ret_void()
    return m


def tap_major(w: np.ndarray) -> np.ndarray:
    """Convolution weights [Cout, C, KH, KW] as [Cout, K] with k = (kh * KW + kw) * C + ci, the
    order of `im2col_pack_8bit_module`."""
    return np.ascontiguousarray(w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1))


def _im2col_fn(g: ConvGeom, nr: int):
    jm = CACHE.get(("im2col", g, nr), lambda: _im2col_module(g, nr))
    return jm.cfunc("im2col_pack", None, G._P, G._P, G._L, G._L)


class Conv2d:
    """A float32 NCHW convolution with constant weights, prepared (packed, compiled) once.

    Parameters
    ----------
    weight : (Cout, Cin/groups, KH, KW) float32
    bias : optional (Cout,) float32
    stride, padding, dilation : int or (h, w); padding is symmetric
    groups : 1, Cin (depthwise, with Cout == Cin) or any divisor of Cin and Cout
    act : None, 'relu' or 'clip' (with ``clip=(lo, hi)``), fused after the bias
    """

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None,
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
                 dilation: int | tuple[int, int] = 1, groups: int = 1, act: str | None = None,
                 clip: tuple[float, float] | None = None,
                 cfg: G.GemmConfig | None = None) -> None:
        G.check_array(weight, "Conv2d: weight", 4)
        cout, cin_g, kh, kw = weight.shape
        if not isinstance(groups, int) or groups < 1 or cout % groups:
            raise ValueError(f"Conv2d: groups={groups!r} must be a positive divisor of "
                             f"Cout={cout}")
        if bias is not None:
            G.check_array(bias, "Conv2d: bias", 1)
            if bias.shape != (cout,):
                raise ValueError(f"Conv2d: bias has shape {bias.shape}, expected ({cout},)")
        self.stride = U.pair(stride, "Conv2d", "stride")
        self.padding = U.pair(padding, "Conv2d", "padding")
        self.dilation = U.pair(dilation, "Conv2d", "dilation")
        if min(self.stride) < 1 or min(self.dilation) < 1 or min(self.padding) < 0:
            raise ValueError(f"Conv2d: stride={self.stride} and dilation={self.dilation} must be "
                             f">= 1 and padding={self.padding} >= 0")
        self.act, self.lo, self.hi = G._check_act(act, clip)
        self.weight, self.groups = weight, groups
        self.cout, self.cin = cout, cin_g * groups
        self.kh, self.kw = kh, kw
        self.bias = (np.ascontiguousarray(bias) if bias is not None
                     else np.zeros(cout, np.float32))
        self.depthwise = groups > 1 and cin_g == 1 and cout == groups
        self.cfg = cfg
        self._packed: dict[G.GemmConfig, tuple[list[G.PackedA], np.ndarray]] = {}

    def geom(self, h: int, w: int) -> ConvGeom:
        cin_g = self.cin // self.groups
        return ConvGeom(cin_g, h, w, self.kh, self.kw, *self.stride, *self.padding,
                        *self.dilation)

    def output_shape(self, x_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
        n, _, h, w = x_shape
        g = self.geom(h, w)
        return n, self.cout, g.oh, g.ow

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None,
                 threads: int = 1) -> np.ndarray:
        G.check_array(x, "Conv2d: x", 4)
        n, c, h, w = x.shape
        if c != self.cin:
            raise ValueError(f"Conv2d: x has {c} channels (shape {x.shape}), expected "
                             f"{self.cin} (weight shape {self.weight.shape}, groups={self.groups})")
        g = self.geom(h, w)
        if g.oh < 1 or g.ow < 1:
            raise ValueError(f"Conv2d: input {h}x{w} is smaller than the dilated kernel "
                             f"{self.kh}x{self.kw} with padding {self.padding}")
        shape = (n, self.cout, g.oh, g.ow)
        if out is None:
            out = np.empty(shape, np.float32)
        else:
            G.check_array(out, "Conv2d: out", 4)
            if out.shape != shape:
                raise ValueError(f"Conv2d: out has shape {out.shape}, expected {shape}")
        if threads < 1:
            raise ValueError(f"Conv2d: threads={threads}, expected >= 1")
        if self.depthwise:
            self._depthwise(x, out, g, threads)
        else:
            self._gemm(x, out, g, threads)
        return out

    def _depthwise(self, x: np.ndarray, out: np.ndarray, g: ConvGeom, threads: int) -> None:
        geom = ConvGeom(1, *dataclass_fields(g)[1:])
        jm = CACHE.get(("dw", geom, self.act), lambda: depthwise_module(geom, str(self.act)))
        fn = jm.cfunc("depthwise", None, G._P, G._P, G._P, G._P, G._L, G._L, G._F, G._F)
        wp, bp = self.weight.ctypes.data, self.bias.ctypes.data
        tasks = []
        for i in range(x.shape[0]):
            xp, yp = x[i].ctypes.data, out[i].ctypes.data
            tasks += [lambda xp=xp, yp=yp, lo=lo, hi=hi: fn(xp, wp, bp, yp, lo, hi, self.lo,
                                                               self.hi)
                      for lo, hi in split_range(self.cout, threads)]
        run_parallel(tasks) if threads > 1 else [t() for t in tasks]

    def _prepared(self, cfg: G.GemmConfig) -> tuple[list[G.PackedA], np.ndarray]:
        """Weights packed as ``MR``-row panels per group, and the bias padded to whole panels."""
        got = self._packed.get(cfg)
        if got is None:
            cg = self.cout // self.groups
            packed = [G.pack_a(np.ascontiguousarray(
                self.weight[i * cg:(i + 1) * cg].reshape(cg, -1)), cfg)
                for i in range(self.groups)]
            bias = np.zeros((self.groups, packed[0].panels * cfg.mr), np.float32)
            bias[:, :cg] = self.bias.reshape(self.groups, cg)
            got = self._packed[cfg] = (packed, bias)
        return got

    def _gemm(self, x: np.ndarray, out: np.ndarray, g: ConvGeom, threads: int) -> None:
        npix = g.oh * g.ow
        cfg = self.cfg or G.choose_config(npix)
        packed, bias = self._prepared(cfg)
        panels = -(-npix // cfg.nr)
        im2col = _im2col_fn(g, cfg.nr)
        k = g.c * g.kh * g.kw
        macro = G.kernels(cfg, "row", self.act).cfunc("gemm_packed", None, *G.MACRO_ARGS)
        cg = self.cout // self.groups
        mpad, npad = packed[0].panels * cfg.mr, panels * cfg.nr
        # Partial tiles would go through the micro-kernel's slow edge path on every K block;
        # instead compute whole tiles into a padded buffer and copy the valid part out once.
        padded = (mpad, npad) != (cg, npix)
        ybuf = np.empty((mpad, npad), np.float32) if padded else None
        copy = _copy2d_fn() if padded else None
        col = np.empty((panels, k, cfg.nr), np.float32)  # reused by every image and group
        hw = g.h * g.w
        for i in range(x.shape[0]):
            for grp in range(self.groups):
                pa = packed[grp]
                xp = x.ctypes.data + 4 * (i * self.cin + grp * g.c) * hw
                yp = out.ctypes.data + 4 * (i * self.cout + grp * cg) * npix
                bp = bias[grp].ctypes.data

                def part(lo: int, hi: int, xp: int = xp, yp: int = yp, bp: int = bp,
                         pa: G.PackedA = pa) -> None:
                    im2col(xp, col.ctypes.data, lo, hi)
                    if ybuf is None:
                        macro(pa.data.ctypes.data, col.ctypes.data, yp, bp, cg, npix, k, npix,
                              0, pa.panels, lo, hi, self.lo, self.hi)
                    else:
                        macro(pa.data.ctypes.data, col.ctypes.data, ybuf.ctypes.data, bp, mpad,
                              npad, k, npad, 0, pa.panels, lo, hi, self.lo, self.hi)
                        c0, c1 = lo * cfg.nr, min(hi * cfg.nr, npix)
                        assert copy is not None
                        copy(ybuf.ctypes.data + 4 * c0, yp + 4 * c0, cg, c1 - c0, npad, npix)

                run_parallel([lambda lo=lo, hi=hi: part(lo, hi)
                              for lo, hi in split_range(panels, threads)])


def _copy2d_module() -> ir.Module:
    m = ir.Module(name="copy2d")
    _, b = U.new_function(m, "copy2d", [("src", U.PTR), ("dst", U.PTR), ("rows", U.I64),
                                         ("cols", U.I64), ("lds", U.I64), ("ldd", U.I64)])
    src, dst, rows, cols, lds, ldd = b.function.args
    with U.loop(b, 0, rows, 1, "r") as r:
        with U.loop(b, 0, cols, 1, "c") as c:
            v = U.load(b, U.F32, src, b.add(b.mul(r, lds), c))
            U.store(b, U.F32, v, dst, b.add(b.mul(r, ldd), c))
    b.ret_void()
    return m


def _copy2d_fn():
    return CACHE.get(("copy2d",), _copy2d_module).cfunc("copy2d", None, G._P, G._P, G._L, G._L,
                                                         G._L, G._L)


def dataclass_fields(g: ConvGeom) -> tuple[int, ...]:
    return (g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw)


def conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
           stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
           dilation: int | tuple[int, int] = 1, groups: int = 1, act: str | None = None,
           clip: tuple[float, float] | None = None, threads: int = 1) -> np.ndarray:
    """One-shot convolution (packs the weights on every call; prefer `Conv2d` for reuse)."""
    return Conv2d(weight, bias, stride, padding, dilation, groups, act, clip)(x, threads=threads)


# -- the window kernel: depthwise convolution (and 2-D max pooling) -------------------------------

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


def depthwise_module(g: ConvGeom, act: str) -> ir.Module:
    """``depthwise(x, w, bias, y, c0, c1, lo, hi)`` for geometry `g` (a `ConvGeom` of one
    channel's image) and activation `act` ('none', 'relu' or 'clip')."""
    return window_module(g, "depthwise", act)


def window_module(g: object, kind: str, act: str) -> ir.Module:
    """The sliding-window kernel vectorised along output rows, float32 NCHW: `kind` ``"depthwise"``
    (one 2-d filter per channel, `g` a `ConvGeom`) or ``"max"`` (2-d max pooling, `g` a
    `pool.PoolGeom`).

    ``depthwise(x, w, bias, y, c0, c1, lo, hi)`` computes channels [c0, c1) of one image. Each
    output row is cut into chunks of `VW` columns; a chunk's accumulator is one vector, and each tap
    (i, j) adds ``w[i, j] * x[ih, c*sw + j*dw - pw]`` for the chunk's columns c. The inputs of a tap
    come from one masked load of ``VW * sw`` consecutive floats of the input row, of which every
    ``sw``-th is kept (a shuffle). Lanes left of column 0 or right of the last column are masked off
    and read as zero, which is the padding (an interior chunk's mask is all ones: a plain load), so
    the border needs no scalar code, and a stride of 2 costs a shuffle instead of a gather. A tap
    whose input row is outside the image reads a clamped row with a zero weight. Rows of fewer than
    `VW` columns (14x14 and 7x7 maps) use a partial mask. The bias starts the accumulator; ReLU or
    clip (lo, hi) runs before the one store per chunk.

    Max pooling is the same walk with ``max`` for the multiply-add: masked-off lanes and rows
    outside the image read as -inf, the accumulator starts at -inf.

    The chunks of a row are unrolled (their masks are then constants) up to `UNROLL_CHUNKS`, beyond
    which a loop computes them.
    """
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
                # max pooling: a NaN-ignoring max chain (one maxps a tap, the accumulator never
                # NaN) and NaN found apart, one ``fcmp uno`` for two taps; a NaN in the window
                # makes the output NaN
                taps: list[ir.Value] = []
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
                        if kind == "depthwise":
                            acc = U.fma(b, weights[i][j], v, acc)
                        else:
                            acc = U.fmax_num(b, acc, v)
                            taps.append(v)
                if taps:
                    pairs = [b.fcmp_unordered("uno", taps[t], taps[min(t + 1, len(taps) - 1)])
                             for t in range(0, len(taps), 2)]
                    nan = pairs[0]
                    for p in pairs[1:]:
                        nan = b.or_(nan, p)
                    acc = b.select(nan, ir.Constant(vt, [math.nan] * VW), acc)
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


# -- the int8 depthwise convolution with the requantisation fused ---------------------------------

def depthwise_s8_module(g: ConvGeom, out_bits: int, clamp: bool = False,
                        unsigned: bool = False, offset: bool = False) -> ir.Module:
    """``depthwise_s8(x, w, bias, mult, shift, clamp_lo, clamp_hi, y, c0, c1, lo, hi, zx,
    zp)``: channels [c0, c1) of one image of the int8 depthwise convolution (`g` a `ConvGeom`
    of one channel's image; ``x`` int8, or uint8 with `unsigned`, [C, H, W], ``w`` int8
    [C, KH*KW]) of ``x - zx`` (zero padding: the graph's CONV_INTEGER; ``zx`` is read only
    with `offset`, else 0) requantised as REQUANTIZE does (`ops.RequantAttrs`): per channel c,
    with int32 arrays of C values, ``t = acc + bias[c]``, with `clamp` saturated to
    ``[clamp_lo[c], clamp_hi[c]]`` (`gemm.clamp_bounds`; without it those arrays are not read),
    then ``y = min(max((t * mult[c] + rnd >> shift[c]) + zp, lo), hi)`` in 32-bit wrap-around
    arithmetic, ``rnd = 1 << (shift[c] - 1)`` (0 for shift 0), stored as 8 bits (`out_bits`
    8: int8, or uint8 with bounds in [0, 255]) or int32 (32).

    The walk of `window_module`: output rows in chunks of `VW` columns, one masked load of
    ``VW * sw`` bytes per tap (masked-off lanes hold ``zx``: the padding), every ``sw``-th byte
    kept by a shuffle, rows outside the image read clamped with a zero weight. The taps'
    inputs, extended to int16 (``x - zx`` with `offset`), go in pairs: two taps interleaved
    into 32 int16 lanes times their two weights, each adjacent product pair summed into an
    int32 lane (`_madd_pairs`: ``vpmaddwd`` / ``vpdpwssd`` on x86), exact since
    ``|(x - zx) * w| <= 255 * 128 < 2**15``; an odd last tap is one int16 product widened. The
    int32 accumulator starts at the bias (32-bit addition is associative: the same bits as the
    sum, then the bias). ``lo``, ``hi``, ``zx`` and ``zp`` are run-time arguments, so layers
    differing only in those (ReLU6 bounds depend on the scale) share one module.
    """
    if out_bits not in (8, 32):
        raise ValueError(f"depthwise_s8_module: out_bits={out_bits}, expected 8 or 32")
    h, w, kh, kw, sh, sw, ph, pw, dh, dw = (g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh,
                                            g.dw)
    oh, ow = g.oh, g.ow
    n = VW * sw  # bytes loaded per tap
    chunks = -(-ow // VW)
    m = ir.Module(name=f"depthwise_s8_{h}x{w}_k{kh}x{kw}_s{sh}x{sw}_p{ph}x{pw}_d{dh}x{dw}"
                       f"_o{out_bits}{'_clamp' if clamp else ''}{'_u8' if unsigned else ''}"
                       f"{'_zx' if offset else ''}")
    fn, b = U.new_function(m, "depthwise_s8", [
        ("x", U.PTR), ("w", U.PTR), ("bias", U.PTR), ("mult", U.PTR), ("shift", U.PTR),
        ("clamp_lo", U.PTR), ("clamp_hi", U.PTR), ("y", U.PTR), ("c0", U.I64), ("c1", U.I64),
        ("lo", U.I64), ("hi", U.I64), ("zx", U.I64), ("zp", U.I64)])
    x, wp, bias, mult, shift, clamp_lo, clamp_hi, y, c0, c1, lo, hi, zx, zp = fn.args
    v16, v32 = U.vec(U.I16, VW), U.vec(U.I32, VW)
    ot = U.I8 if out_bits == 8 else U.I32
    lo_v, hi_v = U.splat(b, b.trunc(lo, U.I32), VW), U.splat(b, b.trunc(hi, U.I32), VW)
    zp_v = U.splat(b, b.trunc(zp, U.I32), VW)
    # the padding's byte, and zx as int16 lanes (x - zx: 0 on the padding)
    zx_fill = U.splat(b, b.trunc(zx, U.I8), n) if offset else None
    zx_v = U.splat(b, b.trunc(zx, U.I16), VW) if offset else None
    keep = ir.Constant(U.vec(U.I32, VW), [sw * lane for lane in range(VW)])
    # lanes (a0, b0, a1, b1, ...) of two VW-lane vectors a, b
    zip2 = ir.Constant(U.vec(U.I32, 2 * VW), [k // 2 + VW * (k % 2) for k in range(2 * VW)])
    lane_col = _lanes(n, lambda lane: lane)  # input column offset of each loaded lane
    lane_out = _lanes(n, lambda lane: lane // sw)  # output column offset it belongs to
    out_lane = _lanes(VW, lambda lane: lane)
    one = ir.Constant(U.I32, 1)
    order = [(i, j) for j in range(kw) for i in range(kh)]  # taps; pairs: order[2p], [2p+1]
    npairs = len(order) // 2

    with U.loop(b, c0, c1, 1, "ch") as ch:
        start = U.splat(b, U.load(b, U.I32, bias, ch), VW)
        s = U.load(b, U.I32, shift, ch)
        mul_v = U.splat(b, U.load(b, U.I32, mult, ch), VW)
        rnd_v = U.splat(b, b.lshr(b.shl(one, s), one), VW)  # 1 << (s - 1), or 0 for s == 0
        s_v = U.splat(b, s, VW)
        sat = [U.splat(b, U.load(b, U.I32, p, ch), VW) for p in (clamp_lo, clamp_hi)] \
            if clamp else []
        taps = [[b.sext(U.load(b, U.I8, wp, b.add(b.mul(ch, U.i64(kh * kw)), U.i64(i * kw + j))),
                        U.I16) for j in range(kw)] for i in range(kh)]
        xc = b.mul(ch, U.i64(h * w))
        yc = b.mul(ch, U.i64(oh * ow))
        with U.loop(b, 0, U.i64(oh), 1, "oh") as o_h:
            rows, weights = [], []
            for i in range(kh):
                ih = b.add(b.mul(o_h, U.i64(sh)), U.i64(i * dh - ph))
                ok = b.icmp_unsigned("<", ih, U.i64(h))
                ihc = U.imin(b, U.imax(b, ih, U.i64(0)), U.i64(h - 1))
                rows.append(b.add(xc, b.mul(ihc, U.i64(w))))
                # a row outside: a clamped row with a zero weight
                weights.append([U.splat(b, b.select(ok, taps[i][j], ir.Constant(U.I16, 0)), VW)
                                for j in range(kw)])
            tw = [weights[i][j] for i, j in order]
            wpairs = [b.shuffle_vector(tw[2 * p], tw[2 * p + 1], zip2) for p in range(npairs)]
            yrow = b.add(yc, b.mul(o_h, U.i64(ow)))

            def chunk(q0: ir.Value) -> None:
                """Output columns [q0, q0 + VW) of this row (q0 a multiple of VW)."""
                out_ok = b.icmp_signed("<", b.add(U.splat(b, q0, n), lane_out),
                                       _lanes(n, lambda _: ow))
                xs = []  # the taps' inputs, int16
                for i, j in order:
                    col0 = b.add(b.mul(q0, U.i64(sw)), U.i64(j * dw - pw))
                    col = b.add(U.splat(b, col0, n), lane_col)
                    mask = b.and_(out_ok, b.and_(
                        b.icmp_signed(">=", col, _lanes(n, lambda _: 0)),
                        b.icmp_signed("<", col, _lanes(n, lambda _: w))))
                    v = G._masked_load_i8(b, U.gep(b, U.I8, x, b.add(rows[i], col0)), mask,
                                          zx_fill)
                    if sw > 1:
                        v = b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), keep)
                    v = b.zext(v, v16) if unsigned else b.sext(v, v16)
                    xs.append(b.sub(v, zx_v) if zx_v is not None else v)
                acc = start
                for p in range(npairs):
                    acc = b.add(acc, _madd_pairs(b, b.shuffle_vector(xs[2 * p], xs[2 * p + 1],
                                                                     zip2), wpairs[p]))
                if len(order) % 2:  # |(x - zx) * w| <= 255 * 128 < 2**15
                    acc = b.add(acc, b.sext(b.mul(xs[-1], tw[-1]), v32))
                if sat:
                    acc = G._ivec_intrinsic(b, "smin", G._ivec_intrinsic(b, "smax", acc, sat[0]),
                                            sat[1])
                t = b.add(b.ashr(b.add(b.mul(acc, mul_v), rnd_v), s_v), zp_v)
                t = G._ivec_intrinsic(b, "smin", G._ivec_intrinsic(b, "smax", t, lo_v), hi_v)
                if out_bits == 8:
                    t = b.trunc(t, U.vec(U.I8, VW))
                store_ok = b.icmp_signed("<", b.add(U.splat(b, q0, VW), out_lane),
                                         _lanes(VW, lambda _: ow))
                G._masked_store(b, t, U.gep(b, ot, y, b.add(yrow, q0)), store_ok)

            if chunks <= UNROLL_CHUNKS:
                for q in range(chunks):
                    chunk(U.i64(q * VW))
            else:
                with U.loop(b, 0, U.i64(ow), VW, "q") as q0:
                    chunk(q0)
    b.ret_void()
    return m


def _madd_pairs(b: ir.IRBuilder, x: ir.Value, w: ir.Value) -> ir.Value:
    """``x[2k] * w[2k] + x[2k+1] * w[2k+1]`` as int32 lane k, for int16 vectors `x`, `w` of
    2n lanes whose products fit int16 times int16 without the sum overflowing (the int8 range
    here). Written as generic IR in the shape X86 selects as ``vpmaddwd`` (``vpdpwssd`` with
    the following add, where AVX-512 VNNI is there)."""
    t = U.vec(U.I32, x.type.count)
    half = x.type.count // 2
    prod = b.mul(b.sext(x, t), b.sext(w, t), flags=["nsw"])
    undef = ir.Constant(t, ir.Undefined)
    even = b.shuffle_vector(prod, undef, ir.Constant(U.vec(U.I32, half),
                                                     [2 * k for k in range(half)]))
    odd = b.shuffle_vector(prod, undef, ir.Constant(U.vec(U.I32, half),
                                                    [2 * k + 1 for k in range(half)]))
    return b.add(even, odd)


# -- the copy-out of a padded im2col GEMM, for the lowering ---------------------------------------

def panel_copy(rows: int, ld_src: int, ncols: int, nr: int,
               program: tuple[Instr, ...] = ()) -> Kernel:
    """dst[r, c] = f(src[r, c] [, res[r, c]]) for the columns c of panels [lo, hi) (nr columns
    each, < ncols): the valid part of a GEMM computed into a padded buffer. `program` (an
    elementwise program over value 0 = the GEMM result and, when it names value 1, the
    residual in dst's layout) fuses the epilogue the GEMM kernel does not do (a residual add,
    an activation) into this copy; empty: a plain copy."""
    key = ("panel_copy", rows, ld_src, ncols, nr, program)
    nres = 1 if any(1 in srcs for _, srcs, _, _ in program) else 0
    f32 = DType.FLOAT32

    def build() -> ir.Module:
        m, b, args = kernel_function(key, 2 + nres)
        dst, src, lo, hi = args[0], args[1], args[-2], args[-1]
        c0 = b.mul(lo, U.i64(nr))
        c1 = U.imin(b, b.mul(hi, U.i64(nr)), U.i64(ncols))
        with U.loop(b, 0, U.i64(rows), 1, "r") as r:
            with U.loop(b, c0, c1, 1, "c") as c:
                di = b.add(b.mul(r, U.i64(ncols)), c)
                vals = [U.load(b, U.F32, src, b.add(b.mul(r, U.i64(ld_src)), c))]
                if nres:
                    vals.append(U.load(b, U.F32, args[2], di))
                for op, srcs, params, dt in program:
                    args_ = [vals[i] for i in srcs]
                    vals.append(S.emit(b, op, args_, [f32] * len(args_), dt, params))
                U.store(b, U.F32, vals[-1], dst, di)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "pp" + "p" * nres + "ll", build, -(-ncols // nr))


# -- generic: every dtype, for the lowering -------------------------------------------------------

@dataclass(frozen=True)
class ConvSpec:
    """A direct N-d convolution (cross-correlation) of x (N, C, *in) with w (M, C/G, *kernel),
    optional bias (M,), optional zero points (x: scalar; w: per output channel) and an
    optional requantisation (QLinearConv)."""

    x_dt: DType
    w_dt: DType
    out_dt: DType
    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    group: int
    bias_dt: DType | None = None
    zero_points: tuple[DType, DType, int] | None = None  # x zp dtype, w zp dtype, w zp stride
    requant: tuple[int, int] | None = None  # (xs stride 0, ws stride per channel)
    transposed: bool = False  # ConvTranspose: w is (C, M/G, *kernel), x scattered by strides


def conv(spec: ConvSpec) -> Kernel:
    """Split over (n, m) planes: operands x, w, [bias], [xzp, wzp], [xs, ws, ys, yzp]."""
    key = ("conv", spec)
    s = spec
    nsp = len(s.x_shape) - 2
    n, c = s.x_shape[:2]
    mch = s.out_shape[1]
    cg, mg = c // s.group, mch // s.group
    ksz = s.w_shape[2:]
    ins, outs = s.x_shape[2:], s.out_shape[2:]
    nptr = 3 + (1 if s.bias_dt else 0) + (2 if s.zero_points else 0) + (4 if s.requant else 0)
    if s.zero_points or s.requant:
        acc_dt = DType.INT64 if s.requant else DType.INT32
    else:
        acc_dt = DType.FLOAT32 if s.out_dt is DType.FLOAT16 else s.out_dt

    def build() -> ir.Module:
        m, b, args = kernel_function(key, nptr)
        out, px, pw = args[0], args[1], args[2]
        rest = list(args[3:-2])
        pbias = rest.pop(0) if s.bias_dt else None
        pxz = rest.pop(0) if s.zero_points else None
        pwz = rest.pop(0) if s.zero_points else None
        lo, hi = args[-2], args[-1]
        ct = S.compute(acc_dt)
        acc = entry_alloca(b, ct)
        with U.loop(b, lo, hi, 1, "plane") as plane:
            bn = b.udiv(plane, U.i64(mch))
            mo = b.urem(plane, U.i64(mch))
            g = b.udiv(mo, U.i64(mg))
            xz = wz = None
            if pxz is not None:
                assert s.zero_points is not None
                xz = S.convert(b, S.load(b, s.zero_points[0], pxz, U.i64(0)), s.zero_points[0],
                               acc_dt)
                wz = S.convert(b, S.load(b, s.zero_points[1], pwz, b.mul(
                    mo, U.i64(s.zero_points[2]))), s.zero_points[1], acc_dt)
            with nest(b, outs, name="o") as ovs:
                b.store(ir.Constant(ct, 0.0 if acc_dt.is_float else 0), acc)
                with U.loop(b, 0, U.i64(cg), 1, "ci") as ci:
                    ch = b.add(b.mul(g, U.i64(cg)), ci)
                    xbase = b.mul(b.add(b.mul(bn, U.i64(c)), ch), U.i64(math.prod(ins)))
                    if s.transposed:  # w[ch, mo % mg, *k]
                        wrow = b.add(b.mul(ch, U.i64(mg)), b.urem(mo, U.i64(mg)))
                    else:
                        wrow = b.add(b.mul(mo, U.i64(cg)), ci)
                    wbase = b.mul(wrow, U.i64(math.prod(ksz)))
                    with nest(b, ksz, name="k") as kvs:
                        ok: ir.Value = ir.Constant(U.I1, 1)
                        xi: ir.Value = xbase
                        xst = contiguous_strides(ins)
                        for d in range(nsp):
                            if s.transposed:  # o = i * stride + k * dilation - pad
                                t = b.sub(b.add(ovs[d], U.i64(s.pads[d])),
                                          b.mul(kvs[d], U.i64(s.dilations[d])))
                                st_ = U.i64(s.strides[d])
                                ok = b.and_(ok, b.icmp_signed(">=", t, U.i64(0)))
                                ok = b.and_(ok, b.icmp_signed("==", b.srem(t, st_), U.i64(0)))
                                p = b.sdiv(t, st_)
                            else:
                                p = b.add(b.mul(ovs[d], U.i64(s.strides[d])),
                                          U.i64(-s.pads[d]))
                                p = b.add(p, b.mul(kvs[d], U.i64(s.dilations[d])))
                            ok = b.and_(ok, b.icmp_unsigned("<", p, U.i64(ins[d])))
                            xi = b.add(xi, b.mul(p, U.i64(xst[d])))
                        with b.if_then(ok):
                            xv = S.convert(b, S.load(b, s.x_dt, px, xi), s.x_dt, acc_dt)
                            wv = S.convert(b, S.load(b, s.w_dt, pw, b.add(
                                wbase, offset(b, kvs, contiguous_strides(ksz)))), s.w_dt,
                                acc_dt)
                            if xz is not None:
                                xv, wv = b.sub(xv, xz), b.sub(wv, wz)
                            cur = b.load(acc)
                            b.store(b.fadd(cur, b.fmul(xv, wv), flags=("contract",))
                                    if acc_dt.is_float else b.add(cur, b.mul(xv, wv)), acc)
                v = b.load(acc)
                if pbias is not None:
                    assert s.bias_dt is not None
                    bv = S.convert(b, S.load(b, s.bias_dt, pbias, mo), s.bias_dt, acc_dt)
                    v = b.fadd(v, bv) if acc_dt.is_float else b.add(v, bv)
                oi = b.add(b.mul(plane, U.i64(math.prod(outs))),
                           offset(b, ovs, contiguous_strides(outs)))
                if s.requant:
                    assert s.requant is not None
                    xs, ws, ys, yzp = args[3 + (1 if s.bias_dt else 0) + 2:-2]
                    f32 = DType.FLOAT32
                    sc = b.fdiv(b.fmul(S.load(b, f32, xs, U.i64(0)),
                                       S.load(b, f32, ws, b.mul(mo, U.i64(s.requant[1])))),
                                S.load(b, f32, ys, U.i64(0)))
                    y = b.fmul(S.convert(b, v, acc_dt, DType.FLOAT64),
                               S.convert(b, sc, f32, DType.FLOAT64))
                    y = b.fadd(y, S.convert(b, S.load(b, s.out_dt, yzp, U.i64(0)), s.out_dt,
                                            DType.FLOAT64))
                    info = np.iinfo(s.out_dt.np)
                    y = S.intrinsic(b, "roundeven", y)
                    y = S.fmin_nan(b, S.fmax_nan(b, y, ir.Constant(S.F64, float(info.min))),
                                   ir.Constant(S.F64, float(info.max)))
                    S.store(b, s.out_dt, S.convert(b, y, DType.FLOAT64, s.out_dt), out, oi)
                else:
                    S.store(b, s.out_dt, S.convert(b, v, acc_dt, s.out_dt), out, oi)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "p" * nptr + "ll", build, n * mch)
