"""The llvmlite lifecycle: lazy init, debug dump, cache, finalisation, object emission."""

import struct
import subprocess
import sys

import llvmlite.ir as ir
import pytest

from vtakit.compiler.backend.cpu.kernels import irutil as U
from vtakit.runtime.cpu import llvm as jit


def _add_one_module(name: str = "add_one") -> ir.Module:
    m = ir.Module(name=name)
    _, b = U.new_function(m, "add_one", [("x", U.I64)], ret=U.I64)
    b.ret(b.add(b.function.args[0], U.i64(1)))
    return m


def _elf_machine(obj: bytes) -> int:
    assert obj[:4] == b"\x7fELF"
    assert obj[4] == 2  # ELFCLASS64
    assert struct.unpack_from("<H", obj, 16)[0] == 1  # ET_REL: an object file
    return struct.unpack_from("<H", obj, 18)[0]


def test_targets_are_not_initialised_at_import():
    code = ("import vtakit.runtime.cpu.llvm as j, vtakit.compiler.backend.cpu.kernels.gemm, "
            "vtakit.compiler.backend.cpu.kernels.conv; "
            "assert j._init_native.cache_info().currsize == 0; "
            "assert j._init_all.cache_info().currsize == 0")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_jit_runs_host_code():
    jm = jit.JitModule(_add_one_module()).compile()
    import ctypes

    assert jm.cfunc("add_one", ctypes.c_int64, ctypes.c_int64)(41) == 42


def test_finalised_module_rejects_more_ir():
    jm = jit.JitModule(_add_one_module()).compile()
    with pytest.raises(RuntimeError, match="module 'add_one' is finalised"):
        jm.define(lambda m: None)


def test_cache_compiles_each_variant_once():
    cache = jit.KernelCache()
    calls = []

    def build():
        calls.append(1)
        return _add_one_module()

    a = cache.get(("k", 1), build)
    assert cache.get(("k", 1), build) is a
    cache.get(("k", 2), build)
    assert len(calls) == 2 and cache.compiles == 2


def test_debug_dump_at_level_4(monkeypatch, capsys):
    monkeypatch.setenv("VTAKIT_DEBUG", "4")
    jit.JitModule(_add_one_module("dumped")).compile()
    err = capsys.readouterr().err
    assert "LLVM IR of dumped" in err and 'define i64 @"add_one"' in err
    monkeypatch.setenv("VTAKIT_DEBUG", "3")
    jit.JitModule(_add_one_module("quiet")).compile()
    assert "quiet" not in capsys.readouterr().err


def test_debug_level_must_be_an_integer(monkeypatch):
    monkeypatch.setenv("VTAKIT_DEBUG", "loud")
    with pytest.raises(ValueError, match=r"VTAKIT_DEBUG='loud' is not an integer"):
        jit.debug_level()


def test_emit_host_object():
    assert _elf_machine(jit.emit_object(_add_one_module())) == 62  # EM_X86_64


def test_emit_aarch64_object_from_a_gemm_kernel():
    from vtakit.compiler.backend.cpu.kernels import gemm

    mod = gemm.build_module(gemm.DEFAULT, "col", "relu")
    obj = jit.emit_object(mod, jit.AARCH64_TRIPLE)
    assert _elf_machine(obj) == 183  # EM_AARCH64
    assert b"gemm_packed" in obj


def test_unknown_triple():
    with pytest.raises(ValueError, match="unknown target triple 'nonsense-"):
        jit.emit_object(_add_one_module(), "nonsense-unknown-none")
