"""What each instruction does: pure functions of (state, DRAM, one decoded instruction).

Nothing here knows about time. An instruction is a mapping from field name to int, as
:func:`vtakit.vta_sim.program.decode_program` produces. Faults raise :class:`ExecFault`; the caller
adds the instruction index.

Every arithmetic result wraps to int32 (two's complement). GEMM and ALU write ``OUT[dst]`` with the
low 8 bits of the new ``ACC[dst]`` (truncation). ALU shifts: ``SHR`` by ``b >= 0`` is an arithmetic
right shift by ``min(b, 31)``; by ``b < 0`` a left shift by ``-b``, which gives 0 when ``-b >= 32``.
``reset=1`` makes GEMM and ALU write zeros to ``ACC[dst]`` and ``OUT[dst]`` of every iteration.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from vtakit.vta_hw import isa
from vtakit.vta_hw.isa import AluOp, MemType, Opcode
from vtakit.vta_hw.timing_facts import n_uops

from .errors import ExecFault
from .state import ArchState

__all__ = ["execute", "check", "load", "store", "gemm", "alu", "loop_indices",
           "LOOP_CHUNK_ITERATIONS"]

Insn = Mapping[str, int]
#: Called between the pieces of a long loop; it may raise to abandon the instruction (the
#: simulator's wall-clock timeout).
Tick = Callable[[], None]


_BUFFERS = {MemType.UOP: ("uop", "UOP", "<u4"), MemType.WGT: ("wgt", "WGT", "i1"),
            MemType.INP: ("inp", "INP", "i1"), MemType.ACC: ("acc", "ACC", "<i4"),
            MemType.ACC_8BIT: ("acc", "ACC", "i1"), MemType.OUT: ("out", "OUT", "i1")}


def _buffer(state: ArchState, mt: int) -> tuple[np.ndarray, str, str]:
    """(SRAM array, its name, DRAM dtype) of a memory type."""
    attr, name, dtype = _BUFFERS[mt]  # type: ignore[index]
    return getattr(state, attr), name, dtype


def _dram_elems(dram: np.ndarray, eb: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    n = dram.size // eb
    return dram[: n * eb].view(dtype).reshape((n,) + shape)


def _dram_check(dram: np.ndarray, insn: Insn, eb: int) -> None:
    y, x, stride, base = insn["y_size"], insn["x_size"], insn["x_stride"], insn["dram_base"]
    if y == 0 or x == 0:
        return
    end = (base + (y - 1) * stride + x) * eb
    if end > dram.size:
        raise ExecFault(
            f"DRAM access out of range: bytes [{base * eb:#x}, {end:#x}) ({y} rows of {x} "
            f"elements of {eb} B, stride {stride}) but DRAM is {dram.size:#x} bytes "
            f"(expected the whole block below {dram.size:#x})")


def _sram_check(name: str, depth: int, first: int, count: int) -> None:
    if first + count > depth:
        raise ExecFault(f"SRAM index out of range: {name}[{first}..{first + count - 1}] but "
                        f"{name} has depth {depth} (expected indices 0..{depth - 1})")


def _dram_index(insn: Insn) -> np.ndarray | slice:
    y, x, stride, base = insn["y_size"], insn["x_size"], insn["x_stride"], insn["dram_base"]
    if stride == x or y == 1:
        return slice(base, base + y * x)
    return (base + np.arange(y)[:, None] * stride + np.arange(x)[None, :]).ravel()


def load(state: ArchState, dram: np.ndarray, insn: Insn) -> None:
    """2-D strided LOAD of INP, WGT, ACC, ACC_8BIT (sign-extended) or UOP, zero padded.

    DRAM element ``dram_base + y*x_stride + x`` goes to SRAM row
    ``sram_base + (y + y_pad_0) * (x_pad_0 + x_size + x_pad_1) + x_pad_0 + x``; the padding
    rows and columns around the block are written with zeros. ``x_size == 0`` does nothing.
    """
    mt = insn["memory_type"]
    if mt == MemType.OUT:
        raise ExecFault("LOAD of memory_type OUT is not supported (expected UOP, WGT, INP, ACC "
                        "or ACC_8BIT)")
    y, x = insn["y_size"], insn["x_size"]
    if x == 0:
        return
    y0, y1, x0, x1 = insn["y_pad_0"], insn["y_pad_1"], insn["x_pad_0"], insn["x_pad_1"]
    rows, cols = y0 + y + y1, x0 + x + x1
    attr, name, dtype = _BUFFERS[mt]  # type: ignore[index]
    buf = getattr(state, attr)
    eb = state.cfg.elem_bytes(mt)
    base = insn["sram_base"]
    if base + rows * cols > buf.shape[0]:
        _sram_check(name, buf.shape[0], base, rows * cols)
    _dram_check(dram, insn, eb)
    if rows == y and cols == x and (insn["x_stride"] == x or y == 1) \
            and mt != MemType.ACC_8BIT:  # one contiguous run of bytes, no padding
        a = insn["dram_base"] * eb
        buf.reshape(buf.shape[0], -1).view(np.uint8)[base: base + y * x] = \
            dram[a: a + y * x * eb].reshape(y * x, eb)
        return
    dst = buf[base: base + rows * cols].reshape((rows, cols) + buf.shape[1:])
    if rows != y or cols != x:
        dst[:y0] = 0
        dst[y0 + y:] = 0
        dst[y0: y0 + y, :x0] = 0
        dst[y0: y0 + y, x0 + x:] = 0
    if y == 0:
        return
    src = _dram_elems(dram, eb, dtype, buf.shape[1:])[_dram_index(insn)]
    dst[y0: y0 + y, x0: x0 + x] = src.reshape((y, x) + buf.shape[1:])


def store(state: ArchState, dram: np.ndarray, insn: Insn) -> None:
    """2-D strided STORE of OUT: SRAM row ``sram_base + y*x_size + x`` goes to DRAM element
    ``dram_base + y*x_stride + x``. Padding fields must be zero; ``x_size == 0`` does nothing."""
    mt = insn["memory_type"]
    if mt != MemType.OUT:
        raise ExecFault(f"STORE of memory_type {MemType(mt).name} is not supported (expected OUT)")
    pads = [insn[k] for k in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")]
    if any(pads):
        raise ExecFault(f"STORE cannot pad: y_pad_0, y_pad_1, x_pad_0, x_pad_1 = {pads} "
                        f"(expected all 0)")
    y, x = insn["y_size"], insn["x_size"]
    if x == 0 or y == 0:
        return
    buf, name, dtype = _buffer(state, mt)
    eb = state.cfg.elem_bytes(mt)
    base = insn["sram_base"]
    _sram_check(name, buf.shape[0], base, y * x)
    _dram_check(dram, insn, eb)
    view = _dram_elems(dram, eb, dtype, buf.shape[1:])
    view[_dram_index(insn)] = buf[base: base + y * x]


def _first_bad_iteration(f: np.ndarray, fo: int, fi: int, iter_out: int, iter_in: int,
                         depth: int) -> tuple[int, int] | None:
    """(iteration, index) of the first loop iteration whose index ``f[u] + i*fo + j*fi`` is
    ``>= depth`` (order: ``i`` outer, ``j``, then micro-op ``u``), or ``None``; in closed form
    (factors are unsigned, so an index grows with ``i`` and ``j``)."""
    nu = f.size
    fmax = int(f.max())
    if fmax + (iter_out - 1) * fo + (iter_in - 1) * fi < depth:
        return None
    last_j = (iter_in - 1) * fi
    i = 0 if fmax + last_j >= depth else -(-(depth - fmax - last_j) // fo)
    base = f.astype(np.int64) + i * fo  # every micro-op at iteration (i, 0)
    if fi:
        j = np.maximum(0, -(-(depth - base) // fi))
    else:
        j = np.where(base >= depth, 0, iter_in)
    j = np.where(j < iter_in, j, iter_in)  # iter_in: never out of range in this i
    jmin = int(j.min())
    u = int(np.flatnonzero(j == jmin)[0])
    return (i * iter_in + jmin) * nu + u, int(base[u]) + jmin * fi


def _check_loop(state: ArchState, insn: Insn, src_depth: int, src_name: str) -> None:
    """Range-check every index of a GEMM/ALU loop in closed form, allocating nothing of the
    loop's size."""
    cfg = state.cfg
    bgn, end = insn["uop_bgn"], insn["uop_end"]
    if end > cfg.uop_depth:
        raise ExecFault(f"SRAM index out of range: uop_end={end} but UOP has depth "
                        f"{cfg.uop_depth} (expected uop_end <= {cfg.uop_depth})")
    iter_out, iter_in = insn["iter_out"], insn["iter_in"]
    if end <= bgn or iter_out == 0 or iter_in == 0:
        return
    d, s, w = isa.decode_uops(state.uop[bgn:end], cfg)
    checks = [(d, "dst", cfg.acc_depth, "ACC"), (s, "src", src_depth, src_name)]
    if "wgt_factor_out" in insn:
        checks.append((w, "wgt", cfg.wgt_depth, "WGT"))
    for f, field, depth, name in checks:
        bad = _first_bad_iteration(np.asarray(f), insn[f"{field}_factor_out"],
                                   insn[f"{field}_factor_in"], iter_out, iter_in, depth)
        if bad is not None:
            raise ExecFault(f"SRAM index out of range: {name}[{bad[1]}] at loop iteration "
                            f"{bad[0]} but {name} has depth {depth} (expected indices "
                            f"0..{depth - 1})")


#: Loops of more micro-op iterations than this run in pieces of about this many (whole
#: iterations of the outer loop where they fit), so memory stays bounded whatever the fields.
LOOP_CHUNK_ITERATIONS = 1 << 18


def loop_indices(state: ArchState, insn: Insn, src_depth: int, src_name: str,
                 outer: tuple[int, int] | None = None, inner: tuple[int, int] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dst, src, wgt) rows of every iteration of a GEMM/ALU loop, in execution order
    (``i`` outer, ``j``, then micro-op), range-checked; int64 arrays. ``outer`` / ``inner``
    (``[first, stop)``) restrict ``i`` / ``j`` to a piece of the loop."""
    _check_loop(state, insn, src_depth, src_name)
    cfg = state.cfg
    bgn, end = insn["uop_bgn"], insn["uop_end"]
    iter_out, iter_in = insn["iter_out"], insn["iter_in"]
    if end <= bgn or iter_out == 0 or iter_in == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    i0, i1 = outer if outer is not None else (0, iter_out)
    j0, j1 = inner if inner is not None else (0, iter_in)
    d, s, w = isa.decode_uops(state.uop[bgn:end], cfg)
    i = np.arange(i0, i1, dtype=np.int64)[:, None, None]
    j = np.arange(j0, j1, dtype=np.int64)[None, :, None]
    dst = (d + i * insn["dst_factor_out"] + j * insn["dst_factor_in"]).ravel()
    src = (s + i * insn["src_factor_out"] + j * insn["src_factor_in"]).ravel()
    if "wgt_factor_out" in insn:
        wgt = (w + i * insn["wgt_factor_out"] + j * insn["wgt_factor_in"]).ravel()
    else:
        wgt = np.zeros(0, np.int64)
    return dst, src, wgt


def _pieces(insn: Insn, iter_out: int | None = None, iter_in: int | None = None
            ) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
    """The loop cut into pieces of about :data:`LOOP_CHUNK_ITERATIONS` iterations, in order:
    ((i0, i1), (j0, j1)) each."""
    nu = insn["uop_end"] - insn["uop_bgn"]
    io = insn["iter_out"] if iter_out is None else iter_out
    ii = insn["iter_in"] if iter_in is None else iter_in
    per_i = nu * ii
    if per_i <= LOOP_CHUNK_ITERATIONS:
        step = max(1, LOOP_CHUNK_ITERATIONS // per_i)
        for a in range(0, io, step):
            yield (a, min(io, a + step)), (0, ii)
        return
    step = max(1, LOOP_CHUNK_ITERATIONS // nu)
    for a in range(io):
        for b in range(0, ii, step):
            yield (a, a + 1), (b, min(ii, b + step))


def _as_slice(rows: np.ndarray) -> slice | np.ndarray:
    """``rows`` as a slice when they are consecutive ascending, else as an index array."""
    if rows.size and bool((rows == np.arange(rows[0], rows[0] + rows.size)).all()):
        return slice(int(rows[0]), int(rows[0]) + rows.size)
    return rows


@dataclass(frozen=True)
class _Loop:
    """:func:`loop_indices` of one loop, with ``dst``/``src`` as slices where they can be,
    and whether the loop runs as one vector step: ``free_imm`` no row is written twice,
    ``free_src`` nor does an iteration read a row an earlier one wrote."""

    dst: np.ndarray
    src: np.ndarray
    dsel: slice | np.ndarray
    ssel: slice | np.ndarray
    free_imm: bool
    free_src: bool


_LOOP_CACHE: dict[tuple, tuple[object, _Loop]] = {}


def _loop(state: ArchState, insn: Insn, src_depth: int, src_name: str) -> _Loop:
    """:func:`loop_indices` (same faults), cached by micro-op words and loop fields."""
    cfg = state.cfg
    bgn, end = insn["uop_bgn"], insn["uop_end"]
    key = (id(cfg), src_depth, bgn, end, state.uop[bgn:end].tobytes(), insn["iter_out"],
           insn["iter_in"], insn["dst_factor_out"], insn["dst_factor_in"],
           insn["src_factor_out"], insn["src_factor_in"], insn.get("wgt_factor_out", -1),
           insn.get("wgt_factor_in", -1))
    hit = _LOOP_CACHE.get(key)
    if hit is not None and hit[0] is cfg:
        return hit[1]
    dst, src, _ = loop_indices(state, insn, src_depth, src_name)
    dst.setflags(write=False)  # shared by every later run of the loop
    src.setflags(write=False)
    n = dst.size
    free_imm = n == 0 or _hazard_free_len(dst, None) == n
    lp = _Loop(dst, src, _as_slice(dst), _as_slice(src), free_imm,
               free_imm and (n == 0 or _hazard_free_len(dst, src) == n))
    if len(_LOOP_CACHE) >= 256:
        _LOOP_CACHE.clear()
    _LOOP_CACHE[key] = (cfg, lp)  # holding cfg keeps id(cfg) from being reused
    return lp


def _wrap32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.int64).astype(np.int32)


def _products(state: ArchState, src: np.ndarray, wgt: np.ndarray) -> np.ndarray:
    """``INP[src[n]] @ WGT[wgt[n]].T`` for every n as float32 (exact: |sum| < 2^24)."""
    n = src.size
    cfg = state.cfg
    out = np.empty((n, cfg.batch, cfg.block_out), np.float32)
    order = np.argsort(wgt, kind="stable")
    ws = wgt[order]
    starts = np.flatnonzero(np.r_[True, ws[1:] != ws[:-1]])
    if len(starts) * 32 <= n:  # few weight tiles, each reused: one BLAS product per tile
        bounds = np.r_[starts, n]
        inp = state.inp
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            rows = order[a:b]
            x = inp[src[rows]].reshape(-1, cfg.block_in).astype(np.float32)
            w = state.wgt[ws[a]].astype(np.float32)
            out[rows] = (x @ w.T).reshape(b - a, cfg.batch, cfg.block_out)
        return out
    x = state.inp[src].astype(np.float32)
    w = state.wgt[wgt].astype(np.float32)
    return np.matmul(x, w.transpose(0, 2, 1), out=out)


def _write(state: ArchState, rows: np.ndarray | slice, values: np.ndarray) -> None:
    state.acc[rows] = values
    state.out[rows] = values.astype(np.int8)  # low 8 bits: truncation, not saturation


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows of the 2-D ``a``, the index of each row among them), in some order.
    Rows compare as byte strings: ``np.unique(axis=0)`` builds a structured dtype of one field
    per column, seconds for one row of a 2^18-iteration piece."""
    a = np.ascontiguousarray(a)
    keys = a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).ravel()
    _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    return a[first], inv.ravel()


def _gemm_sums(state: ArchState, dst: np.ndarray, src: np.ndarray, wgt: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """(rows, sums): the distinct ``dst`` rows and, for each, the int64 sum of every
    ``INP[src] @ WGT[wgt].T`` the loop adds to it (the order of integer additions is
    irrelevant: the result is wrapped to int32 once)."""
    cfg = state.cfg
    n = dst.size
    order = np.argsort(dst, kind="stable")
    ds = dst[order]
    starts = np.flatnonzero(np.r_[True, ds[1:] != ds[:-1]])
    rows = ds[starts]
    counts = np.diff(np.r_[starts, n])
    g = int(counts[0])
    if g > 1 and bool((counts == g).all()):
        # Every row sums g products. Rows that use the same sequence of weight tiles form one
        # matrix product: (rows x g*block_in) @ (g*block_in x block_out). Each term is at most
        # 2^14 in magnitude, so float32 is exact up to 2^10 terms and float64 far beyond.
        d = rows.size
        ft = np.float32 if g * cfg.block_in <= 1024 else np.float64
        s2 = src[order].reshape(d, g)
        w2 = wgt[order].reshape(d, g)
        seqs, inv = _unique_rows(w2)
        if seqs.shape[0] * 4 <= d:
            out = np.empty((d, cfg.batch, cfg.block_out), ft)
            by_seq = np.argsort(inv, kind="stable")
            bounds = np.r_[0, np.cumsum(np.bincount(inv, minlength=seqs.shape[0]))]
            for u in range(seqs.shape[0]):
                sel = by_seq[bounds[u]: bounds[u + 1]]
                w = state.wgt[seqs[u]].astype(ft)  # (g, block_out, block_in)
                w = w.transpose(0, 2, 1).reshape(g * cfg.block_in, cfg.block_out)
                x = state.inp[s2[sel]].astype(ft)  # (k, g, batch, block_in)
                x = x.transpose(0, 2, 1, 3).reshape(sel.size * cfg.batch, g * cfg.block_in)
                out[sel] = (x @ w).reshape(sel.size, cfg.batch, cfg.block_out)
            return rows, out.astype(np.int64)
    prod = _products(state, src[order], wgt[order]).astype(np.float64)
    return rows, np.add.reduceat(prod, starts, axis=0).astype(np.int64)


@dataclass(frozen=True)
class _Product:
    """One BLAS product of a cluster: iterations ``it`` (``None``: all of them), flat row
    indices ``xidx`` (shape (n, batch, k)) into INP viewed as (depth*batch, block_in) and
    ``aidx`` (shape (m, block_out, k)) into WGT viewed as (depth*block_out, block_in)."""

    it: np.ndarray | None
    n: int
    xidx: np.ndarray
    aidx: np.ndarray


@dataclass(frozen=True)
class _Cluster:
    """Micro-op groups (one per ``dst`` value, ``m`` of them) reading the same ``k`` source
    rows; ``rows`` are their ACC rows in (group, iteration) order, a slice when contiguous."""

    k: int
    m: int
    ft: type
    products: tuple[_Product, ...]
    rows: slice | np.ndarray


@dataclass(frozen=True)
class _GemmPlan:
    """The decoded structure of one GEMM loop (see :func:`_gemm_plan`). ``touched`` is
    ``None`` when no ACC row is written twice, else the distinct rows written."""

    iterations: int
    clusters: tuple[_Cluster, ...]
    touched: np.ndarray | None


_PLAN_CACHE: dict[tuple, tuple[object, _GemmPlan | None]] = {}
_PLAN_CACHE_SIZE = 256


def _gemm_plan(state: ArchState, insn: Insn) -> _GemmPlan | None:
    """The plan of a non-reset GEMM, cached by micro-op words and loop fields (the same
    kernel runs many times); ``None`` if some index is out of range or the loop would take many
    small products (the caller then uses the general path)."""
    cfg = state.cfg
    bgn, end = insn["uop_bgn"], insn["uop_end"]
    if end > cfg.uop_depth or end <= bgn or not insn["iter_out"] or not insn["iter_in"]:
        return None
    key = (id(cfg), state.uop[bgn:end].tobytes(), insn["iter_out"], insn["iter_in"],
           insn["dst_factor_out"], insn["dst_factor_in"], insn["src_factor_out"],
           insn["src_factor_in"], insn["wgt_factor_out"], insn["wgt_factor_in"])
    hit = _PLAN_CACHE.get(key)
    if hit is not None and hit[0] is cfg:
        return hit[1]
    plan = _build_gemm_plan(state, insn) if _gemm_in_range(state, insn) else None
    if len(_PLAN_CACHE) >= _PLAN_CACHE_SIZE:
        _PLAN_CACHE.clear()
    _PLAN_CACHE[key] = (cfg, plan)  # holding cfg keeps id(cfg) from being reused
    return plan


def _build_gemm_plan(state: ArchState, insn: Insn) -> _GemmPlan | None:
    """Micro-ops with the same ``dst`` field, at iterations with the same weight offset, form
    one matrix product ``(iterations x k*block_in) @ (k*block_in x block_out)``; groups that
    read the same source rows share one product with their weights side by side."""
    cfg = state.cfg
    bgn, end = insn["uop_bgn"], insn["uop_end"]
    d, s, w = isa.decode_uops(state.uop[bgn:end], cfg)
    i = np.arange(insn["iter_out"], dtype=np.int64)[:, None]
    j = np.arange(insn["iter_in"], dtype=np.int64)[None, :]
    doff = (i * insn["dst_factor_out"] + j * insn["dst_factor_in"]).ravel()
    soff = (i * insn["src_factor_out"] + j * insn["src_factor_in"]).ravel()
    woff = (i * insn["wgt_factor_out"] + j * insn["wgt_factor_in"]).ravel()
    dvals, dgroup = np.unique(d, return_inverse=True)
    wvals, wgroup = np.unique(woff, return_inverse=True)
    if dvals.size * wvals.size > max(8, doff.size * d.size // 256):
        return None
    groups: dict[bytes, list[tuple[int, np.ndarray]]] = {}
    dflat = dgroup.ravel()
    for g, dv in enumerate(dvals.tolist()):
        u = np.flatnonzero(dflat == g)
        groups.setdefault(s[u].tobytes(), []).append((dv, u))
    b, bi, bo = cfg.batch, cfg.block_in, cfg.block_out
    clusters, all_rows = [], []
    for members in groups.values():
        u0 = members[0][1]
        k, m = u0.size, len(members)
        uu = np.stack([u for _, u in members])  # (m, k)
        products = []
        for h, wv in enumerate(wvals.tolist()):
            it = np.flatnonzero(wgroup.ravel() == h) if wvals.size > 1 else None
            srows = s[u0][None, :] + (soff if it is None else soff[it])[:, None]  # (n, k)
            xidx = srows[:, None, :] * b + np.arange(b)[None, :, None]
            aidx = (w[uu] + wv)[:, None, :] * bo + np.arange(bo)[None, :, None]
            xflat, aflat = xidx.ravel().astype(np.intp), aidx.ravel().astype(np.intp)
            xflat.setflags(write=False)
            aflat.setflags(write=False)
            products.append(_Product(it, srows.shape[0], xflat, aflat))
        rows = (np.array([dv for dv, _ in members])[:, None] + doff[None, :]).ravel()
        all_rows.append(rows)
        r0 = int(rows[0])
        contiguous = bool((rows == np.arange(r0, r0 + rows.size)).all())
        ft = np.float32 if k * bi <= 1024 else np.float64  # exact, as in _gemm_sums
        clusters.append(_Cluster(k, m, ft, tuple(products),
                                 slice(r0, r0 + rows.size) if contiguous
                                 else rows.astype(np.intp)))
    every = np.concatenate(all_rows)
    uniq = np.unique(every)
    return _GemmPlan(doff.size, tuple(clusters),
                     None if uniq.size == every.size else uniq.astype(np.intp))


def _run_gemm_plan(state: ArchState, plan: _GemmPlan) -> None:
    """``ACC[dst] += INP[src] @ WGT[wgt].T`` over the loop a plan describes. Every sum is
    exact in its float type and converted to int32 once; int32 additions wrap."""
    cfg = state.cfg
    b, bi, bo = cfg.batch, cfg.block_in, cfg.block_out
    inp = state.inp.reshape(-1, bi)
    wgt = state.wgt.reshape(-1, bi)
    acc, out = state.acc, state.out
    n_it = plan.iterations
    for c in plan.clusters:
        sums: np.ndarray
        if len(c.products) == 1:
            p = c.products[0]
            x: np.ndarray = np.take(inp, p.xidx, axis=0).reshape(n_it * b, c.k * bi).astype(c.ft)
            a: np.ndarray = np.take(wgt, p.aidx, axis=0).reshape(c.m * bo, c.k * bi).astype(c.ft)
            sums = (x @ a.T).reshape(n_it, b, c.m, bo)
        else:
            sums = np.empty((n_it, b, c.m, bo), c.ft)
            for p in c.products:
                x = np.take(inp, p.xidx, axis=0).reshape(p.n * b, c.k * bi).astype(c.ft)
                a = np.take(wgt, p.aidx, axis=0).reshape(c.m * bo, c.k * bi).astype(c.ft)
                sums[p.it] = (x @ a.T).reshape(p.n, b, c.m, bo)
        vals = sums.transpose(2, 0, 1, 3)  # (m, iterations, batch, block_out)
        if c.ft is np.float32:  # |sum| <= 2^24: fits int32
            v32 = vals.astype(np.int32)
        else:
            v32 = vals.astype(np.int64).astype(np.int32)  # wraps
        v32 = v32.reshape(c.m * n_it, b, bo)
        if plan.touched is not None:  # some row written twice: add in place, OUT at the end
            if isinstance(c.rows, slice):
                acc[c.rows] += v32  # a slice holds distinct rows
            else:
                np.add.at(acc, c.rows, v32)
        elif isinstance(c.rows, slice):
            dst = acc[c.rows]
            dst += v32
            out[c.rows] = dst.astype(np.int8)  # low 8 bits: truncation
        else:
            new = acc[c.rows] + v32
            acc[c.rows] = new
            out[c.rows] = new.astype(np.int8)
    if plan.touched is not None:
        out[plan.touched] = acc[plan.touched].astype(np.int8)


def _gemm_in_range(state: ArchState, insn: Insn) -> bool:
    """Whether every index of the loop is in range (factors are unsigned, so the largest
    index is the largest micro-op field plus the last iteration's offsets)."""
    cfg = state.cfg
    bgn, end = insn["uop_bgn"], insn["uop_end"]
    if end > cfg.uop_depth or end <= bgn or not insn["iter_out"] or not insn["iter_in"]:
        return False
    d, s, w = isa.decode_uops(state.uop[bgn:end], cfg)
    io, ii = insn["iter_out"] - 1, insn["iter_in"] - 1
    return (int(d.max()) + io * insn["dst_factor_out"] + ii * insn["dst_factor_in"]
            < cfg.acc_depth
            and int(s.max()) + io * insn["src_factor_out"] + ii * insn["src_factor_in"]
            < cfg.inp_depth
            and int(w.max()) + io * insn["wgt_factor_out"] + ii * insn["wgt_factor_in"]
            < cfg.wgt_depth)


def _repeats(insn: Insn, level: str) -> bool:
    """Whether every iteration of loop ``level`` (``out`` or ``in``) repeats the same rows."""
    return all(insn.get(f"{f}_factor_{level}", 0) == 0 for f in ("dst", "src", "wgt"))


def _big_gemm(state: ArchState, insn: Insn, tick: Tick | None) -> None:
    """A GEMM of more than :data:`LOOP_CHUNK_ITERATIONS` iterations, piece by piece. Its sums
    add up in an int64 delta (wrapping modulo 2^64 keeps the low 32 bits exact); a loop level
    whose factors are all zero repeats the same products, so one pass is multiplied."""
    io, ii = insn["iter_out"], insn["iter_in"]
    times = 1
    if _repeats(insn, "out"):
        times, io = times * io, 1
    if _repeats(insn, "in"):
        times, ii = times * ii, 1
    delta: np.ndarray | None = None
    touched = np.zeros(state.cfg.acc_depth, bool)
    for outer, inner in _pieces(insn, io, ii):
        dst, src, wgt = loop_indices(state, insn, state.cfg.inp_depth, "INP", outer, inner)
        touched[dst] = True
        if not insn["reset"]:
            rows, sums = _gemm_sums(state, dst, src, wgt)
            if delta is None:
                delta = np.zeros(state.acc.shape, np.int64)
            delta[rows] += sums  # rows are distinct
        if tick is not None:
            tick()
    rows = np.flatnonzero(touched)
    if insn["reset"]:
        _write(state, rows, np.zeros((rows.size,) + state.acc.shape[1:], np.int32))
    elif delta is not None:
        _write(state, rows, _wrap32(state.acc[rows].astype(np.int64) + delta[rows] * times))


def gemm(state: ArchState, insn: Insn, tick: Tick | None = None) -> None:
    """``ACC[dst] += INP[src] @ WGT[wgt].T`` (or ``= 0`` with reset) over the whole loop."""
    if n_uops(insn) > LOOP_CHUNK_ITERATIONS:
        _check_loop(state, insn, state.cfg.inp_depth, "INP")
        _big_gemm(state, insn, tick)
        return
    if not insn["reset"]:
        plan = _gemm_plan(state, insn)
        if plan is not None:
            _run_gemm_plan(state, plan)
            return
    if insn["reset"]:
        lp = _loop(state, insn, state.cfg.inp_depth, "INP")
        state.acc[lp.dsel] = 0
        state.out[lp.dsel] = 0
        return
    dst, src, wgt = loop_indices(state, insn, state.cfg.inp_depth, "INP")
    if dst.size == 0:
        return
    rows, sums = _gemm_sums(state, dst, src, wgt)
    _write(state, rows, _wrap32(state.acc[rows].astype(np.int64) + sums))


def _alu_op(op: AluOp, a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    a = a.astype(np.int64)
    b = np.asarray(b, dtype=np.int64)
    if op == AluOp.MIN:
        r = np.minimum(a, b)
    elif op == AluOp.MAX:
        r = np.maximum(a, b)
    elif op == AluOp.ADD:
        r = a + b
    elif op == AluOp.MUL:
        r = a * b  # |a*b| < 2^62: exact in int64, then wrapped
    else:  # SHR: arithmetic right by min(b, 31); negative b: left shift, 0 from 32 on
        right = a >> np.minimum(np.maximum(b, 0), 31)
        left_by = np.minimum(np.maximum(-b, 0), 32)
        left = np.where(left_by >= 32, 0, a << np.minimum(left_by, 31))
        r = np.where(b >= 0, right, left)
    return _wrap32(r)


def _alu_op_int32(op: AluOp, a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """:func:`_alu_op` on int32 ``a``, without the int64 round trip where the result is
    exact in int32 (MIN, MAX, SHR right by an immediate)."""
    if isinstance(b, int):
        if op in (AluOp.MIN, AluOp.MAX) and -2**31 <= b < 2**31:
            return (np.minimum if op == AluOp.MIN else np.maximum)(a, np.int32(b))
        if op == AluOp.SHR and b >= 0:
            return a >> np.int32(min(b, 31))
    elif op in (AluOp.MIN, AluOp.MAX) and b.dtype == np.int32:
        return (np.minimum if op == AluOp.MIN else np.maximum)(a, b)
    return _alu_op(op, a, b)


def _hazard_free_len(dst: np.ndarray, src: np.ndarray | None) -> int:
    """Length of the longest prefix in which no iteration writes a row that an earlier one of
    the prefix wrote, nor reads one an earlier one wrote (so it may run as one vector step)."""
    n = dst.size
    rows, first = np.unique(dst, return_index=True)
    pos = np.arange(n)
    bad = first[np.searchsorted(rows, dst)] < pos  # row written again
    if src is not None:
        k = np.minimum(np.searchsorted(rows, src), rows.size - 1)
        bad |= (rows[k] == src) & (first[k] < pos)  # reads a row written earlier
    hits = np.flatnonzero(bad)
    return int(hits[0]) if hits.size else n


def _reads_written_rows(dst: np.ndarray, src: np.ndarray) -> bool:
    """Whether some iteration reads a row that an earlier iteration wrote."""
    rows, first = np.unique(dst, return_index=True)
    k = np.minimum(np.searchsorted(rows, src), rows.size - 1)
    return bool(((rows[k] == src) & (first[k] < np.arange(dst.size))).any())


def _alu_fold(state: ArchState, op: AluOp, dst: np.ndarray, operands: np.ndarray) -> bool:
    """Apply the iterations of each destination row in order, folded into one step per row
    (``operands[k]`` is iteration k's second operand); ``False`` if ``op`` cannot be folded
    (SHR by amounts of both signs)."""
    order = np.argsort(dst, kind="stable")
    ds = dst[order]
    starts = np.flatnonzero(np.r_[True, ds[1:] != ds[:-1]])
    rows = ds[starts]
    b = operands[order]
    a = state.acc[rows].astype(np.int64)
    if op == AluOp.ADD:
        r = a + np.add.reduceat(b, starts, axis=0)
    elif op == AluOp.MIN:
        r = np.minimum(a, np.minimum.reduceat(b, starts, axis=0))
    elif op == AluOp.MAX:
        r = np.maximum(a, np.maximum.reduceat(b, starts, axis=0))
    elif op == AluOp.MUL:  # products wrap modulo 2^64, which keeps the low 32 bits exact
        prod = np.multiply.reduceat(b.astype(np.uint64), starts, axis=0)
        r = (a.astype(np.uint64) * prod).astype(np.int64)
    elif (b >= 0).all():  # SHR right: shifts add up, clamped at 31
        r = a >> np.minimum(np.add.reduceat(b, starts, axis=0), 31)
    elif (b < 0).all():  # SHR left: shifts add up, 0 from 32 on
        total = np.add.reduceat(-b, starts, axis=0)
        r = np.where(total >= 32, 0, a << np.minimum(total, 31))
    else:
        return False
    _write(state, rows, _wrap32(r))
    return True


def alu(state: ArchState, insn: Insn, tick: Tick | None = None) -> None:
    """``ACC[dst] = op(ACC[dst], imm if use_imm else ACC[src])`` in loop order.

    Iterations that touch rows written earlier in the same instruction are evaluated in order.
    When only destination rows repeat, each row's iterations are folded into one step (sum,
    min, max, product, total shift); otherwise the loop is cut into the longest hazard-free
    chunks, each evaluated as one vector step. A loop of more than
    :data:`LOOP_CHUNK_ITERATIONS` iterations runs piece by piece; when its outer iterations all
    repeat the same rows, they stop repeating once the rows come back to a state seen before
    (the rest of the loop is then known: a fixed point, or a cycle of the states seen).
    """
    if n_uops(insn) <= LOOP_CHUNK_ITERATIONS:
        lp = _loop(state, insn, state.cfg.acc_depth, "ACC")
        _alu_rows(state, insn, lp.dst, lp.src, lp, tick)
        return
    _check_loop(state, insn, state.cfg.acc_depth, "ACC")
    io = insn["iter_out"]
    repeat = insn["dst_factor_out"] == 0 and insn["src_factor_out"] == 0 and io > 1

    def one_pass(n_out: int) -> None:
        for outer, inner in _pieces(insn, n_out):
            dst, src, _ = loop_indices(state, insn, state.cfg.acc_depth, "ACC", outer, inner)
            _alu_rows(state, insn, dst, src, None, tick)
            if tick is not None:
                tick()

    if not repeat:
        one_pass(io)
        return
    # Every outer iteration is the same function F of the ACC rows it writes (the rows it
    # only reads are never written). The state after k passes determines everything after.
    rows = _rows_of_one_outer_iteration(state, insn)
    seen: dict[bytes, int] = {}
    k = 0
    while k < io:
        key = hashlib.blake2b(state.acc[rows].tobytes(), digest_size=16).digest()
        if key in seen:  # a cycle of length k - seen[key]: skip whole cycles
            k = io - (io - k) % (k - seen[key])
            seen.clear()
            if k >= io:
                break
        seen[key] = k
        one_pass(1)
        k += 1


def _rows_of_one_outer_iteration(state: ArchState, insn: Insn) -> np.ndarray:
    """The distinct ACC rows one outer iteration of a range-checked GEMM/ALU loop writes:
    ``d[u] + j * dst_factor_in``, in closed form (a 134e6-iteration outer loop has at most
    ``acc_depth`` of them, and when ``dst_factor_in > 0`` at most ``acc_depth`` values of
    ``j``)."""
    d, _, _ = isa.decode_uops(state.uop[insn["uop_bgn"]:insn["uop_end"]], state.cfg)
    d = np.unique(d)
    fi = insn["dst_factor_in"]
    if fi == 0:
        return d
    # in range: d.max() + (iter_in - 1) * fi < acc_depth, so iter_in <= acc_depth
    return np.unique(d[:, None] + fi * np.arange(insn["iter_in"], dtype=np.int64)[None, :])


#: The sequential path of an ALU loop calls ``tick`` once per this many vector steps (a
#: dependent chain of 2^18 iterations takes seconds, one step each).
TICK_STEPS = 256


def _alu_rows(state: ArchState, insn: Insn, dst: np.ndarray, src: np.ndarray,
              lp: _Loop | None, tick: Tick | None = None) -> None:
    """:func:`alu` over the iterations ``dst``/``src`` (all of them, or one piece);
    ``lp`` is the cached analysis when they are the whole loop; ``tick`` is called every
    :data:`TICK_STEPS` steps of a sequential evaluation."""
    if dst.size == 0:
        return
    if lp is None:
        n = dst.size
        free_imm = _hazard_free_len(dst, None) == n
        lp = _Loop(dst, src, _as_slice(dst), _as_slice(src), free_imm,
                   free_imm and _hazard_free_len(dst, src) == n)
    if insn["reset"]:
        state.acc[lp.dsel] = 0
        state.out[lp.dsel] = 0
        return
    op = AluOp(insn["alu_opcode"])
    use_imm = bool(insn["use_imm"])
    imm = insn["imm"]
    if lp.free_imm if use_imm else lp.free_src:  # the whole loop is one vector step
        _write(state, lp.dsel, _alu_op_int32(op, state.acc[lp.dsel],
                                             imm if use_imm else state.acc[lp.ssel]))
        return
    if _hazard_free_len(dst, None if use_imm else src) < dst.size \
            and (use_imm or not _reads_written_rows(dst, src)):
        # only destination rows repeat: every operand is known before the loop runs
        operands = (np.full((dst.size,) + state.acc.shape[1:], imm, np.int64) if use_imm
                    else state.acc[src].astype(np.int64))
        if _alu_fold(state, op, dst, operands):
            return
    start, n = 0, dst.size
    window = n
    steps = 0
    while start < n:
        steps += 1
        if tick is not None and not steps % TICK_STEPS:
            tick()
        stop = min(n, start + window)
        d = dst[start:stop]
        s = None if use_imm else src[start:stop]
        k = _hazard_free_len(d, s)
        d, s = d[:k], (None if s is None else s[:k])
        b = imm if s is None else state.acc[s]
        _write(state, d, _alu_op(op, state.acc[d], b))
        whole = k == stop - start
        start += k
        window = window * 2 if whole else max(1, k * 2)


def check(state: ArchState, dram: np.ndarray, insn: Insn) -> None:
    """Raise :class:`ExecFault` if ``insn`` would fault: every DRAM and SRAM index it touches
    is checked in closed form, before anything of the instruction's size is allocated. It
    depends on ``state`` only through the micro-ops a GEMM/ALU loop reads."""
    op = insn["opcode"]
    if op == Opcode.LOAD or op == Opcode.STORE:
        mt = insn["memory_type"]
        if op == Opcode.LOAD and mt == MemType.OUT:
            raise ExecFault("LOAD of memory_type OUT is not supported (expected UOP, WGT, INP, "
                            "ACC or ACC_8BIT)")
        if op == Opcode.STORE:
            if mt != MemType.OUT:
                raise ExecFault(f"STORE of memory_type {MemType(mt).name} is not supported "
                                f"(expected OUT)")
            pads = [insn[k] for k in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")]
            if any(pads):
                raise ExecFault(f"STORE cannot pad: y_pad_0, y_pad_1, x_pad_0, x_pad_1 = "
                                f"{pads} (expected all 0)")
        y, x = insn["y_size"], insn["x_size"]
        if x == 0 or (op == Opcode.STORE and y == 0):
            return
        rows = insn["y_pad_0"] + y + insn["y_pad_1"]
        cols = insn["x_pad_0"] + x + insn["x_pad_1"]
        attr, name, _ = _BUFFERS[mt]  # type: ignore[index]
        _sram_check(name, getattr(state, attr).shape[0], insn["sram_base"], rows * cols)
        _dram_check(dram, insn, state.cfg.elem_bytes(mt))
    elif op == Opcode.GEMM:
        _check_loop(state, insn, state.cfg.inp_depth, "INP")
    elif op == Opcode.ALU:
        _check_loop(state, insn, state.cfg.acc_depth, "ACC")


def execute(state: ArchState, dram: np.ndarray, insn: Insn, tick: Tick | None = None) -> None:
    """Apply one instruction's data effect (FINISH has none); ``tick`` is called between the
    pieces of a long loop."""
    op = insn["opcode"]
    if op == Opcode.LOAD:
        load(state, dram, insn)
    elif op == Opcode.STORE:
        store(state, dram, insn)
    elif op == Opcode.GEMM:
        gemm(state, insn, tick)
    elif op == Opcode.ALU:
        alu(state, insn, tick)
