"""Matrix products as LLVM IR: the packed float32 GEMM, the int8 GEMM and the generic matmul.

float32 GEMM ``C[M,N] = A[M,K] @ B[K,N] (+ bias) (→ ReLU / clip)``, the lowering's kernel for
Gemm / MatMul with constant weights and for im2col convolution (``conv.py``).

Layout (Goto/BLIS style):

* ``B`` is packed once into panels of ``NR`` columns, each panel holding all of ``K``:
  ``Bp[jp, k, c] = B[k, jp*NR + c]`` (zero past ``N``). Weights are packed at compile time
  (`pack_b`), im2col for convolution packs straight into this layout (see ``conv.py``).
* ``A`` is packed into panels of ``MR`` rows: ``Ap[ip, k, r] = A[ip*MR + r, k]`` (zero past ``M``).
* The micro-kernel keeps an ``MR × NR`` tile of ``C`` in ``MR*NR/16`` ``<16 x float>``
  accumulators and does ``MR*NR/16`` ``llvm.fma`` per ``k``; loops over ``K`` in blocks of ``KC``
  (the ``KC × NR`` B micro-panel stays in L1), ``M`` in blocks of ``MC`` (the ``MC × KC`` A block
  stays in L2) and ``N`` in blocks of ``NC``. Partial tiles go through a stack buffer.
* Epilogue on the last ``K`` block: bias per column (dense) or per row (NCHW convolution), then
  ReLU or clip.

Threads split the ``M`` or ``N`` tiles between calls of the compiled function through ctypes,
which releases the GIL.

int8 × int8 → int32 GEMM (`gemm_int8`), called from numpy, bit-exact: a row-major i-k-j loop
nest whose j loop widens (sext i8 → i32) and is vectorised by LLVM; threads split the rows.

Packed int8 GEMM with the accelerator's requantisation epilogue (`gemm_s8`, `build_s8_module`),
the same integers as the accelerator's int32 ALU, at ``vpdpbusd`` speed:

* Both operands are packed in 4-deep k groups (K padded with zeros to a multiple of 4):
  ``Ap[ip, g, r, j] = A[ip*MR + r, 4g + j]`` and ``Bp[jp, g, c, j] = B[4g + j, jp*NR + c]``, so
  one k group of a B panel is ``NR/16`` ``<64 x i8>`` vectors (16 int32 lanes × 4 bytes) and of
  an A panel ``MR`` 4-byte words, each broadcast to 16 lanes.
* ``vpdpbusd`` multiplies unsigned by signed bytes. int8 activations are offset by 128
  (``x ^ 0x80``) when packed at run time, uint8 ones are packed as they are (``x ^ 0``); the
  constant weights stay signed, and ``z_u * sum_k W[k, n]`` (``wsum``, computed when they are
  packed) is subtracted through the bias, ``z_u`` the unsigned byte that stands for the
  activations' zero point (128 + z_x for int8, z_x for uint8):
  ``sum_k (x - z_x) W + b[n] = sum_k u W + (b[n] - z_u * wsum[n])`` holds exactly modulo 2^32.
  A convolution's padding is then the zero point itself (``im2col`` fills with ``z_x``): its
  products cancel in the correction as the graph's zero padding of ``x - z_x`` contributes
  nothing.
* Either operand may be the weights (`S8Config.weights`): "b" (channels are columns: Gemm,
  MatMul) or "a" (channels are rows: the convolution's ``Y[Cout, pixels]``, as `Conv2d`).
* The micro-kernel keeps an ``MR × NR`` int32 tile in ``MR*NR/16`` registers over the whole of
  K (no K blocking: int8 output cannot hold partial sums), then the epilogue on 16 outputs at a
  time with per-channel parameters as vectors (weights "b") or broadcasts (weights "a"): bias,
  saturation to the per-channel clamp (``smax`` / ``smin``; only in the variant built with
  `clamp`, for layers that have one), multiply, rounding shift (per-lane ``vpsravd``), the
  output's zero point (a run-time argument), clamp, narrow (the low byte: int8, or uint8 with
  bounds in [0, 255]).
* `vnni=False` builds the same kernel from plain vector IR (byte extraction and int32
  multiply-adds) for hosts without AVX-512 VNNI and for cross-compilation (aarch64).

The generic matmul (`MatmulSpec`, `matmul`): a naive loop nest (a `loops.Kernel`) for every
other MatMul / Gemm of the lowering: any dtype, batch broadcasting, transposes, C, and the
integer and quantised forms (MatMulInteger, QLinearMatMul) with zero points and requantisation.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import llvmlite.ir as ir
import numpy as np
from llvmlite.binding import llvm_version_info

from vtakit.runtime.cpu.llvm import CACHE, JitModule, host_has
from vtakit.runtime.cpu.parallel import run_parallel, split_range

from ....ir.dtypes import DType
from . import irutil as U
from . import scalar as S
from .loops import Kernel, entry_alloca, kernel_function, offset

Act = Literal["none", "relu", "clip"]
BiasMode = Literal["none", "row", "col"]
VW = 16  # floats per <16 x float> vector


@dataclass(frozen=True)
class GemmConfig:
    """Register and cache blocking. ``NR`` is a multiple of 16; ``MC``/``NC`` count rows/columns."""

    mr: int = 8
    nr: int = 48
    kc: int = 384
    mc: int = 144
    nc: int = 3072
    unroll: int = 4

    def __post_init__(self) -> None:
        if self.nr % VW or self.nr <= 0:
            raise ValueError(f"GemmConfig.nr={self.nr} must be a positive multiple of {VW}")
        if self.mc % self.mr or self.nc % self.nr:
            raise ValueError(f"GemmConfig: mc={self.mc} must be a multiple of mr={self.mr} and "
                             f"nc={self.nc} a multiple of nr={self.nr}")


DEFAULT = GemmConfig()


# (mr, nr) register blockings, with their measured relative speed at 512^3 on AVX-512.
_BLOCKINGS = ((6, 64, 1.0), (8, 48, 0.95), (12, 32, 0.88))


def choose_config(n: int, m: int | None = None) -> GemmConfig:
    """The register blocking for ``n`` GEMM columns (and `m` rows, when known) with the least
    padded work per speed. A few rows (a fully connected layer at batch 1) get ``mr = m``: such a
    GEMM streams its weights once, and padding its rows to a larger ``mr`` only multiplies the
    arithmetic."""
    def cost(blk: tuple[int, int, float]) -> float:
        return -(-n // blk[1]) * blk[1] / blk[2]

    mr, nr, _ = min(_BLOCKINGS, key=cost)
    if m is not None and 0 < m < min(b[0] for b in _BLOCKINGS):
        mr, nr = m, 64
    return GemmConfig(mr=mr, nr=nr, mc=mr * (144 // mr), nc=nr * (3072 // nr))


def _ukernel(module: ir.Module, cfg: GemmConfig, bias: BiasMode, act: Act) -> ir.Function:
    """ukernel(kc, a, b, c, ldc, first, last, bias, lo, hi): one MR×NR tile of C.

    ``first``: overwrite C (else accumulate); ``last``: apply the epilogue. ``bias`` points at the
    tile's first row (row mode) or column (col mode) entry.
    """
    mr, nr, nv = cfg.mr, cfg.nr, cfg.nr // VW
    vt = U.vec(U.F32, VW)
    fn, b = U.new_function(module, "ukernel", [
        ("kc", U.I64), ("a", U.PTR), ("b", U.PTR), ("c", U.PTR), ("ldc", U.I64),
        ("first", U.I1), ("last", U.I1), ("bias", U.PTR), ("lo", U.F32), ("hi", U.F32)],
        noalias=False)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    kc, a, bp, c, ldc, first, last, bias_p, lo, hi = fn.args
    zero = ir.Constant(vt, [0.0] * VW)

    def step(bld: ir.IRBuilder, k: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
        bvs = [U.vload(bld, VW, bp, bld.add(bld.mul(k, U.i64(nr)), U.i64(VW * v)))
               for v in range(nv)]
        out = list(acc)
        abase = bld.mul(k, U.i64(mr))
        for r in range(mr):
            s = U.splat(bld, U.load(bld, U.F32, a, bld.add(abase, U.i64(r))), VW)
            for v in range(nv):
                out[r * nv + v] = U.fma(bld, s, bvs[v], out[r * nv + v])
        return out

    # main loop, `unroll` k-steps per iteration, then a remainder loop
    acc2 = U.accumulate(b, kc, cfg.unroll, [zero] * (mr * nv), step)
    lo_v, hi_v = U.splat(b, lo, VW), U.splat(b, hi, VW)
    for r in range(mr):
        if bias == "row":
            brow = U.splat(b, U.load(b, U.F32, bias_p, r), VW)
        for v in range(nv):
            x = acc2[r * nv + v]
            off = b.add(b.mul(U.i64(r), ldc), U.i64(VW * v))
            old = U.vload(b, VW, c, off)
            x = b.select(first, x, b.fadd(x, old))
            y = x
            if bias == "row":
                y = b.fadd(y, brow)
            elif bias == "col":
                y = b.fadd(y, U.vload(b, VW, bias_p, VW * v))
            if act == "relu":
                y = U.fmax(b, y, zero)
            elif act == "clip":
                y = U.fmin(b, U.fmax(b, y, lo_v), hi_v)
            x = b.select(last, y, x)
            U.vstore(b, x, c, off)
    b.ret_void()
    return fn


def _macro(module: ir.Module, cfg: GemmConfig, bias: BiasMode, act: Act) -> None:
    """gemm_packed(ap, bp, c, bias, M, N, K, ldc, ip0, ip1, jp0, jp1, lo, hi).

    Computes the C tiles with row-panel index in [ip0, ip1) and column-panel index in [jp0, jp1).
    """
    uk = _ukernel(module, cfg, bias, act)
    mr, nr = cfg.mr, cfg.nr
    fn, b = U.new_function(module, "gemm_packed", [
        ("ap", U.PTR), ("bp", U.PTR), ("c", U.PTR), ("bias", U.PTR), ("M", U.I64),
        ("N", U.I64), ("K", U.I64), ("ldc", U.I64), ("ip0", U.I64), ("ip1", U.I64),
        ("jp0", U.I64), ("jp1", U.I64), ("lo", U.F32), ("hi", U.F32)])
    ap, bp, c, bias_p, M, N, K, ldc, ip0, ip1, jp0, jp1, lo, hi = fn.args
    tmp = b.alloca(U.F32, size=U.i64(mr * nr), name="tmp")
    tmp.align = 64
    btmp = b.alloca(U.F32, size=U.i64(max(mr, nr)), name="btmp")
    btmp.align = 64
    ncp, mcp = cfg.nc // nr, cfg.mc // mr
    with U.loop(b, jp0, jp1, ncp, "j0") as j0:
        j1 = U.imin(b, b.add(j0, U.i64(ncp)), jp1)
        with U.loop(b, 0, K, cfg.kc, "k0") as k0:
            kc = U.imin(b, U.i64(cfg.kc), b.sub(K, k0))
            first = b.icmp_signed("==", k0, U.i64(0))
            last = b.icmp_signed(">=", b.add(k0, kc), K)
            with U.loop(b, ip0, ip1, mcp, "i0") as i0:
                i1 = U.imin(b, b.add(i0, U.i64(mcp)), ip1)
                with U.loop(b, j0, j1, 1, "jp") as jp:
                    bpp = U.gep(b, U.F32, bp, b.add(b.mul(jp, b.mul(K, U.i64(nr))),
                                                    b.mul(k0, U.i64(nr))))
                    col0 = b.mul(jp, U.i64(nr))
                    nrem = U.imin(b, U.i64(nr), b.sub(N, col0))
                    with U.loop(b, i0, i1, 1, "ip") as ip:
                        app = U.gep(b, U.F32, ap, b.add(b.mul(ip, b.mul(K, U.i64(mr))),
                                                        b.mul(k0, U.i64(mr))))
                        row0 = b.mul(ip, U.i64(mr))
                        mrem = U.imin(b, U.i64(mr), b.sub(M, row0))
                        full = b.and_(b.icmp_signed("==", mrem, U.i64(mr)),
                                      b.icmp_signed("==", nrem, U.i64(nr)))
                        ctile = U.gep(b, U.F32, c, b.add(b.mul(row0, ldc), col0))
                        bias_off = row0 if bias == "row" else col0
                        with b.if_else(full) as (then, other):
                            with then:
                                b.call(uk, [kc, app, bpp, ctile, ldc, first, last,
                                            U.gep(b, U.F32, bias_p, bias_off), lo, hi])
                            with other:
                                with U.loop(b, 0, mrem, 1, "cr") as r:
                                    with U.loop(b, 0, nrem, 1, "cc") as cc:
                                        v = U.load(b, U.F32, ctile, b.add(b.mul(r, ldc), cc))
                                        U.store(b, U.F32, v, tmp,
                                                b.add(b.mul(r, U.i64(nr)), cc))
                                if bias != "none":
                                    cnt = mrem if bias == "row" else nrem
                                    with U.loop(b, 0, cnt, 1, "bb") as q:
                                        U.store(b, U.F32, U.load(b, U.F32, bias_p,
                                                                 b.add(bias_off, q)), btmp, q)
                                b.call(uk, [kc, app, bpp, tmp, U.i64(nr), first, last, btmp,
                                            lo, hi])
                                with U.loop(b, 0, mrem, 1, "sr") as r:
                                    with U.loop(b, 0, nrem, 1, "sc") as cc:
                                        v = U.load(b, U.F32, tmp, b.add(b.mul(r, U.i64(nr)), cc))
                                        U.store(b, U.F32, v, ctile, b.add(b.mul(r, ldc), cc))
    b.ret_void()


def _pack_b_ir(module: ir.Module, nr: int) -> None:
    """pack_b(src, dst, K, N, ld, jp0, jp1): dst[jp, k, c] = src[k, jp*nr + c] or 0."""
    _, b = U.new_function(module, "pack_b", [
        ("src", U.PTR), ("dst", U.PTR), ("K", U.I64), ("N", U.I64), ("ld", U.I64),
        ("jp0", U.I64), ("jp1", U.I64)])
    src, dst, K, N, ld, jp0, jp1 = b.function.args
    with U.loop(b, jp0, jp1, 1, "jp") as jp:
        col0 = b.mul(jp, U.i64(nr))
        base = b.mul(jp, b.mul(K, U.i64(nr)))
        nrem = U.imin(b, U.i64(nr), b.sub(N, col0))
        with U.loop(b, 0, K, 1, "k") as k:
            drow = b.add(base, b.mul(k, U.i64(nr)))
            srow = b.add(b.mul(k, ld), col0)
            with U.loop(b, 0, U.i64(nr), 1, "c") as cc:
                ok = b.icmp_signed("<", cc, nrem)
                idx = b.select(ok, b.add(srow, cc), U.i64(0))
                v = b.select(ok, U.load(b, U.F32, src, idx), U.f32(0.0))
                U.store(b, U.F32, v, dst, b.add(drow, cc))
    b.ret_void()


def _pack_a_ir(module: ir.Module, mr: int) -> None:
    """pack_a(src, dst, M, K, ld, ip0, ip1): dst[ip, k, r] = src[ip*mr + r, k] or 0."""
    _, b = U.new_function(module, "pack_a", [
        ("src", U.PTR), ("dst", U.PTR), ("M", U.I64), ("K", U.I64), ("ld", U.I64),
        ("ip0", U.I64), ("ip1", U.I64)])
    src, dst, M, K, ld, ip0, ip1 = b.function.args
    with U.loop(b, ip0, ip1, 1, "ip") as ip:
        row0 = b.mul(ip, U.i64(mr))
        base = b.mul(ip, b.mul(K, U.i64(mr)))
        for r in range(mr):
            row = b.add(row0, U.i64(r))
            ok = b.icmp_signed("<", row, M)
            srow = b.mul(b.select(ok, row, U.i64(0)), ld)
            with U.loop(b, 0, K, 1, f"k{r}") as k:
                v = b.select(ok, U.load(b, U.F32, src, b.add(srow, k)), U.f32(0.0))
                U.store(b, U.F32, v, dst, b.add(base, b.add(b.mul(k, U.i64(mr)), U.i64(r))))
    b.ret_void()


def build_module(cfg: GemmConfig, bias: BiasMode, act: Act) -> ir.Module:
    m = ir.Module(name=f"gemm_mr{cfg.mr}_nr{cfg.nr}_{bias}_{act}")
    _macro(m, cfg, bias, act)
    _pack_a_ir(m, cfg.mr)
    _pack_b_ir(m, cfg.nr)
    return m


def kernels(cfg: GemmConfig = DEFAULT, bias: BiasMode = "none", act: Act = "none") -> JitModule:
    """The compiled GEMM module for one variant (compiled once per process)."""
    return CACHE.get(("gemm", cfg, bias, act), lambda: build_module(cfg, bias, act))


_P = ctypes.c_void_p
_L = ctypes.c_int64
_F = ctypes.c_float
MACRO_ARGS = (_P, _P, _P, _P, _L, _L, _L, _L, _L, _L, _L, _L, _F, _F)
PACK_ARGS = (_P, _P, _L, _L, _L, _L, _L)


def _ptr(x: np.ndarray) -> int:
    return x.ctypes.data


def check_array(x: object, name: str, ndim: int, dtype: type = np.float32) -> np.ndarray:
    """Check `x` is a C-contiguous `dtype` ndarray with `ndim` dimensions."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray of {np.dtype(dtype).name}, "
                        f"got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype).name}, got {x.dtype.name}")
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {x.strides} "
                         f"for shape {x.shape}; pass numpy.ascontiguousarray({name})")
    return x


def _check_act(act: str | None, clip: tuple[float, float] | None) -> tuple[Act, float, float]:
    if act is None or act == "none":
        return "none", 0.0, 0.0
    if act == "relu":
        return "relu", 0.0, 0.0
    if act == "clip":
        if clip is None or len(clip) != 2 or not clip[0] <= clip[1]:
            raise ValueError(f"act='clip' needs clip=(lo, hi) with lo <= hi, got clip={clip!r}")
        return "clip", float(clip[0]), float(clip[1])
    raise ValueError(f"act={act!r} not supported (expected None, 'relu' or 'clip')")


@dataclass(frozen=True)
class PackedB:
    """``B[K, N]`` packed into ``NR``-column panels: ``data`` has shape (ceil(N/NR), K, NR)."""

    data: np.ndarray
    k: int
    n: int
    cfg: GemmConfig

    @property
    def panels(self) -> int:
        return self.data.shape[0]


@dataclass(frozen=True)
class PackedA:
    """``A[M, K]`` packed into ``MR``-row panels: ``data`` has shape (ceil(M/MR), K, MR)."""

    data: np.ndarray
    m: int
    k: int
    cfg: GemmConfig

    @property
    def panels(self) -> int:
        return self.data.shape[0]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pack_b(b: np.ndarray, cfg: GemmConfig | None = None) -> PackedB:
    """Pack weights ``B[K, N]`` once, for many `gemm` calls (blocking chosen from N if no cfg)."""
    check_array(b, "pack_b: b", 2)
    k, n = b.shape
    cfg = cfg or choose_config(n)
    jm = kernels(cfg)
    out = np.empty((_cdiv(n, cfg.nr), k, cfg.nr), np.float32)
    jm.cfunc("pack_b", None, *PACK_ARGS)(_ptr(b), _ptr(out), k, n, n, 0, out.shape[0])
    return PackedB(out, k, n, cfg)


def pack_a(a: np.ndarray, cfg: GemmConfig = DEFAULT, threads: int = 1) -> PackedA:
    """Pack ``A[M, K]`` into ``MR``-row panels (a convolution's constant weights, or at run
    time)."""
    check_array(a, "pack_a: a", 2)
    m, k = a.shape
    fn = kernels(cfg).cfunc("pack_a", None, *PACK_ARGS)
    out = np.empty((_cdiv(m, cfg.mr), k, cfg.mr), np.float32)
    run_parallel([lambda lo=lo, hi=hi: fn(_ptr(a), _ptr(out), m, k, k, lo, hi)
                  for lo, hi in split_range(out.shape[0], threads)])
    return PackedA(out, m, k, cfg)


def gemm_packed(pa: PackedA, pb: PackedB, out: np.ndarray, bias: np.ndarray | None,
                bias_mode: BiasMode, act: Act, lo: float, hi: float, threads: int) -> None:
    """C = Ap @ Bp (+bias)(act) into `out` (shape (M, N), any row stride ≥ N via out.strides)."""
    cfg = pa.cfg
    m, n, k = pa.m, pb.n, pa.k
    fn = kernels(cfg, bias_mode if bias is not None else "none", act).cfunc(
        "gemm_packed", None, *MACRO_ARGS)
    ldc = out.strides[0] // 4
    bp = _ptr(bias) if bias is not None else None
    mt, nt = pa.panels, pb.panels
    # Split the dimension with more tiles; each thread owns disjoint C tiles.
    if mt >= nt * 2 or nt < threads:
        parts = [(lo_, hi_, 0, nt) for lo_, hi_ in split_range(mt, threads)]
    else:
        parts = [(0, mt, lo_, hi_) for lo_, hi_ in split_range(nt, threads)]
    args = (_ptr(pa.data), _ptr(pb.data), _ptr(out), bp, m, n, k, ldc)
    run_parallel([lambda p=p: fn(*args, *p, lo, hi) for p in parts])


def gemm(a: np.ndarray, b: PackedB | np.ndarray, out: np.ndarray | None = None,
         bias: np.ndarray | None = None, act: str | None = None,
         clip: tuple[float, float] | None = None, threads: int = 1) -> np.ndarray:
    """``out = act(a @ b + bias)``, float32.

    Parameters
    ----------
    a : (M, K) float32, C-contiguous
    b : `PackedB` from `pack_b` (weights), or a (K, N) float32 array (packed on every call)
    out : optional (M, N) float32 C-contiguous output
    bias : optional (N,) float32, added to every row
    act : None, 'relu' or 'clip' (with ``clip=(lo, hi)``)
    threads : number of threads (the M or N tiles are split between them)
    """
    check_array(a, "gemm: a", 2)
    if isinstance(b, np.ndarray):
        b = pack_b(check_array(b, "gemm: b", 2))
    elif not isinstance(b, PackedB):
        raise TypeError(f"gemm: b: expected PackedB or numpy.ndarray, got {type(b).__name__}")
    m, k = a.shape
    if k != b.k:
        raise ValueError(f"gemm: a has shape {a.shape} (K={k}) but b has K={b.k} "
                         f"(b is ({b.k}, {b.n})); expected a of shape ({m}, {b.k})")
    n = b.n
    if out is None:
        out = np.empty((m, n), np.float32)
    else:
        check_array(out, "gemm: out", 2)
        if out.shape != (m, n):
            raise ValueError(f"gemm: out has shape {out.shape}, expected {(m, n)}")
    if bias is not None:
        check_array(bias, "gemm: bias", 1)
        if bias.shape != (n,):
            raise ValueError(f"gemm: bias has shape {bias.shape}, expected ({n},)")
    kind, lo, hi = _check_act(act, clip)
    if threads < 1:
        raise ValueError(f"gemm: threads={threads}, expected >= 1")
    if m == 0 or n == 0:
        return out
    if k == 0:
        out[...] = 0.0 if bias is None else bias
        _apply_act_np(out, kind, lo, hi)
        return out
    pa = pack_a(a, b.cfg, threads)
    gemm_packed(pa, b, out, bias, "col", kind, lo, hi, threads)
    return out


def _apply_act_np(out: np.ndarray, kind: Act, lo: float, hi: float) -> None:
    # Only for the degenerate K == 0 case (no arithmetic to generate code for).
    if kind == "relu":
        np.maximum(out, 0, out=out)
    elif kind == "clip":
        np.clip(out, lo, hi, out=out)


# -- int8, called from numpy ----------------------------------------------------------------------

def _int8_module() -> ir.Module:
    """gemm_i8(a, b, c, M, N, K, m0, m1): rows [m0, m1) of C = A @ B."""
    m = ir.Module(name="gemm_i8")
    _, b = U.new_function(m, "gemm_i8", [("a", U.PTR), ("b", U.PTR), ("c", U.PTR),
                                          ("M", U.I64), ("N", U.I64), ("K", U.I64),
                                          ("m0", U.I64), ("m1", U.I64)])
    a, bb, c, _M, N, K, m0, m1 = b.function.args
    with U.loop(b, m0, m1, 1, "i") as i:
        crow = b.mul(i, N)
        with U.loop(b, 0, N, 1, "z") as j:
            U.store(b, U.I32, ir.Constant(U.I32, 0), c, b.add(crow, j))
        with U.loop(b, 0, K, 1, "k") as k:
            av = b.sext(U.load(b, U.I8, a, b.add(b.mul(i, K), k)), U.I32)
            brow = b.mul(k, N)
            with U.loop(b, 0, N, 1, "j") as j:
                bv = b.sext(U.load(b, U.I8, bb, b.add(brow, j)), U.I32)
                idx = b.add(crow, j)
                U.store(b, U.I32, b.add(U.load(b, U.I32, c, idx), b.mul(av, bv)), c, idx)
    b.ret_void()
    return m


def gemm_int8(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
              threads: int = 1) -> np.ndarray:
    """``out = a @ b`` with int8 inputs and exact int32 accumulation (wraps like int32 on
    overflow, which needs K > 131072)."""
    check_array(a, "gemm_int8: a", 2, np.int8)
    check_array(b, "gemm_int8: b", 2, np.int8)
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(f"gemm_int8: a has shape {a.shape} but b has shape {b.shape}; "
                         f"expected b of shape ({k}, N)")
    n = b.shape[1]
    if out is None:
        out = np.empty((m, n), np.int32)
    else:
        check_array(out, "gemm_int8: out", 2, np.int32)
        if out.shape != (m, n):
            raise ValueError(f"gemm_int8: out has shape {out.shape}, expected {(m, n)}")
    fn = CACHE.get(("gemm_i8",), _int8_module).cfunc("gemm_i8", None, *(_P,) * 3, *(_L,) * 5)
    run_parallel([lambda s=s, e=e: fn(a.ctypes.data, b.ctypes.data, out.ctypes.data, m, n, k,
                                      s, e)
                  for s, e in split_range(m, threads)])
    return out


# -- int8 × int8 → int32, packed: VNNI (or portable) micro-kernel, requantisation epilogue -------

S8Side = Literal["a", "b"]
S8Epilogue = Literal["bias", "requant"]
S8_KG = 4  # k values per packed group: one ``vpdpbusd`` lane sums 4 byte products
S8_XOR = 0x80  # activation byte ^ 0x80 = activation + 128 as an unsigned byte
_V16 = 16  # int32 lanes per vector


@dataclass(frozen=True)
class S8Config:
    """Blocking of the int8 GEMM and which operand holds the constant weights.

    ``weights="b"``: ``C[M, N] = A[M, K] @ W[K, N]``, channels are columns (Gemm / MatMul, and
    a convolution with pixels as rows). ``weights="a"``: ``C[N, P] = W[N, K] @ X[K, P]``,
    channels are rows (the float32 `Conv2d`'s orientation: output channels × pixels, NCHW).
    ``nr`` is a multiple of 16 (int32 lanes); ``mc`` counts rows per cache block.
    """

    mr: int = 8
    nr: int = 32
    mc: int = 64
    unroll: int = 2
    weights: S8Side = "b"
    # the output stored transposed, C[m, n] at ``c + n * ldc + m`` (weights "b" only): a
    # convolution computed with its pixels as the rows M, stored NCHW (channels N major)
    store_t: bool = False

    def __post_init__(self) -> None:
        if self.nr % _V16 or self.nr <= 0 or self.mr <= 0:
            raise ValueError(f"S8Config: nr={self.nr} must be a positive multiple of {_V16} and "
                             f"mr={self.mr} positive")
        if self.mc % self.mr or self.mc <= 0 or self.unroll < 1:
            raise ValueError(f"S8Config: mc={self.mc} must be a positive multiple of "
                             f"mr={self.mr} and unroll={self.unroll} >= 1")
        if self.weights not in ("a", "b"):
            raise ValueError(f"S8Config: weights={self.weights!r}, expected 'a' or 'b'")
        if self.store_t and self.weights != "b":
            raise ValueError("S8Config: store_t=True needs weights='b'")

    @property
    def channel_width(self) -> int:
        """Channels per weight panel: ``nr`` (weights in B) or ``mr`` (weights in A)."""
        return self.nr if self.weights == "b" else self.mr


@functools.cache
def default_vnni() -> bool:
    """The kernel variant for this host: ``vpdpbusd`` where the CPU has AVX-512 VNNI."""
    return host_has("avx512vnni")


def _vpdpbusd(b: ir.IRBuilder, acc: ir.Value, u8: ir.Value, s8: ir.Value) -> ir.Value:
    # LLVM 22 types the byte operands <64 x i8> (llvm-project PR #155194); before, <16 x i32>.
    vt = U.vec(U.I32, _V16)
    if llvm_version_info >= (22,):
        bt: ir.Type = U.vec(U.I8, 64)
    else:
        bt, u8, s8 = vt, b.bitcast(u8, vt), b.bitcast(s8, vt)
    fn = U.intrinsic(b.module, "llvm.x86.avx512.vpdpbusd.512", vt, [vt, bt, bt])
    return b.call(fn, [acc, u8, s8])


def _lane_bytes(b: ir.IRBuilder, x: ir.Value, j: int, signed: bool) -> ir.Value:
    """Byte j of each int32 lane of `x` (<64 x i8>), sign- or zero-extended in place."""
    vt = U.vec(U.I32, _V16)
    x = b.bitcast(x, vt)
    if signed:
        return b.ashr(b.shl(x, U.const_vec(U.I32, _V16, 24 - 8 * j)), U.const_vec(U.I32, _V16, 24))
    return b.and_(b.lshr(x, U.const_vec(U.I32, _V16, 8 * j)), U.const_vec(U.I32, _V16, 255))


def _ivec_intrinsic(b: ir.IRBuilder, name: str, x: ir.Value, y: ir.Value) -> ir.Value:
    t = x.type
    return b.call(U.intrinsic(b.module, f"llvm.{name}.v{t.count}i32", t, [t, t]), [x, y])


def _masked_store(b: ir.IRBuilder, v: ir.Value, ptr: ir.Value, mask: ir.Value) -> None:
    t = v.type
    elt = "i8" if t.element == U.I8 else "i32"
    fn = U.intrinsic(b.module, f"llvm.masked.store.v{t.count}{elt}.p0", U.VOID,
                     [t, U.PTR, U.I32, U.vec(U.I1, t.count)])
    b.call(fn, [v, ptr, ir.Constant(U.I32, 1), mask])


def _s8_ukernel(module: ir.Module, cfg: S8Config, epilogue: S8Epilogue, out_bits: int,
                vnni: bool, clamp: bool) -> ir.Function:
    """ukernel_s8(k4, a, b, c, ldc, mrem, nrem, bias, mult, shift, clamp_lo, clamp_hi, lo, hi,
    zp): one MR×NR tile.

    ``a``/``b`` point at the tile's packed panels, ``c`` at its first output element; the
    per-channel parameters at its first channel (a column, or a row when the weights are A);
    ``clamp_lo`` / ``clamp_hi`` are read only when `clamp`. Stores rows < mrem and columns <
    nrem.
    """
    mr, nr, nv = cfg.mr, cfg.nr, cfg.nr // _V16
    vt, bytes_t = U.vec(U.I32, _V16), U.vec(U.I8, 64)
    ot = U.I8 if out_bits == 8 else U.I32
    fn, b = U.new_function(module, "ukernel_s8", [
        ("k4", U.I64), ("a", U.PTR), ("b", U.PTR), ("c", U.PTR), ("ldc", U.I64),
        ("mrem", U.I64), ("nrem", U.I64), ("bias", U.PTR), ("mult", U.PTR), ("shift", U.PTR),
        ("clamp_lo", U.PTR), ("clamp_hi", U.PTR), ("lo", U.I32), ("hi", U.I32),
        ("zp", U.I32)], noalias=False)
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    k4, a, bp, c, ldc, mrem, nrem, bias_p, mult_p, shift_p, clo_p, chi_p, lo, hi, zp = fn.args
    zero = ir.Constant(vt, [0] * _V16)

    # The activations are the unsigned operand (int8 ones offset by 128): B's vectors when the
    # weights are A, A's broadcast words when the weights are B.
    a_signed = cfg.weights == "a"

    def step(bld: ir.IRBuilder, k: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
        boff = bld.mul(k, U.i64(nr * S8_KG))
        bvs = [U.vload(bld, 64, bp, bld.add(boff, U.i64(64 * v)), U.I8, align=1)
               for v in range(nv)]
        aoff = bld.mul(k, U.i64(mr))
        out = list(acc)
        if vnni:
            for r in range(mr):
                aw = U.load(bld, U.I32, a, bld.add(aoff, U.i64(r)), align=1)
                av = bld.bitcast(U.splat(bld, aw, _V16), bytes_t)
                for v in range(nv):
                    u8, s8 = (bvs[v], av) if a_signed else (av, bvs[v])
                    out[r * nv + v] = _vpdpbusd(bld, out[r * nv + v], u8, s8)
            return out
        # Portable: one k of the group at a time, int32 multiply-adds of bytes extended in
        # place (B's vectors) or loaded as scalars and broadcast (A's), so that few values are
        # live at once. Each product fits 16 bits, which x86 turns into vpmaddwd / vpdpwssd.
        for j in range(S8_KG):
            bj = [_lane_bytes(bld, x, j, not a_signed) for x in bvs]
            for r in range(mr):
                ab = U.load(bld, U.I8, a, bld.add(bld.mul(bld.add(aoff, U.i64(r)), U.i64(
                    S8_KG)), U.i64(j)))
                aj = U.splat(bld, bld.sext(ab, U.I32) if a_signed else bld.zext(ab, U.I32), _V16)
                for v in range(nv):
                    out[r * nv + v] = bld.add(out[r * nv + v], bld.mul(aj, bj[v]))
        return out

    # main loop, `unroll` k-groups per iteration, then a remainder loop (as the f32 kernel)
    acc2 = U.accumulate(b, k4, cfg.unroll, [zero] * (mr * nv), step)

    # Epilogue on 16 outputs per vector op (16 channels when the weights are B, with per-lane
    # clamps, multipliers and shifts: vpmaxsd, vpminsd, vpmulld, vpsllvd, vpsravd; 16 pixels of
    # one channel when they are A), the zero point, clamp with smax / smin, narrow to int8
    # (vpmovdb).
    lo_v, hi_v, zp_v = U.splat(b, lo, _V16), U.splat(b, hi, _V16), U.splat(b, zp, _V16)
    one = U.const_vec(U.I32, _V16, 1)

    def chan(ptr: ir.Value, r: int, v: int) -> ir.Value:
        if cfg.weights == "b":
            return U.vload(b, _V16, ptr, U.i64(_V16 * v), U.I32, align=4)
        return U.splat(b, U.load(b, U.I32, ptr, r), _V16)

    params: dict[tuple[int, int], tuple[ir.Value, ...]] = {}
    for r in range(mr if cfg.weights == "a" else 1):
        for v in range(nv if cfg.weights == "b" else 1):
            bias = chan(bias_p, r, v)
            if epilogue == "requant":
                s = chan(shift_p, r, v)
                rnd = b.lshr(b.shl(one, s), one)  # 1 << (s - 1), or 0 for s == 0
                sat = (chan(clo_p, r, v), chan(chi_p, r, v)) if clamp else ()
                params[r, v] = (bias, chan(mult_p, r, v), s, rnd, *sat)
            else:
                params[r, v] = (bias,)
    vals = []
    for r in range(mr):
        for v in range(nv):
            prm = params[r if cfg.weights == "a" else 0, v if cfg.weights == "b" else 0]
            t = b.add(acc2[r * nv + v], prm[0])
            if epilogue == "requant":
                if clamp:
                    t = _ivec_intrinsic(b, "smin", _ivec_intrinsic(b, "smax", t, prm[4]),
                                        prm[5])
                t = b.add(b.ashr(b.add(b.mul(t, prm[1]), prm[3]), prm[2]), zp_v)
                t = _ivec_intrinsic(b, "smin", _ivec_intrinsic(b, "smax", t, lo_v), hi_v)
            vals.append(b.trunc(t, U.vec(U.I8, _V16)) if out_bits == 8 else t)

    full = b.and_(b.icmp_signed("==", mrem, U.i64(mr)), b.icmp_signed("==", nrem, U.i64(nr)))
    if cfg.store_t:
        # C[m, n] at c + n * ldc + m: element by element (a tile's mr * nr stores against its
        # K / 4 * mr * nr / 16 multiply-adds), those inside the tile's remainder
        with b.if_else(full) as (then, other):
            for part, guard in ((then, False), (other, True)):
                with part:
                    for r in range(mr):
                        for v in range(nv):
                            for i in range(_V16):
                                col = _V16 * v + i
                                ptr = U.gep(b, ot, c, b.add(b.mul(U.i64(col), ldc), U.i64(r)))
                                val = b.extract_element(vals[r * nv + v],
                                                        ir.Constant(U.I32, i))
                                if not guard:
                                    b.store(val, ptr)
                                    continue
                                ok = b.and_(b.icmp_signed("<", U.i64(r), mrem),
                                            b.icmp_signed("<", U.i64(col), nrem))
                                with b.if_then(ok):
                                    b.store(val, ptr)
        b.ret_void()
        return fn
    with b.if_else(full) as (then, other):
        with then:
            for r in range(mr):
                for v in range(nv):
                    U.vstore(b, vals[r * nv + v], c,
                             b.add(b.mul(U.i64(r), ldc), U.i64(_V16 * v)), ot, align=1)
        with other:
            nrem_v = U.splat(b, nrem, _V16)
            masks = [b.icmp_signed("<", ir.Constant(U.vec(U.I64, _V16), [
                _V16 * v + i for i in range(_V16)]), nrem_v) for v in range(nv)]
            for r in range(mr):
                with b.if_then(b.icmp_signed("<", U.i64(r), mrem)):
                    for v in range(nv):
                        ptr = U.gep(b, ot, c, b.add(b.mul(U.i64(r), ldc), U.i64(_V16 * v)))
                        _masked_store(b, vals[r * nv + v], ptr, masks[v])
    b.ret_void()
    return fn


def _s8_macro(module: ir.Module, cfg: S8Config, epilogue: S8Epilogue, out_bits: int,
              vnni: bool, clamp: bool) -> None:
    """gemm_s8(ap, bp, c, bias, mult, shift, clamp_lo, clamp_hi, M, N, K, ldc, ip0, ip1, jp0,
    jp1, lo, hi, zp).

    C tiles with row-panel index in [ip0, ip1) and column-panel index in [jp0, jp1); row stride
    ``ldc`` elements; ``K`` unpadded. ``bias`` / ``mult`` / ``shift`` / ``clamp_lo`` /
    ``clamp_hi``: int32 per channel, padded to whole panels (`s8_channel_params`); the "bias"
    epilogue reads only ``bias``, the clamps are read only when `clamp`; ``zp``: the output's
    zero point, added after the shift ("requant" only). Loops: blocks of
    ``mc`` rows (their A panels stay in L2), then the B panels, then the A panels of the block,
    so each B panel is reused ``mc / mr`` times.
    """
    uk = _s8_ukernel(module, cfg, epilogue, out_bits, vnni, clamp)
    mr, nr = cfg.mr, cfg.nr
    esize = out_bits // 8
    fn, b = U.new_function(module, "gemm_s8", [
        ("ap", U.PTR), ("bp", U.PTR), ("c", U.PTR), ("bias", U.PTR), ("mult", U.PTR),
        ("shift", U.PTR), ("clamp_lo", U.PTR), ("clamp_hi", U.PTR), ("M", U.I64),
        ("N", U.I64), ("K", U.I64), ("ldc", U.I64), ("ip0", U.I64), ("ip1", U.I64),
        ("jp0", U.I64), ("jp1", U.I64), ("lo", U.I64), ("hi", U.I64), ("zp", U.I64)])
    (ap, bp, c, bias_p, mult_p, shift_p, clo_p, chi_p, M, N, K, ldc, ip0, ip1, jp0, jp1, lo,
     hi, zp) = fn.args
    k4 = b.udiv(b.add(K, U.i64(S8_KG - 1)), U.i64(S8_KG))
    apanel, bpanel = b.mul(k4, U.i64(mr * S8_KG)), b.mul(k4, U.i64(nr * S8_KG))
    lo32, hi32, zp32 = b.trunc(lo, U.I32), b.trunc(hi, U.I32), b.trunc(zp, U.I32)
    mcp = cfg.mc // mr
    with U.loop(b, ip0, ip1, mcp, "i0") as i0:
        i1 = U.imin(b, b.add(i0, U.i64(mcp)), ip1)
        with U.loop(b, jp0, jp1, 1, "jp") as jp:
            bpp = U.gep(b, U.I8, bp, b.mul(jp, bpanel))
            col0 = b.mul(jp, U.i64(nr))
            nrem = U.imin(b, U.i64(nr), b.sub(N, col0))
            with U.loop(b, i0, i1, 1, "ip") as ip:
                app = U.gep(b, U.I8, ap, b.mul(ip, apanel))
                row0 = b.mul(ip, U.i64(mr))
                mrem = U.imin(b, U.i64(mr), b.sub(M, row0))
                first = b.add(b.mul(col0, ldc), row0) if cfg.store_t else \
                    b.add(b.mul(row0, ldc), col0)
                ctile = U.gep(b, U.I8, c, b.mul(first, U.i64(esize)))
                ch = b.mul(col0 if cfg.weights == "b" else row0, U.i64(4))
                b.call(uk, [k4, app, bpp, ctile, ldc, mrem, nrem, U.gep(b, U.I8, bias_p, ch),
                            U.gep(b, U.I8, mult_p, ch), U.gep(b, U.I8, shift_p, ch),
                            U.gep(b, U.I8, clo_p, ch), U.gep(b, U.I8, chi_p, ch), lo32, hi32,
                            zp32])
    b.ret_void()


def _masked_load_i8(b: ir.IRBuilder, ptr: ir.Value, mask: ir.Value,
                    fill: ir.Value | None = None) -> ir.Value:
    """Bytes at `ptr` where `mask` is set (the others are not read), `fill`'s lanes (a vector
    of bytes; default 0) elsewhere."""
    n = mask.type.count
    vt = U.vec(U.I8, n)
    fn = U.intrinsic(b.module, f"llvm.masked.load.v{n}i8.p0", vt,
                     [U.PTR, U.I32, U.vec(U.I1, n), vt])
    return b.call(fn, [ptr, ir.Constant(U.I32, 1), mask,
                       ir.Constant(vt, [0] * n) if fill is None else fill])


def _s8_pack_ir(module: ir.Module, name: str, width: int) -> None:
    """name(src, dst, rows, K, s_row, s_k, p0, p1, xor): panels [p0, p1) of ``width`` rows in
    4-deep k groups, ``dst[p, g, w, j] = (src[(p*width + w)*s_row + (4g + j)*s_k] or 0 past
    rows or K) ^ xor``. Fast paths: whole panels contiguous across rows (``s_row == 1``: B =
    activations [K, P]) and rows contiguous in k (``s_k == 1``: A = activations [M, K])."""
    fn, b = U.new_function(module, name, [
        ("src", U.PTR), ("dst", U.PTR), ("rows", U.I64), ("K", U.I64), ("s_row", U.I64),
        ("s_k", U.I64), ("p0", U.I64), ("p1", U.I64), ("xor", U.I64)])
    src, dst, rows, K, s_row, s_k, p0, p1, xor = fn.args
    k4 = b.udiv(b.add(K, U.i64(S8_KG - 1)), U.i64(S8_KG))
    kfull = b.udiv(K, U.i64(S8_KG))
    x8 = b.trunc(xor, U.I8)
    x32 = b.mul(b.zext(x8, U.I32), ir.Constant(U.I32, 0x01010101))
    panel = b.mul(k4, U.i64(width * S8_KG))
    cols = b.icmp_signed("==", s_row, U.i64(1))
    rowk = b.and_(b.icmp_signed("==", s_k, U.i64(1)), b.not_(cols))

    with U.loop(b, p0, p1, 1, "p") as p:
        base = b.mul(p, panel)
        wbase = b.udiv(base, U.i64(S8_KG))  # in int32 words
        row0 = b.mul(p, U.i64(width))
        valid = U.imax(b, U.imin(b, U.i64(width), b.sub(rows, row0)), U.i64(0))
        with b.if_then(cols):
            # 4 masked loads of `width` bytes (k = 4g..4g+3) merged into `width` int32 words:
            # byte j of word w is k = 4g + j (little-endian targets). A width that is not a
            # power of two (7 rows: a 7x7 map's 49 pixels) works on the next power of two's
            # lanes, those past `width` neither loaded nor stored (odd-sized vectors are
            # scalarised)
            vwid = 1 << (width - 1).bit_length()
            vlanes = ir.Constant(U.vec(U.I64, vwid), list(range(vwid)))
            in_rows = b.icmp_signed("<", vlanes, U.splat(b, valid, vwid))
            in_width = ir.Constant(U.vec(U.I1, vwid), [lane < width for lane in range(vwid)])
            def zip2(x: ir.Value, y: ir.Value) -> ir.Value:
                n = x.type.count
                return b.shuffle_vector(x, y, ir.Constant(U.vec(U.I32, 2 * n), [
                    i // 2 + (n if i % 2 else 0) for i in range(2 * n)]))

            def groups(g0: ir.Value, g1: ir.Value, masked: bool) -> None:
                with U.loop(b, g0, g1, 1, "g") as g:
                    ks = []
                    for j in range(S8_KG):
                        kk = b.add(b.mul(g, U.i64(S8_KG)), U.i64(j))
                        ptr = U.gep(b, U.I8, src, b.add(row0, b.mul(kk, s_k)))
                        if masked:
                            mask = b.and_(in_rows, U.splat(b, b.icmp_signed("<", kk, K), vwid))
                            ks.append(_masked_load_i8(b, ptr, mask))
                        elif vwid != width:
                            ks.append(_masked_load_i8(b, ptr, in_width))
                        else:
                            ks.append(U.vload(b, width, ptr, 0, U.I8, align=1))
                    h16 = U.vec(U.I16, vwid)
                    word = zip2(b.bitcast(zip2(ks[0], ks[1]), h16),
                                b.bitcast(zip2(ks[2], ks[3]), h16))
                    word = b.xor(b.bitcast(word, U.vec(U.I32, vwid)), U.splat(b, x32, vwid))
                    at = b.add(wbase, b.mul(g, U.i64(width)))
                    if vwid == width:
                        U.vstore(b, word, dst, at, U.I32, align=1)
                    else:
                        _masked_store(b, word, U.gep(b, U.I32, dst, at), in_width)

            # whole groups of a whole panel unmasked, the rest (k tail, last panel) masked
            gfull = b.select(b.icmp_signed("==", valid, U.i64(width)), kfull, U.i64(0))
            groups(U.i64(0), gfull, False)
            groups(gfull, k4, True)
        with b.if_then(rowk):
            # one 4-byte word per row and whole group; for a whole panel of 2^i <= 16 rows,
            # 16 bytes (4 groups) of each row at a time, transposed into 4 groups of the panel
            g0 = U.i64(0)
            if width <= 16 and width & (width - 1) == 0:
                whole = b.icmp_signed("==", valid, U.i64(width))
                g0 = b.select(whole, b.mul(b.udiv(kfull, U.i64(4)), U.i64(4)), U.i64(0))
                wt4 = U.vec(U.I32, 4 * width)
                with U.loop(b, 0, g0, 4, "g4") as g:
                    rows4 = [U.vload(b, 4, U.gep(b, U.I8, src, b.add(b.mul(b.add(
                        row0, U.i64(w)), s_row), b.mul(g, U.i64(S8_KG)))), 0, U.I32, align=1)
                        for w in range(width)]
                    while len(rows4) > 1:  # concatenate: row w's 4 words at 4w..4w+3
                        n = rows4[0].type.count
                        rows4 = [b.shuffle_vector(x, y, ir.Constant(U.vec(U.I32, 2 * n), list(
                            range(2 * n)))) for x, y in zip(rows4[::2], rows4[1::2], strict=True)]
                    t = b.shuffle_vector(rows4[0], ir.Constant(wt4, ir.Undefined), ir.Constant(
                        wt4, [4 * w + q for q in range(4) for w in range(width)]))
                    U.vstore(b, b.xor(t, U.splat(b, x32, 4 * width)), dst,
                             b.add(wbase, b.mul(g, U.i64(width))), U.I32, align=1)
            with U.loop(b, 0, valid, 1, "w") as w:
                srow = U.gep(b, U.I8, src, b.mul(b.add(row0, w), s_row))
                with U.loop(b, g0, kfull, 1, "gw") as g:
                    word = U.load(b, U.I32, srow, g, align=1)
                    U.store(b, U.I32, b.xor(word, x32), dst,
                            b.add(wbase, b.add(b.mul(g, U.i64(width)), w)), align=1)
        # The rest byte by byte: the k tail of `rowk`, or all of a strided source.
        gstart = b.select(cols, k4, b.select(rowk, kfull, U.i64(0)))
        with U.loop(b, 0, valid, 1, "wb") as w:
            with U.loop(b, b.mul(gstart, U.i64(S8_KG)), b.mul(k4, U.i64(S8_KG)), 1, "kb") as kk:
                ok = b.icmp_signed("<", kk, K)
                idx = b.select(ok, b.add(b.mul(b.add(row0, w), s_row), b.mul(kk, s_k)),
                               U.i64(0))
                v = b.xor(b.select(ok, U.load(b, U.I8, src, idx), ir.Constant(U.I8, 0)), x8)
                g = b.lshr(kk, U.i64(2))
                U.store(b, U.I8, v, dst, b.add(base, b.add(b.mul(b.add(
                    b.mul(g, U.i64(width)), w), U.i64(S8_KG)), b.and_(kk, U.i64(3)))))
        with U.loop(b, valid, U.i64(width), 1, "wz") as w:  # rows past the end
            with U.loop(b, b.select(cols, k4, U.i64(0)), k4, 1, "kz") as g:
                U.store(b, U.I32, x32, dst, b.add(wbase, b.add(b.mul(g, U.i64(width)), w)),
                        align=1)
    b.ret_void()


def build_s8_module(cfg: S8Config, epilogue: S8Epilogue = "bias", out_bits: int = 32,
                    vnni: bool = True, clamp: bool = False) -> ir.Module:
    """The int8 GEMM module of one variant: ``gemm_s8`` (`S8_MACRO_ARGS`), ``pack_a_s8`` and
    ``pack_b_s8`` (`S8_PACK_ARGS`).

    `vnni` picks ``vpdpbusd`` (x86-64 with AVX-512 VNNI only: LLVM aborts the process when
    asked to emit it for another target) or portable vector IR (any target, e.g.
    ``emit_object(module, AARCH64_TRIPLE)``); both compute the same integers from the same
    packed data. `epilogue`: "bias" (``acc + bias``) or "requant" (the full requantisation with
    clamp); `out_bits`: 8 or 32; `clamp`: "requant" saturates to the per-channel clamps before
    the multiply (REQUANTIZE's ``clamp``; without it the clamp arrays are not read).
    """
    if epilogue not in ("bias", "requant") or out_bits not in (8, 32):
        raise ValueError(f"build_s8_module: epilogue={epilogue!r} (expected 'bias' or "
                         f"'requant') and out_bits={out_bits} (expected 8 or 32)")
    if out_bits == 8 and epilogue != "requant":
        raise ValueError("build_s8_module: int8 output needs epilogue='requant' (the clamp)")
    if clamp and epilogue != "requant":
        raise ValueError("build_s8_module: clamp=True needs epilogue='requant'")
    m = ir.Module(name=f"gemm_s8_mr{cfg.mr}_nr{cfg.nr}_{cfg.weights}{'t' if cfg.store_t else ''}"
                       f"_{epilogue}_o{out_bits}_{'vnni' if vnni else 'portable'}"
                       f"{'_clamp' if clamp else ''}")
    _s8_macro(m, cfg, epilogue, out_bits, vnni, clamp)
    _s8_pack_ir(m, "pack_a_s8", cfg.mr)
    _s8_pack_ir(m, "pack_b_s8", cfg.nr)
    return m


def _s8_pack_module(cfg: S8Config) -> ir.Module:
    """Only the packers of `build_s8_module` (the same in every variant)."""
    m = ir.Module(name=f"pack_s8_mr{cfg.mr}_nr{cfg.nr}")
    _s8_pack_ir(m, "pack_a_s8", cfg.mr)
    _s8_pack_ir(m, "pack_b_s8", cfg.nr)
    return m


def s8_kernels(cfg: S8Config, epilogue: S8Epilogue = "bias", out_bits: int = 32,
               vnni: bool | None = None, clamp: bool = False) -> JitModule:
    """The compiled int8 GEMM module of one variant (once per process); `vnni` defaults to
    `default_vnni`."""
    vnni = default_vnni() if vnni is None else vnni
    if vnni and not default_vnni():
        raise ValueError("gemm_s8: vnni=True needs AVX-512 VNNI, which this CPU lacks "
                         "(host_has('avx512vnni') is False); use vnni=False or None")
    return CACHE.get(("gemm_s8", cfg, epilogue, out_bits, vnni, clamp),
                     lambda: build_s8_module(cfg, epilogue, out_bits, vnni, clamp))


# gemm_s8(ap, bp, c, bias, mult, shift, clamp_lo, clamp_hi, M, N, K, ldc, ip0, ip1, jp0, jp1,
#         lo, hi, zp)
S8_MACRO_SIG = "pppppppp" + "l" * 11
S8_MACRO_ARGS = (_P,) * 8 + (_L,) * 11
# pack_a_s8 / pack_b_s8(src, dst, rows, K, s_row, s_k, p0, p1, xor)
S8_PACK_SIG = "pp" + "l" * 7
S8_PACK_ARGS = (_P, _P) + (_L,) * 7


def _aligned_empty(shape: tuple[int, ...], dtype: type, align: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an `align`-byte boundary."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + align, np.uint8)
    off = -raw.ctypes.data % align
    return raw[off:off + nbytes].view(dtype).reshape(shape)


@dataclass(frozen=True)
class PackedS8:
    """Constant int8 weights packed for `gemm_s8`: ``data[p, g, w, j] = W[channel p*width + w,
    k 4g + j]`` (int8, 0 past the channels or K; ``width = cfg.channel_width``) and ``wsum``, the
    weights summed over k per channel (int64, 0 past the channels)."""

    data: np.ndarray
    wsum: np.ndarray
    k: int
    n: int
    cfg: S8Config

    @property
    def panels(self) -> int:
        return self.data.shape[0]


# (mr, nr) register blockings of the int8 kernel, within a few % of one another on whole tiles
# (≈ 95% of vpdpbusd's peak on Zen 4), so the choice only trims padded tiles. (16, 16) is as
# fast with VNNI but 25-50% slower in the portable variant (one broadcast per multiply-add).
_S8_BLOCKINGS = ((8, 32), (4, 64))


def choose_s8_config(n: int, m: int | None = None, weights: S8Side = "b") -> S8Config:
    """The int8 blocking for `n` channels and (when known) `m` rows / pixels (the other output
    dimension): the least padded output tile area, ties to the first of `_S8_BLOCKINGS`."""
    def cost(blk: tuple[int, int]) -> int:
        mr, nr = blk
        ch, other = (nr, mr) if weights == "b" else (mr, nr)
        return _cdiv(n, ch) * ch * (_cdiv(m, other) * other if m else other)

    mr, nr = min(_S8_BLOCKINGS, key=cost)
    return S8Config(mr=mr, nr=nr, mc=mr * max(1, 64 // mr), weights=weights)


# A transposed store (`S8Config.store_t`) costs about what this many multiply-adds do per output
# (a scalar store against 128 multiply-adds a cycle), and its tiles of few rows run at about
# this fraction of the speed of the (8, 32) tiles (measured on Zen 5 at 7 and 14 rows).
_STORE_T_MACS = 128
_ROWS_SPEED = 0.95


def choose_s8_conv_config(cout: int, pixels: int, k: int) -> S8Config:
    """The int8 blocking of a convolution with `cout` output channels, `pixels` output pixels
    per image and `k` multiply-adds per output, stored NCHW: channels as rows (weights "a",
    `choose_s8_config`), or, where the pixels would leave much of the last pixel panel empty
    (a 7x7 or 14x14 map: 49 pixels in 64, 196 in 224) and K is long enough to pay for the
    transposed store, pixels as rows (weights "b", ``store_t``) with ``mr`` the number of rows
    in 4..14 that pads them least (7 for 49, 14 for 196)."""
    a = choose_s8_config(cout, pixels, "a")
    cost_a = _cdiv(cout, a.mr) * a.mr * _cdiv(pixels, a.nr) * a.nr * k
    mr = min(range(14, 3, -1), key=lambda r: _cdiv(pixels, r) * r)
    nr = 32
    cost_b = _cdiv(pixels, mr) * mr * _cdiv(cout, nr) * nr * (k + _STORE_T_MACS) / _ROWS_SPEED
    if cost_b >= cost_a:
        return a
    return S8Config(mr=mr, nr=nr, mc=mr * max(1, 64 // mr), weights="b", store_t=True)


def pack_s8_weights(w: np.ndarray, cfg: S8Config | None = None,
                    layout: Literal["kn", "nk"] = "kn") -> PackedS8:
    """Pack constant int8 weights once, for many `gemm_s8` calls: `w` is ``[K, N]``
    (``layout="kn"``) or ``[N, K]`` (``"nk"``: ONNX Gemm with transB, a convolution's
    ``[Cout, Cin*KH*KW]``), N the output channels."""
    check_array(w, "pack_s8_weights: w", 2, np.int8)
    if layout not in ("kn", "nk"):
        raise ValueError(f"pack_s8_weights: layout={layout!r}, expected 'kn' or 'nk'")
    wnk = w.T if layout == "kn" else w
    n, k = wnk.shape
    cfg = cfg or choose_s8_config(n, None, "b")
    width = cfg.channel_width
    panels, k4 = _cdiv(n, width), _cdiv(k, S8_KG)
    padded = np.zeros((panels * width, k4 * S8_KG), np.int8)
    padded[:n, :k] = wnk
    data = _aligned_empty((panels, k4, width, S8_KG), np.int8)
    data[...] = padded.reshape(panels, width, k4, S8_KG).transpose(0, 2, 1, 3)
    return PackedS8(data, padded.sum(axis=1, dtype=np.int64), k, n, cfg)


def _wrap32(x: np.ndarray) -> np.ndarray:
    """int64 values modulo 2^32 as int32 (two's complement)."""
    return (x.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def _channel_vector(x: np.ndarray | int | None, name: str, n: int, default: int,
                    lo: int, hi: int) -> np.ndarray:
    if x is None:
        return np.full(n, default, np.int64)
    if isinstance(x, int | np.integer):
        x = np.full(n, int(x), np.int64)
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "iu":
        raise TypeError(f"gemm_s8: {name}: expected an int or an integer numpy.ndarray of "
                        f"shape ({n},), got {getattr(x, 'dtype', type(x).__name__)}")
    if x.shape != (n,):
        raise ValueError(f"gemm_s8: {name} has shape {x.shape}, expected ({n},)")
    if x.size and (int(x.min()) < lo or int(x.max()) > hi):
        raise ValueError(f"gemm_s8: {name} has values in [{x.min()}, {x.max()}], expected "
                         f"[{lo}, {hi}]")
    return x.astype(np.int64)


def clamp_bounds(clamp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """REQUANTIZE's clamps (integers in 0..2**31-1; 0: none) as the int32 bounds of a MAX and
    a MIN: ``-c`` and ``c``, the whole int32 range where ``c = 0``."""
    i32 = np.iinfo(np.int32)
    c = np.asarray(clamp, np.int64)
    return (np.where(c > 0, -c, i32.min).astype(np.int32),
            np.where(c > 0, c, i32.max).astype(np.int32))


class S8Params(NamedTuple):
    """The int32 arrays `gemm_s8` reads per channel (`s8_channel_params`), in its order."""

    bias: np.ndarray
    mult: np.ndarray
    shift: np.ndarray
    clamp_lo: np.ndarray
    clamp_hi: np.ndarray

    @property
    def clamped(self) -> bool:
        """Whether a channel has a clamp: the kernel variant that applies them is needed."""
        return bool(np.any(self.clamp_lo != np.iinfo(np.int32).min))


def s8_channel_params(packed: PackedS8, bias: np.ndarray | int | None = None,
                      multiplier: np.ndarray | int | None = None,
                      shift: np.ndarray | int | None = None,
                      clamp: np.ndarray | int | None = None,
                      zero_u8: int = S8_XOR) -> S8Params:
    """The int32 arrays `gemm_s8` reads per channel, padded to whole panels: the bias with the
    offset correction ``- zero_u8 * wsum`` folded in (exact with wrap-around, as the
    accelerator's adder), the multiplier (default 1), the shift (0..31, default 0), and the
    clamp (0..2**31-1, default 0: none) as the bounds of `clamp_bounds`. `zero_u8` is the
    packed (unsigned) byte that stands for the activations' zero point, `activation_zero`:
    128 for int8 activations with zero point 0."""
    if isinstance(zero_u8, bool) or not isinstance(zero_u8, int | np.integer) \
            or not 0 <= zero_u8 <= 255:
        raise ValueError(f"s8_channel_params: zero_u8={zero_u8!r}, expected an int in [0, 255]")
    n, npad = packed.n, packed.panels * packed.cfg.channel_width
    i32 = np.iinfo(np.int32)
    b = _channel_vector(bias, "bias", n, 0, i32.min, i32.max)
    m = _channel_vector(multiplier, "multiplier", n, 1, i32.min, i32.max)
    s = _channel_vector(shift, "shift", n, 0, 0, 31)
    c = np.zeros(npad, np.int64)
    c[:n] = _channel_vector(clamp, "clamp", n, 0, 0, i32.max)
    out = [np.zeros(npad, np.int32) for _ in range(3)]
    out[0][:n] = _wrap32(b - int(zero_u8) * packed.wsum[:n])
    out[1][:n], out[2][:n] = m, s
    return S8Params(out[0], out[1], out[2], *clamp_bounds(c))


def activation_xor(dtype: DType) -> int:
    """What the packers xor the activations of `dtype` with to make them unsigned bytes: 0x80
    for int8 (``x + 128``), 0 for uint8."""
    if dtype not in (DType.INT8, DType.UINT8):
        raise TypeError(f"int8 GEMM activations: expected int8 or uint8, got {dtype.name}")
    return S8_XOR if dtype is DType.INT8 else 0


def activation_zero(dtype: DType, zero_point: int) -> int:
    """The packed (unsigned) byte that stands for the activations' zero point `zero_point`:
    ``zero_point ^ activation_xor`` as a byte (``zero_point + 128`` for int8)."""
    info = np.iinfo(dtype.np)
    if not info.min <= zero_point <= info.max:
        raise ValueError(f"activation zero point {zero_point} outside {dtype.name}'s range")
    return (int(zero_point) & 0xFF) ^ activation_xor(dtype)


def pack_s8_activations(a: np.ndarray, cfg: S8Config, threads: int = 1) -> np.ndarray:
    """int8 or uint8 activations packed as unsigned bytes (int8 offset by 128) into the panels
    of the operand that is not the weights: ``a [M, K]`` into ``mr``-row panels
    (``cfg.weights == "b"``), or ``a [K, P]`` into ``nr``-column panels (``"a"``); shape
    (panels, ceil(K/4), width, 4), 64-byte aligned."""
    if cfg.weights == "b":
        (rows, k), width, s_row, s_k, name = a.shape, cfg.mr, a.shape[1], 1, "pack_a_s8"
    else:
        (k, rows), width, s_row, s_k, name = a.shape, cfg.nr, 1, a.shape[1], "pack_b_s8"
    panels = _cdiv(rows, width)
    act = _aligned_empty((panels, _cdiv(k, S8_KG), width, S8_KG), np.int8)
    fn = CACHE.get(("gemm_s8_pack", cfg.mr, cfg.nr), lambda: _s8_pack_module(cfg)).cfunc(
        name, None, *S8_PACK_ARGS)
    xor = S8_XOR if a.dtype == np.int8 else 0
    run_parallel([lambda p0=p0, p1=p1: fn(_ptr(a), _ptr(act), rows, k, s_row, s_k, p0, p1, xor)
                  for p0, p1 in split_range(panels, threads)])
    return act


def gemm_s8_packed(act: np.ndarray, packed: PackedS8, out: np.ndarray,
                   params: S8Params, requant: bool,
                   lo: int, hi: int, threads: int = 1, vnni: bool | None = None,
                   zero_point: int = 0) -> None:
    """The GEMM on packed operands (`pack_s8_activations`, `pack_s8_weights`) into `out`
    (int8, uint8 or int32, (M, N), or (N, M) with ``cfg.store_t``, any row stride via
    out.strides), with the per-channel `params` of `s8_channel_params` and the output's
    `zero_point` (requantising only); threads split the M or N tiles."""
    cfg = packed.cfg
    m, n = out.shape[::-1] if cfg.store_t else out.shape
    jm = s8_kernels(cfg, "requant" if requant else "bias", 8 * out.itemsize, vnni,
                    requant and params.clamped)
    fn = jm.cfunc("gemm_s8", None, *S8_MACRO_ARGS)
    ap, bp = (act, packed.data) if cfg.weights == "b" else (packed.data, act)
    mt, nt = _cdiv(m, cfg.mr), _cdiv(n, cfg.nr)
    if mt >= nt * 2 or nt < threads:
        parts = [(p0, p1, 0, nt) for p0, p1 in split_range(mt, threads)]
    else:
        parts = [(0, mt, p0, p1) for p0, p1 in split_range(nt, threads)]
    ldc = out.strides[0] // out.itemsize
    args = (_ptr(ap), _ptr(bp), _ptr(out), *(_ptr(x) for x in params), m, n, packed.k, ldc)
    run_parallel([lambda p=p: fn(*args, *p, lo, hi, zero_point) for p in parts])


def gemm_s8(a: np.ndarray, packed: PackedS8, *, bias: np.ndarray | int | None = None,
            multiplier: np.ndarray | int | None = None, shift: np.ndarray | int | None = None,
            clamp: np.ndarray | int | None = None, lo: int = -128, hi: int = 127,
            out_dtype: type = np.int8, threads: int = 1, out: np.ndarray | None = None,
            vnni: bool | None = None, a_zero_point: int = 0,
            zero_point: int = 0) -> np.ndarray:
    """int8 (or uint8) × int8 with exact int32 accumulation, then the requantisation epilogue.

    With ``packed.cfg.weights == "b"``: ``a`` is ``[M, K]`` and ``acc[M, N] = (a - z) @ W``;
    with ``"a"``: ``a`` is ``[K, P]`` and ``acc[N, P] = W @ (a - z)`` (channels are rows), ``z``
    = `a_zero_point` (per tensor). Per channel n, on int32 with wrap-around (the accelerator's
    ALU)::

        t = acc + bias[n]
        t = min(max(t, -clamp[n]), clamp[n])        # requantising, where clamp[n] > 0
        t = t * multiplier[n]                       # requantising only
        t = (t + (1 << (shift[n] - 1) if shift[n] else 0)) >> shift[n]   (arithmetic)
        t = t + zero_point                          # requantising only
        t = min(max(t, lo), hi)

    With ``packed.cfg.store_t`` the result is ``acc`` transposed, ``[N, M]``. It requantises
    when `out_dtype` is int8 / uint8 or `multiplier` / `shift` / `clamp` /
    `zero_point` is given (defaults 1, 0, 0: no clamp, and 0); otherwise the result is
    ``acc + bias`` as int32 and `lo` / `hi` are not used. `bias`, `multiplier`, `shift` and
    `clamp` are ints or ``(N,)`` integer arrays. `vnni` overrides the kernel variant (default:
    `default_vnni`).
    """
    who = "gemm_s8"
    check_array(a, f"{who}: a", 2, np.uint8 if a.dtype == np.uint8 else np.int8)
    if not isinstance(packed, PackedS8):
        raise TypeError(f"{who}: packed: expected PackedS8 (from pack_s8_weights), got "
                        f"{type(packed).__name__}")
    cfg = packed.cfg
    if cfg.weights == "b":
        (m, k), n = a.shape, packed.n
        expect = f"({m}, {packed.k})"
    else:
        (k, n), m = a.shape, packed.n
        expect = f"({packed.k}, {n})"
    if k != packed.k:
        raise ValueError(f"{who}: a has shape {a.shape} but the packed weights have "
                         f"K={packed.k}; expected a of shape {expect}")
    odt = np.dtype(out_dtype)
    if odt not in (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32)):
        raise TypeError(f"{who}: out_dtype={odt.name}, expected int8, uint8 or int32")
    requant = odt.itemsize == 1 or multiplier is not None or shift is not None or \
        clamp is not None or zero_point != 0
    rng = np.iinfo(odt.type)  # type: ignore[type-var]
    if requant and not rng.min <= lo <= hi <= rng.max:
        raise ValueError(f"{who}: lo={lo}, hi={hi}, expected {rng.min} <= lo <= hi <= "
                         f"{rng.max} for {odt.name} output")
    if threads < 1:
        raise ValueError(f"{who}: threads={threads}, expected >= 1")
    shape = (n, m) if cfg.store_t else (m, n)  # store_t: acc transposed
    if out is None:
        out = np.empty(shape, odt)
    else:
        check_array(out, f"{who}: out", 2, odt.type)
        if out.shape != shape:
            raise ValueError(f"{who}: out has shape {out.shape}, expected {shape}")
    zero_u8 = activation_zero(DType.INT8 if a.dtype == np.int8 else DType.UINT8, a_zero_point)
    i32 = np.iinfo(np.int32)
    if not i32.min <= zero_point <= i32.max:
        raise ValueError(f"{who}: zero_point={zero_point}, expected an int32")
    params = s8_channel_params(packed, bias, multiplier, shift, clamp, zero_u8)
    if m == 0 or n == 0:
        return out
    act = pack_s8_activations(a, cfg, threads)
    gemm_s8_packed(act, packed, out, params, requant, lo, hi, threads, vnni, zero_point)
    return out


# -- generic: every dtype, for the lowering -------------------------------------------------------

@dataclass(frozen=True)
class MatmulSpec:
    """out[b, i, j] = requant(alpha * sum_k (A[b, i, k] - azp[i]) * (B[b, k, j] - bzp[j])
    (+ beta * C[b, i, j])). Strides are in elements over (batch..., i or k, k or j) of each
    operand (0 where it broadcasts); out is contiguous (batch..., M, N)."""

    a_dt: DType
    b_dt: DType
    out_dt: DType
    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a_str: tuple[int, ...]  # batch strides..., stride_i, stride_k
    b_str: tuple[int, ...]  # batch strides..., stride_k, stride_j
    alpha: float = 1.0
    beta: float = 1.0
    c: tuple[DType, tuple[int, ...]] | None = None  # dtype, strides (batch..., i, j)
    zero_points: bool = False  # operands: azp (per row i, stride az), bzp (per column j)
    azp_str: int = 0
    bzp_str: int = 0
    zp_dt: tuple[DType, DType] | None = None
    # requantise (QLinearMatMul): y = saturate(rint(acc * (xs * ws / ys)) + yzp)
    requant: bool = False
    xs_str: int = 0
    ws_str: int = 0
    scale_dt: DType = DType.FLOAT32


def matmul(spec: MatmulSpec) -> Kernel:
    """A naive (i, k, j) loop nest over the output rows; accumulates in the output's compute
    type (int32/int64 for integer inputs, float32 for float16)."""
    key = ("matmul", spec)
    s = spec
    nptr = 3 + (1 if s.c else 0) + (2 if s.zero_points else 0) + (4 if s.requant else 0)
    nb = len(s.batch)
    rows = math.prod(s.batch) * s.m
    if s.requant or s.zero_points:
        acc_dt = DType.INT64 if s.requant else DType.INT32
    elif s.out_dt.is_float:
        acc_dt = DType.FLOAT32 if s.out_dt is DType.FLOAT16 else s.out_dt
    else:
        acc_dt = s.out_dt

    def build() -> ir.Module:
        m, b, args = kernel_function(key, nptr)
        out, pa, pb = args[0], args[1], args[2]
        rest = list(args[3:-2])
        pc = rest.pop(0) if s.c else None
        azp = rest.pop(0) if s.zero_points else None
        bzp = rest.pop(0) if s.zero_points else None
        lo, hi = args[-2], args[-1]
        ct = S.compute(acc_dt)
        row = entry_alloca(b, ir.ArrayType(ct, s.n))
        with U.loop(b, lo, hi, 1, "row") as r:
            i = b.urem(r, U.i64(s.m))
            rem = b.udiv(r, U.i64(s.m))
            bidx = []
            for n in reversed(s.batch):
                bidx.append(b.urem(rem, U.i64(n)))
                rem = b.udiv(rem, U.i64(n))
            bidx.reverse()
            abase = b.add(offset(b, bidx, s.a_str[:nb]), b.mul(i, U.i64(s.a_str[nb])))
            bbase = offset(b, bidx, s.b_str[:nb])
            rowp = b.gep(row, [U.i64(0), U.i64(0)])
            with U.loop(b, 0, U.i64(s.n), 1, "z") as j:
                U.store(b, ct, ir.Constant(ct, 0 if not acc_dt.is_float else 0.0), rowp, j)
            az = None
            if azp is not None:
                assert s.zp_dt is not None
                az = S.convert(b, S.load(b, s.zp_dt[0], azp, b.mul(i, U.i64(s.azp_str))),
                               s.zp_dt[0], acc_dt)
            with U.loop(b, 0, U.i64(s.k), 1, "k") as k:
                av = S.convert(b, S.load(b, s.a_dt, pa, b.add(abase, b.mul(k, U.i64(
                    s.a_str[nb + 1])))), s.a_dt, acc_dt)
                if az is not None:
                    av = b.sub(av, az)
                brow = b.add(bbase, b.mul(k, U.i64(s.b_str[nb])))
                with U.loop(b, 0, U.i64(s.n), 1, "j") as j:
                    bv = S.convert(b, S.load(b, s.b_dt, pb, b.add(brow, b.mul(
                        j, U.i64(s.b_str[nb + 1])))), s.b_dt, acc_dt)
                    if bzp is not None:
                        assert s.zp_dt is not None
                        bv = b.sub(bv, S.convert(b, S.load(b, s.zp_dt[1], bzp, b.mul(
                            j, U.i64(s.bzp_str))), s.zp_dt[1], acc_dt))
                    cur = U.load(b, ct, rowp, j)
                    if acc_dt.is_float:
                        nxt = b.fadd(cur, b.fmul(av, bv), flags=("contract",))
                    else:
                        nxt = b.add(cur, b.mul(av, bv))
                    U.store(b, ct, nxt, rowp, j)
            obase = b.mul(r, U.i64(s.n))
            with U.loop(b, 0, U.i64(s.n), 1, "w") as j:
                v = U.load(b, ct, rowp, j)
                if s.requant:
                    xs, ws, ys, yzp = args[3 + (1 if s.c else 0) + 2:-2]
                    f32 = s.scale_dt
                    sx = S.load(b, f32, xs, b.mul(i, U.i64(s.xs_str)))
                    sw = S.load(b, f32, ws, b.mul(j, U.i64(s.ws_str)))
                    sxw = b.fmul(sx, sw)
                    if f32 is DType.FLOAT16:  # the reference rounds each step to float16
                        sxw = b.fpext(b.fptrunc(sxw, S.F16), U.F32)
                    sc = b.fdiv(sxw, S.load(b, f32, ys, U.i64(0)))
                    if f32 is DType.FLOAT16:
                        sc = b.fpext(b.fptrunc(sc, S.F16), U.F32)
                    y = b.fmul(S.convert(b, v, acc_dt, DType.FLOAT64),
                               S.convert(b, sc, DType.FLOAT32, DType.FLOAT64))
                    y = b.fadd(y, S.convert(b, S.load(b, s.out_dt, yzp, U.i64(0)), s.out_dt,
                                            DType.FLOAT64))
                    info = np.iinfo(s.out_dt.np)
                    y = S.intrinsic(b, "roundeven", y)
                    y = S.fmin_nan(b, S.fmax_nan(b, y, ir.Constant(S.F64, float(info.min))),
                                   ir.Constant(S.F64, float(info.max)))
                    S.store(b, s.out_dt, S.convert(b, y, DType.FLOAT64, s.out_dt), out,
                            b.add(obase, j))
                else:
                    if s.alpha != 1.0:
                        v = b.fmul(v, ir.Constant(ct, s.alpha))
                    if pc is not None:
                        assert s.c is not None
                        cdt, cstr = s.c
                        cv = S.convert(b, S.load(b, cdt, pc, b.add(offset(
                            b, bidx + [i, j], cstr), U.i64(0))), cdt, acc_dt)
                        if s.beta != 1.0:
                            cv = b.fmul(cv, ir.Constant(ct, s.beta))
                        v = b.fadd(v, cv) if acc_dt.is_float else b.add(v, cv)
                    S.store(b, s.out_dt, S.convert(b, v, acc_dt, s.out_dt), out, b.add(obase, j))
        b.ret_void()
        return m

    return Kernel(key, "kernel", "p" * nptr + "ll", build, rows)
