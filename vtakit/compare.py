"""One model three ways: fp32 on the CPU, int8 on the CPU, and int8 on the accelerator.

`compare` compiles the model for each, runs the same samples through all three (batch 1, one
sample at a time) and returns a `CompareReport`: output agreement (the accelerator must match the
CPU's int8 path bit for bit), top-1 agreement and accuracy, CPU latency, the accelerator's cycles,
MAC utilisation and DRAM traffic, how much of the model's work the accelerator ran (its share of
the convolution / matmul MACs and of the plan's steps, and why the rest stayed on the CPU), and a
per-layer breakdown. With ``out_dir`` it also writes
``report.json``, ``layers.png`` (per-layer time and utilisation) and ``trace.json`` (a
Perfetto / Chrome trace of one accelerator run, ``sim`` device only). ``vtakit compare`` and
``vtakit demo`` are thin wrappers around it; docs/compare.md explains every column.

    from vtakit.compare import compare
    report = compare("model.onnx", data="test.npz", out_dir="out")
    print(report.table())
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from vtakit.vta_hw.config import HwConfig

__all__ = ["CompareReport", "BackendResult", "AcceleratorResult", "LayerResult",
           "OffloadResult", "CpuNode", "compare", "load_data", "is_digits_model", "plot_layers",
           "node_macs", "check_percent", "DEFAULT_RANDOM_SAMPLES"]

#: Samples drawn when there is no data (random inputs).
DEFAULT_RANDOM_SAMPLES = 32
#: Random calibration samples (no --calib, no data to calibrate on).
RANDOM_CALIB_SAMPLES = 16
#: At most this many samples of --data calibrate the model when there is no --calib.
DATA_CALIB_SAMPLES = 64
#: Repeats of the per-step profile (the CPU steps are microseconds: one run is noise).
PROFILE_REPEAT = 20
#: ... within about this many seconds (a profile of the accelerator's plan simulates it).
PROFILE_BUDGET_S = 0.5

BACKENDS = ("cpu-fp32", "cpu-int8", "vta")

#: A progress bar: called with a label and the number of steps, it returns a context manager
#: whose value has ``update(n)`` (``click.progressbar(length=..., label=...)`` is one).
ProgressFactory = Callable[[str, int], AbstractContextManager[Any]]


@dataclass
class BackendResult:
    """One way of running the model, over all samples.

    Attributes
    ----------
    name : str
        ``cpu-fp32``, ``cpu-int8`` or ``vta`` (int8; the layers the accelerator cannot run stay
        on the CPU).
    accuracy : float or None
        Top-1 accuracy against the labels (None without labels or a class-score output).
    top1_vs_fp32 : float or None
        Fraction of samples whose top-1 class equals fp32's.
    max_abs_diff_vs_fp32 : float
        Largest absolute difference from the fp32 outputs, over every output value.
    max_abs_diff_vs_int8 : float or None
        The same against the CPU's int8 outputs (None for fp32 itself).
    latency_ms : float or None
        Median host time of one sample (``GraphExecutor.run``); None for ``vta``, whose time
        is its cycle count at the configuration's clock (`AcceleratorResult.time_us`).
    """

    name: str
    accuracy: float | None
    top1_vs_fp32: float | None
    max_abs_diff_vs_fp32: float
    max_abs_diff_vs_int8: float | None
    latency_ms: float | None


@dataclass
class AcceleratorResult:
    """The accelerator's side of the run (all counts are per sample).

    Attributes
    ----------
    device : str
        ``sim`` or ``rtl``.
    config, config_hash : str
        The hardware configuration as given, and its hash.
    clock_mhz : float
    macs_per_cycle : int
        The core's peak (batch × block_in × block_out).
    regions : int
        Instruction streams per sample (runs of consecutive accelerator layers).
    cycles : int
        Cycles of one sample, summed over its regions (mean over samples; `cycles_min` and
        `cycles_max` give the spread, normally none: timing does not depend on the data).
    time_us : float
        ``cycles`` at ``clock_mhz``.
    model_macs : int
        Multiply-accumulates the model's accelerator layers need.
    gemm_macs : int or None
        MACs the GEMM core executed, padding of channels to the block size included (sim only).
    mac_utilisation : float or None
        ``gemm_macs / (cycles * macs_per_cycle)`` (the simulator's figure; sim only).
    useful_utilisation : float
        ``model_macs / (cycles * macs_per_cycle)``.
    dram_read_bytes : dict of str to int
        Bytes read per memory type (``INSN``, ``UOP``, ``INP``, ``WGT``, ``ACC``...; sim only).
    dram_write_bytes : int or None
    host_cpu_ms : float
        Host time of the plan's CPU steps (quantise the input, dequantise the output, layers
        that fell back), from the profile.
    bit_identical : bool
        Every output of every sample equals the CPU int8 path's, byte for byte.
    mismatched_samples : int
    cpu_fallback : dict of str to str
        Node -> why it stayed on the CPU (the accelerator backend's ``cpu_fallback``; recomputed
        with its layer finder when it took no node, as the plan then has no ``vta`` section).
    device_seconds : float
        Wall time the device took for all samples (a simulator's speed, not the hardware's).
    """

    device: str
    config: str
    config_hash: str
    clock_mhz: float
    macs_per_cycle: int
    regions: int
    cycles: int
    cycles_min: int
    cycles_max: int
    time_us: float
    model_macs: int
    gemm_macs: int | None
    mac_utilisation: float | None
    useful_utilisation: float
    dram_read_bytes: dict[str, int]
    dram_write_bytes: int | None
    host_cpu_ms: float
    bit_identical: bool
    mismatched_samples: int
    cpu_fallback: dict[str, str]
    device_seconds: float


@dataclass
class LayerResult:
    """One step of the accelerator's plan, profiled on the first sample.

    Attributes
    ----------
    name, op : str
        The step (node) and its operation.
    backend : str
        Where it ran: ``vta`` or ``cpu``.
    macs : int
        The step's multiply-accumulates (`node_macs` of its node on the CPU; 0 for pooling).
    cycles : int or None
        Accelerator cycles of the layer run as its own stream (None on the CPU).
    time_us : float
        ``vta``: cycles at the clock; ``cpu``: measured host time.
    cpu_int8_us : float or None
        Host time of the same node in the all-CPU int8 plan (all its steps: im2col, packing,
        the kernel); None when that plan has no such node.
    mac_utilisation, useful_utilisation : float or None
        As in `AcceleratorResult`, for this layer alone (None on the CPU).
    dram_bytes : int or None
        Bytes the layer's stream read and wrote (sim only).
    note : str
        Why a step stayed on the CPU, when the compiler said.
    """

    name: str
    op: str
    backend: str
    macs: int
    cycles: int | None
    time_us: float
    cpu_int8_us: float | None
    mac_utilisation: float | None
    useful_utilisation: float | None
    dram_bytes: int | None
    note: str = ""


@dataclass
class CpuNode:
    """A node of the integer graph that ran on the CPU.

    Attributes
    ----------
    name, op : str
        The node and its operation (for a fallback named after a layer's requantisation, the
        operation of the convolution or matmul it requantises).
    macs : int
        Its multiply-accumulates (`node_macs`; 0 for a pool or an add).
    reason : str
        Why it is not on the accelerator.
    """

    name: str
    op: str
    macs: int
    reason: str


@dataclass
class OffloadResult:
    """How much of the model the accelerator ran.

    The MACs are those of the integer graph's convolutions and matmuls (``conv_integer``,
    ``matmul_integer``, ``qlinear_conv``, ``qlinear_matmul``, and the float ``conv``,
    ``conv_transpose``, ``matmul`` and ``gemm`` the quantiser left), counted by `node_macs`, the
    formula of the accelerator's layers' ``macs``.

    Attributes
    ----------
    macs : int
        All of the model's MACs.
    accelerator_macs : int
        Those of the nodes the accelerator ran.
    mac_share : float or None
        ``accelerator_macs / macs`` (None when the model has no MACs).
    steps, accelerator_steps : int
        Steps of the accelerator's plan, and those that ran on the accelerator.
    step_share : float or None
        ``accelerator_steps / steps``.
    fallback : list of CpuNode
        The accelerator backend's ``cpu_fallback``: nodes an accelerator layer could have
        started from, left on the CPU, and why.
    no_pattern : list of CpuNode
        The other nodes with MACs that ran on the CPU: no accelerator layer pattern applies to
        them (a float convolution the quantiser kept, an operation the accelerator has no layer
        for).
    """

    macs: int
    accelerator_macs: int
    mac_share: float | None
    steps: int
    accelerator_steps: int
    step_share: float | None
    fallback: list[CpuNode] = field(default_factory=list)
    no_pattern: list[CpuNode] = field(default_factory=list)

    @property
    def cpu_macs(self) -> int:
        return self.macs - self.accelerator_macs

    def headline(self) -> str:
        """One line: the accelerator's share of the MACs and of the steps."""
        steps = (f"{self.accelerator_steps} of {self.steps} steps "
                 f"({_pct_floor(self.step_share)})")
        if not self.macs:
            return (f"offload: the model has no convolution / matmul MACs; the accelerator ran "
                    f"{steps}")
        return (f"offload: the accelerator ran {_pct_floor(self.mac_share)} of the model's "
                f"MACs ({self.accelerator_macs:,} of {self.macs:,}) and {steps}")

    def lines(self) -> list[str]:
        """`headline`, then every CPU fallback and every node with MACs that no accelerator
        pattern took, with its op, MACs and reason."""
        out = [self.headline()]
        groups = [(self.fallback, "CPU fallback, with the compiler's reason"),
                  (self.no_pattern, "on the CPU because no accelerator pattern applies")]
        rows = [r for g, _ in groups for r in g]
        wn = max([len(r.name) for r in rows] + [4])
        wo = max([len(r.op) for r in rows] + [2])
        wm = max([len(f"{r.macs:,}") for r in rows] + [4])
        for nodes, title in groups:
            if not nodes:
                continue
            macs = sum(r.macs for r in nodes)
            out.append(f"  {title}: {len(nodes)} node{'s' * (len(nodes) != 1)}, {macs:,} "
                       f"MACs")
            for r in nodes:
                m = f"{r.macs:,}" if r.macs else "-"
                out.append(f"    {r.name:<{wn}} {r.op:<{wo}} {m:>{wm}} MACs  {r.reason}")
        return out

    def shortfall(self, require_pct: float) -> str | None:
        """The failure line when the accelerator ran less than `require_pct` % of the MACs
        (a model without MACs fails any requirement above 0); None when it meets it."""
        pct = check_percent(require_pct, "require_pct")
        if self.mac_share is not None and 100 * self.mac_share >= pct:
            return None
        if self.mac_share is None:
            if pct == 0:
                return None
            got = "the model has no convolution / matmul MACs to offload"
        else:
            got = (f"the accelerator ran {_pct_floor(self.mac_share)} of the model's MACs "
                   f"({self.accelerator_macs:,} of {self.macs:,})")
        cpu = sorted([(r, "fallback") for r in self.fallback]
                     + [(r, "no pattern") for r in self.no_pattern], key=lambda t: -t[0].macs)
        cpu = [t for t in cpu if t[0].macs]
        where = ", ".join(f"{r.name} ({r.op}, {r.macs:,} MACs, {why})" for r, why in cpu[:3])
        if len(cpu) > 3:
            where += f" and {len(cpu) - 3} more"
        return (f"offload: {got}, below the {pct:g}% required (--require-offload {pct:g})"
                + (f"; on the CPU: {where}" if where else ""))


@dataclass
class CompareReport:
    """What `compare` found; `table` prints it, `to_json` is the JSON report.

    Attributes
    ----------
    model : str
        The model's name (file stem or graph name).
    samples : int
    data : str
        Where the inputs came from.
    calib : str
        Where the calibration data came from.
    labelled : bool
        Whether accuracies were measured against labels.
    backends : list of BackendResult
        ``cpu-fp32``, ``cpu-int8``, ``vta``, in that order.
    accelerator : AcceleratorResult
    layers : list of LayerResult
    offload : OffloadResult
        The accelerator's share of the MACs and steps, and what ran on the CPU and why.
    files : dict of str to str
        ``report``, ``plot``, ``trace`` -> path, for those written.
    notes : list of str
    """

    model: str
    samples: int
    data: str
    calib: str
    labelled: bool
    backends: list[BackendResult]
    accelerator: AcceleratorResult
    layers: list[LayerResult]
    offload: OffloadResult
    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The accelerator's outputs equal the CPU int8 path's on every sample."""
        return self.accelerator.bit_identical

    def backend(self, name: str) -> BackendResult:
        for b in self.backends:
            if b.name == name:
                return b
        raise ValueError(f"no backend {name!r}; expected one of {list(BACKENDS)}")

    def to_dict(self) -> dict[str, Any]:
        return {"format": "vtakit.compare", "version": 1, **asdict(self)}

    def to_json(self) -> str:
        """The report as strict JSON (RFC 8259): a NaN or infinite number (a difference
        between outputs that overflowed, a ratio over zero samples) is written as ``null``,
        as a figure that does not apply is, never as a ``NaN`` / ``Infinity`` literal."""
        return json.dumps(_finite(self.to_dict()), indent=2, allow_nan=False)

    def agreement_line(self) -> str:
        """The int8-CPU vs accelerator verdict, loud when they differ."""
        a = self.accelerator
        if a.bit_identical:
            return f"int8-CPU vs accelerator: bit-identical on all {self.samples} samples"
        return (f"MISMATCH: int8-CPU vs accelerator differ on {a.mismatched_samples} of "
                f"{self.samples} samples (max |diff| "
                f"{_num(self.backend('vta').max_abs_diff_vs_int8)}); the accelerator path is "
                f"wrong for this model or configuration")

    def summary_table(self) -> str:
        """The three backends side by side, and the accelerator's figures."""
        a = self.accelerator
        head = (f"{self.model}: {self.samples} samples ({self.data}); calibration: "
                f"{self.calib}")
        rows = [f"{'':<9} {'accuracy':>8} {'top-1=fp32':>10} {'max|diff| vs fp32':>17} "
                f"{'vs int8-CPU':>11} {'latency/sample':>15}"]
        for b in self.backends:
            lat = (f"{b.latency_ms:.3f} ms" if b.latency_ms is not None
                   else f"{a.time_us / 1e3:.3f} ms*")
            rows.append(f"{b.name:<9} {_pct(b.accuracy):>8} {_pct(b.top1_vs_fp32):>10} "
                        f"{_num(b.max_abs_diff_vs_fp32):>17} {_num(b.max_abs_diff_vs_int8):>11} "
                        f"{lat:>15}")
        reads = ", ".join(f"{k} {v:,}" for k, v in sorted(a.dram_read_bytes.items()))
        util = (f"MAC utilisation {_pct(a.mac_utilisation)} (useful {_pct(a.useful_utilisation)}"
                f": {a.model_macs:,} model MACs of {a.macs_per_cycle} per cycle)")
        acc = [f"* accelerator ({a.device}, config {a.config} {a.config_hash}): "
               f"{a.cycles:,} cycles/sample = {a.time_us:.1f} us at {a.clock_mhz:g} MHz"
               + (f" (spread {a.cycles_min:,}..{a.cycles_max:,})"
                  if a.cycles_min != a.cycles_max else "")
               + f", {a.regions} stream(s), host CPU steps {a.host_cpu_ms:.3f} ms",
               f"  {util}"]
        if a.dram_write_bytes is not None:
            total = sum(a.dram_read_bytes.values())
            acc.append(f"  DRAM/sample: read {total:,} B ({reads}), write "
                       f"{a.dram_write_bytes:,} B")
        acc.append(f"  {a.device} ran {self.samples} samples in {a.device_seconds:.2f} s")
        return "\n".join([head, "", *rows, "", *self.offload.lines(), "", *acc, "",
                          self.agreement_line()])

    def layer_table(self) -> str:
        """One row per step of the accelerator's plan."""
        w = max([len(r.name) for r in self.layers] + [5])
        rows = [f"{'layer':<{w}} {'op':<17} {'ran on':<6} {'MACs':>9} {'cycles':>8} "
                f"{'time us':>9} {'cpu-int8 us':>11} {'MAC util':>8} {'useful':>7}  note"]
        for r in self.layers:
            cyc = f"{r.cycles:,}" if r.cycles is not None else "-"
            macs = f"{r.macs:,}" if r.macs else "-"
            t = f"{r.time_us:.2f}" + ("" if r.backend == "vta" else "*")
            cpu = f"{r.cpu_int8_us:.2f}" if r.cpu_int8_us is not None else "-"
            rows.append(f"{r.name:<{w}} {r.op:<17} {r.backend:<6} {macs:>9} {cyc:>8} {t:>9} "
                        f"{cpu:>11} {_pct(r.mac_utilisation):>8} "
                        f"{_pct(r.useful_utilisation):>7}  {r.note}".rstrip())
        total = sum(r.cycles or 0 for r in self.layers)
        rows.append(f"time us: accelerator layers at {self.accelerator.clock_mhz:g} MHz "
                    f"(each layer its own stream: {total:,} cycles in all), * measured on "
                    f"the host")
        return "\n".join(rows)

    def table(self) -> str:
        parts = [self.summary_table(), "", self.layer_table()]
        parts += [f"note: {n}" for n in self.notes]
        return "\n".join(parts)


def _finite(obj: Any) -> Any:
    """`obj` (JSON-able: dicts, lists, numbers, strings) with every NaN or infinite float
    replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _pct_floor(v: float | None) -> str:
    """A share rounded down to 0.01 %, so that 100.00% means all of it."""
    return "-" if v is None else f"{math.floor(10000 * v) / 100:.2f}%"


def check_percent(value: Any, what: str = "require_offload") -> float:
    """`value` as a percentage, a float from 0 to 100 (a number, or text that is one);
    `TypeError` / `ValueError` naming `what` and what was received otherwise."""
    expect = "expected a percentage, a number from 0 to 100 (e.g. 90)"
    if isinstance(value, bool) or not isinstance(value, (int, float, str, np.integer,
                                                         np.floating)):
        raise TypeError(f"{what}: got {type(value).__name__} {value!r}; {expect}")
    try:
        pct = float(value)
    except ValueError:
        raise ValueError(f"{what}: got {value!r}; {expect}") from None
    if not 0 <= pct <= 100:  # NaN too
        raise ValueError(f"{what}: got {value!r}; {expect}")
    return pct


def _num(v: float | None) -> str:
    return "-" if v is None else "0" if v == 0 else f"{v:.4g}"


def is_digits_model(model: onnx.ModelProto) -> bool:
    """Whether `model` is `vtakit.digits`'s CNN (its test split and calibration set apply)."""
    return model.producer_name == "vtakit.digits" and model.graph.name == "digits_cnn"


def load_data(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray | None]:
    """The arrays ``x`` (inputs, first axis = samples) and ``y`` (labels, optional) of a .npz
    file. `FileNotFoundError`, `ValueError` say what was wrong."""
    path = Path(path)
    expect = "a .npz file with an array 'x' (inputs, N samples) and optionally 'y' (labels, N)"
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} not found; expected {expect}")
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"data file {path} cannot be read ({err}); expected {expect}") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError(f"data file {path} holds one array of shape {np.shape(z)}, not "
                         f"named arrays; expected {expect} (np.savez(path, x=..., y=...))")
    with z:
        if "x" not in z.files:
            raise ValueError(f"data file {path} has arrays {sorted(z.files)}; expected {expect}")
        return z["x"], (z["y"] if "y" in z.files else None)


@dataclass
class _Input:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


def _check_data(x: np.ndarray, y: np.ndarray | None, inputs: Sequence[_Input], source: str
                ) -> tuple[np.ndarray, np.ndarray | None]:
    if len(inputs) != 1:
        raise ValueError(f"{source}: the model has {len(inputs)} inputs "
                         f"{[i.name for i in inputs]}; data arrays x/y fit one-input models "
                         f"(run without --data for random inputs)")
    inp = inputs[0]
    x = np.asarray(x)
    sample = inp.shape[1:]
    want = "(N, " + ", ".join(str(d) for d in sample) + ")"
    if x.ndim != len(inp.shape) or x.shape[1:] != sample or len(x) == 0:
        raise ValueError(f"{source}: x has shape {x.shape}; the model's input {inp.name!r} "
                         f"takes {inp.shape}, so expected {want} with N >= 1")
    if not np.can_cast(x.dtype, inp.dtype, "same_kind"):
        raise TypeError(f"{source}: x has dtype {x.dtype}; the model's input {inp.name!r} is "
                        f"{inp.dtype} (expected numbers castable to it)")
    x = x.astype(inp.dtype, copy=False)
    if y is not None:
        y = np.asarray(y)
        if y.dtype.kind not in "iu":
            raise TypeError(f"{source}: y has dtype {y.dtype}; expected integer class labels")
        if y.shape != (len(x),):
            raise ValueError(f"{source}: y has shape {y.shape} for {len(x)} samples of x; "
                             f"expected ({len(x)},), one label per sample")
        y = y.astype(np.int64)
    return x, y


def _random_inputs(inputs: Sequence[_Input], n: int, rng: np.random.Generator
                   ) -> list[np.ndarray]:
    out = []
    for inp in inputs:
        shape = (n, *inp.shape[1:])
        if inp.dtype.kind == "f":
            out.append(rng.standard_normal(shape).astype(inp.dtype))
        elif inp.dtype.kind == "b":
            out.append(rng.integers(0, 2, shape).astype(inp.dtype))
        else:
            out.append(rng.integers(0, 16, shape).astype(inp.dtype))
    return out


def _classes(y: np.ndarray) -> np.ndarray | None:
    """Top-1 of a batch of class scores (None when each sample has one value)."""
    flat = y.reshape(len(y), -1)
    return flat.argmax(1) if flat.shape[1] > 1 else None


def _model_name(model: Any, proto: onnx.ModelProto) -> str:
    if isinstance(model, (str, os.PathLike)):
        return Path(model).stem
    return proto.graph.name or "model"


@contextmanager
def _null_bar(label: str, length: int) -> Iterator[Any]:
    class _Bar:
        def update(self, n: int) -> None:
            pass

    yield _Bar()


def compare(model: str | os.PathLike | onnx.ModelProto, *, config: str = "default",
            device: str = "sim", data: str | os.PathLike | tuple[np.ndarray, Any] | None = None,
            calib: Any = None, samples: int | None = None, seed: int = 0,
            out_dir: str | os.PathLike | None = None,
            progress: ProgressFactory | None = None,
            log: Callable[[str], object] | None = None) -> CompareReport:
    """Run `model` as fp32 on the CPU, int8 on the CPU and int8 on the accelerator.

    Parameters
    ----------
    model : path or onnx.ModelProto
    config : str
        The accelerator's hardware configuration: a preset name or a JSON file.
    device : str
        ``"sim"`` (the cycle-accurate simulator) or ``"rtl"`` (the core's Verilog, Verilator).
    data : path, (x, y) or None
        A .npz with ``x`` (N samples of the model's input) and optionally ``y`` (labels), or
        the arrays themselves (``y`` may be None). None: the digits model's test split for the
        digits model, else `DEFAULT_RANDOM_SAMPLES` standard-normal inputs drawn from `seed`.
    calib : path, array or None
        Calibration data (see `compiler.quantize.calibrate.load_calibration`). None: the digits
        model's calibration set, else the first `DATA_CALIB_SAMPLES` samples of `data`, else
        random inputs.
    samples : int or None
        Use the first `samples` samples (all when None).
    seed : int
        Seed of the random inputs and calibration.
    out_dir : path or None
        Write ``report.json``, ``layers.png`` and (``sim``) ``trace.json`` here.
    progress : callable or None
        A progress-bar factory (`ProgressFactory`), e.g. wrapping ``click.progressbar``.
    log : callable or None
        Called with a line for each stage (compiling, profiling...).

    Raises
    ------
    FileNotFoundError, ValueError, TypeError
        Bad input (a missing file, wrong arrays in the data, shapes or dtypes that do not fit
        the model), each saying what was received and what was expected.
    """
    say = log or (lambda s: None)
    if device not in ("sim", "rtl", "pynq") and not (
            isinstance(device, str) and device.startswith(("fpga:", "pynq:"))):
        raise ValueError(f"compare: device={device!r}; expected 'sim', 'rtl', "
                         f"'fpga:PORT[@BAUD]' or 'pynq[:BITFILE]'")
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int)
                                or samples < 1):
        raise ValueError(f"compare: samples={samples!r}; expected an int >= 1 or None")
    proto, inputs, classes = _load_model(model)
    name = _model_name(model, proto)
    xs, labels, source = _samples(proto, inputs, data, samples, seed)
    notes = []
    if labels is not None and classes < 2:
        notes.append("the labels were not used: the model's first output is not class scores")
        labels = None
    if labels is not None and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"{source}: y holds labels {labels.min()}..{labels.max()}; the model's "
                         f"first output scores {classes} classes (expected labels 0.."
                         f"{classes - 1})")
    calib_data, calib_source = _calibration(proto, inputs, xs, data, calib, seed)
    plans = _compile(proto, config, calib_data, say)
    meta = plans.vta.sections["vta"].meta if "vta" in plans.vta.sections else {}
    if meta:
        cfg = HwConfig.from_dict(meta["config"])
    else:
        from vtakit.compiler.backend.vta import resolve_config

        cfg = resolve_config(config)
    fallback = (dict(meta["cpu_fallback"]) if "cpu_fallback" in meta
                else _fallback_reasons(plans.graph, cfg))
    offload = _offload(plans, fallback)
    runs = _run(plans, inputs, xs, device, progress or _null_bar, say)
    report = _build_report(name=name, source=source, calib_source=calib_source, labels=labels,
                           runs=runs, cfg=cfg, config=config, device=device, meta=meta,
                           fallback=fallback, offload=offload, graph=plans.graph)
    report.notes[:0] = notes
    if out_dir is not None:
        _write_files(report, Path(out_dir), plans.vta, inputs, xs, device, cfg, say)
    return report


def _load_model(model: Any) -> tuple[onnx.ModelProto, list[_Input], int]:
    """The model, its inputs (batch 1) and the size of one sample of its first output (the
    number of classes, for a classifier); `InvalidModelError` for a file that is not one."""
    from vtakit.compiler.frontend.onnx import import_onnx

    if isinstance(model, (str, os.PathLike)):
        if not Path(model).is_file():
            raise FileNotFoundError(f"model file {model} not found; expected an ONNX model")
    elif not isinstance(model, onnx.ModelProto):
        raise TypeError(f"compare: model must be a path or an onnx.ModelProto, got "
                        f"{type(model).__name__}")
    g = import_onnx(model, batch_size=1)
    inputs = [_Input(n.name, np.dtype(n.dtype.np), tuple(n.shape)) for n in g.inputs]
    for inp in inputs:
        if inp.shape[:1] != (1,):
            raise ValueError(f"compare: the model's input {inp.name!r} has shape {inp.shape}; "
                             f"compare runs one sample at a time (expected a batch of 1 or a "
                             f"symbolic batch dimension)")
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model)
    return proto, inputs, int(np.prod(g.outputs[0].shape[1:]))


def _samples(proto: onnx.ModelProto, inputs: Sequence[_Input], data: Any, samples: int | None,
             seed: int) -> tuple[list[np.ndarray], np.ndarray | None, str]:
    """The inputs (one array per model input, first axis = samples), labels, and a description:
    `data`, the digits test split, or random."""
    labels: np.ndarray | None = None
    if data is None and is_digits_model(proto):
        from vtakit import digits

        x, labels = digits.test_split()
        xs, source = [x], "the digits test split"
    elif data is None:
        xs = _random_inputs(inputs, samples or DEFAULT_RANDOM_SAMPLES,
                            np.random.default_rng(seed))
        source = f"random standard-normal inputs, seed {seed}"
    else:
        if isinstance(data, tuple):
            if len(data) != 2:
                raise ValueError(f"compare: data as a tuple must be (x, y), got {len(data)} "
                                 f"items")
            raw_x, raw_y = data
            source = "the arrays given"
        else:
            raw_x, raw_y = load_data(data)
            source = str(data)
        x, labels = _check_data(raw_x, raw_y, inputs, source)
        xs = [x]
    n = len(xs[0]) if samples is None else min(samples, len(xs[0]))
    return [a[:n] for a in xs], (None if labels is None else labels[:n]), source


def _calibration(proto: onnx.ModelProto, inputs: Sequence[_Input], xs: Sequence[np.ndarray],
                 data: Any, calib: Any, seed: int) -> tuple[Any, str]:
    """`calib`, the digits calibration set, the first samples of `data`, or random inputs."""
    if calib is not None:
        return calib, (str(calib) if isinstance(calib, (str, os.PathLike))
                       else "the arrays given")
    if is_digits_model(proto):
        from vtakit import digits

        return digits.calibration_set(), "the digits calibration set"
    if data is not None:
        k = min(DATA_CALIB_SAMPLES, len(xs[0]))
        return ([{i.name: a[j:j + 1] for i, a in zip(inputs, xs)} for j in range(k)],
                f"the first {k} samples of the data")
    r = _random_inputs(inputs, RANDOM_CALIB_SAMPLES, np.random.default_rng(seed + 1))
    return ([{i.name: a[j:j + 1] for i, a in zip(inputs, r)}
             for j in range(RANDOM_CALIB_SAMPLES)],
            f"{RANDOM_CALIB_SAMPLES} random inputs, seed {seed + 1}")


@dataclass
class _Plans:
    fp32: Any
    int8: Any
    vta: Any
    graph: Any                  # the integer graph the accelerator's plan was lowered from
    on_vta: frozenset[int]      # id() of its nodes the accelerator runs
    quant: Any                  # the quantiser's report (which nodes it kept in float)


def _compile(proto: onnx.ModelProto, config: str, calib: Any, say: Callable[[str], object]
             ) -> _Plans:
    from vtakit.compiler.compile import lower_model, lower_model_graph

    say("compiling: fp32 for the CPU")
    p32 = lower_model(proto, target="cpu")
    say("compiling: int8 for the CPU")
    p8 = lower_model(proto, target="cpu", quantize=True, calib=calib)
    say(f"compiling: int8 for the accelerator (config {config})")
    # the integer graph and the nodes the accelerator took: the offload is counted on them
    pv, sections, g, quant = lower_model_graph(proto, target="vta", options={"config": config},
                                               quantize=True, calib=calib)
    taken: frozenset[int] = next((s.taken for s in sections if s.backend == "vta"),
                                 frozenset())
    return _Plans(p32, p8, pv, g, frozenset(id(g.nodes[i]) for i in taken), quant)


def node_macs(n: Any) -> int:
    """The multiply-accumulates of a graph node: a convolution's ``N*OC*OH*OW * IC/groups*KH*KW``
    (its output's size times one output's share of the weights), a transposed convolution's
    ``N*IC*IH*IW * OC/groups*KH*KW``, a matmul's or gemm's ``M*N*K``; 0 for any other node. The
    formula of the accelerator's layers' ``macs`` (docs/vta.md)."""
    from vtakit.compiler.ir.ops import GemmAttrs, Op

    op = n.op
    if op in (Op.CONV, Op.CONV_INTEGER, Op.QLINEAR_CONV):
        w = n.src[3 if op is Op.QLINEAR_CONV else 1]
        return int(math.prod(n.shape) * math.prod(w.shape[1:]))
    if op is Op.CONV_TRANSPOSE:
        return int(math.prod(n.src[0].shape) * math.prod(n.src[1].shape[1:]))
    if op in (Op.MATMUL, Op.MATMUL_INTEGER, Op.QLINEAR_MATMUL):
        a = n.src[0].shape
        return int(math.prod(n.shape) * (a[-1] if a else 1))
    if op is Op.GEMM:
        a = n.src[0].shape
        trans = isinstance(n.attrs, GemmAttrs) and n.attrs.trans_a
        return int(math.prod(n.shape) * (a[0] if trans else a[-1]))
    return 0


def _fallback_reasons(g: Any, cfg: HwConfig) -> dict[str, str]:
    """The accelerator backend's ``cpu_fallback`` of a plan it took no node of (the plan then
    has no ``vta`` section to keep it): its layer finder's reasons, and each layer's that no
    tiling fits."""
    from vtakit.compiler.backend.vta import requant_programs
    from vtakit.compiler.backend.vta.layers import find_layers
    from vtakit.compiler.backend.vta.schedule import NoSchedule, choose

    layers, why = find_layers(g, cfg)
    for L in layers:
        try:
            choose(L, requant_programs(L, cfg), cfg)
        except NoSchedule as err:
            why[L.name] = str(err)
    return why


def _offload(plans: _Plans, fallback: dict[str, str]) -> OffloadResult:
    """The accelerator's share of the integer graph's MACs and of the plan's steps; the CPU
    fallbacks (`fallback`: node -> reason) and the other nodes with MACs on the CPU."""
    from vtakit.compiler.ir.ops import Op

    g = plans.graph
    by_name = {n.name: n for n in g.nodes if n.name}
    kept = {r.name: r.kind for r in getattr(plans.quant, "layers", [])
            if r.kind.startswith("float")}
    explained: set[int] = set()
    fb = []
    for key, reason in fallback.items():
        n = by_name.get(key)
        if n is not None and not node_macs(n) and n.op is Op.REQUANTIZE and n.src \
                and node_macs(n.src[0]):
            n = n.src[0]  # a layer named after its requantisation: the work is its source's
        if n is not None:
            explained.add(id(n))
        fb.append(CpuNode(key, n.op.value if n is not None else "?",
                          node_macs(n) if n is not None else 0, str(reason)))
    total = acc = 0
    none = []
    for n in g.nodes:
        m = node_macs(n)
        total += m
        if id(n) in plans.on_vta:
            acc += m
        elif m and id(n) not in explained:
            dt = np.dtype(n.dtype.np).name
            if n.dtype.is_float:
                how = kept.get(n.name, "float")
                how = how[how.find("(") + 1:-1] if "(" in how else "not quantised"
                why = (f"{dt}: kept in float by the quantiser ({how}); the accelerator runs "
                       f"int8 layers")
            else:
                why = f"{dt} {n.op.value}: no accelerator layer takes this operation"
            none.append(CpuNode(n.name, n.op.value, m, why))
    steps = plans.vta.steps
    on = sum(s.backend == "vta" for s in steps)
    return OffloadResult(total, acc, acc / total if total else None, len(steps), on,
                         on / len(steps) if steps else None, fb, none)


@dataclass
class _Runs:
    outs: dict[str, list[list[np.ndarray]]]   # backend -> sample -> outputs
    latency_s: dict[str, list[float]]         # the CPU plans' host time per sample
    cycles: list[int]                         # the accelerator's, per sample
    last_stats: list[Any]                     # per region, of the last sample
    device_s: float
    prof8: list[Any]                          # the int8 CPU plan's profile
    profv: list[Any]                          # the accelerator plan's
    profv_cpu: list[Any]                      # its CPU steps, averaged over more profiles
    layer_runs: list[Any]


def _set(ex: Any, inputs: Sequence[_Input], xs: Sequence[np.ndarray], j: int) -> None:
    for i, a in zip(inputs, xs):
        ex.set_input(i.name, a[j:j + 1])


def _outputs(ex: Any) -> list[np.ndarray]:
    return [ex.get_output(k) for k in range(len(ex.output_names))]


def _run(plans: _Plans, inputs: Sequence[_Input], xs: Sequence[np.ndarray], device: str,
         bar: ProgressFactory, say: Callable[[str], object]) -> _Runs:
    """Every sample through each plan (one plan after the other, so that the CPU's timings do
    not share caches with the simulator), then the per-step profiles on the first sample."""
    from vtakit.runtime.executor import GraphExecutor

    n = len(xs[0])
    on_vta = "vta" in plans.vta.backends
    say("preparing the executors")
    ex32 = GraphExecutor(plans.fp32)
    ex8 = GraphExecutor(plans.int8)
    exv = GraphExecutor(plans.vta, runner_options={"vta": {"device": device}} if on_vta
                        else None)
    try:
        runs = _Runs({b: [] for b in BACKENDS}, {"cpu-fp32": [], "cpu-int8": []}, [], [], 0.0,
                     [], [], [], [])
        for key, ex in (("cpu-fp32", ex32), ("cpu-int8", ex8), ("vta", exv)):
            label = f"{key} ({device})" if key == "vta" else key
            if key != "vta":  # a first run pays for page faults and lazy set-up
                _set(ex, inputs, xs, 0)
                ex.run()
            with bar(f"{label:<16}", n) as b:
                for j in range(n):
                    _set(ex, inputs, xs, j)
                    t0 = time.perf_counter()
                    ex.run()
                    dt = time.perf_counter() - t0
                    runs.outs[key].append(_outputs(ex))
                    if key != "vta":
                        runs.latency_s[key].append(dt)
                    else:
                        runs.device_s += dt
                    if key == "vta" and on_vta:
                        done = [r for r in ex.runners["vta"].last_runs if r is not None]
                        runs.cycles.append(sum(r.cycles for r in done))
                        runs.last_stats = [r.stats for r in done]
                    b.update(1)
        say("profiling every step on the first sample")
        _set(ex8, inputs, xs, 0)
        runs.prof8 = _median_profile([ex8.profile() for _ in range(PROFILE_REPEAT)])
        _set(exv, inputs, xs, 0)
        runs.profv, runs.profv_cpu = _profile_accelerator_plan(exv)
        runs.layer_runs = list(exv.runners["vta"].layer_runs) if on_vta else []
    finally:
        for ex in (ex32, ex8, exv):
            ex.close()
    return runs


def _median_profile(runs: Sequence[Sequence[Any]]) -> list[Any]:
    """Each step's median time over several profiles (one slow outlier, a thread waking up,
    must not make a microsecond step look slow)."""
    return [s._replace(ms=statistics.median(r[k].ms for r in runs))
            for k, s in enumerate(runs[0])]


def _profile_accelerator_plan(exv: Any) -> tuple[list[Any], list[Any]]:
    """The accelerator plan's profile, and its CPU steps' median over more profiles: up to
    `PROFILE_REPEAT`, within about `PROFILE_BUDGET_S` (each profile runs the accelerator
    layers too, which make the CPU steps' inputs)."""
    t0 = time.perf_counter()
    runs = [exv.profile()]
    once = time.perf_counter() - t0
    more = min(PROFILE_REPEAT, int(PROFILE_BUDGET_S / max(once, 1e-6))) - 1
    runs += [exv.profile() for _ in range(max(more, 0))]
    cpu = [s for s in _median_profile(runs) if s.backend != "vta"]
    return list(runs[-1]), cpu


def _max_diff(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> float:
    return max((float(np.max(np.abs(u.astype(np.float64) - v.astype(np.float64))))
                for sa, sb in zip(a, b) for u, v in zip(sa, sb) if u.size), default=0.0)


def _top1(outs: list[list[np.ndarray]]) -> np.ndarray | None:
    got = [_classes(s[0]) for s in outs]
    if any(g is None for g in got):
        return None
    return np.concatenate([g for g in got if g is not None])


def _build_report(*, name: str, source: str, calib_source: str, labels: np.ndarray | None,
                  runs: _Runs, cfg: HwConfig, config: str, device: str, meta: dict[str, Any],
                  fallback: dict[str, str], offload: OffloadResult, graph: Any
                  ) -> CompareReport:
    from vtakit.vta_sim import SimStats

    notes: list[str] = []
    outs, cycles = runs.outs, runs.cycles
    n = len(outs["cpu-fp32"])
    top = {k: _top1(v) for k, v in outs.items()}

    def acc(k: str) -> float | None:
        t = top[k]
        return None if t is None or labels is None else float(np.mean(t == labels))

    def agree(k: str) -> float | None:
        t, f = top[k], top["cpu-fp32"]
        return None if t is None or f is None else float(np.mean(t == f))

    mismatched = sum(any(u.tobytes() != v.tobytes() for u, v in zip(sa, sb))
                     for sa, sb in zip(outs["cpu-int8"], outs["vta"]))
    backends = [
        BackendResult("cpu-fp32", acc("cpu-fp32"), agree("cpu-fp32"), 0.0, None,
                      1e3 * statistics.median(runs.latency_s["cpu-fp32"])),
        BackendResult("cpu-int8", acc("cpu-int8"), agree("cpu-int8"),
                      _max_diff(outs["cpu-int8"], outs["cpu-fp32"]), 0.0,
                      1e3 * statistics.median(runs.latency_s["cpu-int8"])),
        BackendResult("vta", acc("vta"), agree("vta"), _max_diff(outs["vta"], outs["cpu-fp32"]),
                      _max_diff(outs["vta"], outs["cpu-int8"]), None),
    ]

    layer_meta = {lm["name"]: lm for r in meta.get("regions", []) for lm in r["layers"]}
    model_macs = sum(int(lm["macs"]) for lm in layer_meta.values())
    mpc = cfg.macs_per_cycle
    mean_cycles = round(statistics.fmean(cycles)) if cycles else 0
    sim = [s for s in runs.last_stats if isinstance(s, SimStats)]
    sim_all = bool(runs.last_stats) and len(sim) == len(runs.last_stats)
    reads: dict[str, int] = {}
    for s in sim:
        for k, v in s.dram_read_bytes.items():
            reads[k] = reads.get(k, 0) + int(v)
    gemm_macs = sum(s.gemm_macs for s in sim) if sim_all else None
    last_cycles = sum(s.cycles for s in sim) if sim_all else 0
    if not meta.get("regions"):
        notes.append("no layer of this model ran on the accelerator")
    accel = AcceleratorResult(
        device=device, config=config, config_hash=cfg.hash, clock_mhz=cfg.clock_mhz,
        macs_per_cycle=mpc, regions=len(meta.get("regions", [])), cycles=mean_cycles,
        cycles_min=min(cycles, default=0), cycles_max=max(cycles, default=0),
        time_us=mean_cycles / cfg.clock_mhz,
        model_macs=model_macs, gemm_macs=gemm_macs,
        mac_utilisation=(gemm_macs / (last_cycles * mpc)
                         if gemm_macs is not None and last_cycles else None),
        useful_utilisation=model_macs / (mean_cycles * mpc) if mean_cycles else 0.0,
        dram_read_bytes=reads if sim_all else {},
        dram_write_bytes=sum(s.dram_write_bytes for s in sim) if sim_all else None,
        host_cpu_ms=sum(s.ms for s in runs.profv_cpu),
        bit_identical=mismatched == 0, mismatched_samples=mismatched, cpu_fallback=fallback,
        device_seconds=runs.device_s)

    # Per layer: the accelerator plan's steps; the int8 CPU plan's time for the same node.
    vnames = {s.name for s in runs.profv}
    cpu_ms = {s.name: s.ms for s in runs.profv_cpu}
    by_name = {lr.name: lr for lr in runs.layer_runs}
    macs = {n.name: node_macs(n) for n in graph.nodes if n.name}
    no_pattern = {r.name: r.reason for r in offload.no_pattern}
    layers = []
    for s in runs.profv:
        int8 = [p.ms for p in runs.prof8 if p.name == s.name
                or (p.name.startswith(s.name + ":") and p.name not in vnames)]
        cpu_us = 1e3 * sum(int8) if int8 else None
        node = s.name.split(":")[0]
        note = str(fallback.get(s.name, fallback.get(node, no_pattern.get(s.name, ""))))
        lr = by_name.get(s.name) if s.backend == "vta" else None
        if lr is not None:
            st = lr.stats if isinstance(lr.stats, SimStats) else None
            gemm = bool(lr.macs)  # utilisation means nothing for a layer without MACs (pool)
            layers.append(LayerResult(
                s.name, s.op, s.backend, int(lr.macs), int(lr.cycles),
                lr.cycles / cfg.clock_mhz, cpu_us,
                st.mac_utilisation if st is not None and gemm else None,
                lr.macs / (lr.cycles * mpc) if lr.cycles and gemm else None,
                (sum(st.dram_read_bytes.values()) + st.dram_write_bytes)
                if st is not None else None, note))
        else:
            layers.append(LayerResult(s.name, s.op, s.backend, macs.get(s.name, 0), None,
                                      1e3 * cpu_ms.get(s.name, s.ms), cpu_us, None, None,
                                      None, note))
    return CompareReport(name, n, source, calib_source, labels is not None, backends, accel,
                         layers, offload, notes=notes)


def _write_files(report: CompareReport, out: Path, plan: Any, inputs: Sequence[_Input],
                 xs: Sequence[np.ndarray], device: str, cfg: Any,
                 say: Callable[[str], object]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if device == "sim" and "vta" in plan.backends:
        from vtakit.driver.devices.sim import SimDevice
        from vtakit.runtime.executor import GraphExecutor

        say("tracing one accelerator run")
        path = out / "trace.json"
        dev = SimDevice(cfg, dram_bytes=1 << 30, trace=path)
        ex = GraphExecutor(plan, runner_options={"vta": {"device": dev}})
        try:
            for i, a in zip(inputs, xs):
                ex.set_input(i.name, a[:1])
            ex.run()
        finally:
            ex.close()
        report.files["trace"] = str(path)
        if report.accelerator.regions > 1:
            report.notes.append(f"the trace holds the last of the {report.accelerator.regions} "
                                f"streams of one sample")
    elif device != "sim":
        report.notes.append(f"no trace: the {device} device does not write one (use --device "
                            f"sim)")
    plot = out / "layers.png"
    plot_layers(report, plot)
    report.files["plot"] = str(plot)
    path = out / "report.json"
    report.files["report"] = str(path)
    text = report.to_json() + "\n"
    try:
        path.write_text(text)
    except OSError as err:  # a full disk's write names no file
        if err.filename is None:
            err.filename = str(path)
        raise


def plot_layers(report: CompareReport, path: str | os.PathLike) -> None:
    """A PNG of the per-layer breakdown: time per step (accelerator at its clock, the CPU int8
    plan measured) and the accelerator layers' MAC utilisation."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise ImportError("the per-layer plot needs matplotlib: pip install matplotlib (or "
                          "'vtakit[compare]')") from None

    a = report.accelerator
    names = [r.name for r in report.layers]
    pos = np.arange(len(names))
    # A bare Figure draws with Agg and leaves pyplot's global state (and backend) alone.
    fig = Figure(figsize=(max(6.0, 0.9 * len(names) + 2), 7))
    ax_t, ax_u = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    here = [r.time_us for r in report.layers]
    colors = ["tab:orange" if r.backend == "vta" else "tab:gray" for r in report.layers]
    cpu = [r.cpu_int8_us or 0.0 for r in report.layers]
    ax_t.bar(pos - 0.2, here, 0.4, color=colors)
    ax_t.bar(pos + 0.2, cpu, 0.4, color="tab:blue")
    ax_t.set_yscale("log")
    shown = [v for v in here + cpu if v > 0] or [1.0]
    ax_t.set_ylim(min(shown) / 2, max(shown) * 12)  # a decade of room for the legend
    ax_t.set_ylabel("time per sample (us)")
    ax_t.legend(handles=[
        Patch(color="tab:orange", label="vta layer at the clock (cycles on top)"),
        Patch(color="tab:gray", label="its plan's CPU step (host)"),
        Patch(color="tab:blue", label="cpu-int8 plan (host)")],
        fontsize=8, loc="upper left", ncol=3)
    ax_t.set_title(f"{report.model}: config {a.config} ({a.config_hash}), "
                   f"{a.macs_per_cycle} MACs/cycle at {a.clock_mhz:g} MHz, device {a.device}",
                   fontsize=10)
    for k, r in enumerate(report.layers):
        if r.cycles is not None:
            ax_t.annotate(f"{r.cycles:,}", (pos[k] - 0.2, r.time_us), ha="center",
                          va="bottom", fontsize=7)
    hw = [100 * (r.mac_utilisation or 0.0) for r in report.layers]
    useful = [100 * (r.useful_utilisation or 0.0) for r in report.layers]
    ax_u.bar(pos - 0.2, hw, 0.4, color="tab:orange", label="MAC utilisation (executed)")
    ax_u.bar(pos + 0.2, useful, 0.4, color="tab:green", label="useful (model MACs)")
    ax_u.set_ylabel("% of peak")
    ax_u.set_ylim(0, 100)
    ax_u.legend(fontsize=8, loc="upper left", ncol=2)
    ax_u.set_xticks(pos, names, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
