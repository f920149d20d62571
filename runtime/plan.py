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
``("i", int)``, ``("f", float)``, and ``("lo",)`` / ``("hi",)`` the part's range; the signature
letter of each (``p`` pointer, ``l`` int64, ``f`` float32) is ``p`` for a buffer (or ``("i", 0)``,
a null pointer), ``l`` for an int or a bound of the range, ``f`` for a float.
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
DTYPE_KINDS = "biuf"  # the dtypes a buffer may hold: bool, signed, unsigned, float
MAX_THREADS = 1024
MAX_RANK = 32
ARENA_ALIGN = 64  # arena buffers start on this boundary (the compiler's memory planner)
ARENA_ALIGN_MAX = 4096  # the most any buffer may be padded to in the arena

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
        """Check the plan before any of it runs (`PlanError` names the field, what it holds and
        what was expected): the thread count; every buffer's kind, dtype, shape and size, inside
        the arena for an arena buffer, equal to its parameter for a constant and to the graph's
        signature for an input or output; every step's backend (one with a section), extent and
        calls: a kernel index, a function name, one signature letter per argument that fits the
        argument's kind, and buffer arguments that point into their buffer.

        What a kernel does with its integer arguments (sizes, strides) is the backend's code and
        cannot be checked here: the artifact's checksums guard those."""
        _expect(_is_int(self.threads) and 1 <= self.threads <= MAX_THREADS, "plan threads",
                f"an int in [1, {MAX_THREADS}]", repr(self.threads))
        _expect(_is_int(self.arena_bytes) and self.arena_bytes >= 0, "plan arena_bytes",
                "an int >= 0", repr(self.arena_bytes))
        for what, sig in (("inputs", self.inputs), ("outputs", self.outputs)):
            _expect(isinstance(sig, list), f"plan {what}", "a list", type(sig).__name__)
            for k, entry in enumerate(sig):
                where = f"plan {what}[{k}]"
                _expect(isinstance(entry, tuple) and len(entry) == 3, where,
                        "[name, dtype, shape]", repr(entry))
                name, dtype, shape = entry
                _expect(isinstance(name, str), f"{where} name", "a str", repr(name))
                _check_dtype(f"{where} ({name!r}) dtype", dtype)
                _check_shape(f"{where} ({name!r}) shape", shape)
            names = [e[0] for e in sig]
            _expect(len(set(names)) == len(names), f"plan {what}", "distinct names",
                    repr(names))
        _expect(isinstance(self.sections, dict), "plan sections", "an object",
                type(self.sections).__name__)
        for name in self.sections:
            _expect(isinstance(name, str) and name.isidentifier(), "plan section name",
                    "a backend name (a Python identifier)", repr(name))
        arena_limit = 0
        for i, b in enumerate(self.buffers):
            self._check_buffer(i, b)
            if b.kind == "arena":
                arena_limit += _round_up(max(b.nbytes, 1), ARENA_ALIGN_MAX)
        # The arena holds the arena buffers; it is never larger than all of them laid end to
        # end (each rounded up generously), so a corrupt size cannot ask for any memory at all.
        _expect(self.arena_bytes <= arena_limit, "plan arena_bytes",
                f"at most {arena_limit} (its {sum(b.kind == 'arena' for b in self.buffers)} "
                f"buffers laid end to end)", repr(self.arena_bytes))
        for k, s in enumerate(self.steps):
            self._check_step(k, s)

    def _check_buffer(self, i: int, b: Buffer) -> None:
        where = f"buffer {i}"
        _expect(isinstance(b, Buffer), where, "a buffer", type(b).__name__)
        _expect(b.kind in BUFFER_KINDS, f"{where} kind", f"one of {BUFFER_KINDS}",
                repr(b.kind))
        where = f"buffer {i} ({b.kind})"
        dtype = _check_dtype(f"{where} dtype", b.dtype)
        _check_shape(f"{where} shape", b.shape)
        size = int(np.prod(b.shape, dtype=np.int64)) * dtype.itemsize
        _expect(_is_int(b.nbytes) and b.nbytes == size, f"{where} nbytes",
                f"{size} (shape {b.shape} of {dtype})", repr(b.nbytes))
        for f in ("index", "offset"):
            v = getattr(b, f)
            _expect(_is_int(v) and v >= 0, f"{where} {f}", "an int >= 0", repr(v))
        _expect(isinstance(b.name, str), f"{where} name", "a str", repr(b.name))
        if b.kind == "const":
            _expect(b.name in self.params, f"{where} name", "a name in the parameters",
                    repr(b.name))
            arr = self.params[b.name]
            _expect(isinstance(arr, np.ndarray) and arr.dtype == dtype and arr.shape == b.shape,
                    f"{where}: parameter {b.name!r}", f"dtype {dtype}, shape {b.shape}",
                    f"dtype {getattr(arr, 'dtype', type(arr).__name__)}, shape "
                    f"{getattr(arr, 'shape', '?')}")
        elif b.kind == "arena":
            _expect(b.offset % ARENA_ALIGN == 0 and b.offset + b.nbytes <= self.arena_bytes,
                    f"{where} offset", f"a multiple of {ARENA_ALIGN} with its {b.nbytes} bytes "
                    f"inside the arena of {self.arena_bytes}",
                    f"{b.offset} (bytes [{b.offset}, {b.offset + b.nbytes}))")
        else:
            sig = self.inputs if b.kind == "input" else self.outputs
            _expect(b.index < len(sig), f"{where} index",
                    f"an index < {len(sig)} (the graph's {b.kind}s)", repr(b.index))
            name, sdt, shape = sig[b.index]
            _expect(np.dtype(sdt) == dtype and tuple(shape) == b.shape,
                    f"{where} dtype and shape",
                    f"those of {b.kind} {b.index} ({name!r}): {np.dtype(sdt)} {tuple(shape)}",
                    f"{dtype} {b.shape}")

    def _check_step(self, k: int, s: Step) -> None:
        _expect(isinstance(s, Step), f"step {k}", "a step", type(s).__name__)
        _expect(isinstance(s.name, str), f"step {k} name", "a str", repr(s.name))
        where = f"step {k} ({s.name!r})"
        _expect(isinstance(s.op, str), f"{where} op", "a str", repr(s.op))
        _expect(isinstance(s.backend, str) and s.backend in self.sections, f"{where} backend",
                f"one of the plan's sections {sorted(self.sections)}", repr(s.backend))
        _expect(_is_int(s.extent) and 0 <= s.extent < (1 << 62), f"{where} extent",
                "an int >= 0", repr(s.extent))
        _expect(isinstance(s.parallel, (bool, np.bool_)), f"{where} parallel", "true or false",
                repr(s.parallel))
        _expect(isinstance(s.calls, list), f"{where} calls", "a list", type(s.calls).__name__)
        for j, c in enumerate(s.calls):
            _expect(isinstance(c, Call), f"{where} call {j}", "a call", type(c).__name__)
            _expect(isinstance(c.fname, str) and c.fname.isidentifier(),
                    f"{where} call {j} fname", "a function name", repr(c.fname))
            at = f"{where} call {j} ({c.fname})"
            _expect(_is_int(c.kernel) and c.kernel >= 0, f"{at} kernel", "an int >= 0",
                    repr(c.kernel))
            _expect(isinstance(c.args, tuple), f"{at} args", "a list",
                    type(c.args).__name__)
            _expect(isinstance(c.sig, str) and set(c.sig) <= set(SIG_LETTERS)
                    and len(c.sig) == len(c.args), f"{at} sig",
                    f"one of {SIG_LETTERS!r} per argument ({len(c.args)} arguments)",
                    repr(c.sig))
            for n, (letter, a) in enumerate(zip(c.sig, c.args)):
                self._check_arg(f"{at} argument {n}", letter, a)

    def _check_arg(self, where: str, letter: str, a: Any) -> None:
        ok = (isinstance(a, tuple) and len(a) >= 1 and isinstance(a[0], str)
              and a[0] in ARG_KINDS and len(a) == ARG_KINDS[a[0]])
        _expect(ok, where, "one of ('b', buffer, offset), ('i', int), ('f', float), ('lo',), "
                "('hi',)", repr(a))
        null = a[0] == "i" and letter == "p" and a[1] == 0  # a null pointer (no bias...)
        _expect(letter in _SIG_OF_KIND[a[0]] or null, f"{where} kind",
                f"an argument for signature letter {letter!r}" + (
                    " (an int only as a null pointer, ('i', 0))" if letter == "p" else ""),
                repr(a))
        if a[0] == "i":
            _expect(_is_int(a[1]) and -(1 << 63) <= a[1] < (1 << 63), where,
                    "an int64 value", repr(a))
        elif a[0] == "f":
            _expect(isinstance(a[1], (int, float, np.integer, np.floating))
                    and not isinstance(a[1], (bool, np.bool_)), where,
                    "a float value", repr(a))
        elif a[0] == "b":
            _, b, off = a
            _expect(_is_int(b) and 0 <= b < len(self.buffers), f"{where} buffer",
                    f"an index < {len(self.buffers)}", repr(a))
            buf = self.buffers[b]
            item = np.dtype(buf.dtype).itemsize
            _expect(_is_int(off) and 0 <= off <= buf.nbytes and off % item == 0,
                    f"{where} offset", f"a multiple of {item} within buffer {b}'s "
                    f"{buf.nbytes} bytes", repr(a))


# Which argument kinds each signature letter takes: a pointer is a buffer argument, an int64 an
# int or a part's bound, a float32 a float.
_SIG_OF_KIND = {"b": "p", "i": "l", "lo": "l", "hi": "l", "f": "f"}


def _is_int(v: Any) -> bool:
    # numpy integers only come from plans lowered in this process (JSON has none)
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def _check_dtype(what: str, dtype: Any) -> np.dtype:
    """The numpy dtype a plan names, if it is one of plain numbers or booleans."""
    try:
        dt = np.dtype(dtype) if isinstance(dtype, str) else None
    except (TypeError, ValueError, SyntaxError):  # numpy's parser raises all three
        dt = None
    _expect(dt is not None and dt.kind in DTYPE_KINDS and dt.names is None
            and dt.subdtype is None and dt.isnative, what, "a numpy dtype of numbers or "
            "booleans in this machine's byte order ('<f4', '|i1', ...)", repr(dtype))
    assert dt is not None
    return dt


def _check_shape(what: str, shape: Any) -> None:
    _expect(isinstance(shape, tuple) and len(shape) <= MAX_RANK
            and all(_is_int(d) and 0 <= d < (1 << 40) for d in shape), what,
            f"a list of at most {MAX_RANK} dimensions, ints >= 0", repr(shape))
    size = 1
    for d in shape:
        size *= d
    _expect(size < (1 << 40), what, "fewer than 2**40 elements", repr(shape))


def _expect(ok: bool, what: str, expected: str, got: str) -> None:
    if not ok:
        raise PlanError(f"{what}: expected {expected}, got {got}")

