"""The bridge protocol's host side: the CRC against amaranth.lib.crc (the gateware's), frames,
the precise errors of a damaged frame, and the link's numbering, retries and splitting."""

from __future__ import annotations

import random
import time

import pytest
from amaranth.lib import crc
from amaranth.sim import Simulator

from vtakit.vta_hw import bridge_protocol as p
from vtakit.vta_hw.bridge_protocol import BridgeLink, Command, Request, Response, Status

RNG = random.Random(0)
SAMPLES = [b"", b"\x00", b"123456789"] + [RNG.randbytes(RNG.randrange(1, 300))
                                         for _ in range(40)]


def test_the_host_crc_is_the_gateways():
    algorithm = getattr(crc.catalog, p.CRC_ALGORITHM)
    params = algorithm(data_width=8)
    # what crc16 computes with binascii.crc_hqx(data, 0xFFFF)
    assert (algorithm.crc_width, algorithm.polynomial, algorithm.initial_crc,
            algorithm.reflect_input, algorithm.reflect_output, algorithm.xor_output) == (
        8 * p.CRC_BYTES, 0x1021, 0xFFFF, False, False, 0)
    assert p.crc16(b"123456789") == 0x29B1  # the catalog's check value of CRC-16/CCITT-FALSE
    for data in SAMPLES:
        assert p.crc16(data) == params.compute(data), data.hex()
        # sent most significant byte first, the CRC register of a whole frame is the residue
        assert params.compute(data + p.crc16(data).to_bytes(2, "big")) == params.residue()


def test_the_hardware_crc_engine_agrees():
    """amaranth's crc.Processor, as the bridge instantiates it, over a few frames' bytes."""
    proc = crc.Processor(getattr(crc.catalog, p.CRC_ALGORITHM)(data_width=8))
    frames = [p.encode_request(Request(Command.WRITE_MEM, 3, (0x40, 1, 2, 0xFFFFFFFF)))[1:],
              p.encode_response(Response(Command.READ_CSR, 9, Status.OK, (0x1234,)))[1:]]

    async def bench(ctx):
        for frame in frames:
            ctx.set(proc.start, 1)
            await ctx.tick()
            ctx.set(proc.start, 0)
            for k, byte in enumerate(frame):
                ctx.set(proc.data, byte)
                ctx.set(proc.valid, 1)
                await ctx.tick()
                if k == len(frame) - 3:  # the last byte before the CRC
                    ctx.set(proc.valid, 0)
                    assert ctx.get(proc.crc) == p.crc16(frame[:-2])
                    ctx.set(proc.valid, 1)
            ctx.set(proc.valid, 0)
            assert ctx.get(proc.match_detected)

    sim = Simulator(proc)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_the_worked_example_of_the_module_docstring():
    frame = p.encode_request(Request(Command.WRITE_MEM, 7, (0x100, 1, 2)))
    assert frame[:-2].hex(" ") == ("a5 01 07 0c 00 00 01 00 00 01 00 00 00 02 00 00 00")
    assert frame[-2:] == p.crc16(frame[1:-2]).to_bytes(2, "big")
    resp = p.encode_response(Response(Command.WRITE_MEM, 7, Status.OK))
    assert resp[:-2].hex(" ") == "5a 01 07 00 00 00"


@pytest.mark.parametrize("req", [
    Request(Command.WRITE_MEM, 0, (0, 1)),
    Request(Command.WRITE_MEM, 255, (0xFFFFFFFC, *range(64))),
    Request(Command.READ_MEM, 1, (0x20, 64)),
    Request(Command.WRITE_CSR, 2, (0x0C, 0xDEADBEEF)),
    Request(Command.READ_CSR, 3, (0x14,)),
    Request(Command.ID, 4),
])
def test_requests_round_trip(req):
    assert p.decode_request(p.encode_request(req)) == req


def test_responses_round_trip():
    for resp in (Response(Command.ID, 1, Status.OK, (1, 256, 1 << 20, 2, 0xABCDEF01)),
                 Response(0, 0, Status.BAD_SYNC), Response(Command.READ_MEM, 9, Status.OK,
                                                           tuple(range(64)))):
        assert p.decode_response(p.encode_response(resp)) == resp


GOOD = p.encode_request(Request(Command.READ_CSR, 5, (0x10,)))  # a5 04 05 04 00 10 00 00 00 crc


def damaged(index: int, value: int) -> bytes:
    out = bytearray(GOOD)
    out[index] = value
    return bytes(out)


@pytest.mark.parametrize("frame, error, status, message", [
    (damaged(0, 0x5A), p.SyncError, Status.BAD_SYNC,
     r"request starts with 0x5a; expected the sync byte 0xa5"),
    (damaged(3, 5), p.LengthError, Status.BAD_LENGTH,
     r"request length field 5; expected a multiple of 4 up to 260"),
    (damaged(4, 2), p.LengthError, Status.BAD_LENGTH,
     r"request length field 516; expected a multiple of 4 up to 260"),
    (GOOD[:9], p.TruncatedError, Status.TRUNCATED,
     r"request of 9 bytes; its length field 4 makes 11"),
    (GOOD[:5], p.TruncatedError, Status.TRUNCATED,
     r"request of 5 bytes \(a5 04 05 04 00\); expected at least 7 \(header and CRC\)"),
    (GOOD + b"\0", p.LengthError, Status.BAD_LENGTH,
     r"request of 12 bytes; its length field 4 makes 11"),
    (damaged(6, 0x11), p.CrcError, Status.BAD_CRC,
     rf"request CRC mismatch: received {int.from_bytes(GOOD[-2:], 'big'):#06x}, computed "
     r"0x[0-9a-f]{4} over 8 bytes \(frame a5 04 05 04 00 10 11 00 00 .*\)"),
])
def test_a_damaged_request_is_refused_with_the_bridges_status(frame, error, status, message):
    with pytest.raises(error, match=message) as info:
        p.decode_request(frame)
    assert info.value.status == status


def test_a_request_a_bridge_does_not_take():
    with pytest.raises(p.CommandError, match=r"request command 0x7e; expected one of 0x01 "
                                             r"WRITE_MEM, 0x02 READ_MEM, .* 0x05 ID") as info:
        p.decode_request(p.encode_request(Request(0x7E, 1)))
    assert info.value.status == Status.BAD_COMMAND
    for req in (Request(Command.READ_CSR, 1, (0, 0)), Request(Command.READ_MEM, 1, (0, 0)),
                Request(Command.READ_MEM, 1, (0, 65)), Request(Command.WRITE_MEM, 1, (0,))):
        with pytest.raises(p.LengthError, match=r"request with \d payload words .*: not a valid "
                                                r"length for the command"):
            p.decode_request(p.encode_request(req))


def test_encoding_checks_its_fields():
    with pytest.raises(ValueError, match=r"WRITE_MEM \(seq 1\): payload of 264 bytes; expected "
                                         r"at most 260 \(4 \+ max_payload\): split the transfer"):
        p.encode_request(Request(Command.WRITE_MEM, 1, (0, *range(65))))
    with pytest.raises(ValueError, match=r"seq=256: expected an int in 0..255"):
        p.encode_request(Request(Command.ID, 256))
    with pytest.raises(ValueError, match=r"payload word 1 = -1: expected an int in 0..2\*\*32-1"):
        p.encode_request(Request(Command.WRITE_CSR, 1, (0, -1)))
    with pytest.raises(ValueError, match=r"max_payload=30: expected a multiple of 4 in "
                                         r"32..4096"):
        p.check_max_payload(30)


# ---- the link ----------------------------------------------------------------------------------
class ScriptedPort:
    """A port whose far end is ``answer(request) -> bytes to send back``."""

    name = "scripted"

    def __init__(self, answer):
        self.answer = answer
        self.timeout: float | None = None
        self.inbox = bytearray()
        self.requests: list[Request] = []

    def write(self, frame: bytes) -> int:
        req = p.decode_request(frame)
        self.requests.append(req)
        self.inbox += self.answer(req)
        return len(frame)

    def read(self, n: int = 1) -> bytes:
        if not self.inbox:
            time.sleep(min(self.timeout or 0.0, 0.005))
            return b""
        out = bytes(self.inbox[:n])
        del self.inbox[:n]
        return out


def ok(req: Request, words: tuple[int, ...] = ()) -> bytes:
    return p.encode_response(Response(req.cmd, req.seq, Status.OK, words))


ID_WORDS = (p.PROTOCOL_VERSION, 32, 1024, 2, 0x12345678)


def test_the_link_splits_transfers_into_max_payload_frames():
    mem = bytearray(4096)

    def board(req):
        if req.cmd == Command.ID:
            return ok(req, ID_WORDS)
        if req.cmd == Command.WRITE_MEM:
            a = req.words[0]
            mem[a:a + 4 * (len(req.words) - 1)] = b"".join(
                w.to_bytes(4, "little") for w in req.words[1:])
            return ok(req)
        a, n = req.words
        return ok(req, tuple(int.from_bytes(mem[a + 4 * i:a + 4 * i + 4], "little")
                             for i in range(n)))

    port = ScriptedPort(board)
    link = BridgeLink(port, timeout_s=0.1)
    data = bytes(range(256)) * 2 + b"\x01\x02\x03\x04"
    link.write_mem(0x40, data)
    assert link.read_mem(0x40, len(data)) == data
    sizes = [len(r.words) - 1 for r in port.requests if r.cmd == Command.WRITE_MEM]
    assert sizes == [8] * 16 + [1]  # 32-byte frames, then the rest
    assert [r.seq for r in port.requests] == list(range(1, len(port.requests) + 1))
    with pytest.raises(ValueError, match=r"write_mem: addr=0x41, 4 bytes; expected a multiple "
                                         r"of 4 for both"):
        link.write_mem(0x41, b"1234")


def test_a_late_response_to_an_earlier_request_is_skipped():
    late: list[bytes] = []

    def board(req):
        out = b"".join(late) + ok(req, (req.seq,))
        late[:] = [ok(req, (req.seq,))]  # answer this one twice, the second time late
        return out

    link = BridgeLink(ScriptedPort(board), timeout_s=0.1)
    assert [link.read_csr(0) for _ in range(3)] == [1, 2, 3]
    assert link.failures == 0


def test_link_statuses_are_retried_with_the_same_seq_and_others_raise():
    answers = [Status.BAD_SYNC, Status.TRUNCATED, Status.OK, Status.BUSY]

    def board(req):
        return p.encode_response(Response(0 if answers[0] == Status.BAD_SYNC else req.cmd,
                                          req.seq, answers.pop(0), ()))

    port = ScriptedPort(board)
    link = BridgeLink(port, timeout_s=0.1, quiet_s=0.001)
    link.write_csr(0x0C, 5)
    assert [r.seq for r in port.requests] == [1, 1, 1] and link.failures == 2
    with pytest.raises(p.StatusError, match=r"the board on scripted refused WRITE_MEM \(seq 2\) "
                                            r"of 1 words at 0x40: BUSY \(the core is running; "
                                            r"memory is not accessible until its run is done\)"
                       ) as info:
        link.request(Command.WRITE_MEM, (0x40, 1))
    assert info.value.status == Status.BUSY


def test_a_response_for_another_command_is_a_sequence_error():
    link = BridgeLink(ScriptedPort(lambda req: p.encode_response(
        Response(Command.READ_MEM, req.seq, Status.OK, (1,)))), timeout_s=0.1)
    with pytest.raises(p.SequenceError, match=r"answered READ_CSR \(seq 1\) with a READ_MEM "
                                              r"response \(seq 1\); expected READ_CSR"):
        link.read_csr(0)


def test_a_damaged_response_length_is_retried_then_reported():
    def board(req):
        frame = bytearray(ok(req, (1,)))
        frame[4] = 0xFF  # length 255 + 256 * 0
        return bytes(frame)

    link = BridgeLink(ScriptedPort(board), timeout_s=0.05, retries=1, quiet_s=0.001)
    with pytest.raises(p.LengthError, match=r"READ_CSR \(seq 1\) failed 2 times; last: the "
                                            r"response to READ_CSR \(seq 1\) has length field "
                                            r"255; expected a multiple of 4 up to 4096"):
        link.read_csr(0)


def test_ident_checks_the_board():
    link = BridgeLink(ScriptedPort(lambda req: ok(req, (7, 32, 16, 2, 1))), timeout_s=0.1)
    with pytest.raises(p.ProtocolError, match=r"the board on scripted speaks bridge protocol "
                                              r"version 7; this host speaks 1"):
        link.ident()
    link = BridgeLink(ScriptedPort(lambda req: ok(req, (1, 30, 16, 2, 1))), timeout_s=0.1)
    with pytest.raises(p.ProtocolError, match=r"reports max_payload=30: expected a multiple"):
        link.ident()
    link = BridgeLink(ScriptedPort(lambda req: ok(req, (1, 32))), timeout_s=0.1)
    with pytest.raises(p.ProtocolError, match=r"ID response has 2 words; expected 5"):
        link.ident()
    board = BridgeLink(ScriptedPort(lambda req: ok(req, ID_WORDS)), timeout_s=0.1).ident()
    assert board.hw_ver_tuple == (0, 0, 2) and board.mem_words == 1024


def test_link_arguments_are_checked():
    with pytest.raises(TypeError, match=r"port must have read\(\) and write\(\) \(a "
                                        r"serial.Serial\), got int"):
        BridgeLink(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"timeout_s=0; expected a positive number"):
        BridgeLink(ScriptedPort(ok), timeout_s=0)
    with pytest.raises(ValueError, match=r"retries=-1; expected an int >= 0"):
        BridgeLink(ScriptedPort(ok), retries=-1)
