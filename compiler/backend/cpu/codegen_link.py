"""One module for a whole program: link every kernel module into one, with its functions
renamed ``k<index>_<name>``, then optimise it and emit object code or load it with MCJIT.

This is the artifact path (one object file per model, plus its LLVM IR for machines without a
matching CPU). In-process runs (tests, the ONNX backend) compile each kernel separately through
`jit.CACHE` instead, so that kernels are shared between graphs.
"""

from __future__ import annotations

import llvmlite.binding as llvm

from . import jit
from .program import CpuProgram


def symbol(kernel: int, fname: str) -> str:
    return f"k{kernel}_{fname}"


def link_ir(program: CpuProgram) -> str:
    """The textual LLVM IR of all the program's kernels, linked, unoptimised, target-free."""
    with jit._lock:
        jit._init_native()
        main = llvm.parse_assembly("")
        for i, k in enumerate(program.kernels):
            mod = llvm.parse_assembly(str(k.build()))
            for f in mod.functions:
                if not f.is_declaration:
                    f.name = symbol(i, f.name)
            for gv in mod.global_variables:
                if not gv.is_declaration:
                    gv.name = symbol(i, gv.name)
            main.link_in(mod)
        main.verify()
        return str(main)


def _optimise(ir_text: str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    mod = llvm.parse_assembly(ir_text)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=jit.OPT_LEVEL)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def emit_object(ir_text: str, triple: str | None = None) -> bytes:
    """Object code for `triple` (None: the host, for its CPU and features)."""
    with jit._lock:
        if triple is None:
            jit._init_native()
            cpu, features = jit.host_cpu()
            tm = jit.target_machine(llvm.get_process_triple(), cpu, features)
        else:
            tm = jit.target_machine(triple)
        return tm.emit_object(_optimise(ir_text, tm))


class LoadedCode:
    """Machine code loaded into this process: from an object file (MCJIT's
    ``add_object_file``) or, failing that, by JIT-compiling the IR. Keep it alive while any
    address from it is in use."""

    def __init__(self, ir_text: str | None = None, obj: bytes | None = None) -> None:
        with jit._lock:
            tm = jit.host_target_machine()
            if obj is not None:
                self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
                self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
                self.source = "object"
            else:
                if ir_text is None:
                    raise ValueError("LoadedCode: neither object code nor IR given")
                self.engine = llvm.create_mcjit_compiler(_optimise(ir_text, tm), tm)
                self.source = "ir"
            self.engine.finalize_object()

    def address(self, kernel: int, fname: str) -> int:
        addr = self.engine.get_function_address(symbol(kernel, fname))
        if not addr:
            raise KeyError(f"function {symbol(kernel, fname)!r} is not in the loaded code")
        return addr
