"""A tiny thread pool for compiled code called through ctypes (which releases the GIL).

The pool's worker threads are started once and kept. A run hands its job to at most
``threads - 1`` of them, and the calling thread works too. Two kinds of job:

* `run_native`: a compiled function that every thread enters at once and that divides the work
  itself (the executor's whole-graph function, `graphfn`). The workers poll for it in compiled
  code and run it without touching the GIL, so a run costs one hand-off, not one per step.
* `run_parallel`: a list of Python callables (each typically one ctypes call), taken
  dynamically (the next unclaimed one, by any thread), so a job split into more parts than
  threads balances itself when a core is slower or busy with another process.

Waking a sleeping thread costs tens of microseconds, and on a busy machine up to a scheduler
tick, which is longer than many steps. So after a job a worker polls its control block for
`SPIN_US` (in compiled code, GIL released) before it sleeps on its queue; the caller likewise
spins briefly before blocking until the helpers are done. The polls use ``pause`` and yield the
core every 64 rounds, so that on a machine with fewer free cores than threads they do not starve
the thread they wait for.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from queue import SimpleQueue

import llvmlite.ir as ir
import numpy as np


def i64c(v: int) -> ir.Constant:
    return ir.Constant(ir.IntType(64), v)


MAX_WORKERS = 15  # helper threads; a run uses at most `threads - 1` of them
SPIN_US = 100.0  # how long an idle worker waits for the next job before sleeping
WAIT_SPIN_US = 100.0  # how long the caller spins for its helpers before blocking

_local = threading.local()


def relax(b: ir.IRBuilder, i: ir.Value) -> None:
    """The body of a polling loop at poll `i`: a ``pause`` hint, and every 64 polls give the core
    to any other runnable thread (on a machine with fewer free cores than threads, a spinning
    thread must not hold up the one it waits for)."""
    mod = b.module
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        b.asm(ir.FunctionType(ir.VoidType(), []), "pause", "", [], side_effect=True)
    fn = b.function
    yield_bb, next_bb = fn.append_basic_block("yield"), fn.append_basic_block("relaxed")
    b.cbranch(b.icmp_unsigned("==", b.and_(i, i64c(63)), i64c(63)), yield_bb, next_bb)
    b.position_at_end(yield_bb)
    sched_yield = mod.globals.get("sched_yield") or ir.Function(
        mod, ir.FunctionType(ir.IntType(32), []), name="sched_yield")
    b.call(sched_yield, [])
    b.branch(next_bb)
    b.position_at_end(next_bb)


def poll_until(b: ir.IRBuilder, ready: Callable[[ir.IRBuilder], tuple[ir.Value, ir.Value]],
               limit: ir.Value | None = None) -> ir.Value:
    """Emit a polling loop at `b`'s position: each round evaluates ``ready(b)`` -> (done flag,
    value) and `relax`es until done (or after `limit` rounds). Returns the last value read;
    `b` is left after the loop."""
    fn = b.function
    start = b.block
    loop, body, out = (fn.append_basic_block(n) for n in ("poll", "poll.again", "poll.done"))
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(ir.IntType(64))
    i.add_incoming(i64c(0), start)
    done, value = ready(b)
    if limit is not None:
        done = b.or_(done, b.icmp_signed(">=", i, limit))
    b.cbranch(done, out, body)
    b.position_at_end(body)
    relax(b, i)
    i.add_incoming(b.add(i, i64c(1)), b.block)
    b.branch(loop)
    b.position_at_end(out)
    return value


def _pool_module() -> ir.Module:
    """The pool's polling loops (see the functions' docstrings in `_Native`)."""
    i64 = ir.IntType(64)
    p64 = i64.as_pointer()
    mod = ir.Module(name="vtakit_pool")

    # spin(inc, p, old, iters) -> *p
    fn = ir.Function(mod, ir.FunctionType(i64, [p64, p64, i64, i64]), name="spin")
    inc, p, old, iters = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    _signal(b, inc)
    v = poll_until(b, lambda b: _changed(b, p, old), iters)
    b.ret(v)

    # wait_eq(p, target): until *p == target
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [p64, i64]), name="wait_eq")
    p, target = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    poll_until(b, lambda b: _equal(b, p, target))
    b.ret_void()

    # publish(p, v): *p = v, a release store (what was written before is seen first)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [p64, i64]), name="publish")
    p, v = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.store_atomic(v, p, "release", 8)
    b.ret_void()

    # work(inc, ctl, iters) -> 1 (a Python job is waiting) or 0 (no job for `iters` polls)
    fn = ir.Function(mod, ir.FunctionType(i64, [p64, p64, i64]), name="work")
    inc, ctl, iters = fn.args
    entry, loop, got, native, body, out_py, out_idle = (fn.append_basic_block(n) for n in (
        "entry", "loop", "got", "native", "body", "out_py", "out_idle"))
    b = ir.IRBuilder(entry)
    _signal(b, inc)
    start = b.block
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(i64c(0), start)
    gen = b.load_atomic(b.gep(ctl, [i64c(CTL_GEN)]), "acquire", 8)
    seen = b.load(b.gep(ctl, [i64c(CTL_SEEN)]))
    b.cbranch(b.icmp_signed("!=", gen, seen), got, body)
    b.position_at_end(got)
    b.store(gen, b.gep(ctl, [i64c(CTL_SEEN)]))
    fptr = b.load(b.gep(ctl, [i64c(CTL_FN)]))
    b.cbranch(b.icmp_signed("==", fptr, i64c(0)), out_py, native)
    b.position_at_end(native)
    job_t = ir.FunctionType(ir.VoidType(), [i64])
    b.call(b.inttoptr(fptr, job_t.as_pointer()), [b.load(b.gep(ctl, [i64c(CTL_ARG)]))])
    b.store_atomic(gen, b.gep(ctl, [i64c(CTL_DONE)]), "release", 8)
    i.add_incoming(i64c(0), native)
    b.branch(loop)
    b.position_at_end(body)
    poll = fn.append_basic_block("poll")
    b.cbranch(b.icmp_signed(">=", i, iters), out_idle, poll)
    b.position_at_end(poll)
    relax(b, i)
    i.add_incoming(b.add(i, i64c(1)), b.block)
    b.branch(loop)
    b.position_at_end(out_py)
    b.ret(i64c(1))
    b.position_at_end(out_idle)
    b.ret(i64c(0))
    return mod


def _signal(b: ir.IRBuilder, inc: ir.Value) -> None:
    """Add 1 to the int64 at `inc` unless `inc` is null (a finished job's counter)."""
    fn = b.function
    signal, cont = fn.append_basic_block("signal"), fn.append_basic_block("signalled")
    b.cbranch(b.icmp_unsigned("!=", b.ptrtoint(inc, ir.IntType(64)), i64c(0)), signal, cont)
    b.position_at_end(signal)
    b.atomic_rmw("add", inc, i64c(1), "seq_cst")
    b.branch(cont)
    b.position_at_end(cont)


def _changed(b: ir.IRBuilder, p: ir.Value, old: ir.Value) -> tuple[ir.Value, ir.Value]:
    v = b.load_atomic(p, "acquire", 8)
    return b.icmp_signed("!=", v, old), v


def _equal(b: ir.IRBuilder, p: ir.Value, target: ir.Value) -> tuple[ir.Value, ir.Value]:
    v = b.load_atomic(p, "acquire", 8)
    return b.icmp_signed("==", v, target), v


class _Native:
    """The compiled polling loops, and polls per microsecond on this machine.

    ``spin(inc, p, old, iters)``: add 1 to the int64 at `inc` (unless 0), then return the int64
    at `p` once it differs from `old`, or `old` after `iters` polls. Signalling here, with the
    GIL released, lets the thread woken take the GIL without waiting for this one to drop it.

    ``wait_eq(p, target)``: return once the int64 at `p` equals `target`.

    ``publish(p, v)``: store `v` at `p` after everything written before (a release store).

    ``work(inc, ctl, iters)``: a worker's loop: signal `inc` like `spin`, then poll the control
    block `ctl` for a new generation; run a native job there and then (``fn(arg)``, then mark it
    done), return 1 for a Python job, or 0 after `iters` polls without a job.
    """

    def __init__(self) -> None:
        import llvmlite.binding as llvm

        from .llvm import JitModule

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        llvm.initialize_native_asmparser()  # for the inline "pause"
        self.jm = JitModule(_pool_module()).compile()
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        self.spin = self.jm.cfunc("spin", i64, vp, vp, i64, i64)
        self.wait_eq = self.jm.cfunc("wait_eq", None, vp, i64)
        self.publish = self.jm.cfunc("publish", None, vp, i64)
        self.work = self.jm.cfunc("work", i64, vp, vp, i64)
        word = np.zeros(1, np.int64)
        n = 20000
        t0 = time.perf_counter()
        self.spin(0, word.ctypes.data, 0, n)
        self.per_us = n / max(1e6 * (time.perf_counter() - t0), 1e-3)


@functools.cache
def _native() -> _Native:
    return _Native()


class _Job:
    """A job of Python tasks (each typically one ctypes call)."""

    __slots__ = ("tasks", "claim", "error", "word", "addr", "done")

    def __init__(self, tasks: Sequence[Callable[..., object]]) -> None:
        self.tasks = tasks
        self.claim = itertools.count()  # next() on a count is atomic under the GIL
        self.error: BaseException | None = None
        self.done = threading.Semaphore(0)  # released by each helper, for a caller that blocks
        self.word = np.zeros(1, np.int64)  # helpers finished (atomic adds by `work`)
        self.addr = self.word.__array_interface__["data"][0]

    def work(self) -> None:
        tasks, claim, n = self.tasks, self.claim, len(self.tasks)
        while True:
            i = next(claim)
            if i >= n:
                return
            try:
                tasks[i]()
            except BaseException as e:  # re-raised on the calling thread
                self.error = e

    def wait(self, helpers: int) -> None:
        """Until `helpers` workers have finished: spin briefly, then block."""
        nat = _native()
        seen = int(self.word[0])
        t_end = time.perf_counter() + 1e-6 * WAIT_SPIN_US
        while seen < helpers and time.perf_counter() < t_end:
            seen = nat.spin(0, self.addr, seen, int(WAIT_SPIN_US * nat.per_us))
        if seen < helpers:
            for _ in range(helpers):
                self.done.acquire()


# A worker's control block (int64 words; the caller's and the worker's on separate cache lines)
CTL_GEN, CTL_FN, CTL_ARG = 0, 1, 2  # written by the caller: generation, native job and argument
CTL_SEEN, CTL_DONE = 8, 9  # written by the worker: generation taken, native generation finished
_CTL_WORDS = 16


class _Worker:
    """A helper thread. It polls its control block in compiled code (`_Native.work`, GIL
    released), runs native jobs without coming back to Python, comes back for a Python job, and
    after `SPIN_US` without a job sleeps on its queue until the next one is given."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.lock = threading.Lock()
        raw = np.zeros(_CTL_WORDS + 8, np.int64)
        off = (-raw.ctypes.data % 64) // 8
        self.ctl = raw[off:off + _CTL_WORDS]  # 64-byte aligned
        self.addr = self.ctl.ctypes.data
        self.job: _Job | None = None
        self.sleeping = False
        self.wake: SimpleQueue[None] = SimpleQueue()
        threading.Thread(target=self.loop, daemon=True, name=f"vtakit-cpu-{index}").start()

    def give(self, job: _Job | None, fn: int = 0, arg: int = 0) -> int:
        """Hand over a Python `job`, or the native job ``fn(arg)``; returns its generation."""
        with self.lock:
            self.job = job
            self.ctl[CTL_FN] = fn
            self.ctl[CTL_ARG] = arg
            gen = int(self.ctl[CTL_GEN]) + 1
            # the poller reads the job after it sees the new generation
            _native().publish(self.addr + 8 * CTL_GEN, gen)
            wake, self.sleeping = self.sleeping, False
        if wake:
            self.wake.put(None)
        return gen

    def loop(self) -> None:
        _local.worker = True
        nat = _native()
        iters = int(SPIN_US * nat.per_us)
        done = 0  # the finished Python job's word, signalled by the next poll
        while True:
            if not nat.work(done, self.addr, iters):
                done = 0
                with self.lock:
                    sleep = self.sleeping = self.ctl[CTL_GEN] == self.ctl[CTL_SEEN]
                if sleep:
                    self.wake.get()
                continue
            with self.lock:
                job, self.job = self.job, None
            done = 0
            if job is not None:
                job.work()  # catches the tasks' errors
                job.done.release()
                done = job.addr


_workers: list[_Worker] = []
_start_lock = threading.Lock()
_run_lock = threading.Lock()  # one parallel run at a time; another caller runs serially


def _after_fork() -> None:
    """A forked child has none of the parent's worker threads: start afresh."""
    global _start_lock, _run_lock
    _workers.clear()
    _start_lock, _run_lock = threading.Lock(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _helpers(k: int) -> list[_Worker]:
    if len(_workers) < k:
        _native()
        with _start_lock:
            while len(_workers) < k:
                _workers.append(_Worker(len(_workers)))
    return _workers[:k]


def split_range(n: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into at most `parts` contiguous, non-empty, near-equal ranges."""
    parts = max(1, min(parts, n))
    q, r = divmod(n, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + q + (1 if i < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


def run_parallel(tasks: Sequence[Callable[..., object]], threads: int | None = None) -> None:
    """Run the independent `tasks` on up to `threads` threads (default: one per task), this
    thread included; each thread takes the next task not yet taken until none is left."""
    n = len(tasks)
    if n == 0:
        return
    k = min(n, threads if threads is not None else n, MAX_WORKERS + 1)
    if k <= 1 or getattr(_local, "worker", False) or not _run_lock.acquire(blocking=False):
        for t in tasks:  # one thread, a task of a parallel run, or another run under way
            t()
        return
    try:
        job = _Job(tasks)
        for w in _helpers(k - 1):
            w.give(job)
        job.work()
        job.wait(k - 1)
    finally:
        _run_lock.release()
    if job.error is not None:
        raise job.error


def run_native(fn: int, arg: int, threads: int, call: Callable[[int], object]) -> None:
    """Run the native job ``fn(arg)`` on `threads` threads at once, this one included (through
    `call`, a ctypes function for `fn`), and return when every thread has finished it.

    The job must divide its work itself (claiming parts with atomics) and be safe to enter
    late: a helper may start after the others have done everything."""
    k = min(threads, MAX_WORKERS + 1)
    if k <= 1 or getattr(_local, "worker", False) or not _run_lock.acquire(blocking=False):
        call(arg)  # one thread, inside a parallel run, or another run under way
        return
    try:
        helpers = _helpers(k - 1)
        gens = [w.give(None, fn, arg) for w in helpers]
        call(arg)
        nat = _native()
        for w, g in zip(helpers, gens):
            nat.wait_eq(w.addr + 8 * CTL_DONE, g)
    finally:
        _run_lock.release()
