"""On-chip buffers: element-addressed SRAMs built from block RAMs with registered read ports.

A buffer written or read several elements per cycle (a bus beat holding more than one element,
docs/timing.md §2) is split into ``banks`` interleaved block RAMs: element ``i`` lives in bank
``i % banks`` at row ``i // banks``. A port moves the *consecutive* elements ``addr``,
``addr + 1``, ... (one per lane; a beat's elements are consecutive), so its lanes always fall
into distinct banks: lane ``k`` reaches bank ``(addr + k) % banks`` through a rotation by
``addr % banks`` (``log2(banks)`` levels of 2:1 multiplexers, not a crossbar), and every bank's
row is ``addr // banks`` or one more. Read data appears the cycle after the index.
When the write lanes after lane 0 only ever hold sign-extended narrow values (``w_sext_bits``:
the ACC buffer of a core whose ACC element is one int32, written four ACC_8BIT values a beat
on a 32-bit bus), only the low bits go through the rotation, and each bank's upper bits are
lane 0's or the sign of the rotated value (``w_sext`` says that lane 0 holds one too): about
65 iCE40 logic cells fewer for that buffer and its writer.

Read-during-write of one element: the Amaranth and Verilator models return the old value, and
on an FPGA the value is undefined (the memories carry yosys' ``no_rw_check`` attribute, so no
bypass logic is built around the block RAMs). No reader depends on it: the compute unit
forwards its own ACC writes around the RAM, and the other buffers are written and read by
different units whose accesses the dependency tokens order. The one exception is a buffer
built ``transparent``: its reads return the element written in the same cycle (synthesis
builds the bypass: the write's data and an address comparison registered beside the block
RAM, a multiplexer after it). The OUT buffer of a core on the registered datapath is one: the
GEMM's last write lands in its finish cycle, when a STORE that pops its token may read the
first element (:mod:`~vtakit.vta_hw.compute`).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["BankedMemory", "rotate"]


def _log2(n: int) -> int:
    return n.bit_length() - 1


def rotate(items: list, amount: Value, up: bool = True) -> list:
    """``out[b] = items[(b - amount) % n]`` (``up``) or ``items[(b + amount) % n]``, for a
    power-of-two ``n = len(items)``: a logarithmic rotator over whole items."""
    n = len(items)
    cur = list(items)
    for i in range(_log2(n)):
        step = (1 << i) if up else -(1 << i)
        cur = [Mux(amount[i], cur[(b - step) % n], cur[b]) for b in range(n)]
    return cur


class BankedMemory(wiring.Component):
    """``depth`` elements of ``width_bits``, in ``banks`` block RAMs.

    Parameters
    ----------
    width_bits : int
        Bits of one element.
    depth : int
        Elements (a power of two, at least ``banks``).
    banks : int
        Interleaved block RAMs (a power of two).
    w_lanes, r_lanes : int
        Consecutive elements written / read per cycle (at most ``banks``).
    w_sext_bits : int
        0, or the width of the values that write lanes ``1 ..`` hold sign-extended to
        ``width_bits`` (their upper bits are not read: the sign of the low bits is written).
    transparent : bool
        A read returns the element written in the same cycle (else the old one).

    Attributes
    ----------
    w_en, w_data : In
        One entry per write lane; lane ``k`` writes element ``w_addr + k``.
    w_sext : In
        (only with ``w_sext_bits``) lane 0 holds a sign-extended value as well (its upper
        bits are not read); low: lane 0 is the only lane enabled.
    w_addr : In
        Index of lane 0's element.
    r_addr : In
        Index of lane 0's element (read every cycle).
    r_data : Out
        The elements ``r_addr + k`` of the previous cycle's ``r_addr``.
    """

    def __init__(self, width_bits: int, depth: int, banks: int = 1, w_lanes: int = 1,
                 r_lanes: int = 1, w_sext_bits: int = 0, transparent: bool = False):
        for name, v in (("width_bits", width_bits), ("depth", depth), ("banks", banks),
                        ("w_lanes", w_lanes), ("r_lanes", r_lanes)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"BankedMemory: {name} must be an int, got {v!r}")
            if v < 1:
                raise ValueError(f"BankedMemory: {name}={v} must be at least 1")
        for name, v in (("depth", depth), ("banks", banks)):
            if v & (v - 1):
                raise ValueError(f"BankedMemory: {name}={v} must be a power of two")
        if depth < banks:
            raise ValueError(f"BankedMemory: depth={depth} must be at least banks={banks}")
        if w_lanes > banks or r_lanes > banks:
            raise ValueError(f"BankedMemory: w_lanes={w_lanes} and r_lanes={r_lanes} must not "
                             f"exceed banks={banks}")
        if not isinstance(w_sext_bits, int) or isinstance(w_sext_bits, bool):
            raise TypeError(f"BankedMemory: w_sext_bits must be an int, got {w_sext_bits!r}")
        if not 0 <= w_sext_bits < width_bits:
            raise ValueError(f"BankedMemory: w_sext_bits={w_sext_bits} must be 0 or less than "
                             f"width_bits={width_bits}")
        if not isinstance(transparent, bool):
            raise TypeError(f"BankedMemory: transparent must be a bool, got {transparent!r}")
        self.w_sext_bits = w_sext_bits
        self.transparent = transparent
        self.width_bits, self.depth, self.banks = width_bits, depth, banks
        self.w_lanes, self.r_lanes = w_lanes, r_lanes
        aw = max(1, _log2(depth))
        self.addr_bits = aw
        sext = {"w_sext": In(1)} if w_sext_bits else {}
        super().__init__({
            **sext,
            "w_en": In(data.ArrayLayout(1, w_lanes)),
            "w_addr": In(unsigned(aw)),
            "w_data": In(data.ArrayLayout(unsigned(width_bits), w_lanes)),
            "r_addr": In(unsigned(aw)),
            "r_data": Out(data.ArrayLayout(unsigned(width_bits), r_lanes)),
        })

    def elaborate(self, platform):
        m = Module()
        nb, lb = self.banks, _log2(self.banks)
        bank_depth = self.depth // nb
        rows = []
        for b in range(nb):
            mem = memory.Memory(shape=unsigned(self.width_bits), depth=bank_depth, init=[],
                                attrs={"no_rw_check": 1})
            m.submodules[f"bank{b}"] = mem
            wp = mem.write_port()
            rows.append((wp, mem.read_port(transparent_for=(wp,) if self.transparent else ())))
        if nb == 1:
            (wp, rp), = rows
            m.d.comb += [wp.en.eq(self.w_en[0]), wp.addr.eq(self.w_addr),
                         wp.data.eq(self.w_data[0]), rp.addr.eq(self.r_addr),
                         self.r_data[0].eq(rp.data)]
            return m

        def bank_rows(addr, lanes):
            """Each bank's row for the lanes starting at element ``addr``."""
            hi = addr[lb:]
            if lanes == 1:
                return [hi] * nb
            hi1 = Signal.like(hi, name=f"{addr.name}_next_row")
            m.d.comb += hi1.eq(hi + 1)
            return [Mux(addr[:lb] > b, hi1, hi) for b in range(nb)]

        # write: lane k to bank (w_addr + k) % nb
        w_shift = self.w_addr[:lb]
        if self.w_lanes == 1:
            en = [self.w_en[0] & (w_shift == b) for b in range(nb)]
            dat = [self.w_data[0]] * nb
        else:
            pad = nb - self.w_lanes
            en = rotate([self.w_en[k] for k in range(self.w_lanes)] + [0] * pad, w_shift)
            nw = self.w_sext_bits or self.width_bits
            dat = rotate([self.w_data[k][:nw] for k in range(self.w_lanes)]
                         + [self.w_data[0][:nw]] * pad, w_shift)
            if nw < self.width_bits:
                # bank b takes lane 0's upper bits where w_shift == b (unless lane 0 is
                # sign-extended too), else the rotated value's sign: one multiplexer per bit
                dat = [Cat(dat[b], Mux((w_shift == b) & ~self.w_sext, self.w_data[0][nw:],
                                       dat[b][nw - 1].replicate(self.width_bits - nw)))
                       for b in range(nb)]
        w_row = bank_rows(self.w_addr, self.w_lanes)
        for b, (wp, _) in enumerate(rows):
            m.d.comb += [wp.en.eq(en[b]), wp.addr.eq(w_row[b]), wp.data.eq(dat[b])]

        # read: bank (r_addr + k) % nb to lane k, one cycle later
        r_row = bank_rows(self.r_addr, self.r_lanes)
        for b, (_, rp) in enumerate(rows):
            m.d.comb += rp.addr.eq(r_row[b])
        r_shift = Signal(lb)
        m.d.sync += r_shift.eq(self.r_addr[:lb])
        out = rotate([rp.data for _, rp in rows], r_shift, up=False)
        for k in range(self.r_lanes):
            m.d.comb += self.r_data[k].eq(out[k])
        return m
