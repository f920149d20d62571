"""The ``pynq`` device (driver/devices/pynq.py) against a fake ``pynq`` module: the PS's DDR is
a numpy array, each ``pynq.allocate`` buffer has its own CPU-side copy that reaches the DDR only
through ``flush()`` and comes back only through ``invalidate()`` (as with cached buffers and a
non-coherent HP port), and the MMIO window is the register map with ``vta_sim``'s
cycle-accurate simulator as the core (a START runs the stream on the DDR)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from vtakit.driver import DeviceError, Session, Stage
from vtakit.driver import kernels as K
from vtakit.driver.devices.pynq import NEEDS_PYNQ, PynqDevice
from vtakit.driver.devices.sim import SimDevice
from vtakit.runtime.vta import make_device
from vtakit.vta_hw import isa
from vtakit.vta_hw.axi import AXI_ERR_LATE
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.faults import TOKEN_FAULTS, Fault
from vtakit.vta_hw.regmap import (
    CTRL_DONE,
    CTRL_FAULT,
    CTRL_RESET,
    CTRL_START,
    AxiAddr,
    CsrAddr,
)
from vtakit.vta_sim import Simulator as VtaSim
from vtakit.vta_sim.errors import SimDeadlock, SimError

CFG = preset("ecp5")
DDR_BYTES = 16 << 20
CSR_BASE = 0x43C0_0000
M, A = isa.MemType, isa.AluOp


class FakeBuffer:
    """``pynq.allocate``'s buffer: a CPU copy (what numpy sees) of a DDR range."""

    def __init__(self, ddr: FakePynq, addr: int, nbytes: int):
        self.ddr, self.physical_address = ddr, addr
        self.cpu = np.full(nbytes, 0xA5, np.uint8)  # stale cache lines until invalidated
        self.freed = False

    def __array__(self, dtype=None, copy=None):
        return self.cpu

    def flush(self) -> None:
        self.ddr.flushes += 1
        self.ddr.mem[self.physical_address:self.physical_address + self.cpu.size] = self.cpu

    def invalidate(self) -> None:
        self.ddr.invalidates += 1
        self.cpu[:] = self.ddr.mem[self.physical_address:self.physical_address + self.cpu.size]

    def freebuffer(self) -> None:
        self.freed = True


class FakeMMIO:
    """The register window of ``vta_axi``; the core is vta_sim on the fake DDR."""

    def __init__(self, ddr: FakePynq, base: int, length: int):
        self.ddr, self.base, self.length = ddr, base, length
        self.regs = {a: 0 for a in (*CsrAddr, *AxiAddr)}
        self.regs[CsrAddr.HW_VER] = (isa.HW_VER[0] << 16) | (isa.HW_VER[1] << 8) | isa.HW_VER[2]
        self.regs[CsrAddr.HW_ID] = ddr.hw_id
        self.starts = self.resets = 0

    def read(self, offset: int, length: int = 4) -> int:
        assert length == 4 and offset % 4 == 0, (offset, length)
        return self.regs.get(offset, 0)

    def write(self, offset: int, value: int) -> None:
        if offset not in (CsrAddr.CTRL, CsrAddr.INSN_ADDR, CsrAddr.INSN_COUNT):
            return
        if offset != CsrAddr.CTRL:
            self.regs[offset] = value
            return
        if value & CTRL_RESET:
            self.resets += 1
            self.regs[CsrAddr.CTRL] = 0
        if value & CTRL_START:
            self.starts += 1
            self._run(self.regs[CsrAddr.INSN_ADDR], self.regs[CsrAddr.INSN_COUNT])

    def _run(self, insn_addr: int, insn_count: int) -> None:
        mode = self.ddr.mode
        self.regs.update({CsrAddr.CTRL: 0, CsrAddr.FAULT: 0, AxiAddr.AXI_STATUS: 0})
        if mode == "hang":
            return
        if mode == "late":
            self.regs[AxiAddr.AXI_STATUS] = AXI_ERR_LATE
            self.regs[CsrAddr.CYCLES] = 57
            return
        cycles, fault = 0, 0
        try:
            cycles = self.ddr.sim.run(insn_addr, insn_count).cycles
        except SimDeadlock:
            fault = Fault.DEADLOCK
        except SimError as err:
            tokens = [bit for q, bit in TOKEN_FAULTS if re.search(rf"\b{q}=", str(err))]
            fault = sum(tokens) if tokens else Fault.UNFINISHED
        self.regs.update({CsrAddr.CYCLES: cycles, CsrAddr.FAULT: int(fault),
                          CsrAddr.CTRL: CTRL_DONE | (CTRL_FAULT if fault else 0)})


class FakePynq:
    """The parts of the ``pynq`` module the device uses: ``allocate``, ``MMIO``, ``Overlay``."""

    def __init__(self, hw_id: int = CFG.hash_u32, ip_dict: dict | None = None):
        self.mem = np.zeros(DDR_BYTES, np.uint8)
        self.sim = VtaSim(CFG, self.mem)
        self.hw_id, self.mode = hw_id, "ok"
        self.next_free = 1 << 20   # CMA above the first MiB
        self.flushes = self.invalidates = 0
        self.buffers: list[FakeBuffer] = []
        self.mmios: list[FakeMMIO] = []
        self.overlays: list[tuple] = []
        self.ip_dict = {"vta": {"phys_addr": CSR_BASE, "addr_range": 4096}} \
            if ip_dict is None else ip_dict

    def allocate(self, shape, dtype):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buf = FakeBuffer(self, self.next_free, nbytes)
        self.next_free += -(-nbytes // 4096) * 4096  # page-aligned, like CMA
        self.buffers.append(buf)
        return buf

    def MMIO(self, base: int, length: int) -> FakeMMIO:  # noqa: N802 - pynq's name
        mmio = FakeMMIO(self, base, length)
        self.mmios.append(mmio)
        return mmio

    def Overlay(self, bitfile: str, download: bool = True):  # noqa: N802 - pynq's name
        self.overlays.append((bitfile, download))
        return SimpleNamespace(ip_dict=self.ip_dict)


def conv(s: Session, shape: K.Conv2dShape, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (shape.n, shape.c, shape.h, shape.w), dtype=np.int8)
    w = rng.integers(-128, 128, (shape.o, shape.c, shape.kh, shape.kw), dtype=np.int8)
    xd, wd = s.array(K.pack_activations(x, s.cfg)), s.array(K.pack_weights(w, s.cfg))
    yd = s.alloc((shape.n // s.cfg.batch, shape.o // s.cfg.block_out, shape.oh, shape.ow,
                  s.cfg.batch, s.cfg.block_out), np.int8)
    K.conv2d(s, xd, wd, yd, shape, shift=8)
    r = s.synchronize()
    out = K.unpack_outputs(yd.numpy())
    np.testing.assert_array_equal(out, K.conv2d_reference(x, w, shape, 8))
    return out, r.cycles


def add_one(s: Session, x, y, rows: int, *, timeout_s: float | None = None,
            extra_push: bool = False):
    """y = int8(x + 1) through ACC; ``extra_push`` leaves a token behind (a fault at FINISH)."""
    k = s.uop_kernel(("add1", rows), lambda b: b.loop(rows, dst=1, src=1).push(0, 0),
                     mode="alu", alu_opcode=A.ADD, use_imm=True, imm=1)
    s.load_2d(x, 0, rows, 1, rows, sram_base=0, memory_type=M.ACC)
    s.alu(k)
    s.dep_push(Stage.COMPUTE, Stage.STORE)
    if extra_push:
        s.dep_push(Stage.COMPUTE, Stage.STORE)
    s.dep_pop(Stage.COMPUTE, Stage.STORE)
    s.store_2d(y, 0, rows, 1, rows, sram_base=0)
    return s.synchronize(timeout_s)


SHAPE = K.Conv2dShape(n=1, c=8, h=5, w=6, o=16, kh=3, kw=3, stride=1, pad=1)


def test_a_convolution_runs_end_to_end_with_the_sim_devices_outputs_and_cycles():
    fake = FakePynq()
    with PynqDevice(CFG, "vta_zynq.bit", pynq=fake) as dev:
        assert fake.overlays == [("vta_zynq.bit", True)]
        assert fake.mmios[0].base == CSR_BASE and fake.mmios[0].length == 4096
        assert dev.identify().config_hash == CFG.hash
        s = Session(dev)
        got, cycles = conv(s, SHAPE, 1)
        stats = dev.last_stats
        assert stats is not None and stats.cycles == cycles and stats["flushed"] >= 3
        assert fake.flushes >= 3 and fake.invalidates >= 1  # outputs came back from the DDR
        again, cycles_again = conv(s, SHAPE, 1)  # resident micro-ops; buffers freed and reused
        s.close()
        buffers = list(fake.buffers)
    assert all(b.freed for b in buffers)  # close() released every buffer
    want, want_cycles = conv(Session(SimDevice(CFG, dram_bytes=DDR_BYTES)), SHAPE, 1)
    np.testing.assert_array_equal(got, want)
    assert cycles == want_cycles and cycles_again > 0


def test_without_flush_the_core_would_see_stale_memory(monkeypatch):
    """The fake's caches are real: with flush() a no-op the core reads the DDR's zeros (its
    stream too) and faults, so the passing tests show that the device flushes."""
    fake = FakePynq()
    monkeypatch.setattr(FakeBuffer, "flush", lambda self: None)
    with PynqDevice(CFG, csr_base=CSR_BASE, pynq=fake) as dev:
        with pytest.raises(DeviceError, match=r"core fault register"):
            conv(Session(dev), SHAPE, 2)


def test_configuration_mismatch_is_refused_at_open():
    fake = FakePynq(hw_id=preset("ice40").hash_u32)
    with pytest.raises(ValueError, match=re.escape(
            "the core at vta_zynq.bit was built for configuration e28c9a54 (preset 'ice40'), "
            "ISA 0.0.2; the driver was given configuration 1effca8f (preset 'ecp5', "
            "1x8x8_i8w8a32_14_14_16_16), ISA 0.0.2: load a bitstream exported for "
            "configuration 1effca8f")):
        PynqDevice(CFG, "vta_zynq.bit", pynq=fake)


def test_missing_pynq_package_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynq(name, *args, **kwargs):
        if name == "pynq":
            raise ImportError("No module named 'pynq'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynq)
    with pytest.raises(ImportError, match=re.escape(NEEDS_PYNQ)):
        PynqDevice(CFG, "vta_zynq.bit")
    with pytest.raises(ImportError, match=r"needs the pynq package there \(pip install pynq"):
        make_device("pynq:vta_zynq.bit", CFG)


def test_register_base_errors():
    with pytest.raises(ValueError, match=r"no register base: pass the bitstream \(bitfile=, its "
                                         r"\.hwh names the base\) or csr_base="):
        PynqDevice(CFG, pynq=FakePynq())
    with pytest.raises(ValueError, match=r"the overlay other.bit has no 'vta' cell \(its AXI-Lite "
                                         r"IPs: axi_gpio_0\); expected a bitstream built from "
                                         r"`vtakit hw export`"):
        PynqDevice(CFG, "other.bit", pynq=FakePynq(ip_dict={"axi_gpio_0": {"phys_addr": 0}}))


def test_timeout_resets_the_core():
    fake = FakePynq()
    dev = PynqDevice(CFG, csr_base=CSR_BASE, pynq=fake)
    s = Session(dev)
    rows = 4
    xs = np.arange(rows * CFG.block_out, dtype=np.int32).reshape(rows, CFG.block_out)
    x, y = s.array(xs), s.alloc(xs.shape, np.int8)
    fake.mode = "hang"
    with pytest.raises(TimeoutError, match=r"pynq device at registers at 0x43c00000: the run of "
                                           r"\d+ instructions at 0x[0-9a-f]+ did not finish "
                                           r"within 0.05 s \(CTRL=0x0, CYCLES=0\); the core "
                                           r"was reset"):
        add_one(s, x, y, rows, timeout_s=0.05)
    assert fake.mmios[0].resets == 1
    fake.mode = "ok"
    add_one(s, x, y, rows)
    np.testing.assert_array_equal(y.numpy(), (xs + 1).astype(np.int8))


def test_late_memory_and_faults_raise_and_reset():
    fake = FakePynq()
    dev = PynqDevice(CFG, csr_base=CSR_BASE, pynq=fake)
    s = Session(dev)
    rows = 4
    xs = np.zeros((rows, CFG.block_out), np.int32)
    x, y = s.array(xs), s.alloc(xs.shape, np.int8)
    fake.mode = "late"
    with pytest.raises(DeviceError, match=r"^pynq: the AXI memory port reported AXI_STATUS=0x1 "
                                          r"at cycle 57 \(LATE: a read beat was due and had "
                                          r"not arrived .*the core was reset: raise "
                                          r"mem_read_latency_cycles in the configuration "
                                          r"\(now 32\)"):
        add_one(s, x, y, rows)
    assert fake.mmios[0].resets == 1
    fake.mode = "ok"
    with pytest.raises(DeviceError, match=r"^pynq: run ended with tokens still in the "
                                          r"dependency queues g2s"):
        add_one(s, x, y, rows, extra_push=True)
    assert fake.mmios[0].resets == 2
    add_one(s, x, y, rows)
    np.testing.assert_array_equal(y.numpy(), np.ones(xs.shape, np.int8))


def test_ranges_outside_the_buffers_are_refused():
    fake = FakePynq()
    dev = PynqDevice(CFG, csr_base=CSR_BASE, pynq=fake)
    addr = dev.allocate(100, 64)
    with pytest.raises(ValueError, match=r"pynq device: read of 8 bytes at 0x50 is not inside "
                                         r"one buffer of this device"):
        dev.read(0x50, 8)
    with pytest.raises(ValueError, match=r"pynq device: free\(0x10\): not an address allocate\(\) "
                                         r"returned"):
        dev.free(0x10)
    dev.write(addr, b"\x01\x02")
    np.testing.assert_array_equal(dev.read(addr, 2), [1, 2])


def test_runtime_spec_opens_a_pynq_device(monkeypatch):
    import sys

    fake = FakePynq()
    monkeypatch.setitem(sys.modules, "pynq", fake)
    dev = make_device("pynq:vta_zynq.bit", CFG)
    assert isinstance(dev, PynqDevice) and fake.overlays == [("vta_zynq.bit", True)]
