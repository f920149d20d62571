"""The accelerator's runner: runs the ``vta`` section of a plan through the driver.

Each region of the section is a relocatable instruction stream (`driver.Program`) over named
device arrays ("slots"): the packed weights and requantisation constants (written once, when the
runner starts), the packed activations (inputs packed from the host buffers before each run,
outputs unpacked after it; the ones in between never leave the device). A run of a segment runs
each of its regions as one stream with one synchronisation; `profile` runs the per-layer streams
instead, one layer at a time, so every layer is timed (and counted in cycles) on its own.

The device is chosen by the runner option ``device``: ``"sim"`` (default, the cycle-accurate
simulator), ``"rtl"`` (the core's Verilog under Verilator), ``"fpga:PORT"`` or
``"fpga:PORT@BAUD"`` (a board behind its UART host bridge, e.g. ``"fpga:/dev/ttyUSB1"``),
``"pynq"`` or ``"pynq:BITFILE"`` (on a Zynq board, through the ``pynq`` package), or a
`driver.Device` instance. A device built for another configuration than the one the model was
compiled for is refused.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vtakit.driver.device import Device, RunResult
from vtakit.driver.packing import im2col, pack_act, pack_mat, unpack_act, unpack_mat
from vtakit.driver.program import Program
from vtakit.driver.session import DeviceArray, Session
from vtakit.vta_hw.config import HwConfig

from .plan import Section, Step
from .runners import HostBuffers, Runner, Segment, register_runner

__all__ = ["VtaRunner", "LayerRun", "make_device", "listing"]

OPTIONS = ("device", "timeout_s")


def make_device(spec: Any, cfg: HwConfig) -> Device:
    """``"sim"``, ``"rtl"``, ``"fpga:PORT[@BAUD]"``, ``"pynq[:BITFILE]"`` or a `Device` (checked
    against `cfg`)."""
    if isinstance(spec, Device):
        if spec.cfg.hash != cfg.hash:
            raise ValueError(
                f"the model was compiled for hardware configuration {cfg.hash} "
                f"({cfg.bitstream_name}); the device given is {spec.cfg.hash} "
                f"({spec.cfg.bitstream_name}): recompile with --option config=... or use a "
                f"device of that configuration")
        return spec
    if spec in (None, "sim"):
        from vtakit.driver.devices.sim import SimDevice

        return SimDevice(cfg, dram_bytes=1 << 30)
    if spec == "rtl":
        from vtakit.driver.devices.rtl import RtlDevice

        return RtlDevice(cfg)
    if isinstance(spec, str) and spec.startswith("fpga:"):
        from vtakit.driver.devices.fpga import FpgaDevice

        return FpgaDevice.from_spec(cfg, spec[len("fpga:"):])
    if isinstance(spec, str) and (spec == "pynq" or spec.startswith("pynq:")):
        from vtakit.driver.devices.pynq import PynqDevice

        return PynqDevice.from_spec(cfg, spec[len("pynq:"):])
    raise ValueError(f"vta runner: device={spec!r}; expected 'sim', 'rtl', 'fpga:PORT', "
                     f"'pynq[:BITFILE]' or a vtakit.driver.Device")


@dataclass
class LayerRun:
    """The last run of one layer (`VtaRunner.layer_runs`, filled by `profile`)."""

    name: str
    kind: str
    macs: int
    cycles: int
    stats: Any = None


@dataclass
class _Region:
    program: Program
    layer_programs: list[Program | None]
    arrays: dict[str, DeviceArray]
    inputs: list[tuple[DeviceArray, np.ndarray, bool, int, tuple[int, ...]]]  # + im2col
    outputs: list[tuple[DeviceArray, np.ndarray, bool, int, str]]
    layers: list[dict[str, Any]]
    last: RunResult | None = None
    layer_runs: list[LayerRun] = field(default_factory=list)


@register_runner("vta")
class VtaRunner(Runner):
    """Runs the accelerator's regions on a device (see the module docstring).

    Attributes
    ----------
    cfg : HwConfig
    device : Device
    session : Session
    last_runs : list of RunResult
        The result (cycles, statistics) of each region's last run, in region order.
    """

    def __init__(self, plan: Any, section: Section, memory: HostBuffers, threads: int,
                 manifest: dict | None = None, options: Mapping[str, Any] | None = None
                 ) -> None:
        super().__init__(plan, section, memory, threads, manifest, options)
        opts = dict(options or {})
        unknown = sorted(set(opts) - set(OPTIONS))
        if unknown:
            raise TypeError(f"vta runner: unknown option(s) {unknown}; expected {list(OPTIONS)}")
        meta = section.meta
        self.cfg = HwConfig.from_dict(meta["config"])
        want = (manifest or {}).get("hw_config_hash")
        if want is not None and want != self.cfg.hash:
            raise ValueError(f"the artifact's manifest says configuration {want}, its vta "
                             f"section {self.cfg.hash}: the artifact is inconsistent")
        self.timeout_s = float(opts.get("timeout_s", 600.0))
        self._own_device = not isinstance(opts.get("device"), Device)
        self.device = make_device(opts.get("device"), self.cfg)
        self.session = Session(self.device, timeout_s=self.timeout_s)
        programs, params = self._load(section)
        self.regions = [self._region(r, programs, params, memory)
                        for r in meta["regions"]]

    @classmethod
    def check_section(cls, section: Section) -> None:
        meta = section.meta
        for key in ("config", "config_hash", "regions"):
            if key not in meta:
                raise ValueError(f"the vta section has no {key!r} in its metadata")
        cfg = HwConfig.from_dict(meta["config"])
        if cfg.hash != meta["config_hash"]:
            raise ValueError(f"the vta section's configuration hashes to {cfg.hash}, but it "
                             f"says {meta['config_hash']}")
        if not isinstance(meta["regions"], list):
            raise ValueError(f"regions: expected a list, got {type(meta['regions']).__name__}")
        need = ["params.npz"]
        params: set[str] = set()
        for r, reg in enumerate(meta["regions"]):
            _check_region(r, reg)
            need.append(reg["program"])
            need += [lm["program"] for lm in reg["layers"] if "program" in lm]
            params |= {slot for slot, info in reg["slots"].items() if info["param"]}
        missing = [m for m in need if m not in section.members]
        if missing:
            raise ValueError(f"the vta section lacks member(s) {missing}")
        try:
            with np.load(io.BytesIO(section.members["params.npz"]), allow_pickle=False) as z:
                stored = {k: (z[k].shape, z[k].dtype) for k in z.files}
        except Exception as e:  # noqa: BLE001 - any reader error: a corrupt member
            raise ValueError(f"member params.npz is not a readable .npz ({e})") from None
        for r, reg in enumerate(meta["regions"]):
            for slot, info in reg["slots"].items():
                if not info["param"]:
                    continue
                got = stored.get(slot)
                want = (tuple(info["shape"]), np.dtype(info["dtype"]))
                if got is None or (tuple(got[0]), got[1]) != want:
                    raise ValueError(f"params.npz: array {slot!r} of region {r} is "
                                     f"{'missing' if got is None else f'{got[1]}{list(got[0])}'}"
                                     f"; the slot expects {want[1]}{list(want[0])}")

    def _load(self, section: Section) -> tuple[dict[str, Program], Mapping[str, np.ndarray]]:
        if section.live is not None:
            return section.live["programs"], section.live["params"]
        programs = {name: Program.load(io.BytesIO(data))
                    for name, data in section.members.items() if name.endswith(".npz")
                    and name != "params.npz"}
        with np.load(io.BytesIO(section.members["params.npz"])) as z:
            params = {k: z[k] for k in z.files}
        for name, p in programs.items():
            if p.cfg.hash != self.cfg.hash:
                raise ValueError(f"vta stream {name} was built for configuration {p.cfg.hash}, "
                                 f"the section for {self.cfg.hash}")
        return programs, params

    def _region(self, meta: dict[str, Any], programs: Mapping[str, Program],
                params: Mapping[str, np.ndarray], memory: HostBuffers) -> _Region:
        s = self.session
        arrays: dict[str, DeviceArray] = {}
        for slot, info in meta["slots"].items():
            arr = s.alloc(tuple(info["shape"]), np.dtype(info["dtype"]), name=slot)
            if info["param"]:
                arr.copyfrom(np.ascontiguousarray(params[slot]))
            arrays[slot] = arr
        ins = [(arrays[m["slot"]], memory.view(tuple(m["arg"]), "int8", tuple(m["shape"])),
                bool(m["matrix"]), int(m["channels"]), tuple(m.get("im2col", ())))
               for m in meta["inputs"]]
        outs = [(arrays[m["slot"]], memory.view(tuple(m["arg"]), "int8", tuple(m["shape"])),
                 bool(m["matrix"]), int(m["channels"]), m["layer"]) for m in meta["outputs"]]
        layer_programs = [programs.get(lm["program"]) if "program" in lm else None
                          for lm in meta["layers"]]
        return _Region(programs[meta["program"]], layer_programs, arrays, ins, outs,
                       meta["layers"])

    # ---- running ------------------------------------------------------------------------
    def _pack_inputs(self, reg: _Region) -> None:
        for arr, host, matrix, c, patches in reg.inputs:
            if patches:  # the input of a convolution run as a 1x1 over its patches
                host = im2col(host, *patches)
            packed = pack_mat(host.reshape(-1, c), self.cfg) if matrix else \
                pack_act(host, self.cfg)
            arr.copyfrom(packed)

    def _unpack(self, reg: _Region, layer: str | None = None) -> None:
        for arr, host, matrix, c, name in reg.outputs:
            if layer is None or name == layer:
                y = arr.numpy()
                if matrix:
                    unpack_mat(y, c, out=host.reshape(-1, c))
                else:
                    unpack_act(y, c, out=host)

    def _run_program(self, program: Program, reg: _Region) -> RunResult:
        return self.session.run_program(program, reg.arrays, timeout_s=self.timeout_s)

    def run_region(self, reg: _Region) -> RunResult:
        """Pack the inputs, run the region's stream, unpack the outputs."""
        self._pack_inputs(reg)
        reg.last = self._run_program(reg.program, reg)
        self._unpack(reg)
        return reg.last

    def run_layer(self, reg: _Region, k: int) -> RunResult:
        """Layer `k` of the region alone (its own stream); the region's inputs are packed before
        its first layer, and each output unpacked after the layer that makes it."""
        prog = reg.layer_programs[k]
        if prog is None:
            raise ValueError("this model was compiled without per-layer streams "
                             "(option per_layer=False); profile the whole region instead")
        if k == 0:
            self._pack_inputs(reg)
            reg.layer_runs = []
        lm = reg.layers[k]
        r = self._run_program(prog, reg)
        run = LayerRun(lm["name"], lm["kind"], int(lm["macs"]), r.cycles, r.stats)
        if k < len(reg.layer_runs):
            reg.layer_runs[k] = run
        else:
            reg.layer_runs.append(run)
        self._unpack(reg, lm["name"])
        return r

    @property
    def last_runs(self) -> list[RunResult | None]:
        return [r.last for r in self.regions]

    @property
    def layer_runs(self) -> list[LayerRun]:
        return [lr for r in self.regions for lr in r.layer_runs]

    def _step(self, r: int, k: int) -> None:
        self.run_layer(self.regions[r], k)

    def segment(self, steps: Sequence[Step]) -> Segment:
        regions: list[int] = []
        per_step: list[Callable[[], None]] = []
        for st in steps:
            (call,) = st.calls
            r, k = call.kernel, int(call.fname.removeprefix("layer"))
            if not regions or regions[-1] != r:
                regions.append(r)
            per_step.append(functools.partial(self._step, r, k))

        def run() -> None:
            for r in regions:
                self.run_region(self.regions[r])

        return Segment(run, per_step)

    def close(self) -> None:
        self.session.close()
        close = getattr(self.device, "close", None)
        if close is not None and self._own_device:
            close()


def listing(section: Section, uops: bool = False) -> list[str]:
    """The disassembly of every stream of a ``vta`` section (`vtakit disasm model.vtak`): each
    region's stream, then each layer's, with a header naming the region and its layers."""
    cfg = HwConfig.from_dict(section.meta["config"])
    lines = [f"; vta section for configuration {cfg.hash} ({cfg.bitstream_name})"]
    for r, reg in enumerate(section.meta["regions"]):
        names = ", ".join(f"{lm['name']} ({lm['kind']})" for lm in reg["layers"])
        prog = Program.load(io.BytesIO(section.members[reg["program"]]))
        lines.append(f"; region {r}: {len(prog)} instructions; layers {names}")
        lines += prog.listing(uops)
    return lines


def _check_region(r: int, reg: Any) -> None:
    """The structure of one region's metadata (`ValueError` naming the field)."""
    where = f"regions[{r}]"
    if not isinstance(reg, dict):
        raise ValueError(f"{where}: expected an object, got {type(reg).__name__}")
    for key, kind in (("program", str), ("slots", dict), ("inputs", list), ("outputs", list),
                      ("layers", list)):
        if not isinstance(reg.get(key), kind):
            raise ValueError(f"{where}.{key}: expected a {kind.__name__}, got "
                             f"{type(reg.get(key)).__name__}")
    for slot, info in reg["slots"].items():
        shape = info.get("shape") if isinstance(info, dict) else None
        if not (isinstance(shape, list) and shape and all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
            raise ValueError(f"{where}.slots[{slot!r}].shape: expected positive ints, got "
                             f"{shape!r}")
        if info.get("dtype") not in ("int8", "int32") or not isinstance(info.get("param"), bool):
            raise ValueError(f"{where}.slots[{slot!r}]: expected dtype int8/int32 and a boolean "
                             f"param, got {info.get('dtype')!r}, {info.get('param')!r}")
    for part in ("inputs", "outputs"):
        for k, m in enumerate(reg[part]):
            ok = (isinstance(m, dict) and m.get("slot") in reg["slots"]
                  and isinstance(m.get("arg"), list) and len(m["arg"]) == 3
                  and isinstance(m.get("shape"), list)
                  and all(isinstance(d, int) and d > 0 for d in m["shape"])
                  and isinstance(m.get("matrix"), bool) and isinstance(m.get("channels"), int)
                  and m["channels"] > 0 and (part == "inputs" or "layer" in m))
            if not ok:
                extra = ", layer" if part == "outputs" else ""
                raise ValueError(f"{where}.{part}[{k}]: expected slot (one of the region's), "
                                 f"arg, shape, matrix, channels{extra}; got {m!r}"[:400])
    for k, lm in enumerate(reg["layers"]):
        if not (isinstance(lm, dict) and isinstance(lm.get("name"), str)
                and isinstance(lm.get("kind"), str) and isinstance(lm.get("macs"), int)):
            raise ValueError(f"{where}.layers[{k}]: expected name, kind, macs; got {lm!r}"[:400])
