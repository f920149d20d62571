"""The ``fpga`` device against a board emulator: a thread that speaks the bridge's protocol on
the far end of a pty (or a TCP socket, for ``socket://`` ports) and executes runs with the
cycle-accurate simulator, so outputs and cycle counts are real. Compared with the ``sim``
device; the link's failures (corrupted frames both ways, a lost response, a silent board) and
the core's faults come out as the documented errors."""

from __future__ import annotations

import os
import re
import select
import socket
import threading
import time
import tty

import numpy as np
import pytest

pytest.importorskip("serial", reason="the fpga device needs pyserial: pip install 'vtakit[fpga]'")

from vtakit.driver import (  # noqa: E402
    DeadlockError,
    DeviceError,
    Session,
    SimDevice,
    Stage,
    run_image,
)
from vtakit.driver import kernels as K  # noqa: E402
from vtakit.driver.devices import fpga  # noqa: E402
from vtakit.driver.devices.fpga import FpgaDevice  # noqa: E402
from vtakit.vta_hw import bridge_protocol as p  # noqa: E402
from vtakit.vta_hw import isa  # noqa: E402
from vtakit.vta_hw.bridge_protocol import Command, Request, Response, Status  # noqa: E402
from vtakit.vta_hw.config import HwConfig, preset  # noqa: E402
from vtakit.vta_hw.faults import TOKEN_FAULTS, Fault  # noqa: E402
from vtakit.vta_sim import Simulator as VtaSim  # noqa: E402
from vtakit.vta_sim.errors import SimDeadlock, SimError  # noqa: E402
from vtakit.vta_sim.image import RunImage  # noqa: E402

M, A = isa.MemType, isa.AluOp
CFG = preset("ice40")
MEM_BYTES = 1 << 20
GAP_S = 0.01  # the emulated bridge's inter-byte timeout


class BoardEmulator:
    """A board: the UART bridge's behaviour (docs/boards.md) in Python, memory that starts as
    garbage, and a core that is :class:`vtakit.vta_sim.Simulator` running in its own thread.

    Knobs for the tests: ``mute`` (stop answering), ``corrupt_responses`` /
    ``corrupt_requests`` (flip one bit of that many next frames), ``hang`` (a started run never
    finishes), ``lose_csr_write_responses`` (execute that many next register writes but lose
    their responses).
    """

    def __init__(self, cfg: HwConfig = CFG, *, mem_bytes: int = MEM_BYTES,
                 max_payload: int = p.DEFAULT_MAX_PAYLOAD, transport: str = "pty", seed: int = 0):
        self.cfg = cfg
        self.mem = np.random.default_rng(seed).integers(0, 256, mem_bytes, dtype=np.uint8)
        self.sim = VtaSim(cfg, self.mem)
        self.max_payload = max_payload
        self.mute = False
        self.hang = False
        self.corrupt_responses = 0
        self.corrupt_requests = 0
        self.lose_csr_write_responses = 0
        self.starts = self.resets = 0
        self.statuses: list[Status] = []
        self.regs = {fpga.INSN_ADDR: 0, fpga.INSN_COUNT: 0}
        self.cycles = self.fault = 0
        self.done = False
        self.running = False
        self.last_seq: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._buf = bytearray()
        self._fds: list[int] = []
        self._conn: socket.socket | None = None
        self._listener: socket.socket | None = None
        if transport == "pty":
            master, slave = os.openpty()
            tty.setraw(slave)
            self.fd = master
            self._fds = [master, slave]
            self.port = os.ttyname(slave)
        else:
            self._listener = socket.create_server(("127.0.0.1", 0))
            self.port = f"socket://127.0.0.1:{self._listener.getsockname()[1]}"
            self.fd = -1
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for fd in self._fds:
            os.close(fd)
        for s in (self._conn, self._listener):
            if s is not None:
                s.close()

    # ---- the line ---------------------------------------------------------------------
    def _byte(self, timeout: float) -> int | None:
        if not self._buf:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return None
            data = os.read(self.fd, 4096)
            if not data:
                self._stop.set()
                return None
            self._buf += data
        return self._buf.pop(0)

    def _bytes(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            b = self._byte(GAP_S)
            if b is None:
                break
            out.append(b)
        return bytes(out)

    def _quiet(self) -> None:
        while self._byte(GAP_S) is not None:
            pass

    def _answer(self, cmd: int, seq: int, status: Status, words: tuple[int, ...] = ()) -> None:
        self.statuses.append(status)
        if self.mute:
            return
        frame = bytearray(p.encode_response(Response(cmd, seq, status, words)))
        if self.corrupt_responses:
            self.corrupt_responses -= 1
            frame[-1] ^= 0x10
        os.write(self.fd, bytes(frame))

    def _serve(self) -> None:
        if self._listener is not None:
            self._listener.settimeout(0.1)
            while not self._stop.is_set():
                try:
                    self._conn, _ = self._listener.accept()
                    break
                except TimeoutError:
                    continue
            else:
                return
            self.fd = self._conn.fileno()
        while not self._stop.is_set():
            b = self._byte(0.05)
            if b is None:
                continue
            if b != p.REQUEST_SYNC:
                self._quiet()
                self._answer(0, 0, Status.BAD_SYNC)
                continue
            head = self._bytes(4)
            cmd, seq = (head + b"\0\0")[:2]
            if len(head) < 4:
                self._answer(cmd, seq, Status.TRUNCATED)
                continue
            length = int.from_bytes(head[2:4], "little")
            if length % 4 or length > 4 + self.max_payload:
                self._quiet()
                self._answer(cmd, seq, Status.BAD_LENGTH)
                continue
            rest = self._bytes(length + p.CRC_BYTES)
            if len(rest) < length + p.CRC_BYTES:
                self._answer(cmd, seq, Status.TRUNCATED)
                continue
            frame = bytearray(bytes([b]) + head + rest)
            if self.corrupt_requests:
                self.corrupt_requests -= 1
                frame[-1] ^= 0x01  # the CRC
            try:
                req = p.decode_request(bytes(frame), self.max_payload)
            except p.CrcError:
                self._quiet()
                self._answer(cmd, seq, Status.BAD_CRC)
                continue
            except p.FrameError as err:
                self._answer(cmd, seq, err.status)
                continue
            self._execute(req)

    # ---- the board ----------------------------------------------------------------------
    def _execute(self, req: Request) -> None:
        cmd, w = req.cmd, req.words
        status = Status.OK
        mem_words = self.mem.size // 4
        if cmd in (Command.WRITE_MEM, Command.READ_MEM):
            n = len(w) - 1 if cmd == Command.WRITE_MEM else w[1]
            status = (Status.MISALIGNED if w[0] % 4 else
                      Status.OUT_OF_RANGE if w[0] // 4 + n > mem_words else
                      Status.BUSY if self.running else Status.OK)
        elif cmd in (Command.WRITE_CSR, Command.READ_CSR):
            status = (Status.OUT_OF_RANGE if w[0] >= p.CSR_ADDR_LIMIT else
                      Status.MISALIGNED if w[0] % 4 else Status.OK)
        if status != Status.OK:
            self._answer(cmd, req.seq, status)
            return
        if cmd in (Command.WRITE_MEM, Command.WRITE_CSR) and req.seq == self.last_seq:
            self._answer(cmd, req.seq, Status.OK)  # a resent write: executed once
            return
        self.last_seq = req.seq
        out: tuple[int, ...] = ()
        if cmd == Command.WRITE_MEM:
            self.mem[w[0]:w[0] + 4 * (len(w) - 1)] = np.array(w[1:], "<u4").view(np.uint8)
        elif cmd == Command.READ_MEM:
            out = tuple(int(v) for v in self.mem[w[0]:w[0] + 4 * w[1]].view("<u4"))
        elif cmd == Command.WRITE_CSR:
            self._write_csr(w[0], w[1])
            if self.lose_csr_write_responses:
                self.lose_csr_write_responses -= 1
                return
        elif cmd == Command.READ_CSR:
            out = (self._read_csr(w[0]),)
        else:
            out = (p.PROTOCOL_VERSION, self.max_payload, mem_words, self._read_csr(0x10),
                   self._read_csr(0x14))
        self._answer(cmd, req.seq, Status.OK, out)

    def _read_csr(self, addr: int) -> int:
        maj, mnr, patch = isa.HW_VER
        with self._lock:
            return {fpga.CTRL: (self.done << 1) | ((self.fault != 0) << 2),
                    fpga.CYCLES: self.cycles, 0x10: (maj << 16) | (mnr << 8) | patch,
                    0x14: self.cfg.hash_u32, fpga.FAULT: self.fault}.get(
                        addr, self.regs.get(addr, 0))

    def _write_csr(self, addr: int, value: int) -> None:
        if addr in self.regs:
            self.regs[addr] = value
        if addr != fpga.CTRL:
            return
        if value & fpga.CTRL_RESET:
            self.resets += 1
            with self._lock:
                self.done, self.fault, self.running = False, 0, False
        if value & fpga.CTRL_START:
            self.starts += 1
            with self._lock:
                self.done, self.fault, self.running = False, 0, True
            if not self.hang:
                threading.Thread(target=self._run, daemon=True,
                                 args=(self.regs[fpga.INSN_ADDR],
                                       self.regs[fpga.INSN_COUNT])).start()

    def _run(self, insn_addr: int, insn_count: int) -> None:
        cycles, fault = 0, 0
        try:
            cycles = self.sim.run(insn_addr, insn_count).cycles
        except SimDeadlock:
            fault = Fault.DEADLOCK
        except SimError as err:
            tokens = [bit for q, bit in TOKEN_FAULTS if re.search(rf"\b{q}=", str(err))]
            fault = sum(tokens) if tokens else Fault.UNFINISHED
        with self._lock:
            self.cycles, self.fault, self.done, self.running = cycles, int(fault), True, False


@pytest.fixture
def board():
    b = BoardEmulator()
    yield b
    b.close()


def open_device(board: BoardEmulator, cfg: HwConfig = CFG, **kwargs) -> FpgaDevice:
    kwargs.setdefault("timeout_s", 0.5)
    return FpgaDevice(cfg, board.port, **kwargs)


# ---- kernels against the sim device ------------------------------------------------------------
def conv(s: Session, shape: K.Conv2dShape, seed: int):
    cfg = s.cfg
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (shape.n, shape.c, shape.h, shape.w), dtype=np.int8)
    w = rng.integers(-128, 128, (shape.o, shape.c, shape.kh, shape.kw), dtype=np.int8)
    xd = s.array(K.pack_activations(x, cfg))
    wd = s.array(K.pack_weights(w, cfg))
    yd = s.alloc((shape.n // cfg.batch, shape.o // cfg.block_out, shape.oh, shape.ow,
                  cfg.batch, cfg.block_out), np.int8)
    K.conv2d(s, xd, wd, yd, shape, shift=8)
    r = s.synchronize()
    out = K.unpack_outputs(yd.numpy())
    np.testing.assert_array_equal(out, K.conv2d_reference(x, w, shape, 8))
    return out, r.cycles


def add_one(s: Session, x, y, rows: int, *, extra_push: bool = False, extra_pop: bool = False):
    """y = int8(x + 1) through ACC (tests/integration/test_rtl_faults.py); ``extra_push`` leaves
    a token behind, ``extra_pop`` waits for one nobody pushes."""
    k = s.uop_kernel(("add1", rows), lambda b: b.loop(rows, dst=1, src=1).push(0, 0),
                     mode="alu", alu_opcode=A.ADD, use_imm=True, imm=1)
    s.load_2d(x, 0, rows, 1, rows, sram_base=0, memory_type=M.ACC)
    if extra_pop:
        s.dep_pop(Stage.STORE, Stage.COMPUTE)
    s.alu(k)
    s.dep_push(Stage.COMPUTE, Stage.STORE)
    if extra_push:
        s.dep_push(Stage.COMPUTE, Stage.STORE)
    s.dep_pop(Stage.COMPUTE, Stage.STORE)
    s.store_2d(y, 0, rows, 1, rows, sram_base=0)
    return s.synchronize()


def workload(s: Session) -> list:
    """Two convolutions and three ALU runs (the micro-op kernels stay resident between runs)."""
    results = []
    for shape, seed in ((K.Conv2dShape(n=1, c=4, h=5, w=6, o=6, kh=3, kw=3, stride=1, pad=1), 1),
                        (K.Conv2dShape(n=1, c=3, h=4, w=4, o=2, kh=1, kw=1, stride=1, pad=0), 2)):
        results.append(conv(s, shape, seed))
    rng = np.random.default_rng(5)
    for rows in (7, 7, 33):
        xs = rng.integers(-100, 100, (rows, CFG.batch * CFG.block_out), dtype=np.int32)
        x, y = s.array(xs), s.alloc(xs.shape, np.int8)
        r = add_one(s, x, y, rows)
        np.testing.assert_array_equal(y.numpy(), (xs + 1).astype(np.int8))
        results.append((y.numpy(), r.cycles))
    return results


def test_kernels_give_the_outputs_and_cycles_of_the_sim_device(board):
    with open_device(board) as dev:
        got = workload(Session(dev))
        stats = dev.last_stats
    want = workload(Session(SimDevice(CFG, dram_bytes=MEM_BYTES)))
    assert len(got) == len(want) == 5
    for (out_f, cycles_f), (out_s, cycles_s) in zip(got, want):
        np.testing.assert_array_equal(out_f, out_s)
        assert cycles_f == cycles_s > 0
    assert board.starts == 5
    assert stats is not None and stats.cycles == want[-1][1] and stats["polls"] >= 1
    assert stats["retries"] == 0 and stats["frames"] >= 4


def test_a_socket_url_works_too():
    board = BoardEmulator(transport="tcp")
    try:
        assert board.port.startswith("socket://")
        with open_device(board) as dev:
            out, cycles = conv(Session(dev), K.Conv2dShape(n=1, c=2, h=3, w=3, o=2), 3)
        want, want_cycles = conv(Session(SimDevice(CFG, dram_bytes=MEM_BYTES)),
                                 K.Conv2dShape(n=1, c=2, h=3, w=3, o=2), 3)
        np.testing.assert_array_equal(out, want)
        assert cycles == want_cycles
    finally:
        board.close()


def test_the_shadow_moves_only_what_it_must(board):
    """The board's memory starts as garbage: reads of memory nobody wrote return it, a partly
    written word keeps the board's other bytes, and after a run only what its STOREs wrote is
    read back."""
    dev = open_device(board)
    np.testing.assert_array_equal(dev.read(0x1001, 11), board.mem[0x1001:0x100C])
    dev.write(0x2003, b"\x01\x02\x03\x04\x05")  # partial words at both ends
    want = board.mem[0x2000:0x200C].copy()
    want[3:8] = [1, 2, 3, 4, 5]
    np.testing.assert_array_equal(dev.read(0x2000, 12), want)
    # nothing reached the board yet: writes go before the next run
    assert not np.array_equal(board.mem[0x2000:0x200C], want)

    s = Session(dev)
    rows = 16
    xs = np.arange(rows * CFG.block_out, dtype=np.int32).reshape(rows, -1)
    x, y = s.array(xs), s.alloc((rows, CFG.block_out), np.int8)
    add_one(s, x, y, rows)
    np.testing.assert_array_equal(board.mem[0x2000:0x200C], want)  # flushed before the run
    before = dev.link.attempts
    np.testing.assert_array_equal(x.numpy(), xs)  # not stored to: no frame
    assert dev.link.attempts == before
    np.testing.assert_array_equal(y.numpy(), (xs + 1).astype(np.int8))  # stored: read back
    assert dev.link.attempts == before + 1


def test_faults_raise_the_sim_devices_errors_reset_the_core_and_the_next_run_works(board):
    rows = 8
    xs = np.arange(rows, dtype=np.int32).reshape(rows, 1) - 3
    dev = open_device(board)
    for d in (dev, SimDevice(CFG, dram_bytes=MEM_BYTES)):  # the same errors on both
        s = Session(d)
        x, y = s.array(xs), s.alloc((rows, 1), np.int8)
        with pytest.raises(DeviceError, match=r"tokens still in the dependency queues g2s"):
            add_one(s, x, y, rows, extra_push=True)
        with pytest.raises(DeadlockError, match=r"deadlock"):
            add_one(s, x, y, rows, extra_pop=True)
        add_one(s, x, y, rows)
        np.testing.assert_array_equal(y.numpy(), (xs + 1).astype(np.int8))
    assert board.resets == 2 and board.starts == 3
    with pytest.raises(DeviceError, match=r"^fpga: run ended with tokens still in the dependency "
                                          r"queues g2s \(expected every push to be popped before "
                                          r"FINISH\) \(core fault register 0x10\)$"):
        s = Session(dev)
        add_one(s, s.array(xs), s.alloc((rows, 1), np.int8), rows, extra_push=True)


def test_an_sram_index_out_of_range_is_refused_before_the_run_starts(board):
    """The core would wrap the index around; the device refuses the stream on the host with
    the sim device's error (driver/stream_check.py)."""
    insns = [isa.MemInsn(memory_type=M.INP, sram_base=CFG.inp_depth - 2, y_size=1, x_size=4,
                         x_stride=4), isa.FinishInsn()]
    raw = np.frombuffer(isa.encode_stream(insns, CFG), np.uint8)
    dram = np.zeros(4096, np.uint8)
    dram[0x100:0x100 + raw.size] = raw
    image = RunImage(CFG, dram, 0x100, len(insns))
    errors = []
    for dev in (open_device(board), SimDevice(CFG, dram_bytes=MEM_BYTES)):
        with pytest.raises(DeviceError, match=r"^instruction #0 .*SRAM index out of range: "
                                              r"INP\[2046..2049\]") as info:
            run_image(dev, image)
        errors.append((str(info.value), info.value.index, info.value.insn))
    assert errors[0] == errors[1]
    assert board.starts == 0


def test_a_run_that_never_finishes_times_out_and_resets_the_core(board):
    dev = open_device(board)
    s = Session(dev)
    x = s.array(np.zeros((4, 1), np.int32))
    board.hang = True
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"fpga device on /dev/pts/\d+: the run of \d+ "
                                           r"instructions at 0x[0-9a-f]+ did not finish within "
                                           r"0.3 s \(CTRL=0x0, CYCLES=0\); the core was reset"):
        s.load_2d(x, 0, 4, 1, 4, sram_base=0, memory_type=M.ACC)
        s.synchronize(0.3)
    assert time.monotonic() - t0 < 2
    assert board.resets == 1 and not board.running
    board.hang = False
    y = s.alloc((4, 1), np.int8)
    add_one(s, x, y, 4)
    np.testing.assert_array_equal(y.numpy(), np.ones((4, 1), np.int8))


def test_a_configuration_the_board_was_not_built_for_is_refused(board):
    ecp5 = preset("ecp5")
    with pytest.raises(ValueError, match=(
            rf"the board on /dev/pts/\d+ was built for configuration {CFG.hash} \(preset "
            rf"'ice40'\), ISA 0.0.2; the driver was given configuration {ecp5.hash} \(preset "
            rf"'ecp5', {ecp5.bitstream_name}\), ISA 0.0.2: program the board with a bitstream "
            rf"of configuration {ecp5.hash} or create the device with the board's "
            rf"configuration")):
        open_device(board, ecp5)
    custom = CFG.replace(clock_mhz=13)
    with pytest.raises(ValueError, match=rf"driver was given configuration {custom.hash} \(not a "
                                         rf"preset, {custom.bitstream_name}\)"):
        open_device(board, custom)


def test_a_board_that_stops_answering_raises_a_timeout_within_the_budget(board):
    dev = open_device(board, timeout_s=0.2, retries=1)
    board.mute = True
    t0 = time.monotonic()
    with pytest.raises(p.NoResponse, match=r"^READ_MEM \(seq \d+\) failed 2 times; last: no "
                                           r"response to READ_MEM \(seq \d+\) from the board on "
                                           r"/dev/pts/\d+ within 0.2 s; check that the board is "
                                           r"programmed with the vtakit bitstream, connected to "
                                           r"/dev/pts/\d+, and that both sides use the same baud "
                                           r"rate$"):
        dev.read(0, 16)
    elapsed = time.monotonic() - t0
    assert 0.4 <= elapsed < 0.4 + 0.2 + 0.5  # two waits of 0.2 s, one drain, slack
    assert isinstance(p.NoResponse("x"), TimeoutError)


def test_corrupted_responses_are_retried_then_reported(board):
    dev = open_device(board, retries=2)
    board.corrupt_responses = 2
    np.testing.assert_array_equal(dev.read(0x100, 8), board.mem[0x100:0x108])
    assert dev.link.failures == 2
    board.corrupt_responses = 3
    with pytest.raises(p.CrcError, match=r"^READ_MEM \(seq \d+\) failed 3 times; last: response "
                                         r"CRC mismatch: received 0x[0-9a-f]{4}, computed "
                                         r"0x[0-9a-f]{4} over 13 bytes \(frame 5a 02 .*\); the "
                                         r"line corrupts frames: check the cable"):
        dev.read(0x200, 8)


def test_corrupted_requests_are_answered_bad_crc_and_resent(board):
    dev = open_device(board, retries=2)
    board.corrupt_requests = 2
    dev.write(0x300, np.arange(64, dtype=np.uint8))
    s = Session(dev)
    x = s.array(np.zeros((2, 1), np.int32))
    y = s.alloc((2, 1), np.int8)
    add_one(s, x, y, 2)  # the run flushes 0x300.. first
    np.testing.assert_array_equal(board.mem[0x300:0x340], np.arange(64))
    assert board.statuses.count(Status.BAD_CRC) == 2
    board.corrupt_requests = 3
    with pytest.raises(p.StatusError, match=r"failed 3 times; last: the board answered BAD_CRC: "
                                            r"the request arrived with a wrong CRC"):
        dev.link.read_csr(fpga.CYCLES)


def test_a_lost_response_to_start_does_not_start_the_core_twice(board):
    dev = open_device(board, timeout_s=0.2)
    s = Session(dev)
    rows = 4
    xs = np.full((rows, 1), 9, np.int32)
    x, y = s.array(xs), s.alloc((rows, 1), np.int8)
    add_one(s, x, y, rows)
    starts = board.starts
    # the responses to the run's INSN_ADDR, INSN_COUNT and CTRL START writes are lost: the
    # host resends each with its SEQ, the board acknowledges without executing again
    board.lose_csr_write_responses = 3
    add_one(s, x, y, rows)
    assert board.starts == starts + 1
    assert dev.link.failures == 3
    np.testing.assert_array_equal(y.numpy(), np.full((rows, 1), 10, np.int8))


def test_status_errors_name_the_request(board):
    dev = open_device(board)
    with pytest.raises(p.StatusError, match=r"the board on /dev/pts/\d+ refused READ_MEM "
                                            r"\(seq \d+\) of 2 words at 0x100000: OUT_OF_RANGE "
                                            r"\(the address lies past the end"):
        dev.link.read_mem(MEM_BYTES, 8)
    with pytest.raises(p.StatusError, match=r"refused READ_CSR \(seq \d+\) of CSR 0x100: "
                                            r"OUT_OF_RANGE"):
        dev.link.read_csr(0x100)


def test_arguments_are_checked(board):
    with pytest.raises(ValueError, match=r"mem_bytes=4194304; the board on /dev/pts/\d+ has "
                                         r"1048576 bytes \(expected 1..1048576\)"):
        open_device(board, mem_bytes=4 << 20)
    with pytest.raises(TypeError, match=r"cfg must be an HwConfig, got str"):
        FpgaDevice("ice40", board.port)
    with pytest.raises(OSError, match=r"fpga device: cannot open port '/nonexistent/tty' at "
                                      r"1000000 baud"):
        FpgaDevice(CFG, "/nonexistent/tty")
    with pytest.raises(ValueError, match=r"fpga device spec '@9600': expected PORT or "
                                         r"PORT@BAUD"):
        FpgaDevice.from_spec(CFG, "@9600")
    dev = open_device(board)
    with pytest.raises(ValueError, match=r"read of 8 bytes at 0xffffc is outside device memory"):
        dev.read(MEM_BYTES - 4, 8)
    with pytest.raises(RuntimeError, match=r"wait\(\) without a run\(\)"):
        dev.wait(1)


def test_the_runtime_opens_a_board_by_spec(board):
    from vtakit.runtime.vta import make_device

    dev = make_device(f"fpga:{board.port}@230400", CFG)
    try:
        assert isinstance(dev, FpgaDevice) and dev._port.baudrate == 230400
        assert dev.identify().config_hash == CFG.hash
        assert dev.identify().name == "fpga"
    finally:
        dev.close()
    with pytest.raises(ValueError, match=r"device='fpga0'; expected 'sim', 'rtl', 'fpga:PORT'"):
        make_device("fpga0", CFG)


def test_the_device_needs_neither_amaranth_nor_pyserial_to_import():
    """The register map and fault words come from pure modules (vta_hw.regmap, vta_hw.faults):
    a host without the HDL toolchain drives a board."""
    import subprocess
    import sys

    code = ("import sys, vtakit.driver.devices.fpga; "
            "print(sorted(m for m in ('amaranth', 'serial') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
