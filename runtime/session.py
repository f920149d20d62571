"""An onnxruntime-shaped session over a compiled artifact:

    sess = InferenceSession("model.vtak")      # or an ONNX model / path / bytes: compiled now
    (y,) = sess.run(None, {"x": x})

The runtime never imports the compiler (a deployed model needs none). An ONNX model is compiled
by the compiler that the installation declares under the ``vtakit.compilers`` entry point
(``onnx``: `vtakit.compiler.compile_model`); a runtime installed without it says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .artifact import Artifact
from .executor import GraphExecutor

_ORT_TYPES = {"float32": "tensor(float)", "float64": "tensor(double)",
              "float16": "tensor(float16)", "bool": "tensor(bool)"}


@dataclass(frozen=True)
class NodeArg:
    """An input or output: name, shape (list of ints) and type ("tensor(float)"...)."""

    name: str
    shape: list[int]
    type: str
    dtype: np.dtype


class InferenceSession:
    """Runs a compiled model.

    Parameters
    ----------
    model : str, Path, bytes, Artifact or onnx.ModelProto
        A ``.vtak`` artifact (path or bytes), or an ONNX model (path ending in ``.onnx``,
        ModelProto, or serialised bytes), which is compiled for this CPU first.
    threads : int, optional
        Threads to run with (default: the artifact's).

    Attributes
    ----------
    artifact : Artifact
    executor : GraphExecutor
    """

    def __init__(self, model: Any, threads: int | None = None) -> None:
        self.artifact = _artifact(model, threads)
        self.executor = GraphExecutor(self.artifact, threads=threads)
        p = self.artifact.plan
        self._inputs = [NodeArg(n, list(s), _type(d), np.dtype(d)) for n, d, s in p.inputs]
        self._outputs = [NodeArg(n, list(s), _type(d), np.dtype(d)) for n, d, s in p.outputs]

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def run(self, output_names: list[str] | None, input_feed: dict[str, Any]) -> list[np.ndarray]:
        """Outputs (all, or those named) for the inputs in `input_feed` (every input, by name)."""
        if not isinstance(input_feed, dict):
            raise TypeError(f"input_feed must be a dict of name -> array, got "
                            f"{type(input_feed).__name__}")
        names = [i.name for i in self._inputs]
        missing = [n for n in names if n not in input_feed]
        unknown = [n for n in input_feed if n not in names]
        if missing or unknown:
            raise ValueError(f"inputs: missing {missing}, unknown {unknown}; expected {names}")
        for k, v in input_feed.items():
            self.executor.set_input(k, v)
        outs = [o.name for o in self._outputs]
        wanted = outs if output_names is None else list(output_names)
        for w in wanted:
            if w not in outs:
                raise ValueError(f"unknown output name {w!r}; expected one of {outs}")
        self.executor.run()
        return [self.executor.get_output(w) for w in wanted]


def _type(dtype: str) -> str:
    name = np.dtype(dtype).name
    return _ORT_TYPES.get(name, f"tensor({name})")


def _artifact(model: Any, threads: int | None) -> Artifact:
    if isinstance(model, Artifact):
        return model
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.suffix != ".onnx":
            return Artifact.load(path)
    elif isinstance(model, bytes) and model[:2] == b"PK":
        return Artifact.load(model)
    return _compiler()(model, threads=threads or 2)


def _compiler() -> Any:
    """The ONNX compiler declared by the installation (entry point group ``vtakit.compilers``,
    name ``onnx``)."""
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="vtakit.compilers") if ep.name == "onnx"]
    if not found:
        raise TypeError("InferenceSession: got an ONNX model, but no ONNX compiler is installed "
                        "(entry point vtakit.compilers:onnx); compile it where vtakit's compiler "
                        "is installed ('vtakit compile model.onnx -o model.vtak') and pass the "
                        ".vtak file")
    return found[0].load()
