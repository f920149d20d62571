"""ONNX `onnx.backend.base.Backend` adapters: `ReferenceBackend` (the importer and the reference
interpreter) and `compiled_backend(target)` (`CpuBackend`: the compiled CPU path), so that the
ONNX backend node tests (tests/conformance) check both against the ONNX specification."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from .errors import NonConstantError
from .frontend.onnx import import_onnx
from .ir.graph import Graph
from .ir.interpreter import run
from .ir.verify import verify


class ReferenceRep(BackendRep):
    """A prepared model. When an input decides a shape (Reshape's shape fed as an input, as
    node tests do), the model is imported again for each run with those inputs bound as
    constants: the compiler only supports static shapes."""

    def __init__(self, model: onnx.ModelProto, graph: Graph | None) -> None:
        self.model = model
        self.graph = graph
        init = {i.name for i in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in init]

    def feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        """The inputs of :meth:`run` (a dict, a list in input order, or one array) by name."""
        if isinstance(inputs, dict):
            return {k: np.asarray(v) for k, v in inputs.items()}
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        return {n: np.asarray(v) for n, v in zip(self.input_names, inputs, strict=False)}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        feeds = self.feeds(inputs)
        graph = self.graph or _specialise(self.model, feeds)
        names = set(graph.input_names)
        out = run(graph, {k: v for k, v in feeds.items() if k in names})
        return tuple(out[n] for n in graph.output_names)


def _specialise(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Graph:
    bound: dict[str, np.ndarray] = {}
    while True:
        try:
            return verify(import_onnx(model, constant_inputs=bound))
        except NonConstantError as e:
            if not e.inputs or any(n not in feeds or n in bound for n in e.inputs):
                raise
            bound.update({n: feeds[n] for n in e.inputs})


class ReferenceBackend(Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU",
                **kwargs: Any) -> ReferenceRep:
        try:
            graph: Graph | None = verify(import_onnx(model))
        except NonConstantError:
            graph = None
        return ReferenceRep(model, graph)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence[np.ndarray], device: str = "CPU",
                 outputs_info: Any = None, **kwargs: Any) -> tuple[np.ndarray, ...]:
        from onnx import helper

        arrays = [np.asarray(x) for x in inputs]
        graph_inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
            a.dtype), a.shape) for name, a in zip(node.input, arrays, strict=False) if name]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(
            helper.make_graph([node], "run_node", graph_inputs, []),
            opset_imports=[helper.make_opsetid("", int(opset))])
        # Graph outputs need types: take them from ONNX's shape inference.
        inferred = onnx.shape_inference.infer_shapes(model)
        types = {vi.name: vi for vi in inferred.graph.value_info}
        model.graph.output.extend(types[n] for n in node.output if n)
        feeds = {n: a for n, a in zip(node.input, arrays, strict=False) if n}
        return cls.prepare(model, device).run(feeds)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


class CompiledRep(ReferenceRep):
    """A model compiled for a backend and run by the runtime; re-specialised per run when an
    input decides a shape (as the reference backend does)."""

    target = "cpu"
    options: Any = None

    def __init__(self, model: onnx.ModelProto, graph: Graph | None) -> None:
        super().__init__(model, graph)
        self.executor = self._executor(graph) if graph is not None else None

    def _executor(self, g: Graph) -> Any:
        from vtakit.runtime.executor import GraphExecutor

        from .lowering import lower_graph
        from .pipeline import optimize

        plan, _ = lower_graph(optimize(g), self.target, self.options, threads=1)
        return GraphExecutor(plan)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        feeds = self.feeds(inputs)
        ex = self.executor
        if ex is None:
            ex = self._executor(_specialise(self.model, feeds))
        for name in ex.input_names:
            ex.set_input(name, feeds[name])
        ex.run()
        return tuple(ex.get_output(i) for i in range(len(ex.output_names)))


def compiled_backend(target: str = "cpu", options: Any = None) -> type[ReferenceBackend]:
    """An ONNX `Backend` whose `prepare` compiles for `target` (a registered backend; nodes it
    does not take run on the CPU backend) in this process; `run_node` is the reference
    backend's (it builds a one-node model and calls ``prepare``). Kernels are compiled through
    the runtime's kernel cache, so tests with the same kernel share its machine code."""
    from .backend import get_backend

    get_backend(target)
    rep = type(f"{target.capitalize()}Rep", (CompiledRep,),
               {"target": target, "options": options})

    class _Compiled(ReferenceBackend):
        @classmethod
        def prepare(cls, model: onnx.ModelProto, device: str = "CPU",
                    **kwargs: Any) -> ReferenceRep:
            try:
                graph: Graph | None = import_onnx(model)
            except NonConstantError:
                graph = None
            return rep(model, graph)

    _Compiled.__name__ = _Compiled.__qualname__ = f"{target.capitalize()}Backend"
    return _Compiled


CpuBackend = compiled_backend("cpu")
