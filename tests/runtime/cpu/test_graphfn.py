"""The compiled whole-graph runner (graphfn) and the native jobs of the thread pool."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from vtakit.compiler.backend.cpu.kernels.irutil import F32, I64, PTR, loop, new_function
from vtakit.runtime.cpu import graphfn as G
from vtakit.runtime.cpu.llvm import JitModule
from vtakit.runtime.cpu.parallel import run_native


@pytest.fixture(scope="module")
def add_kernel() -> JitModule:
    """``add(x, v, lo, hi)``: x[i] += v for i in [lo, hi)."""
    import llvmlite.ir as ir

    mod = ir.Module(name="test_add")
    fn, b = new_function(mod, "add", [("x", PTR), ("v", F32), ("lo", I64), ("hi", I64)])
    x, v, lo, hi = fn.args
    with loop(b, lo, hi) as i:
        p = b.gep(x, [i], source_etype=F32)
        b.store(b.fadd(b.load(p, typ=F32), v), p)
    b.ret_void()
    return JitModule(mod).compile()


def _graph(steps: list[G.NativeStep]) -> tuple[JitModule, int, object, np.ndarray]:
    jm = JitModule(G.build_graph_module(steps)).compile()
    state = np.zeros(G.state_words(steps) + 8, np.int64)
    off = (-state.ctypes.data % 64) // 8
    return jm, jm.address("graph"), jm.cfunc("graph", None, ctypes.c_int64), \
        state[off:off + G.state_words(steps)]


def _step(kernel: JitModule, x: np.ndarray, v: float, parts: int) -> G.NativeStep:
    call = G.NativeCall(kernel.address("add"), "pfll",
                        (("p", x.ctypes.data), ("f", v), ("lo",), ("hi",)))
    return G.NativeStep((call,), x.size, parts)


def test_units_group_consecutive_unsplit_steps(add_kernel: JitModule) -> None:
    x = np.zeros(8, np.float32)
    s1, s8 = _step(add_kernel, x, 1.0, 1), _step(add_kernel, x, 1.0, 8)
    assert [len(u) for u in G.units([s1, s1, s8, s1, s8, s8, s1, s1, s1])] == [2, 1, 1, 1, 1, 3]
    assert G.state_words([s1, s1]) == G.WORDS_PER_UNIT


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_every_part_runs_exactly_once_on_any_thread_count(add_kernel: JitModule,
                                                          threads: int) -> None:
    a = np.zeros(1001, np.float32)  # parts of unequal size (1001 = 7 * 143)
    b = np.zeros(64, np.float32)
    # a split step, two serial steps (one unit), a split step that depends on the first
    steps = [_step(add_kernel, a, 1.0, 7), _step(add_kernel, b, 1.0, 1),
             _step(add_kernel, b, 2.0, 1), _step(add_kernel, a, 10.0, 13)]
    jm, addr, call, state = _graph(steps)  # jm keeps the code loaded
    runs = 50
    for _ in range(runs):
        state.fill(0)
        run_native(addr, state.ctypes.data, threads, call)
    np.testing.assert_array_equal(a, np.full_like(a, 11.0 * runs))
    np.testing.assert_array_equal(b, np.full_like(b, 3.0 * runs))
    # each unit's parts were all claimed and done; a thread that entered late saw that
    units = state.reshape(-1, G.WORDS_PER_UNIT)
    np.testing.assert_array_equal(units[:, 8], [7, 1, 13])
    assert all(units[:, 0] >= [7, 1, 13])
    del jm


def test_a_finished_state_runs_nothing_again(add_kernel: JitModule) -> None:
    x = np.zeros(100, np.float32)
    jm, _, call, state = _graph([_step(add_kernel, x, 1.0, 4)])
    call(state.ctypes.data)
    call(state.ctypes.data)  # like a helper that starts after the others finished
    np.testing.assert_array_equal(x, np.ones_like(x))
    del jm


def test_signature_and_argument_count_must_agree(add_kernel: JitModule) -> None:
    bad = G.NativeCall(add_kernel.address("add"), "pfl", (("p", 0), ("f", 1.0), ("lo",),
                                                          ("hi",)))
    with pytest.raises(ValueError, match=r"signature 'pfl' has 3 arguments, got 4"):
        G.build_graph_module([G.NativeStep((bad,), 10, 1)])
    odd = G.NativeCall(add_kernel.address("add"), "pxll", (("p", 0), ("f", 1.0), ("lo",),
                                                           ("hi",)))
    with pytest.raises(ValueError, match=r"unknown argument type 'x' in signature 'pxll'"):
        G.build_graph_module([G.NativeStep((odd,), 10, 1)])
