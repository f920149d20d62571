"""Post-training int8 quantisation: a float graph and calibration data → the integer graph.

    qg, report = quantize_graph(g, calib, QuantOptions(mode="fixed"))

The integer graph (see `rewrite`) is what every int8 backend runs: the CPU backend computes it,
and the accelerator must equal the CPU's result bit for bit. Requantisation uses only the
accelerator ALU's operations (`requant`); the observers and the data formats are in
`calibrate`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.graph import Graph
from ..ir.interpreter import evaluate
from ..ir.ops import Node, Op
from ..ir.verify import verify
from ..pipeline import prepare_for_quantization
from .calibrate import OBSERVERS, load_calibration, observe_graph
from .requant import MODES, RequantError
from .rewrite import LayerReport, Rewriter

__all__ = ["QuantOptions", "QuantReport", "LayerReport", "quantize_graph", "load_calibration",
           "RequantError", "QuantizationWarning", "sqnr_db"]


@dataclass(frozen=True)
class QuantOptions:
    """mode: "fixed" (per-channel weights, fixed-point multipliers) or "shift" (power-of-two
    scales, VTA's); observer: for activations (weights always use min/max per channel);
    keep_float: node names to leave in float; min_sqnr_db: layers whose int8 output is worse
    than this against fp32 on the calibration data are kept in float (None: keep none);
    report_samples: calibration samples used for the report; clamp: saturate each
    accumulator before the multiply so that multipliers keep 15 bits (exact; off by default,
    see `requant.choose`)."""

    mode: str = "fixed"
    observer: str = "mse"
    keep_float: tuple[str, ...] = ()
    min_sqnr_db: float | None = None
    report_samples: int = 4
    clamp: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"quantisation mode {self.mode!r}; expected one of {MODES}")
        if self.observer not in OBSERVERS:
            raise ValueError(f"observer {self.observer!r}; expected one of {sorted(OBSERVERS)}")


@dataclass
class QuantReport:
    """Per layer: what was done and its SQNR (dB) against fp32; the outputs' top-1 agreement
    (fraction of report samples whose argmax over the last axis is the same) and SQNR."""

    layers: list[LayerReport]
    sqnr_db: dict[str, float] = field(default_factory=dict)
    mode: str = ""
    top1_agreement: float = float("nan")
    output_sqnr_db: float = float("nan")
    kept_for_loss: list[str] = field(default_factory=list)
    rewriter: Rewriter | None = field(default=None, repr=False)  # the scales, for qdq.to_qdq
    #: what the calibration data left undetermined (a tensor 0 on every sample); `table` ends
    #: with them, and `quantize_graph` issues each as a `QuantizationWarning`
    warnings: list[str] = field(default_factory=list)

    def table(self) -> str:
        lines = [f"{'layer':32s} {'op':16s} {'kind':20s} {'mode':6s} {'shift':>5s} "
                 f"{'mults':>5s} {'SQNR dB':>8s}"]
        for r in self.layers:
            q = self.sqnr_db.get(r.name)
            lines.append(f"{r.name[:32]:32s} {r.op[:16]:16s} {r.kind:20s} {r.mode:6s} "
                         f"{'' if r.shift is None else r.shift:>5} {r.multipliers or '':>5} "
                         f"{'' if q is None else f'{q:8.1f}':>8s}")
        lines.append(f"mode {self.mode}; outputs: SQNR {self.output_sqnr_db:.1f} dB, top-1 "
                     f"agreement {100 * self.top1_agreement:.1f}%")
        if self.kept_for_loss:
            lines.append(f"kept in float (SQNR below the limit): {self.kept_for_loss}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


class QuantizationWarning(UserWarning):
    """Something the calibration data left undetermined (see `QuantReport.warnings`)."""


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """Signal-to-quantisation-noise ratio of got against ref, in dB (inf when equal)."""
    ref = np.asarray(ref, np.float64)
    noise = float(np.sum((ref - np.asarray(got, np.float64)) ** 2))
    signal = float(np.sum(ref ** 2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(max(signal, 1e-30) / noise)


def quantize_graph(g: Graph, calib: Any, options: QuantOptions = QuantOptions(),
                   ) -> tuple[Graph, QuantReport]:
    """The integer graph of float graph `g` (as imported; the pre-quantisation passes run
    here) calibrated on `calib` (see `calibrate.load_calibration`), and its report.

    Calibration data no scale can be taken from (NaN or infinite values, an input that is 0 or
    denormal over all samples, magnitudes beyond what float32 models take, a model that
    overflows on the data) is a `ValueError` naming the file, the input or node and the
    sample; a tensor that is 0 on every sample is quantised and reported (`QuantReport.warnings`,
    and a `QuantizationWarning`)."""
    g = prepare_for_quantization(g)
    samples = load_calibration(calib, g)
    thresholds = observe_graph(g, samples, options.observer)
    names = {n.name for n in g.nodes}
    unknown = sorted(set(options.keep_float) - names)
    if unknown:
        raise ValueError(f"keep_float names {unknown}, which are not nodes of the graph "
                         f"(e.g. {sorted(n.name for n in g.nodes if n.op is Op.CONV)[:5]})")
    keep = frozenset(options.keep_float)
    rw = Rewriter(g, thresholds, options.mode, keep, options.clamp)
    qg = verify(rw.run())
    report = _report(g, qg, rw, samples[:options.report_samples])
    if options.min_sqnr_db is not None:
        bad = [k for k, v in report.sqnr_db.items() if v < options.min_sqnr_db]
        if bad:
            rw = Rewriter(g, thresholds, options.mode, keep | frozenset(bad), options.clamp)
            qg = verify(rw.run())
            report = _report(g, qg, rw, samples[:options.report_samples])
            report.kept_for_loss = bad
    report.rewriter = rw
    report.warnings = list(rw.warnings)
    for w in report.warnings:
        warnings.warn(w, QuantizationWarning, stacklevel=2)
    return qg, report


def _values(g: Graph, feed: Mapping[str, np.ndarray], wanted: set[int]) -> dict[int, Any]:
    values: dict[int, np.ndarray] = {}
    kept: dict[int, np.ndarray] = {}
    for n in g.nodes:
        values[id(n)] = np.asarray(feed[n.name]) if n.op is Op.INPUT else evaluate(
            n, [values[id(s)] for s in n.src])
        if id(n) in wanted:
            kept[id(n)] = values[id(n)]
    kept.update({id(n): values[id(n)] for n in g.outputs})
    return kept


def _report(g: Graph, qg: Graph, rw: Rewriter, samples: Sequence[Mapping[str, np.ndarray]],
            ) -> QuantReport:
    pairs: list[tuple[Node, Node, float, str]] = list(rw.mapping.values())
    ref_ids = {id(f) for f, _, _, _ in pairs}
    int_ids = {id(q) for _, q, _, _ in pairs}
    per: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    outs: list[tuple[np.ndarray, np.ndarray]] = []
    for feed in samples:
        fv = _values(g, feed, ref_ids)
        qv = _values(qg, feed, int_ids)
        for f, q, s, layer in pairs:
            if id(q) in qv:
                per.setdefault(layer, []).append((fv[id(f)], qv[id(q)].astype(np.float64) * s))
        for a, b in zip(g.outputs, qg.outputs):
            outs.append((fv[id(a)], qv[id(b)]))
    sq = {k: sqnr_db(np.concatenate([a.ravel() for a, _ in v]),
                     np.concatenate([b.ravel() for _, b in v])) for k, v in per.items()}
    agree = [float(np.argmax(a.reshape(-1, a.shape[-1]), -1).tolist()
                   == np.argmax(b.reshape(-1, b.shape[-1]), -1).tolist())
             for a, b in outs if a.ndim and a.dtype.kind == "f"]
    out_sq = sqnr_db(np.concatenate([a.ravel() for a, _ in outs]),
                     np.concatenate([b.ravel() for _, b in outs])) if outs else float("nan")
    return QuantReport(rw.layers, sq, rw.mode, float(np.mean(agree)) if agree else float("nan"),
                       out_sq)
