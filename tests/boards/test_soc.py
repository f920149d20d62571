# amaranth: UnusedElaboratable=no
"""The board SoC in Amaranth's simulator: the burst memory keeps the timing of
``vta_hw/sim/tb.py`` (docs/timing.md §2), the host port shares it, and a whole run through the
bridge's ports gives the cycles and DRAM of vta_sim."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import Fragment, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator as AmSim

from vtakit.boards.bridge import bridge_ports
from vtakit.boards.soc import BRAM_BANK_WORDS, BurstMemory, Ram, Soc
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.csr import CTRL_DONE, CTRL_FAULT, CTRL_RESET, CTRL_START, CsrAddr
from vtakit.vta_hw.isa import AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode
from vtakit.vta_sim import Simulator

ICE40 = preset("ice40")
# (name, config): the ice40 preset (32-bit bus, L = 1, M = 4), the shortest latencies (no delay
# line, one register, the smallest ring) and a 64-bit bus with two host lanes (L = 32, M = 16)
CONFIGS = {
    "ice40": ICE40,
    "L1": ICE40.replace(mem_read_latency_cycles=1, mem_max_burst_beats=2),
    "L2": ICE40.replace(mem_read_latency_cycles=2),
    "L3-M1": ICE40.replace(mem_read_latency_cycles=3, mem_max_burst_beats=1),
    # the delay line's edges: three register stages, then the shortest ring
    "L5": ICE40.replace(mem_read_latency_cycles=5),
    "L6": ICE40.replace(mem_read_latency_cycles=6),
    "ecp5": preset("ecp5"),
}


def _bursts(cfg, rng, n: int, words: int):
    """``n`` random bursts (kind, first word, beats, [(data, strb)] per beat, idle cycles
    before) inside one M-beat window each, as the core issues them."""
    M = cfg.mem_max_burst_beats
    out = []
    for _ in range(n):
        k = int(rng.integers(1, M + 1))
        window = int(rng.integers(0, words // M))
        first = window * M + int(rng.integers(0, M - k + 1))
        beats = [(int.from_bytes(rng.bytes(cfg.bus_bytes), "little"),
                  int(rng.integers(0, 1 << cfg.bus_bytes))) for _ in range(k)]
        out.append(("rw"[int(rng.integers(0, 2))], first, k, beats, int(rng.integers(0, 3))))
    return out


# RAM banks: the default (one bank of a 256-word memory), banks of 16 words (the last one
# shorter: 248 words), none
BANKS = {"one-bank": (BRAM_BANK_WORDS, 256), "banks": (16, 248), "unbanked": (None, 256)}


@pytest.mark.parametrize("banks", list(BANKS))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_burst_timing_matches_the_bench(name, banks):
    """Back-to-back and spaced bursts of every length: read beat i of a burst requested at g
    arrives exactly at g + L + i (rd_data_valid high then and only then) with the word as of
    its beat, write beat i lands at g + i with its byte strobes; the memory afterwards equals
    the byte-level model's. With a RAM in banks or without."""
    cfg = CONFIGS[name]
    W, L = cfg.bus_bytes, cfg.mem_read_latency_cycles
    bank_words, words = BANKS[banks]
    words -= words % cfg.mem_max_burst_beats
    rng = np.random.default_rng(7)
    init = [int.from_bytes(rng.bytes(W), "little") for _ in range(words)]
    dut = BurstMemory(cfg, words * W, "bram", init, bank_words=bank_words)
    # banks where the word is registered after the RAM anyway (a read latency of 3 or more)
    assert dut.ram.read_latency == (2 if bank_words and L >= 3 else 1)
    model = bytearray(b"".join(v.to_bytes(W, "little") for v in init))
    bursts = _bursts(cfg, rng, 60, words)
    expected: dict[int, int] = {}   # cycle -> read word due then
    seen: dict[int, int] = {}

    async def bench(ctx):
        c = 0

        async def cycle():
            nonlocal c
            if ctx.get(dut.rd_data_valid):
                seen[c] = ctx.get(dut.rd_data)
            await ctx.tick()
            c += 1

        for kind, first, k, beats, gap in bursts:
            for _ in range(gap):
                await cycle()
            for i, (data, strb) in enumerate(beats):
                w = first + i
                if i == 0:
                    port = (dut.rd_valid, dut.rd_addr, dut.rd_beats) if kind == "r" else (
                        dut.wr_valid, dut.wr_addr, dut.wr_beats)
                    ctx.set(port[0], 1)
                    ctx.set(port[1], first * W)
                    ctx.set(port[2], k)
                if kind == "r":
                    expected[c + L] = int.from_bytes(model[w * W:(w + 1) * W], "little")
                else:
                    ctx.set(dut.wr_data_valid, 1)
                    ctx.set(dut.wr_data, data)
                    ctx.set(dut.wr_strb, strb)
                    for b in range(W):
                        if strb >> b & 1:
                            model[w * W + b] = data >> (8 * b) & 0xFF
                # the host is never taken while a burst holds the port
                assert i == 0 or not ctx.get(dut.host_ready)
                await cycle()
                ctx.set(dut.rd_valid, 0)
                ctx.set(dut.wr_valid, 0)
                ctx.set(dut.wr_data_valid, 0)
        for _ in range(L + 2):
            await cycle()

    sim = AmSim(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert sorted(seen) == sorted(expected)
    for cyc, word in expected.items():
        assert seen[cyc] == word, f"cycle {cyc}: got {seen[cyc]:#x}, expected {word:#x}"
    # the final contents, read through the host port below, are checked by the next test


async def _host_write(ctx, dut, addr: int, data: int, strb: int = 0xF) -> None:
    ctx.set(dut.host_addr, addr)
    ctx.set(dut.host_w_data, data)
    ctx.set(dut.host_w_strb, strb)
    ctx.set(dut.host_w_en, 1)
    while not ctx.get(dut.host_ready):
        await ctx.tick()
    await ctx.tick()
    ctx.set(dut.host_w_en, 0)


async def _host_read(ctx, dut, addr: int) -> int:
    ctx.set(dut.host_addr, addr)
    ctx.set(dut.host_r_en, 1)
    while not ctx.get(dut.host_ready):
        await ctx.tick()
    await ctx.tick()
    ctx.set(dut.host_r_en, 0)
    if dut.host_stage:
        # the RAM reads in the cycle after the take, and the word is registered after it
        for _ in range(2):
            assert not ctx.get(dut.host_r_valid)
            await ctx.tick()
    assert ctx.get(dut.host_r_valid)
    return ctx.get(dut.host_r_data)


@pytest.mark.parametrize("bank_words", [BRAM_BANK_WORDS, 16])
@pytest.mark.parametrize("stage", [True, False])
@pytest.mark.parametrize("name", ["ice40", "ecp5"])
def test_host_port_shares_the_memory(name, stage, bank_words):
    """32-bit host words with byte strobes land in the right lane of the bus word; the core's
    reads see them, the host reads back the core's writes; the host is refused while the core
    runs and during the core's bursts, and its read word comes three cycles after the take
    with the host stage (a start's own cycle refused too), the next cycle without. The same
    with the RAM in banks of 16 words (the host stage's where L >= 3)."""
    cfg = CONFIGS[name]
    W, L = cfg.bus_bytes, cfg.mem_read_latency_cycles
    dut = BurstMemory(cfg, 64 * W, "bram", host_stage=stage, bank_words=bank_words)
    assert dut.host_stage is stage
    assert dut.ram.read_latency == (2 if stage and L >= 3 else 1)
    log: dict[str, object] = {}

    async def bench(ctx):
        await ctx.tick()
        assert ctx.get(dut.host_ready)
        for i in range(2 * W // 4):
            await _host_write(ctx, dut, 4 * i, 0x11111111 * (i + 1))
        await _host_write(ctx, dut, 4, 0xAABBCCDD, strb=0b0101)
        log["host"] = [await _host_read(ctx, dut, 4 * i) for i in range(2 * W // 4)]
        # the core reads both bus words in one burst
        ctx.set(dut.rd_valid, 1)
        ctx.set(dut.rd_addr, 0)
        ctx.set(dut.rd_beats, 2)
        await ctx.tick()
        ctx.set(dut.rd_valid, 0)
        assert not ctx.get(dut.host_ready)       # the burst's second beat
        got = []
        for _ in range(L + 2):
            if ctx.get(dut.rd_data_valid):
                got.append(ctx.get(dut.rd_data))
            await ctx.tick()
        log["core"] = got
        # the core writes word 1, the host reads it; a running core keeps the host out
        ctx.set(dut.wr_valid, 1)
        ctx.set(dut.wr_addr, W)
        ctx.set(dut.wr_beats, 1)
        ctx.set(dut.wr_data_valid, 1)
        ctx.set(dut.wr_data, (1 << cfg.bus_width_bits) - 1)
        ctx.set(dut.wr_strb, 1)
        await ctx.tick()
        ctx.set(dut.wr_valid, 0)
        ctx.set(dut.wr_data_valid, 0)
        log["after_write"] = await _host_read(ctx, dut, W)
        ctx.set(dut.core_running, 1)
        log["ready_starting"] = ctx.get(dut.host_ready)  # the start's own cycle
        await ctx.tick()
        log["ready_running"] = ctx.get(dut.host_ready)
        ctx.set(dut.core_running, 0)
        await ctx.tick()
        log["ready_idle"] = ctx.get(dut.host_ready)

    sim = AmSim(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    words = [0x11111111 * (i + 1) for i in range(2 * W // 4)]
    words[1] = (words[1] & 0xFF00FF00) | 0x00BB00DD
    assert log["host"] == words
    bus = [sum(w << (32 * j) for j, w in enumerate(words[k:k + W // 4]))
           for k in range(0, len(words), W // 4)]
    assert log["core"] == bus
    assert log["after_write"] == (words[W // 4] & ~0xFF) | 0xFF
    assert log["ready_starting"] == (0 if stage else 1)
    assert log["ready_running"] == 0 and log["ready_idle"] == 1


def test_host_stage_defaults_to_block_ram_only():
    assert BurstMemory(CONFIGS["ecp5"], 1024, "bram").host_stage
    assert not BurstMemory(CONFIGS["ice40"], 1024, "spram").host_stage


def test_memory_checks_its_parameters():
    with pytest.raises(ValueError, match=r"a 16-bit bus \(log_bus_width=4\) is narrower than "
                                         r"the host's 32-bit words"):
        BurstMemory(ICE40.replace(log_bus_width=4), 1024)
    with pytest.raises(ValueError, match="size_bytes=1030 is not a multiple of the 4-byte"):
        BurstMemory(ICE40, 1030)
    with pytest.raises(TypeError, match="cfg must be an HwConfig, got str"):
        BurstMemory("ice40", 1024)
    with pytest.raises(ValueError, match=r"32768 words of 64 bits need 8 SPRAMs \(expected at "
                                         r"most 4: 16384 words\)"):
        Ram(64, 32768, "spram")
    with pytest.raises(ValueError, match="an SPRAM memory 8 bits wide is not possible"):
        Ram(8, 1024, "spram")
    with pytest.raises(ValueError, match=r"kind='dram' \(expected 'bram' or 'spram'\)"):
        Ram(32, 1024, "dram")
    with pytest.raises(ValueError, match=r"bank_words=24 for a 'bram' RAM \(expected a power "
                                         r"of two, and kind 'bram'\)"):
        Ram(32, 1024, "bram", bank_words=24)
    with pytest.raises(ValueError, match=r"bank_words=16 for a 'spram' RAM"):
        Ram(32, 1024, "spram", bank_words=16)
    with pytest.raises(ValueError, match=r"bank_words=0 must be at least 1"):
        Ram(32, 1024, "bram", bank_words=0)


class _SpramPlatform:
    """Just enough platform for elaborating :class:`Ram` as SPRAM instances."""


def test_spram_ram_instantiates_four_blocks():
    ram = Ram(32, 32768, "spram")
    frag = Fragment.get(ram, _SpramPlatform())
    kinds = [sub.type for sub, _, _ in frag.subfragments if hasattr(sub, "type")]
    assert kinds == ["SB_SPRAM256KA"] * 4


class FakeBridge(wiring.Component):
    """The ports of ``vtakit.boards.bridge.UartBridge``, driven by the test bench."""

    def __init__(self, clk_hz: int, baud: int, mem_words: int, max_payload: int = 256):
        self.args = (clk_hz, baud, mem_words)
        super().__init__(bridge_ports())

    def elaborate(self, platform):
        return Module()


async def _wait(ctx, signal, limit: int = 100) -> None:
    for _ in range(limit):
        if ctx.get(signal):
            return
        await ctx.tick()
    raise AssertionError(f"{signal.name} not high within {limit} cycles")


async def _csr_write(ctx, b: FakeBridge, addr: int, value: int) -> None:
    ctx.set(b.csr_addr, addr)
    ctx.set(b.csr_w_data, value)
    ctx.set(b.csr_w_en, 1)
    await ctx.tick()
    ctx.set(b.csr_w_en, 0)


async def _csr_read(ctx, b: FakeBridge, addr: int) -> int:
    ctx.set(b.csr_addr, addr)
    ctx.set(b.csr_r_en, 1)
    await ctx.tick()
    ctx.set(b.csr_r_en, 0)
    return ctx.get(b.csr_r_data)


async def _mem_write(ctx, b: FakeBridge, addr: int, word: int) -> None:
    ctx.set(b.mem_addr, addr)
    ctx.set(b.mem_w_data, word)
    ctx.set(b.mem_w_strb, 0xF)
    ctx.set(b.mem_w_en, 1)
    await _wait(ctx, b.mem_ready)
    await ctx.tick()
    ctx.set(b.mem_w_en, 0)


async def _mem_read(ctx, b: FakeBridge, addr: int) -> int:
    ctx.set(b.mem_addr, addr)
    ctx.set(b.mem_r_en, 1)
    await _wait(ctx, b.mem_ready)
    await ctx.tick()
    ctx.set(b.mem_r_en, 0)
    await _wait(ctx, b.mem_r_valid)
    return ctx.get(b.mem_r_data)


def _program(cfg):
    """LOAD UOP/INP/WGT, GEMM, ALU (MUL and SHR), STORE, FINISH: every unit and both
    directions of the memory, with dependency tokens."""
    ld = dict(opcode=Opcode.LOAD, y_pad_0=0, y_pad_1=0, x_pad_0=0, x_pad_1=0)
    ei, ew, eo = (cfg.elem_bytes(t) for t in (MemType.INP, MemType.WGT, MemType.OUT))
    return [
        MemInsn(**ld, memory_type=MemType.UOP, sram_base=0, dram_base=1024 // 4, y_size=1,
                x_size=4, x_stride=4),
        MemInsn(**ld, memory_type=MemType.WGT, sram_base=0, dram_base=1536 // ew, y_size=2,
                x_size=3, x_stride=5),
        MemInsn(**ld, memory_type=MemType.INP, sram_base=0, dram_base=2048 // ei + 1,
                y_size=3, x_size=4, x_stride=6, push_next=1),
        GemmInsn(pop_prev=1, uop_bgn=0, uop_end=4, iter_out=2, iter_in=2, dst_factor_out=4,
                 dst_factor_in=1, src_factor_out=4, src_factor_in=1, wgt_factor_in=1),
        AluInsn(uop_bgn=0, uop_end=4, iter_out=2, dst_factor_out=4, alu_opcode=AluOp.MUL,
                use_imm=1, imm=3),
        AluInsn(uop_bgn=0, uop_end=4, iter_out=2, dst_factor_out=4, alu_opcode=AluOp.SHR,
                use_imm=1, imm=2, push_next=1),
        MemInsn(opcode=Opcode.STORE, memory_type=MemType.OUT, sram_base=0,
                dram_base=3072 // eo + 3, y_size=2, x_size=6, x_stride=7, y_pad_0=0,
                y_pad_1=0, x_pad_0=0, x_pad_1=0, pop_prev=1, push_prev=1),
        FinishInsn(pop_next=1),
    ]


@pytest.mark.parametrize("name", ["ice40", "L3-M1"])
def test_run_through_the_bridge_ports_matches_vta_sim(name):
    """The host's view of a run: HW_ID, the program and data written word by word through the
    bridge's memory port (which a running core refuses), INSN_ADDR / INSN_COUNT / CTRL START
    through its register port, DONE polled, CYCLES equal to vta_sim's, the DRAM read back
    equal to vta_sim's; RESET ends the run state."""
    cfg = CONFIGS[name]
    size = 4096
    rng = np.random.default_rng(3)
    dram = rng.integers(0, 256, size).astype(np.uint8)
    uops = isa.encode_uops(np.array([[i, i % 3, i % 2] for i in range(4)]), cfg)
    dram[1024:1024 + 16] = uops.view(np.uint8)
    insns = _program(cfg)
    raw = np.frombuffer(isa.encode_stream(insns, cfg), np.uint8)
    dram[256:256 + raw.size] = raw
    want = dram.copy()
    stats = Simulator(cfg, want).run(256, len(insns))

    soc = Soc(cfg, clk_hz=12_000_000, baud=1_000_000, mem_bytes=size,
              bridge_factory=FakeBridge)
    b = soc.bridge
    assert b.args == (12_000_000, 1_000_000, size // 4)
    log: dict[str, object] = {}

    async def bench(ctx):
        await ctx.tick()
        log["hw_id"] = await _csr_read(ctx, b, CsrAddr.HW_ID)
        for a in range(0, size, 4):
            await _mem_write(ctx, b, a, int.from_bytes(dram[a:a + 4].tobytes(), "little"))
        await _csr_write(ctx, b, CsrAddr.INSN_ADDR, 256)
        await _csr_write(ctx, b, CsrAddr.INSN_COUNT, len(insns))
        await _csr_write(ctx, b, CsrAddr.CTRL, CTRL_START)
        await ctx.tick()
        log["busy"] = (ctx.get(b.mem_busy), ctx.get(b.mem_ready), ctx.get(soc.running))
        for _ in range(2 * stats.cycles + 100):
            ctrl = await _csr_read(ctx, b, CsrAddr.CTRL)
            if ctrl & CTRL_DONE:
                break
        log["ctrl"] = ctrl
        assert ctrl & CTRL_DONE, f"no DONE within {2 * stats.cycles + 100} cycles"
        log["cycles"] = await _csr_read(ctx, b, CsrAddr.CYCLES)
        log["leds"] = tuple(ctx.get(s) for s in (soc.running, soc.done, soc.fault))
        await ctx.tick()
        log["ready_after"] = ctx.get(b.mem_ready)
        out = bytearray()
        for a in range(0, size, 4):
            out += (await _mem_read(ctx, b, a)).to_bytes(4, "little")
        log["dram"] = np.frombuffer(bytes(out), np.uint8)
        await _csr_write(ctx, b, CsrAddr.CTRL, CTRL_RESET)
        await ctx.tick()
        log["after_reset"] = (ctx.get(soc.core.done), ctx.get(soc.running))

    sim = AmSim(soc)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert log["hw_id"] == cfg.hash_u32
    assert log["busy"] == (1, 0, 1)
    assert log["ctrl"] & CTRL_DONE and not log["ctrl"] & CTRL_FAULT
    assert log["cycles"] == stats.cycles
    assert log["leds"] == (0, 1, 0)
    assert log["ready_after"] == 1
    diff = np.flatnonzero(log["dram"] != want)
    assert diff.size == 0, f"DRAM differs at bytes {diff[:16]}"
    assert log["after_reset"] == (0, 0)


def test_soc_checks_its_parameters():
    with pytest.raises(ValueError, match="Soc: baud=0 must be at least 1"):
        Soc(ICE40, clk_hz=12_000_000, baud=0, mem_bytes=4096, bridge_factory=FakeBridge)
    with pytest.raises(TypeError, match="Soc: clk_hz must be an int, got float 12000000.0"):
        Soc(ICE40, clk_hz=12e6, baud=115200, mem_bytes=4096, bridge_factory=FakeBridge)


def test_uart_requests_reach_registers_and_memory():
    """The real bridge in the SoC, driven on its serial pins: ID reports the memory and the
    core's HW_ID, WRITE_MEM / READ_MEM reach the memory the core uses, WRITE_CSR / READ_CSR the
    register block; a memory request during a run is answered BUSY."""
    from vtakit.boards.bridge import UartBridge
    from vtakit.vta_hw import bridge_protocol as p

    clk_hz, baud, size = 4_000_000, 1_000_000, 4096
    div = clk_hz // baud
    soc = Soc(ICE40, clk_hz=clk_hz, baud=baud, mem_bytes=size, bridge_factory=UartBridge)
    requests = [
        p.Request(p.Command.ID, 1),
        p.Request(p.Command.WRITE_MEM, 2, (0x100, 0x11223344, 0x55667788)),
        p.Request(p.Command.READ_MEM, 3, (0x100, 2)),
        p.Request(p.Command.WRITE_CSR, 4, (CsrAddr.INSN_COUNT, 2)),
        p.Request(p.Command.READ_CSR, 5, (CsrAddr.INSN_COUNT,)),
        # a GEMM of 2,500 iterations and FINISH at 0x200, started: memory is refused while
        # it runs, the registers are not
        p.Request(p.Command.WRITE_MEM, 6, (0x200, *np.frombuffer(isa.encode_stream(
            [GemmInsn(uop_bgn=0, uop_end=1, iter_out=50, iter_in=50), FinishInsn()], ICE40),
            np.uint32).tolist())),
        p.Request(p.Command.WRITE_CSR, 7, (CsrAddr.INSN_ADDR, 0x200)),
        p.Request(p.Command.WRITE_CSR, 8, (CsrAddr.CTRL, CTRL_START)),
        p.Request(p.Command.READ_MEM, 9, (0x100, 1)),
        p.Request(p.Command.READ_CSR, 10, (CsrAddr.CTRL,)),
        "wait",
        p.Request(p.Command.READ_CSR, 11, (CsrAddr.CTRL,)),
        p.Request(p.Command.READ_MEM, 12, (0x100, 1)),
    ]
    responses = []

    async def send(ctx, data: bytes) -> None:
        for byte in data:
            for bit in [0] + [byte >> i & 1 for i in range(8)] + [1]:
                ctx.set(soc.rx, bit)
                await ctx.tick().repeat(div)

    async def receive(ctx) -> int:
        for _ in range(200 * div):
            if not ctx.get(soc.tx):
                break
            await ctx.tick()
        else:
            raise AssertionError("no response byte")
        await ctx.tick().repeat(div + div // 2)        # the middle of bit 0
        byte = 0
        for i in range(8):
            byte |= ctx.get(soc.tx) << i
            await ctx.tick().repeat(div)
        assert ctx.get(soc.tx) == 1, "stop bit"
        return byte

    async def bench(ctx):
        ctx.set(soc.rx, 1)
        await ctx.tick().repeat(20)
        for req in requests:
            if req == "wait":
                await ctx.tick().repeat(3000)
                continue
            await send(ctx, p.encode_request(req))
            head = bytes([await receive(ctx) for _ in range(6)])
            n = int.from_bytes(head[4:6], "little")
            frame = head + bytes([await receive(ctx) for _ in range(n + 2)])
            responses.append(p.decode_response(frame))

    sim = AmSim(soc)
    sim.add_clock(1 / clk_hz)
    sim.add_testbench(bench)
    sim.run()
    assert [r.status for r in responses] == [p.Status.OK] * 8 + [p.Status.BUSY] + [
        p.Status.OK] * 3, responses
    board_id = p.BoardId.from_words(responses[0].words)
    assert board_id.mem_words == size // 4 and board_id.hw_id == ICE40.hash_u32
    assert responses[2].words == (0x11223344, 0x55667788)
    assert responses[4].words == (2,)
    assert not responses[9].words[0] & CTRL_DONE                # running
    assert responses[10].words[0] & CTRL_DONE                   # done after the wait
    assert responses[11].words == (0x11223344,)
