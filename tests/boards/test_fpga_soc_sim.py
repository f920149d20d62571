"""The ``fpga`` device against the board SoC itself: the whole ``Soc`` (core, register block,
memory, the real ``UartBridge``) under Verilator, its serial line modelled by cocotbext-uart
and served on a TCP socket (:mod:`vtakit.boards.soc_sim`). VTA's instruction tests run through
it too (``tests/conformance/test_vta_insn.py``, its ``fpga`` parametrisation); here: a
configuration mismatch refused at open, and frames corrupted on the line, rejected by the
gateware and retried (or reported) by the host, with a run that still gives the ``sim``
device's outputs and cycles."""

from __future__ import annotations

import re

import numpy as np
import pytest

from vtakit.driver import Session, SimDevice, Stage
from vtakit.vta_hw import bridge_protocol as p
from vtakit.vta_hw import isa
from vtakit.vta_hw.bridge_protocol import Command, Request, Status, StatusError
from vtakit.vta_hw.config import preset

CFG = preset("default")
MEM_BYTES = 512 << 10  # as the conformance suite's board: one build serves both
M, A = isa.MemType, isa.AluOp


@pytest.fixture(scope="module")
def board():
    from vtakit.boards.soc_sim import SocSimulation, build_soc_sim, missing_soc_tools

    why = missing_soc_tools()
    if why:
        pytest.skip(f"needs the SoC simulator: {why}")
    with SocSimulation(build_soc_sim(CFG, mem_bytes=MEM_BYTES)) as sim:
        yield sim


def test_the_bench_follows_request_frames():
    """The bench waits for the rest of a frame by its length field, and damages exactly one
    bit of a frame when told to."""
    pytest.importorskip("cocotb", reason="needs cocotb: pip install 'vtakit[rtl]'")
    from vtakit.boards.soc_bench import RequestFramer

    f = RequestFramer(256)
    write = p.encode_request(Request(Command.WRITE_MEM, 3, (0x100, 1, 2)))
    ident = p.encode_request(Request(Command.ID, 4, ()))
    # split anywhere: inside a frame until its CRC's last byte
    assert f.feed(write[:3]) == write[:3] and f.mid_frame
    assert f.feed(write[3:] + ident[:1]) == write[3:] + ident[:1] and f.mid_frame
    assert f.feed(ident[1:]) == ident[1:] and not f.mid_frame and f.frames == 2
    # bytes that start no frame pass as they are; a bad length ends the frame at its header
    assert f.feed(b"\x00\x11") == b"\x00\x11" and not f.mid_frame
    bad = bytes([p.REQUEST_SYNC, 1, 5, 3, 0])  # LEN 3
    assert f.feed(bad) == bad and not f.mid_frame and f.frames == 3
    # one bit of the payload's middle byte, or of the CRC's last byte without a payload
    f.corrupt = 2
    for frame, at in ((write, 5 + 6), (ident, len(ident) - 1)):
        out = f.feed(frame)
        assert [k for k in range(len(frame)) if out[k] != frame[k]] == [at]
        assert out[at] ^ frame[at] == 0x01
    assert (f.corrupted, f.corrupt, f.frames) == (2, 0, 5)


def _device(board, cfg=CFG, **kwargs):
    from vtakit.driver.devices.fpga import FpgaDevice

    # the timeouts allow for the simulation's speed (a few KB/s on the line)
    return FpgaDevice(cfg, board.url, timeout_s=60.0, poll_interval_s=0.01, **kwargs)


@pytest.mark.rtl
def test_configuration_mismatch_is_refused_at_open(board):
    other = preset("ecp5")
    port = re.escape(board.url)
    with pytest.raises(ValueError, match=(
            rf"^the board on {port} was built for configuration {CFG.hash} \(preset "
            rf"'default'\), ISA 0\.0\.2; the driver was given configuration {other.hash} "
            rf"\(preset 'ecp5', {re.escape(other.bitstream_name)}\), ISA 0\.0\.2: program the "
            rf"board with a bitstream of configuration {other.hash} or create the device with "
            rf"the board's configuration$")):
        _device(board, other)
    # the board answers the next host as before
    with _device(board) as dev:
        assert dev.identify().config_hash == CFG.hash


@pytest.mark.rtl
def test_corrupted_request_is_rejected_by_the_bridge(board):
    """Without retries the host reports the bridge's BAD_CRC, and the damaged WRITE_MEM was
    not executed; with them the write goes through on the second try; a request damaged on
    every try is reported with its status."""
    rng = np.random.default_rng(1)
    old, new = rng.bytes(64), rng.bytes(64)
    with _device(board, retries=0) as dev:
        dev.link.write_mem(0x400, old)
        before = board.stats()
        board.corrupt_requests(1)
        with pytest.raises(StatusError, match=(
                r"^WRITE_MEM \(seq \d+\) failed 1 time; last: the board answered BAD_CRC: "
                r".*; the line corrupts frames: check the cable, the baud rate and the "
                r"ground$")) as err:
            dev.link.write_mem(0x400, new)
        assert err.value.status == Status.BAD_CRC
        after = board.stats()
        assert after["corrupted"] - before["corrupted"] == 1
        assert after["frame_error"] == 1  # the SoC's frame-error LED
        assert dev.link.read_mem(0x400, 64) == old  # not executed
    with _device(board) as dev:
        failures = dev.link.failures
        board.corrupt_requests(1)
        dev.link.write_mem(0x400, new)
        assert dev.link.failures - failures == 1
        assert dev.link.read_mem(0x400, 64) == new
        board.corrupt_requests(3)  # every try of the next request
        with pytest.raises(StatusError, match=r"^READ_CSR \(seq \d+\) failed 3 times; last: the "
                                              r"board answered BAD_CRC: "):
            dev.link.read_csr(0)
        assert board.stats()["corrupted"] - after["corrupted"] == 4


def _relu_shift(s, a):
    """A small program: load ACC, ADD 3, SHR 1, MAX 0, store; returns (output, result)."""
    rows = a.shape[0]
    ad, yd = s.array(a), s.alloc(a.shape, np.int8)
    s.load_2d(ad, 0, x_size=rows, y_size=1, x_stride=rows, sram_base=0, memory_type=M.ACC)
    for op, imm in ((A.ADD, 3), (A.SHR, 1), (A.MAX, 0)):
        s.alu(s.uop_kernel((op, imm), lambda b: b.loop(rows, dst=1, src=1).push(0, 0),
                           mode="alu", alu_opcode=op, use_imm=True, imm=imm))
    s.dep_push(Stage.COMPUTE, Stage.STORE)
    s.dep_pop(Stage.COMPUTE, Stage.STORE)
    s.store_2d(yd, 0, x_size=rows, y_size=1, x_stride=rows, sram_base=0)
    result = s.synchronize()
    return yd.numpy(), result


@pytest.mark.rtl
def test_run_with_a_corrupted_frame_matches_sim(board):
    """The first frame of a run (data the host sends before START) is damaged on the line:
    rejected, sent again, and the run gives the sim device's outputs and cycle count."""
    a = np.random.default_rng(2).integers(-100, 100, (32, CFG.batch, CFG.block_out),
                                          dtype=np.int32)
    want, sim_result = _relu_shift(Session(SimDevice(CFG, dram_bytes=MEM_BYTES)), a)
    np.testing.assert_array_equal(want, np.maximum((a + 3) >> 1, 0).astype(np.int8))
    with _device(board) as dev:
        s = Session(dev)  # which reads the board's ID
        before = board.stats()
        board.corrupt_requests(1)
        got, result = _relu_shift(s, a)
        stats = dev.last_stats
    np.testing.assert_array_equal(got, want)
    assert result.cycles == sim_result.cycles
    assert stats["retries"] == 1
    assert board.stats()["corrupted"] - before["corrupted"] == 1
