"""The accelerator backend: the integer graph's conv / dense / requantise / pool / residual-add
layers as instruction streams for the VTA core (``--target vta --option config=NAME``).

`lower` finds the layers the core can run (`layers.find_layers`), groups consecutive ones into
*regions*, chooses a tiling per layer (`schedule`), and records each region as one relocatable
instruction stream through the driver (`codegen`), plus one stream per layer for per-layer
profiling. Activations stay packed in device memory inside a region; only its inputs and outputs
cross to the host, packed and unpacked by the runtime (`driver.packing`). Everything else runs on
the CPU backend. See docs/vta.md.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vtakit.driver.devices.record import RecordDevice
from vtakit.driver.packing import act_shape, pack_conv_weights
from vtakit.driver.program import Program
from vtakit.driver.session import DeviceArray, Session
from vtakit.runtime.plan import Call, Section, Step
from vtakit.vta_hw.config import PRESETS, HwConfig, preset

from ...ir.graph import Graph
from ...ir.ops import Node, Op, RequantAttrs
from .. import PlanSection, register_backend
from .codegen import LayerCode, barrier, emit_layer
from .layers import (
    AddLayer,
    ConvLayer,
    Layer,
    PoolLayer,
    activation_frames,
    find_layers,
    node_dims,
    operand_dims,
)
from .requant import RequantProgram, requant_program
from .schedule import (
    ConvSchedule,
    NoSchedule,
    RowSchedule,
    Schedule,
    choose,
    fits,
    schedule_from_json,
)
from .tune import read_log

__all__ = ["VtaOptions", "lower", "resolve_config", "requant_programs"]


@dataclass(frozen=True)
class VtaOptions:
    """Options of the ``vta`` target.

    Parameters
    ----------
    config : str
        A preset name (``default``, ``ecp5``, ``ice40``, ``large``) or a JSON configuration file.
    per_layer : bool
        Also record one stream per layer (``profile()`` and ``vtakit compare`` run those to time
        each layer; a normal run uses one stream per region).
    schedules : dict
        Layer name -> tiling (the fields of `schedule.ConvSchedule` / `RowSchedule`), overriding
        the search and the tuning log.
    tuning_log : str or None
        A JSON-lines tuning log (`tune.tune_model`): a layer whose shape key and configuration
        hash it has a record for takes the record's schedule; the others the analytic model's
        choice. A missing or malformed file is an error naming it (and the line).
    """

    config: str = "default"
    per_layer: bool = True
    schedules: dict[str, dict[str, int]] = field(default_factory=dict)
    tuning_log: str | None = None

    def __post_init__(self) -> None:
        if self.tuning_log is not None and not isinstance(self.tuning_log, (str, os.PathLike)):
            raise TypeError(f"vta: tuning_log must be a path or None, got "
                            f"{type(self.tuning_log).__name__}")


def resolve_config(spec: str | HwConfig | dict) -> HwConfig:
    """A preset name, a JSON file's path, a dict or an `HwConfig`; `ValueError` otherwise."""
    if isinstance(spec, HwConfig):
        return spec.validate()
    if isinstance(spec, dict):
        return HwConfig.from_dict(spec).validate()
    if spec in PRESETS:
        return preset(spec)
    if os.path.exists(spec):
        with open(spec) as f:
            return HwConfig.from_json(f.read()).validate()
    raise ValueError(f"vta: unknown hardware configuration {spec!r} (expected a preset: "
                     f"{', '.join(PRESETS)}, or a .json file)")


def requant_programs(layer: Layer, cfg: HwConfig) -> tuple[RequantProgram, ...]:
    """The ALU programs of a layer's requantisations (a conv's; an add's two operands' and
    its sum's; an average pool's), in the order its code generator takes them."""
    if isinstance(layer, ConvLayer):
        assert layer.requant is not None
        return (requant_program(layer.requant, layer.bias, layer.out.c, cfg,
                                layer.acc_bound),)
    if isinstance(layer, AddLayer):
        ident = RequantAttrs((1,), (0,), 1, -(1 << 31), (1 << 31) - 1)
        return tuple(requant_program(r or ident, b, layer.out.c, cfg, bound)
                     for r, b, bound in ((layer.requant_a, None, None),
                                         (layer.requant_b, None, None),
                                         (layer.requant, layer.bias, layer.acc_bound)))
    if isinstance(layer, PoolLayer) and layer.requant is not None:
        return (requant_program(layer.requant, layer.bias, layer.out.c, cfg,
                                layer.acc_bound),)
    return ()


def _schedule(layer: Layer, rqs: tuple[RequantProgram, ...], cfg: HwConfig,
              opts: VtaOptions) -> Schedule:
    """`opts.schedules`' tiling for the layer's name, else the tuning log's for its shape and
    configuration, else the analytic model's choice (`NoSchedule` if nothing fits)."""
    fixed = opts.schedules.get(layer.name)
    if fixed:
        s = schedule_from_json(layer, fixed)
        if not fits(layer, s, rqs, cfg):
            raise ValueError(f"vta: schedules[{layer.name!r}] = {fixed} does not fit the "
                             f"buffers of {cfg.bitstream_name}")
        return s
    if opts.tuning_log is not None:
        logged = read_log(opts.tuning_log).schedule(layer, rqs, cfg)
        if logged is not None:
            return logged
    return choose(layer, rqs, cfg)


@dataclass
class _Region:
    layers: list[Layer]
    schedules: list[ConvSchedule | RowSchedule]
    rqs: list[tuple[RequantProgram, ...]]


def _regions(g: Graph, layers: list[Layer], schedules: dict[int, Any],
             rqs: dict[int, tuple[RequantProgram, ...]]) -> list[_Region]:
    """Maximal runs of layers with no CPU node between them in graph order."""
    owner = {id(n): k for k, L in enumerate(layers) for n in L.nodes}
    anchor = {id(L.out.node): k for k, L in enumerate(layers)}
    regions: list[_Region] = []
    cur: _Region | None = None
    for n in g.nodes:
        if id(n) in anchor:
            k = anchor[id(n)]
            if cur is None:
                cur = _Region([], [], [])
                regions.append(cur)
            cur.layers.append(layers[k])
            cur.schedules.append(schedules[k])
            cur.rqs.append(rqs[k])
        elif id(n) not in owner and n.op not in (Op.CONST, Op.INPUT):
            cur = None
    return regions


@register_backend("vta", options=VtaOptions)
def lower(g: Graph, opts: VtaOptions, plan: Any) -> PlanSection:
    """VTA instruction streams for the integer graph's conv, dense, pool and add layers."""
    cfg = resolve_config(opts.config)
    layers, why = find_layers(g, cfg)
    unknown = sorted(set(opts.schedules) - {L.name for L in layers})
    if unknown:
        raise ValueError(f"vta: schedules name {unknown}, which are not accelerator layers of "
                         f"this model (its layers: {[L.name for L in layers]})"[:600])
    kept: list[Layer] = []
    schedules: dict[int, Any] = {}
    rqs: dict[int, tuple[RequantProgram, ...]] = {}
    for L in layers:
        progs = requant_programs(L, cfg)
        try:
            sch = _schedule(L, progs, cfg, opts)
        except NoSchedule as e:
            why[L.name] = str(e)
            continue
        schedules[len(kept)], rqs[len(kept)] = sch, progs
        kept.append(L)
    regions = _regions(g, kept, schedules, rqs)
    frames = activation_frames(kept)
    position = {id(n): i for i, n in enumerate(g.nodes)}
    sess = Session(RecordDevice(cfg))
    params: dict[str, np.ndarray] = {}
    programs: dict[str, Program] = {}
    meta_regions = []
    taken: set[int] = set()
    for r, region in enumerate(regions):
        meta_regions.append(_lower_region(r, region, g, cfg, sess, plan, params, programs,
                                          opts.per_layer, frames))
        for L in region.layers:
            taken.update(position[id(n)] for n in L.nodes)
    sess.close()
    meta = {"config": cfg.to_dict(), "config_hash": cfg.hash, "regions": meta_regions,
            "cpu_fallback": why}

    def emit(sec: Section) -> dict[str, bytes]:
        live = sec.live
        out = {}
        for name, prog in live["programs"].items():
            buf = io.BytesIO()
            prog.save(buf)
            out[name] = buf.getvalue()
        buf = io.BytesIO()
        np.savez(buf, **live["params"])
        out["params.npz"] = buf.getvalue()
        return out

    section = Section(meta, live={"programs": programs, "params": params})
    return PlanSection("vta", frozenset(taken), section, emit=emit, hw_config=cfg.to_dict(),
                       hw_config_hash=cfg.hash)


def _lower_region(r: int, region: _Region, g: Graph, cfg: HwConfig, sess: Session, plan: Any,
                  params: dict[str, np.ndarray], programs: dict[str, Program],
                  per_layer: bool, frames: dict[int, tuple[int, int]]) -> dict[str, Any]:
    prefix = f"r{r}."
    produced = {id(L.out.node): L for L in region.layers}
    inside = {id(n) for L in region.layers for n in L.nodes}
    users = g.users()
    graph_outputs = {id(n) for n in g.outputs}
    arrays: dict[str, DeviceArray] = {}
    slots: dict[str, dict[str, Any]] = {}
    act_slot: dict[int, str] = {}
    inputs_meta: list[dict[str, Any]] = []
    outputs_meta: list[dict[str, Any]] = []

    def alloc(name: str, shape: tuple[int, ...], dtype: str, param: bool) -> str:
        slot = prefix + name
        arrays[slot] = sess.alloc(shape, np.dtype(dtype), name=slot)
        slots[slot] = {"shape": list(shape), "dtype": dtype, "param": param}
        return slot

    frame_of: dict[str, int] = {}

    def act(node: Node, operand: Any = None) -> str:
        if id(node) not in act_slot:
            dims = operand_dims(operand, cfg) if operand is not None else node_dims(node, cfg)
            assert dims is not None
            f, fill = (0, 0) if operand is not None and operand.im2col else \
                frames.get(id(node), (0, 0))
            n, c, h, w = dims
            slot = alloc(f"a{len(act_slot)}", act_shape(cfg, n, c, h + 2 * f, w + 2 * f),
                         "int8", False)
            if f:  # the border its readers take as padding (docs/vta.md, "Padding")
                slots[slot].update(frame=f, fill=fill)
                frame_of[slot] = f
            act_slot[id(node)] = slot
        return act_slot[id(node)]

    def host(node: Node, arg: Any, operand: Any = None, fill: int = 0) -> dict[str, Any]:
        """How the runtime packs / unpacks the value of `node` (by its own shape; an im2col
        input by its patches, padded with `fill`)."""
        meta = {"slot": act_slot[id(node)], "arg": list(arg), "shape": list(node.shape),
                "matrix": node.rank != 4, "channels": int(node.shape[1 if node.rank == 4
                                                                     else -1])}
        if operand is not None and operand.im2col:
            meta["im2col"] = list(operand.im2col)
            if fill:
                meta["fill"] = fill
        return meta

    codes: list[LayerCode] = []
    for L in region.layers:
        ins = []
        for opnd in L.inputs:
            slot = act(opnd.node, opnd)
            ins.append(slot)
            if id(opnd.node) not in produced and not any(
                    m["slot"] == slot for m in inputs_meta):
                inputs_meta.append(host(opnd.node, plan.ptr(opnd.node), opnd,
                                        L.fill[0] if L.fill[0] == L.fill[1] else 0))
        out = act(L.out.node)
        code = LayerCode(ins, out, frames={s: frame_of[s] for s in (*ins, out)
                                           if s in frame_of})
        if isinstance(L, ConvLayer):
            w = pack_conv_weights(L.weight, cfg)
            code.weight = alloc(f"{L.name}:w", w.shape, "int8", True)
            params[code.weight] = w
        tables = []
        for k, rq in enumerate(region.rqs[region.layers.index(L)]):
            if rq.rows:
                t = alloc(f"{L.name}:rq{k}", rq.table.shape, "int32", True)
                params[t] = rq.table
                tables.append(t)
            else:
                tables.append("")
        code.tables = tuple(tables)
        codes.append(code)
    for L in region.layers:
        n = L.out.node
        outside = [u for u in users.get(n, []) if id(u) not in inside]
        if outside or id(n) in graph_outputs:
            outputs_meta.append(dict(host(n, plan.out(n)), layer=L.name))
    with sess.record() as rec:
        for k, (L, sch, rqs, code) in enumerate(zip(region.layers, region.schedules, region.rqs,
                                                    codes, strict=True)):
            if k:
                barrier(sess)
            emit_layer(sess, L, sch, rqs, arrays, code)
    name = f"region{r}.npz"
    programs[name] = rec[0]
    layer_meta = []
    for k, (L, sch, rqs, code) in enumerate(zip(region.layers, region.schedules, region.rqs,
                                                codes, strict=True)):
        lm: dict[str, Any] = {"name": L.name, "kind": L.kind, "macs": L.macs,
                              "schedule": sch.to_json(), "inputs": code.inputs,
                              "output": code.output}
        if per_layer:
            with sess.record() as one:
                emit_layer(sess, L, sch, rqs, arrays, code)
            lm["program"] = f"region{r}_layer{k}.npz"
            programs[lm["program"]] = one[0]
        layer_meta.append(lm)
    for arr in arrays.values():
        arr.free()
    io_args = tuple(tuple(m["arg"]) for m in inputs_meta + outputs_meta)
    for k, L in enumerate(region.layers):
        for n in L.nodes:  # the layer's other nodes: lowered here too, by the step below
            if n is not L.out.node:
                with plan.lowering(n, "vta"):
                    pass
        with plan.lowering(L.out.node, "vta"):
            plan.add_step(Step(L.name, L.kind, [Call(r, f"layer{k}", "p" * len(io_args),
                                                     io_args)], backend="vta"))
    return {"program": name, "slots": slots, "inputs": inputs_meta, "outputs": outputs_meta,
            "layers": layer_meta}
