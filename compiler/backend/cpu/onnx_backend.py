"""An `onnx.backend.base.Backend` over the compiled CPU path (import → optimize → lower →
LLVM kernels), so that the ONNX backend node tests check the CPU backend against the ONNX
specification. Kernels are compiled in this process through `jit.CACHE`, keyed by
(op, dtypes, shapes, attributes), so tests with the same kernel share its machine code."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from ...compile import optimize_graph
from ...errors import NonConstantError
from ...frontend.onnx import import_onnx
from ...ir.graph import Graph
from ...onnx_backend import ReferenceBackend, ReferenceRep
from .lower import lower


def _executor(g: Graph) -> Any:
    from vtakit.runtime.executor import GraphExecutor

    return GraphExecutor(lower(optimize_graph(g), threads=1))


class CpuRep(ReferenceRep):
    """A prepared model; re-specialised per run when an input decides a shape (as the
    reference backend does)."""

    def __init__(self, model: onnx.ModelProto, graph: Graph | None) -> None:
        super().__init__(model, graph)
        self.executor = _executor(graph) if graph is not None else None

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        feeds = self.feeds(inputs)
        ex = self.executor
        if ex is None:
            from ...onnx_backend import _specialise

            ex = _executor(_specialise(self.model, feeds))
        for name in ex.input_names:
            ex.set_input(name, feeds[name])
        ex.run()
        return tuple(ex.get_output(i) for i in range(len(ex.output_names)))


class CpuBackend(ReferenceBackend):
    """`prepare` compiles for the CPU; `run_node` is the reference backend's (it builds a
    one-node model and calls ``cls.prepare``)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> CpuRep:
        try:
            graph: Graph | None = import_onnx(model)
        except NonConstantError:
            graph = None
        return CpuRep(model, graph)
