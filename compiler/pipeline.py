"""The optimisation pipeline: the graph passes, by name, in the order they run.

`compiler.compile` runs `optimize()` and then lowers the result through the backend socket
(`compiler.lowering.lower_graph`). Memory is planned after lowering, on the plan's buffers and
steps, by the one memory planner (`passes.plan_memory.place`), not by a pass here.
"""

from __future__ import annotations

from collections.abc import Callable

from vtakit.debug import debug_level

from .ir.graph import Graph
from .ir.verify import verify
from .passes import (
    eliminate_dead_code,
    fold_batch_norm,
    fold_constants,
    fold_requant_clamp,
    fuse_elementwise,
    fuse_epilogues,
    shift_uint8,
)

PASSES: tuple[Callable[[Graph], Graph], ...] = (
    fold_constants,       # weights computed in the graph (casts, transposes...) become CONST
    eliminate_dead_code,  # no identities or no-op reshapes hide patterns from what follows
    fold_batch_norm,      # needs CONST BN parameters; leaves CONV/GEMM/MATMUL with a bias
    shift_uint8,          # integer graphs: uint8 activations as int8 (the accelerator's type)
    fold_requant_clamp,   # integer graphs: a ReLU / clip joins its REQUANTIZE's bounds
    fuse_epilogues,       # bias adds, residual adds, activations into the producer
    fuse_elementwise,     # what remains elementwise, one loop per chain
    eliminate_dead_code,
)


# Quantisation (compiler.quantize) runs on the graph after the first QUANTIZE_AFTER passes: batch
# norms folded into their convolutions, every value still its own node (nothing fused), so that
# each one has been observed on the calibration data and gets its own scale.
QUANTIZE_AFTER = 3


def optimize(g: Graph, *, debug: int | None = None) -> Graph:
    """Run PASSES over g in order; with debug >= 1 (default: the VTAKIT_DEBUG environment
    variable), verify the graph before the first pass and after every pass, so a broken
    invariant names the pass that broke it."""
    return run_passes(g, PASSES, debug)


def prepare_for_quantization(g: Graph, *, debug: int | None = None) -> Graph:
    """The passes before quantisation (PASSES[:QUANTIZE_AFTER])."""
    return run_passes(g, PASSES[:QUANTIZE_AFTER], debug)


def run_passes(g: Graph, passes: tuple[Callable[[Graph], Graph], ...],
               debug: int | None = None) -> Graph:
    level = debug_level() if debug is None else debug
    if level >= 1:
        verify(g)
    for p in passes:
        g = p(g)
        if level >= 1:
            try:
                verify(g)
            except ValueError as e:
                raise type(e)(f"after pass {p.__name__}: {e}") from None
    return g
