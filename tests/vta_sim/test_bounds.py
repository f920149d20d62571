"""The simulator bounds its memory and time before it works (issue 12): one corrupt 16-byte
instruction is refused (or finished) at once, functional and timed runs refuse the same streams
with the same error class, ``SimDevice.wait`` honours its timeout, and the ``sim`` device and
``vtakit sim`` have a default cycle limit."""

from __future__ import annotations

import time

import numpy as np
import pytest
from click.testing import CliRunner
from sim_helpers import Image, load

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.isa import AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode
from vtakit.vta_sim import (
    DEFAULT_CYCLE_LIMIT,
    RunImage,
    SimCycleLimit,
    SimError,
    SimTimeout,
    Simulator,
)
from vtakit.vta_sim import semantics as sem
from vtakit.vta_sim.cli import sim_command
from vtakit.vta_sim.state import ArchState
from vtakit.vta_sim.testing import random_program

CFG = preset("default")
both = pytest.mark.parametrize("timing", [True, False], ids=["timed", "functional"])

# A LOAD of 65535 rows of 65535 WGT tiles (timing it once took one int64 per burst: 64 GiB);
# the ALU NOPs behind it make fetch interrupt its transfer.
HUGE_LOAD = ([MemInsn(opcode=Opcode.LOAD, memory_type=MemType.WGT, y_size=65535, x_size=65535,
                      x_stride=65535, push_next=1)]
             + [AluInsn()] * 64 + [FinishInsn(pop_prev=1)])
# 8192 x 16383 x 16383 = 2.2e12 micro-op iterations (its loop indices once took 16 TiB).
HUGE_LOOP = [AluInsn(uop_end=8192, iter_out=16383, iter_in=16383), FinishInsn()]
# 33.5e6 iterations, each outer one re-reading the rows the previous one wrote.
LONG_CHAIN = AluInsn(uop_end=1, iter_out=16383, iter_in=2047, dst_factor_in=1, src_factor_in=1)


def run(prog, timing, image=None, **kw):
    img = image or Image(CFG)
    addr, n = img.put_insns(prog)
    t0 = time.perf_counter()
    try:
        return Simulator(CFG, img.dram).run(addr, n, timing=timing, **kw)
    finally:
        assert time.perf_counter() - t0 < 2.0


@both
@pytest.mark.parametrize("limit", [None, DEFAULT_CYCLE_LIMIT])
def test_huge_load_is_refused_before_it_is_timed(timing, limit):
    with pytest.raises(SimError, match=r"#0 LOAD WGT\(.*y_size=65535.*\): SRAM index out of "
                                       r"range: WGT\[0\.\.4294836224\] but WGT has depth 1024"):
        run(HUGE_LOAD, timing, cycle_limit=limit)


@both
def test_huge_loop_hits_the_cycle_limit_without_allocating(timing):
    with pytest.raises(SimCycleLimit, match=r"#0 ALU ADD\(.*iter_out=16383.*\): cycle limit "
                                            r"4294967296"):
        run(HUGE_LOOP, timing, cycle_limit=DEFAULT_CYCLE_LIMIT)


@both
def test_huge_loop_out_of_range_is_found_in_closed_form(timing):
    prog = [AluInsn(uop_end=8192, iter_out=16383, iter_in=16383, dst_factor_out=1), FinishInsn()]
    # the first iteration with dst >= 2048 is i=2048, j=0, micro-op 0
    with pytest.raises(SimError, match=rf"ACC\[2048\] at loop iteration {2048 * 16383 * 8192} "
                                       r"but ACC has depth 2048"):
        run(prog, timing)


@both
def test_long_chain_finishes_quickly_and_correctly(timing):
    img = Image(CFG)
    acc = np.random.default_rng(0).integers(-2**31, 2**31, (CFG.acc_depth, CFG.batch,
                                                            CFG.block_out)).astype(np.int32)
    a = img.put(acc) // (4 * CFG.batch * CFG.block_out)
    prog = [load(MemType.ACC, 0, a, 1, CFG.acc_depth), LONG_CHAIN, FinishInsn()]
    addr, n = img.put_insns(prog)
    sim = Simulator(CFG, img.dram)
    t0 = time.perf_counter()
    stats = sim.run(addr, n, timing=timing)
    assert time.perf_counter() - t0 < 2.0
    # each outer iteration doubles rows 0..2046: after 32 of the 16383 they are 0
    assert not sim.state.acc[:2047].any() and not sim.state.out[:2047].any()
    assert np.array_equal(sim.state.acc[2047], acc[2047])
    assert stats.alu_uops == 16383 * 2047


@pytest.mark.parametrize("seed", range(40))
def test_long_loops_in_pieces_equal_one_piece(seed, monkeypatch):
    """Cutting a loop into pieces (and skipping repeated outer iterations) changes nothing."""
    rng = np.random.default_rng(seed)
    st = ArchState.zeros(CFG)
    st.acc[:] = rng.integers(-2**31, 2**31, st.acc.shape).astype(np.int32)
    st.inp[:] = rng.integers(-128, 128, st.inp.shape)
    st.wgt[:] = rng.integers(-128, 128, st.wgt.shape)
    nu = int(rng.integers(1, 4))
    st.uop[:nu] = isa.encode_uops(rng.integers(0, 40, (nu, 3)), CFG)

    def f():
        return int(rng.choice([0, 0, 1, 2, 3]))

    insn = dict(reset=int(rng.integers(0, 8) == 0), uop_bgn=0, uop_end=nu,
                iter_out=int(rng.integers(1, 40)), iter_in=int(rng.integers(1, 12)),
                dst_factor_out=f(), dst_factor_in=f(), src_factor_out=f(), src_factor_in=f())
    if seed % 3 == 0:
        insn.update(opcode=Opcode.GEMM, wgt_factor_out=f(), wgt_factor_in=f())
    else:
        insn.update(opcode=Opcode.ALU, alu_opcode=int(rng.integers(0, 5)),
                    use_imm=int(rng.integers(0, 2)), imm=int(rng.integers(-40, 40)))
    whole, pieces = st.copy(), st.copy()
    sem.execute(whole, np.zeros(0, np.uint8), insn)
    monkeypatch.setattr(sem, "LOOP_CHUNK_ITERATIONS", int(rng.choice([1, 2, 3, 7])))
    sem.execute(pieces, np.zeros(0, np.uint8), insn)
    assert np.array_equal(whole.acc, pieces.acc) and np.array_equal(whole.out, pieces.out)


@pytest.mark.parametrize("seed", range(30))
def test_closed_form_range_check_names_the_first_bad_iteration(seed):
    rng = np.random.default_rng(seed)
    st = ArchState.zeros(CFG)
    nu = int(rng.integers(1, 5))
    st.uop[:nu] = isa.encode_uops(rng.integers(0, 2048, (nu, 3)) // [1, 1, 2], CFG)
    insn = dict(opcode=Opcode.ALU, uop_bgn=0, uop_end=nu, iter_out=int(rng.integers(1, 9)),
                iter_in=int(rng.integers(1, 9)), **{
                    f"{f}_factor_{lvl}": int(rng.choice([0, 1, 100, 700]))
                    for f in ("dst", "src") for lvl in ("out", "in")})
    d, s, _ = isa.decode_uops(st.uop[:nu], CFG)
    i = np.arange(insn["iter_out"])[:, None, None]
    j = np.arange(insn["iter_in"])[None, :, None]
    expect = None
    for f, name in ((d, "dst"), (s, "src")):
        idx = (f + i * insn[f"{name}_factor_out"] + j * insn[f"{name}_factor_in"]).ravel()
        if (idx >= 2048).any():
            k = int(np.argmax(idx >= 2048))
            expect = rf"ACC\[{idx[k]}\] at loop iteration {k} but"
            break
    if expect is None:
        sem.check(st, np.zeros(0, np.uint8), insn)
    else:
        with pytest.raises(sem.ExecFault, match=expect):
            sem.check(st, np.zeros(0, np.uint8), insn)


def test_a_push_waits_after_its_pops_in_both_models():
    # Token queues of depth 1. C2 pops l2g, then waits to push g2l until L3 pops it; L2's push
    # waits for C2's pop. Popping only once the push has room would deadlock the functional run.
    cfg = CFG.replace(dep_queue_depth=1)
    nop = load(MemType.INP, 0, 0, 0, 0)
    prog = [isa.replace(nop, push_next=1), GemmInsn(push_prev=1), isa.replace(nop, push_next=1),
            GemmInsn(pop_prev=1, push_prev=1), isa.replace(nop, pop_next=1),
            GemmInsn(pop_prev=1), isa.replace(nop, pop_next=1, push_next=1),
            FinishInsn(pop_prev=1)]
    img = Image(cfg)
    addr, n = img.put_insns(prog)
    for timing in (True, False):
        Simulator(cfg, img.dram.copy()).run(addr, n, timing=timing)


def _mutate(seed: int) -> RunImage:
    """A random legal stream with 1 to 3 bit flips, half of them in token flags and opcodes."""
    rng = np.random.default_rng(10_000 + seed)
    img = random_program(CFG, seed % 50)
    for _ in range(int(rng.integers(1, 4))):
        k = int(rng.integers(0, img.insn_count))
        bit = int(rng.integers(0, 7)) if rng.integers(0, 2) else int(rng.integers(0, 128))
        img.dram[img.insn_addr + 16 * k + bit // 8] ^= np.uint8(1 << (bit % 8))
    return img


def _outcome(img: RunImage, timing: bool) -> str:
    t0 = time.perf_counter()
    try:
        img.run(timing=timing, cycle_limit=DEFAULT_CYCLE_LIMIT)
        result = "accepted"
    except SimError as err:
        assert err.index is not None and err.insn is not None and f"#{err.index} " in str(err)
        result = type(err).__name__
    assert time.perf_counter() - t0 < 2.0, f"{'timed' if timing else 'functional'} run slow"
    return result


@pytest.mark.parametrize("chunk", range(6))
def test_mutated_streams_get_the_same_verdict_from_both_models(chunk):
    """300 mutated streams: the functional model accepts a stream exactly when the timed one
    does, and refuses it with the same error class (MemoryError would fail the test)."""
    seen = {}
    for seed in range(chunk * 50, chunk * 50 + 50):
        img = _mutate(seed)
        timed, functional = _outcome(img, True), _outcome(img, False)
        assert timed == functional, f"seed {seed}: timed {timed}, functional {functional}"
        seen[timed] = seen.get(timed, 0) + 1
    assert seen.get("accepted", 0) and len(seen) > 1  # the mutations do break some streams


def _slow_chain_device(**kw):
    """A sim device holding a stream whose one ALU instruction is 33e6 dependent steps."""
    from vtakit.driver.devices.sim import SimDevice

    dev = SimDevice(CFG, dram_bytes=1 << 20, **kw)
    rng = np.random.default_rng(1)
    acc = rng.integers(1, 1000, (CFG.acc_depth, CFG.batch, CFG.block_out)).astype(np.int32)
    dev.write(0, acc.view(np.uint8).ravel())
    uop_at = acc.nbytes
    dev.write(uop_at, isa.encode_uops(np.array([[1, 0, 0]]), CFG).view(np.uint8))
    prog = [load(MemType.ACC, 0, 0, 1, CFG.acc_depth),
            load(MemType.UOP, 0, uop_at // isa.UOP_BYTES, 1, 1),
            AluInsn(uop_end=1, iter_out=16383, iter_in=2046, dst_factor_in=1, src_factor_in=1,
                    alu_opcode=AluOp.ADD), FinishInsn()]
    insn_at = uop_at + 256
    dev.write(insn_at, isa.encode_stream(prog, CFG))
    return dev, insn_at, len(prog)


@pytest.mark.parametrize("timing", [True, False], ids=["timed", "functional"])
def test_sim_device_wait_honours_its_timeout(timing):
    dev, addr, n = _slow_chain_device(timing=timing)
    dev.run(addr, n)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"sim device: instruction #2 ALU ADD\(.*\): "
                                           r"wall-clock timeout: the run took more than 0.3 s"):
        dev.wait(0.3)
    assert time.perf_counter() - t0 < 1.5
    dev.run(addr, n)  # the device is usable again


def test_simulator_timeout_is_a_sim_error_and_a_timeout_error():
    img = Image(CFG)
    addr, n = img.put_insns([GemmInsn()] * 20000 + [FinishInsn()])
    with pytest.raises(SimTimeout) as info:
        Simulator(CFG, img.dram).run(addr, n, timeout_s=0.05)
    assert isinstance(info.value, TimeoutError) and info.value.index is not None
    with pytest.raises(ValueError, match=r"timeout_s=0: expected a positive number"):
        Simulator(CFG, img.dram).run(addr, n, timeout_s=0)


def test_default_cycle_limit():
    from vtakit.driver import CycleLimitError
    from vtakit.driver.devices.sim import SimDevice

    assert DEFAULT_CYCLE_LIMIT == 2**32
    for timing in (True, False):
        dev = SimDevice(CFG, dram_bytes=1 << 20, timing=timing)
        assert dev.cycle_limit == DEFAULT_CYCLE_LIMIT
        dev.write(0, isa.encode_stream(HUGE_LOOP, CFG))
        dev.run(0, len(HUGE_LOOP))
        with pytest.raises(CycleLimitError, match=r"#0 ALU ADD.*cycle limit 4294967296"):
            dev.wait(10)
    assert SimDevice(CFG, dram_bytes=1 << 16, cycle_limit=None).cycle_limit is None
    with pytest.raises(ValueError, match=r"cycle_limit=-1: expected a non-negative"):
        SimDevice(CFG, dram_bytes=1 << 16, cycle_limit=-1)


def test_cli_default_cycle_limit(tmp_path):
    img = Image(CFG, size=64 << 10)
    addr, n = img.put_insns(HUGE_LOOP)
    path = tmp_path / "huge.npz"
    RunImage(CFG, img.dram, addr, n).save(path)
    for extra in ([], ["--no-timing"]):
        res = CliRunner().invoke(sim_command, [str(path), *extra])
        assert res.exit_code == 1 and "cycle limit 4294967296" in res.output, res.output
    res = CliRunner().invoke(sim_command, [str(path), "--cycle-limit", "1000"])
    assert res.exit_code == 1 and "cycle limit 1000 " in res.output
