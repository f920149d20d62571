"""Schedule search with the simulator, and the tuning log that carries its results to `compile`.

For every accelerator layer of a model, `tune_model` ranks the tilings that fit by the analytic
model (`schedule.candidates`), runs the best ``top_k`` of them through the simulator's timing
layer (the layer alone, as one stream on a fresh `SimDevice`, so every candidate sees the same
buffer placement), and keeps the fastest. Every simulated candidate must leave the same output
as the first (the tilings compute the same thing), which the search checks as it goes.

The tuning log is a JSON-lines file, one record per tuned layer shape and configuration::

    {"version": 1, "key": {"kind": "conv2d", "inputs": [[1, 16, 8, 8]], "output": [1, 32, 8, 8],
     "kernel": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
     "requant": [{"imm_steps": 3, "row_steps": 5, "rows": 5}]},
     "config_hash": "...", "layer": "conv3x3_2",
     "schedule": {"toh": 8, "tow": 8, "tob": 1, "tib": 1, "threads": 1},
     "predicted_cycles": 4346, "simulated_cycles": 4425,
     "analytic": {"schedule": {...}, "predicted_cycles": 4346, "simulated_cycles": 4425},
     "candidates": [[{...}, 4346, 4425], ...], "searched": 64}

The key (`layer_key`) is everything the layer's instruction stream and its timing depend on:
the kind, the operand and output shapes (N, C, H, W as the accelerator holds them), kernel,
strides and padding, and per requantisation program its immediate and per-channel steps and
table rows; not the weight or constant values. With ``VtaOptions.tuning_log`` set, `compile`
takes the logged schedule of every layer whose key and configuration hash match (a later line
wins over an earlier one), and the analytic choice for the others.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vtakit.driver.devices.sim import SimDevice
from vtakit.driver.packing import act_shape, pack_conv_weights
from vtakit.driver.session import DeviceArray, Session
from vtakit.vta_hw.config import HwConfig

from ...ir.graph import Graph
from ...ir.ops import Node
from .codegen import LayerCode, emit_layer
from .layers import ConvLayer, Layer, PoolLayer, find_layers, node_dims
from .requant import RequantProgram
from .schedule import NoSchedule, Schedule, candidates, fits, schedule_from_json

__all__ = ["LOG_VERSION", "layer_key", "TuneRecord", "TuningLog", "read_log", "simulate",
           "tune_layer", "tune_graph", "tune_model", "TuneReport", "spearman"]

LOG_VERSION = 1
_FIELDS = ("version", "key", "config_hash", "layer", "schedule", "predicted_cycles",
           "simulated_cycles")


def layer_key(L: Layer, rqs: Sequence[RequantProgram]) -> dict[str, Any]:
    """What layer `L`'s stream and timing depend on (see the module docstring)."""
    key: dict[str, Any] = {"kind": L.kind, "inputs": [[x.n, x.c, x.h, x.w] for x in L.inputs],
                           "output": [L.out.n, L.out.c, L.out.h, L.out.w]}
    if isinstance(L, (ConvLayer, PoolLayer)):
        key.update(kernel=list(L.kernel), strides=list(L.strides), pads=list(L.pads))
    if rqs:
        key["requant"] = [{"imm_steps": sum(s.imm is not None for s in r.steps),
                           "row_steps": sum(s.imm is None for s in r.steps), "rows": r.rows}
                          for r in rqs]
    return key


def _key_id(key: Mapping[str, Any]) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


@dataclass
class TuneRecord:
    """One tuned layer: its key, the configuration's hash, the schedule kept and its predicted
    and simulated cycles, the analytic model's own pick (``analytic``: schedule, predicted and
    simulated cycles) and every simulated candidate as ``(schedule, predicted, simulated)``.
    ``searched`` is how many tilings fit; ``line`` where the record was read (0: not read)."""

    key: dict[str, Any]
    config_hash: str
    layer: str
    schedule: dict[str, int]
    predicted_cycles: int
    simulated_cycles: int
    analytic: dict[str, Any] = field(default_factory=dict)
    candidates: list[tuple[dict[str, int], int, int]] = field(default_factory=list)
    searched: int = 0
    line: int = 0

    @property
    def kind(self) -> str:
        return str(self.key.get("kind", "?"))

    @property
    def analytic_cycles(self) -> int:
        """Simulated cycles of the analytic model's pick."""
        return int(self.analytic.get("simulated_cycles", self.simulated_cycles))

    @property
    def gain(self) -> float:
        """Fraction of the analytic pick's simulated cycles the search saved."""
        return 1 - self.simulated_cycles / self.analytic_cycles if self.analytic_cycles else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"version": LOG_VERSION, "key": self.key, "config_hash": self.config_hash,
                "layer": self.layer, "schedule": self.schedule,
                "predicted_cycles": self.predicted_cycles,
                "simulated_cycles": self.simulated_cycles, "analytic": self.analytic,
                "candidates": [list(c) for c in self.candidates], "searched": self.searched}

    @classmethod
    def from_json(cls, d: Any, where: str) -> TuneRecord:
        """A record from its JSON object; `ValueError` prefixed with `where` (file, line)."""
        def bad(what: str) -> ValueError:
            return ValueError(f"{where}: {what} (expected a tuning record: one JSON object per "
                              f"line with {', '.join(_FIELDS)})")

        if not isinstance(d, dict):
            raise bad(f"a JSON {type(d).__name__}, not an object")
        missing = [f for f in _FIELDS if f not in d]
        if missing:
            raise bad(f"no {', '.join(repr(m) for m in missing)}")
        if d["version"] != LOG_VERSION:
            raise ValueError(f"{where}: tuning-log version {d['version']!r}; this vtakit reads "
                             f"version {LOG_VERSION} (re-run the tuning)")
        if not isinstance(d["key"], dict) or not isinstance(d["key"].get("kind"), str):
            raise bad(f"'key' is {d['key']!r}, not an object with a 'kind'")
        if not isinstance(d["config_hash"], str) or not isinstance(d["layer"], str):
            raise bad("'config_hash' and 'layer' must be strings")
        sch = d["schedule"]
        if not isinstance(sch, dict) or not sch or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sch.values()):
            raise bad(f"'schedule' is {sch!r}, not an object of positive integers")
        for f in ("predicted_cycles", "simulated_cycles"):
            if not isinstance(d[f], (int, float)) or isinstance(d[f], bool):
                raise bad(f"{f!r} is {d[f]!r}, not a number")
        cands = d.get("candidates", [])
        if not isinstance(cands, list) or not all(
                isinstance(c, list) and len(c) == 3 and isinstance(c[0], dict) for c in cands):
            raise bad("'candidates' must be a list of [schedule, predicted, simulated]")
        analytic = d.get("analytic", {})
        if not isinstance(analytic, dict):
            raise bad("'analytic' must be an object")
        return cls(d["key"], d["config_hash"], d["layer"], dict(sch), int(d["predicted_cycles"]),
                   int(d["simulated_cycles"]), analytic,
                   [(dict(c[0]), int(c[1]), int(c[2])) for c in cands],
                   int(d.get("searched", 0)))


class TuningLog:
    """The records of a tuning log, by (key, configuration hash).

    Attributes
    ----------
    path : str or None
        The file it was read from (named in errors).
    records : list of TuneRecord
        In file order; a later record replaces an earlier one with the same key and hash.
    """

    def __init__(self, path: str | None = None, records: Sequence[TuneRecord] = ()) -> None:
        self.path = path
        self.records: list[TuneRecord] = []
        self._index: dict[tuple[str, str], int] = {}
        for r in records:
            self.add(r)

    def add(self, record: TuneRecord) -> None:
        """Add `record`, replacing the one with the same key and configuration hash."""
        k = (_key_id(record.key), record.config_hash)
        if k in self._index:
            self.records[self._index[k]] = record
        else:
            self._index[k] = len(self.records)
            self.records.append(record)

    def get(self, key: Mapping[str, Any], config_hash: str) -> TuneRecord | None:
        i = self._index.get((_key_id(key), config_hash))
        return None if i is None else self.records[i]

    def schedule(self, L: Layer, rqs: Sequence[RequantProgram], cfg: HwConfig
                 ) -> Schedule | None:
        """The logged schedule of a layer like `L` on `cfg`, or None; `ValueError` (naming the
        file and line) if the logged schedule is not one of `L`'s or does not fit."""
        rec = self.get(layer_key(L, rqs), cfg.hash)
        if rec is None:
            return None
        where = f"tuning log {self.path}, line {rec.line}"
        try:
            s = schedule_from_json(L, rec.schedule)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if not fits(L, s, rqs, cfg):
            raise ValueError(f"{where}: schedule {rec.schedule} of layer {L.name!r} does not "
                             f"fit the buffers of {cfg.bitstream_name} (re-run the tuning)")
        return s

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TuningLog:
        """Read a tuning log; `FileNotFoundError` or `ValueError` naming the file and line."""
        p = os.fspath(path)
        try:
            with open(p, encoding="utf-8") as f:
                lines = f.readlines()
        except FileNotFoundError:
            raise FileNotFoundError(f"tuning log {p}: no such file (write one with "
                                    f"vtakit.compiler.backend.vta.tune.tune_model)") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"tuning log {p}: not a text file ({e.reason})") from None
        log = cls(p)
        for n, text in enumerate(lines, 1):
            if not text.strip():
                continue
            where = f"tuning log {p}, line {n}"
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
            rec = TuneRecord.from_json(d, where)
            rec.line = n
            log.add(rec)
        return log

    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Write the records, one JSON object a line, replacing the file in one step."""
        p = os.fspath(path if path is not None else self.path or "")
        if not p:
            raise ValueError("TuningLog.save: no path (the log was not read from a file)")
        folder = os.path.dirname(os.path.abspath(p))
        mode = os.stat(p).st_mode & 0o777 if os.path.exists(p) else 0o644
        fd, tmp = tempfile.mkstemp(prefix=".tune-", suffix=".jsonl", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                for r in self.records:
                    f.write(json.dumps(r.to_json(), separators=(",", ":")) + "\n")
            os.chmod(tmp, mode)  # mkstemp's file is private to its owner
            os.replace(tmp, p)
        except BaseException:
            os.unlink(tmp)
            raise
        self.path = p
        for n, r in enumerate(self.records, 1):
            r.line = n


def read_log(path: str | os.PathLike[str]) -> TuningLog:
    """`TuningLog.load`, remembered while the file is unchanged (`compile` asks once per
    layer)."""
    p = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return TuningLog.load(path)  # its error names the file
    stamp = (p, st.st_mtime_ns, st.st_size)
    got = _READ.get(p)
    if got is None or got[0] != stamp:
        got = (stamp, TuningLog.load(path))
        _READ[p] = got
    return got[1]


_READ: dict[str, tuple[tuple[str, int, int], TuningLog]] = {}


def simulate(L: Layer, s: Schedule, rqs: Sequence[RequantProgram], cfg: HwConfig,
             seed: int = 0) -> tuple[int, np.ndarray]:
    """Cycles of layer `L` with tiling `s` as a stream of its own on a fresh `SimDevice`
    (inputs random int8 from `seed`, the layer's real weights and constants), and the packed
    output it leaves. A fresh device places the buffers alike for every schedule."""
    shapes = [act_shape(cfg, *_dims(x.node, cfg)) for x in L.inputs + [L.out]]
    weight = pack_conv_weights(L.weight, cfg) if isinstance(L, ConvLayer) else None
    need = sum(int(np.prod(sh)) for sh in shapes) + sum(r.table.nbytes for r in rqs) + (
        0 if weight is None else weight.nbytes)
    with Session(SimDevice(cfg, dram_bytes=2 * need + (32 << 20), timing=True)) as sess:
        rng = np.random.default_rng(seed)
        arrays: dict[str, DeviceArray] = {}

        def put(name: str, value: np.ndarray) -> str:
            arrays[name] = sess.array(value, name=name)
            return name

        ins = [put(f"in{k}", rng.integers(-128, 128, sh, np.int8))
               for k, sh in enumerate(shapes[:-1])]
        code = LayerCode(ins, put("out", np.zeros(shapes[-1], np.int8)))
        if weight is not None:
            code.weight = put("w", weight)
        code.tables = tuple(put(f"rq{k}", r.table) if r.rows else "" for k, r in enumerate(rqs))
        with sess.record() as rec:
            emit_layer(sess, L, s, tuple(rqs), arrays, code)
        cycles = sess.run_program(rec[0]).cycles
        return cycles, arrays["out"].numpy().copy()


def _dims(n: Node, cfg: HwConfig) -> tuple[int, int, int, int]:
    dims = node_dims(n, cfg)
    assert dims is not None  # find_layers took only values the accelerator holds
    return dims


def tune_layer(L: Layer, rqs: Sequence[RequantProgram], cfg: HwConfig, top_k: int | None = 6
               ) -> TuneRecord:
    """Simulate the `top_k` tilings of `L` the analytic model ranks best (all with None) and
    keep the fastest (the analytic pick on a tie). `NoSchedule` if none fits."""
    if top_k is not None and top_k < 1:
        raise ValueError(f"tune: top_k={top_k}; expected an int >= 1 or None (all tilings)")
    ranked = candidates(L, rqs, cfg)
    tried: list[tuple[Schedule, int, int]] = []
    reference: np.ndarray | None = None
    for s, predicted in ranked[:top_k]:
        cycles, out = simulate(L, s, rqs, cfg)
        if reference is None:
            reference = out
        elif not np.array_equal(out, reference):
            raise RuntimeError(f"tune: layer {L.name!r}: tiling {s.to_json()} computes another "
                               f"output than {tried[0][0].to_json()} (a code generator bug)")
        tried.append((s, predicted, cycles))
    best = min(tried, key=lambda t: t[2])  # min keeps the first (best-predicted) of equals
    first = tried[0]
    return TuneRecord(layer_key(L, rqs), cfg.hash, L.name, best[0].to_json(), best[1], best[2],
                      {"schedule": first[0].to_json(), "predicted_cycles": first[1],
                       "simulated_cycles": first[2]},
                      [(s.to_json(), p, c) for s, p, c in tried], len(ranked))


def _ranks(a: Sequence[float]) -> np.ndarray:
    """Ranks from 0, ties sharing their mean rank."""
    v = np.asarray(a, float)
    order = np.argsort(v, kind="stable")
    r = np.empty(len(v))
    r[order] = np.arange(len(v))
    for x in np.unique(v):
        r[v == x] = r[v == x].mean()
    return r


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of `a` and `b` (nan with fewer than 3 values or a constant
    one)."""
    if len(a) < 3:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass
class TuneReport:
    """What `tune_model` found: one record per accelerator layer of the model, in graph order
    (``reused[i]``: layer i has the key of an earlier layer, whose search it took).

    Attributes
    ----------
    config_hash : str
    records : list of TuneRecord
    reused : list of bool
    log : str or None
        The tuning log written.
    seconds : float
    """

    config_hash: str
    records: list[TuneRecord] = field(default_factory=list)
    reused: list[bool] = field(default_factory=list)
    log: str | None = None
    seconds: float = 0.0

    def _searched(self) -> list[TuneRecord]:
        return [r for r, again in zip(self.records, self.reused, strict=True) if not again]

    @property
    def rank_correlation(self) -> float:
        """Mean over the searched layers of the Spearman correlation between predicted and
        simulated cycles of their simulated candidates (layers with fewer than 3 left out)."""
        rhos = [spearman([c[1] for c in r.candidates], [c[2] for c in r.candidates])
                for r in self._searched()]
        rhos = [x for x in rhos if not math.isnan(x)]
        return float(np.mean(rhos)) if rhos else math.nan

    @property
    def mean_abs_error(self) -> float:
        """Mean |predicted - simulated| / simulated over every simulated candidate."""
        errs = [abs(p - c) / c for r in self._searched() for _, p, c in r.candidates if c]
        return float(np.mean(errs)) if errs else math.nan

    @property
    def simulated_cycles(self) -> int:
        return sum(r.simulated_cycles for r in self.records)

    @property
    def analytic_cycles(self) -> int:
        return sum(r.analytic_cycles for r in self.records)

    def table(self) -> str:
        """Per layer: the schedule kept, its predicted and simulated cycles, the analytic pick's
        simulated cycles and what tuning saved; then the model's accuracy."""
        def sched(d: Mapping[str, int]) -> str:
            return " ".join(f"{k}={v}" for k, v in d.items())

        head = (f"{'layer':<20} {'kind':<8} {'schedule (tuned)':<34} {'predicted':>9} "
                f"{'simulated':>9} {'error':>6} {'analytic':>9} {'gain':>6} {'tried':>7}")
        lines = [head, "-" * len(head)]
        for r, again in zip(self.records, self.reused, strict=True):
            err = (r.predicted_cycles - r.simulated_cycles) / r.simulated_cycles
            tried = "same" if again else f"{len(r.candidates)}/{r.searched}"
            lines.append(f"{r.layer:<20.20} {r.kind:<8} {sched(r.schedule):<34} "
                         f"{r.predicted_cycles:>9} {r.simulated_cycles:>9} {err:>+6.1%} "
                         f"{r.analytic_cycles:>9} {r.gain:>6.1%} {tried:>7}")
        total, analytic = self.simulated_cycles, self.analytic_cycles
        gain = 1 - total / analytic if analytic else 0.0
        lines.append("-" * len(head))
        predicted = sum(r.predicted_cycles for r in self.records)
        lines.append(f"{'total':<20} {'':<8} {'':<34} {predicted:>9} {total:>9} {'':>6} "
                     f"{analytic:>9} {gain:>6.1%}")
        rho = self.rank_correlation
        lines.append(f"analytic model over the simulated candidates: rank correlation "
                     f"{'n/a' if math.isnan(rho) else f'{rho:.3f}'} (Spearman, mean over layers "
                     f"with 3 or more), mean |error| {self.mean_abs_error:.1%}; "
                     f"{self.seconds:.1f} s")
        return "\n".join(lines)


Progress = Callable[[int, int, TuneRecord], None]


def tune_graph(g: Graph, cfg: HwConfig, *, top_k: int | None = 6,
               progress: Progress | None = None) -> TuneReport:
    """`tune_layer` for every accelerator layer of the integer graph `g` (a layer with the key of
    an earlier one takes its result). ``progress(done, total, record)`` after each layer."""
    from . import requant_programs  # not at the top: the package imports this module

    t0 = time.perf_counter()
    layers, _ = find_layers(g, cfg)
    report = TuneReport(cfg.hash)
    done: dict[str, TuneRecord] = {}
    for i, L in enumerate(layers):
        rqs = requant_programs(L, cfg)
        kid = _key_id(layer_key(L, rqs))
        again = kid in done
        if again:
            rec = dataclasses.replace(done[kid], layer=L.name)
        else:
            try:
                rec = tune_layer(L, rqs, cfg, top_k)
            except NoSchedule:  # compile leaves it to the CPU too
                continue
            done[kid] = rec
        report.records.append(rec)
        report.reused.append(again)
        if progress is not None:
            progress(i + 1, len(layers), rec)
    report.seconds = time.perf_counter() - t0
    return report


def tune_model(model: Any, *, config: str | HwConfig | dict = "default",
               log: str | os.PathLike[str] | None = None, calib: Any = None,
               quantize: Any = True, top_k: int | None = 6, batch_size: int = 1,
               progress: Progress | None = None) -> TuneReport:
    """Tune the schedules of an ONNX model's accelerator layers (see the module docstring).

    The model is imported, quantised (`quantize`: True or a `compiler.quantize.QuantOptions`,
    with `calib` data; False for a model already quantised, e.g. QDQ) and optimised as
    `compile.lower_model` does. With `log`, the records are merged into that JSON-lines file
    (created if missing; records of other layers and configurations are kept, those with the
    same key and configuration replaced); compile with ``options={"tuning_log": log}`` to use
    them. `top_k`: how many of the best-predicted tilings per layer to simulate (None: all).
    ``progress(done, total, record)`` is called after each layer."""
    from ...frontend.onnx import import_onnx
    from ...pipeline import optimize
    from . import resolve_config

    cfg = resolve_config(config)
    existing = None
    if log is not None and os.path.exists(log):
        existing = TuningLog.load(log)  # a corrupt log fails before the work
    g = import_onnx(model, batch_size=batch_size)
    if quantize:
        from ...quantize import QuantOptions, quantize_graph

        if calib is None:
            raise ValueError("tune: calibration data is required to quantise (calib=...: a "
                             ".npz, a directory of .npy files or an iterable of arrays), or "
                             "quantize=False for a model already quantised")
        qopts = quantize if isinstance(quantize, QuantOptions) else QuantOptions()
        g, _ = quantize_graph(g, calib, qopts)
    report = tune_graph(optimize(g), cfg, top_k=top_k, progress=progress)
    if log is not None:
        out = existing or TuningLog(os.fspath(log))
        for r, again in zip(report.records, report.reused, strict=True):
            if not again:
                out.add(r)
        out.save(log)
        report.log = os.fspath(log)
    return report
