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

**The clamp: the bound without the bits it costs.** A wide layer (a 1x1 convolution over 960
channels) has ``bound`` near 2**22, which would leave ``m`` only 8 or 9 bits. But the output
saturates long before: given the output range ``[lo, hi]`` and zero point ``z`` (`choose`'s
`out_range` and `zero_point`), let ``D = max(hi - z, z - lo)`` and, per channel with
``m[c] > 0``, ``A[c] = ceil(D * 2**s / m[c])``. REQUANTIZE's ``clamp`` saturates ``t = acc +
bias`` to ``[-A, A]`` before the multiply, and this changes no result of the exact arithmetic
(with ``r = 2**(s-1)``, or 0 when s = 0, so ``0 <= r < 2**s``):

- ``t >= A``: ``t * m >= A * m >= D * 2**s >= (hi - z) * 2**s``, so ``floor((t*m + r) / 2**s)
  >= hi - z`` and the output is ``hi``, for ``t`` and for ``A`` alike;
- ``t <= -A``: ``t * m + r <= -D * 2**s + r < (lo - z + 1) * 2**s``, so ``floor((t*m + r) /
  2**s) <= lo - z`` and the output is ``lo``, for ``t`` and for ``-A`` alike;
- ``|t| < A``: the clamp does nothing.

So ``A[c]`` may replace ``bound[c]`` in the proof above: ``|m[c]| * min(bound[c], A[c]) +
2**(s-1) < 2**31``. Since ``m * A < D * 2**s + m``, the shift no longer depends on the
accumulator's size, only on the output's range: ``s <= 23`` for D in 128..255 (int8 with its
full range, uint8), 24 for D <= 127 (int8 after a ReLU). So ``m = M * 2**23`` is 8389 at ``M =
10**-3`` and reaches the immediate's limit from ``M = 2**-8``, where the unclamped proof left
MobileNetV2's 1x1 projections over 960 channels multipliers of 100 to 800. ``A[c]`` is stored as
``min(A[c], bound[c])`` (a clamp at the bound is a no-op too) and at least 1 (0 means "no
clamp"; a channel with ``m[c] = 0`` outputs ``z`` clipped whatever ``t``, so any clamp is
exact); it fits int32 because the clamp is only used with ``bound < 2**31`` (``acc + bias``
itself must not wrap). `choose` clamps only when it buys a larger shift than the unclamped
proof, and never without `out_range` (the int32 terms of a quantised Add: their range bounds
nothing). The clamp is a per-channel operand of the ALU's MAX and MIN (a row in the accumulator
SRAM, as the bias), not an immediate: ``A ~ D / M`` is about 2.5 * 10**5 for a convolution's
``M`` of 10**-3, past the 16-bit immediate (``vta_hw.isa.IMM_BITS``); the clamps of the
onnxruntime-quantised MobileNetV2 lie in 1.6e4..3.3e5, ResNet-18's in 5.3e4..1.1e6.

The zero point's add, ``q + z`` with ``|q| <= (worst >> s) + 1``, is checked too (it matters
only for s = 0).
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
    relative error of ``m / 2**s`` against the real multiplier, the proven headroom
    ``max |m| * min(bound, clamp) + 2**(s-1)`` (< 2**31), and the clamps of
    `ops.RequantAttrs` (one per channel or one; ``(0,)``: none)."""

    multiplier: tuple[int, ...]
    shift: int
    rel_error: float
    worst_case: int
    clamp: tuple[int, ...] = (0,)


def _per_layer(v: Sequence[int]) -> tuple[int, ...]:
    """One value when every channel has the same, as `ops.RequantAttrs` takes it."""
    return tuple(int(x) for x in v) if len(set(v)) > 1 else (int(v[0]),)


def clamps(m: np.ndarray, bound: np.ndarray, shift: int, span: int) -> np.ndarray:
    """Per channel, a clamp that changes no result (see the module docstring), at most the
    bound and at least 1: ``min(ceil(span * 2**shift / |m|), bound)``, 1 where ``m = 0``.
    `span` is ``D = max(hi - z, z - lo)``; exact integer arithmetic (Python ints)."""
    out = [max(1, min(b, -(-(span << shift) // abs(mi)))) if mi else 1
           for mi, b in zip(m.tolist(), bound.tolist(), strict=True)]
    return np.asarray(out, np.int64)


def choose(real: Sequence[float] | np.ndarray, bound: Sequence[int] | np.ndarray,
           mode: str = "fixed", max_shift: int = 31, out_range: tuple[int, int] | None = None,
           zero_point: int = 0, clamp: bool = False) -> Requant:
    """Multipliers and one shift for the real multipliers `real` (one per channel), with
    `bound[c]` the largest possible ``|acc + bias|`` of channel c (see the module docstring).
    With `clamp`, `out_range` (the REQUANTIZE's ``lo, hi``) and its `zero_point`, a clamp is
    chosen where it allows a larger shift. Off by default: it keeps multipliers 15 bits wide
    but moved MobileNetV2's agreement with onnxruntime by only +0.25 points, and costs the
    accelerator three ALU operations per output row (docs/int8.md)."""
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
    span = None
    if clamp and out_range is not None and int(B.max(initial=0)) < INT32_LIMIT:
        lo, hi = out_range
        span = max(hi - zero_point, zero_point - lo, 0)

    def fits(worst: int, s: int) -> bool:
        return worst < INT32_LIMIT and (worst >> s) + 1 + abs(zero_point) < INT32_LIMIT

    for s in range(max_shift, -1, -1):
        m = np.round(M * (1 << s)).astype(np.int64)
        if m.max(initial=0) > IMM_MAX:
            continue
        rnd = (1 << (s - 1)) if s else 0
        sat: tuple[int, ...] = (0,)
        worst = int((m * B).max(initial=0)) + rnd
        if not fits(worst, s):
            if span is None:
                continue
            a = clamps(m, B, s, span)
            worst = int((m * a).max(initial=0)) + rnd
            if not fits(worst, s):
                continue
            sat = _per_layer(a.tolist())
        with np.errstate(divide="ignore", invalid="ignore"):
            err = np.where(M > 0, np.abs(m / (1 << s) - M) / M, 0.0)
        return Requant(_per_layer(m.tolist()), s, float(err.max(initial=0.0)), worst, sat)
    raise RequantError(f"no shift in 0..{max_shift} keeps multipliers {M[:4].tolist()} within "
                       f"the ALU immediate and bound {int(B.max())} * multiplier within int32")


def pow2_ceil(x: float) -> float:
    """The smallest power of two >= x (x > 0): scales in shift mode."""
    return float(2.0 ** math.ceil(math.log2(x))) if x > 0 else 1.0
