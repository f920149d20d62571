"""Whole-core checks in Amaranth's simulator: cycles and DRAM against vta_sim."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.isa import AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode

sys.path.insert(0, str(Path(__file__).parent))
from core_harness import compare  # noqa: E402


def ld(mt, sram, dram_elem, y, x, stride=None, pads=(0, 0, 0, 0), **flags):
    return MemInsn(opcode=Opcode.LOAD, memory_type=mt, sram_base=sram, dram_base=dram_elem,
                   y_size=y, x_size=x, x_stride=x if stride is None else stride,
                   y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3], **flags)


def st(sram, dram_elem, y, x, stride=None, **flags):
    return MemInsn(opcode=Opcode.STORE, memory_type=MemType.OUT, sram_base=sram,
                   dram_base=dram_elem, y_size=y, x_size=x,
                   x_stride=x if stride is None else stride, **flags)


def gemm64(**flags):
    return GemmInsn(uop_bgn=0, uop_end=4, iter_out=2, iter_in=8, **flags)


# timing.md §5, default preset (D and E change one queue depth)
EXAMPLES = {
    "A": ("default", {}, [ld(MemType.INP, 0, 0, 1, 4, pads=(1, 1, 1, 1), push_next=1),
                          FinishInsn(pop_prev=1)], 94),
    "B-gemm": ("default", {}, [gemm64(), FinishInsn()], 36 + 1 + 70 + 1),
    "B-alu": ("default", {}, [AluInsn(uop_bgn=0, uop_end=4, iter_out=2, iter_in=8),
                              FinishInsn()], 36 + 1 + 133 + 1),
    "C": ("default", {}, [ld(MemType.WGT, 0, 0, 1, 8, push_next=1)]
          + [GemmInsn(uop_bgn=0, uop_end=0)] * 8 + [FinishInsn(pop_prev=1)], 344),
    "D": ("default", {"cmd_queue_depth": 1}, [gemm64()] * 3 + [FinishInsn()], 252),
    "E": ("default", {"dep_queue_depth": 1},
          [ld(MemType.INP, 0, 0, 0, 0, push_next=1)] * 2
          + [gemm64(pop_prev=1), GemmInsn(pop_prev=1), FinishInsn()], 117),
}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_worked_example(name):
    cfg_name, changes, insns, cycles = EXAMPLES[name]
    cfg = preset(cfg_name).replace(**changes) if changes else preset(cfg_name)
    dram = np.zeros(1 << 14, np.uint8)
    rtl, sim = compare(cfg, dram, insns)
    assert rtl == sim == cycles


def mixed_program(cfg, nu=6):
    """Every instruction kind: unaligned UOP load, strided padded INP, WGT, ACC, ACC_8BIT,
    padding-only load, GEMM with back-to-back accumulation, every ALU op (tensor and
    immediate, negative and positive shifts), reset, a strided unaligned STORE."""
    ei, ew, ea, e8, eo = (cfg.elem_bytes(t) for t in (MemType.INP, MemType.WGT, MemType.ACC,
                                                       MemType.ACC_8BIT, MemType.OUT))
    return [
        ld(MemType.UOP, 1, 4096 // 4 + 1, 1, nu - 1),
        ld(MemType.UOP, 0, 4096 // 4, 1, 1),
        ld(MemType.INP, 0, 8192 // ei + 1, 3, 3, stride=5, pads=(1, 0, 2, 1)),
        ld(MemType.WGT, 0, 12288 // ew, 2, 2, stride=3),
        ld(MemType.ACC, 0, 16384 // ea, 2, 3, stride=4),
        ld(MemType.ACC_8BIT, 6, 20480 // e8 + 1, 2, 3, stride=3),
        ld(MemType.INP, 20, 8192 // ei, 0, 3, pads=(1, 1, 0, 0), push_next=1),
        GemmInsn(pop_prev=1, uop_bgn=0, uop_end=nu, iter_out=2, iter_in=2, dst_factor_out=3,
                 dst_factor_in=1, src_factor_out=4, src_factor_in=1, wgt_factor_out=1),
        GemmInsn(uop_bgn=0, uop_end=3, iter_out=1, iter_in=3),
        AluInsn(uop_bgn=0, uop_end=nu, iter_in=2, dst_factor_in=1, src_factor_in=2,
                alu_opcode=AluOp.ADD),
        AluInsn(uop_bgn=0, uop_end=3, iter_out=2, dst_factor_out=1, alu_opcode=AluOp.SHR,
                use_imm=1, imm=-3),
        AluInsn(uop_bgn=0, uop_end=3, alu_opcode=AluOp.SHR, use_imm=1, imm=2),
        AluInsn(uop_bgn=0, uop_end=4, iter_in=2, alu_opcode=AluOp.MUL, src_factor_in=3),
        AluInsn(uop_bgn=1, uop_end=4, alu_opcode=AluOp.MAX, use_imm=1, imm=-100),
        AluInsn(uop_bgn=0, uop_end=4, alu_opcode=AluOp.MIN),
        GemmInsn(reset=1, uop_bgn=5, uop_end=6, push_next=1),
        st(0, 24576 // eo + 1, 3, 3, stride=5, pop_prev=1, push_prev=1),
        FinishInsn(pop_next=1),
    ]


@pytest.mark.parametrize("cfg_name", ["ice40", "ecp5", "default"])
def test_mixed_program_matches_vta_sim(cfg_name):
    cfg = preset(cfg_name)
    rng = np.random.default_rng(1)
    dram = rng.integers(0, 256, 1 << 15).astype(np.uint8)
    dram[:4096] = 0
    nu = 6
    uops = isa.encode_uops(np.array([[i % 3, i, i % 2] for i in range(nu)]), cfg)
    dram[4096:4096 + 4 * nu] = uops.view(np.uint8)
    rtl, sim = compare(cfg, dram, mixed_program(cfg, nu), insn_addr=48)
    assert rtl == sim


def test_store_preempted_by_loads_small_bursts():
    """Short bursts and latency: fetch, compute, load and store contend for the port."""
    cfg = preset("ice40").replace(mem_max_burst_beats=2, mem_read_latency_cycles=3,
                                  cmd_queue_depth=2, dep_queue_depth=2)
    rng = np.random.default_rng(2)
    dram = rng.integers(0, 256, 1 << 15).astype(np.uint8)
    prog = [ld(MemType.ACC_8BIT, 0, 20480 // 2, 4, 5, stride=7),
            AluInsn(uop_bgn=0, uop_end=0, push_next=1),
            st(0, 24576 // 2 + 3, 4, 5, stride=6, pop_prev=1),
            ld(MemType.WGT, 0, 12288 // 4 + 1, 3, 7, stride=9),
            ld(MemType.INP, 0, 8192 // 2 + 1, 3, 7, stride=9, push_next=1),
            ld(MemType.UOP, 0, 4096 // 4 + 3, 1, 9, pop_prev=1),
            st(0, 28672 // 2, 2, 9, stride=9, push_prev=1),
            FinishInsn(pop_next=1)]
    prog[5] = GemmInsn(pop_prev=1, uop_bgn=0, uop_end=0)
    prog.insert(6, ld(MemType.UOP, 0, 4096 // 4 + 3, 1, 9))
    rtl, sim = compare(cfg, dram, prog, insn_addr=16)
    assert rtl == sim


# (y_size, x_size, (y_pad_0, y_pad_1, x_pad_0, x_pad_1), dram element offset, x_stride - x_size):
# every padding segment present or absent, no gap between rows, padding only, a NOP
PADDED_SHAPES = {
    "all-pads": (2, 3, (1, 1, 1, 1), 0, 0),
    "no-top": (3, 2, (0, 1, 0, 1), 1, 2),
    "no-gap": (3, 2, (1, 1, 0, 0), 3, 1),
    "no-bottom": (2, 2, (1, 0, 1, 0), 2, 3),
    "left-only": (3, 2, (0, 0, 2, 0), 1, 0),
    "right-only": (1, 5, (0, 0, 0, 3), 3, 0),
    "one-elem": (1, 1, (2, 2, 2, 2), 5, 0),
    "wide-pads": (2, 3, (15, 0, 15, 15), 1, 4),
    "pad-only": (0, 3, (1, 2, 0, 0), 0, 0),
    "empty": (0, 3, (0, 0, 0, 0), 0, 0),
    "nop": (2, 0, (1, 1, 1, 1), 0, 0),
}


# presets and variants: with a read latency of 2 or more the read DMA steps its index from a
# row's last beat with registers (several elements a beat: "ice40-L2", "ecp5-bus128")
PADDED_CONFIGS = {"ice40": {}, "default": {}, "ice40-L2": {"mem_read_latency_cycles": 2},
                  "ecp5-bus128": {"log_bus_width": 7}}


@pytest.mark.parametrize("shape", list(PADDED_SHAPES))
@pytest.mark.parametrize("cfg_name,mt", [("ice40", MemType.ACC_8BIT), ("ice40", MemType.ACC),
                                         ("default", MemType.ACC),
                                         ("ice40-L2", MemType.ACC_8BIT),
                                         ("ecp5-bus128", MemType.ACC_8BIT)])
def test_padded_load_matches_vta_sim(cfg_name, mt, shape):
    """A padded LOAD over an ACC region filled beforehand, copied to OUT by an ALU and stored:
    the DRAM shows which elements it wrote (data and zeros) and the cycles its duration."""
    changes = PADDED_CONFIGS[cfg_name]
    base = preset(cfg_name.split("-")[0])
    cfg = base.replace(**changes) if changes else base
    y, x, pads, offset, extra = PADDED_SHAPES[shape]
    rows, cols = pads[0] + y + pads[1], pads[2] + x + pads[3]
    n = 2 + rows * cols + 3  # the block at SRAM 2.., with untouched elements on both sides
    rng = np.random.default_rng(3)
    dram = rng.integers(1, 256, 1 << 16).astype(np.uint8)
    dram[4096:4100] = isa.encode_uops(np.array([[0, 0, 0]]), cfg).view(np.uint8)
    e, eo = cfg.elem_bytes(mt), cfg.elem_bytes(MemType.OUT)
    prog = [
        ld(MemType.UOP, 0, 4096 // 4, 1, 1),
        ld(MemType.ACC, 0, 8192 // cfg.elem_bytes(MemType.ACC), 1, n),  # nonzero everywhere
        ld(mt, 2, 16384 // e + offset, y, x, stride=x + extra, pads=pads),
        AluInsn(uop_bgn=0, uop_end=1, iter_out=n, dst_factor_out=1, src_factor_out=1,
                alu_opcode=AluOp.ADD, use_imm=1, imm=0, push_next=1),
        st(0, 32768 // eo, 1, n, pop_prev=1, push_prev=1),
        FinishInsn(pop_next=1),
    ]
    rtl, sim = compare(cfg, dram, prog, insn_addr=48)
    assert rtl == sim


# (y_size, x_size, x_stride, DRAM element offset): rows of micro-ops that start in different
# lanes of their first bus word, one-beat and multi-beat rows among them
UOP_BLOCKS = {"odd-stride": (3, 2, 5, 1), "rows-3": (4, 3, 3, 0), "single": (3, 1, 1, 1),
              "wide": (2, 7, 9, 3)}


@pytest.mark.parametrize("block", list(UOP_BLOCKS))
@pytest.mark.parametrize("cfg_name", ["ice40", "ecp5", "ecp5-bus128", "ice40-L2"])
def test_2d_uop_load_matches_vta_sim(cfg_name, block):
    """A LOAD of micro-ops in several rows with a stride that moves each row's first element
    to another lane (each row's beats and last lane differ), then an ALU that adds 1 to the
    ACC row each loaded micro-op names, stored: the DRAM shows which micro-ops arrived where."""
    changes = PADDED_CONFIGS.get(cfg_name, {})
    base = preset(cfg_name.split("-")[0])
    cfg = base.replace(**changes) if changes else base
    y, x, stride, offset = UOP_BLOCKS[block]
    n = 32  # micro-ops in DRAM, the k-th naming ACC row k
    rng = np.random.default_rng(5)
    dram = rng.integers(1, 256, 1 << 16).astype(np.uint8)
    dram[4096:4096 + 4 * n] = isa.encode_uops(np.array([[k, 0, 0] for k in range(n)]),
                                              cfg).view(np.uint8)
    ea, eo = cfg.elem_bytes(MemType.ACC), cfg.elem_bytes(MemType.OUT)
    prog = [
        ld(MemType.ACC, 0, 8192 // ea, 1, n),
        ld(MemType.UOP, 2, 4096 // 4 + offset, y, x, stride=stride),
        AluInsn(uop_bgn=2, uop_end=2 + y * x, alu_opcode=AluOp.ADD, use_imm=1, imm=1,
                push_next=1),
        st(0, 32768 // eo, 1, n, pop_prev=1, push_prev=1),
        FinishInsn(pop_next=1),
    ]
    rtl, sim = compare(cfg, dram, prog, insn_addr=48)
    assert rtl == sim


def _mul_chain_program(cfg, rows):
    """ALU MULs over the ACC rows ``rows`` (one micro-op each: dst the row, src the row before
    it, so a tensor iteration's source is the row the iteration before wrote): immediate
    chains (one row again and again, rows alternating), MULs with reset, tensor MULs, other
    operations after MUL on the same rows; then every byte of the eight rows stored (OUT,
    shifted right by 8 between stores)."""
    nu = len(rows)
    eo, ea = cfg.elem_bytes(MemType.OUT), cfg.elem_bytes(MemType.ACC)
    prog = [ld(MemType.UOP, 0, 4096 // 4, 1, nu), ld(MemType.ACC, 0, 8192 // ea, 1, 8)]
    for op, use_imm, imm, u0, u1, it_in, reset in [
            (AluOp.MUL, 1, -3, 0, 1, 7, 0),      # one row, seven times
            (AluOp.MUL, 1, 5, 0, 2, 4, 0),       # rows 0 0 1 0 0 1 ...: distance 1 and 2
            (AluOp.MUL, 1, 301, 2, nu, 3, 0),    # the rest of the micro-ops, each three times
            (AluOp.MUL, 1, -1, 1, 2, 3, 1),      # reset: zeros
            (AluOp.ADD, 1, 3, 0, nu, 1, 0),      # nonzero rows again
            (AluOp.MUL, 1, -5, 0, nu, 1, 1),     # reset, the last write of a row not forwarded
            (AluOp.ADD, 1, 7, 0, nu, 1, 0),      # another operation after MUL, same rows
            (AluOp.MUL, 0, 0, 0, nu, 2, 0),      # tensor: src the row before (a square where equal)
            (AluOp.MUL, 1, -2, 0, nu, 1, 0),
            (AluOp.MIN, 0, 0, 0, nu, 2, 0),
            (AluOp.MUL, 1, 3, 0, 1, 1, 0),       # one iteration
            (AluOp.MUL, 1, -7, 0, nu, 2, 0)]:
        prog.append(AluInsn(uop_bgn=u0, uop_end=u1, iter_in=it_in, alu_opcode=op,
                            use_imm=use_imm, imm=imm, reset=reset))
    prog[-1] = dataclasses.replace(prog[-1], push_next=1)
    for k in range(4):  # byte k of every lane of rows 0..7
        prog.append(st(0, 24576 // eo + 8 * k, 1, 8, pop_prev=1, push_prev=1))
        if k < 3:
            prog.append(AluInsn(uop_bgn=0, uop_end=1, iter_out=8, dst_factor_out=1,
                                alu_opcode=AluOp.SHR, use_imm=1, imm=8, pop_next=1,
                                push_next=1))
    prog.append(FinishInsn(pop_next=1))
    return prog


@pytest.mark.parametrize("cfg_name", ["ice40", "ecp5", "default"])
@pytest.mark.parametrize("pattern", ["same", "alternating", "mixed"])
def test_alu_mul_chains_match_vta_sim(cfg_name, pattern):
    """Back-to-back MULs on one ACC row (distance 1 and 2, immediate and tensor, with and
    without reset): each iteration sees the product of the ones before, at the issue rate of
    docs/timing.md, and every bit of the result reaches DRAM."""
    cfg = preset(cfg_name)
    rows = {"same": [0, 0, 0, 1, 1], "alternating": [0, 1, 0, 1, 2, 2, 0],
            "mixed": [3, 3, 1, 3, 3, 3, 1, 1, 0]}[pattern]
    rng = np.random.default_rng(7)
    dram = rng.integers(0, 256, 1 << 15).astype(np.uint8)
    dram[:2048] = 0
    dram[4096:4096 + 4 * len(rows)] = isa.encode_uops(
        np.array([[r, rows[i - 1], 0] for i, r in enumerate(rows)]), cfg).view(np.uint8)
    rtl, sim = compare(cfg, dram, _mul_chain_program(cfg, rows), insn_addr=48)
    assert rtl == sim


def _gemm_then_store_program(cfg, nu):
    """GEMMs whose last iteration writes the ACC row that a STORE popping their token reads
    first (a STORE that starts in the GEMM's finish cycle): accumulation on one row, a walk
    over rows, a reset, loops whose last row was also written two iterations before; each
    STORE's rows, and the next GEMM waits for the STORE (s2g)."""
    eo = cfg.elem_bytes(MemType.OUT)
    prog = [ld(MemType.UOP, 0, 4096 // 4, 1, nu),
            ld(MemType.INP, 0, 8192 // cfg.elem_bytes(MemType.INP), 1, 4),
            ld(MemType.WGT, 0, 12288 // cfg.elem_bytes(MemType.WGT), 1, 4, push_next=1),
            ld(MemType.ACC, 0, 16384 // cfg.elem_bytes(MemType.ACC), 1, 8)]
    cases = [  # (uop_bgn, uop_end, iter_out, iter_in, dst_factor_in, reset, store rows)
        (0, 1, 1, 6, 0, 0, (2, 1)),    # micro-op 0 (row 2) six times
        (0, nu, 1, 1, 0, 0, (5, 2)),   # every micro-op once: the last writes row 5
        (1, 3, 2, 2, 0, 1, (7, 1)),    # reset
        (0, 3, 1, 3, 1, 0, (4, 3)),    # rows 2+j, 0+j, 4+j: the last row, 6, also at j=1
        (0, 1, 1, 1, 0, 0, (2, 1)),    # one iteration
    ]
    for i, (u0, u1, it_out, it_in, dfi, reset, (row, n)) in enumerate(cases):
        prog.append(GemmInsn(uop_bgn=u0, uop_end=u1, iter_out=it_out, iter_in=it_in,
                             dst_factor_in=dfi, src_factor_in=1 if dfi else 0,
                             wgt_factor_in=0, reset=reset, pop_prev=int(i == 0),
                             pop_next=int(i > 0), push_next=1))
        prog.append(st(row, 24576 // eo + 8 * i, 1, n, pop_prev=1, push_prev=1))
    prog.append(FinishInsn(pop_next=1))
    return prog


@pytest.mark.parametrize("cfg_name", ["ice40", "ecp5", "default"])
def test_store_in_the_gemm_finish_cycle_reads_its_last_write(cfg_name):
    """A STORE that starts in a GEMM's finish cycle (it pops the GEMM's token) stores the
    results of the GEMM's last iterations, whichever cycle of the pipeline writes them."""
    cfg = preset(cfg_name)
    uops = [[2, 0, 0], [3, 1, 1], [7, 2, 2], [0, 3, 3], [5, 1, 0]]
    rng = np.random.default_rng(11)
    dram = rng.integers(0, 256, 1 << 15).astype(np.uint8)
    dram[:2048] = 0
    dram[24576:] = 0
    dram[4096:4096 + 4 * len(uops)] = isa.encode_uops(np.array(uops), cfg).view(np.uint8)
    prog = _gemm_then_store_program(cfg, len(uops))
    rtl, sim = compare(cfg, dram, prog, insn_addr=48)
    assert rtl == sim


@pytest.mark.parametrize("cfg_name", ["ice40", "ecp5", "default"])
def test_stores_queued_back_to_back(cfg_name):
    """STOREs queued behind one another in the store's command queue, each of another shape
    (rows, row length, stride, SRAM row; one with no rows): each plans its bursts from its
    own instruction while the next waits at the queue's head, and the next is taken in the
    first one's finish cycle."""
    cfg = preset(cfg_name)
    eo, ea = cfg.elem_bytes(MemType.OUT), cfg.elem_bytes(MemType.ACC)
    rng = np.random.default_rng(5)
    dram = rng.integers(0, 256, 1 << 15).astype(np.uint8)
    dram[24576:] = 0
    dram[4096:4096 + 4] = isa.encode_uops(np.array([[0, 0, 0]]), cfg).view(np.uint8)
    out = 24576 // eo
    prog = [ld(MemType.UOP, 0, 4096 // 4, 1, 1),
            ld(MemType.ACC, 0, 8192 // ea, 1, 12),
            # ACC rows 0..11 (+1) into OUT, one micro-op over twelve rows
            AluInsn(uop_bgn=0, uop_end=1, iter_out=12, iter_in=1, dst_factor_out=1,
                    src_factor_out=1, alu_opcode=AluOp.ADD, use_imm=1, imm=1, push_next=1),
            st(0, out, 3, 2, stride=5, pop_prev=1),
            st(7, out + 40, 1, 4),
            st(2, out + 60, 2, 3, stride=3),
            st(11, out + 90, 1, 1),
            st(4, out + 100, 4, 1, stride=2),
            st(0, out + 120, 0, 3),  # no rows: finishes at s + 1
            st(1, out + 130, 2, 5, stride=7, push_prev=1),
            FinishInsn(pop_next=1)]
    rtl, sim = compare(cfg, dram, prog, insn_addr=48)
    assert rtl == sim
