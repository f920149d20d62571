"""A tiny thread pool for compiled kernels called through ctypes (which releases the GIL).

The pool's worker threads are started once and kept. A split step hands its job to at most
``threads - 1`` of them, and the calling thread works too; the tasks are taken dynamically (the
next unclaimed one, by any thread), so a step split into more parts than threads balances itself
when a core is slower or busy with another process.

Waking a sleeping thread costs tens of microseconds, and on a busy machine up to a scheduler
tick, which is longer than many steps. So after a job a worker spins for `SPIN_US` (in a small
compiled function that releases the GIL) on a word the caller bumps to hand it the next one, and
only then sleeps on its queue; the caller likewise spins briefly before blocking until the
helpers are done. The spins are short and yield the core every few polls, so that on a machine
with fewer free cores than threads they do not starve the thread they wait for.
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

import numpy as np

MAX_WORKERS = 15  # helper threads; a run uses at most `threads - 1` of them
SPIN_US = 100.0  # how long an idle worker waits for the next job before sleeping
WAIT_SPIN_US = 100.0  # how long the caller spins for its helpers before blocking

_local = threading.local()


@functools.cache
def _spin_fn() -> tuple[Callable[[int, int, int, int], int], float]:
    """``spin(inc, p, old, iters)``: add 1 to the int64 at `inc` (unless 0), then return the
    int64 at `p` once it differs from `old`, or `old` after `iters` polls; and the polls per
    microsecond on this machine. Signalling here, with the GIL released, lets the thread woken
    take the GIL without waiting for this one to drop it."""
    import llvmlite.binding as llvm
    import llvmlite.ir as ir

    from .jit import JitModule

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()  # for the inline "pause"

    i64 = ir.IntType(64)
    mod = ir.Module(name="vtakit_spin")
    fn = ir.Function(mod, ir.FunctionType(i64, [i64.as_pointer(), i64.as_pointer(), i64, i64]),
                     name="spin")
    inc, p, old, iters = fn.args
    entry, signal, start, loop, body, out = (fn.append_basic_block(n) for n in (
        "entry", "signal", "start", "loop", "body", "out"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_unsigned("!=", b.ptrtoint(inc, i64), ir.Constant(i64, 0)), signal, start)
    b.position_at_end(signal)
    b.atomic_rmw("add", inc, ir.Constant(i64, 1), "seq_cst")
    b.branch(start)
    b.position_at_end(start)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), start)
    v = b.load_atomic(p, "acquire", 8)
    done = b.or_(b.icmp_signed("!=", v, old), b.icmp_signed(">=", i, iters))
    b.cbranch(done, out, body)
    b.position_at_end(body)
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        b.asm(ir.FunctionType(ir.VoidType(), []), "pause", "", [], side_effect=True)
    # every 64 polls give the core to any other runnable thread: on a machine with fewer free
    # cores than threads, a spinning thread must not hold up the one it waits for
    yield_bb, next_bb = fn.append_basic_block("yield"), fn.append_basic_block("next")
    b.cbranch(b.icmp_unsigned("==", b.and_(i, ir.Constant(i64, 63)), ir.Constant(i64, 63)),
              yield_bb, next_bb)
    b.position_at_end(yield_bb)
    b.call(ir.Function(mod, ir.FunctionType(ir.IntType(32), []), name="sched_yield"), [])
    b.branch(next_bb)
    b.position_at_end(next_bb)
    i.add_incoming(b.add(i, ir.Constant(i64, 1)), next_bb)
    b.branch(loop)
    b.position_at_end(out)
    b.ret(v)
    jm = JitModule(mod).compile()
    spin = jm.cfunc("spin", ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                    ctypes.c_int64)
    _keep.append(jm)
    word = np.zeros(1, np.int64)
    n = 20000
    t0 = time.perf_counter()
    spin(0, word.ctypes.data, 0, n)
    per_us = n / max(1e6 * (time.perf_counter() - t0), 1e-3)
    return spin, per_us


_keep: list[object] = []


class _Job:
    __slots__ = ("tasks", "claim", "error", "word", "addr", "done")

    def __init__(self, tasks: Sequence[Callable[..., object]]) -> None:
        self.tasks = tasks
        self.claim = itertools.count()  # next() on a count is atomic under the GIL
        self.error: BaseException | None = None
        self.done = threading.Semaphore(0)  # released by each helper, for a caller that blocks
        self.word = np.zeros(1, np.int64)  # helpers finished (atomic adds by `spin`)
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
        spin, per_us = _spin_fn()
        seen = int(self.word[0])
        t_end = time.perf_counter() + 1e-6 * WAIT_SPIN_US
        while seen < helpers and time.perf_counter() < t_end:
            seen = spin(0, self.addr, seen, int(WAIT_SPIN_US * per_us))
        if seen < helpers:
            for _ in range(helpers):
                self.done.acquire()


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.lock = threading.Lock()
        self.gen = np.zeros(8, np.int64)  # gen[0]: bumped by the caller for each job
        self.addr = self.gen.__array_interface__["data"][0]
        self.job: _Job | None = None
        self.sleeping = False
        self.wake: SimpleQueue[None] = SimpleQueue()
        threading.Thread(target=self.loop, daemon=True, name=f"vtakit-cpu-{index}").start()

    def give(self, job: _Job) -> None:
        with self.lock:
            self.job = job
            self.gen[0] += 1
            wake, self.sleeping = self.sleeping, False
        if wake:
            self.wake.put(None)

    def loop(self) -> None:
        _local.worker = True
        spin, per_us = _spin_fn()
        seen = 0
        done = 0  # the finished job's word, signalled by the next spin
        while True:
            got = spin(done, self.addr, seen, int(SPIN_US * per_us))
            done = 0
            if got == seen:
                with self.lock:
                    sleep = self.sleeping = int(self.gen[0]) == seen
                if sleep:
                    self.wake.get()
            with self.lock:
                seen = int(self.gen[0])
                job = self.job
                self.job = None
            if job is None:
                continue
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
        _spin_fn()
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
