"""The same fault behaviour on every device: an illegal stream fails on ``sim`` and on ``rtl``
with the same error class (through :class:`CrossCheckDevice`, which requires it), the RTL
simulator survives the fault with its buffers, and the next correct run is correct
(docs/hardware.md, "Faults")."""

from __future__ import annotations

import numpy as np
import pytest
from rtl_helpers import require_rtl

from vtakit.driver import (
    CycleLimitError,
    DeadlockError,
    DeviceError,
    Program,
    Reloc,
    Session,
    Stage,
)
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_sim.errors import DEFAULT_CYCLE_LIMIT

M, A = isa.MemType, isa.AluOp
pytestmark = pytest.mark.rtl
CFG = preset("ice40")
ROWS = 8


@pytest.fixture(scope="module")
def dev():
    require_rtl()
    from vtakit.driver.devices.crosscheck import CrossCheckDevice

    d = CrossCheckDevice(CFG, dram_bytes=4 << 20)
    yield d
    d.close()


def add_one(s, x, y, *, extra_push=False, extra_pop=False):
    """y = (x + 1) as int8 through ACC: LOAD ACC, ALU ADD 1, compute -> store token, STORE; with
    ``extra_push`` one compute -> store token too many, with ``extra_pop`` one pop of a token
    the store unit never pushes."""
    k = s.uop_kernel("add1", lambda b: b.loop(ROWS, dst=1, src=1).push(0, 0), mode="alu",
                     alu_opcode=A.ADD, use_imm=True, imm=1)
    s.load_2d(x, 0, ROWS, 1, ROWS, sram_base=0, memory_type=M.ACC)
    if extra_pop:
        s.dep_pop(Stage.STORE, Stage.COMPUTE)
    s.alu(k)
    s.dep_push(Stage.COMPUTE, Stage.STORE)
    if extra_push:
        s.dep_push(Stage.COMPUTE, Stage.STORE)
    s.dep_pop(Stage.COMPUTE, Stage.STORE)
    s.store_2d(y, 0, ROWS, 1, ROWS, sram_base=0)
    return s.synchronize()


def data(seed):
    rng = np.random.default_rng(seed)
    xs = rng.integers(-100, 100, (ROWS, CFG.batch * CFG.block_out), dtype=np.int32)
    return xs, (xs + 1).astype(np.int8)


def check_next_run_is_correct(dev, s, seed):
    """A correct run after the fault: its STORE pops the compute -> store token; a token left
    by the faulty run would let it store the faulty run's OUT rows before the ALU writes."""
    xs, want = data(seed)
    x, y = s.array(xs), s.alloc(want.shape, np.int8)
    add_one(s, x, y)
    np.testing.assert_array_equal(y.numpy(), want)


def test_a_token_left_at_finish_fails_on_both_and_the_next_run_is_correct(dev):
    s = Session(dev)
    xs, want = data(1)
    x, y = s.array(xs), s.alloc(want.shape, np.int8)
    proc = dev.rtl._simulation().proc
    with pytest.raises(DeviceError, match=r"tokens still in the dependency queues g2s=1 .*"
                                          r"\[rtl agrees: rtl: run ended with tokens still in "
                                          r"the dependency queues g2s") as e:
        add_one(s, x, y, extra_push=True)
    assert type(e.value) is DeviceError
    assert dev.rtl._simulation().proc is proc  # the simulator lives on
    check_next_run_is_correct(dev, s, 2)


def test_a_deadlock_fails_fast_on_both_and_the_simulator_survives(dev):
    s = Session(dev)
    xs, want = data(3)
    x, y = s.array(xs), s.alloc(want.shape, np.int8)
    proc = dev.rtl._simulation().proc
    with pytest.raises(DeadlockError, match=r"deadlock at cycle .*\[rtl agrees: rtl: deadlock "
                                            r"detected at cycle"):
        add_one(s, x, y, extra_pop=True)
    assert dev.rtl._simulation().proc is proc
    check_next_run_is_correct(dev, s, 4)


def test_an_unfinished_store_fails_on_both(dev):
    """FINISH does not wait for the store unit, whose STORE waits for a token: the store is
    still pending when the run ends."""
    s = Session(dev)
    y = s.alloc((ROWS, 8), np.int8, name="y")
    store = isa.MemInsn(opcode=isa.Opcode.STORE, memory_type=M.OUT, pop_prev=1, y_size=1,
                        x_size=1, x_stride=1)
    prog = Program.from_insns(CFG, [store, isa.FinishInsn()],
                              [Reloc(0, "y", 0, CFG.elem_bytes(M.OUT))])
    with pytest.raises(DeviceError, match=r"still had this instruction to finish.*"
                                          r"\[rtl agrees: rtl: FINISH completed"):
        s.run_program(prog, {"y": y})
    check_next_run_is_correct(dev, s, 5)


def long_gemm(s):
    """A legal run of about 2^22 cycles (a GEMM of 2^11 x 2^11 iterations)."""
    k = s.uop_kernel("long", lambda b: b.loop(1 << 11).loop(1 << 11).push(0, 0, 0))
    s.gemm(k)


def test_a_cycle_limit_fails_on_both_and_the_simulator_survives(dev):
    s = Session(dev)
    proc = dev.rtl._simulation().proc
    dev.sim.cycle_limit = dev.rtl.cycle_limit = 5000
    try:
        long_gemm(s)
        with pytest.raises(CycleLimitError, match=r"cycle limit 5000 .*\[rtl agrees: rtl: the "
                                                  r"core did not finish within 5000 cycles"):
            s.synchronize()
    finally:
        dev.sim.cycle_limit = dev.rtl.cycle_limit = DEFAULT_CYCLE_LIMIT
    assert dev.rtl._simulation().proc is proc
    check_next_run_is_correct(dev, s, 6)


def test_the_rtl_device_stops_at_a_timeout_without_losing_the_simulator(dev):
    rtl = dev.rtl
    assert rtl.cycle_limit == DEFAULT_CYCLE_LIMIT  # the sim device's default
    s = Session(rtl)
    proc = rtl._simulation().proc
    long_gemm(s)
    with pytest.raises(TimeoutError, match=r"took longer than 0.2 s .*buffers kept"):
        s.synchronize(timeout_s=0.2)
    assert rtl._simulation().proc is proc and proc.poll() is None
    xs, want = data(7)
    x, y = s.array(xs), s.alloc(want.shape, np.int8)
    add_one(s, x, y)
    np.testing.assert_array_equal(y.numpy(), want)
