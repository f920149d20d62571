"""The accelerator core: fetch, the three command queues, four token queues, load / compute /
store units, the on-chip buffers and the shared memory port, wired together.

Ports (see docs/hardware.md): ``start`` (one-cycle pulse; ``insn_addr`` and ``insn_count``
sampled with it; the next cycle is cycle 0 of docs/timing.md), ``done`` (high from the cycle
FINISH finishes, or a deadlock is detected, until the next start), ``cycles`` (cycle counter,
frozen when ``done`` rises), ``fault`` (what went wrong,
:class:`~vtakit.vta_hw.faults.Fault`), ``hw_ver``, ``hw_id``, and the burst memory interface
``mem_*``.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw import isa
from vtakit.vta_hw.compute import Compute
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.dma import lanes_of
from vtakit.vta_hw.faults import DEADLOCK_QUIET_CYCLES, FAULT_BITS, Fault
from vtakit.vta_hw.fetch import Fetch
from vtakit.vta_hw.gemm import check_dsp_products
from vtakit.vta_hw.interfaces import ADDR_BITS
from vtakit.vta_hw.isa import MemType
from vtakit.vta_hw.load import Load
from vtakit.vta_hw.mem_port import MemPort
from vtakit.vta_hw.queues import CmdQueue, TokenCounter
from vtakit.vta_hw.sram import BankedMemory
from vtakit.vta_hw.store import Store

__all__ = ["Core", "Fault", "hw_ver_word", "DEADLOCK_QUIET_CYCLES", "FAULT_BITS"]


def hw_ver_word() -> int:
    major, minor, patch = isa.HW_VER
    return (major << 16) | (minor << 8) | patch


class Core(wiring.Component):
    """The whole accelerator (Verilog module ``vta_core``).

    Parameters
    ----------
    cfg : HwConfig
    dsp_products : int or None
        How many of the GEMM core's ``batch * block_out * block_in`` products are written for
        DSP blocks; the others are Booth multipliers in logic (:mod:`~vtakit.vta_hw.gemm`: a
        core with more products than the part has multiplier blocks). None: all of them. The
        results and cycle counts are the same either way.

    After a fault the units may still hold instructions of the failed run: reset the core
    (its ``sync`` domain; the buffers keep their contents) before the next ``start``.
    """

    def __init__(self, cfg: HwConfig, *, dsp_products: int | None = None):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Core: cfg must be an HwConfig, got {type(cfg).__name__}")
        check_dsp_products(dsp_products, "Core")
        self.cfg = cfg.validate()
        self.dsp_products = dsp_products
        mb, bus = cfg.mem_max_burst_beats, cfg.bus_width_bits
        # The memory ports are flat (``mem_rd_valid``, ...), not a MemBusSignature member
        # (``mem__rd_valid``): the Verilog port names are the interface of docs/hardware.md
        # that the RTL bench and the boards' SoCs connect to.
        super().__init__({
            "start": In(1), "insn_addr": In(32), "insn_count": In(32),
            "done": Out(1), "cycles": Out(32), "fault": Out(FAULT_BITS),
            "hw_ver": Out(32), "hw_id": Out(32),
            "mem_rd_valid": Out(1), "mem_rd_addr": Out(ADDR_BITS),
            "mem_rd_beats": Out(range(1, mb + 1)),
            "mem_rd_data_valid": In(1), "mem_rd_data": In(bus),
            "mem_wr_valid": Out(1), "mem_wr_addr": Out(ADDR_BITS),
            "mem_wr_beats": Out(range(1, mb + 1)),
            "mem_wr_data_valid": Out(1), "mem_wr_data": Out(bus), "mem_wr_strb": Out(bus // 8),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        connect = wiring.connect
        m.d.comb += [self.hw_ver.eq(hw_ver_word()), self.hw_id.eq(cfg.hash_u32)]
        port = m.submodules.mem_port = MemPort(cfg)
        fetch = m.submodules.fetch = Fetch(cfg)
        load = m.submodules.load = Load(cfg)
        compute = m.submodules.compute = Compute(cfg, self.dsp_products)
        store = m.submodules.store = Store(cfg)
        load_q = m.submodules.load_queue = CmdQueue(cfg.cmd_queue_depth)
        compute_q = m.submodules.compute_queue = CmdQueue(cfg.cmd_queue_depth)
        store_q = m.submodules.store_queue = CmdQueue(cfg.cmd_queue_depth)
        l2g = m.submodules.l2g_tokens = TokenCounter(cfg.dep_queue_depth)
        g2l = m.submodules.g2l_tokens = TokenCounter(cfg.dep_queue_depth)
        g2s = m.submodules.g2s_tokens = TokenCounter(cfg.dep_queue_depth)
        s2g = m.submodules.s2g_tokens = TokenCounter(cfg.dep_queue_depth)

        # memory side: the port's bus is the core's mem_* ports
        bus = port.bus
        m.d.comb += [
            self.mem_rd_valid.eq(bus.rd_valid), self.mem_rd_addr.eq(bus.rd_addr),
            self.mem_rd_beats.eq(bus.rd_beats),
            bus.rd_data_valid.eq(self.mem_rd_data_valid), bus.rd_data.eq(self.mem_rd_data),
            self.mem_wr_valid.eq(bus.wr_valid), self.mem_wr_addr.eq(bus.wr_addr),
            self.mem_wr_beats.eq(bus.wr_beats), self.mem_wr_data_valid.eq(bus.wr_data_valid),
            self.mem_wr_data.eq(bus.wr_data), self.mem_wr_strb.eq(bus.wr_strb),
        ]
        # the port's clients (MemClientSignature)
        connect(m, fetch.mem, port.fetch)
        connect(m, compute.mem, port.compute)
        connect(m, load.mem, port.load)
        connect(m, store.mem, port.store)

        # fetch → command queues → units (CommandWriteSignature, CommandSignature)
        m.d.comb += [fetch.start.eq(self.start), fetch.insn_addr.eq(self.insn_addr),
                     fetch.insn_count.eq(self.insn_count)]
        connect(m, fetch.load_cmd, load_q.w)
        connect(m, fetch.compute_cmd, compute_q.w)
        connect(m, fetch.store_cmd, store_q.w)
        connect(m, load_q.r, load.cmd)
        connect(m, compute_q.r, compute.cmd)
        connect(m, store_q.r, store.cmd)

        # token queues: producer pushes, consumer pops (TokenPushSignature, TokenPopSignature;
        # who pushes and pops which: vta_hw.timing_facts.TOKEN_PUSHES / TOKEN_POPS)
        connect(m, load.l2g, l2g.producer)
        connect(m, compute.l2g, l2g.consumer)
        connect(m, compute.g2l, g2l.producer)
        connect(m, load.g2l, g2l.consumer)
        connect(m, compute.g2s, g2s.producer)
        connect(m, store.g2s, g2s.consumer)
        connect(m, store.s2g, s2g.producer)
        connect(m, compute.s2g, s2g.consumer)

        # on-chip buffers
        def sram(name, width, depth, banks, w_lanes, r_lanes, w_sext_bits=0,
                 transparent=False):
            mod = BankedMemory(width, depth, banks, w_lanes, r_lanes, w_sext_bits, transparent)
            m.submodules[f"{name}_sram"] = mod
            return mod

        ru, ri = lanes_of(cfg, MemType.UOP), lanes_of(cfg, MemType.INP)
        rw, ro = lanes_of(cfg, MemType.WGT), lanes_of(cfg, MemType.OUT)
        ra = compute.acc_lanes
        uop = sram("uop", 32, cfg.uop_depth, ru, ru, 1)
        inp = sram("inp", cfg.inp_elem_bits, cfg.inp_depth, ri, ri, 1)
        wgt = sram("wgt", cfg.wgt_elem_bits, cfg.wgt_depth, rw, rw, 1)
        acc = sram("acc", cfg.acc_elem_bits, cfg.acc_depth, ra, ra, 1, compute.acc_w_sext_bits)
        # the registered datapath writes a GEMM's last result in its finish cycle, when a
        # STORE that pops its token reads OUT's first element: that read sees the write
        out = sram("out", cfg.out_elem_bits, cfg.out_depth, ro, 1, ro,
                   transparent=not compute.compact)

        def wire_w(mem, en, addr, dat):
            m.d.comb += [mem.w_en.eq(en), mem.w_addr.eq(addr), mem.w_data.eq(dat)]

        def wire_r(mem, addr, dat):
            m.d.comb += [mem.r_addr.eq(addr), dat.eq(mem.r_data)]

        wire_w(uop, compute.uop_w_en, compute.uop_w_addr, compute.uop_w_data)
        wire_r(uop, compute.uop_r_addr, compute.uop_r_data)
        wire_w(inp, load.inp_w_en, load.inp_w_addr, load.inp_w_data)
        wire_r(inp, compute.inp_r_addr, compute.inp_r_data)
        wire_w(wgt, load.wgt_w_en, load.wgt_w_addr, load.wgt_w_data)
        wire_r(wgt, compute.wgt_r_addr, compute.wgt_r_data)
        wire_w(acc, compute.acc_w_en, compute.acc_w_addr, compute.acc_w_data)
        if compute.acc_w_sext_bits:
            m.d.comb += acc.w_sext.eq(compute.acc_w_sext)
        wire_r(acc, compute.acc_r_addr, compute.acc_r_data)
        wire_w(out, compute.out_w_en, compute.out_w_addr, compute.out_w_data)
        wire_r(out, store.out_r_addr, store.out_r_data)

        # run control: cycle 0 is the cycle after start; done from FINISH's finish cycle
        done = Signal()
        running = Signal()
        cycles = Signal(32)
        fault = Signal(FAULT_BITS)
        m.d.comb += [self.done.eq(done), self.cycles.eq(cycles), self.fault.eq(fault)]
        with m.If(running & ~done):
            m.d.sync += cycles.eq(cycles + 1)
        with m.If(compute.finish_start & running):
            m.d.sync += done.eq(1)

        # faults (class Fault): a deadlock ends the run; the end-of-run check looks at the
        # state after FINISH's finish cycle e, in cycle e + 1
        quiet = Signal()
        m.d.comb += quiet.eq(running & ~done & ~fetch.active & ~load.active & ~compute.active
                             & ~store.active)
        quiet_for = Signal(range(DEADLOCK_QUIET_CYCLES))
        m.d.sync += quiet_for.eq(0)
        with m.If(quiet):
            m.d.sync += quiet_for.eq(quiet_for + 1)
            with m.If(quiet_for == DEADLOCK_QUIET_CYCLES - 1):
                m.d.sync += [done.eq(1), fault.eq(fault | Fault.DEADLOCK)]
        finish_e = Signal()  # cycle e
        check = Signal()     # cycle e + 1
        m.d.sync += [finish_e.eq(compute.finish_start & running), check.eq(finish_e)]
        unfinished = ((~load.idle) | (load_q.level != 0) | (~store.idle) | (store_q.level != 0))
        left = [tokens.count != 0 for tokens in (l2g, g2l, g2s, s2g)]
        with m.If(check):
            m.d.sync += fault.eq(fault | Mux(unfinished, Fault.UNFINISHED, 0)
                                 | Cat(Const(0, 2), *left))

        with m.If(self.start):
            m.d.sync += [cycles.eq(0), done.eq(0), running.eq(1), fault.eq(0), quiet_for.eq(0),
                         finish_e.eq(0), check.eq(0)]
        for tokens in (l2g, g2l, g2s, s2g):
            m.d.comb += tokens.clear.eq(self.start)
        return m
