"""Hypothesis: random legal programs give the same DRAM and SRAMs with timing on and off, and
the same as executing the instructions one after another in stream order."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_helpers import Image, load, store

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import AluInsn, AluOp, FinishInsn, GemmInsn, MemType
from vtakit.vta_sim import ArchState, Simulator, semantics
from vtakit.vta_sim.program import decode_program

# Small core, short bursts and shallow queues: preemption and stalls happen often.
CFG = HwConfig(log_batch=1, log_block_in=2, log_block_out=3, log_uop_buff_size=8,
               log_inp_buff_size=9, log_wgt_buff_size=10, log_acc_buff_size=11,
               mem_read_latency_cycles=5, mem_max_burst_beats=4, cmd_queue_depth=4,
               dep_queue_depth=2).validate()
DATA_BYTES = 16 << 10
OUT_ELEM0 = DATA_BYTES // CFG.out_elem_bytes  # stores go above the input data


def mem(draw, mt, sram_max, dram_max, pads=True):
    y, x = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    stride = x + draw(st.integers(0, 2))
    p = [draw(st.integers(0, 1)) if pads else 0 for _ in range(4)]
    return load(mt, draw(st.integers(0, sram_max)), draw(st.integers(0, dram_max)), y, x,
                stride, tuple(p))


def loop_fields(draw):
    bgn = draw(st.integers(0, 15))
    return dict(uop_bgn=bgn, uop_end=bgn + draw(st.integers(0, 4)),
                iter_out=draw(st.integers(1, 3)), iter_in=draw(st.integers(1, 3)),
                dst_factor_out=draw(st.integers(0, 3)), dst_factor_in=draw(st.integers(0, 3)),
                src_factor_out=draw(st.integers(0, 3)), src_factor_in=draw(st.integers(0, 3)),
                reset=int(draw(st.integers(0, 7)) == 0))


@st.composite
def programs(draw):
    phases = draw(st.integers(1, 3))
    prog = [load(MemType.UOP, 0, 0, 1, 24)]
    for p in range(phases):
        stage = [mem(draw, draw(st.sampled_from([MemType.INP, MemType.WGT])), 4, 200)
                 for _ in range(draw(st.integers(1, 3)))]
        stage[0] = isa.replace(stage[0], pop_next=int(p > 0))
        stage[-1] = isa.replace(stage[-1], push_next=1)
        prog += stage
        stage = []
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(["gemm", "alu", "acc"]))
            if kind == "gemm":
                stage.append(GemmInsn(**loop_fields(draw), wgt_factor_out=draw(st.integers(0, 3)),
                                      wgt_factor_in=draw(st.integers(0, 3))))
            elif kind == "alu":
                stage.append(AluInsn(**loop_fields(draw),
                                     alu_opcode=draw(st.sampled_from(list(AluOp))),
                                     use_imm=draw(st.integers(0, 1)),
                                     imm=draw(st.integers(-40, 40))))
            else:
                stage.append(mem(draw, draw(st.sampled_from([MemType.ACC, MemType.ACC_8BIT])),
                                 4, 100))
        stage[0] = isa.replace(stage[0], pop_prev=1, pop_next=int(p > 0))
        stage[-1] = isa.replace(stage[-1], push_next=1, push_prev=int(p < phases - 1))
        prog += stage
        stage = []
        for _ in range(draw(st.integers(1, 2))):
            y, x = draw(st.integers(0, 3)), draw(st.integers(0, 3))
            stage.append(store(draw(st.integers(0, 8)), OUT_ELEM0 + draw(st.integers(0, 200)),
                               y, x, x + draw(st.integers(0, 2))))
        stage[0] = isa.replace(stage[0], pop_prev=1)
        stage[-1] = isa.replace(stage[-1], push_prev=1)
        prog += stage
    prog.append(FinishInsn(pop_next=1))
    return prog


def build(prog, seed):
    rng = np.random.default_rng(seed)
    img = Image(CFG, size=64 << 10)
    img.dram[:DATA_BYTES] = rng.integers(0, 256, DATA_BYTES, dtype=np.uint8)
    uops = isa.encode_uops(rng.integers(0, 8, (24, 3)), CFG)
    img.dram[:uops.nbytes] = uops.view(np.uint8)
    img.top = 2 * DATA_BYTES
    addr, n = img.put_insns(prog)
    return img.dram, addr, n


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**32 - 1))
def test_timed_equals_functional_equals_stream_order(prog, seed):
    dram, addr, n = build(prog, seed)
    results = []
    for timing in (True, False):
        d = dram.copy()
        sim = Simulator(CFG, d)
        stats = sim.run(addr, n, timing=timing)
        results.append((d, sim.state))
        if timing:
            assert stats.cycles > 0
    d = dram.copy()
    state = ArchState.zeros(CFG)
    for insn in decode_program(d[addr: addr + 16 * n], CFG).insns:
        semantics.execute(state, d, insn)
    results.append((d, state))
    for d, s in results[1:]:
        np.testing.assert_array_equal(d, results[0][0])
        for name in ("inp", "wgt", "acc", "out", "uop"):
            np.testing.assert_array_equal(getattr(s, name), getattr(results[0][1], name))


def test_big_gemm_stream_is_correct_and_busy():
    """A tiled 128x128x128 matrix product through the simulator matches numpy."""
    from vtakit.vta_hw.config import preset
    cfg = preset("default")
    rng = np.random.default_rng(0)
    m = k = nn = 128
    kt, nt = k // 16, nn // 16
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, nn), dtype=np.int8)
    img = Image(cfg, size=1 << 20)
    a_a = img.put(a)
    a_b = img.put(b.reshape(kt, 16, nt, 16).transpose(2, 0, 3, 1).copy())
    a_u = img.put(isa.encode_uops(np.array([[0, j, j] for j in range(kt)]), cfg))
    a_c = img.alloc(m * nn)
    prog = [load(MemType.UOP, 0, a_u // 4, 1, kt), load(MemType.WGT, 0, a_b // 256, 1, nt * kt),
            load(MemType.INP, 0, a_a // 16, 1, m * kt, push_next=1)]
    loops = dict(uop_bgn=0, iter_out=nt, iter_in=m, dst_factor_out=1, dst_factor_in=nt,
                 src_factor_out=0, src_factor_in=kt, wgt_factor_out=kt, wgt_factor_in=0)
    prog += [GemmInsn(reset=1, uop_end=1, pop_prev=1, **loops),
             GemmInsn(uop_end=kt, push_next=1, **loops),
             store(0, a_c // 16, m, nt, nt, pop_prev=1, push_prev=1), FinishInsn(pop_next=1)]
    addr, n = img.put_insns(prog)
    stats = Simulator(cfg, img.dram).run(addr, n)
    got = img.dram[a_c: a_c + m * nn].view(np.int8).reshape(m, nn)
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32).astype(np.int8)
    np.testing.assert_array_equal(got, want)
    assert stats.gemm_macs == m * k * nn
    assert 0 < stats.mac_utilisation < 1


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 4, 16]),
       st.sampled_from([1, 3, 8]))
def test_cycles_match_a_naive_cycle_by_cycle_model(prog, seed, burst, latency):
    from cycle_model import cycles

    cfg = CFG.replace(mem_max_burst_beats=burst, mem_read_latency_cycles=latency)
    dram, addr, n = build(prog, seed)
    stats = Simulator(cfg, dram).run(addr, n)
    p = decode_program(dram[addr: addr + 16 * n], cfg)
    assert stats.cycles == cycles(p.insns, p.unit, cfg, addr)
