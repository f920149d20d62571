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
Correctness first: a ``vpdpbusd`` micro-kernel would need B packed as 4-deep k groups.

The generic matmul (`MatmulSpec`, `matmul`): a naive loop nest (a `loops.Kernel`) for every
other MatMul / Gemm of the lowering: any dtype, batch broadcasting, transposes, C, and the
integer and quantised forms (MatMulInteger, QLinearMatMul) with zero points and requantisation.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Literal

import llvmlite.ir as ir
import numpy as np

from vtakit.runtime.cpu.llvm import CACHE, JitModule
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
    un = cfg.unroll
    kmain = b.mul(b.udiv(kc, U.i64(un)), U.i64(un))
    pre = b.block
    head = fn.append_basic_block("k.head")
    body = fn.append_basic_block("k.body")
    rhead = fn.append_basic_block("r.head")
    rbody = fn.append_basic_block("r.body")
    done = fn.append_basic_block("done")
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(U.I64, "k")
    acc = [b.phi(vt, f"acc{i}") for i in range(mr * nv)]
    k.add_incoming(U.i64(0), pre)
    for p in acc:
        p.add_incoming(zero, pre)
    b.cbranch(b.icmp_signed("<", k, kmain), body, rhead)
    b.position_at_end(body)
    cur: list[ir.Value] = list(acc)
    for u in range(un):
        cur = step(b, b.add(k, U.i64(u)), cur)
    k.add_incoming(b.add(k, U.i64(un)), body)
    for p, v in zip(acc, cur, strict=True):
        p.add_incoming(v, body)
    b.branch(head)
    b.position_at_end(rhead)
    k2 = b.phi(U.I64, "k2")
    acc2 = [b.phi(vt, f"racc{i}") for i in range(mr * nv)]
    k2.add_incoming(k, head)
    for p, q in zip(acc2, acc, strict=True):
        p.add_incoming(q, head)
    b.cbranch(b.icmp_signed("<", k2, kc), rbody, done)
    b.position_at_end(rbody)
    cur = step(b, k2, list(acc2))
    k2.add_incoming(b.add(k2, U.i64(1)), rbody)
    for p, v in zip(acc2, cur, strict=True):
        p.add_incoming(v, rbody)
    b.branch(rhead)

    b.position_at_end(done)
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
