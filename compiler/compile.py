"""ONNX → artifact: import, optimise, lower, link, emit object code.

    compile_model("model.onnx", target="cpu", threads=2) -> runtime.Artifact
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from vtakit import __version__

from .backend.cpu import jit
from .backend.cpu.lower import lower
from .backend.cpu.program import CpuProgram
from .frontend.onnx import import_onnx
from .ir.graph import Graph

TARGETS = {"cpu": None, "host": None, "aarch64": jit.AARCH64_TRIPLE}


def optimize_graph(g: Graph) -> Graph:
    """`compiler.pipeline.optimize`; the import is checked here so that the backend also
    works on a tree without the pass pipeline (then: no passes)."""
    try:
        from .pipeline import optimize
    except ImportError:  # PIPELINE-CHECK: compiler/pipeline.py absent -> lower unoptimised
        return g
    return optimize(g)


def lower_model(model: Any, *, threads: int = 2, batch_size: int = 1,
                optimize: bool = True) -> CpuProgram:
    """An ONNX model (ModelProto, path or bytes) lowered for the CPU in this process."""
    g = import_onnx(model, batch_size=batch_size)
    return lower(optimize_graph(g) if optimize else g, threads=threads)


def compile_model(model: Any, *, target: str = "cpu", threads: int = 2, batch_size: int = 1,
                  optimize: bool = True) -> Any:
    """Compile an ONNX model into an `Artifact` for `target` ("cpu" / "host": this machine,
    "aarch64": a 64-bit ARM Linux board, cross-compiled; not runnable here)."""
    from vtakit.runtime.artifact import FORMAT, FORMAT_VERSION, Artifact

    from .backend.cpu.codegen_link import emit_object, link_ir

    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {sorted(TARGETS)}")
    t0 = time.perf_counter()
    program = lower_model(model, threads=threads, batch_size=batch_size, optimize=optimize)
    ir_text = link_ir(program)
    name = "host" if TARGETS[target] is None else target
    objects = {name: emit_object(ir_text, TARGETS[target])}
    cpu, features = jit.host_cpu()
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "vtakit_version": __version__,
        "created_by": f"vtakit {__version__} compile",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "targets": sorted(objects),
        "triple": TARGETS[target] or _process_triple(),
        "host": {"cpu": cpu, "features": features} if name == "host" else {},
        "threads": threads,
        "inputs": [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in program.inputs],
        "outputs": [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in program.outputs],
        "kernels": len(program.kernels), "steps": len(program.steps),
        "arena_bytes": program.arena_bytes,
        "compile_seconds": round(time.perf_counter() - t0, 3),
    }
    return Artifact(manifest, program, ir_text, objects)


def _process_triple() -> str:
    import llvmlite.binding as llvm

    return llvm.get_process_triple()
