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
from .ir.graph import Graph
from .lowering import lower_graph
from .pipeline import optimize as optimize_graph


def _lower(model: Any, target: str, options: Any, cpu_options: Any, threads: int,
           batch_size: int, optimize: bool, quantize: Any = None, calib: Any = None,
           ) -> tuple[Plan, list[PlanSection], Any]:
    plan, sections, _, report = lower_model_graph(
        model, target=target, options=options, cpu_options=cpu_options, threads=threads,
        batch_size=batch_size, optimize=optimize, quantize=quantize, calib=calib)
    return plan, sections, report


def lower_model_graph(model: Any, *, target: str = "cpu", options: Any = None,
                      cpu_options: Any = None, threads: int = 2, batch_size: int = 1,
                      optimize: bool = True, quantize: Any = None, calib: Any = None,
                      ) -> tuple[Plan, list[PlanSection], Graph, Any]:
    """`lower_model`, with what it was lowered from: (the plan, each backend's section with the
    nodes it took, the graph those index, the quantiser's report or None). `vtakit compare`
    counts the offload on them."""
    get_backend(target)  # an unknown target fails before the import
    g = import_onnx(model, batch_size=batch_size)
    report = None
    if quantize:
        from .quantize import QuantOptions, quantize_graph

        if calib is None:
            raise ValueError("quantize: calibration data is required (calib=...: a .npz, a "
                             "directory of .npy files or an iterable of arrays)")
        qopts = quantize if isinstance(quantize, QuantOptions) else QuantOptions()
        g, report = quantize_graph(g, calib, qopts)
    g = optimize_graph(g) if optimize else g
    plan, sections = lower_graph(g, target, options, threads=threads, cpu_options=cpu_options)
    return plan, sections, g, report


def lower_model(model: Any, *, target: str = "cpu", options: Any = None,
                cpu_options: Any = None, threads: int = 2, batch_size: int = 1,
                optimize: bool = True, quantize: Any = None, calib: Any = None) -> Plan:
    """An ONNX model (ModelProto, path or bytes) lowered for `target` in this process (a plan
    for `runtime.GraphExecutor`; nothing is written). `quantize` (True or a
    `compiler.quantize.QuantOptions`) with `calib` data makes it the int8 integer graph first."""
    return _lower(model, target, options, cpu_options, threads, batch_size, optimize,
                  quantize, calib)[0]


def compile_model(model: Any, *, target: str = "cpu", options: Any = None,
                  cpu_options: Any = None, threads: int = 2, batch_size: int = 1,
                  optimize: bool = True, quantize: Any = None, calib: Any = None) -> Artifact:
    """Compile an ONNX model into an `Artifact` for `target` (a registered backend, see
    `compiler.backend.available_backends`; nodes it does not take run on ``cpu``). `options`
    are the target backend's (its options dataclass, a dict of its fields, or None);
    `cpu_options` those of the CPU backend when it is not the target (e.g.
    ``{"triple": "aarch64"}``). `quantize` (True or a `compiler.quantize.QuantOptions`) with
    `calib` data quantises the model to int8 first; the artifact's ``quantization`` attribute
    then holds the quantiser's report."""
    t0 = time.perf_counter()
    plan, sections, report = _lower(model, target, options, cpu_options, threads, batch_size,
                                    optimize, quantize, calib)
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
    if report is not None:
        manifest["quantization"] = {
            "mode": report.mode,
            "int8_layers": sum(r.kind == "int8" for r in report.layers),
            "float_layers": [r.name for r in report.layers if r.kind.startswith("float (")],
            "output_sqnr_db": round(report.output_sqnr_db, 2),
        }
    manifest["compile_seconds"] = round(time.perf_counter() - t0, 3)
    art = Artifact(manifest, plan)
    art.quantization = report
    return art
