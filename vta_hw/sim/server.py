"""The cocotb test that runs inside the simulator process and serves the host.

Started by :class:`vtakit.vta_hw.sim.process.RtlSimulation` (``COCOTB_TEST_MODULES`` names
this module); it connects back to the host over the Unix socket ``$VTAKIT_RTL_SOCKET`` and
executes its requests until told to quit. While it waits for a request, simulated time stands
still, so the core and its SRAMs keep their state between runs. No Python runs per cycle: the
clock is cocotb's C-level clock and a run waits on the ``done``/``err`` edges with a timer.

Requests and replies (pickled tuples):

* ``("load",)`` -> ``("ok",)``: ``$readmemh`` the host's sparse hex file into the DRAM;
* ``("run", insn_addr, insn_count, cycle_limit, timeout_s)`` -> ``("done", cycles, tb_cycles,
  write_beats, fault)`` | ``("error", code, cycle, addr, beats, is_write)`` |
  ``("limit", tb_cycles)`` | ``("timeout", tb_cycles)``: the run stops after ``cycle_limit``
  cycles or ``timeout_s`` wall-clock seconds (``None``: none), checked every
  :data:`CHUNK_CYCLES` cycles; ``fault`` is the core's ``fault`` port two cycles after ``done``
  rose (when it is complete, :class:`vtakit.vta_hw.faults.Fault`);
* ``("id",)`` -> ``("id", hw_ver, hw_id)``; ``("reset",)`` -> ``("ok",)``; ``("quit",)``.
"""

from __future__ import annotations

import os
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import First, ReadOnly, RisingEdge, Timer

PERIOD_NS = 10
#: Cycles simulated between two looks at the wall clock (well under a second on any core).
CHUNK_CYCLES = 1 << 16


async def _pulse(dut, sig) -> None:
    # The bench acts on the pulse in the edge after the write; the coroutine resumes before
    # that edge's processes have run, so wait one more edge for the effect to be complete.
    sig.value = 1
    await RisingEdge(dut.clk)
    sig.value = 0
    await RisingEdge(dut.clk)


async def _reset(dut) -> None:
    dut.rst.value = 1
    for _ in range(4):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


async def _run(dut, insn_addr: int, insn_count: int, cycle_limit: int,
               timeout_s: float | None = None) -> tuple:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    dut.insn_addr.value = insn_addr
    dut.insn_count.value = insn_count
    await _pulse(dut, dut.log_open)
    dut.start.value = 1
    await RisingEdge(dut.clk)  # start is sampled here; the next cycle is cycle 0
    dut.start.value = 0
    base_beats = int(dut.wr_beats_total.value)
    left = cycle_limit + 2
    stop = None
    while True:
        step = min(left, CHUNK_CYCLES)
        limit = Timer(step * PERIOD_NS, unit="ns")
        fired = await First(RisingEdge(dut.done), RisingEdge(dut.err), limit)
        if fired is not limit:
            break
        left -= step
        if left <= 0:
            stop = "limit"
            break
        if deadline is not None and time.monotonic() > deadline:
            stop = "timeout"
            break
    await ReadOnly()  # let every register of this edge settle (Icarus updates them in turn)
    reply: tuple
    if int(dut.err.value):
        reply = ("error", int(dut.err_code.value), int(dut.err_cycle.value),
                 int(dut.err_addr.value), int(dut.err_beats.value), int(dut.err_write.value))
    elif stop is not None:
        reply = (stop, int(dut.tb_cycle.value))
    else:
        reply = ("done", int(dut.cycles.value), int(dut.tb_cycle.value),
                 int(dut.wr_beats_total.value) - base_beats)
    await Timer(1, unit="ps")  # leave the read-only phase before driving inputs again
    if reply[0] == "done":  # the end-of-run check completes two cycles after done
        await RisingEdge(dut.clk)
        await RisingEdge(dut.clk)
        await ReadOnly()
        reply += (int(dut.fault.value),)
        await Timer(1, unit="ps")
    await _pulse(dut, dut.log_close)
    return reply


@cocotb.test()
async def serve(dut) -> None:
    from multiprocessing.connection import Client

    conn = Client(os.environ["VTAKIT_RTL_SOCKET"], family="AF_UNIX")
    Clock(dut.clk, PERIOD_NS, unit="ns", impl="gpi").start()  # in C: no Python per cycle
    dut.dram_limit.value = int(os.environ["VTAKIT_RTL_DRAM_BYTES"])
    for sig in (dut.start, dut.dram_load, dut.log_open, dut.log_close, dut.insn_addr,
                dut.insn_count):
        sig.value = 0
    await _reset(dut)
    conn.send(("ready",))
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            conn.send(("bye",))
            break
        if msg[0] == "load":
            await _pulse(dut, dut.dram_load)
            conn.send(("ok",))
        elif msg[0] == "run":
            conn.send(await _run(dut, *msg[1:]))
        elif msg[0] == "id":
            conn.send(("id", int(dut.hw_ver.value), int(dut.hw_id.value)))
        elif msg[0] == "reset":
            await _reset(dut)
            conn.send(("ok",))
        else:
            conn.send(("bad", f"unknown request {msg[0]!r}"))
    conn.close()
