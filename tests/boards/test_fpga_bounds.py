"""The board's answers are bounded: whatever a broken or hostile board (or line) sends, the host
(``BridgeLink``, ``FpgaDevice``) allocates only what it must, fails within
``(1 + retries) * timeout_s``, never takes a wrong answer, and raises a ``ProtocolError`` (or
the ``ValueError`` of a configuration mismatch) saying what arrived and what was expected,
never an exception of the port's own.

The far end here is a fake port object: ``write`` hands the request to a Python board, ``read``
returns its crafted bytes and honours ``timeout`` as pyserial does. The property tests run with
Hypothesis derandomized (fixed examples) or a seeded ``random.Random``."""

from __future__ import annotations

import errno
import os
import random
import re
import socket
import threading
import time
import tracemalloc
import tty
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtakit.driver import DeadlockError, DeviceError
from vtakit.driver.devices import fpga
from vtakit.driver.devices.fpga import MAX_MEM_BYTES, FpgaDevice
from vtakit.vta_hw import bridge_protocol as p
from vtakit.vta_hw import isa
from vtakit.vta_hw.bridge_protocol import BridgeLink, Command, Request, Response, Status
from vtakit.vta_hw.config import HwConfig, preset
from vtakit.vta_hw.faults import Fault, describe_fault

CFG = preset("ice40")
HW_VER_WORD = (isa.HW_VER[0] << 16) | (isa.HW_VER[1] << 8) | isa.HW_VER[2]
FIXED = settings(derandomize=True, deadline=None, database=None, max_examples=50,
                 suppress_health_check=[HealthCheck.too_slow])


def id_words(cfg: HwConfig = CFG, *, mem_words: int = 4096,
             max_payload: int = p.DEFAULT_MAX_PAYLOAD) -> tuple[int, ...]:
    return (p.PROTOCOL_VERSION, max_payload, mem_words, HW_VER_WORD, cfg.hash_u32)


def ok(req: Request, words: tuple[int, ...] = ()) -> bytes:
    return p.encode_response(Response(req.cmd, req.seq, Status.OK, words))


class FakeBoard:
    """A bridge in Python behind a port-like object: memory, CTRL/CYCLES/FAULT, and
    ``tamper(req, frame) -> bytes`` to send something else than the right answer.

    A START ends at once: CTRL reads DONE, and FAULT too when ``fault`` is not None (FAULT then
    reads ``fault``, 0 included)."""

    name = "fake"

    def __init__(self, cfg: HwConfig = CFG, *, mem_words: int = 4096,
                 ident: tuple[int, ...] | None = None,
                 tamper: Callable[[Request, bytes], bytes] | None = None,
                 fault: int | None = None):
        self.timeout: float | None = None
        self.ident = ident or id_words(cfg, mem_words=mem_words)
        self.mem = bytearray(4 * min(mem_words, 1 << 16))
        self.tamper = tamper
        self.fault = fault
        self.ctrl = 0
        self.csr_writes: list[tuple[int, int]] = []
        self.requests: list[Request] = []
        self.inbox = bytearray()

    def answer(self, req: Request) -> bytes:
        w = req.words
        if req.cmd == Command.ID:
            return ok(req, self.ident)
        if req.cmd == Command.READ_MEM:
            return ok(req, tuple(int.from_bytes(self.mem[w[0] + 4 * i:w[0] + 4 * i + 4], "little")
                                 for i in range(w[1])))
        if req.cmd == Command.WRITE_MEM:
            self.mem[w[0]:w[0] + 4 * (len(w) - 1)] = b"".join(x.to_bytes(4, "little")
                                                              for x in w[1:])
            return ok(req)
        if req.cmd == Command.WRITE_CSR:
            self.csr_writes.append((w[0], w[1]))
            if w[0] == fpga.CTRL and w[1] & fpga.CTRL_START:
                self.ctrl = fpga.CTRL_DONE | (fpga.CTRL_FAULT if self.fault is not None else 0)
            if w[0] == fpga.CTRL and w[1] & fpga.CTRL_RESET:
                self.ctrl = 0
            return ok(req)
        value = {fpga.CTRL: self.ctrl, fpga.CYCLES: 123, fpga.FAULT: self.fault or 0}.get(
            w[0], 0)
        return ok(req, (value,))

    # ---- the port -------------------------------------------------------------------------
    def write(self, frame: bytes) -> int:
        req = p.decode_request(frame)
        self.requests.append(req)
        reply = self.answer(req)
        self.inbox += self.tamper(req, reply) if self.tamper else reply
        return len(frame)

    def read(self, n: int = 1) -> bytes:
        if not self.inbox:  # nothing more comes before the next write: wait out the timeout
            time.sleep(self.timeout or 0.0)
            return b""
        out = bytes(self.inbox[:n])
        del self.inbox[:n]
        return out


class StreamingPort:
    """A line that never goes quiet: every ``read(n)`` returns bytes at 100 kB/s (1 Mbaud) for
    as long as its timeout allows, from ``source(k) -> k bytes``; requests are ignored."""

    name = "noisy"

    def __init__(self, source: Callable[[int], bytes], bytes_per_s: float = 100_000):
        self.timeout: float | None = None
        self.source = source
        self.byte_s = 1 / bytes_per_s

    def write(self, frame: bytes) -> int:
        return len(frame)

    def read(self, n: int = 1) -> bytes:
        wait = min(n * self.byte_s, self.timeout if self.timeout is not None else 1e9)
        time.sleep(wait)
        return self.source(max(1, min(n, int(wait / self.byte_s))))


def noise(seed: int) -> Callable[[int], bytes]:
    rng = random.Random(seed)
    return rng.randbytes


def repeating(frame: bytes) -> Callable[[int], bytes]:
    buf = bytearray()

    def source(k: int) -> bytes:
        while len(buf) < k:
            buf.extend(frame)
        out = bytes(buf[:k])
        del buf[:k]
        return out
    return source


def open_fake(board, **kwargs) -> FpgaDevice:
    kwargs.setdefault("timeout_s", 0.05)
    return FpgaDevice(CFG, board, **kwargs)


def peak_bytes(fn: Callable[[], object]) -> tuple[int, BaseException | None]:
    """Peak traced allocation while ``fn`` runs, and what it raised."""
    tracemalloc.start()
    try:
        fn()
        raised = None
    except BaseException as err:  # noqa: BLE001 - returned to the test, which checks it
        raised = err
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, raised


# ---- 1. the ID's sizes ---------------------------------------------------------------------------
class TestIdIsBounded:
    """Every size the ID reports is checked against the protocol's limits, the configuration's
    and the host's before anything is allocated."""

    def test_mem_words_of_2_32_minus_1_is_refused_before_any_allocation(self):
        peak, err = peak_bytes(lambda: open_fake(FakeBoard(mem_words=0xFFFFFFFF)))
        assert isinstance(err, p.IdError) and isinstance(err, p.ProtocolError)
        assert isinstance(err, ValueError)
        assert str(err) == ("the board on fake reports mem_words=4294967295 (ID word 2); "
                            "expected 1..1073741824 (2**30: 32-bit words behind a 32-bit byte "
                            "address)")
        assert peak < 1 << 20  # not the 20 GiB of a shadow of that size

    def test_no_memory_is_refused(self):
        with pytest.raises(p.IdError, match=r"reports mem_words=0 \(ID word 2\); expected "
                                            r"1..1073741824"):
            open_fake(FakeBoard(mem_words=0))

    def test_more_than_the_host_shadows_needs_mem_bytes(self):
        words = p.MAX_MEM_WORDS  # in the protocol's range, past the host's
        peak, err = peak_bytes(lambda: open_fake(FakeBoard(mem_words=words)))
        assert isinstance(err, p.IdError)
        assert str(err) == (f"the board on fake reports mem_words={words} ({4 * words} bytes); "
                            f"expected at most {MAX_MEM_BYTES // 4} words ({MAX_MEM_BYTES} "
                            f"bytes, the most the fpga device shadows): pass mem_bytes= to use "
                            f"part of it")
        assert peak < 1 << 20
        dev = open_fake(FakeBoard(mem_words=words), mem_bytes=1 << 16)
        assert dev.dram.size == 1 << 16
        with pytest.raises(ValueError, match=rf"mem_bytes={MAX_MEM_BYTES + 4}; the board on "
                                             rf"fake has {4 * words} bytes \(expected "
                                             rf"1..{MAX_MEM_BYTES}\)"):
            open_fake(FakeBoard(mem_words=words), mem_bytes=MAX_MEM_BYTES + 4)

    def test_memory_is_whole_bus_words_of_the_configuration(self):
        ecp5 = preset("ecp5")  # a 64-bit bus: an even number of 32-bit words
        with pytest.raises(p.IdError, match=r"^the board on fake reports mem_words=4097 \(ID "
                                            r"word 2\); expected a multiple of 2: the "
                                            r"configuration's memory is whole 8-byte bus "
                                            r"words$"):
            FpgaDevice(ecp5, FakeBoard(ecp5, mem_words=4097), timeout_s=0.05)
        assert FpgaDevice(ecp5, FakeBoard(ecp5, mem_words=4098), timeout_s=0.05).dram.size \
            == 4 * 4098

    @pytest.mark.parametrize("word, value, message", [
        (0, 2, r"the board on fake speaks bridge protocol version 2; this host speaks 1: "
               r"rebuild the bitstream or update vtakit"),
        (1, 0, r"the board on fake reports max_payload=0: expected a multiple of 4 in 32..4096 "
               r"\(ID word 1\)"),
        (1, 0xFFFFFFFF, r"reports max_payload=4294967295: expected a multiple of 4 in "
                        r"32..4096"),
        (1, 258, r"reports max_payload=258: expected a multiple of 4"),
        (3, 0xFF000000 | HW_VER_WORD, r"reports HW_VER=0xff000002 \(ID word 3\); expected "
                                      r"\(major << 16\) \| \(minor << 8\) \| patch, at most "
                                      r"0x00ffffff"),
    ])
    def test_the_other_fields_are_checked(self, word, value, message):
        ident = list(id_words())
        ident[word] = value
        with pytest.raises(p.IdError, match=message):
            open_fake(FakeBoard(ident=tuple(ident)))

    def test_the_configuration_hash_and_isa_version_are_compared(self):
        for word, value in ((4, CFG.hash_u32 ^ 1), (3, HW_VER_WORD + 1)):
            ident = list(id_words())
            ident[word] = value
            with pytest.raises(ValueError, match=r"the board on fake was built for "
                                                 r"configuration [0-9a-f]{8} .*, ISA \d+\.\d+\.\d+;"
                                                 r" the driver was given configuration "
                                                 rf"{CFG.hash}"):
                open_fake(FakeBoard(ident=tuple(ident)))

    @FIXED
    @given(st.lists(st.one_of(st.integers(0, 0xFFFFFFFF),
                              st.sampled_from([0, 1, 4, 32, 256, 4096, 1 << 30, (1 << 30) + 1,
                                               0xFFFFFFFF])),
                    min_size=5, max_size=5),
           st.booleans())
    def test_any_id_opens_a_bounded_device_or_is_refused(self, words, plausible):
        if plausible:  # the checks past the first ones are reached too
            words[0], words[3], words[4] = p.PROTOCOL_VERSION, HW_VER_WORD, CFG.hash_u32
        peak, err = peak_bytes(lambda: open_fake(FakeBoard(ident=tuple(words))))
        if err is None:
            assert 32 <= words[1] <= 4096 and 1 <= words[2] <= MAX_MEM_BYTES // 4
            assert peak < 4 * words[2] * 3 + (1 << 20)  # the shadow and its two masks
        else:
            assert isinstance(err, (p.ProtocolError, ValueError)), repr(err)
            assert peak < 1 << 20
            assert re.search(r"(mem_words|max_payload|HW_VER)=\d+|version \d+|configuration",
                             str(err)), str(err)


# ---- 2. the length of a response -----------------------------------------------------------------
def with_words(words: tuple[int, ...]) -> Callable[[Request, bytes], bytes]:
    """A board that answers OK (CRC good) with ``words`` whatever was asked (ID excepted)."""
    def tamper(req: Request, frame: bytes) -> bytes:
        return frame if req.cmd == Command.ID else ok(req, words)
    return tamper


class TestResponseLength:
    """An OK response whose payload is not its command's length is a ``ResponseLengthError``
    naming the command, the length received and the length expected; it is not retried."""

    @pytest.mark.parametrize("call, words, message", [
        (lambda link: link.read_mem(0x40, 16), (1, 2, 3),
         r"answered READ_MEM \(seq \d+\) of 4 words at 0x40 with a payload of the wrong length: "
         r"READ_MEM response has 3 words; expected 4 \(12 bytes received, 16 expected\)$"),
        (lambda link: link.read_mem(0x40, 16), (1, 2, 3, 4, 5),
         r"answered .*: "
         r"READ_MEM response has 5 words; expected 4 \(20 bytes received, 16 expected\)$"),
        (lambda link: link.read_mem(0x40, 16), (),
         r"answered .*: "
         r"READ_MEM response has 0 words; expected 4"),
        (lambda link: link.read_csr(0x08), (),
         r"answered READ_CSR \(seq \d+\) of CSR 0x08 with a payload of the wrong length: "
         r"READ_CSR response has 0 words; expected 1 \(0 bytes received, 4 expected\)$"),
        (lambda link: link.read_csr(0x08), (1, 2),
         r"answered .*: "
         r"READ_CSR response has 2 words; expected 1"),
        (lambda link: link.write_csr(0x00, 1), (7,),
         r"answered WRITE_CSR \(seq \d+\) of CSR 0x00 with a payload of the wrong length: "
         r"WRITE_CSR response has 1 word; expected 0 \(4 bytes received, 0 expected\)$"),
        (lambda link: link.write_mem(0x40, b"\0" * 8), (7, 8),
         r"answered WRITE_MEM \(seq \d+\) of 2 words at 0x40 .*: WRITE_MEM response has 2 "
         r"words; expected 0"),
        (lambda link: link.ident(), (1, 2, 3, 4),
         r"answered ID \(seq \d+\) with a payload of the wrong length: ID response has 4 "
         r"words; expected 5 \(16 bytes received, 20 expected\)$"),
        (lambda link: link.ident(), (*id_words(), 0),
         r"answered .*: "
         r"ID response has 6 words; expected 5"),
    ])
    def test_a_wrong_length_names_the_command_and_both_lengths(self, call, words, message):
        def tamper(req, frame):
            if req.cmd == Command.ID and len(board.requests) == 1:
                return frame  # the link's own ID, before the call
            return ok(req, words)

        board = FakeBoard(tamper=tamper)
        link = BridgeLink(board, timeout_s=0.05, retries=2)
        link.ident()
        with pytest.raises(p.ResponseLengthError, match=r"^the board on fake " + message):
            call(link)
        assert len(board.requests) == 2  # not retried: the CRC was good, the board is wrong

    def test_the_device_does_not_take_a_short_read(self):
        dev = open_fake(FakeBoard(tamper=with_words((1, 2))))
        with pytest.raises(p.ResponseLengthError, match=r"READ_MEM response has 2 words; "
                                                        r"expected 4"):
            dev.read(0, 16)

    @FIXED
    @given(st.sampled_from([Command.READ_MEM, Command.READ_CSR, Command.WRITE_CSR,
                            Command.WRITE_MEM, Command.ID]),
           st.integers(1, 64), st.integers(0, 70))
    def test_any_length_is_the_right_one_or_refused(self, cmd, n, got):
        args = {Command.READ_MEM: (0, n), Command.READ_CSR: (0,), Command.WRITE_CSR: (0, 1),
                Command.WRITE_MEM: (0, *range(n)), Command.ID: ()}[cmd]
        want = p.response_words(Request(cmd, 0, args))
        board = FakeBoard(tamper=lambda req, frame: ok(req, tuple(range(got))))
        link = BridgeLink(board, timeout_s=0.05, retries=0)
        link.board = p.BoardId(*id_words())
        if got == want:
            assert link.request(cmd, args) == tuple(range(got))
        elif 4 * got > p.DEFAULT_MAX_PAYLOAD:  # no frame is that long: taken for line damage
            with pytest.raises(p.LengthError, match=rf"{cmd.name} \(seq 1\) failed 1 time; last: "
                                                    rf"the response to {cmd.name} \(seq 1\) has "
                                                    rf"length field {4 * got}; expected a "
                                                    rf"multiple of 4 up to 256"):
                link.request(cmd, args)
        else:
            with pytest.raises(p.ResponseLengthError,
                               match=rf"{cmd.name} response has {got} words?; expected {want} "
                                     rf"\({4 * got} bytes received, {4 * want} expected\)"):
                link.request(cmd, args)


# ---- 3. a port that fails ------------------------------------------------------------------------
class FailingPort(FakeBoard):
    """A board whose port raises ``error`` from ``method`` once ``armed``."""

    def __init__(self, method: str, error: BaseException):
        super().__init__()
        self.method, self.error, self.armed = method, error, False

    def write(self, frame: bytes) -> int:
        if self.armed and self.method == "write":
            raise self.error
        return super().write(frame)

    def read(self, n: int = 1) -> bytes:
        if self.armed and self.method == "read":
            raise self.error
        return super().read(n)


class EofPort(FakeBoard):
    """A port at end of file: every read returns nothing at once (a closed pipe, a file)."""

    def read(self, n: int = 1) -> bytes:
        return b""


class TestDroppedConnection:
    """A port that fails is a ``PortError`` (a ``ProtocolError``) naming the port and what
    happened, at once; pyserial's and the socket's exceptions never escape."""

    @pytest.fixture
    def serial(self):
        return pytest.importorskip("serial", reason="needs pyserial: pip install 'vtakit[fpga]'")

    def test_serial_exceptions_of_read_and_write(self, serial):
        cases = [
            ("read", serial.SerialException("device reports readiness to read but returned no "
                                            "data (device disconnected or multiple access on "
                                            "port?)"),
             r"failed while waiting for the response to READ_CSR \(seq 2\): SerialException: "
             r"device reports readiness to read but returned no data"),
            ("write", serial.SerialTimeoutException("Write timeout"),
             r"failed while sending READ_CSR \(seq 2\): SerialTimeoutException: Write timeout"),
            ("read", OSError(errno.EIO, "Input/output error"),
             r"failed while waiting .*: OSError: \[Errno 5\] Input/output error"),
            ("write", serial.PortNotOpenError(),
             r"failed while sending .*: PortNotOpenError: Attempting to use a port that is not "
             r"open"),
            ("read", ValueError("I/O operation on closed file."),
             r"failed while waiting .*: ValueError: I/O operation on closed file\."),
        ]
        for method, error, message in cases:
            port = FailingPort(method, error)
            link = BridgeLink(port, timeout_s=0.05, retries=2)
            link.ident()
            port.armed = True
            with pytest.raises(p.PortError, match=r"^the connection to the board on fake "
                                                  + message) as info:
                link.read_csr(0)
            assert isinstance(info.value, p.ProtocolError)
            assert isinstance(info.value, ConnectionError)
            assert info.value.__cause__ is error
            assert len(port.requests) == 1 + (method == "read")  # not retried

    def test_a_port_at_end_of_file(self):
        link = BridgeLink(EofPort(), timeout_s=0.5, retries=2)
        t0 = time.monotonic()
        with pytest.raises(p.PortError, match=r"^the port fake is at end of file: 3 reads in a "
                                              r"row returned no bytes at once, although each "
                                              r"could wait up to 0.5 s \(while waiting for the "
                                              r"response to ID \(seq 1\)\); expected a port that "
                                              r"waits for bytes: the connection was closed$"):
            link.ident()
        assert time.monotonic() - t0 < 0.2  # not a busy wait to the deadline

    def test_a_port_that_returns_more_than_asked_or_no_bytes(self):
        class Greedy(FakeBoard):
            def read(self, n=1):
                return bytes(n + 1)

        class Text(FakeBoard):
            def read(self, n=1):
                return "5a"

        with pytest.raises(p.PortError, match=r"the port fake returned 2 bytes to a read of 1 "
                                              r"bytes while waiting for the response to ID "
                                              r"\(seq 1\); expected bytes, at most 1"):
            BridgeLink(Greedy(), timeout_s=0.05).ident()
        with pytest.raises(p.PortError, match=r"the port fake returned a str to a read of 1 "
                                              r"bytes"):
            BridgeLink(Text(), timeout_s=0.05).ident()

    def test_a_pty_whose_far_end_hangs_up(self, serial):
        master, slave = os.openpty()
        tty.setraw(slave)
        name = os.ttyname(slave)
        port = serial.serial_for_url(name, baudrate=1_000_000, timeout=0.1)
        try:
            link = BridgeLink(port, timeout_s=0.2)
            os.close(master)
            with pytest.raises(p.PortError, match=rf"^the connection to the board on "
                                                  rf"{name} failed while (sending|"
                                                  rf"waiting for the response to) READ_CSR "
                                                  rf"\(seq 1\): SerialException: .*Input/output "
                                                  rf"error"):
                link.read_csr(0)
            port.close()
            with pytest.raises(p.PortError, match=r"failed while sending READ_CSR \(seq 2\): "
                                                  r"PortNotOpenError"):
                link.read_csr(0)
        finally:
            port.close()
            os.close(slave)

    def test_a_socket_whose_server_goes_away(self, serial):
        server = socket.create_server(("127.0.0.1", 0))
        url = f"socket://127.0.0.1:{server.getsockname()[1]}"

        def serve():
            conn, _ = server.accept()
            conn.recv(64)
            conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with pytest.raises(p.PortError, match=rf"^the connection to the board on {url} "
                                                  rf"failed while waiting for the response to ID "
                                                  rf"\(seq 1\): SerialException: read failed: "
                                                  rf"socket disconnected"):
                FpgaDevice(CFG, url, timeout_s=0.5)
        finally:
            thread.join(5)
            server.close()

    def test_the_device_passes_a_port_error_on(self):
        port = FailingPort("read", OSError(errno.ENXIO, "No such device or address"))
        dev = open_fake(port)
        port.armed = True
        with pytest.raises(p.PortError, match=r"No such device or address"):
            dev.read(0, 4)


# ---- 4. the deadline -----------------------------------------------------------------------------
MARGIN_S = 0.1  # scheduling on two shared cores


class TestDeadline:
    """A request returns or raises within ``(1 + retries) * timeout_s``, however long the line
    keeps sending."""

    @staticmethod
    def timed(call: Callable[[], object]) -> tuple[float, BaseException]:
        t0 = time.monotonic()
        with pytest.raises(p.ProtocolError) as info:
            call()
        return time.monotonic() - t0, info.value

    @pytest.mark.parametrize("timeout_s, retries", [(0.05, 0), (0.05, 2), (0.1, 1), (0.02, 4)])
    def test_a_line_that_streams_noise_forever(self, timeout_s, retries):
        link = BridgeLink(StreamingPort(noise(7)), timeout_s=timeout_s, retries=retries)
        elapsed, err = self.timed(link.ident)
        assert elapsed <= (1 + retries) * timeout_s + MARGIN_S
        assert re.match(rf"ID \(seq 1\) failed [1-{1 + retries}] times?; last: ", str(err))

    def test_a_line_that_streams_an_old_response_forever(self):
        old = ok(Request(Command.READ_CSR, 200, (0,)), (5,))
        link = BridgeLink(StreamingPort(repeating(old)), timeout_s=0.1, retries=1)
        elapsed, err = self.timed(lambda: link.read_csr(0))
        assert elapsed <= 0.2 + MARGIN_S
        assert isinstance(err, (p.NoResponse, p.TruncatedError))  # the deadline, between frames
        assert re.search(r"^READ_CSR \(seq 1\) failed 2 times; last: .*READ_CSR \(seq 1\).* "
                         r"\(.*\d+ responses to other requests arrived; the line did not go "
                         r"quiet for 0.05 s before the request was sent: \d+ bytes discarded\)",
                         str(err)), str(err)

    def test_a_frame_that_never_ends(self):
        """A header announcing 4 KiB, then a byte per 10 ms: cut off at the deadline."""
        head = bytes([p.RESPONSE_SYNC, Command.READ_CSR, 1, 0]) + (4096).to_bytes(2, "little")
        link = BridgeLink(StreamingPort(repeating(head + bytes(4096)), bytes_per_s=100),
                          timeout_s=0.1, retries=2)
        elapsed, err = self.timed(lambda: link.read_csr(0))
        assert elapsed <= 0.3 + MARGIN_S
        assert isinstance(err, p.ProtocolError)

    def test_a_silent_board_uses_every_try_within_the_budget(self):
        board = FakeBoard(tamper=lambda req, frame: frame if req.cmd == Command.ID else b"")
        link = BridgeLink(board, timeout_s=0.1, retries=2)
        link.ident()
        elapsed, err = self.timed(lambda: link.read_csr(0))
        assert 0.3 - 0.01 <= elapsed <= 0.3 + MARGIN_S
        assert isinstance(err, p.NoResponse) and isinstance(err, TimeoutError)
        assert str(err).startswith("READ_CSR (seq 2) failed 3 times; last: no response")

    def test_the_device_opens_or_fails_within_the_budget_on_a_noisy_line(self):
        t0 = time.monotonic()
        with pytest.raises(p.ProtocolError, match=r"^ID \(seq 1\) failed"):
            FpgaDevice(CFG, StreamingPort(noise(3)), timeout_s=0.05, retries=2)
        assert time.monotonic() - t0 <= 0.15 + MARGIN_S

    @settings(FIXED, max_examples=25)
    @given(st.integers(0, 2 ** 32), st.sampled_from([0.02, 0.04]), st.integers(0, 3),
           st.sampled_from(["noise", "mangled", "dribble"]))
    def test_any_stream_is_bounded(self, seed, timeout_s, retries, kind):
        rng = random.Random(seed)
        if kind == "noise":
            port = StreamingPort(noise(seed))
        elif kind == "mangled":  # responses with bytes flipped, dropped and repeated
            good = bytearray(ok(Request(Command.ID, 1), id_words()))
            for _ in range(rng.randint(1, 4)):
                k = rng.randrange(len(good))
                op = rng.randrange(3)
                if op == 0:
                    good[k] ^= 1 << rng.randrange(8)
                elif op == 1:
                    del good[k]
                else:
                    good.insert(k, good[k])
            port = StreamingPort(repeating(bytes(good)))
        else:
            port = StreamingPort(noise(seed), bytes_per_s=rng.choice([200, 2000]))
        link = BridgeLink(port, timeout_s=timeout_s, retries=retries, quiet_s=0.01)
        elapsed, err = self.timed(link.ident)
        assert elapsed <= (1 + retries) * timeout_s + MARGIN_S


# ---- the whole exchange against a board that lies ------------------------------------------------
class TestNoWrongAnswer:
    """Responses damaged on the line (CRC not recomputed) or forged by the board (a good CRC
    for another SEQ, command, status or length): each read returns the board's data or raises
    a ``ProtocolError``, nothing else, within the budget."""

    @settings(FIXED, max_examples=30)
    @given(st.integers(0, 2 ** 32), st.integers(0, 3))
    def test_reads_are_right_or_refused(self, seed, retries):
        rng = random.Random(seed)

        def tamper(req: Request, frame: bytes) -> bytes:
            if req.cmd == Command.ID or rng.random() < 0.3:
                return frame
            kind = rng.randrange(6)
            out = bytearray(frame)
            if kind == 0:  # bits flipped on the line
                for _ in range(rng.randint(1, 3)):
                    out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
            elif kind == 1:  # cut off
                del out[rng.randrange(len(out)):]
            elif kind == 2:  # forged: another SEQ, command or an unknown status
                field = rng.choice(["seq", "cmd", "status"])
                resp = p.decode_response(bytes(frame))
                resp = Response(resp.cmd if field != "cmd" else rng.randrange(256),
                                resp.seq if field != "seq" else (resp.seq + 1) & 0xFF,
                                resp.status if field != "status" else rng.randrange(10, 256),
                                resp.words)
                out = bytearray(p.encode_response(resp))
            elif kind == 3:  # forged: a payload of another length
                resp = p.decode_response(bytes(frame))
                n = len(resp.words) + rng.choice([-1, 1, 2])
                out = bytearray(ok(req, tuple(range(max(n, 0)))))
            elif kind == 4:  # garbage before and after
                out = bytearray(rng.randbytes(rng.randrange(20))) + out \
                    + rng.randbytes(rng.randrange(20))
            else:  # a length field that lies
                out[4:6] = rng.randrange(0x10000).to_bytes(2, "little")
            return bytes(out)

        board = FakeBoard(tamper=tamper)
        board.mem[:] = np.random.default_rng(seed).integers(0, 256, len(board.mem),
                                                            np.uint8).tobytes()
        link = BridgeLink(board, timeout_s=0.02, retries=retries, quiet_s=0.002)
        link.ident()
        for _ in range(4):
            addr = 4 * rng.randrange(64)
            nbytes = 4 * rng.randint(1, 80)
            t0 = time.monotonic()
            try:
                data = link.read_mem(addr, nbytes)
            except p.ProtocolError:
                pass
            else:
                assert data == bytes(board.mem[addr:addr + nbytes])
            frames = -(-nbytes // p.DEFAULT_MAX_PAYLOAD)
            assert time.monotonic() - t0 <= frames * (1 + retries) * 0.02 + MARGIN_S


# ---- 5. a fault without a cause ------------------------------------------------------------------
def run_to_fault(fault: int) -> BaseException:
    board = FakeBoard(fault=fault)
    dev = open_fake(board)
    dev.write(0x100, np.frombuffer(isa.encode_stream([isa.FinishInsn()], CFG), np.uint8))
    dev.run(0x100, 1)
    with pytest.raises(DeviceError) as info:
        dev.wait(1.0)
    assert (fpga.CTRL, fpga.CTRL_RESET) in board.csr_writes  # the core was reset
    return info.value


class TestFaultWords:
    """A FAULT status says in words what the fault register holds, also when it names no
    cause or bits this host does not know."""

    def test_fault_register_zero(self):
        err = run_to_fault(0)
        assert type(err) is DeviceError
        assert str(err) == ("fpga: fault register 0: the core reported a fault at cycle 123 "
                            "without a cause (expected at least one of the bits "
                            "DEADLOCK, UNFINISHED, TOKENS_L2G, TOKENS_G2L, TOKENS_G2S, "
                            "TOKENS_S2G) (core fault register 0x00)")

    def test_unknown_fault_bits(self):
        err = run_to_fault(0xC0)
        assert type(err) is DeviceError
        assert str(err) == ("fpga: unknown fault bits 0xc0 (expected only bits 0..5: DEADLOCK, "
                            "UNFINISHED, TOKENS_L2G, TOKENS_G2L, TOKENS_G2S, TOKENS_S2G; a "
                            "core of another ISA version?) (core fault register 0xc0)")

    def test_known_and_unknown_bits_together(self):
        err = run_to_fault(0x80000000 | Fault.DEADLOCK)
        assert isinstance(err, DeadlockError)
        assert re.fullmatch(r"fpga: deadlock detected at cycle 123: .*; unknown fault bits "
                            r"0x80000000 \(.*\) \(core fault register 0x80000001\)", str(err))

    @pytest.mark.parametrize("fault", [Fault.DEADLOCK, Fault.TOKENS_G2S,
                                       Fault.UNFINISHED | Fault.TOKENS_L2G])
    def test_known_bits_read_as_before(self, fault):
        assert str(run_to_fault(int(fault))) == f"fpga: {describe_fault(int(fault), 123)}"

    def test_the_next_run_works(self):
        board = FakeBoard(fault=0)
        dev = open_fake(board)
        dev.write(0x100, np.frombuffer(isa.encode_stream([isa.FinishInsn()], CFG), np.uint8))
        dev.run(0x100, 1)
        with pytest.raises(DeviceError, match=r"fault register 0: the core reported a fault"):
            dev.wait(1.0)
        board.fault = None
        dev.run(0x100, 1)
        assert dev.wait(1.0).cycles == 123
