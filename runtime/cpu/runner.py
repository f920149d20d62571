"""`CpuRunner`: the runner of the ``cpu`` backend.

The CPU section of a plan holds ``module.ll`` (every kernel, linked; see `llvm.link`) and object
code for one target (``<name>.o``, described in the section's metadata ``objects``: triple, CPU
and features it was built for). In the process that lowered the plan, the section's live objects
are the kernels' builders instead, compiled through `llvm.CACHE`. Before any code of an
artifact is loaded, the section is checked (`check`): each object's ELF header against its
triple and this host, every CPU call of the plan against the signature ``module.ll`` gives its
function; what fails is a `PlanError` naming the member or the call.

A segment (consecutive CPU steps) runs as one call of a function compiled for it
(`graphfn.build_graph_module`) with every kernel address, buffer address and constant baked in,
entered by all threads at once (`parallel.run_native`); `Segment.steps` call each step's kernels
through ctypes, for profiling.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import llvmlite.binding as llvm_binding

from ..plan import PlanError, Section, Step
from ..runners import Runner, Segment, register_runner
from . import check, graphfn, llvm
from .parallel import run_native, run_parallel, split_range

_CT = {"p": ctypes.c_void_p, "l": ctypes.c_int64, "f": ctypes.c_float}
Resolver = Callable[[int, str], int]
# A split step is cut into this many parts per thread, taken by the threads as they come free,
# so that a slow or busy core does not hold the others up.
CHUNKS_PER_THREAD = 4


OBJECT_META = ("triple", "cpu", "features")


def host_object_meta() -> dict[str, str]:
    """The metadata of an object file built for this machine (what `CpuRunner` compares)."""
    cpu, features = llvm.host_cpu()
    return {"triple": llvm_binding.get_process_triple(), "cpu": cpu, "features": features}


@register_runner("cpu")
class CpuRunner(Runner):
    """Runs the ``cpu`` steps of a plan (see the module docstring).

    Attributes
    ----------
    code_source : str
        Where the machine code came from: ``"object"`` (the artifact's object code), ``"ir"``
        (its IR, compiled in this process) or ``"live"`` (kernels lowered in this process).
    """

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._resolve, self.code_source = self._loader()
        self._addrs: dict[tuple[int, str], int] = {}
        self._fns: dict[tuple[int, str, str], Any] = {}
        self._keep: list[Any] = []

    @classmethod
    def check_section(cls, section: Section) -> None:
        """The section of a loaded artifact: ``module.ll`` (UTF-8 text), a kernel count, and
        ``objects``: each a member whose ELF header matches the triple its metadata names."""
        if section.live is None:
            ir = section.members.get("module.ll")
            if ir is None:
                raise ValueError(f"the cpu section has no module.ll (members: "
                                 f"{sorted(section.members)})")
            try:
                ir.decode()
            except UnicodeDecodeError as e:
                raise ValueError(f"cpu/module.ll is not UTF-8 text ({e})") from None
        kernels = section.meta.get("kernels")
        if isinstance(kernels, bool) or not isinstance(kernels, int) or kernels < 0:
            raise ValueError(f"the cpu section's 'kernels' must be an int >= 0, got {kernels!r}")
        objects = section.meta.get("objects", {})
        if not isinstance(objects, dict):
            raise ValueError(f"the cpu section's 'objects' must be an object (member name -> "
                             f"triple, cpu, features), got {type(objects).__name__}")
        for name, built in objects.items():
            ok = isinstance(built, dict) and set(built) == set(OBJECT_META) and all(
                isinstance(v, str) for v in built.values())
            if not ok:
                raise ValueError(f"the cpu section's objects[{name!r}] must hold the strings "
                                 f"{list(OBJECT_META)}, got {built!r:.120}")
            if section.live is None:
                if name not in section.members:
                    raise ValueError(f"the cpu section's objects name {name!r}, which is not a "
                                     f"member (members: {sorted(section.members)})")
                check.check_object(name, section.members[name], built["triple"])

    def _loader(self) -> tuple[Resolver, str]:
        """Check the code against the plan (`check`: `PlanError`), then load it: the object
        built for this host, else the IR compiled here."""
        live = self.section.live
        if live is not None:
            mods = [llvm.CACHE.get(k.key, k.build) for k in live]
            return (lambda i, fname: mods[i].address(fname)), "live"
        try:
            type(self).check_section(self.section)
        except ValueError as e:
            raise PlanError(str(e)) from None
        members, here = self.section.members, host_object_meta()
        ir_text = members["module.ll"].decode()
        check.check_calls([s for s in self.plan.steps if s.backend == self.name],
                          self.section.meta["kernels"], check.ir_signatures(ir_text))
        code = None
        for name, built in self.section.meta.get("objects", {}).items():
            if built == here and name in members:
                if not check.check_host_object(name, members[name], here["triple"]):
                    continue  # a host this runtime cannot check objects for: use the IR
                try:
                    code = llvm.LoadedCode(obj=members[name])
                    break
                except RuntimeError:
                    continue  # fall back to the IR below; the object may not link here
        if code is None:
            try:
                code = llvm.LoadedCode(ir_text=ir_text)
            except RuntimeError as e:
                raise PlanError(f"cpu/module.ll is not valid LLVM IR: {str(e).strip()[:300]}") \
                    from None
        self._code = code
        return code.address, code.source

    def _address(self, kernel: int, fname: str) -> int:
        addr = self._addrs.get((kernel, fname))
        if addr is None:
            addr = self._addrs[kernel, fname] = self._resolve(kernel, fname)
        return addr

    def segment(self, steps: Sequence[Step]) -> Segment:
        base = self.memory.addresses
        native: list[graphfn.NativeStep] = []
        tasks_by_step: list[Callable[[], None]] = []
        for s in steps:
            parts = split_range(s.extent, _parts(s.extent, self.threads) if s.parallel
                                else 1) if s.extent else [(0, 0)]
            ncalls = []
            for c in s.calls:
                nargs: list[graphfn.NativeArg] = []
                for a in c.args:
                    nargs.append(("p", base[a[1]] + a[2]) if a[0] == "b" else tuple(a))
                ncalls.append(graphfn.NativeCall(self._address(c.kernel, c.fname), c.sig,
                                                 tuple(nargs)))
            native.append(graphfn.NativeStep(tuple(ncalls), s.extent, len(parts)))
            tasks = []
            for lo, hi in parts:
                calls = []
                for c, nc in zip(s.calls, ncalls):
                    key = (c.kernel, c.fname, c.sig)
                    fn = self._fns.get(key)
                    if fn is None:
                        fn = self._fns[key] = ctypes.CFUNCTYPE(None, *[_CT[ch] for ch in c.sig])(
                            nc.address)
                    args = [lo if a[0] == "lo" else hi if a[0] == "hi" else a[1]
                            for a in nc.args]
                    calls.append((fn, tuple(args)))
                tasks.append(_bind(calls))
            tasks_by_step.append(_step_runner(tasks, self.threads))
        graph = llvm.JitModule(graphfn.build_graph_module(native)).compile()
        addr = graph.address("graph")
        call = graph.cfunc("graph", None, ctypes.c_int64)
        state = _aligned_words(graphfn.state_words(native))
        state_addr = state.ctypes.data
        threads = self.threads
        self._keep.append((graph, state))

        def run() -> None:
            state.fill(0)
            run_native(addr, state_addr, threads, call)

        return Segment(run, tasks_by_step)


def _aligned_words(n: int, align: int = 64) -> Any:
    import numpy as np

    raw = np.empty(8 * n + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + 8 * n].view(np.int64)


def _parts(extent: int, threads: int) -> int:
    """How many parts a split step of `extent` is cut into: `CHUNKS_PER_THREAD` per thread, or
    one per unit of a smaller extent (more parts than threads let the others take over the work
    of a thread that is slow or descheduled)."""
    if threads <= 1:
        return 1
    return min(extent, threads * CHUNKS_PER_THREAD)


def _step_runner(tasks: list[Callable[[], None]], threads: int) -> Callable[[], None]:
    if len(tasks) == 1:
        return tasks[0]
    return lambda: run_parallel(tasks, threads)


def _bind(calls: list[tuple[Any, tuple]]) -> Callable[[], None]:
    if len(calls) == 1:
        fn, args = calls[0]
        return lambda: fn(*args)

    def run() -> None:
        for fn, args in calls:
            fn(*args)
    return run
