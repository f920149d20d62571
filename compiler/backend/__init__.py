"""The backend socket: code generators found by name, one folder per backend.

A backend is the package ``compiler/backend/<name>/``. Its ``__init__.py`` registers one
lowering entry with `register_backend`: given the graph, its options and the shared
`PlanBuilder`, it lowers the nodes it takes (steps and buffers in the builder) and returns a
`PlanSection`: those nodes, and its part of the plan (metadata, artifact files). The runtime has
a runner of the same name (``vtakit.runtime.<name>``). Nodes a backend does not take are lowered
by the ``cpu`` backend, which takes every node::

    @register_backend("vta", options=VtaOptions)
    def lower(g: Graph, opts: VtaOptions, plan: PlanBuilder) -> PlanSection: ...

`get_backend` imports ``vtakit.compiler.backend.<name>`` the first time a name is asked for, so
adding a backend touches no other backend's files and nothing dispatches on the target's name.
See docs/backends.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from vtakit.runtime.plan import Section
from vtakit.runtime.runners import import_by_name

from ..ir.graph import Graph


@dataclass
class PlanSection:
    """What a backend's lowering returns.

    Parameters
    ----------
    backend : str
        The backend's name.
    taken : frozenset of int
        The nodes it lowered, as positions in ``g.nodes``.
    section : Section
        Its part of the plan: metadata, and (for the process that lowered it) live objects.
    emit : callable, optional
        ``emit(section) -> dict of member name to bytes``: the backend's artifact files (object
        code, instruction streams), built only when an artifact is written.
    hw_config : dict, optional
        The accelerator configuration the section was built for (`HwConfig.to_json`), which the
        artifact's manifest records with its hash.
    """

    backend: str
    taken: frozenset[int]
    section: Section = field(default_factory=Section)
    emit: Callable[[Section], dict[str, bytes]] | None = None
    hw_config: dict[str, Any] | None = None
    hw_config_hash: str | None = None


class Lowering(Protocol):
    def __call__(self, g: Graph, opts: Any, plan: Any) -> PlanSection: ...


@dataclass(frozen=True)
class BackendSpec:
    """A registered backend: its name, lowering entry and options class (a dataclass whose
    fields are the backend's options, all with defaults)."""

    name: str
    lower: Lowering
    options: type
    doc: str

    def make_options(self, options: Any = None) -> Any:
        """`options` as this backend's options: None (the defaults), an instance, or a mapping
        of field names to values (`TypeError` names an unknown field)."""
        if options is None:
            return self.options()
        if isinstance(options, self.options):
            return options
        if isinstance(options, Mapping):
            known = {f.name for f in dataclasses.fields(self.options)}
            unknown = sorted(set(options) - known)
            if unknown:
                raise TypeError(f"backend {self.name!r}: unknown option(s) {unknown}; its "
                                f"options are {sorted(known)}")
            return self.options(**options)
        raise TypeError(f"backend {self.name!r}: options must be a {self.options.__name__}, a "
                        f"dict or None, got {type(options).__name__}")


_BACKENDS: dict[str, BackendSpec] = {}


@dataclass(frozen=True)
class NoOptions:
    """A backend without options."""


def register_backend(name: str, *, options: type = NoOptions
                     ) -> Callable[[Lowering], Lowering]:
    """Decorator: register `fn` as the lowering entry of backend `name`."""

    def deco(fn: Lowering) -> Lowering:
        if not name.isidentifier():
            raise ValueError(f"backend name {name!r} must be a Python identifier")
        old = _BACKENDS.get(name)
        if old is not None and old.lower is not fn:
            raise ValueError(f"backend {name!r} is already registered ({old.lower!r})")
        if not dataclasses.is_dataclass(options):
            raise TypeError(f"backend {name!r}: options must be a dataclass, got {options!r}")
        doc = (fn.__doc__ or "").strip().splitlines()
        _BACKENDS[name] = BackendSpec(name, fn, options, doc[0] if doc else "")
        return fn

    return deco


def get_backend(name: str) -> BackendSpec:
    """The backend registered as `name`, importing its package on first use; `ValueError` lists
    the registry."""
    if not isinstance(name, str):
        raise TypeError(f"target must be a backend name (str), got {type(name).__name__}")
    import_by_name(_BACKENDS, __name__, name)
    if name not in _BACKENDS:
        raise ValueError(f"unknown target {name!r}; the registered backends are "
                         f"{available_backends()}")
    return _BACKENDS[name]


def available_backends() -> list[str]:
    """Every registered backend, including this package's own (imported to register)."""
    for m in pkgutil.iter_modules(__path__):
        if m.ispkg and m.name not in _BACKENDS:
            importlib.import_module(f"{__name__}.{m.name}")
    return sorted(_BACKENDS)
