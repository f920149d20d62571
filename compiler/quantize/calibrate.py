"""Calibration: the user's data, and the observers that turn the values a tensor takes on it into
the range its int8 scale must cover.

Data (`load_calibration`): a ``.npz`` file (one array per graph input name, or one array for a
one-input graph; the first axis counts samples), a directory of ``.npy`` files (one sample each,
or a stack), or a Python iterable of arrays or of ``{input name: array}`` dicts.

Observers (`OBSERVERS`), each giving the threshold T of a symmetric range [-T, T]:

- ``minmax``: the largest magnitude seen. Exact cover, but one outlier sets the scale. Used for
  weights (per output channel), where every value matters.
- ``percentile``: the 99.99th percentile of the magnitudes; values beyond it saturate.
- ``mse``: the threshold among 128 candidates up to the largest magnitude that minimises the mean
  squared error of quantising the observed values to int8 (rounding plus clipping error).
  The default for activations: it keeps resolution where the values are when a few are far out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..ir.graph import Graph
from ..ir.interpreter import evaluate
from ..ir.ops import Op

MAX_SAMPLES_KEPT = 1 << 16  # values kept per tensor for the percentile and MSE observers


def load_calibration(data: Any, g: Graph) -> list[dict[str, np.ndarray]]:
    """Calibration samples for `g`: one ``{input name: array}`` per sample, each array of the
    graph input's shape (batch 1) and dtype. `ValueError` / `TypeError` say what was wrong."""
    names = list(g.input_names)
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if path.is_dir():
            files = sorted(path.glob("*.npy"))
            if not files:
                raise ValueError(f"calibration directory {path} holds no .npy files")
            data = [np.load(f) for f in files]
        elif path.suffix == ".npz":
            with np.load(path) as z:
                arrays = {k: z[k] for k in z.files}
            if set(arrays) >= set(names):
                data = _split({k: arrays[k] for k in names})
            elif len(arrays) == 1 and len(names) == 1:
                data = _split({names[0]: next(iter(arrays.values()))})
            else:
                raise ValueError(f"calibration file {path}: arrays {sorted(arrays)}, expected "
                                 f"one per graph input {names}")
        elif path.suffix == ".npy":
            data = [np.load(path)]
        else:
            raise ValueError(f"calibration data {path}: expected a .npz file, a .npy file or a "
                             f"directory of .npy files")
    if isinstance(data, np.ndarray):
        data = [data]
    if not isinstance(data, Iterable):
        raise TypeError(f"calibration data must be a path or an iterable of arrays, got "
                        f"{type(data).__name__}")
    samples: list[dict[str, np.ndarray]] = []
    for item in data:
        feed = item if isinstance(item, Mapping) else (
            {names[0]: item} if len(names) == 1 else None)
        if feed is None:
            raise TypeError(f"the graph has inputs {names}: give each calibration sample as a "
                            f"dict of input name to array")
        samples.extend(_fit(feed, g))
    if not samples:
        raise ValueError("no calibration samples")
    return samples


def _split(arrays: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    n = {len(a) for a in arrays.values()}
    if len(n) != 1:
        raise ValueError(f"calibration arrays differ in sample count: "
                         f"{ {k: len(a) for k, a in arrays.items()} }")
    return [{k: a[i:i + 1] for k, a in arrays.items()} for i in range(n.pop())]


def _fit(feed: Mapping[str, Any], g: Graph) -> list[dict[str, np.ndarray]]:
    """One sample, or a stack of them along the batch axis, as batch-1 feeds."""
    out: list[dict[str, np.ndarray]] = []
    arrays = {}
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
        arrays[n.name] = a.astype(n.dtype.np, copy=False)
        count = len(a) if count is None else min(count, len(a))
    for i in range(count or 0):
        out.append({k: a[i:i + 1] for k, a in arrays.items()})
    return out


class Observer:
    """Collects the values one tensor takes; `threshold()` is the range to cover."""

    kind = ""

    def __init__(self) -> None:
        self.absmax = 0.0
        self._kept: list[np.ndarray] = []
        self._count = 0
        self._rng = np.random.default_rng(0)

    def observe(self, x: np.ndarray) -> None:
        a = np.abs(np.asarray(x, np.float64).reshape(-1))
        if a.size == 0:
            return
        self.absmax = max(self.absmax, float(a.max()))
        if self.kind != "minmax":
            room = MAX_SAMPLES_KEPT - self._count
            if a.size > room:
                a = self._rng.choice(a, max(room, 0), replace=False) if room > 0 else a[:0]
            self._kept.append(a)
            self._count += a.size

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
    (``id(node)``) with a float value, the threshold its observer chose."""
    if observer not in OBSERVERS:
        raise ValueError(f"unknown observer {observer!r}; expected one of {sorted(OBSERVERS)}")
    obs: dict[int, Observer] = {id(n): OBSERVERS[observer]() for n in g.nodes
                                if n.dtype.is_float and n.op is not Op.CONST}
    last_use: dict[int, int] = {}
    for i, n in enumerate(g.nodes):
        for s in n.src:
            last_use[id(s)] = i
    outputs = {id(n) for n in g.outputs}
    for feed in samples:
        values: dict[int, np.ndarray] = {}
        for i, n in enumerate(g.nodes):
            if n.op is Op.INPUT:
                values[id(n)] = np.asarray(feed[n.name])
            else:
                values[id(n)] = evaluate(n, [values[id(s)] for s in n.src])
            if id(n) in obs:
                obs[id(n)].observe(values[id(n)])
            for s in n.src:  # free what no later node reads
                if last_use.get(id(s)) == i and id(s) not in outputs:
                    values.pop(id(s), None)
    return {k: o.threshold() for k, o in obs.items()}
