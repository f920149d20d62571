"""The driver's sharp edges: kernels never stale, sessions that clean up, runs pinned to their
addresses, virtual threads without hand-placed tokens (all through the public API)."""

import gc
import itertools

import numpy as np
import pytest

from vtakit.driver import Session, SimDevice
from vtakit.driver.errors import DeviceError
from vtakit.driver.kernels import (
    Conv2dShape,
    Conv2dTiling,
    conv2d,
    conv2d_reference,
    pack_activations,
    pack_weights,
    unpack_outputs,
)
from vtakit.driver.memory import Allocator
from vtakit.driver.session import run_image
from vtakit.driver.threads import VirtualThreads
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import PRESETS, preset

CFG = preset("default")
A, M = isa.AluOp, isa.MemType


# ---- 1. uop_kernel never returns a stale kernel ---------------------------------------------
def _alu(s, key, op=A.MAX, imm=0, n=8):
    return s.uop_kernel(key, lambda b: b.loop(n, dst=1).push(0), mode="alu", alu_opcode=op,
                        use_imm=True, imm=imm)


@pytest.mark.parametrize("change", [
    dict(imm=5), dict(op=A.MIN), dict(n=4),
])
def test_a_key_reused_with_another_definition_is_refused(change):
    s = Session(SimDevice(CFG))
    _alu(s, "k")
    with pytest.raises(ValueError, match=r"key 'k' is already defined as alu \[MAX, "
                                         r"use_imm=True, imm=0; loops 8.*this call records"):
        _alu(s, "k", **change)


def test_a_key_reused_with_another_record_function_is_refused():
    s = Session(SimDevice(CFG))
    s.uop_kernel("g", lambda b: b.push(1, 2, 3))
    with pytest.raises(ValueError, match=r"key 'g' is already defined as gemm \[reset=False.*"
                                         r"\(1, 2, 3\).*records gemm .*\(1, 2, 4\)"):
        s.uop_kernel("g", lambda b: b.push(1, 2, 4))
    with pytest.raises(ValueError, match="reset=True"):
        s.uop_kernel("g", lambda b: b.push(1, 2, 3), reset=True)


def test_the_same_definition_returns_the_cached_kernel_and_shares_residency():
    s = Session(SimDevice(CFG))
    k1 = _alu(s, "a")
    assert _alu(s, "a") is k1 and s.uop_kernel("a") is k1
    k2 = _alu(s, "b")  # another key, same content: one UOP load serves both
    assert k2.signature == k1.signature
    x = s.array(np.arange(8 * 16, dtype=np.int32).reshape(8, 16) - 64)
    with s.record() as out:
        s.load_2d(x, 0, 8, 1, 8, sram_base=0, memory_type=M.ACC)
        s.alu(k1)
        s.alu(k2)
    uop_loads = [i for i in out[0].insns()
                 if isinstance(i, isa.MemInsn) and i.memory_type == M.UOP and i.x_size]
    assert len(uop_loads) == 1


def test_stale_kernel_would_have_given_a_wrong_answer():
    """The failure the check prevents: the same key with another shift amount."""
    s = Session(SimDevice(CFG))
    x = s.array(np.full((8, 16), 64, np.int32))
    y = s.alloc((8, 16), np.int8)
    for shift, want in ((1, 32), (2, 16)):
        s.load_2d(x, 0, 8, 1, 8, sram_base=0, memory_type=M.ACC)
        s.alu(s.uop_kernel(("shr", shift), lambda b: b.loop(8, dst=1).push(0), mode="alu",
                           alu_opcode=A.SHR, use_imm=True, imm=shift))
        s.dep_push(2, 3)
        s.dep_pop(2, 3)
        s.store_2d(y, 0, 8, 1, 8, sram_base=0)
        s.synchronize()
        assert (y.numpy() == want).all()


# ---- 3. sessions clean up --------------------------------------------------------------------
def _small_run(s):
    x = s.array(np.arange(4 * 16, dtype=np.int32).reshape(4, 16))
    y = s.alloc((4, 16), np.int8)
    s.load_2d(x, 0, 4, 1, 4, sram_base=0, memory_type=M.ACC)
    s.alu(_alu(s, "relu", n=4))
    s.dep_push(2, 3)
    s.dep_pop(2, 3)
    s.store_2d(y, 0, 4, 1, 4, sram_base=0)
    s.synchronize()
    return y.numpy()


def test_thousand_sessions_on_one_device_leave_its_memory_as_it_was():
    dev = SimDevice(CFG, dram_bytes=64 << 20, timing=False)
    start = dev.allocator.free_bytes
    for k in range(1000):
        with Session(dev) as s:
            out = _small_run(s) if k % 100 == 0 else None
            s.alloc((1 << 16,), np.uint8)
            assert s.device_bytes > 0
        assert s.closed and dev.allocator.free_bytes == start
        if out is not None:
            assert (out == np.clip(np.arange(64).reshape(4, 16), 0, 127)).all()
    # sessions dropped without close() release their memory when collected
    for _ in range(50):
        s = Session(dev)
        _small_run(s)
    del s
    gc.collect()
    assert dev.allocator.free_bytes == start


def test_close_releases_buffers_and_makes_the_session_unusable():
    dev = SimDevice(CFG)
    start = dev.allocator.free_bytes
    s = Session(dev)
    y = s.alloc((4, 16), np.int8)
    _small_run(s)  # allocates the instruction and micro-op areas too
    assert dev.allocator.free_bytes < start
    s.close()
    s.close()  # idempotent
    assert dev.allocator.free_bytes == start
    with pytest.raises(RuntimeError, match="session is closed"):
        s.alloc(4, np.int8)
    with pytest.raises(RuntimeError, match=r"numpy of DeviceArray\(buf\d+.*freed or its session "
                                           r"closed"):
        y.numpy()


def test_discard_drops_a_half_recorded_stream():
    dev = SimDevice(CFG)
    s = Session(dev)
    x = s.array(np.arange(4 * 16, dtype=np.int32).reshape(4, 16))
    s.load_2d(x, 0, 4, 1, 4, sram_base=0, memory_type=M.ACC)
    s.alu(_alu(s, "relu", n=4))  # would load the kernel's micro-ops
    s.dep_pop(2, 3)
    assert s.pending > 0
    s.discard()
    assert s.pending == 0
    assert s.synchronize().cycles == 0  # nothing to run
    # the next stream loads the kernel again (the discarded load never ran)
    assert (_small_run(s) == np.clip(np.arange(64).reshape(4, 16), 0, 127)).all()


# ---- 4. cycle counts and placement -----------------------------------------------------------
ECP5 = preset("ecp5")  # 64-byte alignment, 128-byte burst windows: placement shows


def _conv_on(s):
    cfg = s.cfg
    shape = Conv2dShape(n=cfg.batch, c=cfg.block_in, h=4, w=4, o=cfg.block_out)
    x = np.ones((shape.n, shape.c, 4, 4), np.int8)
    w = np.ones((shape.o, shape.c, 3, 3), np.int8)
    xd, wd = s.array(pack_activations(x, cfg)), s.array(pack_weights(w, cfg))
    yd = s.alloc((1, 1, 4, 4, shape.n, cfg.block_out), np.int8)
    with s.record() as out:
        conv2d(s, xd, wd, yd, shape, shift=4)
    return out[0], yd, conv2d_reference(x, w, shape, 4)


def test_placement_changes_cycles_and_images_pin_it():
    """docs/timing.md, "Placement": the worked example."""
    fresh = SimDevice(ECP5)
    reused = SimDevice(ECP5)
    reused.allocate(64, 16)  # an earlier tenant's block shifts everything by 64 bytes
    cycles, images = [], []
    for dev in (fresh, reused):
        s = Session(dev)
        program, yd, ref = _conv_on(s)
        cycles.append(s.run_program(program).cycles)
        assert (unpack_outputs(yd.numpy()) == ref).all()
        images.append(s.image(program, description="conv"))
    assert cycles == [566, 562]  # same kernel, other addresses: other fetch groups
    # each image, replayed on a third device, reproduces its own run
    assert [run_image(SimDevice(ECP5), im).cycles for im in images] == cycles
    # the fresh run's image on both kinds of device: the same cycles and bytes
    replayed = [run_image(dev, images[0]) for dev in (SimDevice(ECP5), SimDevice(ECP5))]
    assert replayed[0].cycles == replayed[1].cycles == 566
    assert (replayed[0].dram == replayed[1].dram).all()


def test_run_image_refuses_a_range_in_use():
    dev = SimDevice(ECP5)
    s = Session(dev)
    program, _, _ = _conv_on(s)
    image = s.image(program)
    with pytest.raises(ValueError, match=r"cannot reserve \[0x0, 0x[0-9a-f]+\) of device memory: "
                                         r"block \[0x[0-9a-f]+, 0x[0-9a-f]+\) is allocated"):
        run_image(dev, image)
    s.close()
    assert run_image(dev, image).cycles == 566
    with pytest.raises(ValueError, match="the image was made for configuration"):
        run_image(SimDevice(CFG), image)


def test_allocator_reserve_and_free():
    a = Allocator(1 << 12)
    a.reserve(0, 256)
    b = a.alloc(64, 64)
    assert b == 256
    with pytest.raises(ValueError, match="is allocated there"):
        a.reserve(200, 100)
    a.free(0)
    assert a.alloc(64, 64) != 0  # address 0 stays reserved for "no buffer"
    with pytest.raises(ValueError, match="inside"):
        a.reserve(4000, 200)


# ---- 5. virtual threads ----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("threads", [1, 2])
def test_virtual_threads_run_on_every_preset(name, threads):
    """A tiled ACC copy through both halves: correct and free of deadlock on every preset,
    including the ice40's one-entry command queues."""
    cfg = preset(name)
    s = Session(SimDevice(cfg, dram_bytes=16 << 20))
    bo, b = cfg.block_out, cfg.batch
    rows, tiles, chunks = 4, 5, 3
    rng = np.random.default_rng(1)
    x = rng.integers(-100, 100, (tiles * chunks * rows, b, bo), dtype=np.int32)
    xd, yd = s.array(x), s.alloc((tiles * rows, b, bo), np.int8)
    vt = VirtualThreads(s, threads)
    for t in range(tiles):
        with vt.tile() as a:
            acc = vt.half(cfg.acc_depth, a)
            for c in range(chunks):
                with vt.load():  # nothing of INP/WGT used: the compute loads ACC itself
                    pass
                with vt.compute():
                    row = (t * chunks + c) * rows
                    s.load_2d(xd, row, rows, 1, rows, sram_base=acc + c * rows,
                              memory_type=M.ACC)
            with vt.compute():
                for c in range(1, chunks):
                    s.alu(s.uop_kernel(("add", rows, acc, c), lambda k, c=c, acc=acc: k.loop(
                        rows, dst=1, src=1).push(acc, acc + c * rows), mode="alu",
                        alu_opcode=A.ADD))
            with vt.store():
                s.store_2d(yd, t * rows, rows, 1, rows, sram_base=acc)
    vt.finish()
    s.synchronize()
    want = x.reshape(tiles, chunks, rows, b, bo).sum(1).reshape(-1, b, bo)
    assert (yd.numpy() == want.astype(np.int8)).all()


def test_hand_tiled_conv_uses_two_threads_on_every_preset():
    for name in sorted(PRESETS):
        cfg = preset(name)
        bi, bo = cfg.block_in, cfg.block_out
        shape = Conv2dShape(n=cfg.batch, c=2 * bi, h=6, w=6, o=2 * bo)
        rng = np.random.default_rng(2)
        x = rng.integers(-8, 8, (shape.n, shape.c, 6, 6), dtype=np.int8)
        w = rng.integers(-8, 8, (shape.o, shape.c, 3, 3), dtype=np.int8)
        s = Session(SimDevice(cfg, dram_bytes=16 << 20))
        xd, wd = s.array(pack_activations(x, cfg)), s.array(pack_weights(w, cfg))
        yd = s.alloc((1, 2, 6, 6, shape.n, bo), np.int8)
        conv2d(s, xd, wd, yd, shape, 3, Conv2dTiling(toh=2, tob=1, tib=1))
        s.synchronize()
        assert (unpack_outputs(yd.numpy()) == conv2d_reference(x, w, shape, 3)).all(), name


def _loaded(vt):
    with vt.load():
        pass


@pytest.mark.parametrize("misuse, message", [
    (lambda vt: [_loaded(vt), _loaded(vt)], "was not computed on"),
    (lambda vt: vt.compute().__enter__(), "inside a tile"),
    (lambda vt: vt.store().__enter__(), "one store\\(\\) per tile"),
])
def test_virtual_thread_misuse_is_named(misuse, message):
    vt = VirtualThreads(Session(SimDevice(CFG)))
    with pytest.raises(RuntimeError, match=message):
        misuse(vt)


def test_a_tile_without_a_store_is_refused():
    vt = VirtualThreads(Session(SimDevice(CFG)))
    with pytest.raises(RuntimeError, match="a tile ends with a store"):
        with vt.tile():
            pass


def test_virtual_threads_never_exceed_the_dependency_queue():
    from dataclasses import replace

    cfg = replace(CFG, dep_queue_depth=1)
    with pytest.raises(ValueError, match="2 threads need 2 dependency-queue entries"):
        VirtualThreads(Session(SimDevice(cfg)), 2)


def test_token_pattern_cannot_deadlock_random_shapes():
    """Random numbers of tiles and chunks per tile (including tiles without a load), both thread
    counts, on the one-entry-queue preset: every stream finishes."""
    cfg = preset("ice40")
    rng = np.random.default_rng(3)
    for threads, trial in itertools.product((1, 2), range(10)):
        s = Session(SimDevice(cfg, dram_bytes=1 << 20))
        src = s.array(np.ones((8, cfg.batch, cfg.block_in), np.int8))
        out = s.alloc((8, cfg.batch, cfg.block_out), np.int8)
        vt = VirtualThreads(s, threads)
        for _ in range(int(rng.integers(1, 6))):
            with vt.tile() as a:
                for _ in range(int(rng.integers(0, 4))):
                    with vt.load() as b:
                        s.load_2d(src, 0, 2, 1, 2, sram_base=vt.half(cfg.inp_depth, b),
                                  memory_type=M.INP)
                    acc = vt.half(cfg.acc_depth, a)
                    with vt.compute():
                        s.gemm(s.uop_kernel(("r", acc), lambda k, acc=acc: k.push(acc),
                                            reset=True))
                with vt.store():
                    s.store_2d(out, 0, 1, 1, 1, sram_base=vt.half(cfg.acc_depth, a))
        vt.finish()
        try:
            s.synchronize()
        except DeviceError as e:  # pragma: no cover - the failure this test looks for
            pytest.fail(f"threads={threads} trial {trial}: {e}")


def test_kernels_differing_only_in_the_alu_operation_share_one_load():
    s = Session(SimDevice(CFG))
    x = s.array(np.full((8, 16), 100, np.int32))
    y = s.alloc((8, 16), np.int8)
    with s.record() as out:
        s.load_2d(x, 0, 8, 1, 8, sram_base=0, memory_type=M.ACC)
        for op, imm in ((A.SHR, 1), (A.MIN, 40), (A.MAX, -5)):
            s.alu(s.uop_kernel(("rq", int(op)), lambda b: b.loop(8, dst=1).push(0), mode="alu",
                               alu_opcode=op, use_imm=True, imm=imm))
        s.dep_push(2, 3)
        s.dep_pop(2, 3)
        s.store_2d(y, 0, 8, 1, 8, sram_base=0)
    uop_loads = [i for i in out[0].insns()
                 if isinstance(i, isa.MemInsn) and i.memory_type == M.UOP and i.x_size]
    assert len(uop_loads) == 1
    s.run_program(out[0])
    assert (y.numpy() == 40).all()
