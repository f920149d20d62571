"""Dense linear algebra on small matrices, one matrix per unit of the split range: Det."""

from __future__ import annotations

import llvmlite.ir as ir

from ....ir.dtypes import DType
from . import irutil as U
from . import scalar as S
from .loops import Kernel, kernel_function

F64 = DType.FLOAT64


def det(dt: DType, batch: int, n: int) -> Kernel:
    """out[b] = det(x[b]) for a (batch, n, n) array, by LU factorisation with partial pivoting
    in float64 (det = the product of the pivots, negated once per row swap; a zero pivot
    column gives 0). Operands: out, x, scratch (batch * n * n float64, the factors)."""
    key = ("det", dt, batch, n)

    def build() -> ir.Module:
        m, b, (out, x, w, lo, hi) = kernel_function(key, 3)
        acc = b.alloca(S.F64)
        piv = b.alloca(U.I64)
        best = b.alloca(S.F64)
        zero = ir.Constant(S.F64, 0.0)

        def at(base: ir.Value, i: ir.Value, j: ir.Value) -> ir.Value:
            return b.add(base, b.add(b.mul(i, U.i64(n)), j))

        with U.loop(b, lo, hi, 1, "m") as mat:
            base = b.mul(mat, U.i64(n * n))
            with U.loop(b, 0, U.i64(n * n), 1, "cp") as i:
                v = S.convert(b, S.load(b, dt, x, b.add(base, i)), dt, F64)
                S.store(b, F64, v, w, b.add(base, i))
            b.store(ir.Constant(S.F64, 1.0), acc)
            with U.loop(b, 0, U.i64(n), 1, "k") as k:
                # the pivot: the first row i >= k with the largest |w[i, k]|
                b.store(k, piv)
                b.store(S.intrinsic(b, "fabs", S.load(b, F64, w, at(base, k, k))), best)
                with U.loop(b, b.add(k, U.i64(1)), U.i64(n), 1, "p") as i:
                    v = S.intrinsic(b, "fabs", S.load(b, F64, w, at(base, i, k)))
                    larger = b.fcmp_ordered(">", v, b.load(best))
                    b.store(b.select(larger, v, b.load(best)), best)
                    b.store(b.select(larger, i, b.load(piv)), piv)
                p = b.load(piv)
                with b.if_then(b.icmp_signed("!=", p, k)):
                    with U.loop(b, k, U.i64(n), 1, "s") as j:
                        a, c = at(base, k, j), at(base, p, j)
                        va, vc = S.load(b, F64, w, a), S.load(b, F64, w, c)
                        S.store(b, F64, vc, w, a)
                        S.store(b, F64, va, w, c)
                    b.store(b.fneg(b.load(acc)), acc)
                pivot = S.load(b, F64, w, at(base, k, k))
                b.store(b.fmul(b.load(acc), pivot), acc)
                # eliminate below the pivot (skipped for a zero pivot: the product is 0)
                with b.if_then(b.fcmp_unordered("!=", pivot, zero)):
                    with U.loop(b, b.add(k, U.i64(1)), U.i64(n), 1, "r") as i:
                        f = b.fdiv(S.load(b, F64, w, at(base, i, k)), pivot)
                        with U.loop(b, b.add(k, U.i64(1)), U.i64(n), 1, "e") as j:
                            ij = at(base, i, j)
                            r = b.fsub(S.load(b, F64, w, ij),
                                       b.fmul(f, S.load(b, F64, w, at(base, k, j))))
                            S.store(b, F64, r, w, ij)
            S.store(b, dt, S.convert(b, b.load(acc), F64, dt), out, mat)
        b.ret_void()
        return m

    return Kernel(key, "kernel", "pppll", build, batch)
