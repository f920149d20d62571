# amaranth: UnusedElaboratable=no
"""The UART host bridge in Amaranth's simulator: frames sent bit by bit on ``rx``, responses
decoded from ``tx`` with the host's decoder, a memory with random back-pressure and read
latency behind ``mem_*``, and the core's real register block behind ``csr_*``."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from vtakit.boards.bridge import UartBridge
from vtakit.boards.uart import UartRx, UartTx, uart_divisor
from vtakit.vta_hw import bridge_protocol as p
from vtakit.vta_hw.bridge_protocol import Command, Request, Status
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.csr import CTRL_START, CsrAddr, CsrBlock
from vtakit.vta_hw.top import hw_ver_word

CFG = preset("ice40")
CLK_HZ, BAUD = 1_000_000, 250_000  # 4 clock cycles per bit
DIV = CLK_HZ // BAUD
TIMEOUT_S = 160e-6                   # 160 cycles: 4 characters
MAX_PAYLOAD = 32                     # 8 words
MEM_WORDS = 64


@dataclass
class Board:
    """The bridge, a register block and the test's view of memory and the core's ports."""

    bridge: UartBridge
    csr: CsrBlock
    top: Module
    mem: list[int]
    rng: random.Random
    tx_bytes: bytearray = field(default_factory=bytearray)
    starts: int = 0
    frame_errors: int = 0
    mem_accesses: int = 0

    @classmethod
    def build(cls, seed: int = 0) -> Board:
        m = Module()
        bridge = m.submodules.bridge = UartBridge(CLK_HZ, BAUD, MEM_WORDS, MAX_PAYLOAD,
                                                  timeout_s=TIMEOUT_S)
        csr = m.submodules.csr = CsrBlock(CFG)
        m.d.comb += [csr.addr.eq(bridge.csr_addr), csr.w_en.eq(bridge.csr_w_en),
                     csr.w_data.eq(bridge.csr_w_data), csr.r_en.eq(bridge.csr_r_en),
                     bridge.csr_r_data.eq(csr.r_data)]
        rng = random.Random(seed)
        return cls(bridge, csr, m, [rng.getrandbits(32) for _ in range(MEM_WORDS)], rng)

    # ---- the serial line ----------------------------------------------------------------
    async def send(self, ctx, data: bytes, *, stop_bit: int = 1) -> None:
        """Drive ``rx`` with 8N1 characters, back to back."""
        for byte in data:
            for bit in [0, *((byte >> i) & 1 for i in range(8)), stop_bit]:
                ctx.set(self.bridge.rx, bit)
                await ctx.tick().repeat(DIV)
        ctx.set(self.bridge.rx, 1)

    async def response(self, ctx, max_cycles: int = 6000) -> p.Response:
        """Wait for one whole response on ``tx`` and decode it."""
        for _ in range(max_cycles // (10 * DIV)):
            await ctx.tick().repeat(10 * DIV)
            buf = self.tx_bytes
            if len(buf) >= 6 and len(buf) >= 6 + int.from_bytes(buf[4:6], "little") + 2:
                n = 6 + int.from_bytes(buf[4:6], "little") + 2
                frame = bytes(buf[:n])
                del buf[:n]
                return p.decode_response(frame, MAX_PAYLOAD)
        raise AssertionError(f"no whole response within {max_cycles} cycles; got "
                             f"{bytes(self.tx_bytes).hex(' ')}")

    async def exchange(self, ctx, req: Request) -> p.Response:
        await self.send(ctx, p.encode_request(req, MAX_PAYLOAD))
        resp = await self.response(ctx)
        assert (resp.cmd, resp.seq) == (req.cmd, req.seq), resp
        return resp

    async def idle(self, ctx, cycles: int) -> None:
        await ctx.tick().repeat(cycles)

    # ---- background processes -----------------------------------------------------------
    async def monitor_tx(self, ctx) -> None:
        """Decode ``tx`` (sampled in the middle of each bit)."""
        while True:
            await ctx.negedge(self.bridge.tx)
            await ctx.tick().repeat(DIV // 2)
            assert ctx.get(self.bridge.tx) == 0, "start bit too short"
            value = 0
            for i in range(8):
                await ctx.tick().repeat(DIV)
                value |= ctx.get(self.bridge.tx) << i
            await ctx.tick().repeat(DIV)
            assert ctx.get(self.bridge.tx) == 1, "stop bit low"
            self.tx_bytes.append(value)

    async def memory(self, ctx) -> None:
        """Memory with random ``mem_ready`` and 1-3 cycles of read latency; counts the core's
        start pulses and the bridge's frame errors."""
        b = self.bridge
        ready = False
        reads: list[tuple[int, int]] = []  # (cycle due, word)
        cycle = 0
        async for _clk, _rst, w_en, r_en, addr, w_data, strb, start, ferr in ctx.tick().sample(
                b.mem_w_en, b.mem_r_en, b.mem_addr, b.mem_w_data, b.mem_w_strb,
                self.csr.core_start, b.frame_error):
            cycle += 1
            self.starts += start
            self.frame_errors += ferr
            if ready and (w_en or r_en):
                assert addr % 4 == 0 and addr < 4 * MEM_WORDS, hex(addr)
                self.mem_accesses += 1
            if ready and w_en:
                assert strb == 0b1111
                self.mem[addr // 4] = w_data
            if ready and r_en:
                due = max([cycle + self.rng.randint(0, 2)] + [c + 1 for c, _ in reads[-1:]])
                reads.append((due, self.mem[addr // 4]))
            ready = self.rng.random() < 0.6
            ctx.set(b.mem_ready, ready)
            if reads and reads[0][0] <= cycle:
                ctx.set(b.mem_r_valid, 1)
                ctx.set(b.mem_r_data, reads.pop(0)[1])
            else:
                ctx.set(b.mem_r_valid, 0)

    def run(self, script) -> None:
        sim = Simulator(self.top)
        sim.add_clock(1 / CLK_HZ)
        sim.add_testbench(self.monitor_tx, background=True)
        sim.add_testbench(self.memory, background=True)

        async def bench(ctx):
            ctx.set(self.bridge.rx, 1)
            await ctx.tick().repeat(4)
            await script(ctx)
            await ctx.tick().repeat(4)  # let the last frame_error pulse be counted

        sim.add_testbench(bench)
        sim.run()


def words(seed: int, n: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.getrandbits(32) for _ in range(n))


def write(seq, addr, data):
    return Request(Command.WRITE_MEM, seq, (addr, *data))


def read(seq, addr, n):
    return Request(Command.READ_MEM, seq, (addr, n))


def test_write_then_read_back_memory_blocks():
    b = Board.build()
    first, last = words(1, 8), words(2, 3)

    async def script(ctx):
        assert (await b.exchange(ctx, write(1, 0x40, first))).status == Status.OK
        assert (await b.exchange(ctx, write(2, 4 * (MEM_WORDS - 3), last))).status == Status.OK
        r = await b.exchange(ctx, read(3, 0x40, 8))
        assert (r.status, r.words) == (Status.OK, first)
        r = await b.exchange(ctx, read(4, 4 * (MEM_WORDS - 3), 3))
        assert (r.status, r.words) == (Status.OK, last)
        r = await b.exchange(ctx, read(5, 0x44, 1))
        assert r.words == first[1:2]

    before = list(b.mem)
    b.run(script)
    assert b.mem[0x10:0x18] == list(first) and b.mem[-3:] == list(last)
    assert b.mem[:0x10] == before[:0x10] and b.mem[0x18:-3] == before[0x18:-3]
    assert b.frame_errors == 0


def test_registers_id_and_a_resent_write_is_executed_once():
    b = Board.build()

    async def script(ctx):
        r = await b.exchange(ctx, Request(Command.ID, 9))
        assert r.status == Status.OK
        board = p.BoardId.from_words(r.words)
        assert board == p.BoardId(p.PROTOCOL_VERSION, MAX_PAYLOAD, MEM_WORDS, hw_ver_word(),
                                  CFG.hash_u32)
        w = Request(Command.WRITE_CSR, 10, (CsrAddr.INSN_ADDR, 0x1230))
        assert (await b.exchange(ctx, w)).status == Status.OK
        r = await b.exchange(ctx, Request(Command.READ_CSR, 11, (CsrAddr.INSN_ADDR,)))
        assert (r.status, r.words) == (Status.OK, (0x1230,))
        start = Request(Command.WRITE_CSR, 12, (CsrAddr.CTRL, CTRL_START))
        assert (await b.exchange(ctx, start)).status == Status.OK
        # the host lost the response and resends with the same SEQ: acknowledged, not executed
        assert (await b.exchange(ctx, start)).status == Status.OK
        assert b.starts == 1
        # a new request (next SEQ) is executed
        again = Request(Command.WRITE_CSR, 13, (CsrAddr.CTRL, CTRL_START))
        assert (await b.exchange(ctx, again)).status == Status.OK
        assert b.starts == 2
        # an unmapped register reads 0
        r = await b.exchange(ctx, Request(Command.READ_CSR, 14, (0x40,)))
        assert r.words == (0,)

    b.run(script)
    assert b.mem_accesses == 0


def flip(frame: bytes, index: int, bit: int) -> bytes:
    out = bytearray(frame)
    out[index] ^= 1 << bit
    return bytes(out)


# a WRITE_MEM of 4 words: SYNC 0, CMD 1, SEQ 2, LEN 3-4 (= 20 = 0x14), ADDR 5-8, data 9-24,
# CRC 25-26
CORRUPTIONS = [
    ("sync", 0, 0, Status.BAD_SYNC),
    ("command", 1, 3, Status.BAD_CRC),
    ("sequence number", 2, 0, Status.BAD_CRC),
    ("length, not a multiple of 4", 3, 0, Status.BAD_LENGTH),
    ("length, shorter", 3, 2, Status.BAD_CRC),
    ("length, longer", 3, 3, Status.TRUNCATED),
    ("length, past max_payload", 3, 5, Status.BAD_LENGTH),
    ("length, high byte", 4, 0, Status.BAD_LENGTH),
    ("address", 6, 1, Status.BAD_CRC),
    ("payload data", 20, 7, Status.BAD_CRC),
    ("crc", 26, 0, Status.BAD_CRC),
]


@pytest.mark.parametrize("what, index, bit, status", CORRUPTIONS,
                         ids=[c[0] for c in CORRUPTIONS])
def test_a_corrupted_frame_is_rejected_and_not_executed(what, index, bit, status):
    b = Board.build()
    data = words(3, 4)
    frame = p.encode_request(write(21, 0x20, data), MAX_PAYLOAD)
    assert len(frame) == 27

    async def script(ctx):
        await b.send(ctx, flip(frame, index, bit))
        r = await b.response(ctx)
        assert r.status == status, (what, r)
        assert r.words == ()
        if status == Status.BAD_SYNC:
            assert (r.cmd, r.seq) == (0, 0)
        assert b.mem_accesses == 0
        # the next good frame (the host resends with the same SEQ) is executed
        r = await b.exchange(ctx, write(21, 0x20, data))
        assert r.status == Status.OK

    before = list(b.mem)
    b.run(script)
    assert b.mem[8:12] == list(data) and b.mem[:8] + b.mem[12:] == before[:8] + before[12:]
    assert b.frame_errors == 1


def test_a_truncated_frame_times_out_and_the_next_frame_works():
    b = Board.build()
    frame = p.encode_request(write(30, 0, words(4, 4)), MAX_PAYLOAD)

    async def script(ctx):
        await b.send(ctx, frame[:9])  # header and one payload word, then the line goes quiet
        r = await b.response(ctx)
        assert (r.cmd, r.seq, r.status) == (Command.WRITE_MEM, 30, Status.TRUNCATED)
        assert b.mem_accesses == 0
        r = await b.exchange(ctx, read(31, 0, 4))
        assert r.status == Status.OK and r.words == tuple(b.mem[:4])

    b.run(script)
    assert b.frame_errors == 1


def test_a_low_stop_bit_is_a_line_error():
    b = Board.build()

    async def script(ctx):
        await b.send(ctx, bytes([p.REQUEST_SYNC]), stop_bit=0)
        r = await b.response(ctx)
        assert r.status == Status.LINE_ERROR
        r = await b.exchange(ctx, Request(Command.READ_CSR, 40, (CsrAddr.HW_ID,)))
        assert r.words == (CFG.hash_u32,)

    b.run(script)


def test_memory_is_busy_while_the_core_runs():
    b = Board.build()

    async def script(ctx):
        ctx.set(b.bridge.mem_busy, 1)
        assert (await b.exchange(ctx, write(50, 0, (1, 2)))).status == Status.BUSY
        assert (await b.exchange(ctx, read(51, 0, 2))).status == Status.BUSY
        # the registers stay reachable: the host polls CTRL while the core runs
        r = await b.exchange(ctx, Request(Command.READ_CSR, 52, (CsrAddr.HW_VER,)))
        assert (r.status, r.words) == (Status.OK, (hw_ver_word(),))
        ctx.set(b.bridge.mem_busy, 0)
        assert (await b.exchange(ctx, write(53, 0, (1, 2)))).status == Status.OK

    b.run(script)
    assert b.mem[:2] == [1, 2]
    assert b.frame_errors == 2


REFUSED = [
    ("write past the end", write(60, 4 * (MEM_WORDS - 2), (1, 2, 3)), Status.OUT_OF_RANGE),
    ("read past the end", read(61, 4 * MEM_WORDS, 1), Status.OUT_OF_RANGE),
    ("read far past the end", read(62, 0xFFFF_FFFC, 2), Status.OUT_OF_RANGE),
    ("misaligned write", write(63, 0x42, (1,)), Status.MISALIGNED),
    ("register past 0xff", Request(Command.READ_CSR, 64, (0x100,)), Status.OUT_OF_RANGE),
    ("misaligned register", Request(Command.WRITE_CSR, 65, (0x0D, 1)), Status.MISALIGNED),
    ("unknown command", Request(0x7E, 66, ()), Status.BAD_COMMAND),
    ("length wrong for the command", Request(Command.READ_CSR, 67, (0, 0)), Status.BAD_LENGTH),
    ("read of 0 words", read(68, 0, 0), Status.BAD_LENGTH),
    ("read of more than max_payload", read(69, 0, MAX_PAYLOAD // 4 + 1), Status.BAD_LENGTH),
    ("write without data", Request(Command.WRITE_MEM, 70, (0,)), Status.BAD_LENGTH),
]


def test_requests_out_of_range_or_malformed_are_refused():
    b = Board.build()

    async def script(ctx):
        for what, req, status in REFUSED:
            r = await b.exchange(ctx, req)
            assert (r.status, r.words) == (status, ()), what

    before = list(b.mem)
    b.run(script)
    assert b.mem == before and b.mem_accesses == 0
    assert b.frame_errors == len(REFUSED)


def test_uart_loopback_every_byte_value():
    """UartTx into UartRx: all 256 values, back to back."""
    m = Module()
    tx = m.submodules.tx = UartTx(5)
    rx = m.submodules.rx = UartRx(5)
    m.d.comb += rx.line.eq(tx.line)
    got = []

    async def sender(ctx):
        for v in range(256):
            ctx.set(tx.i.payload, v)
            ctx.set(tx.i.valid, 1)
            await ctx.tick().until(tx.i.ready)
        ctx.set(tx.i.valid, 0)
        await ctx.tick().repeat(80)

    async def receiver(ctx):
        async for _clk, _rst, valid, data, err in ctx.tick().sample(rx.o.valid, rx.o.payload,
                                                                    rx.error):
            assert not err
            if valid:
                got.append(data)

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(sender)
    sim.add_testbench(receiver, background=True)
    sim.run()
    assert got == list(range(256))


def test_parameters_are_checked():
    with pytest.raises(ValueError, match=r"clk_hz=1000000, baud=500000: 2.00 clock cycles per "
                                         r"bit; expected at least 4"):
        uart_divisor(1_000_000, 500_000)
    with pytest.raises(ValueError, match=r"baud=180000: the nearest divisor 6 gives 166667 "
                                         r"baud, 7.4% off; expected within 2%"):
        uart_divisor(1_000_000, 180_000)
    assert uart_divisor(12_000_000, 115_200) == 104
    with pytest.raises(ValueError, match=r"UartRx: divisor=3; expected an int >= 4"):
        UartRx(3)
    with pytest.raises(ValueError, match=r"mem_words=0; expected an int in 1..2\*\*30"):
        UartBridge(CLK_HZ, BAUD, 0)
    with pytest.raises(ValueError, match=r"UartBridge: max_payload=30: expected a multiple of 4 "
                                         r"in 32..4096"):
        UartBridge(CLK_HZ, BAUD, 16, 30)
    with pytest.raises(ValueError, match=r"timeout_s=5e-05 is 50 cycles at 1000000 Hz; expected "
                                         r"at least 120 \(3 characters of 40 cycles\)"):
        UartBridge(CLK_HZ, BAUD, 16, timeout_s=50e-6)
