"""The llvmlite lifecycle for CPU kernels: build, dump, parse, verify, optimise, JIT or emit.

Every kernel generator in this package returns an `llvmlite.ir.Module`; this module turns it into
callable machine code for the host (MCJIT) or into an object file for any target triple (the host,
or ``aarch64-unknown-linux-gnu`` for a cross-compiled board). The order is fixed:

1. build with `llvmlite.ir` (the generators),
2. at ``VTAKIT_DEBUG>=4`` print ``str(module)`` to stderr (read at call time),
3. parse, ``verify()``,
4. optimise with the new pass manager at O3 for the target machine,
5. JIT (host) or ``emit_object`` (any triple).

Targets are initialised lazily, on the first compile, never at import. `KernelCache` compiles each
kernel variant once per process.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import llvmlite.binding as llvm
import llvmlite.ir as ir

from ...debug import debug_level

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


def parse_and_optimise(module: ir.Module, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    """Steps 2–4: dump, parse, verify, optimise for `tm`. Returns the optimised module."""
    _dump(module)
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    mod = llvm.parse_assembly(str(module))
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def emit_object(module: ir.Module, triple: str | None = None, cpu: str = "",
                features: str = "") -> bytes:
    """Compile `module` to an object file for `triple` (default: the host, with its CPU).

    The object is not loaded; use this for artifacts and cross-compilation
    (``triple=AARCH64_TRIPLE``).
    """
    with _lock:
        if triple is None:
            _init_native()
            triple = llvm.get_process_triple()
            cpu, features = host_cpu()
        tm = target_machine(triple, cpu, features)
        return tm.emit_object(parse_and_optimise(module, tm))


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
            mod = parse_and_optimise(self.module, tm)
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
