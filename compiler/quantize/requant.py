"""Choosing a requantisation's integers, with the proof that nothing overflows.

A REQUANTIZE (see `ir.ops.RequantAttrs`) turns an int32 accumulator ``acc`` (plus an int32 bias)
into int8 as ``(t * m + 2**(s-1)) >> s``, all in 32-bit arithmetic, standing for the real
``t * M`` with ``M = m / 2**s``. Two modes, both made only of the accelerator ALU's operations:

- ``"fixed"`` (fixed point): one shift ``s`` per layer and a multiplier ``m[c]`` per output
  channel, ``m[c] = round(M[c] * 2**s)``, ``|m[c]| <= 2**15 - 1`` (the ALU's 16-bit immediate);
- ``"shift"`` (power of two, VTA's): ``m = 1`` and ``M`` an exact power of two, which the
  quantiser arranges by rounding every scale up to a power of two.

**No overflow, for any input.** The caller gives, per channel, ``bound[c] >= max |acc + bias|``
over every possible int8 input (for a convolution, ``128 * sum |w_q[c]| + |bias_q[c]|``: exact
worst case, not a calibrated one). The largest shift is chosen such that
``|m[c]| * bound[c] + 2**(s-1) < 2**31`` for every channel: then neither the product nor the
rounding add can leave int32, whatever the input, and the int32 wrap-around of the hardware never
happens. `choose` raises when no shift satisfies this (a layer whose accumulator is too large for
32 bits), and reports the relative error of the multipliers it chose.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IMM_MAX = (1 << 15) - 1  # the ALU immediate is a signed 16-bit field (vta_hw.isa.IMM_BITS)
INT32_LIMIT = 1 << 31
MODES = ("fixed", "shift")


class RequantError(ValueError):
    """No requantisation of the asked mode fits the accelerator's 32-bit ALU."""


@dataclass(frozen=True)
class Requant:
    """The chosen integers: multipliers (one per channel or one), the shift, the largest
    relative error of ``m / 2**s`` against the real multiplier, and the proven headroom:
    ``max |m| * bound + 2**(s-1)`` (< 2**31)."""

    multiplier: tuple[int, ...]
    shift: int
    rel_error: float
    worst_case: int


def choose(real: Sequence[float] | np.ndarray, bound: Sequence[int] | np.ndarray,
           mode: str = "fixed",
           max_shift: int = 31) -> Requant:
    """Multipliers and one shift for the real multipliers `real` (one per channel), with
    `bound[c]` the largest possible ``|acc + bias|`` of channel c (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"requantisation mode {mode!r}; expected one of {MODES}")
    M = np.asarray(real, np.float64)
    B = np.asarray(bound, np.int64)
    if np.any(~np.isfinite(M)) or np.any(M < 0):
        raise RequantError(f"real multipliers must be finite and >= 0, got {M[:4].tolist()}...")
    if mode == "shift":
        nz = M[M > 0]
        exps = {round(math.log2(v)) for v in nz.tolist()}
        if len(exps) > 1 or any(abs(math.log2(v) - round(math.log2(v))) > 1e-9 for v in nz):
            raise RequantError("shift mode needs one power-of-two multiplier per layer, got "
                               f"{sorted(set(nz.tolist()))[:4]}")
        s = -exps.pop() if exps else 0
        if s < 0:
            raise RequantError(f"shift mode: multiplier 2**{-s} > 1 would need a left shift")
        if s > max_shift:
            s = max_shift  # a multiplier below 2**-31: everything rounds to 0 anyway
        worst = int(B.max(initial=0)) + ((1 << (s - 1)) if s else 0)
        if worst >= INT32_LIMIT:
            raise RequantError(f"accumulator bound {int(B.max())} + rounding overflows int32")
        return Requant((1,), s, 0.0, worst)
    for s in range(max_shift, -1, -1):
        m = np.round(M * (1 << s)).astype(np.int64)
        if m.max(initial=0) > IMM_MAX:
            continue
        worst = int((m * B).max(initial=0)) + ((1 << (s - 1)) if s else 0)
        if worst >= INT32_LIMIT:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            err = np.where(M > 0, np.abs(m / (1 << s) - M) / M, 0.0)
        mult = tuple(int(v) for v in m) if len(set(m.tolist())) > 1 else (int(m[0]),)
        return Requant(mult, s, float(err.max(initial=0.0)), worst)
    raise RequantError(f"no shift in 0..{max_shift} keeps multipliers {M[:4].tolist()} within "
                       f"the ALU immediate and bound {int(B.max())} * multiplier within int32")


def pow2_ceil(x: float) -> float:
    """The smallest power of two >= x (x > 0): scales in shift mode."""
    return float(2.0 ** math.ceil(math.log2(x))) if x > 0 else 1.0
