"""`GraphExecutor`: runs a `CpuProgram` by calling its compiled functions in order.

All buffers are allocated once (inputs, outputs, the arena, the parameters) so every call's
arguments are fixed when the executor is built. `run` makes one call into a function compiled for
this executor (`compiler.backend.cpu.graphfn`) that runs every step with those arguments baked in,
on all threads at once; `profile` calls each step's kernels through ctypes, one step at a time.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from vtakit.compiler.backend.cpu import graphfn
from vtakit.compiler.backend.cpu.parallel import run_native, run_parallel, split_range
from vtakit.compiler.backend.cpu.program import CpuProgram

if TYPE_CHECKING:
    from .artifact import Artifact

_CT = {"p": ctypes.c_void_p, "l": ctypes.c_int64, "f": ctypes.c_float}
Resolver = Callable[[int, str], int]
# A split step is cut into this many parts per thread, taken by the threads as they come free,
# so that a slow or busy core does not hold the others up.
CHUNKS_PER_THREAD = 4


def _aligned(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes]


def jit_resolver(program: CpuProgram) -> Resolver:
    """Addresses from kernels compiled in this process (one cached module per kernel)."""
    from vtakit.compiler.backend.cpu.jit import CACHE

    mods = [CACHE.get(k.key, k.build) for k in program.kernels]
    return lambda i, fname: mods[i].address(fname)


class GraphExecutor:
    """Runs a compiled graph.

    Parameters
    ----------
    artifact : Artifact or CpuProgram
        A loaded artifact (its object code is loaded with MCJIT, or its IR JIT-compiled when
        the object code does not fit this CPU), or a program lowered in this process.
    threads : int, optional
        Threads for the split steps (default: the thread count the program was compiled for).

    Attributes
    ----------
    program : CpuProgram
    threads : int
    input_names, output_names : list of str
    """

    def __init__(self, artifact: Artifact | CpuProgram, threads: int | None = None) -> None:
        from .artifact import Artifact

        if isinstance(artifact, Artifact):
            self.program = artifact.program
            self._code = artifact.load_code()
            resolve: Resolver = self._code.address
        elif isinstance(artifact, CpuProgram):
            self.program = artifact
            resolve = jit_resolver(artifact)
        else:
            raise TypeError(f"GraphExecutor: expected an Artifact or a CpuProgram, got "
                            f"{type(artifact).__name__}")
        p = self.program
        self.threads = p.threads if threads is None else threads
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"GraphExecutor: threads={threads!r}, expected an int >= 1")
        self.input_names = [n for n, _, _ in p.inputs]
        self.output_names = [n for n, _, _ in p.outputs]
        self._arena = _aligned(max(p.arena_bytes, 1))
        self._inputs = [np.empty(shape, np.dtype(dt)) for _, dt, shape in p.inputs]
        self._outputs = [np.empty(shape, np.dtype(dt)) for _, dt, shape in p.outputs]
        self._params = {k: np.ascontiguousarray(v) for k, v in p.params.items()}
        base = []
        for b in p.buffers:
            if b.kind == "arena":
                base.append(self._arena.ctypes.data + b.offset)
            elif b.kind == "input":
                base.append(self._inputs[b.index].ctypes.data)
            elif b.kind == "output":
                base.append(self._outputs[b.index].ctypes.data)
            else:
                base.append(self._params[b.name].ctypes.data)
        fns: dict[tuple[int, str, str], Any] = {}
        addrs: dict[tuple[int, str], int] = {}
        self._steps: list[tuple[str, str, list[Callable[[], None]]]] = []
        native: list[graphfn.NativeStep] = []
        for s in p.steps:
            parts = split_range(s.extent, _parts(s.extent, self.threads) if s.parallel
                                else 1) if s.extent else [(0, 0)]
            ncalls = []
            for c in s.calls:
                addr = addrs.get((c.kernel, c.fname))
                if addr is None:
                    addr = addrs[c.kernel, c.fname] = resolve(c.kernel, c.fname)
                nargs: list[graphfn.NativeArg] = []
                for a in c.args:
                    if a[0] == "b":
                        nargs.append(("p", base[a[1]] + a[2]))
                    elif a[0] in ("i", "f", "lo", "hi"):
                        nargs.append(tuple(a))
                    else:
                        raise ValueError(f"step {s.name!r}: unknown argument kind {a!r}")
                ncalls.append(graphfn.NativeCall(addr, c.sig, tuple(nargs)))
            native.append(graphfn.NativeStep(tuple(ncalls), s.extent, len(parts)))
            tasks = []
            for lo, hi in parts:
                calls = []
                for c, nc in zip(s.calls, ncalls):
                    key = (c.kernel, c.fname, c.sig)
                    fn = fns.get(key)
                    if fn is None:
                        fn = fns[key] = ctypes.CFUNCTYPE(None, *[_CT[ch] for ch in c.sig])(
                            nc.address)
                    args = [lo if a[0] == "lo" else hi if a[0] == "hi" else a[1]
                            for a in nc.args]
                    calls.append((fn, tuple(args)))
                tasks.append(_bind(calls))
            self._steps.append((s.name, s.op, tasks))
        from vtakit.compiler.backend.cpu.jit import JitModule

        self._graph = JitModule(graphfn.build_graph_module(native)).compile()
        self._graph_addr = self._graph.address("graph")
        self._graph_call = self._graph.cfunc("graph", None, ctypes.c_int64)
        self._state = _aligned(8 * graphfn.state_words(native)).view(np.int64)
        self._state_addr = self._state.ctypes.data

    def _index(self, names: list[str], key: int | str, what: str) -> int:
        if isinstance(key, str):
            if key not in names:
                raise ValueError(f"unknown {what} name {key!r}; expected one of {names}")
            return names.index(key)
        if isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key < len(names):
                raise ValueError(f"{what} index {key} out of range; the graph has "
                                 f"{len(names)} {what}s {names}")
            return key
        raise TypeError(f"{what} must be named by a str or an int index, got "
                        f"{type(key).__name__}")

    def set_input(self, name: int | str, array: object) -> None:
        """Copy `array` into input `name` (a name or an index); its dtype and shape must be the
        compiled ones."""
        i = self._index(self.input_names, name, "input")
        if not isinstance(array, np.ndarray):
            if isinstance(array, (list, tuple, int, float, np.generic)):
                array = np.asarray(array)
            else:
                raise TypeError(f"input {self.input_names[i]!r}: expected a numpy.ndarray, got "
                                f"{type(array).__name__}")
        dst = self._inputs[i]
        if array.dtype != dst.dtype:
            raise TypeError(f"input {self.input_names[i]!r}: got dtype {array.dtype}, expected "
                            f"{dst.dtype}")
        if array.shape != dst.shape:
            raise ValueError(f"input {self.input_names[i]!r}: got shape {array.shape}, "
                             f"expected {dst.shape}")
        np.copyto(dst, array)

    def run(self) -> None:
        """Run every step once, in order, on `threads` threads."""
        self._state.fill(0)
        run_native(self._graph_addr, self._state_addr, self.threads, self._graph_call)

    def get_output(self, index_or_name: int | str) -> np.ndarray:
        """A copy of an output of the last `run`."""
        return self._outputs[self._index(self.output_names, index_or_name, "output")].copy()

    def profile(self, repeat: int = 1) -> list[tuple[str, str, float]]:
        """Run once per repeat, timing every step: (node name, op, milliseconds), averaged."""
        totals = [0.0] * len(self._steps)
        for _ in range(repeat):
            for k, (_, _, tasks) in enumerate(self._steps):
                t0 = time.perf_counter()
                if len(tasks) == 1:
                    tasks[0]()
                else:
                    run_parallel(tasks, self.threads)
                totals[k] += time.perf_counter() - t0
        return [(name, op, 1e3 * t / repeat) for (name, op, _), t in zip(self._steps, totals)]


def _parts(extent: int, threads: int) -> int:
    """How many parts a split step of `extent` is cut into: `CHUNKS_PER_THREAD` per thread, or
    one per unit of a smaller extent (more parts than threads let the others take over the work
    of a thread that is slow or descheduled)."""
    if threads <= 1:
        return 1
    return min(extent, threads * CHUNKS_PER_THREAD)


def _bind(calls: list[tuple[Any, tuple]]) -> Callable[[], None]:
    if len(calls) == 1:
        fn, args = calls[0]
        return lambda: fn(*args)

    def run() -> None:
        for fn, args in calls:
            fn(*args)
    return run
