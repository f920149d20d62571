"""Tilings of the accelerator's layers: what fits the on-chip buffers and the instruction
fields, and an analytic model of the cycles of each (the compiler picks the tiling it predicts
fastest; `tune` re-ranks the best few with the simulator's timing layer).

A convolution tile is ``tob`` output-channel blocks x ``toh`` output rows x ``tow`` output
columns of one batch block; its input channels arrive in chunks of ``tib`` blocks. With
``threads = 2`` each SRAM is split in two halves and chunk/tile ``k`` uses half ``k % 2``.
A pooling or add tile is ``toh x tow`` output elements of one channel block.

The model (`estimate`) replays the instructions `codegen` emits for a tiling, in stream order,
on the timing contract's three units (docs/timing.md §3-§4): each instruction starts when fetch
has dispatched it (fetch groups, full command queues), its unit is free and the token it pops
(`driver.VirtualThreads`' pattern) is visible; micro-op kernels are loaded when they are not
resident. Transfers take their uncontended closed form (§2): what it leaves out is mainly the
shared memory port (fetch, compute, load and store transfers taking turns, the store last), so
it predicts a little low, most where a one-thread tiling's loads meet compute's and fetch's
transfers (digits CNN, LeNet, MLP: 1-9 % per layer, mean 4 %; docs/timing.md §5a's placement
effects are left out too).
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.timing_facts import (
    ALU_PIPELINE_CYCLES,
    LOAD_SETUP_CYCLES,
    NOP_CYCLES,
    PAD_ONLY_SETUP_CYCLES,
    STORE_SETUP_CYCLES,
    alu_cycles,
    gemm_cycles,
)

from .layers import AddLayer, ConvLayer, Layer, PoolLayer
from .requant import RequantProgram

__all__ = ["ConvSchedule", "RowSchedule", "Schedule", "ConvGeometry", "conv_geometry",
           "conv_fits", "rows_fit", "is_global", "fits", "conv_candidates", "row_candidates",
           "candidates", "estimate", "estimate_conv", "estimate_rows", "lower_bound",
           "compute_floor", "choose", "choose_conv", "choose_rows", "schedule_from_json",
           "NoSchedule"]


class NoSchedule(ValueError):
    """No tiling of a layer fits the configuration's buffers."""


@dataclass(frozen=True)
class ConvSchedule:
    """``order`` 1: output-channel groups outer, spatial tiles inner (a group's weights stay in
    their WGT half while its tiles pass); 2: spatial tiles outer (a tile's input window stays in
    its INP half while the output-channel groups pass). A load whose data its half already
    holds is skipped (`codegen.emit_conv`)."""

    toh: int
    tow: int
    tob: int
    tib: int
    threads: int = 2
    order: int = 1

    def to_json(self) -> dict[str, int]:
        return {"toh": self.toh, "tow": self.tow, "tob": self.tob, "tib": self.tib,
                "threads": self.threads, "order": self.order}


@dataclass(frozen=True)
class RowSchedule:
    """Pooling and adds: ``toh x tow`` output elements of one channel block per tile. A global
    pool (`is_global`) has one output element and reads its plane ``chunk`` input rows at a
    time into ACC (0: the whole plane at once), so a plane of any size fits."""

    toh: int
    tow: int
    threads: int = 2
    chunk: int = 0

    def to_json(self) -> dict[str, int]:
        out = {"toh": self.toh, "tow": self.tow, "threads": self.threads}
        return out | ({"chunk": self.chunk} if self.chunk else {})


Schedule: TypeAlias = "ConvSchedule | RowSchedule"


def schedule_from_json(L: Layer, fields: dict[str, int]) -> Schedule:
    """The schedule of layer `L`'s kind with these fields (`to_json`'s); `ValueError` names a
    missing or unknown field."""
    cls: type[ConvSchedule] | type[RowSchedule] = (
        ConvSchedule if isinstance(L, ConvLayer) else RowSchedule)
    want = set(cls.__dataclass_fields__)
    got = set(fields)
    if not want - {"threads", "order", "chunk"} <= got <= want or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in fields.values()):
        raise ValueError(f"layer {L.name!r} ({L.kind}): schedule {fields} is not a "
                         f"{cls.__name__} (expected positive integers {sorted(want)})")
    return cls(**fields)


@dataclass(frozen=True)
class ConvGeometry:
    nb: int  # batch blocks
    ib: int  # input-channel blocks
    ob: int  # output-channel blocks
    h: int
    w: int
    oh: int
    ow: int


def conv_geometry(L: ConvLayer, cfg: HwConfig) -> ConvGeometry:
    x, o = L.inputs[0], L.out
    return ConvGeometry(x.n // cfg.batch, -(-x.c // cfg.block_in), -(-o.c // cfg.block_out),
                        x.h, x.w, o.h, o.w)


def _limits(cfg: HwConfig) -> tuple[int, int]:
    lay = isa.layouts(cfg)
    return lay.gemm["iter_in"].max, lay.gemm["src_factor_out"].max


def conv_fits(L: ConvLayer, s: ConvSchedule, table_rows: int, cfg: HwConfig) -> bool:
    """Whether tiling `s` fits the buffers (one half each with two threads), the micro-op
    buffer and the instruction fields."""
    kh, kw = L.kernel
    sh, sw = L.strides
    in_rows, in_cols = (s.toh - 1) * sh + kh, (s.tow - 1) * sw + kw
    t = s.threads
    iter_max, factor_max = _limits(cfg)
    g = conv_geometry(L, cfg)
    return (t in (1, 2) and s.order in (1, 2)
            and s.tib * in_rows * in_cols <= cfg.inp_depth // t
            and s.tob * s.tib * kh * kw <= cfg.wgt_depth // t
            and s.tob * (s.toh * s.tow + table_rows) <= cfg.acc_depth // t
            and s.tob * s.tib * kh * kw <= cfg.uop_depth // 4
            and s.tob * s.toh <= iter_max and s.tow <= iter_max
            and sh * in_cols <= factor_max and s.tow <= factor_max
            and g.w <= 0xFFFF and g.ow <= 0xFFFF and g.ib * kh * kw <= 0xFFFF
            and t <= cfg.dep_queue_depth)


def is_global(L: Layer) -> bool:
    """A pool whose window is its whole, unpadded input plane (one output element)."""
    return (isinstance(L, PoolLayer) and L.kind == "avg_pool" and L.out.h == L.out.w == 1
            and not any(L.pads) and L.kernel == (L.inputs[0].h, L.inputs[0].w))


def rows_fit(L: Layer, s: RowSchedule, table_rows: int, cfg: HwConfig) -> bool:
    """Whether a pooling / add tile fits one ACC half (its output, the requantisation
    constants, and the input window, the chunk of a global pool's plane, or the second
    operand) and the instruction fields."""
    iter_max, factor_max = _limits(cfg)
    if s.chunk and not is_global(L):
        return False
    if is_global(L) and s.chunk:
        x = L.inputs[0]
        use = 1 + table_rows + s.chunk * x.w
        ok = (s.toh == s.tow == 1 and s.chunk <= x.h and s.chunk <= iter_max
              and x.w <= min(iter_max, factor_max))
    elif isinstance(L, PoolLayer):
        (kh, kw), (sh, sw) = L.kernel, L.strides
        in_rows, in_cols = (s.toh - 1) * sh + kh, (s.tow - 1) * sw + kw
        use = s.toh * s.tow + table_rows + in_rows * in_cols
        ok = sh * in_cols <= factor_max and kh * kw <= cfg.uop_depth // 4
    else:
        use, ok = 2 * s.toh * s.tow + table_rows, True
    return (ok and s.threads in (1, 2) and s.threads <= cfg.dep_queue_depth
            and use <= cfg.acc_depth // s.threads and s.toh <= iter_max
            and s.tow <= min(iter_max, factor_max))


def fits(L: Layer, s: Schedule, rqs: Sequence[RequantProgram], cfg: HwConfig) -> bool:
    """Whether `s` is a tiling of `L`'s kind that fits (`conv_fits` / `rows_fit`)."""
    rows = sum(r.rows for r in rqs)
    if isinstance(L, ConvLayer):
        return isinstance(s, ConvSchedule) and conv_fits(L, s, rows, cfg)
    return isinstance(s, RowSchedule) and rows_fit(L, s, rows, cfg)


def _sizes(n: int) -> list[int]:
    """Tile sizes worth trying for an extent n: its divisors and the powers of two below it."""
    out = {d for d in range(1, n + 1) if n % d == 0}
    out |= {1 << k for k in range(n.bit_length()) if 1 << k <= n}
    return sorted(out)


def conv_candidates(L: ConvLayer, table_rows: int, cfg: HwConfig) -> list[ConvSchedule]:
    """Every tiling of the search space that fits (see `conv_fits`)."""
    g = conv_geometry(L, cfg)
    out = []
    for t, tob, tib, toh, tow in itertools.product((2, 1), _sizes(g.ob), _sizes(g.ib),
                                                   _sizes(g.oh), _sizes(g.ow)):
        s = ConvSchedule(toh, tow, tob, tib, t)
        if conv_fits(L, s, table_rows, cfg):
            out.append(s)
            if tob < g.ob:  # more than one output-channel group: the other order differs
                out.append(ConvSchedule(toh, tow, tob, tib, t, order=2))
    return out


def row_candidates(L: Layer, table_rows: int, cfg: HwConfig) -> list[RowSchedule]:
    """Every pooling / add tile that fits (see `rows_fit`), largest first."""
    o = L.out
    out = []
    if is_global(L):
        for t, chunk in itertools.product((2, 1), _sizes(L.inputs[0].h)[::-1]):
            s = RowSchedule(1, 1, t, chunk)
            if rows_fit(L, s, table_rows, cfg):
                out.append(s)
        return out
    for t, tow, toh in itertools.product((2, 1), _sizes(o.w)[::-1], _sizes(o.h)[::-1]):
        s = RowSchedule(toh, tow, t)
        if rows_fit(L, s, table_rows, cfg):
            out.append(s)
    return out


_LOAD, _COMPUTE, _STORE = 0, 1, 2


class _Timeline:
    """The model's state: when each unit is free, where fetch is, which micro-op kernels are
    resident (as `driver.Session` keeps them: loaded on first use, all evicted when the next
    does not fit)."""

    def __init__(self, cfg: HwConfig) -> None:
        self.cfg = cfg
        self.latency = cfg.mem_read_latency_cycles
        self.group = max(1, cfg.mem_max_burst_beats * cfg.bus_bytes // isa.INSN_BYTES)
        self.group_cycles = self.beats(self.group * isa.INSN_BYTES) + self.latency
        self.free = [0, 0, 0]
        self.taken: list[deque[int]] = [deque(maxlen=cfg.cmd_queue_depth) for _ in range(3)]
        self.fetch = 0  # the first cycle fetch can dispatch the next instruction
        self.count = 0
        self.resident: set[Hashable] = set()
        self.uop_top = 0

    def beats(self, nbytes: int) -> int:
        return -(-nbytes // self.cfg.bus_bytes)

    def transfer(self, rows: int, row_bytes: int, pad: int = 0) -> int:
        """Cycles of a LOAD of `rows` rows of `row_bytes` and `pad` padding elements."""
        return (LOAD_SETUP_CYCLES + rows * self.beats(row_bytes) + self.latency + pad if rows
                else PAD_ONLY_SETUP_CYCLES + pad)

    def store(self, rows: int, row_bytes: int) -> int:
        return STORE_SETUP_CYCLES + rows * self.beats(row_bytes)

    def insn(self, unit: int, cycles: int, after: int = 0) -> int:
        """Issue one instruction of `unit` taking `cycles` once started, popping a token visible
        at `after`; returns its finish cycle."""
        if self.count % self.group == 0:  # §3: a group's transfer, then one dispatch a cycle
            self.fetch += self.group_cycles
        queue = self.taken[unit]
        dispatch = self.fetch
        if len(queue) == queue.maxlen:  # the queue is full until its oldest entry is taken
            dispatch = max(dispatch, queue[0] + 1)
        self.fetch = dispatch + 1
        self.count += 1
        take = max(self.free[unit], dispatch + 1)
        queue.append(take)
        self.free[unit] = max(take, after) + cycles
        return self.free[unit]

    def kernel(self, key: Hashable, uops: int, cycles: int, after: int = 0) -> int:
        """A GEMM/ALU of `cycles` over a kernel of `uops` micro-ops, loading them if needed.
        `key` stands for the micro-ops themselves (the driver keeps them resident by content:
        kernels that differ only in loops or ALU operation share one load): a tuple of
        (dst, src, wgt), or a tag and the parameters that determine them."""
        if key not in self.resident:
            if self.uop_top + uops > self.cfg.uop_depth:
                self.resident.clear()
                self.uop_top = 0
            self.resident.add(key)
            self.uop_top += uops
            self.insn(_COMPUTE, self.transfer(1, uops * self.cfg.uop_elem_bytes), after)
            after = 0
        return self.insn(_COMPUTE, cycles, after)

    def requant(self, rq: RequantProgram, acc: int, blocks: int, rows: int, cols: int,
                table: int) -> int:
        """`codegen._requant`'s ALU steps."""
        n = blocks * rows * cols
        end = self.free[_COMPUTE]
        for st in rq.steps:
            if st.imm is not None:
                end = self.kernel(((acc, acc, 0),), 1, alu_cycles(n, True))
            else:
                end = self.kernel(tuple((acc + b * rows * cols, table + b * rq.rows + st.row, 0)
                                        for b in range(blocks)), blocks, alu_cycles(n, False))
        return end

    def finish(self) -> int:
        """The end of the stream: compute waits for the last load and store, then FINISH."""
        return self.insn(_COMPUTE, NOP_CYCLES, max(self.free))


def conv_tiles(g: ConvGeometry, s: ConvSchedule) -> Iterator[tuple[int, int, int, int]]:
    """(batch block, first output-channel block, first row, first column) of every tile, in
    the schedule's order (shared by `codegen.emit_conv` and the model)."""
    groups, rows, cols = range(0, g.ob, s.tob), range(0, g.oh, s.toh), range(0, g.ow, s.tow)
    for n0 in range(g.nb):
        if s.order == 2:
            for oh0, ow0, o0 in itertools.product(rows, cols, groups):
                yield n0, o0, oh0, ow0
        else:
            for o0, oh0, ow0 in itertools.product(groups, rows, cols):
                yield n0, o0, oh0, ow0


def estimate_conv(L: ConvLayer, s: ConvSchedule, rq: RequantProgram, cfg: HwConfig) -> int:
    """Predicted cycles of `codegen.emit_conv` with tiling `s` as a stream of its own."""
    g = conv_geometry(L, cfg)
    kh, kw = L.kernel
    sh, sw = L.strides
    taps, t = kh * kw, s.threads
    tl = _Timeline(cfg)
    chunks: list[int] = []  # compute's finish of each input chunk (frees its INP/WGT half)
    stored: list[int] = []  # the store's finish of each tile (frees its ACC half)
    held_inp: list[tuple[int, ...] | None] = [None] * t
    held_wgt: list[tuple[int, ...] | None] = [None] * t
    for n0, o0, oh0, ow0 in conv_tiles(g, s):
        tb, th, tw = min(s.tob, g.ob - o0), min(s.toh, g.oh - oh0), min(s.tow, g.ow - ow0)
        in_rows, in_cols = (th - 1) * sh + kh, (tw - 1) * sw + kw
        ih0, iw0 = oh0 * sh - L.pads[0], ow0 * sw - L.pads[1]
        rows = min(ih0 + in_rows, g.h) - max(ih0, 0)
        cols = min(iw0 + in_cols, g.w) - max(iw0, 0)
        window = tl.transfer(rows, cols * cfg.inp_elem_bytes, in_rows * in_cols - rows * cols)
        acc = len(stored) % t * (cfg.acc_depth // t)
        acc_free = stored[-t] if len(stored) >= t else 0
        for i0 in range(0, g.ib, s.tib):
            ti = min(s.tib, g.ib - i0)
            half = len(chunks) % t
            inp, wgt = half * (cfg.inp_depth // t), half * (cfg.wgt_depth // t)
            wait = chunks[-t] if len(chunks) >= t else 0
            after = 0
            if held_inp[half] != (n0, i0, oh0, ow0, ti):
                held_inp[half] = (n0, i0, oh0, ow0, ti)
                for k in range(ti):
                    after = tl.insn(_LOAD, window, wait if k == 0 else 0)
                wait = 0
            if held_wgt[half] != (o0, i0, tb, ti):
                held_wgt[half] = (o0, i0, tb, ti)
                after = tl.insn(_LOAD, tl.transfer(tb, ti * taps * cfg.wgt_elem_bytes), wait)
                wait = 0
            if wait or after == 0:  # nothing loaded: a NOP carries the chunk's tokens
                after = tl.insn(_LOAD, NOP_CYCLES, wait)
            if i0 == 0:
                tl.kernel(((acc, 0, 0),), 1, gemm_cycles(tb * th * tw),
                          max(after, acc_free))
                after = 0
            chunks.append(tl.kernel(("gemm", tb, ti, th * tw, in_rows, in_cols, acc, inp, wgt),
                                    tb * ti * taps, gemm_cycles(tb * ti * taps * th * tw),
                                    after))
        consts = acc + tb * th * tw
        if rq.rows:
            tl.insn(_COMPUTE, tl.transfer(1, tb * rq.rows * cfg.acc_elem_bytes))
        ready = tl.requant(rq, acc, tb, th, tw, consts)
        for oc in range(tb):
            tl.insn(_STORE, tl.store(th, tw * cfg.out_elem_bytes), ready if oc == 0 else 0)
        stored.append(tl.free[_STORE])
    return tl.finish()


def estimate_rows(L: Layer, s: RowSchedule, rqs: Sequence[RequantProgram],
                  cfg: HwConfig) -> int:
    """Predicted cycles of `codegen.emit_pool` / `emit_add` with tiling `s` as a stream of its
    own."""
    o = L.out
    t = s.threads
    e8 = cfg.elem_bytes(isa.MemType.ACC_8BIT)
    tl = _Timeline(cfg)
    stored: list[int] = []
    blocks = o.n // cfg.batch * -(-o.c // cfg.block_out)
    for _, oh0, ow0 in itertools.product(range(blocks), range(0, o.h, s.toh),
                                         range(0, o.w, s.tow)):
        th, tw = min(s.toh, o.h - oh0), min(s.tow, o.w - ow0)
        acc = len(stored) % t * (cfg.acc_depth // t)
        after = stored[-t] if len(stored) >= t else 0
        if s.chunk:  # a global pool, chunk by chunk (`codegen.emit_global_pool`)
            x = L.inputs[0]
            tl.kernel(((acc, 0, 0),), 1, gemm_cycles(1), after)
            rows = sum(r.rows for r in rqs)
            win = acc + 1 + rows
            for r0 in range(0, x.h, s.chunk):
                r = min(s.chunk, x.h - r0)
                tl.insn(_COMPUTE, tl.transfer(r, x.w * e8))
                tl.kernel(((acc, win, 0),), 1, alu_cycles(r * x.w, False))
            for rq in rqs:
                if rq.rows:
                    tl.insn(_COMPUTE, tl.transfer(1, rq.rows * cfg.acc_elem_bytes))
                tl.requant(rq, acc, 1, 1, 1, acc + 1)
        elif isinstance(L, PoolLayer):
            x = L.inputs[0]
            (kh, kw), (sh, sw) = L.kernel, L.strides
            in_rows, in_cols = (th - 1) * sh + kh, (tw - 1) * sw + kw
            ih0, iw0 = oh0 * sh - L.pads[0], ow0 * sw - L.pads[1]
            rows = min(ih0 + in_rows, x.h) - max(ih0, 0)
            cols = min(iw0 + in_cols, x.w) - max(iw0, 0)
            tl.insn(_COMPUTE, tl.transfer(rows, cols * e8, in_rows * in_cols - rows * cols),
                    after)
            tl.kernel(((acc, 0, 0),), 1, gemm_cycles(th * tw))
            rows = sum(r.rows for r in rqs)
            win = acc + th * tw + rows
            tl.kernel(((acc, win, 0),), 1, alu_cycles(th * tw, False))
            if kh * kw > 1:
                tl.kernel(("taps", in_cols, kh, kw, acc, win), kh * kw - 1,
                          alu_cycles((kh * kw - 1) * th * tw, False))
            for rq in rqs:  # average pooling: the sums' requantisation
                if rq.rows:
                    tl.insn(_COMPUTE, tl.transfer(1, rq.rows * cfg.acc_elem_bytes))
                tl.requant(rq, acc, 1, th, tw, acc + th * tw)
        else:
            n = th * tw
            tl.insn(_COMPUTE, tl.transfer(th, tw * e8), after)
            tl.insn(_COMPUTE, tl.transfer(th, tw * e8))
            row = acc + 2 * n
            for k, rq in enumerate(rqs):
                if k == 2:
                    tl.kernel(((acc, acc + n, 0),), 1, alu_cycles(n, False))
                if rq.rows:
                    tl.insn(_COMPUTE, tl.transfer(1, rq.rows * cfg.acc_elem_bytes))
                tl.requant(rq, acc + n if k == 1 else acc, 1, th, tw, row)
                row += rq.rows
        stored.append(tl.insn(_STORE, tl.store(th, tw * cfg.out_elem_bytes),
                              tl.free[_COMPUTE]))
    return tl.finish()


def estimate(L: Layer, s: Schedule, rqs: Sequence[RequantProgram], cfg: HwConfig) -> int:
    """Predicted cycles of layer `L` with tiling `s` (`rqs`: its requantisation programs)."""
    if isinstance(L, ConvLayer):
        assert isinstance(s, ConvSchedule)
        return estimate_conv(L, s, rqs[0], cfg)
    assert isinstance(s, RowSchedule)
    return estimate_rows(L, s, rqs, cfg)


def _parts(n: int, t: int) -> list[int]:
    return [min(t, n - k) for k in range(0, n, t)]


def _tiles(n: int, t: int, stride: int, k: int, pad: int, extent: int
           ) -> list[tuple[int, int, int]]:
    """The tiles of an output extent `n` cut by `t`: (outputs, input window, the part of the
    window inside the input's `extent`)."""
    out = []
    for p0 in range(0, n, t):
        m = min(t, n - p0)
        win = (m - 1) * stride + k
        i0 = p0 * stride - pad
        out.append((m, win, min(i0 + win, extent) - max(i0, 0)))
    return out


def _windows(tl: _Timeline, hs: list[tuple[int, int, int]], ws: list[tuple[int, int, int]],
             elem_bytes: int) -> int:
    """Sum over the (row tile, column tile) grid of `_Timeline.transfer` of the padded window
    (rows x cols of data, the rest padding), in closed form."""
    rows, cols = sum(h[2] for h in hs), sum(w[2] for w in ws)
    return (rows * sum(tl.beats(w[2] * elem_bytes) for w in ws) + len(hs) * len(ws) * tl.latency
            + sum(h[1] for h in hs) * sum(w[1] for w in ws) - rows * cols)


def lower_bound(L: Layer, s: Schedule, rqs: Sequence[RequantProgram], cfg: HwConfig) -> int:
    """A lower bound of `estimate` in closed form (no pass over the tiles): the busiest unit's
    instructions back to back, or fetch's time for the instructions counted. `candidates` ranks
    by it first and runs the model only where the bound can beat the best found."""
    tl = _Timeline(cfg)
    o = L.out
    imm = sum(st.imm is not None for r in rqs for st in r.steps)
    alu = 2 * sum(len(r.steps) for r in rqs) - imm  # cycles per element of the requantisation
    steps = sum(len(r.steps) for r in rqs)
    if isinstance(L, ConvLayer):
        assert isinstance(s, ConvSchedule)
        g = conv_geometry(L, cfg)
        (kh, kw), (sh, sw), taps = L.kernel, L.strides, L.kernel[0] * L.kernel[1]
        hs = _tiles(g.oh, s.toh, sh, kh, L.pads[0], g.h)
        ws = _tiles(g.ow, s.tow, sw, kw, L.pads[1], g.w)
        bs, chunks = _parts(g.ob, s.tob), _parts(g.ib, s.tib)
        planes = len(hs) * len(ws)
        tiles = g.nb * len(bs) * planes
        rows = rqs[0].rows
        # every input window and weight block loaded at least once (a half may keep either)
        load = g.nb * (g.ib * _windows(tl, hs, ws, cfg.inp_elem_bytes) + sum(
            tl.transfer(tb, ti * taps * cfg.wgt_elem_bytes) for tb in bs for ti in chunks))
        elems = g.nb * g.ob * g.oh * g.ow
        compute = (elems * (1 + g.ib * taps + alu) + tiles * 5 * (1 + len(chunks) + steps)
                   + (g.nb * planes * sum(tl.transfer(1, tb * rows * cfg.acc_elem_bytes)
                                          for tb in bs) if rows else 0))
        stores = g.nb * g.ob * planes
        insns = tiles * (len(chunks) + 1 + steps + bool(rows)) + stores
        blocks, oh, ws_out = g.nb * g.ob, g.oh, ws
    else:
        assert isinstance(s, RowSchedule)
        blocks = o.n // cfg.batch * -(-o.c // cfg.block_out)
        e8 = cfg.elem_bytes(isa.MemType.ACC_8BIT)
        if isinstance(L, PoolLayer):
            x = L.inputs[0]
            (kh, kw), (sh, sw) = L.kernel, L.strides
            hs = _tiles(o.h, s.toh, sh, kh, L.pads[0], x.h)
            ws = _tiles(o.w, s.tow, sw, kw, L.pads[1], x.w)
            taps = kh * kw
            per_elem = 1 + 2 * taps + alu
            per_tile = 5 * ((3 if taps > 1 else 2) + steps)
            tables = sum(tl.transfer(1, r.rows * cfg.acc_elem_bytes) for r in rqs if r.rows)
            loads = blocks * (_windows(tl, hs, ws, e8) + len(hs) * len(ws) * tables)
            tile_insns = 4 + (taps > 1) + steps + sum(bool(r.rows) for r in rqs)
        else:
            hs = _tiles(o.h, s.toh, 1, 1, 0, o.h)
            ws = _tiles(o.w, s.tow, 1, 1, 0, o.w)
            per_elem, per_tile = 2 + alu, 5 * (1 + steps)
            loads = 2 * blocks * _windows(tl, hs, ws, e8) + blocks * len(hs) * len(ws) * sum(
                tl.transfer(1, r.rows * cfg.acc_elem_bytes) for r in rqs if r.rows)
            tile_insns = 4 + steps + sum(bool(r.rows) for r in rqs)
        tiles = blocks * len(hs) * len(ws)
        compute = loads + blocks * o.h * o.w * per_elem + tiles * per_tile
        load, stores, insns = 0, tiles, tiles * tile_insns
        oh, ws_out = o.h, ws
    store = stores * STORE_SETUP_CYCLES + blocks * oh * sum(
        tl.beats(w[0] * cfg.out_elem_bytes) for w in ws_out)
    fetch = -(-insns // tl.group) * tl.group_cycles + insns
    return max(load, compute, store, fetch)


def compute_floor(L: Layer, rqs: Sequence[RequantProgram], cfg: HwConfig) -> int:
    """The compute unit's work for layer `L` with any tiling: cycles no schedule of this
    instruction set can beat. Every output row of ACC (``batch x block_out`` results) takes a
    reset, its GEMM micro-ops (one a cycle) and every ALU step of its requantisation (1 cycle
    with an immediate, 2 with a tensor operand: docs/timing.md); pooling and add layers also
    load their inputs into ACC on the compute unit. A convolution's load unit must also bring
    every weight and input byte in at least once, one bus beat a cycle (a dense layer's weights
    make it DRAM-bound). Per-instruction pipeline fills, micro-op and constant loads and waits
    between the units are left out.

    Worked example: ResNet-18's 3x3 convolutions over 64 channels at 56x56 on the default
    preset take 36 GEMM cycles per output row (4 input blocks x 9 taps), 1 for the reset and 7
    for the requantisation (MUL and ADD with per-channel operands, SHR, MAX, MIN), so at most
    36 / 44 = 81.8 % of the 256-MAC bound whatever the tiling."""
    o = L.out
    def per_uop(imm: bool) -> int:
        return alu_cycles(1, imm) - ALU_PIPELINE_CYCLES

    alu = sum(per_uop(st.imm is not None) for r in rqs for st in r.steps)
    rows = o.n // cfg.batch * -(-o.c // cfg.block_out) * o.h * o.w
    tl = _Timeline(cfg)
    e8 = cfg.elem_bytes(isa.MemType.ACC_8BIT)
    if isinstance(L, ConvLayer):
        g = conv_geometry(L, cfg)
        x = L.inputs[0]
        taps = L.kernel[0] * L.kernel[1]
        once = (g.ob * g.ib * taps * cfg.wgt_elem_bytes
                + g.nb * g.ib * x.h * x.w * cfg.inp_elem_bytes)
        return max(rows * (1 + g.ib * taps + alu), tl.beats(once))
    if isinstance(L, PoolLayer):
        x = L.inputs[0]
        taps = L.kernel[0] * L.kernel[1]
        reads = x.n // cfg.batch * -(-x.c // cfg.block_in) * x.h * x.w * tl.beats(e8)
        return rows * (1 + taps * per_uop(False) + alu) + reads
    if isinstance(L, AddLayer):
        return rows * (per_uop(False) + alu + 2 * tl.beats(e8))
    raise TypeError(f"no floor for layer kind {L.kind}")


def candidates(L: Layer, rqs: Sequence[RequantProgram], cfg: HwConfig,
               keep: int | None = None) -> list[tuple[Schedule, int]]:
    """The tilings of `L` that fit with their predicted cycles, fastest first (ties: two
    threads, then the enumeration's order): all of them, or the first `keep` (which skips the
    model where `lower_bound` says a tiling cannot be among them). `NoSchedule` if none fits."""
    cands: list[Schedule] = []
    if isinstance(L, ConvLayer):
        cands.extend(conv_candidates(L, rqs[0].rows, cfg))
        if not cands:
            raise NoSchedule(f"layer {L.name!r}: no tiling of its {L.kernel[0]}x{L.kernel[1]} "
                             f"convolution fits the buffers of {cfg.bitstream_name}")
    else:
        cands.extend(row_candidates(L, sum(r.rows for r in rqs), cfg))
        if not cands:
            raise NoSchedule(f"layer {L.name!r}: not even one output row fits ACC of "
                             f"{cfg.bitstream_name}")
    if keep is None:
        scored = [(estimate(L, s, rqs, cfg), -s.threads, i) for i, s in enumerate(cands)]
        scored.sort()
    else:
        bounds = sorted((lower_bound(L, s, rqs, cfg), i) for i, s in enumerate(cands))
        scored = []
        for bound, i in bounds:
            if len(scored) >= keep and bound > scored[keep - 1][0]:
                break  # the bounds left are no lower: nothing after can enter the first `keep`
            bisect.insort(scored, (estimate(L, cands[i], rqs, cfg), -cands[i].threads, i))
            del scored[keep:]
    return [(cands[i], e) for e, _, i in scored]


def choose(L: Layer, rqs: Sequence[RequantProgram], cfg: HwConfig) -> Schedule:
    """The tiling with the lowest predicted cycles."""
    return candidates(L, rqs, cfg, keep=1)[0][0]


def choose_conv(L: ConvLayer, rq: RequantProgram, cfg: HwConfig) -> ConvSchedule:
    s = choose(L, (rq,), cfg)
    assert isinstance(s, ConvSchedule)
    return s


def choose_rows(L: Layer, rqs: Sequence[RequantProgram], cfg: HwConfig) -> RowSchedule:
    s = choose(L, rqs, cfg)
    assert isinstance(s, RowSchedule)
    return s
