"""The simulator's SRAM range check of an instruction stream, done on the host before the
stream runs.

The simulator refuses an instruction whose SRAM indices leave their buffer (``SRAM index out
of range``, :mod:`vtakit.vta_sim.semantics`); the core takes indices modulo the buffer's
index width and would wrap around silently. So the driver checks streams on the host:

* :class:`StreamChecker` (a device without hardware range checks: ``rtl``, a board) checks a
  whole stream in :meth:`~vtakit.driver.device.Device.run`, before it starts it, and raises the
  ``sim`` device's error for the first bad instruction: a
  :class:`~vtakit.driver.errors.DeviceError` with the same message, ``index`` and ``insn``;
* :func:`check_program` (``Session.run_program``) checks a relocatable
  :class:`~vtakit.driver.program.Program`, and :func:`loop_overflow` (``Session.gemm`` /
  ``Session.alu``) one recorded loop, each raising ``ValueError`` at the call.

What is judged, in stream order (the first bad instruction is reported):

* LOAD of UOP, WGT, INP, ACC or ACC_8BIT with ``x_size > 0``: SRAM rows ``sram_base ..
  sram_base + (y_pad_0 + y_size + y_pad_1) * (x_pad_0 + x_size + x_pad_1) - 1``;
* STORE of OUT without padding, with ``x_size > 0`` and ``y_size > 0``: rows ``sram_base ..
  sram_base + y_size * x_size - 1``;
* GEMM and ALU: ``uop_end <= uop_depth``, and, when the loop runs (``uop_bgn < uop_end``,
  ``iter_out > 0``, ``iter_in > 0``), every loop index in closed form: factors are unsigned, so
  a field's largest index is its largest micro-op value plus ``factor_out * (iter_out - 1) +
  factor_in * (iter_in - 1)``. GEMM's dst, src, wgt index ACC, INP, WGT; the ALU's dst and src
  both index ACC. Example: micro-op dst=1, ``iter_out=2, dst_factor_out=1023``, ``iter_in=1``
  reaches ACC row 1024, out of range for an ACC of depth 1024.

A loop's micro-ops come from a shadow of the UOP SRAM: ``(uop_depth, 3)`` int64 rows of dst,
src, wgt, ``-1`` where the host does not know the row. Each LOAD UOP of the stream writes its
rows (zeros for its padding) in stream order, which is the order the compute unit executes
LOAD UOP, GEMM and ALU in. Unknown micro-ops are not judged (the loop runs unchecked): rows
never loaded, rows of a LOAD UOP that reads DRAM a STORE of the same stream writes (the store
unit runs alongside the compute unit), of one that reads outside device memory (the simulator
reports that as a DRAM fault), and, for a device, rows an interrupted run may or may not have
loaded (:meth:`StreamChecker.settle`).

Malformed instructions, the token protocol and DRAM ranges are not judged here; the simulator
refuses them with their own messages and the core reports its own faults
(docs/hardware.md, "Faults").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from vtakit.driver.errors import DeviceError
from vtakit.driver.program import Program, Reloc
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig

__all__ = ["StreamChecker", "check_stream", "dram_reader", "unknown_uops", "find_range_fault",
           "RangeFault", "check_program", "loop_overflow", "ReadDram"]

Op, T = isa.Opcode, isa.MemType

#: ``read_dram(addr, nbytes)``: ``nbytes`` of device memory at byte ``addr`` as uint8, or
#: ``None`` where ``[addr, addr + nbytes)`` is not all device memory.
ReadDram = Callable[[int, int], np.ndarray | None]

#: The buffer each loop index of a GEMM/ALU reads or writes (docs/isa.md "Execution
#: semantics"; the ALU's ``src`` reads ACC).
_LOOP_BUFFERS = {"gemm": (("dst", T.ACC), ("src", T.INP), ("wgt", T.WGT)),
                 "alu": (("dst", T.ACC), ("src", T.ACC))}
_FIELDS = ("dst", "src", "wgt")
#: Above this many bytes between a strided LOAD UOP's first and last element, its rows are
#: read one by one instead of as one span.
_SPAN_READ_BYTES = 1 << 20


def unknown_uops(cfg: HwConfig) -> np.ndarray:
    """A UOP SRAM shadow that knows nothing: ``(uop_depth, 3)`` int64, all ``-1``."""
    return np.full((cfg.uop_depth, 3), -1, dtype=np.int64)


def dram_reader(dram: np.ndarray) -> ReadDram:
    """The :data:`ReadDram` of a device whose memory (or its authoritative copy) is the host
    array ``dram`` (uint8): views of it, ``None`` outside it."""
    def read(addr: int, nbytes: int) -> np.ndarray | None:
        if addr < 0 or nbytes < 0 or addr + nbytes > dram.size:
            return None
        return dram[addr:addr + nbytes]
    return read


def loop_overflow(cfg: HwConfig, mode: str, uops: np.ndarray, iter_out: int, iter_in: int,
                  factors: Mapping[str, tuple[int, int]]) -> str | None:
    """What is wrong with the largest index of a GEMM/ALU loop, or ``None`` if every index is
    inside its buffer.

    ``mode`` is ``"gemm"`` or ``"alu"``; ``uops`` is (n, 3): dst, src, wgt; ``factors[field]``
    is (factor_out, factor_in). In closed form (module docstring)."""
    if len(uops) == 0 or iter_out < 1 or iter_in < 1:
        return None
    for col, (field, mem) in enumerate(_LOOP_BUFFERS[mode]):
        fo, fi = factors[field]
        values = np.asarray(uops[:, col], dtype=np.int64)
        u = int(values.argmax())
        top = int(values[u]) + fo * (iter_out - 1) + fi * (iter_in - 1)
        depth = cfg.depth(mem)
        if top >= depth:
            return (f"{field} index {top} = micro-op {u} {field}={int(values[u])} + "
                    f"{fo}*{iter_out - 1} + {fi}*{iter_in - 1} (at the last loop iteration) "
                    f"is out of range: {mem.name} SRAM has depth {depth} (rows "
                    f"0..{depth - 1})")
    return None


@dataclass(frozen=True)
class RangeFault:
    """The first instruction of a stream whose SRAM indices leave their buffer.

    Attributes
    ----------
    index : int
        Its index in the stream.
    what : str
        ``"rows"`` (a LOAD's or STORE's block), ``"uop_end"`` or ``"loop"`` (a GEMM/ALU index).
    uops : np.ndarray | None
        For ``"loop"``: the (n, 3) micro-ops ``uop_bgn..uop_end - 1`` it runs (all known).
    """

    index: int
    what: str
    uops: np.ndarray | None = None


#: ``fetch(k)``: the micro-op words (uint32, shape (y_size, x_size)) LOAD UOP ``k`` reads from
#: DRAM, or ``None`` if they are not known.
FetchUops = Callable[[int], np.ndarray | None]


def _row_blocks(cfg: HwConfig, d: isa.DecodedStream) -> tuple[np.ndarray, np.ndarray]:
    """(SRAM rows each instruction's block spans, the depth of its buffer); meaningful where
    the opcode is LOAD or STORE with a valid memory type."""
    op, mt = d.opcode, d["memory_type"]
    cols = d["x_pad_0"] + d["x_size"] + d["x_pad_1"]
    rows = np.where(op == Op.STORE, d["y_size"] * d["x_size"],
                    (d["y_pad_0"] + d["y_size"] + d["y_pad_1"]) * cols)
    depth = np.array([cfg.depth(t) for t in T], dtype=np.int64)[np.minimum(mt, max(T))]
    return rows, depth


def find_range_fault(cfg: HwConfig, d: isa.DecodedStream, uops: np.ndarray,
                     fetch: FetchUops) -> tuple[RangeFault | None, np.ndarray]:
    """The first instruction of the decoded stream ``d`` whose SRAM indices leave their buffer
    (``None`` if there is none), and the UOP SRAM shadow after the stream (meaningful when
    there is none).

    ``uops`` is the shadow before the stream (not modified); ``fetch`` gives the micro-ops
    each LOAD UOP reads. Vectorised over the instructions; Python runs a few numpy calls per
    LOAD UOP and per run of loops between two LOAD UOPs."""
    op, mt, n = d.opcode, d["memory_type"], d.count
    x, y = d["x_size"], d["y_size"]
    pads = d["y_pad_0"] | d["y_pad_1"] | d["x_pad_0"] | d["x_pad_1"]
    valid = mt <= max(T)
    loads = (op == Op.LOAD) & valid & (mt != T.OUT) & (x > 0)
    stores = (op == Op.STORE) & (mt == T.OUT) & (pads == 0) & (x > 0) & (y > 0)
    rows, depth = _row_blocks(cfg, d)
    rows_bad = (loads | stores) & (d["sram_base"] + rows > depth)
    loops = (op == Op.GEMM) | (op == Op.ALU)
    bgn, end = d["uop_bgn"], d["uop_end"]
    end_bad = loops & (end > cfg.uop_depth)
    static = np.flatnonzero(rows_bad | end_bad)
    stop = int(static[0]) if static.size else n
    # the loops before ``stop`` that run, and the LOAD UOPs that change the micro-ops between
    # them (the compute unit executes both in stream order)
    head = np.arange(n) < stop
    runs = loops & head & (bgn < end) & (d["iter_out"] > 0) & (d["iter_in"] > 0)
    queries = np.flatnonzero(runs)
    updates = np.flatnonzero(loads & head & (mt == T.UOP))
    shadow = _Shadow(uops)
    largest = shadow.replay(_LoadBlocks(cfg, d, updates, fetch), queries, bgn[queries],
                            end[queries])
    top = np.full((n, 3), -1, dtype=np.int64)
    top[queries] = largest
    bad = np.zeros(n, dtype=bool)
    known = runs & (top[:, 0] >= 0)
    never = np.iinfo(np.int64).max  # the ALU has no wgt
    for col, field in enumerate(_FIELDS):
        reach = (top[:, col] + d[f"{field}_factor_out"] * (d["iter_out"] - 1)
                 + d[f"{field}_factor_in"] * (d["iter_in"] - 1))
        bound = np.where(op == Op.GEMM, cfg.depth(dict(_LOOP_BUFFERS["gemm"])[field]),
                         cfg.depth(T.ACC) if field != "wgt" else never)
        bad |= known & (reach >= bound)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        before = _Shadow(uops)
        before.replay(_LoadBlocks(cfg, d, updates[updates < k], fetch), queries[:0],
                      bgn[:0], end[:0])
        return RangeFault(k, "loop", before.rows[int(bgn[k]):int(end[k]), :3].copy()), \
            shadow.uops()
    if stop < n:
        return RangeFault(stop, "uop_end" if end_bad[stop] else "rows"), shadow.uops()
    return None, shadow.uops()


class _Shadow:
    """The UOP SRAM shadow during a scan: (depth + 1, 4) int64 rows of dst, src, wgt and an
    unknown flag (1: unknown, dst = src = wgt = -1); the extra last row is never written, so
    that ``depth`` is a valid index for ``reduceat``."""

    def __init__(self, uops: np.ndarray):
        depth = len(uops)
        self.rows = np.zeros((depth + 1, 4), dtype=np.int64)
        self.rows[:depth, :3] = uops
        self.rows[:depth, 3] = uops[:, 0] < 0
        self.rows[:depth][self.rows[:depth, 3] == 1, :3] = -1

    def uops(self) -> np.ndarray:
        return self.rows[:-1, :3].copy()

    def replay(self, loads: _LoadBlocks, queries: np.ndarray, bgn: np.ndarray,
               end: np.ndarray) -> np.ndarray:
        """Apply ``loads`` in order; before each, answer the queries (loops, by stream index)
        that come before it: (len(queries), 3) largest dst, src, wgt over ``bgn..end - 1``,
        -1 where a row is unknown. Queries and loads are sorted by stream index."""
        out = np.empty((len(queries), 3), dtype=np.int64)
        cuts = np.searchsorted(queries, loads.index, side="left").tolist() + [len(queries)]
        first = 0
        for j, cut in enumerate(cuts):
            if cut > first:
                out[first:cut] = self._largest(bgn[first:cut], end[first:cut])
                first = cut
            if j < len(loads.index):
                loads.apply(j, self.rows)
        return out

    def _largest(self, bgn: np.ndarray, end: np.ndarray) -> np.ndarray:
        if len(bgn) <= 4:  # a few loops between two LOAD UOPs: cheaper one by one
            out = np.empty((len(bgn), 3), dtype=np.int64)
            for i, (b, e) in enumerate(zip(bgn.tolist(), end.tolist())):
                most = self.rows[b:e].max(axis=0)
                out[i] = -1 if most[3] else most[:3]
            return out
        depth = len(self.rows) - 1
        pairs, inverse = np.unique(bgn * (depth + 1) + end, return_inverse=True)
        ub, ue = pairs // (depth + 1), pairs % (depth + 1)
        # reduceat over [ub0, ue0, ub1, ue1, ...] of the rows ub0..max(ue): the even segments
        # are the ranges (all non-empty); the pairs are sorted by ub, so the odd segments
        # between them and the last one add at most those rows of work
        lo, hi = int(ub[0]), int(ue.max())
        most = np.maximum.reduceat(self.rows[lo:hi + 1], np.stack([ub, ue], axis=1).ravel() - lo,
                                   axis=0)[::2]
        most[most[:, 3] == 1, :3] = -1
        return most[inverse.ravel(), :3]


class _LoadBlocks:
    """The SRAM blocks a list of LOAD UOPs write, fetched and decoded in batches.

    Block ``j`` is ``rows_j`` rows at ``sram_base_j``: zeros for the padding, the micro-ops
    ``fetch`` gives, unknown rows where it gives ``None``."""

    #: Rows decoded at once (bounds the memory a stream of many LOAD UOPs needs).
    BATCH_ROWS = 1 << 18

    def __init__(self, cfg: HwConfig, d: isa.DecodedStream, index: np.ndarray,
                 fetch: FetchUops):
        self.cfg, self.fetch, self.index = cfg, fetch, index
        self.y, self.x = d["y_size"][index], d["x_size"][index]
        self.yp0, self.xp0 = d["y_pad_0"][index], d["x_pad_0"][index]
        self.cols = self.xp0 + self.x + d["x_pad_1"][index]
        self.rows = (self.yp0 + self.y + d["y_pad_1"][index]) * self.cols
        self.base = d["sram_base"][index].tolist()
        self.size = self.rows.tolist()
        self._batch: tuple[int, int, list[int], np.ndarray] | None = None  # first, stop, at

    def apply(self, j: int, shadow: np.ndarray) -> None:
        """Write block ``j`` into ``shadow`` (the scan's (depth + 1, 4) rows)."""
        if self._batch is None or not self._batch[0] <= j < self._batch[1]:
            self._batch = self._decode(j)
        first, _, at, values = self._batch
        base, size = self.base[j], self.size[j]
        shadow[base:base + size] = values[at[j - first]:at[j - first] + size]

    def _decode(self, first: int) -> tuple[int, int, list[int], np.ndarray]:
        """Blocks ``first..stop - 1`` (at most :attr:`BATCH_ROWS` rows, or one block)."""
        total = np.cumsum(self.rows[first:])
        stop = first + max(1, int(np.searchsorted(total, self.BATCH_ROWS, side="right")))
        sl = slice(first, stop)
        y, x, cols = self.y[sl], self.x[sl], self.cols[sl]
        starts = np.concatenate([[0], np.cumsum(self.rows[sl])])
        values = np.zeros((int(starts[-1]), 4), dtype=np.int64)
        words, known = [], np.ones(stop - first, dtype=bool)
        for j, (k, has_data) in enumerate(zip(self.index[sl].tolist(), (y > 0).tolist())):
            w = self.fetch(k) if has_data else None
            if w is not None:
                words.append(w.reshape(-1))
            elif has_data:
                known[j] = False
        # every data element: its block b, row r and column c there, and its row of values
        count = y * x
        b = np.repeat(np.arange(stop - first), count)
        t = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        r, c = t // x[b], t % x[b]
        pos = starts[b] + (self.yp0[sl][b] + r) * cols[b] + self.xp0[sl][b] + c
        ok = known[b]
        if words:
            values[pos[ok], :3] = np.stack(
                isa.decode_uops(np.concatenate(words), self.cfg), axis=1)
        values[pos[~ok]] = (-1, -1, -1, 1)
        return first, stop, starts[:-1].tolist(), values


# ---- a device: the simulator's error, the shadow kept across runs ---------------------------
def _dram_fetch(cfg: HwConfig, d: isa.DecodedStream, read_dram: ReadDram) -> FetchUops:
    """Micro-ops from device memory; unknown where a STORE of the same stream may write them
    (the store unit runs alongside the compute unit, in either order) or outside memory."""
    op, mt = d.opcode, d["memory_type"]
    x, y, stride, base = d["x_size"], d["y_size"], d["x_stride"], d["dram_base"]
    stores = (op == Op.STORE) & (x > 0) & (y > 0) & (mt <= max(T))
    eb = np.array([cfg.elem_bytes(t) for t in T], dtype=np.int64)[np.minimum(mt, max(T))]
    span = (np.maximum(y, 1) - 1) * stride + x  # elements from the first to the last
    lo, hi = base * eb, (base + span) * eb
    # the stores sorted by their first byte, with the furthest last byte of any store so far:
    # a block [lo, hi) meets a store iff one of the stores starting below hi ends above lo
    order = np.argsort(lo[stores], kind="stable")
    s_lo, s_hi = lo[stores][order], np.maximum.accumulate(hi[stores][order])
    below = np.searchsorted(s_lo, hi, side="left") - 1
    raced = (below >= 0) & (s_hi[np.maximum(below, 0)] > lo) if s_lo.size else \
        np.zeros(d.count, dtype=bool)
    ub = isa.UOP_BYTES

    def fetch(k: int) -> np.ndarray | None:
        if raced[k]:
            return None
        a, b = int(lo[k]), int(hi[k])  # a LOAD UOP's elements are micro-ops
        rows, cols, step = int(y[k]), int(x[k]), int(stride[k])
        if rows == 1 or step == cols:
            raw = read_dram(a, b - a)
            return None if raw is None else _as_words(raw).reshape(rows, cols)
        if b - a <= _SPAN_READ_BYTES:
            raw = read_dram(a, b - a)
            if raw is None:
                return None
            at = np.arange(rows)[:, None] * step + np.arange(cols)[None, :]
            return _as_words(raw)[at]
        out = np.empty((rows, cols), dtype="<u4")
        for r in range(rows):
            raw = read_dram(a + r * step * ub, cols * ub)
            if raw is None:
                return None
            out[r] = _as_words(raw)
        return out

    return fetch


def _as_words(raw: np.ndarray) -> np.ndarray:
    """Bytes of device memory as little-endian uint32 micro-op words."""
    return np.ascontiguousarray(raw, dtype=np.uint8).view("<u4")


def _insn_fields(cfg: HwConfig, d: isa.DecodedStream, k: int) -> dict[str, int]:
    """Instruction ``k``'s fields as the simulator's errors carry them (its layout's fields in
    order, then ``kind``)."""
    from vtakit.vta_sim.program import kind_of

    names = isa.layouts(cfg).for_opcode(int(d.opcode[k])).names
    insn = {name: int(d[name][k]) for name in names}
    insn["kind"] = kind_of(insn)  # type: ignore[assignment]  # a str among the ints
    return insn


def _simulator_error(cfg: HwConfig, d: isa.DecodedStream, fault: RangeFault) -> DeviceError:
    """The ``sim`` device's error for ``fault``: the simulator's own check of the instruction,
    over a state holding the micro-ops it runs."""
    from vtakit.vta_sim.errors import ExecFault, SimError
    from vtakit.vta_sim.semantics import check
    from vtakit.vta_sim.state import ArchState

    k = fault.index
    insn = _insn_fields(cfg, d, k)
    uop = np.zeros(cfg.uop_depth, dtype=np.uint32)
    if fault.uops is not None:
        uop[insn["uop_bgn"]:insn["uop_end"]] = isa.encode_uops(fault.uops, cfg)
    # buffers of the right depths and no contents: the check reads only their depths and UOP
    state = ArchState(cfg, inp=np.empty((cfg.inp_depth, 0), np.int8),
                      wgt=np.empty((cfg.wgt_depth, 0), np.int8),
                      acc=np.empty((cfg.acc_depth, 0), np.int32),
                      out=np.empty((cfg.out_depth, 0), np.int8), uop=uop)
    try:
        check(state, np.zeros(0, np.uint8), insn)
    except ExecFault as err:
        sim = SimError(str(err), k, insn)
        return DeviceError(str(sim), sim.index, sim.insn)
    raise AssertionError(f"stream_check: instruction #{k} {insn} was judged out of range but "
                         f"the simulator's check passes it")


def check_stream(cfg: HwConfig, stream: bytes | np.ndarray, uops: np.ndarray,
                 read_dram: ReadDram) -> np.ndarray:
    """Refuse ``stream`` if an instruction's SRAM indices leave their buffer, as the simulator
    would: :class:`~vtakit.driver.errors.DeviceError` naming the first such instruction, with
    the ``sim`` device's message, ``index`` and ``insn`` (``instruction #3 GEMM(...): SRAM index
    out of range: ACC[1024] at loop iteration 5 but ACC has depth 1024 (expected indices
    0..1023)``).

    Parameters
    ----------
    cfg : HwConfig
    stream : bytes | np.ndarray
        The instructions (bytes, or a uint8/uint64 array), as the device will fetch them.
    uops : np.ndarray
        The UOP SRAM shadow before the stream (:func:`unknown_uops` if nothing is known); not
        modified.
    read_dram : ReadDram
        Device memory, for the micro-ops LOAD UOP reads (:func:`dram_reader` of a host copy).

    Returns
    -------
    np.ndarray
        The shadow once the stream has run to the end.
    """
    if not isinstance(uops, np.ndarray) or uops.shape != (cfg.uop_depth, 3):
        raise ValueError(f"check_stream: uops is {getattr(uops, 'shape', type(uops).__name__)}; "
                         f"expected a ({cfg.uop_depth}, 3) array (dst, src, wgt of each UOP "
                         f"SRAM row, -1 where unknown; unknown_uops(cfg) knows nothing)")
    d = isa.decode_stream(stream, cfg)
    fault, after = find_range_fault(cfg, d, uops, _dram_fetch(cfg, d, read_dram))
    if fault is not None:
        raise _simulator_error(cfg, d, fault)
    return after


class StreamChecker:
    """The range check of a device whose core does not check SRAM indices itself, with what the
    host knows of the device's UOP SRAM, kept across runs as the core keeps its buffers.

    A device calls, for every stream::

        self.stream_check = StreamChecker(cfg)              # in __init__
        self.stream_check.check(stream, read_dram)          # in run(), before starting it:
                                                            # DeviceError, nothing started
        self.stream_check.settle(completed)                 # once the run is over: True if it
                                                            # ran to FINISH, False if it failed
        self.stream_check.forget()                          # the buffers were lost (power,
                                                            # a fresh simulator process)

    Parameters
    ----------
    cfg : HwConfig

    Attributes
    ----------
    uops : np.ndarray
        (uop_depth, 3) int64: dst, src, wgt of every UOP SRAM row as the last settled run left
        it, ``-1`` where unknown (at first, everywhere).
    """

    def __init__(self, cfg: HwConfig):
        self.cfg = cfg
        self.uops = unknown_uops(cfg)
        self._after: np.ndarray | None = None

    def check(self, stream: bytes | np.ndarray, read_dram: ReadDram) -> None:
        """:func:`check_stream` against :attr:`uops`; on success the stream's effect on the UOP
        SRAM waits for :meth:`settle`."""
        self._after = None
        self._after = check_stream(self.cfg, stream, self.uops, read_dram)

    def settle(self, completed: bool) -> None:
        """The checked stream's run is over. ``completed``: it ran to FINISH, so its LOAD UOPs
        all happened; otherwise some may not have, and the rows they write become unknown
        (unless they load what the row already held)."""
        after, self._after = self._after, None
        if after is None:
            return
        if completed:
            self.uops = after
        else:
            same = (after == self.uops).all(axis=1, keepdims=True)
            self.uops = np.where(same, self.uops, -1)

    def forget(self) -> None:
        """Nothing is known of the UOP SRAM any more."""
        self.uops = unknown_uops(self.cfg)
        self._after = None


# ---- a relocatable Program (Session.run_program) ---------------------------------------------
def _constant_fetch(cfg: HwConfig, d: isa.DecodedStream, program: Program) -> FetchUops:
    """Micro-ops from the program's constants; unknown when a LOAD UOP reads an argument
    buffer (bound at run time) or past the end of a constant."""
    relocs: dict[int, Reloc] = {r.index: r for r in program.relocs}

    def fetch(k: int) -> np.ndarray | None:
        reloc = relocs.get(k)
        words = program.constants.get(reloc.slot) if reloc is not None else None
        if reloc is None or words is None:
            return None
        words = np.ascontiguousarray(words, dtype="<u4").reshape(-1)
        y, x, stride = int(d["y_size"][k]), int(d["x_size"][k]), int(d["x_stride"][k])
        at = reloc.elem_offset + np.arange(y)[:, None] * stride + np.arange(x)[None, :]
        if reloc.elem_offset < 0 or int(at.max()) >= words.size:
            return None
        return words[at]

    return fetch


def check_program(cfg: HwConfig, program: Program, what: str) -> None:
    """``ValueError`` (its message starting with ``what``) naming the first instruction of
    ``program`` whose SRAM rows leave their buffer: a LOAD's or STORE's block, a GEMM/ALU's
    ``uop_end``, and every loop index of a GEMM/ALU whose micro-ops the program loads itself
    (from its constants; micro-ops loaded from an argument buffer or by an earlier run are not
    known here, and the device checks them)."""
    d = isa.decode_stream(program.words, cfg)
    fault, _ = find_range_fault(cfg, d, unknown_uops(cfg), _constant_fetch(cfg, d, program))
    if fault is None:
        return
    k = fault.index
    name = isa.Opcode(int(d.opcode[k])).name
    if fault.what == "loop":
        assert fault.uops is not None
        mode = name.lower()
        bgn, end = int(d["uop_bgn"][k]), int(d["uop_end"][k])
        factors = {f: (int(d[f"{f}_factor_out"][k]), int(d[f"{f}_factor_in"][k]))
                   for f, _ in _LOOP_BUFFERS[mode]}
        why = loop_overflow(cfg, mode, fault.uops, int(d["iter_out"][k]), int(d["iter_in"][k]),
                            factors)
        raise ValueError(f"{what}: instruction #{k} {name} (micro-ops {bgn}..{end - 1}): {why}")
    if fault.what == "uop_end":
        raise ValueError(f"{what}: instruction #{k} {name}: uop_end={int(d['uop_end'][k])} is "
                         f"out of range: UOP SRAM has depth {cfg.uop_depth}")
    mem = T(int(d["memory_type"][k])).name
    rows, depth = _row_blocks(cfg, d)
    base = int(d["sram_base"][k])
    raise ValueError(f"{what}: instruction #{k} {name} {mem}: {mem} SRAM rows {base}.."
                     f"{base + int(rows[k]) - 1} are out of range (depth {int(depth[k])})")
