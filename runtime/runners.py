"""The runtime side of the backend socket: one runner per backend, found by name.

A runner runs the steps of one backend of a `Plan`. The executor hands it each maximal run of
consecutive steps of its backend (a *segment*) once, when it is built, and later calls the
segment's `run` for every inference; the host buffers (inputs, outputs, constants, the arena)
belong to the executor, and every runner sees them at fixed addresses (`HostBuffers`).

A backend named ``<name>`` registers its runner in ``vtakit.runtime.<name>`` (a module or a
package) with ``@register_runner("<name>")``; `runner_class` imports that module the first time
the name is asked for, so adding a backend touches no other backend's files::

    @register_runner("vta")
    class VtaRunner(Runner):
        def segment(self, steps): ...
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .plan import Plan, Section, Step

_RUNNERS: dict[str, type[Runner]] = {}


@dataclass(frozen=True)
class HostBuffers:
    """The executor's host memory: the numpy array behind every plan buffer (constants, graph
    inputs and outputs, views of the arena) and its address, by buffer index."""

    arrays: list[np.ndarray]
    addresses: list[int]

    def view(self, arg: tuple, dtype: str | np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The array at a call argument ``("b", buffer, byte offset)``, as `dtype` and `shape`
        (a view: writing it writes the buffer)."""
        kind, b, off = arg
        if kind != "b":
            raise ValueError(f"expected a buffer argument ('b', buffer, offset), got {arg!r}")
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        raw = self.arrays[b].reshape(-1).view(np.uint8)
        if off + n > raw.size:
            raise ValueError(f"buffer {b}: {n} bytes at offset {off} run past its "
                             f"{raw.size} bytes")
        return raw[off:off + n].view(dt).reshape(shape)


@dataclass
class Segment:
    """A run of consecutive steps of one backend, ready to run.

    Parameters
    ----------
    run : callable
        Runs every step of the segment once.
    steps : list of callables
        One callable per step, running that step alone (for `GraphExecutor.profile`).
    """

    run: Callable[[], None]
    steps: list[Callable[[], None]]


class Runner(ABC):
    """Runs one backend's steps of a plan.

    Parameters
    ----------
    plan : Plan
    section : Section
        The plan's section for this backend (its metadata, artifact members, and in the process
        that lowered the plan, its live objects).
    memory : HostBuffers
    threads : int
        Threads the executor runs with.
    manifest : dict
        The artifact's manifest (empty for a plan that was never saved); a runner checks what it
        needs there (for an accelerator: the configuration hash).
    options : mapping, optional
        The runner's own options, given to `GraphExecutor(..., runner_options={name: {...}})`
        (for an accelerator: the device); a runner rejects the ones it does not know.
    """

    name: str = ""

    def __init__(self, plan: Plan, section: Section, memory: HostBuffers, threads: int,
                 manifest: dict | None = None, options: Mapping[str, Any] | None = None
                 ) -> None:
        self.plan, self.section, self.memory, self.threads = plan, section, memory, threads
        self.manifest = manifest or {}
        self.options = dict(options or {})

    @classmethod
    def check_section(cls, section: Section) -> None:
        """Raise `ValueError` saying what is missing if `section` (as loaded from an artifact)
        cannot be run; called when the artifact is loaded. The default accepts any section."""
        return None

    @classmethod
    def check_plan(cls, section: Section, plan: Plan, manifest: Mapping[str, Any]) -> None:
        """Raise `ValueError` if what `section` says about the rest of the artifact (the plan's
        buffers and this backend's steps, the manifest) does not hold; called when the artifact
        is loaded, after `check_section` and `Plan.validate`. The default accepts any."""
        return None

    @abstractmethod
    def segment(self, steps: Sequence[Step]) -> Segment:
        """Prepare `steps` (consecutive, all of this backend) to be run many times."""

    def close(self) -> None:
        """Release what the runner holds (device memory, threads); the default holds nothing."""
        return None


def register_runner(name: str) -> Callable[[type[Runner]], type[Runner]]:
    """Class decorator: register `cls` as the runner of backend `name`."""

    def deco(cls: type[Runner]) -> type[Runner]:
        if not name.isidentifier():
            raise ValueError(f"runner name {name!r} must be a Python identifier")
        if name in _RUNNERS and _RUNNERS[name] is not cls:
            raise ValueError(f"a runner for backend {name!r} is already registered "
                             f"({_RUNNERS[name].__qualname__})")
        cls.name = name
        _RUNNERS[name] = cls
        return cls

    return deco


def import_by_name(registry: Mapping[str, object], package: str, name: str) -> None:
    """Import ``<package>.<name>`` (which registers `name` in `registry` when imported) unless
    `name` is registered already; a module that does not exist is not an error (the caller
    reports the name as unknown), an import error inside one is raised. The socket's way of
    finding a backend by name, on the compiler's side and on the runtime's."""
    if name in registry or not name.isidentifier():
        return
    try:
        importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{package}.{name}":
            raise


def runner_class(name: str) -> type[Runner]:
    """The runner registered for backend `name`, importing ``vtakit.runtime.<name>`` on first
    use; `ValueError` lists the runners there are."""
    import_by_name(_RUNNERS, __package__ or "vtakit.runtime", name)
    if name not in _RUNNERS:
        raise ValueError(f"no runtime runner for backend {name!r}; this vtakit has runners for "
                         f"{available_runners()}")
    return _RUNNERS[name]


def available_runners() -> list[str]:
    """Every backend with a runner: registered ones and the runtime's own backend modules."""
    import vtakit.runtime as pkg

    names = set(_RUNNERS)
    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name in _NOT_RUNNERS:
            continue
        try:
            runner_class(m.name)
        except ValueError:
            continue
        names.add(m.name)
    return sorted(names)


# Modules of the runtime package that are not backends.
_NOT_RUNNERS = frozenset({"plan", "artifact", "executor", "session", "runners"})

