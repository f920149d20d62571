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

**Never a lost value: the error bound.** Fitting int32 is not enough: the largest shift that
fits can leave every multiplier 0. onnxruntime, when ``input scale * weight scale`` is too small
for a layer's float bias, enlarges the weight scales until the bias fits int32, which puts it at
``2**31 / 1.0001``; after a GlobalAveragePool of scale 3.5e-10 (MobileNetV2 with a tiny last
feature map) its classifier has real multipliers 1.5e-10..6.3e-8 and ``|acc + bias|`` past
2**31, so no ``m >= 1`` fits and the search returned ``m = 0``: every output the zero point, and
no error. So every candidate now carries ``max_error``, a proof of how far the value it rounds,
``t1 * m / 2**(p+s)``, can be from the exact ``t * M`` for any ``|t| <= bound``:
``(|t| + h) * |m / 2**(p+s) - M| + h * M`` with ``h = 2**(p-1)`` (0 without a pre-shift), over
``|t| < T = (D + 1/2) / M`` only, since past ``T`` the exact output saturates, and so does ours
(checked exactly at ``+-T``; REQUANTIZE is monotone in t). Below 1, every output is within one
step of the exact rational result ``clip(floor(t * M + 1/2) + z)``. `choose` takes the plain
search's result where it is within one step; else (always with ``exact``, the ONNX importer's
choice; otherwise only where the value would be lost, ``max_error`` past 1/16 of the largest
output) it tries, in this order: multipliers capped at the immediate (``M >= 2**15``, a tiny
output scale: only ``t = 0`` is not saturated, so any ``m >= D + 1`` with a clamp of 1 gives
the exact result), the clamp, and REQUANTIZE's **pre-shift** ``p``, which divides ``t`` by
``2**p`` (rounding) before the multiply, so a 15-bit ``m`` times ``t / 2**p`` fits 32 bits, at
a cost of at most ``2**(p-1) * M`` steps; its bias is added in two parts (the low ``p`` bits
before the shift, the rest after), so ``acc + bias`` is never formed and a bias at the int32
limits cannot wrap (the proof then needs ``|acc| + 1.5 * 2**p < 2**31``: `acc_bound`).
Where none is within a step, the plain result stands if it keeps the value (one shift per
layer with multipliers far apart; an int32 output past 2**15, which no 32-bit product holds
to a step); where none keeps it, `RequantError` gives the multipliers, bounds and range: e.g.
a multiplier past 1 with ``acc + bias`` past int32 (the sign of the sum is the result there,
and REQUANTIZE cannot form the sum).
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
    relative error of ``m / 2**(p + s)`` against the real multiplier, the proven headroom
    ``max |m| * min(bound, clamp) + 2**(s-1)`` (< 2**31; the bound divided by ``2**p`` with a
    pre-shift), the clamps of `ops.RequantAttrs` (one per channel or one; ``(0,)``: none),
    its pre-shift ``p`` (0: none), and ``max_error``: the proven largest distance, over every
    accumulator up to the bound, between the value REQUANTIZE rounds and the exact ``(acc +
    bias) * real`` (in output steps: below 1 means every output is within one step of the
    exact rational result)."""

    multiplier: tuple[int, ...]
    shift: int
    rel_error: float
    worst_case: int
    clamp: tuple[int, ...] = (0,)
    pre_shift: int = 0
    max_error: float = 0.0


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


FAITHFUL = 1.0 - 1e-9  # max_error below this: every output within one step of the exact one
LOST = 16  # max_error above 1/16 of the largest output (and >= 1 step): the value is lost
PRE_SHIFT_MAX = 30  # REQUANTIZE's pre_shift: (bias & (2**p - 1)) + 2**(p-1) must fit int32


@dataclass
class _Layer:
    """What `choose` fits: real multipliers M, bounds B of |acc + bias| (and A of |acc|, when
    a pre-shift may be used), the output's span D (None: no saturation: an int32 output) and
    range, the zero point."""

    M: np.ndarray
    B: np.ndarray
    acc: np.ndarray | None
    span: int | None
    lo: int
    hi: int
    z: int

    def fits(self, worst: int, s: int) -> bool:
        return worst < INT32_LIMIT and (worst >> s) + 1 + abs(self.z) < INT32_LIMIT

    def candidate(self, m: np.ndarray, s: int, p: int, clamp: bool) -> Requant | None:
        """The requantisation (m, s, pre-shift p, a clamp where `clamp` and needed), or None
        where one of its int32 steps could overflow for some accumulator within the bounds."""
        B = self.B
        if p:
            if self.acc is None or int(self.acc.max(initial=0)) + 3 * (1 << (p - 1)) \
                    >= INT32_LIMIT:
                return None  # x + (bias & (2**p - 1)) + 2**(p-1) must not wrap
            B = (B >> p) + 1  # |floor((acc + bias + 2**(p-1)) / 2**p)|
            if int(B.max(initial=0)) >= INT32_LIMIT:
                return None
        rnd = (1 << (s - 1)) if s else 0
        sat: tuple[int, ...] = (0,)
        worst = int((m * B).max(initial=0)) + rnd
        if not self.fits(worst, s):
            if not clamp or self.span is None or int(B.max(initial=0)) >= INT32_LIMIT:
                return None  # (acc + bias itself must not wrap before the clamp)
            if self.span.bit_length() + s < 62:  # the same integers, vectorised
                mm = np.maximum(np.abs(m), 1)
                a = np.where(m != 0, np.maximum(1, np.minimum(B, -(-(self.span << s) // mm))), 1)
            else:
                a = clamps(m, B, s, self.span)
            worst = int((m * a).max(initial=0)) + rnd
            if not self.fits(worst, s):
                return None
            sat = _per_layer(a.tolist())
        err = self.error(m, s, p)
        k = float(2.0 ** (p + s))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(self.M > 0, np.abs(m / k - self.M) / self.M, 0.0)
        return Requant(_per_layer(m.tolist()), s, float(rel.max(initial=0.0)), worst, sat, p,
                       err)

    def error(self, m: np.ndarray, s: int, p: int) -> float:
        """The largest |value rounded - acc * M| in output steps over every |acc| <= B.

        With ``t1 = floor((t + h) / 2**p)`` (``h = 2**(p-1)``, 0 without a pre-shift) the value
        rounded is ``t1 * m / 2**(p+s)`` and ``|t1 * 2**p - t| <= h``, so it is within ``(|t| +
        h) * |m / 2**(p+s) - M| + h * M`` of ``t * M``: below 1, the rounded results are within
        one step. Past ``T = (D + 1/2) / M`` the exact output saturates (lo or hi); so does
        ours if it does at ``+-T`` (checked exactly, in integers), as it is monotone in t. So
        only ``|t| < T`` counts; where ours does not saturate at ``+-T``, the steps it falls
        short by count instead (at least 1: not faithful)."""
        M, B = self.M, self.B.astype(np.float64)
        h = float(1 << (p - 1)) if p else 0.0
        delta = np.abs(m / float(2.0 ** (p + s)) - M)
        top, short = B, 0
        if self.span is not None:
            with np.errstate(divide="ignore", over="ignore"):
                sat = np.where(M > 0, np.floor((self.span + 0.5) / M * (1 + 1e-12)) + 1, np.inf)
            check = sat <= B
            if check.any():
                t = sat[check].astype(np.int64)
                mc = np.broadcast_to(m, M.shape)[check].astype(np.int64)
                rnd = (1 << (s - 1)) if s else 0

                def q(v: np.ndarray) -> np.ndarray:
                    t1 = (v + (1 << (p - 1))) >> p if p else v
                    return (t1 * mc + rnd) >> s

                short = max(int((self.hi - self.z - q(t)).max(initial=0)),
                            int((q(-t) - (self.lo - self.z)).max(initial=0)), 0)
            top = np.minimum(B, sat - 1)
        return max(float(((top + h) * delta + h * M).max(initial=0.0)), float(short))

    def largest_output(self) -> float:
        """max over channels of min(B * M, D + 1/2): how far from 0 an exact output gets."""
        y = self.B.astype(np.float64) * self.M
        return float((y if self.span is None else np.minimum(y, self.span + 0.5)).max(
            initial=0.0))

    def best(self, p_values: Sequence[int], clamp: bool, max_shift: int) -> Requant | None:
        """Of the feasible requantisations with these pre-shifts (multipliers capped at the
        immediate: past it, only saturated outputs can be right, which `error` checks), the
        one with the least `max_error`."""
        best: Requant | None = None
        for p in p_values:
            for s in range(max_shift, -1, -1):
                exact = self.M * float(2.0 ** (p + s))
                capped = exact > IMM_MAX
                m = np.where(capped, IMM_MAX, np.round(np.minimum(exact, IMM_MAX)))
                c = self.candidate(m.astype(np.int64), s, p, clamp)
                if c is not None and (best is None or c.max_error < best.max_error):
                    best = c
                if c is not None and not capped.any():
                    break  # a smaller shift only loses bits
        return best


def choose(real: Sequence[float] | np.ndarray, bound: Sequence[int] | np.ndarray,
           mode: str = "fixed", max_shift: int = 31, out_range: tuple[int, int] | None = None,
           zero_point: int = 0, clamp: bool = False,
           acc_bound: Sequence[int] | np.ndarray | None = None, exact: bool = False
           ) -> Requant:
    """Multipliers and one shift for the real multipliers `real` (one per channel), with
    `bound[c]` the largest possible ``|acc + bias|`` of channel c (see the module docstring).
    With `clamp`, `out_range` (the REQUANTIZE's ``lo, hi``) and its `zero_point`, a clamp is
    chosen where it allows a larger shift. Off by default: it keeps multipliers 15 bits wide
    but moved MobileNetV2's agreement with onnxruntime by only +0.25 points, and costs the
    accelerator three ALU operations per output row (docs/int8.md).

    The value is never lost (`Requant.max_error`, the proven worst case over every input,
    at most 1/16 of the largest output, or below one step): where the plain search (the
    largest shift that fits) would lose it, e.g. multipliers rounded to 0, multipliers capped
    at the immediate (a saturating layer: a tiny output scale), a clamp (with `out_range`,
    whatever `clamp` says) or a pre-shift (only with `acc_bound`, the largest ``|acc|`` per
    channel without the bias; the caller must then write ``pre_shift`` into
    `ops.RequantAttrs`) are tried, in that order; where none keeps it, `RequantError` gives
    the numbers. With `exact` they are also tried wherever the plain result is not within one
    step of the exact rational one for some input (`max_error` >= 1), which is then the
    result wherever the ALU allows (not for int32 outputs past 2**15, nor multipliers too far
    apart for one shift)."""
    if mode not in MODES:
        raise ValueError(f"requantisation mode {mode!r}; expected one of {MODES}")
    M = np.asarray(real, np.float64).reshape(-1)
    B = np.asarray(bound, np.int64).reshape(-1)
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
        lo, hi = out_range if out_range is not None else (-(1 << 31), (1 << 31) - 1)
        M, B = np.broadcast_arrays(M, B)
        layer = _Layer(M, B, None, None if out_range is None else max(
            hi - zero_point, zero_point - lo, 0), lo, hi, zero_point)
        return Requant((1,), s, 0.0, worst, max_error=layer.error(np.ones(1, np.int64), s, 0))
    acc = None if acc_bound is None else np.asarray(acc_bound, np.int64).reshape(-1)
    if acc is not None:
        M, B, acc = np.broadcast_arrays(M, B, acc)
    elif M.size != B.size:
        M, B = np.broadcast_arrays(M, B)
    span = None
    lo, hi = (-(1 << 31), (1 << 31) - 1) if out_range is None else out_range
    if out_range is not None:
        span = max(hi - zero_point, zero_point - lo, 0)
    layer = _Layer(M, B, acc, span, lo, hi, zero_point)
    # The plain search: the largest shift whose multipliers fit the immediate and whose
    # products fit int32 (clamped only when asked).
    plain = None
    for s in range(max_shift, -1, -1):
        scaled = M * float(1 << s)
        if scaled.max(initial=0) > IMM_MAX + 0.5:
            continue
        m = np.round(scaled).astype(np.int64)
        if m.max(initial=0) > IMM_MAX:
            continue
        plain = layer.candidate(m, s, 0, clamp)
        if plain is not None:
            break
    top = layer.largest_output()
    if plain is not None and (plain.max_error < FAITHFUL
                              or (not exact and plain.max_error <= top / LOST)):
        return plain
    # Not faithful (or nothing fits): multipliers capped at the immediate (saturating
    # layers), a clamp, a pre-shift, in that order of cost.
    tried = [plain] if plain is not None else []
    families: list[tuple[Sequence[int], bool]] = [((0,), False)]
    if span is not None:
        families.append(((0,), True))
    if acc is not None:
        families += [(range(1, PRE_SHIFT_MAX + 1), False)] + (
            [(range(1, PRE_SHIFT_MAX + 1), True)] if span is not None else [])
    for p_values, with_clamp in families:
        c = layer.best(p_values, with_clamp, max_shift)
        if c is not None and c.max_error < FAITHFUL:
            return c
        if c is not None:
            tried.append(c)
    fine = [c for c in tried if c.max_error <= top / LOST]
    if fine:
        return plain if plain in fine else min(fine, key=lambda c: c.max_error)
    nz = M[M > 0]
    what = (f"multipliers {_num(nz.min()) if nz.size else 0}..{_num(M.max(initial=0))} "
            f"({M.size} channel{'s' if M.size > 1 else ''}), |acc + bias| up to "
            f"{int(B.max(initial=0))}"
            + (f", |acc| up to {int(acc.max(initial=0))}" if acc is not None else "")
            + (f", output range [{lo}, {hi}] zero point {zero_point}"
               if out_range is not None else ", int32 output"))
    if not tried:
        raise RequantError(f"no shift in 0..{max_shift} keeps multipliers {M[:4].tolist()} "
                           f"within the ALU immediate and bound {int(B.max())} * multiplier "
                           f"within int32 ({what})")
    b = min(tried, key=lambda c: c.max_error)
    raise RequantError(
        f"{what}: no REQUANTIZE (multiplier <= {IMM_MAX}, shift <= {max_shift}"
        f"{', pre-shift <= ' + str(PRE_SHIFT_MAX) if acc is not None else ''}) keeps the value: "
        f"the best (shift {b.shift}, pre-shift {b.pre_shift}, multipliers up to "
        f"{max(b.multiplier)}) is off by up to {b.max_error:.3g} steps of outputs up to "
        f"{top:.3g}")


def _num(v: float) -> str:
    return f"{float(v):.4g}"


def pow2_ceil(x: float) -> float:
    """The smallest power of two >= x (x > 0): scales in shift mode."""
    return float(2.0 ** math.ceil(math.log2(x))) if x > 0 else 1.0
