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


def run_stream(dev, s, insns):
    """Write ``insns`` to device memory and run them on the device directly: a stream a Session
    would refuse at the call that recorded it (its host checks) reaches the device as it is."""
    raw = np.frombuffer(isa.encode_stream(insns, CFG), np.uint8)
    buf = s.array(raw)
    try:
        dev.run(buf.addr, len(insns))
        return dev.wait(60)
    finally:
        buf.free()


def test_sram_indices_past_the_end_fail_on_both_and_the_next_run_is_correct(dev):
    """The core would wrap an SRAM index around; the rtl device refuses the stream before it
    runs with the simulator's error (docs/hardware.md, "Faults"), judging a loop by micro-ops
    an earlier run loaded (the UOP SRAM keeps them)."""
    s = Session(dev)
    proc = dev.rtl._simulation().proc
    U, ACC, INP = CFG.uop_depth, CFG.acc_depth, CFG.inp_depth
    uops = s.array(isa.encode_uops(np.array([[ACC - 4, 0, 0], [0, 0, 0]]), CFG))
    # the last two UOP rows, clear of the session's resident kernels (which start at row 0)
    load_uops = isa.MemInsn(memory_type=M.UOP, sram_base=U - 2, dram_base=uops.addr // 4,
                            y_size=1, x_size=2, x_stride=2)

    def gemm(iter_in):  # zeroes ACC rows ACC - 4 .. ACC - 5 + iter_in
        return isa.GemmInsn(reset=1, uop_bgn=U - 2, uop_end=U - 1, iter_in=iter_in,
                            dst_factor_in=1)

    run_stream(dev, s, [load_uops, gemm(4), isa.FinishInsn()])  # the last row: legal
    with pytest.raises(DeviceError) as e:
        run_stream(dev, s, [gemm(5), isa.FinishInsn()])  # micro-ops of the run before
    assert type(e.value) is DeviceError and e.value.index == 0
    head = str(e.value).split(" [rtl agrees: ")[0]
    assert str(e.value) == f"{head} [rtl agrees: {head}]"  # the very same error on both
    assert head.startswith("instruction #0 GEMM(") and head.endswith(
        f"SRAM index out of range: ACC[{ACC}] at loop iteration 4 but ACC has depth {ACC} "
        f"(expected indices 0..{ACC - 1})")

    x = s.alloc((8, CFG.batch * CFG.block_in), np.int8)
    load = isa.MemInsn(memory_type=M.INP, sram_base=INP - 2, dram_base=x.addr // 16,
                       y_size=1, x_size=4, x_stride=4, push_next=1)
    with pytest.raises(DeviceError, match=rf"instruction #0 LOAD INP\(.*\): SRAM index out of "
                                          rf"range: INP\[{INP - 2}..{INP + 1}\] but INP has "
                                          rf"depth {INP} .*\[rtl agrees: instruction #0 LOAD "
                                          rf"INP\(") as e:
        run_stream(dev, s, [load, isa.FinishInsn(pop_prev=1)])
    assert type(e.value) is DeviceError and e.value.index == 0
    assert dev.rtl._simulation().proc is proc  # nothing reached the simulator
    run_stream(dev, s, [isa.replace(load, sram_base=INP - 4), isa.FinishInsn(pop_prev=1)])

    # the simulator stores y before it reaches the bad GEMM; the rtl device runs nothing, and
    # the crosscheck device carries on from the RTL's memory (y untouched)
    xs, _ = data(9)
    xa, y = s.array(xs), s.array(np.zeros((ROWS, CFG.batch * CFG.block_out), np.int8))
    add = isa.AluInsn(uop_bgn=U - 1, uop_end=U, iter_in=ROWS, dst_factor_in=1,
                      src_factor_in=1, use_imm=1, imm=1, push_next=1)
    stream = [isa.MemInsn(memory_type=M.ACC, dram_base=xa.addr // CFG.elem_bytes(M.ACC),
                          y_size=1, x_size=ROWS, x_stride=ROWS), add,
              isa.MemInsn(opcode=isa.Opcode.STORE, memory_type=M.OUT,
                          dram_base=y.addr // CFG.elem_bytes(M.OUT), y_size=1, x_size=ROWS,
                          x_stride=ROWS, pop_prev=1, push_prev=1),
              isa.replace(gemm(5), pop_next=1), isa.FinishInsn()]
    with pytest.raises(DeviceError, match=r"instruction #3 GEMM.*\[rtl agrees: instruction #3"):
        run_stream(dev, s, stream)
    assert not y.numpy().any()
    check_next_run_is_correct(dev, s, 10)


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

