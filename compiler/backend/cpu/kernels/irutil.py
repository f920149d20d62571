"""Small helpers for writing loop nests with `llvmlite.ir` (types, counted loops, vectors)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import llvmlite.ir as ir

F32 = ir.FloatType()
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
VOID = ir.VoidType()
PTR = ir.PointerType()  # opaque pointer (LLVM >= 17)


def i64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def f32(v: float) -> ir.Constant:
    return ir.Constant(F32, v)


def vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def new_function(module: ir.Module, name: str, args: list[tuple[str, ir.Type]],
                 ret: ir.Type = VOID, noalias: bool = True) -> tuple[ir.Function, ir.IRBuilder]:
    """Declare `name(args...)`, pointer arguments `noalias`, and return a builder at its entry."""
    fn = ir.Function(module, ir.FunctionType(ret, [t for _, t in args]), name=name)
    for a, (n, t) in zip(fn.args, args, strict=True):
        a.name = n
        if noalias and isinstance(t, ir.PointerType):
            a.add_attribute("noalias")
    fn.attributes.add("nounwind")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


@contextlib.contextmanager
def loop(b: ir.IRBuilder, start: ir.Value | int, stop: ir.Value | int, step: int = 1,
         name: str = "i") -> Iterator[ir.Value]:
    """``for i in range(start, stop, step)`` over i64 (step > 0); the body is built in the block.

    The loop is guarded, so ``start >= stop`` runs zero iterations.
    """
    start = i64(start) if isinstance(start, int) else start
    stop = i64(stop) if isinstance(stop, int) else stop
    pre = b.block
    fn = pre.function
    head = fn.append_basic_block(f"{name}.head")
    body = fn.append_basic_block(f"{name}.body")
    done = fn.append_basic_block(f"{name}.end")
    b.branch(head)
    b.position_at_end(head)
    iv = b.phi(I64, name=name)
    iv.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", iv, stop), body, done)
    b.position_at_end(body)
    yield iv
    nxt = b.add(iv, i64(step), name=f"{name}.next")
    iv.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(done)


def gep(b: ir.IRBuilder, ty: ir.Type, ptr: ir.Value, idx: ir.Value | int) -> ir.Value:
    idx = i64(idx) if isinstance(idx, int) else idx
    return b.gep(ptr, [idx], source_etype=ty)


def load(b: ir.IRBuilder, ty: ir.Type, ptr: ir.Value, idx: ir.Value | int,
         align: int | None = None) -> ir.Value:
    return b.load(gep(b, ty, ptr, idx), typ=ty, align=align)


def store(b: ir.IRBuilder, ty: ir.Type, val: ir.Value, ptr: ir.Value, idx: ir.Value | int,
          align: int | None = None) -> None:
    b.store(val, gep(b, ty, ptr, idx), align=align)


def vload(b: ir.IRBuilder, n: int, ptr: ir.Value, idx: ir.Value | int, elt: ir.Type = F32,
          align: int = 4) -> ir.Value:
    """Load `n` consecutive `elt` starting at element `idx` as a vector."""
    vt = vec(elt, n)
    return b.load(gep(b, elt, ptr, idx), typ=vt, align=align)


def vstore(b: ir.IRBuilder, val: ir.Value, ptr: ir.Value, idx: ir.Value | int,
           elt: ir.Type = F32, align: int = 4) -> None:
    b.store(val, gep(b, elt, ptr, idx), align=align)


def splat(b: ir.IRBuilder, x: ir.Value, n: int) -> ir.Value:
    vt = vec(x.type, n)
    v = b.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                            ir.Constant(vec(I32, n), [0] * n))


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, args), name=name)
    return fn


def fma(b: ir.IRBuilder, a: ir.Value, x: ir.Value, c: ir.Value) -> ir.Value:
    """a * x + c, fused (``llvm.fma``) for float or float vectors."""
    t = a.type
    suffix = f"v{t.count}f32" if isinstance(t, ir.VectorType) else "f32"
    fn = intrinsic(b.module, f"llvm.fma.{suffix}", t, [t, t, t])
    return b.call(fn, [a, x, c])


def fmax(b: ir.IRBuilder, a: ir.Value, x: ir.Value) -> ir.Value:
    """max(a, x) as ``llvm.maximum``: NaN in either operand gives NaN (numpy.maximum, ONNX Relu /
    Clip / Max / MaxPool as onnxruntime computes them where it is consistent). ``nsz``: the sign
    of a zero result is unspecified, which makes it ``maxps`` + a NaN blend on x86 (as
    ``llvm.maxnum`` was) and one ``fmax`` on AArch64."""
    return _minmax(b, "maximum", a, x)


def fmin(b: ir.IRBuilder, a: ir.Value, x: ir.Value) -> ir.Value:
    """min(a, x) as ``llvm.minimum``: NaN-propagating, like `fmax`."""
    return _minmax(b, "minimum", a, x)


def fmax_num(b: ir.IRBuilder, a: ir.Value, x: ir.Value) -> ir.Value:
    """max(a, x) as ``llvm.maxnum``, NaN-ignoring (numpy.fmax): one ``maxps`` where `a` is
    known not NaN. Only for a caller that tracks NaN itself (the max-pooling window)."""
    t = a.type
    suffix = f"v{t.count}f32" if isinstance(t, ir.VectorType) else "f32"
    return b.call(intrinsic(b.module, f"llvm.maxnum.{suffix}", t, [t, t]), [a, x])


def _minmax(b: ir.IRBuilder, name: str, a: ir.Value, x: ir.Value) -> ir.Value:
    t = a.type
    suffix = f"v{t.count}f32" if isinstance(t, ir.VectorType) else "f32"
    fn = intrinsic(b.module, f"llvm.{name}.{suffix}", t, [t, t])
    return b.call(fn, [a, x], fastmath=("nsz",))


def const_vec(t: ir.Type, n: int, v: float | int) -> ir.Constant:
    return ir.Constant(vec(t, n), [v] * n)


def imin(b: ir.IRBuilder, a: ir.Value, x: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", a, x), a, x)


def imax(b: ir.IRBuilder, a: ir.Value, x: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", a, x), a, x)


def pair(v: int | tuple[int, int], who: str, name: str) -> tuple[int, int]:
    """``(v, v)`` for an int, the two ints of a pair; ``TypeError`` naming ``who`` otherwise."""
    if isinstance(v, int):
        return v, v
    if isinstance(v, tuple | list) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return int(v[0]), int(v[1])
    raise TypeError(f"{who}: {name} must be an int or a pair of ints, got {v!r}")


def accumulate(b: ir.IRBuilder, n: ir.Value, unroll: int, init: list[ir.Value],
               step: Callable[[ir.IRBuilder, ir.Value, list[ir.Value]], list[ir.Value]],
               ) -> list[ir.Value]:
    """Emit ``acc = init; for k in range(n): acc = step(b, k, acc)`` as a main loop of
    `unroll` steps per iteration and a remainder loop, the accumulators carried in registers
    (phi nodes). Returns the final accumulators; `b` is left after the loops."""
    fn = b.function
    kmain = b.mul(b.udiv(n, i64(unroll)), i64(unroll))
    pre = b.block
    head, body, rhead, rbody, done = (fn.append_basic_block(x) for x in (
        "k.head", "k.body", "r.head", "r.body", "done"))
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(I64, "k")
    acc = [b.phi(v.type, f"acc{i}") for i, v in enumerate(init)]
    k.add_incoming(i64(0), pre)
    for p, v in zip(acc, init, strict=True):
        p.add_incoming(v, pre)
    b.cbranch(b.icmp_signed("<", k, kmain), body, rhead)
    b.position_at_end(body)
    cur: list[ir.Value] = list(acc)
    for u in range(unroll):
        cur = step(b, b.add(k, i64(u)), cur)
    k.add_incoming(b.add(k, i64(unroll)), b.block)
    for p, v in zip(acc, cur, strict=True):
        p.add_incoming(v, b.block)
    b.branch(head)
    b.position_at_end(rhead)
    k2 = b.phi(I64, "k2")
    acc2 = [b.phi(v.type, f"racc{i}") for i, v in enumerate(init)]
    k2.add_incoming(k, head)
    for p, q in zip(acc2, acc, strict=True):
        p.add_incoming(q, head)
    b.cbranch(b.icmp_signed("<", k2, n), rbody, done)
    b.position_at_end(rbody)
    cur = step(b, k2, list(acc2))
    k2.add_incoming(b.add(k2, i64(1)), b.block)
    for p, v in zip(acc2, cur, strict=True):
        p.add_incoming(v, b.block)
    b.branch(rhead)
    b.position_at_end(done)
    return list(acc2)
