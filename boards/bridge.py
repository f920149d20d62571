"""The UART host bridge: the board end of :mod:`vtakit.vta_hw.bridge_protocol`, a master on the
SoC's memory and on the core's register block (docs/boards.md, "UART host bridge").

One request at a time, in four phases: receive (each byte of the frame after SYNC goes straight
into its lane of a word buffer of ``max_payload`` bytes plus the header and the address, a
block RAM, while the CRC processor checks it), decide (the status, from the buffer's address
and count words and registers), execute (writes from the buffer) and answer (the response goes
out through the same CRC processor, restarted; each word a read returns is read from memory or
the register bus just before it is sent). Nothing reaches memory or a register before the CRC
matched. The CRC processor is an ``amaranth.lib.crc`` processor of
:data:`~vtakit.vta_hw.bridge_protocol.CRC_ALGORITHM`, the algorithm the host computes.

Sized for the iCE40 UP5K, where the core leaves little room: one CRC processor, no word
assembly register (bytes are written into their lane), no read-first logic on the buffer, reads
sent from one word register instead of the buffer, counters as wide as their largest value,
comparisons with constants as logic rather than carry chains, and the inter-byte timer's sign
bit as its timeout.
"""

from __future__ import annotations

import math

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal, Value
from amaranth.lib import crc, memory, wiring
from amaranth.lib.wiring import In, Out

from vtakit.boards.uart import UartRx, UartTx, uart_divisor
from vtakit.vta_hw import bridge_protocol as p
from vtakit.vta_hw.csr import CsrAddr

__all__ = ["UartBridge", "bridge_ports"]


def bridge_ports() -> dict:
    """The bridge's ports (its ``wiring`` signature members): what an SoC connects to, and
    what a stand-in bridge must have."""
    return {
        "rx": In(1, init=1), "tx": Out(1, init=1),
        "mem_addr": Out(32), "mem_w_en": Out(1), "mem_w_data": Out(32),
        "mem_w_strb": Out(4), "mem_r_en": Out(1), "mem_ready": In(1),
        "mem_r_data": In(32), "mem_r_valid": In(1), "mem_busy": In(1),
        "csr_addr": Out(8), "csr_w_en": Out(1), "csr_w_data": Out(32), "csr_r_en": Out(1),
        "csr_r_data": In(32),
        "frame_error": Out(1), "active": Out(1),
    }

#: Fewest characters (10 bits each) of line silence the inter-byte timeout may be: a frame's
#: bytes arrive 1 character apart when back to back, so 2 leave room for a late one.
MIN_TIMEOUT_CHARS = 3


class UartBridge(wiring.Component):
    """Bridge from a UART to a 32-bit memory master and the core's register bus.

    Parameters
    ----------
    clk_hz : int
        The ``sync`` clock.
    baud : int
        The line rate (``round(clk_hz / baud)`` clock cycles per bit, at least 4, within 2%).
    mem_words : int
        32-bit words of memory behind ``mem_*``: a memory command that touches a word at or past
        it is answered OUT_OF_RANGE.
    max_payload : int
        Most data bytes of one WRITE_MEM or READ_MEM (the buffer's size), a multiple of 4 in
        32..4096.
    timeout_s : float
        Inter-byte timeout: a frame in which the line stays quiet this long is TRUNCATED, and a
        rejected frame is answered once the line has been quiet this long. At least 3
        characters; the default 10 ms covers the gaps of USB serial adapters.

    Attributes
    ----------
    rx : In(1)
        The serial line from the host (idles high).
    tx : Out(1)
        The serial line to the host (idles high).
    mem_addr, mem_w_en, mem_w_data, mem_w_strb, mem_r_en : Out
        The memory master: a word-aligned byte address; a write (``mem_w_strb`` is always
        ``0b1111``) or a read request, held until ``mem_ready``.
    mem_ready : In(1)
        The memory takes the request held on ``mem_w_en`` / ``mem_r_en`` in this cycle.
    mem_r_data, mem_r_valid : In
        The data of a taken read, one or more cycles later (the bridge has one read
        outstanding at a time).
    mem_busy : In(1)
        The core is running: memory commands are answered BUSY without touching memory.
    csr_addr, csr_w_en, csr_w_data, csr_r_en : Out
        The register bus of :class:`vtakit.vta_hw.csr.CsrBlock` (one-cycle strobes).
    csr_r_data : In(32)
        The register read in the previous cycle.
    frame_error : Out(1)
        A one-cycle pulse when a request is answered with a status other than OK (stretch it
        for an LED).
    active : Out(1)
        A request is being received, executed or answered.
    """

    def __init__(self, clk_hz: int, baud: int, mem_words: int,
                 max_payload: int = p.DEFAULT_MAX_PAYLOAD, *, timeout_s: float = 0.01):
        self.divisor = uart_divisor(clk_hz, baud)
        if isinstance(mem_words, bool) or not isinstance(mem_words, int) \
                or not 1 <= mem_words <= 1 << 30:
            raise ValueError(f"UartBridge: mem_words={mem_words!r}; expected an int in "
                             f"1..2**30 (32-bit words behind a 32-bit byte address)")
        try:
            self.max_payload = p.check_max_payload(max_payload)
        except ValueError as err:
            raise ValueError(f"UartBridge: {err}") from None
        self.timeout_cycles = math.ceil(timeout_s * clk_hz)
        least = MIN_TIMEOUT_CHARS * 10 * self.divisor
        if self.timeout_cycles < least:
            raise ValueError(f"UartBridge: timeout_s={timeout_s!r} is {self.timeout_cycles} "
                             f"cycles at {clk_hz} Hz; expected at least {least} "
                             f"({MIN_TIMEOUT_CHARS} characters of {10 * self.divisor} cycles)")
        self.clk_hz, self.baud, self.mem_words = clk_hz, baud, mem_words
        super().__init__(bridge_ports())

    def elaborate(self, platform):
        m = Module()
        max_words = self.max_payload // 4
        # word-address bits kept (at least 6: the CSR addresses 0x00..0xfc); the bits above
        # only matter as "any set", which puts the address out of range
        aw = min(max((self.mem_words - 1).bit_length(), 6), 30)
        m.submodules.uart_rx = rx = UartRx(self.divisor)
        m.submodules.uart_tx = tx = UartTx(self.divisor)
        # one CRC processor: it checks the request, then (restarted) makes the response's CRC.
        # It is restarted through its reset (the CRC register's reset value is the initial
        # CRC), not its start input: start folds a multiplexer into every bit's XOR network.
        algorithm = getattr(crc.catalog, p.CRC_ALGORITHM)
        crc_ = crc.Processor(algorithm(data_width=8))
        crc_restart = Signal()
        m.submodules.crc = ResetInserter(crc_restart)(crc_)
        # the request as it arrived: word i of the frame after SYNC (0: CMD SEQ LEN, 1: the
        # address, 2..: the data or READ_MEM's count) in buffer word i, each byte written
        # straight into its lane. No word is read in a cycle it is written, so the read port
        # need not return the old word on a collision (no_rw_check): otherwise yosys builds
        # read-first logic around the block RAM (a register per data bit and a bypass).
        m.submodules.buf = buf = memory.Memory(shape=32, depth=max_words + 2, init=[],
                                               attrs={"no_rw_check": 1})
        wp, rp = buf.write_port(granularity=8), buf.read_port()
        m.d.comb += [rx.line.eq(self.rx), self.tx.eq(tx.line)]
        byte, got = rx.o.payload, rx.o.valid

        # inter-byte timer: counts down from the last byte (or framing error); negative once
        # the line has been quiet for timeout_cycles (the sign bit says so: no comparator)
        quiet = Signal(range(-1, self.timeout_cycles), init=-1)
        timed_out = quiet[-1]
        with m.If(got | rx.error):
            m.d.sync += quiet.eq(self.timeout_cycles - 1)
        with m.Elif(~timed_out):
            m.d.sync += quiet.eq(quiet - 1)

        cmd, seq, status = Signal(8), Signal(8), Signal(4)
        last_seq, last_valid = Signal(8), Signal()
        # the request's bytes after SYNC; in the answer, 2 + the bytes sent (so that payload
        # bytes start at a multiple of 4)
        pos = Signal(range(4 + 4 * (max_words + 1) + p.CRC_BYTES + 1))
        words = Signal(max(6, (max_words + 1).bit_length()))  # LEN / 4 (LEN_lo's 6 first)
        len_odd = Signal()                        # LEN is not a multiple of 4
        # the address (payload word 0): the word address of the next access, and flags
        cur = Signal(aw)
        misaligned = Signal()                     # bit 0 or 1 set
        addr_high = Signal()                      # a bit above the word address set
        not_csr = Signal()                        # a bit from 8 up set: past the registers
        # words the memory command moves (decide, write), then words still to answer
        left = Signal(range(max(max_words, p.ID_WORDS) + 1))
        count_ok = Signal()                       # READ_MEM's count is 1..max_words
        k = Signal(range(max_words + 2))          # the buffer word on the read port next cycle
        txw = Signal(32)                          # the response word being sent

        is_cmd = {c: cmd == c for c in p.Command}
        is_mem = is_cmd[p.Command.WRITE_MEM] | is_cmd[p.Command.READ_MEM]
        is_csr = is_cmd[p.Command.WRITE_CSR] | is_cmd[p.Command.READ_CSR]
        is_write = is_cmd[p.Command.WRITE_MEM] | is_cmd[p.Command.WRITE_CSR]
        known = Cat(is_cmd.values()).any()
        length_ok = Signal()
        with m.Switch(cmd):
            with m.Case(p.Command.WRITE_MEM):
                m.d.comb += length_ok.eq(words[1:].any())  # at least 2
            with m.Case(p.Command.READ_MEM):
                m.d.comb += length_ok.eq((words == 2) & count_ok)
            with m.Case(p.Command.WRITE_CSR):
                m.d.comb += length_ok.eq(words == 2)
            with m.Case(p.Command.READ_CSR):
                m.d.comb += length_ok.eq(words == 1)
            with m.Case(p.Command.ID):
                m.d.comb += length_ok.eq(words == 0)

        # received bytes go into their lane of buffer word pos / 4 (in HEADER and PAYLOAD)
        store = Signal()
        m.d.comb += [wp.addr.eq(pos[2:]), wp.data.eq(Cat(byte, byte, byte, byte)),
                     wp.en.eq(Cat(store & (pos[:2] == i) for i in range(4))),
                     rp.addr.eq(k)]
        # the memory and register masters: the address is cur's, the data buffer word k's
        m.d.comb += [self.mem_addr.eq(Cat(Const(0, 2), cur)), self.mem_w_strb.eq(0b1111),
                     self.mem_w_data.eq(rp.data), self.csr_addr.eq(Cat(Const(0, 2), cur)),
                     self.csr_w_data.eq(rp.data)]

        # the answer's bytes: the header (pos 2..7), the payload (lane pos % 4 of txw, or of
        # one of ID's constant words while left is 5, 4, 3), the CRC
        header, body, out = Signal(8), Signal(8), Signal(8)
        resp_len = Cat(Const(0, 2), left)
        with m.Switch(pos[:3]):
            for i, v in enumerate((p.RESPONSE_SYNC, cmd, seq, status, resp_len[:8],
                                   resp_len[8:16])):
                with m.Case(2 + i):
                    m.d.comb += header.eq(v)
        id_const = is_cmd[p.Command.ID] & ~_at_most(left, p.ID_WORDS - 3)
        m.d.comb += body.eq(txw.word_select(pos[:2], 8))
        with m.If(is_cmd[p.Command.ID]):
            for i, v in enumerate((p.PROTOCOL_VERSION, self.max_payload, self.mem_words)):
                with m.If(left == p.ID_WORDS - i):
                    m.d.comb += body.eq(Const(v, 32).word_select(pos[:2], 8))
        sending = Signal()
        m.d.comb += [tx.i.payload.eq(out), tx.i.valid.eq(sending),
                     crc_.data.eq(Mux(sending, out, byte))]
        m.d.sync += self.frame_error.eq(0)

        def fail(code: p.Status, state: str) -> None:
            m.d.sync += status.eq(code)
            m.next = state

        def line_trouble() -> None:
            """A framing error or a quiet line inside a frame."""
            with m.Elif(rx.error):
                fail(p.Status.LINE_ERROR, "DISCARD")
            with m.Elif(timed_out):
                fail(p.Status.TRUNCATED, "RESPOND")

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(got | rx.error):
                    m.d.sync += [cmd.eq(0), seq.eq(0), pos.eq(0), k.eq(1)]
                with m.If(got):
                    with m.If(byte == p.REQUEST_SYNC):
                        m.d.comb += crc_restart.eq(1)
                        m.next = "HEADER"
                    with m.Else():
                        fail(p.Status.BAD_SYNC, "DISCARD")
                with m.Elif(rx.error):
                    fail(p.Status.LINE_ERROR, "DISCARD")

            # ---- receive: the CRC register takes every byte after SYNC ------------------
            with m.State("HEADER"):  # CMD SEQ LEN_lo LEN_hi
                m.d.comb += [crc_.valid.eq(got), store.eq(got)]
                with m.If(got):
                    m.d.sync += pos.eq(pos + 1)
                    with m.Switch(pos[:2]):
                        with m.Case(0):
                            m.d.sync += cmd.eq(byte)
                        with m.Case(1):
                            m.d.sync += seq.eq(byte)
                        with m.Case(2):
                            m.d.sync += [words.eq(byte[2:]), len_odd.eq(byte[:2].any())]
                        with m.Case(3):
                            length_words = Cat(words[:6], byte)
                            m.d.sync += words.eq(length_words)
                            with m.If(len_odd | ~_at_most(length_words, max_words + 1)):
                                fail(p.Status.BAD_LENGTH, "DISCARD")
                            with m.Elif(length_words == 0):
                                m.next = "CRC"
                            with m.Else():
                                m.next = "PAYLOAD"
                line_trouble()

            with m.State("PAYLOAD"):  # LEN bytes: words 1 .. LEN / 4 of the frame
                m.d.comb += [crc_.valid.eq(got), store.eq(got)]
                with m.If(got):
                    m.d.sync += pos.eq(pos + 1)
                    with m.If((pos[:2] == 3) & (pos[2:] == words)):
                        m.next = "CRC"
                line_trouble()

            with m.State("CRC"):
                m.d.comb += crc_.valid.eq(got)
                with m.If(got):
                    m.d.sync += pos.eq(pos + 1)
                    with m.If(pos[0]):  # the second CRC byte (the first is at a multiple of 4)
                        m.d.sync += k.eq(2)
                        m.next = "CHECK"
                line_trouble()

            # ---- decide: nothing has been executed yet ------------------------------------
            # The read port shows the word k had a cycle before: buffer word 1 (k = 1 from
            # IDLE on) in CHECK, word 2 in COUNT. Words the frame did not carry read as stale
            # buffer words; the length check rejects every command that would use them.
            with m.State("CHECK"):  # the CRC register has taken the last byte
                addr = rp.data
                m.d.sync += [cur.eq(addr[2:2 + aw]), misaligned.eq(addr[:2].any()),
                             addr_high.eq(addr[2 + aw:].any()), not_csr.eq(addr[8:].any())]
                with m.If(crc_.match_detected):
                    m.next = "COUNT"
                with m.Else():
                    fail(p.Status.BAD_CRC, "DISCARD")
            with m.State("COUNT"):
                count = rp.data
                m.d.sync += count_ok.eq(count.any() & _at_most(count, max_words))
                with m.Switch(cmd):
                    with m.Case(p.Command.READ_MEM):
                        m.d.sync += left.eq(count)
                    with m.Case(p.Command.READ_CSR):
                        m.d.sync += left.eq(1)
                    with m.Case(p.Command.ID):
                        m.d.sync += left.eq(p.ID_WORDS)
                    with m.Default():  # WRITE_MEM: the data words (WRITE_CSR answers none)
                        m.d.sync += left.eq(words - 1)
                m.next = "DECIDE"
            with m.State("DECIDE"):
                with m.If(~known):
                    fail(p.Status.BAD_COMMAND, "RESPOND")
                with m.Elif(~length_ok):
                    fail(p.Status.BAD_LENGTH, "RESPOND")
                with m.Elif((is_mem | is_csr) & misaligned):
                    fail(p.Status.MISALIGNED, "RESPOND")
                with m.Elif(is_mem & (addr_high | ~_at_most(cur + left, self.mem_words))):
                    fail(p.Status.OUT_OF_RANGE, "RESPOND")
                with m.Elif(is_csr & not_csr):
                    fail(p.Status.OUT_OF_RANGE, "RESPOND")
                with m.Elif(is_mem & self.mem_busy):
                    fail(p.Status.BUSY, "RESPOND")
                with m.Elif(is_write & last_valid & (seq == last_seq)):
                    fail(p.Status.OK, "RESPOND")  # a resent write that was executed: ack only
                with m.Else():
                    m.d.sync += [status.eq(p.Status.OK), last_seq.eq(seq), last_valid.eq(1)]
                    with m.Switch(cmd):
                        with m.Case(p.Command.WRITE_MEM):
                            m.next = "WRITE"
                        with m.Case(p.Command.WRITE_CSR):
                            m.next = "CSR_WRITE"
                        with m.Case(p.Command.ID):
                            # words 3 and 4 are the registers HW_VER and HW_ID, read through
                            # cur as READ_CSR's register is
                            m.d.sync += cur.eq(CsrAddr.HW_VER >> 2)
                            m.next = "RESPOND"
                        with m.Default():  # the reads execute while the answer is sent
                            m.next = "RESPOND"

            with m.State("DISCARD"):  # drop the rest of a rejected frame, then answer
                with m.If(timed_out):
                    m.next = "RESPOND"

            # ---- execute the writes ---------------------------------------------------------
            # buffer word k is on the read port from the cycle after k changed
            with m.State("WRITE_FETCH"):
                m.next = "WRITE"
            with m.State("WRITE"):
                m.d.comb += self.mem_w_en.eq(1)
                with m.If(self.mem_ready):
                    m.d.sync += [k.eq(k + 1), cur.eq(cur + 1), left.eq(left - 1)]
                    with m.If(left == 1):
                        m.next = "RESPOND"
                    with m.Else():
                        m.next = "WRITE_FETCH"
            with m.State("CSR_WRITE"):  # the value is buffer word 2 (k = 2)
                m.d.comb += self.csr_w_en.eq(1)
                m.next = "RESPOND"

            # ---- answer: SYNC CMD SEQ STATUS LEN_lo LEN_hi PAYLOAD CRC_hi CRC_lo ----------
            # The reads execute here, each word just before it is sent: nothing else can
            # start the core or use the memory while the bridge answers. After taking a byte
            # the transmitter is busy for a whole character (10 bits of at least 4 cycles),
            # so the CRC register, a cycle late, is current long before the next byte.
            with m.State("RESPOND"):
                m.d.comb += crc_restart.eq(1)
                m.d.sync += [pos.eq(2), self.frame_error.eq(status != p.Status.OK)]
                with m.If((status != p.Status.OK) | is_write):
                    m.d.sync += left.eq(0)
                m.next = "TX_HEADER"
            with m.State("TX_HEADER"):
                m.d.comb += [out.eq(header), sending.eq(1)]
                with m.If(tx.i.ready):
                    m.d.comb += crc_.valid.eq(pos[:3] != 2)  # not SYNC
                    m.d.sync += pos.eq(pos + 1)
                    with m.If(pos[:3] == 7):
                        with m.If(left == 0):
                            m.next = "TX_CRC"
                        with m.Else():
                            m.next = "FETCH"
            with m.State("FETCH"):  # the next payload word
                with m.If(is_cmd[p.Command.READ_MEM]):
                    m.d.comb += self.mem_r_en.eq(1)
                    with m.If(self.mem_ready):
                        m.d.sync += cur.eq(cur + 1)
                        m.next = "READ_DATA"
                with m.Elif(id_const):
                    m.next = "TX_BODY"
                with m.Else():
                    m.d.comb += self.csr_r_en.eq(1)
                    m.d.sync += cur.eq(cur + 1)
                    m.next = "READ_DATA"
            with m.State("READ_DATA"):  # a memory word 1 or more cycles later, a register 1
                with m.If(~is_cmd[p.Command.READ_MEM]):
                    m.d.sync += txw.eq(self.csr_r_data)
                    m.next = "TX_BODY"
                with m.Elif(self.mem_r_valid):
                    m.d.sync += txw.eq(self.mem_r_data)
                    m.next = "TX_BODY"
            with m.State("TX_BODY"):
                m.d.comb += [out.eq(body), sending.eq(1)]
                with m.If(tx.i.ready):
                    m.d.comb += crc_.valid.eq(1)
                    m.d.sync += pos.eq(pos + 1)
                    with m.If(pos[:2] == 3):
                        m.d.sync += left.eq(left - 1)
                        with m.If(left == 1):
                            m.next = "TX_CRC"
                        with m.Else():
                            m.next = "FETCH"
            with m.State("TX_CRC"):  # the first CRC byte is at a multiple of 4
                m.d.comb += [out.eq(Mux(pos[0], crc_.crc[:8], crc_.crc[8:])), sending.eq(1)]
                with m.If(tx.i.ready):
                    m.d.sync += pos.eq(pos + 1)
                    with m.If(pos[0]):
                        m.next = "IDLE"

        m.d.comb += self.active.eq(~fsm.ongoing("IDLE"))
        return m


def _at_most(value: Value, bound: int) -> Value:
    """``value <= bound`` (unsigned) for a constant ``bound``, as plain logic: yosys maps an
    ordered comparison to a carry chain, a logic cell per bit, where this folds into a few
    LUTs."""
    if bound < 0:
        return Const(0)
    result: Value = Const(1)  # the bits below i are at most bound's
    for i in range(len(value)):
        result = (~value[i] | result) if (bound >> i) & 1 else (~value[i] & result)
    return result | Const(int(bound >> len(value) != 0))
