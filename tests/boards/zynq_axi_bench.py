"""The cocotb side of tests/boards/test_zynq_rtl.py: runs inside the ``vta_axi`` simulator
(:func:`vtakit.vta_hw.sim.axi_build.build_axi_top`).

cocotbext-axi's ``AxiLiteMaster`` plays the processing system's GP0 port (the driver's register
sequence) and its ``AxiRam`` the DDR behind the HP0 port. The plan comes from the pickle at
``$VTAKIT_ZYNQ_PLAN`` and every observation goes to ``$VTAKIT_ZYNQ_RESULTS``; the pytest side
compares them with ``vta_sim`` (this module judges nothing, so a failure is reported there
with the numbers).

Plan: ``{"mem_bytes": int, "runs": [{"name", "dram": bytes, "insn_addr", "insn_count",
"lite_pause": bool, "slow_ram": bool, "max_polls": int}], "max_polls": int}``.
"""

from __future__ import annotations

import itertools
import os
import pickle
import traceback

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, ReadOnly, RisingEdge, Timer
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from vtakit.vta_hw.axi_top import M_AXI, S_AXI
from vtakit.vta_hw.regmap import CTRL_DONE, CTRL_RESET, CTRL_START, AxiAddr, CsrAddr

PERIOD_NS = 10


def _u32(value: int) -> bytes:
    return int(value).to_bytes(4, "little")


class Bench:
    def __init__(self, dut, mem_bytes: int):
        self.dut = dut
        self.ram = AxiRam(AxiBus.from_prefix(dut, M_AXI), dut.aclk, dut.aresetn,
                          reset_active_level=False, size=mem_bytes)
        self.ctl = AxiLiteMaster(AxiLiteBus.from_prefix(dut, S_AXI), dut.aclk, dut.aresetn,
                                 reset_active_level=False)
        self.cycle = 0

    async def count_cycles(self) -> None:
        edge = RisingEdge(self.dut.aclk)
        while True:
            await edge
            self.cycle += 1

    async def read(self, addr: int) -> tuple[int, int]:
        """(value, RRESP) of a register read."""
        r = await self.ctl.read(addr, 4)
        return int.from_bytes(r.data, "little"), int(r.resp)

    async def write(self, addr: int, value: int | bytes) -> int:
        """BRESP of a register write (bytes: a partial write with their strobes)."""
        data = value if isinstance(value, bytes) else _u32(value)
        return int((await self.ctl.write(addr, data)).resp)

    async def interrupt(self) -> int:
        await ReadOnly()
        value = int(self.dut.interrupt.value)
        await Timer(1, unit="ps")
        return value

    def lite_pauses(self, on: bool) -> None:
        """Back-pressure on the master's channels in different rhythms, so AW and W reach the
        slave in different cycles (either first) and R / B wait for ready."""
        chans = (self.ctl.write_if.aw_channel, self.ctl.write_if.w_channel,
                 self.ctl.write_if.b_channel, self.ctl.read_if.ar_channel,
                 self.ctl.read_if.r_channel)
        patterns = ([1, 1, 1, 0], [0, 1, 0], [1, 0, 0, 1, 1], [1, 1, 0, 0, 1], [0, 0, 1])
        for chan, pat in zip(chans, patterns):
            chan.set_pause_generator(itertools.cycle(pat) if on else None)
            if not on:
                chan.pause = False  # removing the generator leaves its last value

    async def run(self, spec: dict, max_polls: int) -> dict:
        out: dict = {"name": spec["name"], "resp": {}}
        self.lite_pauses(spec.get("lite_pause", False))
        if spec.get("slow_ram"):  # R beats held back 24 cycles in 25: later than L
            self.ram.read_if.r_channel.set_pause_generator(itertools.cycle([1] * 24 + [0]))
        self.ram.write(0, spec["dram"])
        out["resp"]["insn_addr"] = await self.write(CsrAddr.INSN_ADDR, spec["insn_addr"])
        out["resp"]["insn_count"] = await self.write(CsrAddr.INSN_COUNT, spec["insn_count"])
        out["insn_addr"] = await self.read(CsrAddr.INSN_ADDR)
        out["insn_count"] = await self.read(CsrAddr.INSN_COUNT)
        out["resp"]["start"] = await self.write(CsrAddr.CTRL, CTRL_START)
        started = self.cycle
        polls, ctrl = 0, 0
        while polls < spec.get("max_polls", max_polls):
            ctrl, _ = await self.read(CsrAddr.CTRL)
            polls += 1
            if ctrl & CTRL_DONE:
                break
        out.update(ctrl=ctrl, polls=polls, bus_cycles=self.cycle - started,
                   interrupt=await self.interrupt(),
                   cycles=await self.read(CsrAddr.CYCLES),
                   fault=await self.read(CsrAddr.FAULT),
                   axi_status=await self.read(AxiAddr.AXI_STATUS))
        out["dram"] = self.ram.read(0, len(spec["dram"]))
        if spec.get("slow_ram"):
            self.ram.read_if.r_channel.set_pause_generator(None)
            self.ram.read_if.r_channel.pause = False
            out["resp"]["reset"] = await self.write(CsrAddr.CTRL, CTRL_RESET)
            await ClockCycles(self.dut.aclk, 200)  # the late beats drain
            out["after_reset"] = {"ctrl": await self.read(CsrAddr.CTRL),
                                  "interrupt": await self.interrupt()}
        self.lite_pauses(False)
        return out

    async def bad_accesses(self) -> dict:
        """Responses (and what the registers hold afterwards) of accesses that must fail."""
        out: dict = {}
        before = await self.read(CsrAddr.INSN_COUNT)
        out["read_unmapped"] = await self.read(max(*CsrAddr, *AxiAddr) + 4)
        out["read_window_end"] = await self.read(0xFFC)
        out["write_unmapped"] = await self.write(max(*CsrAddr, *AxiAddr) + 4, 1)
        cycles = await self.read(CsrAddr.CYCLES)
        out["write_read_only"] = await self.write(CsrAddr.CYCLES, 12345)
        out["cycles_after"] = (cycles, await self.read(CsrAddr.CYCLES))
        out["write_hw_id"] = await self.write(CsrAddr.HW_ID, 0)
        out["write_partial"] = await self.write(CsrAddr.INSN_COUNT, b"\x07\x00")
        out["write_byte_unaligned"] = await self.write(CsrAddr.INSN_COUNT + 1, b"\x07")
        out["insn_count_after"] = (before, await self.read(CsrAddr.INSN_COUNT))
        return out


@cocotb.test()
async def zynq_top(dut) -> None:
    with open(os.environ["VTAKIT_ZYNQ_PLAN"], "rb") as f:
        plan = pickle.load(f)
    results: dict = {"runs": []}
    try:
        Clock(dut.aclk, PERIOD_NS, unit="ns").start()
        dut.aresetn.value = 0
        bench = Bench(dut, plan["mem_bytes"])
        cocotb.start_soon(bench.count_cycles())
        await ClockCycles(dut.aclk, 8)
        dut.aresetn.value = 1
        await ClockCycles(dut.aclk, 2)
        results["interrupt_after_reset"] = await bench.interrupt()
        results["hw_ver"] = await bench.read(CsrAddr.HW_VER)
        results["hw_id"] = await bench.read(CsrAddr.HW_ID)
        results["ctrl_idle"] = await bench.read(CsrAddr.CTRL)
        for spec in plan["runs"]:
            results["runs"].append(await bench.run(spec, plan["max_polls"]))
        results["bad"] = await bench.bad_accesses()
    except Exception:  # noqa: BLE001 - reported to the pytest side, which fails with it
        results["error"] = traceback.format_exc()
    with open(os.environ["VTAKIT_ZYNQ_RESULTS"], "wb") as f:
        pickle.dump(results, f)
