"""Cycle counts computed by hand from docs/timing.md (default preset unless stated)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sim_helpers import Image, load, store

from vtakit.vta_hw.config import preset
from vtakit.vta_hw.isa import AluInsn, AluOp, FinishInsn, GemmInsn, MemType
from vtakit.vta_hw.timing_facts import ALU_PIPELINE_CYCLES, GEMM_PIPELINE_CYCLES
from vtakit.vta_sim import Simulator


def run(prog, cfg=None, **kw):
    cfg = cfg or preset("default")
    img = Image(cfg)
    addr, n = img.put_insns(prog)
    assert addr == 0
    return Simulator(cfg, img.dram).run(addr, n, **kw)


def test_constants_match_the_document():
    assert (GEMM_PIPELINE_CYCLES, ALU_PIPELINE_CYCLES) == (6, 5)


def test_worked_example_a_padded_load():
    # fetch 4 beats: 0+4+32=36; LOAD taken 37, requested 39, 8 beats -> 79, 14 pad elements
    # -> 93; FINISH starts at 93 and finishes at 94.
    st = run([load(MemType.INP, 0, 4096, 1, 4, pads=(1, 1, 1, 1), push_next=1),
              FinishInsn(pop_prev=1)])
    assert st.cycles == 94
    assert st.units["load"].busy_cycles == 93 - 37
    assert st.units["compute"].stall_cycles == 93 - 38


@pytest.mark.parametrize("x, pads, finish", [
    (2, (1, 1, 0, 0), 37 + 2 + 4),   # two whole padding rows of 2
    (3, (0, 0, 1, 0), 37 + 2 + 0),   # x_pad_0 alone pads nothing without a data row
    (1, (2, 0, 1, 1), 37 + 2 + 6),   # two rows of 1 + 1 + 1
    (0, (1, 1, 1, 1), 37 + 1),       # x_size = 0: a NOP
])
def test_padding_only_load(x, pads, finish):
    # fetch 36; LOAD taken and started at 37; a block with y_size = 0 writes its P padding
    # elements from s + PAD_ONLY_SETUP_CYCLES = 39; FINISH right after it
    st = run([load(MemType.INP, 0, 0, 0, x, pads=pads, push_next=1), FinishInsn(pop_prev=1)])
    assert st.cycles == finish + 1


def test_finish_alone():
    # fetch 2 beats -> 34, dispatch at 34, taken 35, finishes 36
    assert run([FinishInsn()]).cycles == 36


@pytest.mark.parametrize("insn, cycles", [
    (GemmInsn(uop_bgn=0, uop_end=4, iter_out=2, iter_in=8), 64 + 6),
    (GemmInsn(reset=1, uop_bgn=0, uop_end=4, iter_out=2, iter_in=8), 64 + 6),
    (GemmInsn(uop_bgn=3, uop_end=3), 1),
    (AluInsn(uop_bgn=0, uop_end=4, iter_out=2, iter_in=8, alu_opcode=AluOp.ADD), 2 * 64 + 5),
    (AluInsn(uop_bgn=0, uop_end=4, iter_out=2, iter_in=8, use_imm=1, imm=3), 64 + 5),
    (AluInsn(uop_bgn=0, uop_end=1, iter_out=0), 1),
])
def test_compute_durations(insn, cycles):
    # fetch 36; compute takes the instruction at 37; FINISH runs right after it.
    assert run([insn, FinishInsn()]).cycles == 37 + cycles + 1


def test_store():
    # 2 rows x 4 OUT elements x 16 B = 2 x 8 beats; requested at 37 + 2, write: 39 + 16 = 55;
    # FINISH 55 -> 56
    st = run([store(0, 4096, 2, 4, 8, push_prev=1), FinishInsn(pop_next=1)])
    assert st.cycles == 56
    assert st.dram_write_bytes == 128


def test_unaligned_uop_load_touches_three_beats():
    # bytes [4, 20) of a 8-byte bus: 3 beats; requested at 37 + 2: 39 + 3 + 32 = 74;
    # FINISH 74 -> 75
    assert run([load(MemType.UOP, 0, 1, 1, 4), FinishInsn()]).cycles == 75


def test_nop_load_costs_one_cycle():
    # NOP taken 37 -> 38, pushes l2g at 38; FINISH (taken 38) starts 38 -> 39
    assert run([load(MemType.INP, 0, 0, 0, 0, push_next=1), FinishInsn(pop_prev=1)]).cycles \
        == 39


def test_fetch_preempts_load():
    # Worked example C of docs/timing.md.
    prog = [load(MemType.WGT, 0, 16, 1, 8, push_next=1)]
    prog += [GemmInsn(uop_bgn=0, uop_end=0)] * 8
    prog += [FinishInsn(pop_prev=1)]
    st = run(prog)
    # load: taken 49, granted 51, fetch asks at 56, cut at 67; fetch 67..70; load resumes at 71
    # with 240 beats -> port 311, data 343; FINISH 343 -> 344
    assert st.cycles == 344


def test_command_queue_full_stalls_fetch():
    cfg = preset("default").replace(cmd_queue_depth=1)
    g = GemmInsn(uop_bgn=0, uop_end=4, iter_out=2, iter_in=8)
    st = run([g, g, g, FinishInsn()], cfg)
    # fetch 40; GEMMs 41->111->181->251; FINISH 251->252
    assert st.cycles == 252
    assert st.units["fetch"].stall_cycles > 0


def test_token_queue_full_stalls_the_pusher():
    cfg = preset("default").replace(dep_queue_depth=1)
    nop = load(MemType.INP, 0, 0, 0, 0, push_next=1)
    st = run([nop, nop, GemmInsn(uop_bgn=0, uop_end=4, iter_out=2, iter_in=8, pop_prev=1),
              GemmInsn(uop_bgn=0, uop_end=0, pop_prev=1), FinishInsn()], cfg)
    # fetch 42; NOPs finish 44 and 45; the second push waits for compute's pop at 45 -> 46;
    # GEMM 45 -> 115; GEMM 115 -> 116; FINISH 116 -> 117
    assert st.cycles == 117
    assert st.units["load"].stall_cycles == 1


def test_functional_run_has_no_cycles():
    st = run([load(MemType.INP, 0, 4096, 1, 4, push_next=1), FinishInsn(pop_prev=1)],
             timing=False)
    assert st.cycles == 0 and st.mac_utilisation == 0.0
    assert st.insn_counts == {"LOAD": 1, "FINISH": 1}


def test_trace_is_chrome_json(tmp_path):
    path = tmp_path / "t.json"
    run([load(MemType.INP, 0, 4096, 1, 4, push_next=1), FinishInsn(pop_prev=1)], trace=path)
    doc = json.loads(path.read_text())
    names = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"]
    assert "LOAD INP" in names and "FINISH" in names
    ld = next(e for e in doc["traceEvents"] if e.get("name") == "LOAD INP")
    assert ld["args"]["x_size"] == 4 and ld["ts"] == 37


def test_summary_mentions_every_unit():
    st = run([GemmInsn(uop_bgn=0, uop_end=4, iter_out=2, iter_in=8), FinishInsn()])
    text = st.summary()
    for word in ("cycles", "fetch", "load", "compute", "store", "MAC utilisation", "GEMM"):
        assert word in text
    assert st.gemm_macs == 64 * 256
    assert st.mac_utilisation == pytest.approx(64 / st.cycles)


def test_state_persists_between_runs():
    cfg = preset("default")
    img = Image(cfg)
    data = np.arange(64, dtype=np.int8)
    a = img.put(data)
    addr1, n1 = img.put_insns([load(MemType.UOP, 0, a // 4, 1, 16), FinishInsn()])
    addr2, n2 = img.put_insns([FinishInsn()])
    sim = Simulator(cfg, img.dram)
    sim.run(addr1, n1)
    sim.run(addr2, n2)
    assert sim.state.uop[:16].view(np.int8).tolist() == data.tolist()


def test_two_tokens_arriving_in_the_same_cycle_are_popped_once():
    # GEMM pops l2g and s2g; a LOAD with y_size = 0 and no padding (41 -> 43, s + 2) and a NOP
    # STORE (43 -> 44) both push at 44; the GEMM runs 44 -> 45 and FINISH 45 -> 46.
    pad_only = load(MemType.INP, 0, 0, 0, 1, push_next=1)
    prog = [GemmInsn(uop_bgn=0, uop_end=0, pop_prev=1, pop_next=1), pad_only,
            store(0, 0, 0, 0, push_prev=1), FinishInsn()]
    st = run(prog)
    assert st.cycles == 46
    assert st.units["compute"].stall_cycles == 44 - 41


# ---- the event-driven model against a naive cycle-by-cycle reading of docs/timing.md ---------

def _model_cycles(prog, cfg):
    from cycle_model import cycles

    from vtakit.vta_sim.program import decode_program
    img = Image(cfg)
    addr, n = img.put_insns(prog)
    p = decode_program(img.dram[addr: addr + 16 * n], cfg)
    return cycles(p.insns, p.unit, cfg, addr)


@pytest.mark.parametrize("name", ["a", "c", "d", "e", "store", "uop", "gemm"])
def test_cycle_model_agrees_on_the_worked_examples(name):
    cfg = preset("default")
    g = GemmInsn(uop_bgn=0, uop_end=4, iter_out=2, iter_in=8)
    nop = load(MemType.INP, 0, 0, 0, 0, push_next=1)
    progs = {
        "a": ([load(MemType.INP, 0, 4096, 1, 4, pads=(1, 1, 1, 1), push_next=1),
               FinishInsn(pop_prev=1)], cfg),
        "c": ([load(MemType.WGT, 0, 16, 1, 8, push_next=1)]
              + [GemmInsn(uop_bgn=0, uop_end=0)] * 8 + [FinishInsn(pop_prev=1)], cfg),
        "d": ([g, g, g, FinishInsn()], cfg.replace(cmd_queue_depth=1)),
        "e": ([nop, nop, isa_replace(g, pop_prev=1), GemmInsn(uop_bgn=0, uop_end=0, pop_prev=1),
               FinishInsn()], cfg.replace(dep_queue_depth=1)),
        "store": ([store(0, 4096, 2, 4, 8, push_prev=1), FinishInsn(pop_next=1)], cfg),
        "uop": ([load(MemType.UOP, 0, 1, 1, 4), FinishInsn()], cfg),
        "gemm": ([g, FinishInsn()], cfg),
    }
    prog, c = progs[name]
    assert run(prog, c).cycles == _model_cycles(prog, c)


def isa_replace(insn, **kw):
    from vtakit.vta_hw import isa
    return isa.replace(insn, **kw)
