"""`GraphExecutor`: runs a `Plan`, handing each backend's steps to that backend's runner.

All host buffers are allocated once (inputs, outputs, the arena, the parameters), so every
call's arguments are fixed when the executor is built. The steps are cut into segments (maximal
runs of consecutive steps of one backend); each runner prepares its segments once, and `run`
runs the segments in order. A plan that is all CPU is one segment: one call into a function
compiled for this executor that runs every step on all threads at once (`runtime.cpu`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .plan import Plan, PlanError
from .runners import HostBuffers, Runner, Segment, runner_class

if TYPE_CHECKING:
    from .artifact import Artifact


class StepProfile(NamedTuple):
    """One step's time in `GraphExecutor.profile`."""

    name: str
    op: str
    backend: str
    ms: float


def _aligned(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes]


class GraphExecutor:
    """Runs a compiled graph.

    Parameters
    ----------
    artifact : Artifact or Plan
        A loaded artifact, or a plan lowered in this process (`vtakit.compiler.lower_model`).
    threads : int, optional
        Threads for the split steps (default: the thread count the plan was compiled for).
    runner_options : mapping, optional
        Backend name -> that runner's options, e.g. ``{"vta": {"device": "rtl"}}``.

    Attributes
    ----------
    plan : Plan
    threads : int
    input_names, output_names : list of str
    runners : dict of str to Runner
        The runner of each backend the plan uses.
    """

    def __init__(self, artifact: Artifact | Plan, threads: int | None = None, *,
                 runner_options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        from .artifact import Artifact, ArtifactError

        if isinstance(artifact, Artifact):
            self.plan, manifest = artifact.plan, artifact.manifest
        elif isinstance(artifact, Plan):
            self.plan, manifest = artifact, {}
        else:
            raise TypeError(f"GraphExecutor: expected an Artifact or a Plan, got "
                            f"{type(artifact).__name__}")
        p = self.plan
        from_artifact = isinstance(artifact, Artifact)
        # Checked again here: a loaded artifact's plan can have been changed since, and a plan
        # lowered in this process was never checked. Nothing native runs before this.
        try:
            p.validate()
        except PlanError as e:
            if from_artifact:
                raise ArtifactError(f"the artifact's plan: {e}") from None
            raise
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise ValueError(f"GraphExecutor: threads={threads!r}, expected an int >= 1 (or "
                             f"None: the plan's {p.threads})")
        self.threads = p.threads if threads is None else threads
        self.input_names = [n for n, _, _ in p.inputs]
        self.output_names = [n for n, _, _ in p.outputs]
        self._arena = _aligned(max(p.arena_bytes, 1))
        self._inputs = [np.empty(shape, np.dtype(dt)) for _, dt, shape in p.inputs]
        self._outputs = [np.empty(shape, np.dtype(dt)) for _, dt, shape in p.outputs]
        self._params = {k: np.ascontiguousarray(v) for k, v in p.params.items()}
        arrays: list[np.ndarray] = []
        for b in p.buffers:
            if b.kind == "arena":
                arrays.append(self._arena[b.offset:b.offset + b.nbytes])
            elif b.kind == "input":
                arrays.append(self._inputs[b.index])
            elif b.kind == "output":
                arrays.append(self._outputs[b.index])
            else:
                arrays.append(self._params[b.name])
        memory = HostBuffers(arrays, [a.ctypes.data for a in arrays])
        self.runners: dict[str, Runner] = {}
        ropts = dict(runner_options or {})
        stray = sorted(set(ropts) - set(p.backends))
        if stray:
            raise ValueError(f"GraphExecutor: runner_options for {stray}, which the plan does "
                             f"not use (its backends: {p.backends})")
        try:
            for name in p.backends:
                self.runners[name] = runner_class(name)(p, p.sections[name], memory,
                                                        self.threads, manifest, ropts.get(name))
        except (PlanError, KeyError, IndexError, AttributeError) as e:
            # A runner raises these on a section it cannot use (a PlanError names what); the
            # others are from a section's metadata, which only an artifact's can be wrong in.
            if not from_artifact:
                raise
            why = str(e) if isinstance(e, PlanError) else f"{type(e).__name__}: {e}"
            raise ArtifactError(f"the artifact's {name} section cannot be run: {why}") from e
        self._segments: list[Segment] = []
        self._step_info: list[tuple[str, str, str]] = []
        i = 0
        while i < len(p.steps):
            j = i
            while j < len(p.steps) and p.steps[j].backend == p.steps[i].backend:
                j += 1
            self._segments.append(self.runners[p.steps[i].backend].segment(p.steps[i:j]))
            i = j
        self._step_info = [(s.name, s.op, s.backend) for s in p.steps]
        self._runs = [s.run for s in self._segments]

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

    def set_input(self, name: int | str, array: Any) -> None:
        """Copy `array` into input `name` (a name or an index); its dtype and shape must be the
        compiled ones. `array` is a numpy array, anything with ``__dlpack__`` on the CPU (a
        torch tensor, a JAX or CuPy-on-host array: read in place, without an intermediate copy),
        or a list/scalar."""
        i = self._index(self.input_names, name, "input")
        if not isinstance(array, np.ndarray):
            if hasattr(array, "__dlpack__"):
                array = _from_dlpack(array, self.input_names[i])
            elif isinstance(array, (list, tuple, int, float, np.generic)):
                array = np.asarray(array)
            else:
                raise TypeError(f"input {self.input_names[i]!r}: expected a numpy.ndarray or "
                                f"an object with __dlpack__, got {type(array).__name__}")
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
        for run in self._runs:
            run()

    def get_output(self, index_or_name: int | str, *, dlpack: bool = False) -> np.ndarray:
        """An output of the last `run`: a copy, or with ``dlpack=True`` the executor's own
        output array without a copy (it supports ``__dlpack__``, so ``torch.from_dlpack(x)``
        shares it); the next `run` overwrites it."""
        out = self._outputs[self._index(self.output_names, index_or_name, "output")]
        return out if dlpack else out.copy()

    def profile(self, repeat: int = 1) -> list[StepProfile]:
        """Run once per repeat, timing every step: (node name, op, backend, milliseconds),
        averaged over the repeats."""
        if isinstance(repeat, bool) or not isinstance(repeat, int):
            raise TypeError(f"profile: repeat must be an int, got {type(repeat).__name__}")
        if repeat < 1:
            raise ValueError(f"profile: repeat={repeat}, expected an int >= 1")
        fns = [f for seg in self._segments for f in seg.steps]
        totals = [0.0] * len(fns)
        for _ in range(repeat):
            for k, fn in enumerate(fns):
                t0 = time.perf_counter()
                fn()
                totals[k] += time.perf_counter() - t0
        return [StepProfile(name, op, backend, 1e3 * t / repeat)
                for (name, op, backend), t in zip(self._step_info, totals)]

    def close(self) -> None:
        """Release what the runners hold (device memory, for an accelerator)."""
        for r in self.runners.values():
            r.close()


def _from_dlpack(obj: Any, name: str) -> np.ndarray:
    """A numpy view of a DLPack-capable object on the CPU (no copy)."""
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None:
        kind, _ = dev()
        if int(kind) != 1:  # kDLCPU
            raise TypeError(f"input {name!r}: the DLPack tensor lives on device type "
                            f"{int(kind)}, expected the CPU (1); copy it to host memory first "
                            f"(e.g. tensor.cpu())")
    try:
        return np.from_dlpack(obj)
    except (TypeError, BufferError, RuntimeError) as e:
        raise TypeError(f"input {name!r}: could not read {type(obj).__name__} through DLPack "
                        f"({e})") from None
