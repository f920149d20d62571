"""One compiled function that runs a whole lowered graph, on every thread at once.

The executor calls a step's kernels through ctypes; handing each split step to the helper
threads from Python costs tens of microseconds (a GIL hand-off and a wake-up per step), which on
a network of many small steps (MobileNetV2: about a hundred of 20-200 us) eats what the second
thread gains. `build_graph_module` instead writes ``graph(state)``: a straight-line function that
calls every step's kernels itself, with the buffer addresses, sizes and kernel addresses baked in
as constants. Every thread of a run enters it (`parallel.run_native`) and walks the same steps:

* a step split into P parts is claimed part by part with an atomic counter, so whichever thread
  comes first takes the next part; a step that is not split is one part, run by one thread;
* after its parts, every thread waits until the step's done-counter reaches P (a barrier that
  needs no thread count, so a helper that starts late skips the work already claimed);
* consecutive steps that are not split form one unit: one thread runs them back to back.

``state`` holds two counters per unit, each on its own cache line; the caller zeroes it before
each run. A thread waits by polling with ``pause`` and yields the core every 64 polls
(`parallel.poll_until`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import llvmlite.ir as ir

from .parallel import poll_until

F32, I64, VOID = ir.FloatType(), ir.IntType(64), ir.VoidType()
PTR = ir.PointerType()


def i64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


# argument kinds of a resolved call: ("p", address), ("i", int), ("f", float), ("lo",), ("hi",)
NativeArg = tuple
WORDS_PER_UNIT = 16  # claim counter at +0, done counter at +8: separate 64-byte lines
_TYPES = {"p": PTR, "l": I64, "f": F32}


@dataclass(frozen=True)
class NativeCall:
    address: int  # the kernel function's address in this process
    sig: str  # one letter per argument: p pointer, l int64, f float
    args: tuple[NativeArg, ...]


@dataclass(frozen=True)
class NativeStep:
    """A step's calls for each of `parts` near-equal parts of ``range(extent)``."""

    calls: tuple[NativeCall, ...]
    extent: int
    parts: int


def units(steps: list[NativeStep]) -> list[list[NativeStep]]:
    """Split steps alone; runs of consecutive one-part steps together."""
    out: list[list[NativeStep]] = []
    for s in steps:
        if s.parts <= 1 and out and out[-1][-1].parts <= 1:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def state_words(steps: list[NativeStep]) -> int:
    return WORDS_PER_UNIT * max(1, len(units(steps)))


def _emit_calls(b: ir.IRBuilder, step: NativeStep, lo: ir.Value, hi: ir.Value) -> None:
    for c in step.calls:
        if len(c.sig) != len(c.args):
            raise ValueError(f"call at {c.address:#x}: signature {c.sig!r} has {len(c.sig)} "
                             f"arguments, got {len(c.args)}")
        vals: list[ir.Value] = []
        for ch, a in zip(c.sig, c.args):
            kind = a[0]
            if kind == "lo":
                v = lo
            elif kind == "hi":
                v = hi
            elif ch == "p":
                v = b.inttoptr(i64(int(a[1])), PTR)
            elif ch == "l":
                v = i64(int(a[1]))
            elif ch == "f":
                v = ir.Constant(F32, float(a[1]))
            else:
                raise ValueError(f"unknown argument type {ch!r} in signature {c.sig!r}")
            vals.append(v)
        fty = ir.FunctionType(VOID, [_TYPES[ch] for ch in c.sig])
        b.call(b.inttoptr(i64(c.address), fty.as_pointer()), vals)


def _all_done(b: ir.IRBuilder, done_p: ir.Value, parts: int) -> tuple[ir.Value, ir.Value]:
    done = b.load_atomic(done_p, "acquire", 8)
    return b.icmp_signed(">=", done, i64(parts)), done


def build_graph_module(steps: list[NativeStep], name: str = "vtakit_graph") -> ir.Module:
    """``void graph(i64 state)``: run `steps` in order, cooperating with every other thread that
    runs it on the same zeroed `state` (`state_words` int64 words, 64-byte aligned)."""
    mod = ir.Module(name=name)
    fn = ir.Function(mod, ir.FunctionType(VOID, [I64]), name="graph")
    fn.attributes.add("nounwind")
    (state_int,) = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    state = b.inttoptr(state_int, I64.as_pointer())
    for u, group in enumerate(units(steps)):
        claim_p = b.gep(state, [i64(WORDS_PER_UNIT * u)])
        done_p = b.gep(state, [i64(WORDS_PER_UNIT * u + 8)])
        parts = group[0].parts if len(group) == 1 else 1
        claim = fn.append_basic_block(f"u{u}.claim")
        body = fn.append_basic_block(f"u{u}.body")
        wait = fn.append_basic_block(f"u{u}.wait")
        b.branch(claim)
        b.position_at_end(claim)
        part = b.atomic_rmw("add", claim_p, i64(1), "monotonic")
        b.cbranch(b.icmp_signed(">=", part, i64(parts)), wait, body)
        b.position_at_end(body)
        if parts > 1:
            (s,) = group
            q, r = divmod(s.extent, parts)
            # part i covers [i*q + min(i, r), that + q + (i < r))
            small = b.icmp_signed("<", part, i64(r))
            lo = b.add(b.mul(part, i64(q)), b.select(small, part, i64(r)))
            hi = b.add(b.add(lo, i64(q)), b.zext(small, I64))
            _emit_calls(b, s, lo, hi)
        else:
            for s in group:
                _emit_calls(b, s, i64(0), i64(s.extent))
        b.atomic_rmw("add", done_p, i64(1), "release")
        b.branch(claim)
        b.position_at_end(wait)
        poll_until(b, functools.partial(_all_done, done_p=done_p, parts=parts))
    b.ret_void()
    return mod
