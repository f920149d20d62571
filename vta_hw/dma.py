"""The read DMA shared by the load unit (INP, WGT) and the compute unit (UOP, ACC, ACC_8BIT):
a 2-D strided transfer from DRAM into an SRAM with zero padding (docs/timing.md §2, §4).

The start cycle ``s`` reads the candidate instruction only to register ``x_size - 1``
(``L >= 2``) or to load the request side's registers (``L = 1``), and to finish a block with
``x_size = 0`` at ``s + 1``; from ``s + 1`` (the setup cycle) everything reads the unit's
instruction register, so no path runs from the start cycle's choice of instruction (take,
tokens, start) into the receive side.
Request side: rows in order, each row's bus words ``floor(a/W) .. floor((a+n-1)/W)`` cut into
bursts at multiples of ``M`` beats; the first burst is requested at ``s + 2``
(``LOAD_SETUP_CYCLES``), from registers (:func:`staged_row_requests` plans the walk in the
setup cycle; with ``L = 1`` :func:`row_requests` loads at ``s`` and holds the request back
at ``s + 1``).
Receive side: the beats come back in the same order; each completes elements that are written
to the target SRAM in the cycle the beat arrives (one element per beat-lane when elements are
smaller than a beat, one element per ``E/W`` beats otherwise). The transfer finishes at ``F``,
the cycle after its last beat; the padding elements are then written one per cycle, at
``F .. F+P-1``, and the instruction finishes at ``F + P`` (``finish`` is high in that cycle).
Padding of a block with ``y_size = 0`` is chosen in the setup cycle and starts at ``s + 2``
(``PAD_ONLY_SETUP_CYCLES``); ``x_size = 0`` finishes at ``s + 1``. The padding is written as
contiguous SRAM segments, in this order: the last row's right pad with the bottom rows, the
top rows with the first row's left pad, and the gaps between consecutive data rows (right pad
+ next left pad). (The order is not observable: data
effects take place at the finish cycle, docs/timing.md §4.)

Area (the iCE40 preset has to fit 5,280 logic cells): DRAM addresses are walked as one 32-bit
byte address per row plus a beat count, and a row's beat count is
``((a mod W) + n - 1) / W + 1``, an adder as wide as ``x_size`` rather than a 32-bit span.
SRAM indices are computed modulo ``2**idx_bits`` (the buffer's index width; the SRAM drops
the bits above it anyway), as one running index that steps by a beat's lanes, over the gap
between rows, or by one padding element. A LOAD that vta_sim accepts has its padded block
inside the buffer, so sizes, rows and padding counts fit ``idx_bits + 1`` bits. The padding is
walked with counters (a partial row, then whole rows of ``x_pad_0 + x_size + x_pad_1``
elements), so its length ``P`` is never multiplied out; the one product left, the first data
row's index ``y_pad_0 * cols``, is written as a multiplication, so that synthesis may give it
a spare DSP block (on the iCE40 preset the load unit's: about 75 logic cells fewer than the
shifted additions it was; the compute unit's is too narrow for yosys to map, and costs the
same either way).
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.interfaces import ADDR_BITS, MemClientSignature, SramWriteSignature
from vtakit.vta_hw.isa import MemType
from vtakit.vta_hw.layouts import insn_layouts
from vtakit.vta_hw.timing_facts import LOAD_SETUP_CYCLES, PAD_ONLY_SETUP_CYCLES

__all__ = ["ReadDMA", "ElemSizes", "row_requests", "lanes_of", "IDX_BITS", "ADDR_BITS"]

IDX_BITS = isa.SRAM_ADDR_BITS  # SRAM element indices on the units' ports (sram_base's width)

# The padding of a block without data rows is chosen in the setup cycle s + 1 (from_start below)
# and written from s + 2.
assert PAD_ONLY_SETUP_CYCLES == 2, "ReadDMA starts a padding-only block at s + 2"
# the request side asks for the first burst two cycles after the start
assert LOAD_SETUP_CYCLES == 2, "ReadDMA requests its first burst at s + 2"

#: The member of :class:`ReadDMA` that writes each memory type's buffer.
_WRITE_MEMBER = {MemType.UOP: "uop", MemType.WGT: "wgt", MemType.INP: "inp",
                 MemType.ACC: "acc", MemType.ACC_8BIT: "acc_8bit"}


def lanes_of(cfg: HwConfig, mt: MemType) -> int:
    """Elements of ``mt`` per bus beat (1 when an element spans one or more beats)."""
    return max(1, cfg.bus_bytes // cfg.elem_bytes(mt))


def _log2(n: int) -> int:
    return n.bit_length() - 1


@dataclass
class ElemSizes:
    """The element size of the memory type ``mt`` among ``targets``, as the hardware sees it:
    ``sel[le]`` is high when the element is ``2**le`` bytes. Helpers give per-size values.

    ``rem1(off)`` is the number of bus words of a row of ``x_size`` elements starting at byte
    ``off`` of its first word, minus one, and the byte offset of its last byte in its last word:
    ``((off + x_size*E - 1) >> lw, (off + x_size*E - 1) mod W)`` (docs/timing.md §2's
    ``beats(row) - 1``). ``off`` is 0 when elements are at least a bus word.
    """

    cfg: HwConfig
    sel: dict[int, Value]
    x_minus_1: Value

    @classmethod
    def build(cls, m: Module, cfg: HwConfig, mt: Value, targets: tuple[MemType, ...],
              x_size: Value, name: str) -> ElemSizes:
        sel: dict[int, Value] = {}
        for t in targets:
            le = _log2(cfg.elem_bytes(t))
            sel[le] = (sel[le] | (mt == t)) if le in sel else (mt == t)
        xm1 = Signal(len(x_size), name=f"{name}_x_minus_1")
        m.d.comb += xm1.eq(x_size - 1)
        return cls(cfg, sel, xm1)

    @property
    def sizes(self) -> list[int]:
        return sorted(self.sel)

    def pick(self, f) -> Value:
        """``f(le)`` for the current element size ``2**le`` bytes."""
        les = self.sizes
        out = f(les[0])
        for le in les[1:]:
            out = Mux(self.sel[le], f(le), out)
        return out

    def to_bytes(self, elems: Value, width: int = ADDR_BITS) -> Value:
        """``elems * E`` modulo ``2**width``."""
        return self.pick(lambda le: (elems << le)[:width])

    def rem1(self, off: Value) -> tuple[Value, Value]:
        lw = _log2(self.cfg.bus_bytes)

        def row_sum(le):  # off + x_size*E - 1
            nm1 = Cat(Const((1 << le) - 1, le), self.x_minus_1)
            return (off + nm1) if le < lw else nm1

        s = self.pick(row_sum)
        return s[lw:], s[:lw]


def row_requests(m: Module, name: str, cfg: HwConfig, *, load: Value, active: Value,
                 a0: Value, rows: Value, stride: Value, rem1,
                 grant: Value) -> tuple[Value, Value, Value]:
    """Add the request side of a 2-D transfer (docs/timing.md §2) to ``m``: the compact
    datapath's (``L = 1``, iCE40 logic cells); :func:`staged_row_requests` is the registered
    one.

    On ``load`` the walk starts at the row whose first byte is ``a0`` (32-bit byte address),
    with ``rows`` rows ``stride`` bytes apart, if ``active``; ``rem1(off)`` gives a row's
    beats minus one (:meth:`ElemSizes.rem1`). The request is ready from the cycle after
    ``load``, from registers only (the units hold it back one more cycle: docs/timing.md's
    ``LOAD_SETUP_CYCLES`` and ``STORE_SETUP_CYCLES``). Each row's words are cut into bursts at
    multiples of ``M`` beats; a burst is requested until ``grant``, which masks the adders'
    inputs. Returns ``(req, addr, beats)`` for the memory port.
    """
    W, M = cfg.bus_bytes, cfg.mem_max_burst_beats
    lw, lm = _log2(W), _log2(M)
    q_active = Signal(name=f"{name}_q_active")
    q_a = Signal(ADDR_BITS, name=f"{name}_q_row")  # byte address of the current row
    q_rows = Signal(len(rows), name=f"{name}_q_rows")  # rows left, the current one included
    rem_c, _ = rem1(q_a[:lw])
    q_pos = Signal(len(rem_c), name=f"{name}_q_pos")  # beats of the row already granted
    word = Signal(ADDR_BITS - lw, name=f"{name}_word")
    m.d.comb += word.eq(q_a[lw:] + q_pos)
    rem = Signal(len(q_pos), name=f"{name}_rem")  # beats of the row after this burst's first
    m.d.comb += rem.eq(rem_c - q_pos)
    room = Signal(range(1, M + 1), name=f"{name}_room")  # beats to the next M-beat boundary
    m.d.comb += room.eq(M - word[:lm]) if lm else room.eq(1)
    row_end = Signal(name=f"{name}_row_end")  # this burst is the row's last
    m.d.comb += row_end.eq((rem[lm + 1:] == 0) & (rem[:lm + 1] < room))
    burst = Signal(range(1, M + 1), name=f"{name}_burst")
    m.d.comb += burst.eq(Mux(row_end, rem[:lm + 1] + 1, room))
    req = Signal(name=f"{name}_req")
    m.d.comb += req.eq(q_active)
    # next state; "x + (d & enable)" rather than a multiplexer after the adder
    took = grant & q_active
    next_row = Signal(name=f"{name}_next_row")
    m.d.comb += next_row.eq(took & row_end)
    m.d.sync += [
        q_a.eq(q_a + (stride & next_row.replicate(len(stride)))),
        q_pos.eq(Mux(next_row, 0, q_pos + (burst & took.replicate(len(burst))))),
        q_rows.eq(q_rows - next_row),
        q_active.eq(Mux(next_row, q_rows != 1, q_active)),
    ]
    with m.If(load):
        m.d.sync += [q_active.eq(active), q_a.eq(a0), q_rows.eq(rows), q_pos.eq(0)]
    return req, Cat(Const(0, lw), word), burst


def staged_row_requests(m: Module, name: str, cfg: HwConfig, *, setup: Value, active: Value,
                        a0: Value, rows: Value, stride: Value, rem1,
                        grant: Value) -> tuple[Value, Value, Value]:
    """The registered datapath's request side (the read DMA with ``L >= 2``, the store;
    docs/timing.md §2), every output a register.

    In the ``setup`` cycle the walk is planned from the unit's instruction register: the row
    whose first byte is ``a0``, ``rows`` rows ``stride`` bytes apart, if ``active``;
    ``rem1(off)`` gives a row's beats minus one (:meth:`ElemSizes.rem1`). The first burst is
    requested from the cycle after ``setup`` (``LOAD_SETUP_CYCLES`` and ``STORE_SETUP_CYCLES``:
    2 after the start).

    The request (``req``, the burst's word address and its length) and whether the burst ends
    its row are registers, and so is the next row's byte address: the next values, for a burst
    that continues its row and for the next row's first, are formed from registers alone, and
    ``grant`` only selects them. No path runs from the row's length through adders into the
    memory port or the request registers' enables (the ECP5 clock: a row's beats, the
    beats granted and the burst's length were one chain of adders into the grant's enables).
    """
    W, M = cfg.bus_bytes, cfg.mem_max_burst_beats
    lw, lm = _log2(W), _log2(M)

    def plan(a: Value) -> tuple[Value, Value, Value, Value]:
        """A row starting at byte ``a`` (its low ``lw + lm`` bits): the beats after its first
        burst's first, the beats to the next ``M``-beat boundary, whether the first burst
        ends the row, and that burst's length."""
        rem, _ = rem1(a[:lw])
        room = Signal(range(1, M + 1), name=f"{name}_plan_room")
        m.d.comb += room.eq(M - a[lw:lw + lm]) if lm else room.eq(1)
        end = (rem[lm + 1:] == 0) & (rem[:lm + 1] < room)
        return rem, room, end, Mux(end, rem[:lm + 1] + 1, room)

    q_active = Signal(name=f"{name}_q_active")
    q_rows = Signal(len(rows), name=f"{name}_q_rows")  # rows left, the current one included
    q_word = Signal(ADDR_BITS - lw, name=f"{name}_q_word")  # the burst's first bus word
    n_row = Signal(ADDR_BITS, name=f"{name}_n_row")  # byte address of the next row
    rem_a, room_a, end_a, burst_a = plan(a0)
    q_rem = Signal(len(rem_a), name=f"{name}_q_rem")  # beats of the row after the burst's first
    q_room = Signal(range(1, M + 1), name=f"{name}_q_room")  # beats to the M-beat boundary
    q_end = Signal(name=f"{name}_q_end")  # the burst is the row's last
    q_burst = Signal(range(1, M + 1), name=f"{name}_q_burst")
    took = grant & q_active

    # a granted burst that does not end its row ends at an M-beat boundary
    c_rem = Signal.like(q_rem, name=f"{name}_c_rem")
    m.d.comb += c_rem.eq(q_rem - q_room)
    c_end = c_rem[lm:] == 0
    c_word = Cat(Const(0, lm), q_word[lm:] + 1) if lm else q_word + 1
    rem_n, room_n, end_n, burst_n = plan(n_row)
    with m.If(took & q_end):  # the next row
        m.d.sync += [q_word.eq(n_row[lw:]), n_row.eq(n_row + stride),
                     q_rows.eq(q_rows - 1), q_active.eq(q_rows != 1),
                     q_rem.eq(rem_n), q_room.eq(room_n), q_end.eq(end_n),
                     q_burst.eq(burst_n)]
    with m.Elif(took):  # the row's next burst
        m.d.sync += [q_word.eq(c_word), q_rem.eq(c_rem), q_room.eq(M), q_end.eq(c_end),
                     q_burst.eq(Mux(c_end, c_rem[:lm] + 1, M))]
    with m.If(setup):
        m.d.sync += [q_active.eq(active), q_rows.eq(rows), q_word.eq(a0[lw:]),
                     n_row.eq(a0 + stride), q_rem.eq(rem_a), q_room.eq(room_a),
                     q_end.eq(end_a), q_burst.eq(burst_a)]
    return q_active, Cat(Const(0, lw), q_word), q_burst


class ReadDMA(wiring.Component):
    """2-D strided DRAM → SRAM transfer with zero padding for the memory types ``targets``.

    Parameters
    ----------
    cfg : HwConfig
    targets : tuple of MemType
        The memory types this DMA serves; each gets a member (``uop``, ``wgt``, ``inp``,
        ``acc``, ``acc_8bit``) of :class:`~vtakit.vta_hw.interfaces.SramWriteSignature` with
        ``lanes_of(cfg, t)`` elements of ``8 * cfg.elem_bytes(t)`` bits, lane ``k`` at SRAM
        index ``addr + k`` (all targets share one index).

    Attributes
    ----------
    start : In
        The instruction on ``insn`` starts in this cycle (a LOAD whose ``memory_type`` is one
        of ``targets``).
    insn : In
        The instruction, read in the ``start`` cycle only (the command queue's head or the
        unit's register: the candidate).
    insn_reg : In
        The same instruction from the cycle after ``start`` to the cycle before ``finish``:
        the unit's instruction register itself (what is formed after the start cycle then
        hangs off no path through the start cycle's choice of instruction).
    finish : Out
        High in the instruction's finish cycle.
    finish_next : Out
        ``finish`` will be high in the next cycle.
    mem : Out(MemClientSignature(cfg))
        The memory-port client (read).
    writes : dict[MemType, interface]
        The write member of each target.
    """

    def __init__(self, cfg: HwConfig, targets: tuple[MemType, ...]):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"ReadDMA: cfg must be an HwConfig, got {type(cfg).__name__}")
        if not targets or not all(isinstance(t, MemType) for t in targets):
            raise ValueError(f"ReadDMA: targets must be a non-empty tuple of MemType, "
                             f"got {targets!r}")
        self.cfg, self.targets = cfg, tuple(targets)
        self.idx_bits = max(1, *(cfg.log_depth(t) for t in self.targets))
        members = {
            "start": In(1), "insn": In(isa.INSN_WIDTH_BITS),
            "insn_reg": In(isa.INSN_WIDTH_BITS), "finish": Out(1),
            "finish_next": Out(1), "active": Out(1), "mem": Out(MemClientSignature(cfg)),
        }
        for t in self.targets:
            members[_WRITE_MEMBER[t]] = Out(SramWriteSignature(
                8 * cfg.elem_bytes(t), lanes_of(cfg, t), self.idx_bits))
        super().__init__(members)
        self.writes = {t: getattr(self, _WRITE_MEMBER[t]) for t in self.targets}

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        # the start cycle's instruction (the candidate) is read only there: for the request
        # side's first row and whether the block has data at all; from s + 1 on everything
        # reads the unit's instruction register
        cur = data.View(insn_layouts(cfg).mem, self.insn)
        reg = data.View(insn_layouts(cfg).mem, self.insn_reg)
        W = cfg.bus_bytes
        lw = _log2(W)
        iw = self.idx_bits
        # A LOAD that vta_sim accepts has (y_pad_0 + y_size + y_pad_1) * (x_pad_0 + x_size +
        # x_pad_1) <= the buffer's depth (or x_size = 0), so sizes and counts fit idx_bits + 1
        # bits; the zero tests use the whole fields.
        nb = iw + 1
        y_any = reg.y_size != 0
        x, y = reg.x_size[:nb], reg.y_size[:nb]
        x0, x1, y0, y1 = reg.x_pad_0, reg.x_pad_1, reg.y_pad_0, reg.y_pad_1
        sizes = ElemSizes.build(m, cfg, reg.memory_type, self.targets, x, "dma")
        # With L >= 2 (the first beat at s + 3 or later) the row lengths and the index steps
        # from a row's last beat come from registers (here and below), so no path runs from
        # the instruction register or from r_off through a chain of adders into the request
        # registers or w_reg (the ECP5 clock); x_size - 1 is registered from the candidate at
        # the start, for the first request at s + 1.
        staged = cfg.mem_read_latency_cycles >= 2
        if staged:
            xm1 = Signal(len(x), name="dma_x_minus_1_reg")
            with m.If(self.start):
                m.d.sync += xm1.eq(cur.x_size[:nb] - 1)
            sizes = ElemSizes(cfg, sizes.sel, xm1)
        stride = Signal(ADDR_BITS)
        m.d.comb += stride.eq(sizes.to_bytes(reg.x_stride))
        gap = Signal(5)  # padding between two data rows, x_pad_1 + x_pad_0
        m.d.comb += gap.eq(x0 + x1)
        cols = Signal(nb)  # x_pad_0 + x_size + x_pad_1 (one adder as wide as x_size)
        m.d.comb += cols.eq(x + gap)

        # setup: the cycle after the start of a block with x_size > 0 (LOAD_SETUP_CYCLES,
        # PAD_ONLY_SETUP_CYCLES): the receive side begins here, from the register
        c_x_any = cur.x_size != 0
        setup = Signal()
        m.d.sync += setup.eq(self.start & c_x_any)

        # ---- request side ----------------------------------------------------------------
        # the first burst is requested at s + 2 (LOAD_SETUP_CYCLES)
        if staged:
            # planned in the setup cycle from the unit's register, every output a register
            req, addr, beats = staged_row_requests(
                m, "rq", cfg, setup=setup, active=y_any, a0=sizes.to_bytes(reg.dram_base),
                rows=y, stride=stride, rem1=sizes.rem1, grant=self.mem.grant)
        else:
            # loaded at the start from the candidate (the request side's registers come
            # first, the iCE40 preset's logic), held back in the setup cycle
            c_sizes = ElemSizes.build(m, cfg, cur.memory_type, self.targets, cur.x_size[:nb],
                                      "dma_start")
            req, addr, beats = row_requests(
                m, "rq", cfg, load=self.start, active=c_x_any & (cur.y_size != 0),
                a0=c_sizes.to_bytes(cur.dram_base), rows=cur.y_size[:nb], stride=stride,
                rem1=sizes.rem1, grant=self.mem.grant)
            req = req & ~setup
        m.d.comb += [self.mem.req.eq(req), self.mem.addr.eq(addr), self.mem.beats.eq(beats)]

        # ---- receive side ----------------------------------------------------------------
        IDLE, XFER, PAD, FIN = 0, 1, 2, 3
        ph = Signal(2)
        ph_next = Signal(2)  # assigned below, last assignment wins
        m.d.comb += ph_next.eq(ph)
        m.d.sync += ph.eq(ph_next)
        m.d.comb += [self.finish.eq(ph == FIN), self.finish_next.eq(ph_next == FIN),
                     self.active.eq((ph != IDLE) | setup)]
        beat = self.mem.rd_valid & (ph == XFER)
        pad_en = ph == PAD
        r_first = Signal()  # the next beat is the first of a row
        r_off = Signal(lw)  # byte offset of the current row's first byte in its first word
        r_rows = Signal(len(y))  # data rows left, the current one included (then MID gaps)
        # (staged: the stride's low bits registered from s + 1, the register's first cycle)
        stride_lw: Value = stride[:lw]
        if staged:
            stride_lw = Signal(lw, name="stride_lw")
            m.d.sync += stride_lw.eq(stride[:lw])
        n_off = Signal(lw)  # r_off of the next row
        m.d.comb += n_off.eq(r_off + stride_lw)
        # the first row's r_off: the block's DRAM address within its bus word
        off0 = sizes.to_bytes(reg.dram_base, lw)
        last = Signal()  # the current beat is the row's last
        if staged:
            # The row's sum (its beats less one, its last byte's offset) registered with r_off,
            # from the r_off it takes (off0 at the setup cycle, n_off at a row's last beat), so
            # the row's last beat and every lane's write enable come from registers and no
            # carry chain runs into the buffers' write enables (the ECP5 clock)
            rs_hi, rs_lo = sizes.rem1(Mux(setup, off0, n_off))
            rem_first = Signal(len(rs_hi), name="row_rem")
            last_off = Signal(lw, name="row_last_off")
            first_last = Signal(name="row_one_beat")  # the row is one beat
            with m.If(setup | (beat & last)):
                m.d.sync += [rem_first.eq(rs_hi), last_off.eq(rs_lo),
                             first_last.eq(rs_hi == 0)]
        else:
            rem_first, last_off = sizes.rem1(r_off)
        r_left = Signal(len(rem_first))  # beats of the row after the current one
        left_after = Signal.like(r_left)
        m.d.comb += left_after.eq(Mux(r_first, rem_first, r_left - 1))
        if staged:
            m.d.comb += last.eq(Mux(r_first, first_last, r_left == 1))
        else:
            m.d.comb += last.eq(left_after == 0)
        last_row = Signal()  # ... of the last row
        m.d.comb += last_row.eq(beat & last & (r_rows == 1))
        with m.If(beat):
            m.d.sync += [r_left.eq(left_after), r_first.eq(last)]
            with m.If(last):
                m.d.sync += r_off.eq(n_off)

        # w_reg: the SRAM index written now, shared by every target: lane 0 of the current
        # beat (less than the row's first element when the row starts in a later lane), or
        # the padding element. From a row's last beat it steps to the next row's first beat
        # (over the gap), from the last row's to the element after that row.
        k_max = max(1, *(cfg.elem_bytes(t) // W for t in self.targets))
        part = Signal(range(k_max), name="part")  # beat within an element (E > W)
        w_reg = Signal(iw)
        done_elem = sizes.pick(lambda le: part == (1 << (le - lw)) - 1 if le > lw else Const(1))

        def lane_of(off, le):
            return off[le:] if le < lw else Const(0, 1)

        def step_of(le):  # to the next beat of the row
            return Const(1 << (lw - le), lw + 1) if le < lw else done_elem

        def row_step_of(le):  # from a row's last beat: its last element + 1, the gap, the lane
            past = lane_of(last_off, le) + 1
            return Mux(r_rows == 1, past, past + gap - lane_of(n_off, le))

        w_next = Signal(iw)
        if staged:
            # row_end: the index after the current row's last element; row_next: the next
            # row's first element (set in the setup2 cycle below, stepped by a row's pitch
            # at each row's last beat)
            row_end, row_next = Signal(iw), Signal(iw)
            with m.If(beat & last):
                m.d.sync += [row_end.eq(row_end + cols), row_next.eq(row_next + cols)]
            step = Signal(signed(8))
            m.d.comb += step.eq(Mux(pad_en, 1, sizes.pick(step_of)))
            from_row = Mux(r_rows == 1, row_end,
                           row_next - sizes.pick(lambda le: lane_of(n_off, le)))
            m.d.comb += w_next.eq(Mux(~pad_en & last, from_row, w_reg + step))
        else:
            step = Signal(signed(8))
            m.d.comb += step.eq(Mux(pad_en, 1, Mux(last, sizes.pick(row_step_of),
                                                   sizes.pick(step_of))))
            m.d.comb += w_next.eq(w_reg + step)
        with m.If(beat | pad_en):
            m.d.sync += w_reg.eq(w_next)
        if k_max > 1:
            with m.If(beat):
                m.d.sync += part.eq(Mux(done_elem, 0, part + 1))

        word = self.mem.rd_data
        for i, t in enumerate(self.targets):
            eb = cfg.elem_bytes(t)
            le = _log2(eb)
            port = self.writes[t]
            en, dat = port.en, port.data
            mine = reg.memory_type == t
            m.d.comb += port.addr.eq(w_reg)
            if eb >= W:
                k = eb // W
                if k > 1:
                    sr = Signal((k - 1) * W * 8, name=f"t{i}_sr")
                    with m.If(beat):
                        m.d.sync += sr.eq(Cat(sr[W * 8:], word))
                    full = Cat(sr, word)
                else:
                    full = word
                m.d.comb += [en[0].eq(mine & ((beat & done_elem) | pad_en)),
                             dat[0].eq(Mux(pad_en, 0, full))]
            else:
                for lane in range(W // eb):
                    ok = ((~r_first | (lane_of(r_off, le) <= lane))
                          & (~last | (lane_of(last_off, le) >= lane)))
                    lane_data = word[lane * eb * 8:(lane + 1) * eb * 8]
                    if lane == 0:  # padding is written through lane 0 only
                        m.d.comb += [en[0].eq(mine & ((beat & ok) | pad_en)),
                                     dat[0].eq(Mux(pad_en, 0, lane_data))]
                    else:
                        m.d.comb += [en[lane].eq(mine & beat & ok), dat[lane].eq(lane_data)]

        # ---- padding -----------------------------------------------------------------------
        # Three kinds of segments, written in this order: BOT (the last row's right pad, then
        # y_pad_1 rows; it follows the last data beat's index), TOP (from sram_base: x_pad_0
        # partial, then y_pad_0 rows; with y_size = 0 all y_pad_0 + y_pad_1 rows), and the
        # y_size - 1 MID gaps (x_pad_1 + x_pad_0 after each data row but the last; the first
        # follows row 0's data). Within a segment the index steps by 1. Empty segments are
        # skipped when choosing the next one, so a padding element is written every cycle.
        BOT, TOP, MID = 0, 1, 2
        # staged: where the next MID gap starts (the index after its data row's last element;
        # set with w_reg's first value, so no adder follows the choice of segment)
        mid_at = Signal(iw, name="mid_at")
        p_seg = Signal(2)
        p_cnt = Signal(nb)  # elements left in the current partial row or row
        p_rows = Signal(5)  # whole rows left after the current one
        top_partial = Mux(y_any, x0, 0)
        top_rows = Signal(5)
        m.d.comb += top_rows.eq(Mux(y_any, y0, y0 + y1))
        # where the next segment is chosen: before the first one (after the last data beat,
        # or at the start of a block without data rows), or at the end of the current one
        from_start = Signal()
        m.d.comb += from_start.eq((setup & ~y_any)
                                  | (last_row & ((x0 | x1 | y0 | y1) != 0)))
        seg_done = Signal()
        m.d.comb += seg_done.eq(pad_en & (p_cnt == 1) & (p_rows == 0))
        choose = from_start | seg_done
        at = {seg: seg_done & (p_seg == seg) for seg in (BOT, TOP, MID)}
        # A choice from the start and one after a segment never fall in one cycle (the former
        # comes in the setup cycle or with the last data beat, not in a padding cycle), so
        # with L >= 2 the next segment is planned with "not after a segment" for "from the
        # start": from registers alone (the instruction register, p_seg, p_cnt, p_rows,
        # r_rows, w_reg), and the choice, which the last data beat's arrival decides late in
        # the cycle (the port's read valid, the row's beats left), only enables the plan (the
        # ECP5 clock). Without a choice the plan is not used.
        fs = ~seg_done if staged else from_start
        to_bot = fs & y_any & ((x1 != 0) | (y1 != 0))
        to_top = ~to_bot & (fs | at[BOT]) & ((top_partial != 0) | (top_rows != 0))
        # r_rows counts the MID gaps down from y_size to 2 (the last one)
        to_mid = ~to_bot & ~to_top & Mux(at[MID], r_rows != 2, y[1:].any() & (gap != 0))
        nseg = Signal(2)
        m.d.comb += nseg.eq(Mux(to_bot, BOT, Mux(to_top, TOP, MID)))
        n_partial = Signal(5)
        n_rows = Signal(5)
        n_idx = Signal(iw)  # where TOP or MID starts (BOT follows the last data beat)
        with m.Switch(nseg):
            with m.Case(BOT):
                m.d.comb += [n_partial.eq(x1), n_rows.eq(y1)]
            with m.Case(TOP):
                m.d.comb += [n_partial.eq(top_partial), n_rows.eq(top_rows),
                             n_idx.eq(reg.sram_base)]
            with m.Default():
                # the gap after a row's data: after the previous gap or the TOP segment (which
                # ends at row 0), or (no TOP segment) after row 0 at sram_base
                # (the index after the segment's last element: padding steps by one)
                if staged:
                    # (a register: the first gap's start, stepped by a row's pitch at each)
                    m.d.comb += [n_partial.eq(gap), n_rows.eq(0), n_idx.eq(mid_at)]
                else:
                    skip_from = Mux(at[TOP] | at[MID], w_reg + 1, reg.sram_base)
                    m.d.comb += [n_partial.eq(gap), n_rows.eq(0), n_idx.eq(skip_from + x)]
        # r_rows: data rows left (down to 1, the last), then the MID gaps (from y_size down)
        enter_mid = choose & to_mid
        if staged:
            with m.If(enter_mid):
                m.d.sync += mid_at.eq(mid_at + cols)
        rows_dec = (beat & last & (r_rows != 1)) | (enter_mid & at[MID])
        m.d.sync += r_rows.eq(Mux(setup | (enter_mid & ~at[MID]), y, r_rows - rows_dec))
        with m.If(ph == FIN):  # before the assignments below: a start may follow at once
            m.d.comb += ph_next.eq(IDLE)
        with m.If(pad_en):
            m.d.sync += p_cnt.eq(p_cnt - 1)
            with m.If((p_cnt == 1) & (p_rows != 0)):
                m.d.sync += [p_cnt.eq(cols), p_rows.eq(p_rows - 1)]
        with m.If(choose):
            with m.If(to_top | to_mid | to_bot):
                m.d.comb += ph_next.eq(PAD)
                m.d.sync += p_seg.eq(nseg)
                with m.If(~to_bot):
                    m.d.sync += w_reg.eq(n_idx)
                with m.If(n_partial != 0):
                    m.d.sync += [p_cnt.eq(n_partial), p_rows.eq(n_rows)]
                with m.Else():
                    m.d.sync += [p_cnt.eq(cols), p_rows.eq(n_rows - 1)]
            with m.Else():
                m.d.comb += ph_next.eq(FIN)
        with m.If(last_row & ~from_start):
            m.d.comb += ph_next.eq(FIN)

        # a new instruction may start in the previous one's finish cycle: the start cycle only
        # decides whether there is anything to do (x_size = 0 finishes at s + 1)
        with m.If(self.start & ~c_x_any):
            m.d.comb += ph_next.eq(FIN)
        # setup (s + 1): the first beat arrives at s + 1 + L >= s + 2, its lane 0 at
        # sram_base + y_pad_0 * cols + x_pad_0 - (its first lane), formed from the register
        lane0 = sizes.pick(lambda le: lane_of(off0, le))
        with m.If(setup):
            m.d.sync += [r_off.eq(off0), r_first.eq(1)]
            if k_max > 1:
                m.d.sync += part.eq(0)
            with m.If(y_any):
                m.d.comb += ph_next.eq(XFER)
        if cfg.mem_read_latency_cycles >= 2:
            # the first beat comes at s + 3 or later: y_pad_0 * cols (shifts and adds of a
            # 4-bit factor, beside the DMA's other logic) into a register at s + 1, the index
            # at s + 2, so no path runs from the instruction register through a multiplier to
            # the index (the ECP5 clock)
            top = Signal(iw)
            m.d.sync += top.eq(sum(Mux(y0[k], cols[:iw] << k, 0)
                                   for k in range(len(y0)))[:iw])
            first = Signal(iw)
            m.d.comb += first.eq(reg.sram_base + top + (reg.x_pad_0 - lane0))
            setup2 = Signal()
            m.d.sync += setup2.eq(setup & y_any)
            # the first row's element x_pad_0, less the top rows (from s + 1)
            row0 = Signal(iw)
            m.d.sync += row0.eq(reg.sram_base + reg.x_pad_0)
            end0 = Signal(iw)  # the index after the first data row's last element
            m.d.comb += end0.eq(row0 + top + x)
            with m.If(setup2):
                m.d.sync += [w_reg.eq(first), row_end.eq(end0),
                             row_next.eq(row0 + top + cols), mid_at.eq(end0)]
        else:
            first = reg.sram_base + (y0 * cols[:iw])[:iw] + (reg.x_pad_0 - lane0)
            with m.If(setup & y_any):
                m.d.sync += w_reg.eq(first[:iw])
        return m
