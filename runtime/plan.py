"""The executable plan: what every backend's lowering produces and the executor runs.

A `Plan` is backend-neutral data: host buffers (graph inputs and outputs, constants, one arena
for intermediates), and an ordered list of steps, each naming the backend that runs it. A step is
a list of calls of that backend's kernels (a kernel index into the backend's section, a function
name, an argument signature and arguments), run once, or for each ``[lo, hi)`` part of
``range(extent)`` when the step may be split across threads. Each backend used has a `Section`:
its JSON metadata (kept in ``plan.json``) and its artifact members (files under ``<backend>/``
in the artifact: object code, IR, instruction streams...).

The plan is JSON (``Plan.to_json`` / ``Plan.from_json``), versioned and validated on load, so a
corrupt or foreign plan is refused with a message that says what is wrong.

Argument kinds of a call: ``("b", buffer, byte offset)`` a pointer into a plan buffer,
``("i", int)``, ``("f", float)``, and ``("lo",)`` / ``("hi",)`` the part's range.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PLAN_VERSION = 2
BUFFER_KINDS = ("input", "output", "const", "arena")
ARG_KINDS = {"b": 3, "i": 2, "f": 2, "lo": 1, "hi": 1}
SIG_LETTERS = "plf"  # pointer, int64, float32

Arg = tuple


class PlanError(ValueError):
    """A plan that is malformed or inconsistent (names what and where)."""


@dataclass
class Buffer:
    """A host buffer. kind: "input" / "output" (`index` into the graph's), "const" (`name` in
    the parameters) or "arena" (`offset` bytes into the arena)."""

    kind: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    index: int = 0
    name: str = ""
    offset: int = 0


@dataclass
class Call:
    """Call function `fname` of the backend's kernel `kernel` with `args` (one letter of `sig`
    per argument: p pointer, l int64, f float32)."""

    kernel: int
    fname: str
    sig: str
    args: tuple[Arg, ...]


@dataclass
class Step:
    """One node's work on `backend`: `calls` run in order for each [lo, hi) part of
    range(extent) (extent 0: the calls take no range and run once); `parallel` says whether
    threads may split it."""

    name: str
    op: str
    calls: list[Call]
    extent: int = 0
    parallel: bool = False
    backend: str = "cpu"


@dataclass
class Section:
    """A backend's part of a plan.

    Parameters
    ----------
    meta : dict
        JSON data the backend's runner reads (stored in ``plan.json``).
    members : dict of str to bytes
        The backend's artifact files (stored as ``<backend>/<name>``); empty for a plan that
        only runs in the process that lowered it.
    live : object, optional
        What a runner in the lowering process may use instead of `members` (the CPU backend:
        its kernels' IR builders); never stored.
    """

    meta: dict[str, Any] = field(default_factory=dict)
    members: dict[str, bytes] = field(default_factory=dict)
    live: Any = None


@dataclass
class Plan:
    """Buffers, steps, constants, the graph's signature, and one `Section` per backend used."""

    buffers: list[Buffer]
    steps: list[Step]
    params: dict[str, np.ndarray]
    inputs: list[tuple[str, str, tuple[int, ...]]]  # name, numpy dtype, shape
    outputs: list[tuple[str, str, tuple[int, ...]]]
    arena_bytes: int
    threads: int
    sections: dict[str, Section] = field(default_factory=dict)

    @property
    def backends(self) -> list[str]:
        """The backends the steps use, in order of first use."""
        return list(dict.fromkeys(s.backend for s in self.steps))

    def to_json(self) -> dict:
        """Everything but the parameter values and the sections' members, as JSON data."""
        return {
            "version": PLAN_VERSION,
            "buffers": [dataclasses.asdict(b) for b in self.buffers],
            "steps": [{"name": s.name, "op": s.op, "backend": s.backend, "extent": s.extent,
                       "parallel": s.parallel,
                       "calls": [{"kernel": c.kernel, "fname": c.fname, "sig": c.sig,
                                  "args": [list(a) for a in c.args]} for c in s.calls]}
                      for s in self.steps],
            "inputs": [list(i) for i in self.inputs],
            "outputs": [list(i) for i in self.outputs],
            "arena_bytes": self.arena_bytes,
            "threads": self.threads,
            "sections": {k: v.meta for k, v in self.sections.items()},
        }

    @classmethod
    def from_json(cls, plan: Any, params: Mapping[str, np.ndarray],
                  members: Mapping[str, dict[str, bytes]] | None = None) -> Plan:
        """The plan of `to_json`, checked (`PlanError` names what is wrong)."""
        _expect(isinstance(plan, dict), "plan", "a JSON object", type(plan).__name__)
        version = plan.get("version")
        if version != PLAN_VERSION:
            raise PlanError(f"plan version {version!r} is not supported (expected "
                            f"{PLAN_VERSION}); recompile the model with this vtakit")
        try:
            bufs = [Buffer(**{**b, "shape": tuple(b["shape"])}) for b in plan["buffers"]]
            steps = [Step(s["name"], s["op"],
                          [Call(c["kernel"], c["fname"], c["sig"],
                                tuple(tuple(a) for a in c["args"])) for c in s["calls"]],
                          s["extent"], s["parallel"], s["backend"])
                     for s in plan["steps"]]
            io = [[(n, d, tuple(sh)) for n, d, sh in plan[k]] for k in ("inputs", "outputs")]
            sections = {k: Section(dict(v), dict((members or {}).get(k, {})))
                        for k, v in plan["sections"].items()}
            p = cls(bufs, steps, dict(params), io[0], io[1], plan["arena_bytes"],
                    plan["threads"], sections)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanError(f"malformed plan ({type(e).__name__}: {e})") from None
        p.validate()
        return p

    def validate(self) -> None:
        """Check that every reference in the plan is in range (`PlanError` otherwise)."""
        _expect(isinstance(self.threads, int) and self.threads >= 1, "plan threads",
                "an int >= 1", repr(self.threads))
        _expect(isinstance(self.arena_bytes, int) and self.arena_bytes >= 0, "arena_bytes",
                "an int >= 0", repr(self.arena_bytes))
        for i, b in enumerate(self.buffers):
            where = f"buffer {i}"
            _expect(b.kind in BUFFER_KINDS, f"{where} kind", f"one of {BUFFER_KINDS}",
                    repr(b.kind))
            _expect(isinstance(b.nbytes, int) and b.nbytes >= 0, f"{where} nbytes",
                    "an int >= 0", repr(b.nbytes))
            if b.kind == "const":
                _expect(b.name in self.params, f"{where} (const)", "a name in the parameters",
                        repr(b.name))
            elif b.kind == "arena":
                _expect(0 <= b.offset and b.offset + b.nbytes <= max(self.arena_bytes, 0),
                        f"{where} (arena)", f"bytes within the arena of {self.arena_bytes}",
                        f"[{b.offset}, {b.offset + b.nbytes})")
            else:
                sig = self.inputs if b.kind == "input" else self.outputs
                _expect(0 <= b.index < len(sig), f"{where} ({b.kind})",
                        f"an index < {len(sig)}", repr(b.index))
        for s in self.steps:
            where = f"step {s.name!r}"
            _expect(s.backend in self.sections, f"{where} backend",
                    f"one of the plan's sections {sorted(self.sections)}", repr(s.backend))
            _expect(isinstance(s.extent, int) and s.extent >= 0, f"{where} extent",
                    "an int >= 0", repr(s.extent))
            for c in s.calls:
                _expect(isinstance(c.sig, str) and set(c.sig) <= set(SIG_LETTERS)
                        and len(c.sig) == len(c.args), f"{where} call {c.fname!r}",
                        f"one of {SIG_LETTERS!r} per argument ({len(c.args)} arguments)",
                        repr(c.sig))
                for a in c.args:
                    ok = (isinstance(a, tuple) and len(a) >= 1 and a[0] in ARG_KINDS
                          and len(a) == ARG_KINDS[a[0]])
                    _expect(ok, f"{where} call {c.fname!r} argument", "one of "
                            "('b', buffer, offset), ('i', int), ('f', float), ('lo',), "
                            "('hi',)", repr(a))
                    if a[0] == "b":
                        _expect(isinstance(a[1], int) and 0 <= a[1] < len(self.buffers)
                                and isinstance(a[2], int)
                                and 0 <= a[2] <= self.buffers[a[1]].nbytes,
                                f"{where} call {c.fname!r} buffer argument",
                                f"a buffer < {len(self.buffers)} and an offset within it",
                                repr(a))


def _expect(ok: bool, what: str, expected: str, got: str) -> None:
    if not ok:
        raise PlanError(f"{what}: expected {expected}, got {got}")

