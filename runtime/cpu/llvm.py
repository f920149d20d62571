"""The one llvmlite lifecycle: build, dump, parse, verify, optimise, then JIT or emit.

Every kernel generator of the CPU backend returns an `llvmlite.ir.Module`, and so do the runtime's
own generated functions (the thread pool's polling loops, the whole-graph function). This module
turns a module (or the textual IR of one) into callable machine code in this process (MCJIT) or
into an object file for any target triple (the host, or ``aarch64-unknown-linux-gnu`` for a
cross-compiled board), and loads an artifact's object code back. The order is fixed:

1. build with `llvmlite.ir` (the generators),
2. at ``VTAKIT_DEBUG>=4`` print ``str(module)`` to stderr (read at call time),
3. parse, ``verify()``,
4. optimise with the new pass manager at O3 for the target machine (`optimise`: the one pipeline),
5. JIT (`JitModule`, `LoadedCode`) or emit an object file (`emit_object`: the one emitter).

It lives in the runtime because a deployed model needs steps 3-5 (loading object code, or
compiling the IR where the object does not fit the CPU) without the compiler; the compiler uses
the same functions. Targets are initialised lazily, on the first compile, never at import.
`KernelCache` compiles each kernel variant once per process.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import llvmlite.binding as llvm
import llvmlite.ir as ir

from vtakit.debug import debug_level

AARCH64_TRIPLE = "aarch64-unknown-linux-gnu"
OPT_LEVEL = 3

_lock = threading.RLock()


@functools.cache
def _init_native() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()  # inline asm (the thread pool's "pause")


@functools.cache
def _init_all() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


@functools.cache
def host_cpu() -> tuple[str, str]:
    """(cpu name, feature string) of the machine we run on."""
    _init_native()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def host_has(feature: str) -> bool:
    """Whether the host CPU has an LLVM feature such as ``"avx512f"``."""
    return f"+{feature}" in host_cpu()[1].split(",")


def host_target_machine() -> llvm.TargetMachine:
    """A new host target machine. Not cached: an MCJIT engine takes ownership of (and disposes)
    the target machine it is created with."""
    _init_native()
    cpu, features = host_cpu()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=cpu, features=features, opt=OPT_LEVEL,
                                        reloc="default", codemodel="jitdefault")


def target_machine(triple: str, cpu: str = "", features: str = "") -> llvm.TargetMachine:
    """A target machine for `triple`, for emitting object code (position independent)."""
    _init_all()
    try:
        target = llvm.Target.from_triple(triple)
    except RuntimeError as exc:
        raise ValueError(f"unknown target triple {triple!r}: {exc}") from None
    return target.create_target_machine(cpu=cpu, features=features, opt=OPT_LEVEL, reloc="pic",
                                        codemodel="default")


def _dump(module: ir.Module) -> None:
    if debug_level() >= 4:
        print(f"; VTAKIT_DEBUG=4: LLVM IR of {module.name}\n{module}", file=sys.stderr)


def optimise(source: ir.Module | str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    """Steps 2-4: dump (a module), parse, verify, optimise for `tm`. `source` is a module being
    built or the textual IR of one (an artifact's ``module.ll``)."""
    if isinstance(source, ir.Module):
        _dump(source)
        source.triple = tm.triple
        source.data_layout = str(tm.target_data)
        mod = llvm.parse_assembly(str(source))
    else:
        mod = llvm.parse_assembly(source)
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def emit_object(source: ir.Module | str, triple: str | None = None, cpu: str = "",
                features: str = "") -> bytes:
    """Compile `source` (a module or textual IR) to an object file for `triple` (default: the
    host, for its CPU and features).

    The object is not loaded; use this for artifacts and cross-compilation
    (``triple=AARCH64_TRIPLE``).
    """
    with _lock:
        if triple is None:
            _init_native()
            triple = llvm.get_process_triple()
            cpu, features = host_cpu()
        tm = target_machine(triple, cpu, features)
        return tm.emit_object(optimise(source, tm))


def symbol(kernel: int, fname: str) -> str:
    """The name of kernel `kernel`'s function `fname` in a program's linked module."""
    return f"k{kernel}_{fname}"


def link(modules: Sequence[ir.Module]) -> str:
    """The textual IR of `modules` linked into one, unoptimised and target-free, with module
    ``i``'s functions and globals renamed ``symbol(i, name)`` (a program's ``module.ll``)."""
    with _lock:
        _init_native()
        main = llvm.parse_assembly("")
        for i, m in enumerate(modules):
            _dump(m)
            mod = llvm.parse_assembly(str(m))
            for f in mod.functions:
                if not f.is_declaration:
                    f.name = symbol(i, f.name)
            for gv in mod.global_variables:
                if not gv.is_declaration:
                    gv.name = symbol(i, gv.name)
            main.link_in(mod)
        main.verify()
        return str(main)


class LoadedCode:
    """A program's linked machine code loaded into this process: from an object file (MCJIT's
    ``add_object_file``) or, failing that, by JIT-compiling its IR. Functions are looked up by
    kernel index and name (`symbol`). Keep it alive while any address from it is in use."""

    def __init__(self, ir_text: str | None = None, obj: bytes | None = None) -> None:
        with _lock:
            tm = host_target_machine()
            if obj is not None:
                self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
                self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
                self.source = "object"
            else:
                if ir_text is None:
                    raise ValueError("LoadedCode: neither object code nor IR given")
                self.engine = llvm.create_mcjit_compiler(optimise(ir_text, tm), tm)
                self.source = "ir"
            self.engine.finalize_object()

    def address(self, kernel: int, fname: str) -> int:
        addr = self.engine.get_function_address(symbol(kernel, fname))
        if not addr:
            raise KeyError(f"function {symbol(kernel, fname)!r} is not in the loaded code")
        return addr


@dataclass
class JitModule:
    """A module compiled and loaded into this process with MCJIT.

    Once compiled the module is final: `define` after `compile` raises. Keep this object alive
    while any of its function pointers is in use.
    """

    module: ir.Module
    engine: llvm.ExecutionEngine | None = None
    llvm_module: llvm.ModuleRef | None = None
    _cfuncs: dict[str, Any] = field(default_factory=dict)

    @property
    def finalized(self) -> bool:
        return self.engine is not None

    def compile(self) -> JitModule:
        with _lock:
            if self.engine is not None:
                return self
            tm = host_target_machine()
            mod = optimise(self.module, tm)
            engine = llvm.create_mcjit_compiler(mod, tm)
            engine.finalize_object()
            engine.run_static_constructors()
            self.llvm_module, self.engine = mod, engine
        return self

    def address(self, name: str) -> int:
        if self.engine is None:
            raise RuntimeError(f"module {self.module.name!r} is not compiled yet; call compile()")
        addr = self.engine.get_function_address(name)
        if not addr:
            raise KeyError(f"function {name!r} not found in module {self.module.name!r}")
        return addr

    def cfunc(self, name: str, restype: type | None, *argtypes: type) -> Any:
        """A ctypes function for `name` (the GIL is released during the call)."""
        fn = self._cfuncs.get(name)
        if fn is None:
            fn = ctypes.CFUNCTYPE(restype, *argtypes)(self.address(name))
            self._cfuncs[name] = fn
        return fn

    def define(self, build: Callable[[ir.Module], None]) -> None:
        """Add more IR to the module; only allowed before `compile`."""
        if self.engine is not None:
            raise RuntimeError(f"module {self.module.name!r} is finalised; build a new module "
                               "instead of adding to a compiled one")
        build(self.module)


class KernelCache:
    """Compiles each kernel variant once per process.

    The key is any hashable description of the variant (generator name + parameters); `build`
    returns the `ir.Module` for it and is called only on a miss.
    """

    def __init__(self) -> None:
        self._modules: dict[Hashable, JitModule] = {}
        self.compiles = 0

    def get(self, key: Hashable, build: Callable[[], ir.Module]) -> JitModule:
        with _lock:
            jm = self._modules.get(key)
            if jm is None:
                jm = JitModule(build()).compile()
                self._modules[key] = jm
                self.compiles += 1
            return jm

    def __len__(self) -> int:
        return len(self._modules)

    def clear(self) -> None:
        with _lock:
            self._modules.clear()


CACHE = KernelCache()


@dataclass(frozen=True)
class KernelRef:
    """A kernel a lowering produced, for running in the process that lowered it: `key` names the
    variant (for `CACHE`), `build` returns its `llvmlite.ir.Module`."""

    key: Hashable
    build: Callable[[], ir.Module]
