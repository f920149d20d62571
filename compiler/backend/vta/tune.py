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

The log is data from a file: reading it checks every field of every record against a strict
schema (`_RecordSchema`: no missing or unknown field, integers where integers are due and no
NaN, Infinity, boolean or float in their place, every integer within int64) and refuses
anything else, JSON nested too deeply or an integer too long to convert included, with a
`ValueError` naming the file, the line, the field, what it holds and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import reprlib
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
from .codegen import LayerCode, emit_layer
from .layers import ConvLayer, Layer, PoolLayer, find_layers, operand_dims
from .requant import RequantProgram
from .schedule import (
    ConvSchedule,
    NoSchedule,
    RowSchedule,
    Schedule,
    candidates,
    fits,
    schedule_from_json,
)

__all__ = ["LOG_VERSION", "layer_key", "TuneRecord", "TuningLog", "read_log", "buffer_shapes",
           "simulate", "tune_layer", "tune_graph", "tune_model", "TuneReport", "spearman"]

LOG_VERSION = 1
_FIELDS = ("version", "key", "config_hash", "layer", "schedule", "predicted_cycles",
           "simulated_cycles", "analytic", "candidates", "searched")
_MAX_INT = (1 << 63) - 1  # every integer of a record is an int64 (numpy, the cycle counters)
_SCHEDULE_OF = {"conv2d": ConvSchedule, "dense": ConvSchedule, "max_pool": RowSchedule,
                "avg_pool": RowSchedule, "add": RowSchedule}  # a layer kind's tiling class
_HASH = re.compile(r"[0-9a-f]{8}")  # HwConfig.hash


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

    def __post_init__(self) -> None:
        if not self.analytic:  # no analytic pick recorded: the kept schedule stands for it
            self.analytic = {"schedule": dict(self.schedule),
                             "predicted_cycles": self.predicted_cycles,
                             "simulated_cycles": self.simulated_cycles}

    @classmethod
    def from_json(cls, d: Any, where: str) -> TuneRecord:
        """A record from its parsed JSON object, every field checked against the schema (see
        `_RecordSchema`); `ValueError` prefixed with `where` (file, line) naming the field,
        what it holds and what was expected."""
        return _RecordSchema(where).record(d)


def _show(v: Any) -> str:
    """`v` for an error message, short whatever it is (a huge integer, a deep nest, a long
    string), with JSON's names for the constants Python's json reads."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"{'true' if v else 'false'} (a boolean)"
    if isinstance(v, int):
        return repr(v) if abs(v) <= _MAX_INT else f"an integer of {v.bit_length()} bits"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return ("-Infinity" if v < 0 else "Infinity") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return f"the string {_REPR.repr(v)}"
    return _REPR.repr(v)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring = 3, 6, 6, 40
_REPR.maxlong = _REPR.maxother = 40


class _RecordSchema:
    """The tuning record's schema, checked field by field without recursion (so no nest a file
    holds can overflow the stack)::

        version           1 (an integer; ``true`` is not one)
        key               kind: "conv2d" | "dense" | "max_pool" | "avg_pool" | "add";
                          inputs: [[N, C, H, W]] (two for an add), output: [N, C, H, W]
                          (integers >= 1); kernel, strides: [KH, KW] (>= 1), pads: [4 ints
                          >= 0], all three for every kind but add; requant (optional): a
                          non-empty list of {imm_steps, row_steps, rows} (>= 0)
        config_hash       8 lower-case hex digits (`HwConfig.hash`)
        layer             a string
        schedule          the kind's tiling (`ConvSchedule` / `RowSchedule` fields, those
                          without a default required), integers >= 1
        predicted_cycles, simulated_cycles   integers >= 1
        analytic          {schedule, predicted_cycles, simulated_cycles} as above
        candidates        a list of [schedule, predicted_cycles, simulated_cycles] as above
        searched          an integer >= 0

    No other field, every integer at most 2**63-1, and no float (not even 3.0), NaN or
    Infinity where an integer is due.
    """

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, got: Any, want: str) -> ValueError:
        return ValueError(f"{self.where}: {path} is {_show(got)}; expected {want}")

    def fields(self, v: Any, path: str, required: Sequence[str], optional: Sequence[str] = ()
               ) -> dict[str, Any]:
        """`v` as an object with every `required` field and no other than the `optional`."""
        want = ", ".join(required) + (f" and optionally {', '.join(optional)}" if optional
                                      else "")
        if not isinstance(v, dict):
            raise self.fail(path, v, f"an object with {want}")
        missing = [f for f in required if f not in v]
        extra = [f for f in v if f not in required and f not in optional]
        if missing or extra:
            what = [f"no {', '.join(map(repr, missing))}"] if missing else []
            if extra:
                what.append(f"the unknown field{'s' if len(extra) > 1 else ''} "
                            f"{', '.join(_REPR.repr(f) for f in extra[:4])}"
                            + (" ..." if len(extra) > 4 else ""))
            raise ValueError(f"{self.where}: {path} has {' and '.join(what)} (expected an "
                             f"object with {want})")
        return v

    def integer(self, v: Any, path: str, lo: int) -> int:
        if type(v) is not int or not lo <= v <= _MAX_INT:  # type(): a bool is an int too
            raise self.fail(path, v, f"an integer from {lo} to 2**63-1")
        return v

    def ints(self, v: Any, path: str, n: int, lo: int, what: str) -> list[int]:
        if not isinstance(v, list) or len(v) != n:
            raise self.fail(path, v, f"a list of {n} integers >= {lo} ({what})")
        return [self.integer(x, f"{path}[{i}]", lo) for i, x in enumerate(v)]

    def string(self, v: Any, path: str, want: str = "a string",
               pattern: re.Pattern[str] | None = None) -> str:
        if not isinstance(v, str) or (pattern is not None and not pattern.fullmatch(v)):
            raise self.fail(path, v, want)
        return v

    def key(self, v: Any) -> dict[str, Any]:
        kinds = f"one of {', '.join(map(repr, _SCHEDULE_OF))}"
        kind = self.fields(v, "key", ("kind", "inputs", "output"),
                           ("kernel", "strides", "pads", "requant"))["kind"]
        if not isinstance(kind, str) or kind not in _SCHEDULE_OF:
            raise self.fail("key.kind", kind, kinds)
        windowed = ("kernel", "strides", "pads") if kind != "add" else ()
        self.fields(v, f"key (of {kind!r})", ("kind", "inputs", "output") + windowed,
                    ("requant",))
        if windowed:
            self.ints(v["kernel"], "key.kernel", 2, 1, "KH, KW")
            self.ints(v["strides"], "key.strides", 2, 1, "SH, SW")
            self.ints(v["pads"], "key.pads", 4, 0, "top, left, bottom, right")
        n_in = 2 if kind == "add" else 1
        ins = v["inputs"]
        if not isinstance(ins, list) or len(ins) != n_in:
            raise self.fail("key.inputs", ins, f"a list of {n_in} [N, C, H, W] (of {kind!r})")
        for i, x in enumerate(ins):
            self.ints(x, f"key.inputs[{i}]", 4, 1, "N, C, H, W")
        self.ints(v["output"], "key.output", 4, 1, "N, C, H, W")
        if "requant" in v:
            rqs = v["requant"]
            if not isinstance(rqs, list) or not rqs:
                raise self.fail("key.requant", rqs, "a non-empty list of {imm_steps, "
                                "row_steps, rows}")
            for i, r in enumerate(rqs):
                for f, x in self.fields(r, f"key.requant[{i}]",
                                        ("imm_steps", "row_steps", "rows")).items():
                    self.integer(x, f"key.requant[{i}].{f}", 0)
        return v

    def schedule(self, v: Any, path: str, kind: str) -> dict[str, int]:
        """A tiling of the layer kind's class: the fields `schedule_from_json` takes."""
        cls = _SCHEDULE_OF[kind]
        fs = dataclasses.fields(cls)
        required = [f.name for f in fs if f.default is dataclasses.MISSING]
        optional = [f.name for f in fs if f.default is not dataclasses.MISSING]
        v = self.fields(v, f"{path} (a {cls.__name__})", required, optional)
        return {f: self.integer(x, f"{path}.{f}", 1) for f, x in v.items()}

    def record(self, d: Any) -> TuneRecord:
        if not isinstance(d, dict):
            raise ValueError(f"{self.where}: a JSON {_json_type(d)}, not an object (expected a "
                             f"tuning record: one JSON object per line with "
                             f"{', '.join(_FIELDS)})")
        version = d.get("version")
        if type(version) is int and version != LOG_VERSION:  # before the fields: they may differ
            raise ValueError(f"{self.where}: tuning-log version {_show(version)}; expected "
                             f"version {LOG_VERSION}, the one this vtakit reads (re-run the "
                             f"tuning)")
        missing = [f for f in _FIELDS if f not in d]
        if missing:
            raise ValueError(f"{self.where}: no {', '.join(repr(m) for m in missing)} (expected "
                             f"a tuning record: one JSON object per line with "
                             f"{', '.join(_FIELDS)})")
        self.fields(d, "the record", _FIELDS)
        if type(version) is not int:
            raise self.fail("version", version, f"the integer {LOG_VERSION}")
        key = self.key(d["key"])
        kind = key["kind"]
        config_hash = self.string(d["config_hash"], "config_hash",
                                  "8 lower-case hex digits (HwConfig.hash)", _HASH)
        layer = self.string(d["layer"], "layer")
        sch = self.schedule(d["schedule"], "schedule", kind)
        predicted = self.integer(d["predicted_cycles"], "predicted_cycles", 1)
        simulated = self.integer(d["simulated_cycles"], "simulated_cycles", 1)
        a = self.fields(d["analytic"], "analytic",
                        ("schedule", "predicted_cycles", "simulated_cycles"))
        analytic = {"schedule": self.schedule(a["schedule"], "analytic.schedule", kind),
                    "predicted_cycles": self.integer(a["predicted_cycles"],
                                                     "analytic.predicted_cycles", 1),
                    "simulated_cycles": self.integer(a["simulated_cycles"],
                                                     "analytic.simulated_cycles", 1)}
        triple = "[schedule, predicted_cycles, simulated_cycles]"
        if not isinstance(d["candidates"], list):
            raise self.fail("candidates", d["candidates"], f"a list of {triple}")
        cands = []
        for i, c in enumerate(d["candidates"]):
            if not isinstance(c, list) or len(c) != 3:
                raise self.fail(f"candidates[{i}]", c, triple)
            cands.append((self.schedule(c[0], f"candidates[{i}][0]", kind),
                          self.integer(c[1], f"candidates[{i}][1]", 1),
                          self.integer(c[2], f"candidates[{i}][2]", 1)))
        searched = self.integer(d["searched"], "searched", 0)
        return TuneRecord(key, config_hash, layer, sch, predicted, simulated, analytic, cands,
                          searched)


def _json_type(v: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
             type(None): "null"}
    return names.get(type(v), type(v).__name__)


class _Repeated(ValueError):
    """A JSON object naming a field twice (json would keep the last one silently)."""


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Repeated(f"the field {_REPR.repr(k)} twice in one object (expected each "
                                f"field once)")
            seen.add(k)
    return d


def _parse(text: str, where: str) -> Any:
    """One line of a log as JSON; `ValueError` naming `where` for anything json refuses or
    cannot hold (a nest deeper than the stack, an integer of more digits than Python converts,
    a field named twice)."""
    try:
        return json.loads(text, object_pairs_hook=_no_repeats)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise ValueError(f"{where}: not a tuning record (JSON nested too deeply to read; "
                         f"expected a record, whose fields nest 4 levels at most)") from None
    except _Repeated as e:
        raise ValueError(f"{where}: {e}") from None
    except ValueError as e:  # an integer literal of more digits than Python converts
        raise ValueError(f"{where}: not a tuning record ({e}; expected integers up to "
                         f"2**63-1)") from None


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
            rec = TuneRecord.from_json(_parse(text, where), where)
            rec.line = n
            log.add(rec)
        return log

    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Write the records, one JSON object a line, replacing the file in one step."""
        p = os.fspath(path if path is not None else self.path or "")
        if not p:
            raise ValueError("TuningLog.save: no path (the log was not read from a file)")
        for i, r in enumerate(self.records, 1):  # what is written reads back
            TuneRecord.from_json(r.to_json(), f"TuningLog.save({p}): record {i} ({r.layer!r})")
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


def buffer_shapes(L: Layer, cfg: HwConfig) -> list[tuple[int, ...]]:
    """The packed shapes of layer `L`'s input buffers and then its output buffer, as `compile`
    allocates them (an im2col input as its patches, not its host value: `operand_dims`)."""
    return [act_shape(cfg, *operand_dims(x, cfg)) for x in L.inputs + [L.out]]


def simulate(L: Layer, s: Schedule, rqs: Sequence[RequantProgram], cfg: HwConfig,
             seed: int = 0) -> tuple[int, np.ndarray]:
    """Cycles of layer `L` with tiling `s` as a stream of its own on a fresh `SimDevice`
    (inputs random int8 from `seed`, the layer's real weights and constants), and the packed
    output it leaves. A fresh device places the buffers alike for every schedule."""
    shapes = buffer_shapes(L, cfg)
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


def _check_top_k(top_k: Any) -> None:
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool)):
        raise TypeError(f"tune: top_k={top_k!r} (a {type(top_k).__name__}); expected an int "
                        f">= 1 or None (all tilings)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"tune: top_k={top_k}; expected an int >= 1 or None (all tilings)")


def tune_layer(L: Layer, rqs: Sequence[RequantProgram], cfg: HwConfig, top_k: int | None = 6
               ) -> TuneRecord:
    """Simulate the `top_k` tilings of `L` the analytic model ranks best (all with None) and
    keep the fastest (the analytic pick on a tie). `NoSchedule` if none fits."""
    _check_top_k(top_k)
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

    _check_top_k(top_k)  # before any work
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
