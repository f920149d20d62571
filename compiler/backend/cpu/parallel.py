"""A tiny thread pool for compiled kernels called through ctypes (which releases the GIL)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="vtakit-cpu")
        return _pool


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


def run_parallel(tasks: Sequence[Callable[..., object]]) -> None:
    """Run `tasks` concurrently: all but the last on pool threads, the last on this thread."""
    if not tasks:
        return
    if len(tasks) == 1:
        tasks[0]()
        return
    futures: list[Future] = [_executor().submit(t) for t in tasks[:-1]]
    tasks[-1]()
    for f in futures:
        f.result()
