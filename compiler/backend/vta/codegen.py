"""Instruction streams for the accelerator's layers, recorded through the driver's public API.

Every layer is tiled over its output (batch, output-channel blocks, rows, columns); a tile owns
one half of ACC (its accumulators and its requantisation constants) and, for convolutions, its
input-channel chunks alternate between the two halves of INP and WGT so that loading the next
chunk overlaps computing on this one (`driver.VirtualThreads` places the tokens). Layers of a
region follow each other in one stream: a barrier (compute waits for the last store, load waits
for compute) separates them, because the next layer reads what the previous one stored.

Packed layouts (`driver.packing`): activations ``(N/B, C/BI, H, W, B, BI)``; conv weights
``(O/BO, I/BI, KH, KW, BO, BI)``; requantisation constants ``(O/BO, rows, B, BO)`` int32.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from vtakit.driver.program import KernelBuilder, UopKernel
from vtakit.driver.session import DeviceArray, Session, Stage
from vtakit.driver.threads import VirtualThreads
from vtakit.vta_hw import isa

from .layers import AddLayer, ConvLayer, Layer, PoolLayer
from .requant import RequantProgram
from .schedule import ConvSchedule, RowSchedule, conv_geometry, conv_tiles

M, A = isa.MemType, isa.AluOp

__all__ = ["LayerCode", "emit_layer", "barrier"]


@dataclass
class LayerCode:
    """What a layer's stream reads and writes: slot names of its device arrays, and the frame
    of each activation slot that has one (`layers.activation_frames`: a border of that many
    elements around every plane, holding the padding its readers need)."""

    inputs: list[str]
    output: str
    weight: str | None = None
    tables: tuple[str, ...] = ()
    frames: dict[str, int] = field(default_factory=dict)

    def frame(self, slot: str) -> int:
        return self.frames.get(slot, 0)


def _element(plane: int, h: int, w: int, f: int, row: int, col: int) -> int:
    """Element (row, col) of plane ``plane`` of an (h x w)-plane activation with a frame of
    ``f`` elements: planes are (h + 2f) x (w + 2f), the value at their centre."""
    return (plane * (h + 2 * f) + row + f) * (w + 2 * f) + col + f


def _kernel(sess: Session, loops: list[tuple[int, int, int, int]],
            uops: list[tuple[int, int, int]], **mode: Any) -> UopKernel:
    """The micro-op kernel with these loops ((extent, dst, src, wgt) factors, outer first) and
    micro-ops ((dst, src, wgt)), keyed by its content."""
    def record(k: KernelBuilder) -> None:
        for lp in loops:
            k.loop(*lp)
        for u in uops:
            k.push(*u)
    key = (tuple(loops), tuple(uops), tuple(sorted((k, int(v)) for k, v in mode.items()
                                                   if k != "mode")), mode.get("mode", "gemm"))
    return sess.uop_kernel(key, record, **mode)


def barrier(sess: Session) -> None:
    """Order everything after against everything before: compute has seen the last store (the
    layer's `VirtualThreads.finish`), then load waits for compute."""
    sess.dep_push(Stage.COMPUTE, Stage.LOAD)
    sess.dep_pop(Stage.COMPUTE, Stage.LOAD)


def _requant(sess: Session, rq: RequantProgram, acc: int, blocks: int, rows: int, cols: int,
             table: int) -> None:
    """The requantisation steps over ``blocks`` channel blocks of ``rows x cols`` accumulators
    at ``acc`` (block-major), constants for block b at ``table + b * rq.rows``."""
    for st in rq.steps:
        if st.imm is not None:
            sess.alu(_kernel(sess, [(blocks * rows, cols, cols, 0), (cols, 1, 1, 0)],
                             [(acc, acc, 0)], mode="alu", alu_opcode=st.op, use_imm=True,
                             imm=st.imm))
        else:
            sess.alu(_kernel(sess, [(rows, cols, 0, 0), (cols, 1, 0, 0)],
                             [(acc + b * rows * cols, table + b * rq.rows + st.row, 0)
                              for b in range(blocks)], mode="alu", alu_opcode=st.op))


def _load_window(sess: Session, x: DeviceArray, plane: int, h: int, w: int, f: int, ih0: int,
                 iw0: int, in_rows: int, in_cols: int, sram_base: int,
                 memory_type: isa.MemType) -> None:
    """Rows ``ih0 .. ih0+in_rows`` x cols ``iw0 .. iw0+in_cols`` of plane ``plane`` of an
    (h x w)-plane activation with a frame of ``f``: read from the frame where the window
    leaves the plane by up to ``f``, zero-padded by the LOAD beyond."""
    hp, wp = h + 2 * f, w + 2 * f
    ih, iw = ih0 + f, iw0 + f  # in the framed plane
    top, bottom = max(0, -ih), max(0, ih + in_rows - hp)
    left, right = max(0, -iw), max(0, iw + in_cols - wp)
    rows, cols = in_rows - top - bottom, in_cols - left - right
    first = (plane * hp + max(ih, 0)) * wp + max(iw, 0)
    if rows <= 0 or cols <= 0:
        raise ValueError(f"tile window rows {ih0}.., cols {iw0}.. lies outside the {h}x{w} input")
    sess.load_2d(x, first, x_size=cols, y_size=rows, x_stride=wp, x_pad_0=left, x_pad_1=right,
                 y_pad_0=top, y_pad_1=bottom, sram_base=sram_base, memory_type=memory_type)


def _store_rows(sess: Session, y: DeviceArray, plane: int, h: int, w: int, f: int, row: int,
                col: int, rows: int, cols: int, sram_base: int) -> None:
    """STORE ``rows x cols`` outputs at (row, col) of plane ``plane`` (inside its frame)."""
    sess.store_2d(y, _element(plane, h, w, f, row, col), x_size=cols, y_size=rows,
                  x_stride=w + 2 * f, sram_base=sram_base)


def emit_conv(sess: Session, L: ConvLayer, sch: ConvSchedule, rq: RequantProgram,
              arrays: Mapping[str, DeviceArray], code: LayerCode) -> None:
    cfg = sess.cfg
    g = conv_geometry(L, cfg)
    x, wt, y = arrays[code.inputs[0]], arrays[code.weight or ""], arrays[code.output]
    table = arrays[code.tables[0]] if rq.rows else None
    kh, kw = L.kernel
    sh, sw = L.strides
    taps = kh * kw
    fx, fy = code.frame(code.inputs[0]), code.frame(code.output)
    vt = VirtualThreads(sess, sch.threads)
    # what each INP / WGT half holds: a load of the same data into the same half is skipped
    held_inp: list[tuple[int, ...] | None] = [None] * sch.threads
    held_wgt: list[tuple[int, ...] | None] = [None] * sch.threads
    for n0, o0, oh0, ow0 in conv_tiles(g, sch):
        tb, th, tw = min(sch.tob, g.ob - o0), min(sch.toh, g.oh - oh0), min(sch.tow, g.ow - ow0)
        in_rows, in_cols = (th - 1) * sh + kh, (tw - 1) * sw + kw
        ih0, iw0 = oh0 * sh - L.pads[0], ow0 * sw - L.pads[1]
        with vt.tile() as a:
            acc = vt.half(cfg.acc_depth, a)
            consts = acc + tb * th * tw
            for i0 in range(0, g.ib, sch.tib):
                ti = min(sch.tib, g.ib - i0)
                with vt.load() as b:
                    inp, wgt = vt.half(cfg.inp_depth, b), vt.half(cfg.wgt_depth, b)
                    if held_inp[b] != (n0, i0, oh0, ow0, ti):
                        held_inp[b] = (n0, i0, oh0, ow0, ti)
                        for ci in range(ti):
                            _load_window(sess, x, n0 * g.ib + i0 + ci, g.h, g.w, fx,
                                         ih0, iw0, in_rows, in_cols,
                                         inp + ci * in_rows * in_cols, M.INP)
                    if held_wgt[b] != (o0, i0, tb, ti):
                        held_wgt[b] = (o0, i0, tb, ti)
                        sess.load_2d(wt, (o0 * g.ib + i0) * taps, x_size=ti * taps, y_size=tb,
                                     x_stride=g.ib * taps, sram_base=wgt, memory_type=M.WGT)
                with vt.compute():
                    if i0 == 0:
                        sess.gemm(_kernel(sess, [(tb * th, tw, 0, 0), (tw, 1, 0, 0)],
                                          [(acc, 0, 0)], reset=True))
                    sess.gemm(_kernel(
                        sess, [(th, tw, sh * in_cols, 0), (tw, 1, sw, 0)],
                        [(acc + oc * th * tw, inp + ci * in_rows * in_cols + ky * in_cols + kx,
                          wgt + (oc * ti + ci) * taps + ky * kw + kx)
                         for oc, ci, ky, kx in itertools.product(range(tb), range(ti),
                                                                 range(kh), range(kw))]))
            with vt.compute():
                if table is not None:
                    sess.load_2d(table, o0 * rq.rows, x_size=tb * rq.rows, y_size=1,
                                 x_stride=tb * rq.rows, sram_base=consts, memory_type=M.ACC)
                _requant(sess, rq, acc, tb, th, tw, consts)
            with vt.store():
                for oc in range(tb):
                    _store_rows(sess, y, n0 * g.ob + o0 + oc, g.oh, g.ow, fy, oh0, ow0, th,
                                tw, acc + oc * th * tw)
    vt.finish()


def _channel_tiles(L: Layer, sch: RowSchedule, cfg: Any
                   ) -> Iterator[tuple[int, int, int, int, int, int]]:
    """The tiles of a pooling / add layer: (batch block, channel block, first row, first
    column, rows, columns), one channel block each."""
    o = L.out
    cb, nb = -(-o.c // cfg.block_out), o.n // cfg.batch
    for n0, c0, oh0, ow0 in itertools.product(range(nb), range(cb), range(0, o.h, sch.toh),
                                              range(0, o.w, sch.tow)):
        yield n0, c0, oh0, ow0, min(sch.toh, o.h - oh0), min(sch.tow, o.w - ow0)


def emit_pool(sess: Session, L: PoolLayer, sch: RowSchedule, rq: RequantProgram | None,
              arrays: Mapping[str, DeviceArray], code: LayerCode) -> None:
    """Pooling: a window of input rows is loaded into ACC (sign-extended); the output rows are
    reset, take the first tap (ADD) and then every other tap: MAX for max pooling, ADD for
    average pooling, whose sums are then requantised (the division by the window is in the
    requantisation's multiplier). ACC half: outputs | requantisation constants | window."""
    cfg = sess.cfg
    x, y = arrays[code.inputs[0]], arrays[code.output]
    table = arrays[code.tables[0]] if rq is not None and rq.rows else None
    xi, o = L.inputs[0], L.out
    kh, kw = L.kernel
    sh, sw = L.strides
    cb = -(-o.c // cfg.block_out)
    rows = rq.rows if rq is not None else 0
    rest = A.ADD if L.kind == "avg_pool" else A.MAX
    vt = VirtualThreads(sess, sch.threads)
    for n0, c0, oh0, ow0, th, tw in _channel_tiles(L, sch, cfg):
        in_rows, in_cols = (th - 1) * sh + kh, (tw - 1) * sw + kw
        with vt.tile() as a:
            acc = vt.half(cfg.acc_depth, a)
            consts = acc + th * tw
            win = consts + rows
            with vt.compute():
                _load_window(sess, x, n0 * cb + c0, xi.h, xi.w, code.frame(code.inputs[0]),
                             oh0 * sh - L.pads[0], ow0 * sw - L.pads[1], in_rows, in_cols, win,
                             M.ACC_8BIT)
                sess.gemm(_kernel(sess, [(th, tw, 0, 0), (tw, 1, 0, 0)], [(acc, 0, 0)],
                                  reset=True))
                taps = list(itertools.product(range(kh), range(kw)))
                loops = [(th, tw, sh * in_cols, 0), (tw, 1, sw, 0)]
                sess.alu(_kernel(sess, loops, [(acc, win, 0)], mode="alu", alu_opcode=A.ADD))
                if len(taps) > 1:
                    sess.alu(_kernel(sess, loops, [(acc, win + ky * in_cols + kx, 0)
                                                   for ky, kx in taps[1:]],
                                     mode="alu", alu_opcode=rest))
                if rq is not None:
                    if table is not None:
                        sess.load_2d(table, c0 * rows, x_size=rows, y_size=1, x_stride=rows,
                                     sram_base=consts, memory_type=M.ACC)
                    _requant(sess, rq, acc, 1, th, tw, consts)
            with vt.store():
                _store_rows(sess, y, n0 * cb + c0, o.h, o.w, code.frame(code.output), oh0, ow0,
                            th, tw, acc)
    vt.finish()


def emit_global_pool(sess: Session, L: PoolLayer, sch: RowSchedule, rq: RequantProgram,
                     arrays: Mapping[str, DeviceArray], code: LayerCode) -> None:
    """Global average pooling over a plane of any size: the output row is reset, then the
    plane comes into ACC ``sch.chunk`` input rows at a time and one ALU instruction ADDs each
    chunk's elements into it (one micro-op: the loops walk the chunk, the destination stays),
    then the sum is requantised. ACC half: output | requantisation constants | chunk."""
    cfg = sess.cfg
    x, y = arrays[code.inputs[0]], arrays[code.output]
    table = arrays[code.tables[0]] if rq.rows else None
    xi, o = L.inputs[0], L.out
    cb = -(-o.c // cfg.block_out)
    vt = VirtualThreads(sess, sch.threads)
    fx = code.frame(code.inputs[0])
    for n0, c0, _, _, _, _ in _channel_tiles(L, sch, cfg):
        plane = n0 * cb + c0
        with vt.tile() as a:
            acc = vt.half(cfg.acc_depth, a)
            consts = acc + 1
            win = consts + rq.rows
            with vt.compute():
                sess.gemm(_kernel(sess, [(1, 0, 0, 0), (1, 0, 0, 0)], [(acc, 0, 0)],
                                  reset=True))
                for r0 in range(0, xi.h, sch.chunk):
                    r = min(sch.chunk, xi.h - r0)
                    sess.load_2d(x, _element(plane, xi.h, xi.w, fx, r0, 0), x_size=xi.w,
                                 y_size=r, x_stride=xi.w + 2 * fx, sram_base=win,
                                 memory_type=M.ACC_8BIT)
                    sess.alu(_kernel(sess, [(r, 0, xi.w, 0), (xi.w, 0, 1, 0)],
                                     [(acc, win, 0)], mode="alu", alu_opcode=A.ADD))
                if table is not None:
                    sess.load_2d(table, c0 * rq.rows, x_size=rq.rows, y_size=1,
                                 x_stride=rq.rows, sram_base=consts, memory_type=M.ACC)
                _requant(sess, rq, acc, 1, 1, 1, consts)
            with vt.store():
                _store_rows(sess, y, plane, 1, 1, code.frame(code.output), 0, 0, 1, 1, acc)
    vt.finish()


def emit_add(sess: Session, L: AddLayer, sch: RowSchedule,
             rqs: tuple[RequantProgram, RequantProgram, RequantProgram],
             arrays: Mapping[str, DeviceArray], code: LayerCode) -> None:
    """The residual add: both operands loaded into ACC (sign-extended), each rescaled, summed,
    and the sum requantised to int8."""
    cfg = sess.cfg
    xa, xb, y = arrays[code.inputs[0]], arrays[code.inputs[1]], arrays[code.output]
    o = L.out
    cb = -(-o.c // cfg.block_out)
    vt = VirtualThreads(sess, sch.threads)
    for n0, c0, oh0, ow0, th, tw in _channel_tiles(L, sch, cfg):
        n = th * tw
        plane = n0 * cb + c0
        with vt.tile() as a:
            acc = vt.half(cfg.acc_depth, a)
            base_a, base_b, consts = acc, acc + n, acc + 2 * n
            with vt.compute():
                for arr, slot, base in ((xa, code.inputs[0], base_a),
                                        (xb, code.inputs[1], base_b)):
                    _load_window(sess, arr, plane, o.h, o.w, code.frame(slot), oh0, ow0, th, tw,
                                 base, M.ACC_8BIT)
                row = consts
                for k, (rq, slot) in enumerate(zip(rqs, code.tables, strict=True)):
                    if k == 2:  # both operands rescaled: the sum
                        sess.alu(_kernel(sess, [(th, tw, tw, 0), (tw, 1, 1, 0)],
                                         [(base_a, base_b, 0)], mode="alu", alu_opcode=A.ADD))
                    if rq.rows:
                        sess.load_2d(arrays[slot], c0 * rq.rows, x_size=rq.rows, y_size=1,
                                     x_stride=rq.rows, sram_base=row, memory_type=M.ACC)
                    _requant(sess, rq, base_b if k == 1 else base_a, 1, th, tw, row)
                    row += rq.rows
            with vt.store():
                _store_rows(sess, y, plane, o.h, o.w, code.frame(code.output), oh0, ow0, th, tw,
                            base_a)
    vt.finish()


def emit_layer(sess: Session, L: Layer, schedule: object, rqs: tuple[RequantProgram, ...],
               arrays: Mapping[str, DeviceArray], code: LayerCode) -> None:
    """Record layer `L`'s instructions on `sess` (no barrier, no FINISH)."""
    if isinstance(L, ConvLayer):
        assert isinstance(schedule, ConvSchedule)
        emit_conv(sess, L, schedule, rqs[0], arrays, code)
    elif isinstance(L, PoolLayer):
        assert isinstance(schedule, RowSchedule)
        if schedule.chunk:
            emit_global_pool(sess, L, schedule, rqs[0], arrays, code)
        else:
            emit_pool(sess, L, schedule, rqs[0] if rqs else None, arrays, code)
    elif isinstance(L, AddLayer):
        assert isinstance(schedule, RowSchedule) and len(rqs) == 3
        emit_add(sess, L, schedule, (rqs[0], rqs[1], rqs[2]), arrays, code)
    else:  # pragma: no cover - find_layers makes only these
        raise TypeError(f"no code generator for layer {L.kind}")
