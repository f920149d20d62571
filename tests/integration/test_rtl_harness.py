"""The RTL harness itself (DRAM model, loading, write-back, protocol checks, waveforms, Icarus),
tested with a stand-in core that speaks the real core's port protocol."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import require_rtl

from vtakit.driver.devices.rtl import RtlDevice
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.sim.standin import standin_core_verilog
from vtakit.vta_sim.errors import DeviceError

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
