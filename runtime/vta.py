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
from vtakit.driver.packing import (
    act_shape,
    frame_act,
    im2col,
    pack_act,
    pack_mat,
    unframe_act,
    unpack_act,
    unpack_mat,
)
from vtakit.driver.program import Program
from vtakit.driver.session import DeviceArray, Session
from vtakit.driver.slot_check import SlotAccess, check_confined
from vtakit.driver.stream_check import check_program
from vtakit.vta_hw import isa
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
    # slot, host array, matrix, channels, im2col, its fill, (frame, fill)
    inputs: list[tuple[DeviceArray, np.ndarray, bool, int, tuple[int, ...], int,
                       tuple[int, int]]]
    outputs: list[tuple[DeviceArray, np.ndarray, bool, int, str, int]]  # ..., layer, frame
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
        """The section as data (`ValueError` naming the member and the field): its metadata
        (`_check_meta`), its members, every stream decoded and checked (ISA version, the
        configuration, SRAM ranges, and every DMA inside the slot it names, with the slots'
        roles: `driver.slot_check`), and the micro-op constants the streams share."""
        meta = section.meta
        cfg = _check_meta(meta)
        need = ["params.npz"]
        for reg in meta["regions"]:
            need.append(reg["program"])
            need += [lm["program"] for lm in reg["layers"] if "program" in lm]
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
        constants: dict[str, tuple[str, np.ndarray]] = {}
        for reg in meta["regions"]:
            for member, access in _stream_access(reg):
                prog = _load_stream(section, member, cfg)
                check_program(cfg, prog, f"vta/{member}")
                check_confined(prog, access, f"vta/{member}", uops_from_constants=True,
                               check_tokens=True)
                for name, words in prog.constants.items():
                    seen = constants.setdefault(name, (member, words))
                    if not np.array_equal(seen[1], words):
                        raise ValueError(f"vta/{member}: micro-op constant {name!r} differs "
                                         f"from the one of that name in vta/{seen[0]} (a "
                                         f"constant's name must stand for its content)")

    @classmethod
    def check_plan(cls, section: Section, plan: Any, manifest: Mapping[str, Any]) -> None:
        """What the section says about the rest of the artifact: the manifest's configuration
        and hash (both present, the one hashing to the other and equal to the section's), each
        input's and output's host buffer (int8, the offset and extent inside it), and each
        accelerator step's call (a region and a layer of the section)."""
        meta = section.meta
        want = meta["config_hash"]
        if "hw_config_hash" not in manifest:
            raise ValueError(f"manifest.json has no hw_config_hash (expected {want}, the vta "
                             f"section's configuration)")
        got = manifest["hw_config_hash"]
        if got != want:
            raise ValueError(f"manifest.json hw_config_hash: {got!r}, but the vta section is "
                             f"for configuration {want}: the artifact is inconsistent")
        if "hw_config" in manifest:
            try:
                h = HwConfig.from_dict(manifest["hw_config"]).hash
            except (TypeError, ValueError) as e:
                raise ValueError(f"manifest.json hw_config: {e}") from None
            if h != got:
                raise ValueError(f"manifest.json hw_config hashes to {h}, but hw_config_hash "
                                 f"says {got}")
        for r, reg in enumerate(meta["regions"]):
            for part in ("inputs", "outputs"):
                for k, m in enumerate(reg[part]):
                    where = f"plan.json sections.vta.regions[{r}].{part}[{k}].arg"
                    _, b, off = m["arg"]
                    nbytes = int(np.prod(m["shape"], dtype=np.int64))
                    if b >= len(plan.buffers):
                        raise ValueError(f"{where}: buffer {b}, but the plan has "
                                         f"{len(plan.buffers)} buffers")
                    buf = plan.buffers[b]
                    if np.dtype(buf.dtype) != np.int8:
                        raise ValueError(f"{where}: buffer {b} holds {np.dtype(buf.dtype)}, "
                                         f"expected int8 (the accelerator's activations)")
                    if off + nbytes > buf.nbytes:
                        raise ValueError(f"{where}: {nbytes} bytes at offset {off} leave "
                                         f"buffer {b}'s {buf.nbytes} bytes")
        for k, st in enumerate(plan.steps):
            if st.backend != "vta":
                continue
            where = f"plan.json step {k} ({st.name!r})"
            if len(st.calls) != 1:
                raise ValueError(f"{where}: {len(st.calls)} calls, expected one (a layer of "
                                 f"a region)")
            call = st.calls[0]
            if call.kernel >= len(meta["regions"]):
                raise ValueError(f"{where}: kernel {call.kernel}, but the vta section has "
                                 f"{len(meta['regions'])} region(s)")
            layers = meta["regions"][call.kernel]["layers"]
            names = [f"layer{j}" for j in range(len(layers))]
            if call.fname not in names:
                raise ValueError(f"{where}: calls {call.fname!r}, which region {call.kernel} "
                                 f"does not have (expected one of {names})"[:400])

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
            elif info.get("frame"):  # the border, once: the streams write only inside it
                arr.copyfrom(np.full(arr.shape, info["fill"], arr.dtype))
            arrays[slot] = arr
        frame = {slot: (int(info.get("frame", 0)), int(info.get("fill", 0)))
                 for slot, info in meta["slots"].items()}
        ins = [(arrays[m["slot"]], memory.view(tuple(m["arg"]), "int8", tuple(m["shape"])),
                bool(m["matrix"]), int(m["channels"]), tuple(m.get("im2col", ())),
                int(m.get("fill", 0)), frame[m["slot"]]) for m in meta["inputs"]]
        outs = [(arrays[m["slot"]], memory.view(tuple(m["arg"]), "int8", tuple(m["shape"])),
                 bool(m["matrix"]), int(m["channels"]), m["layer"], frame[m["slot"]][0])
                for m in meta["outputs"]]
        layer_programs = [programs.get(lm["program"]) if "program" in lm else None
                          for lm in meta["layers"]]
        return _Region(programs[meta["program"]], layer_programs, arrays, ins, outs,
                       meta["layers"])

    # ---- running ------------------------------------------------------------------------
    def _pack_inputs(self, reg: _Region) -> None:
        for arr, host, matrix, c, patches, fill, (f, border) in reg.inputs:
            if patches:  # the input of a convolution run as a 1x1 over its patches
                host = im2col(host, *patches, fill=fill)
            packed = pack_mat(host.reshape(-1, c), self.cfg) if matrix else \
                frame_act(pack_act(host, self.cfg), f, border)
            arr.copyfrom(packed)

    def _unpack(self, reg: _Region, layer: str | None = None) -> None:
        for arr, host, matrix, c, name, f in reg.outputs:
            if layer is None or name == layer:
                y = unframe_act(arr.numpy(), f)
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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_meta(meta: Any) -> HwConfig:
    """The section's metadata as data: its configuration (hashing to its hash), a non-empty
    list of regions, each well formed (`_check_region`), and one stream per program name."""
    if not isinstance(meta, dict):
        raise ValueError(f"plan.json sections.vta: expected an object, got "
                         f"{type(meta).__name__}")
    for key in ("config", "config_hash", "regions"):
        if key not in meta:
            raise ValueError(f"the vta section has no {key!r} in its metadata")
    try:
        cfg = HwConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"plan.json sections.vta.config: {e}") from None
    if cfg.hash != meta["config_hash"]:
        raise ValueError(f"the vta section's configuration hashes to {cfg.hash}, but it "
                         f"says {meta['config_hash']}")
    regions = meta["regions"]
    if not isinstance(regions, list):
        raise ValueError(f"regions: expected a list, got {type(regions).__name__}")
    if not regions:
        raise ValueError("plan.json sections.vta.regions: expected at least one region, got "
                         "none")
    owner: dict[str, str] = {}
    for r, reg in enumerate(regions):
        _check_region(r, reg, cfg)
        names = [(f"regions[{r}].program", reg["program"])] + [
            (f"regions[{r}].layers[{k}].program", lm["program"])
            for k, lm in enumerate(reg["layers"]) if "program" in lm]
        for where, name in names:
            if name in owner:
                raise ValueError(f"plan.json sections.vta.{where}: {name!r} is already the "
                                 f"stream of {owner[name]} (expected one stream per region "
                                 f"and per layer)")
            if name == "params.npz" or not name.endswith(".npz"):
                raise ValueError(f"plan.json sections.vta.{where}: {name!r} is not a stream "
                                 f"member (expected a name ending in .npz other than "
                                 f"params.npz)")
            owner[name] = where
    return cfg


def _packed_shape(cfg: HwConfig, m: Mapping[str, Any], where: str, frame: int
                  ) -> tuple[int, ...]:
    """The packed shape the runtime makes of an input's or output's host array (inside a
    frame of `frame` elements)."""
    shape, c = m["shape"], m["channels"]
    if m["matrix"]:
        if frame:
            raise ValueError(f"{where}: a matrix's slot has no frame")
        rows, rem = divmod(int(np.prod(shape, dtype=np.int64)), c)
        if rem or rows % cfg.batch:
            raise ValueError(f"{where}: shape {shape} is not rows of {c} channels in a "
                             f"multiple of the core's batch {cfg.batch}")
        return act_shape(cfg, cfg.batch, c, rows // cfg.batch, 1)
    if len(shape) != 4 or shape[1] != c or shape[0] % cfg.batch:
        raise ValueError(f"{where}: shape {shape} with channels {c}: expected (N, C, H, W) "
                         f"with C = channels and N a multiple of the core's batch {cfg.batch}")
    n, _, h, w = shape
    spec = m.get("im2col", ())
    if "fill" in m and not (spec and _is_int(m["fill"]) and -128 <= m["fill"] <= 127):
        raise ValueError(f"{where}.fill: expected the int8 value an im2col input is padded "
                         f"with, got {m['fill']!r}")
    if not spec:
        return act_shape(cfg, n, c, h + 2 * frame, w + 2 * frame)
    if frame:
        raise ValueError(f"{where}: an im2col input's slot has no frame")
    pad_max = isa.layouts(cfg).mem["y_pad_0"].max
    if not (isinstance(spec, list) and len(spec) == 8 and all(_is_int(v) for v in spec)
            and min(spec[:4]) >= 1 and all(0 <= p <= pad_max for p in spec[4:])):
        raise ValueError(f"{where}.im2col: expected [kh, kw, sh, sw, pad top, left, bottom, "
                         f"right], kernel and strides >= 1 and pads 0..{pad_max} (the LOAD's "
                         f"padding fields), got {spec!r}"[:400])
    kh, kw, sh, sw, pt, pl, pb, pr = spec
    if h + pt + pb < kh or w + pl + pr < kw:
        raise ValueError(f"{where}.im2col: a {kh}x{kw} window does not fit the padded "
                         f"{h + pt + pb}x{w + pl + pr} input")
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    return act_shape(cfg, n, c * kh * kw, oh, ow)


def _check_region(r: int, reg: Any, cfg: HwConfig) -> None:
    """The structure of one region's metadata (`ValueError` naming the field)."""
    where = f"plan.json sections.vta.regions[{r}]"
    if not isinstance(reg, dict):
        raise ValueError(f"{where}: expected an object, got {type(reg).__name__}")
    for key, kind in (("program", str), ("slots", dict), ("inputs", list), ("outputs", list),
                      ("layers", list)):
        if not isinstance(reg.get(key), kind):
            raise ValueError(f"{where}.{key}: expected a {kind.__name__}, got "
                             f"{type(reg.get(key)).__name__}")
        if key != "program" and not reg[key]:
            raise ValueError(f"{where}.{key}: expected at least one entry, got none")
    for slot, info in reg["slots"].items():
        shape = info.get("shape") if isinstance(info, dict) else None
        if not (isinstance(shape, list) and shape and all(
                _is_int(d) and d > 0 for d in shape)):
            raise ValueError(f"{where}.slots[{slot!r}].shape: expected positive ints, got "
                             f"{shape!r}")
        if info.get("dtype") not in ("int8", "int32") or not isinstance(info.get("param"), bool):
            raise ValueError(f"{where}.slots[{slot!r}]: expected dtype int8/int32 and a boolean "
                             f"param, got {info.get('dtype')!r}, {info.get('param')!r}")
        if "frame" in info or "fill" in info:
            f, v = info.get("frame"), info.get("fill")
            pad_max = isa.layouts(cfg).mem["y_pad_0"].max
            if not (_is_int(f) and 1 <= f <= pad_max and _is_int(v) and -128 <= v <= 127
                    and info["dtype"] == "int8" and not info["param"] and len(shape) == 6):
                raise ValueError(f"{where}.slots[{slot!r}]: a frame of 1..{pad_max} elements "
                                 f"and an int8 fill, on an int8 activation; got frame {f!r}, "
                                 f"fill {v!r}")
    layers = reg["layers"]
    for k, lm in enumerate(layers):
        ok = (isinstance(lm, dict) and isinstance(lm.get("name"), str)
              and isinstance(lm.get("kind"), str) and _is_int(lm.get("macs"))
              and lm["macs"] >= 0 and ("program" not in lm or isinstance(lm["program"], str)))
        if not ok:
            raise ValueError(f"{where}.layers[{k}]: expected name, kind, macs (an int >= 0) "
                             f"and a program name; got {lm!r}"[:400])
        for key in ("inputs", "output"):
            names = lm.get(key) if key == "inputs" else [lm.get(key)]
            if not isinstance(names, list) or not names or not all(
                    isinstance(n, str) and n in reg["slots"] for n in names):
                raise ValueError(f"{where}.layers[{k}].{key}: expected slot name(s) of the "
                                 f"region, got {lm.get(key)!r}"[:400])
        out = reg["slots"][lm["output"]]
        if out["param"] or out["dtype"] != "int8":
            raise ValueError(f"{where}.layers[{k}].output: slot {lm['output']!r} is "
                             f"{'a parameter' if out['param'] else out['dtype']}, expected an "
                             f"int8 activation")
    produced = {lm["output"]: lm["name"] for lm in layers}
    for part in ("inputs", "outputs"):
        for k, m in enumerate(reg[part]):
            ok = (isinstance(m, dict) and m.get("slot") in reg["slots"]
                  and isinstance(m.get("arg"), list) and len(m["arg"]) == 3
                  and m["arg"][0] == "b" and all(_is_int(v) and v >= 0 for v in m["arg"][1:])
                  and isinstance(m.get("shape"), list) and m["shape"]
                  and all(_is_int(d) and d > 0 for d in m["shape"])
                  and isinstance(m.get("matrix"), bool) and _is_int(m.get("channels"))
                  and m["channels"] > 0 and (part == "inputs" or "layer" in m))
            if not ok:
                extra = ", layer" if part == "outputs" else ""
                raise ValueError(f"{where}.{part}[{k}]: expected slot (one of the region's), "
                                 f"arg ['b', buffer, offset >= 0], shape, matrix, channels"
                                 f"{extra}; got {m!r}"[:400])
            at = f"{where}.{part}[{k}]"
            info = reg["slots"][m["slot"]]
            if info["param"] or info["dtype"] != "int8":
                raise ValueError(f"{at}.slot: {m['slot']!r} is "
                                 f"{'a parameter' if info['param'] else info['dtype']}, "
                                 f"expected an int8 activation")
            if part == "outputs" and "im2col" in m:
                raise ValueError(f"{at}: an output has no im2col")
            want = _packed_shape(cfg, m, at, info.get("frame", 0))
            if tuple(info["shape"]) != want:
                raise ValueError(f"{at}: slot {m['slot']!r} is {info['shape']}, but its host "
                                 f"array {m['shape']} packs to {list(want)}")
            if part == "inputs" and m["slot"] in produced:
                raise ValueError(f"{at}.slot: {m['slot']!r} is the output of layer "
                                 f"{produced[m['slot']]!r}, expected a slot the host fills")
            if part == "outputs" and produced.get(m["slot"]) != m["layer"]:
                raise ValueError(f"{at}: layer {m['layer']!r} does not make slot "
                                 f"{m['slot']!r} (expected the name of the region's layer "
                                 f"whose output it is)"[:400])


def _stream_access(reg: Mapping[str, Any]) -> list[tuple[str, dict[str, SlotAccess]]]:
    """Each stream of a region with what it may do to each slot: parameters and inputs are
    read only and hold their data from the start; the region's stream writes every layer's
    output, and reads one only after it is written; layer ``k``'s own stream writes that
    layer's output, and finds the outputs of the layers before it written (profiling runs
    the layers in order)."""
    inputs = {m["slot"] for m in reg["inputs"]}

    def nbytes(info: Mapping[str, Any]) -> int:
        return int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(info["dtype"]).itemsize

    def access(preset: set[str], writable: set[str]) -> dict[str, SlotAccess]:
        return {s: SlotAccess(nbytes(info), info["param"] or s in inputs or s in preset,
                              not info["param"] and s not in inputs and s in writable)
                for s, info in reg["slots"].items()}

    outs = [lm["output"] for lm in reg["layers"]]
    streams = [(reg["program"], access(set(), set(outs)))]
    for k, lm in enumerate(reg["layers"]):
        if "program" in lm:
            streams.append((lm["program"], access(set(outs[:k]), {outs[k]})))
    return streams


def _load_stream(section: Section, member: str, cfg: HwConfig) -> Program:
    """A stream member, decoded and checked against the section's configuration."""
    try:
        prog = Program.load(io.BytesIO(section.members[member]), cfg)
    except ValueError as e:
        raise ValueError(f"vta/{member}: {str(e).removeprefix('program: ')}") from None
    return prog
