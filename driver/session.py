"""The JIT runtime driver: builds instruction streams at run time and runs them on a device.

The command API follows VTA's runtime, so kernels written for it translate directly::

    s = Session(SimDevice(preset("default")))
    x = s.array(x_host)                      # device copy of a numpy array
    y = s.alloc((4, 16), np.int8)
    s.load_2d(x, 0, x_size=4, y_size=1, x_stride=4, sram_base=0, memory_type=MemType.ACC)
    k = s.uop_kernel("copy", lambda b: b.loop(4, dst=1, src=1).push(0, 0),
                     mode="alu", alu_opcode=AluOp.SHR, use_imm=True, imm=0)
    s.alu(k)
    s.dep_push(Stage.COMPUTE, Stage.STORE)
    s.dep_pop(Stage.COMPUTE, Stage.STORE)
    s.store_2d(y, 0, x_size=4, y_size=1, x_stride=4, sram_base=0)
    s.synchronize()
    y.numpy()

Dependency flags are folded into neighbouring instructions: a pop is attached to the next
instruction of the popping stage, a push to the last instruction of the pushing stage when
nothing is pending there; a NOP (LOAD/STORE with ``x_size = 0``) is added only when no
instruction can carry the flag. :meth:`Session.synchronize` makes compute wait for the load
and store stages, appends FINISH, links the stream to the buffers' addresses and runs it.

Micro-op kernels are recorded once per key (:meth:`Session.uop_kernel`) and kept resident in
the UOP SRAM across runs; a LOAD of micro-ops is emitted only when a kernel's micro-ops are not
resident (kernels that differ only in their loops or ALU operation share them).
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

from vtakit.driver.device import Device, RunResult
from vtakit.driver.program import KernelBuilder, Loop, Program, Reloc, UopKernel
from vtakit.driver.slot_check import check_confined
from vtakit.driver.stream_check import check_program, loop_overflow
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.timing_facts import LOAD_UNIT_MEMORY_TYPES

if TYPE_CHECKING:
    from vtakit.vta_sim.image import RunImage

__all__ = ["Session", "DeviceArray", "Stage", "stage_of", "ImageRun", "run_image"]


class Stage(IntEnum):
    """The three command stages (VTA's queue ids)."""

    LOAD = 1
    COMPUTE = 2
    STORE = 3


def stage_of(insn: isa.Insn) -> Stage:
    """Which unit executes ``insn`` (the fetch unit's dispatch rule)."""
    if isinstance(insn, isa.MemInsn):
        if insn.opcode == isa.Opcode.STORE:
            return Stage.STORE
        if insn.memory_type in LOAD_UNIT_MEMORY_TYPES:
            return Stage.LOAD
    return Stage.COMPUTE


_NEIGHBOURS = {(Stage.LOAD, Stage.COMPUTE), (Stage.COMPUTE, Stage.LOAD),
               (Stage.COMPUTE, Stage.STORE), (Stage.STORE, Stage.COMPUTE)}


def _check_pair(what: str, src: Stage, dst: Stage) -> tuple[Stage, Stage]:
    src, dst = Stage(src), Stage(dst)
    if (src, dst) not in _NEIGHBOURS:
        raise ValueError(f"{what}({src.name}, {dst.name}): tokens only flow between "
                         f"neighbouring stages (LOAD<->COMPUTE, COMPUTE<->STORE)")
    return src, dst


class DeviceArray:
    """A buffer in device memory.

    Attributes
    ----------
    addr : int
        Physical byte address.
    shape, dtype :
        How :meth:`numpy` views the bytes.
    slot : str
        The name a recorded :class:`Program` uses for this buffer.
    """

    def __init__(self, session: Session, addr: int, shape: tuple[int, ...], dtype: np.dtype,
                 slot: str):
        self.session, self.addr, self.shape, self.dtype, self.slot = (
            session, addr, shape, dtype, slot)
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

    def _check_live(self, what: str) -> None:
        if self.session._arrays.get(self.slot) is not self:
            raise RuntimeError(f"{what} of {self!r}: the array was freed or its session closed")

    def copyfrom(self, data: np.ndarray) -> DeviceArray:
        self._check_live("copyfrom")
        arr = np.asarray(data)
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError(f"copy into device array {self.slot}: expected {self.shape} "
                             f"{self.dtype}, got {arr.shape} {arr.dtype}")
        self.session.device.write(self.addr, np.ascontiguousarray(arr))
        return self

    def numpy(self) -> np.ndarray:
        self._check_live("numpy")
        return self.session.device.read(self.addr, self.nbytes).view(self.dtype).reshape(
            self.shape)

    def free(self) -> None:
        self.session._free(self)

    def __repr__(self) -> str:
        return f"DeviceArray({self.slot}, addr={self.addr:#x}, {self.shape}, {self.dtype})"


@dataclass
class _Recording:
    insns: list[isa.Insn]
    relocs: list[Reloc]
    constants: dict[str, np.ndarray]
    pending_pops: dict[Stage, set[str]]
    last_of_stage: dict[Stage, int]

    @classmethod
    def empty(cls) -> _Recording:
        return cls([], [], {}, {s: set() for s in Stage}, {})


class Session:
    """A device plus the JIT state that builds its instruction streams.

    Parameters
    ----------
    device : Device
        Where streams run; its configuration is the session's.
    timeout_s : float
        Default time :meth:`synchronize` waits for a run.
    """

    def __init__(self, device: Device, *, timeout_s: float = 600.0):
        device.check_compatible()
        self.device = device
        self.cfg: HwConfig = device.cfg
        self.timeout_s = timeout_s
        self._align = max(64, self.cfg.wgt_elem_bytes, self.cfg.acc_elem_bytes,
                          self.cfg.inp_elem_bytes)
        self._arrays: dict[str, DeviceArray] = {}
        self._ids = itertools.count()
        self._rec = _Recording.empty()
        self._kernels: dict[Hashable, UopKernel] = {}
        self._uop_buffers: dict[str, tuple[DeviceArray, np.ndarray]] = {}
        self._resident: OrderedDict[str, int] = OrderedDict()  # signature -> uop_bgn
        self._uop_top = 0
        self._insn_buf: DeviceArray | None = None
        self.last_result: RunResult | None = None
        # addresses this session holds on the device: released by close(), or when the session
        # is garbage-collected without one (the finalizer must not refer to the session)
        self._owned: set[int] = set()
        self._finalizer = weakref.finalize(self, _release, device, self._owned)

    # ---- memory ---------------------------------------------------------------------------
    def alloc(self, shape: int | Sequence[int], dtype: np.typing.DTypeLike,
              name: str | None = None) -> DeviceArray:
        """Allocate an array in device memory (aligned for every memory type)."""
        shape_t = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(
            int(d) for d in shape)
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape_t, dtype=np.int64)) * dt.itemsize
        slot = name if name is not None else f"buf{next(self._ids)}"
        if slot in self._arrays:
            raise ValueError(f"a device array named {slot!r} already exists")
        self._check_open("alloc")
        addr = self.device.allocate(max(nbytes, 1), self._align)
        self._owned.add(addr)
        arr = DeviceArray(self, addr, shape_t, dt, slot)
        self._arrays[slot] = arr
        return arr

    def array(self, data: np.ndarray, name: str | None = None) -> DeviceArray:
        """A device copy of ``data``."""
        data = np.ascontiguousarray(data)
        return self.alloc(data.shape, data.dtype, name).copyfrom(data)

    def _free(self, arr: DeviceArray) -> None:
        if self._arrays.get(arr.slot) is not arr:
            raise ValueError(f"{arr!r} is not a live array of this session")
        if any(r.slot == arr.slot for r in self._rec.relocs):
            raise ValueError(f"cannot free {arr.slot}: instructions not yet run refer to it")
        del self._arrays[arr.slot]
        self._owned.discard(arr.addr)
        self.device.free(arr.addr)

    # ---- lifetime -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def device_bytes(self) -> int:
        """Bytes of device memory this session holds (its arrays, instruction and micro-op
        areas)."""
        return sum(a.nbytes for a in self._arrays.values())

    def _check_open(self, what: str) -> None:
        if not self._finalizer.alive:
            raise RuntimeError(f"{what}: the session is closed (its device memory was "
                               f"released); open a new Session on the device")

    def discard(self) -> None:
        """Drop the instructions recorded and not yet run; nothing reaches the device.

        The kernels the discarded stream would have loaded are forgotten too, so the next
        stream loads what it uses."""
        self._rec = _Recording.empty()
        self._resident.clear()
        self._uop_top = 0

    def close(self) -> None:
        """Discard any pending stream and release every buffer of the session (its arrays,
        instruction and micro-op areas) on the device. Idempotent; the session's arrays are
        unusable afterwards. ``with Session(dev) as s: ...`` closes on exit."""
        if not self._finalizer.alive:
            return
        self.discard()
        self._finalizer()  # frees every owned address
        self._arrays.clear()
        self._uop_buffers.clear()
        self._insn_buf = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- recording ------------------------------------------------------------------------
    def _emit(self, insn: isa.Insn, reloc: tuple[str, int, int] | None = None) -> int:
        self._check_open("recording")
        rec = self._rec
        stage = stage_of(insn)
        pops = rec.pending_pops[stage]
        if pops:
            insn = replace(insn, **{flag: 1 for flag in pops})
            pops.clear()
        isa.encode(insn, self.cfg)  # check every field now, at the call that set it
        rec.insns.append(insn)
        index = len(rec.insns) - 1
        if reloc is not None:
            rec.relocs.append(Reloc(index, *reloc))
        rec.last_of_stage[stage] = index
        return index

    def _nop(self, stage: Stage) -> isa.MemInsn:
        if stage == Stage.LOAD:
            return isa.MemInsn(memory_type=isa.MemType.INP)
        if stage == Stage.STORE:
            return isa.MemInsn(opcode=isa.Opcode.STORE, memory_type=isa.MemType.OUT)
        return isa.MemInsn(memory_type=isa.MemType.UOP)

    def _check_dram(self, what: str, arr: DeviceArray, elem_offset: int, x_size: int,
                    y_size: int, x_stride: int, nbytes_elem: int) -> None:
        if not isinstance(arr, DeviceArray) or self._arrays.get(arr.slot) is not arr:
            raise TypeError(f"{what}: expected a live DeviceArray of this session, got {arr!r}")
        if x_size == 0 or y_size == 0:
            return
        if x_stride < x_size:
            raise ValueError(f"{what}: x_stride={x_stride} is smaller than x_size={x_size}")
        first = elem_offset * nbytes_elem
        end = (elem_offset + (y_size - 1) * x_stride + x_size) * nbytes_elem
        if elem_offset < 0 or end > arr.nbytes:
            raise ValueError(
                f"{what}: out-of-range DRAM access: bytes {first}..{end - 1} of {arr.slot} "
                f"({arr.nbytes} bytes; {y_size} rows of {x_size} elements of {nbytes_elem} B, "
                f"stride {x_stride}, from element {elem_offset})")

    def _check_sram(self, what: str, memory_type: isa.MemType, sram_base: int,
                    count: int) -> None:
        depth = self.cfg.depth(memory_type)
        if sram_base < 0 or sram_base + count > depth:
            raise ValueError(f"{what}: {memory_type.name} SRAM rows {sram_base}.."
                             f"{sram_base + count - 1} are out of range (depth {depth})")

    def load_2d(self, src: DeviceArray, elem_offset: int, x_size: int, y_size: int,
                x_stride: int, x_pad_0: int = 0, y_pad_0: int = 0, x_pad_1: int = 0,
                y_pad_1: int = 0, *, sram_base: int, memory_type: isa.MemType) -> None:
        """LOAD ``y_size`` rows of ``x_size`` elements of ``src`` (from element
        ``elem_offset``, rows ``x_stride`` apart) into SRAM at ``sram_base``, zero-padded."""
        memory_type = isa.MemType(memory_type)
        if memory_type == isa.MemType.OUT:
            raise ValueError("load_2d: OUT cannot be loaded (expected INP, WGT, ACC, ACC_8BIT "
                             "or UOP)")
        eb = self.cfg.elem_bytes(memory_type)
        self._check_dram("load_2d", src, elem_offset, x_size, y_size, x_stride, eb)
        rows = (y_pad_0 + y_size + y_pad_1) * (x_pad_0 + x_size + x_pad_1)
        self._check_sram("load_2d", memory_type, sram_base, rows)
        self._emit(isa.MemInsn(memory_type=memory_type, sram_base=sram_base, y_size=y_size,
                               x_size=x_size, x_stride=x_stride, y_pad_0=y_pad_0,
                               y_pad_1=y_pad_1, x_pad_0=x_pad_0, x_pad_1=x_pad_1),
                   (src.slot, elem_offset, eb))

    def store_2d(self, dst: DeviceArray, elem_offset: int, x_size: int, y_size: int,
                 x_stride: int, *, sram_base: int,
                 memory_type: isa.MemType = isa.MemType.OUT) -> None:
        """STORE ``y_size x x_size`` OUT elements from SRAM ``sram_base`` into ``dst``."""
        memory_type = isa.MemType(memory_type)
        if memory_type != isa.MemType.OUT:
            raise ValueError(f"store_2d: only OUT can be stored, got {memory_type.name}")
        eb = self.cfg.elem_bytes(memory_type)
        self._check_dram("store_2d", dst, elem_offset, x_size, y_size, x_stride, eb)
        self._check_sram("store_2d", memory_type, sram_base, x_size * y_size)
        self._emit(isa.MemInsn(opcode=isa.Opcode.STORE, memory_type=memory_type,
                               sram_base=sram_base, y_size=y_size, x_size=x_size,
                               x_stride=x_stride), (dst.slot, elem_offset, eb))

    def uop_kernel(self, key: Hashable, record: Callable[[KernelBuilder], object] | None = None,
                   *, mode: str = "gemm", reset: bool = False,
                   alu_opcode: isa.AluOp = isa.AluOp.ADD, use_imm: bool = False,
                   imm: int = 0) -> UopKernel:
        """The micro-op kernel named ``key``, recorded by ``record(builder)``.

        A key names one definition. Every call that passes ``record`` records the kernel (cheap:
        one Python call per micro-op) and compares it, micro-ops and mode fields (``mode``,
        ``reset``, ``alu_opcode``, ``use_imm``, ``imm``), with the kernel first recorded under
        ``key``: the same definition returns the cached kernel; a different one raises
        ``ValueError`` (use another key), so a reused key never silently runs a stale kernel.
        ``uop_kernel(key)`` without ``record`` returns the cached kernel as it is. Residency in
        the UOP SRAM is keyed by content, so two keys with the same definition share one load.
        """
        kernel = self._kernels.get(key)
        if record is None:
            if kernel is None:
                raise KeyError(f"no micro-op kernel is cached under {key!r} and no record "
                               f"function was given")
            return kernel
        builder = KernelBuilder(mode, reset=reset, alu_opcode=alu_opcode, use_imm=use_imm,
                                imm=imm)
        record(builder)
        fresh = builder.build()
        if kernel is not None:
            if fresh.signature != kernel.signature:
                raise ValueError(f"uop_kernel: key {key!r} is already defined as "
                                 f"{kernel.describe()}; this call records "
                                 f"{fresh.describe()} (give each definition its own key)")
            return kernel
        fresh.words(self.cfg)  # range-check the micro-op fields now
        self._kernels[key] = fresh
        return fresh

    def _make_resident(self, kernel: UopKernel) -> int:
        sig = kernel.uop_signature
        if sig in self._resident:
            return self._resident[sig]
        n = len(kernel.uops)
        if n > self.cfg.uop_depth:
            raise ValueError(f"micro-op kernel of {n} micro-ops does not fit the "
                             f"{self.cfg.uop_depth}-entry UOP buffer")
        if self._uop_top + n > self.cfg.uop_depth:  # evict everything: compute runs in order,
            self._resident.clear()                  # so later loads cannot disturb earlier
            self._uop_top = 0                       # instructions
        bgn = self._uop_top
        slot = f"uop:{sig}"
        self._rec.constants.setdefault(slot, kernel.words(self.cfg))
        self._emit(isa.MemInsn(memory_type=isa.MemType.UOP, sram_base=bgn, y_size=1, x_size=n,
                               x_stride=n), (slot, 0, self.cfg.elem_bytes(isa.MemType.UOP)))
        self._resident[sig] = bgn
        self._uop_top += n
        return bgn

    def _run_kernel(self, kernel: UopKernel, mode: str) -> None:
        if not isinstance(kernel, UopKernel):
            raise TypeError(f"{mode}: expected a UopKernel, got {type(kernel).__name__}")
        if kernel.mode != mode:
            raise ValueError(f"{mode}: the kernel was recorded for {kernel.mode}")
        self._check_loop_indices(kernel, mode)
        bgn = self._make_resident(kernel)
        self._emit(kernel.insn(bgn))

    def _check_loop_indices(self, kernel: UopKernel, mode: str) -> None:
        """``ValueError`` before anything is recorded if a loop index of ``kernel`` leaves its
        SRAM (on the RTL it would wrap around silently; the simulator refuses it)."""
        outer = kernel.loops[0] if len(kernel.loops) == 2 else Loop(1)
        inner = kernel.loops[-1] if kernel.loops else Loop(1)
        factors = {f: (getattr(outer, f), getattr(inner, f)) for f in ("dst", "src", "wgt")}
        why = loop_overflow(self.cfg, mode, np.asarray(kernel.uops, dtype=np.int64),
                            outer.extent, inner.extent, factors)
        if why is not None:
            key = next((repr(k) for k, v in self._kernels.items() if v is kernel), "(unnamed)")
            raise ValueError(f"{mode}: kernel {key}: {why}; kernel {kernel.describe()}")

    def gemm(self, kernel: UopKernel) -> None:
        """GEMM over ``kernel`` (loading its micro-ops first if they are not resident)."""
        self._run_kernel(kernel, "gemm")

    def alu(self, kernel: UopKernel) -> None:
        """ALU over ``kernel``."""
        self._run_kernel(kernel, "alu")

    def dep_pop(self, src: Stage, dst: Stage) -> None:
        """Stage ``dst`` waits, before its next instruction, for a token from ``src``."""
        src, dst = _check_pair("dep_pop", src, dst)
        flag = "pop_prev" if src < dst else "pop_next"
        pops = self._rec.pending_pops[dst]
        if flag in pops:  # one instruction pops once: a NOP carries the earlier pop
            self._emit(self._nop(dst))
        pops.add(flag)

    def dep_push(self, src: Stage, dst: Stage) -> None:
        """Stage ``src`` signals ``dst`` once everything issued to ``src`` so far is done."""
        src, dst = _check_pair("dep_push", src, dst)
        flag = "push_next" if src < dst else "push_prev"
        rec = self._rec
        last = rec.last_of_stage.get(src)
        if last is not None and not rec.pending_pops[src] and not getattr(rec.insns[last], flag):
            rec.insns[last] = replace(rec.insns[last], **{flag: 1})
        else:
            self._emit(replace(self._nop(src), **{flag: 1}))

    # ---- running --------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Instructions recorded and not yet run."""
        return len(self._rec.insns)

    def finalize(self) -> Program:
        """End the stream: compute waits for the load and store stages, then FINISH. Returns
        the relocatable program and starts a new stream."""
        rec = self._rec
        if not rec.insns:
            raise ValueError("finalize: no instructions were recorded")
        for stage in (Stage.STORE, Stage.LOAD):
            if stage in rec.last_of_stage or rec.pending_pops[stage]:
                self.dep_push(stage, Stage.COMPUTE)
                self.dep_pop(stage, Stage.COMPUTE)
        self._emit(isa.FinishInsn())
        program = Program.from_insns(self.cfg, rec.insns, rec.relocs, rec.constants)
        self._rec = _Recording.empty()
        return program

    def _addresses(self, program: Program,
                   bindings: Mapping[str, DeviceArray | int] | None) -> dict[str, int]:
        addresses: dict[str, int] = {}
        sizes: dict[str, int] = {}
        for slot, words in program.constants.items():
            data = np.ascontiguousarray(words, dtype="<u4")
            cached = self._uop_buffers.get(slot)
            if cached is not None and not np.array_equal(cached[1], data):
                # the same name, other micro-ops: the device copy is replaced, never reused
                cached[0].free()
                cached = None
            if cached is None:
                cached = (self.array(data, name=slot), data.copy())
                self._uop_buffers[slot] = cached
            addresses[slot] = cached[0].addr
        for slot in program.arguments:
            target = (bindings or {}).get(slot, self._arrays.get(slot))
            if target is None:
                raise ValueError(f"no buffer bound to slot {slot!r} (bind it: "
                                 f"run_program(program, {{{slot!r}: array}}))")
            if not isinstance(target, DeviceArray):
                target = self._array_at(slot, int(target))
            addresses[slot] = target.addr
            sizes[slot] = target.nbytes
        check_confined(program, sizes, "run_program")
        return addresses

    def _array_at(self, slot: str, addr: int) -> DeviceArray:
        """The array of this session that starts at ``addr`` (a slot bound by address)."""
        for arr in self._arrays.values():
            if arr.addr == addr:
                return arr
        raise ValueError(f"slot {slot!r} is bound to address {addr:#x}, where no array of "
                         f"this session starts (expected a DeviceArray, or the address of "
                         f"one; a stream reaches only the arrays it is bound to)")

    def _execute(self, program: Program, bindings: Mapping[str, DeviceArray | int] | None,
                 timeout_s: float | None) -> RunResult:
        insn_addr, count = self._stage(program, bindings)
        self.device.run(insn_addr, count)
        self.last_result = self.device.wait(self.timeout_s if timeout_s is None else timeout_s)
        return self.last_result

    def _stage(self, program: Program, bindings: Mapping[str, DeviceArray | int] | None
               ) -> tuple[int, int]:
        """Link ``program`` and write it to device memory: (insn_addr, insn_count)."""
        stream = program.link(self._addresses(program, bindings))
        if self._insn_buf is None or self._insn_buf.nbytes < len(stream):
            if self._insn_buf is not None:
                self._insn_buf.free()
            size = max(len(stream), 4096)
            self._insn_buf = self.alloc((size,), np.uint8, name=f"insn{next(self._ids)}")
        self.device.write(self._insn_buf.addr, np.frombuffer(stream, dtype=np.uint8))
        return self._insn_buf.addr, len(stream) // isa.INSN_BYTES

    def image(self, program: Program, bindings: Mapping[str, DeviceArray | int] | None = None,
              description: str = "") -> RunImage:
        """``program`` linked to this session's buffers, with the device memory it reads, as a
        :class:`vtakit.vta_sim.RunImage`: a run pinned to its addresses.

        A run's cycle count depends on where its buffers sit (docs/timing.md, "Placement"), so
        comparing devices means running the same image on each: :func:`run_image`."""
        from vtakit.vta_sim import RunImage

        insn_addr, count = self._stage(program, bindings)
        top = max(a.addr + a.nbytes for a in self._arrays.values())
        dram = self.device.read(0, (top + 4095) & ~4095)
        return RunImage(self.cfg, dram, insn_addr, count, description)

    def save_image(self, program: Program, path: str,
                   bindings: Mapping[str, DeviceArray | int] | None = None,
                   description: str = "") -> None:
        """Save :meth:`image` to ``path`` (``vtakit sim`` replays it)."""
        self.image(program, bindings, description).save(path)

    def synchronize(self, timeout_s: float | None = None) -> RunResult:
        """Finish the stream, run it and wait for it; returns cycles and statistics."""
        if not self._rec.insns:
            return RunResult(cycles=0)
        program = self.finalize()
        try:
            return self._execute(program, None, timeout_s)
        except BaseException:
            self._resident.clear()  # the UOP SRAM may hold anything after a failed run
            self._uop_top = 0
            raise

    @contextmanager
    def record(self) -> Iterator[list[Program]]:
        """Record a stream without running it: ``with s.record() as out: ...``; afterwards
        ``out[0]`` is the :class:`Program`, which loads all of its own micro-ops."""
        if self._rec.insns:
            raise ValueError("record: finish or synchronize the pending stream first")
        saved, saved_top = self._resident.copy(), self._uop_top
        self._resident.clear()
        self._uop_top = 0
        out: list[Program] = []
        try:
            yield out
            out.append(self.finalize())
        finally:
            self._rec = _Recording.empty()
            self._resident, self._uop_top = saved, saved_top

    def run_program(self, program: Program, bindings: Mapping[str, DeviceArray | int] | None
                    = None, timeout_s: float | None = None) -> RunResult:
        """Link ``program`` to ``bindings`` (slot -> array or address) and run it."""
        if program.cfg != self.cfg:
            raise ValueError(f"program was built for configuration {program.cfg.hash}, the "
                             f"device is {self.cfg.hash}")
        if self._rec.insns:
            raise ValueError("run_program: synchronize the pending stream first")
        _check_program_indices(self.cfg, program)
        self._resident.clear()  # the program loads micro-ops wherever it likes
        self._uop_top = 0
        return self._execute(program, bindings, timeout_s)


def _check_program_indices(cfg: HwConfig, program: Program) -> None:
    """``ValueError`` naming the first instruction of ``program`` whose SRAM rows leave their
    buffer (:func:`vtakit.driver.stream_check.check_program`): the simulator refuses such an
    index, the RTL takes it modulo the buffer's index width, so the host checks it."""
    check_program(cfg, program, "run_program")


def _release(device: Device, owned: set[int]) -> None:
    for addr in sorted(owned):
        device.free(addr)
    owned.clear()


@dataclass(frozen=True)
class ImageRun:
    """What :func:`run_image` returns: the device's result and the whole image's DRAM after the
    run (uint8, the image's size)."""

    result: RunResult
    dram: np.ndarray

    @property
    def cycles(self) -> int:
        return self.result.cycles


def run_image(device: Device, image: RunImage, timeout_s: float = 600.0) -> ImageRun:
    """Run ``image`` on ``device`` at the image's own addresses: the same program, buffers and
    instruction stream at the same physical addresses on every device, so cycle counts compare
    (docs/timing.md, "Placement").

    The image occupies device memory ``[0, image.dram.size)``; that range must be free (a
    device with no live session arrays there), else ``ValueError`` naming the block in the way.
    The range is reserved for the run and freed afterwards."""
    if image.cfg != device.cfg:
        raise ValueError(f"run_image: the image was made for configuration {image.cfg.hash}, "
                         f"the device is {device.cfg.hash}")
    size = int(image.dram.size)
    device.reserve(0, size)
    try:
        device.write(0, image.dram)
        device.run(image.insn_addr, image.insn_count)
        result = device.wait(timeout_s)
        return ImageRun(result, device.read(0, size))
    finally:
        device.free(0)
