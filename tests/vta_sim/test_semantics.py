"""Each instruction's data effect against a plain-loop reference written from the ISA text."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig, preset
from vtakit.vta_hw.isa import AluOp, MemType, Opcode
from vtakit.vta_sim import ArchState
from vtakit.vta_sim import semantics as sem
from vtakit.vta_sim.errors import ExecFault

# batch 2, block_in 4, block_out 8: catches mixed-up axes
CFG = HwConfig(log_batch=1, log_block_in=2, log_block_out=3, log_uop_buff_size=8,
               log_inp_buff_size=9, log_wgt_buff_size=10, log_acc_buff_size=11).validate()


def fields(kind: str, **kw) -> dict[str, int]:
    lay = isa.layouts(CFG)
    layout = {"mem": lay.mem, "gemm": lay.gemm, "alu": lay.alu}[kind]
    d = dict.fromkeys(layout.names, 0)
    d["opcode"] = {"mem": Opcode.LOAD, "gemm": Opcode.GEMM, "alu": Opcode.ALU}[kind]
    if kind != "mem":
        d["iter_out"] = d["iter_in"] = 1
    d.update(kw)
    return d


def random_state(rng) -> ArchState:
    st = ArchState.zeros(CFG)
    st.inp[:] = rng.integers(-128, 128, st.inp.shape)
    st.wgt[:] = rng.integers(-128, 128, st.wgt.shape)
    st.acc[:] = rng.integers(-2**31, 2**31, st.acc.shape)
    return st


# ---- references: loops over the definitions --------------------------------------------------

def ref_load(st, dram, f):
    mt = MemType(f["memory_type"])
    eb = CFG.elem_bytes(mt)
    buf = {MemType.INP: st.inp, MemType.WGT: st.wgt, MemType.ACC: st.acc,
           MemType.ACC_8BIT: st.acc, MemType.UOP: st.uop}[mt]
    dtype = {MemType.ACC: "<i4", MemType.UOP: "<u4"}.get(mt, "i1")
    cols = f["x_pad_0"] + f["x_size"] + f["x_pad_1"]
    rows = f["y_pad_0"] + f["y_size"] + f["y_pad_1"]
    for r in range(rows):
        for c in range(cols):
            y, x = r - f["y_pad_0"], c - f["x_pad_0"]
            dst = f["sram_base"] + r * cols + c
            if 0 <= y < f["y_size"] and 0 <= x < f["x_size"]:
                a = (f["dram_base"] + y * f["x_stride"] + x) * eb
                buf[dst] = np.frombuffer(dram[a:a + eb].tobytes(), dtype).reshape(
                    buf.shape[1:])
            else:
                buf[dst] = 0


def ref_loop(st, f, body):
    d_, s_, w_ = isa.decode_uops(st.uop, CFG)
    for i in range(f["iter_out"]):
        for j in range(f["iter_in"]):
            for u in range(f["uop_bgn"], f["uop_end"]):
                d = int(d_[u]) + i * f["dst_factor_out"] + j * f["dst_factor_in"]
                s = int(s_[u]) + i * f["src_factor_out"] + j * f["src_factor_in"]
                w = int(w_[u]) + i * f.get("wgt_factor_out", 0) + j * f.get("wgt_factor_in", 0)
                body(d, s, w)


def wrap(v: int) -> int:
    return ((int(v) + 2**31) % 2**32) - 2**31


def ref_gemm(st, f):
    def body(d, s, w):
        for b in range(CFG.batch):
            for o in range(CFG.block_out):
                if f["reset"]:
                    v = 0
                else:
                    v = int(st.acc[d, b, o]) + sum(int(st.inp[s, b, k]) * int(st.wgt[w, o, k])
                                                   for k in range(CFG.block_in))
                st.acc[d, b, o] = wrap(v)
                st.out[d, b, o] = np.int8(((wrap(v) + 128) % 256) - 128)
    ref_loop(st, f, body)


def ref_alu_scalar(op, a, b):
    if op == AluOp.MIN:
        return min(a, b)
    if op == AluOp.MAX:
        return max(a, b)
    if op == AluOp.ADD:
        return wrap(a + b)
    if op == AluOp.MUL:
        return wrap(a * b)
    if b >= 0:
        return a >> min(b, 31)
    return 0 if -b >= 32 else wrap(a << -b)


def ref_alu(st, f):
    def body(d, s, w):
        for b in range(CFG.batch):
            for o in range(CFG.block_out):
                if f["reset"]:
                    v = 0
                else:
                    x = f["imm"] if f["use_imm"] else int(st.acc[s, b, o])
                    v = ref_alu_scalar(AluOp(f["alu_opcode"]), int(st.acc[d, b, o]), x)
                st.acc[d, b, o] = v
                st.out[d, b, o] = np.int8(((v + 128) % 256) - 128)
    ref_loop(st, f, body)


def same(a: ArchState, b: ArchState):
    for name in ("inp", "wgt", "acc", "out", "uop"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


# ---- LOAD / STORE -----------------------------------------------------------------------------

@pytest.mark.parametrize("mt", [MemType.INP, MemType.WGT, MemType.ACC, MemType.ACC_8BIT,
                                MemType.UOP])
@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (1, 1, 2, 1), (0, 1, 0, 0), (2, 0, 0, 3)])
def test_load_with_padding_on_every_side(mt, pads):
    rng = np.random.default_rng(1)
    dram = rng.integers(0, 256, 4096, dtype=np.uint8)
    f = fields("mem", memory_type=mt, sram_base=1, dram_base=3, y_size=2, x_size=3,
               x_stride=5, y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2],
               x_pad_1=pads[3])
    a, b = random_state(rng), None
    b = a.copy()
    sem.load(a, dram, f)
    ref_load(b, dram, f)
    same(a, b)


def test_acc_8bit_sign_extends():
    st = ArchState.zeros(CFG)
    dram = np.zeros(64, np.uint8)
    dram[:16] = np.arange(16, dtype=np.int8) * np.int8(-9)  # includes negatives
    sem.load(st, dram, fields("mem", memory_type=MemType.ACC_8BIT, y_size=1, x_size=1,
                              x_stride=1))
    assert st.acc.dtype == np.int32
    assert st.acc[0].ravel().tolist() == (np.arange(16) * -9).astype(np.int8).tolist()
    assert st.acc[0].min() < 0


def test_nop_load_changes_nothing():
    st = random_state(np.random.default_rng(2))
    before = st.copy()
    sem.load(st, np.zeros(16, np.uint8), fields("mem", memory_type=MemType.INP, y_size=3,
                                                 x_size=0, y_pad_0=2))
    same(st, before)


def test_store_strided():
    st = random_state(np.random.default_rng(3))
    st.out[:] = np.random.default_rng(4).integers(-128, 128, st.out.shape)
    dram = np.zeros(1024, np.uint8)
    f = fields("mem", opcode=Opcode.STORE, memory_type=MemType.OUT, sram_base=2,
               dram_base=1, y_size=3, x_size=2, x_stride=4)
    sem.store(st, dram, f)
    eb = CFG.out_elem_bytes
    expect = np.zeros(1024, np.uint8)
    for y in range(3):
        for x in range(2):
            a = (1 + y * 4 + x) * eb
            expect[a:a + eb] = st.out[2 + y * 2 + x].view(np.uint8).ravel()
    np.testing.assert_array_equal(dram, expect)


# ---- GEMM -----------------------------------------------------------------------------------

def put_uops(st, rows):
    st.uop[:len(rows)] = isa.encode_uops(np.array(rows), CFG)


def test_gemm_accumulates_into_repeated_rows():
    # conv-like: iter_in walks input channels, every iteration adds into the same ACC rows
    rng = np.random.default_rng(5)
    a = random_state(rng)
    put_uops(a, [[0, 0, 0], [1, 1, 1], [0, 2, 2]])  # uop 2 writes row 0 again
    f = fields("gemm", uop_bgn=0, uop_end=3, iter_out=3, iter_in=4, dst_factor_out=2,
               dst_factor_in=0, src_factor_out=1, src_factor_in=7, wgt_factor_out=1,
               wgt_factor_in=3)
    b = a.copy()
    sem.gemm(a, f)
    ref_gemm(b, f)
    same(a, b)


def test_gemm_many_rows_share_weight_sequences():
    rng = np.random.default_rng(6)
    a = random_state(rng)
    put_uops(a, [[0, k, k] for k in range(8)])  # reduce over 8 tiles
    f = fields("gemm", uop_bgn=0, uop_end=8, iter_out=4, iter_in=6, dst_factor_out=1,
               dst_factor_in=4, src_factor_out=0, src_factor_in=8, wgt_factor_out=8)
    b = a.copy()
    sem.gemm(a, f)
    ref_gemm(b, f)
    same(a, b)


def test_gemm_reset_writes_zeros():
    a = random_state(np.random.default_rng(7))
    put_uops(a, [[3, 0, 0]])
    f = fields("gemm", reset=1, uop_bgn=0, uop_end=1, iter_in=2, dst_factor_in=5)
    sem.gemm(a, f)
    assert not a.acc[[3, 8]].any() and not a.out[[3, 8]].any()


def test_gemm_wraps_int32():
    st = ArchState.zeros(CFG)
    st.acc[0] = 2**31 - 1
    st.inp[0] = 1
    st.wgt[0] = 1
    put_uops(st, [[0, 0, 0]])
    sem.gemm(st, fields("gemm", uop_bgn=0, uop_end=1))
    assert (st.acc[0] == -2**31 + CFG.block_in - 1).all()
    assert (st.out[0] == CFG.block_in - 1).all()  # low 8 bits of -2^31 + 3


# ---- ALU ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", list(AluOp))
@pytest.mark.parametrize("use_imm, imm", [(1, 5), (1, -3), (1, -40), (1, 40), (0, 0)])
def test_alu_ops(op, use_imm, imm):
    rng = np.random.default_rng(int(op) * 7 + imm % 13)
    a = random_state(rng)
    a.acc[16:] = rng.integers(-40, 40, a.acc[16:].shape)  # small shift amounts too
    put_uops(a, [[0, 16, 0], [1, 17, 0]])
    f = fields("alu", uop_bgn=0, uop_end=2, iter_out=2, iter_in=3, dst_factor_out=2,
               dst_factor_in=4, src_factor_out=3, src_factor_in=1, alu_opcode=op,
               use_imm=use_imm, imm=imm)
    b = a.copy()
    sem.alu(a, f)
    ref_alu(b, f)
    same(a, b)


def test_shr_negative_shifts_left_and_mul_wraps():
    st = ArchState.zeros(CFG)
    st.acc[0] = 3
    put_uops(st, [[0, 0, 0]])
    sem.alu(st, fields("alu", uop_bgn=0, uop_end=1, alu_opcode=AluOp.SHR, use_imm=1, imm=-4))
    assert (st.acc[0] == 48).all()
    st.acc[0] = 2**30 + 1
    sem.alu(st, fields("alu", uop_bgn=0, uop_end=1, alu_opcode=AluOp.MUL, use_imm=1, imm=4))
    assert (st.acc[0] == 4).all() and (st.out[0] == 4).all()
    st.acc[0] = -(2**20)
    sem.alu(st, fields("alu", uop_bgn=0, uop_end=1, alu_opcode=AluOp.SHR, use_imm=1, imm=100))
    assert (st.acc[0] == -1).all()


@pytest.mark.parametrize("uops, fo, fi, src_fi, it", [
    ([[1, 0, 0]], 0, 0, 1, (1, 6)),          # same dst, six reads of consecutive rows
    ([[1, 0, 0], [2, 1, 0]], 0, 1, 1, (1, 5)),  # each iteration reads what the last wrote
    ([[0, 0, 0]], 0, 0, 0, (3, 4)),          # ACC[0] = ACC[0] op ACC[0], 12 times
    ([[5, 4, 0], [4, 5, 0]], 1, 0, 0, (4, 1)),  # ping-pong between two rows
])
def test_alu_overlapping_rows_run_in_order(uops, fo, fi, src_fi, it):
    rng = np.random.default_rng(9)
    for op in (AluOp.ADD, AluOp.MUL, AluOp.MAX):
        a = random_state(rng)
        a.acc[:] = rng.integers(-5, 6, a.acc.shape)
        put_uops(a, uops)
        f = fields("alu", uop_bgn=0, uop_end=len(uops), iter_out=it[0], iter_in=it[1],
                   dst_factor_out=fo, dst_factor_in=fi, src_factor_out=0, src_factor_in=src_fi,
                   alu_opcode=op)
        b = a.copy()
        sem.alu(a, f)
        ref_alu(b, f)
        same(a, b)


def test_alu_imm_repeated_dst():
    a = ArchState.zeros(CFG)
    a.acc[2] = 7
    put_uops(a, [[2, 0, 0]])
    sem.alu(a, fields("alu", uop_bgn=0, uop_end=1, iter_in=10, alu_opcode=AluOp.ADD,
                      use_imm=1, imm=3))
    assert (a.acc[2] == 37).all()


def test_alu_reset_writes_zeros():
    a = random_state(np.random.default_rng(10))
    put_uops(a, [[4, 9, 0]])
    sem.alu(a, fields("alu", reset=1, uop_bgn=0, uop_end=1, alu_opcode=AluOp.ADD))
    assert not a.acc[4].any() and not a.out[4].any()


# ---- faults ---------------------------------------------------------------------------------

def test_faults_name_buffer_index_and_depth():
    st = ArchState.zeros(CFG)
    with pytest.raises(ExecFault, match=r"SRAM index out of range: INP\[63\.\.64\] but INP "
                                        r"has depth 64"):
        sem.load(st, np.zeros(4096, np.uint8), fields("mem", memory_type=MemType.INP,
                                                       sram_base=63, y_size=1, x_size=2))
    with pytest.raises(ExecFault, match=r"DRAM access out of range: bytes \[0x1f8, 0x208\) .* "
                                        r"DRAM is 0x200 bytes"):
        sem.load(st, np.zeros(512, np.uint8), fields("mem", memory_type=MemType.INP,
                                                      dram_base=63, y_size=1, x_size=2))
    put_uops(st, [[0, 0, 0]])
    with pytest.raises(ExecFault, match=r"SRAM index out of range: WGT\[32\] .* depth 32"):
        sem.gemm(st, fields("gemm", uop_bgn=0, uop_end=1, iter_in=3, wgt_factor_in=16))


@pytest.mark.parametrize("op", list(AluOp))
@pytest.mark.parametrize("use_imm, imm", [(1, 3), (1, -2), (1, 31), (0, 0)])
def test_alu_reduction_into_one_row(op, use_imm, imm):
    # pooling-like: ACC[0..1] = op(ACC[0..1], ACC[src_j]) for 12 source rows j, or an immediate
    rng = np.random.default_rng(11)
    for amounts in ((-3, 4), (0, 6), (-6, 0)):  # mixed, right-only and left-only shifts
        a = random_state(rng)
        a.acc[8:] = rng.integers(*amounts, a.acc[8:].shape) if op == AluOp.SHR \
            else rng.integers(-2**31, 2**31, a.acc[8:].shape)
        put_uops(a, [[0, 8, 0], [1, 9, 0]])
        f = fields("alu", uop_bgn=0, uop_end=2, iter_out=3, iter_in=4, src_factor_out=2,
                   src_factor_in=5, alu_opcode=op, use_imm=use_imm, imm=imm)
        b = a.copy()
        sem.alu(a, f)
        ref_alu(b, f)
        same(a, b)


# ---- random loops against the reference ---------------------------------------------------------



@st.composite
def loops(draw, alu: bool):
    n_u = draw(st.integers(0, 4))
    uops = [[draw(st.integers(0, 7)), draw(st.integers(0, 7)), draw(st.integers(0, 7))]
            for _ in range(n_u)]
    f = dict(uop_bgn=0, uop_end=n_u, iter_out=draw(st.integers(1, 3)),
             iter_in=draw(st.integers(1, 3)), reset=int(draw(st.integers(0, 9)) == 0),
             **{k: draw(st.integers(0, 3)) for k in ("dst_factor_out", "dst_factor_in",
                                                   "src_factor_out", "src_factor_in")})
    if alu:
        f.update(alu_opcode=draw(st.sampled_from(list(AluOp))), use_imm=draw(st.integers(0, 1)),
                 imm=draw(st.integers(-40, 40)))
    else:
        f.update(wgt_factor_out=draw(st.integers(0, 3)), wgt_factor_in=draw(st.integers(0, 3)))
    return uops, f


@settings(max_examples=80, deadline=None)
@given(loops(alu=True), st.integers(0, 2**32 - 1), st.booleans())
def test_random_alu_loops(case, seed, small):
    uops, f = case
    rng = np.random.default_rng(seed)
    a = random_state(rng)
    if small:  # small values: shift amounts and repeated products stay interesting
        a.acc[:] = rng.integers(-40, 40, a.acc.shape)
    if uops:
        put_uops(a, uops)
    f = fields("alu", **f)
    b = a.copy()
    sem.alu(a, f)
    ref_alu(b, f)
    same(a, b)


@settings(max_examples=40, deadline=None)
@given(loops(alu=False), st.integers(0, 2**32 - 1))
def test_random_gemm_loops(case, seed):
    uops, f = case
    a = random_state(np.random.default_rng(seed))
    if uops:
        put_uops(a, uops)
    f = fields("gemm", **f)
    b = a.copy()
    sem.gemm(a, f)
    ref_gemm(b, f)
    same(a, b)


# ---- GEMM fast path (cached loop plans) against the general path ---------------------------------

def general_gemm(st, f):
    """GEMM through :func:`sem._gemm_sums` (the general path), bypassing the cached plans."""
    dst, src, wgt = sem.loop_indices(st, f, st.cfg.inp_depth, "INP")
    rows, sums = sem._gemm_sums(st, dst, src, wgt)
    sem._write(st, rows, sem._wrap32(st.acc[rows].astype(np.int64) + sums))


def matmul_uops(m, k, t, dst_step):
    # output tile oc sums k input tiles: dst = oc*dst_step, src = ci*t, wgt = oc*k + ci
    return [[oc * dst_step, ci * t, oc * k + ci] for oc in range(m) for ci in range(k)]


FAST_GEMM_CASES = {
    # like the driver's matmul kernel: every group reads the same rows, rows contiguous
    "contiguous": (matmul_uops(4, 4, 8, 8), dict(iter_out=8, dst_factor_out=1,
                                                 src_factor_out=1)),
    # rows interleaved: not one slice, still written once each
    "strided": (matmul_uops(4, 4, 8, 1), dict(iter_out=8, dst_factor_out=4, src_factor_out=1)),
    # weight offset changes with the outer iteration: one product per offset
    "weight offsets": ([[d, c, c] for d in range(2) for c in range(3)],
                       dict(iter_out=4, iter_in=3, dst_factor_out=2, dst_factor_in=8,
                            src_factor_out=1, src_factor_in=5, wgt_factor_out=4)),
    # inner iterations add into the same rows (conv-like reduction): rows written many times
    "repeated rows": (matmul_uops(2, 3, 4, 4), dict(iter_out=4, iter_in=4, dst_factor_out=1,
                                                    src_factor_out=1, src_factor_in=12,
                                                    wgt_factor_in=6)),
    # groups whose row ranges overlap: contiguous (reading different rows) or not (same rows)
    "overlapping ranges": ([[0, 0, 0], [0, 1, 1], [3, 2, 2], [3, 3, 3]],
                           dict(iter_out=10, dst_factor_out=1, src_factor_out=2)),
    "overlapping groups": ([[0, 0, 0], [0, 1, 1], [3, 0, 2], [3, 1, 3]],
                           dict(iter_out=10, dst_factor_out=1, src_factor_out=2)),
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("case", list(FAST_GEMM_CASES))
def test_gemm_fast_path_matches_general_path(case, seed):
    uops, loop = FAST_GEMM_CASES[case]
    a = random_state(np.random.default_rng(seed))  # ACC over the whole int32 range: wraps
    put_uops(a, uops)
    f = fields("gemm", uop_bgn=0, uop_end=len(uops), **loop)
    assert sem._gemm_plan(a, f) is not None  # the fast path is taken
    b, c = a.copy(), a.copy()
    sem.gemm(a, f)
    sem.gemm(a, f)  # second run: the cached plan, on the state the first run left
    general_gemm(b, f)
    general_gemm(b, f)
    same(a, b)
    ref_gemm(c, f)
    ref_gemm(c, f)
    same(a, c)


def test_gemm_fast_path_float64_reduction():
    # 80 terms of block_in 16 per output: beyond float32's exact range, float64 is used
    cfg = preset("default")
    rng = np.random.default_rng(9)
    a = ArchState.zeros(cfg)
    a.inp[:] = -128  # largest products: every sum is 80 * 16 * 2^14 > 2^24
    a.wgt[:80] = -128
    a.wgt[80:] = rng.integers(-128, 128, a.wgt[80:].shape)
    a.acc[:] = rng.integers(-2**31, 2**31, a.acc.shape)
    uops = [[oc * 16, ci * 16, oc * 80 + ci] for oc in range(2) for ci in range(80)]
    a.uop[:len(uops)] = isa.encode_uops(np.array(uops), cfg)
    f = dict.fromkeys(isa.layouts(cfg).gemm.names, 0)
    f.update(opcode=Opcode.GEMM, uop_bgn=0, uop_end=len(uops), iter_out=16, iter_in=1,
             dst_factor_out=1, src_factor_out=1)
    plan = sem._gemm_plan(a, f)
    assert plan is not None and plan.clusters[0].ft is np.float64
    b = a.copy()
    sem.gemm(a, f)
    general_gemm(b, f)
    np.testing.assert_array_equal(a.acc, b.acc)
    np.testing.assert_array_equal(a.out, b.out)
