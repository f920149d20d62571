"""The host's SRAM range check of a stream (:mod:`vtakit.driver.stream_check`) gives the
simulator's verdict: every stream the simulator refuses for an SRAM index is refused at the same
instruction with the same error, no in-range stream is refused, the micro-ops it judges loops by
are kept across runs, and micro-ops the host does not know are not judged."""

from __future__ import annotations

import re

import numpy as np
import pytest

from vtakit.driver import DeadlockError, DeviceError, run_image
from vtakit.driver.devices.sim import SimDevice
from vtakit.driver.stream_check import (
    StreamChecker,
    check_stream,
    dram_reader,
    unknown_uops,
)
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_sim import semantics
from vtakit.vta_sim.errors import ExecFault, SimError
from vtakit.vta_sim.image import RunImage
from vtakit.vta_sim.program import decode_program
from vtakit.vta_sim.state import ArchState
from vtakit.vta_sim.testing import compiled_mix_stream, random_program

CFG = preset("ice40")
M, Op = isa.MemType, isa.Opcode
LAY = isa.layouts(CFG)
LOOP_FIELDS = {"gemm": (("dst", M.ACC), ("src", M.INP), ("wgt", M.WGT)),
               "alu": (("dst", M.ACC), ("src", M.ACC))}
_UOPS = 64 << 10  # where random_program keeps its micro-ops


def refusal(stream, dram, uops=None):
    """The checker's DeviceError for ``stream`` over ``dram``, or None if it passes it."""
    try:
        check_stream(CFG, stream, unknown_uops(CFG) if uops is None else uops,
                     dram_reader(dram))
    except DeviceError as err:
        assert type(err) is DeviceError
        return err
    return None


def sim_verdict(img):
    """The ``sim`` device's DeviceError for the image's run, or None if it ran to the end."""
    try:
        run_image(SimDevice(CFG, dram_bytes=img.dram.size), img)
    except DeviceError as err:
        return err
    return None


def stream_of(img):
    return img.dram[img.insn_addr:img.insn_addr + isa.INSN_BYTES * img.insn_count]


def insns_of(img):
    raw = stream_of(img)
    return [isa.decode(bytes(raw[k:k + isa.INSN_BYTES]), CFG)
            for k in range(0, raw.size, isa.INSN_BYTES)]


def with_insns(img, insns):
    dram = img.dram.copy()
    dram[img.insn_addr:img.insn_addr + isa.INSN_BYTES * len(insns)] = np.frombuffer(
        isa.encode_stream(insns, CFG), np.uint8)
    return RunImage(cfg=CFG, dram=dram, insn_addr=img.insn_addr, insn_count=len(insns))


def fits(layout, name, value):
    return min(max(int(value), 0), layout[name].max)


def mutate(img, rng):
    """``img`` with one random change that may move an SRAM index past its buffer's end: a
    LOAD/STORE block near the end of its buffer, a GEMM/ALU ``uop_end`` past the UOP SRAM, a
    loop factor near a buffer's depth, or a micro-op in DRAM with a large field (every loop
    that runs it may then leave its buffer)."""
    insns = insns_of(img)
    kind = rng.choice(["rows", "uop_end", "factor", "factor", "dram_uop"])
    if kind == "dram_uop":
        dram = img.dram.copy()
        words = dram[_UOPS:_UOPS + 4 * 34].view("<u4")
        row = int(rng.integers(2, 34))
        dst, src, wgt = (np.asarray(f) for f in isa.decode_uops(words[row:row + 1], CFG))
        col = int(rng.integers(0, 3))
        top = CFG.depth((M.ACC, M.ACC if row >= 10 and (row - 2) % 16 >= 8 else M.INP,
                         M.WGT)[col])
        new = np.array([[int(dst[0]), int(src[0]), int(wgt[0])]])
        new[0, col] = int(rng.integers(top - 4, top))
        words[row] = isa.encode_uops(new, CFG)[0]
        return RunImage(cfg=CFG, dram=dram, insn_addr=img.insn_addr,
                        insn_count=img.insn_count)
    if kind == "rows":
        cands = [k for k, i in enumerate(insns) if isinstance(i, isa.MemInsn) and i.x_size
                 and (i.opcode == Op.LOAD or i.y_size)]
        k = int(rng.choice(cands))
        i = insns[k]
        rows = (i.y_size * i.x_size if i.opcode == Op.STORE else
                (i.y_pad_0 + i.y_size + i.y_pad_1) * (i.x_pad_0 + i.x_size + i.x_pad_1))
        base = CFG.depth(i.memory_type) - rows + int(rng.integers(-2, 3))
        insns[k] = isa.replace(i, sram_base=fits(LAY.mem, "sram_base", base))
        return with_insns(img, insns)
    cands = [k for k, i in enumerate(insns) if isinstance(i, (isa.GemmInsn, isa.AluInsn))
             and i.uop_bgn < i.uop_end]
    k = int(rng.choice(cands))
    i = insns[k]
    mode, lay = ("gemm", LAY.gemm) if isinstance(i, isa.GemmInsn) else ("alu", LAY.alu)
    if kind == "uop_end":
        insns[k] = isa.replace(i, uop_end=CFG.uop_depth + int(rng.integers(1, 3)))
        return with_insns(img, insns)
    field, mem = LOOP_FIELDS[mode][int(rng.integers(0, len(LOOP_FIELDS[mode])))]
    level = "out" if rng.integers(0, 2) else "in"
    iters = f"iter_{level}"
    n = max(getattr(i, iters), 2)
    # the largest micro-op of a set is below 2 * 32 + 16 (random_program's halves); aim the
    # last iteration at the last few rows of the buffer, either side of its end
    step = (CFG.depth(mem) - int(rng.integers(0, 80))) // (n - 1)
    insns[k] = isa.replace(i, **{iters: n, f"{field}_factor_{level}":
                                 fits(lay, f"{field}_factor_{level}", step)})
    return with_insns(img, insns)


@pytest.mark.parametrize("first_seed", range(0, 240, 40))
def test_the_checker_refuses_exactly_what_the_simulator_refuses(first_seed):
    """Random legal programs, each with one random change: the ``sim`` device and the checker
    agree on every one (the same instruction, the same error), and both verdicts occur."""
    refused = passed = 0
    for seed in range(first_seed, first_seed + 40):
        rng = np.random.default_rng(seed)
        img = random_program(CFG, seed)
        bad = mutate(img, rng)
        sim = sim_verdict(bad)
        host = refusal(stream_of(bad), bad.dram)
        if sim is not None:
            assert "SRAM index out of range" in str(sim), (seed, str(sim))
            assert host is not None, (seed, str(sim))
            assert (host.index, host.insn, str(host)) == (sim.index, sim.insn, str(sim)), seed
            refused += 1
        else:
            assert host is None, (seed, str(host))
            passed += 1
    assert refused >= 5 and passed >= 5, (refused, passed)


def random_stream(rng, n, wild):
    """``n`` random LOAD (UOP, WGT, INP, ACC, ACC_8BIT), STORE, GEMM and ALU instructions after
    a LOAD UOP of the whole UOP SRAM, then FINISH. Each instruction, with probability ``wild``,
    is aimed at the end of its buffer or past it (a block at the end, ``uop_end`` past the UOP
    SRAM, loop factors up to their field's maximum, micro-ops from the DRAM half whose fields
    reach their buffers' ends); otherwise it is well inside. DRAM ranges all lie inside the
    image and no STORE comes near the micro-ops; no token flags (the reference executes the
    stream in stream order)."""
    out = [isa.MemInsn(memory_type=M.UOP, dram_base=0, y_size=1, x_size=CFG.uop_depth,
                       x_stride=CFG.uop_depth)]
    for _ in range(n):
        aim = rng.random() < wild
        kind = rng.choice(["load", "uop", "store", "gemm", "alu"])
        if kind in ("load", "uop", "store"):
            mt = (M.UOP if kind == "uop" else M.OUT if kind == "store"
                  else M(int(rng.choice([M.WGT, M.INP, M.ACC, M.ACC_8BIT]))))
            y, x = int(rng.integers(0, 4)), int(rng.integers(0, 6))
            pads = [0] * 4 if kind == "store" else [int(rng.integers(0, 3)) for _ in range(4)]
            rows = (y * x if kind == "store" else
                    (pads[0] + y + pads[1]) * (pads[2] + x + pads[3]))
            depth = CFG.depth(mt)
            base = (max(0, depth - rows + int(rng.integers(-3, 3))) if aim else
                    int(rng.integers(0, depth - rows + 1)))
            dram = (int(rng.integers(0, 4096 - 20 if aim else 2048 - 20)) if kind == "uop" else
                    (48 << 10) // CFG.elem_bytes(mt))  # stores well above the micro-ops
            out.append(isa.MemInsn(opcode=Op.STORE if kind == "store" else Op.LOAD,
                                   memory_type=mt, sram_base=base, dram_base=dram, y_size=y,
                                   x_size=x, x_stride=x + int(rng.integers(0, 3)),
                                   y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2],
                                   x_pad_1=pads[3]))
        else:
            lay = LAY.gemm if kind == "gemm" else LAY.alu
            bgn = int(rng.integers(0, CFG.uop_depth))
            end = (CFG.uop_depth + 1 if aim and rng.integers(0, 4) == 0 else
                   min(bgn + int(rng.integers(0, 6)), CFG.uop_depth))
            f = {name: int(rng.integers(0, lay[name].max + 1)) if aim and rng.integers(0, 2)
                 else int(rng.integers(0, 4)) for name in lay.names if "factor" in name}
            cls = isa.GemmInsn if kind == "gemm" else isa.AluInsn
            out.append(cls(uop_bgn=bgn, uop_end=end, iter_out=int(rng.integers(0, 4)),
                           iter_in=int(rng.integers(0, 4)), **f))
    out.append(isa.FinishInsn())
    return out


def stream_order_reference(dram, raw):
    """The first instruction the simulator's semantics refuse for an SRAM index when the
    stream's instructions are checked in stream order (the compute unit's order of LOAD UOP,
    GEMM and ALU), executing the LOAD UOPs: (index, the sim device's message) or None."""
    prog = decode_program(raw, CFG)
    state = ArchState.zeros(CFG)
    for k, insn in enumerate(prog.insns):
        try:
            semantics.check(state, dram, insn)
        except ExecFault as err:
            assert "SRAM index out of range" in str(err), str(err)
            return k, str(SimError(str(err), k, insn))
        if insn["opcode"] == Op.LOAD and insn["memory_type"] == M.UOP:
            semantics.load(state, dram, insn)
    return None


@pytest.mark.parametrize("seed", range(8))
def test_many_faults_in_one_stream_the_first_in_stream_order_is_named(seed):
    rng = np.random.default_rng(1000 + seed)
    dram = np.zeros(64 << 10, np.uint8)
    top = [CFG.acc_depth, CFG.inp_depth, CFG.wgt_depth]
    # micro-ops 0..2047 with small fields; 2048..4095 mostly small, some up to a buffer's depth
    words = np.stack([np.where((np.arange(4096) >= 2048) & (rng.random(4096) < 0.2),
                               rng.integers(0, t, 4096), rng.integers(0, 64, 4096))
                      for t in top], axis=1)
    dram[:4096 * 4] = isa.encode_uops(words, CFG).view(np.uint8)
    seen = {True: 0, False: 0}
    for _ in range(30):
        insns = random_stream(rng, int(rng.integers(5, 60)), float(rng.choice([0, 0.03, 0.3])))
        raw = np.frombuffer(isa.encode_stream(insns, CFG), np.uint8)
        want = stream_order_reference(dram, raw)
        got = refusal(raw, dram)
        seen[want is not None] += 1
        if want is None:
            assert got is None, str(got)
        else:
            assert got is not None and (got.index, str(got)) == want
    assert seen[True] and seen[False], seen


# ---- micro-ops across runs ----------------------------------------------------------------
class Rig:
    """A ``sim`` device and a StreamChecker over the same device memory, the way a device
    without hardware checks keeps one."""

    def __init__(self):
        self.dev = SimDevice(CFG, dram_bytes=1 << 20)
        self.check = StreamChecker(CFG)
        self.uop_addr = self.dev.allocate(4096, 64)
        self.out_addr = self.dev.allocate(4096, 64)
        self.insn_addr = self.dev.allocate(4096, 64)

    def put_uops(self, rows):
        self.dev.write(self.uop_addr, isa.encode_uops(np.array(rows), CFG))

    def load_uops(self, n, sram_base=0, **flags):
        return isa.MemInsn(memory_type=M.UOP, sram_base=sram_base,
                           dram_base=self.uop_addr // 4, y_size=1, x_size=n, x_stride=n,
                           **flags)

    def run(self, insns):
        """(the checker's refusal, the sim device's error): each None if it passed."""
        raw = isa.encode_stream(insns, CFG)
        self.dev.write(self.insn_addr, raw)
        host = None
        try:
            self.check.check(raw, dram_reader(self.dev.dram))
        except DeviceError as err:
            host = err
        self.dev.run(self.insn_addr, len(insns))
        try:
            self.dev.wait(60)
            sim = None
        except DeviceError as err:
            sim = err
        if host is None:
            self.check.settle(sim is None)
        return host, sim


def gemm(bgn, end, iter_in=3, **kw):
    """A GEMM over micro-ops ``bgn..end - 1`` whose dst reaches micro-op dst + iter_in - 1."""
    return isa.GemmInsn(uop_bgn=bgn, uop_end=end, iter_in=iter_in, dst_factor_in=1, **kw)


ACC = CFG.acc_depth


def test_micro_ops_are_kept_across_runs():
    r = Rig()
    r.put_uops([[0, 0, 0], [ACC - 3, 0, 0]])
    assert r.run([r.load_uops(2), gemm(0, 2), isa.FinishInsn()]) == (None, None)
    r.put_uops([[0, 0, 0], [0, 0, 0]])  # DRAM changes; the UOP SRAM keeps the loaded rows
    host, sim = r.run([gemm(0, 2, dst_factor_out=1, iter_out=2), isa.FinishInsn()])
    assert sim is not None and host is not None
    assert (host.index, str(host)) == (sim.index, str(sim)) == (0, str(sim))
    assert f"ACC[{ACC}] at loop iteration" in str(host)
    assert r.run([gemm(0, 2), isa.FinishInsn()]) == (None, None)  # still in range
    # the refused run changed nothing: the rows are those of the first run
    assert r.check.uops[:2].tolist() == [[0, 0, 0], [ACC - 3, 0, 0]]


def test_a_failed_run_leaves_the_rows_it_may_have_loaded_unknown():
    r = Rig()
    r.put_uops([[0, 0, 0], [5, 0, 0], [ACC - 3, 0, 0]])
    assert r.run([r.load_uops(3), isa.FinishInsn()]) == (None, None)
    # a run that loads other values into rows 0..1, then deadlocks (a pop nobody pushes)
    r.put_uops([[ACC - 3, 0, 0], [5, 0, 0]])
    host, sim = r.run([r.load_uops(2), gemm(0, 1, pop_next=1), isa.FinishInsn()])
    assert host is None and isinstance(sim, DeadlockError)
    assert r.check.uops[0].tolist() == [-1, -1, -1]  # old or new: unknown
    assert r.check.uops[1].tolist() == [5, 0, 0]     # the same either way: known
    assert r.check.uops[2].tolist() == [ACC - 3, 0, 0]  # not touched: known
    # row 0 holds ACC - 3 on the device, but the host does not know it: not judged
    host, sim = r.run([gemm(0, 1, iter_in=4), isa.FinishInsn()])
    assert host is None and f"SRAM index out of range: ACC[{ACC}]" in str(sim)
    host, sim = r.run([gemm(2, 3, iter_in=4), isa.FinishInsn()])  # a known row: judged
    assert host is not None and str(host) == str(sim)
    r.check.forget()
    assert (r.check.uops == -1).all()


def test_micro_ops_a_store_of_the_same_stream_writes_are_not_judged():
    r = Rig()
    r.put_uops([[ACC - 3, 0, 0]] * 4)
    store = isa.MemInsn(opcode=Op.STORE, memory_type=M.OUT, sram_base=0,
                        dram_base=r.uop_addr // CFG.elem_bytes(M.OUT), y_size=1, x_size=1,
                        x_stride=1)
    host, sim = r.run([store, r.load_uops(1), gemm(0, 1, iter_in=4), isa.FinishInsn()])
    assert host is None  # the store unit may write the micro-ops before or after the load
    assert sim is not None  # (a range fault or the STORE not ordered before FINISH)
    # the same stream with the STORE elsewhere: the micro-ops are known and judged
    r2 = Rig()
    r2.put_uops([[ACC - 3, 0, 0]] * 4)
    far = isa.replace(store, dram_base=r2.out_addr // CFG.elem_bytes(M.OUT))
    host, sim = r2.run([far, r2.load_uops(1), gemm(0, 1, iter_in=4), isa.FinishInsn()])
    assert host is not None and sim is not None and host.index == sim.index == 2


def test_micro_ops_read_from_outside_device_memory_are_not_judged():
    dram = np.zeros(1 << 12, np.uint8)
    load = isa.MemInsn(memory_type=M.UOP, dram_base=(1 << 12) // 4 - 1, y_size=1, x_size=2,
                       x_stride=2)
    raw = isa.encode_stream([load, gemm(0, 2, dst_factor_out=ACC - 1, iter_out=2),
                             isa.FinishInsn()], CFG)
    known_zeros = np.zeros((CFG.uop_depth, 3), np.int64)
    assert refusal(raw[isa.INSN_BYTES:], dram, known_zeros) is not None  # judged: zeros
    assert refusal(raw, dram, known_zeros) is None  # after the load: unknown


def test_unknown_micro_ops_at_first_are_not_judged_and_padding_is_zeros():
    dram = np.zeros(1 << 12, np.uint8)
    # with micro-op dst=0 the last index is ACC - 1 + 1 = ACC
    big = isa.GemmInsn(uop_bgn=0, uop_end=1, iter_out=2, dst_factor_out=ACC - 1, iter_in=2,
                       dst_factor_in=1)
    raw = isa.encode_stream([big, isa.FinishInsn()], CFG)
    assert refusal(raw, dram) is None  # row 0 never loaded: unknown
    pad = isa.MemInsn(memory_type=M.UOP, y_size=0, x_size=1, x_stride=1, y_pad_0=1)
    raw = isa.encode_stream([pad, big, isa.FinishInsn()], CFG)
    err = refusal(raw, dram)  # padding loads micro-op 0
    assert err is not None and err.index == 1 and f"ACC[{ACC}]" in str(err)
    raw = isa.encode_stream([pad, isa.replace(big, iter_in=1), isa.FinishInsn()], CFG)
    assert refusal(raw, dram) is None  # last index ACC - 1


@pytest.mark.parametrize("insn, message", [
    (isa.MemInsn(memory_type=M.INP, sram_base=CFG.inp_depth - 2, y_size=1, x_size=4,
                 x_stride=4),
     rf"SRAM index out of range: INP\[{CFG.inp_depth - 2}..{CFG.inp_depth + 1}\] but INP has "
     rf"depth {CFG.inp_depth} \(expected indices 0..{CFG.inp_depth - 1}\)"),
    (isa.MemInsn(memory_type=M.ACC_8BIT, sram_base=ACC - 2, y_size=1, x_size=1, x_stride=1,
                 y_pad_1=1, x_pad_1=1),
     rf"ACC\[{ACC - 2}..{ACC + 1}\] but ACC has depth {ACC}"),
    (isa.MemInsn(opcode=Op.STORE, memory_type=M.OUT, sram_base=CFG.out_depth, y_size=1,
                 x_size=1, x_stride=1), rf"OUT\[{CFG.out_depth}..{CFG.out_depth}\]"),
    (isa.AluInsn(uop_bgn=0, uop_end=CFG.uop_depth + 1, iter_out=1, iter_in=1),
     rf"uop_end={CFG.uop_depth + 1} but UOP has depth {CFG.uop_depth}"),
])
def test_each_kind_of_instruction_is_refused_with_the_simulators_message(insn, message):
    dram = np.zeros(1 << 16, np.uint8)
    raw = isa.encode_stream([isa.MemInsn(memory_type=M.INP), insn, isa.FinishInsn()], CFG)
    err = refusal(raw, dram)
    assert err is not None and err.index == 1 and err.insn["kind"] == decode_program(
        np.frombuffer(raw, np.uint8), CFG).insns[1]["kind"]
    assert str(err).startswith("instruction #1 ")
    assert re.search(message, str(err)), str(err)


def test_nops_and_empty_loops_are_not_judged():
    dram = np.zeros(1 << 12, np.uint8)
    raw = isa.encode_stream([
        isa.MemInsn(memory_type=M.INP, sram_base=CFG.inp_depth + 5),  # x_size 0: a NOP
        isa.MemInsn(opcode=Op.STORE, memory_type=M.OUT, sram_base=CFG.out_depth, x_size=3),
        isa.GemmInsn(uop_bgn=3, uop_end=3, iter_out=5, dst_factor_out=ACC - 1),
        isa.AluInsn(uop_bgn=0, uop_end=CFG.uop_depth, iter_out=0),
        isa.FinishInsn()], CFG)
    assert refusal(raw, dram) is None


def test_a_stream_of_100k_instructions_is_checked_to_its_end():
    """The whole stream is judged: an out-of-range LOAD as its last instruction but FINISH is
    named (benchmarks/sim_speed.py reports how long a check of this stream takes)."""
    cfg, raw, dram = compiled_mix_stream(100_000, 20)  # about 4,800 LOAD UOPs
    assert raw.size == 100_000 * isa.INSN_BYTES
    check_stream(cfg, raw, unknown_uops(cfg), dram_reader(dram))
    bad = raw.copy()
    load = isa.MemInsn(memory_type=M.INP, sram_base=cfg.inp_depth - 1, dram_base=0, y_size=1,
                       x_size=2, x_stride=2)
    at = (100_000 - 2) * isa.INSN_BYTES
    bad[at:at + isa.INSN_BYTES] = np.frombuffer(isa.encode_stream([load], cfg), np.uint8)
    with pytest.raises(DeviceError, match=r"instruction #99998 .*SRAM index out of range: "
                                          rf"INP\[{cfg.inp_depth - 1}\.\.{cfg.inp_depth}\] but "
                                          rf"INP has depth {cfg.inp_depth}"):
        check_stream(cfg, bad, unknown_uops(cfg), dram_reader(dram))
