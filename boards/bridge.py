"""The UART host bridge: the board end of :mod:`vtakit.vta_hw.bridge_protocol`, a master on the
SoC's memory and on the core's register block (docs/boards.md, "UART host bridge").

One request at a time, in four phases: receive (the frame's payload goes into a word buffer of
``max_payload`` bytes, a block RAM, while a CRC engine checks it), decide (the status, from
registers only), execute (memory or register accesses; reads fill the same buffer) and answer
(the response streams out of the buffer through a second CRC engine). Nothing reaches memory
or a register before the CRC matched. Both CRC engines are ``amaranth.lib.crc`` processors of
:data:`~vtakit.vta_hw.bridge_protocol.CRC_ALGORITHM`, the algorithm the host computes.
"""

from __future__ import annotations

import math

from amaranth.hdl import Cat, Const, Module, Mux, Signal
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
        The data of a taken read, any number of cycles later, in order.
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
        aw = min(max(self.mem_words.bit_length(), 6), 30)
        m.submodules.uart_rx = rx = UartRx(self.divisor)
        m.submodules.uart_tx = tx = UartTx(self.divisor)
        algorithm = getattr(crc.catalog, p.CRC_ALGORITHM)
        m.submodules.crc_rx = crc_rx = crc.Processor(algorithm(data_width=8))
        m.submodules.crc_tx = crc_tx = crc.Processor(algorithm(data_width=8))
        m.submodules.buf = buf = memory.Memory(shape=32, depth=max_words, init=[])
        wp, rp = buf.write_port(), buf.read_port()
        m.d.comb += [rx.line.eq(self.rx), self.tx.eq(tx.line)]

        byte, got = rx.o.payload, rx.o.valid
        m.d.comb += [crc_rx.data.eq(byte), self.mem_w_strb.eq(0b1111)]

        # inter-byte timer: cycles since the last byte (or framing error), saturating
        quiet = Signal(range(self.timeout_cycles + 1))
        timed_out = quiet == self.timeout_cycles
        with m.If(got | rx.error):
            m.d.sync += quiet.eq(0)
        with m.Elif(~timed_out):
            m.d.sync += quiet.eq(quiet + 1)

        # the request, as received
        cmd, seq, len_lo = Signal(8), Signal(8), Signal(8)
        status = Signal(4)
        hdr_idx, byte_pos = Signal(2), Signal(2)
        widx = Signal(range(max_words + 2))       # payload words received
        wleft = Signal(range(max_words + 2))      # payload words still to come
        shreg = Signal(24)                        # the first bytes of the word being received
        addr = Signal(aw + 2)                     # payload word 0, its low bits ...
        addr_high = Signal()                      # ... and whether any bit above them is set
        count = Signal(range(max_words + 1))      # payload word 1 (READ_MEM's count) ...
        count_ok = Signal()                       # ... and whether it is 1..max_words
        crc_idx = Signal()
        last_seq, last_valid = Signal(8), Signal()
        # execution
        n = Signal(range(max_words + 1))          # words the memory command moves
        cur = Signal(aw)                          # word address of the next memory access
        k = Signal(range(max_words + 1))          # buffer index (0 until execution)
        todo = Signal(range(max_words + 1))       # READ_MEM: reads not yet taken
        pend = Signal(range(max_words + 1))       # writes not taken / read data not arrived
        # the response
        resp_words = Signal(range(max(max_words, p.ID_WORDS) + 1))
        hidx = Signal(3)
        tx_word, tx_byte = Signal(range(max(max_words, p.ID_WORDS))), Signal(2)

        word = Cat(shreg, byte)  # the payload word completed by this byte
        is_mem = (cmd == p.Command.WRITE_MEM) | (cmd == p.Command.READ_MEM)
        is_csr = (cmd == p.Command.WRITE_CSR) | (cmd == p.Command.READ_CSR)
        is_write = (cmd == p.Command.WRITE_MEM) | (cmd == p.Command.WRITE_CSR)
        known = Cat(cmd == c for c in p.Command).any()
        m.d.comb += n.eq(Mux(cmd == p.Command.READ_MEM, count, widx - 1))
        length_ok = Signal()
        with m.Switch(cmd):
            with m.Case(p.Command.WRITE_MEM):
                m.d.comb += length_ok.eq(widx >= 2)
            with m.Case(p.Command.READ_MEM):
                m.d.comb += length_ok.eq((widx == 2) & count_ok)
            with m.Case(p.Command.WRITE_CSR):
                m.d.comb += length_ok.eq(widx == 2)
            with m.Case(p.Command.READ_CSR):
                m.d.comb += length_ok.eq(widx == 1)
            with m.Case(p.Command.ID):
                m.d.comb += length_ok.eq(widx == 0)

        m.d.comb += [rp.addr.eq(k), self.mem_addr.eq(Cat(Const(0, 2), cur)),
                     self.mem_w_data.eq(rp.data), self.csr_w_data.eq(rp.data)]
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
                    m.d.sync += [cmd.eq(0), seq.eq(0), hdr_idx.eq(0), widx.eq(0),
                                 byte_pos.eq(0), crc_idx.eq(0), k.eq(0), resp_words.eq(0)]
                with m.If(got):
                    with m.If(byte == p.REQUEST_SYNC):
                        m.d.comb += crc_rx.start.eq(1)
                        m.next = "HEADER"
                    with m.Else():
                        fail(p.Status.BAD_SYNC, "DISCARD")
                with m.Elif(rx.error):
                    fail(p.Status.LINE_ERROR, "DISCARD")

            with m.State("HEADER"):  # CMD SEQ LEN_lo LEN_hi
                m.d.comb += crc_rx.valid.eq(got)
                with m.If(got):
                    m.d.sync += hdr_idx.eq(hdr_idx + 1)
                    with m.Switch(hdr_idx):
                        with m.Case(0):
                            m.d.sync += cmd.eq(byte)
                        with m.Case(1):
                            m.d.sync += seq.eq(byte)
                        with m.Case(2):
                            m.d.sync += len_lo.eq(byte)
                        with m.Case(3):
                            length = Cat(len_lo, byte)
                            m.d.sync += wleft.eq(length[2:])
                            with m.If((length[:2] != 0) | (length > 4 + self.max_payload)):
                                fail(p.Status.BAD_LENGTH, "DISCARD")
                            with m.Elif(length == 0):
                                m.next = "CRC"
                            with m.Else():
                                m.next = "PAYLOAD"
                line_trouble()

            with m.State("PAYLOAD"):  # little-endian words: 0 addr, 1.. into the buffer
                m.d.comb += crc_rx.valid.eq(got)
                with m.If(got):
                    m.d.sync += [byte_pos.eq(byte_pos + 1), shreg.eq(Cat(shreg[8:], byte))]
                    with m.If(byte_pos == 3):
                        m.d.sync += [widx.eq(widx + 1), wleft.eq(wleft - 1)]
                        with m.If(widx == 0):
                            m.d.sync += [addr.eq(word), addr_high.eq(word[aw + 2:].any())]
                        with m.Else():
                            m.d.comb += [wp.en.eq(1), wp.addr.eq(widx - 1), wp.data.eq(word)]
                        with m.If(widx == 1):
                            m.d.sync += [count.eq(word),
                                         count_ok.eq((word >= 1) & (word <= max_words))]
                        with m.If(wleft == 1):
                            m.next = "CRC"
                line_trouble()

            with m.State("CRC"):
                m.d.comb += crc_rx.valid.eq(got)
                with m.If(got):
                    m.d.sync += crc_idx.eq(1)
                    with m.If(crc_idx):
                        m.next = "CHECK"
                line_trouble()

            with m.State("CHECK"):  # the CRC register has taken the last byte
                with m.If(crc_rx.match_detected):
                    m.next = "DECIDE"
                with m.Else():
                    fail(p.Status.BAD_CRC, "DISCARD")

            with m.State("DECIDE"):  # nothing has been executed yet
                m.d.sync += [cur.eq(addr[2:]), todo.eq(n), pend.eq(n)]
                with m.If(~known):
                    fail(p.Status.BAD_COMMAND, "RESPOND")
                with m.Elif(~length_ok):
                    fail(p.Status.BAD_LENGTH, "RESPOND")
                with m.Elif((is_mem | is_csr) & (addr[:2] != 0)):
                    fail(p.Status.MISALIGNED, "RESPOND")
                with m.Elif(is_mem & (addr_high | (addr[2:] + n > self.mem_words))):
                    fail(p.Status.OUT_OF_RANGE, "RESPOND")
                with m.Elif(is_csr & (addr_high | (addr[8:] != 0))):
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
                        with m.Case(p.Command.READ_MEM):
                            m.d.sync += resp_words.eq(count)
                            m.next = "READ"
                        with m.Case(p.Command.WRITE_CSR):
                            m.next = "CSR_WRITE"
                        with m.Case(p.Command.READ_CSR):
                            m.d.sync += resp_words.eq(1)
                            m.next = "CSR_READ"
                        with m.Case(p.Command.ID):
                            m.d.sync += resp_words.eq(p.ID_WORDS)
                            m.next = "ID_VER"

            with m.State("DISCARD"):  # drop the rest of a rejected frame, then answer
                with m.If(timed_out):
                    m.next = "RESPOND"

            # ---- execute ----------------------------------------------------------------
            # buffer word k is on the read port from the cycle after k changed
            with m.State("WRITE_FETCH"):
                m.next = "WRITE"
            with m.State("WRITE"):
                m.d.comb += self.mem_w_en.eq(1)
                with m.If(self.mem_ready):
                    m.d.sync += [k.eq(k + 1), cur.eq(cur + 1), pend.eq(pend - 1)]
                    with m.If(pend == 1):
                        m.next = "RESPOND"
                    with m.Else():
                        m.next = "WRITE_FETCH"

            with m.State("READ"):
                m.d.comb += self.mem_r_en.eq(todo != 0)
                with m.If(self.mem_r_en & self.mem_ready):
                    m.d.sync += [todo.eq(todo - 1), cur.eq(cur + 1)]
                with m.If(self.mem_r_valid):
                    m.d.comb += [wp.en.eq(1), wp.addr.eq(k), wp.data.eq(self.mem_r_data)]
                    m.d.sync += [k.eq(k + 1), pend.eq(pend - 1)]
                    with m.If(pend == 1):
                        m.next = "RESPOND"

            with m.State("CSR_WRITE"):  # the value is buffer word 0 (k = 0)
                m.d.comb += [self.csr_w_en.eq(1), self.csr_addr.eq(addr[:8])]
                m.next = "RESPOND"
            with m.State("CSR_READ"):
                m.d.comb += [self.csr_r_en.eq(1), self.csr_addr.eq(addr[:8])]
                m.next = "CSR_READ_DATA"
            with m.State("CSR_READ_DATA"):
                m.d.comb += [wp.en.eq(1), wp.addr.eq(0), wp.data.eq(self.csr_r_data)]
                m.next = "RESPOND"

            # ID: words 0-2 (PROTOCOL_VERSION, max_payload, mem_words) are constants of the
            # answer; HW_VER and HW_ID go to buffer words 3 and 4
            with m.State("ID_VER"):
                m.d.comb += [self.csr_r_en.eq(1), self.csr_addr.eq(CsrAddr.HW_VER)]
                m.next = "ID_HWID"
            with m.State("ID_HWID"):
                m.d.comb += [wp.en.eq(1), wp.addr.eq(3), wp.data.eq(self.csr_r_data),
                             self.csr_r_en.eq(1), self.csr_addr.eq(CsrAddr.HW_ID)]
                m.next = "ID_HWID_DATA"
            with m.State("ID_HWID_DATA"):
                m.d.comb += [wp.en.eq(1), wp.addr.eq(4), wp.data.eq(self.csr_r_data)]
                m.next = "RESPOND"

            # ---- answer: SYNC CMD SEQ STATUS LEN_lo LEN_hi PAYLOAD CRC_hi CRC_lo ----------
            # After taking a byte the transmitter is busy for a whole character (10 bits of
            # at least 4 cycles), so the buffer's read port and the CRC register, each a
            # cycle late, are current long before the next byte is taken.
            with m.State("RESPOND"):
                m.d.comb += crc_tx.start.eq(1)
                m.d.sync += [hidx.eq(0), tx_word.eq(0), tx_byte.eq(0), crc_idx.eq(0),
                             self.frame_error.eq(status != p.Status.OK)]
                with m.If(status != p.Status.OK):
                    m.d.sync += resp_words.eq(0)
                m.next = "TX_HEADER"
            with m.State("TX_HEADER"):
                out = Signal(8)
                resp_len = Cat(Const(0, 2), resp_words)
                with m.Switch(hidx):
                    for i, v in enumerate((p.RESPONSE_SYNC, cmd, seq, status, resp_len[:8],
                                           resp_len[8:16])):
                        with m.Case(i):
                            m.d.comb += out.eq(v)
                m.d.comb += [tx.i.valid.eq(1), tx.i.payload.eq(out), crc_tx.data.eq(out),
                             rp.addr.eq(0)]
                with m.If(tx.i.ready):
                    m.d.comb += crc_tx.valid.eq(hidx != 0)
                    m.d.sync += hidx.eq(hidx + 1)
                    with m.If(hidx == 5):
                        with m.If(resp_words == 0):
                            m.next = "TX_CRC"
                        with m.Else():
                            m.next = "TX_BODY"
            with m.State("TX_BODY"):
                out = Signal(8)
                m.d.comb += [rp.addr.eq(tx_word), out.eq(rp.data.word_select(tx_byte, 8))]
                with m.If((cmd == p.Command.ID) & (tx_word < 3)):
                    consts = Cat(Const(p.PROTOCOL_VERSION, 32), Const(self.max_payload, 32),
                                 Const(self.mem_words, 32))
                    m.d.comb += out.eq(consts.word_select(Cat(tx_byte, tx_word[:2]), 8))
                m.d.comb += [tx.i.valid.eq(1), tx.i.payload.eq(out), crc_tx.data.eq(out)]
                with m.If(tx.i.ready):
                    m.d.comb += crc_tx.valid.eq(1)
                    m.d.sync += tx_byte.eq(tx_byte + 1)
                    with m.If(tx_byte == 3):
                        m.d.sync += tx_word.eq(tx_word + 1)
                        with m.If(tx_word == resp_words - 1):
                            m.next = "TX_CRC"
            with m.State("TX_CRC"):
                out = Mux(crc_idx, crc_tx.crc[:8], crc_tx.crc[8:])
                m.d.comb += [tx.i.valid.eq(1), tx.i.payload.eq(out)]
                with m.If(tx.i.ready):
                    m.d.sync += crc_idx.eq(1)
                    with m.If(crc_idx):
                        m.next = "IDLE"

        m.d.comb += self.active.eq(~fsm.ongoing("IDLE"))
        return m
