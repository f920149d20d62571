"""The CPU backend's kernel generators, one module per op family: each holds the family's fast
float32 kernels and its generic loop nest (every dtype, N-d, integer / quantised forms).

    gemm.py         packed float32 GEMM, int8 GEMM, the generic matmul
    conv.py         im2col + GEMM conv, the depthwise window kernel, the int8 im2col / depthwise
                    kernels, the generic N-d conv
    pool.py         2-D max (the window kernel; float32 and 8-bit) / average / global pooling,
                    the generic pooling
    elementwise.py  float32 add / mul / relu / clip / softmax, the generic elementwise programs
                    and softmax
    loops.py        the loop-nest machinery (`Kernel`, nests, strides) and the ops without a
                    family module: data movement, reductions, norms, scans, scatters, einsum, ...
    sample.py       GridSample
    linalg.py       Det
    scalar.py       per-dtype scalar code: loads, stores, conversions, every elementwise op
    irutil.py       llvmlite helpers: types, counted loops, vectors, intrinsics

A fast kernel is a function building an `llvmlite.ir.Module` (compiled through
`runtime.cpu.llvm.CACHE` when called from numpy); a generic one returns a `loops.Kernel`.
"""
