"""ONNX → artifact: import, optimise, lower through the backend socket, emit each section.

    compile_model("model.onnx", target="cpu", threads=2) -> runtime.Artifact
    lower_model("model.onnx", target="cpu") -> runtime.Plan   # runnable in this process
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from vtakit import __version__
from vtakit.runtime.artifact import FORMAT, FORMAT_VERSION, Artifact
from vtakit.runtime.plan import Plan

from .backend import PlanSection, get_backend
from .frontend.onnx import import_onnx
from .lowering import lower_graph
from .pipeline import optimize as optimize_graph


def _lower(model: Any, target: str, options: Any, cpu_options: Any, threads: int,
           batch_size: int, optimize: bool) -> tuple[Plan, list[PlanSection]]:
    get_backend(target)  # an unknown target fails before the import
    g = import_onnx(model, batch_size=batch_size)
    return lower_graph(optimize_graph(g) if optimize else g, target, options, threads=threads,
                       cpu_options=cpu_options)


def lower_model(model: Any, *, target: str = "cpu", options: Any = None,
                cpu_options: Any = None, threads: int = 2, batch_size: int = 1,
                optimize: bool = True) -> Plan:
    """An ONNX model (ModelProto, path or bytes) lowered for `target` in this process (a plan
    for `runtime.GraphExecutor`; nothing is written)."""
    return _lower(model, target, options, cpu_options, threads, batch_size, optimize)[0]


def compile_model(model: Any, *, target: str = "cpu", options: Any = None,
                  cpu_options: Any = None, threads: int = 2, batch_size: int = 1,
                  optimize: bool = True) -> Artifact:
    """Compile an ONNX model into an `Artifact` for `target` (a registered backend, see
    `compiler.backend.available_backends`; nodes it does not take run on ``cpu``). `options`
    are the target backend's (its options dataclass, a dict of its fields, or None);
    `cpu_options` those of the CPU backend when it is not the target (e.g.
    ``{"triple": "aarch64"}``)."""
    t0 = time.perf_counter()
    plan, sections = _lower(model, target, options, cpu_options, threads, batch_size, optimize)
    manifest: dict[str, Any] = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "vtakit_version": __version__,
        "created_by": f"vtakit {__version__} compile",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": target,
        "backends": [s.backend for s in sections],
        "threads": threads,
        "inputs": [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in plan.inputs],
        "outputs": [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in plan.outputs],
        "steps": len(plan.steps),
        "steps_by_backend": {b: sum(s.backend == b for s in plan.steps) for b in plan.backends},
        "arena_bytes": plan.arena_bytes,
    }
    for s in sections:
        if s.emit is not None:
            s.section.members = s.emit(s.section)
        s.section.live = None  # an artifact runs from its members, like a loaded one
        if s.hw_config is not None:
            if "hw_config" in manifest and manifest["hw_config"] != s.hw_config:
                raise ValueError(f"backends {manifest['backends']} were built for different "
                                 f"hardware configurations")
            manifest["hw_config"], manifest["hw_config_hash"] = s.hw_config, s.hw_config_hash
    manifest["compile_seconds"] = round(time.perf_counter() - t0, 3)
    return Artifact(manifest, plan)
