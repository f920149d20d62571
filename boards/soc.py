"""The system on a chip around the core: memory, register block, host bridge, clocks, pins.

* :class:`Ram`: one single-port word RAM: inferred block RAM, or the iCE40's ``SB_SPRAM256KA``
  blocks (instantiated when elaborated for a platform; a behavioural model in simulation).
* :class:`BurstMemory`: serves the core's burst memory interface from a :class:`Ram` with the
  exact timing docs/timing.md §2 defines and ``vta_hw/sim/tb.py`` implements (a read burst
  requested in cycle ``g`` returns beat ``i`` in cycle ``g + L + i``; a write burst requested in
  ``g`` writes its beats in cycles ``g .. g + k - 1``), so a board counts the cycles the
  simulator predicts; and gives a 32-bit host port into the same memory while the core is not
  running.
* :class:`Soc`: :class:`~vtakit.vta_hw.top.Core` (reset by the register block's
  ``core_reset`` through an Amaranth ``ResetInserter``), :class:`~vtakit.vta_hw.csr.CsrBlock`,
  :class:`BurstMemory` and the UART host bridge, with the status outputs for LEDs. Simulatable.
* :class:`BoardTop`: a :class:`Soc` on a :class:`~vtakit.boards.boards.Board`: the clock (a PLL
  where the oscillator differs from the core's clock), the UART pins and the LEDs.

How :class:`BurstMemory` keeps the timing with a one-cycle RAM: every beat (the core's read or
write, in the cycles ``g .. g + k - 1`` its burst holds the port) is one RAM access in that
cycle, so reads and writes never compete for the RAM (single-ported SPRAM is enough); a read
beat's word leaves the RAM one cycle later and waits ``L - 1`` more cycles in a delay line (a
circular buffer in block RAM, written every cycle, read ``L - 2`` entries behind; registers
for ``L <= 2``). A ``k``-beat write at ``g`` makes its data visible to a read beat from
``g + k`` on, as in the bench.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from amaranth.hdl import (
    Array,
    Cat,
    ClockDomain,
    ClockSignal,
    Elaboratable,
    Instance,
    Module,
    Mux,
    ResetInserter,
    Signal,
)
from amaranth.lib import io, memory, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth.lib.wiring import In, Out

from vtakit.boards.boards import Board
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.csr import CsrBlock
from vtakit.vta_hw.top import Core

__all__ = ["Ram", "BurstMemory", "Soc", "BoardTop", "BridgeFactory", "SPRAM_WORDS",
           "SPRAM_BLOCKS", "HOST_WORD_BITS", "BRAM_BANK_WORDS"]

#: :class:`BurstMemory`'s default RAM banks: the ECP5 DP16KD's deepest configuration with a
#: bus word's bits in whole blocks (8,192 x 2), the one yosys maps a 64-bit memory to
BRAM_BANK_WORDS = 8192
#: 16-bit words of one iCE40 ``SB_SPRAM256KA``, and how many a UP5K has
SPRAM_WORDS = 16384
SPRAM_BLOCKS = 4
#: the host bridge's memory word
HOST_WORD_BITS = 32

#: ``factory(clk_hz=..., baud=..., mem_words=...)`` -> a component with the ports of
#: :class:`vtakit.boards.bridge.UartBridge`
BridgeFactory = Callable[..., wiring.Component]


def _log2(n: int) -> int:
    return n.bit_length() - 1


def _positive_int(who: str, name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{who}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{who}: {name}={value} must be at least 1")
    return value


class Ram(wiring.Component):
    """A single-port RAM of ``depth`` words of ``width_bits`` with byte write enables.

    In a cycle with any ``w_en`` bit set it writes those bytes of ``w_data`` at ``addr``;
    otherwise, with ``r_en``, it reads ``addr``, and ``r_data`` holds the word in the next
    cycle (not after a write).

    Parameters
    ----------
    width_bits : int
        A multiple of 8.
    depth : int
        Words.
    kind : str
        ``"bram"``: an Amaranth memory (block RAM). ``"spram"``: iCE40 UP5K ``SB_SPRAM256KA``
        blocks, 16 bits wide and 16,384 deep each, ``width_bits / 16`` side by side and as many
        rows as ``depth`` needs (at most :data:`SPRAM_BLOCKS` in all); instantiated when
        elaborated for a platform, the same behaviour as ``"bram"`` in simulation.
    init : Sequence[int]
        Initial words (simulation and ``bram``; SPRAMs start undefined).
    bank_words : int or None
        ``bram`` only: the RAM in banks of this many words (a power of two), each bank's read
        word registered beside its block RAMs and the word selected from those registers, so
        no path runs from a block RAM's output (slow: the ECP5 block's clock-to-output is
        about 5.6 ns) across the die; ``r_data`` then holds the word two cycles after the
        read (:attr:`read_latency`). ``None``: one cycle, the block RAMs' outputs as they are.
    """

    def __init__(self, width_bits: int, depth: int, kind: str = "bram",
                 init: Sequence[int] = (), bank_words: int | None = None):
        _positive_int("Ram", "width_bits", width_bits)
        _positive_int("Ram", "depth", depth)
        if width_bits % 8:
            raise ValueError(f"Ram: width_bits={width_bits} must be a multiple of 8")
        if kind not in ("bram", "spram"):
            raise ValueError(f"Ram: kind={kind!r} (expected 'bram' or 'spram')")
        if kind == "spram":
            cols = width_bits // 16
            if width_bits % 16 or cols > SPRAM_BLOCKS:
                raise ValueError(f"Ram: an SPRAM memory {width_bits} bits wide is not possible "
                                 f"(expected 16, 32 or 64: {SPRAM_BLOCKS} blocks of 16 bits)")
            rows = -(-depth // SPRAM_WORDS)
            if rows * cols > SPRAM_BLOCKS:
                raise ValueError(f"Ram: {depth} words of {width_bits} bits need "
                                 f"{rows * cols} SPRAMs (expected at most {SPRAM_BLOCKS}: "
                                 f"{SPRAM_BLOCKS * SPRAM_WORDS * 16 // width_bits} words)")
        if len(init) > depth:
            raise ValueError(f"Ram: {len(init)} initial words for a depth of {depth}")
        if bank_words is not None:
            _positive_int("Ram", "bank_words", bank_words)
            if bank_words & (bank_words - 1) or kind != "bram":
                raise ValueError(f"Ram: bank_words={bank_words} for a {kind!r} RAM (expected "
                                 f"a power of two, and kind 'bram')")
        self.width_bits, self.depth, self.kind, self.init = width_bits, depth, kind, list(init)
        self.bank_words = bank_words
        #: cycles from a read to its word on ``r_data``
        self.read_latency = 1 if bank_words is None else 2
        super().__init__({
            "addr": In(range(depth)), "w_en": In(width_bits // 8), "w_data": In(width_bits),
            "r_en": In(1), "r_data": Out(width_bits),
        })

    def elaborate(self, platform):
        if self.kind == "spram" and platform is not None:
            return self._spram()
        m = Module()
        read = self.r_en & (self.w_en == 0)
        if self.bank_words is None:
            self._bank(m, "mem", self.depth, self.init, self.w_en, read, self.r_data)
            return m
        # banks: every bank reads at each read (the select picks the word), the select
        # registered with the read, then delayed a cycle with the banks' registered words
        bw = _log2(self.bank_words)
        n = -(-self.depth // self.bank_words)
        which = Signal(range(max(n, 2)))
        sel, sel_q = Signal.like(which), Signal.like(which)
        if n > 1:
            m.d.comb += which.eq(self.addr[bw:])
        m.d.sync += [sel.eq(which), sel_q.eq(sel)]
        words = []
        for b in range(n):
            lo = b * self.bank_words
            size = min(self.bank_words, self.depth - lo)
            out = Signal(self.width_bits, name=f"bank{b}_r_data")
            self._bank(m, f"bank{b}", size, self.init[lo:lo + size],
                       Mux(which == b, self.w_en, 0), read, out)
            q = Signal(self.width_bits, name=f"bank{b}_r_word", reset_less=True)
            m.d.sync += q.eq(out)
            words.append(q)
        m.d.comb += self.r_data.eq(Array(words)[sel_q] if n > 1 else words[0])
        return m

    def _bank(self, m, name, depth, init, w_en, read, r_data) -> None:
        # a read never coincides with a write (r_en is gated off), so read-during-write
        # behaviour does not matter: no_rw_check spares yosys the read-first logic
        mem = m.submodules[name] = memory.Memory(shape=self.width_bits, depth=depth, init=init,
                                                 attrs={"no_rw_check": 1})
        w = mem.write_port(granularity=8)
        r = mem.read_port()
        addr = self.addr[:max(1, (depth - 1).bit_length())]
        m.d.comb += [w.addr.eq(addr), w.en.eq(w_en), w.data.eq(self.w_data), r.addr.eq(addr),
                     r.en.eq(read), r_data.eq(r.data)]

    def _spram(self) -> Module:
        m = Module()
        cols = self.width_bits // 16
        rows = -(-self.depth // SPRAM_WORDS)
        row_bits = _log2(SPRAM_WORDS)
        row = Signal(range(max(rows, 2)))
        row_q = Signal.like(row)  # the row whose word r_data shows
        m.d.comb += row.eq(self.addr[row_bits:] if rows > 1 else 0)
        with m.If(self.r_en & (self.w_en == 0)):
            m.d.sync += row_q.eq(row)
        outs = []
        for r in range(rows):
            words = []
            for c in range(cols):
                out = Signal(16, name=f"spram_{r}_{c}_out")
                s0, s1 = self.w_en[2 * c], self.w_en[2 * c + 1]
                m.submodules[f"spram_{r}_{c}"] = Instance(
                    "SB_SPRAM256KA",
                    i_ADDRESS=self.addr[:row_bits], i_DATAIN=self.w_data[16 * c:16 * c + 16],
                    i_MASKWREN=Cat(s0, s0, s1, s1), i_WREN=(self.w_en != 0) & (row == r),
                    i_CHIPSELECT=(row == r), i_CLOCK=ClockSignal("sync"), i_STANDBY=0,
                    i_SLEEP=0, i_POWEROFF=1, o_DATAOUT=out)
                words.append(out)
            outs.append(Cat(*words))
        m.d.comb += self.r_data.eq(outs[0])
        for r in range(1, rows):
            with m.If(row_q == r):
                m.d.comb += self.r_data.eq(outs[r])
        return m


class BurstMemory(wiring.Component):
    """The core's DRAM: its burst interface (docs/hardware.md, "Top module") and a 32-bit host
    port, on one :class:`Ram`.

    Core side (the ports of :class:`~vtakit.vta_hw.top.Core` without ``mem_``): ``rd_valid``,
    ``rd_addr``, ``rd_beats`` in; ``rd_data_valid``, ``rd_data`` out (beat ``i`` of a burst
    requested at ``g`` in cycle ``g + L + i``); ``wr_valid``, ``wr_addr``, ``wr_beats``,
    ``wr_data_valid``, ``wr_data``, ``wr_strb`` in (beat ``i`` written in cycle ``g + i``).
    Addresses are taken modulo the memory's size (the driver keeps them in range).

    Host side (the bridge's memory master): ``host_addr`` (byte address of a 32-bit word),
    ``host_w_en`` + ``host_w_data`` + ``host_w_strb``, or ``host_r_en``, held until a cycle
    with ``host_ready``, which takes the request. With ``host_stage`` (the default for a
    ``bram`` memory) the RAM does it in the next cycle, and a read's word comes on
    ``host_r_data`` with ``host_r_valid`` three cycles after the take (registered on its way
    from the RAM); ``host_ready`` is low
    while ``core_running`` is high, in the cycle after, and while a burst of the core is in
    progress, and depends on ``core_running`` and registers only. Without it (the default for
    ``spram``) the RAM does the request in the take's cycle, the word comes in the next, and
    ``host_ready`` is a register: low in the cycle after one with ``core_running`` high and
    while a burst of the core is in progress. A core that still
    moves data after its run ended (an UNFINISHED fault) can lose beats to the host: reset it
    first, as after any fault.

    Parameters
    ----------
    cfg : HwConfig
        Bus width (at least 32 bits), read latency, longest burst.
    size_bytes : int
        Memory size, a multiple of the bus word.
    kind : str
        :class:`Ram` kind.
    init : Sequence[int]
        Initial bus words (simulation, ``bram``).
    host_stage : bool or None
        Register the host's request before the RAM (above); ``None``: for ``bram`` only.
    bank_words : int or None
        With ``host_stage`` on a ``bram`` memory and a read latency of at least 3 (the word
        goes into flip-flops after the RAM anyway), :class:`Ram`'s banks of this many words:
        each block RAM's word registered beside it, the same cycles outside. ``None``: the
        RAM's one-cycle word, registered after the block RAMs' multiplexer.
    """

    def __init__(self, cfg: HwConfig, size_bytes: int, kind: str = "bram",
                 init: Sequence[int] = (), host_stage: bool | None = None,
                 bank_words: int | None = BRAM_BANK_WORDS):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"BurstMemory: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg.validate()
        _positive_int("BurstMemory", "size_bytes", size_bytes)
        if cfg.bus_width_bits < HOST_WORD_BITS:
            raise ValueError(f"BurstMemory: a {cfg.bus_width_bits}-bit bus (log_bus_width="
                             f"{cfg.log_bus_width}) is narrower than the host's "
                             f"{HOST_WORD_BITS}-bit words (expected log_bus_width >= 5)")
        if size_bytes % cfg.bus_bytes:
            raise ValueError(f"BurstMemory: size_bytes={size_bytes} is not a multiple of the "
                             f"{cfg.bus_bytes}-byte bus word")
        self.size_bytes = size_bytes
        self.host_stage = kind == "bram" if host_stage is None else bool(host_stage)
        self.words = size_bytes // cfg.bus_bytes
        banked = (bank_words is not None and self.host_stage and kind == "bram"
                  and cfg.mem_read_latency_cycles >= 3)
        self.ram = Ram(cfg.bus_width_bits, self.words, kind, init,
                       bank_words if banked else None)
        mb, bus = cfg.mem_max_burst_beats, cfg.bus_width_bits
        super().__init__({
            "rd_valid": In(1), "rd_addr": In(32), "rd_beats": In(range(1, mb + 1)),
            "rd_data_valid": Out(1), "rd_data": Out(bus),
            "wr_valid": In(1), "wr_addr": In(32), "wr_beats": In(range(1, mb + 1)),
            "wr_data_valid": In(1), "wr_data": In(bus), "wr_strb": In(bus // 8),
            "core_running": In(1),
            "host_addr": In(32), "host_w_en": In(1), "host_w_data": In(HOST_WORD_BITS),
            "host_w_strb": In(HOST_WORD_BITS // 8), "host_r_en": In(1),
            "host_ready": Out(1), "host_r_data": Out(HOST_WORD_BITS), "host_r_valid": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        ram = m.submodules.ram = self.ram
        L, M = cfg.mem_read_latency_cycles, cfg.mem_max_burst_beats
        # The core's side: with L >= 2 its burst signals are registered first (the RAM is
        # reached a cycle later, so the core's same-cycle request and grant do not run on
        # into the RAM's inputs: the ECP5 build's clock) and the read beats wait a cycle less
        # in the delay line. Reads and writes move together, so a read beat still sees the
        # writes of earlier beats, and the core sees the same cycles.
        core = {name: getattr(self, name) for name in (
            "rd_valid", "rd_addr", "rd_beats", "wr_valid", "wr_addr", "wr_beats",
            "wr_data_valid", "wr_data", "wr_strb")}
        staged = L >= 2
        if staged:
            for name, sig in list(core.items()):
                q = Signal.like(sig, name=f"{name}_q")
                m.d.sync += q.eq(sig)
                core[name] = q
            L -= 1
        wsh = _log2(cfg.bus_bytes)          # byte address -> bus word
        aw = max(1, (self.words - 1).bit_length())

        def word(addr):
            # past the end of a memory whose size is not a power of two: undefined (the
            # bridge and the driver keep addresses in range)
            return addr[wsh:wsh + aw]

        # the burst in progress after its first beat: next beat's word, beats left, kind
        more = Signal()            # a burst has beats left after this cycle's
        more_read = Signal()
        next_word = Signal(aw)
        left = Signal(range(M + 1))
        beat_word = Signal(aw)
        m.d.comb += beat_word.eq(Mux(core["rd_valid"], word(core["rd_addr"]),
                                     Mux(core["wr_valid"], word(core["wr_addr"]), next_word)))
        more_next = Signal()
        with m.If(core["rd_valid"] | core["wr_valid"]):
            beats = Mux(core["rd_valid"], core["rd_beats"], core["wr_beats"])
            m.d.comb += more_next.eq(beats > 1)
            m.d.sync += [more_read.eq(core["rd_valid"]), next_word.eq(beat_word + 1),
                         left.eq(beats - 1)]
        with m.Elif(more):
            m.d.comb += more_next.eq(left > 1)
            m.d.sync += [next_word.eq(next_word + 1), left.eq(left - 1)]
        m.d.sync += more.eq(more_next)
        rd_beat = Signal()
        m.d.comb += rd_beat.eq(core["rd_valid"] | (more & more_read))

        # host port: a 32-bit lane of the bus word
        lanes = cfg.bus_width_bits // HOST_WORD_BITS
        lane = Signal(range(max(lanes, 2)))
        if lanes > 1:
            m.d.comb += lane.eq(self.host_addr[2:wsh])
        ready = Signal()  # no beat of the core in this cycle, unless it starts a burst
        incoming = (self.rd_valid | self.wr_valid) if staged else 0  # a burst for the next cycle
        m.d.sync += ready.eq(~self.core_running & ~more_next & ~incoming)
        # the host's byte strobes in its lane of the bus word (either mode)
        host_strb = Signal(cfg.bus_bytes)
        m.d.comb += host_strb.eq(Mux(self.host_w_en, self.host_w_strb, 0)
                                 << (lane * (HOST_WORD_BITS // 8)))
        # the RAM's inputs for the core's beat of this cycle, when the host has none
        core_to_ram = [ram.addr.eq(beat_word),
                       ram.w_en.eq(Mux(core["wr_data_valid"], core["wr_strb"], 0)),
                       ram.w_data.eq(core["wr_data"]), ram.r_en.eq(rd_beat)]
        # the RAM's word a cycle later, in flip-flops: the staged host port's read word and,
        # where the delay line is a ring of block RAM (below), the ring's input. A banked RAM
        # gives it so (its banks' registers, then their select), the others through a
        # register here
        r_word = Signal.like(ram.r_data)
        banked = ram.read_latency == 2
        if banked:
            m.d.comb += r_word.eq(ram.r_data)
        elif self.host_stage or L - 1 > 3:
            m.d.sync += r_word.eq(ram.r_data)
        if self.host_stage:
            self._host_staged(m, ram, ready, lane, lanes, word, aw, host_strb, core_to_ram,
                              r_word)
        else:
            # on the iCE40's SPRAMs (logic cells run out, the clock is the oscillator's) the
            # RAM does the request in the take's cycle
            m.d.comb += self.host_ready.eq(ready)
            host = Signal()
            m.d.comb += host.eq(ready & (self.host_w_en | self.host_r_en))
            with m.If(host):
                m.d.comb += [ram.addr.eq(word(self.host_addr)), ram.w_en.eq(host_strb),
                             ram.w_data.eq(Cat(*[self.host_w_data] * lanes)),
                             ram.r_en.eq(self.host_r_en & ~self.host_w_en)]
            with m.Else():
                m.d.comb += core_to_ram
            host_read_q = Signal()
            lane_q = Signal.like(lane)
            m.d.sync += [host_read_q.eq(host & self.host_r_en & ~self.host_w_en),
                         lane_q.eq(lane)]
            m.d.comb += [self.host_r_valid.eq(host_read_q),
                         self.host_r_data.eq(ram.r_data.word_select(lane_q, HOST_WORD_BITS))]

        # the core's read beats: valid L cycles after the beat, data through a delay line of
        # L - 1 cycles behind the RAM's one
        valid_line = Signal(L)
        m.d.sync += valid_line.eq(Cat(rd_beat, valid_line[:-1]))
        m.d.comb += self.rd_data_valid.eq(valid_line[-1])
        delay = L - 1
        if delay <= 3:
            stage = r_word if banked else ram.r_data
            for k in range(delay - banked):
                q = Signal.like(ram.r_data, name=f"rd_data_{k}")
                m.d.sync += q.eq(stage)
                stage = q
            m.d.comb += self.rd_data.eq(stage)
        else:
            # The RAM's word registered in flip-flops, then k = delay - 2 cycles in a ring of
            # block RAM, then flip-flops again: no path runs from a block RAM's output, slow
            # as those are, through a long route (the RAM's blocks lie across the die) on into
            # the ring or the core (the ECP5 build's clock). Entry written at t + 2 (the
            # register's word for a beat at t), read at t + L - 2 (its data at t + L - 1,
            # registered at t + L), i.e. L - 4 >= 1 entries behind the write pointer; the ring
            # has at least L - 1 entries, so nothing is overwritten before it is read
            depth = 1 << max(1, (delay - 1).bit_length())
            ring = m.submodules.delay_line = memory.Memory(
                shape=cfg.bus_width_bits, depth=depth, init=[],
                attrs={"ram_style": "block", "no_rw_check": 1})
            wp = Signal(range(depth))
            m.d.sync += wp.eq(wp + 1)
            w = ring.write_port()
            r = ring.read_port()
            m.d.comb += [w.addr.eq(wp), w.data.eq(r_word), w.en.eq(1),
                         r.addr.eq(wp + (depth - (L - 4)) % depth)]
            m.d.sync += self.rd_data.eq(r.data)
        return m

    def _host_staged(self, m, ram, ready, lane, lanes, word, aw, host_strb, core_to_ram,
                     r_word):
        """The host's request registered before the RAM (``host_stage``). A request taken at
        t reaches the RAM at t + 1 from registers of its own, so the host's (the bridge's)
        request logic does not run on into the RAM's inputs, which lie across the die (the
        ECP5 build's clock). The RAM is free at t + 1: no beat of the core at t (ready), so
        no burst goes on, and the core, not running at t, makes no request before t + 2 (its
        first comes the cycle after the start)."""
        cfg = self.cfg
        m.d.comb += self.host_ready.eq(ready & ~self.core_running)
        host = Signal()
        m.d.comb += host.eq(self.host_ready & (self.host_w_en | self.host_r_en))
        h_go, h_read = Signal(), Signal()
        h_word, h_strb = Signal(aw), Signal(cfg.bus_bytes)
        h_data = Signal(cfg.bus_width_bits)
        lane_q, lane_qq = Signal.like(lane), Signal.like(lane)
        m.d.sync += [h_go.eq(host), h_read.eq(host & self.host_r_en & ~self.host_w_en),
                     h_word.eq(word(self.host_addr)), h_strb.eq(host_strb),
                     h_data.eq(Cat(*[self.host_w_data] * lanes)), lane_q.eq(lane),
                     lane_qq.eq(lane_q)]
        with m.If(h_go):
            m.d.comb += [ram.addr.eq(h_word), ram.w_en.eq(h_strb), ram.w_data.eq(h_data),
                         ram.r_en.eq(h_read)]
        with m.Else():
            m.d.comb += core_to_ram
        # the word registered once more on its way to the host (the bridge), r_word: the
        # RAM's block RAM outputs lie across the die from the bridge (the ECP5 build's clock)
        host_read_q, host_read_qq = Signal(), Signal()
        lane_q3 = Signal.like(lane)
        m.d.sync += [host_read_q.eq(h_read), host_read_qq.eq(host_read_q), lane_q3.eq(lane_qq)]
        m.d.comb += [self.host_r_valid.eq(host_read_qq),
                     self.host_r_data.eq(r_word.word_select(lane_q3, HOST_WORD_BITS))]


def _default_bridge(**kwargs) -> wiring.Component:
    try:
        from vtakit.boards.bridge import UartBridge
    except ImportError as err:
        raise ImportError(f"the SoC needs the UART host bridge vtakit.boards.bridge "
                          f"({err})") from None
    return UartBridge(**kwargs)


class Soc(wiring.Component):
    """The core, its register block, its memory and the UART host bridge.

    Parameters
    ----------
    cfg : HwConfig
    clk_hz : int
        The ``sync`` clock (the bridge's bit timing).
    baud : int
        The UART's rate.
    mem_bytes : int
        The core's DRAM (:class:`BurstMemory`).
    mem_kind : str
        :class:`Ram` kind.
    bridge_factory : BridgeFactory or None
        Makes the bridge; None: :class:`vtakit.boards.bridge.UartBridge`.
    mem_init : Sequence[int]
        Initial bus words of the memory (simulation).
    dsp_products : int or None
        :class:`~vtakit.vta_hw.top.Core`'s (GEMM products for DSP blocks; None: all).

    Attributes
    ----------
    rx : In
        UART receive line (synchronised to ``sync`` by the caller: :class:`BoardTop` does).
    tx : Out
        UART transmit line.
    running, done, fault, frame_error : Out
        For LEDs: a run is in progress (from START until the core's ``done`` or a RESET); the
        core's ``done``; its ``fault`` is not 0; the bridge saw a malformed frame since the last
        START or RESET.
    core, csr, memory, bridge :
        The parts (for tests).
    """

    def __init__(self, cfg: HwConfig, *, clk_hz: int, baud: int, mem_bytes: int,
                 mem_kind: str = "bram", bridge_factory: BridgeFactory | None = None,
                 mem_init: Sequence[int] = (), dsp_products: int | None = None):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Soc: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg.validate()
        self.clk_hz = _positive_int("Soc", "clk_hz", clk_hz)
        self.baud = _positive_int("Soc", "baud", baud)
        self.core = Core(cfg, dsp_products=dsp_products)
        self.csr = CsrBlock(cfg)
        self.memory = BurstMemory(cfg, mem_bytes, mem_kind, mem_init)
        factory = bridge_factory or _default_bridge
        self.bridge = factory(clk_hz=clk_hz, baud=baud,
                              mem_words=mem_bytes // (HOST_WORD_BITS // 8))
        super().__init__({"rx": In(1, init=1), "tx": Out(1, init=1), "running": Out(1),
                          "done": Out(1), "fault": Out(1), "frame_error": Out(1)})

    def elaborate(self, platform):
        m = Module()
        core, csr, mem, bridge = self.core, self.csr, self.memory, self.bridge
        m.submodules.core = ResetInserter({"sync": csr.core_reset})(core)
        m.submodules.csr = csr
        m.submodules.memory = mem
        m.submodules.bridge = bridge

        # register block <-> core
        m.d.comb += [core.start.eq(csr.core_start), core.insn_addr.eq(csr.core_insn_addr),
                     core.insn_count.eq(csr.core_insn_count), csr.core_done.eq(core.done),
                     csr.core_cycles.eq(core.cycles), csr.core_fault.eq(core.fault)]
        # core <-> memory
        m.d.comb += [mem.rd_valid.eq(core.mem_rd_valid), mem.rd_addr.eq(core.mem_rd_addr),
                     mem.rd_beats.eq(core.mem_rd_beats),
                     core.mem_rd_data_valid.eq(mem.rd_data_valid),
                     core.mem_rd_data.eq(mem.rd_data),
                     mem.wr_valid.eq(core.mem_wr_valid), mem.wr_addr.eq(core.mem_wr_addr),
                     mem.wr_beats.eq(core.mem_wr_beats),
                     mem.wr_data_valid.eq(core.mem_wr_data_valid),
                     mem.wr_data.eq(core.mem_wr_data), mem.wr_strb.eq(core.mem_wr_strb)]
        # a run: from START to the core's done; RESET ends it too (and wins over a START
        # written with it, as in the core)
        running = Signal()
        with m.If(csr.core_reset):
            m.d.sync += running.eq(0)
        with m.Elif(csr.core_start):
            m.d.sync += running.eq(1)
        with m.Elif(core.done):
            m.d.sync += running.eq(0)
        # the core's first request comes the cycle after start: the memory is the core's from
        # the start pulse on
        busy = Signal()
        m.d.comb += [busy.eq(running | csr.core_start), mem.core_running.eq(busy)]
        # bridge <-> register block, memory
        m.d.comb += [csr.addr.eq(bridge.csr_addr), csr.w_en.eq(bridge.csr_w_en),
                     csr.w_data.eq(bridge.csr_w_data), csr.r_en.eq(bridge.csr_r_en),
                     bridge.csr_r_data.eq(csr.r_data),
                     mem.host_addr.eq(bridge.mem_addr), mem.host_w_en.eq(bridge.mem_w_en),
                     mem.host_w_data.eq(bridge.mem_w_data), mem.host_w_strb.eq(bridge.mem_w_strb),
                     mem.host_r_en.eq(bridge.mem_r_en), bridge.mem_ready.eq(mem.host_ready),
                     bridge.mem_r_data.eq(mem.host_r_data),
                     bridge.mem_r_valid.eq(mem.host_r_valid), bridge.mem_busy.eq(busy),
                     bridge.rx.eq(self.rx), self.tx.eq(bridge.tx)]
        # status
        frame_error = Signal()
        with m.If(csr.core_start | csr.core_reset):
            m.d.sync += frame_error.eq(0)
        with m.Elif(bridge.frame_error):
            m.d.sync += frame_error.eq(1)
        m.d.comb += [self.running.eq(running), self.done.eq(core.done),
                     self.fault.eq(core.fault != 0), self.frame_error.eq(frame_error)]
        return m


class BoardTop(Elaboratable):
    """The top-level design for a board: pass it to the board's platform ``prepare`` / ``build``.

    It makes the ``sync`` clock (the oscillator, or a PLL where the core's clock differs) and
    its reset (held ``POR_US`` µs after configuration, as iCE40 block RAMs read 0 for a few µs,
    and until the PLL locks), synchronises the UART's receive line and drives the LEDs.

    Parameters
    ----------
    board : Board
    cfg : HwConfig
        Usually the board's preset.
    bridge_factory : BridgeFactory or None
        As :class:`Soc`'s.

    Attributes
    ----------
    clk_hz : float
        The core's clock: the board's target, or the fastest a PLL makes below it.
    pll : Ecp5Pll, Ice40Pll or None
        The PLL settings (None: the oscillator clocks the core).
    soc : Soc or None
        The SoC, once elaborated.
    """

    POR_US = 15

    def __init__(self, board: Board, cfg: HwConfig,
                 bridge_factory: BridgeFactory | None = None):
        from vtakit.boards.pll import ecp5_pll, ice40_pll

        if not isinstance(board, Board):
            raise TypeError(f"BoardTop: board must be a Board, got {type(board).__name__}")
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"BoardTop: cfg must be an HwConfig, got {type(cfg).__name__}")
        if board.export_only or board.uart is None:
            raise ValueError(f"board {board.name!r} has no open-toolchain SoC (expected a "
                             f"board with a UART; Zynq boards are built with Vivado)")
        self.board, self.cfg = board, cfg.validate()
        self.bridge_factory = bridge_factory
        target_hz = board.target_mhz(cfg.clock_mhz) * 1e6
        osc_hz = board.oscillator[1]
        self.pll = None
        if abs(target_hz - osc_hz) > 1e-6 * osc_hz:
            pll_of = {"ecp5": ecp5_pll, "ice40": ice40_pll}[board.family]
            self.pll = pll_of(osc_hz, target_hz)
        self.clk_hz = self.pll.f_out_hz if self.pll is not None else osc_hz
        self.soc: Soc | None = None

    def _clock(self, m: Module, platform) -> None:
        """The ``sync`` domain: clock from the oscillator or the PLL, reset from a power-on
        counter and the PLL's lock."""
        osc = m.submodules.osc_buffer = io.Buffer(
            "i", platform.request(self.board.oscillator[0], 0, dir="-"))
        m.domains.sync = ClockDomain("sync")
        # a Signal (not a ClockSignal) can carry a constraint; with a PLL it does, and `keep`
        # holds its name through synthesis, where nextpnr looks for it (without, nextpnr warns
        # that the net does not exist and derives the constraint from the PLL's settings)
        clk = Signal(name="core_clk", attrs={"keep": 1} if self.pll is not None else {})
        m.d.comb += ClockSignal("sync").eq(clk)
        locked = Signal(init=1)
        p = self.pll
        if p is None:
            m.d.comb += clk.eq(osc.i)
        elif self.board.family == "ecp5":
            m.submodules.pll = Instance(
                "EHXPLLL",
                a_FREQUENCY_PIN_CLKI=f"{p.f_in_hz / 1e6:g}",
                a_FREQUENCY_PIN_CLKOP=f"{p.f_out_hz / 1e6:g}",
                a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
                a_MFG_GMCREF_SEL="2",
                p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
                p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA",
                p_CLKI_DIV=p.clki_div, p_CLKFB_DIV=p.clkfb_div, p_CLKOP_ENABLE="ENABLED",
                p_CLKOP_DIV=p.clkop_div, p_CLKOP_CPHASE=p.clkop_div - 1, p_CLKOP_FPHASE=0,
                p_FEEDBK_PATH="CLKOP",
                i_CLKI=osc.i, i_CLKFB=clk, i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0,
                i_PHASEDIR=1, i_PHASESTEP=1, i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0,
                o_CLKOP=clk, o_LOCK=locked)
        else:
            m.submodules.pll = Instance(
                "SB_PLL40_CORE",
                p_FEEDBACK_PATH="SIMPLE", p_DIVR=p.divr, p_DIVF=p.divf, p_DIVQ=p.divq,
                p_FILTER_RANGE=p.filter_range,
                i_REFERENCECLK=osc.i, i_RESETB=1, i_BYPASS=0, o_PLLOUTGLOBAL=clk,
                o_LOCK=locked)
        if p is not None:
            platform.add_clock_constraint(clk, self.clk_hz)
        # power-on reset, in a reset-less domain on the same clock (FPGA flip-flops start at
        # their init values)
        m.domains.por = ClockDomain("por", reset_less=True)
        m.d.comb += ClockSignal("por").eq(clk)
        delay = max(1, round(self.POR_US * 1e-6 * self.clk_hz))
        count = Signal(range(delay + 1))
        with m.If(count != delay):
            m.d.por += count.eq(count + 1)
        m.submodules.reset_sync = ResetSynchronizer(~locked | (count != delay), domain="sync")

    def elaborate(self, platform):
        if platform is None:
            raise ValueError("BoardTop needs a platform (use Soc in simulation)")
        m = Module()
        self._clock(m, platform)
        board = self.board
        soc = self.soc = Soc(self.cfg, clk_hz=round(self.clk_hz), baud=board.baud,
                             mem_bytes=board.memory.size_bytes, mem_kind=board.memory.kind,
                             bridge_factory=self.bridge_factory,
                             dsp_products=board.gemm_dsp_products(self.cfg))
        m.submodules.soc = soc
        uart = platform.request(*board.uart, dir="-")
        rx = m.submodules.rx_buffer = io.Buffer("i", uart.rx)
        tx = m.submodules.tx_buffer = io.Buffer("o", uart.tx)
        m.submodules.rx_sync = FFSynchronizer(rx.i, soc.rx, init=1)
        m.d.comb += tx.o.eq(soc.tx)
        requested: dict[tuple[str, int], object] = {}
        for state, where in board.leds.items():
            key = (where[0], where[1])
            if key not in requested:
                requested[key] = platform.request(*key, dir="-")
            port = requested[key]
            if len(where) == 3:
                port = getattr(port, where[2])
            led = m.submodules[f"led_{state}"] = io.Buffer("o", port)
            m.d.comb += led.o.eq(getattr(soc, state))
        return m
