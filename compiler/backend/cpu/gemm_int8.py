"""int8 × int8 → int32 GEMM as LLVM IR, for the quantised CPU path (bit-exact integer math).

``C[M, N] = sum_k int32(A[m, k]) * int32(B[k, n])``. Row-major i-k-j loop nest with the j loop
widening (sext i8 → i32) and vectorised by LLVM; threads split the rows. Correctness first: a
``vpdpbusd`` micro-kernel would need B packed as 4-deep k groups.
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from vtakit.runtime.cpu.llvm import CACHE
from vtakit.runtime.cpu.parallel import run_parallel, split_range

from . import gemm as G
from . import irutil as U


def _module() -> ir.Module:
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
    G.check_array(a, "gemm_int8: a", 2, np.int8)
    G.check_array(b, "gemm_int8: b", 2, np.int8)
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(f"gemm_int8: a has shape {a.shape} but b has shape {b.shape}; "
                         f"expected b of shape ({k}, N)")
    n = b.shape[1]
    if out is None:
        out = np.empty((m, n), np.int32)
    else:
        G.check_array(out, "gemm_int8: out", 2, np.int32)
        if out.shape != (m, n):
            raise ValueError(f"gemm_int8: out has shape {out.shape}, expected {(m, n)}")
    fn = CACHE.get(("gemm_i8",), _module).cfunc("gemm_i8", None, *(G._P,) * 3, *(G._L,) * 5)
    run_parallel([lambda s=s, e=e: fn(a.ctypes.data, b.ctypes.data, out.ctypes.data, m, n, k,
                                      s, e)
                  for s, e in split_range(m, threads)])
    return out
