"""The RTL harness itself (DRAM model, loading, write-back, protocol checks, waveforms, Icarus),
tested with a stand-in core that speaks the real core's port protocol, and an Icarus smoke test
of the real core against ``vta_sim``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import require_rtl

from vtakit.driver.devices.rtl import RtlDevice
from vtakit.driver.errors import DeviceError
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.sim.standin import standin_core_verilog

pytestmark = pytest.mark.rtl
CFG = preset("ice40")


@pytest.fixture(scope="module")
def standin():
    require_rtl()
    dev = RtlDevice(CFG, dram_bytes=1 << 20, verilog=standin_core_verilog(CFG))
    yield dev
    dev.close()


def expected_after(dram: np.ndarray, addr: int, count: int) -> np.ndarray:
    """The stand-in adds 1 to every bus word of the stream."""
    want = dram.copy()
    words = want[addr:addr + 16 * count].view("<u4")
    words += np.uint32(1)
    return want


@pytest.mark.parametrize("addr, count", [(0, 1), (16, 3), (4096 - 16, 9), (96, 40)])
def test_reads_with_latency_and_writes_back(standin, addr, count):
    rng = np.random.default_rng(addr + count)
    data = rng.integers(0, 256, 4096, dtype=np.uint8)
    standin.write(0, data)
    standin.write(4096, np.zeros(4096, np.uint8))
    before = standin.read(0, 8192)
    standin.run(addr, count)
    r = standin.wait(60)
    np.testing.assert_array_equal(standin.read(0, 8192), expected_after(before, addr, count))
    assert r.cycles == r.stats["tb_cycles"] > CFG.mem_read_latency_cycles
    assert r.stats["write_beats"] == 16 * count // CFG.bus_bytes


def test_identify(standin):
    info = standin.identify()
    assert (info.name, info.hw_ver, info.config_hash) == ("rtl", isa.HW_VER, CFG.hash)
    standin.check_compatible()


@pytest.mark.parametrize("flag, message", [
    (1 << 31, r"cycle \d+: address not aligned to the bus word \(read burst addr=0x1 "),
    (1 << 30, r"cycle \d+: burst requested while the previous burst still holds the memory "
              r"port \(read burst addr=0x0 beats=1"),
])
def test_protocol_violations_fail_loudly(standin, flag, message):
    standin._pending = (0, 8 | flag)  # the stand-in's misbehaviour switches; not a stream
    with pytest.raises(DeviceError, match=message):
        standin.wait(60)
    standin.run(0, 2)  # the device recovers (the core is reset) for the next run
    assert standin.wait(60).cycles > 0


def test_out_of_range_burst_is_caught():
    require_rtl()
    with RtlDevice(CFG, dram_bytes=4096, verilog=standin_core_verilog(CFG)) as dev:
        dev.run(4096 - 16, 1)
        dev.wait(60)
        dev._pending = (4096, 1)  # bypass the driver's own range check
        with pytest.raises(DeviceError, match=r"burst outside the DRAM \(read burst "
                                              r"addr=0x1000 beats=4; DRAM 0x1000 bytes"):
            dev.wait(60)


@pytest.mark.parametrize("suffix", ["vcd", "fst"])
def test_waveform_on_demand(tmp_path, suffix):
    require_rtl()
    if suffix == "fst" and not Path("/usr/include/lz4.h").exists():
        pytest.skip("FST waveforms need the lz4 headers: apt-get install liblz4-dev")
    path = tmp_path / f"run.{suffix}"
    with RtlDevice(CFG, dram_bytes=1 << 16, verilog=standin_core_verilog(CFG),
                   waves=path) as dev:
        dev.run(0, 4)
        dev.wait(60)
    assert path.stat().st_size > 100


def test_icarus_smoke():
    require_rtl("icarus")
    with RtlDevice(CFG, dram_bytes=1 << 14, simulator="icarus",
                   verilog=standin_core_verilog(CFG)) as dev:
        dev.write(0, np.arange(64, dtype=np.uint8))
        dev.run(0, 4)
        r = dev.wait(120)
        np.testing.assert_array_equal(dev.read(0, 64),
                                      expected_after(np.arange(64, dtype=np.uint8), 0, 4))
        assert r.cycles == r.stats["tb_cycles"]


def _padded_load_gemm_store(cfg) -> tuple[np.ndarray, int]:
    """DRAM (4 KiB) with a stream at 0: micro-ops, a weight, a padded 1x2 input (2x4 in the
    SRAM), GEMM reset + GEMM, STORE of the 8 outputs to 1024, FINISH."""
    from vtakit.vta_hw.isa import FinishInsn, GemmInsn, MemInsn, MemType, Opcode, Uop

    dram = np.zeros(4096, np.uint8)
    dram[256:256 + 32] = isa.encode_uops([Uop(dst=i, src=i, wgt=0) for i in range(8)],
                                         cfg).view(np.uint8)
    dram[512] = 3
    dram[768:770] = np.array([5, -7], np.int8).view(np.uint8)

    def mem(opcode, mt, dram_base, x, pads=(0, 0, 0, 0), **flags):
        return MemInsn(opcode=opcode, memory_type=mt, sram_base=0, dram_base=dram_base,
                       y_size=1, x_size=x, x_stride=x, y_pad_0=pads[0], y_pad_1=pads[1],
                       x_pad_0=pads[2], x_pad_1=pads[3], **flags)

    stream = [mem(Opcode.LOAD, MemType.UOP, 256 // cfg.uop_elem_bytes, 8),
              mem(Opcode.LOAD, MemType.WGT, 512, 1),
              mem(Opcode.LOAD, MemType.INP, 768, 2, pads=(1, 0, 1, 1), push_next=1),
              GemmInsn(reset=1, uop_bgn=0, uop_end=8),
              GemmInsn(uop_bgn=0, uop_end=8, pop_prev=1, push_next=1),
              mem(Opcode.STORE, MemType.OUT, 1024, 8, pop_prev=1, push_prev=1),
              FinishInsn(pop_next=1)]
    raw = np.frombuffer(isa.encode_stream(stream, cfg), np.uint8)
    dram[:raw.size] = raw
    return dram, len(stream)


def test_icarus_runs_the_real_core_like_the_simulator():
    """The real core (not the stand-in) under Icarus: a FINISH-only stream and a padded load +
    GEMM + store give the cycle counts and DRAM of ``vta_sim``. (Before yosys's time-0
    wake-up of ``always @*`` processes was made explicit for Icarus, ``done`` never rose.)"""
    require_rtl("icarus")
    from vtakit.driver.devices.crosscheck import compare_run
    from vtakit.vta_sim.image import RunImage

    finish = np.zeros(4096, np.uint8)
    finish[:16] = np.frombuffer(isa.encode_stream([isa.FinishInsn()], CFG), np.uint8)
    programs = [(finish, 1), _padded_load_gemm_store(CFG)]
    with RtlDevice(CFG, dram_bytes=1 << 14, simulator="icarus", cycle_limit=5000) as dev:
        for k, (dram, count) in enumerate(programs):
            stats, sim = RunImage(CFG, dram, 0, count).run()
            dev.write(0, dram)
            dev.run(0, count)
            r = dev.wait(60)
            compare_run(CFG, dram[:16 * count], sim.dram, dev.read(0, dram.size), stats.cycles,
                        r.cycles, f"program {k}", r.stats["tb_cycles"])
            assert r.cycles > 0
    out = sim.dram[1024:1032].view(np.int8)
    np.testing.assert_array_equal(out, [0, 0, 0, 0, 0, 15, -21, 0])
