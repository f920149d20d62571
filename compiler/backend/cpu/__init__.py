"""The ``cpu`` backend: every IR op as LLVM IR kernels (llvmlite), run by the runtime's ``cpu``
runner; the backend that takes every node the target backend leaves.

Options (`CpuOptions`): ``triple``, the LLVM target triple the artifact's object code is built
for (None: this machine, for its CPU and features; ``"aarch64"``: 64-bit ARM Linux, cross-compiled,
not runnable here). The IR (``cpu/module.ll``) is stored beside the object code either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from vtakit.runtime.cpu import llvm
from vtakit.runtime.cpu.runner import host_object_meta
from vtakit.runtime.plan import Section

from ...ir.graph import Graph
from ...lowering import PlanBuilder
from .. import PlanSection, register_backend
from .lower import lower_nodes

TRIPLES = {"host": None, "aarch64": llvm.AARCH64_TRIPLE}


@dataclass(frozen=True)
class CpuOptions:
    """triple: an LLVM target triple, or a short name in `TRIPLES` (None / "host": this
    machine)."""

    triple: str | None = None

    def __post_init__(self) -> None:
        if self.triple is not None and not isinstance(self.triple, str):
            raise TypeError(f"cpu option triple must be a str or None, got "
                            f"{type(self.triple).__name__}")

    @property
    def full_triple(self) -> str | None:
        return TRIPLES.get(self.triple, self.triple) if self.triple is not None else None


@register_backend("cpu", options=CpuOptions)
def lower(g: Graph, opts: CpuOptions, plan: PlanBuilder) -> PlanSection:
    """LLVM IR kernels for every op (host x86-64/aarch64 object code, or JIT in process)."""
    triple = opts.full_triple
    # Code for another machine uses no host-only instructions (VNNI would not even compile for
    # aarch64: LLVM aborts on an x86 intrinsic there).
    section = lower_nodes(g, plan, vnni=None if triple is None else False)

    def emit(sec: Section) -> dict[str, bytes]:
        ir_text = llvm.link([k.build() for k in sec.live])
        if triple is None:
            name, meta = "host.o", host_object_meta()
        else:
            name, meta = f"{triple.split('-')[0]}.o", {"triple": triple, "cpu": "",
                                                        "features": ""}
        sec.meta["objects"] = {name: meta}
        return {"module.ll": ir_text.encode(), name: llvm.emit_object(ir_text, triple)}

    section.emit = emit
    return section


__all__ = ["CpuOptions", "lower"]
