# amaranth: UnusedElaboratable=no
"""The AXI4 master adapter against a small AXI4 slave memory written here: bursts, strobes,
back-pressure, read-after-write order, and the run-time check of the fixed-latency contract."""

from __future__ import annotations

import random
from collections import deque

import pytest
from amaranth.sim import Simulator

from vtakit.vta_hw.axi import AXI_ERR_LATE, AXI_ERR_OVERFLOW, AXI_ERR_RESP, AxiMaster
from vtakit.vta_hw.config import preset

CFG = preset("ice40").replace(mem_read_latency_cycles=40, mem_max_burst_beats=4)
W = CFG.bus_bytes


class SlaveMemory:
    """An AXI4 slave over a bytearray, one cycle at a time.

    ``ready_p``: probability that arready/awready/wready are high in a cycle;
    ``latency``: cycles from AR accepted to the first R beat offered (then ``rvalid`` may drop
    with probability ``1 - ready_p``); B is offered one cycle after the last W beat.
    """

    def __init__(self, size, rng, ready_p=1.0, latency=2, bresp=0):
        self.mem = bytearray(rng.randbytes(size))
        self.rng, self.ready_p, self.latency, self.bresp = rng, ready_p, latency, bresp
        self.reads = deque()  # [ready cycle, addr, beats left]
        self.aws = deque()
        self.wbeat = 0
        self.wq = deque()
        self.bs = deque()  # cycles at which a B response may be offered
        self.r_beat = None
        self.b_offer = False

    async def step(self, ctx, dut, cycle):
        """Drive the slave's outputs for this cycle, then take the handshakes."""
        rnd = self.rng.random
        ctx.set(dut.arready, rnd() < self.ready_p)
        ctx.set(dut.awready, rnd() < self.ready_p)
        ctx.set(dut.wready, rnd() < self.ready_p)
        offer = bool(self.reads) and self.reads[0][0] <= cycle and rnd() < max(self.ready_p, .5)
        ctx.set(dut.rvalid, offer)
        if offer:
            _, addr, left = self.reads[0]
            ctx.set(dut.rdata, int.from_bytes(self.mem[addr:addr + W], "little"))
            ctx.set(dut.rlast, left == 1)
            ctx.set(dut.rresp, 0)
        b = bool(self.bs) and self.bs[0] <= cycle
        ctx.set(dut.bvalid, b)
        ctx.set(dut.bresp, self.bresp)
        # handshakes of this cycle
        if ctx.get(dut.arvalid) and ctx.get(dut.arready):
            assert ctx.get(dut.arburst) == 1 and ctx.get(dut.arsize) == W.bit_length() - 1
            self.reads.append([cycle + self.latency, ctx.get(dut.araddr), ctx.get(dut.arlen) + 1])
        if offer and ctx.get(dut.rready):
            head = self.reads[0]
            head[1] += W
            head[2] -= 1
            if head[2] == 0:
                self.reads.popleft()
        if ctx.get(dut.awvalid) and ctx.get(dut.awready):
            self.aws.append([ctx.get(dut.awaddr), ctx.get(dut.awlen) + 1])
        if ctx.get(dut.wvalid) and ctx.get(dut.wready):
            # AXI lets W run ahead of AW: keep the beats until their AW is known
            self.wq.append((ctx.get(dut.wdata).to_bytes(W, "little"), ctx.get(dut.wstrb),
                            ctx.get(dut.wlast)))
        while self.aws and self.wq:
            addr, n = self.aws[0]
            word, strb, wlast = self.wq.popleft()
            a = addr + self.wbeat * W
            for k in range(W):
                if strb >> k & 1:
                    self.mem[a + k] = word[k]
            self.wbeat += 1
            assert wlast == (self.wbeat == n)
            if self.wbeat == n:
                self.aws.popleft()
                self.wbeat = 0
                self.bs.append(cycle + 1)
        if b and ctx.get(dut.bready):
            self.bs.popleft()


def random_program(rng, n=24, size=1024):
    """Core-side bursts: (kind, addr, beats, [(data, strb)]), kept within one M*W window."""
    prog = []
    for _ in range(n):
        beats = rng.randint(1, CFG.mem_max_burst_beats)
        window = CFG.mem_max_burst_beats * W
        base = rng.randrange(0, size // window) * window
        addr = base + rng.randint(0, CFG.mem_max_burst_beats - beats) * W
        if rng.random() < 0.5:
            prog.append(("rd", addr, beats, None))
        else:
            beats_data = [(rng.getrandbits(8 * W), rng.getrandbits(W)) for _ in range(beats)]
            prog.append(("wr", addr, beats, beats_data))
    return prog


def run(prog, slave, gap_p=0.3, seed=0, limit=3000):
    """Play ``prog`` as the core would (one burst at a time, reads checked at g + L + i against
    a reference memory with posted writes); return (adapter error_cause, reference memory)."""
    dut = AxiMaster(CFG)
    L = CFG.mem_read_latency_cycles
    ref = bytearray(slave.mem)
    rng = random.Random(seed)
    out = {"late": False}

    async def bench(ctx):
        expect = {}  # cycle -> word
        busy_until = 0
        todo = deque(prog)
        wbeats = deque()
        for cycle in range(limit):
            for s in ("mem_rd_valid", "mem_wr_valid", "mem_wr_data_valid"):
                ctx.set(getattr(dut, s), 0)
            if wbeats:
                d, s = wbeats.popleft()
                ctx.set(dut.mem_wr_data_valid, 1)
                ctx.set(dut.mem_wr_data, d)
                ctx.set(dut.mem_wr_strb, s)
            elif todo and cycle >= busy_until and rng.random() >= gap_p:
                kind, addr, beats, beats_data = todo.popleft()
                busy_until = cycle + beats
                if kind == "rd":
                    ctx.set(dut.mem_rd_valid, 1)
                    ctx.set(dut.mem_rd_addr, addr)
                    ctx.set(dut.mem_rd_beats, beats)
                    for i in range(beats):
                        a = addr + i * W
                        expect[cycle + L + i] = int.from_bytes(ref[a:a + W], "little")
                else:
                    ctx.set(dut.mem_wr_valid, 1)
                    ctx.set(dut.mem_wr_addr, addr)
                    ctx.set(dut.mem_wr_beats, beats)
                    for i, (d, s) in enumerate(beats_data):
                        a = addr + i * W
                        for k in range(W):  # posted: visible to every later read
                            if s >> k & 1:
                                ref[a + k] = d.to_bytes(W, "little")[k]
                    d, s = beats_data[0]
                    ctx.set(dut.mem_wr_data_valid, 1)
                    ctx.set(dut.mem_wr_data, d)
                    ctx.set(dut.mem_wr_strb, s)
                    wbeats.extend(beats_data[1:])
            await slave.step(ctx, dut, cycle)
            want = expect.pop(cycle, None)
            if want is not None and not ctx.get(dut.mem_rd_data_valid):
                out["late"] = True  # the adapter must have flagged it
            elif not out["late"]:
                assert ctx.get(dut.mem_rd_data_valid) == (want is not None), cycle
                if want is not None:
                    assert ctx.get(dut.mem_rd_data) == want, cycle
            await ctx.tick()
            idle = not (todo or wbeats or expect or slave.bs or slave.aws or slave.wq
                        or slave.reads)
            if idle and cycle > busy_until + 4:
                break
        out["cause"] = ctx.get(dut.error_cause)
        assert bool(out["cause"] & AXI_ERR_LATE) == out["late"]

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return out["cause"], ref


# (seed, ready probability, read latency of the slave, expected error_cause): at half the
# bandwidth the slave cannot keep up with back-to-back bursts, and the adapter says so
CASES = [(1, 1.0, 1, 0), (2, 0.7, 2, 0), (4, 0.8, 5, 0), (5, 1.0, 8, 0),
         (3, 0.5, 3, AXI_ERR_LATE)]


@pytest.mark.parametrize("seed, ready_p, latency, want", CASES)
def test_bursts_with_back_pressure(seed, ready_p, latency, want):
    rng = random.Random(seed)
    slave = SlaveMemory(1024, rng, ready_p=ready_p, latency=latency)
    cause, ref = run(random_program(rng), slave, seed=seed)
    assert cause == want
    assert slave.mem == ref  # every write landed, byte strobes respected


def test_slow_slave_is_flagged_late():
    rng = random.Random(7)
    slave = SlaveMemory(1024, rng, latency=CFG.mem_read_latency_cycles + 5)
    prog = [("rd", 0, 2, None), ("rd", 64, 1, None)]
    cause, _ = run(prog, slave, gap_p=0)
    assert cause & AXI_ERR_LATE


def test_error_response_is_flagged():
    rng = random.Random(8)
    slave = SlaveMemory(1024, rng, bresp=2)  # SLVERR
    cause, _ = run([("wr", 0, 1, [(1, 0xf)])], slave, gap_p=0)
    assert cause == AXI_ERR_RESP


def test_stuck_write_channel_overflows():
    rng = random.Random(9)
    slave = SlaveMemory(1024, rng, ready_p=0.0)  # never ready
    prog = [("wr", 16 * k, 4, [(k, 0xf)] * 4) for k in range(12)]
    cause, _ = run(prog, slave, gap_p=0, limit=200)
    assert cause & AXI_ERR_OVERFLOW


def test_checks_parameters():
    with pytest.raises(TypeError, match="cfg must be an HwConfig"):
        AxiMaster("ice40")
    with pytest.raises(ValueError, match="queue_depth=0 must be an int >= 1"):
        AxiMaster(CFG, queue_depth=0)
    with pytest.raises(ValueError, match="may cross a 4 KiB boundary"):
        AxiMaster(preset("default").replace(mem_max_burst_beats=256, log_bus_width=8))


def test_abort_drops_stale_read_beats_and_finishes_a_cut_write_burst():
    """A core reset mid-run (``abort``): a read burst that came back too late never reaches the
    next run, and a write burst cut after 2 of 4 beats is finished with empty beats."""
    dut = AxiMaster(CFG)
    L = CFG.mem_read_latency_cycles
    rng = random.Random(10)
    slave = SlaveMemory(1024, rng, latency=L + 30)  # the first read comes back far too late
    before = bytes(slave.mem)
    seen = {}

    async def bench(ctx):
        async def step(cycle):
            await slave.step(ctx, dut, cycle)
            if ctx.get(dut.mem_rd_data_valid):
                seen[cycle] = ctx.get(dut.mem_rd_data)
            await ctx.tick()
            for s in ("mem_rd_valid", "mem_wr_valid", "mem_wr_data_valid", "abort", "clear"):
                ctx.set(getattr(dut, s), 0)

        cycle = 0
        ctx.set(dut.mem_rd_valid, 1)
        ctx.set(dut.mem_rd_addr, 0)
        ctx.set(dut.mem_rd_beats, 4)
        while cycle < L + 6:  # its beats were due at L .. L + 3: LATE
            await step(cycle)
            cycle += 1
        assert ctx.get(dut.error_cause) & AXI_ERR_LATE
        # a write burst of 4 beats of which the core sends 2, then it is reset
        ctx.set(dut.mem_wr_valid, 1)
        ctx.set(dut.mem_wr_addr, 128)
        ctx.set(dut.mem_wr_beats, 4)
        ctx.set(dut.mem_wr_data_valid, 1)
        ctx.set(dut.mem_wr_data, 0x11111111)
        ctx.set(dut.mem_wr_strb, 0xf)
        await step(cycle)
        cycle += 1
        ctx.set(dut.mem_wr_data_valid, 1)
        ctx.set(dut.mem_wr_data, 0x22222222)
        ctx.set(dut.mem_wr_strb, 0xf)
        ctx.set(dut.abort, 1)
        await step(cycle)
        cycle += 1
        while cycle < 2 * L + 40:  # the late beats arrive now, and are dropped
            await step(cycle)
            cycle += 1
        assert not seen  # none reached the core
        slave.latency = 2
        ctx.set(dut.clear, 1)
        await step(cycle)
        cycle += 1
        start = cycle
        ctx.set(dut.mem_rd_valid, 1)
        ctx.set(dut.mem_rd_addr, 64)
        ctx.set(dut.mem_rd_beats, 1)
        while cycle < start + L + 10:
            await step(cycle)
            cycle += 1
        assert ctx.get(dut.error_cause) == 0
        want = int.from_bytes(before[64:64 + W], "little")
        assert seen.get(start + L) == want, (start + L, seen)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert slave.mem[128:128 + 2 * W] == bytes.fromhex("11111111" "22222222")
    assert slave.mem[128 + 2 * W:128 + 4 * W] == before[128 + 2 * W:128 + 4 * W]
    assert not slave.aws and not slave.wq and not slave.bs  # the burst completed, B taken
