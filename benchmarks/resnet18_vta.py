"""Models on the simulated accelerator: ResNet-18 and MobileNetV2 (224x224, batch 1, seeded
weights, default preset), measured in one run.

    .venv/bin/python benchmarks/resnet18_vta.py [--config default] [--models resnet18 mobilenet_v2]
                                                [--calib 2] [--tuning-log FILE]
                                                [--quant-mode fixed|shift]
                                                [--model ours|ort-quint8|ort-qint8 ...]

Prints per model:
- compile time (quantise excluded, tiling search included) and the CPU-int8 check (the
  accelerator's output must equal the CPU's bit for bit);
- total accelerator cycles of one inference (each region as one stream) and the wall time of the
  cycle-accurate simulation; the ratio against VTA's published RTL figure for ResNet-18
  (7.73 M cycles for the offloaded part) and against the 256-MAC/cycle bound;
- per offloaded layer (each layer run alone): cycles, MAC utilisation against the bound, the
  instruction set's floor for the layer (`schedule.compute_floor`: the compute unit's GEMM,
  reset and requantisation cycles, which no tiling can beat) and the share of the cycles it
  is, DRAM bytes read and written, and the tiling;
- for ResNet-18, the part VTA offloads (its graph packing starts after the max pool and stops
  at the global average pool: the four stages of residual blocks) against VTA's figure.
- the nodes left on the CPU, grouped by reason.
Targets (ResNet-18): <= 7.3 M cycles offloaded, >= 90% utilisation on every 3x3 convolution,
compile <= 30 s, simulation <= 5 s.

`--model ort-quint8` / `ort-qint8` (or both): the model as users quantise it, measured after
ours (our quantiser's symmetric int8 form, `ours`, the default and the only one without the
option) in the same run: onnxruntime's `quant_pre_process` then `quantize_static` (QDQ, QUInt8
or QInt8 activations with their zero points, QInt8 per-channel weights, MinMax on the same
calibration images; `ort_models.py`), imported as a file (compile time: import, graph passes
and lowering with the tiling search). The same figures for it, then against the symmetric
form: the share of its offloaded MACs that the onnxruntime model offloads (target >= 99 %),
the cycles of its accelerator streams over theirs (target <= 1.03), and the CPU-int8 check of
its outputs (the CPU path compiling the same onnxruntime file).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

VTA_RESNET18_CYCLES = 7.73e6  # VTA's published RTL figure (offloaded part), vta-reference.md


@dataclass
class _Run:
    """One quantised model compiled for the accelerator and run on the simulator."""

    label: str
    t_quant: float
    t_compile: float
    same: bool
    regions: int
    fallback: dict[str, str]
    total: int  # cycles of one inference, each region as one stream
    t_sim: float
    layers: list[Any]  # runtime.vta.LayerRun, each layer alone
    floors: dict[str, int]
    sched: dict[str, Any]

    @property
    def macs(self) -> int:
        return sum(lr.macs for lr in self.layers)


def _run(label: str, qg: Any, cpu_plan: Any, options: dict, cfg: Any, x: np.ndarray,
         t_quant: float, t_lower: float = 0.0) -> _Run:
    """Lower the integer graph `qg` for the accelerator (timed, plus `t_lower` already spent
    making it), run it on the simulator and `cpu_plan` (its CPU-int8 form) on `x`, and profile
    every layer alone."""
    from vtakit.compiler.backend.vta import requant_programs
    from vtakit.compiler.backend.vta.layers import find_layers
    from vtakit.compiler.backend.vta.schedule import compute_floor
    from vtakit.compiler.lowering import lower_graph
    from vtakit.runtime.executor import GraphExecutor

    t0 = time.perf_counter()
    plan, _ = lower_graph(qg, "vta", options)
    t_compile = t_lower + time.perf_counter() - t0
    ec, ev = GraphExecutor(cpu_plan), GraphExecutor(plan)
    try:
        ec.set_input(0, x)
        ec.run()
        ev.set_input(0, x)
        t0 = time.perf_counter()
        ev.run()
        t_sim = time.perf_counter() - t0
        same = np.array_equal(ec.get_output(0), ev.get_output(0))
        runner = ev.runners["vta"]
        total = sum(r.cycles for r in runner.last_runs if r is not None)
        ev.profile()
        layers = list(runner.layer_runs)
    finally:
        ev.close()
    floors = {L.name: compute_floor(L, requant_programs(L, cfg), cfg)
              for L in find_layers(qg, cfg)[0]}
    meta = plan.sections["vta"].meta
    sched = {lm["name"]: lm["schedule"] for r in meta["regions"] for lm in r["layers"]}
    return _Run(label, t_quant, t_compile, same, len(meta["regions"]),
                dict(meta["cpu_fallback"]), total, t_sim, layers, floors, sched)


def _ours(model: Any, calib: list[np.ndarray], x: np.ndarray, options: dict, cfg: Any,
          mode: str) -> _Run:
    """Our own quantiser's model (symmetric int8 activations)."""
    from vtakit.compiler.compile import lower_model
    from vtakit.compiler.frontend.onnx import import_onnx
    from vtakit.compiler.pipeline import optimize
    from vtakit.compiler.quantize import QuantOptions, quantize_graph

    g = import_onnx(model)
    t0 = time.perf_counter()
    qopts = QuantOptions(mode=mode)
    qg = optimize(quantize_graph(g, calib, qopts)[0])
    t_quant = time.perf_counter() - t0
    cpu_plan = lower_model(model, target="cpu", quantize=qopts, calib=calib)
    return _run(f"ours ({mode} requantisation)", qg, cpu_plan, options, cfg, x, t_quant)


def _ort(model: Any, calib: list[np.ndarray], x: np.ndarray, options: dict, cfg: Any,
         activation: str) -> _Run:
    """The model as onnxruntime's quantize_static makes it (QDQ, `activation` activations,
    QInt8 per-channel weights, after quant_pre_process), imported like any ONNX file: its
    compile time is the import, the graph passes and the lowering with the tiling search."""
    from ort_models import ort_quantize  # type: ignore[import-not-found]

    from vtakit.compiler.compile import lower_model
    from vtakit.compiler.frontend.onnx import import_onnx
    from vtakit.compiler.pipeline import optimize

    t0 = time.perf_counter()
    q = ort_quantize(model, calib, activation=activation)
    t_quant = time.perf_counter() - t0
    t0 = time.perf_counter()
    qg = optimize(import_onnx(q))
    t_import = time.perf_counter() - t0
    cpu_plan = lower_model(q, target="cpu")
    return _run(f"onnxruntime quantize_static QDQ, {activation} activations, QInt8 per-channel "
                f"weights", qg, cpu_plan, options, cfg, x, t_quant, t_import)


def _print(name: str, r: _Run, cfg: Any, quantiser: str) -> None:
    layers, total = r.layers, r.total
    mpc = cfg.batch * cfg.block_in * cfg.block_out
    print(f"\n== {name} on {cfg.bitstream_name} ({cfg.clock_mhz} MHz, {mpc} MACs/cycle): "
          f"{r.label}")
    print(f"{quantiser} {r.t_quant:.1f} s, compile with search {r.t_compile:.1f} s "
          f"(target <= 30 s)")
    print(f"accelerator == CPU-int8: {'yes' if r.same else 'NO (bug)'}; "
          f"{r.regions} region(s), {len(layers)} layers offloaded, "
          f"{len(r.fallback)} left on the CPU")
    bound = r.macs / mpc
    print(f"cycles {total:,} ({total / cfg.clock_mhz / 1e3:.2f} ms at {cfg.clock_mhz} MHz); "
          f"MAC bound {bound:,.0f} -> utilisation {bound / max(total, 1):.1%}; "
          f"simulated in {r.t_sim:.2f} s (target <= 5 s)")
    floor = sum(r.floors.get(lr.name, 0) for lr in layers)
    print(f"instruction-set floor {floor:,} cycles ({bound / max(floor, 1):.1%} of the MAC "
          f"bound at best); these streams take {floor / max(total, 1):.1%} of their time there")
    kinds = [lr.kind for lr in layers]
    if name == "resnet18" and "max_pool" in kinds and "add" in kinds:
        first = kinds.index("max_pool") + 1
        last = len(kinds) - kinds[::-1].index("add")  # through the last residual add
        part = layers[first:last]
        pc = sum(lr.cycles for lr in part)
        pf = sum(r.floors.get(lr.name, 0) for lr in part)
        pb = sum(lr.macs for lr in part) / mpc
        print(f"VTA's offloaded part (layers {first}..{last - 1}: the residual stages, each layer "
              f"alone): {pc:,} cycles vs VTA's published {VTA_RESNET18_CYCLES / 1e6:.2f} M: "
              f"{pc / VTA_RESNET18_CYCLES:.2f}x (target 7.3 M = "
              f"{7.3e6 / VTA_RESNET18_CYCLES:.2f}x); MAC bound {pb:,.0f}, floor {pf:,}")
    nw = min(max([22] + [len(lr.name) + 1 for lr in layers]), 40)
    print(f"{'layer':<{nw}}{'kind':<10}{'cycles':>11}{'util':>8}{'floor':>11}{'at floor':>9}"
          f"{'read B':>11}{'write B':>10}  tiling")
    for lr in layers:
        st = lr.stats
        rd = sum(getattr(st, "dram_read_bytes", {}).values()) if st is not None else 0
        wr = getattr(st, "dram_write_bytes", 0) if st is not None else 0
        util = lr.macs / mpc / max(lr.cycles, 1)
        fl = r.floors.get(lr.name, 0)
        print(f"{lr.name[:nw - 1]:<{nw}}{lr.kind:<10}{lr.cycles:>11,}{util:>8.1%}{fl:>11,}"
              f"{fl / max(lr.cycles, 1):>9.1%}{rd:>11,}{wr:>10,}  {r.sched.get(lr.name)}")
    print(f"sum of per-layer cycles {sum(lr.cycles for lr in layers):,} (one stream per region: "
          f"{total:,})")
    _print_fallback(r.fallback)


def _print_fallback(fallback: dict[str, str]) -> None:
    """The nodes left to the CPU, grouped by reason."""
    if not fallback:
        print("left on the CPU: none")
        return
    by_reason: dict[str, list[str]] = {}
    for node, why in fallback.items():
        by_reason.setdefault(why, []).append(node)
    print(f"left on the CPU ({len(fallback)}):")
    for why, nodes in by_reason.items():
        shown = ", ".join(nodes[:4]) + (f", ... ({len(nodes)} in all)" if len(nodes) > 4 else "")
        print(f"  {why}: {shown}")


def _compare(name: str, ort: _Run, ours: _Run) -> None:
    """The onnxruntime model against the symmetric form, measured in the same run."""
    share = ort.macs / max(ours.macs, 1)
    ratio = ort.total / max(ours.total, 1)
    kinds = lambda r: ", ".join(f"{k} {sum(lr.kind == k for lr in r.layers)}"  # noqa: E731
                                for k in dict.fromkeys(lr.kind for lr in r.layers))
    print(f"\n== {name}: {ort.label} against ours (symmetric), same run")
    print(f"offloaded MACs {ort.macs:,} of ours' {ours.macs:,}: {share:.2%} (target >= 99 %); "
          f"layers offloaded {len(ort.layers)} ({kinds(ort)}) vs {len(ours.layers)} "
          f"({kinds(ours)}); regions {ort.regions} vs {ours.regions}")
    print(f"accelerator cycles {ort.total:,} vs {ours.total:,}: {ratio:.3f}x (target <= 1.03)")
    print(f"compile with search {ort.t_compile:.1f} s vs {ours.t_compile:.1f} s "
          f"(target <= 30 s{' for ResNet-18' if name != 'resnet18' else ''}); "
          f"accelerator == CPU-int8 on one input: {'yes' if ort.same else 'NO (bug)'}")
    print(f"left on the CPU: {len(ort.fallback)} vs {len(ours.fallback)}")


def _bench(name: str, config: str, n_calib: int, tuning_log: str | None, mode: str,
           which: list[str]) -> None:
    from vtakit import models
    from vtakit.compiler.backend.vta import resolve_config
    from vtakit.compiler.frontend.onnx import import_onnx

    cfg = resolve_config(config)
    model = getattr(models, name)()
    shape = import_onnx(model).inputs[0].shape
    rng = np.random.default_rng(0)
    calib = [rng.standard_normal(shape).astype(np.float32) for _ in range(n_calib)]
    x = rng.standard_normal(shape).astype(np.float32)
    options = {"config": config, **({"tuning_log": tuning_log} if tuning_log else {})}
    ours = _ours(model, calib, x, options, cfg, mode)
    _print(name, ours, cfg, "quantise")
    from ort_models import ACTIVATIONS  # type: ignore[import-not-found]

    for w in dict.fromkeys(which):
        if w == "ours":
            continue
        ort = _ort(model, calib, x, options, cfg, ACTIVATIONS[w])
        _print(name, ort, cfg, "onnxruntime quant_pre_process + quantize_static")
        _compare(name, ort, ours)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default")
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2"])
    ap.add_argument("--calib", type=int, default=2, help="calibration images")
    ap.add_argument("--tuning-log", default=None)
    ap.add_argument("--model", nargs="+", choices=["ours", "ort-quint8", "ort-qint8"],
                    default=["ours"],
                    help="ours: our quantiser's model only; ort-*: also the model as "
                         "onnxruntime's quantize_static makes it (uint8 or int8 activations), "
                         "each compared with ours, measured once in the same run")
    ap.add_argument("--quant-mode", choices=["fixed", "shift"], default="fixed",
                    help="fixed: per-channel fixed-point multipliers (the default); shift: "
                         "power-of-two scales, VTA's")
    args = ap.parse_args()
    for name in args.models:
        _bench(name, args.config, args.calib, args.tuning_log, args.quant_mode, args.model)


if __name__ == "__main__":
    main()
