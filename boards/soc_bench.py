"""The cocotb test that runs inside the SoC's simulator process: a simulated board on a TCP
socket.

Started by :class:`vtakit.boards.soc_sim.SocSimulation` (``COCOTB_TEST_MODULES`` names this
module). The SoC's UART lines are driven by ``cocotbext-uart``: a ``UartSource`` on ``rx`` and a
``UartSink`` on ``tx``, both at the bench's bit time. The bench listens on a TCP port of
127.0.0.1 (one host at a time: the ``fpga`` device opens ``socket://127.0.0.1:PORT``) and
forwards bytes between that socket and the line, looking at the socket without blocking once
per character time, so simulated time keeps going while the host thinks (the core runs, the
bridge's inter-byte timeout counts). Two exceptions, both to keep wall-clock scheduling of the
host out of what the simulated line carries:

* while the host has sent only part of a request frame (the bench follows the requests' length
  fields), the bench waits for the rest (up to :data:`FRAME_WAIT_S`) before simulating on: the
  host writes a frame in one call, and a simulated millisecond is a wall-clock second, so the
  operating system's scheduling would otherwise show on the line as gaps of thousands of
  cycles; a frame still incomplete after that lets the line go quiet, and the bridge answers
  TRUNCATED as on a board;
* while no host is connected and nothing is left to send, simulated time stands still.

Environment: ``VTAKIT_SOC_BIT_NS`` (the bit time), ``VTAKIT_SOC_MAX_PAYLOAD`` (the bridge's),
``VTAKIT_SOC_CONTROL``. It reports to the harness over that Unix socket (pickled tuples):

* on start: ``("ready", port)``;
* ``("corrupt", n)`` -> ``("ok",)``: flip one bit in each of the next ``n`` request frames
  from the host (bit 0 of the middle byte of the payload, or of the CRC's last byte for a
  frame without payload), so the bridge must reject them (BAD_CRC);
* ``("stats",)`` -> ``("stats", {...})``: simulated cycles, request frames and bytes from the
  host, bytes to the host, frames corrupted, the SoC's ``frame_error`` and ``running`` outputs;
* ``("quit",)`` -> ``("bye",)``, and the simulation ends.
"""

from __future__ import annotations

import os
import select
import socket
import warnings

import cocotb
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import RisingEdge, Timer

from vtakit.vta_hw.bridge_protocol import CRC_BYTES, REQUEST_HEADER_BYTES, REQUEST_SYNC

#: The clock period; ``clk_hz`` of the simulated SoC is 1e9 / PERIOD_NS.
PERIOD_NS = 10
#: Longest wait for the rest of a request frame the host has started to send.
FRAME_WAIT_S = 2.0


class RequestFramer:
    """Follows the host's byte stream frame by frame (by SYNC and the length field) and
    corrupts frames on request.

    Parameters
    ----------
    max_payload : int
        The bridge's ``max_payload``: a length field that is not a multiple of 4 or exceeds
        ``4 + max_payload`` ends the frame after its header, as far as the line is concerned
        (the bridge rejects it there).

    Attributes
    ----------
    corrupt : int
        Frames still to corrupt.
    frames, corrupted, bytes : int
        Request frames seen, frames corrupted, bytes passed.
    """

    def __init__(self, max_payload: int):
        self.max_payload = max_payload
        self.corrupt = 0
        self.frames = self.corrupted = self.bytes = 0
        self._pos = 0                    # bytes of the current frame seen (0: between frames)
        self._total: int | None = None   # its length, once the length field is in
        self._len_lo = 0
        self._flip_at: int | None = None

    @property
    def mid_frame(self) -> bool:
        """Part of a frame has passed and the rest is still due."""
        return self._pos != 0

    def resync(self) -> None:
        """The line went quiet inside a frame: the next byte starts afresh (as in the bridge)."""
        self._pos, self._total, self._flip_at = 0, None, None

    def feed(self, data: bytes) -> bytes:
        """The bytes to put on the line for ``data`` from the host."""
        out = bytearray()
        for b in data:
            self.bytes += 1
            if self._pos == 0 and b != REQUEST_SYNC:
                out.append(b)  # not a frame: the bridge answers BAD_SYNC after a quiet line
                continue
            k = self._pos
            self._pos += 1
            if k == 3:
                self._len_lo = b
            elif k == 4:
                length = self._len_lo | b << 8
                ok = length % 4 == 0 and length <= 4 + self.max_payload
                self._total = REQUEST_HEADER_BYTES + (length + CRC_BYTES if ok else 0)
                if ok and self.corrupt:
                    self.corrupt -= 1
                    self._flip_at = REQUEST_HEADER_BYTES + (
                        length // 2 if length else CRC_BYTES - 1)
            if k == self._flip_at:
                b ^= 0x01
                self.corrupted += 1
                self._flip_at = None
            out.append(b)
            if self._pos == self._total:
                self.frames += 1
                self.resync()
        return bytes(out)


async def _reset(dut) -> None:
    dut.rst.value = 1
    for _ in range(4):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


@cocotb.test()
async def serve(dut) -> None:
    from multiprocessing.connection import Client

    from cocotbext.uart import UartSink, UartSource

    bit_ns = int(os.environ["VTAKIT_SOC_BIT_NS"])
    baud = round(1e9 / bit_ns)
    # cocotbext-uart times a bit as int(1e9 / baud) ns: it must be the SoC's bit exactly
    assert int(1e9 / baud) == bit_ns, (bit_ns, baud)
    framer = RequestFramer(int(os.environ["VTAKIT_SOC_MAX_PAYLOAD"]))
    ctrl = Client(os.environ["VTAKIT_SOC_CONTROL"], family="AF_UNIX")
    Clock(dut.clk, PERIOD_NS, unit="ns", impl="gpi").start()  # in C: no Python per cycle
    dut.rx.value = 1
    await _reset(dut)
    with warnings.catch_warnings():
        # cocotbext-uart 0.1.4 idles the line with cocotb 1's setimmediatevalue, deprecated
        # (and still working) in cocotb 2
        warnings.filterwarnings("ignore", category=DeprecationWarning,
                                message=r"Use `handle\.set\(Immediate")
        source = UartSource(dut.rx, baud=baud, bits=8, stop_bits=1)
    sink = UartSink(dut.tx, baud=baud, bits=8, stop_bits=1)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    ctrl.send(("ready", listener.getsockname()[1]))
    host: socket.socket | None = None
    to_host = 0
    char_time = 10 * bit_ns

    def stats() -> dict:
        return {"cycles": int(get_sim_time(unit="ns")) // PERIOD_NS, "frames": framer.frames,
                "bytes_from_host": framer.bytes, "bytes_to_host": to_host,
                "corrupted": framer.corrupted, "frame_error": int(dut.frame_error.value),
                "running": int(dut.running.value)}

    def pump_host() -> None:
        """Pass what the host sent to the line: what is there now, and inside a frame, the
        rest of it."""
        nonlocal host
        assert host is not None
        ready = select.select([host], [], [], 0)[0]
        while ready:
            try:
                data = host.recv(1 << 16)
            except OSError:  # reset by the host
                data = b""
            if not data:  # the host closed the port
                host.close()
                host = None
                framer.resync()
                return
            source.write_nowait(framer.feed(data))
            if not framer.mid_frame:
                return
            ready = select.select([host], [], [], FRAME_WAIT_S)[0]
        if framer.mid_frame:
            framer.resync()  # the host stopped inside a frame: the line goes quiet

    while True:
        # while no host is connected and the line is idle, wait for a host or the harness
        # without simulating
        if host is None and source.idle():
            select.select([ctrl.fileno(), listener.fileno()], [], [])
        if ctrl.poll(0):
            msg = ctrl.recv()
            if msg[0] == "quit":
                ctrl.send(("bye",))
                break
            if msg[0] == "corrupt":
                framer.corrupt += int(msg[1])
                ctrl.send(("ok",))
            elif msg[0] == "stats":
                ctrl.send(("stats", stats()))
            else:
                ctrl.send(("bad", f"unknown request {msg[0]!r}"))
        if host is None:
            try:
                host, _ = listener.accept()
            except BlockingIOError:
                pass
            else:
                host.setblocking(True)
                host.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                framer.resync()
        if host is not None:
            pump_host()
        out = sink.read_nowait()
        if out and host is not None:
            to_host += len(out)
            try:
                host.sendall(bytes(out))
            except OSError:  # the host went away; its next connection starts afresh
                host.close()
                host = None
        await Timer(char_time, unit="ns")
    for s in (host, listener):
        if s is not None:
            s.close()
    ctrl.close()
