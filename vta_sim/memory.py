"""The memory model's arithmetic: beats and bursts of a 2-D transfer (docs/timing.md §2).

A transfer is a list of rows, each a byte range ``[start, start + nbytes)``. A row occupies every
bus beat it touches (``bus_bytes``-aligned words); its beats are split into bursts at every
multiple of ``mem_max_burst_beats`` beats, so no burst crosses a burst-size-aligned boundary.
Rows are never merged, even when they are contiguous.
"""

from __future__ import annotations

import numpy as np

__all__ = ["row_starts", "total_beats", "burst_lengths"]


def row_starts(dram_base: int, y_size: int, x_stride: int, elem_bytes: int) -> np.ndarray:
    """Byte address of each row of a 2-D transfer."""
    return (dram_base + np.arange(y_size, dtype=np.int64) * x_stride) * elem_bytes


def total_beats(starts: np.ndarray | int, nbytes: int, bus_bytes: int) -> int:
    """Beats of all rows (each row: the aligned bus words it touches)."""
    if nbytes <= 0:
        return 0
    if isinstance(starts, int):
        return (starts + nbytes - 1) // bus_bytes - starts // bus_bytes + 1
    if starts.size and nbytes % bus_bytes == 0 and not np.any(starts % bus_bytes):
        return int(starts.size * (nbytes // bus_bytes))
    return int(((starts + nbytes - 1) // bus_bytes - starts // bus_bytes + 1).sum())


def burst_lengths(starts: np.ndarray, nbytes: int, bus_bytes: int,
                  max_burst_beats: int) -> np.ndarray:
    """Beats of every burst of the transfer, in issue order (rows in order)."""
    starts = np.atleast_1d(np.asarray(starts, dtype=np.int64))
    first = starts // bus_bytes
    last = (starts + nbytes - 1) // bus_bytes
    b0, b1 = first // max_burst_beats, last // max_burst_beats
    per_row = b1 - b0 + 1
    total = int(per_row.sum())
    # Burst k of a row covers beats [max(first, blk*M), min(last, blk*M + M - 1)].
    row = np.repeat(np.arange(starts.size), per_row)
    offset = np.arange(total) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    blk = b0[row] + offset
    lo = np.maximum(first[row], blk * max_burst_beats)
    hi = np.minimum(last[row], blk * max_burst_beats + max_burst_beats - 1)
    return hi - lo + 1
