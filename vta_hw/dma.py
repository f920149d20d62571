"""The read DMA shared by the load unit (INP, WGT) and the compute unit (UOP, ACC, ACC_8BIT):
a 2-D strided transfer from DRAM into an SRAM with zero padding (docs/timing.md §2, §4).

Request side: rows in order, each row's bus words ``floor(a/W) .. floor((a+n-1)/W)`` cut into
bursts at multiples of ``M`` beats; the first burst is requested in the start cycle ``s``.
Receive side: the beats come back in the same order; each completes elements that are written
to the target SRAM in the cycle the beat arrives (one element per beat-lane when elements are
smaller than a beat, one element per ``E/W`` beats otherwise). The transfer finishes at ``F``,
the cycle after its last beat; the padding elements are then written one per cycle, at
``F .. F+P-1``, and the instruction finishes at ``F + P`` (``finish`` is high in that cycle).
Padding of a block with ``y_size = 0`` starts at ``s + 1``; ``x_size = 0`` finishes at
``s + 1``. The padding is written as contiguous SRAM segments: the top rows with the first row's
left pad, the gap between consecutive data rows (right pad + next left pad), and the last row's
right pad with the bottom rows.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import MemType
from vtakit.vta_hw.layouts import insn_layouts

__all__ = ["ReadDMA", "elem_bytes", "lanes_of", "small_mul"]

IDX_BITS = 16  # SRAM element indices (sram_base is 16 bits)


def elem_bytes(cfg: HwConfig, mt: MemType) -> int:
    """DRAM bytes of one element of ``mt`` (docs/timing.md's ``E``)."""
    return {MemType.UOP: cfg.uop_elem_bytes, MemType.WGT: cfg.wgt_elem_bytes,
            MemType.INP: cfg.inp_elem_bytes, MemType.ACC: cfg.acc_elem_bytes,
            MemType.OUT: cfg.out_elem_bytes, MemType.ACC_8BIT: cfg.batch * cfg.block_out}[mt]


def lanes_of(cfg: HwConfig, mt: MemType) -> int:
    """Elements of ``mt`` per bus beat (1 when an element spans one or more beats)."""
    return max(1, cfg.bus_bytes // elem_bytes(cfg, mt))


def _log2(n: int) -> int:
    return n.bit_length() - 1


def small_mul(a, b, width: int):
    """``a * b`` for a narrow ``a`` (a pad count) as a sum of shifted ``b``: no multiplier."""
    acc = Const(0, width)
    for i in range(len(a)):
        acc = acc + Mux(a[i], b << i, 0)
    return acc[:width]


class ReadDMA(wiring.Component):
    """2-D strided DRAM → SRAM transfer with zero padding for the memory types ``targets``.

    Parameters
    ----------
    cfg : HwConfig
    targets : tuple of MemType
        The memory types this DMA serves; target ``i`` gets write lanes ``w{i}_*`` of
        ``lanes_of(cfg, t)`` elements of ``8 * elem_bytes(cfg, t)`` bits.

    Attributes
    ----------
    start : In
        The instruction on ``insn`` starts in this cycle (a LOAD whose ``memory_type`` is one
        of ``targets``).
    finish : Out
        High in the instruction's finish cycle.
    req, addr, beats, grant : memory-port client (read).
    rd_valid, rd_data : the client's returning beats.
    """

    def __init__(self, cfg: HwConfig, targets: tuple[MemType, ...]):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"ReadDMA: cfg must be an HwConfig, got {type(cfg).__name__}")
        if not targets or not all(isinstance(t, MemType) for t in targets):
            raise ValueError(f"ReadDMA: targets must be a non-empty tuple of MemType, "
                             f"got {targets!r}")
        self.cfg, self.targets = cfg, tuple(targets)
        members = {
            "start": In(1), "insn": In(128), "finish": Out(1), "active": Out(1),
            "req": Out(1), "addr": Out(32), "beats": Out(range(1, cfg.mem_max_burst_beats + 1)),
            "grant": In(1), "rd_valid": In(1), "rd_data": In(cfg.bus_width_bits),
        }
        for i, t in enumerate(self.targets):
            r, eb = lanes_of(cfg, t), elem_bytes(cfg, t)
            members[f"w{i}_en"] = Out(data.ArrayLayout(1, r))
            members[f"w{i}_addr"] = Out(data.ArrayLayout(unsigned(IDX_BITS), r))
            members[f"w{i}_data"] = Out(data.ArrayLayout(unsigned(8 * eb), r))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = insn_layouts(cfg).mem
        W, M = cfg.bus_bytes, cfg.mem_max_burst_beats
        lw, lm = _log2(W), _log2(M)
        reg = Signal(128)
        with m.If(self.start):
            m.d.sync += reg.eq(self.insn)
        cur = data.View(lay, Signal(128))
        m.d.comb += cur.as_value().eq(Mux(self.start, self.insn, reg))
        mt = cur.memory_type

        def shl_e(v, width=40):
            """``v * E(memory_type)`` (bytes)."""
            out = Const(0, width)
            for t in self.targets:
                out = Mux(mt == t, v << _log2(elem_bytes(cfg, t)), out)
            return out[:width]

        def span(row_elem):
            """(first, last) bus word of a row starting at element ``row_elem``."""
            a = shl_e(row_elem)
            n = shl_e(cur.x_size)
            return (a >> lw)[:32], ((a + n - 1) >> lw)[:32]

        x, y = cur.x_size, cur.y_size
        x0, x1, y0, y1 = cur.x_pad_0, cur.x_pad_1, cur.y_pad_0, cur.y_pad_1
        cols = Signal(18)
        m.d.comb += cols.eq(x0 + x + x1)

        # ---- request side ----------------------------------------------------------------
        q_active = Signal()
        q_row = Signal(32)
        q_rows = Signal(16)
        q_cur = Signal(32)
        q_last = Signal(32)
        c_active, c_row, c_rows = Signal(), Signal(32), Signal(16)
        c_cur, c_last = Signal(32), Signal(32)
        f0, l0 = span(cur.dram_base)
        with m.If(self.start):
            m.d.comb += [c_active.eq((x != 0) & (y != 0)), c_row.eq(cur.dram_base), c_rows.eq(y),
                         c_cur.eq(f0), c_last.eq(l0)]
        with m.Else():
            m.d.comb += [c_active.eq(q_active), c_row.eq(q_row), c_rows.eq(q_rows),
                         c_cur.eq(q_cur), c_last.eq(q_last)]
        room = Signal(range(M + 1))
        m.d.comb += room.eq(M - c_cur[:lm]) if lm else room.eq(1)
        rest = Signal(33)
        m.d.comb += rest.eq(c_last - c_cur + 1)
        burst = Signal(range(M + 1))
        m.d.comb += burst.eq(Mux(rest < room, rest, room))
        m.d.comb += [self.req.eq(c_active), self.addr.eq((c_cur << lw)[:32]),
                     self.beats.eq(burst)]
        m.d.sync += [q_active.eq(c_active), q_row.eq(c_row), q_rows.eq(c_rows),
                     q_cur.eq(c_cur), q_last.eq(c_last)]
        nrow = Signal(32)
        m.d.comb += nrow.eq(c_row + cur.x_stride)
        nf, nl = span(nrow)
        with m.If(self.grant & c_active):
            with m.If(c_cur + burst > c_last):
                m.d.sync += [q_row.eq(nrow), q_rows.eq(c_rows - 1), q_active.eq(c_rows != 1),
                             q_cur.eq(nf), q_last.eq(nl)]
            with m.Else():
                m.d.sync += q_cur.eq(c_cur + burst)

        # ---- receive side ----------------------------------------------------------------
        XFER, PAD, FIN, IDLE = 1, 2, 3, 0
        ph = Signal(2)
        m.d.comb += [self.finish.eq(ph == FIN), self.active.eq(ph != IDLE)]
        r_rows = Signal(16)
        r_row = Signal(32)
        r_left = Signal(32)  # beats left in the current row after the previous beat
        r_ptr = Signal(IDX_BITS)  # SRAM index of the current row's first data element
        beat = self.rd_valid & (ph == XFER)
        first = r_left == 0
        rf, rl = span(r_row)
        left_after = Signal(32)
        m.d.comb += left_after.eq(Mux(first, rl - rf, r_left - 1))
        last = left_after == 0
        with m.If(beat):
            m.d.sync += r_left.eq(left_after)
            with m.If(last):
                m.d.sync += [r_row.eq(r_row + cur.x_stride), r_ptr.eq(r_ptr + cols),
                             r_rows.eq(r_rows - 1)]

        # per-target element extraction
        word = self.rd_data
        for i, t in enumerate(self.targets):
            eb = elem_bytes(cfg, t)
            en = getattr(self, f"w{i}_en")
            addr = getattr(self, f"w{i}_addr")
            dat = getattr(self, f"w{i}_data")
            mine = beat & (cur.memory_type == t)
            if eb >= W:
                k = eb // W
                part = Signal(range(k), name=f"t{i}_part") if k > 1 else None
                sr = Signal((k - 1) * W * 8, name=f"t{i}_sr") if k > 1 else None
                xc_reg = Signal(16, name=f"t{i}_x")
                xc = Mux(first, 0, xc_reg)
                done_elem = (part == k - 1) if k > 1 else Const(1)
                m.d.comb += [en[0].eq(mine & done_elem), addr[0].eq(r_ptr + xc),
                             dat[0].eq(Cat(sr, word) if k > 1 else word)]
                with m.If(mine):
                    m.d.sync += xc_reg.eq(xc + done_elem)
                    if k > 1:
                        m.d.sync += [part.eq(part + 1), sr.eq(Cat(sr[W * 8:], word))]
                if k > 1:
                    with m.If(self.start):
                        m.d.sync += part.eq(0)
            else:
                r = W // eb
                lr = _log2(r)
                lane0 = r_row[:lr]
                lane_last = (r_row + x - 1)[:lr]
                eb_reg = Signal(IDX_BITS, name=f"t{i}_base")
                base = Signal(IDX_BITS, name=f"t{i}_beat_base")
                m.d.comb += base.eq(Mux(first, r_ptr - lane0, eb_reg))
                with m.If(mine):
                    m.d.sync += eb_reg.eq(base + r)
                for lane in range(r):
                    ok = (~first | (lane0 <= lane)) & (~last | (lane_last >= lane))
                    m.d.comb += [en[lane].eq(mine & ok), addr[lane].eq(base + lane),
                                 dat[lane].eq(word[lane * eb * 8:(lane + 1) * eb * 8])]

        # ---- padding -----------------------------------------------------------------------
        TOP, MID, BOT = 0, 1, 2
        p_idx = Signal(IDX_BITS)
        p_left = Signal(24)
        p_seg = Signal(2)
        p_mids = Signal(16)
        gap = Signal(6)
        m.d.comb += gap.eq(x0 + x1)
        top_len = Signal(24)
        bot_len = Signal(24)
        m.d.comb += [
            top_len.eq(Mux(y == 0, small_mul(y0 + y1, cols, 24), small_mul(y0, cols, 24) + x0)),
            bot_len.eq(Mux(y == 0, 0, small_mul(y1, cols, 24) + x1)),
        ]
        pad_total = Signal(24)
        m.d.comb += pad_total.eq(top_len + bot_len + Mux(y > 1, small_mul(gap, y - 1, 24), 0))
        has_mid = (y > 1) & (gap != 0)

        # choose the first non-empty segment at or after `seg` (given the next index)
        def enter(seg_from_top: bool, idx_after, mids_left, bot_start):
            """Assign p_* for the next non-empty segment; ph <= FIN when there is none."""
            if seg_from_top:
                with m.If(top_len != 0):
                    m.d.sync += [ph.eq(PAD), p_seg.eq(TOP), p_idx.eq(cur.sram_base),
                                 p_left.eq(top_len), p_mids.eq(Mux(y > 1, y - 1, 0))]
                with m.Elif(has_mid):
                    m.d.sync += [ph.eq(PAD), p_seg.eq(MID), p_idx.eq(cur.sram_base + x),
                                 p_left.eq(gap), p_mids.eq(y - 2)]
                with m.Elif(bot_len != 0):
                    m.d.sync += [ph.eq(PAD), p_seg.eq(BOT), p_idx.eq(bot_start),
                                 p_left.eq(bot_len)]
                with m.Else():
                    m.d.sync += ph.eq(FIN)
            else:
                with m.If(has_mid & (mids_left != 0)):
                    m.d.sync += [p_seg.eq(MID), p_idx.eq(idx_after + x), p_left.eq(gap),
                                 p_mids.eq(mids_left - 1)]
                with m.Elif(bot_len != 0):
                    m.d.sync += [p_seg.eq(BOT), p_idx.eq(bot_start), p_left.eq(bot_len)]
                with m.Else():
                    m.d.sync += ph.eq(FIN)

        bot_reg = Signal(IDX_BITS)
        # the last data row's end (its first data element + x_size)
        with m.If(beat & last & (r_rows == 1)):
            m.d.sync += bot_reg.eq(r_ptr + x)
            with m.If(pad_total == 0):
                m.d.sync += ph.eq(FIN)
            with m.Else():
                enter(True, None, None, r_ptr + x)
        pad_en = ph == PAD
        with m.If(pad_en):
            m.d.sync += [p_idx.eq(p_idx + 1), p_left.eq(p_left - 1)]
            with m.If(p_left == 1):
                with m.If(p_seg == BOT):
                    m.d.sync += ph.eq(FIN)
                with m.Else():
                    enter(False, p_idx + 1, Mux(p_seg == TOP, p_mids, p_mids), bot_reg)
        for i, t in enumerate(self.targets):
            en = getattr(self, f"w{i}_en")
            addr = getattr(self, f"w{i}_addr")
            dat = getattr(self, f"w{i}_data")
            with m.If(pad_en & (cur.memory_type == t)):
                m.d.comb += [en[0].eq(1), addr[0].eq(p_idx), dat[0].eq(0)]

        with m.If(ph == FIN):
            m.d.sync += ph.eq(IDLE)
        # a new instruction (possibly starting in the previous one's finish cycle)
        with m.If(self.start):
            first_ptr = (cur.sram_base + small_mul(y0, cols, IDX_BITS) + x0)[:IDX_BITS]
            m.d.sync += [r_rows.eq(y), r_row.eq(cur.dram_base), r_left.eq(0),
                         r_ptr.eq(first_ptr)]
            with m.If(x == 0):
                m.d.sync += ph.eq(FIN)
            with m.Elif(y == 0):
                enter(True, None, None, cur.sram_base)
            with m.Else():
                m.d.sync += ph.eq(XFER)
        return m
