"""int8 GEMM is exact against numpy's int32 matmul."""

import numpy as np
import pytest

from vtakit.compiler.backend.cpu.kernels.gemm import gemm_int8

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 17, 33), (33, 1, 7), (64, 300, 65)])
@pytest.mark.parametrize("threads", [1, 2])
def test_exact(m, k, n, threads):
    a = RNG.integers(-128, 128, (m, k), dtype=np.int8)
    b = RNG.integers(-128, 128, (k, n), dtype=np.int8)
    a[0, 0], b[0, 0] = -128, -128
    np.testing.assert_array_equal(gemm_int8(a, b, threads=threads),
                                  a.astype(np.int32) @ b.astype(np.int32))


def test_errors():
    a = np.zeros((2, 3), np.int8)
    with pytest.raises(TypeError, match="gemm_int8: a: expected dtype int8, got uint8"):
        gemm_int8(a.astype(np.uint8), a.T.copy())
    with pytest.raises(ValueError, match=r"b has shape \(2, 3\); expected b of shape \(3, N\)"):
        gemm_int8(a, a)
    with pytest.raises(TypeError, match="gemm_int8: out: expected dtype int32, got float32"):
        gemm_int8(a, a.T.copy(), out=np.zeros((2, 2), np.float32))
