"""CPU backend: kernels generated as LLVM IR with llvmlite, JIT-compiled for the host or emitted
as object code (x86-64, aarch64).

Kernels take numpy arrays (float32 or int8, C-contiguous) and are called through ctypes, so
several threads can run them at once.
"""
