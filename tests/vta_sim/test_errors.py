"""Every way a stream can fail names the instruction, what was wrong and what was expected.

The simulator raises its own :class:`~vtakit.vta_sim.errors.SimError`; the driver's ``sim``
device turns it into the device contract's :class:`~vtakit.driver.DeviceError` (last tests)."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import Image, load, store

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.isa import AluInsn, FinishInsn, GemmInsn, MemType
from vtakit.vta_sim import SimCycleLimit, SimDeadlock, SimError, Simulator

CFG = preset("default")


def run(prog, timing=True, patch=None, **kw):
    img = Image(CFG)
    addr, n = img.put_insns(prog)
    if patch:
        patch(img.dram, addr)
    return Simulator(CFG, img.dram).run(addr, n, timing=timing, **kw)


both = pytest.mark.parametrize("timing", [True, False], ids=["timed", "functional"])


@both
def test_deadlock_lists_units_and_tokens(timing):
    prog = [load(MemType.INP, 0, 0, 0, 0, pop_next=1, push_next=1), FinishInsn(pop_prev=1)]
    with pytest.raises(SimDeadlock, match=r"deadlock.*load: #0 LOAD INP waiting for token "
                                          r"g2l \(pop_next\).*compute: #1 FINISH waiting for "
                                          r"token l2g \(pop_prev\).*token counts l2g=0, "
                                          r"g2l=0, g2s=0, s2g=0") as info:
        run(prog, timing)
    assert info.value.index in (0, 1) and info.value.insn["kind"] in ("LOAD INP", "FINISH")


@both
def test_dram_out_of_range(timing):
    prog = [load(MemType.WGT, 0, (1 << 20) // 256, 1, 1, push_next=1), FinishInsn(pop_prev=1)]
    with pytest.raises(SimError, match=r"instruction #0 LOAD WGT\(.*dram_base=4096.*\): "
                                       r"DRAM access out of range: bytes \[0x100000, "
                                       r"0x100100\).*DRAM is 0x100000 bytes") as info:
        run(prog, timing)
    assert info.value.index == 0 and info.value.insn["dram_base"] == 4096


@both
def test_sram_out_of_range(timing):
    prog = [load(MemType.INP, CFG.inp_depth - 1, 0, 1, 2, push_next=1), FinishInsn(pop_prev=1)]
    with pytest.raises(SimError, match=r"#0 .*INP\[2047\.\.2048\] but INP has depth 2048"):
        run(prog, timing)


@both
def test_gemm_acc_out_of_range(timing):
    prog = [GemmInsn(uop_bgn=0, uop_end=1, iter_in=3, dst_factor_in=1500), FinishInsn()]
    with pytest.raises(SimError, match=r"#0 GEMM.*ACC\[3000\] at loop iteration 2 but ACC "
                                       r"has depth 2048"):
        run(prog, timing)


def _poke(index: int, field: str, value: int):
    def patch(dram, addr):
        lay = isa.layouts(CFG)
        k = addr + 16 * index
        word = int.from_bytes(dram[k:k + 16].tobytes(), "little")
        op = word & 7
        f = (lay.mem if op in (0, 1) else lay.alu if op == 4 else lay.gemm)[field] \
            if field != "opcode" else lay.mem["opcode"]
        word = (word & ~(f.mask << f.lsb)) | (value << f.lsb)
        dram[k:k + 16] = np.frombuffer(word.to_bytes(16, "little"), np.uint8)
    return patch


@pytest.mark.parametrize("field, value, msg", [
    ("opcode", 7, r"#0 opcode 7\(.*\): malformed instruction: opcode 7 is not one of LOAD=0"),
    ("memory_type", 6, r"#0 LOAD 6\(.*\): malformed instruction: memory_type 6 is not one of "),
    ("alu_opcode", 7, r"#0 ALU 7\(.*\): malformed instruction: alu_opcode 7 is not one of MIN"),
])
def test_malformed(field, value, msg):
    first = AluInsn(uop_bgn=0, uop_end=1) if field == "alu_opcode" else load(MemType.INP, 0,
                                                                           0, 0, 0)
    with pytest.raises(SimError, match=msg):
        run([first, FinishInsn()], patch=_poke(0, field, value))


def test_store_of_inp_is_rejected():
    bad = isa.replace(store(0, 0, 1, 1), memory_type=MemType.INP)
    with pytest.raises(SimError, match=r"#0 STORE INP.*memory_type INP is not supported "
                                       r"\(expected OUT\)"):
        run([bad, FinishInsn()])


def test_no_finish_and_after_finish():
    with pytest.raises(SimError, match=r"no FINISH within insn_count=1"):
        run([GemmInsn()])
    with pytest.raises(SimError, match=r"#1 GEMM.*instruction after FINISH"):
        run([FinishInsn(), GemmInsn()])


@both
def test_tokens_left_at_the_end(timing):
    with pytest.raises(SimError, match=r"tokens still in the dependency queues g2s=1"):
        run([GemmInsn(push_next=1), FinishInsn()], timing)


@both
def test_finish_before_store_done(timing):
    # No token orders the STORE before FINISH: the timed model sees FINISH complete while the
    # store still runs; the functional model, with no time, sees the missing token chain.
    prog = [GemmInsn(push_next=1), store(0, 0, 1, 8, pop_prev=1), FinishInsn()]
    with pytest.raises(SimError, match=r"#1 STORE OUT.*FINISH completed( at cycle \d+)? "
                                       r"while the store unit still had"):
        run(prog, timing)


@both
def test_finish_not_ordered_after_a_quick_store(timing):
    # The store finishes long before FINISH, but only by luck of timing: rejected all the same.
    prog = [GemmInsn(push_next=1), store(0, 0, 1, 8, pop_prev=1),
            GemmInsn(uop_bgn=0, uop_end=1, iter_out=100, iter_in=10), FinishInsn()]
    with pytest.raises(SimError, match=r"#1 STORE OUT.*no chain of tokens orders it before "
                                       r"FINISH"):
        run(prog, timing)


def test_cycle_limit():
    prog = [GemmInsn(uop_bgn=0, uop_end=1, iter_out=100, iter_in=100), FinishInsn()]
    with pytest.raises(SimCycleLimit, match=r"#0 GEMM.*cycle limit 1000 reached before FINISH"
                                            r".*compute: #0 GEMM"):
        run(prog, cycle_limit=1000)
    assert run(prog, cycle_limit=20000).cycles == 37 + 10006 + 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="writable C-contiguous 1-D uint8"):
        Simulator(CFG, np.zeros(16, np.int32))
    sim = Simulator(CFG, np.zeros(1024, np.uint8))
    with pytest.raises(ValueError, match="insn_addr=0x8 must be a non-negative multiple of 16"):
        sim.run(8, 1)
    with pytest.raises(ValueError, match="outside DRAM"):
        sim.run(0, 100)


def test_deadlock_on_a_full_command_queue_is_timed_only():
    # compute's queue holds one instruction: the GEMMs behind the waiting one block fetch, so
    # the LOAD that
    # would push its token is never dispatched (docs/timing.md §7: the functional model does
    # not model command-queue depth and runs this stream).
    cfg = preset("default").replace(cmd_queue_depth=1)
    prog = [GemmInsn(pop_prev=1), GemmInsn(), GemmInsn(),
            load(MemType.INP, 0, 0, 0, 0, push_next=1), FinishInsn()]
    img = Image(cfg)
    addr, n = img.put_insns(prog)
    with pytest.raises(SimDeadlock, match=r"compute: #0 GEMM waiting for token l2g "
                                          r"\(pop_prev\).*fetch: #2 GEMM waiting for space in "
                                          r"the compute command queue"):
        Simulator(cfg, img.dram.copy()).run(addr, n)
    Simulator(cfg, img.dram.copy()).run(addr, n, timing=False)


@pytest.mark.parametrize("prog, kind", [
    ([load(MemType.INP, 0, 0, 0, 0, pop_next=1, push_next=1), FinishInsn(pop_prev=1)],
     "DeadlockError"),
    ([GemmInsn(uop_bgn=0, uop_end=1, iter_out=100, iter_in=100), FinishInsn()],
     "CycleLimitError"),
    ([GemmInsn(uop_bgn=0, uop_end=1, iter_in=3, dst_factor_in=1500), FinishInsn()],
     "DeviceError"),
])
def test_sim_device_raises_the_driver_errors(prog, kind):
    import vtakit.driver as drv
    from vtakit.driver.devices.sim import SimDevice

    dev = SimDevice(CFG, dram_bytes=1 << 20, cycle_limit=1000)
    stream = isa.encode_stream(prog, CFG)
    dev.write(0, stream)
    with pytest.raises(SimError) as direct:
        Simulator(CFG, dev.dram.copy()).run(0, len(prog), cycle_limit=1000)
    dev.run(0, len(prog))
    with pytest.raises(drv.DeviceError) as info:
        dev.wait(10)
    assert type(info.value) is getattr(drv, kind)
    # Code that catches the simulator's classes (their names before the device contract moved
    # to the driver) still catches the device's errors.
    import vtakit.vta_sim as vs

    assert isinstance(info.value, getattr(vs, kind)) and isinstance(info.value, SimError)
    assert str(info.value) == str(direct.value)
    assert (info.value.index, info.value.insn) == (direct.value.index, direct.value.insn)
