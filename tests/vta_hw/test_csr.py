# amaranth: UnusedElaboratable=no
"""The control/status register block: register map, start pulse, and a whole run through it."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.sim import Simulator

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.csr import CTRL_DONE, CTRL_FAULT, CTRL_RESET, CTRL_START, CsrAddr, CsrBlock
from vtakit.vta_hw.isa import FinishInsn, GemmInsn
from vtakit.vta_hw.top import Core, Fault, hw_ver_word
from vtakit.vta_sim import Simulator as VtaSim

CFG = preset("ice40")


async def bus_write(ctx, csr, addr, value):
    ctx.set(csr.addr, addr)
    ctx.set(csr.w_data, value)
    ctx.set(csr.w_en, 1)
    await ctx.tick()
    ctx.set(csr.w_en, 0)


async def bus_read(ctx, csr, addr):
    ctx.set(csr.addr, addr)
    ctx.set(csr.r_en, 1)
    await ctx.tick()
    ctx.set(csr.r_en, 0)
    return ctx.get(csr.r_data)


def read_memory(core, dram):
    """A process serving the core's read bursts from ``dram`` with the configured latency
    (docs/hardware.md: beat ``i`` of a burst requested in cycle ``g`` arrives in ``g+L+i``)."""
    L, W = CFG.mem_read_latency_cycles, CFG.bus_bytes

    async def memory(ctx):
        pending: dict[int, int] = {}
        cycle = 0
        async for (_, _, rd_valid, addr, beats) in ctx.tick().sample(
                core.mem_rd_valid, core.mem_rd_addr, core.mem_rd_beats):
            if rd_valid:
                for i in range(beats):
                    pending[cycle + L + i] = addr + i * W
            cycle += 1
            a = pending.pop(cycle, None)
            ctx.set(core.mem_rd_data_valid, a is not None)
            if a is not None:
                ctx.set(core.mem_rd_data, int.from_bytes(dram[a:a + W].tobytes(), "little"))
    return memory


async def start_and_wait(ctx, csr, addr, count):
    """Start ``count`` instructions at ``addr`` through the registers; poll until DONE."""
    await bus_write(ctx, csr, CsrAddr.INSN_ADDR, addr)
    await bus_write(ctx, csr, CsrAddr.INSN_COUNT, count)
    await bus_write(ctx, csr, CsrAddr.CTRL, CTRL_START)
    for _ in range(200):
        if await bus_read(ctx, csr, CsrAddr.CTRL) & CTRL_DONE:
            return
    raise AssertionError("DONE never set")


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


# (operation, address, value written / expected read); the fake core has done=1, cycles=1234,
# fault=0b100100 (tokens left in l2g and s2g)
REGISTER_CASES = [
    ("read", CsrAddr.HW_VER, hw_ver_word()),
    ("read", CsrAddr.HW_ID, CFG.hash_u32),
    ("read", CsrAddr.CYCLES, 1234),
    ("read", CsrAddr.CTRL, CTRL_DONE | CTRL_FAULT),
    ("read", CsrAddr.INSN_ADDR, 0),
    ("write", CsrAddr.INSN_ADDR, 0x1230),
    ("read", CsrAddr.INSN_ADDR, 0x1230),
    ("write", CsrAddr.INSN_COUNT, 0xdeadbeef),
    ("read", CsrAddr.INSN_COUNT, 0xdeadbeef),
    ("read", CsrAddr.INSN_ADDR, 0x1230),
    ("write", CsrAddr.HW_ID, 0),  # read-only: ignored
    ("read", CsrAddr.HW_ID, CFG.hash_u32),
    ("write", CsrAddr.CYCLES, 7),
    ("read", CsrAddr.CYCLES, 1234),
    ("read", CsrAddr.FAULT, 0b100100),
    ("write", CsrAddr.FAULT, 0),  # read-only: ignored
    ("read", CsrAddr.FAULT, 0b100100),
    ("read", 0x1C, 0),  # unmapped
    ("read", 0x40, 0),
    ("write", 0x40, 5),  # unmapped write: no effect anywhere
    ("read", CsrAddr.INSN_COUNT, 0xdeadbeef),
    ("read", CsrAddr.INSN_ADDR | 3, 0x1230),  # low address bits ignored
]


def test_register_map():
    csr = CsrBlock(CFG)

    async def bench(ctx):
        ctx.set(csr.core_done, 1)
        ctx.set(csr.core_cycles, 1234)
        ctx.set(csr.core_fault, 0b100100)
        for k, (op, addr, value) in enumerate(REGISTER_CASES):
            if op == "write":
                await bus_write(ctx, csr, addr, value)
                assert not ctx.get(csr.core_start), k
            else:
                assert await bus_read(ctx, csr, addr) == value, (k, op, hex(addr))
        # no read in the previous cycle: r_data is 0
        await ctx.tick()
        assert ctx.get(csr.r_data) == 0

    run(csr, bench)


@pytest.mark.parametrize("value, pulse", [(CTRL_START, 1), (CTRL_START | CTRL_DONE, 1),
                                          (CTRL_DONE, 0), (0, 0)])
def test_start_is_a_one_cycle_pulse(value, pulse):
    csr = CsrBlock(CFG)

    async def bench(ctx):
        await bus_write(ctx, csr, CsrAddr.INSN_ADDR, 0x40)
        await bus_write(ctx, csr, CsrAddr.INSN_COUNT, 3)
        await bus_write(ctx, csr, CsrAddr.CTRL, value)
        seen = []
        for _ in range(4):
            seen.append(ctx.get(csr.core_start))
            if ctx.get(csr.core_start):
                assert ctx.get(csr.core_insn_addr) == 0x40
                assert ctx.get(csr.core_insn_count) == 3
            await ctx.tick()
        assert seen == [pulse, 0, 0, 0]
        assert await bus_read(ctx, csr, CsrAddr.CTRL) == 0  # START reads 0, done is low

    run(csr, bench)


def test_checks_parameters():
    with pytest.raises(TypeError, match="cfg must be an HwConfig"):
        CsrBlock("ice40")
    with pytest.raises(ValueError, match="addr_bits=4 must be an int >= 5"):
        CsrBlock(CFG, addr_bits=4)


def test_run_through_registers():
    """Start a FINISH-only stream through the bus; DONE and CYCLES match vta_sim."""
    insns = [FinishInsn()]
    raw = np.frombuffer(isa.encode_stream(insns, CFG), np.uint8)
    insn_addr = 0x100
    dram = np.zeros(1 << 12, np.uint8)
    dram[insn_addr:insn_addr + raw.size] = raw
    want = VtaSim(CFG, dram.copy()).run(insn_addr, len(insns)).cycles

    m = Module()
    core = m.submodules.core = Core(CFG)
    csr = m.submodules.csr = CsrBlock(CFG)
    m.d.comb += [core.start.eq(csr.core_start), core.insn_addr.eq(csr.core_insn_addr),
                 core.insn_count.eq(csr.core_insn_count), csr.core_done.eq(core.done),
                 csr.core_cycles.eq(core.cycles)]

    async def host(ctx):
        await start_and_wait(ctx, csr, insn_addr, len(insns))
        assert await bus_read(ctx, csr, CsrAddr.CYCLES) == want
        assert await bus_read(ctx, csr, CsrAddr.HW_ID) == CFG.hash_u32

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_process(read_memory(core, dram))
    sim.add_testbench(host)
    sim.run_until(1e-6 * 400)


def test_fault_and_reset_through_registers():
    """A stream that leaves a token behind: DONE, then FAULT names the queue; RESET (the SoC
    wraps the core in ResetInserter) and a correct run reads FAULT 0 and vta_sim's cycles."""
    bad = [GemmInsn(push_next=1), FinishInsn()]  # compute -> store token nobody pops
    good = [FinishInsn()]
    dram = np.zeros(1 << 12, np.uint8)
    for addr, insns in ((0x100, bad), (0x200, good)):
        raw = np.frombuffer(isa.encode_stream(insns, CFG), np.uint8)
        dram[addr:addr + raw.size] = raw
    want = VtaSim(CFG, dram.copy()).run(0x200, len(good)).cycles

    m = Module()
    core_rst = Signal()
    inner = Core(CFG)
    m.submodules.core = ResetInserter({"sync": core_rst})(inner)
    csr = m.submodules.csr = CsrBlock(CFG)
    m.d.comb += [inner.start.eq(csr.core_start), inner.insn_addr.eq(csr.core_insn_addr),
                 inner.insn_count.eq(csr.core_insn_count), csr.core_done.eq(inner.done),
                 csr.core_cycles.eq(inner.cycles), csr.core_fault.eq(inner.fault),
                 core_rst.eq(csr.core_reset)]

    async def run_stream(ctx, addr, count):
        await start_and_wait(ctx, csr, addr, count)
        return await bus_read(ctx, csr, CsrAddr.CTRL), await bus_read(ctx, csr, CsrAddr.FAULT)

    async def host(ctx):
        ctrl, fault = await run_stream(ctx, 0x100, len(bad))
        assert fault == Fault.TOKENS_G2S and ctrl & CTRL_FAULT
        await bus_write(ctx, csr, CsrAddr.CTRL, CTRL_RESET)
        await ctx.tick()
        ctrl, fault = await run_stream(ctx, 0x200, len(good))
        assert fault == 0 and not ctrl & CTRL_FAULT
        assert await bus_read(ctx, csr, CsrAddr.CYCLES) == want
        done.append(True)

    done: list[bool] = []
    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_process(read_memory(inner, dram))
    sim.add_testbench(host)
    sim.run_until(1e-6 * 800)
    assert done
