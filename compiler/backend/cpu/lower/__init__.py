"""Lower an (optimised) graph's nodes to CPU steps: kernels, and calls of them in a `Plan`.

    lower_nodes(g, plan_builder) -> PlanSection   # the socket's entry: the nodes left to the CPU
    lower(g, threads=2) -> Plan                   # a CPU-only plan, for this process

Every node becomes one `Step`: one or more calls of LLVM-generated functions, with buffer
pointers and integer/float constants as arguments. Nothing is computed with numpy at run time:
the executor only allocates the buffers once and then calls the functions in order. A step
whose work can be split (its outermost loop, or the GEMM's tiles) is called on [lo, hi) ranges
from several threads.

Kernels (``../kernels/``, one module per op family): the fast float32 kernels (packed GEMM with
fused bias and ReLU/clip, im2col convolution, depthwise convolution, 2-D pooling) for the common
cases, and the generic loop nests for everything else: elementwise programs over all dtypes with
broadcasting, reductions, data movement, softmax, layer norm, naive matmul and convolution (N-d,
integer, quantised), pooling, GridSample and Det.

Buffers (in the shared `compiler.lowering.PlanBuilder`): graph inputs and outputs, constants
(parameters, with the GEMM/convolution weights pre-packed), and one arena for every intermediate
and scratch buffer, placed from the live ranges by the one memory planner
(`passes.plan_memory.place`). RESHAPE and IDENTITY alias their operand's storage.

Files: `base.py` (`LowererBase`: the lowering's state and helpers), `nn.py` (`NnLowering`:
matmul, gemm, conv, pooling, integer ops), `walk.py` (`_Lowerer`: the walk, elementwise, data
movement, reductions, the rest; `lower_nodes`, `lower`).
"""

from __future__ import annotations

from .walk import _Lowerer, lower, lower_nodes

__all__ = ["_Lowerer", "lower", "lower_nodes"]
