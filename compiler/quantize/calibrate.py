"""Calibration: the user's data, and the observers that turn the values a tensor takes on it into
the range its int8 scale must cover.

Data (`load_calibration`): a ``.npz`` file (one array per graph input name, or one array for a
one-input graph; the first axis counts samples), a directory of ``.npy`` files (one sample each,
or a stack), or a Python iterable of arrays or of ``{input name: array}`` dicts. Data that no
scale can be taken from is refused with the file, the input and the sample: NaN or infinity,
a magnitude of 2**64 or more, an input that is 0 (or only denormal, or below 2**-63) over all
the samples; so is a tensor of the model that overflows on them (`observe_graph`). A tensor
that is exactly 0 on every sample (a dead activation) is kept: its scale does not matter, and
the quantiser's report warns about it.

Observers (`OBSERVERS`), each giving the threshold T of a symmetric range [-T, T]:

- ``minmax``: the largest magnitude seen. Exact cover, but one outlier sets the scale. Used for
  weights (per output channel), where every value matters.
- ``percentile``: the 99.99th percentile of the magnitudes; values beyond it saturate.
- ``mse``: the threshold among 128 candidates up to the largest magnitude that minimises the mean
  squared error of quantising the observed values to int8 (rounding plus clipping error).
  The default for activations: it keeps resolution where the values are when a few are far out.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..ir.graph import Graph
from ..ir.interpreter import evaluate
from ..ir.ops import Node, Op

MAX_SAMPLES_KEPT = 1 << 16  # values kept per tensor for the percentile and MSE observers

#: A float calibration input must hold no magnitude of 2**64 or more (the square of a smaller
#: one is still a finite float32, so a model that multiplies two such values, as attention and
#: norms do, does not overflow) and span a range (its largest magnitude over all samples) of at
#: least 2**-63 (whose square is still a normal float32). Data outside is in the wrong units or
#: preprocessing, not a model's input, and an int8 scale taken from it fits no real input.
INPUT_MAGNITUDE_MAX = 2.0 ** 64
INPUT_RANGE_MIN = 2.0 ** -63
#: The smallest observed range of an intermediate tensor whose int8 scale (range / 127) is a
#: normal float32.
SCALE_RANGE_MIN = 127 * float(np.finfo(np.float32).tiny)


class Calibration(list):  # type: ignore[type-arg]
    """The calibration samples (a list of ``{input name: array}``, batch 1) and where each
    came from, for error messages.

    Attributes
    ----------
    source : str
        The data as a whole: ``calibration file X``, ``calibration directory X`` or
        ``calibration data`` (given in memory).
    origins : list of str
        Per sample: the file that holds it and its index, e.g. ``calibration file c.npz,
        sample 3``.
    """

    source: str
    origins: list[str]


def load_calibration(data: Any, g: Graph) -> Calibration:
    """Calibration samples for `g`: one ``{input name: array}`` per sample, each array of the
    graph input's shape (batch 1) and dtype. `ValueError` / `TypeError` say what was wrong,
    naming the file, the input and the sample: a shape that does not fit, a float input holding
    NaN or infinity, a magnitude of `INPUT_MAGNITUDE_MAX` or more, or an input whose largest
    magnitude over all samples is 0 or below `INPUT_RANGE_MIN` (nothing to take a scale from)."""
    names = list(g.input_names)
    source = "calibration data"
    chunks: list[tuple[str, Any]] = []  # (the file it came from, an item of samples)
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if path.is_dir():
            files = sorted(path.glob("*.npy"))
            if not files:
                raise ValueError(f"calibration directory {path} holds no .npy files")
            source = f"calibration directory {path}"
            chunks = [(f"calibration file {f}", _load(f)) for f in files]
        elif path.suffix == ".npz":
            source = f"calibration file {path}"
            arrays = _load(path)
            if set(arrays) >= set(names):
                chunks = [(source, s) for s in _split({k: arrays[k] for k in names}, source)]
            elif len(arrays) == 1 and len(names) == 1:
                chunks = [(source, s) for s in _split({names[0]: next(iter(arrays.values()))},
                                                      source)]
            else:
                raise ValueError(f"calibration file {path}: arrays {sorted(arrays)}, expected "
                                 f"one per graph input {names}")
        elif path.suffix == ".npy":
            source = f"calibration file {path}"
            chunks = [(source, _load(path))]
        else:
            raise ValueError(f"calibration data {path}: expected a .npz file, a .npy file or a "
                             f"directory of .npy files")
    else:
        if isinstance(data, np.ndarray):
            data = [data]
        if not isinstance(data, Iterable):
            raise TypeError(f"calibration data must be a path or an iterable of arrays, got "
                            f"{type(data).__name__}")
        chunks = ((source, item) for item in data)  # type: ignore[assignment]
    samples = Calibration()
    samples.source, samples.origins = source, []
    ranges = {n.name: _Range() for n in g.inputs}
    for where, item in chunks:
        feed = item if isinstance(item, Mapping) else (
            {names[0]: item} if len(names) == 1 else None)
        if feed is None:
            raise TypeError(f"the graph has inputs {names}: give each calibration sample as a "
                            f"dict of input name to array")
        for given in _fit(feed, g):
            origin = f"{where}, sample {len(samples)}"
            for n in g.inputs:  # before the cast: float64 data beyond float32 would be inf
                _check_input(given[n.name], n, origin, ranges[n.name])
            samples.append({n.name: given[n.name].astype(n.dtype.np, copy=False)
                            for n in g.inputs})
            samples.origins.append(origin)
    if not samples:
        raise ValueError("no calibration samples")
    for n in g.inputs:
        if n.dtype.is_float:
            ranges[n.name].check(n.name, source, len(samples))
    return samples


def _load(path: Path) -> Any:
    """A .npy array or a .npz file's arrays; what cannot be read names the file."""
    try:
        if path.suffix == ".npz":
            with np.load(path) as z:
                return {k: z[k] for k in z.files}
        return np.load(path)
    except (OSError, ValueError, EOFError) as err:
        if isinstance(err, OSError) and err.filename is not None:
            raise
        raise ValueError(f"calibration file {path}: cannot read it as a numpy "
                         f"{path.suffix or '.npy'} file ({err})") from err


def _split(arrays: Mapping[str, np.ndarray], source: str) -> list[dict[str, np.ndarray]]:
    arrays = {k: np.asarray(a) for k, a in arrays.items()}
    n = {len(a) if a.ndim else 0 for a in arrays.values()}
    if len(n) != 1:
        raise ValueError(f"{source}: the arrays differ in sample count: "
                         f"{ {k: len(a) if a.ndim else 0 for k, a in arrays.items()} }")
    return [{k: a[i:i + 1] for k, a in arrays.items()} for i in range(n.pop())]


def _fit(feed: Mapping[str, Any], g: Graph) -> list[dict[str, np.ndarray]]:
    """One sample, or a stack of them along the batch axis, as batch-1 arrays (as given: the
    caller checks them, then casts them to the inputs' dtypes)."""
    raw: dict[str, np.ndarray] = {}
    count = None
    for n in g.inputs:
        if n.name not in feed:
            raise ValueError(f"calibration sample has {sorted(feed)}, missing input {n.name!r}")
        a = np.asarray(feed[n.name])
        if a.shape == n.shape[1:]:
            a = a[None]
        if a.shape[1:] != n.shape[1:] or n.shape[0] != 1:
            raise ValueError(f"calibration input {n.name!r}: got shape {list(a.shape)}, expected "
                             f"{list(n.shape)} (or a stack of samples of that shape)")
        raw[n.name] = a
        count = len(a) if count is None else min(count, len(a))
    return [{k: a[i:i + 1] for k, a in raw.items()} for i in range(count or 0)]


def _first(mask: np.ndarray) -> list[int]:
    """The index (one int per axis, batch axis dropped) of the first True of `mask`."""
    return [int(k) for k in np.unravel_index(int(np.argmax(mask)), mask.shape)[1:]]


def _check_input(a: np.ndarray, n: Node, origin: str, rng: _Range) -> None:
    """One sample of input `n` as given (before the cast to the input's dtype)."""
    if a.dtype.kind == "f":
        finite = np.isfinite(a)
        if not finite.all():
            at = _first(~finite)
            v = a[0][tuple(at)]
            kind = "NaN" if np.isnan(v) else ("+inf" if v > 0 else "-inf")
            more = int((~finite).sum()) - 1
            raise ValueError(f"{origin}: input {n.name!r} holds {kind} at index {at}"
                             + (f" (and {more} more non-finite values)" if more else "")
                             + "; calibration data must be finite (the inputs the model will "
                               "run on, preprocessed as for inference)")
    if not n.dtype.is_float or not a.size or a.dtype.kind not in "biuf":
        return
    mag = np.abs(a.astype(np.float64))
    big = mag >= INPUT_MAGNITUDE_MAX
    if big.any():
        at = _first(big)
        v = float(a[0][tuple(at)])
        raise ValueError(f"{origin}: input {n.name!r} holds {v:.6g} at index {at}, beyond "
                         f"what a model's float32 input can take (magnitudes below 2**64 = "
                         f"{INPUT_MAGNITUDE_MAX:.3g}); expected the inputs the model will run "
                         f"on, preprocessed as for inference")
    rng.add(mag, origin)


class _Range:
    """The largest magnitude of one input over the samples seen so far, and where it was."""

    def __init__(self) -> None:
        self.absmax = 0.0
        self.where = ""

    def add(self, mag: np.ndarray, origin: str) -> None:
        m = float(mag.max())
        if m > self.absmax:
            self.absmax, self.where = m, f"{origin}, index {_first(mag == m)}"

    def check(self, name: str, source: str, count: int) -> None:
        """Refuse a range of 0 or below `INPUT_RANGE_MIN`."""
        samples = ("its only sample (0)" if count == 1
                   else f"all {count} samples (0 to {count - 1})")
        if self.absmax == 0.0:
            raise ValueError(f"{source}: input {name!r} is 0 in {samples}: there is no range "
                             f"to take its int8 scale from (every value would quantise to 0); "
                             f"expected the inputs the model will run on")
        if self.absmax < INPUT_RANGE_MIN:
            denormal = self.absmax < float(np.finfo(np.float32).tiny)
            raise ValueError(f"{source}: input {name!r}: its largest magnitude over {samples} "
                             f"is {self.absmax:.3g}{' (denormal in float32)' if denormal else ''}"
                             f", at {self.where.removeprefix(source + ', ')}; below 2**-63 = "
                             f"{INPUT_RANGE_MIN:.3g}, too small for an int8 scale to be taken "
                             f"from; expected the inputs the model will run on, preprocessed as "
                             f"for inference")


class Observer:
    """Collects the values one tensor takes; `threshold()` is the range to cover."""

    kind = ""

    def __init__(self) -> None:
        self.absmax = 0.0
        self._kept: list[np.ndarray] = []
        self._count = 0
        self._rng = np.random.default_rng(0)

    def observe(self, x: np.ndarray) -> float:
        """Take in the values of one sample; return their largest magnitude (NaN or inf when
        the sample holds one, which the caller refuses: it is not folded into the range)."""
        a = np.abs(np.asarray(x, np.float64).reshape(-1))
        if a.size == 0:
            return 0.0
        m = float(a.max())
        if not math.isfinite(m):
            return m
        self.absmax = max(self.absmax, m)
        if self.kind != "minmax":
            room = MAX_SAMPLES_KEPT - self._count
            if a.size > room:
                a = self._rng.choice(a, max(room, 0), replace=False) if room > 0 else a[:0]
            self._kept.append(a)
            self._count += a.size
        return m

    def values(self) -> np.ndarray:
        return np.concatenate(self._kept) if self._kept else np.zeros(1)

    def threshold(self) -> float:
        return self.absmax


class MinMax(Observer):
    kind = "minmax"


class Percentile(Observer):
    kind = "percentile"
    q = 99.99

    def threshold(self) -> float:
        return float(np.percentile(self.values(), self.q)) or self.absmax


class Mse(Observer):
    kind = "mse"
    candidates = 128

    def threshold(self) -> float:
        v = self.values()
        if self.absmax == 0.0:
            return 0.0
        best, best_err = self.absmax, np.inf
        for t in np.linspace(self.absmax / self.candidates, self.absmax, self.candidates):
            s = t / 127.0
            err = float(np.mean((np.clip(np.round(v / s), -127, 127) * s - v) ** 2))
            if err < best_err:
                best, best_err = float(t), err
        return best


OBSERVERS: dict[str, type[Observer]] = {"minmax": MinMax, "percentile": Percentile,
                                        "mse": Mse}


def observe_graph(g: Graph, samples: Sequence[Mapping[str, np.ndarray]],
                  observer: str = "mse") -> dict[int, float]:
    """Run `g` (float) on every sample with the reference interpreter and return, per node
    (``id(node)``) with a float value, the threshold its observer chose.

    `ValueError`, naming the sample (its file and index when `samples` is a `Calibration`) and
    the node, when a value is NaN or infinite (the model overflows float32 on that sample) or
    when a tensor's range is above 0 but too small for its int8 scale to be a normal float32
    (`SCALE_RANGE_MIN`). A range of exactly 0 (a dead activation) is returned as 0: the
    quantiser warns about it (`Rewriter.scale`)."""
    if observer not in OBSERVERS:
        raise ValueError(f"unknown observer {observer!r}; expected one of {sorted(OBSERVERS)}")
    obs: dict[int, Observer] = {id(n): OBSERVERS[observer]() for n in g.nodes
                                if n.dtype.is_float and n.op is not Op.CONST}
    last_use: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        for s in n.src:
            last_use[id(s)] = i
    outputs = {id(n) for n in g.outputs}
    origins = getattr(samples, "origins", None)
    for k, feed in enumerate(samples):
        values: dict[int, np.ndarray] = {}
        for i, n in enumerate(g.nodes):
            if n.op is Op.INPUT:
                values[id(n)] = np.asarray(feed[n.name])
            else:
                with np.errstate(all="ignore"):  # an overflow is refused just below
                    values[id(n)] = evaluate(n, [values[id(s)] for s in n.src])
            if id(n) in obs and not math.isfinite(obs[id(n)].observe(values[id(n)])):
                where = origins[k] if origins is not None else f"calibration sample {k}"
                raise ValueError(_nonfinite(n, values[id(n)], where))
            for s in n.src:  # free what no later node reads
                if last_use.get(id(s)) == i and id(s) not in outputs:
                    values.pop(id(s), None)
    thresholds = {k: o.threshold() for k, o in obs.items()}
    source = getattr(samples, "source", "calibration data")
    for n in g.nodes:
        t = thresholds.get(id(n))
        if t is not None and 0.0 < t < SCALE_RANGE_MIN:
            what = f"input {n.name!r}" if n.op is Op.INPUT else f"node {n.name!r} ({n.op.name})"
            raise ValueError(f"{source}: {what}: its observed range over {len(samples)} "
                             f"sample(s) is {t:.3g}, so small that its int8 scale (range / 127) "
                             f"is not a normal float32 (range >= {SCALE_RANGE_MIN:.3g}): the "
                             f"model's values underflow on this data")
    return thresholds


def _nonfinite(n: Node, v: np.ndarray, where: str) -> str:
    v = np.asarray(v)
    bad = ~np.isfinite(v)
    at = [int(k) for k in np.unravel_index(int(np.argmax(bad)), v.shape)]
    x = v[tuple(at)]
    kind = "NaN" if np.isnan(x) else ("+inf" if x > 0 else "-inf")
    if n.op is Op.INPUT:
        return (f"{where}: input {n.name!r} holds {kind} at index {at[1:]}; calibration data "
                f"must be finite")
    return (f"{where}: node {n.name!r} ({n.op.name}) computes {kind} at index {at} "
            f"({int(bad.sum())} of {v.size} values not finite): the float model overflows on "
            f"this calibration sample, so no int8 scale can cover it; check the data's scale "
            f"and preprocessing")
