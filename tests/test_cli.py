import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from vtakit import __version__
from vtakit.cli import main
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import PRESETS, HwConfig, preset
from vtakit.vta_hw.disasm import parse_line


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and __version__ in result.output


def test_config_list_names_every_preset():
    result = run("config", "list")
    assert result.exit_code == 0
    for name, cfg in PRESETS.items():
        line = next(ln for ln in result.output.splitlines() if ln.startswith(name + " "))
        assert f"{cfg.batch}x{cfg.block_in}x{cfg.block_out}" in line and cfg.hash in line


@pytest.mark.parametrize("name", list(PRESETS))
def test_config_show_json_round_trips(name):
    result = run("config", "show", name, "--json")
    assert result.exit_code == 0
    assert HwConfig.from_json(result.output) == preset(name)


def test_config_show_text():
    result = run("config", "show", "default")
    assert result.exit_code == 0
    assert "log_block_in               4" in result.output
    assert "wgt buffer                 1024 x 256 B" in result.output
    assert "eb4589e8" in result.output


def test_config_show_from_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"LOG_BLOCK": 3, "LOG_INP_BUFF_SIZE": 14, "log_wgt_buff_size": 16,
                                "log_acc_buff_size": 16}))
    result = run("config", "show", str(path), "--json")
    assert result.exit_code == 0 and json.loads(result.output)["log_block_out"] == 3


def test_config_errors():
    result = run("config", "show", "pynq")
    assert result.exit_code == 2
    assert "unknown hardware configuration 'pynq'" in result.output
    assert "default, ecp5, ecp5-16x16, ice40, large" in result.output


def test_config_file_errors(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"log_block_in": 9}')
    result = run("config", "show", str(path))
    assert result.exit_code == 2
    assert "log_block_in=9 is out of range" in result.output


def _insns(cfg):
    lays = isa.layouts(cfg)
    return [
        isa.MemInsn(memory_type=isa.MemType.UOP, dram_base=1024, y_size=1, x_size=10,
                    x_stride=10),
        isa.MemInsn(memory_type=isa.MemType.INP, dram_base=256, y_size=4, x_size=4, x_stride=4,
                    y_pad_0=1, y_pad_1=1, x_pad_0=1, x_pad_1=1, push_next=1),
        isa.GemmInsn(pop_prev=1, uop_bgn=0, uop_end=9, iter_out=4, iter_in=4,
                     dst_factor_out=4, dst_factor_in=1, src_factor_out=6, src_factor_in=1,
                     wgt_factor_in=lays.gemm["wgt_factor_in"].max),
        isa.AluInsn(alu_opcode=isa.AluOp.SHR, use_imm=1, imm=-3, uop_bgn=9, uop_end=10,
                    push_next=1),
        isa.MemInsn(opcode=isa.Opcode.STORE, memory_type=isa.MemType.OUT, dram_base=2048,
                    y_size=4, x_size=4, x_stride=4, pop_prev=1),
        isa.FinishInsn(),
    ]


@pytest.mark.parametrize("name", list(PRESETS))
def test_disasm_prints_back_the_fields(tmp_path, name):
    cfg = preset(name)
    insns = _insns(cfg)
    path = tmp_path / "prog.bin"
    path.write_bytes(isa.encode_stream(insns, cfg))
    result = run("disasm", str(path), "--config", name)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert len(lines) == len(insns)
    for i, (line, insn) in enumerate(zip(lines, insns)):
        index, kind, fields = parse_line(line)
        assert index == i
        lay = isa.layouts(cfg).for_opcode(insn.opcode)
        assert fields == {f.name: int(getattr(insn, f.name)) for f in lay.fields}
    assert lines[1].split()[1] == "LOAD.INP" and lines[3].split()[1] == "ALU.SHR"
    assert "imm=-3" in lines[3]


@settings(max_examples=25, deadline=None)
@given(uops=st.lists(st.tuples(st.integers(0, 2047), st.integers(0, 2047),
                               st.integers(0, 1023)), min_size=1, max_size=12))
def test_disasm_uops(tmp_path_factory, uops):
    cfg = preset("default")
    path = tmp_path_factory.mktemp("u") / "uops.bin"
    path.write_bytes(isa.encode_uops([isa.Uop(*u) for u in uops], cfg).tobytes())
    result = run("disasm", "--uops", str(path))
    assert result.exit_code == 0
    got = [parse_line(line)[2] for line in result.output.splitlines()]
    assert [(g["dst"], g["src"], g["wgt"]) for g in got] == uops


def test_disasm_errors(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(b"\0" * 20)
    result = run("disasm", str(path))
    assert result.exit_code == 2  # bad input: one "Error:" line (tests/test_cli_errors.py)
    assert "whole number of 16-byte instructions, got 20 bytes" in result.output
    path.write_bytes(isa.encode_stream([isa.FinishInsn()], preset("default"))
                     + (5).to_bytes(16, "little"))
    result = run("disasm", str(path))
    assert result.exit_code == 2
    assert "instruction 1 (bytes 16..31): malformed instruction: opcode 5" in result.output
    result = run("disasm", str(tmp_path / "missing.bin"))
    assert result.exit_code == 2 and "does not exist" in result.output


def test_demo_runs_and_replays(tmp_path):
    image, trace = tmp_path / "run.npz", tmp_path / "trace.json"
    result = run("demo", "--config", "ecp5", "--save", str(image), "--trace", str(trace))
    assert result.exit_code == 0, result.output
    assert "outputs match numpy" in result.output
    cycles = next(ln for ln in result.output.splitlines() if ln.startswith("cycles"))
    replay = run("sim", str(image))
    assert replay.exit_code == 0
    assert cycles in replay.output  # the image replays to the same cycle count
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(e.get("ph") == "X" for e in events)


def test_sim_reports_device_errors(tmp_path):
    from vtakit.vta_sim import RunImage

    cfg = preset("default")
    stream = isa.encode_stream([isa.MemInsn(memory_type=isa.MemType.INP, dram_base=1 << 20,
                                            y_size=1, x_size=4, x_stride=4, push_next=1),
                                isa.FinishInsn(pop_prev=1)], cfg)
    dram = np.zeros(4096, np.uint8)
    dram[:len(stream)] = np.frombuffer(stream, np.uint8)
    RunImage(cfg, dram, 0, 2).save(tmp_path / "bad.npz")
    result = run("sim", str(tmp_path / "bad.npz"))
    assert result.exit_code == 1
    assert "instruction #0" in result.output and "DRAM" in result.output
