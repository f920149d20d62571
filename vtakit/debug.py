"""The ``VTAKIT_DEBUG`` level shared by the pipeline (verify after each pass at >= 1) and the
backends (dump LLVM IR at >= 4). Read at call time, never at import."""

from __future__ import annotations

import os

__all__ = ["debug_level"]


def debug_level() -> int:
    """``VTAKIT_DEBUG`` as an int (0 when unset)."""
    raw = os.environ.get("VTAKIT_DEBUG", "0")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"VTAKIT_DEBUG={raw!r} is not an integer (expected 0..4)") from None
