"""The JIT's stream building, checked on the instructions it produces (no simulation here;
tests/conformance runs the streams)."""

import numpy as np
import pytest

from vtakit.driver import Device, DeviceInfo, Program, RunResult, Session, Stage, stage_of
from vtakit.driver.memory import Allocator, OutOfDeviceMemory
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset

CFG = preset("default")
A, M = isa.AluOp, isa.MemType


class RecordingDevice(Device):
    """Memory plus a log of the streams it was asked to run."""

    def __init__(self, cfg=CFG, config_hash=None):
        super().__init__(cfg)
        self.mem = np.zeros(1 << 22, np.uint8)
        self.alloc = Allocator(self.mem.size)
        self.runs = []
        self.hash = config_hash or cfg.hash

    def allocate(self, nbytes, align):
        return self.alloc.alloc(nbytes, align)

    def free(self, addr):
        self.alloc.free(addr)

    def write(self, addr, data):
        buf = np.frombuffer(bytes(data), np.uint8)
        self.mem[addr:addr + buf.size] = buf

    def read(self, addr, nbytes):
        return self.mem[addr:addr + nbytes].copy()

    def run(self, insn_addr, insn_count):
        data = self.mem[insn_addr:insn_addr + 16 * insn_count].tobytes()
        self.runs.append([isa.decode(data[i:i + 16], self.cfg) for i in range(0, len(data), 16)])

    def wait(self, timeout_s):
        return RunResult(cycles=0)

    def identify(self):
        return DeviceInfo("recording", isa.HW_VER, self.hash)


def flags(insn):
    return " ".join(name for name in ("pop_prev", "pop_next", "push_prev", "push_next")
                    if getattr(insn, name))


def relu_kernel(s):
    return s.uop_kernel("relu", lambda b: b.loop(8, dst=1).push(0), mode="alu",
                        alu_opcode=A.MAX, use_imm=True, imm=0)


def test_pops_attach_to_next_instruction_of_the_stage_and_pushes_fold():
    s = Session(RecordingDevice())
    x = s.alloc((8, 16), np.int8)
    s.load_2d(x, 0, 8, 1, 8, sram_base=0, memory_type=M.INP)
    s.dep_push(Stage.LOAD, Stage.COMPUTE)            # folds into the LOAD
    s.dep_pop(Stage.LOAD, Stage.COMPUTE)             # rides on compute's next instruction
    s.alu(relu_kernel(s))                            # LOAD UOP (carries the pop), then ALU
    s.dep_push(Stage.COMPUTE, Stage.STORE)
    s.dep_pop(Stage.COMPUTE, Stage.STORE)
    s.store_2d(x, 0, 8, 1, 8, sram_base=0)
    s.synchronize()
    insns = s.device.runs[-1]
    kinds = [(stage_of(i).name, isa.Opcode(i.opcode).name, flags(i)) for i in insns]
    assert kinds == [
        ("LOAD", "LOAD", "push_next"),
        ("COMPUTE", "LOAD", "pop_prev"),                 # the micro-op load carries the pop
        ("COMPUTE", "ALU", "push_next"),
        ("STORE", "STORE", "pop_prev push_prev"),        # pops, then tells compute it is done
        ("LOAD", "LOAD", "push_next"),   # the load stage had work: a NOP says it is done
        ("COMPUTE", "FINISH", "pop_prev pop_next"),
    ]
    assert insns[4].x_size == 0 and insns[4].memory_type == M.INP


def test_double_pop_emits_a_nop():
    s = Session(RecordingDevice())
    s.dep_pop(Stage.LOAD, Stage.COMPUTE)
    s.dep_pop(Stage.LOAD, Stage.COMPUTE)
    s.alu(relu_kernel(s))
    s.synchronize()
    insns = s.device.runs[-1]
    assert isa.Opcode(insns[0].opcode) == isa.Opcode.LOAD and insns[0].x_size == 0
    assert insns[0].pop_prev == 1 and insns[1].pop_prev == 1  # NOP, then the micro-op load


def test_push_after_pending_pop_gets_its_own_nop():
    s = Session(RecordingDevice())
    x = s.alloc((8, 16), np.int8)
    s.load_2d(x, 0, 8, 1, 8, sram_base=0, memory_type=M.INP)
    s.dep_pop(Stage.COMPUTE, Stage.LOAD)
    s.dep_push(Stage.LOAD, Stage.COMPUTE)  # must come after the pop, not fold into the LOAD
    prog = s.finalize()
    insns = prog.insns()
    assert insns[0].push_next == 0
    assert insns[1].x_size == 0 and insns[1].pop_next == 1 and insns[1].push_next == 1


def test_uop_kernels_stay_resident_across_runs():
    s = Session(RecordingDevice())
    k = relu_kernel(s)
    assert s.uop_kernel("relu") is k
    s.alu(k)
    s.alu(k)
    s.synchronize()
    s.alu(k)
    s.synchronize()
    first, second = s.device.runs
    assert [isa.Opcode(i.opcode).name for i in first] == ["LOAD", "ALU", "ALU", "FINISH"]
    assert [isa.Opcode(i.opcode).name for i in second] == ["ALU", "FINISH"]
    assert first[1] == second[0]


def test_uop_eviction_when_sram_is_full():
    cfg = preset("ice40")  # 512 micro-ops
    s = Session(RecordingDevice(cfg))
    kernels = [s.uop_kernel(i, lambda b, i=i: [b.push(j % 4 + i) for j in range(200)]
                            and None, mode="alu", imm=i) for i in range(3)]
    for k in kernels:
        s.alu(k)
    s.alu(kernels[0])
    s.synchronize()
    loads = [i for i in s.device.runs[0] if isa.Opcode(i.opcode) == isa.Opcode.LOAD]
    assert [ld.sram_base for ld in loads] == [0, 200, 0, 200]  # third evicts; first reloads


def test_uop_words_go_to_device_memory():
    s = Session(RecordingDevice())
    k = s.uop_kernel("g", lambda b: b.push(1, 2, 3).push(4, 5, 6))
    s.gemm(k)
    s.synchronize()
    load = s.device.runs[0][0]
    words = s.device.read(load.dram_base * 4, 8).view("<u4")
    assert (words == isa.encode_uops(k.uops, CFG)).all()


def test_program_relinks_without_rebuilding():
    s = Session(RecordingDevice())
    x = s.alloc((64, 16), np.int8, name="x")
    with s.record() as out:
        s.load_2d(x, 4, 8, 2, 16, sram_base=0, memory_type=M.INP)
        s.store_2d(x, 2, 4, 1, 4, sram_base=0)
    prog = out[0]
    assert prog.arguments == ["x"]
    for base in (0x10000, 0x20040):
        stream = prog.link({"x": base})
        insns = [isa.decode(stream[i:i + 16], CFG) for i in range(0, len(stream), 16)]
        assert insns[0].dram_base == base // 16 + 4
        assert insns[1].dram_base == base // 16 + 2
    with pytest.raises(ValueError, match=r"cannot link: no address for slot\(s\) x"):
        prog.link({})
    with pytest.raises(ValueError, match=r"slot 'x' is at 0x10008, not a multiple of its "
                                         r"16-byte elements"):
        prog.link({"x": 0x10008})


def test_program_save_load(tmp_path):
    s = Session(RecordingDevice())
    x = s.alloc((64, 16), np.int8, name="x")
    with s.record() as out:
        s.load_2d(x, 0, 8, 1, 8, sram_base=0, memory_type=M.ACC_8BIT)
        s.alu(relu_kernel(s))
    out[0].save(tmp_path / "p.npz")
    back = Program.load(tmp_path / "p.npz")
    assert back.link({"x": 4096, **{k: 0 for k in back.constants}}) == \
        out[0].link({"x": 4096, **{k: 0 for k in back.constants}})
    assert back.cfg == CFG and list(back.constants) == list(out[0].constants)


def test_run_program_binds_arguments():
    s = Session(RecordingDevice())
    x = s.alloc((8, 16), np.int8, name="x")
    with s.record() as out:
        s.load_2d(x, 0, 8, 1, 8, sram_base=0, memory_type=M.INP)
    y = s.alloc((8, 16), np.int8)
    s.run_program(out[0], {"x": y})
    assert s.device.runs[-1][0].dram_base == y.addr // 16
    with pytest.raises(ValueError, match=r"no buffer bound to slot 'z'"):
        s.run_program(Program(CFG, out[0].words, [r.__class__(0, "z", 0, 16)
                                                  for r in out[0].relocs]))


@pytest.mark.parametrize("call, message", [
    (lambda s, x: s.load_2d(x, 0, 8, 2, 8, sram_base=0, memory_type=M.INP),
     r"load_2d: out-of-range DRAM access: bytes 0..255 of buf0 \(128 bytes"),
    (lambda s, x: s.load_2d(x, 0, 8, 1, 4, sram_base=0, memory_type=M.INP),
     r"load_2d: x_stride=4 is smaller than x_size=8"),
    (lambda s, x: s.load_2d(x, 0, 8, 1, 8, sram_base=2044, memory_type=M.INP),
     r"load_2d: INP SRAM rows 2044..2051 are out of range \(depth 2048\)"),
    (lambda s, x: s.load_2d(x, 0, 8, 1, 8, sram_base=0, memory_type=M.OUT),
     r"load_2d: OUT cannot be loaded"),
    (lambda s, x: s.store_2d(x, 0, 8, 1, 8, sram_base=0, memory_type=M.ACC),
     r"store_2d: only OUT can be stored, got ACC"),
    (lambda s, x: s.load_2d(np.zeros(4), 0, 1, 1, 1, sram_base=0, memory_type=M.INP),
     r"load_2d: expected a live DeviceArray of this session"),
    (lambda s, x: s.load_2d(x, 0, 8, 1, 8, x_pad_0=16, sram_base=0, memory_type=M.INP),
     r"LOAD field 'x_pad_0' = 16 does not fit in 4 bits"),
    (lambda s, x: s.dep_push(Stage.LOAD, Stage.STORE),
     r"dep_push\(LOAD, STORE\): tokens only flow between neighbouring stages"),
    (lambda s, x: s.gemm(relu_kernel(s)), r"gemm: the kernel was recorded for alu"),
    (lambda s, x: s.uop_kernel("never"), r"no micro-op kernel is cached under 'never'"),
    (lambda s, x: s.uop_kernel("big", lambda b: b.push(4096)),
     r"micro-op 0: field 'dst' = 4096 does not fit in 11 bits"),
])
def test_bad_commands_are_refused_at_the_call(call, message):
    s = Session(RecordingDevice())
    x = s.alloc((8, 16), np.int8)
    with pytest.raises((ValueError, TypeError, KeyError), match=message):
        call(s, x)


def test_session_refuses_a_device_built_for_another_config():
    with pytest.raises(ValueError, match=r"device recording reports configuration 00000000, "
                                         r"ISA 0.0.2; the driver expects eb4589e8"):
        Session(RecordingDevice(config_hash="00000000"))


def test_allocator_first_fit_and_errors():
    a = Allocator(1 << 16)
    p = a.alloc(1000, 256)
    q = a.alloc(1000, 256)
    assert p % 256 == 0 and q >= p + 1000 and p > 0
    a.free(p)
    assert a.alloc(500, 256) == p  # first fit reuses the hole
    with pytest.raises(OutOfDeviceMemory, match=r"cannot allocate 1048576 bytes"):
        a.alloc(1 << 20)
    with pytest.raises(ValueError, match=r"not an allocated block"):
        a.free(12345)
