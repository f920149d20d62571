"""Models on the simulated accelerator: ResNet-18 and MobileNetV2 (224x224, batch 1, seeded
weights, default preset), measured in one run.

    .venv/bin/python benchmarks/resnet18_vta.py [--config default] [--models resnet18 mobilenet_v2]
                                                [--calib 2] [--tuning-log FILE]
                                                [--quant-mode fixed|shift]

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
Targets (ResNet-18): <= 7.3 M cycles offloaded, >= 90% utilisation on every 3x3 convolution,
compile <= 30 s, simulation <= 5 s.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

VTA_RESNET18_CYCLES = 7.73e6  # VTA's published RTL figure (offloaded part), vta-reference.md


def _bench(name: str, config: str, n_calib: int, tuning_log: str | None, mode: str) -> None:
    from vtakit import models
    from vtakit.compiler.backend.vta import requant_programs, resolve_config
    from vtakit.compiler.backend.vta.layers import find_layers
    from vtakit.compiler.backend.vta.schedule import compute_floor
    from vtakit.compiler.compile import lower_model
    from vtakit.compiler.frontend.onnx import import_onnx
    from vtakit.compiler.lowering import lower_graph
    from vtakit.compiler.pipeline import optimize
    from vtakit.compiler.quantize import QuantOptions, quantize_graph
    from vtakit.runtime.executor import GraphExecutor

    cfg = resolve_config(config)
    model = getattr(models, name)()
    g = import_onnx(model)
    rng = np.random.default_rng(0)
    calib = [rng.standard_normal(g.inputs[0].shape).astype(np.float32) for _ in range(n_calib)]
    t0 = time.perf_counter()
    qopts = QuantOptions(mode=mode)
    qg = optimize(quantize_graph(g, calib, qopts)[0])
    t_quant = time.perf_counter() - t0
    options = {"config": config, **({"tuning_log": tuning_log} if tuning_log else {})}
    t0 = time.perf_counter()
    plan, _ = lower_graph(qg, "vta", options)
    t_compile = time.perf_counter() - t0
    cpu_plan = lower_model(model, target="cpu", quantize=qopts, calib=calib)
    x = rng.standard_normal(g.inputs[0].shape).astype(np.float32)
    ec, ev = GraphExecutor(cpu_plan), GraphExecutor(plan)
    ec.set_input(0, x)
    ec.run()
    ev.set_input(0, x)
    t0 = time.perf_counter()
    ev.run()
    t_sim = time.perf_counter() - t0
    same = np.array_equal(ec.get_output(0), ev.get_output(0))
    floors = {L.name: compute_floor(L, requant_programs(L, cfg), cfg)
              for L in find_layers(qg, cfg)[0]}
    runner = ev.runners["vta"]
    total = sum(r.cycles for r in runner.last_runs if r is not None)
    ev.profile()
    layers = runner.layer_runs
    macs = sum(lr.macs for lr in layers)
    meta = plan.sections["vta"].meta
    sched = {lm["name"]: lm["schedule"] for r in meta["regions"] for lm in r["layers"]}
    mpc = cfg.batch * cfg.block_in * cfg.block_out
    print(f"\n== {name} on {cfg.bitstream_name} ({cfg.clock_mhz} MHz, {mpc} MACs/cycle), "
          f"{mode} requantisation")
    print(f"quantise {t_quant:.1f} s, compile with search {t_compile:.1f} s (target <= 30 s)")
    print(f"accelerator == CPU-int8: {'yes' if same else 'NO (bug)'}; "
          f"{len(meta['regions'])} region(s), {len(layers)} layers offloaded, "
          f"{len(meta['cpu_fallback'])} left on the CPU")
    bound = macs / mpc
    print(f"cycles {total:,} ({total / cfg.clock_mhz / 1e3:.2f} ms at {cfg.clock_mhz} MHz); "
          f"MAC bound {bound:,.0f} -> utilisation {bound / max(total, 1):.1%}; "
          f"simulated in {t_sim:.2f} s (target <= 5 s)")
    floor = sum(floors.get(lr.name, 0) for lr in layers)
    print(f"instruction-set floor {floor:,} cycles ({bound / max(floor, 1):.1%} of the MAC "
          f"bound at best); these streams take {floor / max(total, 1):.1%} of their time there")
    if name == "resnet18":
        kinds = [lr.kind for lr in layers]
        first = kinds.index("max_pool") + 1
        last = len(kinds) - kinds[::-1].index("add")  # through the last residual add
        part = layers[first:last]
        pc = sum(lr.cycles for lr in part)
        pf = sum(floors.get(lr.name, 0) for lr in part)
        pb = sum(lr.macs for lr in part) / mpc
        print(f"VTA's offloaded part (layers {first}..{last - 1}: the residual stages, each layer "
              f"alone): {pc:,} cycles vs VTA's published {VTA_RESNET18_CYCLES / 1e6:.2f} M: "
              f"{pc / VTA_RESNET18_CYCLES:.2f}x (target 7.3 M = "
              f"{7.3e6 / VTA_RESNET18_CYCLES:.2f}x); MAC bound {pb:,.0f}, floor {pf:,}")
    print(f"{'layer':<22}{'kind':<10}{'cycles':>11}{'util':>8}{'floor':>11}{'at floor':>9}"
          f"{'read B':>11}{'write B':>10}  tiling")
    for lr in layers:
        st = lr.stats
        rd = sum(getattr(st, "dram_read_bytes", {}).values()) if st is not None else 0
        wr = getattr(st, "dram_write_bytes", 0) if st is not None else 0
        util = lr.macs / mpc / max(lr.cycles, 1)
        fl = floors.get(lr.name, 0)
        print(f"{lr.name[:21]:<22}{lr.kind:<10}{lr.cycles:>11,}{util:>8.1%}{fl:>11,}"
              f"{fl / max(lr.cycles, 1):>9.1%}{rd:>11,}{wr:>10,}  {sched.get(lr.name)}")
    print(f"sum of per-layer cycles {sum(lr.cycles for lr in layers):,} (one stream per region: "
          f"{total:,})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default")
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2"])
    ap.add_argument("--calib", type=int, default=2, help="calibration images")
    ap.add_argument("--tuning-log", default=None)
    ap.add_argument("--quant-mode", choices=["fixed", "shift"], default="fixed",
                    help="fixed: per-channel fixed-point multipliers (the default); shift: "
                         "power-of-two scales, VTA's")
    args = ap.parse_args()
    for name in args.models:
        _bench(name, args.config, args.calib, args.tuning_log, args.quant_mode)


if __name__ == "__main__":
    main()
