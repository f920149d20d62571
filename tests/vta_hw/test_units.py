"""Unit tests of the hardware components with Amaranth async testbenches."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, signed
from amaranth.sim import Simulator

from vtakit.vta_hw.alu import TensorAlu
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.gemm import GemmCore, booth_mul8
from vtakit.vta_hw.isa import AluOp
from vtakit.vta_hw.layouts import insn_layouts
from vtakit.vta_hw.mem_port import MemPort
from vtakit.vta_hw.queues import CmdQueue, TokenCounter
from vtakit.vta_hw.sram import BankedMemory
from vtakit.vta_hw.top import Core
from vtakit.vta_sim.semantics import _alu_op


def run(dut, bench, clock=True):
    sim = Simulator(dut)
    if clock:
        sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_layouts_match_isa():
    lay = insn_layouts(preset("default"))
    for kind in ("mem", "gemm", "alu", "finish", "uop"):
        table = getattr(lay.isa, kind)
        flex = getattr(lay, kind)
        assert flex.size == table.width_bits
        for f in table.fields:
            assert flex[f.name].offset == f.lsb and flex[f.name].width == f.width


@pytest.mark.parametrize("depth", [1, 4])
def test_cmd_queue_visibility_and_order(depth):
    q = CmdQueue(depth, 8)

    async def bench(ctx):
        assert not ctx.get(q.r.valid)
        ctx.set(q.w.en, 1)
        ctx.set(q.w.data, 10)
        await ctx.tick()  # written at d -> visible at d + 1
        ctx.set(q.w.en, 0)
        assert ctx.get(q.r.valid) and ctx.get(q.r.data) == 10
        got, n = [], 1
        for k in range(depth - 1):
            ctx.set(q.w.en, 1)
            ctx.set(q.w.data, 11 + k)
            await ctx.tick()
            n += 1
        ctx.set(q.w.en, 0)
        assert ctx.get(q.w.full)
        while ctx.get(q.r.valid):
            got.append(ctx.get(q.r.data))
            ctx.set(q.r.take, 1)
            await ctx.tick()  # taken at p -> slot usable at p + 1
            ctx.set(q.r.take, 0)
            assert not ctx.get(q.w.full)
        assert got == list(range(10, 10 + n))

    run(q, bench)


@pytest.mark.parametrize("depth", [2, 4, 8])
def test_cmd_queue_against_a_fifo_model(depth):
    """Random writes and takes (back to back included): every cycle the head, ``valid``,
    ``full`` and ``level`` are those of a FIFO of ``depth`` whose writes show a cycle later."""
    q = CmdQueue(depth, 16)
    rng = np.random.default_rng(depth)

    async def bench(ctx):
        model: list[int] = []
        nxt = 0
        for _ in range(600):
            assert ctx.get(q.level) == len(model)
            assert ctx.get(q.w.full) == (len(model) == depth)
            assert ctx.get(q.r.valid) == bool(model)
            if model:
                assert ctx.get(q.r.data) == model[0]
            busy = rng.random() < 0.5  # phases of writing and of taking
            write = len(model) < depth and rng.random() < (0.8 if busy else 0.3)
            take = bool(model) and rng.random() < (0.3 if busy else 0.9)
            ctx.set(q.w.en, write)
            ctx.set(q.w.data, nxt)
            ctx.set(q.r.take, take)
            await ctx.tick()
            if take:
                model.pop(0)
            if write:
                model.append(nxt)
                nxt = (nxt + 1) & 0xFFFF

    run(q, bench)


def test_token_counter_push_visible_same_cycle_pop_next():
    t = TokenCounter(1)

    async def bench(ctx):
        assert not ctx.get(t.consumer.avail)
        ctx.set(t.producer.push, 1)
        assert ctx.get(t.consumer.avail)  # a push is visible to the consumer in its cycle
        await ctx.tick()
        ctx.set(t.producer.push, 0)
        assert not ctx.get(t.producer.can_push)  # full
        ctx.set(t.consumer.pop, 1)
        assert not ctx.get(t.producer.can_push)  # popped slot usable one cycle later
        await ctx.tick()
        ctx.set(t.consumer.pop, 0)
        assert ctx.get(t.producer.can_push) and ctx.get(t.count) == 0

    run(t, bench)


@pytest.mark.parametrize("banks,w_lanes,r_lanes", [(1, 1, 1), (2, 2, 2), (4, 4, 4), (4, 1, 4),
                                                   (4, 4, 1), (4, 3, 2)])
def test_banked_memory_lanes(banks, w_lanes, r_lanes):
    """Lane k of a port is element addr + k, whatever bank addr falls into; disabled lanes
    write nothing."""
    depth = 32
    mem = BankedMemory(8, depth, banks=banks, w_lanes=w_lanes, r_lanes=r_lanes)
    want = [0] * depth

    async def bench(ctx):
        for step, base in enumerate(range(0, depth + 3, 3)):  # every alignment; skip a lane
            ctx.set(mem.w_addr, base % depth)
            for lane in range(w_lanes):
                on = lane != step % w_lanes or w_lanes == 1
                ctx.set(mem.w_en[lane], on)
                ctx.set(mem.w_data[lane], 7 * step + lane)
                if on:
                    want[(base + lane) % depth] = 7 * step + lane
            await ctx.tick()
        for lane in range(w_lanes):
            ctx.set(mem.w_en[lane], 0)
        for i in range(depth):
            ctx.set(mem.r_addr, i)
            await ctx.tick()
            for lane in range(r_lanes):
                assert ctx.get(mem.r_data[lane]) == want[(i + lane) % depth], (i, lane)

    run(mem, bench)


@pytest.mark.parametrize("transparent", [False, True])
@pytest.mark.parametrize("banks,r_lanes", [(1, 1), (4, 4), (4, 2)])
def test_banked_memory_read_during_write(banks, r_lanes, transparent):
    """A read of the element written in the same cycle returns the new value when the memory
    is transparent, the old one when it is not; the lanes read beside it are unaffected."""
    depth = 16
    mem = BankedMemory(8, depth, banks=banks, w_lanes=1, r_lanes=r_lanes,
                       transparent=transparent)

    async def bench(ctx):
        for i in range(depth):  # element i holds i
            ctx.set(mem.w_en[0], 1)
            ctx.set(mem.w_addr, i)
            ctx.set(mem.w_data[0], i)
            await ctx.tick()
        written = set()  # elements holding 100 + their index before this cycle
        for i in range(depth):  # write 100 + i to i while reading it at each lane
            for lane in range(r_lanes):
                base = (i - lane) % depth
                ctx.set(mem.w_addr, i)
                ctx.set(mem.w_data[0], 100 + i)
                ctx.set(mem.r_addr, base)
                await ctx.tick()
                for k in range(r_lanes):
                    e = (base + k) % depth
                    new = e in written or (e == i and transparent)
                    assert ctx.get(mem.r_data[k]) == (100 + e if new else e), (i, lane, k)
                written.add(i)

    run(mem, bench)


def test_banked_memory_checks_transparent():
    with pytest.raises(TypeError, match=r"BankedMemory: transparent must be a bool, got 1"):
        BankedMemory(8, 16, transparent=1)


def test_banked_memory_sign_extended_lanes():
    """With ``w_sext_bits``, lanes after 0 (and lane 0 under ``w_sext``) write the sign
    extension of their low bits, whatever their upper bits hold; lane 0 alone writes all of
    its bits."""
    depth, width, narrow = 32, 16, 4
    mem = BankedMemory(width, depth, banks=4, w_lanes=4, w_sext_bits=narrow)
    want = [0] * depth

    def sext(v):
        low = v & ((1 << narrow) - 1)
        return low - (1 << narrow) if low >> (narrow - 1) else low

    async def bench(ctx):
        for step, base in enumerate(range(0, depth + 5, 5)):
            wide = step % 2 == 0  # lane 0 alone, full width; else four narrow values
            ctx.set(mem.w_addr, base % depth)
            ctx.set(mem.w_sext, not wide)
            for lane in range(4):
                on = lane == 0 or not wide
                value = (0x9A5 * (step + 1) + 0x3C3 * lane) & 0xFFFF  # junk upper bits
                ctx.set(mem.w_en[lane], on)
                ctx.set(mem.w_data[lane], value)
                if on:
                    want[(base + lane) % depth] = value if wide else sext(value) & 0xFFFF
            await ctx.tick()
        for lane in range(4):
            ctx.set(mem.w_en[lane], 0)
        for i in range(depth):
            ctx.set(mem.r_addr, i)
            await ctx.tick()
            assert ctx.get(mem.r_data[0]) == want[i], i

    run(mem, bench)


def test_mem_port_priority_and_burst_boundaries():
    cfg = preset("ice40")
    port = MemPort(cfg)

    async def bench(ctx):
        # load asks for a 4-beat burst at cycle 0, fetch at cycle 1: fetch waits for cycle 4
        ctx.set(port.load.req, 1)
        ctx.set(port.load.beats, 4)
        ctx.set(port.load.addr, 64)
        assert ctx.get(port.load.grant) and ctx.get(port.bus.rd_valid)
        await ctx.tick()
        ctx.set(port.fetch.req, 1)
        ctx.set(port.fetch.beats, 2)
        grants = []
        for _ in range(1, 8):
            grants.append((ctx.get(port.fetch.grant), ctx.get(port.load.grant)))
            fetch_granted = ctx.get(port.fetch.grant)
            await ctx.tick()
            if fetch_granted:  # the fetch client withdraws after its only burst
                ctx.set(port.fetch.req, 0)
        assert grants[:3] == [(0, 0)] * 3  # port held by the load burst
        assert grants[3] == (1, 0)  # fetch takes the boundary at cycle 4
        assert grants[5] == (0, 1)  # the load continues at 6

    run(port, bench)


ALU_CASES = [(op, a, b) for op in AluOp for a, b in
             [(5, 3), (-7, 2), (123456, -4), (-1, 31), (1 << 30, 40), (3, -32), (-5, -1),
              (2**31 - 1, 2), (-(2**31), -1), (-7, 31), (-7, 32), (5, -31), (5, -33),
              (-3, -31), (0x12345678, 1 << 20), (0x12345678, -(1 << 20)),
              (-(2**31), 31), (-(2**31), -(2**31)), (2**31 - 1, 2**31 - 1), (-1, 0), (7, 0)]
             + [tuple(int(v) for v in pair) for pair in  # every bit of either operand
                np.random.default_rng(11).integers(-(2**31), 2**31, size=(24, 2))]]
# every shift amount from -34 to 34 (each saturation edge of either direction), of a negative
# and a positive operand
ALU_CASES += [(AluOp.SHR, a, b) for a in (-0x6543210f, 0x12345679) for b in range(-34, 35)]


def _alu_control_bits(op) -> int:
    """ALU_CONTROL's bits of ``op``, written out: MIN or MAX, MAX, ADD, MUL."""
    return ((op in (AluOp.MIN, AluOp.MAX)) | (op == AluOp.MAX) << 1 | (op == AluOp.ADD) << 2
            | (op == AluOp.MUL) << 3)


# shifts by multiplier / barrel shifter; the latter with the operation decoded per lane
@pytest.mark.parametrize("config,decoded", [("ice40", False), ("ecp5", False), ("ecp5", True)])
def test_alu_matches_semantics(config, decoded):
    alu = TensorAlu(preset(config), decoded=decoded)
    assert alu.shift_by_multiplier == (config == "ice40")
    lanes = 2

    async def bench(ctx):
        for op, a, b in ALU_CASES:
            if decoded:
                ctx.set(alu.control.as_value(), sum(_alu_control_bits(op) << (4 * k)
                                                    for k in range(preset(config).block_out)))
            else:
                ctx.set(alu.op, op)
            ctx.set(alu.a, sum((a & 0xffffffff) << (32 * k) for k in range(lanes)))
            ctx.set(alu.b, sum((b & 0xffffffff) << (32 * k) for k in range(lanes)))
            if decoded:  # MUL's own copies of the operands
                ctx.set(alu.mul_a, sum((a & 0xffffffff) << (32 * k) for k in range(lanes)))
                ctx.set(alu.mul_b, sum((b & 0xffffffff) << (32 * k) for k in range(lanes)))
            got = ctx.get(alu.out) & 0xffffffff
            want = int(_alu_op(op, np.array([a]), b)[0]) & 0xffffffff
            assert got == want, (op, a, b, got, want)
            # the halves the compute unit selects from: MUL's product, every other result
            half = ctx.get(alu.product if op == AluOp.MUL else alu.other)
            assert half & 0xffffffff == want, (op, a, b, half, want)

    run(alu, bench, clock=False)


def test_alu_decoded_needs_the_barrel_shifter_datapath():
    with pytest.raises(ValueError, match="decoded=True needs the barrel-shifter datapath"):
        TensorAlu(preset("ice40"), decoded=True)


def test_booth_multiplier_is_exact_on_every_int8_pair():
    m = Module()
    x, w, p = Signal(signed(8)), Signal(signed(8)), Signal(signed(16))
    m.d.comb += p.eq(booth_mul8(m, x, w, "t"))
    wrong = []

    async def bench(ctx):
        for a in range(-128, 128):
            ctx.set(x, a)
            for b in range(-128, 128):
                ctx.set(w, b)
                if ctx.get(p) != a * b:
                    wrong.append((a, b, ctx.get(p)))

    run(m, bench, clock=False)
    assert wrong == []


@pytest.mark.parametrize("operand_regs", [False, True])
@pytest.mark.parametrize("dsp_products", [None, 0, 13, 40])
def test_gemm_core_with_logic_multipliers_matches_numpy(dsp_products, operand_regs):
    """Operands presented back to back, one pair a cycle: the sums of each pair one cycle
    later (two with operand registers)."""
    cfg = preset("ecp5")  # 8 lanes of 8 products
    gemm = GemmCore(cfg, dsp_products, operand_regs=operand_regs)
    latency = 2 if operand_regs else 1
    rng = np.random.default_rng(5)
    cases = [rng.integers(-128, 128, size=(cfg.block_in,)) for _ in range(12)]
    wgts = [rng.integers(-128, 128, size=(cfg.block_out, cfg.block_in)) for _ in range(12)]
    cases[0][:], wgts[0][:] = -128, -128  # the extremes: every product 2**14

    def pack(vals, bits):
        return sum((int(v) & ((1 << bits) - 1)) << (bits * k) for k, v in enumerate(vals))

    async def bench(ctx):
        for i in range(len(cases) + latency - 1):
            if i < len(cases):
                ctx.set(gemm.inp, pack(cases[i], 8))
                ctx.set(gemm.wgt, pack(wgts[i].reshape(-1), 8))
            await ctx.tick()  # the products (and the operands) are registered
            k = i + 1 - latency
            if k >= 0:
                got = ctx.get(gemm.sums)
                want = pack(wgts[k] @ cases[k], 32)
                assert got == want, (k, cases[k], wgts[k])

    run(gemm, bench)


@pytest.mark.filterwarnings("ignore:.*created but never used")  # refused in __init__
def test_gemm_and_core_check_dsp_products():
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match=r"dsp_products=.* must be None or a non-negative int"):
            GemmCore(preset("ecp5"), bad)
        with pytest.raises(ValueError, match=r"Core: dsp_products="):
            Core(preset("ecp5"), dsp_products=bad)
    for bad in (1, None, "yes"):
        with pytest.raises(TypeError, match=r"GemmCore: operand_regs must be a bool, got "):
            GemmCore(preset("ecp5"), operand_regs=bad)


def test_core_checks_parameters_and_id():
    with pytest.raises(TypeError, match="cfg must be an HwConfig"):
        Core("default")  # raises before anything is created
    core = Core(preset("ice40"))

    async def bench(ctx):
        assert ctx.get(core.hw_ver) == 2
        assert ctx.get(core.hw_id) == preset("ice40").hash_u32

    run(core, bench)
