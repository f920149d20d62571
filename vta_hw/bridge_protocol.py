"""The UART host bridge's protocol: framed, checked requests and responses over a byte stream
(docs/boards.md, "UART host bridge"). Pure Python (no Amaranth), shared by the gateware
(:mod:`vtakit.boards.bridge`), the driver's ``fpga`` device and the tests' board emulator; it
lives in ``vta_hw`` because both sides may import ``vta_hw`` (``boards -> vta_hw``,
``driver -> vta_hw``) and neither may import the other.

Request (host → board); multi-byte fields little-endian except the CRC::

    offset  bytes  field
    0       1      SYNC = 0xA5
    1       1      CMD
    2       1      SEQ      chosen by the host, echoed in the response
    3       2      LEN      payload bytes: a multiple of 4, at most 4 + max_payload
    5       LEN    PAYLOAD  LEN / 4 little-endian 32-bit words
    5+LEN   2      CRC      CRC-16/CCITT-FALSE of bytes 1 .. 4+LEN, most significant byte first

Response (board → host)::

    0       1      SYNC = 0x5A
    1       1      CMD      echoed
    2       1      SEQ      echoed
    3       1      STATUS   :class:`Status`
    4       2      LEN
    6       LEN    PAYLOAD
    6+LEN   2      CRC      of bytes 1 .. 5+LEN

Commands (payload words → response words):

=========== ==== =========================== ============================================
command     code request payload             response payload (when OK)
=========== ==== =========================== ============================================
WRITE_MEM   0x01 addr, w[0], ..., w[n-1]     none; 1 <= n <= max_payload / 4
READ_MEM    0x02 addr, n                     w[0], ..., w[n-1]
WRITE_CSR   0x03 addr, value                 none
READ_CSR    0x04 addr                        value
ID          0x05 none                        PROTOCOL_VERSION, max_payload, mem_words,
                                             HW_VER (CSR 0x10), HW_ID (CSR 0x14)
=========== ==== =========================== ============================================

Memory addresses are byte addresses of 32-bit words (multiples of 4); the host does
read-modify-write for anything narrower. Worked example, write the words 1 and 2 at 0x100
with SEQ 7: ``a5 01 07 0c 00 | 00 01 00 00 | 01 00 00 00 | 02 00 00 00 | crc_hi crc_lo``;
the board answers ``5a 01 07 00 00 00 crc_hi crc_lo`` (OK, no payload).

Rules the bridge keeps, and the host relies on:

* **Nothing is executed before its CRC is checked.** The bridge buffers a whole WRITE_MEM
  payload (``max_payload`` bytes, 256 by default: one small block RAM) and touches memory or a
  register only once the CRC matched; the host splits larger transfers.
* A frame that breaks the framing is rejected with one response, sent once the line has been
  quiet for the bridge's inter-byte timeout (so the rest of a damaged frame never starts a
  new one): BAD_SYNC (bytes that did not start with SYNC), LINE_ERROR (a UART stop bit was
  low), BAD_LENGTH (LEN not a multiple of 4 or too long), BAD_CRC, TRUNCATED (the line went
  quiet inside a frame; answered at once). Then CMD and SEQ echo whatever arrived (0 if
  nothing).
* A frame with a good CRC gets BAD_COMMAND, BAD_LENGTH (LEN wrong for CMD, or READ_MEM's
  ``n`` outside 1 .. max_payload / 4), MISALIGNED, OUT_OF_RANGE (a memory word at or past
  ``mem_words``, a CSR address past 0xFF), BUSY (a memory command while the core runs) or OK.
* **A write is executed at most once.** A WRITE_MEM or WRITE_CSR whose SEQ equals the SEQ of
  the last executed frame is answered OK without being executed again: a host that lost a
  response resends the request with the same SEQ (a repeated CTRL START must not start the
  core twice). A host numbers new requests consecutively and begins a session with ID (a
  read, always executed), so a new request never repeats the last executed SEQ.
* One request at a time: bytes that arrive while the bridge executes or answers are dropped.

The host end (:class:`BridgeLink`) trusts nothing it receives: a request returns or raises
within ``(1 + retries) * timeout_s`` however the line behaves, a response's size is bounded
by ``max_payload`` and must be its command's (:func:`response_words`), the ID's fields are
checked (:func:`check_board_id`), and a failing port is a :class:`PortError`; every error is a
:class:`ProtocolError` saying what arrived and what was expected.
"""

from __future__ import annotations

import binascii
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

__all__ = [
    "PROTOCOL_VERSION", "REQUEST_SYNC", "RESPONSE_SYNC", "CRC_ALGORITHM", "CRC_BYTES",
    "DEFAULT_MAX_PAYLOAD", "MAX_PAYLOAD_LIMIT", "MIN_MAX_PAYLOAD", "ID_WORDS", "CSR_ADDR_LIMIT",
    "MAX_MEM_WORDS", "Command", "Status", "LINK_STATUSES", "Request", "Response", "BoardId",
    "crc16", "encode_request", "decode_request", "encode_response", "decode_response",
    "request_length_ok", "response_words", "check_board_id", "ProtocolError", "FrameError",
    "SyncError", "LengthError", "CrcError", "TruncatedError", "CommandError", "StatusError",
    "SequenceError", "NoResponse", "ResponseLengthError", "IdError", "PortError",
    "SerialLike", "BridgeLink",
]

PROTOCOL_VERSION = 1
REQUEST_SYNC = 0xA5
RESPONSE_SYNC = 0x5A

#: The CRC, by its name in ``amaranth.lib.crc.catalog``: the gateware builds its CRC engines
#: from this entry, the host computes the same function with :func:`crc16`
#: (tests/boards/test_protocol.py proves them equal). Width 16, polynomial 0x1021, initial
#: 0xFFFF, not reflected, no final XOR; sent most significant byte first, so that the CRC
#: register after a whole frame (CRC included) holds 0.
CRC_ALGORITHM = "CRC16_CCITT_FALSE"
CRC_BYTES = 2

DEFAULT_MAX_PAYLOAD = 256
MIN_MAX_PAYLOAD = 32
MAX_PAYLOAD_LIMIT = 4096
ID_WORDS = 5
CSR_ADDR_LIMIT = 0x100
#: The most memory an ID may report: 32-bit words behind a 32-bit byte address (the range
#: ``boards.bridge.UartBridge`` accepts for ``mem_words``).
MAX_MEM_WORDS = 1 << 30

REQUEST_HEADER_BYTES = 5   # SYNC CMD SEQ LEN(2)
RESPONSE_HEADER_BYTES = 6  # SYNC CMD SEQ STATUS LEN(2)


class Command(IntEnum):
    WRITE_MEM = 0x01
    READ_MEM = 0x02
    WRITE_CSR = 0x03
    READ_CSR = 0x04
    ID = 0x05


class Status(IntEnum):
    OK = 0
    BAD_CRC = 1
    TRUNCATED = 2
    BAD_LENGTH = 3
    BAD_COMMAND = 4
    OUT_OF_RANGE = 5
    BUSY = 6
    BAD_SYNC = 7
    LINE_ERROR = 8
    MISALIGNED = 9


#: Statuses that say the request was damaged on the way (the host resends it).
LINK_STATUSES = frozenset({Status.BAD_CRC, Status.TRUNCATED, Status.BAD_LENGTH,
                           Status.BAD_SYNC, Status.LINE_ERROR})

_STATUS_MEANING = {
    Status.OK: "done",
    Status.BAD_CRC: "the request arrived with a wrong CRC (corrupted on the line)",
    Status.TRUNCATED: "the request stopped in the middle (the line went quiet for longer than "
                      "the bridge's inter-byte timeout)",
    Status.BAD_LENGTH: "the length field is not valid (not a multiple of 4, too long, or wrong "
                       "for the command)",
    Status.BAD_COMMAND: "the bridge does not know the command",
    Status.OUT_OF_RANGE: "the address lies past the end of the board's memory (or past CSR "
                         "0xff)",
    Status.BUSY: "the core is running; memory is not accessible until its run is done",
    Status.BAD_SYNC: "bytes arrived that did not start with the sync byte 0xa5",
    Status.LINE_ERROR: "a UART framing error (stop bit low): a wrong baud rate or a noisy line",
    Status.MISALIGNED: "the address is not a multiple of 4",
}


def status_name(status: int) -> str:
    try:
        return Status(status).name
    except ValueError:
        return f"unknown status {status:#04x}"


def command_name(cmd: int) -> str:
    try:
        return Command(cmd).name
    except ValueError:
        return f"unknown command {cmd:#04x}"


def crc16(data: bytes | bytearray | memoryview) -> int:
    """CRC-16/CCITT-FALSE (:data:`CRC_ALGORITHM`) of ``data``."""
    return binascii.crc_hqx(data, 0xFFFF)


# ---- errors -------------------------------------------------------------------------------
class ProtocolError(Exception):
    """A frame or an exchange broke the protocol."""


class FrameError(ProtocolError):
    """A frame is malformed; ``status`` is what a bridge answers to such a request."""

    status = Status.BAD_CRC


class SyncError(FrameError):
    status = Status.BAD_SYNC


class LengthError(FrameError):
    status = Status.BAD_LENGTH


class CrcError(FrameError):
    status = Status.BAD_CRC


class TruncatedError(FrameError):
    status = Status.TRUNCATED


class CommandError(FrameError):
    status = Status.BAD_COMMAND


class StatusError(ProtocolError):
    """The board answered a request with a status other than OK.

    Attributes
    ----------
    status : int
    request : Request | None
    """

    def __init__(self, message: str, status: int, request: Request | None = None):
        super().__init__(message)
        self.status = status
        self.request = request


class SequenceError(ProtocolError):
    """A response that does not belong to the request it answers."""


class NoResponse(ProtocolError, TimeoutError):
    """The board sent no (complete) response within the timeout."""


class ResponseLengthError(ProtocolError):
    """An OK response (its CRC good) whose payload is not the length its command answers with
    (:func:`response_words`): a board that does not keep the protocol, not a damaged line, so
    it is not retried."""


class IdError(ProtocolError, ValueError):
    """The ID response reports a value outside the range the protocol, the configuration or
    the host takes (:func:`check_board_id`, ``FpgaDevice``)."""


class PortError(ProtocolError, ConnectionError):
    """The port itself failed: the serial driver or the socket raised, the port was closed, or
    it is at end of file. Not retried (the next attempt would meet the same port)."""


# ---- frames -------------------------------------------------------------------------------
def _check_u8(what: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFF:
        raise ValueError(f"{what}={value!r}: expected an int in 0..255")
    return value


def _words_bytes(what: str, words: Sequence[int]) -> bytes:
    out = bytearray()
    for k, w in enumerate(words):
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= 0xFFFFFFFF:
            raise ValueError(f"{what} word {k} = {w!r}: expected an int in 0..2**32-1")
        out += w.to_bytes(4, "little")
    return bytes(out)


def _bytes_words(data: bytes) -> tuple[int, ...]:
    return tuple(int.from_bytes(data[k:k + 4], "little") for k in range(0, len(data), 4))


def _head(frame: bytes, n: int = 12) -> str:
    return frame[:n].hex(" ") + (" ..." if len(frame) > n else "")


@dataclass(frozen=True)
class Request:
    """One request: ``cmd`` (a :class:`Command`, or any byte to test a board), ``seq`` and the
    payload ``words``."""

    cmd: int
    seq: int
    words: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"{command_name(self.cmd)} (seq {self.seq})"


@dataclass(frozen=True)
class Response:
    """One response: the echoed ``cmd`` and ``seq``, ``status`` and the payload ``words``."""

    cmd: int
    seq: int
    status: int
    words: tuple[int, ...] = ()


@dataclass(frozen=True)
class BoardId:
    """The ID response: what the bridge and the core on a board are.

    Attributes
    ----------
    protocol_version : int
    max_payload : int
        Most data bytes in one WRITE_MEM or READ_MEM.
    mem_words : int
        32-bit words of board memory (addresses ``0 .. 4 * mem_words - 1``).
    hw_ver : int
        The core's HW_VER register, ``(major << 16) | (minor << 8) | patch``.
    hw_id : int
        The core's HW_ID register: the configuration hash (``HwConfig.hash_u32``).
    """

    protocol_version: int
    max_payload: int
    mem_words: int
    hw_ver: int
    hw_id: int

    @classmethod
    def from_words(cls, words: Sequence[int]) -> BoardId:
        if len(words) != ID_WORDS:
            raise LengthError(f"ID response has {len(words)} words; expected {ID_WORDS}")
        return cls(*words)

    def to_words(self) -> tuple[int, ...]:
        return (self.protocol_version, self.max_payload, self.mem_words, self.hw_ver,
                self.hw_id)

    @property
    def hw_ver_tuple(self) -> tuple[int, int, int]:
        v = self.hw_ver
        return ((v >> 16) & 0xFF, (v >> 8) & 0xFF, v & 0xFF)


def check_board_id(board: BoardId, name: str = "the board") -> BoardId:
    """``board`` if every field is one this protocol allows, else :class:`IdError` saying the
    value received and the range expected: the protocol version, ``max_payload``
    (:func:`check_max_payload`), ``mem_words`` (1 .. :data:`MAX_MEM_WORDS`) and HW_VER (three
    bytes, the top byte 0). HW_ID (any 32-bit hash) is the caller's to compare with its
    configuration. ``name`` says which board (``"the board on /dev/ttyUSB1"``)."""
    if board.protocol_version != PROTOCOL_VERSION:
        raise IdError(f"{name} speaks bridge protocol version {board.protocol_version}; this "
                      f"host speaks {PROTOCOL_VERSION}: rebuild the bitstream or update vtakit")
    try:
        check_max_payload(board.max_payload)
    except ValueError as err:
        raise IdError(f"{name} reports {err} (ID word 1)") from None
    if not 1 <= board.mem_words <= MAX_MEM_WORDS:
        raise IdError(f"{name} reports mem_words={board.mem_words} (ID word 2); expected "
                      f"1..{MAX_MEM_WORDS} (2**30: 32-bit words behind a 32-bit byte address)")
    if board.hw_ver >> 24:
        raise IdError(f"{name} reports HW_VER={board.hw_ver:#010x} (ID word 3); expected "
                      f"(major << 16) | (minor << 8) | patch, at most 0x00ffffff")
    return board


def check_max_payload(max_payload: int) -> int:
    """``ValueError`` unless ``max_payload`` is a multiple of 4 in
    :data:`MIN_MAX_PAYLOAD` .. :data:`MAX_PAYLOAD_LIMIT`."""
    if isinstance(max_payload, bool) or not isinstance(max_payload, int) or max_payload % 4 \
            or not MIN_MAX_PAYLOAD <= max_payload <= MAX_PAYLOAD_LIMIT:
        raise ValueError(f"max_payload={max_payload!r}: expected a multiple of 4 in "
                         f"{MIN_MAX_PAYLOAD}..{MAX_PAYLOAD_LIMIT}")
    return max_payload


def encode_request(req: Request, max_payload: int = DEFAULT_MAX_PAYLOAD) -> bytes:
    """The frame of ``req``. ``ValueError`` for a field out of range or a payload longer than
    ``4 + max_payload`` bytes (split it)."""
    _check_u8("cmd", req.cmd)
    _check_u8("seq", req.seq)
    payload = _words_bytes("payload", req.words)
    if len(payload) > 4 + max_payload:
        raise ValueError(f"{req.describe()}: payload of {len(payload)} bytes; expected at most "
                         f"{4 + max_payload} (4 + max_payload): split the transfer")
    body = bytes([req.cmd, req.seq]) + len(payload).to_bytes(2, "little") + payload
    return bytes([REQUEST_SYNC]) + body + crc16(body).to_bytes(CRC_BYTES, "big")


def encode_response(resp: Response) -> bytes:
    """The frame of ``resp`` (what a board sends)."""
    _check_u8("cmd", resp.cmd)
    _check_u8("seq", resp.seq)
    _check_u8("status", resp.status)
    payload = _words_bytes("payload", resp.words)
    if len(payload) > 0xFFFF:
        raise ValueError(f"response payload of {len(payload)} bytes; expected at most 65535")
    body = bytes([resp.cmd, resp.seq, resp.status]) + len(payload).to_bytes(2, "little") \
        + payload
    return bytes([RESPONSE_SYNC]) + body + crc16(body).to_bytes(CRC_BYTES, "big")


def _check_frame(kind: str, frame: bytes, sync: int, header: int, max_len: int) -> int:
    """Common checks of a whole frame; returns LEN."""
    if len(frame) < header + CRC_BYTES:
        raise TruncatedError(f"{kind} of {len(frame)} bytes ({_head(frame)}); expected at least "
                             f"{header + CRC_BYTES} (header and CRC)")
    if frame[0] != sync:
        raise SyncError(f"{kind} starts with {frame[0]:#04x}; expected the sync byte {sync:#04x}")
    length = int.from_bytes(frame[header - 2:header], "little")
    if length % 4 or length > max_len:
        raise LengthError(f"{kind} length field {length}; expected a multiple of 4 up to "
                          f"{max_len}")
    want = header + length + CRC_BYTES
    if len(frame) < want:
        raise TruncatedError(f"{kind} of {len(frame)} bytes; its length field {length} makes "
                             f"{want}")
    if len(frame) > want:
        raise LengthError(f"{kind} of {len(frame)} bytes; its length field {length} makes {want}")
    got = int.from_bytes(frame[-CRC_BYTES:], "big")
    computed = crc16(frame[1:-CRC_BYTES])
    if got != computed:
        raise CrcError(f"{kind} CRC mismatch: received {got:#06x}, computed {computed:#06x} over "
                       f"{len(frame) - 1 - CRC_BYTES} bytes (frame {_head(frame)})")
    return length


def response_words(req: Request) -> int:
    """Payload words of the OK response to ``req``: READ_MEM its count, READ_CSR 1, ID
    :data:`ID_WORDS`, the writes none."""
    if req.cmd == Command.READ_MEM:
        return req.words[1] if len(req.words) > 1 else 0
    if req.cmd == Command.READ_CSR:
        return 1
    return ID_WORDS if req.cmd == Command.ID else 0


def request_length_ok(cmd: int, words: Sequence[int], max_payload: int) -> bool:
    """Whether the payload has the length ``cmd`` takes (READ_MEM: also its count)."""
    n = len(words)
    if cmd == Command.WRITE_MEM:
        return 2 <= n <= 1 + max_payload // 4
    if cmd == Command.READ_MEM:
        return n == 2 and 1 <= words[1] <= max_payload // 4
    return n == {Command.WRITE_CSR: 2, Command.READ_CSR: 1, Command.ID: 0}[Command(cmd)]


def decode_request(frame: bytes, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Request:
    """Check a whole request frame as a bridge does and return it; a :class:`FrameError`
    (``SyncError``, ``LengthError``, ``CrcError``, ``TruncatedError``, ``CommandError``) whose
    ``status`` is the bridge's answer otherwise. Range and BUSY checks are the board's."""
    length = _check_frame("request", bytes(frame), REQUEST_SYNC, REQUEST_HEADER_BYTES,
                          4 + max_payload)
    cmd, seq = frame[1], frame[2]
    words = _bytes_words(bytes(frame[REQUEST_HEADER_BYTES:REQUEST_HEADER_BYTES + length]))
    if cmd not in Command._value2member_map_:
        raise CommandError(f"request command {cmd:#04x}; expected one of "
                           + ", ".join(f"{c.value:#04x} {c.name}" for c in Command))
    if not request_length_ok(cmd, words, max_payload):
        raise LengthError(f"{command_name(cmd)} request with {len(words)} payload words "
                          f"{list(words)[:3]}: not a valid length for the command")
    return Request(cmd, seq, words)


def decode_response(frame: bytes, max_payload: int = MAX_PAYLOAD_LIMIT) -> Response:
    """Check a whole response frame and return it (``FrameError`` subclasses otherwise)."""
    length = _check_frame("response", bytes(frame), RESPONSE_SYNC, RESPONSE_HEADER_BYTES,
                          max(max_payload, 4 * ID_WORDS))
    return Response(frame[1], frame[2], frame[3],
                    _bytes_words(bytes(frame[RESPONSE_HEADER_BYTES:RESPONSE_HEADER_BYTES
                                             + length])))


# ---- the host side of a link --------------------------------------------------------------
class SerialLike(Protocol):
    """What :class:`BridgeLink` needs of a port (a ``serial.Serial`` has it): ``read(n)``
    returns up to ``n`` bytes, fewer once ``timeout`` seconds have passed (it must honour
    ``timeout``: the link's deadlines rest on it), and ``write(data)`` sends them all."""

    timeout: float | None

    def read(self, size: int = 1) -> bytes: ...

    def write(self, data: bytes) -> int | None: ...


#: A read that returns no bytes in under this long although it was given at least
#: :data:`_EOF_MIN_TIMEOUT_S` to wait did not wait: the port is at end of file (a serial port
#: waits out its timeout). :data:`_EOF_READS` of them in a row are a :class:`PortError`.
_EOF_AT_ONCE_S = 0.001
_EOF_MIN_TIMEOUT_S = 0.005
_EOF_READS = 3

#: The exceptions a port raises when it fails: pyserial's ``SerialException`` (an
#: ``OSError``, ``PortNotOpenError`` and ``SerialTimeoutException`` included), a socket's
#: ``OSError``, a closed file object's ``ValueError``, a stream's ``EOFError``.
_PORT_ERRORS = (OSError, ValueError, EOFError)


class BridgeLink:
    """The host end of the protocol over a port: numbering, retries, timeouts, and transfers
    split into frames.

    Every request is tried at most ``1 + retries`` times: again after a response that says it
    arrived damaged (:data:`LINK_STATUSES`), a response that arrived damaged (CRC, length,
    cut off) or no response within ``timeout_s``; a retry carries the same SEQ, so the board
    executes a write at most once. Other statuses raise :class:`StatusError` at once, and so
    do an OK response of the wrong length for its command (:class:`ResponseLengthError`) or
    for another command (:class:`SequenceError`).

    Time: each attempt has ``timeout_s``, from its start to the deadline of its response,
    the discarding of input before a retry (at most half of it) and the write included; the
    whole request has a monotonic deadline of ``(1 + retries) * timeout_s``. No read waits
    past it, however many bytes keep arriving (a board that streams garbage, a line that
    never goes quiet), so :meth:`request` returns or raises within
    ``(1 + retries) * timeout_s`` (plus one read's scheduling slack) provided the port honours
    its ``timeout``; a silent board raises :class:`NoResponse` (a ``TimeoutError``).

    A failing port (pyserial's ``SerialException`` or any ``OSError``, a closed port, a port
    at end of file) raises :class:`PortError` naming the port and what happened, at once;
    no exception of the port's own leaves the link.

    Parameters
    ----------
    port : SerialLike
    timeout_s : float
        Time of one attempt (its longest wait for a response).
    retries : int
    name : str | None
        How messages name the board (default: the port's ``name`` or ``port``).
    quiet_s : float
        Before a retry, the link discards input until the line has been quiet this long
        (longer than the bridge's inter-byte timeout, after which it answers a damaged frame),
        for at most half of the attempt's ``timeout_s``.

    Attributes
    ----------
    board : BoardId | None
        The last ID response (:meth:`ident`).
    attempts, failures : int
        Requests sent (retries included) and failed attempts that were retried, for
        statistics.
    """

    def __init__(self, port: SerialLike, *, timeout_s: float = 1.0, retries: int = 2,
                 name: str | None = None, quiet_s: float = 0.05):
        for attr in ("read", "write"):
            if not callable(getattr(port, attr, None)):
                raise TypeError(f"BridgeLink: port must have read() and write() (a "
                                f"serial.Serial), got {type(port).__name__}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not 0 < timeout_s < float("inf"):
            raise ValueError(f"BridgeLink: timeout_s={timeout_s!r}; expected a positive number")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"BridgeLink: retries={retries!r}; expected an int >= 0")
        if isinstance(quiet_s, bool) or not isinstance(quiet_s, (int, float)) \
                or not 0 < quiet_s < float("inf"):
            raise ValueError(f"BridgeLink: quiet_s={quiet_s!r}; expected a positive number")
        self.port = port
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self.quiet_s = float(quiet_s)
        self.name = name or str(getattr(port, "name", None) or getattr(port, "port", None)
                                or type(port).__name__)
        self.board: BoardId | None = None
        self.attempts = 0
        self.failures = 0
        self._seq = 0
        self._empty_at_once = 0

    # ---- the port ------------------------------------------------------------------------
    def _port_failed(self, doing: str, err: BaseException) -> PortError:
        what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        return PortError(f"the connection to the board on {self.name} failed while {doing}: "
                         f"{what}; check that the board is connected and powered, and that "
                         f"no other program holds the port")

    def _port_read(self, n: int, timeout_s: float, doing: str) -> bytes:
        """One ``read(n)`` of the port with ``timeout_s``; a :class:`PortError` for an error of
        the port, a reply that is not up to ``n`` bytes, or end of file."""
        try:
            self.port.timeout = timeout_s
            start = time.monotonic()
            data = self.port.read(n)
        except _PORT_ERRORS as err:
            raise self._port_failed(doing, err) from err
        if data is None:  # a non-blocking raw stream with nothing to read
            data = b""
        if not isinstance(data, (bytes, bytearray)) or len(data) > n:
            got = f"{len(data)} bytes" if isinstance(data, (bytes, bytearray)) else \
                f"a {type(data).__name__}"
            raise PortError(f"the port {self.name} returned {got} to a read of {n} bytes "
                            f"while {doing}; expected bytes, at most {n}")
        if data or timeout_s < _EOF_MIN_TIMEOUT_S or time.monotonic() - start >= _EOF_AT_ONCE_S:
            self._empty_at_once = 0
        else:
            self._empty_at_once += 1
            if self._empty_at_once >= _EOF_READS:
                self._empty_at_once = 0
                raise PortError(f"the port {self.name} is at end of file: {_EOF_READS} reads in "
                                f"a row returned no bytes at once, although each could wait up "
                                f"to {timeout_s:.3g} s (while {doing}); expected a port that "
                                f"waits for bytes: the connection was closed")
        return bytes(data)

    def _port_write(self, frame: bytes, req: Request) -> None:
        doing = f"sending {req.describe()}"
        try:
            n = self.port.write(frame)
        except _PORT_ERRORS as err:
            raise self._port_failed(doing, err) from err
        if isinstance(n, int) and not isinstance(n, bool) and n != len(frame):
            raise PortError(f"the port {self.name} took {n} of the {len(frame)} bytes of "
                            f"{req.describe()}; expected all of them")

    # ---- raw exchange ------------------------------------------------------------------
    def _read(self, n: int, deadline: float, doing: str) -> bytes:
        """Up to ``n`` bytes, fewer if ``deadline`` (``time.monotonic()``) passes first."""
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            buf += self._port_read(n - len(buf), left, doing)
        return bytes(buf)

    def _drain(self, end: float) -> tuple[int, bool]:
        """Discard input until the line has been quiet for ``quiet_s``, or until ``end``;
        the bytes discarded and whether the line went quiet."""
        discarded = 0
        quiet = False
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            got = self._port_read(4096, min(self.quiet_s, left),
                                  "discarding input before a retry")
            if not got:
                quiet = True
                break
            discarded += len(got)
        reset = getattr(self.port, "reset_input_buffer", None)
        if callable(reset):
            try:
                reset()
            except _PORT_ERRORS as err:
                raise self._port_failed("discarding input before a retry", err) from err
        return discarded, quiet

    def _receive(self, req: Request, deadline: float, note: str = "") -> Response:
        """The response to ``req``: skips bytes before a SYNC and whole responses to earlier
        requests; raises ``NoResponse`` or a ``FrameError`` for a damaged response."""
        max_len = max(self.board.max_payload if self.board else MAX_PAYLOAD_LIMIT,
                      4 * ID_WORDS)
        doing = f"waiting for the response to {req.describe()}"
        skipped = others = 0

        def extra() -> str:
            said = [f"{skipped} bytes without a sync byte arrived"] if skipped else []
            if others:
                said.append(f"{others} responses to other requests arrived")
            return f" ({'; '.join(said + ([note] if note else []))})" if said or note else ""

        while True:
            b = self._read(1, deadline, doing)
            if not b:
                raise NoResponse(f"no response to {req.describe()} from the board on "
                                 f"{self.name} within {self.timeout_s:g} s{extra()}")
            if b[0] != RESPONSE_SYNC:
                skipped += 1
                continue
            head = b + self._read(RESPONSE_HEADER_BYTES - 1, deadline, doing)
            if len(head) < RESPONSE_HEADER_BYTES:
                raise TruncatedError(f"the response to {req.describe()} stopped after "
                                     f"{len(head)} bytes ({_head(head)}){extra()}")
            length = int.from_bytes(head[4:6], "little")
            if length % 4 or length > max_len:
                raise LengthError(f"the response to {req.describe()} has length field "
                                  f"{length}; expected a multiple of 4 up to {max_len} "
                                  f"(header {_head(head)})")
            rest = self._read(length + CRC_BYTES, deadline, doing)
            frame = head + rest
            if len(rest) < length + CRC_BYTES:
                raise TruncatedError(f"the response to {req.describe()} stopped after "
                                     f"{len(frame)} of {RESPONSE_HEADER_BYTES + length + 2} "
                                     f"bytes ({_head(frame)}){extra()}")
            resp = decode_response(frame, max_len)
            if resp.status in LINK_STATUSES or resp.seq == req.seq:
                return resp
            others += 1  # a late response to an earlier request (its SEQ differs): not ours

    def request(self, cmd: int, words: Sequence[int] = ()) -> tuple[int, ...]:
        """Send one request (with retries) and return the words of its OK response, within
        ``(1 + retries) * timeout_s`` (the class's "Time")."""
        self._seq = (self._seq + 1) & 0xFF
        req = Request(int(cmd), self._seq, tuple(words))
        frame = encode_request(req, self.board.max_payload if self.board else MAX_PAYLOAD_LIMIT)
        budget_end = time.monotonic() + (1 + self.retries) * self.timeout_s
        last: Exception | None = None
        tries = 0
        while tries < 1 + self.retries:
            start = time.monotonic()
            if tries and start >= budget_end:
                break
            attempt_end = min(start + self.timeout_s, budget_end)
            note = ""
            if tries:
                self.failures += 1
                discarded, quiet = self._drain(min(start + self.timeout_s / 2, attempt_end))
                if not quiet:
                    note = (f"the line did not go quiet for {self.quiet_s:g} s before the "
                            f"request was sent: {discarded} bytes discarded")
            tries += 1
            self.attempts += 1
            self._port_write(frame, req)
            try:
                resp = self._receive(req, attempt_end, note)
            except (FrameError, NoResponse) as err:
                last = err
                continue
            if resp.status in LINK_STATUSES:
                last = StatusError(f"the board answered {status_name(resp.status)}: "
                                   f"{_STATUS_MEANING[Status(resp.status)]}", resp.status, req)
                continue
            if resp.cmd != req.cmd:
                raise SequenceError(f"the board on {self.name} answered {req.describe()} with "
                                    f"a {command_name(resp.cmd)} response (seq {resp.seq}); "
                                    f"expected {command_name(req.cmd)}")
            if resp.status != Status.OK:
                meaning = _STATUS_MEANING.get(Status(resp.status)) if resp.status in \
                    Status._value2member_map_ else "not a status of this protocol"
                raise StatusError(f"the board on {self.name} refused {req.describe()} "
                                  f"{_args(req)}: {status_name(resp.status)} ({meaning})",
                                  resp.status, req)
            want = response_words(req)
            if len(resp.words) != want:
                args = f" {_args(req)}" if _args(req) else ""
                raise ResponseLengthError(
                    f"the board on {self.name} answered {req.describe()}{args} with a payload "
                    f"of the wrong length: {command_name(req.cmd)} response has "
                    f"{_n_words(len(resp.words))}; expected {want} ({4 * len(resp.words)} bytes "
                    f"received, {4 * want} expected)")
            return resp.words
        assert last is not None
        hint = ("check that the board is programmed with the vtakit bitstream, connected to "
                f"{self.name}, and that both sides use the same baud rate"
                if isinstance(last, NoResponse) else
                "the line corrupts frames: check the cable, the baud rate and the ground")
        msg = (f"{req.describe()} failed {tries} time{'s' if tries > 1 else ''}; last: {last}; "
               f"{hint}")
        if isinstance(last, StatusError):
            raise StatusError(msg, last.status, req) from None
        raise type(last)(msg) from None

    # ---- commands ----------------------------------------------------------------------
    def ident(self) -> BoardId:
        """The ID of the board (also remembered in :attr:`board`), its fields checked
        (:func:`check_board_id`: an :class:`IdError` for a value out of range)."""
        board = BoardId.from_words(self.request(Command.ID))  # request() checked its length
        self.board = check_board_id(board, f"the board on {self.name}")
        return board

    def _max_words(self) -> int:
        if self.board is None:
            self.ident()
        assert self.board is not None
        return self.board.max_payload // 4

    def read_csr(self, addr: int) -> int:
        return self.request(Command.READ_CSR, (addr,))[0]

    def write_csr(self, addr: int, value: int) -> None:
        self.request(Command.WRITE_CSR, (addr, value))

    def write_mem(self, addr: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` (a multiple of 4 bytes) at the word-aligned byte address ``addr``,
        in frames of at most ``max_payload`` bytes."""
        data = bytes(data)
        if addr % 4 or len(data) % 4:
            raise ValueError(f"write_mem: addr={addr:#x}, {len(data)} bytes; expected a "
                             f"multiple of 4 for both")
        step = 4 * self._max_words()
        for k in range(0, len(data), step):
            chunk = data[k:k + step]
            self.request(Command.WRITE_MEM, (addr + k, *_bytes_words(chunk)))

    def read_mem(self, addr: int, nbytes: int) -> bytes:
        """Read ``nbytes`` (a multiple of 4) at the word-aligned byte address ``addr``."""
        if addr % 4 or nbytes % 4:
            raise ValueError(f"read_mem: addr={addr:#x}, {nbytes} bytes; expected a multiple of "
                             f"4 for both")
        step = 4 * self._max_words()
        out = bytearray()
        for k in range(0, nbytes, step):
            n = min(step, nbytes - k) // 4
            words = self.request(Command.READ_MEM, (addr + k, n))
            assert len(words) == n  # request() checked the response's length
            out += _words_bytes("read", words)
        return bytes(out)


def _n_words(n: int) -> str:
    return f"{n} word" if n == 1 else f"{n} words"


def _args(req: Request) -> str:
    if req.cmd in (Command.WRITE_MEM, Command.READ_MEM) and req.words:
        n = len(req.words) - 1 if req.cmd == Command.WRITE_MEM else \
            (req.words[1] if len(req.words) > 1 else 0)
        return f"of {n} words at {req.words[0]:#x}"
    if req.cmd in (Command.WRITE_CSR, Command.READ_CSR) and req.words:
        return f"of CSR {req.words[0]:#04x}"
    return ""
