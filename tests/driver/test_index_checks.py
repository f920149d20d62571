"""Loop indices past the end of an SRAM: the simulator refuses them, the RTL would wrap around
silently, so the driver refuses them on the host, at the call that recorded them
(``Session.gemm`` / ``Session.alu``) or when a loaded Program is run (``Session.run_program``).
"""

import numpy as np
import pytest

from vtakit.driver import DeviceError, Program, Session
from vtakit.driver.devices.sim import SimDevice
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset

CFG = preset("default")
A, M = isa.AluOp, isa.MemType
ACC, INP, WGT = CFG.acc_depth, CFG.inp_depth, CFG.wgt_depth


def session():
    return Session(SimDevice(CFG, dram_bytes=16 << 20))


def gemm_kernel(s, key, outer, inner, uop=(0, 0, 0)):
    return s.uop_kernel(key, lambda b: b.loop(*outer).loop(*inner).push(*uop))


@pytest.mark.parametrize("outer, inner, uop, field, mem, index", [
    # dst = 0 + (ACC/2)*1 + 1*(ACC/2 - 1): exactly the last row, legal
    ((2, ACC // 2, 0, 0), (ACC // 2, 1, 0, 0), (0, 0, 0), "dst", "ACC", ACC - 1),
    ((1, 0, 0, 0), (16, 0, 1, 0), (0, INP - 15, 0), "src", "INP", INP),
    ((4, 0, 0, 1), (1, 0, 0, 0), (0, 0, WGT - 3), "wgt", "WGT", WGT),
])
def test_gemm_index_past_the_end_is_refused_at_the_call(outer, inner, uop, field, mem, index):
    s = session()
    k = gemm_kernel(s, "k", outer, inner, uop)
    if index < CFG.depth(M[mem]):  # the first case sits exactly at the edge: legal
        s.gemm(k)
        assert s.pending == 2  # LOAD UOP + GEMM
        return
    with pytest.raises(ValueError) as e:
        s.gemm(k)
    text = str(e.value)
    assert text.startswith("gemm: kernel 'k': ")
    assert f"{field} index {index} = micro-op 0" in text
    assert f"{mem} SRAM has depth {CFG.depth(M[mem])}" in text
    assert s.pending == 0  # nothing was recorded, not even the micro-op load


def test_gemm_dst_one_past_the_end():
    s = session()
    k = gemm_kernel(s, "acc", (2, ACC // 2), (ACC // 2, 1), (1, 0, 0))
    with pytest.raises(ValueError, match=rf"gemm: kernel 'acc': dst index {ACC} = micro-op 0 "
                                         rf"dst=1 \+ {ACC // 2}\*1 \+ 1\*{ACC // 2 - 1} .*"
                                         rf"ACC SRAM has depth {ACC} \(rows 0..{ACC - 1}\)"):
        s.gemm(k)


def test_the_largest_micro_op_is_named():
    s = session()
    k = s.uop_kernel("m", lambda b: b.loop(4, dst=ACC // 4).push(0).push(ACC // 4 - 1)
                     .push(ACC // 4), mode="alu", alu_opcode=A.ADD, use_imm=True, imm=1)
    with pytest.raises(ValueError, match=rf"alu: kernel 'm': dst index {ACC} = micro-op 2 "):
        s.alu(k)


def test_alu_src_reads_acc():
    s = session()
    # src within INP's depth but past ACC's would pass a GEMM check; the ALU reads ACC
    k = s.uop_kernel("a", lambda b: b.loop(8, dst=1, src=1).push(0, ACC - 4), mode="alu",
                     alu_opcode=A.MAX, use_imm=False)
    with pytest.raises(ValueError, match=rf"alu: kernel 'a': src index {ACC + 3} .* ACC SRAM"):
        s.alu(k)


def test_edge_kernels_pass_and_run():
    s = session()
    x = s.array(np.arange(ACC * 16, dtype=np.int32).reshape(ACC, 16) % 100)
    s.load_2d(x, 0, ACC, 1, ACC, sram_base=0, memory_type=M.ACC)
    k = s.uop_kernel("all", lambda b: b.loop(ACC // 8, dst=8, src=8).loop(8, dst=1, src=1)
                     .push(0, 0), mode="alu", alu_opcode=A.ADD, use_imm=True, imm=1)
    s.alu(k)
    s.synchronize()


def recorded_program(s, iter_in, dst_factor_in=1):
    """A loaded Program (saved and read back) whose GEMM runs ``iter_in`` INP rows."""
    import io

    x = s._arrays.get("x") or s.alloc((INP, 16), np.int8, name="x")
    with s.record() as out:
        s.load_2d(x, 0, 16, 1, 16, sram_base=0, memory_type=M.INP)
        s.gemm(s.uop_kernel("g", lambda b: b.loop(16, dst=1, src=1).push(0, 0, 0)))
    prog = out[0]
    insns = prog.insns()
    k = next(i for i, insn in enumerate(insns) if isinstance(insn, isa.GemmInsn))
    insns[k] = isa.replace(insns[k], iter_in=iter_in, dst_factor_in=dst_factor_in,
                           src_factor_in=1)
    changed = Program.from_insns(CFG, insns, prog.relocs, prog.constants)
    buf = io.BytesIO()
    changed.save(buf)
    buf.seek(0)
    return Program.load(buf, CFG), k


def test_run_program_checks_a_loaded_program():
    s = session()
    prog, k = recorded_program(s, INP + 1)
    with pytest.raises(ValueError, match=rf"run_program: instruction #{k} GEMM \(micro-ops "
                                         rf"0..0\): dst index {ACC} .* ACC SRAM has depth"):
        s.run_program(prog)
    prog, k = recorded_program(s, INP + 1, dst_factor_in=0)
    with pytest.raises(ValueError, match=rf"#{k} GEMM .*: src index {INP} = micro-op 0 src=0 "
                                         rf"\+ 0\*0 \+ 1\*{INP} .* INP SRAM has depth"):
        s.run_program(prog)
    prog, _ = recorded_program(s, 64)
    s.run_program(prog)  # inside every buffer: runs


def test_the_simulator_refuses_what_the_driver_refuses(monkeypatch):
    """The check is the simulator's, moved to the host: the same program fails on ``sim``."""
    from vtakit.driver import session as session_mod

    s = session()
    prog, k = recorded_program(s, INP + 1, dst_factor_in=0)
    with pytest.raises(ValueError):
        s.run_program(prog)
    monkeypatch.setattr(session_mod, "_check_program_indices", lambda cfg, program: None)
    with pytest.raises(DeviceError, match=rf"instruction #{k} GEMM.*SRAM index out of "
                                          rf"range: INP\[{INP}\]"):
        s.run_program(prog)


def test_run_program_checks_load_store_rows_and_uop_end():
    s = session()
    x = s.alloc((64, 16), np.int8, name="x")
    with s.record() as out:
        s.load_2d(x, 0, 16, 1, 16, sram_base=0, memory_type=M.INP)
        s.alu(s.uop_kernel("r", lambda b: b.loop(4, dst=1).push(0), mode="alu",
                           alu_opcode=A.MAX, use_imm=True))
        s.store_2d(x, 0, 16, 1, 16, sram_base=0)
    insns = out[0].insns()
    load = 0
    store = next(i for i, insn in enumerate(insns)
                 if isinstance(insn, isa.MemInsn) and insn.opcode == isa.Opcode.STORE)
    alu = next(i for i, insn in enumerate(insns) if isinstance(insn, isa.AluInsn))

    def run(k, **changes):
        bad = list(insns)
        bad[k] = isa.replace(bad[k], **changes)
        s.run_program(Program.from_insns(CFG, bad, out[0].relocs, out[0].constants))

    with pytest.raises(ValueError, match=rf"#{load} LOAD INP: INP SRAM rows {INP - 8}.."
                                         rf"{INP + 7} are out of range \(depth {INP}\)"):
        run(load, sram_base=INP - 8)
    with pytest.raises(ValueError, match=rf"#{store} STORE OUT: OUT SRAM rows"):
        run(store, sram_base=CFG.out_depth - 1)
    with pytest.raises(ValueError, match=rf"#{alu} ALU: uop_end={CFG.uop_depth + 1} is out of "
                                         rf"range: UOP SRAM has depth {CFG.uop_depth}"):
        run(alu, uop_bgn=CFG.uop_depth - 1, uop_end=CFG.uop_depth + 1)
    run(alu)  # unchanged: runs


def test_micro_ops_from_an_argument_buffer_are_not_judged():
    """A LOAD UOP from a caller's buffer: the host does not know those micro-ops."""
    s = session()
    words = isa.encode_uops(np.array([[ACC - 1, 0, 0]]), CFG)
    u = s.array(words, name="u")
    with s.record() as out:
        s.load_2d(u, 0, 1, 1, 1, sram_base=0, memory_type=M.UOP)
    insns = out[0].insns()[:-1] + [isa.GemmInsn(uop_bgn=0, uop_end=1, iter_out=1, iter_in=2,
                                                dst_factor_in=1), isa.FinishInsn()]
    prog = Program.from_insns(CFG, insns, out[0].relocs, out[0].constants)
    with pytest.raises(DeviceError, match=r"ACC\[2048\]"):  # the device still refuses it
        s.run_program(prog)
