"""Run :class:`Core` in Amaranth's simulator against a Python model of the burst memory, and
compare cycles and DRAM with :class:`vtakit.vta_sim.Simulator` (shared by the vta_hw tests)."""

from __future__ import annotations

import numpy as np
from amaranth.sim import Simulator as AmSim

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.top import Core, Fault
from vtakit.vta_sim import Simulator

DEBUG = False


def run_core(cfg: HwConfig, dram: np.ndarray, insn_addr: int, insn_count: int,
             limit: int = 20000, core: Core | None = None, faults: list | None = None) -> int:
    """Run the stream on the RTL; ``dram`` is updated in place; returns the cycle count.

    The core's ``fault`` port, read two cycles after ``done`` (when the end-of-run check has
    been made), must be 0, unless ``faults`` is given: it is appended there."""
    dut = core or Core(cfg)
    L, W = cfg.mem_read_latency_cycles, cfg.bus_bytes
    result = {}

    async def bench(ctx):
        ctx.set(dut.insn_addr, insn_addr)
        ctx.set(dut.insn_count, insn_count)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        pending: dict[int, int] = {}  # cycle -> beat address
        wr_addr = 0
        for c in range(limit):
            # cycle c
            a = pending.pop(c, None)
            ctx.set(dut.mem_rd_data_valid, a is not None)
            if a is not None:
                ctx.set(dut.mem_rd_data, int.from_bytes(dram[a:a + W].tobytes(), "little"))
            if ctx.get(dut.done):
                result["cycles"] = c
                assert ctx.get(dut.cycles) == c
                await ctx.tick().repeat(2)
                fault = ctx.get(dut.fault)
                if faults is not None:
                    faults.append(Fault(fault))
                else:
                    assert fault == 0, f"the core reports {Fault(fault)!r}"
                return
            if ctx.get(dut.mem_rd_valid):
                base, k = ctx.get(dut.mem_rd_addr), ctx.get(dut.mem_rd_beats)
                assert base % W == 0
                for i in range(k):
                    assert c + L + i not in pending
                    pending[c + L + i] = base + i * W
            if ctx.get(dut.mem_wr_valid):
                wr_addr = ctx.get(dut.mem_wr_addr)
            if ctx.get(dut.mem_wr_data_valid):
                word = ctx.get(dut.mem_wr_data).to_bytes(W, "little")
                strb = ctx.get(dut.mem_wr_strb)
                if DEBUG:
                    print("wr", c, hex(wr_addr), word.hex(), bin(strb))
                for b in range(W):
                    if strb >> b & 1:
                        dram[wr_addr + b] = word[b]
                wr_addr += W
            await ctx.tick()
        raise AssertionError(f"RTL: no done within {limit} cycles")

    sim = AmSim(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return result["cycles"]


def compare(cfg: HwConfig, dram: np.ndarray, insns: list, insn_addr: int = 0,
            limit: int = 20000) -> tuple[int, int]:
    """Put ``insns`` at ``insn_addr`` and run RTL and vta_sim on copies of ``dram``; assert
    equal DRAM afterwards and return (rtl cycles, sim cycles)."""
    raw = np.frombuffer(isa.encode_stream(insns, cfg), np.uint8)
    dram = dram.copy()
    dram[insn_addr:insn_addr + raw.size] = raw
    d_sim = dram.copy()
    st = Simulator(cfg, d_sim).run(insn_addr, len(insns))
    d_rtl = dram.copy()
    cyc = run_core(cfg, d_rtl, insn_addr, len(insns), limit=max(limit, 2 * st.cycles + 100))
    diff = np.flatnonzero(d_rtl != d_sim)
    assert diff.size == 0, (f"cycles rtl {cyc} sim {st.cycles}; DRAM differs at bytes "
                            f"{diff[:16]} (rtl {d_rtl[diff[:16]]}, sim {d_sim[diff[:16]]})")
    return cyc, st.cycles
