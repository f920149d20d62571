"""The compute unit: LOAD of UOP/ACC/ACC_8BIT, GEMM, ALU and FINISH (docs/timing.md §4).

GEMM and ALU walk the loop ``i < iter_out, j < iter_in, u in uop_bgn..uop_end-1`` issuing one
iteration per cycle (two for a tensor-operand ALU) from ``s + 1``; the finish cycle is the last
issue plus 5 (6 for a tensor ALU, whose first issue also is at ``s + 1``), which gives
``s + n + 5`` and ``s + 2n + 5``. Pipeline, for an iteration issued at ``t``:

* ``t``: read the micro-op; ``t+1``: form the ACC/INP/WGT indices, read the SRAMs;
* GEMM / ALU immediate: ``t+2`` operands arrive (GEMM products registered); ``t+3`` adder tree,
  accumulate or ALU; ``t+4`` write ACC and OUT;
* tensor ALU: ``t+1`` reads ``ACC[src]``, ``t+2`` reads ``ACC[dst]``; ``t+4`` ALU; ``t+5`` write.

Back-to-back updates of one ACC row are forwarded: a value read from the ACC block RAM is
patched with the write of the previous cycle (which the registered read missed) and of the
current one, and every operand held in a pipeline register snoops the ACC write port until it
is used. So each iteration sees every earlier iteration's result, as the loop semantics say.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.alu import TensorAlu
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.control import unit_control
from vtakit.vta_hw.dma import IDX_BITS, ReadDMA, lanes_of
from vtakit.vta_hw.gemm import GemmCore
from vtakit.vta_hw.isa import MemType, Opcode
from vtakit.vta_hw.layouts import insn_layouts

__all__ = ["Compute", "COMPUTE_TARGETS"]

COMPUTE_TARGETS = (MemType.UOP, MemType.ACC, MemType.ACC_8BIT)


class Compute(wiring.Component):
    """Executes the compute queue.

    Parameters
    ----------
    cfg : HwConfig

    Attributes
    ----------
    cmd_valid, cmd_data, cmd_take : the compute command queue's head.
    l2g_*, s2g_* (popped), g2l_*, g2s_* (pushed) : token queues.
    req, addr, beats, grant, rd_valid, rd_data : memory-port client (read).
    uop_*, inp_r_*, wgt_r_*, acc_*, out_w_* : SRAM ports.
    finish_start : Out
        A FINISH starts in this cycle (it finishes, and the run ends, in the next).
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Compute: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        ru = lanes_of(cfg, MemType.UOP)
        ra = max(lanes_of(cfg, MemType.ACC), lanes_of(cfg, MemType.ACC_8BIT))
        self.acc_lanes = ra
        arr = data.ArrayLayout
        idx = unsigned(IDX_BITS)
        super().__init__({
            "cmd_valid": In(1), "cmd_data": In(128), "cmd_take": Out(1),
            "l2g_avail": In(1), "l2g_pop": Out(1), "s2g_avail": In(1), "s2g_pop": Out(1),
            "g2l_can_push": In(1), "g2l_push": Out(1), "g2s_can_push": In(1), "g2s_push": Out(1),
            "req": Out(1), "addr": Out(32), "beats": Out(range(1, cfg.mem_max_burst_beats + 1)),
            "grant": In(1), "rd_valid": In(1), "rd_data": In(cfg.bus_width_bits),
            "uop_w_en": Out(arr(1, ru)), "uop_w_addr": Out(arr(idx, ru)),
            "uop_w_data": Out(arr(32, ru)),
            "uop_r_addr": Out(arr(idx, 1)), "uop_r_data": In(arr(32, 1)),
            "inp_r_addr": Out(arr(idx, 1)), "inp_r_data": In(arr(cfg.inp_elem_bits, 1)),
            "wgt_r_addr": Out(arr(idx, 1)), "wgt_r_data": In(arr(cfg.wgt_elem_bits, 1)),
            "acc_w_en": Out(arr(1, ra)), "acc_w_addr": Out(arr(idx, ra)),
            "acc_w_data": Out(arr(cfg.acc_elem_bits, ra)),
            "acc_r_addr": Out(arr(idx, 1)), "acc_r_data": In(arr(cfg.acc_elem_bits, 1)),
            "out_w_en": Out(arr(1, 1)), "out_w_addr": Out(arr(idx, 1)),
            "out_w_data": Out(arr(cfg.out_elem_bits, 1)),
            "finish_start": Out(1), "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lays = insn_layouts(cfg)
        fin = Signal()
        ctl = unit_control(m, "compute", lays.gemm, self.cmd_valid, self.cmd_data,
                           self.cmd_take,
                           [("pop_prev", self.l2g_avail, self.l2g_pop),
                            ("pop_next", self.s2g_avail, self.s2g_pop)],
                           [("push_prev", self.g2l_can_push, self.g2l_push),
                            ("push_next", self.g2s_can_push, self.g2s_push)], fin)
        m.d.comb += self.idle.eq(ctl.idle)
        cand_bits = ctl.cand.as_value()
        op = ctl.cand.opcode
        g = data.View(lays.gemm, cand_bits)
        a_ = data.View(lays.alu, cand_bits)

        # ---- LOAD UOP / ACC / ACC_8BIT through the read DMA ---------------------------------
        dma = m.submodules.dma = ReadDMA(cfg, COMPUTE_TARGETS)
        m.d.comb += [dma.start.eq(ctl.start & (op == Opcode.LOAD)), dma.insn.eq(cand_bits),
                     self.req.eq(dma.req), self.addr.eq(dma.addr), self.beats.eq(dma.beats),
                     dma.grant.eq(self.grant), dma.rd_valid.eq(self.rd_valid),
                     dma.rd_data.eq(self.rd_data)]
        for lane in range(len(self.uop_w_en)):
            m.d.comb += [self.uop_w_en[lane].eq(dma.w0_en[lane]),
                         self.uop_w_addr[lane].eq(dma.w0_addr[lane]),
                         self.uop_w_data[lane].eq(dma.w0_data[lane])]
        n_lanes8 = cfg.batch * cfg.block_out
        for lane in range(self.acc_lanes):
            if lane < len(dma.w1_en):
                with m.If(dma.w1_en[lane]):
                    m.d.comb += [self.acc_w_en[lane].eq(1),
                                 self.acc_w_addr[lane].eq(dma.w1_addr[lane]),
                                 self.acc_w_data[lane].eq(dma.w1_data[lane])]
            if lane < len(dma.w2_en):
                d8 = dma.w2_data[lane]
                vals = []
                for v in range(n_lanes8):
                    s32 = Signal(32, name=f"acc8_{lane}_{v}")
                    m.d.comb += s32.eq(d8[8 * v:8 * v + 8].as_signed())
                    vals.append(s32)
                with m.If(dma.w2_en[lane]):
                    m.d.comb += [self.acc_w_en[lane].eq(1),
                                 self.acc_w_addr[lane].eq(dma.w2_addr[lane]),
                                 self.acc_w_data[lane].eq(Cat(*vals))]

        # ---- GEMM / ALU loop --------------------------------------------------------------
        lay_a = cfg.log_acc_depth
        lay_i = cfg.log_inp_depth
        lay_w = cfg.log_wgt_depth
        is_loop = (op == Opcode.GEMM) | (op == Opcode.ALU)
        n_zero = (g.uop_end <= g.uop_bgn) | (g.iter_out == 0) | (g.iter_in == 0)
        insn = ctl.insn
        gi = data.View(lays.gemm, insn)
        ai = data.View(lays.alu, insn)
        is_alu = Signal()
        tensor = Signal()
        reset = Signal()
        active = Signal()
        tog = Signal()
        u = Signal(cfg.log_uop_depth + 1)
        i = Signal(14)
        j = Signal(14)
        off_d, base_d = Signal(lay_a), Signal(lay_a)
        src_w = max(lay_a, lay_i)
        off_s, base_s = Signal(src_w), Signal(src_w)
        off_w, base_w = Signal(lay_w), Signal(lay_w)
        drain = Signal(3)
        draining = Signal()
        issue = active & (~tensor | ~tog)
        with m.If(active):
            m.d.sync += tog.eq(~tog)
        last_u = u == gi.uop_end - 1
        last_j = j == gi.iter_in - 1
        last_i = i == gi.iter_out - 1
        with m.If(issue):
            with m.If(~last_u):
                m.d.sync += u.eq(u + 1)
            with m.Else():
                m.d.sync += u.eq(gi.uop_bgn)
                with m.If(~last_j):
                    m.d.sync += [j.eq(j + 1), off_d.eq(off_d + gi.dst_factor_in),
                                 off_s.eq(off_s + Mux(is_alu, ai.src_factor_in,
                                                      gi.src_factor_in)),
                                 off_w.eq(off_w + gi.wgt_factor_in)]
                with m.Else():
                    nd = base_d + gi.dst_factor_out
                    ns = base_s + Mux(is_alu, ai.src_factor_out, gi.src_factor_out)
                    nw = base_w + gi.wgt_factor_out
                    m.d.sync += [j.eq(0), i.eq(i + 1), base_d.eq(nd), base_s.eq(ns),
                                 base_w.eq(nw), off_d.eq(nd), off_s.eq(ns), off_w.eq(nw)]
                    with m.If(last_i):
                        m.d.sync += [active.eq(0), draining.eq(1),
                                     drain.eq(Mux(tensor, 5, 4))]
        with m.If(draining):
            m.d.sync += drain.eq(drain - 1)
            with m.If(drain == 0):
                m.d.sync += draining.eq(0)
        loop_fin = draining & (drain == 0)

        # short instructions (FINISH, empty loops) finish at s + 1
        short = Signal()
        m.d.sync += short.eq(0)
        with m.If(ctl.start):
            with m.If(is_loop & ~n_zero):
                m.d.sync += [active.eq(1), tog.eq(0), u.eq(g.uop_bgn), i.eq(0), j.eq(0),
                             off_d.eq(0), off_s.eq(0), off_w.eq(0), base_d.eq(0),
                             base_s.eq(0), base_w.eq(0), is_alu.eq(op == Opcode.ALU),
                             tensor.eq((op == Opcode.ALU) & ~a_.use_imm), reset.eq(g.reset)]
            with m.Elif(op != Opcode.LOAD):
                m.d.sync += short.eq(1)
        m.d.comb += [fin.eq(loop_fin | short | dma.finish),
                     self.finish_start.eq(ctl.start & (op == Opcode.FINISH))]

        # ---- pipeline -----------------------------------------------------------------------
        m.d.comb += self.uop_r_addr[0].eq(u)
        uop = data.View(lays.uop, self.uop_r_data[0])
        p1 = Signal()
        p1_d, p1_s, p1_w = Signal(lay_a), Signal(src_w), Signal(lay_w)
        m.d.sync += [p1.eq(issue), p1_d.eq(off_d), p1_s.eq(off_s), p1_w.eq(off_w)]
        ia = Signal(lay_a)
        isrc = Signal(src_w)
        iw = Signal(lay_w)
        m.d.comb += [ia.eq(uop.dst + p1_d), isrc.eq(uop.src + p1_s), iw.eq(uop.wgt + p1_w)]
        m.d.comb += [self.inp_r_addr[0].eq(isrc[:lay_i]), self.wgt_r_addr[0].eq(iw)]

        # the ACC write of this cycle and of the previous one (forwarding)
        wr_en = Signal()
        wr_a = Signal(lay_a)
        wr_v = Signal(cfg.acc_elem_bits)
        lw_en = Signal()
        lw_a = Signal(lay_a)
        lw_v = Signal(cfg.acc_elem_bits)
        m.d.sync += [lw_en.eq(wr_en), lw_a.eq(wr_a), lw_v.eq(wr_v)]

        def snoop(val, addr):
            return Mux(wr_en & (wr_a == addr), wr_v, val)

        def patch(val, addr):
            return snoop(Mux(lw_en & (lw_a == addr), lw_v, val), addr)

        acc_rd = self.acc_r_data[0]
        # 1 iteration / cycle: GEMM and ALU with an immediate
        p2, p2_a = Signal(), Signal(lay_a)
        p2_s = Signal(lay_a)  # tensor: the source row
        m.d.sync += [p2.eq(p1), p2_a.eq(ia), p2_s.eq(isrc[:lay_a])]
        p3, p3_a, p3_old = Signal(), Signal(lay_a), Signal(cfg.acc_elem_bits)
        p4, p4_a, p4_v = Signal(), Signal(lay_a), Signal(cfg.acc_elem_bits)
        gemm = m.submodules.gemm = GemmCore(cfg)
        alu = m.submodules.alu = TensorAlu(cfg)
        m.d.comb += [gemm.inp.eq(self.inp_r_data[0]), gemm.wgt.eq(self.wgt_r_data[0]),
                     alu.op.eq(ai.alu_opcode)]
        imm32 = Signal(32)
        m.d.comb += imm32.eq(ai.imm)
        imm_vec = Cat(*[imm32 for _ in range(cfg.batch * cfg.block_out)])
        lanes = cfg.batch * cfg.block_out
        # tensor ALU registers
        t3, t3_a = Signal(), Signal(lay_a)
        src_v, src_a = Signal(cfg.acc_elem_bits), Signal(lay_a)
        t4, t4_a, dst_v = Signal(), Signal(lay_a), Signal(cfg.acc_elem_bits)
        p5, p5_a, p5_v = Signal(), Signal(lay_a), Signal(cfg.acc_elem_bits)

        # ACC read index
        m.d.comb += self.acc_r_addr[0].eq(Mux(tensor, isrc[:lay_a], ia))
        with m.If(tensor & p2):
            m.d.comb += self.acc_r_addr[0].eq(p2_a)

        old = snoop(p3_old, p3_a)
        sums = gemm.sums
        added = Cat(*[(old[k * 32:(k + 1) * 32] + sums[k * 32:(k + 1) * 32])[:32]
                      for k in range(lanes)])
        m.d.sync += [p3.eq(p2 & ~tensor), p3_a.eq(p2_a), p3_old.eq(patch(acc_rd, p2_a)),
                     p4.eq(p3), p4_a.eq(p3_a)]
        with m.If(tensor):
            m.d.comb += [alu.a.eq(snoop(dst_v, t4_a)), alu.b.eq(snoop(src_v, src_a))]
        with m.Else():
            m.d.comb += [alu.a.eq(old), alu.b.eq(imm_vec)]
        m.d.sync += p4_v.eq(Mux(reset, 0, Mux(is_alu, alu.out, added)))
        # tensor: t+2 source arrives (p2), t+3 destination arrives (t3), t+4 ALU (t4)
        m.d.sync += [t3.eq(p2 & tensor), t3_a.eq(p2_a), t4.eq(t3), t4_a.eq(t3_a),
                     p5.eq(t4), p5_a.eq(t4_a), p5_v.eq(Mux(reset, 0, alu.out))]
        m.d.sync += src_v.eq(snoop(src_v, src_a))
        with m.If(p2 & tensor):
            m.d.sync += [src_v.eq(patch(acc_rd, p2_s)), src_a.eq(p2_s)]
        with m.If(t3):
            m.d.sync += dst_v.eq(patch(acc_rd, t3_a))

        with m.If(p4):
            m.d.comb += [wr_en.eq(1), wr_a.eq(p4_a), wr_v.eq(p4_v)]
        with m.If(p5):
            m.d.comb += [wr_en.eq(1), wr_a.eq(p5_a), wr_v.eq(p5_v)]
        with m.If(wr_en):
            m.d.comb += [self.acc_w_en[0].eq(1), self.acc_w_addr[0].eq(wr_a),
                         self.acc_w_data[0].eq(wr_v)]
        m.d.comb += [self.out_w_en[0].eq(wr_en), self.out_w_addr[0].eq(wr_a),
                     self.out_w_data[0].eq(Cat(*[wr_v[k * 32:k * 32 + 8]
                                                 for k in range(lanes)]))]
        return m
